//! The result of an HTTP request an earlier plan declared: [`Observation`].

use serde::{Deserialize, Serialize};

use crate::ReconcileError;

/// The result of an HTTP request an earlier plan declared, as a snapshot
/// carries it.
///
/// JSON (also the `items` of a `wasmop.dev/v1 Observations` fixture
/// document): `{"id","status":200|null,"body":"text","error":null|"…",
/// "observedAt","ageMs"}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Observation {
    /// The request's id.
    pub id: String,
    /// HTTP status code, when a response arrived.
    #[serde(default)]
    pub status: Option<u16>,
    /// Response body as text (bytes that are not UTF-8 are replaced by
    /// U+FFFD).
    #[serde(default)]
    pub body: String,
    /// Why the request failed or was cut, for a person.
    #[serde(default)]
    pub error: Option<String>,
    /// When the response was received, RFC 3339.
    pub observed_at: String,
    /// Age of the result at snapshot time, in milliseconds.
    #[serde(default)]
    pub age_ms: u64,
}

impl Observation {
    /// True when a response arrived with a 2xx status and no error.
    pub fn is_success(&self) -> bool {
        self.error.is_none() && matches!(self.status, Some(200..=299))
    }

    /// The body parsed as JSON into `T`.
    ///
    /// # Errors
    ///
    /// [`ReconcileError::NotReady`] when the body does not parse: the remote
    /// side answered something unexpected, which a later request may fix.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, ReconcileError> {
        serde_json::from_str(&self.body).map_err(|e| {
            ReconcileError::not_ready(format!(
                "observation `{}` body is not the expected JSON: {e}",
                self.id
            ))
        })
    }
}
