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
//!   anything the plugin made for a live owner: only deletes the plugin
//!   names, validated, are executed, and objects whose owner is gone that
//!   the garbage collector missed ([`orphans`], under its own rules).
//! - Failures are reported on the primary as the `Reconciled` condition and
//!   as a Warning Event, and retried with exponential backoff.

mod echo;
pub mod orphans;
pub mod queue;
pub mod rollout;
pub(crate) mod route;
mod sharder;
mod truth;
mod worker;

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use kube::Client;
use kube::api::ApiResource;
use serde_json::Value;
use tokio::sync::mpsc;
use tracing::Instrument;

use crate::contract::manifest::{Controller, KindRef};
use crate::contract::selector::LabelSelector;
use crate::controller::queue::{Backoff, Queue};
use crate::execute::Reporter;
use crate::execute::writer::Writer;
use crate::judge::snapshot::ObjectSource;
use crate::metrics;
use crate::observe::{ObserveConfig, Observer};
use crate::plugin::LoadedPlugin;
use crate::watch::by_name::{self, SecretReads};
use crate::watch::cache::{Cache, CachedObject, Change, KindCache, KindKey, WatchSpec};
use route::{PrimaryLookup, Route, cached_key_of};
use wasmop_contract::Scope;

pub use crate::execute::{
    RECONCILED_BY_ANNOTATION, RECONCILED_CONDITION, api_resource, reconciled_by,
};
pub use crate::lease::{leader, shard};
pub use route::kind_key;

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
    /// Limits and allow-list of the HTTP observations plans ask for.
    pub observe: ObserveConfig,
    /// How often the Secrets primaries name through field references are
    /// read again to notice changes (they are read by name, not watched).
    pub secret_poll_interval: Duration,
    /// Where each decided reconcile is recorded (`wasmop run --record`).
    pub recorder: Option<Arc<crate::report::record::Recorder>>,
    /// How often the leader sweeps for objects of its plugins whose owner
    /// is gone (see [`orphans`]); `None`: never.
    pub orphan_sweep_interval: Option<Duration>,
    /// How often the `PluginRollout` objects are read (and, on the
    /// leader, driven; see [`crate::reconcile::rollout`]); `None`: rollouts are not
    /// followed.
    pub rollout_interval: Option<Duration>,
    /// Only `PluginRollout` objects whose labels match this selector are
    /// followed (several operator Deployments in one cluster); `None`: all.
    pub rollout_selector: Option<String>,
}

impl Default for OperatorConfig {
    fn default() -> Self {
        Self {
            workers: 4,
            backoff_base: Duration::from_millis(500),
            backoff_max: Duration::from_secs(300),
            reporter: "wasmop".into(),
            sync_timeout: Duration::from_secs(60),
            observe: ObserveConfig::default(),
            secret_poll_interval: Duration::from_secs(30),
            recorder: None,
            orphan_sweep_interval: Some(DEFAULT_ORPHAN_SWEEP_INTERVAL),
            rollout_interval: None,
            rollout_selector: None,
        }
    }
}

/// How often the leader sweeps for orphans by default (`wasmop run
/// --orphan-sweep-interval-secs`).
pub const DEFAULT_ORPHAN_SWEEP_INTERVAL: Duration = Duration::from_secs(600);

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
    /// The API server does not serve a kind the plugin needs (404: its CRD
    /// is not installed). The plugin file's loader tries again.
    #[error("plugin {plugin} waits for CRD {crd} ({hint})")]
    KindNotServed {
        /// The kind.
        kind: String,
        /// `<plural>.<group>` of the missing CRD.
        crd: String,
        /// What to install.
        hint: String,
        /// The plugin being loaded.
        plugin: String,
    },
}

/// How long the changes for a kind-scoped controller are collected before
/// its one call runs: the first change schedules the call this much later,
/// and every change until then joins it (so N changes within the window
/// make one call). A change during the call schedules one more.
pub const KIND_DEBOUNCE: Duration = Duration::from_millis(200);

/// The `name` of the one queue key of a kind-scoped controller (not a
/// valid object name, so it never collides with a primary's key).
pub const WHOLE_KIND_NAME: &str = "*";

/// The one queue key of the kind-scoped controller `controller`.
pub(crate) fn whole_kind_key(controller: &Arc<str>) -> PrimaryKey {
    PrimaryKey {
        controller: controller.clone(),
        namespace: String::new(),
        name: WHOLE_KIND_NAME.to_owned(),
    }
}

pub use crate::key::PrimaryKey;

/// One controller of one loaded plugin, as the operator runs it.
struct Active {
    id: Arc<str>,
    plugin: Arc<LoadedPlugin>,
    spec: Controller,
    primary: KindKey,
    primary_resource: ApiResource,
    writer: Writer,
    route: Route,
    /// Every kind its snapshots come from but the optional ones (see
    /// `Controller::required_kinds`); a reconcile waits until all of their caches have synced.
    kinds: Vec<KindKey>,
}

impl std::fmt::Debug for Active {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Active").field("id", &self.id).finish()
    }
}

/// The live operator.
pub struct Operator {
    client: Client,
    cache: Arc<Cache>,
    controllers: RwLock<BTreeMap<Arc<str>, Arc<Active>>>,
    queue: Arc<Queue<PrimaryKey>>,
    backoff: Backoff<PrimaryKey>,
    reporter: Reporter,
    config: OperatorConfig,
    leader: Arc<AtomicBool>,
    lease_until: leader::LeaseDeadline,
    tasks: Mutex<Vec<tokio::task::AbortHandle>>,
    observer: Arc<Observer>,
    secrets: Arc<SecretReads>,
    /// Shadow candidates by plugin name (see [`crate::report::shadow`]).
    shadows: RwLock<BTreeMap<String, Arc<LoadedPlugin>>>,
    /// Shadow calls in flight (bounded by the worker count).
    shadow_inflight: Arc<std::sync::atomic::AtomicUsize>,
    /// Deletes each plugin executed in the last minute (its per-minute
    /// deletion budget).
    deletion_budgets: crate::execute::budget::DeletionBudgets,
    /// Primaries whose last reconcile judged an object absent without a
    /// read and then met a conflict: until one of their reconciles
    /// executes cleanly, they read every object the cache does not hold
    /// (see `truth`).
    read_before_create: Mutex<HashSet<PrimaryKey>>,
    /// The plans' writes whose watch events have not arrived (see
    /// [`echo`]).
    echoes: echo::Echoes,
    /// UIDs of objects recently collected because their owner was gone
    /// (see [`orphans`]).
    collected: Arc<orphans::Collected>,
    /// Routing and counts of the plugin rollouts (see [`crate::reconcile::rollout`]).
    rollouts: Arc<crate::reconcile::rollout::Rollouts>,
    /// This replica as a shard (`wasmop run --sharding`; see [`shard`]).
    sharding: std::sync::OnceLock<Arc<shard::Sharding>>,
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
        let op = Arc::new(Self {
            reporter: Reporter::new(client.clone(), &config.reporter),
            secrets: SecretReads::new(client.clone()),
            deletion_budgets: Default::default(),
            client,
            cache,
            controllers: RwLock::new(BTreeMap::new()),
            queue: Queue::with_metrics(|k: &PrimaryKey| k.controller.to_string()),
            backoff: Backoff::new(config.backoff_base, config.backoff_max),
            observer: Observer::new(config.observe.clone()),
            config,
            leader: Arc::new(AtomicBool::new(true)),
            lease_until: Arc::new(Mutex::new(None)),
            tasks: Mutex::new(Vec::new()),
            shadows: RwLock::new(BTreeMap::new()),
            shadow_inflight: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            read_before_create: Mutex::new(HashSet::new()),
            echoes: echo::Echoes::default(),
            collected: Arc::default(),
            rollouts: Arc::default(),
            sharding: std::sync::OnceLock::new(),
        });
        (op, changes)
    }

    /// Reconciles waiting or running (delayed re-queues not yet due
    /// excluded): zero when the operator has caught up with every change
    /// it has seen, the echoes of its own writes included.
    pub fn pending_reconciles(&self) -> usize {
        self.queue.pending()
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

    /// The local-clock end of this replica's write permission, kept by the
    /// leader election loop; checked before every write of a plan.
    pub fn lease_deadline(&self) -> leader::LeaseDeadline {
        self.lease_until.clone()
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
                    op.route(&change);
                }
            })
        };
        let secret_poller = {
            let op = self.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(op.config.secret_poll_interval);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    op.poll_secrets().await;
                }
            })
        };
        let sweeper = {
            let op = self.clone();
            tokio::spawn(async move {
                let Some(every) = op.config.orphan_sweep_interval else {
                    return;
                };
                let mut tick = tokio::time::interval(every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                // The first tick is at once: the first sweep waits a period.
                tick.tick().await;
                loop {
                    tick.tick().await;
                    op.sweep_orphans().await;
                }
            })
        };
        let rollouts = self
            .config
            .rollout_interval
            .map(|every| tokio::spawn(self.clone().run_rollouts(every)));
        let workers: Vec<_> = (0..self.config.workers.max(1))
            .map(|_| {
                let op = self.clone();
                tokio::spawn(async move {
                    while let Some(key) = op.queue.next().await {
                        // /healthz fails while one reconcile runs too long.
                        let busy = crate::report::health::global().busy(key.to_string());
                        let started = std::time::Instant::now();
                        op.reconcile(&key)
                            .instrument(crate::logging::reconcile_span(&key))
                            .await;
                        crate::metrics::global().observe(
                            "workqueue_work_duration_seconds",
                            &[("name", &key.controller)],
                            started.elapsed().as_secs_f64(),
                        );
                        drop(busy);
                        op.queue.done(&key);
                    }
                })
            })
            .collect();
        {
            let mut tasks = self.tasks.lock().expect("tasks lock");
            tasks.push(router.abort_handle());
            tasks.push(secret_poller.abort_handle());
            tasks.push(sweeper.abort_handle());
            tasks.extend(rollouts.iter().map(|r| r.abort_handle()));
            tasks.extend(workers.iter().map(|w| w.abort_handle()));
        }
        shutdown.await;
        self.queue.close();
        for w in workers {
            let _ = w.await;
        }
        router.abort();
        secret_poller.abort();
        sweeper.abort();
        if let Some(r) = rollouts {
            r.abort();
        }
    }

    /// `Ok` when the cache of every kind an active controller reads has
    /// synced; otherwise the kinds still listing (for `/readyz`).
    pub fn caches_synced(&self) -> Result<(), String> {
        let controllers = self.controllers.read().expect("controllers lock");
        let mut waiting: Vec<String> = controllers
            .values()
            .flat_map(|a| a.kinds.iter())
            .filter(|k| !self.cache.kind(k).is_some_and(|kc| kc.synced()))
            .map(|k| k.to_string())
            .collect();
        waiting.sort();
        waiting.dedup();
        if waiting.is_empty() {
            Ok(())
        } else {
            Err(format!("caches not synced: {}", waiting.join(", ")))
        }
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
    /// plugin is queued again in the queue's background
    /// ([`Queue::add_background`]): at most `workers` at once, like every
    /// reconcile, and behind every change that arrives meanwhile, so a swap
    /// neither floods the API server nor holds back other work.
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
        // Optional kinds (named only by optional reads or optional owned
        // kinds): watched, not waited for.
        let mut optional: Vec<Arc<KindCache>> = Vec::new();
        let mut actives = Vec::new();
        for c in &manifest.controllers {
            let id: Arc<str> = format!("{}/{}", plugin.name(), c.name).into();
            caches.push(self.cache.ensure(WatchSpec {
                resource: api_resource(&c.primary),
                namespaced: c.primary.namespaced,
                managed_only: false,
                selector: self.primary_selector(c, &manifest.controllers),
            }));
            let required = c.required_kinds();
            // Secrets named by a field are read by name, not watched.
            for r in c.reads.iter().filter(|r| !by_name::is_by_name(r)) {
                let cache = self.cache.ensure(WatchSpec {
                    resource: api_resource(&r.kind),
                    namespaced: r.kind.namespaced,
                    managed_only: false,
                    selector: None,
                });
                if required.iter().any(|k| k.same_type(&r.kind)) {
                    caches.push(cache);
                } else {
                    optional.push(cache);
                }
            }
            // Dependent kinds are judged by a read of the object when it
            // is deleted; nothing to watch for them.
            for o in c.owns.iter().filter(|o| !o.is_dependent()) {
                let read_elsewhere = self.kind_is_read(&kind_key(&o.kind), &manifest.controllers);
                let cache = self.cache.ensure(WatchSpec {
                    resource: api_resource(&o.kind),
                    namespaced: o.kind.namespaced,
                    managed_only: !read_elsewhere,
                    selector: self.owned_selector(c, !read_elsewhere),
                });
                if required.iter().any(|k| k.same_type(&o.kind)) {
                    caches.push(cache);
                } else {
                    optional.push(cache);
                }
            }
            actives.push(Arc::new(Active {
                id: id.clone(),
                spec: c.clone(),
                primary: kind_key(&c.primary),
                primary_resource: api_resource(&c.primary),
                writer: Writer::new(self.client.clone(), format!("wasmop-{}", plugin.name())),
                plugin: plugin.clone(),
                route: Route::new(id.clone(), c.clone()),
                kinds: watched_kinds(c)
                    .into_iter()
                    .filter(|k| required.iter().any(|r| kind_key(r) == *k))
                    .collect(),
            }));
        }
        for c in &caches {
            let synced = tokio::time::timeout(self.config.sync_timeout, async {
                tokio::select! {
                    () = c.wait_synced() => true,
                    () = c.wait_not_served() => false,
                }
            })
            .await;
            if synced == Ok(false) {
                self.drop_unused_caches();
                return Err(OperatorError::KindNotServed {
                    kind: c.key().to_string(),
                    crd: c.crd_name(),
                    hint: crate::watch::cache::install_hint(&c.spec().resource.group).to_owned(),
                    plugin: plugin.name().to_string(),
                });
            }
            if synced.is_err() {
                self.drop_unused_caches();
                return Err(OperatorError::NotSynced {
                    kind: c.key().to_string(),
                    plugin: plugin.name().to_string(),
                    waited: self.config.sync_timeout,
                });
            }
        }
        for c in optional.iter().filter(|c| !c.synced()) {
            tracing::info!(
                plugin = plugin.name(),
                kind = %c.key(),
                "optional kind not served yet (is its CRD installed?); \
                 snapshots name it absent until its watch lists it"
            );
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
                    let field_reads = a.route.has_field_reads();
                    for obj in kc.list(None) {
                        if field_reads {
                            a.route.index_refs(&obj.value());
                        }
                        if a.spec.scope == Scope::Object {
                            queued.push(cached_key_of(&a.id, &obj));
                        }
                    }
                }
                if a.spec.scope == Scope::Kind {
                    queued.push(whole_kind_key(&a.id));
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
        for key in queued {
            self.queue.add_background(key);
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

    /// Runs `plugin` as the shadow of the active plugin of the same name:
    /// called on every snapshot the active one decides, compared, never
    /// written (see [`crate::report::shadow`]). Replaces an earlier shadow.
    ///
    /// # Errors
    /// When no plugin of that name is active (a message naming it).
    pub fn set_shadow(&self, plugin: Arc<LoadedPlugin>) -> Result<(), String> {
        let name = plugin.name().to_owned();
        let active = self
            .controllers
            .read()
            .expect("controllers lock")
            .values()
            .any(|a| a.plugin.name() == name);
        if !active {
            return Err(format!(
                "no active plugin {name} to shadow (a shadow runs beside {name}.wasm)"
            ));
        }
        tracing::info!(plugin = %name, version = plugin.version(), digest = plugin.digest(),
            "shadow candidate running beside the active plugin; it writes nothing");
        self.shadows
            .write()
            .expect("shadows lock")
            .insert(name, plugin);
        Ok(())
    }

    /// Stops the shadow of plugin `name`; returns whether one ran.
    pub fn remove_shadow(&self, name: &str) -> bool {
        let removed = self
            .shadows
            .write()
            .expect("shadows lock")
            .remove(name)
            .is_some();
        if removed {
            tracing::info!(plugin = name, "shadow candidate stopped");
        }
        removed
    }

    /// The shadow of plugin `name`, if any.
    pub fn shadow(&self, name: &str) -> Option<Arc<LoadedPlugin>> {
        self.shadows
            .read()
            .expect("shadows lock")
            .get(name)
            .cloned()
    }

    /// The keys of the primaries of `a` the watch cache holds.
    fn cached_primary_keys(&self, a: &Active) -> Vec<PrimaryKey> {
        self.cache
            .kind(&a.primary)
            .map(|kc| kc.list(None))
            .unwrap_or_default()
            .iter()
            .map(|o| cached_key_of(&a.id, o))
            .collect()
    }

    /// Queues every primary of every running controller again, in the
    /// queue's background like a plugin start (e.g. after this replica
    /// became the leader and its earlier reconciles skipped their writes).
    pub fn requeue_all(&self) {
        let keys: Vec<PrimaryKey> = {
            let controllers = self.controllers.read().expect("controllers lock");
            controllers
                .values()
                .flat_map(|a| {
                    if a.spec.scope == Scope::Kind {
                        return vec![whole_kind_key(&a.id)];
                    }
                    self.cached_primary_keys(a)
                })
                .collect()
        };
        for key in keys {
            self.queue.add_background(key);
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

    /// Every running plugin, once each (admission asks per request).
    pub fn loaded_plugins(&self) -> Vec<Arc<LoadedPlugin>> {
        let mut out: Vec<Arc<LoadedPlugin>> = Vec::new();
        for a in self.controllers.read().expect("controllers lock").values() {
            if !out.iter().any(|p| Arc::ptr_eq(p, &a.plugin)) {
                out.push(a.plugin.clone());
            }
        }
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
                watched_kinds(c)
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
            kind_key(&c.primary) == *key
                || c.reads
                    .iter()
                    .any(|r| !by_name::is_by_name(r) && kind_key(&r.kind) == *key)
        };
        incoming.iter().any(reads)
            || self
                .controllers
                .read()
                .expect("controllers lock")
                .values()
                .any(|a| reads(&a.spec))
    }
}

/// The kinds a controller's snapshots come from through watches: its
/// primary, owned and read kinds, and its HTTP target kinds, except Secrets
/// that are only named by field references (read by name) and dependent
/// kinds nothing else reads.
fn watched_kinds(c: &Controller) -> Vec<KindKey> {
    let unwatched = |kind: &KindRef| {
        !kind.same_type(&c.primary)
            && !c
                .owns
                .iter()
                .any(|o| !o.is_dependent() && o.kind.same_type(kind))
            && !c.http_targets.iter().any(|t| t.kind.same_type(kind))
            && c.reads
                .iter()
                .filter(|r| r.kind.same_type(kind))
                .all(by_name::is_by_name)
    };
    c.kinds()
        .into_iter()
        .filter(|k| !unwatched(k))
        .map(kind_key)
        .collect()
}

/// The live caches as the snapshot builder's object source and routing's
/// primary lookup. With `secrets`, field references to Secrets are read
/// from the API server (blocking: only from a blocking task).
#[derive(Clone)]
pub(crate) struct CacheSource {
    pub(crate) cache: Arc<Cache>,
    pub(crate) secrets: Option<(Arc<SecretReads>, tokio::runtime::Handle)>,
}

impl ObjectSource for CacheSource {
    fn absent(&self, kind: &KindRef) -> bool {
        self.cache
            .kind(&kind_key(kind))
            .is_some_and(|kc| !kc.synced())
    }

    fn owned_by(&self, kind: &KindRef, owner_uid: &str) -> Vec<Arc<Value>> {
        self.cache
            .kind(&kind_key(kind))
            .map(|kc| parsed(kc.owned_by(owner_uid)))
            .unwrap_or_default()
    }

    fn get(&self, kind: &KindRef, namespace: Option<&str>, name: &str) -> Option<Arc<Value>> {
        self.cache
            .kind(&kind_key(kind))?
            .get(namespace.unwrap_or_default(), name)
            .map(|o| Arc::new(o.value()))
    }

    fn list(&self, kind: &KindRef, namespace: Option<&str>) -> Vec<Arc<Value>> {
        self.cache
            .kind(&kind_key(kind))
            .map(|kc| parsed(kc.list(namespace)))
            .unwrap_or_default()
    }

    fn list_matching(
        &self,
        kind: &KindRef,
        namespace: Option<&str>,
        selector: &LabelSelector,
    ) -> Vec<Arc<Value>> {
        self.cache
            .kind(&kind_key(kind))
            .map(|kc| {
                let mut objects = kc.list(namespace);
                objects.retain(|o| selector.matches(&o.labels()));
                parsed(objects)
            })
            .unwrap_or_default()
    }

    fn get_named(&self, kind: &KindRef, namespace: Option<&str>, name: &str) -> Option<Arc<Value>> {
        match (&self.secrets, namespace) {
            (Some((secrets, runtime)), Some(ns)) if by_name::is_secret(kind) => {
                secrets.get_blocking(runtime, ns, name)
            }
            _ => self.get(kind, namespace, name),
        }
    }
}

/// Cached objects parsed, for a snapshot.
fn parsed(objects: Vec<Arc<CachedObject>>) -> Vec<Arc<Value>> {
    objects.iter().map(|o| Arc::new(o.value())).collect()
}

impl PrimaryLookup for CacheSource {
    fn by_uid(&self, kind: &KindKey, uid: &str) -> Option<Arc<CachedObject>> {
        self.cache.kind(kind)?.get_by_uid(uid)
    }

    fn list(&self, kind: &KindKey, namespace: Option<&str>) -> Vec<Arc<CachedObject>> {
        self.cache
            .kind(kind)
            .map(|kc| kc.list(namespace))
            .unwrap_or_default()
    }

    fn by_name(&self, kind: &KindKey, namespace: &str, name: &str) -> Option<Arc<CachedObject>> {
        self.cache.kind(kind)?.get(namespace, name)
    }
}

impl Operator {
    /// Reads again the Secrets primaries name through field references and
    /// routes each change like a watch event.
    async fn poll_secrets(&self) {
        let secret = by_name::secret_key();
        let mut referenced: Vec<by_name::SecretId> = self
            .controllers
            .read()
            .expect("controllers lock")
            .values()
            .flat_map(|a| a.route.refs.lock().expect("refs lock").targets_of(&secret))
            .collect();
        referenced.sort();
        referenced.dedup();
        for change in self.secrets.poll(&referenced).await {
            self.route(&change);
        }
    }

    /// A kind was listed for the first time. Its objects, if any, came as
    /// changes of their own; but a controller for which the kind is
    /// optional decided its primaries while the kind was absent (its CRD
    /// not installed, the snapshot naming it absent), and nothing else
    /// would tell it the kind is served now when the list is empty. Every
    /// primary of such a controller is queued again, in the background
    /// like a swap's re-queues. Kinds a controller requires were synced
    /// before it started, so they re-queue nothing.
    fn kind_listed(&self, kind: &KindKey, actives: &[Arc<Active>]) {
        for a in actives {
            if a.primary == *kind
                || a.kinds.contains(kind)
                || !watched_kinds(&a.spec).contains(kind)
            {
                continue;
            }
            tracing::info!(controller = %a.id, kind = %kind,
                "optional kind served now; reconciling the controller's primaries again");
            if a.spec.scope == Scope::Kind {
                self.queue.add_after(whole_kind_key(&a.id), KIND_DEBOUNCE);
                continue;
            }
            if let Some(kc) = self.cache.kind(&a.primary) {
                for obj in kc.list(None) {
                    self.queue.add_background(cached_key_of(&a.id, &obj));
                }
            }
        }
    }

    /// Every running controller, as of now.
    fn actives(&self) -> Vec<Arc<Active>> {
        self.controllers
            .read()
            .expect("controllers lock")
            .values()
            .cloned()
            .collect()
    }

    /// Routes a cache change to the primaries it concerns.
    fn route(&self, change: &Change) {
        let actives = self.actives();
        if change.is_listed() {
            self.kind_listed(&change.kind, &actives);
            return;
        }
        let routes: Vec<&Route> = actives.iter().map(|a| &a.route).collect();
        let source = CacheSource {
            cache: Arc::clone(&self.cache),
            secrets: None,
        };
        let routed = route::route(&routes, change, &source);
        let kind_scoped = |key: &PrimaryKey| {
            actives
                .iter()
                .any(|a| a.id == key.controller && a.spec.scope == Scope::Kind)
        };
        let seen = self.echoes.take(change, |writer| {
            !kind_scoped(writer) && routed.keys.contains(writer)
        });
        for (key, uid) in routed.gone {
            if let Some(s) = self.sharding.get() {
                s.forget_claim(&uid);
            }
            self.observer.forget(&uid);
            self.queue.forget(&key);
            self.backoff.reset(&key);
            self.read_before_create
                .lock()
                .expect("read-before-create lock")
                .remove(&key);
            if kind_scoped(&key) {
                // The others may move up (e.g. a queue): one more call.
                metrics::global().set_primary_gauges(
                    &key.controller,
                    &key.namespace,
                    &key.name,
                    &[],
                );
                self.queue
                    .add_after(whole_kind_key(&key.controller), KIND_DEBOUNCE);
            }
        }
        for key in routed.keys {
            if kind_scoped(&key) {
                self.queue
                    .add_after(whole_kind_key(&key.controller), KIND_DEBOUNCE);
            } else {
                match &seen {
                    echo::Seen::Echo(writer) if *writer == key => {
                        echo::settle(
                            &self.queue,
                            echo::Settled {
                                primary: key,
                                echo: true,
                            },
                        );
                    }
                    // Settled when the write's answer comes.
                    echo::Seen::Held(writer) if *writer == key => {
                        metrics::global().inc(
                            "wasmop_echoes_held_total",
                            &[("controller", &key.controller)],
                        );
                    }
                    _ => self.queue.add(key),
                }
            }
        }
    }
}
