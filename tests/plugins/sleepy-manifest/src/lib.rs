//! Test plugin `sleepy-manifest`: `manifest()` sleeps for an hour (a WASI
//! clock wait). Loading it, at start or by hot swap, must be refused within
//! the plugin's deadline.

use std::time::Duration;

use wasmop_sdk::k8s_openapi::api::core::v1::ConfigMap;
use wasmop_sdk::serde_json::Value;
use wasmop_sdk::{
    Controller, KindRef, Manifest, Plan, Plugin, ReconcileError, SettingsProblem, Snapshot,
};

/// The `sleepy-manifest` plugin.
#[derive(Debug)]
pub struct SleepyManifest;

/// The manifest it would declare, had it not slept first.
pub fn declared() -> Manifest {
    Manifest::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")).controller(
        Controller::new(
            "sleeper",
            KindRef::namespaced("test.wasmop.dev", "v1", "Sleeper", "sleepers"),
        )
        .owns(KindRef::of::<ConfigMap>()),
    )
}

impl Plugin for SleepyManifest {
    fn manifest() -> Manifest {
        std::thread::sleep(Duration::from_secs(3600));
        declared()
    }

    fn validate_settings(settings: &Value) -> Result<(), Vec<SettingsProblem>> {
        wasmop_sdk::settings::only_keys(settings, &[])
    }

    fn reconcile(_snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
        Ok(Plan::new())
    }
}

wasmop_sdk::export_plugin!(SleepyManifest);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_declared_manifest_claims_sleepers() {
        assert_eq!(declared().controllers[0].primary.plural, "sleepers");
    }
}
