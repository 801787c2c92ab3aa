//! The worker: one reconcile of one primary, as one `match` on the
//! [`Decision`] (controller-runtime's `reconcileHandler`): skipped → done;
//! failed or rejected → report and back off; planned → (leader?) execute,
//! requeue, observe.
//!
//! Its cuts: acting on a planned decision (`act`), the one call of a
//! kind-scoped controller (`kind`) and the shadow calls (`shadow`).
//!
//! # Guarantees
//! - A reconcile reads only from caches that have synced, decides through
//!   the one path used offline too, and writes only on the leader (and,
//!   with sharding, the primary's shard).
//! - A failure is reported on the primary and retried with backoff; it
//!   never deletes anything.
//! - A primary is never planned from a cached version older than this
//!   replica's own last status write to it: the plan would start from the
//!   status that write replaced, and its status write would put the older
//!   state back. The reconcile waits ([`OWN_STATUS_WAIT`]) for the watch.

mod act;
mod kind;
mod shadow;

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::contract::manifest::KindRef;
use crate::controller::truth::TruthLookup;
use crate::controller::{Active, CacheSource, Operator, PrimaryKey, whole_kind_key};
use crate::execute::report;
use crate::judge::validate::Plan;
use crate::metrics;
use crate::object;
use crate::observe::PrimaryInfo;
use crate::reconcile::decide::{DecideInput, Decision, decide, format_now};
use wasmop_contract::Scope;

/// An object of a primary's snapshot, with the kind of the read that
/// selected it (`None` for owned objects).
type Seen = (Option<KindRef>, Arc<Value>);

/// How long a reconcile waits before looking again when the cache has not
/// yet seen this replica's last status write to the primary.
pub(super) const OWN_STATUS_WAIT: Duration = Duration::from_millis(50);

impl Operator {
    /// What a decision reads: the cache (Secrets read live), and the
    /// cache-then-API-server lookup that judges the plan's writes
    /// (judging objects to create absent without a read when
    /// `presume_absent`, see [`TruthLookup`]).
    fn sources(&self, presume_absent: bool) -> (CacheSource, TruthLookup) {
        let source = CacheSource {
            cache: Arc::clone(&self.cache),
            secrets: Some((Arc::clone(&self.secrets), tokio::runtime::Handle::current())),
        };
        let truth = TruthLookup {
            cache: source.clone(),
            client: self.client.clone(),
            runtime: tokio::runtime::Handle::current(),
            presume_absent,
            collected: Arc::clone(&self.collected),
        };
        (source, truth)
    }

    /// One reconcile of one primary, start to end. Never panics on bad
    /// input; every failure ends up on the primary's conditions and Events.
    pub(super) async fn reconcile(&self, key: &PrimaryKey) {
        let active = self
            .controllers
            .read()
            .expect("controllers lock")
            .get(&key.controller)
            .cloned();
        let Some(a) = active else { return };
        if a.spec.scope == Scope::Kind {
            if key.name == super::WHOLE_KIND_NAME && key.namespace.is_empty() {
                self.reconcile_kind(&a).await;
            } else {
                // A primary's own key queued before a hot swap made the
                // controller kind-scoped: it joins the next kind call.
                self.queue
                    .add_after(whole_kind_key(&a.id), super::KIND_DEBOUNCE);
            }
            return;
        }
        let Some(primary) = self
            .cache
            .kind(&a.primary)
            .and_then(|kc| kc.get(&key.namespace, &key.name))
            .map(|o| Arc::new(o.value()))
        else {
            // Gone: so are the gauges its plans set.
            metrics::global().set_primary_gauges(&key.controller, &key.namespace, &key.name, &[]);
            self.read_before_create
                .lock()
                .expect("read-before-create lock")
                .remove(key);
            return;
        };
        if let Some(s) = self.shard_for(&a) {
            match s.standing(&crate::lease::shard::labels_of(&primary)) {
                crate::lease::shard::Standing::Mine => {}
                crate::lease::shard::Standing::Draining => {
                    self.acknowledge_drain(&a, key, &primary).await;
                    return;
                }
                // Another shard's (the cache is not filtered, or the
                // label changed): nothing to do here.
                crate::lease::shard::Standing::NotMine => {
                    s.forget_claim(object::uid(&primary));
                    return;
                }
            }
        }
        // The cache still shows the primary as it was before this
        // replica's last status write to it: a plan made from it would
        // start from the status that write replaced (a plugin's own
        // records, like a key ring), and writing its status would put that
        // older state back. Wait for the watch to deliver the write.
        if crate::execute::economy::behind_own_status(
            object::uid(&primary),
            object::resource_version(&primary),
        ) {
            tracing::debug!(primary = %key, "the cache has not seen our last status write; reconcile waits");
            self.queue.add_after(key.clone(), OWN_STATUS_WAIT);
            return;
        }
        // A rollout may route this primary to the candidate (see
        // `controller/rollout.rs`): chosen once, for the whole reconcile.
        let a = self.routed(&a, &primary);
        let now = jiff::Timestamp::now();
        let now_text = format_now(now);
        let (observations, seen_results) = self.observer.snapshot(object::uid(&primary), now);
        if let Some(kind) = a
            .kinds
            .iter()
            .find(|k| !self.cache.kind(k).is_some_and(|kc| kc.synced()))
        {
            // A snapshot from a cache that has not listed everything yet
            // would look like missing objects: wait for it.
            tracing::debug!(primary = %key, kind = %kind, "cache not synced; reconcile waits");
            self.queue
                .add_after(key.clone(), Duration::from_millis(200));
            return;
        }
        // Arrived at this shard: its owned objects first carry this
        // shard's label and are in the caches (see `sharder.rs`).
        if let Some(s) = self.shard_for(&a)
            && !self.claimed(s, key, &primary)
        {
            return;
        }
        let read_first = self
            .read_before_create
            .lock()
            .expect("read-before-create lock")
            .contains(key);
        let (source, truth) = self.sources(!read_first);
        let started = std::time::Instant::now();
        let decided = {
            let a = Arc::clone(&a);
            let primary = Arc::clone(&primary);
            tokio::task::spawn_blocking(move || {
                decide(
                    DecideInput {
                        plugin: &a.plugin,
                        controller: &a.spec,
                        source: &source,
                        existing: &truth,
                        now,
                    },
                    primary,
                    observations,
                )
            })
            .await
        };
        let elapsed = started.elapsed();
        metrics::global().add(
            "wasmop_reconcile_seconds_total",
            &[("controller", &a.id)],
            elapsed.as_secs_f64(),
        );
        // Snapshot, plugin call and plan validation, per plugin.
        metrics::global().observe(
            "wasmop_plugin_call_duration_seconds",
            &[("plugin", a.plugin.name()), ("controller", &a.id)],
            elapsed.as_secs_f64(),
        );
        if let Ok(d) = &decided
            && !matches!(d.decision, Decision::Skipped(_))
        {
            let deletes = match &d.decision {
                Decision::Planned { plan, .. } => plan.delete.len(),
                _ => 0,
            };
            self.rollouts.record(
                a.plugin.name(),
                a.plugin.digest(),
                &crate::report::shadow::primary_key(&key.namespace, &key.name),
                crate::reconcile::rollout::Outcome::Decided { deletes },
                elapsed,
            );
        }
        let decided = match decided {
            Ok(decided) => decided,
            Err(join) => {
                let message = format!("reconcile task failed: {join}");
                self.fail(&a, key, &primary, "PluginTrapped", &message, &now_text)
                    .await;
                return;
            }
        };
        if let (Some(recorder), Some(snapshot)) = (&self.config.recorder, &decided.snapshot)
            && let Some(rendered) = recorder.render(&a.plugin, snapshot, &decided.decision)
        {
            let recorder = Arc::clone(recorder);
            tokio::task::spawn_blocking(move || recorder.write(rendered));
        }
        if let (Some(shadow), Some(snapshot)) = (self.shadow(a.plugin.name()), &decided.snapshot)
            && shadow.digest() != a.plugin.digest()
        {
            self.run_shadow(&a, key, shadow, snapshot, &decided.decision);
        }
        self.act(
            &a,
            key,
            primary,
            decided.decision,
            decided.snapshot.as_ref(),
            seen_results,
            &now_text,
            elapsed,
        )
        .await;
    }

    /// Queues `key` again after `delay`: the primary itself, or, for a
    /// kind-scoped controller, its one whole-kind key.
    pub(super) fn requeue(&self, a: &Active, key: &PrimaryKey, delay: Duration) {
        if a.spec.scope == Scope::Kind {
            self.queue.add_after(whole_kind_key(&a.id), delay);
        } else {
            self.queue.add_after(key.clone(), delay);
        }
    }

    /// Performs the plan's HTTP requests after its writes; their results
    /// reach the primary's next snapshot, which is queued when they are in.
    ///
    /// `seen_results` says which stored results the plan's snapshot
    /// carried: a mutating call whose answer arrived after it is not sent
    /// again ([`crate::observe::Observer::run_planned`]).
    fn observe(
        &self,
        a: &Active,
        key: &PrimaryKey,
        primary: &Value,
        plan: &Plan,
        seen: &[Seen],
        seen_results: crate::observe::SeenResults,
    ) {
        // Targets and Secrets are looked up by name in the primary's
        // namespace, among the objects of its snapshot only: what the
        // primary owns or its controller reads.
        let namespace = object::namespace(primary);
        let find = |kind: &KindRef, name: &str| -> Option<Value> {
            seen.iter()
                .find(|(read_kind, o)| {
                    let typed = kind.matches(object::api_version(o), object::kind(o));
                    let untyped_from_read = object::kind(o).is_empty()
                        && read_kind.as_ref().is_some_and(|k| k.same_type(kind));
                    (typed || untyped_from_read)
                        && object::name(o) == name
                        && object::namespace(o) == namespace
                })
                .map(|(_, o)| o.as_ref().clone())
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
            seen_results,
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
                m.add(
                    "wasmop_http_requests_total",
                    &[("controller", c), ("outcome", "superseded")],
                    outcome.superseded as f64,
                );
                if outcome.changed > 0 || outcome.superseded > 0 {
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
        metrics::reconcile_error(&a.id, reason);
        self.rollouts
            .record_failure(a.plugin.name(), a.plugin.digest(), reason);
        let delay = self.backoff.fail(key);
        tracing::warn!(primary = %key, plugin_version = %a.plugin.version(), reason,
            message = %report::cap(message, report::MAX_CONDITION_MESSAGE), retry_in = ?delay,
            "reconcile failed");
        if self.may_write_for(a, key, object::uid(primary)) {
            report::failure(
                &a.writer,
                &a.primary_resource,
                &self.reporter,
                primary,
                reason,
                message,
                now,
            )
            .await;
        }
        self.requeue(a, key, delay);
    }
}
