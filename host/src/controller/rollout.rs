//! The live side of [`crate::reconcile::rollout`]: which version reconciles a
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
//! - Every status write is fenced by the rollout's identity: a JSON patch
//!   whose first operation tests `/metadata/uid`, so a rollout deleted and
//!   re-created under its name while a tick ran never inherits what was
//!   decided for its predecessor (a `Promoted` above all). The leader
//!   writes its fields one by one and never `status.shards`.
//! - With `--sharding`, every shard counts the step the status names and
//!   publishes its counts as `status.shards.<shard>` (its own entry, by the
//!   same fenced patch, when they changed); the leader analyses its own
//!   counts plus the other shards' entries of the same step (see
//!   [`crate::reconcile::rollout::combine`]).
//! - A rollback (automatic or asked) is held until its status is written:
//!   the routing goes back to the current version first, and a failed
//!   status write is tried again each tick, the candidate routed nothing
//!   meanwhile. Every replica routes nothing to the candidate once
//!   `spec.rollback` is set.
//! - A list of the rollouts that fails does not keep the routing it last
//!   read: at once when the resource is gone (404: the CRD deleted), and
//!   after [`LIST_FAILURE_GRACE`] of failing lists otherwise, every plugin
//!   is routed back to its current version, until a list succeeds again.

mod drive;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Api, Resource};
use serde_json::{Value, json};

use crate::controller::route::Route;
use crate::controller::{Active, Operator, watched_kinds};
use crate::object;
use crate::reconcile::rollout::{
    self, RolloutSpec, RolloutStatus, ShardCounts, phase, shard_counts,
};
use wasmop_contract::Scope;

/// How long listing the rollouts may fail (other than with a 404) before
/// every plugin is routed back to its current version.
pub const LIST_FAILURE_GRACE: Duration = Duration::from_secs(10);

/// The JSON patch of a rollout's status fenced by its identity: a test of
/// `/metadata/uid` first, then `ops`.
pub fn fenced_status_patch(uid: &str, ops: impl IntoIterator<Item = Value>) -> Vec<Value> {
    let mut out = vec![json!({"op": "test", "path": "/metadata/uid", "value": uid})];
    out.extend(ops);
    out
}

/// The operations that write `new` as the leader's part of a status:
/// field by field when the status exists (`listed` is the status as
/// listed), so the shards' `status.shards` is kept; whole otherwise.
pub fn leader_status_ops(listed: Option<&Value>, new: &RolloutStatus) -> Vec<Value> {
    let value = serde_json::to_value(new).unwrap_or_default();
    match (listed.filter(|s| s.is_object()), value) {
        (Some(_), Value::Object(fields)) => fields
            .into_iter()
            .map(|(k, v)| json!({"op": "add", "path": format!("/status/{}", pointer_token(&k)), "value": v}))
            .collect(),
        (_, v) => vec![json!({"op": "add", "path": "/status", "value": v})],
    }
}

/// The operation that writes shard `identity`'s counts into a status
/// (`listed` is the status as listed).
pub fn shard_counts_op(listed: Option<&Value>, identity: &str, counts: &ShardCounts) -> Value {
    let value = serde_json::to_value(counts).unwrap_or_default();
    match listed.filter(|s| s.is_object()) {
        Some(st) if st.get("shards").is_some_and(Value::is_object) => json!({"op": "add",
            "path": format!("/status/shards/{}", pointer_token(identity)), "value": value}),
        Some(_) => json!({"op": "add", "path": "/status/shards", "value": {identity: value}}),
        None => json!({"op": "add", "path": "/status", "value": {"shards": {identity: value}}}),
    }
}

/// `key` as one JSON pointer token (RFC 6901).
fn pointer_token(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

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
        let mut failing_since: Option<Instant> = None;
        // With --sharding: the step start each plugin's window counts.
        let mut counting: HashMap<String, String> = HashMap::new();
        loop {
            tick.tick().await;
            let leads = self.leads();
            let sharding = self.sharding.get().cloned();
            if !leads && sharding.is_none() {
                self.rollouts.close_all();
            }
            let mut items = match api.list(&params).await {
                Ok(list) => {
                    failing_since = None;
                    list.items
                }
                Err(e) => {
                    let gone = matches!(&e, kube::Error::Api(s) if s.code == 404);
                    let since = *failing_since.get_or_insert_with(Instant::now);
                    if gone || since.elapsed() >= LIST_FAILURE_GRACE {
                        let routed = self.rollouts.routed_plugins();
                        if !routed.is_empty() {
                            tracing::warn!(error = %e, plugins = ?routed,
                                "cannot list PluginRollouts; every plugin goes back to its current version");
                        }
                        for plugin in routed {
                            self.rollouts.close_window(&plugin);
                            self.apply_routing(&plugin, None);
                        }
                    } else {
                        tracing::debug!(error = %e, "cannot list PluginRollouts (is its CRD installed?)");
                    }
                    continue;
                }
            };
            items.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
            let mut driven: HashSet<String> = HashSet::new();
            let mut uids: HashSet<String> = HashSet::new();
            for obj in items {
                let name = obj.metadata.name.clone().unwrap_or_default();
                let value = serde_json::to_value(&obj).unwrap_or_default();
                uids.insert(object::uid(&value).to_owned());
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
                            self.write_status(&value, &status, &st).await;
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
                        self.write_status(&value, &status, &st).await;
                    }
                    continue;
                }
                if leads {
                    status = self.drive(&value, &spec, status).await;
                } else if sharding.is_some() && claims {
                    self.count_step(&spec, &value, &status, &mut counting);
                }
                if let Some(s) = &sharding
                    && claims
                {
                    self.publish_counts(&value, s, &spec, &status).await;
                }
                if claims {
                    let routing = if self.rollouts.held_rollback(object::uid(&value)).is_some() {
                        None
                    } else {
                        status.routing(&name, &spec)
                    };
                    self.apply_routing(&spec.plugin, routing);
                }
            }
            self.rollouts.forget_held_except(&uids);
            counting.retain(|plugin, _| driven.contains(plugin));
            for plugin in self.rollouts.routed_plugins() {
                if !driven.contains(&plugin) {
                    self.rollouts.close_window(&plugin);
                    self.apply_routing(&plugin, None);
                }
            }
            self.rollouts.close_windows_except(&driven);
        }
    }

    /// On a shard that does not lead (`--sharding`): counts the step
    /// `status` names in a window of its own (opened afresh for a new step,
    /// candidate or step start; closed when nothing is analysed), so it
    /// can publish its counts ([`Self::publish_counts`]).
    fn count_step(
        &self,
        spec: &RolloutSpec,
        obj: &Value,
        status: &RolloutStatus,
        counting: &mut HashMap<String, String>,
    ) {
        let analysed = matches!(status.phase.as_str(), phase::SHADOW | phase::CANARY)
            && !status.candidate_digest.is_empty()
            && !spec.rollback
            && self.rollouts.held_rollback(object::uid(obj)).is_none();
        if !analysed {
            self.rollouts.close_window(&spec.plugin);
            counting.remove(&spec.plugin);
            return;
        }
        if counting.get(&spec.plugin) != Some(&status.step_started_at) {
            self.rollouts.close_window(&spec.plugin);
            counting.insert(spec.plugin.clone(), status.step_started_at.clone());
        }
        let w = self.rollouts.window(
            &spec.plugin,
            status.step,
            &status.candidate_digest,
            spec,
            self.budgets(&spec.plugin),
        );
        if w.opened {
            self.requeue_plugin(&spec.plugin, "rollout analysis window opened on this shard");
        }
    }

    /// Publishes this shard's counts of the step `status` names as
    /// `status.shards.<shard>`, when they changed since the list.
    async fn publish_counts(
        &self,
        obj: &Value,
        s: &crate::lease::shard::Sharding,
        spec: &RolloutSpec,
        status: &RolloutStatus,
    ) {
        if !matches!(status.phase.as_str(), phase::SHADOW | phase::CANARY) || !s.in_term() {
            return;
        }
        let Some(w) = self.rollouts.window_counts(&spec.plugin) else {
            return;
        };
        if w.step != status.step || w.candidate_digest != status.candidate_digest {
            return;
        }
        let mine = ShardCounts {
            step: w.step,
            candidate_digest: w.candidate_digest,
            step_started_at: status.step_started_at.clone(),
            current: w.current,
            candidate: w.candidate,
        };
        let listed = obj.get("status");
        if shard_counts(listed).get(&s.identity) == Some(&mine) {
            return;
        }
        let ops = fenced_status_patch(
            object::uid(obj),
            [shard_counts_op(listed, &s.identity, &mine)],
        );
        if let Err(e) = self.patch_status(object::name(obj), &ops).await {
            tracing::debug!(rollout = object::name(obj), error = %e,
                "cannot publish this shard's rollout counts; trying again");
        }
    }

    /// Sends the JSON patch `ops` to the status of rollout `name`.
    async fn patch_status(&self, name: &str, ops: &[Value]) -> Result<(), kube::Error> {
        let request = kube::core::Request::new(DynamicObject::url_path(&rollout_resource(), None));
        let mut http = request
            .patch_subresource(
                "status",
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({})),
            )
            .map_err(kube::Error::BuildRequest)?;
        http.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json-patch+json"),
        );
        *http.body_mut() = serde_json::to_vec(ops).map_err(kube::Error::SerdeError)?;
        self.client.request_text(http).await.map(|_| ())
    }

    /// Whether this replica may write now (it leads, its lease is valid).
    fn leads(&self) -> bool {
        crate::lease::leader::may_write(&self.leader, &self.lease_until)
    }

    /// Records an Event on a rollout, while this replica leads.
    async fn rollout_event(&self, obj: &Value, warning: bool, reason: &str, message: &str) {
        if self.leads() {
            self.reporter.event(obj, warning, reason, message).await;
        }
    }

    /// Writes `new` as the status of rollout `obj` (as listed) when it
    /// differs from `old` and this replica still leads, fenced by the
    /// rollout's UID (a rollout re-created under its name meanwhile is not
    /// written). True when the status holds `new` (written, or nothing to
    /// write); a failure is logged (the next tick tries again).
    async fn write_status(&self, obj: &Value, old: &RolloutStatus, new: &RolloutStatus) -> bool {
        if old == new {
            return true;
        }
        if !self.leads() {
            return false;
        }
        let name = object::name(obj);
        let ops = fenced_status_patch(object::uid(obj), leader_status_ops(obj.get("status"), new));
        match self.patch_status(name, &ops).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(rollout = name, error = %e, "cannot write the PluginRollout status");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_write_tests_the_uid_first_and_the_leader_keeps_the_shards() {
        let new = RolloutStatus {
            phase: phase::CANARY.into(),
            step: 2,
            ..RolloutStatus::default()
        };
        let whole = fenced_status_patch("u-1", leader_status_ops(None, &new));
        assert_eq!(
            whole[0],
            json!({"op": "test", "path": "/metadata/uid", "value": "u-1"})
        );
        assert_eq!(whole.len(), 2);
        assert_eq!(whole[1]["path"], "/status");
        assert_eq!(whole[1]["value"]["step"], 2);
        let listed = json!({"phase": "Shadow", "shards": {"b": {}}});
        let fields = leader_status_ops(Some(&listed), &new);
        assert!(
            fields.iter().all(|op| op["op"] == "add"
                && op["path"]
                    .as_str()
                    .is_some_and(|p| p.starts_with("/status/"))
                && op["path"] != "/status/shards"),
            "{fields:?}"
        );
        assert!(
            fields
                .iter()
                .any(|op| op["path"] == "/status/phase" && op["value"] == "Canary")
        );
        let counts = ShardCounts::default();
        assert_eq!(
            shard_counts_op(Some(&listed), "b", &counts)["path"],
            "/status/shards/b"
        );
        assert_eq!(
            shard_counts_op(Some(&json!({"phase": "Canary"})), "b", &counts)["path"],
            "/status/shards"
        );
        let none = shard_counts_op(None, "a/b~c", &counts);
        assert_eq!(none["path"], "/status");
        assert!(none["value"]["shards"]["a/b~c"].is_object());
        assert_eq!(pointer_token("a/b~c"), "a~1b~0c");
    }
}
