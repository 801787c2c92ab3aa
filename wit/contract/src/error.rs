//! Why a call produced no result: [`ReconcileError`] for a reconcile,
//! [`SettingsProblem`] for a settings check.

use serde::{Deserialize, Serialize};

/// Why a reconcile produced no plan. Nothing is written for an error.
///
/// JSON: `{"invalidSpec":"…"}`, `{"notReady":"…"}` or `{"internal":"…"}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ReconcileError {
    /// The primary's spec cannot be reconciled as written; retried when the
    /// primary changes or after the maximum backoff.
    InvalidSpec(String),
    /// Something the plugin needs is not there yet; retried with backoff.
    NotReady(String),
    /// The snapshot was not what the plugin expected (a bug); retried with
    /// backoff.
    Internal(String),
}

impl ReconcileError {
    /// An [`ReconcileError::InvalidSpec`].
    pub fn invalid_spec(message: impl Into<String>) -> Self {
        ReconcileError::InvalidSpec(message.into())
    }

    /// A [`ReconcileError::NotReady`].
    pub fn not_ready(message: impl Into<String>) -> Self {
        ReconcileError::NotReady(message.into())
    }

    /// An [`ReconcileError::Internal`].
    pub fn internal(message: impl Into<String>) -> Self {
        ReconcileError::Internal(message.into())
    }

    /// The message without its variant.
    pub fn message(&self) -> &str {
        match self {
            ReconcileError::InvalidSpec(m)
            | ReconcileError::NotReady(m)
            | ReconcileError::Internal(m) => m,
        }
    }
}

impl std::fmt::Display for ReconcileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReconcileError::InvalidSpec(m) => write!(f, "invalid spec: {m}"),
            ReconcileError::NotReady(m) => write!(f, "not ready: {m}"),
            ReconcileError::Internal(m) => write!(f, "internal error: {m}"),
        }
    }
}

impl std::error::Error for ReconcileError {}

/// One problem found in the operator's settings for a plugin.
///
/// JSON: `{"path":"replicas","message":"…"}`; `validate-settings` answers
/// with a JSON list of them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SettingsProblem {
    /// Dotted path of the offending setting, empty for the whole document.
    pub path: String,
    /// What is wrong, for a person.
    pub message: String,
}

impl SettingsProblem {
    /// A problem at `path`.
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        SettingsProblem {
            path: path.into(),
            message: message.into(),
        }
    }
}

impl std::fmt::Display for SettingsProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconcile_error_json_names_the_variant_in_camel_case() {
        assert_eq!(
            serde_json::to_string(&ReconcileError::not_ready("instance missing")).unwrap(),
            r#"{"notReady":"instance missing"}"#
        );
        assert_eq!(
            ReconcileError::invalid_spec("x").to_string(),
            "invalid spec: x"
        );
    }
}
