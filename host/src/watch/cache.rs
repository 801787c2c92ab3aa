//! Watch caches: one reflector per kind that any loaded plugin declares,
//! shared between plugins, with the indexes the controllers need.
//!
//! Each [`KindCache`] holds the objects of one kind as compact JSON text
//! ([`CachedObject`]: the same object `kubectl get -o json` shows, without
//! `managedFields`), each stored once and shared by the indexes: by
//! namespace and name, by UID and by the UID of their controller
//! ownerReference (or owner label). Readers that need the tree parse it.
//! Every change is reported on a channel as a [`Change`] so the controller
//! can work out which primaries it concerns.
//!
//! # Guarantees
//! - A kind is watched once, however many controllers declare it.
//! - [`KindCache::synced`] turns true only after the initial list of every
//!   watched scope completed; nothing reads a kind before that.
//! - After a watch restart the cache is replaced atomically and the
//!   differences are reported as changes, so nothing is missed or doubled.
//! - A watch whose resourceVersion expired (410) relists at once. While the
//!   API server is unreachable a watch retries with jittered backoff capped
//!   at 2 s, so it is back within about 2 s of the server's return (see
//!   [`RetryState`](crate::watch::retry::RetryState)).
//! - The objects a kind's cache holds are counted in
//!   `wasmop_cache_objects{kind}` (updated with every stored list, change
//!   and deletion).
//! - Each watch stream's state (synced, relisting, backing off) is in the
//!   metrics: `wasmop_watch_streams{kind,state}`, with
//!   `wasmop_watch_lists_total{kind,reason}`,
//!   `wasmop_watch_errors_total{kind,reason}` and
//!   `wasmop_watch_recovery_seconds{kind}`.

mod stream;

use self::stream::run_watch;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use kube::Client;
use kube::api::ApiResource;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::metrics;

pub use super::stored::CachedObject;

/// Identity of a watched kind: `group/version/Kind` (`/v1/ConfigMap` for the
/// core group).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KindKey(pub String);

impl KindKey {
    /// The key of a kind.
    pub fn new(group: &str, version: &str, kind: &str) -> Self {
        Self(format!("{group}/{version}/{kind}"))
    }
}

impl std::fmt::Display for KindKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What the cache needs to know to watch a kind.
#[derive(Clone, Debug)]
pub struct WatchSpec {
    /// API group, version, kind and plural.
    pub resource: ApiResource,
    /// Whether the kind is namespaced.
    pub namespaced: bool,
    /// Watch only objects the host manages (owned kinds no controller reads).
    pub managed_only: bool,
    /// Watch only objects matching this label selector as well (a shard's
    /// primaries, `shard.wasmop.dev/shard=<shard>`); `None`: no such filter.
    pub selector: Option<String>,
}

impl WatchSpec {
    /// True when a cache watched as `self` holds every object `wanted`
    /// asks for (it is no more filtered).
    fn covers(&self, wanted: &WatchSpec) -> bool {
        (!self.managed_only || wanted.managed_only)
            && (self.selector.is_none() || self.selector == wanted.selector)
    }

    /// The least filtered of `self` and `other`.
    fn union(&self, other: &WatchSpec) -> WatchSpec {
        WatchSpec {
            resource: other.resource.clone(),
            namespaced: other.namespaced,
            managed_only: self.managed_only && other.managed_only,
            selector: if self.selector == other.selector {
                other.selector.clone()
            } else {
                None
            },
        }
    }
}

/// One change of one object in the cache. `old` is absent for a new object,
/// `new` for a deleted one. Both absent: the kind's first complete list
/// (its cache just synced; see [`Change::listed`]), sent even when the list
/// held no object, so that what waited for the kind to be served (an
/// optional kind whose CRD was missing) can look again.
#[derive(Clone, Debug)]
pub struct Change {
    /// Kind of the object.
    pub kind: KindKey,
    /// The object before the change.
    pub old: Option<Arc<CachedObject>>,
    /// The object after the change.
    pub new: Option<Arc<CachedObject>>,
}

impl Change {
    /// The change that says `kind` was listed completely for the first
    /// time.
    pub fn listed(kind: KindKey) -> Self {
        Change {
            kind,
            old: None,
            new: None,
        }
    }

    /// True for [`Change::listed`].
    pub fn is_listed(&self) -> bool {
        self.old.is_none() && self.new.is_none()
    }
}

type ObjKey = (String, String); // (namespace, name); namespace empty when cluster-scoped

/// The objects of one kind, and two indexes that share them (an `Arc`
/// each, no copy of an object): by UID, and by owner UID (each owner's
/// objects sorted by namespace and name; a `Vec`, since an owner usually
/// has a few, where a tree set would allocate a node for eleven).
#[derive(Default, Debug)]
struct Data {
    objects: BTreeMap<ObjKey, Arc<CachedObject>>,
    by_uid: HashMap<String, Arc<CachedObject>>,
    by_owner: HashMap<String, Vec<Arc<CachedObject>>>,
}

/// An object's place in an owner's list: namespace, then name.
fn sort_key(obj: &CachedObject) -> (&str, &str) {
    (obj.namespace(), obj.name())
}

impl Data {
    fn insert(&mut self, key: ObjKey, obj: Arc<CachedObject>) -> Option<Arc<CachedObject>> {
        let old = self.remove(&key);
        let uid = obj.uid();
        if !uid.is_empty() {
            self.by_uid.insert(uid.to_string(), Arc::clone(&obj));
        }
        for owner in obj.owner_uids() {
            let list = self.by_owner.entry(owner.to_string()).or_default();
            let at = list.partition_point(|o| sort_key(o) < sort_key(&obj));
            // An owner named twice in ownerReferences lists the object once.
            if !list.get(at).is_some_and(|o| Arc::ptr_eq(o, &obj)) {
                list.insert(at, Arc::clone(&obj));
            }
        }
        self.objects.insert(key, obj);
        old
    }

    fn remove(&mut self, key: &ObjKey) -> Option<Arc<CachedObject>> {
        let old = self.objects.remove(key)?;
        let uid = old.uid();
        if self.by_uid.get(uid).is_some_and(|o| Arc::ptr_eq(o, &old)) {
            self.by_uid.remove(uid);
        }
        for owner in old.owner_uids() {
            if let Some(list) = self.by_owner.get_mut(owner) {
                list.retain(|o| !Arc::ptr_eq(o, &old));
                if list.is_empty() {
                    self.by_owner.remove(owner);
                }
            }
        }
        Some(old)
    }
}

/// The cached objects of one kind.
#[derive(Debug)]
pub struct KindCache {
    key: KindKey,
    spec: WatchSpec,
    data: RwLock<Data>,
    synced: watch::Sender<bool>,
    /// The API server answered 404 to this kind's list and no list has
    /// completed since: the kind is not served (its CRD is not installed).
    not_served: watch::Sender<bool>,
    /// Who [`KindCache::observe`]s the objects stored from now on.
    observers: std::sync::Mutex<Vec<mpsc::UnboundedSender<Arc<CachedObject>>>>,
}

impl KindCache {
    fn new(key: KindKey, spec: WatchSpec) -> Self {
        KindCache {
            key,
            spec,
            data: RwLock::new(Data::default()),
            synced: watch::channel(false).0,
            not_served: watch::channel(false).0,
            observers: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// Every object this cache stores from now on, added or changed, by a
    /// watch event or a relist, as stored (deletions are not reported).
    ///
    /// For benchmarks and tests that follow the operator's progress
    /// through its own watch: a watch of their own would add the API
    /// server's work of serving it to what they measure. The channel is
    /// unbounded: an observer that stops reading keeps everything sent to
    /// it until its receiver is dropped, and is forgotten at the next
    /// stored object after that. With no observer, storing an object costs
    /// one uncontended lock more.
    pub fn observe(&self) -> mpsc::UnboundedReceiver<Arc<CachedObject>> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.observers.lock().expect("observers lock").push(tx);
        rx
    }

    /// Hands a stored object to every observer still listening.
    fn stored(&self, obj: &Arc<CachedObject>) {
        let mut observers = self.observers.lock().expect("observers lock");
        if !observers.is_empty() {
            observers.retain(|tx| tx.send(Arc::clone(obj)).is_ok());
        }
    }

    /// The kind's key.
    pub fn key(&self) -> &KindKey {
        &self.key
    }

    /// How the kind is watched.
    pub fn spec(&self) -> &WatchSpec {
        &self.spec
    }

    /// True once every initial list of this kind completed.
    pub fn synced(&self) -> bool {
        *self.synced.borrow()
    }

    /// Waits until [`KindCache::synced`] is true.
    pub async fn wait_synced(&self) {
        let mut rx = self.synced.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }

    /// True while the API server answers 404 to this kind's list (no list
    /// completed since): the kind is not served, e.g. its CRD is not
    /// installed. The watch keeps retrying; the first list that completes
    /// turns this false.
    pub fn not_served(&self) -> bool {
        *self.not_served.borrow()
    }

    /// Waits until [`KindCache::not_served`] is true.
    pub async fn wait_not_served(&self) {
        let mut rx = self.not_served.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }

    /// The name of the CustomResourceDefinition that would serve this kind:
    /// `<plural>.<group>`.
    pub fn crd_name(&self) -> String {
        crd_name(&self.spec.resource)
    }

    /// The object with this namespace (empty for cluster-scoped) and name.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<CachedObject>> {
        let data = self.data.read().expect("cache lock");
        data.objects
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }

    /// The object with this UID.
    pub fn get_by_uid(&self, uid: &str) -> Option<Arc<CachedObject>> {
        let data = self.data.read().expect("cache lock");
        data.by_uid.get(uid).cloned()
    }

    /// Objects in a namespace (`Some`) or everywhere (`None`), sorted by
    /// namespace and name.
    pub fn list(&self, namespace: Option<&str>) -> Vec<Arc<CachedObject>> {
        let data = self.data.read().expect("cache lock");
        match namespace {
            None => data.objects.values().cloned().collect(),
            Some(ns) => data
                .objects
                .range((ns.to_string(), String::new())..)
                .take_while(|((n, _), _)| n == ns)
                .map(|(_, v)| v.clone())
                .collect(),
        }
    }

    /// Objects whose controller ownerReference has this UID, sorted by
    /// namespace and name.
    pub fn owned_by(&self, owner_uid: &str) -> Vec<Arc<CachedObject>> {
        let data = self.data.read().expect("cache lock");
        data.by_owner.get(owner_uid).cloned().unwrap_or_default()
    }

    /// Number of cached objects.
    pub fn len(&self) -> usize {
        self.data.read().expect("cache lock").objects.len()
    }

    /// True when no object is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A watched kind: its cache and the watch tasks feeding it.
type Watched = (Arc<KindCache>, Vec<JoinHandle<()>>);

/// All watch caches of the operator.
pub struct Cache {
    client: Client,
    namespaces: Vec<String>,
    kinds: RwLock<HashMap<KindKey, Watched>>,
    /// Unfiltered caches syncing to replace a filtered one.
    pending: std::sync::Mutex<HashMap<KindKey, Arc<KindCache>>>,
    changes: mpsc::UnboundedSender<Change>,
}

impl Cache {
    /// A cache watching `namespaces` (empty: all namespaces) that reports
    /// changes on the returned receiver.
    pub fn new(
        client: Client,
        namespaces: Vec<String>,
    ) -> (Arc<Self>, mpsc::UnboundedReceiver<Change>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let cache = Arc::new(Self {
            client,
            namespaces,
            kinds: RwLock::new(HashMap::new()),
            pending: std::sync::Mutex::new(HashMap::new()),
            changes: tx,
        });
        (cache, rx)
    }

    /// The namespaces watched; empty when every namespace is.
    pub fn namespaces(&self) -> &[String] {
        &self.namespaces
    }

    /// True when objects of a kind with this scope in `namespace` are
    /// within the cache's watches (every namespace is when the cache
    /// watches all; a cluster-scoped kind has no namespace).
    pub fn watches_namespace(&self, namespaced: bool, namespace: Option<&str>) -> bool {
        !namespaced
            || self.namespaces.is_empty()
            || namespace.is_some_and(|ns| self.namespaces.iter().any(|n| n == ns))
    }

    /// The cache of a kind, if it is watched.
    pub fn kind(&self, key: &KindKey) -> Option<Arc<KindCache>> {
        self.kinds
            .read()
            .expect("cache lock")
            .get(key)
            .map(|(k, _)| k.clone())
    }

    /// Keys of every watched kind.
    pub fn kinds(&self) -> Vec<KindKey> {
        self.kinds
            .read()
            .expect("cache lock")
            .keys()
            .cloned()
            .collect()
    }

    /// Makes sure a kind is watched as `spec` says and returns its cache.
    ///
    /// A kind already watched with the same filter is shared. A kind watched
    /// with the managed-only filter that is now needed unfiltered gets a new
    /// unfiltered watch; the filtered cache keeps serving every running
    /// controller until the new one has synced, and is then replaced in one
    /// step (so no reconcile ever sees the half-filled new cache). The
    /// returned cache is the one that will serve: wait for its sync.
    pub fn ensure(self: &Arc<Self>, spec: WatchSpec) -> Arc<KindCache> {
        let key = KindKey::new(
            &spec.resource.group,
            &spec.resource.version,
            &spec.resource.kind,
        );
        let mut kinds = self.kinds.write().expect("cache lock");
        let (upgrading, spec) = match kinds.get(&key) {
            Some((existing, _)) if existing.spec.covers(&spec) => {
                return existing.clone();
            }
            Some((existing, _)) => (true, existing.spec.union(&spec)),
            None => (false, spec),
        };
        if upgrading {
            let mut pending = self.pending.lock().expect("pending lock");
            if let Some(kc) = pending.get(&key) {
                return kc.clone();
            }
            let (kc, tasks) = self.start(key.clone(), spec);
            pending.insert(key.clone(), kc.clone());
            let cache = Arc::downgrade(self);
            let new = kc.clone();
            tokio::spawn(async move {
                new.wait_synced().await;
                let Some(cache) = cache.upgrade() else { return };
                cache.pending.lock().expect("pending lock").remove(&key);
                let old = cache
                    .kinds
                    .write()
                    .expect("cache lock")
                    .insert(key, (new, tasks));
                for t in old.map(|(_, tasks)| tasks).unwrap_or_default() {
                    t.abort();
                }
            });
            return kc;
        }
        let (kc, tasks) = self.start(key.clone(), spec);
        kinds.insert(key, (kc.clone(), tasks));
        kc
    }

    /// Starts the watches of one kind into a new cache.
    fn start(&self, key: KindKey, spec: WatchSpec) -> Watched {
        let kc = Arc::new(KindCache::new(key.clone(), spec.clone()));
        let scopes: Vec<Option<String>> = if spec.namespaced && !self.namespaces.is_empty() {
            self.namespaces.iter().cloned().map(Some).collect()
        } else {
            vec![None]
        };
        let pending = Arc::new(std::sync::atomic::AtomicUsize::new(scopes.len()));
        let tasks = scopes
            .into_iter()
            .map(|scope| {
                tokio::spawn(run_watch(
                    self.client.clone(),
                    kc.clone(),
                    scope,
                    pending.clone(),
                    self.changes.clone(),
                ))
            })
            .collect();
        (kc, tasks)
    }

    /// Stops every watch.
    pub fn stop(&self) {
        for (_, tasks) in self.kinds.read().expect("cache lock").values() {
            for t in tasks {
                t.abort();
            }
        }
    }

    /// Stops watching a kind and forgets its objects.
    pub fn remove(&self, key: &KindKey) {
        if let Some((_, tasks)) = self.kinds.write().expect("cache lock").remove(key) {
            for t in tasks {
                t.abort();
            }
            metrics::global().remove_where("wasmop_cache_objects", "kind", &key.0);
        }
    }
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache")
            .field("namespaces", &self.namespaces)
            .field("kinds", &self.kinds())
            .finish()
    }
}

impl Drop for Cache {
    fn drop(&mut self) {
        if let Ok(kinds) = self.kinds.get_mut() {
            for (_, tasks) in kinds.values() {
                for t in tasks {
                    t.abort();
                }
            }
        }
    }
}

/// `<plural>.<group>`: the name a CustomResourceDefinition serving this
/// resource has.
pub fn crd_name(resource: &ApiResource) -> String {
    format!("{}.{}", resource.plural, resource.group)
}

/// What to install for a CRD of a well-known project, else the CRD itself.
pub fn install_hint(group: &str) -> &'static str {
    match group {
        "cert-manager.io" | "acme.cert-manager.io" => "install cert-manager",
        "gateway.networking.k8s.io" => "install the Gateway API CRDs",
        g if g.ends_with("istio.io") => "install Istio",
        "monitoring.coreos.com" => "install the Prometheus Operator",
        "acid.zalan.do" => "install the Zalando postgres-operator",
        "snapshot.storage.k8s.io" => "install the external-snapshotter CRDs",
        _ => "install its CRD",
    }
}

fn obj_key(o: &CachedObject) -> ObjKey {
    (o.namespace().to_string(), o.name().to_string())
}

#[cfg(test)]
mod tests {
    use super::stream::*;
    use super::*;
    use crate::watch::retry::*;
    use kube::api::DynamicObject;
    use kube::runtime::watcher;
    use serde_json::Value;
    use serde_json::json;
    use std::collections::BTreeSet;
    use std::time::Duration;

    #[test]
    fn cached_objects_always_carry_api_version_and_kind() {
        let ar = ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
            "apps",
            "v1",
            "StatefulSet",
        ));
        let bare: DynamicObject = serde_json::from_value(json!({
            "metadata": {"name": "f", "namespace": "n", "managedFields": [{"manager": "x"}]}
        }))
        .expect("object");
        let cached = to_cached(bare, &ar).expect("value");
        let v = cached.value();
        assert_eq!(v["apiVersion"], "apps/v1");
        assert_eq!(v["kind"], "StatefulSet");
        assert!(v["metadata"].get("managedFields").is_none());
        assert!(
            !cached.text().contains("managedFields"),
            "{}",
            cached.text()
        );
        assert_eq!((cached.namespace(), cached.name()), ("n", "f"));
        let typed: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "f"}
        }))
        .expect("object");
        assert_eq!(
            to_cached(typed, &ar).expect("value").value()["kind"],
            "StatefulSet"
        );
    }

    /// A `kubectl apply`-ed object: its last-applied annotation (a copy of
    /// the whole object) is not cached, the object's other annotations are.
    #[test]
    fn cached_objects_leave_out_kubectls_last_applied_annotation() {
        let ar = ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk("", "v1", "ConfigMap"));
        let applied: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "f", "namespace": "n", "annotations": {
                "kubectl.kubernetes.io/last-applied-configuration": "{\"data\":{\"k\":\"v\"}}",
                "team": "a",
            }},
            "data": {"k": "v"}
        }))
        .expect("object");
        let cached = to_cached(applied, &ar).expect("value");
        assert_eq!(
            cached.value()["metadata"]["annotations"],
            json!({"team": "a"})
        );
        assert!(!cached.text().contains("last-applied"), "{}", cached.text());
        assert_eq!(cached.value()["data"], json!({"k": "v"}));
    }

    fn cm_value(ns: &str, name: &str, uid: &str, owner: Option<&str>) -> Value {
        let mut v = json!({"apiVersion":"v1","kind":"ConfigMap",
            "metadata":{"namespace":ns,"name":name,"uid":uid,"resourceVersion":"1"}});
        if let Some(o) = owner {
            v["metadata"]["ownerReferences"] =
                json!([{"apiVersion":"v1","kind":"X","name":"x","uid":o,"controller":true}]);
        }
        v
    }

    fn cm(ns: &str, name: &str, uid: &str, owner: Option<&str>) -> Arc<CachedObject> {
        Arc::new(CachedObject::from_value(&cm_value(ns, name, uid, owner)))
    }

    #[test]
    fn owner_index_follows_inserts_replacements_and_removals() {
        let mut d = Data::default();
        let k = ("a".to_string(), "c1".to_string());
        d.insert(k.clone(), cm("a", "c1", "u1", Some("p1")));
        assert_eq!(d.by_owner["p1"].len(), 1);
        // Re-owned: the old owner's index entry must go away.
        d.insert(k.clone(), cm("a", "c1", "u1", Some("p2")));
        assert!(!d.by_owner.contains_key("p1"));
        assert_eq!(d.by_owner["p2"].len(), 1);
        d.remove(&k);
        assert!(d.by_owner.is_empty());
        assert!(d.by_uid.is_empty());
    }

    #[test]
    fn an_owners_objects_are_sorted_shared_and_listed_once() {
        let mut d = Data::default();
        for (ns, name, uid) in [("b", "x", "u3"), ("a", "z", "u2"), ("a", "y", "u1")] {
            d.insert((ns.into(), name.into()), cm(ns, name, uid, Some("p")));
        }
        let names: Vec<_> = d.by_owner["p"].iter().map(|o| sort_key(o)).collect();
        assert_eq!(names, [("a", "y"), ("a", "z"), ("b", "x")]);
        // The indexes hold the cached object itself, not a copy.
        let cached = &d.objects[&("a".to_string(), "z".to_string())];
        assert!(Arc::ptr_eq(&d.by_uid["u2"], cached));
        // Replaced: the index serves the new object, the old one is gone.
        d.insert(("a".into(), "z".into()), cm("a", "z", "u2", Some("p")));
        assert_eq!(d.by_owner["p"].len(), 3);
        let cached = &d.objects[&("a".to_string(), "z".to_string())];
        assert!(Arc::ptr_eq(&d.by_uid["u2"], cached));
        assert!(d.by_owner["p"].iter().any(|o| Arc::ptr_eq(o, cached)));
        // Two ownerReferences to one owner: listed once.
        let mut twice = cm_value("c", "w", "u4", Some("q"));
        let refs = twice["metadata"]["ownerReferences"].clone();
        twice["metadata"]["ownerReferences"] = json!([refs[0], refs[0]]);
        d.insert(
            ("c".into(), "w".into()),
            Arc::new(CachedObject::from_value(&twice)),
        );
        assert_eq!(d.by_owner.get("q").map(Vec::len), Some(1));
    }

    #[test]
    fn a_filtered_watch_never_serves_a_less_filtered_need() {
        let ar = ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk("", "v1", "ConfigMap"));
        let spec = |managed_only: bool, selector: Option<&str>| WatchSpec {
            resource: ar.clone(),
            namespaced: true,
            managed_only,
            selector: selector.map(str::to_owned),
        };
        let whole = spec(false, None);
        let shard = spec(false, Some("s=a"));
        let other = spec(false, Some("s=b"));
        let managed = spec(true, None);
        assert!(whole.covers(&shard) && whole.covers(&managed));
        assert!(shard.covers(&shard));
        assert!(!shard.covers(&whole), "a shard's watch lacks the others'");
        assert!(!shard.covers(&other));
        assert!(!managed.covers(&whole));
        let u = shard.union(&other);
        assert!(
            u.selector.is_none() && !u.managed_only,
            "two shards need it whole"
        );
        let u = managed.union(&shard);
        assert!(u.covers(&managed) && u.covers(&shard));
    }

    /// An empty cache of namespaced ConfigMaps.
    fn cm_cache(ar: &ApiResource) -> KindCache {
        KindCache::new(
            KindKey::new("", "v1", "ConfigMap"),
            WatchSpec {
                resource: ar.clone(),
                namespaced: true,
                managed_only: false,
                selector: None,
            },
        )
    }

    #[test]
    fn the_readers_answer_from_the_stored_text() {
        let ar = ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk("", "v1", "ConfigMap"));
        let kc = cm_cache(&ar);
        let mut values = Vec::new();
        for (ns, name, uid, owner) in [
            ("b", "x", "u3", Some("p")),
            ("a", "z", "u2", Some("p")),
            ("a", "y", "u1", None),
        ] {
            let mut v = cm_value(ns, name, uid, owner);
            v["data"] = json!({"k": format!("{ns}/{name}")});
            v["metadata"]["managedFields"] = json!([{"manager": "m"}]);
            let obj: DynamicObject = serde_json::from_value(v.clone()).expect("object");
            let cached = to_cached(obj, &ar).expect("cached");
            v["metadata"]
                .as_object_mut()
                .expect("metadata")
                .remove("managedFields");
            assert_eq!(cached.value(), v);
            kc.data
                .write()
                .expect("cache lock")
                .insert(obj_key(&cached), Arc::new(cached));
            values.push(v);
        }
        let got = kc.get("a", "z").expect("a/z");
        assert_eq!(got.value(), values[1]);
        assert!(Arc::ptr_eq(&got, &kc.get_by_uid("u2").expect("u2")));
        assert!(kc.get("a", "x").is_none());
        let names = |objects: Vec<Arc<CachedObject>>| {
            objects
                .iter()
                .map(|o| format!("{}/{}", o.namespace(), o.name()))
                .collect::<Vec<_>>()
        };
        assert_eq!(names(kc.list(None)), ["a/y", "a/z", "b/x"]);
        assert_eq!(names(kc.list(Some("a"))), ["a/y", "a/z"]);
        assert_eq!(names(kc.owned_by("p")), ["a/z", "b/x"]);
        assert!(kc.owned_by("u1").is_empty());
        // What the indexes hold is the one stored object.
        assert!(
            kc.owned_by("p")
                .iter()
                .any(|o| Arc::ptr_eq(o, &kc.get("b", "x").expect("b/x")))
        );
        assert_eq!(kc.len(), 3);
    }

    #[test]
    fn observers_get_every_stored_object_and_a_dropped_one_is_forgotten() {
        let ar = ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk("", "v1", "ConfigMap"));
        let kc = cm_cache(&ar);
        let (changes, _changes_rx) = mpsc::unbounded_channel();
        let cached = |name: &str, rv: &str| {
            let mut v = cm_value("a", name, &format!("u-{name}"), None);
            v["metadata"]["resourceVersion"] = json!(rv);
            let obj: DynamicObject = serde_json::from_value(v).expect("object");
            Arc::new(to_cached(obj, &ar).expect("cached"))
        };
        let list = |objects: &[Arc<CachedObject>]| {
            objects
                .iter()
                .map(|o| (obj_key(o), Arc::clone(o)))
                .collect::<BTreeMap<_, _>>()
        };
        let mut kept = kc.observe();
        let dropped = kc.observe();
        drop(dropped);
        let x1 = cached("x", "1");
        replace_scope(&kc, None, list(&[x1.clone(), cached("y", "1")]), &changes);
        // A relist with x unchanged and y changed reports only y again.
        let y2 = cached("y", "2");
        replace_scope(&kc, None, list(&[x1.clone(), y2.clone()]), &changes);
        let mut got = Vec::new();
        while let Ok(o) = kept.try_recv() {
            got.push(format!("{}@{}", o.name(), o.resource_version()));
        }
        assert_eq!(got, ["x@1", "y@1", "y@2"]);
        assert!(Arc::ptr_eq(&kc.get("a", "y").expect("y"), &y2));
        assert_eq!(kc.observers.lock().expect("observers lock").len(), 1);
        drop(kept);
        replace_scope(&kc, None, list(&[x1, cached("y", "3")]), &changes);
        assert!(kc.observers.lock().expect("observers lock").is_empty());
    }

    fn api_error(code: u16) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("test", "Test")
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn errors_are_classified_by_what_they_say_about_the_server() {
        use watcher::Error as E;
        let gone = kube::core::Status::failure("too old resource version", "Expired")
            .with_code(410)
            .boxed();
        assert_eq!(Failure::of(&E::WatchError(gone)), Failure::Expired);
        // A 410 answering the watch request itself, and on a list page.
        assert_eq!(
            Failure::of(&E::WatchStartFailed(api_error(410))),
            Failure::Expired
        );
        assert_eq!(
            Failure::of(&E::InitialListFailed(api_error(410))),
            Failure::Expired
        );
        let refused = kube::Error::Service(Box::new(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        )));
        assert_eq!(
            Failure::of(&E::InitialListFailed(refused)),
            Failure::Unavailable
        );
        for code in [429, 500, 503, 504] {
            assert_eq!(
                Failure::of(&E::WatchStartFailed(api_error(code))),
                Failure::Unavailable,
                "{code}"
            );
        }
        for code in [400, 401, 403, 404] {
            assert_eq!(
                Failure::of(&E::WatchFailed(api_error(code))),
                Failure::Rejected,
                "{code}"
            );
        }
        assert_eq!(Failure::of(&E::NoResourceVersion), Failure::Rejected);
    }

    #[test]
    fn backoff_doubles_is_capped_and_jitter_stays_within_half_to_full() {
        let base = Duration::from_millis(200);
        let max = Duration::from_secs(2);
        assert_eq!(backoff_delay(base, max, 0, 0.0), Duration::from_millis(100));
        assert_eq!(backoff_delay(base, max, 1, 0.0), Duration::from_millis(200));
        let d = backoff_delay(base, max, 3, 0.999_999);
        assert!(
            d > Duration::from_millis(1599) && d <= Duration::from_millis(1600),
            "{d:?}"
        );
        for attempt in [4, 10, 31, 32, u32::MAX] {
            for jitter in [0.0, 0.5, 0.999_999, 1.0, -3.0, f64::NAN] {
                let d = backoff_delay(base, max, attempt, jitter);
                assert!(
                    d >= max / 2 && d <= max,
                    "attempt {attempt} jitter {jitter}: {d:?}"
                );
            }
        }
    }

    #[test]
    fn expiry_relists_at_once_even_after_a_long_outage() {
        let policy = RetryPolicy::default();
        let mut r = RetryState::default();
        let t0 = std::time::Instant::now();
        for i in 0..50 {
            let d = r.on_failure(
                &policy,
                Failure::Unavailable,
                t0 + Duration::from_millis(i * 300),
                0.7,
            );
            assert!(!d.relist);
            assert!(d.delay <= policy.unavailable_max);
        }
        let d = r.on_failure(&policy, Failure::Expired, t0 + Duration::from_secs(16), 0.7);
        assert_eq!(
            d,
            Decision {
                relist: true,
                delay: Duration::ZERO
            }
        );
        // The relist expires again before completing: wait a little, then
        // relist again; never a tight loop.
        let d = r.on_failure(&policy, Failure::Expired, t0 + Duration::from_secs(17), 0.0);
        assert!(d.relist && d.delay >= policy.base / 2, "{d:?}");
        // A completed list resets everything.
        r.on_synced();
        let d = r.on_failure(&policy, Failure::Expired, t0 + Duration::from_secs(18), 0.0);
        assert_eq!(d.delay, Duration::ZERO);
    }

    #[test]
    fn refusals_back_off_longer_than_an_unreachable_server() {
        let policy = RetryPolicy::default();
        let mut r = RetryState::default();
        let t0 = std::time::Instant::now();
        let mut last = Duration::ZERO;
        for i in 0..20 {
            last = r
                .on_failure(&policy, Failure::Rejected, t0 + Duration::from_secs(i), 0.0)
                .delay;
        }
        assert_eq!(last, policy.rejected_max / 2);
        // Refusals do not lengthen the wait for an unreachable server.
        let d = r.on_failure(
            &policy,
            Failure::Unavailable,
            t0 + Duration::from_secs(21),
            0.0,
        );
        assert_eq!(d.delay, policy.base / 2);
        // Progress resets the counts; so does a quiet period.
        r.on_progress();
        let d = r.on_failure(
            &policy,
            Failure::Rejected,
            t0 + Duration::from_secs(22),
            0.0,
        );
        assert_eq!(d.delay, policy.base / 2);
        r.on_failure(
            &policy,
            Failure::Unavailable,
            t0 + Duration::from_secs(23),
            0.0,
        );
        let d = r.on_failure(
            &policy,
            Failure::Unavailable,
            t0 + Duration::from_secs(23 + 61),
            0.0,
        );
        assert_eq!(d.delay, policy.base / 2);
    }

    /// The API server is unreachable for 15 s and then answers: whatever
    /// the jitter, the next attempt comes within the cap of its return.
    #[test]
    fn an_outage_ends_in_a_retry_within_the_cap() {
        let policy = RetryPolicy::default();
        let t0 = std::time::Instant::now();
        let back = Duration::from_secs(15);
        for seed in 0..200u64 {
            let mut r = RetryState::default();
            let mut now = Duration::ZERO;
            let mut x = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            while now < back {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let jitter = (x >> 11) as f64 / (1u64 << 53) as f64;
                now += r
                    .on_failure(&policy, Failure::Unavailable, t0 + now, jitter)
                    .delay;
            }
            assert!(
                now - back <= policy.unavailable_max,
                "seed {seed}: {:?}",
                now - back
            );
        }
    }

    #[test]
    fn an_unanswered_attempt_is_abandoned_after_a_doubling_timeout() {
        let policy = RetryPolicy::default();
        let mut r = RetryState::default();
        let t0 = std::time::Instant::now();
        assert_eq!(r.stall_timeout(&policy), Duration::from_secs(2));
        let d = r.on_stall(&policy, t0);
        assert_eq!(
            d,
            Decision {
                relist: true,
                delay: Duration::ZERO
            }
        );
        assert_eq!(r.stall_timeout(&policy), Duration::from_secs(4));
        // A list slower than the timeout gets more time each round, so it
        // completes in the end instead of being abandoned forever.
        for i in 0..40 {
            r.on_stall(&policy, t0 + Duration::from_secs(i));
        }
        assert_eq!(r.stall_timeout(&policy), policy.stall_max);
        r.on_progress();
        assert_eq!(r.stall_timeout(&policy), policy.stall_base);
    }

    #[test]
    fn jitter_is_in_range_and_varies() {
        let xs: Vec<f64> = (0..64).map(|_| jitter()).collect();
        assert!(xs.iter().all(|x| (0.0..1.0).contains(x)));
        let distinct: BTreeSet<u64> = xs.iter().map(|x| x.to_bits()).collect();
        assert!(distinct.len() > 32, "{distinct:?}");
    }

    #[test]
    fn stream_status_counts_each_stream_in_one_state() {
        let kind = "test.invalid/v1/StatusProbe";
        let get = |state: WatchState| {
            metrics::global()
                .get(
                    "wasmop_watch_streams",
                    &[("kind", kind), ("state", state.label())],
                )
                .unwrap_or(-1.0)
        };
        let mut a = StreamStatus::new(kind);
        let b = StreamStatus::new(kind);
        assert_eq!(get(WatchState::Relisting), 2.0);
        assert_eq!(get(WatchState::Synced), 0.0);
        assert_eq!(get(WatchState::BackingOff), 0.0);
        a.set(WatchState::BackingOff);
        a.set(WatchState::BackingOff);
        assert_eq!(get(WatchState::Relisting), 1.0);
        assert_eq!(get(WatchState::BackingOff), 1.0);
        drop(b);
        a.set(WatchState::Synced);
        assert_eq!(get(WatchState::Relisting), 0.0);
        assert_eq!(get(WatchState::Synced), 1.0);
        drop(a);
        for s in WatchState::ALL {
            assert_eq!(get(s), 0.0, "{s:?}");
        }
    }
}
