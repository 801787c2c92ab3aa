//! Reporting on the primary: Events, and the `Reconciled=False` condition
//! of a failed reconcile.
//!
//! # Guarantees
//!
//! - Event notes are cut at 1,000 characters and reasons at 128; condition
//!   messages at [`MAX_CONDITION_MESSAGE`] characters, below the API
//!   server's limit of 32,768, with a note of how much was left out.
//! - A failure is written only while this replica leads; Events too.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder};
use serde_json::{Value, json};

use crate::conditions;
use crate::execute::RECONCILED_CONDITION;
use crate::execute::writer::Writer;
use crate::object::{self, describe};

/// Longest condition message written, in characters.
pub const MAX_CONDITION_MESSAGE: usize = 8192;

/// Records Events on primaries.
#[derive(Clone)]
pub struct Reporter {
    recorder: Recorder,
}

impl std::fmt::Debug for Reporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Reporter")
    }
}

impl Reporter {
    /// Events reported as `controller` (and `POD_NAME` as instance).
    pub fn new(client: Client, controller: &str) -> Self {
        let reporter = kube::runtime::events::Reporter {
            controller: controller.to_owned(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Reporter {
            recorder: Recorder::new(client, reporter),
        }
    }

    /// Records an Event on `primary`; a failure to record is logged.
    pub async fn event(&self, primary: &Value, warning: bool, reason: &str, message: &str) {
        let reference = ObjectReference {
            api_version: primary["apiVersion"].as_str().map(String::from),
            kind: primary["kind"].as_str().map(String::from),
            name: primary["metadata"]["name"].as_str().map(String::from),
            namespace: object::namespace(primary).map(String::from),
            uid: primary["metadata"]["uid"].as_str().map(String::from),
            ..ObjectReference::default()
        };
        let ev = KubeEvent {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.chars().take(128).collect(),
            note: Some(cap(message, 1000)),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, &reference).await {
            tracing::warn!(object = %describe(primary), error = %e, "could not record an Event");
        }
    }
}

/// `text` cut to `max` characters, with a note of how many were left out.
pub fn cap(text: &str, max: usize) -> String {
    let total = text.chars().count();
    if total <= max {
        return text.to_owned();
    }
    let mut out: String = text.chars().take(max).collect();
    out.push_str(&format!("… ({} more characters left out)", total - max));
    out
}

/// Writes `Reconciled=False` with `reason` and `message` on `primary`
/// (when it changed) and records a Warning Event.
pub async fn failure(
    writer: &Writer,
    resource: &kube::api::ApiResource,
    reporter: &Reporter,
    primary: &Value,
    reason: &str,
    message: &str,
    now: &str,
) {
    let message = cap(message, MAX_CONDITION_MESSAGE);
    let mut status = primary["status"].clone();
    if !status.is_object() {
        status = json!({});
    }
    conditions::set(
        &mut status,
        RECONCILED_CONDITION,
        "False",
        reason,
        &message,
        primary["metadata"]["generation"].as_i64(),
        now,
    );
    if status != primary["status"]
        && let Err(e) = writer.write_status(resource, primary, &status).await
    {
        tracing::warn!(object = %describe(primary), error = %e, "could not write the failure condition");
    }
    reporter.event(primary, true, reason, &message).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_messages_are_cut_with_a_note_of_what_was_left_out() {
        assert_eq!(cap("short", 10), "short");
        let long = "x".repeat(40_000);
        let capped = cap(&long, MAX_CONDITION_MESSAGE);
        assert!(capped.len() < 32_768);
        assert!(
            capped.ends_with("(31808 more characters left out)"),
            "{capped}"
        );
    }
}
