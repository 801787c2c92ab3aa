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
}
