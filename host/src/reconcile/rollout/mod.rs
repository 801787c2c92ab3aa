//! Staged plugin rollouts: a candidate version of a plugin is shadowed,
//! then given a growing share of the primaries, each step held until its
//! analysis against the current version passes, and rolled back by itself
//! when a threshold is crossed.
//!
//! A rollout is a cluster-scoped `PluginRollout` object
//! (`wasmop.dev/v1alpha1`, CRD in `crds/`). It lives in the API server, not
//! in the operator configuration, because its state must survive an
//! operator restart and a leader change, and because a person reads where
//! it stands (`kubectl get pluginrollouts`) and stops it with one patch.
//!
//! The candidate is the plugin's shadow, `NAME.shadow.wasm` beside
//! `NAME.wasm` (a file, or an OCI digest the mirror writes there): it is
//! loaded, compiled and checked by the hot swap path before anything is
//! routed to it (see [`crate::report::shadow`]). `spec.candidate.version` or
//! `.digest` pin which shadow the rollout means; another shadow is not
//! routed to.
//!
//! This module holds the parts every replica shares and that need no API
//! server: the object's types, the stable bucket of a primary, the routing
//! table, the per-step counts and the pure [`analyze`] and [`step_done`].
//! The leader's driver lives in `controller/rollout.rs`.
//!
//! # Guarantees
//! - A primary is in the canary share when its UID's bucket
//!   (FNV-1a 64 of the UID, mod 10000: [`bucket`]) is below the step's
//!   share in basis points and, if the step names a selector, its labels
//!   match it. The same UID lands in the same bucket on every replica and
//!   after every restart; a wider step (with the same selector or none)
//!   keeps every primary of the narrower.
//! - Only a loaded shadow whose digest is the one the rollout recorded is
//!   routed to; otherwise the primary is reconciled by the current version.
//! - Counts are kept only for plugins with a rollout this replica drives
//!   (the leader) or, with `--sharding`, whose step every shard counts
//!   (each shard reconciles only its own primaries, so the leader's counts
//!   alone would miss what the candidate does on the other shards). A
//!   reconcile takes one short lock of the window map, empty when nothing
//!   is rolled out; the costs of calls (memory, CPU) come from the
//!   lock-free [`crate::plugin::budget`].
//! - With `--sharding`, each shard publishes its counts of the step in the
//!   rollout's status, under `status.shards.<shard>` ([`ShardCounts`],
//!   tagged with the step, candidate digest and step start they count),
//!   and the leader analyses its own counts plus every other shard's entry
//!   for the same step ([`combine`]): a candidate that fails only on
//!   another shard's primaries is rolled back like one that fails on the
//!   leader's.
//! - A rollback is routed away from the candidate at once, and held by the
//!   leader ([`Rollouts::hold_rollback`]) until its status is recorded: a
//!   failed status write is tried again at the next tick, and meanwhile
//!   nothing is routed to the candidate again. A `spec.rollback` routes
//!   nothing to the candidate on any replica, before the leader records it
//!   ([`RolloutStatus::routing`]).

mod analysis;
mod spec;
mod status;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use crate::contract::selector::LabelSelector;
use crate::plugin::budget::{BudgetCounts, CallBudget};
use crate::reconcile::diff::Difference;

pub use self::analysis::{Breach, Counts, analyze, step_done};
pub use self::spec::{
    AllowedDifference, CanaryStep, CandidateRef, DEFAULT_HOLD_SECONDS, RolloutSpec, ShadowStep,
    Thresholds,
};
pub use self::status::{RolloutStatus, ShardCounts, combine, shard_counts};

/// API group of `PluginRollout`.
pub const GROUP: &str = "wasmop.dev";
/// API version of `PluginRollout`.
pub const VERSION: &str = "v1alpha1";
/// Kind.
pub const KIND: &str = "PluginRollout";
/// Resource (plural).
pub const PLURAL: &str = "pluginrollouts";

/// How many buckets the UIDs are spread over (a share is in basis points).
pub const BUCKETS: u32 = 10_000;

/// Phases a rollout goes through.
pub mod phase {
    /// The candidate is not loaded as a shadow (yet).
    pub const WAITING: &str = "Waiting";
    /// The candidate runs as a shadow only.
    pub const SHADOW: &str = "Shadow";
    /// The candidate reconciles a share of the primaries.
    pub const CANARY: &str = "Canary";
    /// The candidate reconciles every primary.
    pub const PROMOTED: &str = "Promoted";
    /// Every primary is back on the current version.
    pub const ROLLED_BACK: &str = "RolledBack";
    /// The spec cannot be followed.
    pub const INVALID: &str = "Invalid";
}

/// The stable bucket of a primary's UID, `0..BUCKETS` (FNV-1a 64).
pub fn bucket(uid: &str) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in uid.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (h % u64::from(BUCKETS)) as u32
}

/// A share in percent as basis points, clamped to `0..=10000`.
pub fn basis_points(percent: f64) -> u32 {
    if percent.is_nan() {
        return 0;
    }
    (percent * 100.0).round().clamp(0.0, f64::from(BUCKETS)) as u32
}

/// Where the primaries of one plugin go.
#[derive(Clone, Debug, PartialEq)]
pub struct Routing {
    /// The rollout's name.
    pub rollout: String,
    /// The candidate's digest: only a shadow with it is routed to.
    pub candidate_digest: String,
    /// Share in basis points.
    pub share_bp: u32,
    /// Only primaries matching it.
    pub selector: Option<LabelSelector>,
}

impl Routing {
    /// Whether the primary with `uid` and `labels` goes to the candidate.
    pub fn to_candidate(&self, uid: &str, labels: &BTreeMap<String, String>) -> bool {
        !uid.is_empty()
            && bucket(uid) < self.share_bp
            && self.selector.as_ref().is_none_or(|s| s.matches(labels))
    }
}

/// How a reconcile ended, for the counts.
#[derive(Clone, Copy, Debug)]
pub enum Outcome {
    /// Decided (planned, rejected or failed; failures are counted again by
    /// [`Rollouts::record_failure`]) with this many deletes planned.
    Decided {
        /// Deletes in the plan.
        deletes: usize,
    },
}

#[derive(Debug, Default)]
struct Side {
    counts: Counts,
    primaries: HashSet<String>,
    durations: Vec<f64>,
    /// The version's budget and what it held when the window opened.
    budget: Option<(Arc<CallBudget>, BudgetCounts)>,
}

impl Side {
    fn with_budget(budget: Option<Arc<CallBudget>>) -> Self {
        Side {
            budget: budget.map(|b| {
                let at = b.counts();
                (b, at)
            }),
            ..Side::default()
        }
    }
}

/// Call times kept per side and window (the p99 is of these).
const MAX_DURATIONS: usize = 4096;

impl Side {
    fn snapshot(&self) -> Counts {
        let mut c = self.counts.clone();
        c.primaries = self.primaries.len() as u64;
        c.p99_call_seconds = p99(&self.durations);
        if let Some((b, at)) = &self.budget {
            let delta = b.counts().since(at);
            c.p99_memory_bytes = delta.p99_memory_bytes();
            c.cpu_seconds_per_call = delta.cpu_seconds_per_call();
        }
        c
    }
}

fn p99(samples: &[f64]) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let i = ((s.len() as f64) * 0.99).ceil() as usize;
    s[i.clamp(1, s.len()) - 1]
}

/// One step's window of counts, on the replica that drives the rollout.
#[derive(Debug)]
struct Window {
    step: u32,
    candidate_digest: String,
    started: Instant,
    current: Side,
    candidate: Side,
    spec: RolloutSpec,
}

/// The counts of a window, for the driver.
#[derive(Clone, Debug)]
pub struct WindowCounts {
    /// The current version.
    pub current: Counts,
    /// The candidate.
    pub candidate: Counts,
    /// Since the window started.
    pub elapsed: Duration,
    /// Whether this call opened the window.
    pub opened: bool,
}

/// An open window's step, candidate and counts ([`Rollouts::window_counts`]).
#[derive(Clone, Debug)]
pub struct OpenWindow {
    /// The step counted.
    pub step: u32,
    /// The candidate counted.
    pub candidate_digest: String,
    /// The current version.
    pub current: Counts,
    /// The candidate.
    pub candidate: Counts,
}

/// The budgets of the two versions an analysis window compares.
#[derive(Clone, Debug, Default)]
pub struct Budgets {
    /// The current version's.
    pub current: Option<Arc<CallBudget>>,
    /// The candidate's.
    pub candidate: Option<Arc<CallBudget>>,
}

/// Routing and counting of every rollout on this replica.
#[derive(Debug, Default)]
pub struct Rollouts {
    routes: RwLock<HashMap<String, Routing>>,
    windows: Mutex<HashMap<String, Window>>,
    /// Rollbacks decided but not yet recorded in their rollout's status,
    /// by the rollout's UID.
    held: Mutex<HashMap<String, RolloutStatus>>,
}

impl Rollouts {
    /// Holds the rollback `status` of the rollout with `uid` until
    /// [`Self::rollback_recorded`]: while held, the rollout routes nothing
    /// to its candidate on this replica, whatever its status still says.
    pub fn hold_rollback(&self, uid: &str, status: &RolloutStatus) {
        self.held
            .lock()
            .expect("held rollbacks lock")
            .insert(uid.to_owned(), status.clone());
    }

    /// The rollback held for the rollout with `uid`, if any.
    pub fn held_rollback(&self, uid: &str) -> Option<RolloutStatus> {
        let held = self.held.lock().expect("held rollbacks lock");
        if held.is_empty() {
            return None;
        }
        held.get(uid).cloned()
    }

    /// The rollback of the rollout with `uid` is in its status (or the
    /// rollout is gone): no longer held.
    pub fn rollback_recorded(&self, uid: &str) {
        self.held.lock().expect("held rollbacks lock").remove(uid);
    }

    /// Forgets the held rollbacks of rollouts whose UID is not in `live`.
    pub fn forget_held_except(&self, live: &HashSet<String>) {
        self.held
            .lock()
            .expect("held rollbacks lock")
            .retain(|uid, _| live.contains(uid));
    }

    /// The routing of plugin `name`, if a rollout routes any of it.
    pub fn routing(&self, name: &str) -> Option<Routing> {
        let routes = self.routes.read().expect("rollout routes lock");
        if routes.is_empty() {
            return None;
        }
        routes.get(name).cloned()
    }

    /// Sets the routing of plugin `name` (`None`: all to the current
    /// version); returns whether it changed.
    pub fn set_routing(&self, name: &str, routing: Option<Routing>) -> bool {
        let mut routes = self.routes.write().expect("rollout routes lock");
        let changed = routes.get(name) != routing.as_ref();
        match routing {
            Some(r) => routes.insert(name.to_owned(), r),
            None => routes.remove(name),
        };
        changed
    }

    /// Plugins with a routing.
    pub fn routed_plugins(&self) -> Vec<String> {
        self.routes
            .read()
            .expect("rollout routes lock")
            .keys()
            .cloned()
            .collect()
    }

    /// Starts counting step `step` of plugin `name` afresh, unless a
    /// window of that step and candidate is open; returns the counts (and
    /// whether this call opened the window).
    pub fn window(
        &self,
        name: &str,
        step: u32,
        candidate_digest: &str,
        spec: &RolloutSpec,
        budgets: Budgets,
    ) -> WindowCounts {
        let mut windows = self.windows.lock().expect("rollout windows lock");
        let fresh = |budgets: Budgets| Window {
            step,
            candidate_digest: candidate_digest.to_owned(),
            started: Instant::now(),
            current: Side::with_budget(budgets.current),
            candidate: Side::with_budget(budgets.candidate),
            spec: spec.clone(),
        };
        let opened = match windows.get(name) {
            Some(w) => w.step != step || w.candidate_digest != candidate_digest,
            None => true,
        };
        if opened {
            windows.insert(name.to_owned(), fresh(budgets));
        }
        let w = windows.get_mut(name).expect("the window just made");
        w.spec = spec.clone();
        WindowCounts {
            current: w.current.snapshot(),
            candidate: w.candidate.snapshot(),
            elapsed: w.started.elapsed(),
            opened,
        }
    }

    /// The counts of plugin `name`'s open window, without opening one.
    pub fn window_counts(&self, name: &str) -> Option<OpenWindow> {
        let windows = self.windows.lock().expect("rollout windows lock");
        let w = windows.get(name)?;
        Some(OpenWindow {
            step: w.step,
            candidate_digest: w.candidate_digest.clone(),
            current: w.current.snapshot(),
            candidate: w.candidate.snapshot(),
        })
    }

    /// Stops counting for every plugin not in `keep`.
    pub fn close_windows_except(&self, keep: &HashSet<String>) {
        self.windows
            .lock()
            .expect("rollout windows lock")
            .retain(|name, _| keep.contains(name));
    }

    /// Stops counting for plugin `name`.
    pub fn close_window(&self, name: &str) {
        self.windows
            .lock()
            .expect("rollout windows lock")
            .remove(name);
    }

    /// Stops counting everything (this replica no longer leads).
    pub fn close_all(&self) {
        self.windows.lock().expect("rollout windows lock").clear();
    }

    fn with_side(&self, name: &str, digest: &str, f: impl FnOnce(&mut Side, &RolloutSpec)) {
        let mut windows = self.windows.lock().expect("rollout windows lock");
        if windows.is_empty() {
            return;
        }
        let Some(w) = windows.get_mut(name) else {
            return;
        };
        let spec = w.spec.clone();
        let side = if w.candidate_digest == digest {
            &mut w.candidate
        } else {
            &mut w.current
        };
        f(side, &spec);
    }

    /// Counts one reconcile of `primary` by the version of plugin `name`
    /// with `digest`.
    pub fn record(
        &self,
        name: &str,
        digest: &str,
        primary: &str,
        outcome: Outcome,
        elapsed: Duration,
    ) {
        self.with_side(name, digest, |side, _| {
            let Outcome::Decided { deletes } = outcome;
            side.counts.reconciles += 1;
            side.counts.deletes += deletes as u64;
            if !side.primaries.contains(primary) {
                side.primaries.insert(primary.to_owned());
            }
            if side.durations.len() < MAX_DURATIONS {
                side.durations.push(elapsed.as_secs_f64());
            }
        });
    }

    /// Counts a failed reconcile (its `reason`, as the `Reconciled`
    /// condition names it) of the version with `digest`.
    pub fn record_failure(&self, name: &str, digest: &str, reason: &str) {
        self.with_side(name, digest, |side, _| match reason {
            "PluginTimedOut" => side.counts.timeouts += 1,
            "PlanRejected" => side.counts.plan_rejected += 1,
            "DryRunRefused" => side.counts.dry_run_refused += 1,
            _ => side.counts.errors += 1,
        });
    }

    /// Counts one shadow comparison of the candidate with `digest`: its
    /// differences (those outside the allow-list count) and its failure
    /// reason, if its call failed.
    pub fn record_shadow(
        &self,
        name: &str,
        digest: &str,
        differences: &[Difference],
        failed: Option<&str>,
    ) {
        let mut windows = self.windows.lock().expect("rollout windows lock");
        let Some(w) = windows.get_mut(name) else {
            return;
        };
        if w.candidate_digest != digest {
            return;
        }
        let counted = w.spec.counted_differences(differences);
        let side = &mut w.candidate;
        side.counts.shadow_compared += 1;
        if counted > 0 {
            side.counts.shadow_differences += 1;
        }
        match failed {
            Some("PluginTimedOut") => side.counts.timeouts += 1,
            Some(_) => side.counts.errors += 1,
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(v: serde_json::Value) -> RolloutSpec {
        serde_json::from_value(v).expect("a spec")
    }

    #[test]
    fn the_bucket_is_stable_and_spread_and_a_wider_share_keeps_the_narrower() {
        assert_eq!(bucket("0d6e0c1a-1111-4222-8333-444455556666"), {
            bucket("0d6e0c1a-1111-4222-8333-444455556666")
        });
        let uids: Vec<String> = (0..2000).map(|i| format!("uid-{i}")).collect();
        let under = |bp: u32| uids.iter().filter(|u| bucket(u) < bp).count();
        let tenth = under(1000);
        assert!((120..=280).contains(&tenth), "10% of 2000 is {tenth}");
        for u in &uids {
            if bucket(u) < 100 {
                assert!(bucket(u) < 1000);
            }
        }
        let r = Routing {
            rollout: "r".into(),
            candidate_digest: "d".into(),
            share_bp: BUCKETS,
            selector: None,
        };
        assert!(r.to_candidate("x", &BTreeMap::new()));
        assert!(!r.to_candidate("", &BTreeMap::new()), "no UID, no move");
        let sel = Routing {
            selector: Some(LabelSelector::parse("canary=yes").expect("a selector")),
            ..r
        };
        assert!(!sel.to_candidate("x", &BTreeMap::new()));
        assert!(sel.to_candidate("x", &[("canary".into(), "yes".into())].into()));
    }

    #[test]
    fn a_spec_that_cannot_be_followed_says_why() {
        let s = spec(
            json!({"plugin": "", "steps": [{"percent": 50}, {"percent": 10},
            {"percent": 0}, {"percent": 100, "selector": "a in (b"}]}),
        );
        let p = s.problems().join("; ");
        for needle in [
            "spec.plugin",
            "narrows",
            "not in (0, 100]",
            "steps[3].selector",
        ] {
            assert!(p.contains(needle), "{p}");
        }
        assert!(
            serde_json::from_value::<RolloutSpec>(json!({"plugin": "x", "stepz": []})).is_err()
        );
        assert!(
            spec(json!({"plugin": "x", "steps": [{"percent": 1}]}))
                .problems()
                .is_empty()
        );
    }

    #[test]
    fn each_threshold_compares_the_candidate_with_the_current_version() {
        let t = Thresholds::default();
        let current = Counts {
            reconciles: 10,
            primaries: 5,
            ..Counts::default()
        };
        let same = Counts {
            reconciles: 10,
            primaries: 5,
            ..Counts::default()
        };
        assert_eq!(analyze(&t, true, &current, &same, 0.1), None);
        let deleting = Counts {
            deletes: 1,
            ..same.clone()
        };
        let b = analyze(&t, true, &current, &deleting, 0.1).expect("a breach");
        assert_eq!(b.metric, "deletesPerMinute");
        assert!(b.to_string().contains("deletesPerMinute is 0.200"), "{b}");
        // The current version deleting as much is no breach.
        let current_deleting = Counts {
            deletes: 1,
            ..current.clone()
        };
        assert_eq!(analyze(&t, true, &current_deleting, &deleting, 0.1), None);
        let differing = Counts {
            shadow_differences: 1,
            ..same.clone()
        };
        assert_eq!(
            analyze(&t, true, &current, &differing, 0.1).map(|b| b.metric),
            Some("shadowDifferences")
        );
        assert_eq!(analyze(&t, false, &current, &differing, 0.1), None);
        let rejected = Counts {
            plan_rejected: 1,
            ..same.clone()
        };
        assert_eq!(
            analyze(&t, true, &current, &rejected, 0.1).map(|b| b.metric),
            Some("planRejected")
        );
        let slow = Counts {
            p99_call_seconds: 2.5,
            ..same.clone()
        };
        assert_eq!(
            analyze(&t, true, &current, &slow, 0.1).map(|b| b.metric),
            Some("p99CallSeconds")
        );
        let hungry = Counts {
            p99_memory_bytes: f64::from(64u32 << 20),
            ..same.clone()
        };
        let b = analyze(&t, true, &current, &hungry, 0.1).expect("a breach");
        assert_eq!(
            (b.metric, b.threshold),
            ("p99MemoryBytes", f64::from(16u32 << 20))
        );
        let busy_cpu = Counts {
            cpu_seconds_per_call: 0.9,
            ..same.clone()
        };
        assert_eq!(
            analyze(&t, true, &current, &busy_cpu, 0.1).map(|b| b.metric),
            Some("cpuSecondsPerCall")
        );
        // Churn under a minute counts as a minute: 3 reconciles of one
        // primary in 2 s is not churn.
        let busy = Counts {
            reconciles: 3,
            primaries: 1,
            ..Counts::default()
        };
        assert_eq!(analyze(&t, true, &Counts::default(), &busy, 0.03), None);
        let churning = Counts {
            reconciles: 30,
            primaries: 1,
            ..Counts::default()
        };
        assert_eq!(
            analyze(&t, true, &Counts::default(), &churning, 1.0).map(|b| b.metric),
            Some("reconcilesPerMinute")
        );
    }

    #[test]
    fn a_step_is_held_until_its_hold_and_its_reconciles() {
        let s = spec(
            json!({"plugin": "x", "shadow": {"reconciles": 3, "seconds": 30},
            "steps": [{"percent": 10, "holdSeconds": 2, "minReconciles": 2}]}),
        );
        let c = |n: u64, compared: u64| Counts {
            reconciles: n,
            shadow_compared: compared,
            ..Counts::default()
        };
        let secs = Duration::from_secs;
        assert!(step_done(&s, 0, &c(0, 2), secs(1)).is_some());
        assert!(step_done(&s, 0, &c(0, 3), secs(1)).is_none(), "by count");
        assert!(step_done(&s, 0, &c(0, 0), secs(30)).is_none(), "by time");
        let waiting = step_done(&s, 1, &c(1, 0), secs(5)).expect("waits");
        assert!(waiting.contains("1 of 2 candidate reconciles"), "{waiting}");
        assert!(step_done(&s, 1, &c(2, 0), secs(1)).is_some());
        assert!(step_done(&s, 1, &c(2, 0), secs(2)).is_none());
    }

    #[test]
    fn counts_go_to_the_side_of_the_digest_and_allowed_differences_do_not_count() {
        let r = Rollouts::default();
        let s = spec(json!({"plugin": "p", "steps": [{"percent": 100}],
            "allowDifferences": [{"op": "apply", "path": ".metadata.labels"}]}));
        // No window: nothing counted.
        r.record(
            "p",
            "cand",
            "ns/a",
            Outcome::Decided { deletes: 1 },
            Duration::ZERO,
        );
        let first = r.window("p", 1, "cand", &s, Budgets::default());
        assert_eq!((first.candidate.reconciles, first.opened), (0, true));
        assert!(!r.window("p", 1, "cand", &s, Budgets::default()).opened);
        r.record(
            "p",
            "cand",
            "ns/a",
            Outcome::Decided { deletes: 1 },
            Duration::ZERO,
        );
        r.record(
            "p",
            "cand",
            "ns/a",
            Outcome::Decided { deletes: 0 },
            Duration::ZERO,
        );
        r.record(
            "p",
            "cur",
            "ns/b",
            Outcome::Decided { deletes: 0 },
            Duration::ZERO,
        );
        r.record_failure("p", "cur", "PlanRejected");
        let label = Difference {
            op: "apply".into(),
            object: "ConfigMap ns/a-cm".into(),
            path: ".metadata.labels[\"v\"]".into(),
            before: None,
            after: None,
        };
        let delete = Difference {
            op: "delete".into(),
            path: String::new(),
            ..label.clone()
        };
        r.record_shadow("p", "cand", std::slice::from_ref(&label), None);
        r.record_shadow("p", "cand", &[label, delete], None);
        r.record_shadow("p", "other", &[], Some("PluginTimedOut"));
        let w = r.window("p", 1, "cand", &s, Budgets::default());
        assert_eq!((w.candidate.reconciles, w.candidate.deletes), (2, 1));
        assert_eq!(w.candidate.primaries, 1);
        assert_eq!(
            (w.candidate.shadow_compared, w.candidate.shadow_differences),
            (2, 1)
        );
        assert_eq!(
            w.candidate.timeouts, 0,
            "another shadow is not the candidate"
        );
        assert_eq!((w.current.reconciles, w.current.plan_rejected), (1, 1));
        // A new step starts a new window.
        assert_eq!(
            r.window("p", 2, "cand", &s, Budgets::default())
                .candidate
                .reconciles,
            0
        );
    }

    #[test]
    fn the_status_routes_only_in_canary_and_promoted() {
        let s = spec(
            json!({"plugin": "p", "steps": [{"percent": 1}, {"percent": 50, "selector": "a=b"}]}),
        );
        let st = |phase: &str, step: u32| RolloutStatus {
            phase: phase.into(),
            step,
            candidate_digest: "d".into(),
            ..RolloutStatus::default()
        };
        assert_eq!(st(phase::SHADOW, 0).routing("r", &s), None);
        assert_eq!(st(phase::ROLLED_BACK, 1).routing("r", &s), None);
        assert_eq!(
            st(phase::CANARY, 1).routing("r", &s).map(|r| r.share_bp),
            Some(100)
        );
        let second = st(phase::CANARY, 2).routing("r", &s).expect("routed");
        assert_eq!((second.share_bp, second.selector.is_some()), (5000, true));
        assert_eq!(
            st(phase::PROMOTED, 2).routing("r", &s).map(|r| r.share_bp),
            Some(BUCKETS)
        );
        let mut no_digest = st(phase::PROMOTED, 2);
        no_digest.candidate_digest.clear();
        assert_eq!(no_digest.routing("r", &s), None);
    }

    #[test]
    fn a_rollback_in_the_spec_routes_nothing_whatever_the_status_says() {
        let mut s = spec(json!({"plugin": "p", "steps": [{"percent": 100}]}));
        let st = RolloutStatus {
            phase: phase::CANARY.into(),
            step: 1,
            candidate_digest: "d".into(),
            ..RolloutStatus::default()
        };
        assert!(st.routing("r", &s).is_some());
        s.rollback = true;
        assert_eq!(st.routing("r", &s), None);
    }

    #[test]
    fn shard_counts_add_up_and_the_worst_measure_counts() {
        let local = Counts {
            reconciles: 2,
            primaries: 2,
            deletes: 0,
            p99_call_seconds: 0.5,
            ..Counts::default()
        };
        let other = Counts {
            reconciles: 3,
            primaries: 1,
            deletes: 4,
            errors: 1,
            p99_call_seconds: 2.0,
            cpu_seconds_per_call: 0.3,
            ..Counts::default()
        };
        let all = combine(&local, [&other]);
        assert_eq!(
            (all.reconciles, all.primaries, all.deletes, all.errors),
            (5, 3, 4, 1)
        );
        assert_eq!((all.p99_call_seconds, all.cpu_seconds_per_call), (2.0, 0.3));
        assert_eq!(combine(&local, []), local);
        // Only another shard's entry of the same step start counts.
        let status = RolloutStatus {
            step: 1,
            candidate_digest: "d".into(),
            step_started_at: "t1".into(),
            ..RolloutStatus::default()
        };
        let published = shard_counts(Some(&json!({"phase": "Canary", "shards": {
            "b": {"step": 1, "candidateDigest": "d", "stepStartedAt": "t1", "candidate": {"deletes": 4}},
            "c": {"step": 1, "candidateDigest": "d", "stepStartedAt": "t0", "candidate": {"deletes": 9}},
            "d": "not counts",
        }})));
        assert_eq!(published.len(), 2, "{published:?}");
        let counted: Vec<&str> = published
            .iter()
            .filter(|(_, c)| c.counts_step_of(&status))
            .map(|(k, _)| k.as_str())
            .collect();
        assert_eq!(counted, ["b"]);
        assert_eq!(published["b"].candidate.deletes, 4);
        // The shards' entries are not the leader's status.
        let parsed: RolloutStatus =
            serde_json::from_value(json!({"phase": "Canary", "shards": {}})).expect("parses");
        assert_eq!(parsed.phase, "Canary");
    }

    #[test]
    fn a_held_rollback_stays_until_recorded_or_its_rollout_is_gone() {
        let r = Rollouts::default();
        assert_eq!(r.held_rollback("u"), None);
        let st = RolloutStatus {
            phase: phase::ROLLED_BACK.into(),
            ..RolloutStatus::default()
        };
        r.hold_rollback("u", &st);
        r.hold_rollback("v", &st);
        assert_eq!(r.held_rollback("u"), Some(st.clone()));
        r.rollback_recorded("u");
        assert_eq!(r.held_rollback("u"), None);
        r.forget_held_except(&HashSet::new());
        assert_eq!(r.held_rollback("v"), None);
    }
}
