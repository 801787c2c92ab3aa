//! The live side of [`crate::rollout`]: which version reconciles a
//! primary, and the loop that reads the `PluginRollout` objects and, on
//! the leader, drives them.
//!
//! # Guarantees
//! - A primary is reconciled by exactly one version at a time: the version
//!   is chosen when its reconcile starts, and the work queue never runs two
//!   reconciles of one primary at once. A primary that changes version is
//!   fenced like a hot swap: the reconcile in flight finishes on the
//!   version it started with, every later one runs the other.
//! - Only object-scoped controllers are split; a kind-scoped controller's
//!   one call stays on the current version (its candidate runs as a
//!   shadow only).
//! - A candidate whose controller does not reconcile the same primary kind,
//!   or needs a kind whose watch has not synced, is not routed to.
//! - When the routing of a plugin changes (a step, a rollback, a deleted
//!   rollout), every primary of the plugin is queued again in the
//!   background, as after a hot swap; a rollback sets this replica's
//!   routing back before its status is written.
//! - Only the leader writes a rollout's status and Events. A new leader
//!   continues from the status (phase, step, candidate digest) and opens a
//!   fresh analysis window for the step it finds.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use kube::Api;
use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::{Value, json};

use crate::controller::route::Route;
use crate::controller::{Active, Operator, watched_kinds};
use crate::object;
use crate::rollout::{self, RolloutSpec, RolloutStatus, analyze, phase, step_done};
use wasmop_contract::Scope;

/// The `PluginRollout` resource.
pub fn rollout_resource() -> ApiResource {
    ApiResource {
        group: rollout::GROUP.into(),
        version: rollout::VERSION.into(),
        api_version: format!("{}/{}", rollout::GROUP, rollout::VERSION),
        kind: rollout::KIND.into(),
        plural: rollout::PLURAL.into(),
    }
}

impl Operator {
    /// The routing and counts of this replica's rollouts.
    pub fn rollouts(&self) -> &Arc<rollout::Rollouts> {
        &self.rollouts
    }

    /// The controller that reconciles `primary` this time: the candidate's
    /// when a rollout routes the primary to it, else `a` itself.
    pub(super) fn routed(&self, a: &Arc<Active>, primary: &Value) -> Arc<Active> {
        if a.spec.scope == Scope::Kind {
            return Arc::clone(a);
        }
        let Some(routing) = self.rollouts.routing(a.plugin.name()) else {
            return Arc::clone(a);
        };
        let Some(candidate) = self.shadow(a.plugin.name()) else {
            return Arc::clone(a);
        };
        if candidate.digest() != routing.candidate_digest
            || !routing.to_candidate(object::uid(primary), &object::labels(primary))
        {
            tracing::debug!(
                uid = object::uid(primary),
                bucket = rollout::bucket(object::uid(primary)),
                share_bp = routing.share_bp,
                digest_matches = candidate.digest() == routing.candidate_digest,
                "primary stays on the current version"
            );
            return Arc::clone(a);
        }
        let Some(spec) = candidate
            .effective_manifest()
            .controllers
            .iter()
            .find(|c| c.name == a.spec.name && c.primary.same_type(&a.spec.primary))
            .cloned()
        else {
            return Arc::clone(a);
        };
        let unsynced = watched_kinds(&spec)
            .iter()
            .any(|k| !self.cache.kind(k).is_some_and(|kc| kc.synced()));
        if unsynced || spec.scope != Scope::Object {
            tracing::debug!(unsynced, "candidate cannot reconcile the primary");
            return Arc::clone(a);
        }
        Arc::new(Active {
            id: a.id.clone(),
            plugin: candidate,
            route: Route::new(a.id.clone(), spec.clone()),
            spec,
            primary: a.primary.clone(),
            primary_resource: a.primary_resource.clone(),
            writer: a.writer.clone(),
            kinds: a.kinds.clone(),
        })
    }

    /// The budgets of `plugin`'s current version and its shadow.
    fn budgets(&self, plugin: &str) -> rollout::Budgets {
        let current = self
            .loaded_plugins()
            .into_iter()
            .find(|p| p.name() == plugin)
            .and_then(|p| p.budget().cloned());
        let candidate = self.shadow(plugin).and_then(|p| p.budget().cloned());
        rollout::Budgets { current, candidate }
    }

    /// Sets the routing of `plugin`; when it changed, queues every primary
    /// of the plugin again (in the background, like a hot swap).
    fn apply_routing(&self, plugin: &str, routing: Option<rollout::Routing>) {
        if self.rollouts.set_routing(plugin, routing) {
            self.requeue_plugin(plugin, "rollout routing changed");
        }
    }

    /// Queues every primary of `plugin`'s object-scoped controllers again,
    /// in the background.
    fn requeue_plugin(&self, plugin: &str, why: &str) {
        let keys: Vec<_> = self
            .actives()
            .iter()
            .filter(|a| a.plugin.name() == plugin && a.spec.scope == Scope::Object)
            .flat_map(|a| self.cached_primary_keys(a))
            .collect();
        tracing::info!(
            plugin,
            primaries = keys.len(),
            "{why}; primaries queued again"
        );
        for k in keys {
            self.queue.add_background(k);
        }
    }

    /// Reads the rollouts every `every`, routes by their status, and, while
    /// this replica leads, drives them. Runs until aborted.
    pub(super) async fn run_rollouts(self: Arc<Self>, every: Duration) {
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &rollout_resource());
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut params = ListParams::default();
        if let Some(selector) = &self.config.rollout_selector {
            params = params.labels(selector);
        }
        loop {
            tick.tick().await;
            let leads = self.leads();
            if !leads {
                self.rollouts.close_all();
            }
            let mut items = match api.list(&params).await {
                Ok(list) => list.items,
                Err(e) => {
                    tracing::debug!(error = %e, "cannot list PluginRollouts (is its CRD installed?)");
                    continue;
                }
            };
            items.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
            let mut driven: HashSet<String> = HashSet::new();
            for obj in items {
                let name = obj.metadata.name.clone().unwrap_or_default();
                let value = serde_json::to_value(&obj).unwrap_or_default();
                let spec: Result<RolloutSpec, _> =
                    serde_json::from_value(value.get("spec").cloned().unwrap_or(Value::Null));
                let mut status: RolloutStatus = value
                    .get("status")
                    .cloned()
                    .and_then(|s| serde_json::from_value(s).ok())
                    .unwrap_or_default();
                let spec = match spec {
                    Ok(spec) => spec,
                    Err(e) => {
                        if leads {
                            let mut st = status.clone();
                            st.phase = phase::INVALID.into();
                            st.message = format!("spec does not parse: {e}");
                            self.write_status(&api, &name, &status, &st).await;
                        }
                        continue;
                    }
                };
                // A rollout that can be followed and has not rolled back
                // claims its plugin; the first by name wins.
                let claims = spec.problems().is_empty() && status.phase != phase::ROLLED_BACK;
                if claims && !driven.insert(spec.plugin.clone()) {
                    if leads {
                        let mut st = status.clone();
                        st.phase = phase::INVALID.into();
                        st.message = format!(
                            "another PluginRollout (first by name) rolls out plugin {}",
                            spec.plugin
                        );
                        self.write_status(&api, &name, &status, &st).await;
                    }
                    continue;
                }
                if leads {
                    status = self.drive(&api, &name, &value, &spec, status).await;
                }
                if claims {
                    self.apply_routing(&spec.plugin, status.routing(&name, &spec));
                }
            }
            for plugin in self.rollouts.routed_plugins() {
                if !driven.contains(&plugin) {
                    self.rollouts.close_window(&plugin);
                    self.apply_routing(&plugin, None);
                }
            }
        }
    }

    /// Whether this replica may write now (it leads, its lease is valid).
    fn leads(&self) -> bool {
        crate::controller::leader::may_write(&self.leader, &self.lease_until)
    }

    /// Records an Event on a rollout, while this replica leads.
    async fn rollout_event(&self, obj: &Value, warning: bool, reason: &str, message: &str) {
        if self.leads() {
            self.reporter.event(obj, warning, reason, message).await;
        }
    }

    /// Writes `new` as the status of rollout `name` when it differs from
    /// `old` and this replica still leads; a failure is logged (the next
    /// tick tries again).
    async fn write_status(
        &self,
        api: &Api<DynamicObject>,
        name: &str,
        old: &RolloutStatus,
        new: &RolloutStatus,
    ) {
        if old == new || !self.leads() {
            return;
        }
        let patch = json!({"status": new});
        if let Err(e) = api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            tracing::warn!(rollout = name, error = %e, "cannot write the PluginRollout status");
        }
    }

    /// One step of the leader's work on one rollout; returns the status as
    /// written.
    async fn drive(
        &self,
        api: &Api<DynamicObject>,
        name: &str,
        obj: &Value,
        spec: &RolloutSpec,
        old: RolloutStatus,
    ) -> RolloutStatus {
        let mut st = old.clone();
        let now = jiff::Timestamp::now().to_string();
        let problems = spec.problems();
        if !problems.is_empty() {
            st.phase = phase::INVALID.into();
            st.message = problems.join("; ");
            self.write_status(api, name, &old, &st).await;
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
            self.write_status(api, name, &old, &st).await;
            return st;
        };
        st.current_version = current_version;
        if spec.rollback {
            let message = "rolled back on request (spec.rollback)".to_owned();
            return self
                .roll_back(api, name, obj, spec, &old, st, "RollbackRequested", message)
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
                    crate::shadow::SUFFIX
                );
                self.rollouts.close_window(&spec.plugin);
                self.write_status(api, name, &old, &st).await;
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
            self.write_status(api, name, &old, &st).await;
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
        st.current = w.current.clone();
        st.candidate = w.candidate.clone();
        let minutes = w.elapsed.as_secs_f64() / 60.0;
        if let Some(breach) = analyze(
            &spec.analysis,
            spec.shadow_analysis(),
            &w.current,
            &w.candidate,
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
                .roll_back(api, name, obj, spec, &old, st, "ThresholdCrossed", message)
                .await;
        }
        match step_done(spec, st.step, &w.candidate, w.elapsed) {
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
        self.write_status(api, name, &old, &st).await;
        st
    }

    /// Rolls back at once: this replica's routing first, then the status
    /// (phase, condition naming the metric, value and threshold) and a
    /// Warning Event. The candidate keeps running as a shadow.
    #[allow(clippy::too_many_arguments)]
    async fn roll_back(
        &self,
        api: &Api<DynamicObject>,
        name: &str,
        obj: &Value,
        spec: &RolloutSpec,
        old: &RolloutStatus,
        mut st: RolloutStatus,
        reason: &str,
        message: String,
    ) -> RolloutStatus {
        self.apply_routing(&spec.plugin, None);
        self.rollouts.close_window(&spec.plugin);
        let now = jiff::Timestamp::now().to_string();
        st.phase = phase::ROLLED_BACK.into();
        st.share_percent = 0.0;
        st.message = message.clone();
        st.conditions = vec![healthy(false, reason, &message, &now)];
        tracing::warn!(rollout = name, plugin = %spec.plugin, reason, %message, "rollout rolled back");
        self.write_status(api, name, old, &st).await;
        self.rollout_event(obj, true, reason, &message).await;
        st
    }
}

/// The `Healthy` condition.
fn healthy(ok: bool, reason: &str, message: &str, now: &str) -> Value {
    json!({
        "type": "Healthy",
        "status": if ok { "True" } else { "False" },
        "reason": reason,
        "message": message,
        "lastTransitionTime": now,
    })
}
