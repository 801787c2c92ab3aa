//! The leader driving one rollout through its steps: analyse the open
//! step, wait for the candidate, move on, promote, or roll back, and write
//! the status.
//!
//! # Guarantees
//! - Only the leader drives; every status write is fenced by the
//!   rollout's UID, so a rollout deleted and made again under its name is
//!   never written with the old one's status.
//! - A breach rolls back at once: the rollback is held before anything
//!   else, so no later tick routes to the candidate, then the status (kept
//!   being written until it lands) and a Warning Event name the metric,
//!   its value and the threshold.

use serde_json::{Value, json};

use crate::controller::Operator;
use crate::object;
use crate::reconcile::rollout::{
    self, RolloutSpec, RolloutStatus, ShardCounts, analyze, phase, shard_counts, step_done,
};

/// The `Healthy` condition.
pub(super) fn healthy(ok: bool, reason: &str, message: &str, now: &str) -> Value {
    json!({
        "type": "Healthy",
        "status": if ok { "True" } else { "False" },
        "reason": reason,
        "message": message,
        "lastTransitionTime": now,
    })
}

impl Operator {
    /// One step of the leader's work on one rollout; returns the status as
    /// written.
    pub(super) async fn drive(
        &self,
        obj: &Value,
        spec: &RolloutSpec,
        old: RolloutStatus,
    ) -> RolloutStatus {
        let name = object::name(obj);
        if let Some(held) = self.rollouts.held_rollback(object::uid(obj)) {
            if old.phase == phase::ROLLED_BACK {
                self.rollouts.rollback_recorded(object::uid(obj));
            } else {
                // Decided, not yet recorded: still routed to nobody, and
                // written again.
                self.apply_routing(&spec.plugin, None);
                self.rollouts.close_window(&spec.plugin);
                if self.write_status(obj, &old, &held).await {
                    self.rollouts.rollback_recorded(object::uid(obj));
                }
                return held;
            }
        }
        let mut st = old.clone();
        let now = jiff::Timestamp::now().to_string();
        let problems = spec.problems();
        if !problems.is_empty() {
            st.phase = phase::INVALID.into();
            st.message = problems.join("; ");
            self.write_status(obj, &old, &st).await;
            return st;
        }
        if st.phase == phase::ROLLED_BACK {
            self.rollouts.close_window(&spec.plugin);
            return st;
        }
        if st.phase == phase::INVALID {
            // Followable now (its spec was fixed, or the rollout it
            // collided with is gone): it starts from the beginning.
            st.phase.clear();
            st.candidate_digest.clear();
        }
        let Some((_, current_version, _)) = self
            .plugins()
            .into_iter()
            .find(|(n, _, _)| *n == spec.plugin)
        else {
            if st.phase.is_empty() {
                st.phase = phase::WAITING.into();
            }
            st.message = format!("plugin {} is not running", spec.plugin);
            self.write_status(obj, &old, &st).await;
            return st;
        };
        st.current_version = current_version;
        if spec.rollback {
            let message = "rolled back on request (spec.rollback)".to_owned();
            return self
                .roll_back(obj, spec, &old, st, "RollbackRequested", message)
                .await;
        }
        let candidate = self.shadow(&spec.plugin).filter(|c| {
            spec.candidate
                .version
                .as_deref()
                .is_none_or(|v| v == c.version())
                && spec
                    .candidate
                    .digest
                    .as_deref()
                    .is_none_or(|d| d == c.digest())
        });
        match candidate {
            None => {
                if st.phase.is_empty() || st.phase == phase::WAITING {
                    st.phase = phase::WAITING.into();
                }
                st.message = format!(
                    "candidate not loaded: put it beside the plugin as {}{}.wasm \
                     (every primary stays on the current version meanwhile)",
                    spec.plugin,
                    crate::report::shadow::SUFFIX
                );
                self.rollouts.close_window(&spec.plugin);
                self.write_status(obj, &old, &st).await;
                return st;
            }
            Some(c) if st.candidate_digest != c.digest() || st.phase == phase::WAITING => {
                if !st.candidate_digest.is_empty() && st.candidate_digest != c.digest() {
                    tracing::info!(
                        rollout = name,
                        "candidate changed; the rollout starts again"
                    );
                }
                st.candidate_digest = c.digest().to_owned();
                st.candidate_version = c.version().to_owned();
                st.step = spec.first_step();
                st.phase = if st.step == 0 {
                    phase::SHADOW
                } else {
                    phase::CANARY
                }
                .into();
                st.step_started_at = now.clone();
                st.conditions = vec![healthy(
                    true,
                    "AnalysisPassing",
                    "no threshold crossed",
                    &now,
                )];
            }
            Some(_) => {}
        }
        if st.phase == phase::PROMOTED {
            self.rollouts.close_window(&spec.plugin);
            st.share_percent = 100.0;
            self.write_status(obj, &old, &st).await;
            return st;
        }
        st.share_percent = spec
            .routing(st.step)
            .map_or(0.0, |(bp, _)| f64::from(bp) / 100.0);
        let w = self.rollouts.window(
            &spec.plugin,
            st.step,
            &st.candidate_digest,
            spec,
            self.budgets(&spec.plugin),
        );
        if w.opened {
            // A window opened by a new leader, or the shadow step's first:
            // every primary is reconciled (and compared) once in it, not
            // only those that happen to change.
            self.requeue_plugin(&spec.plugin, "rollout analysis window opened");
        }
        // With --sharding, what the other shards counted of this step.
        let published = shard_counts(obj.get("status"));
        let others: Vec<&ShardCounts> = match self.sharding.get() {
            Some(s) => published
                .iter()
                .filter(|(id, c)| **id != s.identity && c.counts_step_of(&st))
                .map(|(_, c)| c)
                .collect(),
            None => Vec::new(),
        };
        st.current = rollout::combine(&w.current, others.iter().map(|c| &c.current));
        st.candidate = rollout::combine(&w.candidate, others.iter().map(|c| &c.candidate));
        let minutes = w.elapsed.as_secs_f64() / 60.0;
        if let Some(breach) = analyze(
            &spec.analysis,
            spec.shadow_analysis(),
            &st.current,
            &st.candidate,
            minutes,
        ) {
            let message = format!(
                "rolled back at step {} ({}): {breach}",
                st.step,
                if st.step == 0 {
                    "shadow".to_owned()
                } else {
                    format!("{}%", st.share_percent)
                }
            );
            return self
                .roll_back(obj, spec, &old, st, "ThresholdCrossed", message)
                .await;
        }
        match step_done(spec, st.step, &st.candidate, w.elapsed) {
            Some(waits) => st.message = waits,
            None if spec.paused => {
                st.message = format!(
                    "paused (spec.paused): step {} holds; its analysis goes on",
                    st.step
                );
            }
            None => {
                let done = st.step;
                st.step += 1;
                st.step_started_at = now.clone();
                // The next step's window opens now, before its routing
                // re-queues the primaries: their reconciles count in it.
                self.rollouts.window(
                    &spec.plugin,
                    st.step,
                    &st.candidate_digest,
                    spec,
                    self.budgets(&spec.plugin),
                );
                st.current = rollout::Counts::default();
                st.candidate = rollout::Counts::default();
                if st.step as usize > spec.steps.len() {
                    // Promoted: the status keeps naming the last step.
                    st.step = done;
                    self.rollouts.close_window(&spec.plugin);
                    st.phase = phase::PROMOTED.into();
                    st.share_percent = 100.0;
                    st.message = format!(
                        "candidate {} reconciles every primary; undo: set spec.rollback",
                        st.candidate_version
                    );
                    self.rollout_event(obj, false, "RolloutPromoted", &st.message)
                        .await;
                } else {
                    st.phase = phase::CANARY.into();
                    st.share_percent = spec
                        .routing(st.step)
                        .map_or(0.0, |(bp, _)| f64::from(bp) / 100.0);
                    st.message = format!("step {done} passed; step {} begins", st.step);
                    self.rollout_event(
                        obj,
                        false,
                        "RolloutStepPassed",
                        &format!(
                            "step {done} passed its analysis; {}% of the primaries go to {}",
                            st.share_percent, st.candidate_version
                        ),
                    )
                    .await;
                }
            }
        }
        self.write_status(obj, &old, &st).await;
        st
    }

    /// Rolls back at once: the rollback held first (so no later tick routes
    /// to the candidate before it is recorded), this replica's routing,
    /// then the status (phase, condition naming the metric, value and
    /// threshold; written again each tick until it lands) and a Warning
    /// Event. The candidate keeps running as a shadow.
    pub(super) async fn roll_back(
        &self,
        obj: &Value,
        spec: &RolloutSpec,
        old: &RolloutStatus,
        mut st: RolloutStatus,
        reason: &str,
        message: String,
    ) -> RolloutStatus {
        let name = object::name(obj);
        let now = jiff::Timestamp::now().to_string();
        st.phase = phase::ROLLED_BACK.into();
        st.share_percent = 0.0;
        st.message = message.clone();
        st.conditions = vec![healthy(false, reason, &message, &now)];
        self.rollouts.hold_rollback(object::uid(obj), &st);
        self.apply_routing(&spec.plugin, None);
        self.rollouts.close_window(&spec.plugin);
        tracing::warn!(rollout = name, plugin = %spec.plugin, reason, %message, "rollout rolled back");
        if self.write_status(obj, old, &st).await {
            self.rollouts.rollback_recorded(object::uid(obj));
        }
        self.rollout_event(obj, true, reason, &message).await;
        st
    }
}
