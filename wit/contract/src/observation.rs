//! The result of an HTTP request an earlier plan declared: [`Observation`].

use serde::{Deserialize, Serialize};

use crate::ReconcileError;

/// The result of an HTTP request an earlier plan declared, as a snapshot
/// carries it.
///
/// JSON (also the `items` of a `wasmop.dev/v1 Observations` fixture
/// document): `{"id","status":200|null,"body":"text","error":null|"…",
/// "observedAt","ageMs","outcome"?}`.
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
    /// What became of the request, as the host classified it (later
    /// addition to 0.4.0); `None` from a host before it, or a fixture
    /// without it. Read this, not the words of `error`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<ObservationOutcome>,
}

/// What became of a declared HTTP request (JSON: the variant's name).
///
/// It crosses the WIT boundary, whose `observation` record has no field for
/// it, as one related object under [`crate::OBSERVATION_OUTCOMES_READ`]:
/// `{"apiVersion":"wasmop.dev/v1","kind":"ObservationOutcomes",
/// "metadata":{"name":"outcomes"},"outcomes":{"<id>":"<outcome>",…}}`; the
/// SDK moves it onto the observations. A plugin built before it sees one
/// more related object under a read id it never declared, and the same
/// observations as before.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ObservationOutcome {
    /// The whole response arrived (any status).
    Complete,
    /// The response body exceeded the request's byte cap; `body` holds the
    /// first cap bytes.
    Oversized,
    /// The deadline passed before the response was complete.
    TimedOut,
    /// No usable response: connection or protocol error, or the request
    /// was refused before sending.
    Failed,
    /// An outcome this build does not know (from a newer host).
    #[serde(other)]
    Other,
}

impl ObservationOutcome {
    /// The JSON name.
    pub fn as_str(self) -> &'static str {
        match self {
            ObservationOutcome::Complete => "Complete",
            ObservationOutcome::Oversized => "Oversized",
            ObservationOutcome::TimedOut => "TimedOut",
            ObservationOutcome::Failed => "Failed",
            ObservationOutcome::Other => "Other",
        }
    }
}

/// The related object carrying `observations`' outcomes across the WIT
/// boundary (see [`ObservationOutcome`]); `None` when none has one.
pub fn outcomes_object(observations: &[Observation]) -> Option<serde_json::Value> {
    let outcomes: serde_json::Map<String, serde_json::Value> = observations
        .iter()
        .filter_map(|o| Some((o.id.clone(), o.outcome?.as_str().into())))
        .collect();
    (!outcomes.is_empty()).then(|| {
        serde_json::json!({
            "apiVersion": "wasmop.dev/v1",
            "kind": "ObservationOutcomes",
            "metadata": {"name": "outcomes"},
            "outcomes": outcomes,
        })
    })
}

/// Sets each observation's outcome from a related object made by
/// [`outcomes_object`]; entries that do not parse, or name no observation,
/// are ignored.
pub fn apply_outcomes(observations: &mut [Observation], object: &serde_json::Value) {
    let Some(outcomes) = object["outcomes"].as_object() else {
        return;
    };
    for o in observations.iter_mut() {
        if let Some(v) = outcomes.get(&o.id)
            && let Ok(outcome) = serde_json::from_value::<ObservationOutcome>(v.clone())
        {
            o.outcome = Some(outcome);
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(id: &str, outcome: Option<ObservationOutcome>) -> Observation {
        Observation {
            id: id.into(),
            status: None,
            body: String::new(),
            error: None,
            observed_at: "2026-01-01T00:00:00Z".into(),
            age_ms: 0,
            outcome,
        }
    }

    #[test]
    fn outcomes_cross_as_one_object_and_come_back() {
        let sent = [
            obs("a", Some(ObservationOutcome::Oversized)),
            obs("b", None),
            obs("c", Some(ObservationOutcome::TimedOut)),
        ];
        let object = outcomes_object(&sent).unwrap();
        assert_eq!(
            object["outcomes"],
            serde_json::json!({"a": "Oversized", "c": "TimedOut"})
        );
        let mut got = [obs("a", None), obs("b", None), obs("c", None)];
        apply_outcomes(&mut got, &object);
        assert_eq!(got, sent);
        assert!(outcomes_object(&[obs("x", None)]).is_none());
    }

    #[test]
    fn an_unknown_outcome_is_other_and_a_malformed_object_is_ignored() {
        let mut got = [obs("a", None)];
        apply_outcomes(
            &mut got,
            &serde_json::json!({"outcomes": {"a": "Teleported"}}),
        );
        assert_eq!(got[0].outcome, Some(ObservationOutcome::Other));
        let mut got = [obs("a", None)];
        apply_outcomes(&mut got, &serde_json::json!({"outcomes": {"a": 7}}));
        apply_outcomes(&mut got, &serde_json::json!({"outcomes": []}));
        assert_eq!(got[0].outcome, None);
        // Old JSON without the field still parses.
        let old: Observation = serde_json::from_str(
            r#"{"id":"a","status":200,"body":"","error":null,"observedAt":"t","ageMs":1}"#,
        )
        .unwrap();
        assert_eq!(old.outcome, None);
        assert!(!serde_json::to_string(&old).unwrap().contains("outcome"));
    }
}
