//! One reconcile of a FireboltEngineClass: `status.boundEngines`, the
//! number of FireboltEngines in the class's namespace whose
//! `spec.engineClassRef` names it, and a `Ready` condition.
//!
//! The class creates nothing. Its deletion is guarded by the validating
//! webhook [`crate::admission::CLASS_IN_USE_RULE`], which lists
//! referencing engines live (not this cached count). Should a class
//! disappear anyway (admission off), an engine reports it on its `Ready`
//! condition and keeps serving its current generation.

use serde_json::{Value, json};
use wasmop_sdk::conditions::{conditions_of, set_condition};
use wasmop_sdk::{Plan, ReconcileError, Snapshot};

use crate::ENGINES_READ;

/// Reconciles the class in `snapshot`.
///
/// # Errors
///
/// [`ReconcileError::Internal`] when the snapshot time is invalid.
pub fn reconcile(snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
    if snapshot.deleting {
        return Ok(Plan::new());
    }
    let name = snapshot.primary_name();
    let bound = snapshot
        .related(ENGINES_READ)
        .filter(|e| e.pointer("/spec/engineClassRef").and_then(Value::as_str) == Some(name))
        .filter(|e| e.pointer("/metadata/deletionTimestamp").is_none())
        .count();
    let mut conditions = conditions_of(&snapshot.primary);
    set_condition(
        &mut conditions,
        "Ready",
        true,
        "Admissible",
        &format!("bound to {bound} engine(s)"),
        snapshot.primary_generation(),
        &snapshot.now()?,
    );
    let mut status = snapshot.primary["status"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    status.insert("boundEngines".into(), json!(bound));
    status.insert("conditions".into(), json!(conditions));
    let status = Value::Object(status);
    Ok(if status == snapshot.primary["status"] {
        Plan::new()
    } else {
        Plan::new().status(status)
    })
}
