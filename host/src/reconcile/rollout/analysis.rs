//! Judging a step: what each version did in the step's window
//! ([`Counts`]), whether the candidate breached a threshold against the
//! current version ([`analyze`], [`Breach`]) and whether the step held
//! long enough with enough reconciles to move on ([`step_done`]).
//!
//! # Guarantees
//! - Pure functions of the counts and the spec: the same counts give the
//!   same verdict on every replica.
//! - A canary step may end only after its hold and its candidate
//!   reconciles (a shadow step after its comparisons or its seconds); a
//!   breach is named with the measure, both values and the threshold.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{DEFAULT_HOLD_SECONDS, RolloutSpec, Thresholds};

/// What one version did in a step's window, as the status shows it.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct Counts {
    /// Reconciles decided (shadow comparisons for the candidate in the
    /// shadow step are counted in `shadowCompared`).
    pub reconciles: u64,
    /// Distinct primaries reconciled.
    pub primaries: u64,
    /// Failures other than the ones below.
    pub errors: u64,
    /// Timed-out calls.
    pub timeouts: u64,
    /// Rejected plans.
    pub plan_rejected: u64,
    /// Plans the dry run refused.
    pub dry_run_refused: u64,
    /// Deletes in decided plans.
    pub deletes: u64,
    /// Shadow comparisons (candidate only).
    pub shadow_compared: u64,
    /// Shadow comparisons that differed outside the allow-list.
    pub shadow_differences: u64,
    /// p99 of the call time, seconds.
    pub p99_call_seconds: f64,
    /// p99 of the calls' peak memory, bytes (every call of the version,
    /// shadow calls included; see [`crate::plugin::budget`]).
    pub p99_memory_bytes: f64,
    /// CPU seconds per call (as `p99MemoryBytes`).
    pub cpu_seconds_per_call: f64,
}

/// The analysis found the candidate worse than allowed.
#[derive(Clone, Debug, PartialEq)]
pub struct Breach {
    /// The metric, as the thresholds name it.
    pub metric: &'static str,
    /// The candidate's value.
    pub value: f64,
    /// The current version's value (0 for shadow differences).
    pub current: f64,
    /// The threshold crossed.
    pub threshold: f64,
}

impl std::fmt::Display for Breach {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} is {:.3} for the candidate against {:.3} for the current version, \
             more than the threshold {} allows",
            self.metric, self.value, self.current, self.threshold
        )
    }
}

pub(super) fn ratio(n: u64, of: u64) -> f64 {
    if of == 0 { 0.0 } else { n as f64 / of as f64 }
}

/// Per primary per minute; a window shorter than a minute counts as one.
pub(super) fn per_primary_minute(n: u64, primaries: u64, minutes: f64) -> f64 {
    n as f64 / primaries.max(1) as f64 / minutes.max(1.0)
}

/// The first threshold the candidate crosses against the current version
/// in a window of `minutes`, if any. Ratios are per reconcile; rates per
/// primary per minute (a window under a minute counts as one minute, so a
/// few reconciles of a short step are not churn).
pub fn analyze(
    t: &Thresholds,
    shadow_analysis: bool,
    current: &Counts,
    candidate: &Counts,
    minutes: f64,
) -> Option<Breach> {
    if shadow_analysis && candidate.shadow_differences > t.shadow_differences {
        return Some(Breach {
            metric: "shadowDifferences",
            value: candidate.shadow_differences as f64,
            current: 0.0,
            threshold: t.shadow_differences as f64,
        });
    }
    // Each metric of both versions: per reconcile, per primary per minute,
    // or as measured.
    let per_reconcile = |n: fn(&Counts) -> u64| {
        (
            ratio(n(candidate), candidate.reconciles),
            ratio(n(current), current.reconciles),
        )
    };
    let per_minute = |n: fn(&Counts) -> u64| {
        (
            per_primary_minute(n(candidate), candidate.primaries, minutes),
            per_primary_minute(n(current), current.primaries, minutes),
        )
    };
    let measured = |v: fn(&Counts) -> f64| (v(candidate), v(current));
    let checks: [(&'static str, (f64, f64), f64); 9] = [
        ("timeouts", per_reconcile(|c| c.timeouts), t.timeouts),
        (
            "planRejected",
            per_reconcile(|c| c.plan_rejected),
            t.plan_rejected,
        ),
        (
            "dryRunRefused",
            per_reconcile(|c| c.dry_run_refused),
            t.dry_run_refused,
        ),
        ("errors", per_reconcile(|c| c.errors), t.errors),
        (
            "deletesPerMinute",
            per_minute(|c| c.deletes),
            t.deletes_per_minute,
        ),
        (
            "reconcilesPerMinute",
            per_minute(|c| c.reconciles),
            t.reconciles_per_minute,
        ),
        (
            "p99CallSeconds",
            measured(|c| c.p99_call_seconds),
            t.p99_call_seconds,
        ),
        (
            "p99MemoryBytes",
            measured(|c| c.p99_memory_bytes),
            t.p99_memory_bytes,
        ),
        (
            "cpuSecondsPerCall",
            measured(|c| c.cpu_seconds_per_call),
            t.cpu_seconds_per_call,
        ),
    ];
    checks
        .into_iter()
        .find(|(_, (value, current), threshold)| value - current > *threshold)
        .map(|(metric, (value, current), threshold)| Breach {
            metric,
            value,
            current,
            threshold,
        })
}

/// Whether step `step` may end: the shadow step after its comparisons or
/// its seconds, whichever first (with neither given: like a canary step);
/// a canary step after its hold and its candidate reconciles. `None` when
/// it may; otherwise what it waits for (the status's message).
pub fn step_done(
    spec: &RolloutSpec,
    step: u32,
    candidate: &Counts,
    elapsed: Duration,
) -> Option<String> {
    let secs = elapsed.as_secs_f64();
    let hold = spec.hold_seconds.unwrap_or(DEFAULT_HOLD_SECONDS);
    let min = spec.min_reconciles.unwrap_or(1);
    if step == 0 {
        let shadow = spec.shadow.clone().unwrap_or_default();
        if shadow.reconciles.is_some() || shadow.seconds.is_some() {
            let by_count = shadow
                .reconciles
                .is_some_and(|n| candidate.shadow_compared >= n);
            let by_time = shadow.seconds.is_some_and(|s| secs >= s);
            return (!(by_count || by_time)).then(|| {
                format!(
                    "shadow step: {} of {} comparisons, {:.0} of {} s",
                    candidate.shadow_compared,
                    shadow.reconciles.map_or("-".to_owned(), |n| n.to_string()),
                    secs,
                    shadow.seconds.map_or("-".to_owned(), |s| s.to_string()),
                )
            });
        }
        return (!(secs >= hold && candidate.shadow_compared >= min)).then(|| {
            format!(
                "shadow step: {} of {min} comparisons, {secs:.0} of {hold} s",
                candidate.shadow_compared
            )
        });
    }
    let s = spec.steps.get(step as usize - 1)?;
    let hold = s.hold_seconds.unwrap_or(hold);
    let min = s.min_reconciles.unwrap_or(min);
    (!(secs >= hold && candidate.reconciles >= min)).then(|| {
        format!(
            "step {step} ({}%): {} of {min} candidate reconciles, {secs:.0} of {hold} s",
            s.percent, candidate.reconciles
        )
    })
}
