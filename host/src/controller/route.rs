//! Routing: which primaries a cache change concerns. Pure apart from the
//! reference index it keeps current, so it is unit-tested without a cluster.
//!
//! # Guarantees
//!
//! - A primary is routed when anything but its status and bookkeeping
//!   metadata changed ([`trigger_view`]), so the host's own status writes
//!   never loop.
//! - An owned object routes to the primary that owns it: its controller
//!   ownerReference's UID for owner-reference kinds, its
//!   `wasmop.dev/owner-uid` label for owner-label kinds.
//! - A related object routes to exactly the primaries that select it:
//!   through the reference index for field references, by namespace for
//!   same-namespace reads, all for cluster-wide reads, by label for label
//!   reads.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use serde_json::Value;

use crate::contract::manifest::{Controller, KindRef, Ownership, Selector};
use crate::contract::selector::selector_matches;
use crate::controller::{PrimaryKey, RECONCILED_BY_ANNOTATION};
use crate::judge::snapshot;
use crate::object;
use crate::watch::cache::{CachedObject, Change, KindKey};

/// `(namespace, name)` of a primary.
pub(crate) type ObjId = (String, String);
/// `(kind, namespace, name)` a field reference names.
pub(crate) type RefTarget = (KindKey, String, String);

/// Which primaries name which objects through field references.
#[derive(Debug, Default)]
pub(crate) struct RefIndex {
    by_target: HashMap<RefTarget, HashSet<ObjId>>,
    by_primary: HashMap<ObjId, Vec<RefTarget>>,
}

impl RefIndex {
    pub(crate) fn set(&mut self, primary: ObjId, targets: Vec<RefTarget>) {
        self.clear(&primary);
        for t in &targets {
            self.by_target
                .entry(t.clone())
                .or_default()
                .insert(primary.clone());
        }
        if !targets.is_empty() {
            self.by_primary.insert(primary, targets);
        }
    }

    pub(crate) fn clear(&mut self, primary: &ObjId) {
        for t in self.by_primary.remove(primary).unwrap_or_default() {
            if let Some(set) = self.by_target.get_mut(&t) {
                set.remove(primary);
                if set.is_empty() {
                    self.by_target.remove(&t);
                }
            }
        }
    }

    /// `(namespace, name)` of every object of `kind` some primary names.
    pub(crate) fn targets_of(&self, kind: &KindKey) -> Vec<(String, String)> {
        self.by_target
            .keys()
            .filter(|(k, _, _)| k == kind)
            .map(|(_, ns, name)| (ns.clone(), name.clone()))
            .collect()
    }

    pub(crate) fn referrers(&self, target: &RefTarget) -> Vec<ObjId> {
        let mut out: Vec<ObjId> = self
            .by_target
            .get(target)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        out.sort();
        out
    }
}

/// What routing needs of one running controller.
#[derive(Debug)]
pub(crate) struct Route {
    /// `plugin/controller`.
    pub(crate) id: Arc<str>,
    /// The controller as the manifest declares it.
    pub(crate) spec: Controller,
    /// Cache key of its primary kind.
    pub(crate) primary: KindKey,
    /// Its field references.
    pub(crate) refs: Mutex<RefIndex>,
}

impl Route {
    pub(crate) fn new(id: Arc<str>, spec: Controller) -> Self {
        Route {
            id,
            primary: kind_key(&spec.primary),
            spec,
            refs: Mutex::new(RefIndex::default()),
        }
    }

    /// True when the controller reads objects through field references
    /// (only then does [`Route::index_refs`] record anything).
    pub(crate) fn has_field_reads(&self) -> bool {
        self.spec
            .reads
            .iter()
            .any(|r| matches!(r.selector, Selector::Field(_)))
    }

    /// Records the objects `primary` names through field references.
    pub(crate) fn index_refs(&self, primary: &Value) {
        let targets = snapshot::referenced_names(&self.spec, primary)
            .into_iter()
            .map(|r| (kind_key(&r.kind), r.namespace.unwrap_or_default(), r.name))
            .collect();
        self.refs
            .lock()
            .expect("refs lock")
            .set(obj_id(primary), targets);
    }
}

/// The primaries routing can look up (the primary kinds' caches).
pub(crate) trait PrimaryLookup {
    /// The primary of `kind` with this UID.
    fn by_uid(&self, kind: &KindKey, uid: &str) -> Option<Arc<CachedObject>>;
    /// The primaries of `kind` in `namespace` (all for `None`).
    fn list(&self, kind: &KindKey, namespace: Option<&str>) -> Vec<Arc<CachedObject>>;
    /// The primary of `kind` named `name` in `namespace` (empty for a
    /// cluster-scoped kind).
    fn by_name(&self, kind: &KindKey, namespace: &str, name: &str) -> Option<Arc<CachedObject>>;
}

/// Where a change goes.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Routed {
    /// Primaries to reconcile, sorted, without duplicates.
    pub(crate) keys: Vec<PrimaryKey>,
    /// Primaries that are gone: forget their queue entries and results.
    pub(crate) gone: Vec<(PrimaryKey, String)>,
}

/// Cache key of a manifest kind.
pub fn kind_key(kind: &KindRef) -> KindKey {
    KindKey::new(&kind.group, &kind.version, &kind.kind)
}

pub(crate) fn key_of(controller: &Arc<str>, obj: &Value) -> PrimaryKey {
    PrimaryKey {
        controller: controller.clone(),
        namespace: object::namespace(obj).unwrap_or_default().to_string(),
        name: object::name(obj).to_string(),
    }
}

/// [`key_of`] a cached object, without parsing it.
pub(crate) fn cached_key_of(controller: &Arc<str>, obj: &CachedObject) -> PrimaryKey {
    PrimaryKey {
        controller: controller.clone(),
        namespace: obj.namespace().to_string(),
        name: obj.name().to_string(),
    }
}

pub(crate) fn obj_id(obj: &Value) -> ObjId {
    (
        object::namespace(obj).unwrap_or_default().to_string(),
        object::name(obj).to_string(),
    )
}

/// What of a primary may trigger a reconcile: everything but its status and
/// bookkeeping metadata.
pub(crate) fn trigger_view(obj: &Value) -> Value {
    let mut v = obj.clone();
    if let Some(m) = v.as_object_mut() {
        m.remove("status");
    }
    crate::object::strip_bookkeeping(&mut v);
    if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("resourceVersion");
        if let Some(ann) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
            ann.remove(RECONCILED_BY_ANNOTATION);
            if ann.is_empty() {
                meta.remove("annotations");
            }
        }
    }
    v
}

/// The UID an owned object names as its owner under `ownership`.
fn owner_uid<'a>(obj: &'a Value, ownership: &Ownership) -> Option<&'a str> {
    match ownership {
        Ownership::OwnerReference => object::controller_uid(obj),
        Ownership::OwnerLabel { .. } => object::labels_get(obj, wasmop_contract::OWNER_UID_LABEL),
        // Controlled by an owned object, not by the primary: its changes
        // reach the primary through a read, if the controller has one.
        Ownership::Dependent => None,
    }
}

/// The primary of `r`'s kind named as `obj`'s controller ownerReference
/// names its owner, when the cache holds one under that name (it has
/// another UID: the owner was deleted and re-created).
fn namesake_of_gone_owner(
    r: &Route,
    lookup: &dyn PrimaryLookup,
    obj: &Value,
) -> Option<Arc<CachedObject>> {
    let owner = object::controller_ref(obj)?;
    let text = |k: &str| owner.get(k).and_then(Value::as_str).unwrap_or_default();
    let primary = &r.spec.primary;
    if !primary.matches(text("apiVersion"), text("kind")) {
        return None;
    }
    let name = owner.get("name").and_then(Value::as_str)?;
    let namespace = if primary.namespaced {
        object::namespace(obj)?
    } else {
        ""
    };
    lookup.by_name(&r.primary, namespace, name)
}

/// Which primaries of `routes` a cache change concerns.
pub(crate) fn route(routes: &[&Route], change: &Change, lookup: &dyn PrimaryLookup) -> Routed {
    let mut out = Routed::default();
    // The cache holds text: each side of the change is parsed once here.
    let old = change.old.as_ref().map(|o| o.value());
    let new = change.new.as_ref().map(|o| o.value());
    let objects: Vec<&Value> = old.iter().chain(new.iter()).collect();
    for r in routes {
        if r.primary == change.kind {
            match (&old, &new) {
                (_, Some(new)) => {
                    r.index_refs(new);
                    let changed = old
                        .as_ref()
                        .is_none_or(|old| trigger_view(old) != trigger_view(new));
                    if changed {
                        out.keys.push(key_of(&r.id, new));
                    }
                }
                (Some(old), None) => {
                    r.refs.lock().expect("refs lock").clear(&obj_id(old));
                    out.gone
                        .push((key_of(&r.id, old), object::uid(old).to_owned()));
                }
                (None, None) => {}
            }
        }
        // Owned objects (and reads of owned objects) route to their owner.
        let ownerships: Vec<&Ownership> = r
            .spec
            .owns
            .iter()
            .filter(|o| kind_key(&o.kind) == change.kind)
            .map(|o| &o.ownership)
            .chain(
                r.spec
                    .reads
                    .iter()
                    .filter(|rd| {
                        kind_key(&rd.kind) == change.kind
                            && matches!(rd.selector, Selector::OwnedByPrimary)
                    })
                    .flat_map(|_| [&Ownership::OwnerReference, &OWNER_LABEL]),
            )
            .collect();
        for ownership in ownerships {
            for obj in &objects {
                let Some(uid) = owner_uid(obj, ownership) else {
                    continue;
                };
                match lookup.by_uid(&r.primary, uid) {
                    Some(p) => out.keys.push(cached_key_of(&r.id, &p)),
                    // A kind-scoped controller decides all its primaries
                    // in one call, so an object of its plugin whose owner
                    // is gone may still matter to the others: a Job the
                    // garbage collector deletes after its EtcdBackup was
                    // re-created under the same name unblocks the new
                    // one. Without this, nothing would call it until the
                    // next resync.
                    None if r.spec.scope == wasmop_contract::Scope::Kind
                        && object::labels_get(obj, wasmop_contract::PLUGIN_LABEL)
                            == r.id.split('/').next() =>
                    {
                        out.keys.push(super::whole_kind_key(&r.id));
                    }
                    // An object whose owner is gone, changing (deleted by
                    // the garbage collector or a collection, or a finalizer
                    // letting it go): a primary re-created under the
                    // owner's name may be waiting for the name it holds.
                    None if matches!(ownership, Ownership::OwnerReference) => {
                        if let Some(p) = namesake_of_gone_owner(r, lookup, obj) {
                            out.keys.push(cached_key_of(&r.id, &p));
                        }
                    }
                    None => {}
                }
            }
        }
        for read in r
            .spec
            .reads
            .iter()
            .filter(|rd| kind_key(&rd.kind) == change.kind)
        {
            match &read.selector {
                Selector::OwnedByPrimary => {}
                Selector::Field(_) => {
                    let refs = r.refs.lock().expect("refs lock");
                    for obj in &objects {
                        let target = (
                            change.kind.clone(),
                            object::namespace(obj).unwrap_or_default().to_string(),
                            object::name(obj).to_string(),
                        );
                        for (namespace, name) in refs.referrers(&target) {
                            out.keys.push(PrimaryKey {
                                controller: r.id.clone(),
                                namespace,
                                name,
                            });
                        }
                    }
                }
                Selector::SameNamespace => {
                    for obj in &objects {
                        out.keys
                            .extend(primaries_in(r, lookup, object::namespace(obj)));
                    }
                }
                Selector::ClusterWide => out.keys.extend(primaries_in(r, lookup, None)),
                Selector::Labels(sel) => {
                    for obj in &objects {
                        if selector_matches(sel, &object::labels(obj)) {
                            out.keys
                                .extend(primaries_in(r, lookup, object::namespace(obj)));
                        }
                    }
                }
            }
        }
    }
    out.keys.sort();
    out.keys.dedup();
    out
}

const OWNER_LABEL: Ownership = Ownership::OwnerLabel {
    extra_label: None,
    collected: false,
};

fn primaries_in(r: &Route, lookup: &dyn PrimaryLookup, namespace: Option<&str>) -> Vec<PrimaryKey> {
    let namespace = if r.spec.primary.namespaced {
        namespace
    } else {
        None
    };
    lookup
        .list(&r.primary, namespace)
        .iter()
        .map(|p| cached_key_of(&r.id, p))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;
    use crate::contract::manifest::{Read, Selector};

    fn widget_kind() -> KindRef {
        KindRef::namespaced("test.wasmop.dev", "v1", "Widget", "widgets")
    }
    fn cm_kind() -> KindRef {
        KindRef::namespaced("", "v1", "ConfigMap", "configmaps")
    }
    fn secret_kind() -> KindRef {
        KindRef::namespaced("", "v1", "Secret", "secrets")
    }

    fn widget(ns: &str, name: &str, uid: &str) -> Arc<Value> {
        Arc::new(json!({"apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
            "metadata": {"name": name, "namespace": ns, "uid": uid, "resourceVersion": "1"},
            "spec": {"secretRef": "s", "x": 1}}))
    }

    /// Primaries by kind, for lookups.
    #[derive(Default)]
    struct Primaries(BTreeMap<String, Arc<Value>>);

    impl PrimaryLookup for Primaries {
        fn by_uid(&self, _: &KindKey, uid: &str) -> Option<Arc<CachedObject>> {
            self.0
                .values()
                .find(|p| object::uid(p) == uid)
                .map(|p| Arc::new(CachedObject::from_value(p)))
        }
        fn list(&self, _: &KindKey, namespace: Option<&str>) -> Vec<Arc<CachedObject>> {
            self.0
                .values()
                .filter(|p| namespace.is_none_or(|ns| object::namespace(p) == Some(ns)))
                .map(|p| Arc::new(CachedObject::from_value(p)))
                .collect()
        }
        fn by_name(&self, _: &KindKey, namespace: &str, name: &str) -> Option<Arc<CachedObject>> {
            self.0
                .get(&format!("{namespace}/{name}"))
                .map(|p| Arc::new(CachedObject::from_value(p)))
        }
    }

    fn world() -> Primaries {
        let mut p = Primaries::default();
        for (ns, name, uid) in [("a", "w1", "u1"), ("a", "w2", "u2"), ("b", "w3", "u3")] {
            p.0.insert(format!("{ns}/{name}"), widget(ns, name, uid));
        }
        p
    }

    fn route_of(spec: Controller) -> Route {
        Route::new("good/widget".into(), spec)
    }

    fn change(kind: &KindRef, old: Option<Value>, new: Option<Value>) -> Change {
        Change {
            kind: kind_key(kind),
            old: old.map(|v| Arc::new(CachedObject::from_value(&v))),
            new: new.map(|v| Arc::new(CachedObject::from_value(&v))),
        }
    }

    fn names(routed: &Routed) -> Vec<String> {
        routed
            .keys
            .iter()
            .map(|k| format!("{}/{}", k.namespace, k.name))
            .collect()
    }

    #[test]
    fn a_status_only_change_of_a_primary_routes_nothing() {
        let r = route_of(Controller::new("widget", widget_kind()));
        let old = (*widget("a", "w1", "u1")).clone();
        let mut new = old.clone();
        new["status"] = json!({"ready": true});
        new["metadata"]["resourceVersion"] = json!("2");
        let routed = route(
            &[&r],
            &change(&widget_kind(), Some(old.clone()), Some(new)),
            &world(),
        );
        assert!(routed.keys.is_empty());
        let mut spec_changed = old.clone();
        spec_changed["spec"]["x"] = json!(2);
        let routed = route(
            &[&r],
            &change(&widget_kind(), Some(old), Some(spec_changed)),
            &world(),
        );
        assert_eq!(names(&routed), ["a/w1"]);
    }

    #[test]
    fn an_object_of_a_gone_owner_routes_to_the_primary_re_created_under_its_name() {
        let r = route_of(Controller::new("widget", widget_kind()).owns(cm_kind()));
        let owned_by = |kind: &str, api_version: &str, name: &str, ns: &str| {
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "c", "namespace": ns,
                    "ownerReferences": [{"apiVersion": api_version, "kind": kind,
                        "name": name, "uid": "gone", "controller": true}]}})
        };
        // Its deletion (the garbage collector's, or a collection's)
        // reaches w1, which holds the owner's name.
        let old = owned_by("Widget", "test.wasmop.dev/v1", "w1", "a");
        let routed = route(&[&r], &change(&cm_kind(), Some(old), None), &world());
        assert_eq!(names(&routed), ["a/w1"]);
        // No primary of that name in that namespace, another kind of the
        // name, or the name in another group: nothing.
        for other in [
            owned_by("Widget", "test.wasmop.dev/v1", "w9", "a"),
            owned_by("Widget", "test.wasmop.dev/v1", "w1", "b"),
            owned_by("Gadget", "test.wasmop.dev/v1", "w1", "a"),
            owned_by("Widget", "other.dev/v1", "w1", "a"),
        ] {
            let routed = route(
                &[&r],
                &change(&cm_kind(), Some(other.clone()), None),
                &world(),
            );
            assert!(routed.keys.is_empty(), "{other}");
        }
    }

    #[test]
    fn an_owned_change_routes_to_its_owner_by_reference_or_by_label() {
        let by_ref = route_of(Controller::new("widget", widget_kind()).owns(cm_kind()));
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c", "namespace": "a",
                "ownerReferences": [{"uid": "u2", "controller": true}]}});
        let routed = route(&[&by_ref], &change(&cm_kind(), None, Some(cm)), &world());
        assert_eq!(names(&routed), ["a/w2"]);

        let by_label = route_of(
            Controller::new("widget", widget_kind())
                .owns_by_label(cm_kind(), None)
                .finalizer("f"),
        );
        let labelled = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c", "namespace": "elsewhere",
                "labels": {"wasmop.dev/owner-uid": "u3"}}});
        let routed = route(
            &[&by_label],
            &change(&cm_kind(), None, Some(labelled.clone())),
            &world(),
        );
        assert_eq!(names(&routed), ["b/w3"]);
        // A label-owned kind ignores ownerReferences and vice versa.
        let routed = route(
            &[&by_ref],
            &change(&cm_kind(), None, Some(labelled)),
            &world(),
        );
        assert!(routed.keys.is_empty());
    }

    #[test]
    fn an_object_of_a_gone_owner_calls_its_plugins_kind_scoped_controller_again() {
        let mut spec = Controller::new("widget", widget_kind()).owns(cm_kind());
        spec.scope = wasmop_contract::Scope::Kind;
        let kind_scoped = route_of(spec);
        let orphan = |plugin: &str| {
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "c", "namespace": "a",
                    "labels": {"wasmop.dev/plugin": plugin},
                    "ownerReferences": [{"uid": "gone", "controller": true}]}})
        };
        let routed = route(
            &[&kind_scoped],
            &change(&cm_kind(), Some(orphan("good")), None),
            &world(),
        );
        assert_eq!(
            routed.keys,
            [crate::controller::whole_kind_key(&"good/widget".into())]
        );
        // Another plugin's object, or a per-object controller: nothing.
        let routed = route(
            &[&kind_scoped],
            &change(&cm_kind(), Some(orphan("other")), None),
            &world(),
        );
        assert!(routed.keys.is_empty());
        let per_object = route_of(Controller::new("widget", widget_kind()).owns(cm_kind()));
        let routed = route(
            &[&per_object],
            &change(&cm_kind(), Some(orphan("good")), None),
            &world(),
        );
        assert!(routed.keys.is_empty());
    }

    #[test]
    fn a_field_reference_routes_to_its_referrers_only() {
        let r = route_of(Controller::new("widget", widget_kind()).reads(Read::new(
            "secret",
            secret_kind(),
            Selector::field("spec.secretRef"),
        )));
        let w = world();
        for p in w.0.values() {
            r.index_refs(p);
        }
        let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": "a"}});
        let routed = route(&[&r], &change(&secret_kind(), None, Some(secret)), &w);
        assert_eq!(names(&routed), ["a/w1", "a/w2"]);
        let other = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "t", "namespace": "a"}});
        assert!(
            route(&[&r], &change(&secret_kind(), None, Some(other)), &w)
                .keys
                .is_empty()
        );
    }

    #[test]
    fn namespace_cluster_and_label_reads_route_as_they_select() {
        let same_ns = route_of(Controller::new("widget", widget_kind()).reads(Read::new(
            "cms",
            cm_kind(),
            Selector::SameNamespace,
        )));
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c", "namespace": "b", "labels": {"app": "x"}}});
        let routed = route(
            &[&same_ns],
            &change(&cm_kind(), None, Some(cm.clone())),
            &world(),
        );
        assert_eq!(names(&routed), ["b/w3"]);

        let cluster = route_of(Controller::new("widget", widget_kind()).reads(Read::new(
            "cms",
            cm_kind(),
            Selector::ClusterWide,
        )));
        let routed = route(
            &[&cluster],
            &change(&cm_kind(), None, Some(cm.clone())),
            &world(),
        );
        assert_eq!(names(&routed), ["a/w1", "a/w2", "b/w3"]);

        let labels = route_of(Controller::new("widget", widget_kind()).reads(Read::new(
            "cms",
            cm_kind(),
            Selector::Labels("app=y".into()),
        )));
        assert!(
            route(
                &[&labels],
                &change(&cm_kind(), None, Some(cm.clone())),
                &world()
            )
            .keys
            .is_empty()
        );
        let mut y = cm;
        y["metadata"]["labels"]["app"] = json!("y");
        let routed = route(&[&labels], &change(&cm_kind(), None, Some(y)), &world());
        assert_eq!(names(&routed), ["b/w3"]);
    }

    #[test]
    fn a_deleted_primary_is_reported_gone_with_its_uid() {
        let r = route_of(Controller::new("widget", widget_kind()));
        let old = (*widget("a", "w1", "u1")).clone();
        let routed = route(&[&r], &change(&widget_kind(), Some(old), None), &world());
        assert!(routed.keys.is_empty());
        assert_eq!(routed.gone.len(), 1);
        assert_eq!(routed.gone[0].1, "u1");
    }

    #[test]
    fn status_and_resource_version_changes_do_not_trigger() {
        let a = json!({"metadata":{"name":"a","resourceVersion":"1","generation":1},"spec":{"x":1},"status":{"y":1}});
        let mut b = a.clone();
        b["metadata"]["resourceVersion"] = json!("2");
        b["status"]["y"] = json!(2);
        assert_eq!(trigger_view(&a), trigger_view(&b));
        let mut c = a.clone();
        c["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        assert_ne!(trigger_view(&a), trigger_view(&c), "deletion must trigger");
    }

    #[test]
    fn ref_index_finds_referrers_and_forgets_old_references() {
        let mut idx = RefIndex::default();
        let k = KindKey::new("g", "v1", "K");
        let p = ("ns".to_string(), "p".to_string());
        idx.set(p.clone(), vec![(k.clone(), "ns".into(), "a".into())]);
        assert_eq!(
            idx.referrers(&(k.clone(), "ns".into(), "a".into())),
            vec![p.clone()]
        );
        idx.set(p.clone(), vec![(k.clone(), "ns".into(), "b".into())]);
        assert!(
            idx.referrers(&(k.clone(), "ns".into(), "a".into()))
                .is_empty()
        );
        idx.clear(&p);
        assert!(idx.by_target.is_empty() && idx.by_primary.is_empty());
    }
}
