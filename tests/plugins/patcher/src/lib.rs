//! Test plugin `patcher`: exercises `primaryPatch` against its one declared
//! primary field, `metadata.labels.app`.
//!
//! For each `Patcher` (`test.wasmop.dev/v1`):
//! - with `spec.patch` (any JSON), returns it verbatim as the plan's
//!   `primaryPatch`, so tests can ask for patches outside the declared
//!   field (a label that merely starts with `app`, an empty object);
//! - otherwise sets the label `app` to `spec.app` (default `plugin`) once:
//!   only while the primary has no `app` label, so a value someone else set
//!   meanwhile is kept.
//!
//! The status records the `app` label the snapshot saw (`status.app`).

use serde_json::{Value, json};
use wasmop_sdk::{
    Controller, KindRef, Manifest, Plan, Plugin, ReconcileError, SettingsProblem, Snapshot,
};

/// The `patcher` plugin.
#[derive(Debug)]
pub struct Patcher;

impl Plugin for Patcher {
    fn manifest() -> Manifest {
        Manifest::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")).controller(
            Controller::new(
                "patcher",
                KindRef::namespaced("test.wasmop.dev", "v1", "Patcher", "patchers"),
            )
            .primary_field("metadata.labels.app"),
        )
    }

    fn validate_settings(settings: &Value) -> Result<(), Vec<SettingsProblem>> {
        wasmop_sdk::settings::only_keys(settings, &[])
    }

    fn reconcile(snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
        if snapshot.deleting {
            return Ok(Plan::new().cleanup_complete());
        }
        let seen = snapshot
            .primary
            .pointer("/metadata/labels/app")
            .cloned()
            .unwrap_or(Value::Null);
        let plan = Plan::new().status(json!({"app": seen}));
        if let Some(patch) = snapshot
            .primary
            .pointer("/spec/patch")
            .filter(|p| !p.is_null())
        {
            return Ok(plan.primary_patch(patch.clone()));
        }
        if seen.is_null() {
            let app = snapshot
                .primary
                .pointer("/spec/app")
                .and_then(Value::as_str)
                .unwrap_or("plugin");
            return Ok(plan.primary_patch(json!({"metadata": {"labels": {"app": app}}})));
        }
        Ok(plan)
    }
}

#[cfg(target_arch = "wasm32")]
wasmop_sdk::export_plugin!(Patcher);
