//! Shadow runs: a candidate `NAME.shadow.wasm` beside the active
//! `NAME.wasm` is called on every live snapshot the active plugin decided,
//! and its plan is compared with the active one. It writes nothing: its
//! plan is never validated for execution, never executed, and it makes no
//! HTTP requests; only the comparison is kept.
//!
//! - `wasmop_shadow_plans_total{controller, result}` counts `equal`,
//!   `different`, `failed` (the shadow's call failed where the active one
//!   did not) and `skipped` (too many shadow calls in flight).
//! - The latest [`MAX_KEPT`] differing reconciles, each with its
//!   per-object differences, are served as JSON at `/shadow` on the
//!   metrics address.
//! - A kind-scoped controller's call is compared primary by primary: the
//!   active call's decision for each primary against the shadow's object
//!   plan for it (a primary only one side planned counts as different, a
//!   failed call as failed for every primary it covered); each primary is
//!   counted and kept like a reconcile.
//! - Promotion is a rename: `NAME.shadow.wasm` → `NAME.wasm` stops the
//!   shadow and hot-swaps the active plugin, through the plugin directory.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock};

use serde::Serialize;
use serde_json::{Value, json};

use crate::judge::validate::Plan;
use crate::metrics;
use crate::object;
use crate::plugin::CallError;
use crate::reconcile::diff::{Difference, diff, outcome_of};
use crate::reconcile::kind::{KindDecided, KindOutcome};

/// How many differing reconciles `/shadow` keeps.
pub const MAX_KEPT: usize = 50;

/// The file-stem suffix that marks a shadow candidate.
pub const SUFFIX: &str = ".shadow";

/// One reconcile where the shadow's plan differed from the active one.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ShadowDifference {
    /// When (RFC 3339).
    pub at: String,
    /// `plugin/controller`.
    pub controller: String,
    /// `namespace/name` of the primary (`name` when cluster-scoped).
    pub primary: String,
    /// Version of the active plugin.
    pub active: String,
    /// Version of the shadow.
    pub shadow: String,
    /// Per-object differences, active → shadow.
    pub differences: Vec<Difference>,
}

fn kept() -> &'static Mutex<VecDeque<ShadowDifference>> {
    static KEPT: OnceLock<Mutex<VecDeque<ShadowDifference>>> = OnceLock::new();
    KEPT.get_or_init(|| Mutex::new(VecDeque::new()))
}

/// The comparable form of a decision's outcome: the plan itself, also for
/// a rejected plan (the shadow's plan is not validated either), or the
/// failure.
pub fn comparable(outcome: &Value) -> Value {
    match outcome.pointer("/rejected/plan") {
        Some(plan) => plan.clone(),
        None => outcome.clone(),
    }
}

/// Compares the active outcome with the shadow's and accounts for it.
pub fn account(
    controller: &str,
    primary: &str,
    versions: (&str, &str),
    active: &Value,
    shadow: &Value,
) -> Vec<Difference> {
    let differences = diff(&comparable(active), &comparable(shadow));
    let result = if differences.is_empty() {
        "equal"
    } else if shadow.get("failed").is_some() && active.get("failed").is_none() {
        "failed"
    } else {
        "different"
    };
    metrics::global().inc(
        "wasmop_shadow_plans_total",
        &[("controller", controller), ("result", result)],
    );
    if !differences.is_empty() {
        let mut kept = kept().lock().expect("shadow lock");
        kept.push_back(ShadowDifference {
            at: jiff::Timestamp::now().to_string(),
            controller: controller.to_owned(),
            primary: primary.to_owned(),
            active: versions.0.to_owned(),
            shadow: versions.1.to_owned(),
            differences: differences.clone(),
        });
        while kept.len() > MAX_KEPT {
            kept.pop_front();
        }
    }
    differences
}

/// `namespace/name` of a primary, or `name` when cluster-scoped.
pub fn primary_key(namespace: &str, name: &str) -> String {
    if namespace.is_empty() {
        name.to_owned()
    } else {
        format!("{namespace}/{name}")
    }
}

/// What a side that did not plan a primary compares as.
fn not_planned() -> Value {
    json!({"skipped": {"reason": "NotPlanned"}})
}

/// The comparable form of a failed call.
pub fn failed(e: &CallError) -> Value {
    json!({"failed": {"reason": e.reason(), "message": e.to_string()}})
}

/// The active kind call's outcome per primary it covered (keyed as
/// [`kind_pairs`] keys them); empty when the plugin was not called.
pub fn active_kind_outcomes(decided: &KindDecided) -> BTreeMap<String, Value> {
    let key =
        |p: &Arc<Value>| primary_key(object::namespace(p).unwrap_or_default(), object::name(p));
    match &decided.outcome {
        KindOutcome::Empty => BTreeMap::new(),
        KindOutcome::Failed(e) => decided
            .primaries
            .iter()
            .map(|p| (key(p), failed(e)))
            .collect(),
        KindOutcome::Split { decisions, .. } => {
            let mut out: BTreeMap<String, Value> = decided
                .primaries
                .iter()
                .map(|p| (key(p), not_planned()))
                .collect();
            out.extend(decisions.iter().map(|(p, d)| (key(p), outcome_of(d))));
            out
        }
    }
}

/// The active and the shadow outcome of each primary of a kind call:
/// the shadow's object plan for it (as the shadow wrote it, not
/// validated), its failure for every primary the active call covered, or
/// "not planned"; a primary only the shadow names is compared with "not
/// planned" on the active side. A shadow kind plan that sets anything but
/// `objects` fails as the active one would.
pub fn kind_pairs(
    active: BTreeMap<String, Value>,
    shadow: Result<Plan, CallError>,
) -> Vec<(String, Value, Value)> {
    let mut shadow_by: BTreeMap<String, Value> = BTreeMap::new();
    let shadow_failure = match shadow {
        Err(e) => Some(failed(&e)),
        Ok(mut plan) => {
            let objects = std::mem::take(&mut plan.objects);
            if plan.is_empty() {
                for o in objects {
                    let value = serde_json::to_value(&o.plan).unwrap_or_default();
                    shadow_by.insert(primary_key(&o.namespace, &o.name), value);
                }
                None
            } else {
                Some(json!({"failed": {"reason": "PluginOutputMalformed",
                    "message": "a kind plan holds only `objects`"}}))
            }
        }
    };
    let keys: std::collections::BTreeSet<String> =
        active.keys().chain(shadow_by.keys()).cloned().collect();
    keys.into_iter()
        .map(|k| {
            let a = active.get(&k).cloned().unwrap_or_else(not_planned);
            let s = match &shadow_failure {
                Some(f) => f.clone(),
                None => shadow_by.remove(&k).unwrap_or_else(not_planned),
            };
            (k, a, s)
        })
        .collect()
}

/// Counts a shadow call not made because too many were in flight, once
/// per primary it would have compared (one for a reconcile, each primary
/// of a kind call), as a made call is counted.
pub fn skipped(controller: &str, primaries: usize) {
    metrics::global().add(
        "wasmop_shadow_plans_total",
        &[("controller", controller), ("result", "skipped")],
        primaries as f64,
    );
}

/// The latest differing reconciles, newest first, as JSON text.
pub fn report() -> String {
    let kept = kept().lock().expect("shadow lock");
    let latest: Vec<&ShadowDifference> = kept.iter().rev().collect();
    let mut text =
        serde_json::to_string_pretty(&serde_json::json!({ "latest": latest })).unwrap_or_default();
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_skipped_call_counts_once_per_primary_it_would_have_compared() {
        let labels = [("controller", "t/skipped"), ("result", "skipped")];
        let count = || {
            metrics::global()
                .get("wasmop_shadow_plans_total", &labels)
                .unwrap_or(0.0)
        };
        let before = count();
        skipped("t/skipped", 1);
        assert_eq!(count(), before + 1.0);
        skipped("t/skipped", 3);
        assert_eq!(count(), before + 4.0, "a kind call of three primaries");
        skipped("t/skipped", 0);
        assert_eq!(count(), before + 4.0, "a kind call without primaries");
    }

    #[test]
    fn equal_and_different_plans_are_counted_and_differences_kept() {
        let plan = json!({"apply": [], "delete": [], "status": {"a": 1}});
        let other = json!({"apply": [], "delete": [], "status": {"a": 2}});
        let before = metrics::global()
            .get(
                "wasmop_shadow_plans_total",
                &[("controller", "t/unit"), ("result", "equal")],
            )
            .unwrap_or(0.0);
        assert!(account("t/unit", "ns/p", ("1", "2"), &plan, &plan).is_empty());
        assert_eq!(
            metrics::global().get(
                "wasmop_shadow_plans_total",
                &[("controller", "t/unit"), ("result", "equal")]
            ),
            Some(before + 1.0)
        );
        let d = account("t/unit", "ns/p", ("1", "2"), &plan, &other);
        assert_eq!(d.len(), 1);
        assert!(report().contains("\"primary\": \"ns/p\""));
        assert_eq!(primary_key("", "cluster-wide"), "cluster-wide");
        // A rejected active plan compares by its plan.
        let rejected = json!({"rejected": {"violations": [], "plan": plan}});
        assert!(account("t/unit", "ns/p", ("1", "2"), &rejected, &plan).is_empty());
        let failed = json!({"failed": {"reason": "PluginTrapped", "message": "x"}});
        assert!(!account("t/unit", "ns/p", ("1", "2"), &plan, &failed).is_empty());
        assert!(
            metrics::global()
                .get(
                    "wasmop_shadow_plans_total",
                    &[("controller", "t/unit"), ("result", "failed")]
                )
                .is_some()
        );
    }

    #[test]
    fn a_kind_call_is_compared_primary_by_primary() {
        use wasmop_contract::ObjectPlan;
        let plan = |a: i64| -> Plan {
            serde_json::from_value(json!({"status": {"a": a}})).expect("a plan")
        };
        let object_plan = |name: &str, a: i64| {
            let mut o: ObjectPlan =
                serde_json::from_value(json!({"namespace": "ns", "name": name, "uid": name}))
                    .expect("an object plan");
            o.plan = plan(a);
            o
        };
        let value = |a: i64| serde_json::to_value(plan(a)).expect("a value");
        let active: BTreeMap<String, Value> = [
            ("ns/x".to_owned(), value(1)),
            ("ns/y".to_owned(), value(1)),
            ("ns/z".to_owned(), not_planned()),
        ]
        .into();
        let shadow = Plan {
            objects: vec![
                object_plan("x", 1),
                object_plan("y", 2),
                object_plan("w", 1),
            ],
            ..Plan::default()
        };
        let pairs = kind_pairs(active.clone(), Ok(shadow));
        let keys: Vec<&str> = pairs.iter().map(|(k, _, _)| k.as_str()).collect();
        assert_eq!(keys, ["ns/w", "ns/x", "ns/y", "ns/z"]);
        let differs: Vec<bool> = pairs
            .iter()
            .map(|(_, a, s)| !diff(&comparable(a), &comparable(s)).is_empty())
            .collect();
        // w: only the shadow plans it; x: equal; y: another status; z: neither.
        assert_eq!(differs, [true, false, true, false]);
        // A failed shadow call fails every primary the active call covered.
        let failed_call = kind_pairs(
            active.clone(),
            Err(CallError::Timeout {
                deadline: std::time::Duration::from_secs(1),
            }),
        );
        assert_eq!(failed_call.len(), 3);
        assert!(
            failed_call
                .iter()
                .all(|(_, _, s)| s.get("failed").is_some())
        );
        // So does a kind plan with anything but `objects`.
        let mut wrong = plan(1);
        wrong.objects = vec![object_plan("x", 1)];
        let wrong_scope = kind_pairs(active, Ok(wrong));
        assert!(
            wrong_scope
                .iter()
                .all(|(_, _, s)| s.get("failed").is_some())
        );
    }
}
