//! Assembling the snapshot of one primary: the primary, the objects it
//! owns, and the related objects its controller's reads select.
//!
//! Objects come from an [`ObjectSource`], which the caller implements over
//! whatever holds them: [`MemorySource`] over a list of objects (the
//! offline CLI, golden tests), the live watch cache over reflector stores.
//! [`build_snapshot`] applies the manifest's selection rules the same way
//! for both, so `wasmop plan` sees what the live operator would.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde_json::Value;

use crate::contract::manifest::{Controller, KindRef, Read, Selector, split_api_version};
use crate::contract::selector::LabelSelector;
use crate::judge::existing::{ExistingLookup, ExistingObject};
use crate::object;

/// Where snapshot objects come from.
///
/// # Guarantees expected of an implementation
///
/// Kinds are matched by group and kind (the version may differ, as the API
/// server converts between versions). Results need not be sorted;
/// [`build_snapshot`] sorts them.
pub trait ObjectSource {
    /// Objects of `kind` whose controller ownerReference has `owner_uid`.
    fn owned_by(&self, kind: &KindRef, owner_uid: &str) -> Vec<Arc<Value>>;
    /// The object of `kind` at `namespace`/`name` (`None` for cluster-scoped).
    fn get(&self, kind: &KindRef, namespace: Option<&str>, name: &str) -> Option<Arc<Value>>;
    /// Objects of `kind` in `namespace`, or in all namespaces for `None`.
    fn list(&self, kind: &KindRef, namespace: Option<&str>) -> Vec<Arc<Value>>;
    /// The objects of [`ObjectSource::list`] whose labels `selector`
    /// matches. The live source reads the labels without parsing the
    /// objects that do not match.
    fn list_matching(
        &self,
        kind: &KindRef,
        namespace: Option<&str>,
        selector: &LabelSelector,
    ) -> Vec<Arc<Value>> {
        self.list(kind, namespace)
            .into_iter()
            .filter(|o| selector.matches(&object::labels(o)))
            .collect()
    }
    /// The object a field reference names. The live source reads Secrets
    /// from the API server here instead of watching them all.
    fn get_named(&self, kind: &KindRef, namespace: Option<&str>, name: &str) -> Option<Arc<Value>> {
        self.get(kind, namespace, name)
    }
    /// True when `kind`, an optional kind of the controller (see
    /// `Controller::required_kinds`), has not been listed: its API is not
    /// served (e.g. its CRD is not installed) or its watch has not synced yet.
    fn absent(&self, _kind: &KindRef) -> bool {
        false
    }
}

/// An object selected by a read, tagged with the read's id (WIT `related-object`).
#[derive(Clone, Debug, PartialEq)]
pub struct RelatedObject {
    /// The read's id.
    pub read: String,
    /// The object.
    pub object: Arc<Value>,
}

pub use wasmop_contract::Observation;

/// Everything a plugin sees for one reconcile (WIT `snapshot`), in host
/// types. Converted to JSON texts only at the plugin boundary.
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    /// The controller the call is for.
    pub controller: String,
    /// The primary object.
    pub primary: Arc<Value>,
    /// Owned objects (by controller ownerReference or owner label, as each
    /// owned kind declares), sorted by kind, namespace and name.
    pub owned: Vec<Arc<Value>>,
    /// Objects selected by reads: reads in manifest order, objects of each
    /// read sorted by kind, namespace and name.
    pub related: Vec<RelatedObject>,
    /// Now, RFC 3339 in UTC.
    pub now: String,
    /// True when the primary has a deletionTimestamp.
    pub deleting: bool,
    /// The plugin's settings (`{}` when none).
    pub settings: Value,
    /// Results of earlier HTTP requests.
    pub observations: Vec<Observation>,
}

impl Snapshot {
    /// Approximate size in bytes of the snapshot's objects as JSON text.
    pub fn approximate_size(&self) -> usize {
        let len = |v: &Value| serde_json::to_string(v).map_or(0, |s| s.len());
        len(&self.primary)
            + self.owned.iter().map(|o| len(o)).sum::<usize>()
            + self.related.iter().map(|r| len(&r.object)).sum::<usize>()
    }
}

/// A reference one primary makes to another object through a `field` read.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct FieldReference {
    /// The read's id.
    pub read: String,
    /// The kind referenced.
    pub kind: KindRef,
    /// The namespace referenced (`None` for cluster-scoped kinds).
    pub namespace: Option<String>,
    /// The name referenced.
    pub name: String,
}

/// Builds the snapshot of `primary` for `controller` from `source`.
///
/// # Guarantees
///
/// - `owned` holds the objects of every owned kind whose controller
///   ownerReference UID is the primary's, each once.
/// - `related` holds, per read in manifest order: `owned-by-primary` — as
///   above for the read's kind; `field` — the one object named by the
///   primary's fields (nothing when the name field is missing or empty);
///   `same-namespace` — objects in the primary's namespace (all namespaces
///   when the read kind is cluster-scoped; nothing for a namespaced read
///   kind under a cluster-scoped primary); `cluster-wide` — every object;
///   `labels` — objects matching the selector in the primary's namespace
///   (cluster-wide for a cluster-scoped primary or read kind).
/// - Order is deterministic: objects sorted by kind, namespace, name.
pub fn build_snapshot(
    controller: &Controller,
    primary: Arc<Value>,
    source: &dyn ObjectSource,
    now: &str,
    settings: &Value,
    observations: Vec<Observation>,
) -> Snapshot {
    let uid = object::uid(&primary).to_owned();
    let mut owned = Vec::new();
    for kind in controller.owns.iter().filter(|k| !k.is_dependent()) {
        owned.extend(
            source
                .owned_by(&kind.kind, &uid)
                .into_iter()
                .filter(|o| ExistingObject::of(o).is_controlled_by(&uid, &kind.ownership)),
        );
    }
    let owned = sorted_unique(owned);

    let mut related = Vec::new();
    for read in &controller.reads {
        let objects = select(read, controller, &primary, source);
        related.extend(
            sorted_unique(objects)
                .into_iter()
                .map(|object| RelatedObject {
                    read: read.id.clone(),
                    object,
                }),
        );
    }

    // Optional kinds (only optional reads or optional owned kinds name
    // them) that are not listed: named, so a plugin can tell "no objects"
    // from "no API".
    related.extend(absent_kinds(controller, source));

    Snapshot {
        controller: controller.name.clone(),
        deleting: object::is_deleting(&primary),
        primary,
        owned,
        related,
        now: now.to_owned(),
        settings: settings.clone(),
        observations,
    }
}

fn select(
    read: &Read,
    controller: &Controller,
    primary: &Value,
    source: &dyn ObjectSource,
) -> Vec<Arc<Value>> {
    let primary_ns = primary_namespace(controller, primary);
    match &read.selector {
        Selector::OwnedByPrimary => source.owned_by(&read.kind, object::uid(primary)),
        Selector::Field(_) => field_reference(read, controller, primary)
            .and_then(|r| source.get_named(&read.kind, r.namespace.as_deref(), &r.name))
            .into_iter()
            .collect(),
        Selector::SameNamespace => match (read.kind.namespaced, primary_ns) {
            (false, _) => source.list(&read.kind, None),
            (true, Some(ns)) => source.list(&read.kind, Some(ns)),
            (true, None) => Vec::new(),
        },
        Selector::ClusterWide => source.list(&read.kind, None),
        Selector::Labels(text) => {
            // Manifests are checked at load, so the selector parses; a
            // selector that does not selects nothing.
            let Ok(selector) = LabelSelector::parse(text) else {
                return Vec::new();
            };
            let scope = if read.kind.namespaced {
                primary_ns
            } else {
                None
            };
            source.list_matching(&read.kind, scope, &selector)
        }
    }
}

/// One `AbsentKind` related object for each optional kind of `controller`
/// that `source` has not listed.
pub(crate) fn absent_kinds(
    controller: &Controller,
    source: &dyn ObjectSource,
) -> Vec<RelatedObject> {
    let required = controller.required_kinds();
    controller
        .kinds()
        .into_iter()
        .filter(|kind| !required.iter().any(|r| r.same_type(kind)) && source.absent(kind))
        .map(|kind| RelatedObject {
            read: wasmop_contract::ABSENT_KIND_READ.to_owned(),
            object: Arc::new(absent_kind(kind)),
        })
        .collect()
}

/// The object a snapshot carries under [`wasmop_contract::ABSENT_KIND_READ`]
/// for an optional kind that is not listed.
pub fn absent_kind(kind: &KindRef) -> Value {
    serde_json::json!({
        "apiVersion": "wasmop.dev/v1",
        "kind": "AbsentKind",
        "metadata": {"name": format!("{}.{}", kind.plural, kind.group)},
        "spec": {"group": kind.group, "version": kind.version, "kind": kind.kind, "plural": kind.plural},
    })
}

fn primary_namespace<'a>(controller: &Controller, primary: &'a Value) -> Option<&'a str> {
    if controller.primary.namespaced {
        object::namespace(primary)
    } else {
        None
    }
}

fn field_reference(
    read: &Read,
    controller: &Controller,
    primary: &Value,
) -> Option<FieldReference> {
    let Selector::Field(field) = &read.selector else {
        return None;
    };
    let name = object::str_at(primary, &field.name_path).filter(|n| !n.is_empty())?;
    let namespace = if read.kind.namespaced {
        let explicit = field
            .namespace_path
            .as_deref()
            .and_then(|p| object::str_at(primary, p))
            .filter(|ns| !ns.is_empty());
        Some(
            explicit
                .or(primary_namespace(controller, primary))?
                .to_owned(),
        )
    } else {
        None
    };
    Some(FieldReference {
        read: read.id.clone(),
        kind: read.kind.clone(),
        namespace,
        name: name.to_owned(),
    })
}

/// The objects `primary` names through the controller's `field` reads, for
/// the live side's reverse index ("which primaries reference this object").
/// Missing or empty name fields yield nothing.
pub fn referenced_names(controller: &Controller, primary: &Value) -> Vec<FieldReference> {
    controller
        .reads
        .iter()
        .filter_map(|read| field_reference(read, controller, primary))
        .collect()
}

/// Sort key: kind, namespace, name (then apiVersion for stability).
fn sort_key(o: &Value) -> (&str, &str, &str, &str) {
    (
        object::kind(o),
        object::namespace(o).unwrap_or_default(),
        object::name(o),
        object::api_version(o),
    )
}

fn sorted_unique(mut objects: Vec<Arc<Value>>) -> Vec<Arc<Value>> {
    objects.sort_by(|a, b| sort_key(a).cmp(&sort_key(b)));
    objects.dedup_by(|a, b| sort_key(a) == sort_key(b));
    objects
}

/// (group, kind) — how [`MemorySource`] tells kinds apart.
type TypeKey = (String, String);

/// An in-memory [`ObjectSource`] over a list of objects, indexed by kind,
/// namespace and name and by controller owner UID. Used by `wasmop plan`
/// and golden tests.
#[derive(Debug, Default, Clone)]
pub struct MemorySource {
    by_name: BTreeMap<(TypeKey, String, String), Arc<Value>>,
    by_owner: BTreeMap<(TypeKey, String), BTreeSet<(String, String)>>,
}

impl MemorySource {
    /// Indexes `objects`. A later object with the same kind, namespace and
    /// name replaces an earlier one.
    pub fn new(objects: impl IntoIterator<Item = Value>) -> Self {
        let mut source = MemorySource::default();
        for object in objects {
            source.insert(Arc::new(object));
        }
        source
    }

    /// Adds or replaces one object.
    pub fn insert(&mut self, obj: Arc<Value>) {
        let (group, _) = split_api_version(object::api_version(&obj));
        let key: TypeKey = (group.to_owned(), object::kind(&obj).to_owned());
        let ns = object::namespace(&obj).unwrap_or_default().to_owned();
        let name = object::name(&obj).to_owned();
        for owner in object::owner_uids(&obj) {
            self.by_owner
                .entry((key.clone(), owner.to_owned()))
                .or_default()
                .insert((ns.clone(), name.clone()));
        }
        self.by_name.insert((key, ns, name), obj);
    }

    /// Every object held, in kind/namespace/name order.
    pub fn objects(&self) -> impl Iterator<Item = &Arc<Value>> {
        self.by_name.values()
    }
}

fn type_key(kind: &KindRef) -> TypeKey {
    (kind.group.clone(), kind.kind.clone())
}

impl ObjectSource for MemorySource {
    fn owned_by(&self, kind: &KindRef, owner_uid: &str) -> Vec<Arc<Value>> {
        let key = type_key(kind);
        let Some(names) = self.by_owner.get(&(key.clone(), owner_uid.to_owned())) else {
            return Vec::new();
        };
        names
            .iter()
            .filter_map(|(ns, name)| self.by_name.get(&(key.clone(), ns.clone(), name.clone())))
            .filter(|o| object::owner_uids(o).contains(&owner_uid))
            .cloned()
            .collect()
    }

    fn get(&self, kind: &KindRef, namespace: Option<&str>, name: &str) -> Option<Arc<Value>> {
        let ns = if kind.namespaced {
            namespace.unwrap_or_default()
        } else {
            ""
        };
        self.by_name
            .get(&(type_key(kind), ns.to_owned(), name.to_owned()))
            .cloned()
    }

    fn list(&self, kind: &KindRef, namespace: Option<&str>) -> Vec<Arc<Value>> {
        let key = type_key(kind);
        self.by_name
            .range((key.clone(), String::new(), String::new())..)
            .take_while(|((k, _, _), _)| *k == key)
            .filter(|((_, ns, _), _)| namespace.is_none_or(|want| want == ns))
            .map(|(_, o)| o.clone())
            .collect()
    }

    /// An optional kind is absent when the objects hold its
    /// `wasmop.dev/v1 AbsentKind` marker (how a golden fixture or a
    /// `wasmop plan` input says "this CRD is not installed").
    fn absent(&self, kind: &KindRef) -> bool {
        let marker: TypeKey = ("wasmop.dev".to_owned(), "AbsentKind".to_owned());
        self.by_name.contains_key(&(
            marker,
            String::new(),
            format!("{}.{}", kind.plural, kind.group),
        ))
    }
}

/// Every source of objects answers for what exists.
impl<S: ObjectSource + ?Sized> ExistingLookup for S {
    fn existing(
        &self,
        kind: &KindRef,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<ExistingObject> {
        let found = self.get(kind, namespace, name)?;
        Some(ExistingObject::of(&found))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::contract::manifest::FieldRef;
    use crate::contract::manifest::tests::{configmap, controller};

    const UID: &str = "uid-w";

    fn primary() -> Value {
        json!({"apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
               "metadata": {"name": "w", "namespace": "ns", "uid": UID},
               "spec": {"configRef": "settings", "other": {"name": "x", "namespace": "elsewhere"}}})
    }

    fn cm(ns: &str, name: &str, owner: Option<&str>, labels: Value) -> Value {
        let mut o = json!({"apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": {"name": name, "namespace": ns, "labels": labels}});
        if let Some(uid) = owner {
            o["metadata"]["ownerReferences"] = json!([{"uid": uid, "controller": true}]);
        }
        o
    }

    fn names(objects: &[Arc<Value>]) -> Vec<String> {
        objects.iter().map(|o| object::describe(o)).collect()
    }

    fn related(snapshot: &Snapshot) -> Vec<String> {
        snapshot
            .related
            .iter()
            .map(|r| format!("{}: {}", r.read, object::describe(&r.object)))
            .collect()
    }

    fn source() -> MemorySource {
        MemorySource::new(vec![
            primary(),
            cm("ns", "b-owned", Some(UID), json!({})),
            cm("ns", "a-owned", Some(UID), json!({"app": "web"})),
            cm("ns", "foreign", Some("other"), json!({"app": "web"})),
            cm("ns", "settings", None, json!({"tier": "a"})),
            cm("elsewhere", "x", None, json!({})),
            cm("other-ns", "far", None, json!({"app": "web"})),
        ])
    }

    fn snapshot_with(reads: Vec<(&str, Selector)>) -> Snapshot {
        let mut c = controller();
        c.reads = reads
            .into_iter()
            .map(|(id, selector)| Read {
                id: id.into(),
                kind: configmap(),
                selector,
                optional: false,
            })
            .collect();
        build_snapshot(
            &c,
            Arc::new(primary()),
            &source(),
            "2025-01-01T00:00:00Z",
            &json!({}),
            vec![],
        )
    }

    #[test]
    fn owned_objects_are_those_controlled_by_the_primary_sorted() {
        let s = snapshot_with(vec![]);
        assert_eq!(
            names(&s.owned),
            vec!["ConfigMap ns/a-owned", "ConfigMap ns/b-owned"]
        );
        assert!(s.related.is_empty());
        assert!(!s.deleting);
    }

    #[test]
    fn field_reads_follow_name_and_namespace_paths() {
        let s = snapshot_with(vec![
            (
                "cfg",
                Selector::Field(FieldRef {
                    name_path: "spec.configRef".into(),
                    namespace_path: None,
                }),
            ),
            (
                "other",
                Selector::Field(FieldRef {
                    name_path: "spec.other.name".into(),
                    namespace_path: Some("spec.other.namespace".into()),
                }),
            ),
            (
                "missing",
                Selector::Field(FieldRef {
                    name_path: "spec.nothing".into(),
                    namespace_path: None,
                }),
            ),
        ]);
        assert_eq!(
            related(&s),
            vec!["cfg: ConfigMap ns/settings", "other: ConfigMap elsewhere/x"]
        );
    }

    #[test]
    fn same_namespace_and_cluster_wide_reads() {
        let s = snapshot_with(vec![("ns", Selector::SameNamespace)]);
        assert_eq!(s.related.len(), 4);
        let s = snapshot_with(vec![("all", Selector::ClusterWide)]);
        assert_eq!(s.related.len(), 6);
    }

    #[test]
    fn label_reads_stay_in_the_primarys_namespace() {
        let s = snapshot_with(vec![("web", Selector::Labels("app=web".into()))]);
        assert_eq!(
            related(&s),
            vec!["web: ConfigMap ns/a-owned", "web: ConfigMap ns/foreign"]
        );
    }

    #[test]
    fn owned_by_primary_reads() {
        let s = snapshot_with(vec![("mine", Selector::OwnedByPrimary)]);
        assert_eq!(
            related(&s),
            vec!["mine: ConfigMap ns/a-owned", "mine: ConfigMap ns/b-owned"]
        );
    }

    #[test]
    fn absent_optional_kinds_are_named_in_the_snapshot() {
        let mut c = controller();
        let route =
            KindRef::namespaced("gateway.networking.k8s.io", "v1", "HTTPRoute", "httproutes");
        c.owns
            .push(crate::contract::manifest::OwnedKind::label(route.clone()).optional());
        let marker = absent_kind(&route);
        let s = build_snapshot(
            &c,
            Arc::new(primary()),
            &source(),
            "now",
            &json!({}),
            vec![],
        );
        assert!(
            !s.related
                .iter()
                .any(|r| r.read == wasmop_contract::ABSENT_KIND_READ)
        );
        let mut with_marker = source();
        with_marker.insert(Arc::new(marker.clone()));
        let s = build_snapshot(
            &c,
            Arc::new(primary()),
            &with_marker,
            "now",
            &json!({}),
            vec![],
        );
        let absent: Vec<&Value> = s
            .related
            .iter()
            .filter(|r| r.read == wasmop_contract::ABSENT_KIND_READ)
            .map(|r| r.object.as_ref())
            .collect();
        assert_eq!(absent, vec![&marker]);
        assert_eq!(
            marker["metadata"]["name"],
            "httproutes.gateway.networking.k8s.io"
        );

        // An optional read's kind is named the same way; a kind a required
        // read also names never is (the controller waits for it instead).
        let policy = KindRef::namespaced(
            "security.istio.io",
            "v1",
            "AuthorizationPolicy",
            "authorizationpolicies",
        );
        c.reads
            .push(Read::new("policies", policy.clone(), Selector::SameNamespace).optional());
        let mut both = with_marker;
        both.insert(Arc::new(absent_kind(&policy)));
        let named = |c: &Controller, source: &MemorySource| -> Vec<String> {
            build_snapshot(c, Arc::new(primary()), source, "now", &json!({}), vec![])
                .related
                .iter()
                .filter(|r| r.read == wasmop_contract::ABSENT_KIND_READ)
                .map(|r| {
                    r.object["metadata"]["name"]
                        .as_str()
                        .unwrap_or("")
                        .to_owned()
                })
                .collect()
        };
        assert_eq!(
            named(&c, &both),
            vec![
                "httproutes.gateway.networking.k8s.io",
                "authorizationpolicies.security.istio.io"
            ]
        );
        c.reads.push(Read::new(
            "required",
            route.clone(),
            Selector::SameNamespace,
        ));
        assert_eq!(
            named(&c, &both),
            vec!["authorizationpolicies.security.istio.io"]
        );
    }

    #[test]
    fn deleting_follows_the_deletion_timestamp() {
        let mut p = primary();
        p["metadata"]["deletionTimestamp"] = json!("2025-01-01T00:00:00Z");
        let s = build_snapshot(
            &controller(),
            Arc::new(p),
            &source(),
            "now",
            &json!({}),
            vec![],
        );
        assert!(s.deleting);
    }

    #[test]
    fn referenced_names_lists_field_references_only() {
        let mut c = controller();
        c.reads = vec![
            Read {
                id: "cfg".into(),
                kind: configmap(),
                selector: Selector::Field(FieldRef {
                    name_path: "spec.configRef".into(),
                    namespace_path: None,
                }),
                optional: false,
            },
            Read {
                id: "all".into(),
                kind: configmap(),
                selector: Selector::ClusterWide,
                optional: false,
            },
        ];
        assert_eq!(
            referenced_names(&c, &primary()),
            vec![FieldReference {
                read: "cfg".into(),
                kind: configmap(),
                namespace: Some("ns".into()),
                name: "settings".into(),
            }]
        );
    }

    #[test]
    fn memory_source_matches_kinds_by_group_not_version() {
        let mut kind = configmap();
        kind.version = "v2".into();
        assert!(source().get(&kind, Some("ns"), "settings").is_some());
        assert_eq!(source().list(&kind, Some("ns")).len(), 4);
    }
}
