//! Acting on a planned decision: execute the judged plan (only on the
//! leader and, with sharding, the primary's shard), report it on the
//! primary, requeue and observe.
//!
//! # Guarantees
//! - Nothing is written unless this replica holds the fences every write
//!   checks; a plan refused for orphans only collects them and reconciles
//!   again at once.
//! - A failed execution is reported on the primary and retried with
//!   backoff; what was written before the failure stays fenced.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::Seen;
use crate::controller::{Active, CacheSource, Operator, PrimaryKey};
use crate::execute::{self, Target};
use crate::metrics;
use crate::object;
use crate::reconcile::decide::Decision;

impl Operator {
    /// Carries out one primary's [`Decision`]: reports a failure or a
    /// rejection on the primary, or executes the plan, then requeues and
    /// starts its HTTP requests. The one place a decision turns into
    /// writes, for per-object and kind-scoped controllers alike.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::controller) async fn act(
        &self,
        a: &Active,
        key: &PrimaryKey,
        primary: Arc<Value>,
        decision: Decision,
        snapshot: Option<&crate::judge::snapshot::Snapshot>,
        seen_results: crate::observe::SeenResults,
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
                    written: Some(&crate::controller::echo::EchoLog {
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
                            self.observe(a, key, &primary, &plan, &seen, seen_results);
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
}
