//! Why a reconcile produced no plan: [`ReconcileError`].

use serde::{Deserialize, Serialize};

/// Why a reconcile produced no plan (WIT `reconcile-error`). Nothing is
/// written for an error; the host records it on the primary and retries.
///
/// JSON: `{"invalidSpec":"…"}`, `{"notReady":"…"}` or `{"internal":"…"}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(rename_all = "camelCase")]
pub enum ReconcileError {
    /// The primary's spec cannot be reconciled as written; retried when the
    /// primary changes.
    #[error("invalid spec: {0}")]
    InvalidSpec(String),
    /// Something the plugin needs is not there yet; retried with backoff.
    #[error("not ready: {0}")]
    NotReady(String),
    /// The snapshot was not what the plugin expected (a bug); retried with
    /// backoff.
    #[error("internal error: {0}")]
    Internal(String),
}

impl ReconcileError {
    /// [`ReconcileError::InvalidSpec`] with this message.
    pub fn invalid_spec(message: impl Into<String>) -> Self {
        ReconcileError::InvalidSpec(message.into())
    }

    /// [`ReconcileError::NotReady`] with this message.
    pub fn not_ready(message: impl Into<String>) -> Self {
        ReconcileError::NotReady(message.into())
    }

    /// [`ReconcileError::Internal`] with this message.
    pub fn internal(message: impl Into<String>) -> Self {
        ReconcileError::Internal(message.into())
    }

    /// The message, without the variant.
    pub fn message(&self) -> &str {
        match self {
            ReconcileError::InvalidSpec(m)
            | ReconcileError::NotReady(m)
            | ReconcileError::Internal(m) => m,
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
