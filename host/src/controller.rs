//! The live operator: routes cache changes to the primaries they concern,
//! runs reconciles from the work queue, and turns each plugin answer into
//! validated writes.
//!
//! ```text
//! cache change ──route──▶ queue ──worker──▶ snapshot ▶ plugin ▶ validate ▶ execute
//! ```
//!
//! # Guarantees
//! - A primary is reconciled only after every cache its controller needs
//!   has synced.
//! - A change of a primary's status (or resourceVersion alone) does not
//!   trigger it again, so the host's own status write never loops.
//! - Owned objects re-trigger their controller owner; related objects
//!   re-trigger exactly the primaries that select them (through the
//!   reference index for field references, by namespace or label otherwise).
//! - A plugin failure, a rejected plan or an empty plan never deletes
//!   anything: only deletes the plugin names, validated, are executed.
//! - Failures are reported on the primary as the `Reconciled` condition and
//!   as a Warning Event, and retried with exponential backoff.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::api::ApiResource;
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::apply::{ApplyError, Writer, describe};
use crate::cache::{Cache, Change, KindCache, KindKey, WatchSpec};
use crate::conditions;
use crate::manifest::{Controller, KindRef, Selector};
use crate::metrics;
use crate::object;
use crate::observe::{ObserveConfig, Observer, PrimaryInfo};
use crate::plan::{self, Plan, Precondition};
use crate::plugin::LoadedPlugin;
use crate::queue::{Backoff, Queue};
use crate::snapshot::{self, ObjectSource};

/// Condition type the host maintains on every primary.
pub const RECONCILED_CONDITION: &str = "Reconciled";

/// Annotation naming the plugin version that last reconciled a primary:
/// `<plugin> <version> <digest>`.
pub const RECONCILED_BY_ANNOTATION: &str = "wasmop.dev/reconciled-by";

/// Tunables of the live operator.
#[derive(Clone, Debug)]
pub struct OperatorConfig {
    /// Reconciles running at once (different primaries).
    pub workers: usize,
    /// First retry delay after a failure.
    pub backoff_base: Duration,
    /// Longest retry delay.
    pub backoff_max: Duration,
    /// Name reported as the Events' reporting controller.
    pub reporter: String,
    /// How long a new plugin's caches may take to sync before it is
    /// rejected (e.g. its CRD is not installed).
    pub sync_timeout: Duration,
    /// Spacing of the re-queues after a plugin starts or is swapped.
    pub requeue_spacing: Duration,
    /// Limits and allow-list of the HTTP observations plans ask for.
    pub observe: ObserveConfig,
}

impl Default for OperatorConfig {
    fn default() -> Self {
        Self {
            workers: 4,
            backoff_base: Duration::from_millis(500),
            backoff_max: Duration::from_secs(300),
            reporter: "wasmop".into(),
            sync_timeout: Duration::from_secs(60),
            requeue_spacing: Duration::from_millis(5),
            observe: ObserveConfig::default(),
        }
    }
}

/// Errors of registering a plugin with the live operator.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    /// Another loaded controller already reconciles this kind.
    #[error("kind {kind} is already reconciled by {owner}; {plugin} cannot claim it")]
    KindClaimed {
        /// The contested kind.
        kind: String,
        /// `plugin/controller` that holds it.
        owner: String,
        /// The plugin being loaded.
        plugin: String,
    },
    /// A kind's watch did not complete its first list in time.
    #[error("{plugin}: the watch of {kind} did not sync within {waited:?} (is its CRD installed?)")]
    NotSynced {
        /// The kind.
        kind: String,
        /// The plugin being loaded.
        plugin: String,
        /// How long it waited.
        waited: Duration,
    },
}

/// Identity of one primary for one controller.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PrimaryKey {
    /// `plugin/controller`.
    pub controller: Arc<str>,
    /// Namespace, empty for cluster-scoped primaries.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl std::fmt::Display for PrimaryKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "{} {}", self.controller, self.name)
        } else {
            write!(f, "{} {}/{}", self.controller, self.namespace, self.name)
        }
    }
}

type ObjId = (String, String);
type RefTarget = (KindKey, String, String);

/// Which primaries name which objects through field references.
#[derive(Debug, Default)]
struct RefIndex {
    by_target: HashMap<RefTarget, HashSet<ObjId>>,
    by_primary: HashMap<ObjId, Vec<RefTarget>>,
}

impl RefIndex {
    fn set(&mut self, primary: ObjId, targets: Vec<RefTarget>) {
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

    fn clear(&mut self, primary: &ObjId) {
        for t in self.by_primary.remove(primary).unwrap_or_default() {
            if let Some(set) = self.by_target.get_mut(&t) {
                set.remove(primary);
                if set.is_empty() {
                    self.by_target.remove(&t);
                }
            }
        }
    }

    fn referrers(&self, target: &RefTarget) -> Vec<ObjId> {
        self.by_target
            .get(target)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }
}

/// One controller of one loaded plugin, as the operator runs it.
struct Active {
    id: Arc<str>,
    plugin: Arc<LoadedPlugin>,
    spec: Controller,
    primary: KindKey,
    primary_resource: ApiResource,
    writer: Writer,
    refs: Mutex<RefIndex>,
}

impl std::fmt::Debug for Active {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Active").field("id", &self.id).finish()
    }
}

/// Kubernetes API coordinates of a manifest kind.
pub fn api_resource(kind: &KindRef) -> ApiResource {
    ApiResource {
        group: kind.group.clone(),
        version: kind.version.clone(),
        api_version: kind.api_version(),
        kind: kind.kind.clone(),
        plural: kind.plural.clone(),
    }
}

/// Cache key of a manifest kind.
pub fn kind_key(kind: &KindRef) -> KindKey {
    KindKey::new(&kind.group, &kind.version, &kind.kind)
}

/// The live operator.
pub struct Operator {
    client: Client,
    cache: Arc<Cache>,
    controllers: RwLock<BTreeMap<Arc<str>, Arc<Active>>>,
    queue: Arc<Queue<PrimaryKey>>,
    backoff: Backoff<PrimaryKey>,
    recorder: Recorder,
    config: OperatorConfig,
    leader: Arc<AtomicBool>,
    tasks: Mutex<Vec<tokio::task::AbortHandle>>,
    observer: Arc<Observer>,
}

impl std::fmt::Debug for Operator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Operator")
            .field("controllers", &self.controller_ids())
            .field("config", &self.config)
            .finish()
    }
}

impl Operator {
    /// An operator watching `namespaces` (empty: all). Call [`Operator::run`]
    /// to start routing and workers, and [`Operator::add_plugin`] for each
    /// plugin.
    pub fn new(
        client: Client,
        namespaces: Vec<String>,
        config: OperatorConfig,
    ) -> (Arc<Self>, mpsc::UnboundedReceiver<Change>) {
        let (cache, changes) = Cache::new(client.clone(), namespaces);
        let reporter = Reporter {
            controller: config.reporter.clone(),
            instance: std::env::var("POD_NAME").ok(),
        };
        let op = Arc::new(Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            cache,
            controllers: RwLock::new(BTreeMap::new()),
            queue: Queue::new(),
            backoff: Backoff::new(config.backoff_base, config.backoff_max),
            observer: Observer::new(config.observe.clone()),
            config,
            leader: Arc::new(AtomicBool::new(true)),
            tasks: Mutex::new(Vec::new()),
        });
        (op, changes)
    }

    /// The watch caches.
    pub fn cache(&self) -> &Arc<Cache> {
        &self.cache
    }

    /// `plugin/controller` of every running controller.
    pub fn controller_ids(&self) -> Vec<String> {
        self.controllers
            .read()
            .expect("controllers lock")
            .keys()
            .map(|k| k.to_string())
            .collect()
    }

    /// The flag that gates writes (leader election); true by default.
    pub fn leader_flag(&self) -> Arc<AtomicBool> {
        self.leader.clone()
    }

    /// Starts the change router and the workers; returns when `shutdown`
    /// resolves, after in-flight reconciles finished.
    pub async fn run(
        self: Arc<Self>,
        mut changes: mpsc::UnboundedReceiver<Change>,
        shutdown: impl std::future::Future<Output = ()>,
    ) {
        let router = {
            let op = self.clone();
            tokio::spawn(async move {
                while let Some(change) = changes.recv().await {
                    for key in op.route(&change) {
                        op.queue.add(key);
                    }
                }
            })
        };
        let workers: Vec<_> = (0..self.config.workers.max(1))
            .map(|_| {
                let op = self.clone();
                tokio::spawn(async move {
                    while let Some(key) = op.queue.next().await {
                        op.reconcile(&key).await;
                        op.queue.done(&key);
                    }
                })
            })
            .collect();
        {
            let mut tasks = self.tasks.lock().expect("tasks lock");
            tasks.push(router.abort_handle());
            tasks.extend(workers.iter().map(|w| w.abort_handle()));
        }
        shutdown.await;
        self.queue.close();
        for w in workers {
            let _ = w.await;
        }
        router.abort();
    }

    /// Stops everything at once — watches, routing, workers — without
    /// waiting for in-flight reconciles (what a crash looks like to the
    /// cluster).
    pub fn abort(&self) {
        for t in self.tasks.lock().expect("tasks lock").drain(..) {
            t.abort();
        }
        self.queue.close();
        self.cache.stop();
    }

    /// Starts the controllers of a loaded plugin, or replaces the running
    /// version of a plugin with the same name (hot swap).
    ///
    /// Watches the plugin's kinds, waits until their caches synced, then
    /// switches over in one step: reconciles already running finish on the
    /// old version, every later one runs the new. Every primary of the
    /// plugin is queued again, spread out at [`OperatorConfig::requeue_spacing`]
    /// so a swap is not a thundering herd.
    ///
    /// # Errors
    /// [`OperatorError::KindClaimed`] when a primary kind is reconciled by
    /// another plugin; [`OperatorError::NotSynced`] when a kind's cache does
    /// not sync in time (e.g. its CRD is not installed). Nothing changes
    /// then: the running version, if any, keeps serving.
    pub async fn add_plugin(&self, plugin: Arc<LoadedPlugin>) -> Result<(), OperatorError> {
        // The manifest with `setting:` write namespaces resolved: what
        // validation enforces.
        let manifest = plugin.effective_manifest().clone();
        {
            let controllers = self.controllers.read().expect("controllers lock");
            for c in &manifest.controllers {
                for other in controllers.values() {
                    if other.plugin.name() != plugin.name()
                        && other.spec.primary.same_type(&c.primary)
                    {
                        return Err(OperatorError::KindClaimed {
                            kind: c.primary.to_string(),
                            owner: other.id.to_string(),
                            plugin: plugin.name().to_string(),
                        });
                    }
                }
            }
        }
        let mut caches: Vec<Arc<KindCache>> = Vec::new();
        let mut actives = Vec::new();
        for c in &manifest.controllers {
            let id: Arc<str> = format!("{}/{}", plugin.name(), c.name).into();
            caches.push(self.cache.ensure(WatchSpec {
                resource: api_resource(&c.primary),
                namespaced: c.primary.namespaced,
                managed_only: false,
            }));
            for r in &c.reads {
                caches.push(self.cache.ensure(WatchSpec {
                    resource: api_resource(&r.kind),
                    namespaced: r.kind.namespaced,
                    managed_only: false,
                }));
            }
            for o in &c.owns {
                let read_elsewhere = self.kind_is_read(&kind_key(o), &manifest.controllers);
                caches.push(self.cache.ensure(WatchSpec {
                    resource: api_resource(o),
                    namespaced: o.namespaced,
                    managed_only: !read_elsewhere,
                }));
            }
            actives.push(Arc::new(Active {
                id,
                spec: c.clone(),
                primary: kind_key(&c.primary),
                primary_resource: api_resource(&c.primary),
                writer: Writer::new(self.client.clone(), format!("wasmop-{}", plugin.name())),
                plugin: plugin.clone(),
                refs: Mutex::new(RefIndex::default()),
            }));
        }
        for c in &caches {
            if tokio::time::timeout(self.config.sync_timeout, c.wait_synced())
                .await
                .is_err()
            {
                self.drop_unused_caches();
                return Err(OperatorError::NotSynced {
                    kind: c.key().to_string(),
                    plugin: plugin.name().to_string(),
                    waited: self.config.sync_timeout,
                });
            }
        }
        let mut queued = Vec::new();
        let replaced = {
            let mut controllers = self.controllers.write().expect("controllers lock");
            let old: Vec<Arc<str>> = controllers
                .iter()
                .filter(|(_, a)| a.plugin.name() == plugin.name())
                .map(|(k, _)| k.clone())
                .collect();
            let replaced = old.iter().filter_map(|k| controllers.remove(k)).next();
            for a in actives {
                if let Some(kc) = self.cache.kind(&a.primary) {
                    for obj in kc.list(None) {
                        self.index_refs(&a, &obj);
                        queued.push(key_of(&a.id, &obj));
                    }
                }
                controllers.insert(a.id.clone(), a);
            }
            replaced
        };
        let m = metrics::global();
        if let Some(old) = &replaced {
            m.remove_where("wasmop_plugin_info", "plugin", old.plugin.name());
        }
        m.set(
            "wasmop_plugin_info",
            &[
                ("plugin", plugin.name()),
                ("version", plugin.version()),
                ("digest", plugin.digest()),
            ],
            1.0,
        );
        m.inc("wasmop_plugin_loads_total", &[("plugin", plugin.name())]);
        match &replaced {
            Some(old) => tracing::info!(
                plugin = plugin.name(),
                from = old.plugin.version(),
                to = plugin.version(),
                digest = plugin.digest(),
                primaries = queued.len(),
                "plugin swapped"
            ),
            None => tracing::info!(
                plugin = plugin.name(),
                version = plugin.version(),
                digest = plugin.digest(),
                controllers = manifest.controllers.len(),
                primaries = queued.len(),
                "plugin started"
            ),
        }
        for (i, key) in queued.into_iter().enumerate() {
            let delay = self
                .config
                .requeue_spacing
                .saturating_mul(u32::try_from(i).unwrap_or(u32::MAX));
            self.queue.add_after(key, delay);
        }
        self.drop_unused_caches();
        Ok(())
    }

    /// Stops the controllers of a plugin. Its objects stay: nothing is
    /// deleted because a plugin went away. Returns whether it was running.
    pub fn remove_plugin(&self, name: &str) -> bool {
        let removed: Vec<Arc<Active>> = {
            let mut controllers = self.controllers.write().expect("controllers lock");
            let ids: Vec<Arc<str>> = controllers
                .iter()
                .filter(|(_, a)| a.plugin.name() == name)
                .map(|(k, _)| k.clone())
                .collect();
            ids.iter().filter_map(|k| controllers.remove(k)).collect()
        };
        if removed.is_empty() {
            return false;
        }
        metrics::global().remove_where("wasmop_plugin_info", "plugin", name);
        tracing::info!(
            plugin = name,
            "plugin removed; its controllers stopped, its objects left in place"
        );
        self.drop_unused_caches();
        true
    }

    /// Queues every primary of every running controller again, spaced out
    /// like a plugin start (e.g. after this replica became the leader and
    /// its earlier reconciles skipped their writes).
    pub fn requeue_all(&self) {
        let keys: Vec<PrimaryKey> = {
            let controllers = self.controllers.read().expect("controllers lock");
            controllers
                .values()
                .flat_map(|a| {
                    self.cache
                        .kind(&a.primary)
                        .map(|kc| kc.list(None))
                        .unwrap_or_default()
                        .iter()
                        .map(|o| key_of(&a.id, o))
                        .collect::<Vec<_>>()
                })
                .collect()
        };
        for (i, key) in keys.into_iter().enumerate() {
            let delay = self
                .config
                .requeue_spacing
                .saturating_mul(u32::try_from(i).unwrap_or(u32::MAX));
            self.queue.add_after(key, delay);
        }
    }

    /// The name, version and digest of every running plugin.
    pub fn plugins(&self) -> Vec<(String, String, String)> {
        let mut out: Vec<(String, String, String)> = self
            .controllers
            .read()
            .expect("controllers lock")
            .values()
            .map(|a| {
                (
                    a.plugin.name().to_string(),
                    a.plugin.version().to_string(),
                    a.plugin.digest().to_string(),
                )
            })
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// Stops the watches no running controller needs any more.
    fn drop_unused_caches(&self) {
        let needed: HashSet<KindKey> = self
            .controllers
            .read()
            .expect("controllers lock")
            .values()
            .flat_map(|a| {
                let c = &a.spec;
                std::iter::once(kind_key(&c.primary))
                    .chain(c.owns.iter().map(kind_key))
                    .chain(c.reads.iter().map(|r| kind_key(&r.kind)))
                    .collect::<Vec<_>>()
            })
            .collect();
        for k in self.cache.kinds() {
            if !needed.contains(&k) {
                self.cache.remove(&k);
            }
        }
    }

    fn kind_is_read(&self, key: &KindKey, incoming: &[Controller]) -> bool {
        let reads = |c: &Controller| {
            kind_key(&c.primary) == *key || c.reads.iter().any(|r| kind_key(&r.kind) == *key)
        };
        incoming.iter().any(reads)
            || self
                .controllers
                .read()
                .expect("controllers lock")
                .values()
                .any(|a| reads(&a.spec))
    }

    fn index_refs(&self, a: &Active, primary: &Value) {
        let targets = snapshot::referenced_names(&a.spec, primary)
            .into_iter()
            .map(|r| (kind_key(&r.kind), r.namespace.unwrap_or_default(), r.name))
            .collect();
        a.refs
            .lock()
            .expect("refs lock")
            .set(obj_id(primary), targets);
    }

    /// Which primaries a cache change concerns.
    fn route(&self, change: &Change) -> Vec<PrimaryKey> {
        let controllers: Vec<Arc<Active>> = self
            .controllers
            .read()
            .expect("controllers lock")
            .values()
            .cloned()
            .collect();
        let mut keys = Vec::new();
        let objects: Vec<&Value> = change
            .old
            .iter()
            .chain(change.new.iter())
            .map(|v| v.as_ref())
            .collect();
        for a in &controllers {
            if a.primary == change.kind {
                match (&change.old, &change.new) {
                    (_, Some(new)) => {
                        self.index_refs(a, new);
                        let changed = change
                            .old
                            .as_ref()
                            .is_none_or(|old| trigger_view(old) != trigger_view(new));
                        if changed {
                            keys.push(key_of(&a.id, new));
                        }
                    }
                    (Some(old), None) => {
                        a.refs.lock().expect("refs lock").clear(&obj_id(old));
                        self.observer.forget(object::uid(old));
                        self.observer.forget(object::uid(old));
                        let key = key_of(&a.id, old);
                        self.queue.forget(&key);
                        self.backoff.reset(&key);
                    }
                    (None, None) => {}
                }
            }
            let owned = a.spec.owns.iter().any(|o| kind_key(o) == change.kind);
            let read_owned = a.spec.reads.iter().any(|r| {
                kind_key(&r.kind) == change.kind && matches!(r.selector, Selector::OwnedByPrimary)
            });
            if owned || read_owned {
                for obj in &objects {
                    if let Some(p) = self.owner_primary(a, obj) {
                        keys.push(key_of(&a.id, &p));
                    }
                }
            }
            for r in a
                .spec
                .reads
                .iter()
                .filter(|r| kind_key(&r.kind) == change.kind)
            {
                match &r.selector {
                    Selector::OwnedByPrimary => {}
                    Selector::Field(_) => {
                        let refs = a.refs.lock().expect("refs lock");
                        for obj in &objects {
                            let target = (
                                change.kind.clone(),
                                object::namespace(obj).unwrap_or_default().to_string(),
                                object::name(obj).to_string(),
                            );
                            for (ns, name) in refs.referrers(&target) {
                                keys.push(PrimaryKey {
                                    controller: a.id.clone(),
                                    namespace: ns,
                                    name,
                                });
                            }
                        }
                    }
                    Selector::SameNamespace => {
                        for obj in &objects {
                            keys.extend(self.primaries_in(a, object::namespace(obj)));
                        }
                    }
                    Selector::ClusterWide => keys.extend(self.primaries_in(a, None)),
                    Selector::Labels(sel) => {
                        for obj in &objects {
                            if crate::selector::selector_matches(sel, &object::labels(obj)) {
                                let ns = if a.spec.primary.namespaced {
                                    object::namespace(obj)
                                } else {
                                    None
                                };
                                keys.extend(self.primaries_in(a, ns));
                            }
                        }
                    }
                }
            }
        }
        keys.sort();
        keys.dedup();
        keys
    }

    fn primaries_in(&self, a: &Active, namespace: Option<&str>) -> Vec<PrimaryKey> {
        let Some(kc) = self.cache.kind(&a.primary) else {
            return Vec::new();
        };
        let ns = if a.spec.primary.namespaced {
            namespace
        } else {
            None
        };
        kc.list(ns).iter().map(|p| key_of(&a.id, p)).collect()
    }

    fn owner_primary(&self, a: &Active, obj: &Value) -> Option<Arc<Value>> {
        let uid = object::controller_uid(obj)?;
        self.cache.kind(&a.primary)?.get_by_uid(uid)
    }

    /// One reconcile of one primary, start to end. Never panics on bad
    /// input; every failure ends up on the primary's conditions and Events.
    async fn reconcile(&self, key: &PrimaryKey) {
        let active = self
            .controllers
            .read()
            .expect("controllers lock")
            .get(&key.controller)
            .cloned();
        let Some(a) = active else { return };
        let Some(primary) = self
            .cache
            .kind(&a.primary)
            .and_then(|kc| kc.get(&key.namespace, &key.name))
        else {
            return;
        };
        let deleting = object::is_deleting(&primary);
        let has_finalizer = a
            .spec
            .finalizer
            .as_deref()
            .is_some_and(|f| finalizers(&primary).iter().any(|x| x == f));
        if deleting && !has_finalizer {
            // Garbage collection removes the owned objects; nothing to do.
            return;
        }
        let now = now_rfc3339();
        let source = CacheSource { cache: &self.cache };
        let observations = self
            .observer
            .results(object::uid(&primary), jiff::Timestamp::now());
        let snap = snapshot::build_snapshot(
            &a.spec,
            primary.clone(),
            &source,
            &now,
            a.plugin.settings(),
            observations,
        );
        // What the plan's HTTP requests may reach: the objects of this snapshot.
        let seen: Vec<Arc<Value>> = snap
            .owned
            .iter()
            .cloned()
            .chain(snap.related.iter().map(|r| r.object.clone()))
            .collect();
        let plugin = a.plugin.clone();
        let started = std::time::Instant::now();
        let outcome = tokio::task::spawn_blocking(move || plugin.reconcile(&snap)).await;
        let elapsed = started.elapsed();
        metrics::global().add(
            "wasmop_reconcile_seconds_total",
            &[("controller", &a.id)],
            elapsed.as_secs_f64(),
        );
        let plan = match outcome {
            Ok(Ok(plan)) => plan,
            Ok(Err(e)) => {
                self.fail(&a, key, &primary, e.reason(), &e.to_string(), &now)
                    .await;
                return;
            }
            Err(join) => {
                self.fail(
                    &a,
                    key,
                    &primary,
                    "PluginTrapped",
                    &format!("reconcile task failed: {join}"),
                    &now,
                )
                .await;
                return;
            }
        };
        tracing::debug!(primary = %key, plugin_version = %a.plugin.version(), ?elapsed,
            plan = %serde_json::to_string(&plan).unwrap_or_default(), "plan");
        if let Err(violations) = plan::validate(&plan, &a.spec, &primary, &source) {
            let message = violations
                .iter()
                .map(|v| v.to_string())
                .collect::<Vec<_>>()
                .join("; ");
            self.fail(
                &a,
                key,
                &primary,
                "PlanRejected",
                &format!("plan rejected, nothing written: {message}"),
                &now,
            )
            .await;
            return;
        }
        if !self.leader.load(Ordering::SeqCst) {
            return;
        }
        match self.execute(&a, &primary, &plan, &now).await {
            Ok(()) => {
                metrics::global().inc(
                    "wasmop_reconcile_total",
                    &[("controller", &a.id), ("result", "Reconciled")],
                );
                self.backoff.reset(key);
                tracing::info!(primary = %key, plugin_version = %a.plugin.version(),
                    applied = plan.apply.len(), deleted = plan.delete.len(), "reconciled");
                if let Some(ms) = plan.requeue_after_ms {
                    self.queue.add_after(key.clone(), Duration::from_millis(ms));
                }
                if !plan.http_requests.is_empty() {
                    self.observe(&a, key, &primary, &plan, &seen);
                }
            }
            Err(e) => {
                let reason = e.reason();
                // Re-read: the failed write may have been preceded by others.
                let current = self
                    .cache
                    .kind(&a.primary)
                    .and_then(|kc| kc.get(&key.namespace, &key.name));
                let primary = current.unwrap_or(primary);
                self.fail(&a, key, &primary, reason, &e.to_string(), &now)
                    .await;
            }
        }
    }

    async fn execute(
        &self,
        a: &Active,
        primary: &Value,
        plan: &Plan,
        now: &str,
    ) -> Result<(), ApplyError> {
        let mut primary = primary.clone();
        let deleting = object::is_deleting(&primary);
        let w = &a.writer;
        // A delete of the primary itself (validated: the controller declares
        // `delete-primary`). Its resourceVersion precondition is the one the
        // plugin saw, so nothing here may move the primary's version before
        // it: no finalizer is added and no annotation written.
        let delete_self = plan
            .delete
            .iter()
            .find(|d| plan::is_primary(&d.target, &a.spec, &primary))
            .cloned();
        if let Some(f) = &a.spec.finalizer
            && delete_self.is_none()
        {
            let mut list = finalizers(&primary);
            if !deleting && !list.iter().any(|x| x == f) {
                list.push(f.clone());
                primary = w
                    .set_finalizers(&a.primary_resource, &primary, &list)
                    .await?;
                strip_managed_fields(&mut primary);
            }
        }
        // Fields of the primary (validated to be declared `primary-fields`)
        // and the record of which plugin version reconciles it, in one merge
        // patch: set-once values are never removed by a later pass.
        let mut patch = plan.primary_patch.clone().unwrap_or_else(|| json!({}));
        let reconciled_by = reconciled_by(&a.plugin);
        if delete_self.is_none()
            && primary["metadata"]["annotations"][RECONCILED_BY_ANNOTATION].as_str()
                != Some(reconciled_by.as_str())
        {
            merge(
                &mut patch,
                &json!({"metadata": {"annotations": {RECONCILED_BY_ANNOTATION: reconciled_by}}}),
            );
        }
        if patch.as_object().is_some_and(|m| !m.is_empty()) {
            let updated = w.merge_patch(&a.primary_resource, &primary, &patch).await?;
            follow_version(&mut primary, &updated);
        }
        // Each write is attempted even when an earlier one failed: one
        // component's conflict must not hold back the others. Any failure
        // fails the reconcile (status, Events and finalizer release wait
        // for a clean pass).
        let mut failures: Vec<ApplyError> = Vec::new();
        for op in &plan.apply {
            let obj = plan::prepare_apply(&op.object, &primary, a.plugin.name());
            // Validation guarantees every applied object is of an owned kind.
            let Some(resource) = owned_kind(&a.spec, &obj).map(api_resource) else {
                failures.push(ApplyError::Api {
                    target: describe(&obj),
                    message: "not of a kind the controller owns".into(),
                });
                continue;
            };
            // `force` takes fields from other managers; a create has none.
            let written = match &op.precondition {
                Some(Precondition::Absent) => w.create(&resource, &obj).await,
                Some(Precondition::ResourceVersion(rv)) => {
                    w.apply(&resource, &obj, Some(rv), op.force).await
                }
                None => w.apply(&resource, &obj, None, op.force).await,
            };
            if let Err(e) = written {
                failures.push(e);
            }
        }
        for d in plan
            .delete
            .iter()
            .filter(|d| Some(*d) != delete_self.as_ref())
        {
            let kind = a
                .spec
                .owns
                .iter()
                .find(|k| k.matches(&d.target.api_version, &d.target.kind));
            if let Some(kind) = kind {
                let ns = (!d.target.namespace.is_empty()).then_some(d.target.namespace.as_str());
                if let Err(e) = w
                    .delete(
                        &api_resource(kind),
                        ns,
                        &d.target.name,
                        &d.uid,
                        &d.resource_version,
                    )
                    .await
                {
                    failures.push(e);
                }
            }
        }
        // The primary goes last, and only after every other write held:
        // a failed pass is retried with the primary still there.
        if failures.is_empty()
            && let Some(d) = &delete_self
        {
            let ns = (!d.target.namespace.is_empty()).then_some(d.target.namespace.as_str());
            if let Err(e) = w
                .delete(
                    &a.primary_resource,
                    ns,
                    &d.target.name,
                    &d.uid,
                    &d.resource_version,
                )
                .await
            {
                failures.push(e);
            }
        }
        if let Some(first) = failures.first() {
            return Err(match failures.len() {
                1 => failures.remove(0),
                n => ApplyError::Api {
                    target: format!("{n} objects"),
                    message: failures
                        .iter()
                        .map(|e| e.to_string())
                        .collect::<Vec<_>>()
                        .join("; "),
                }
                .with_reason_of(first),
            });
        }
        let mut status = plan
            .status
            .clone()
            .unwrap_or_else(|| primary["status"].clone());
        if !status.is_object() {
            status = json!({});
        }
        if let Some(g) = primary["metadata"]["generation"].as_i64() {
            status["observedGeneration"] = json!(g);
        }
        // A plugin that writes its own conditions list without ours must not
        // reset our condition's lastTransitionTime on every pass.
        conditions::carry_over(&mut status, &primary["status"], RECONCILED_CONDITION);
        conditions::set(
            &mut status,
            RECONCILED_CONDITION,
            "True",
            "Reconciled",
            &format!(
                "reconciled by plugin {} {}",
                a.plugin.name(),
                a.plugin.version()
            ),
            primary["metadata"]["generation"].as_i64(),
            now,
        );
        // A deleted primary gets no status: it is gone, or going.
        if delete_self.is_none() && status != primary["status"] {
            let updated = w
                .write_status(&a.primary_resource, &primary, &status)
                .await?;
            follow_version(&mut primary, &updated);
        }
        for e in &plan.events {
            self.event(
                &primary,
                e.event_type == plan::EventType::Warning,
                &e.reason,
                &e.message,
            )
            .await;
        }
        if deleting
            && plan.cleanup_complete
            && let Some(f) = &a.spec.finalizer
        {
            let list: Vec<String> = finalizers(&primary)
                .into_iter()
                .filter(|x| x != f)
                .collect();
            w.set_finalizers(&a.primary_resource, &primary, &list)
                .await?;
        }
        Ok(())
    }

    /// Performs the plan's HTTP requests after its writes; their results
    /// reach the primary's next snapshot, which is queued when they are in.
    fn observe(
        &self,
        a: &Active,
        key: &PrimaryKey,
        primary: &Value,
        plan: &Plan,
        seen: &[Arc<Value>],
    ) {
        // Targets and Secrets are looked up by name in the primary's
        // namespace, among the objects of its snapshot only.
        let namespace = object::namespace(primary);
        let find = |kind: &KindRef, name: &str| -> Option<Value> {
            seen.iter()
                .find(|o| {
                    kind.matches(object::api_version(o), object::kind(o))
                        && object::name(o) == name
                        && object::namespace(o) == namespace
                })
                .map(|o| o.as_ref().clone())
        };
        let secret = KindRef::namespaced("", "v1", "Secret", "secrets");
        let resolved = self.observer.prepare(
            &plan.http_requests,
            &a.spec.http_targets,
            find,
            |name: &str| find(&secret, name),
        );
        let queue = self.queue.clone();
        let key = key.clone();
        self.observer.submit(
            PrimaryInfo::of(primary, a.plugin.name(), a.plugin.version()),
            resolved,
            // Only a result the plugin has not seen is worth a reconcile;
            // re-queueing on an unchanged result would loop.
            move |outcome| {
                let m = metrics::global();
                let c: &str = &key.controller;
                m.add(
                    "wasmop_http_requests_total",
                    &[("controller", c), ("outcome", "sent")],
                    outcome.sent as f64,
                );
                m.add(
                    "wasmop_http_requests_total",
                    &[("controller", c), ("outcome", "refused")],
                    outcome.refused as f64,
                );
                m.add(
                    "wasmop_http_requests_total",
                    &[("controller", c), ("outcome", "rate_limited")],
                    outcome.rate_limited as f64,
                );
                if outcome.changed > 0 {
                    queue.add(key);
                }
            },
        );
    }

    /// Reports a failed reconcile on the primary and schedules a retry.
    async fn fail(
        &self,
        a: &Active,
        key: &PrimaryKey,
        primary: &Value,
        reason: &str,
        message: &str,
        now: &str,
    ) {
        metrics::global().inc(
            "wasmop_reconcile_total",
            &[("controller", &a.id), ("result", reason)],
        );
        let delay = self.backoff.fail(key);
        tracing::warn!(primary = %key, plugin_version = %a.plugin.version(), reason, message, retry_in = ?delay, "reconcile failed");
        if self.leader.load(Ordering::SeqCst) {
            let mut status = primary["status"].clone();
            if !status.is_object() {
                status = json!({});
            }
            conditions::set(
                &mut status,
                RECONCILED_CONDITION,
                "False",
                reason,
                message,
                primary["metadata"]["generation"].as_i64(),
                now,
            );
            if status != primary["status"]
                && let Err(e) = a
                    .writer
                    .write_status(&a.primary_resource, primary, &status)
                    .await
            {
                tracing::warn!(primary = %key, error = %e, "could not write the failure condition");
            }
            self.event(primary, true, reason, message).await;
        }
        self.queue.add_after(key.clone(), delay);
    }

    async fn event(&self, primary: &Value, warning: bool, reason: &str, message: &str) {
        let reference = ObjectReference {
            api_version: primary["apiVersion"].as_str().map(String::from),
            kind: primary["kind"].as_str().map(String::from),
            name: primary["metadata"]["name"].as_str().map(String::from),
            namespace: object::namespace(primary).map(String::from),
            uid: primary["metadata"]["uid"].as_str().map(String::from),
            ..ObjectReference::default()
        };
        let mut note: String = message.chars().take(1000).collect();
        if note.len() < message.len() {
            note.push('…');
        }
        let ev = KubeEvent {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.chars().take(128).collect(),
            note: Some(note),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, &reference).await {
            tracing::warn!(object = %describe(primary), error = %e, "could not record an Event");
        }
    }
}

/// The owned kind an object to apply belongs to.
fn owned_kind<'a>(c: &'a Controller, obj: &Value) -> Option<&'a KindRef> {
    c.owns
        .iter()
        .find(|k| k.matches(object::api_version(obj), object::kind(obj)))
}

fn key_of(controller: &Arc<str>, obj: &Value) -> PrimaryKey {
    PrimaryKey {
        controller: controller.clone(),
        namespace: object::namespace(obj).unwrap_or_default().to_string(),
        name: object::name(obj).to_string(),
    }
}

fn obj_id(obj: &Value) -> ObjId {
    (
        object::namespace(obj).unwrap_or_default().to_string(),
        object::name(obj).to_string(),
    )
}

fn finalizers(obj: &Value) -> Vec<String> {
    obj["metadata"]["finalizers"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|f| f.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// `<plugin> <version> <digest prefix>`, the value of [`RECONCILED_BY_ANNOTATION`].
pub fn reconciled_by(plugin: &LoadedPlugin) -> String {
    let digest: String = plugin.digest().chars().take(19).collect();
    format!("{} {} {digest}", plugin.name(), plugin.version())
}

/// Takes the resourceVersion of our own write, so a later preconditioned
/// write in the same reconcile does not conflict with it.
fn follow_version(primary: &mut Value, updated: &Value) {
    if let Some(rv) = updated["metadata"]["resourceVersion"].as_str() {
        primary["metadata"]["resourceVersion"] = json!(rv);
    }
}

fn strip_managed_fields(obj: &mut Value) {
    if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("managedFields");
    }
}

/// What of a primary may trigger a reconcile: everything but its status and
/// bookkeeping metadata.
fn trigger_view(obj: &Value) -> Value {
    let mut v = obj.clone();
    if let Some(m) = v.as_object_mut() {
        m.remove("status");
    }
    if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("resourceVersion");
        meta.remove("managedFields");
        if let Some(ann) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
            ann.remove(RECONCILED_BY_ANNOTATION);
            if ann.is_empty() {
                meta.remove("annotations");
            }
        }
    }
    v
}

/// Deep-merges `patch` into `base` (objects merge, everything else replaces).
fn merge(base: &mut Value, patch: &Value) {
    match (base, patch) {
        (Value::Object(b), Value::Object(p)) => {
            for (k, v) in p {
                merge(b.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (b, p) => *b = p.clone(),
    }
}

/// Current time as RFC 3339 UTC with second precision.
pub fn now_rfc3339() -> String {
    jiff::Timestamp::now()
        .round(jiff::Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// The live caches as the snapshot builder's object source.
struct CacheSource<'a> {
    cache: &'a Cache,
}

impl ObjectSource for CacheSource<'_> {
    fn owned_by(&self, kind: &KindRef, owner_uid: &str) -> Vec<Arc<Value>> {
        self.cache
            .kind(&kind_key(kind))
            .map(|kc| kc.owned_by(owner_uid))
            .unwrap_or_default()
    }

    fn get(&self, kind: &KindRef, namespace: Option<&str>, name: &str) -> Option<Arc<Value>> {
        self.cache
            .kind(&kind_key(kind))?
            .get(namespace.unwrap_or_default(), name)
    }

    fn list(&self, kind: &KindRef, namespace: Option<&str>) -> Vec<Arc<Value>> {
        self.cache
            .kind(&kind_key(kind))
            .map(|kc| kc.list(namespace))
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_and_resource_version_changes_do_not_trigger() {
        let a = json!({"metadata":{"name":"a","resourceVersion":"1","generation":1},"spec":{"x":1},"status":{"y":1}});
        let mut b = a.clone();
        b["metadata"]["resourceVersion"] = json!("2");
        b["status"]["y"] = json!(2);
        assert_eq!(trigger_view(&a), trigger_view(&b));
        b["spec"]["x"] = json!(2);
        assert_ne!(trigger_view(&a), trigger_view(&b));
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

    #[test]
    fn merge_replaces_scalars_and_merges_objects() {
        let mut base = json!({"metadata":{"name":"x"},"spec":{"a":1}});
        merge(&mut base, &json!({"spec":{"id":"u"}}));
        assert_eq!(
            base,
            json!({"metadata":{"name":"x"},"spec":{"a":1,"id":"u"}})
        );
    }
}
