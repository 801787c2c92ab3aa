//! The live operator: routes cache changes to the primaries they concern,
//! runs reconciles from the work queue, and turns each plugin answer into
//! validated writes.
//!
//! ```text
//! cache change ──route──▶ queue ──worker──▶ snapshot ▶ plugin ▶ validate ▶ execute
//! ```
//!
//! The operator's registry of running plugins is `registry`, the caches
//! as an object source `source`, what a cache change becomes `changes`.
//! The Leases its writes check are the `lease` layer below, re-exported
//! here as [`leader`] and [`shard`].
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

mod changes;
mod echo;
pub mod orphans;
pub mod queue;
mod registry;
pub mod rollout;
pub(crate) mod route;
mod sharder;
mod source;
mod truth;
mod worker;

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use kube::Client;
use kube::api::ApiResource;
use tokio::sync::mpsc;
use tracing::Instrument;

use crate::contract::manifest::Controller;
use crate::controller::queue::{Backoff, Queue};
use crate::execute::Reporter;
use crate::execute::writer::Writer;
use crate::observe::{ObserveConfig, Observer};
use crate::plugin::LoadedPlugin;
use crate::watch::by_name::SecretReads;
use crate::watch::cache::{Cache, Change, KindKey};
use route::Route;

pub use crate::execute::{
    RECONCILED_BY_ANNOTATION, RECONCILED_CONDITION, api_resource, reconciled_by,
};
pub use crate::lease::{leader, shard};
use registry::watched_kinds;
pub use route::kind_key;
pub(crate) use source::CacheSource;

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
}
