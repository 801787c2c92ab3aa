//! Test plugin `looper`: reconcile never returns. It spins on a counter the
//! optimiser cannot see through, so only the host's deadline (epoch
//! interruption) ends the call.

use std::hint::black_box;

use wasmop_sdk::k8s_openapi::api::core::v1::ConfigMap;
use wasmop_sdk::serde_json::Value;
use wasmop_sdk::{
    Controller, KindRef, Manifest, Plan, Plugin, ReconcileError, SettingsProblem, Snapshot,
};

/// The `looper` plugin.
#[derive(Debug)]
pub struct Looper;

impl Plugin for Looper {
    fn manifest() -> Manifest {
        Manifest::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")).controller(
            Controller::new(
                "looper",
                KindRef::namespaced("test.wasmop.dev", "v1", "Looper", "loopers"),
            )
            .owns(KindRef::of::<ConfigMap>()),
        )
    }

    fn validate_settings(settings: &Value) -> Result<(), Vec<SettingsProblem>> {
        wasmop_sdk::settings::only_keys(settings, &[])
    }

    fn reconcile(_snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
        spin()
    }
}

/// Counts forever.
fn spin() -> ! {
    let mut turns: u64 = 0;
    loop {
        turns = black_box(turns.wrapping_add(1));
    }
}

wasmop_sdk::export_plugin!(Looper);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_claims_loopers() {
        let m = Looper::manifest();
        assert_eq!((m.name.as_str(), m.version.as_str()), ("looper", "0.1.0"));
        assert_eq!(m.controllers[0].primary.plural, "loopers");
        assert_eq!(m.controllers[0].owns[0].kind.kind, "ConfigMap");
    }
}
