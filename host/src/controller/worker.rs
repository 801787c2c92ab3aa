//! The worker: one reconcile of one primary, as one `match` on the
//! [`Decision`] (controller-runtime's `reconcileHandler`): skipped → done;
//! failed or rejected → report and back off; planned → (leader?) execute,
//! requeue, observe.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::contract::manifest::KindRef;
use crate::controller::truth::TruthLookup;
use crate::controller::{Active, CacheSource, Operator, PrimaryKey, whole_kind_key};
use crate::execute::{self, Target, report};
use crate::judge::validate::Plan;
use crate::metrics;
use crate::object;
use crate::observe::PrimaryInfo;
use crate::reconcile::decide::{DecideInput, Decision, decide, format_now};
use crate::reconcile::kind::{KindOutcome, decide_kind};
use futures::StreamExt;
use wasmop_contract::Scope;

/// An object of a primary's snapshot, with the kind of the read that
/// selected it (`None` for owned objects).
type Seen = (Option<KindRef>, Arc<Value>);

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

    /// A place for one more shadow call in flight (at most as many as
    /// workers), given back when dropped; `None` when there is none,
    /// counted as skipped once for each of the call's `primaries`.
    fn shadow_slot(&self, a: &Active, primaries: usize) -> Option<ShadowSlot> {
        use std::sync::atomic::Ordering;
        let inflight = Arc::clone(&self.shadow_inflight);
        if inflight.fetch_add(1, Ordering::SeqCst) >= self.config.workers.max(1) {
            inflight.fetch_sub(1, Ordering::SeqCst);
            crate::report::shadow::skipped(&a.id, primaries);
            return None;
        }
        Some(ShadowSlot(inflight))
    }

    /// Calls the shadow candidate on the snapshot the active plugin just
    /// decided, in the background (bounded by the worker count), and
    /// compares the plans. Nothing of the shadow's plan is written.
    fn run_shadow(
        &self,
        a: &Active,
        key: &PrimaryKey,
        shadow: Arc<crate::plugin::LoadedPlugin>,
        snapshot: &crate::judge::snapshot::Snapshot,
        decision: &Decision,
    ) {
        let Some(slot) = self.shadow_slot(a, 1) else {
            return;
        };
        let active = crate::reconcile::diff::outcome_of(decision);
        let snapshot = snapshot.clone();
        let controller = a.id.to_string();
        let primary = crate::report::shadow::primary_key(&key.namespace, &key.name);
        let active_version = a.plugin.version().to_owned();
        let rollouts = Arc::clone(&self.rollouts);
        tokio::task::spawn_blocking(move || {
            let _slot = slot;
            let outcome = match shadow.reconcile(&snapshot) {
                Ok(plan) => serde_json::to_value(&plan).unwrap_or_default(),
                Err(e) => crate::report::shadow::failed(&e),
            };
            let differences = crate::report::shadow::account(
                &controller,
                &primary,
                (&active_version, shadow.version()),
                &active,
                &outcome,
            );
            rollouts.record_shadow(
                shadow.name(),
                shadow.digest(),
                &differences,
                outcome.pointer("/failed/reason").and_then(Value::as_str),
            );
            if !differences.is_empty() {
                tracing::info!(controller = %controller, primary = %primary, shadow_version = shadow.version(),
                    differences = differences.len(), "shadow plan differs from the active one");
            }
        });
    }

    /// Calls the shadow candidate on the snapshot of a kind call the active
    /// plugin just made, in the background (bounded like [`Self::run_shadow`]),
    /// and compares the two calls primary by primary. Nothing of the
    /// shadow's plan is written.
    fn run_shadow_kind(
        &self,
        a: &Active,
        shadow: Arc<crate::plugin::LoadedPlugin>,
        decided: &crate::reconcile::kind::KindDecided,
    ) {
        let Some(snapshot) = &decided.snapshot else {
            return;
        };
        let Some(slot) = self.shadow_slot(a, decided.primaries.len()) else {
            return;
        };
        let active = crate::report::shadow::active_kind_outcomes(decided);
        let snapshot = snapshot.clone();
        let controller = a.id.to_string();
        let active_version = a.plugin.version().to_owned();
        let rollouts = Arc::clone(&self.rollouts);
        tokio::task::spawn_blocking(move || {
            let _slot = slot;
            let pairs = crate::report::shadow::kind_pairs(active, shadow.reconcile(&snapshot));
            let mut differing = 0usize;
            for (primary, active, outcome) in &pairs {
                let differences = crate::report::shadow::account(
                    &controller,
                    primary,
                    (&active_version, shadow.version()),
                    active,
                    outcome,
                );
                rollouts.record_shadow(
                    shadow.name(),
                    shadow.digest(),
                    &differences,
                    outcome.pointer("/failed/reason").and_then(Value::as_str),
                );
                differing += usize::from(!differences.is_empty());
            }
            if differing > 0 {
                tracing::info!(controller = %controller, shadow_version = shadow.version(),
                    primaries = pairs.len(), differing, "shadow kind plan differs from the active one");
            }
        });
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
        // A rollout may route this primary to the candidate (see
        // `rollout.rs`): chosen once, for the whole reconcile.
        let a = self.routed(&a, &primary);
        let now = jiff::Timestamp::now();
        let now_text = format_now(now);
        let observations = self.observer.results(object::uid(&primary), now);
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
            &now_text,
            elapsed,
        )
        .await;
    }

    /// Carries out one primary's [`Decision`]: reports a failure or a
    /// rejection on the primary, or executes the plan, then requeues and
    /// starts its HTTP requests. The one place a decision turns into
    /// writes, for per-object and kind-scoped controllers alike.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn act(
        &self,
        a: &Active,
        key: &PrimaryKey,
        primary: Arc<Value>,
        decision: Decision,
        snapshot: Option<&crate::judge::snapshot::Snapshot>,
        now_text: &str,
        elapsed: Duration,
    ) {
        let now_text = now_text.to_owned();
        match decision {
            Decision::Skipped(_) => {}
            Decision::Failed(e) => {
                self.fail(a, key, &primary, e.reason(), &e.to_string(), &now_text)
                    .await;
            }
            Decision::Rejected { plan, violations } => {
                // Refused only for objects whose owner is gone (the
                // garbage collector missed them): collected, and the
                // reconcile goes on at once.
                if self.collect_refused(a, &primary, &plan, &violations).await {
                    self.requeue(a, key, Duration::ZERO);
                    return;
                }
                // Each violation names its rule, so a person (and a test)
                // can tell which guarantee the plan broke.
                let message = violations
                    .iter()
                    .map(|v| format!("{} ({})", v, v.rule.as_str()))
                    .collect::<Vec<_>>()
                    .join("; ");
                let message = format!("plan rejected, nothing written: {message}");
                self.fail(a, key, &primary, "PlanRejected", &message, &now_text)
                    .await;
            }
            Decision::Planned { plan, judgement } => {
                tracing::debug!(primary = %key, plugin_version = %a.plugin.version(), ?elapsed,
                    applied = plan.apply.len(), deleted = plan.delete.len(), "plan");
                let uid = object::uid(&primary);
                if !self.may_write_for(a, key, uid) {
                    return;
                }
                let shard = self.shard_for(a);
                let owns = || self.may_write_for(a, key, uid);
                let (leader, lease_until) = match shard {
                    Some(s) => (&*s.flag, &*s.until),
                    None => (&*self.leader, &*self.lease_until),
                };
                // The objects as cached, to skip applies that change nothing.
                let current = CacheSource {
                    cache: Arc::clone(&self.cache),
                    secrets: None,
                };
                let target = Target {
                    spec: &a.spec,
                    plugin: &a.plugin,
                    writer: &a.writer,
                    primary_resource: &a.primary_resource,
                    leader,
                    lease_until,
                    shard: shard.map(|sharding| execute::ShardFence {
                        sharding,
                        owns: &owns,
                    }),
                    budgets: &self.deletion_budgets,
                    current: Some(&current),
                    written: Some(&super::echo::EchoLog {
                        echoes: &self.echoes,
                        primary: key,
                        queue: Some(&self.queue),
                    }),
                };
                match execute::execute(
                    target,
                    &primary,
                    &plan,
                    &judgement,
                    &now_text,
                    &self.reporter,
                )
                .await
                {
                    Ok(_) => {
                        metrics::global().set_primary_gauges(
                            &key.controller,
                            &key.namespace,
                            &key.name,
                            &plan.gauges,
                        );
                        metrics::global().inc(
                            "wasmop_reconcile_total",
                            &[("controller", &a.id), ("result", "Reconciled")],
                        );
                        self.backoff.reset(key);
                        self.read_before_create
                            .lock()
                            .expect("read-before-create lock")
                            .remove(key);
                        tracing::info!(primary = %key, plugin_version = %a.plugin.version(),
                            applied = plan.apply.len(), deleted = plan.delete.len(), "reconciled");
                        // Never sooner than the plugin's floor: a
                        // `requeueAfterMs: 0` is no tight loop.
                        if let Some(delay) = a.plugin.limits().plan.requeue_after(&plan) {
                            self.requeue(a, key, delay);
                        }
                        // HTTP calls are writes to the outside world: only
                        // while this replica still leads.
                        if !plan.http_requests.is_empty()
                            && self.may_write_for(a, key, uid)
                            && let Some(snapshot) = snapshot
                        {
                            // Each object with the kind of the read that
                            // selected it: an object from a watch's
                            // initial list may carry no apiVersion/kind.
                            let read_kind = |read: &str| {
                                a.spec
                                    .reads
                                    .iter()
                                    .find(|r| r.id == read)
                                    .map(|r| r.kind.clone())
                            };
                            let seen: Vec<Seen> = snapshot
                                .owned
                                .iter()
                                .map(|o| (None, o.clone()))
                                .chain(
                                    snapshot
                                        .related
                                        .iter()
                                        .map(|r| (read_kind(&r.read), r.object.clone())),
                                )
                                .collect();
                            self.observe(a, key, &primary, &plan, &seen);
                        }
                    }
                    Err(e) if e.is_conflict() && judgement.applies.iter().any(|j| j.unasked) => {
                        // An object judged absent without a read was
                        // there after all (someone else's: the cache would
                        // hold ours), or the world moved. The retry, at
                        // once, reads every object the cache does not hold
                        // and judges it before writing anything.
                        metrics::global().inc(
                            "wasmop_reconcile_total",
                            &[("controller", &a.id), ("result", e.reason())],
                        );
                        metrics::global().inc("workqueue_retries_total", &[("name", &a.id)]);
                        self.read_before_create
                            .lock()
                            .expect("read-before-create lock")
                            .insert(key.clone());
                        tracing::info!(primary = %key, reason = e.reason(), error = %e,
                            "reconcile deferred; the retry reads what the cache does not hold");
                        self.requeue(a, key, Duration::ZERO);
                    }
                    Err(e)
                        if e.is_conflict()
                            && self.shard_for(a).is_some()
                            && crate::lease::shard::forged_label_conflict(&e.to_string()) =>
                    {
                        // Someone else wrote the shard label of an owned
                        // object: every apply of it conflicts until that
                        // label goes. Said on the primary, not retried in
                        // silence (see `shard::forged_label_conflict`).
                        let message = crate::lease::shard::forged_label_message(&e);
                        self.fail(a, key, &primary, "ShardLabelForged", &message, &now_text)
                            .await;
                    }
                    Err(e)
                        if e.is_conflict()
                            || matches!(e, execute::ExecuteError::LostLeadership) =>
                    {
                        // The world moved since the snapshot (or another
                        // replica leads now): a fresh snapshot is the fix,
                        // not a failure to report.
                        metrics::global().inc(
                            "wasmop_reconcile_total",
                            &[("controller", &a.id), ("result", e.reason())],
                        );
                        metrics::global().inc("workqueue_retries_total", &[("name", &a.id)]);
                        let delay = self.backoff.fail(key);
                        tracing::info!(primary = %key, reason = e.reason(), error = %e,
                            retry_in = ?delay, "reconcile deferred");
                        self.requeue(a, key, delay);
                    }
                    Err(e) => {
                        // Re-read: the failed write may have been preceded
                        // by others. Only the same primary: a successor
                        // made under its name is not the one that failed.
                        let current = self
                            .cache
                            .kind(&a.primary)
                            .and_then(|kc| kc.get(&key.namespace, &key.name))
                            .filter(|o| o.uid() == object::uid(&primary))
                            .map(|o| Arc::new(o.value()));
                        let primary = current.unwrap_or(primary);
                        self.fail(a, key, &primary, e.reason(), &e.to_string(), &now_text)
                            .await;
                    }
                }
            }
        }
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

    /// One call of a kind-scoped controller over every primary of its
    /// kind, then each primary's decision carried out by [`Self::act`]
    /// (at most `workers` primaries at once).
    async fn reconcile_kind(&self, a: &Arc<Active>) {
        let key = whole_kind_key(&a.id);
        if let Some(kind) = a
            .kinds
            .iter()
            .find(|k| !self.cache.kind(k).is_some_and(|kc| kc.synced()))
        {
            tracing::debug!(controller = %a.id, kind = %kind, "cache not synced; kind reconcile waits");
            self.queue.add_after(key, Duration::from_millis(200));
            return;
        }
        // Parsed from the cached text: the kind call reads every primary.
        let all: Vec<Arc<Value>> = self
            .cache
            .kind(&a.primary)
            .map(|kc| kc.list(None).iter().map(|o| Arc::new(o.value())).collect())
            .unwrap_or_default();
        let now = jiff::Timestamp::now();
        let now_text = format_now(now);
        // One call judges many primaries: every object the cache does not
        // hold is read, as before.
        let (source, truth) = self.sources(false);
        let started = std::time::Instant::now();
        let decided = {
            let a = Arc::clone(a);
            tokio::task::spawn_blocking(move || {
                decide_kind(
                    DecideInput {
                        plugin: &a.plugin,
                        controller: &a.spec,
                        source: &source,
                        existing: &truth,
                        now,
                    },
                    all,
                )
            })
            .await
        };
        let elapsed = started.elapsed();
        let m = metrics::global();
        m.add(
            "wasmop_reconcile_seconds_total",
            &[("controller", &a.id)],
            elapsed.as_secs_f64(),
        );
        let decided = match decided {
            Ok(decided) => decided,
            Err(join) => {
                let e = format!("kind reconcile task failed: {join}");
                tracing::warn!(controller = %a.id, error = %e, "kind reconcile failed");
                self.queue
                    .add_after(key, self.config.backoff_max.min(Duration::from_secs(5)));
                return;
            }
        };
        if let Some(recorder) = &self.config.recorder
            && let Some(rendered) = recorder.render_kind(&a.plugin, &decided)
        {
            let recorder = Arc::clone(recorder);
            tokio::task::spawn_blocking(move || recorder.write(rendered));
        }
        if let Some(shadow) = self.shadow(a.plugin.name()) {
            self.run_shadow_kind(a, shadow, &decided);
        }
        if decided.snapshot.is_some() {
            m.inc("wasmop_kind_calls_total", &[("controller", &a.id)]);
            m.add(
                "wasmop_kind_call_primaries_total",
                &[("controller", &a.id)],
                decided.primaries.len() as f64,
            );
            m.observe(
                "wasmop_plugin_call_duration_seconds",
                &[("plugin", a.plugin.name()), ("controller", &a.id)],
                elapsed.as_secs_f64(),
            );
        }
        let workers = self.config.workers.max(1);
        let key_of_primary = |p: &Value| super::route::key_of(&a.id, p);
        match decided.outcome {
            KindOutcome::Empty => {}
            KindOutcome::Failed(e) => {
                // The one call failed: every primary it covered says so.
                let (reason, message) = (e.reason(), e.to_string());
                futures::stream::iter(decided.primaries)
                    .for_each_concurrent(workers, |p| {
                        let (reason, message, now_text) = (reason, &message, &now_text);
                        async move {
                            self.fail(a, &key_of_primary(&p), &p, reason, message, now_text)
                                .await;
                        }
                    })
                    .await;
            }
            KindOutcome::Split { decisions, refused } => {
                for r in &refused {
                    m.inc("wasmop_kind_plans_refused_total", &[("controller", &a.id)]);
                    tracing::warn!(controller = %a.id, plugin_version = %a.plugin.version(),
                        refusal = %r, "object plan of a kind plan refused, nothing of it written");
                }
                tracing::debug!(controller = %a.id, primaries = decided.primaries.len(),
                    planned = decisions.len(), refused = refused.len(), ?elapsed, "kind plan");
                futures::stream::iter(decisions)
                    .for_each_concurrent(workers, |(p, decision)| {
                        let now_text = &now_text;
                        async move {
                            let k = key_of_primary(&p);
                            self.act(a, &k, p, decision, None, now_text, elapsed).await;
                        }
                    })
                    .await;
            }
        }
    }

    /// Performs the plan's HTTP requests after its writes; their results
    /// reach the primary's next snapshot, which is queued when they are in.
    fn observe(&self, a: &Active, key: &PrimaryKey, primary: &Value, plan: &Plan, seen: &[Seen]) {
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

/// One shadow call in flight (see `Operator::shadow_slot`).
struct ShadowSlot(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for ShadowSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}
