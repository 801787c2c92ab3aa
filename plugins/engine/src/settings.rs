//! The operator's settings for this plugin, checked at load by
//! [`validate`] and read on every reconcile as [`Settings`].
//!
//! | key | default | what |
//! | --- | --- | --- |
//! | `engineImage` | [`DEFAULT_ENGINE_IMAGE`] | engine image unless the class or engine template names one |
//! | `uiSidecarImage` | [`DEFAULT_UI_SIDECAR_IMAGE`] | image of the `engine-web` sidecar |
//! | `clusterDomain` | `cluster.local` | DNS domain of the cluster, for the node names in `config.yaml` |

use serde::Deserialize;
use serde_json::Value;
use wasmop_sdk::SettingsProblem;
use wasmop_sdk::settings::{only_keys, optional_string};

/// Default engine image.
pub const DEFAULT_ENGINE_IMAGE: &str = "ghcr.io/firebolt-db/engine:latest";
/// Default image of the UI sidecar.
pub const DEFAULT_UI_SIDECAR_IMAGE: &str = "nginx:1.27-alpine";
/// Default cluster DNS domain.
pub const DEFAULT_CLUSTER_DOMAIN: &str = "cluster.local";

const KEYS: [&str; 3] = ["engineImage", "uiSidecarImage", "clusterDomain"];

/// The plugin's settings, defaults filled in.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Settings {
    /// Default engine image.
    pub engine_image: String,
    /// Image of the UI sidecar.
    pub ui_sidecar_image: String,
    /// The cluster's DNS domain.
    pub cluster_domain: String,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            engine_image: DEFAULT_ENGINE_IMAGE.to_owned(),
            ui_sidecar_image: DEFAULT_UI_SIDECAR_IMAGE.to_owned(),
            cluster_domain: DEFAULT_CLUSTER_DOMAIN.to_owned(),
        }
    }
}

/// Checks the settings document.
///
/// # Errors
///
/// Every problem found: unknown keys, values that are not strings, empty
/// values or values with whitespace.
pub fn validate(settings: &Value) -> Result<(), Vec<SettingsProblem>> {
    only_keys(settings, &KEYS)?;
    let mut problems = Vec::new();
    for key in KEYS {
        if let Err(p) = optional_string(settings, key) {
            problems.extend(p);
            continue;
        }
        if let Some(text) = settings.get(key).and_then(Value::as_str)
            && (text.is_empty() || text.contains(char::is_whitespace))
        {
            problems.push(SettingsProblem::new(
                key,
                format!("{text:?} must be non-empty without whitespace"),
            ));
        }
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
    use serde_json::json;

    #[test]
    fn known_string_keys_pass_and_everything_else_is_reported() {
        assert!(validate(&json!({})).is_ok());
        assert!(validate(&json!({"engineImage": "e:1", "clusterDomain": "c.local"})).is_ok());
        assert!(validate(&json!({"postgresImage": "x"})).is_err());
        assert_eq!(validate(&json!({"engineImage": 3})).unwrap_err().len(), 1);
        assert_eq!(
            validate(&json!({"engineImage": "a b", "clusterDomain": ""}))
                .unwrap_err()
                .len(),
            2
        );
    }
}
