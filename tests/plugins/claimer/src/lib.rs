//! Test plugin `claimer`: well-formed, but its primary kind is `Widget`,
//! which the `good` plugin reconciles. Loading both must be refused.

use serde_json::Value;
use wasmop_sdk::k8s_openapi::api::core::v1::ConfigMap;
use wasmop_sdk::{
    Controller, KindRef, Manifest, Plan, Plugin, ReconcileError, SettingsProblem, Snapshot,
};

/// The `claimer` plugin.
#[derive(Debug)]
pub struct Claimer;

impl Plugin for Claimer {
    fn manifest() -> Manifest {
        Manifest::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")).controller(
            Controller::new(
                "widget",
                KindRef::namespaced("test.wasmop.dev", "v1", "Widget", "widgets"),
            )
            .owns(KindRef::of::<ConfigMap>()),
        )
    }

    fn validate_settings(_settings: &Value) -> Result<(), Vec<SettingsProblem>> {
        Ok(())
    }

    fn reconcile(_snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
        Ok(Plan::new())
    }
}

#[cfg(target_arch = "wasm32")]
wasmop_sdk::export_plugin!(Claimer);
