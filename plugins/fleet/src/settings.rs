//! The operator's settings for this plugin, checked at load by [`validate`].
//!
//! | key | default | what |
//! | --- | --- | --- |
//! | `operatorNamespace` | `wasmop` | namespace of the operator Pods, admitted to the peer port |
//! | `operatorPodLabels` | `{"app.kubernetes.io/name": "wasmop"}` | labels of the operator Pods |
//! | `memberReplacementDelaySeconds` | 300 | how long the one PersistentFleet member down may stay down, the rest ready, before it is replaced on a fresh claim |
//! | `operatorServiceAccount` | `wasmop` | the operator's ServiceAccount, admitted to the peer port by the Istio AuthorizationPolicy |
//! | `observeApplications` | true | read every member's `GET /state` on the peer port for `status.application` and `ApplicationConverged` |

use serde::Deserialize;
use serde_json::{Map, Value, json};
use wasmop_sdk::SettingsProblem;
use wasmop_sdk::settings::{json_type, only_keys, optional_string};

const KEYS: [&str; 5] = [
    "operatorNamespace",
    "operatorServiceAccount",
    "operatorPodLabels",
    "memberReplacementDelaySeconds",
    "observeApplications",
];

/// Default operator namespace (as `deploy/wasmop.yaml`).
pub const DEFAULT_OPERATOR_NAMESPACE: &str = "wasmop";
/// Default member replacement delay.
pub const DEFAULT_REPLACEMENT_DELAY_SECONDS: u64 = 300;

/// The settings, defaults filled in.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Settings {
    /// Namespace of the operator Pods.
    pub operator_namespace: String,
    /// Labels of the operator Pods.
    pub operator_pod_labels: Map<String, Value>,
    /// The operator's ServiceAccount.
    pub operator_service_account: String,
    /// Member replacement delay in seconds.
    pub member_replacement_delay_seconds: u64,
    /// Read members' `/state` (application observation).
    pub observe_applications: bool,
}

impl Default for Settings {
    fn default() -> Self {
        let labels = json!({"app.kubernetes.io/name": "wasmop"});
        Settings {
            operator_namespace: DEFAULT_OPERATOR_NAMESPACE.to_owned(),
            operator_pod_labels: labels.as_object().cloned().unwrap_or_default(),
            operator_service_account: "wasmop".to_owned(),
            member_replacement_delay_seconds: DEFAULT_REPLACEMENT_DELAY_SECONDS,
            observe_applications: true,
        }
    }
}

/// Checks the settings document.
///
/// # Errors
///
/// Every problem: unknown keys, wrong types, an empty namespace, label
/// values that are not strings, a delay that is not a positive integer.
pub fn validate(settings: &Value) -> Result<(), Vec<SettingsProblem>> {
    only_keys(settings, &KEYS)?;
    let mut problems = Vec::new();
    if let Err(p) = optional_string(settings, "operatorNamespace") {
        problems.extend(p);
    } else if settings
        .get("operatorNamespace")
        .and_then(Value::as_str)
        .is_some_and(|s| s.is_empty())
    {
        problems.push(SettingsProblem::new(
            "operatorNamespace",
            "must not be empty",
        ));
    }
    if let Err(p) = optional_string(settings, "operatorServiceAccount") {
        problems.extend(p);
    }
    match settings.get("operatorPodLabels") {
        None => {}
        Some(Value::Object(map)) if !map.is_empty() => {
            for (k, v) in map {
                if !v.is_string() {
                    problems.push(SettingsProblem::new(
                        format!("operatorPodLabels.{k}"),
                        format!("expected a string, found {}", json_type(v)),
                    ));
                }
            }
        }
        Some(other) => problems.push(SettingsProblem::new(
            "operatorPodLabels",
            format!(
                "expected a non-empty object of labels, found {}",
                json_type(other)
            ),
        )),
    }
    match settings.get("memberReplacementDelaySeconds") {
        None => {}
        Some(v) if v.as_u64().is_some_and(|n| n > 0) => {}
        Some(v) => problems.push(SettingsProblem::new(
            "memberReplacementDelaySeconds",
            format!("expected a positive integer, found {v}"),
        )),
    }
    if let Some(v) = settings.get("observeApplications")
        && !v.is_boolean()
    {
        problems.push(SettingsProblem::new(
            "observeApplications",
            format!("expected true or false, found {}", json_type(v)),
        ));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_problems() {
        assert!(validate(&json!({})).is_ok());
        let s: Settings = serde_json::from_value(json!({})).unwrap();
        assert_eq!(s, Settings::default());
        let problems = validate(&json!({
            "operatorNamespace": "",
            "operatorPodLabels": {"a": 1},
            "memberReplacementDelaySeconds": 0
        }))
        .unwrap_err();
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(validate(&json!({"nope": 1})).is_err());
    }
}
