//! The checks that decide whether a plugin's manifest can be loaded at all,
//! and the resolution of its `setting:<key>` write namespaces.
//!
//! The manifest's types are the contract's ([`wasmop_contract::manifest`]);
//! their serde form (camelCase) is what the plugin returns and what
//! `wasmop inspect` prints.
//!
//! [`problems`] is run once at load: a manifest with any problem rejects the
//! plugin like a broken file, so everything downstream (snapshot selection,
//! plan validation, RBAC) may rely on a well-formed manifest.

use std::collections::BTreeSet;

use serde::Serialize;

pub use wasmop_contract::manifest::{
    Controller, FieldRef, HttpTarget, KindRef, Manifest, OwnedKind, Ownership, Read,
    SETTING_PREFIX, Selector, split_api_version,
};

use crate::contract::selector::LabelSelector;
use crate::names;

/// One thing wrong with a manifest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ManifestProblem {
    /// Where in the manifest, e.g. `controllers[0].owns[1]`.
    pub path: String,
    /// What is wrong, for a person.
    pub message: String,
}

impl std::fmt::Display for ManifestProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// The manifest with every `setting:<key>` entry of `write-namespaces` (the
/// controllers' and the owned kinds' own) replaced by the namespace the
/// top-level setting `<key>` holds.
///
/// # Guarantees
///
/// - A setting that is a string and a DNS-1123 label replaces the
///   entry; an absent or `null` setting removes it (the plugin lists its
///   default as a literal entry when it has one).
/// - Entries stay in order, without duplicates; nothing else changes.
///
/// # Errors
///
/// One [`ManifestProblem`] per entry whose setting is present but not a
/// string, or not a valid namespace name (`*` included: a setting
/// cannot widen the manifest to every namespace).
pub fn resolve_settings(
    manifest: &Manifest,
    settings: &serde_json::Value,
) -> Result<Manifest, Vec<ManifestProblem>> {
    let mut problems = Vec::new();
    let mut out = manifest.clone();
    for (ci, c) in out.controllers.iter_mut().enumerate() {
        let at = format!("controllers[{ci}]");
        c.write_namespaces = resolve_entries(
            &c.write_namespaces,
            settings,
            &format!("{at}.writeNamespaces"),
            &mut problems,
        );
        for (oi, owned) in c.owns.iter_mut().enumerate() {
            if let Some(list) = &owned.write_namespaces {
                owned.write_namespaces = Some(resolve_entries(
                    list,
                    settings,
                    &format!("{at}.owns[{oi}].writeNamespaces"),
                    &mut problems,
                ));
            }
        }
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(problems)
    }
}

/// One write-namespace list with its `setting:<key>` entries resolved (see
/// [`resolve_settings`]); problems are pushed with `path[i]`.
fn resolve_entries(
    entries: &[String],
    settings: &serde_json::Value,
    path: &str,
    problems: &mut Vec<ManifestProblem>,
) -> Vec<String> {
    let mut resolved: Vec<String> = Vec::with_capacity(entries.len());
    for (wi, entry) in entries.iter().enumerate() {
        let namespace = match entry.strip_prefix(SETTING_PREFIX) {
            None => Some(entry.clone()),
            Some(key) => match settings.get(key) {
                None | Some(serde_json::Value::Null) => None,
                Some(serde_json::Value::String(ns)) => match names::dns1123_label(ns) {
                    Ok(()) => Some(ns.clone()),
                    Err(why) => {
                        problems.push(ManifestProblem {
                            path: format!("{path}[{wi}]"),
                            message: format!("setting {key:?} names namespace {ns:?}, which {why}"),
                        });
                        None
                    }
                },
                Some(other) => {
                    problems.push(ManifestProblem {
                        path: format!("{path}[{wi}]"),
                        message: format!(
                            "setting {key:?} must be a string naming a namespace, not {other}"
                        ),
                    });
                    None
                }
            },
        };
        if let Some(ns) = namespace
            && !resolved.contains(&ns)
        {
            resolved.push(ns);
        }
    }
    resolved
}

/// A write-namespace entry: `*`, a DNS-1123 label, or `setting:<key>` with
/// a non-empty key without blanks.
fn write_namespace_entry(ns: &str) -> Result<(), String> {
    if let Some(key) = ns.strip_prefix(SETTING_PREFIX) {
        if key.is_empty() || key.chars().any(char::is_whitespace) {
            return Err(format!(
                "{ns:?} must name a setting: setting:<key>, without blanks"
            ));
        }
    } else if ns != "*"
        && let Err(why) = names::dns1123_label(ns)
    {
        return Err(format!("namespace {ns:?} {why}"));
    }
    Ok(())
}

/// Everything that makes this manifest unusable; empty when it is fine.
///
/// Checked: plugin name (a DNS-1123 label, since it becomes a label
/// value and field manager) and version; at least one controller;
/// unique controller names and primary kinds; every kind reference
/// complete (version, kind, lowercase plural); a primary never also
/// owned; no kind owned twice; unique, non-empty read ids; field paths
/// present; label selectors parse; a finalizer without blanks;
/// write namespaces are `*`, DNS-1123 labels or `setting:<key>` with a
/// non-empty key without blanks; an owned kind's own write namespaces
/// are only on a namespaced kind, each entry also in the controller's
/// list (`*` there covers any), and none on an owner-reference kind of a
/// namespaced primary; primary fields are
/// `spec.…`, `metadata.labels.…` or `metadata.annotations.…`; HTTP
/// targets have unique ids, non-zero ports, and address Pods or
/// Services the controller owns or reads.
pub fn problems(manifest: &Manifest) -> Vec<ManifestProblem> {
    let mut out = Vec::new();
    let mut problem = |path: String, message: String| out.push(ManifestProblem { path, message });

    if manifest.name.is_empty() {
        problem("name".into(), "plugin name is empty".into());
    } else if let Err(why) = names::dns1123_label(&manifest.name) {
        problem(
            "name".into(),
            format!("plugin name {:?} {why}", manifest.name),
        );
    }
    if manifest.version.trim().is_empty() {
        problem("version".into(), "plugin version is empty".into());
    }
    if manifest.controllers.is_empty() {
        problem(
            "controllers".into(),
            "the plugin declares no controller".into(),
        );
    }

    let mut controller_names = BTreeSet::new();
    let mut primaries: Vec<(&KindRef, &str)> = Vec::new();
    for (ci, c) in manifest.controllers.iter().enumerate() {
        let at = format!("controllers[{ci}]");
        if c.name.is_empty() {
            problem(format!("{at}.name"), "controller name is empty".into());
        } else if !controller_names.insert(c.name.as_str()) {
            problem(
                format!("{at}.name"),
                format!("duplicate controller name {:?}", c.name),
            );
        }
        if let Some((_, other)) = primaries.iter().find(|(k, _)| k.same_type(&c.primary)) {
            problem(
                format!("{at}.primary"),
                format!(
                    "kind {} is already the primary of controller {other:?}",
                    c.primary
                ),
            );
        }
        primaries.push((&c.primary, &c.name));

        for msg in kind_problems(&c.primary) {
            problem(format!("{at}.primary"), msg);
        }
        for (oi, owned) in c.owns.iter().enumerate() {
            let path = format!("{at}.owns[{oi}]");
            let kind = &owned.kind;
            for msg in kind_problems(kind) {
                problem(path.clone(), msg);
            }
            if kind.same_type(&c.primary) {
                problem(
                    path.clone(),
                    format!("primary kind {kind} is also listed as owned"),
                );
            }
            if c.owns[..oi].iter().any(|k| k.kind.same_type(kind)) {
                problem(path.clone(), format!("kind {kind} is owned twice"));
            }
            match &owned.ownership {
                // An ownerReference to a namespaced owner only works inside
                // that owner's namespace: the garbage collector treats any
                // other as dangling and deletes the object.
                Ownership::OwnerReference if c.primary.namespaced && !kind.namespaced => problem(
                    format!("{path}.ownership"),
                    format!(
                        "cluster-scoped kind {kind} cannot carry an ownerReference to a namespaced \
                         {}; declare it owner-label",
                        c.primary.kind
                    ),
                ),
                Ownership::OwnerReference => {}
                Ownership::Dependent if owned.adopt => problem(
                    format!("{path}.adopt"),
                    format!("dependent kind {kind} cannot be adopted: plans never apply it"),
                ),
                Ownership::Dependent => {}
                Ownership::OwnerLabel { extra_label, .. } => {
                    if c.finalizer.is_none() {
                        problem(
                            format!("{path}.ownership"),
                            format!(
                                "label-owned kind {kind} needs a finalizer on the controller: \
                                 nothing else cleans its objects up"
                            ),
                        );
                    }
                    if let Some(key) = extra_label
                        && let Err(why) = extra_label_key(key)
                    {
                        problem(format!("{path}.ownership.ownerLabel.extraLabel"), why);
                    }
                }
            }
        }
        // Objects in other namespaces can only be owned by label.
        if c.primary.namespaced && !c.write_namespaces.is_empty() && !c.has_label_owned() {
            problem(
                format!("{at}.writeNamespaces"),
                "ownerReferences cannot cross namespaces: a namespaced primary may write into \
                 other namespaces only kinds it owns by label; declare them owner-label"
                    .into(),
            );
        }

        let mut read_ids = BTreeSet::new();
        for (ri, read) in c.reads.iter().enumerate() {
            let path = format!("{at}.reads[{ri}]");
            if read.id.is_empty() {
                problem(format!("{path}.id"), "read id is empty".into());
            } else if read.id == wasmop_contract::ABSENT_KIND_READ {
                problem(
                    format!("{path}.id"),
                    format!(
                        "read id {:?} is the host's (absent optional kinds)",
                        read.id
                    ),
                );
            } else if read.id == wasmop_contract::OBSERVATION_OUTCOMES_READ {
                problem(
                    format!("{path}.id"),
                    format!("read id {:?} is the host's (observation outcomes)", read.id),
                );
            } else if !read_ids.insert(read.id.as_str()) {
                problem(
                    format!("{path}.id"),
                    format!("duplicate read id {:?}", read.id),
                );
            }
            for msg in kind_problems(&read.kind) {
                problem(format!("{path}.kind"), msg);
            }
            match &read.selector {
                Selector::Field(field) => {
                    if let Err(why) = dotted_path(&field.name_path) {
                        problem(format!("{path}.selector.namePath"), why);
                    }
                    if let Some(ns) = field.namespace_path.as_deref().filter(|p| !p.is_empty())
                        && let Err(why) = dotted_path(ns)
                    {
                        problem(format!("{path}.selector.namespacePath"), why);
                    }
                }
                Selector::Labels(text) => {
                    if let Err(e) = LabelSelector::parse(text) {
                        problem(format!("{path}.selector.labels"), e.to_string());
                    }
                }
                Selector::OwnedByPrimary | Selector::SameNamespace | Selector::ClusterWide => {}
            }
        }

        if let Some(finalizer) = &c.finalizer
            && (finalizer.is_empty() || finalizer.chars().any(char::is_whitespace))
        {
            problem(
                format!("{at}.finalizer"),
                format!("finalizer {finalizer:?} must be non-empty and without blanks"),
            );
        }
        for (wi, ns) in c.write_namespaces.iter().enumerate() {
            if let Err(why) = write_namespace_entry(ns) {
                problem(format!("{at}.writeNamespaces[{wi}]"), why);
            }
        }
        for (oi, owned) in c.owns.iter().enumerate() {
            let Some(list) = &owned.write_namespaces else {
                continue;
            };
            let path = format!("{at}.owns[{oi}].writeNamespaces");
            let kind = &owned.kind;
            if !kind.namespaced {
                problem(
                    path.clone(),
                    format!("{kind} is cluster-scoped: its objects have no namespace to scope"),
                );
                continue;
            }
            if c.primary.namespaced
                && owned.ownership == Ownership::OwnerReference
                && !list.is_empty()
            {
                problem(
                    path.clone(),
                    format!(
                        "ownerReferences cannot cross namespaces: {kind} is owned by reference, \
                         so only the primary's namespace can hold it; declare it owner-label"
                    ),
                );
            }
            for (wi, ns) in list.iter().enumerate() {
                if let Err(why) = write_namespace_entry(ns) {
                    problem(format!("{path}[{wi}]"), why);
                } else if !c.write_namespaces.iter().any(|w| w == "*" || w == ns) {
                    // Compared as written: `setting:<key>` is covered by `*`
                    // or the same entry, which resolve to the same namespace.
                    problem(
                        format!("{path}[{wi}]"),
                        format!(
                            "{ns:?} is not in the controller's writeNamespaces ({}): a kind's \
                             list may only narrow the controller's",
                            if c.write_namespaces.is_empty() {
                                "none".to_owned()
                            } else {
                                c.write_namespaces.join(", ")
                            }
                        ),
                    );
                }
            }
        }
        for (fi, field) in c.primary_fields.iter().enumerate() {
            if let Err(why) = primary_field(field) {
                problem(format!("{at}.primaryFields[{fi}]"), why);
            }
        }

        if c.scope == wasmop_contract::Scope::Kind && !c.http_targets.is_empty() {
            // HTTP results are kept per primary and re-trigger one
            // primary; a kind call has no single primary to hand them to.
            problem(
                format!("{at}.scope"),
                "a kind-scoped controller cannot declare httpTargets (HTTP results belong to one primary)".into(),
            );
        }

        let mut target_ids = BTreeSet::new();
        for (ti, target) in c.http_targets.iter().enumerate() {
            let path = format!("{at}.httpTargets[{ti}]");
            if target.id.is_empty() {
                problem(
                    format!("{path}.id"),
                    format!("target id {:?} is empty or reserved", target.id),
                );
            } else if !target_ids.insert(target.id.as_str()) {
                problem(
                    format!("{path}.id"),
                    format!("duplicate target id {:?}", target.id),
                );
            }
            if !(target.kind.group.is_empty()
                && (target.kind.kind == "Pod" || target.kind.kind == "Service"))
            {
                problem(
                    format!("{path}.kind"),
                    format!("kind {} is neither Pod nor Service", target.kind),
                );
            }
            let declared = c.owns.iter().any(|k| k.kind.same_type(&target.kind))
                || c.reads.iter().any(|r| r.kind.same_type(&target.kind));
            if !declared {
                problem(
                    format!("{path}.kind"),
                    format!(
                        "kind {} is neither owned nor read by the controller",
                        target.kind
                    ),
                );
            }
            if target.ports.is_empty() || target.ports.contains(&0) {
                problem(
                    format!("{path}.ports"),
                    "ports must be non-empty and non-zero".into(),
                );
            }
        }
    }
    out
}

fn kind_problems(kind: &KindRef) -> Vec<String> {
    let mut out = Vec::new();
    let name = if kind.kind.is_empty() {
        "(unnamed)"
    } else {
        kind.kind.as_str()
    };
    if kind.kind.is_empty() {
        out.push("kind is empty".to_owned());
    }
    if kind.version.is_empty() {
        out.push(format!("kind {name} is missing its version"));
    }
    if kind.plural.is_empty() {
        out.push(format!("kind {name} is missing its plural"));
    } else if kind.plural != kind.plural.to_lowercase() || kind.plural.contains('/') {
        out.push(format!(
            "plural {:?} of kind {name} must be lowercase, without '/'",
            kind.plural
        ));
    }
    out
}

/// A label key the plugin may name as its extra owner label: a valid
/// qualified name that is none of the host's own labels.
fn extra_label_key(key: &str) -> Result<(), String> {
    let reserved = [
        wasmop_contract::MANAGED_BY_LABEL,
        wasmop_contract::PLUGIN_LABEL,
        wasmop_contract::OWNER_UID_LABEL,
    ];
    if reserved.contains(&key) {
        return Err(format!("{key:?} is one of the host's own labels"));
    }
    names::label_key(key).map_err(|why| format!("label key {key:?} {why}"))
}

fn dotted_path(path: &str) -> Result<(), String> {
    if path.is_empty() || path.split('.').any(str::is_empty) {
        Err(format!("{path:?} is not a dotted field path"))
    } else {
        Ok(())
    }
}

fn primary_field(path: &str) -> Result<(), String> {
    dotted_path(path)?;
    let segments: Vec<&str> = path.split('.').collect();
    match segments.as_slice() {
        ["spec", _, ..] => Ok(()),
        ["metadata", "labels" | "annotations", _, ..] => Ok(()),
        _ => Err(format!(
            "primary field {path:?} must be under spec, metadata.labels or metadata.annotations"
        )),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn configmap() -> KindRef {
        KindRef::namespaced("", "v1", "ConfigMap", "configmaps")
    }

    pub(crate) fn widget() -> KindRef {
        KindRef::namespaced("test.wasmop.dev", "v1", "Widget", "widgets")
    }

    pub(crate) fn controller() -> Controller {
        Controller {
            name: "widget".into(),
            primary: widget(),
            owns: vec![OwnedKind::reference(configmap())],
            reads: vec![],
            finalizer: None,
            write_namespaces: vec![],
            primary_fields: vec!["spec.id".into()],
            http_targets: vec![],
            delete_primary: false,
            scope: Default::default(),
        }
    }

    pub(crate) fn manifest() -> Manifest {
        Manifest {
            name: "widget".into(),
            version: "0.1.0".into(),
            controllers: vec![controller()],
            admission: Vec::new(),
        }
    }

    fn messages(m: &Manifest) -> Vec<String> {
        problems(m).iter().map(ToString::to_string).collect()
    }

    #[test]
    fn a_well_formed_manifest_has_no_problems() {
        assert_eq!(messages(&manifest()), Vec::<String>::new());
    }

    #[test]
    fn empty_plugin_name_is_a_problem() {
        let mut m = manifest();
        m.name.clear();
        assert_eq!(messages(&m), vec!["name: plugin name is empty"]);
    }

    #[test]
    fn duplicate_controller_names_are_a_problem() {
        let mut m = manifest();
        let mut second = controller();
        second.primary = KindRef::namespaced("test.wasmop.dev", "v1", "Gadget", "gadgets");
        m.controllers.push(second);
        assert_eq!(
            messages(&m),
            vec!["controllers[1].name: duplicate controller name \"widget\""]
        );
    }

    #[test]
    fn two_controllers_cannot_claim_one_primary_kind() {
        let mut m = manifest();
        let mut second = controller();
        second.name = "other".into();
        m.controllers.push(second);
        assert_eq!(
            messages(&m),
            vec![
                "controllers[1].primary: kind Widget.test.wasmop.dev is already the primary of controller \"widget\""
            ]
        );
    }

    #[test]
    fn kinds_missing_plural_are_a_problem() {
        let mut m = manifest();
        m.controllers[0].owns[0].kind.plural.clear();
        assert_eq!(
            messages(&m),
            vec!["controllers[0].owns[0]: kind ConfigMap is missing its plural"]
        );
    }

    #[test]
    fn a_primary_kind_listed_as_owned_is_a_problem() {
        let mut m = manifest();
        m.controllers[0].owns.push(OwnedKind::reference(widget()));
        assert_eq!(
            messages(&m),
            vec![
                "controllers[0].owns[1]: primary kind Widget.test.wasmop.dev is also listed as owned"
            ]
        );
    }

    #[test]
    fn duplicate_read_ids_are_a_problem() {
        let mut m = manifest();
        let read = Read {
            id: "cm".into(),
            kind: configmap(),
            selector: Selector::SameNamespace,
            optional: false,
        };
        m.controllers[0].reads = vec![read.clone(), read];
        assert_eq!(
            messages(&m),
            vec!["controllers[0].reads[1].id: duplicate read id \"cm\""]
        );
    }

    #[test]
    fn the_hosts_read_ids_are_reserved() {
        for (id, what) in [
            (wasmop_contract::ABSENT_KIND_READ, "absent optional kinds"),
            (
                wasmop_contract::OBSERVATION_OUTCOMES_READ,
                "observation outcomes",
            ),
        ] {
            let mut m = manifest();
            m.controllers[0].reads = vec![Read {
                id: id.into(),
                kind: configmap(),
                selector: Selector::SameNamespace,
                optional: false,
            }];
            assert_eq!(
                messages(&m),
                vec![format!(
                    "controllers[0].reads[0].id: read id \"{id}\" is the host's ({what})"
                )]
            );
        }
    }

    #[test]
    fn broken_label_selectors_are_a_problem() {
        let mut m = manifest();
        m.controllers[0].reads = vec![Read {
            id: "cm".into(),
            kind: configmap(),
            selector: Selector::Labels("app in (a".into()),
            optional: false,
        }];
        let problems = messages(&m);
        assert_eq!(problems.len(), 1);
        assert!(
            problems[0].starts_with("controllers[0].reads[0].selector.labels:"),
            "{problems:?}"
        );
    }

    #[test]
    fn primary_fields_outside_spec_and_metadata_labels_are_a_problem() {
        let mut m = manifest();
        m.controllers[0].primary_fields = vec!["status.phase".into(), "metadata.name".into()];
        assert_eq!(problems(&m).len(), 2);
    }

    #[test]
    fn http_targets_must_address_declared_pods_or_services() {
        let mut m = manifest();
        m.controllers[0].http_targets = vec![HttpTarget {
            id: "members".into(),
            kind: KindRef::namespaced("", "v1", "Pod", "pods"),
            ports: vec![8080],
        }];
        assert_eq!(
            messages(&m),
            vec![
                "controllers[0].httpTargets[0].kind: kind Pod is neither owned nor read by the controller"
            ]
        );
    }

    #[test]
    fn a_kind_scoped_controller_may_not_declare_http_targets() {
        let mut m = manifest();
        m.controllers[0].scope = wasmop_contract::Scope::Kind;
        assert!(messages(&m).is_empty(), "kind scope alone is fine");
        m.controllers[0]
            .owns
            .push(OwnedKind::reference(KindRef::namespaced(
                "", "v1", "Pod", "pods",
            )));
        m.controllers[0].http_targets = vec![HttpTarget {
            id: "members".into(),
            kind: KindRef::namespaced("", "v1", "Pod", "pods"),
            ports: vec![8080],
        }];
        assert_eq!(
            messages(&m),
            vec![
                "controllers[0].scope: a kind-scoped controller cannot declare httpTargets (HTTP results belong to one primary)"
            ]
        );
    }

    /// The test manifest with its ConfigMaps owned by label, so it may
    /// write into other namespaces.
    fn label_owning() -> Manifest {
        let mut m = manifest();
        m.controllers[0].owns[0] = OwnedKind::label(configmap());
        m.controllers[0].finalizer = Some("test.wasmop.dev/cleanup".into());
        m
    }

    #[test]
    fn owner_references_across_namespaces_are_refused_naming_owner_label() {
        let mut m = manifest();
        m.controllers[0].write_namespaces = vec!["other".into()];
        let msgs = messages(&m);
        assert_eq!(msgs.len(), 1, "{msgs:?}");
        assert!(msgs[0].contains("declare them owner-label"), "{msgs:?}");
        let mut cluster = manifest();
        cluster.controllers[0]
            .owns
            .push(OwnedKind::reference(KindRef::cluster_scoped(
                "g", "v1", "Claim", "claims",
            )));
        let msgs = messages(&cluster);
        assert!(msgs[0].contains("declare it owner-label"), "{msgs:?}");
        let mut ok = label_owning();
        ok.controllers[0].write_namespaces = vec!["other".into()];
        assert_eq!(messages(&ok), Vec::<String>::new());
    }

    #[test]
    fn label_owned_kinds_need_a_finalizer_and_a_valid_extra_label() {
        let mut m = label_owning();
        m.controllers[0].finalizer = None;
        assert!(messages(&m)[0].contains("needs a finalizer"));
        let mut m = label_owning();
        m.controllers[0].owns[0] =
            OwnedKind::label(configmap()).extra_label("wasmop.dev/owner-uid");
        assert!(
            messages(&m)[0].contains("host's own labels"),
            "{:?}",
            messages(&m)
        );
        m.controllers[0].owns[0] = OwnedKind::label(configmap()).extra_label("bad key!");
        assert_eq!(messages(&m).len(), 1);
        m.controllers[0].owns[0] =
            OwnedKind::label(configmap()).extra_label("celld.eric.dev/fleet-uid");
        assert_eq!(messages(&m), Vec::<String>::new());
    }

    #[test]
    fn write_namespaces_are_star_or_labels() {
        let mut m = label_owning();
        m.controllers[0].write_namespaces = vec!["*".into(), "ok-ns".into(), "Bad_NS".into()];
        assert_eq!(problems(&m).len(), 1);
    }

    #[test]
    fn write_namespaces_may_name_a_setting() {
        let mut m = label_owning();
        m.controllers[0].write_namespaces = vec![
            "setting:targetNamespace".into(),
            "setting:".into(),
            "setting:a b".into(),
        ];
        assert_eq!(
            messages(&m),
            vec![
                "controllers[0].writeNamespaces[1]: \"setting:\" must name a setting: setting:<key>, without blanks",
                "controllers[0].writeNamespaces[2]: \"setting:a b\" must name a setting: setting:<key>, without blanks",
            ]
        );
    }

    fn with_setting_entry() -> Manifest {
        let mut m = manifest();
        m.controllers[0].write_namespaces =
            vec!["setting:targetNamespace".into(), "default-ns".into()];
        m
    }

    #[test]
    fn a_setting_entry_resolves_to_the_settings_namespace() {
        let m = resolve_settings(
            &with_setting_entry(),
            &serde_json::json!({"targetNamespace": "backups"}),
        )
        .unwrap();
        assert_eq!(m.controllers[0].write_namespaces, ["backups", "default-ns"]);
        assert!(m.controllers[0].may_write_namespace(None, "backups"));
        assert!(!m.controllers[0].may_write_namespace(None, "elsewhere"));
        let same = resolve_settings(
            &with_setting_entry(),
            &serde_json::json!({"targetNamespace": "default-ns"}),
        )
        .unwrap();
        assert_eq!(same.controllers[0].write_namespaces, ["default-ns"]);
    }

    #[test]
    fn an_absent_setting_resolves_to_nothing() {
        for settings in [
            serde_json::json!({}),
            serde_json::json!({"targetNamespace": null}),
        ] {
            let m = resolve_settings(&with_setting_entry(), &settings).unwrap();
            assert_eq!(m.controllers[0].write_namespaces, ["default-ns"]);
        }
    }

    #[test]
    fn a_setting_that_is_no_namespace_name_is_a_problem() {
        for (value, message) in [
            (
                serde_json::json!(3),
                "controllers[0].writeNamespaces[0]: setting \"targetNamespace\" must be a string naming a namespace, not 3",
            ),
            (
                serde_json::json!("*"),
                "controllers[0].writeNamespaces[0]: setting \"targetNamespace\" names namespace \"*\", which may contain only lowercase letters, digits, '-' and '.'",
            ),
        ] {
            let problems = resolve_settings(
                &with_setting_entry(),
                &serde_json::json!({"targetNamespace": value}),
            )
            .unwrap_err();
            let texts: Vec<String> = problems.iter().map(ToString::to_string).collect();
            assert_eq!(texts, vec![message]);
        }
    }

    #[test]
    fn an_unresolved_setting_entry_allows_no_namespace() {
        let m = with_setting_entry();
        assert!(!m.controllers[0].may_write_namespace(None, "setting:targetNamespace"));
        assert!(!m.controllers[0].may_write_namespace(None, "backups"));
    }

    /// A label-owned ConfigMap that may go anywhere, and a label-owned
    /// Secret whose own list `kind` narrows that.
    fn with_kind_list(controller: &[&str], kind: &[&str]) -> Manifest {
        let mut m = label_owning();
        let mut secret = OwnedKind::label(KindRef::namespaced("", "v1", "Secret", "secrets"));
        secret.write_namespaces = Some(kind.iter().map(|s| s.to_string()).collect());
        m.controllers[0].owns.push(secret);
        m.controllers[0].write_namespaces = controller.iter().map(|s| s.to_string()).collect();
        m
    }

    #[test]
    fn a_kinds_write_namespaces_may_only_narrow_the_controllers() {
        assert_eq!(
            messages(&with_kind_list(&["*"], &["a", "*"])),
            Vec::<String>::new()
        );
        assert_eq!(
            messages(&with_kind_list(&["a", "b"], &["b"])),
            Vec::<String>::new()
        );
        assert_eq!(messages(&with_kind_list(&[], &[])), Vec::<String>::new());
        assert_eq!(
            messages(&with_kind_list(&["a"], &["b", "*", "Bad_NS"])),
            vec![
                "controllers[0].owns[1].writeNamespaces[0]: \"b\" is not in the controller's writeNamespaces (a): a kind's list may only narrow the controller's",
                "controllers[0].owns[1].writeNamespaces[1]: \"*\" is not in the controller's writeNamespaces (a): a kind's list may only narrow the controller's",
                "controllers[0].owns[1].writeNamespaces[2]: namespace \"Bad_NS\" may contain only lowercase letters, digits, '-' and '.'",
            ]
        );
        assert_eq!(
            messages(&with_kind_list(&[], &["a"])),
            vec![
                "controllers[0].owns[1].writeNamespaces[0]: \"a\" is not in the controller's writeNamespaces (none): a kind's list may only narrow the controller's"
            ]
        );
        // A setting entry is covered by the same entry (or `*`) only.
        assert_eq!(
            messages(&with_kind_list(&["setting:t"], &["setting:t"])),
            Vec::<String>::new()
        );
        assert_eq!(
            messages(&with_kind_list(&["setting:t"], &["setting:u"])).len(),
            1
        );
    }

    #[test]
    fn a_kind_list_on_an_owner_reference_or_cluster_scoped_kind_is_a_problem() {
        let mut m = with_kind_list(&["*"], &["*"]);
        let mut deployment = OwnedKind::reference(KindRef::namespaced(
            "apps",
            "v1",
            "Deployment",
            "deployments",
        ));
        deployment.write_namespaces = Some(vec!["*".into()]);
        m.controllers[0].owns.push(deployment.clone());
        let mut claim = OwnedKind::label(KindRef::cluster_scoped("g", "v1", "Claim", "claims"));
        claim.write_namespaces = Some(vec![]);
        m.controllers[0].owns.push(claim);
        let msgs = messages(&m);
        assert_eq!(msgs.len(), 2, "{msgs:?}");
        assert!(
            msgs[0].starts_with(
                "controllers[0].owns[2].writeNamespaces: ownerReferences cannot cross namespaces"
            ),
            "{msgs:?}"
        );
        assert_eq!(
            msgs[1],
            "controllers[0].owns[3].writeNamespaces: Claim.g is cluster-scoped: its objects have no namespace to scope"
        );
        // Own namespace only is what an owner reference means anyway.
        let mut ok = with_kind_list(&["*"], &["*"]);
        deployment.write_namespaces = Some(vec![]);
        ok.controllers[0].owns.push(deployment);
        assert_eq!(messages(&ok), Vec::<String>::new());
    }

    #[test]
    fn a_kinds_setting_entries_resolve_like_the_controllers() {
        let m = with_kind_list(&["setting:t", "fixed"], &["setting:t"]);
        let resolved = resolve_settings(&m, &serde_json::json!({"t": "backups"})).unwrap();
        let c = &resolved.controllers[0];
        assert_eq!(
            c.owns[1].write_namespaces.as_deref(),
            Some(&["backups".to_owned()][..])
        );
        assert_eq!(c.kind_write_namespaces(&c.owns[1]), ["backups"]);
        assert_eq!(c.kind_write_namespaces(&c.owns[0]), ["backups", "fixed"]);
        // Absent: the kind is left with its primary's namespace only.
        let resolved = resolve_settings(&m, &serde_json::json!({})).unwrap();
        let c = &resolved.controllers[0];
        assert!(c.kind_write_namespaces(&c.owns[1]).is_empty());
        assert!(!c.may_write_kind(&c.owns[1], Some("own"), "fixed"));
        let problems = resolve_settings(&m, &serde_json::json!({"t": 3})).unwrap_err();
        let texts: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert_eq!(texts.len(), 2, "{texts:?}");
        assert!(
            texts[1].starts_with("controllers[0].owns[1].writeNamespaces[0]: setting \"t\""),
            "{texts:?}"
        );
    }
}
