//! Reporting on the primary: Events, and the `Reconciled=False` condition
//! of a failed reconcile.
//!
//! # Guarantees
//!
//! - Event notes are cut to the API server's limit of 1,024 bytes
//!   ([`MAX_EVENT_NOTE`]) and reasons at 128 characters; condition messages
//!   to [`MAX_CONDITION_MESSAGE`] bytes, below the API server's limit of
//!   32,768; each cut at a character boundary, with a note of how much was
//!   left out that fits within the limit.
//! - A failure is written only while this replica leads; Events too.
//! - Repeats of one Event (same type, reason, note and object) are one
//!   Event with a count; an Event whose note changed is a new Event
//!   ([`event_action`]).

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder};
use serde_json::{Value, json};

use crate::conditions;
use crate::execute::RECONCILED_CONDITION;
use crate::execute::writer::Writer;
use crate::object::{self, describe};

/// Longest condition message written, in bytes.
pub const MAX_CONDITION_MESSAGE: usize = 8192;

/// Longest Event note written, in bytes: the API server's limit.
pub const MAX_EVENT_NOTE: usize = 1024;

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
        let note = cap(message, MAX_EVENT_NOTE);
        let ev = KubeEvent {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.chars().take(128).collect(),
            action: event_action(&note),
            note: Some(note),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, &reference).await {
            tracing::warn!(object = %describe(primary), error = %e, "could not record an Event");
        }
    }
}

/// The Event's `action`: `Reconcile`, and a digest of the note.
///
/// The recorder folds an Event into an earlier one of the same type,
/// reason, action and object (a series, counted) and keeps the earlier
/// note: with the same action for every note, a PlanRejected Warning whose
/// reason changed would go on showing the first one in `kubectl describe`
/// for the recorder's six minutes. With the note's digest in the action,
/// only repeats of the same note are folded, as client-go's recorder does
/// (its key includes the note).
pub fn event_action(note: &str) -> String {
    // FNV-1a: stable across runs and versions, unlike the std hasher.
    let digest = note.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("Reconcile/{:08x}", digest >> 32)
}

/// `text` in at most `max` bytes (the API server counts bytes): cut at a
/// character boundary, with a note of how many characters were left out,
/// the note included in `max`.
pub fn cap(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    // Room for "… (N more characters left out)" with N of up to 13 digits.
    const NOTE: usize = 48;
    let budget = max.saturating_sub(NOTE);
    let mut end = 0;
    let mut kept = 0;
    for (i, c) in text.char_indices() {
        if i + c.len_utf8() > budget {
            break;
        }
        end = i + c.len_utf8();
        kept += 1;
    }
    let left = text.chars().count() - kept;
    format!("{}… ({left} more characters left out)", &text[..end])
}

/// `primary`'s status with `Reconciled=False` for `reason` and `message`
/// at its generation: what [`failure`] writes, and what `wasmop check`'s
/// model writes for a failed reconcile.
pub fn failed_status(primary: &Value, reason: &str, message: &str, now: &str) -> Value {
    let mut status = primary["status"].clone();
    if !status.is_object() {
        status = json!({});
    }
    conditions::set(
        &mut status,
        RECONCILED_CONDITION,
        "False",
        reason,
        message,
        primary["metadata"]["generation"].as_i64(),
        now,
    );
    status
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
    let status = failed_status(primary, reason, &message, now);
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
        assert!(capped.len() <= MAX_CONDITION_MESSAGE);
        assert!(
            capped.ends_with("(31856 more characters left out)"),
            "{capped}"
        );
    }

    #[test]
    fn events_fold_only_repeats_of_the_same_note() {
        let a = event_action("plan rejected: ConfigMap a exists");
        assert_eq!(a, event_action("plan rejected: ConfigMap a exists"));
        assert_ne!(a, event_action("plan rejected: ConfigMap b exists"));
        assert!(a.starts_with("Reconcile/") && a.len() == "Reconcile/".len() + 8);
        assert!(event_action(&"x".repeat(5_000)).len() <= 128);
    }

    #[test]
    fn an_event_note_fits_the_api_servers_limit_in_bytes_whatever_its_characters() {
        // Just over the limit, and far over it in three-byte characters:
        // the API server refuses a note of more than 1,024 bytes.
        for text in ["y".repeat(1_025), "…".repeat(2_000), "ab…".repeat(700)] {
            let capped = cap(&text, MAX_EVENT_NOTE);
            assert!(capped.len() <= MAX_EVENT_NOTE, "{} bytes", capped.len());
            assert!(capped.ends_with("more characters left out)"), "{capped}");
            let kept = capped.split("… (").next().unwrap_or_default();
            assert!(text.starts_with(kept), "a prefix of the text is kept");
            let left: usize = capped
                .rsplit("… (")
                .next()
                .and_then(|t| t.split(' ').next())
                .and_then(|n| n.parse().ok())
                .expect("a count");
            assert_eq!(kept.chars().count() + left, text.chars().count());
        }
        assert_eq!(cap(&"z".repeat(1_024), MAX_EVENT_NOTE), "z".repeat(1_024));
    }
}
