//! The RBAC rules a plugin needs, derived from its manifest, as
//! `wasmop inspect` prints them.
//!
//! - primary kinds: get, list, watch; patch (finalizers and
//!   `primary-fields`); delete when the controller declares
//!   `delete-primary`; `<plural>/status`: patch;
//!   `<plural>/finalizers`: update (needed to set `blockOwnerDeletion`
//!   ownerReferences to the primary).
//! - owned kinds: get, list, watch, create (a server-side apply of a new
//!   object is authorized as create), patch, delete; dependent kinds
//!   (controlled by an owned object): get, delete.
//! - read kinds and HTTP target kinds: get, list, watch; Secrets named by a
//!   field reference only get (they are read by name, never listed).
//! - Events (`events.k8s.io`, what the host's recorder writes): create,
//!   patch.
//!
//! No `update` but on finalizers: the host writes by server-side apply
//! and merge patch, never by a whole-object PUT (the API server's audit
//! log of `deploy/run-local.sh --check --rbac` shows it).
//!
//! A ClusterRole grants in every namespace; what the manifest confines to
//! the primary's namespace is enforced by plan validation. Controllers that
//! may write owned objects into other namespaces (`write-namespaces`) are
//! called out in the annotation [`CROSS_NAMESPACE_ANNOTATION`], so whoever
//! reviews the role sees which writes really cross namespaces.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::contract::manifest::Manifest;

const READ: &[&str] = &["get", "list", "watch"];
const WRITE: &[&str] = &["create", "patch", "delete"];

/// Verbs in the order kubectl users expect to read them.
const VERB_ORDER: &[&str] = &[
    "get", "list", "watch", "create", "update", "patch", "delete",
];

/// What one (API group, resource) is granted, and whether the resource is
/// namespaced (so a Role can hold it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grant {
    /// The verbs.
    pub verbs: BTreeSet<&'static str>,
    /// True for namespaced resources.
    pub namespaced: bool,
}

/// Grants keyed by (API group, resource).
pub type Grants = BTreeMap<(String, String), Grant>;

/// Adds `verbs` on `group`/`resource` to `grants`.
pub fn grant(
    grants: &mut Grants,
    group: &str,
    resource: String,
    namespaced: bool,
    verbs: &[&'static str],
) {
    let g = grants.entry((group.to_owned(), resource)).or_default();
    g.namespaced = namespaced;
    g.verbs.extend(verbs.iter().copied());
}

/// Everything the plugin's controllers need, per (group, resource).
pub fn grants(manifest: &Manifest) -> Grants {
    let mut grants = Grants::new();
    let mut grant = |group: &str, resource: String, namespaced: bool, verbs: &[&'static str]| {
        grant(&mut grants, group, resource, namespaced, verbs);
    };
    for c in &manifest.controllers {
        let p = &c.primary;
        let ns = p.namespaced;
        grant(&p.group, p.plural.clone(), ns, READ);
        grant(&p.group, p.plural.clone(), ns, &["patch"]);
        if c.delete_primary {
            grant(&p.group, p.plural.clone(), ns, &["delete"]);
        }
        grant(&p.group, format!("{}/status", p.plural), ns, &["patch"]);
        grant(
            &p.group,
            format!("{}/finalizers", p.plural),
            ns,
            &["update"],
        );
        for owned in &c.owns {
            let k = &owned.kind;
            if owned.is_dependent() {
                // Read when judged, deleted; never created or changed.
                grant(&k.group, k.plural.clone(), k.namespaced, &["get", "delete"]);
                continue;
            }
            grant(&k.group, k.plural.clone(), k.namespaced, READ);
            grant(&k.group, k.plural.clone(), k.namespaced, WRITE);
        }
        for read in &c.reads {
            let k = &read.kind;
            // Secrets named by a field are read by name, never listed.
            let verbs = if crate::watch::by_name::is_by_name(read) {
                &["get"][..]
            } else {
                READ
            };
            grant(&k.group, k.plural.clone(), k.namespaced, verbs);
        }
        for target in &c.http_targets {
            let k = &target.kind;
            grant(&k.group, k.plural.clone(), k.namespaced, READ);
        }
    }
    grant(
        "events.k8s.io",
        "events".to_owned(),
        true,
        &["create", "patch"],
    );
    grants
}

/// `grants` as rules: one per (group, verb set) listing its resources,
/// deterministic in order.
pub fn merge_rules<'a>(
    grants: impl IntoIterator<Item = (&'a (String, String), &'a Grant)>,
) -> Vec<PolicyRule> {
    let mut merged: BTreeMap<(String, Vec<&str>), Vec<String>> = BTreeMap::new();
    for ((group, resource), grant) in grants {
        let verbs: Vec<&str> = VERB_ORDER
            .iter()
            .copied()
            .filter(|v| grant.verbs.contains(v))
            .collect();
        merged
            .entry((group.clone(), verbs))
            .or_default()
            .push(resource.clone());
    }
    let mut out: Vec<PolicyRule> = merged
        .into_iter()
        .map(|((group, verbs), resources)| PolicyRule {
            api_groups: Some(vec![group]),
            resources: Some(resources),
            verbs: verbs.into_iter().map(str::to_owned).collect(),
            ..PolicyRule::default()
        })
        .collect();
    out.sort_by(|a, b| (&a.api_groups, &a.resources).cmp(&(&b.api_groups, &b.resources)));
    out
}

/// The rules the plugin's controllers need, merged per API group and
/// resource, deterministic in order.
pub fn rules(manifest: &Manifest) -> Vec<PolicyRule> {
    merge_rules(&grants(manifest))
}

/// Annotation of the generated ClusterRole naming the writes that leave
/// the primary's namespace.
pub const CROSS_NAMESPACE_ANNOTATION: &str = "wasmop.dev/cross-namespace-writes";

/// The owned kinds each controller may write outside its primary's
/// namespace, and where (each kind's write scope,
/// [`Controller::kind_write_namespaces`](crate::contract::manifest::Controller::kind_write_namespaces)):
/// one line per controller and scope, `None` when none does.
pub fn cross_namespace_writes(manifest: &Manifest) -> Option<String> {
    let mut lines: Vec<String> = Vec::new();
    for c in &manifest.controllers {
        // Kinds with the same write scope on one line.
        let mut scopes: Vec<(Vec<String>, Vec<String>)> = Vec::new();
        for o in &c.owns {
            let scope = c.kind_write_namespaces(o);
            if scope.is_empty() {
                continue;
            }
            let kind = match o.kind.group.as_str() {
                "" => o.kind.plural.clone(),
                group => format!("{}.{group}", o.kind.plural),
            };
            match scopes.iter_mut().find(|(s, _)| *s == scope) {
                Some((_, kinds)) => kinds.push(kind),
                None => scopes.push((scope, vec![kind])),
            }
        }
        for (scope, kinds) in scopes {
            let places: Vec<String> = scope
                .iter()
                .map(|n| {
                    if n == "*" {
                        "any namespace".to_owned()
                    } else {
                        format!("namespace {n}")
                    }
                })
                .collect();
            lines.push(format!(
                "controller {} writes {} outside its primary's namespace, in {}",
                c.name,
                kinds.join(", "),
                places.join(", ")
            ));
        }
    }
    (!lines.is_empty()).then(|| lines.join("\n"))
}

/// A ClusterRole `wasmop-plugin-<name>` holding [`rules`], annotated with
/// [`cross_namespace_writes`].
pub fn cluster_role(manifest: &Manifest) -> ClusterRole {
    ClusterRole {
        metadata: ObjectMeta {
            name: Some(format!("wasmop-plugin-{}", manifest.name)),
            annotations: cross_namespace_writes(manifest)
                .map(|w| [(CROSS_NAMESPACE_ANNOTATION.to_owned(), w)].into()),
            ..ObjectMeta::default()
        },
        rules: Some(rules(manifest)),
        ..ClusterRole::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::manifest::tests::manifest;

    fn as_text(rules: &[PolicyRule]) -> Vec<String> {
        rules
            .iter()
            .map(|r| {
                format!(
                    "{:?} {:?} {:?}",
                    r.api_groups.clone().unwrap_or_default(),
                    r.resources.clone().unwrap_or_default(),
                    r.verbs
                )
            })
            .collect()
    }

    #[test]
    fn rules_cover_primary_owned_status_and_events() {
        assert_eq!(
            as_text(&rules(&manifest())),
            vec![
                r#"[""] ["configmaps"] ["get", "list", "watch", "create", "patch", "delete"]"#,
                r#"["events.k8s.io"] ["events"] ["create", "patch"]"#,
                r#"["test.wasmop.dev"] ["widgets"] ["get", "list", "watch", "patch"]"#,
                r#"["test.wasmop.dev"] ["widgets/finalizers"] ["update"]"#,
                r#"["test.wasmop.dev"] ["widgets/status"] ["patch"]"#,
            ]
        );
    }

    #[test]
    fn cross_namespace_writes_are_called_out_on_the_role() {
        use crate::contract::manifest::{KindRef, OwnedKind};
        let m = manifest();
        assert_eq!(cross_namespace_writes(&m), None);
        assert!(cluster_role(&m).metadata.annotations.is_none());
        let mut m = manifest();
        m.controllers[0].owns[0] = OwnedKind::label(m.controllers[0].owns[0].kind.clone());
        m.controllers[0].finalizer = Some("f".into());
        m.controllers[0].write_namespaces = vec!["*".into(), "audit".into()];
        // A kind narrowed to its primary's namespace is not called out; one
        // narrowed to a namespace is, on a line of its own.
        m.controllers[0].owns.push(
            OwnedKind::label(KindRef::namespaced(
                "apps",
                "v1",
                "Deployment",
                "deployments",
            ))
            .own_namespace_only(),
        );
        m.controllers[0].owns.push(
            OwnedKind::label(KindRef::namespaced("", "v1", "Secret", "secrets"))
                .write_namespace("audit"),
        );
        let role = cluster_role(&m);
        let called_out = role
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(CROSS_NAMESPACE_ANNOTATION))
            .cloned()
            .unwrap_or_default();
        assert_eq!(
            called_out,
            format!(
                "controller {0} writes configmaps outside its primary's namespace, in any namespace, namespace audit\n\
                 controller {0} writes secrets outside its primary's namespace, in namespace audit",
                m.controllers[0].name
            )
        );
    }

    #[test]
    fn delete_primary_grants_delete_on_the_primary() {
        let mut m = manifest();
        m.controllers[0].delete_primary = true;
        let text = as_text(&rules(&m));
        assert!(
            text.contains(
                &r#"["test.wasmop.dev"] ["widgets"] ["get", "list", "watch", "patch", "delete"]"#
                    .to_owned()
            ),
            "{text:?}"
        );
    }

    #[test]
    fn secrets_named_by_a_field_are_only_got_other_reads_listed() {
        use crate::contract::manifest::{FieldRef, KindRef, Read, Selector};
        let secret = KindRef::namespaced("", "v1", "Secret", "secrets");
        let mut m = manifest();
        m.controllers[0].reads.push(Read {
            id: "creds".into(),
            kind: secret.clone(),
            selector: Selector::Field(FieldRef {
                name_path: "spec.secretRef".into(),
                namespace_path: None,
            }),
            optional: false,
        });
        let text = as_text(&rules(&m));
        assert!(
            text.contains(&r#"[""] ["secrets"] ["get"]"#.to_owned()),
            "{text:?}"
        );
        m.controllers[0].reads.push(Read {
            id: "all".into(),
            kind: secret,
            selector: Selector::SameNamespace,
            optional: false,
        });
        let text = as_text(&rules(&m));
        assert!(
            text.iter()
                .any(|t| t.contains(r#"["secrets"]"#) && t.contains(r#""list", "watch""#)),
            "a same-namespace read of Secrets needs list and watch: {text:?}"
        );
    }
}
