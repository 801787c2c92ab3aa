//! `metav1.Condition` bookkeeping on a status held as JSON.

use serde_json::{Value, json};

/// Sets condition `type_` in `status.conditions`. `lastTransitionTime` moves
/// only when the condition's status changes; reason, message and
/// observedGeneration are updated in place.
pub fn set(
    status: &mut Value,
    type_: &str,
    cond_status: &str,
    reason: &str,
    message: &str,
    observed_generation: Option<i64>,
    now: &str,
) {
    if !status["conditions"].is_array() {
        status["conditions"] = json!([]);
    }
    let list = status["conditions"].as_array_mut().expect("array");
    let mut cond = json!({
        "type": type_,
        "status": cond_status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": now,
    });
    if let Some(g) = observed_generation {
        cond["observedGeneration"] = json!(g);
    }
    match list.iter_mut().find(|c| c["type"] == type_) {
        Some(existing) => {
            if existing["status"] == cond_status {
                cond["lastTransitionTime"] = existing["lastTransitionTime"].clone();
            }
            *existing = cond;
        }
        None => list.push(cond),
    }
}

/// Copies condition `type_` from `from` into `status` when `status` lacks it.
pub fn carry_over(status: &mut Value, from: &Value, type_: &str) {
    let present = status["conditions"]
        .as_array()
        .is_some_and(|l| l.iter().any(|c| c["type"] == type_));
    if present {
        return;
    }
    let Some(found) = from["conditions"]
        .as_array()
        .and_then(|l| l.iter().find(|c| c["type"] == type_))
    else {
        return;
    };
    if !status["conditions"].is_array() {
        status["conditions"] = json!([]);
    }
    if let Some(list) = status["conditions"].as_array_mut() {
        list.push(found.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transition_time_moves_only_when_status_changes() {
        let mut s = json!({});
        set(&mut s, "Ready", "False", "A", "m", Some(1), "t1");
        set(&mut s, "Ready", "False", "B", "m2", Some(2), "t2");
        assert_eq!(s["conditions"][0]["lastTransitionTime"], "t1");
        assert_eq!(s["conditions"][0]["reason"], "B");
        set(&mut s, "Ready", "True", "C", "m3", Some(2), "t3");
        assert_eq!(s["conditions"][0]["lastTransitionTime"], "t3");
        assert_eq!(s["conditions"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn carry_over_keeps_a_condition_the_new_status_dropped() {
        let old =
            json!({"conditions":[{"type":"Reconciled","status":"True","lastTransitionTime":"t0"}]});
        let mut new = json!({"conditions":[{"type":"Ready","status":"True"}]});
        carry_over(&mut new, &old, "Reconciled");
        set(&mut new, "Reconciled", "True", "R", "m", None, "t9");
        let r = new["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Reconciled")
            .unwrap()
            .clone();
        assert_eq!(r["lastTransitionTime"], "t0");
    }
}
