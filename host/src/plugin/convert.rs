//! Crossing the plugin boundary: the snapshot into its WIT record, and the
//! plugin's JSON answers (manifest, settings problems, plan) into the
//! contract's types — or an [`OutputProblem`].
//!
//! # Guarantees
//!
//! - What a plugin returns is one JSON text, already bounded by the
//!   plugin's memory when wasmtime lifts it. Before parsing, the text's size
//!   and the number of JSON values it holds are checked against
//!   [`MAX_OUTPUT_BYTES`] and [`MAX_OUTPUT_VALUES`], so the parsed form is
//!   bounded too: nothing a plugin returns makes the host allocate more
//!   than its memory cap plus a fixed allowance.
//! - A plan whose applied objects, status or primary patch are not JSON
//!   objects (or whose objects lack an identity) is refused as a whole.

use serde::de::DeserializeOwned;
use serde_json::Value;
use thiserror::Error;

use crate::contract::bindings::types as wit;
use crate::contract::manifest::Manifest;
use crate::judge::snapshot::Snapshot;
use crate::judge::validate::Plan;
use crate::object;
use wasmop_contract::SettingsProblem;

/// Largest JSON text a plugin may return, in bytes.
pub const MAX_OUTPUT_BYTES: usize = 8 << 20;

/// Most JSON values (objects, arrays, strings, numbers, literals) a plugin's
/// answer may hold. Each parsed value costs the host a few dozen bytes, so
/// this bounds the parsed form of a text that is small but dense
/// (`[[],[],…]`).
pub const MAX_OUTPUT_VALUES: usize = 250_000;

/// What is wrong with a plugin's output.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum OutputProblem {
    /// The text does not parse as the contract's JSON.
    #[error("{field} is not valid JSON of the contract ({reason})")]
    NotJson {
        /// What was parsed: `plan`, `manifest`, `settings problems`.
        field: String,
        /// The parser's complaint, with line and column.
        reason: String,
    },
    /// A JSON value parses but is not a JSON object.
    #[error("{field} is not a JSON object")]
    NotAnObject {
        /// Where in the plan, e.g. `apply[0].object`.
        field: String,
    },
    /// The plan's shape does not fit the controller's scope: `objects` in
    /// a per-object plan, or anything but `objects` in a kind plan.
    #[error("{0}")]
    WrongScope(String),
    /// An applied object lacks part of its identity.
    #[error("{field} has no {missing}")]
    MissingIdentity {
        /// Where in the plan.
        field: String,
        /// `apiVersion`, `kind` or `metadata.name`.
        missing: &'static str,
    },
    /// The text is larger than [`MAX_OUTPUT_BYTES`].
    #[error("the {field} holds {bytes} bytes, more than the limit of {limit}")]
    TooLarge {
        /// What was returned.
        field: String,
        /// Bytes of text.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
    /// The text holds more than [`MAX_OUTPUT_VALUES`] JSON values.
    #[error("the {field} holds more than {limit} JSON values")]
    TooManyValues {
        /// What was returned.
        field: String,
        /// The limit.
        limit: usize,
    },
}

/// An upper bound of the number of JSON values in `text`: every value but
/// the first follows a `,`, `:`, `[` or `{` outside a string. Linear, with
/// no allocation.
pub fn json_value_bound(text: &str) -> usize {
    let mut count = 1usize;
    let mut in_string = false;
    let mut escaped = false;
    for b in text.bytes() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
        } else {
            match b {
                b'"' => in_string = true,
                b',' | b':' | b'[' | b'{' => count += 1,
                _ => {}
            }
        }
    }
    count
}

/// Parses a plugin's JSON answer into `T` after checking its size and value
/// count.
fn parse_bounded<T: DeserializeOwned>(field: &str, text: &str) -> Result<T, OutputProblem> {
    if text.len() > MAX_OUTPUT_BYTES {
        return Err(OutputProblem::TooLarge {
            field: field.to_owned(),
            bytes: text.len(),
            limit: MAX_OUTPUT_BYTES,
        });
    }
    if json_value_bound(text) > MAX_OUTPUT_VALUES {
        return Err(OutputProblem::TooManyValues {
            field: field.to_owned(),
            limit: MAX_OUTPUT_VALUES,
        });
    }
    serde_json::from_str(text).map_err(|e| OutputProblem::NotJson {
        field: field.to_owned(),
        reason: e.to_string(),
    })
}

/// The plugin's manifest from its JSON text.
pub(crate) fn manifest_from_json(text: &str) -> Result<Manifest, OutputProblem> {
    parse_bounded("manifest", text)
}

/// The settings problems from their JSON text; text that is not the
/// contract's list is itself reported as one problem, so a broken answer
/// still rejects the load.
pub(crate) fn settings_problems_from_json(text: &str) -> Vec<SettingsProblem> {
    match parse_bounded::<Vec<SettingsProblem>>("settings problems", text) {
        Ok(problems) if !problems.is_empty() => problems,
        Ok(_) => vec![SettingsProblem::new(
            "",
            "the plugin rejected the settings without naming a problem",
        )],
        Err(e) => vec![SettingsProblem::new("", e.to_string())],
    }
}

fn json_text(v: &Value) -> String {
    // Serializing a `Value` cannot fail: its keys are strings.
    serde_json::to_string(v).unwrap_or_else(|_| "null".to_owned())
}

/// Bytes of JSON text a WIT snapshot hands over: its objects and settings.
pub(crate) fn wit_snapshot_bytes(s: &wit::Snapshot) -> usize {
    s.primary.len()
        + s.owned.iter().map(String::len).sum::<usize>()
        + s.related.iter().map(|r| r.object.len()).sum::<usize>()
        + s.settings.len()
}

pub(crate) fn snapshot_to_wit(s: &Snapshot) -> wit::Snapshot {
    wit::Snapshot {
        controller: s.controller.clone(),
        primary: json_text(&s.primary),
        owned: s.owned.iter().map(|o| json_text(o)).collect(),
        related: s
            .related
            .iter()
            .map(|r| wit::RelatedObject {
                read: r.read.clone(),
                object: json_text(&r.object),
            })
            // The observations' typed outcomes: the WIT record has no
            // field for them (see `ObservationOutcome`).
            .chain(
                wasmop_contract::observation::outcomes_object(&s.observations).map(|o| {
                    wit::RelatedObject {
                        read: wasmop_contract::OBSERVATION_OUTCOMES_READ.to_owned(),
                        object: json_text(&o),
                    }
                }),
            )
            .collect(),
        now: s.now.clone(),
        deleting: s.deleting,
        settings: json_text(&s.settings),
        observations: s
            .observations
            .iter()
            .map(|o| wit::Observation {
                id: o.id.clone(),
                status: o.status,
                body: o.body.as_bytes().to_vec(),
                error: o.error.clone(),
                observed_at: o.observed_at.clone(),
                age_ms: o.age_ms,
            })
            .collect(),
    }
}

fn object_field(field: String, value: &Value) -> Result<(), OutputProblem> {
    if value.is_object() {
        Ok(())
    } else {
        Err(OutputProblem::NotAnObject { field })
    }
}

/// The plugin's plan from its JSON text, checking everything the plugin
/// boundary can: size, value count, shape, object identities.
pub(crate) fn plan_from_json(text: &str) -> Result<Plan, OutputProblem> {
    let plan: Plan = parse_bounded("plan", text)?;
    check_plan_shape(&plan, "")?;
    for (i, object_plan) in plan.objects.iter().enumerate() {
        // A kind plan's object plans are checked like plans (one level:
        // nested `objects` are refused by decision, not here).
        check_plan_shape(&object_plan.plan, &format!("objects[{i}]."))?;
    }
    Ok(plan)
}

/// The shape checks of one plan; `prefix` locates it in the output.
fn check_plan_shape(plan: &Plan, prefix: &str) -> Result<(), OutputProblem> {
    for (i, op) in plan.apply.iter().enumerate() {
        let field = format!("{prefix}apply[{i}].object");
        object_field(field.clone(), &op.object)?;
        for (missing, present) in [
            ("apiVersion", !object::api_version(&op.object).is_empty()),
            ("kind", !object::kind(&op.object).is_empty()),
            ("metadata.name", !object::name(&op.object).is_empty()),
        ] {
            if !present {
                return Err(OutputProblem::MissingIdentity { field, missing });
            }
        }
    }
    if let Some(status) = &plan.status {
        object_field(format!("{prefix}status"), status)?;
    }
    if let Some(patch) = &plan.primary_patch {
        object_field(format!("{prefix}primaryPatch"), patch)?;
    }
    Ok(())
}

/// The `admit` answer from its JSON text, bounded like a plan.
pub(crate) fn admission_response_from_json(
    text: &str,
) -> Result<wasmop_contract::AdmissionResponse, OutputProblem> {
    parse_bounded("admission response", text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan_with_object(object: &str) -> String {
        format!(r#"{{"apply":[{{"object":{object}}}]}}"#)
    }

    #[test]
    fn object_text_must_be_json_objects_with_identity() {
        assert!(matches!(
            plan_from_json(&plan_with_object(r#""text""#)),
            Err(OutputProblem::NotAnObject { field }) if field == "apply[0].object"
        ));
        assert!(matches!(
            plan_from_json(&plan_with_object(
                r#"{"apiVersion":"v1","kind":"ConfigMap"}"#
            )),
            Err(OutputProblem::MissingIdentity {
                missing: "metadata.name",
                ..
            })
        ));
        let ok = plan_from_json(&plan_with_object(
            r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a"}}"#,
        ))
        .unwrap();
        assert_eq!(ok.apply.len(), 1);
    }

    #[test]
    fn text_that_is_not_the_contracts_json_names_the_parser_position() {
        let err = plan_from_json(r#"{"apply":[{"object":{"apiVersion":"#).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("plan is not valid JSON of the contract (EOF"),
            "{err}"
        );
        let err = plan_from_json(r#"{"apply":"nope"}"#).unwrap_err();
        assert!(matches!(err, OutputProblem::NotJson { .. }), "{err}");
    }

    #[test]
    fn status_and_primary_patch_must_be_objects() {
        assert_eq!(
            plan_from_json(r#"{"status":[1]}"#).unwrap_err(),
            OutputProblem::NotAnObject {
                field: "status".into()
            }
        );
        assert_eq!(
            plan_from_json(r#"{"primaryPatch":"x"}"#).unwrap_err(),
            OutputProblem::NotAnObject {
                field: "primaryPatch".into()
            }
        );
    }

    #[test]
    fn oversized_output_is_rejected_before_parsing() {
        let big = format!(r#"{{"status":{{"x":"{}"}}}}"#, "a".repeat(MAX_OUTPUT_BYTES));
        assert!(matches!(
            plan_from_json(&big),
            Err(OutputProblem::TooLarge { .. })
        ));
    }

    #[test]
    fn dense_output_is_rejected_by_its_value_count_before_parsing() {
        let dense = format!(
            r#"{{"status":{{"x":[{}]}}}}"#,
            "[],".repeat(MAX_OUTPUT_VALUES)
        );
        assert!(dense.len() < MAX_OUTPUT_BYTES);
        assert!(matches!(
            plan_from_json(&dense),
            Err(OutputProblem::TooManyValues { .. })
        ));
    }

    #[test]
    fn the_value_bound_ignores_punctuation_inside_strings() {
        assert_eq!(json_value_bound(r#""a,b:[{""#), 1);
        assert_eq!(json_value_bound(r#"{"a":"x\",y","b":[1,2]}"#), 7);
    }

    #[test]
    fn settings_problems_that_do_not_parse_still_reject() {
        let problems = settings_problems_from_json("not json");
        assert_eq!(problems.len(), 1);
        assert!(problems[0].message.contains("not valid JSON"));
        assert_eq!(settings_problems_from_json("[]").len(), 1);
    }
}
