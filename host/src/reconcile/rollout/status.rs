//! A rollout's status as the host reads and writes it: the step, phase
//! and candidate it is at ([`RolloutStatus`]), and, with `--sharding`, the
//! counts each shard publishes ([`ShardCounts`]) and their sum
//! ([`combine`]).
//!
//! # Guarantees
//! - Only counts of the same step, candidate digest and step start are
//!   added up, so a shard's stale counts never judge a later step.
//! - The status routes primaries only in the canary and promoted phases.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{BUCKETS, Counts, RolloutSpec, Routing, phase};

/// What one shard counted in a step's window, as it publishes it under
/// `status.shards.<shard>` of the rollout (`--sharding`). The leader adds
/// the entries of the other shards that count the step it analyses (same
/// step, candidate digest and step start) to its own ([`combine`]).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct ShardCounts {
    /// The step counted.
    pub step: u32,
    /// The candidate counted.
    pub candidate_digest: String,
    /// The step's `stepStartedAt`, as the status named it.
    pub step_started_at: String,
    /// The current version's counts on this shard.
    pub current: Counts,
    /// The candidate's counts on this shard.
    pub candidate: Counts,
}

impl ShardCounts {
    /// Whether these counts are of the step `status` is at.
    pub fn counts_step_of(&self, status: &RolloutStatus) -> bool {
        self.step == status.step
            && self.candidate_digest == status.candidate_digest
            && self.step_started_at == status.step_started_at
    }
}

/// The counts of one version over shards: `local` (this replica's) plus
/// `others`. Counters add up (each shard reconciles its own primaries, so
/// distinct primaries add up too); the p99s and the CPU per call are the
/// highest of any shard (a bound on the whole: no shard's calls are
/// averaged away).
pub fn combine<'a>(local: &Counts, others: impl IntoIterator<Item = &'a Counts>) -> Counts {
    let mut out = local.clone();
    for c in others {
        out.reconciles += c.reconciles;
        out.primaries += c.primaries;
        out.errors += c.errors;
        out.timeouts += c.timeouts;
        out.plan_rejected += c.plan_rejected;
        out.dry_run_refused += c.dry_run_refused;
        out.deletes += c.deletes;
        out.shadow_compared += c.shadow_compared;
        out.shadow_differences += c.shadow_differences;
        out.p99_call_seconds = out.p99_call_seconds.max(c.p99_call_seconds);
        out.p99_memory_bytes = out.p99_memory_bytes.max(c.p99_memory_bytes);
        out.cpu_seconds_per_call = out.cpu_seconds_per_call.max(c.cpu_seconds_per_call);
    }
    out
}

/// The published [`ShardCounts`] of a rollout's status (`status.shards`),
/// by shard; entries that do not parse are left out.
pub fn shard_counts(status: Option<&serde_json::Value>) -> BTreeMap<String, ShardCounts> {
    status
        .and_then(|s| s.get("shards"))
        .and_then(serde_json::Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), serde_json::from_value(v.clone()).ok()?)))
                .collect()
        })
        .unwrap_or_default()
}

/// `status` of a `PluginRollout`, as the leader writes it (the shards'
/// entries, `status.shards`, are [`ShardCounts`], read apart).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct RolloutStatus {
    /// See [`phase`].
    pub phase: String,
    /// 0: the shadow step; 1..: the canary steps.
    pub step: u32,
    /// The share routed to the candidate, percent.
    pub share_percent: f64,
    /// The candidate's version.
    pub candidate_version: String,
    /// The candidate's digest; only this shadow is routed to.
    pub candidate_digest: String,
    /// The current version.
    pub current_version: String,
    /// When the step began (RFC 3339).
    pub step_started_at: String,
    /// What the step waits for, or why the rollout stopped.
    pub message: String,
    /// Counts of the current version in this step's window.
    pub current: Counts,
    /// Counts of the candidate in this step's window.
    pub candidate: Counts,
    /// `Healthy`: False once rolled back, naming metric, value and
    /// threshold.
    pub conditions: Vec<serde_json::Value>,
}

impl RolloutStatus {
    /// The routing this status asks for, if any: none once `spec.rollback`
    /// is set, whatever the status still says (every replica honours it
    /// before the leader has written `RolledBack`).
    pub fn routing(&self, name: &str, spec: &RolloutSpec) -> Option<Routing> {
        if self.candidate_digest.is_empty() || spec.rollback {
            return None;
        }
        let (share_bp, selector) = match self.phase.as_str() {
            phase::CANARY => spec.routing(self.step)?,
            phase::PROMOTED => (BUCKETS, None),
            _ => return None,
        };
        Some(Routing {
            rollout: name.to_owned(),
            candidate_digest: self.candidate_digest.clone(),
            share_bp,
            selector,
        })
    }
}
