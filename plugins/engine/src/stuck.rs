//! Why a generation's Pods do not become Ready, read from the Pods
//! themselves: the scheduler's verdict (`PodScheduled=False`), a
//! container (or init container) waiting for a reason other than being
//! created (`ImagePullBackOff`, `CrashLoopBackOff`, ...), or a Pod that
//! failed. The first Pod (by name) with a cause speaks for the generation,
//! as upstream copies the StatefulSet's latest warning into `Ready`
//! (`StatefulSetWarning`).

use serde_json::Value;

/// The reason used when a Pod's own reason is not a valid condition
/// reason (CamelCase, as the API server requires).
pub const FALLBACK_REASON: &str = "StatefulSetWarning";

/// Container waiting reasons that are part of a normal start.
const STARTING: [&str; 2] = ["ContainerCreating", "PodInitializing"];

/// Why a generation is stuck.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cause {
    /// For `Ready` and the Warning Event, e.g. `ImagePullBackOff`.
    pub reason: String,
    /// `pod <name>: <what>` for a person.
    pub message: String,
}

/// The cause of the first Pod (by name) that has one.
pub fn cause(pods: &[&Value]) -> Option<Cause> {
    let mut pods: Vec<&&Value> = pods.iter().collect();
    pods.sort_by_key(|p| {
        p["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    });
    pods.into_iter().find_map(|p| pod_cause(p))
}

/// The cause of one Pod, if it has one.
pub fn pod_cause(pod: &Value) -> Option<Cause> {
    let name = pod["metadata"]["name"].as_str().unwrap_or_default();
    let status = &pod["status"];
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    let make = |reason: &str, what: String| Cause {
        reason: if valid_reason(reason) {
            reason.to_owned()
        } else {
            FALLBACK_REASON.to_owned()
        },
        message: format!("pod {name}: {what}"),
    };
    if status["phase"] == "Failed" {
        let reason = text(&status["reason"]);
        let reason = if reason.is_empty() {
            "PodFailed".to_owned()
        } else {
            reason
        };
        return Some(make(
            &reason,
            join(&reason, &text(&status["message"]), "the Pod failed"),
        ));
    }
    if let Some(c) = status["conditions"].as_array().and_then(|cs| {
        cs.iter()
            .find(|c| c["type"] == "PodScheduled" && c["status"] == "False")
    }) {
        let reason = text(&c["reason"]);
        let reason = if reason.is_empty() {
            "Unschedulable".to_owned()
        } else {
            reason
        };
        return Some(make(
            &reason,
            join(&reason, &text(&c["message"]), "not scheduled"),
        ));
    }
    for list in ["initContainerStatuses", "containerStatuses"] {
        for c in status[list].as_array().into_iter().flatten() {
            let container = c["name"].as_str().unwrap_or_default();
            let waiting = &c["state"]["waiting"];
            let reason = text(&waiting["reason"]);
            if !waiting.is_null() && !reason.is_empty() && !STARTING.contains(&reason.as_str()) {
                return Some(make(
                    &reason,
                    format!(
                        "container {container}: {}",
                        join(&reason, &text(&waiting["message"]), "waiting")
                    ),
                ));
            }
            let terminated = &c["state"]["terminated"];
            let code = terminated["exitCode"].as_i64().unwrap_or(0);
            if list == "containerStatuses" && !terminated.is_null() && code != 0 {
                let reason = text(&terminated["reason"]);
                let reason = if reason.is_empty() {
                    "Error".to_owned()
                } else {
                    reason
                };
                return Some(make(
                    &reason,
                    format!("container {container}: {reason} (exit code {code})"),
                ));
            }
        }
    }
    None
}

fn join(reason: &str, message: &str, default: &str) -> String {
    match (reason.is_empty(), message.is_empty()) {
        (true, true) => default.to_owned(),
        (false, true) => reason.to_owned(),
        (true, false) => message.to_owned(),
        (false, false) => format!("{reason}: {message}"),
    }
}

/// A condition reason the API server accepts:
/// `^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`, at most 1024 characters.
pub fn valid_reason(reason: &str) -> bool {
    let b = reason.as_bytes();
    let inner = |c: &u8| c.is_ascii_alphanumeric() || matches!(c, b'_' | b',' | b':');
    !b.is_empty()
        && b.len() <= 1024
        && b[0].is_ascii_alphabetic()
        && b.iter().all(inner)
        && (b.len() == 1 || b[b.len() - 1].is_ascii_alphanumeric() || b[b.len() - 1] == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, status: Value) -> Value {
        json!({"metadata": {"name": name}, "status": status})
    }

    #[test]
    fn an_unschedulable_pod_names_the_scheduler_message() {
        let p = pod(
            "e-g1-0",
            json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                "reason": "Unschedulable", "message": "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector."}]}),
        );
        let c = pod_cause(&p).unwrap();
        assert_eq!(c.reason, "Unschedulable");
        assert!(
            c.message
                .starts_with("pod e-g1-0: Unschedulable: 0/1 nodes")
        );
    }

    #[test]
    fn waiting_containers_name_their_reason_but_starting_ones_do_not() {
        let waiting = |reason: &str| {
            pod(
                "e-g1-0",
                json!({"phase": "Pending", "containerStatuses": [{"name": "engine",
                    "state": {"waiting": {"reason": reason, "message": "Back-off pulling image \"nope\""}}}]}),
            )
        };
        let c = pod_cause(&waiting("ImagePullBackOff")).unwrap();
        assert_eq!(c.reason, "ImagePullBackOff");
        assert!(
            c.message
                .contains("container engine: ImagePullBackOff: Back-off")
        );
        assert_eq!(
            pod_cause(&waiting("CrashLoopBackOff")).unwrap().reason,
            "CrashLoopBackOff"
        );
        assert_eq!(pod_cause(&waiting("ContainerCreating")), None);
        // A reason the API server would refuse falls back.
        assert_eq!(
            pod_cause(&waiting("Bad reason!")).unwrap().reason,
            FALLBACK_REASON
        );
        let init = pod(
            "e-g1-0",
            json!({"phase": "Pending", "initContainerStatuses": [{"name": "init",
                "state": {"waiting": {"reason": "ErrImagePull"}}}]}),
        );
        assert_eq!(pod_cause(&init).unwrap().reason, "ErrImagePull");
    }

    #[test]
    fn failed_and_crashed_pods_have_causes_and_healthy_ones_none() {
        let failed = pod(
            "e-g1-0",
            json!({"phase": "Failed", "reason": "Evicted", "message": "low on memory"}),
        );
        assert_eq!(pod_cause(&failed).unwrap().reason, "Evicted");
        let crashed = pod(
            "e-g1-0",
            json!({"phase": "Running", "containerStatuses": [{"name": "engine",
                "state": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}]}),
        );
        assert!(
            pod_cause(&crashed)
                .unwrap()
                .message
                .contains("OOMKilled (exit code 137)")
        );
        let fine = pod(
            "e-g1-0",
            json!({"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"}],
                "containerStatuses": [{"name": "engine", "state": {"running": {}}}]}),
        );
        assert_eq!(pod_cause(&fine), None);
    }

    #[test]
    fn the_first_pod_by_name_speaks() {
        let a = pod("e-g1-1", json!({"phase": "Failed", "reason": "Evicted"}));
        let b = pod("e-g1-0", json!({"phase": "Failed", "reason": "Preempted"}));
        assert_eq!(cause(&[&a, &b]).unwrap().reason, "Preempted");
        assert_eq!(cause(&[]), None);
    }

    #[test]
    fn reasons_are_checked_like_the_api_server() {
        for ok in ["A", "ImagePullBackOff", "a_b", "X:y,z1"] {
            assert!(valid_reason(ok), "{ok}");
        }
        for bad in ["", "1abc", "has space", "ends,", "dash-ed"] {
            assert!(!valid_reason(bad), "{bad}");
        }
    }
}
