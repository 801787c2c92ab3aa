//! Test plugin `panicker`: reconcile panics with the message
//! [`MESSAGE`]. In the component a panic is a trap; the host must fail that
//! one reconcile and go on.
//!
//! With `spec.flood: N` it first calls `diagnostics.panic-text` N times
//! with 8 bytes of `0xff` and a `len` of 255, as a hostile plugin would:
//! the host must keep a bounded amount of it, and only for that call.

use wasmop_sdk::k8s_openapi::api::core::v1::ConfigMap;
use wasmop_sdk::serde_json::Value;
use wasmop_sdk::{
    Controller, KindRef, Manifest, Plan, Plugin, ReconcileError, SettingsProblem, Snapshot,
};

/// The panic message, for tests to look for in the host's report.
pub const MESSAGE: &str = "panicker: deliberate panic";

/// The `panicker` plugin.
#[derive(Debug)]
pub struct Panicker;

impl Plugin for Panicker {
    fn manifest() -> Manifest {
        Manifest::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")).controller(
            Controller::new(
                "panicker",
                KindRef::namespaced("test.wasmop.dev", "v1", "Panicker", "panickers"),
            )
            .owns(KindRef::of::<ConfigMap>()),
        )
    }

    fn validate_settings(settings: &Value) -> Result<(), Vec<SettingsProblem>> {
        wasmop_sdk::settings::only_keys(settings, &[])
    }

    fn reconcile(snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
        let flood = snapshot.primary["spec"]["flood"].as_u64().unwrap_or(0);
        #[cfg(target_arch = "wasm32")]
        for _ in 0..flood {
            wasmop_sdk::bindings::wasmop::reconciler::diagnostics::panic_text(u64::MAX, u8::MAX);
        }
        #[cfg(not(target_arch = "wasm32"))]
        let _ = flood;
        panic!("{MESSAGE}")
    }
}

wasmop_sdk::export_plugin!(Panicker);

#[cfg(test)]
mod tests {
    use super::*;
    use wasmop_sdk::testing::{SnapshotBuilder, run};

    #[test]
    #[should_panic(expected = "panicker: deliberate panic")]
    fn reconcile_panics_with_the_recognisable_message() {
        let _ = run::<Panicker>(&SnapshotBuilder::new("panicker").build());
    }
}
