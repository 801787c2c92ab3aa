//! Test plugin `bad-manifest`: its controller owns its own primary kind,
//! which the host's manifest checks reject at load.

use serde_json::Value;
use wasmop_sdk::{
    Controller, KindRef, Manifest, Plan, Plugin, ReconcileError, SettingsProblem, Snapshot,
};

/// The `bad-manifest` plugin.
#[derive(Debug)]
pub struct BadManifest;

impl Plugin for BadManifest {
    fn manifest() -> Manifest {
        let widget = KindRef::namespaced("test.wasmop.dev", "v1", "Widget", "widgets");
        Manifest::new("good", "9.9.9")
            .controller(Controller::new("widget", widget.clone()).owns(widget))
    }

    fn validate_settings(_settings: &Value) -> Result<(), Vec<SettingsProblem>> {
        Ok(())
    }

    fn reconcile(_snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
        Ok(Plan::new())
    }
}

#[cfg(target_arch = "wasm32")]
wasmop_sdk::export_plugin!(BadManifest);
