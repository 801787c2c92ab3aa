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
//! - Promotion is a rename: `NAME.shadow.wasm` → `NAME.wasm` stops the
//!   shadow and hot-swaps the active plugin, through the plugin directory.

use std::collections::VecDeque;
use std::sync::{Mutex, OnceLock};

use serde::Serialize;
use serde_json::Value;

use crate::metrics;
use crate::reconcile::diff::{Difference, diff};

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
    /// `namespace/name` of the primary.
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

/// Counts a shadow call not made because too many were in flight.
pub fn skipped(controller: &str) {
    metrics::global().inc(
        "wasmop_shadow_plans_total",
        &[("controller", controller), ("result", "skipped")],
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
}
