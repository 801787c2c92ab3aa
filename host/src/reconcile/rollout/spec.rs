//! The `PluginRollout` spec: the candidate, the steps (shadow, canary
//! shares), the thresholds and allowed differences that analysis applies
//! ([`RolloutSpec`]).
//!
//! # Guarantees
//! - A spec that cannot be followed says why ([`RolloutSpec::problems`]):
//!   a rollout never starts from a spec it would misread.
//! - Pure data: reading a spec has no effect.

use serde::{Deserialize, Serialize};

use super::basis_points;
use crate::contract::selector::LabelSelector;
use crate::reconcile::diff::Difference;

/// Which candidate a rollout means; empty: the shadow loaded now.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CandidateRef {
    /// The candidate's manifest version.
    #[serde(default)]
    pub version: Option<String>,
    /// The candidate's digest (`sha256:...`, as `wasmop_plugin_info` shows).
    #[serde(default)]
    pub digest: Option<String>,
}

/// The shadow step.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ShadowStep {
    /// Done after this many shadow comparisons...
    #[serde(default)]
    pub reconciles: Option<u64>,
    /// ...or after this many seconds, whichever comes first.
    #[serde(default)]
    pub seconds: Option<f64>,
    /// Whether shadow differences outside the allow-list fail the
    /// rollout (default true), in this step and the canary steps.
    #[serde(default = "yes")]
    pub analyze: bool,
}

pub(super) fn yes() -> bool {
    true
}

/// One canary step.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CanaryStep {
    /// Share of the primaries, in percent (two decimals count).
    #[serde(default = "hundred")]
    pub percent: f64,
    /// Only primaries whose labels match (kubectl syntax).
    #[serde(default)]
    pub selector: Option<String>,
    /// Held at least this long (default: `spec.holdSeconds`).
    #[serde(default)]
    pub hold_seconds: Option<f64>,
    /// Held until the candidate reconciled this often (default:
    /// `spec.minReconciles`).
    #[serde(default)]
    pub min_reconciles: Option<u64>,
}

pub(super) fn hundred() -> f64 {
    100.0
}

/// How far the candidate may be worse than the current version in the
/// same window before it is rolled back. Each is "the candidate's value
/// minus the current version's"; `shadowDifferences` is a plain count.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Thresholds {
    /// Failed reconciles per reconcile (trap, plugin error, malformed
    /// output, write errors): default 0.05.
    pub errors: f64,
    /// Timed-out calls per reconcile: default 0.
    pub timeouts: f64,
    /// Rejected plans per reconcile: default 0.
    pub plan_rejected: f64,
    /// Plans the API server's dry run refused, per reconcile: default 0.
    pub dry_run_refused: f64,
    /// Shadow plans differing outside the allow-list: default 0.
    pub shadow_differences: u64,
    /// Deletes per primary per minute: default 0.
    pub deletes_per_minute: f64,
    /// Reconciles per primary per minute (requeue churn): default 10.
    pub reconciles_per_minute: f64,
    /// p99 of the call time (snapshot, call, validation), seconds:
    /// default 1.
    pub p99_call_seconds: f64,
    /// p99 of a call's peak memory, bytes (from the budget histogram, so
    /// to its bucket's bound): default 16 MiB.
    pub p99_memory_bytes: f64,
    /// CPU seconds per call: default 0.5.
    pub cpu_seconds_per_call: f64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Self {
            errors: 0.05,
            timeouts: 0.0,
            plan_rejected: 0.0,
            dry_run_refused: 0.0,
            shadow_differences: 0,
            deletes_per_minute: 0.0,
            reconciles_per_minute: 10.0,
            p99_call_seconds: 1.0,
            p99_memory_bytes: f64::from(16u32 << 20),
            cpu_seconds_per_call: 0.5,
        }
    }
}

/// A shadow difference that does not count: its `op` (any when absent)
/// and a prefix of its `path` (any when absent).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AllowedDifference {
    /// `apply`, `delete`, `status`, ... (see `wasmop replay`).
    #[serde(default)]
    pub op: Option<String>,
    /// A prefix of the difference's path, e.g. `.metadata.labels`.
    #[serde(default)]
    pub path: Option<String>,
}

impl AllowedDifference {
    fn allows(&self, d: &Difference) -> bool {
        self.op.as_ref().is_none_or(|op| *op == d.op)
            && self.path.as_ref().is_none_or(|p| d.path.starts_with(p))
    }
}

/// `spec` of a `PluginRollout`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RolloutSpec {
    /// The plugin (manifest name) rolled out.
    pub plugin: String,
    /// Which shadow is the candidate.
    #[serde(default)]
    pub candidate: CandidateRef,
    /// The shadow step; none: the rollout starts at the first canary step.
    #[serde(default)]
    pub shadow: Option<ShadowStep>,
    /// The canary steps; the last should be 100.
    #[serde(default)]
    pub steps: Vec<CanaryStep>,
    /// Default hold of a step, seconds (default 60).
    #[serde(default)]
    pub hold_seconds: Option<f64>,
    /// Default candidate reconciles a step waits for (default 1).
    #[serde(default)]
    pub min_reconciles: Option<u64>,
    /// Thresholds of the analysis.
    #[serde(default)]
    pub analysis: Thresholds,
    /// Shadow differences that do not count.
    #[serde(default)]
    pub allow_differences: Vec<AllowedDifference>,
    /// Set to roll back (also after promotion): every primary back to the
    /// current version.
    #[serde(default)]
    pub rollback: bool,
    /// Set to hold the current step: it does not end, while its analysis
    /// (and an automatic rollback) goes on.
    #[serde(default)]
    pub paused: bool,
}

/// Default hold of a step.
pub const DEFAULT_HOLD_SECONDS: f64 = 60.0;

impl RolloutSpec {
    /// Problems that make the spec impossible to follow.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.plugin.is_empty() {
            out.push("spec.plugin is empty".to_owned());
        }
        if self.steps.is_empty() {
            out.push("spec.steps is empty: a rollout needs at least one canary step".to_owned());
        }
        let mut last = 0;
        for (i, s) in self.steps.iter().enumerate() {
            if !(s.percent > 0.0 && s.percent <= 100.0) {
                out.push(format!(
                    "spec.steps[{i}].percent {} is not in (0, 100]",
                    s.percent
                ));
            }
            let bp = basis_points(s.percent);
            if bp < last {
                out.push(format!(
                    "spec.steps[{i}].percent {} narrows the previous step",
                    s.percent
                ));
            }
            last = bp;
            if let Some(sel) = &s.selector
                && let Err(e) = LabelSelector::parse(sel)
            {
                out.push(format!("spec.steps[{i}].selector: {e}"));
            }
        }
        out
    }

    /// The first step: 0 (shadow) when there is a shadow step, else 1.
    pub fn first_step(&self) -> u32 {
        if self.shadow.is_some() { 0 } else { 1 }
    }

    /// Whether shadow differences are analysed.
    pub fn shadow_analysis(&self) -> bool {
        self.shadow.as_ref().is_none_or(|s| s.analyze)
    }

    /// The differences of `ds` the allow-list does not allow.
    pub fn counted_differences(&self, ds: &[Difference]) -> usize {
        ds.iter()
            .filter(|d| !self.allow_differences.iter().any(|a| a.allows(d)))
            .count()
    }

    /// The routing of canary step `step` (1-based).
    pub fn routing(&self, step: u32) -> Option<(u32, Option<LabelSelector>)> {
        let s = self.steps.get((step as usize).checked_sub(1)?)?;
        let selector = s
            .selector
            .as_deref()
            .and_then(|t| LabelSelector::parse(t).ok());
        Some((basis_points(s.percent), selector))
    }
}
