//! The guest side of the WIT boundary: the snapshot's WIT records into the
//! SDK's [`Snapshot`], and what the plugin returns (manifest, settings
//! problems, plan) into the JSON text the contract defines.
//!
//! Objects are `serde_json::Value` on the native side and JSON text on the
//! WIT side. WIT → native parses JSON text and fails with
//! [`ReconcileError::Internal`] naming the field. Native → JSON never fails
//! for the contract's types (their map keys are strings).

use serde::Serialize;
use serde_json::Value;

use crate::raw as wit;
use crate::{Observation, Plugin, ReconcileError, RelatedObject, SettingsProblem, Snapshot};

/// In a component, makes a panic's text reach the host (WIT
/// `diagnostics.panic-text`) before the call traps, so the reconcile's
/// error says what went wrong: a plugin built for `wasm32-unknown-unknown`
/// has no stderr, and one built for `wasm32-wasip2` reports the same way.
/// Called at the start of every export; each call is a new instance, whose
/// hook is the standard library's until then. Natively it does nothing
/// (the host process's hook stays).
pub(crate) fn report_panics() {
    #[cfg(target_arch = "wasm32")]
    std::panic::set_hook(Box::new(|info| {
        let location = info.location().map(|l| (l.file(), l.line(), l.column()));
        let payload = info.payload_as_str().unwrap_or("Box<dyn Any>");
        for (bytes, len) in panic_words(&panic_text(location, payload)) {
            crate::bindings::wasmop::reconciler::diagnostics::panic_text(bytes, len);
        }
    }));
}

/// The text the host shows for a panic, as the standard library's hook
/// prints it (without the thread's name).
#[cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]
pub(crate) fn panic_text(location: Option<(&str, u32, u32)>, payload: &str) -> String {
    match location {
        Some((file, line, column)) => format!("panicked at {file}:{line}:{column}:\n{payload}\n"),
        None => format!("panicked:\n{payload}\n"),
    }
}

/// `text` as the words `diagnostics.panic-text` takes: up to 8 bytes each,
/// the first byte lowest, with their count.
#[cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]
pub(crate) fn panic_words(text: &str) -> impl Iterator<Item = (u64, u8)> + '_ {
    text.as_bytes().chunks(8).map(|chunk| {
        let mut word = [0u8; 8];
        word[..chunk.len()].copy_from_slice(chunk);
        // A chunk holds at most 8 bytes.
        (u64::from_le_bytes(word), chunk.len() as u8)
    })
}

/// JSON text of a contract value (serde_json's text, written by
/// [`crate::json`]).
pub(crate) fn json_text(value: &impl Serialize) -> String {
    // The contract's types always serialize: every map key is a string.
    crate::json::to_string(value)
        .unwrap_or_else(|e| panic!("wasmop-sdk: contract value does not serialize to JSON: {e}"))
}

fn parse(what: impl FnOnce() -> String, text: &str) -> Result<Value, ReconcileError> {
    serde_json::from_str(text)
        .map_err(|e| ReconcileError::internal(format!("{} is not valid JSON: {e}", what())))
}

impl From<ReconcileError> for wit::ReconcileError {
    fn from(e: ReconcileError) -> Self {
        match e {
            ReconcileError::InvalidSpec(m) => wit::ReconcileError::InvalidSpec(m),
            ReconcileError::NotReady(m) => wit::ReconcileError::NotReady(m),
            ReconcileError::Internal(m) => wit::ReconcileError::Internal(m),
        }
    }
}

impl From<wit::ReconcileError> for ReconcileError {
    fn from(e: wit::ReconcileError) -> Self {
        match e {
            wit::ReconcileError::InvalidSpec(m) => ReconcileError::InvalidSpec(m),
            wit::ReconcileError::NotReady(m) => ReconcileError::NotReady(m),
            wit::ReconcileError::Internal(m) => ReconcileError::Internal(m),
        }
    }
}

/// An observation as the snapshot carries it: the body as bytes.
pub(crate) fn observation_to_wit(o: Observation) -> wit::Observation {
    wit::Observation {
        id: o.id,
        status: o.status,
        body: o.body.into_bytes(),
        error: o.error,
        observed_at: o.observed_at,
        age_ms: o.age_ms,
    }
}

/// An observation from the snapshot: bytes that are not UTF-8 are replaced,
/// not dropped. Its outcome comes from the snapshot's
/// [`wasmop_contract::OBSERVATION_OUTCOMES_READ`] object, if any.
pub(crate) fn observation_from_wit(o: wit::Observation) -> Observation {
    Observation {
        id: o.id,
        status: o.status,
        body: match String::from_utf8(o.body) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        },
        error: o.error,
        observed_at: o.observed_at,
        age_ms: o.age_ms,
        outcome: None,
    }
}

impl From<Snapshot> for wit::Snapshot {
    fn from(s: Snapshot) -> Self {
        wit::Snapshot {
            controller: s.controller,
            primary: json_text(&s.primary),
            owned: s.owned.iter().map(json_text).collect(),
            related: s
                .related
                .into_iter()
                .map(|r| wit::RelatedObject {
                    object: json_text(&r.object),
                    read: r.read,
                })
                // As the host sends the observations' outcomes.
                .chain(
                    wasmop_contract::observation::outcomes_object(&s.observations).map(|o| {
                        wit::RelatedObject {
                            read: wasmop_contract::OBSERVATION_OUTCOMES_READ.to_owned(),
                            object: json_text(&o),
                        }
                    }),
                )
                .collect(),
            now: s.now,
            deleting: s.deleting,
            settings: json_text(&s.settings),
            observations: s.observations.into_iter().map(observation_to_wit).collect(),
        }
    }
}

impl TryFrom<wit::Snapshot> for Snapshot {
    type Error = ReconcileError;

    fn try_from(s: wit::Snapshot) -> Result<Self, ReconcileError> {
        // Each text is freed as soon as it is parsed, so the next object's
        // nodes reuse its memory: in a component, every page a call touches
        // is reset after the call, and fewer pages touched is less to reset.
        let owned = s
            .owned
            .into_iter()
            .enumerate()
            .map(|(i, o)| parse(|| format!("snapshot owned[{i}]"), &o))
            .collect::<Result<_, _>>()?;
        let mut related: Vec<RelatedObject> = s
            .related
            .into_iter()
            .enumerate()
            .map(|(i, r)| {
                Ok(RelatedObject {
                    object: parse(|| format!("snapshot related[{i}] ({})", r.read), &r.object)?,
                    read: r.read,
                })
            })
            .collect::<Result<_, ReconcileError>>()?;
        let mut observations: Vec<Observation> = s
            .observations
            .into_iter()
            .map(observation_from_wit)
            .collect();
        // The observations' typed outcomes cross as a related object; they
        // go onto the observations and out of `related`.
        related.retain(|r| {
            let outcomes = r.read == wasmop_contract::OBSERVATION_OUTCOMES_READ;
            if outcomes {
                wasmop_contract::observation::apply_outcomes(&mut observations, &r.object);
            }
            !outcomes
        });
        Ok(Snapshot {
            controller: s.controller,
            primary: parse(|| "snapshot primary".to_owned(), &s.primary)?,
            owned,
            related,
            now: s.now,
            deleting: s.deleting,
            settings: parse(|| "snapshot settings".to_owned(), &s.settings)?,
            observations,
        })
    }
}

impl From<crate::admission::AdmissionRequest> for wit::AdmissionRequest {
    fn from(r: crate::admission::AdmissionRequest) -> Self {
        wit::AdmissionRequest {
            rule: r.rule,
            request: json_text(&r.request),
            related: r
                .related
                .into_iter()
                .map(|o| wit::RelatedObject {
                    object: json_text(&o.object),
                    read: o.read,
                })
                .collect(),
            now: r.now,
            settings: json_text(&r.settings),
        }
    }
}

impl TryFrom<wit::AdmissionRequest> for crate::admission::AdmissionRequest {
    type Error = String;

    fn try_from(r: wit::AdmissionRequest) -> Result<Self, String> {
        let json = |what: String, text: &str| {
            serde_json::from_str::<Value>(text)
                .map_err(|e| format!("{what} is not valid JSON: {e}"))
        };
        let related = r
            .related
            .into_iter()
            .enumerate()
            .map(|(i, o)| {
                Ok(RelatedObject {
                    object: json(format!("admission related[{i}] ({})", o.read), &o.object)?,
                    read: o.read,
                })
            })
            .collect::<Result<_, String>>()?;
        Ok(crate::admission::AdmissionRequest {
            rule: r.rule,
            request: json("admission request".into(), &r.request)?,
            related,
            now: r.now,
            settings: json("admission settings".into(), &r.settings)?,
        })
    }
}

/// Parses the settings text, hands it to the plugin, and answers with the
/// JSON list of problems the contract defines.
pub(crate) fn validate_settings<P: Plugin>(settings: &str) -> Result<(), String> {
    let checked = match serde_json::from_str::<Value>(settings) {
        Ok(value) => P::validate_settings(&value),
        Err(e) => Err(vec![SettingsProblem::new(
            "",
            format!("settings are not valid JSON: {e}"),
        )]),
    };
    checked.map_err(|problems| json_text(&problems))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn snapshot_survives_a_round_trip_and_bad_json_is_internal() {
        let snapshot: Snapshot = serde_json::from_value(json!({
            "controller": "c", "primary": {"kind": "K"}, "owned": [{"kind": "A"}],
            "related": [{"read": "r", "object": {"kind": "B"}}], "now": "2025-01-01T00:00:00Z",
            "deleting": true, "settings": {"x": 1},
            "observations": [{"id": "o", "status": null, "body": "b", "error": "timeout",
                              "observedAt": "2025-01-01T00:00:00Z", "ageMs": 5}]
        }))
        .unwrap();
        let mut wit_snapshot: wit::Snapshot = snapshot.clone().into();
        assert_eq!(wit_snapshot.related[0].read, "r");
        assert_eq!(
            wit_snapshot.related.len(),
            1,
            "no outcomes, no outcome object"
        );
        assert_eq!(Snapshot::try_from(wit_snapshot.clone()).unwrap(), snapshot);

        // With an outcome: one more related object across the boundary,
        // back on the observation and out of `related` on the other side.
        let mut with_outcome = snapshot.clone();
        with_outcome.observations[0].outcome = Some(crate::contract::ObservationOutcome::TimedOut);
        let crossed: wit::Snapshot = with_outcome.clone().into();
        assert_eq!(crossed.related.len(), 2);
        assert_eq!(
            crossed.related[1].read,
            crate::contract::OBSERVATION_OUTCOMES_READ
        );
        assert_eq!(Snapshot::try_from(crossed).unwrap(), with_outcome);

        wit_snapshot.owned[0] = "[".into();
        assert!(matches!(
            Snapshot::try_from(wit_snapshot),
            Err(ReconcileError::Internal(m)) if m.starts_with("snapshot owned[0] is not valid JSON")
        ));
    }

    #[test]
    fn observation_bodies_that_are_not_utf8_are_replaced_not_dropped() {
        let o = observation_from_wit(wit::Observation {
            id: "o".into(),
            status: Some(200),
            body: vec![b'o', b'k', 0xff],
            error: None,
            observed_at: String::new(),
            age_ms: 0,
        });
        assert_eq!(o.body, "ok\u{fffd}");
    }

    #[test]
    fn errors_keep_their_variant_across_the_boundary() {
        let e: wit::ReconcileError = ReconcileError::not_ready("later").into();
        assert!(matches!(e, wit::ReconcileError::NotReady(ref m) if m == "later"));
        assert_eq!(ReconcileError::from(e), ReconcileError::not_ready("later"));
    }

    struct Picky;

    impl Plugin for Picky {
        fn manifest() -> crate::Manifest {
            crate::Manifest::new("picky", "0.1.0")
        }
        fn validate_settings(settings: &Value) -> Result<(), Vec<SettingsProblem>> {
            crate::settings::only_keys(settings, &["a"])
        }
        fn reconcile(_: &Snapshot) -> Result<crate::Plan, ReconcileError> {
            Ok(crate::Plan::new())
        }
    }

    #[test]
    fn settings_problems_cross_as_the_contracts_json_list() {
        assert_eq!(validate_settings::<Picky>(r#"{"a":1}"#), Ok(()));
        let problems: Vec<SettingsProblem> =
            serde_json::from_str(&validate_settings::<Picky>(r#"{"b":1}"#).unwrap_err()).unwrap();
        assert_eq!(problems[0].path, "b");
        let not_json: Vec<SettingsProblem> =
            serde_json::from_str(&validate_settings::<Picky>("{").unwrap_err()).unwrap();
        assert!(
            not_json[0]
                .message
                .starts_with("settings are not valid JSON")
        );
    }

    #[test]
    fn a_panic_crosses_as_words_of_up_to_eight_bytes() {
        let text = panic_text(Some(("src/lib.rs", 5, 9)), "über 8 bytes: ✓");
        assert_eq!(text, "panicked at src/lib.rs:5:9:\nüber 8 bytes: ✓\n");
        assert_eq!(panic_text(None, "x"), "panicked:\nx\n");
        let words: Vec<(u64, u8)> = panic_words(&text).collect();
        assert_eq!(words.len(), text.len().div_ceil(8));
        assert!(words[..words.len() - 1].iter().all(|&(_, len)| len == 8));
        assert_eq!(
            usize::from(words[words.len() - 1].1),
            (text.len() - 1) % 8 + 1
        );
        // What the host does with them: the first `len` bytes, low first.
        let mut back = Vec::new();
        for (bytes, len) in words {
            back.extend_from_slice(&bytes.to_le_bytes()[..usize::from(len)]);
        }
        assert_eq!(String::from_utf8(back).unwrap(), text);
        assert_eq!(panic_words("").count(), 0);
    }
}
