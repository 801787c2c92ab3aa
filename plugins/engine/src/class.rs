//! One reconcile of a FireboltEngineClass: `status.boundEngines`, the
//! number of FireboltEngines in the class's namespace whose
//! `spec.engineClassRef` names it, and a `Ready` condition.
//!
//! The class creates nothing. Its deletion is guarded twice: by the
//! validating webhook [`crate::admission::CLASS_IN_USE_RULE`] when the
//! operator serves admission (it lists referencing engines live), and,
//! webhook or not, by the finalizer [`DELETION_GUARD`] (upstream's name):
//! a class being deleted while engines reference it stays, with
//! `Ready=False/DeletionBlocked` naming them and a Warning Event, and goes
//! once none does (engines being deleted do not count). Its engines keep
//! using it meanwhile.

use serde_json::{Value, json};
use wasmop_sdk::conditions::{conditions_of, set_condition};
use wasmop_sdk::{Plan, ReconcileError, Snapshot};

use crate::ENGINES_READ;

/// The finalizer that holds a class while engines reference it.
pub const DELETION_GUARD: &str = "compute.firebolt.io/fireboltengineclass-deletion-guard";

/// Engines named in a `DeletionBlocked` message at most.
pub const NAMED_AT_MOST: usize = 10;

/// Reconciles the class in `snapshot`.
///
/// # Errors
///
/// [`ReconcileError::Internal`] when the snapshot time is invalid.
pub fn reconcile(snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
    let name = snapshot.primary_name();
    let mut bound: Vec<&str> = snapshot
        .related(ENGINES_READ)
        .filter(|e| e.pointer("/spec/engineClassRef").and_then(Value::as_str) == Some(name))
        .filter(|e| e.pointer("/metadata/deletionTimestamp").is_none())
        .filter_map(|e| e.pointer("/metadata/name").and_then(Value::as_str))
        .collect();
    bound.sort_unstable();
    if snapshot.deleting && bound.is_empty() {
        return Ok(Plan::new().cleanup_complete());
    }
    let mut conditions = conditions_of(&snapshot.primary);
    let mut plan = Plan::new();
    if snapshot.deleting {
        let mut named = bound
            .iter()
            .take(NAMED_AT_MOST)
            .copied()
            .collect::<Vec<_>>()
            .join(", ");
        if bound.len() > NAMED_AT_MOST {
            named.push_str(&format!(" and {} more", bound.len() - NAMED_AT_MOST));
        }
        let message = format!(
            "deletion waits until no FireboltEngine references this class; {} do: {named}",
            bound.len()
        );
        let already = conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.reason == "DeletionBlocked" && c.message == message);
        if !already {
            plan = plan.warning("DeletionBlocked", message.clone());
        }
        set_condition(
            &mut conditions,
            "Ready",
            false,
            "DeletionBlocked",
            &message,
            snapshot.primary_generation(),
            &snapshot.now()?,
        );
    } else {
        set_condition(
            &mut conditions,
            "Ready",
            true,
            "Admissible",
            &format!("bound to {} engine(s)", bound.len()),
            snapshot.primary_generation(),
            &snapshot.now()?,
        );
    }
    let mut status = snapshot.primary["status"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    status.insert("boundEngines".into(), json!(bound.len()));
    status.insert("conditions".into(), json!(conditions));
    let status = Value::Object(status);
    if status != snapshot.primary["status"] {
        plan = plan.status(status);
    }
    Ok(plan)
}
