//! `metav1.Condition` helpers.
//!
//! A plugin starts from the conditions the primary already has
//! ([`conditions_of`]), sets the ones it computes with [`set_condition`], and
//! writes the list back in the plan's status. `lastTransitionTime` then moves
//! only when a condition's status really changes.
//!
//! ```
//! use wasmop_sdk::conditions::{conditions_of, is_true, set_condition};
//! use wasmop_sdk::k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
//! use serde_json::json;
//!
//! let primary = json!({"status": {"conditions": []}});
//! let now: Time = Time("2025-01-01T00:00:00Z".parse().unwrap());
//! let mut conditions = conditions_of(&primary);
//! set_condition(&mut conditions, "Ready", true, "Reconciled", "all good", Some(1), &now);
//! assert!(is_true(&conditions, "Ready"));
//! ```

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde_json::Value;

/// The status of a condition: `True`, `False` or `Unknown`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConditionStatus {
    /// `"True"`.
    True,
    /// `"False"`.
    False,
    /// `"Unknown"`.
    Unknown,
}

impl ConditionStatus {
    /// The string Kubernetes uses.
    pub fn as_str(self) -> &'static str {
        match self {
            ConditionStatus::True => "True",
            ConditionStatus::False => "False",
            ConditionStatus::Unknown => "Unknown",
        }
    }
}

impl From<bool> for ConditionStatus {
    fn from(b: bool) -> Self {
        if b {
            ConditionStatus::True
        } else {
            ConditionStatus::False
        }
    }
}

/// Sets the condition of type `type_`, adding it when missing.
///
/// Returns true when anything about the condition changed.
///
/// # Guarantees
///
/// `lastTransitionTime` is set to `now` when the condition is added or its
/// status changes, and kept otherwise: a new reason, message or
/// observedGeneration alone does not move it. Other conditions and the order
/// of the list are untouched.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: impl Into<ConditionStatus>,
    reason: &str,
    message: &str,
    observed_generation: Option<i64>,
    now: &Time,
) -> bool {
    let status = status.into().as_str();
    let Some(existing) = conditions.iter_mut().find(|c| c.type_ == type_) else {
        conditions.push(Condition {
            type_: type_.to_owned(),
            status: status.to_owned(),
            reason: reason.to_owned(),
            message: message.to_owned(),
            observed_generation,
            last_transition_time: now.clone(),
        });
        return true;
    };
    let before = existing.clone();
    if existing.status != status {
        existing.status = status.to_owned();
        existing.last_transition_time = now.clone();
    }
    existing.reason = reason.to_owned();
    existing.message = message.to_owned();
    existing.observed_generation = observed_generation;
    *existing != before
}

/// The condition of type `type_`, if present.
pub fn find_condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// True when the condition of type `type_` is present with status `True`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    find_condition(conditions, type_).is_some_and(|c| c.status == "True")
}

/// The conditions in `object.status.conditions`, skipping entries that are
/// not valid conditions; empty when there are none.
pub fn conditions_of(object: &Value) -> Vec<Condition> {
    object
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .map(|list| {
            list.iter()
                .filter_map(|c| serde_json::from_value(c.clone()).ok())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn at(s: &str) -> Time {
        Time(s.parse().unwrap())
    }

    #[test]
    fn last_transition_time_moves_only_when_status_changes() {
        let t0 = at("2025-01-01T00:00:00Z");
        let t1 = at("2025-01-01T00:01:00Z");
        let t2 = at("2025-01-01T00:02:00Z");
        let mut conditions = Vec::new();

        assert!(set_condition(
            &mut conditions,
            "Ready",
            false,
            "Pending",
            "waiting",
            Some(1),
            &t0
        ));
        assert_eq!(conditions[0].last_transition_time, t0);

        // New reason, message and generation, same status: time stays.
        assert!(set_condition(
            &mut conditions,
            "Ready",
            false,
            "StillPending",
            "still",
            Some(2),
            &t1
        ));
        let c = find_condition(&conditions, "Ready").unwrap();
        assert_eq!(c.last_transition_time, t0);
        assert_eq!(c.reason, "StillPending");
        assert_eq!(c.message, "still");
        assert_eq!(c.observed_generation, Some(2));

        // Status flips: time moves.
        assert!(set_condition(
            &mut conditions,
            "Ready",
            true,
            "Done",
            "done",
            Some(2),
            &t2
        ));
        assert_eq!(conditions[0].last_transition_time, t2);
        assert!(is_true(&conditions, "Ready"));
    }

    #[test]
    fn setting_the_same_condition_again_reports_no_change() {
        let t0 = at("2025-01-01T00:00:00Z");
        let t1 = at("2025-01-01T00:05:00Z");
        let mut conditions = Vec::new();
        set_condition(&mut conditions, "Ready", true, "Done", "done", Some(1), &t0);
        let before = conditions.clone();
        assert!(!set_condition(
            &mut conditions,
            "Ready",
            true,
            "Done",
            "done",
            Some(1),
            &t1
        ));
        assert_eq!(conditions, before);
    }

    #[test]
    fn other_conditions_keep_their_place() {
        let t0 = at("2025-01-01T00:00:00Z");
        let mut conditions = Vec::new();
        set_condition(&mut conditions, "Available", true, "Up", "", None, &t0);
        set_condition(
            &mut conditions,
            "Ready",
            ConditionStatus::Unknown,
            "Checking",
            "",
            None,
            &t0,
        );
        set_condition(&mut conditions, "Available", false, "Down", "", None, &t0);
        let types: Vec<&str> = conditions.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, ["Available", "Ready"]);
        assert!(!is_true(&conditions, "Available"));
        assert_eq!(
            find_condition(&conditions, "Ready").unwrap().status,
            "Unknown"
        );
        assert!(!is_true(&conditions, "Missing"));
    }

    #[test]
    fn conditions_of_reads_status_and_skips_garbage() {
        let obj = json!({"status": {"conditions": [
            {"type": "Ready", "status": "True", "reason": "R", "message": "m",
             "lastTransitionTime": "2025-01-01T00:00:00Z"},
            {"type": "Broken"},
        ]}});
        let conditions = conditions_of(&obj);
        assert_eq!(conditions.len(), 1);
        assert_eq!(
            conditions[0].last_transition_time,
            at("2025-01-01T00:00:00Z")
        );
        assert!(conditions_of(&json!({})).is_empty());
    }
}
