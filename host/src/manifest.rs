//! What a plugin declares about itself, in host-native types, and the checks
//! that decide whether a manifest can be loaded at all.
//!
//! The types mirror the WIT records of `wasmop:reconciler@0.2.0` one to one.
//! Their serde form (camelCase) is what `wasmop inspect` prints.
//!
//! [`Manifest::problems`] is run once at load: a manifest with any problem
//! rejects the plugin like a broken file, so everything downstream (snapshot
//! selection, plan validation, RBAC) may rely on a well-formed manifest.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::names;
use crate::selector::LabelSelector;

/// A Kubernetes resource type and how it is addressed (WIT `kind-ref`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KindRef {
    /// API group, empty for the core group.
    pub group: String,
    /// API version within the group, e.g. `v1`.
    pub version: String,
    /// Kind, e.g. `ConfigMap`.
    pub kind: String,
    /// Plural resource name used in URLs, e.g. `configmaps`.
    pub plural: String,
    /// True for namespaced kinds, false for cluster-scoped ones.
    pub namespaced: bool,
}

impl KindRef {
    /// A namespaced kind.
    pub fn namespaced(group: &str, version: &str, kind: &str, plural: &str) -> Self {
        KindRef {
            group: group.to_owned(),
            version: version.to_owned(),
            kind: kind.to_owned(),
            plural: plural.to_owned(),
            namespaced: true,
        }
    }

    /// A cluster-scoped kind.
    pub fn cluster_scoped(group: &str, version: &str, kind: &str, plural: &str) -> Self {
        KindRef {
            namespaced: false,
            ..KindRef::namespaced(group, version, kind, plural)
        }
    }

    /// `group/version`, or just `version` for the core group.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// True when an object with this `apiVersion` and `kind` is of this kind
    /// (group, version and kind all equal).
    pub fn matches(&self, api_version: &str, kind: &str) -> bool {
        self.kind == kind && self.api_version() == api_version
    }

    /// True when `other` names the same resource type regardless of version
    /// (same group and kind).
    pub fn same_type(&self, other: &KindRef) -> bool {
        self.group == other.group && self.kind == other.kind
    }
}

impl std::fmt::Display for KindRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.group.is_empty() {
            write!(f, "{}", self.kind)
        } else {
            write!(f, "{}.{}", self.kind, self.group)
        }
    }
}

/// Names a related object through fields of the primary (WIT `field-ref`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FieldRef {
    /// Dotted path to the string field holding the object's name.
    pub name_path: String,
    /// Dotted path to the string field holding its namespace; the primary's
    /// namespace when `None` or empty.
    pub namespace_path: Option<String>,
}

/// How the objects of a read kind are selected for a snapshot (WIT `selector`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Selector {
    /// Objects whose controller ownerReference is the primary.
    OwnedByPrimary,
    /// The one object named by a field of the primary.
    Field(FieldRef),
    /// Every object of the kind in the primary's namespace.
    SameNamespace,
    /// Every object of the kind in the cluster.
    ClusterWide,
    /// Objects matching a label selector in kubectl syntax.
    Labels(String),
}

/// A kind the controller reads without owning (WIT `read`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Read {
    /// Name of the read in the snapshot, unique within the controller.
    pub id: String,
    /// The kind read.
    pub kind: KindRef,
    /// Which objects of the kind the snapshot holds.
    pub selector: Selector,
}

/// A target of HTTP requests (WIT `http-target`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpTarget {
    /// Name the requests use for this target.
    pub id: String,
    /// Pods or Services the primary owns or reads.
    pub kind: KindRef,
    /// Ports that may be called.
    pub ports: Vec<u16>,
}

/// One reconciler inside a plugin (WIT `controller`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Controller {
    /// Name, unique within the plugin.
    pub name: String,
    /// The kind reconciled.
    pub primary: KindRef,
    /// Kinds the controller may create, update and delete.
    pub owns: Vec<KindRef>,
    /// Kinds read without owning.
    pub reads: Vec<Read>,
    /// Finalizer the host manages on primaries, if any.
    pub finalizer: Option<String>,
    /// Namespaces besides the primary's that owned objects may be written to;
    /// `*` allows any; `setting:<key>` names the namespace held by a
    /// setting until [`Manifest::resolve_settings`] replaces it.
    pub write_namespaces: Vec<String>,
    /// Dotted paths of primary fields the plan may set.
    pub primary_fields: Vec<String>,
    /// Targets of HTTP requests.
    pub http_targets: Vec<HttpTarget>,
    /// A plan may delete the primary itself.
    #[serde(default)]
    pub delete_primary: bool,
}

impl Controller {
    /// The owned kind objects with this `apiVersion` and `kind` belong to.
    pub fn owned_kind(&self, api_version: &str, kind: &str) -> Option<&KindRef> {
        self.owns.iter().find(|k| k.matches(api_version, kind))
    }

    /// True when owned objects may be written into `namespace` for a primary
    /// living in `primary_namespace` (`None` for a cluster-scoped primary).
    ///
    /// An unresolved `setting:<key>` entry matches no namespace, so a
    /// manifest that was not resolved fails closed.
    pub fn may_write_namespace(&self, primary_namespace: Option<&str>, namespace: &str) -> bool {
        primary_namespace == Some(namespace)
            || self
                .write_namespaces
                .iter()
                .filter(|allowed| !allowed.starts_with(SETTING_PREFIX))
                .any(|allowed| allowed == "*" || allowed == namespace)
    }

    /// Every kind the controller touches: primary, owned, read and HTTP
    /// target kinds, deduplicated, in that order.
    pub fn kinds(&self) -> Vec<&KindRef> {
        let mut out: Vec<&KindRef> = Vec::new();
        let all = std::iter::once(&self.primary)
            .chain(self.owns.iter())
            .chain(self.reads.iter().map(|r| &r.kind))
            .chain(self.http_targets.iter().map(|t| &t.kind));
        for kind in all {
            if !out.contains(&kind) {
                out.push(kind);
            }
        }
        out
    }
}

/// What a plugin is and what it reconciles (WIT `manifest`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// Plugin name; used in the `wasmop.dev/plugin` label and field manager.
    pub name: String,
    /// Plugin version.
    pub version: String,
    /// One or more controllers.
    pub controllers: Vec<Controller>,
}

/// Prefix of a `write-namespaces` entry naming a plugin setting:
/// `setting:targetNamespace`.
pub const SETTING_PREFIX: &str = "setting:";

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

impl Manifest {
    /// The controller called `name`.
    pub fn controller(&self, name: &str) -> Option<&Controller> {
        self.controllers.iter().find(|c| c.name == name)
    }

    /// The controller whose primary kind matches an object's `apiVersion`
    /// and `kind` (group and kind compared; the version may differ).
    pub fn controller_for(&self, api_version: &str, kind: &str) -> Option<&Controller> {
        let (group, _) = split_api_version(api_version);
        self.controllers
            .iter()
            .find(|c| c.primary.kind == kind && c.primary.group == group)
    }

    /// The manifest with every `setting:<key>` entry of `write-namespaces`
    /// replaced by the namespace the top-level setting `<key>` holds.
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
        &self,
        settings: &serde_json::Value,
    ) -> Result<Manifest, Vec<ManifestProblem>> {
        let mut problems = Vec::new();
        let mut out = self.clone();
        for (ci, c) in out.controllers.iter_mut().enumerate() {
            let mut resolved: Vec<String> = Vec::with_capacity(c.write_namespaces.len());
            for (wi, entry) in c.write_namespaces.iter().enumerate() {
                let namespace = match entry.strip_prefix(SETTING_PREFIX) {
                    None => Some(entry.clone()),
                    Some(key) => match settings.get(key) {
                        None | Some(serde_json::Value::Null) => None,
                        Some(serde_json::Value::String(ns)) => match names::dns1123_label(ns) {
                            Ok(()) => Some(ns.clone()),
                            Err(why) => {
                                problems.push(ManifestProblem {
                                    path: format!("controllers[{ci}].writeNamespaces[{wi}]"),
                                    message: format!(
                                        "setting {key:?} names namespace {ns:?}, which {why}"
                                    ),
                                });
                                None
                            }
                        },
                        Some(other) => {
                            problems.push(ManifestProblem {
                                path: format!("controllers[{ci}].writeNamespaces[{wi}]"),
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
            c.write_namespaces = resolved;
        }
        if problems.is_empty() {
            Ok(out)
        } else {
            Err(problems)
        }
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
    /// non-empty key without blanks; primary fields are
    /// `spec.…`, `metadata.labels.…` or `metadata.annotations.…`; HTTP
    /// targets have unique ids, non-zero ports, and address Pods or
    /// Services the controller owns or reads.
    pub fn problems(&self) -> Vec<ManifestProblem> {
        let mut out = Vec::new();
        let mut problem =
            |path: String, message: String| out.push(ManifestProblem { path, message });

        if self.name.is_empty() {
            problem("name".into(), "plugin name is empty".into());
        } else if let Err(why) = names::dns1123_label(&self.name) {
            problem("name".into(), format!("plugin name {:?} {why}", self.name));
        }
        if self.version.trim().is_empty() {
            problem("version".into(), "plugin version is empty".into());
        }
        if self.controllers.is_empty() {
            problem(
                "controllers".into(),
                "the plugin declares no controller".into(),
            );
        }

        let mut controller_names = BTreeSet::new();
        let mut primaries: Vec<(&KindRef, &str)> = Vec::new();
        for (ci, c) in self.controllers.iter().enumerate() {
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
                for msg in kind_problems(owned) {
                    problem(path.clone(), msg);
                }
                if owned.same_type(&c.primary) {
                    problem(
                        path.clone(),
                        format!("primary kind {} is also listed as owned", owned),
                    );
                }
                if c.owns[..oi].iter().any(|k| k.same_type(owned)) {
                    problem(path, format!("kind {owned} is owned twice"));
                }
            }

            let mut read_ids = BTreeSet::new();
            for (ri, read) in c.reads.iter().enumerate() {
                let path = format!("{at}.reads[{ri}]");
                if read.id.is_empty() {
                    problem(format!("{path}.id"), "read id is empty".into());
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
                if let Some(key) = ns.strip_prefix(SETTING_PREFIX) {
                    if key.is_empty() || key.chars().any(char::is_whitespace) {
                        problem(
                            format!("{at}.writeNamespaces[{wi}]"),
                            format!("{ns:?} must name a setting: setting:<key>, without blanks"),
                        );
                    }
                } else if ns != "*"
                    && let Err(why) = names::dns1123_label(ns)
                {
                    problem(
                        format!("{at}.writeNamespaces[{wi}]"),
                        format!("namespace {ns:?} {why}"),
                    );
                }
            }
            for (fi, field) in c.primary_fields.iter().enumerate() {
                if let Err(why) = primary_field(field) {
                    problem(format!("{at}.primaryFields[{fi}]"), why);
                }
            }

            let mut target_ids = BTreeSet::new();
            for (ti, target) in c.http_targets.iter().enumerate() {
                let path = format!("{at}.httpTargets[{ti}]");
                if target.id.is_empty() || target.id == "allow-list" {
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
                let declared = c.owns.iter().any(|k| k.same_type(&target.kind))
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
}

/// Splits an `apiVersion` into group and version (`v1` → `("", "v1")`).
pub fn split_api_version(api_version: &str) -> (&str, &str) {
    match api_version.rsplit_once('/') {
        Some((group, version)) => (group, version),
        None => ("", api_version),
    }
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
            owns: vec![configmap()],
            reads: vec![],
            finalizer: None,
            write_namespaces: vec![],
            primary_fields: vec!["spec.id".into()],
            http_targets: vec![],
            delete_primary: false,
        }
    }

    pub(crate) fn manifest() -> Manifest {
        Manifest {
            name: "widget".into(),
            version: "0.1.0".into(),
            controllers: vec![controller()],
        }
    }

    fn messages(m: &Manifest) -> Vec<String> {
        m.problems().iter().map(ToString::to_string).collect()
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
        m.controllers[0].owns[0].plural.clear();
        assert_eq!(
            messages(&m),
            vec!["controllers[0].owns[0]: kind ConfigMap is missing its plural"]
        );
    }

    #[test]
    fn a_primary_kind_listed_as_owned_is_a_problem() {
        let mut m = manifest();
        m.controllers[0].owns.push(widget());
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
        };
        m.controllers[0].reads = vec![read.clone(), read];
        assert_eq!(
            messages(&m),
            vec!["controllers[0].reads[1].id: duplicate read id \"cm\""]
        );
    }

    #[test]
    fn broken_label_selectors_are_a_problem() {
        let mut m = manifest();
        m.controllers[0].reads = vec![Read {
            id: "cm".into(),
            kind: configmap(),
            selector: Selector::Labels("app in (a".into()),
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
        assert_eq!(m.problems().len(), 2);
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
    fn write_namespaces_are_star_or_labels() {
        let mut m = manifest();
        m.controllers[0].write_namespaces = vec!["*".into(), "ok-ns".into(), "Bad_NS".into()];
        assert_eq!(m.problems().len(), 1);
    }

    #[test]
    fn write_namespaces_may_name_a_setting() {
        let mut m = manifest();
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
        let m = with_setting_entry()
            .resolve_settings(&serde_json::json!({"targetNamespace": "backups"}))
            .unwrap();
        assert_eq!(m.controllers[0].write_namespaces, ["backups", "default-ns"]);
        assert!(m.controllers[0].may_write_namespace(None, "backups"));
        assert!(!m.controllers[0].may_write_namespace(None, "elsewhere"));
        let same = with_setting_entry()
            .resolve_settings(&serde_json::json!({"targetNamespace": "default-ns"}))
            .unwrap();
        assert_eq!(same.controllers[0].write_namespaces, ["default-ns"]);
    }

    #[test]
    fn an_absent_setting_resolves_to_nothing() {
        for settings in [
            serde_json::json!({}),
            serde_json::json!({"targetNamespace": null}),
        ] {
            let m = with_setting_entry().resolve_settings(&settings).unwrap();
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
            let problems = with_setting_entry()
                .resolve_settings(&serde_json::json!({"targetNamespace": value}))
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
}
