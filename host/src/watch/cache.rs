//! Watch caches: one reflector per kind that any loaded plugin declares,
//! shared between plugins, with the indexes the controllers need.
//!
//! Each [`KindCache`] holds the objects of one kind as JSON values (the same
//! text `kubectl get -o json` shows, without `managedFields`), indexed by
//! namespace, by UID and by the UID of their controller ownerReference.
//! Every change is reported on a channel as a [`Change`] so the controller
//! can work out which primaries it concerns.
//!
//! # Guarantees
//! - A kind is watched once, however many controllers declare it.
//! - [`KindCache::synced`] turns true only after the initial list of every
//!   watched scope completed; nothing reads a kind before that.
//! - After a watch restart the cache is replaced atomically and the
//!   differences are reported as changes, so nothing is missed or doubled.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::StreamExt;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde_json::Value;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::object;

/// Label the host puts on every object it writes.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY_LABEL`].
pub const MANAGED_BY_VALUE: &str = "wasmop";

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
}

/// One change of one object in the cache. `old` is absent for a new object,
/// `new` for a deleted one.
#[derive(Clone, Debug)]
pub struct Change {
    /// Kind of the object.
    pub kind: KindKey,
    /// The object before the change.
    pub old: Option<Arc<Value>>,
    /// The object after the change.
    pub new: Option<Arc<Value>>,
}

type ObjKey = (String, String); // (namespace, name); namespace empty when cluster-scoped

#[derive(Default, Debug)]
struct Data {
    objects: BTreeMap<ObjKey, Arc<Value>>,
    by_uid: HashMap<String, ObjKey>,
    by_owner: HashMap<String, BTreeSet<ObjKey>>,
}

impl Data {
    fn insert(&mut self, key: ObjKey, obj: Arc<Value>) -> Option<Arc<Value>> {
        let old = self.remove(&key);
        let uid = object::uid(&obj);
        if !uid.is_empty() {
            self.by_uid.insert(uid.to_string(), key.clone());
        }
        for owner in object::owner_uids(&obj) {
            self.by_owner
                .entry(owner.to_string())
                .or_default()
                .insert(key.clone());
        }
        self.objects.insert(key, obj);
        old
    }

    fn remove(&mut self, key: &ObjKey) -> Option<Arc<Value>> {
        let old = self.objects.remove(key)?;
        let uid = object::uid(&old);
        if self.by_uid.get(uid) == Some(key) {
            self.by_uid.remove(uid);
        }
        for owner in object::owner_uids(&old) {
            if let Some(set) = self.by_owner.get_mut(owner) {
                set.remove(key);
                if set.is_empty() {
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
}

impl KindCache {
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

    /// The object with this namespace (empty for cluster-scoped) and name.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<Value>> {
        let data = self.data.read().expect("cache lock");
        data.objects
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }

    /// The object with this UID.
    pub fn get_by_uid(&self, uid: &str) -> Option<Arc<Value>> {
        let data = self.data.read().expect("cache lock");
        let key = data.by_uid.get(uid)?;
        data.objects.get(key).cloned()
    }

    /// Objects in a namespace (`Some`) or everywhere (`None`), sorted by
    /// namespace and name.
    pub fn list(&self, namespace: Option<&str>) -> Vec<Arc<Value>> {
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
    pub fn owned_by(&self, owner_uid: &str) -> Vec<Arc<Value>> {
        let data = self.data.read().expect("cache lock");
        data.by_owner
            .get(owner_uid)
            .map(|keys| {
                keys.iter()
                    .filter_map(|k| data.objects.get(k).cloned())
                    .collect()
            })
            .unwrap_or_default()
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
            changes: tx,
        });
        (cache, rx)
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
    /// with the managed-only filter that is now needed unfiltered is
    /// restarted without the filter.
    pub fn ensure(&self, spec: WatchSpec) -> Arc<KindCache> {
        let key = KindKey::new(
            &spec.resource.group,
            &spec.resource.version,
            &spec.resource.kind,
        );
        let mut kinds = self.kinds.write().expect("cache lock");
        if let Some((existing, tasks)) = kinds.get(&key) {
            if existing.spec.managed_only == spec.managed_only || !existing.spec.managed_only {
                return existing.clone();
            }
            for t in tasks {
                t.abort();
            }
        }
        let kc = Arc::new(KindCache {
            key: key.clone(),
            spec: spec.clone(),
            data: RwLock::new(Data::default()),
            synced: watch::channel(false).0,
        });
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
        kinds.insert(key, (kc.clone(), tasks));
        kc
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

async fn run_watch(
    client: Client,
    kc: Arc<KindCache>,
    scope: Option<String>,
    pending: Arc<std::sync::atomic::AtomicUsize>,
    changes: mpsc::UnboundedSender<Change>,
) {
    let api: Api<DynamicObject> = match &scope {
        Some(ns) => Api::namespaced_with(client, ns, &kc.spec.resource),
        None => Api::all_with(client, &kc.spec.resource),
    };
    let mut config = watcher::Config::default();
    if kc.spec.managed_only {
        config = config.labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}"));
    }
    let mut stream = watcher::watcher(api, config).default_backoff().boxed();
    let mut buffer: Option<BTreeMap<ObjKey, Arc<Value>>> = None;
    let mut counted_sync = false;
    while let Some(event) = stream.next().await {
        let event = match event {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(kind = %kc.key, error = %e, "watch failed; retrying with backoff");
                continue;
            }
        };
        match event {
            Event::Init => buffer = Some(BTreeMap::new()),
            Event::InitApply(obj) => {
                if let Some(v) = to_value(obj) {
                    buffer
                        .get_or_insert_with(BTreeMap::new)
                        .insert(obj_key(&v), Arc::new(v));
                }
            }
            Event::InitDone => {
                let fresh = buffer.take().unwrap_or_default();
                replace_scope(&kc, scope.as_deref(), fresh, &changes);
                if !counted_sync {
                    counted_sync = true;
                    if pending.fetch_sub(1, std::sync::atomic::Ordering::SeqCst) == 1 {
                        kc.synced.send_replace(true);
                        tracing::debug!(kind = %kc.key, objects = kc.len(), "cache synced");
                    }
                }
            }
            Event::Apply(obj) => {
                if let Some(v) = to_value(obj) {
                    let key = obj_key(&v);
                    let new = Arc::new(v);
                    let old = kc
                        .data
                        .write()
                        .expect("cache lock")
                        .insert(key, new.clone());
                    let _ = changes.send(Change {
                        kind: kc.key.clone(),
                        old,
                        new: Some(new),
                    });
                }
            }
            Event::Delete(obj) => {
                if let Some(v) = to_value(obj) {
                    let key = obj_key(&v);
                    let old = kc.data.write().expect("cache lock").remove(&key);
                    let _ = changes.send(Change {
                        kind: kc.key.clone(),
                        old: old.or_else(|| Some(Arc::new(v))),
                        new: None,
                    });
                }
            }
        }
    }
    // The watcher stream never ends on its own; if it does, say so loudly.
    tracing::error!(kind = %kc.key, "watch stream ended");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

/// Replaces the objects of one scope with a fresh list and reports the
/// differences.
fn replace_scope(
    kc: &KindCache,
    scope: Option<&str>,
    fresh: BTreeMap<ObjKey, Arc<Value>>,
    changes: &mpsc::UnboundedSender<Change>,
) {
    let mut data = kc.data.write().expect("cache lock");
    let stale: Vec<ObjKey> = data
        .objects
        .keys()
        .filter(|(ns, _)| scope.is_none_or(|s| s == ns))
        .filter(|k| !fresh.contains_key(*k))
        .cloned()
        .collect();
    for key in stale {
        if let Some(old) = data.remove(&key) {
            let _ = changes.send(Change {
                kind: kc.key.clone(),
                old: Some(old),
                new: None,
            });
        }
    }
    for (key, new) in fresh {
        let unchanged = data
            .objects
            .get(&key)
            .is_some_and(|old| object::resource_version(old) == object::resource_version(&new));
        if unchanged {
            continue;
        }
        let old = data.insert(key, new.clone());
        let _ = changes.send(Change {
            kind: kc.key.clone(),
            old,
            new: Some(new),
        });
    }
}

fn to_value(obj: DynamicObject) -> Option<Value> {
    let mut v = serde_json::to_value(obj).ok()?;
    if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("managedFields");
    }
    Some(v)
}

fn obj_key(v: &Value) -> ObjKey {
    let meta = &v["metadata"];
    (
        meta["namespace"].as_str().unwrap_or_default().to_string(),
        meta["name"].as_str().unwrap_or_default().to_string(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cm(ns: &str, name: &str, uid: &str, owner: Option<&str>) -> Arc<Value> {
        let mut v = json!({"apiVersion":"v1","kind":"ConfigMap",
            "metadata":{"namespace":ns,"name":name,"uid":uid,"resourceVersion":"1"}});
        if let Some(o) = owner {
            v["metadata"]["ownerReferences"] =
                json!([{"apiVersion":"v1","kind":"X","name":"x","uid":o,"controller":true}]);
        }
        Arc::new(v)
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
}
