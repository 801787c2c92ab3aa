//! One call of a kind-scoped controller: every primary of its kind in one
//! snapshot, the answer split into object plans, each judged and executed
//! against its own primary.
//!
//! # Guarantees
//! - Every guarantee of a per-object reconcile holds per primary: an
//!   object plan is counted, validated and executed against its own
//!   primary, and a refused one stops none of the others.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::Value;

use crate::controller::{Active, Operator, whole_kind_key};
use crate::metrics;
use crate::reconcile::decide::{DecideInput, format_now};
use crate::reconcile::kind::{KindOutcome, decide_kind};

impl Operator {
    /// One call of a kind-scoped controller over every primary of its
    /// kind, then each primary's decision carried out by [`Self::act`]
    /// (at most `workers` primaries at once).
    pub(super) async fn reconcile_kind(&self, a: &Arc<Active>) {
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
        // As for one primary (`worker.rs`): a primary the cache shows from
        // before our last status write to it would be planned from the
        // status that write replaced. The call waits for the watch.
        if all.iter().any(|p| {
            crate::execute::economy::behind_own_status(
                crate::object::uid(p),
                crate::object::resource_version(p),
            )
        }) {
            tracing::debug!(controller = %a.id, "the cache has not seen our last status write to a primary; kind reconcile waits");
            self.queue.add_after(key, super::OWN_STATUS_WAIT);
            return;
        }
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
        let key_of_primary = |p: &Value| crate::controller::route::key_of(&a.id, p);
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
                            self.act(
                                a,
                                &k,
                                p,
                                decision,
                                None,
                                Default::default(),
                                now_text,
                                elapsed,
                            )
                            .await;
                        }
                    })
                    .await;
            }
        }
    }
}
