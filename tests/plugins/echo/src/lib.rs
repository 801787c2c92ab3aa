//! Test plugin `echo`: reconcile answers with the snapshot it received, as
//! the SDK parsed it, in `status.snapshot`. The host's runtime tests lower a
//! snapshot into the real component and compare what comes back with what
//! went in, field by field: the host's conversion and the SDK's agree.

use wasmop_sdk::k8s_openapi::api::core::v1::{ConfigMap, Secret};
use wasmop_sdk::serde_json::{Value, json};
use wasmop_sdk::{
    Controller, KindRef, Manifest, Plan, Plugin, Read, ReconcileError, Selector, SettingsProblem,
    Snapshot,
};

/// The `echo` plugin.
#[derive(Debug)]
pub struct Echo;

impl Plugin for Echo {
    fn manifest() -> Manifest {
        Manifest::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")).controller(
            Controller::new(
                "echo",
                KindRef::namespaced("test.wasmop.dev", "v1", "Echo", "echoes"),
            )
            .owns(KindRef::of::<ConfigMap>())
            .reads(Read::new(
                "secret",
                KindRef::of::<Secret>(),
                Selector::field("spec.secretRef"),
            )),
        )
    }

    fn validate_settings(_settings: &Value) -> Result<(), Vec<SettingsProblem>> {
        Ok(())
    }

    fn reconcile(snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
        Ok(Plan::new().status(json!({ "snapshot": snapshot })))
    }
}

wasmop_sdk::export_plugin!(Echo);

#[cfg(test)]
mod tests {
    use super::*;
    use wasmop_sdk::testing::{SnapshotBuilder, run};

    #[test]
    fn the_status_holds_the_snapshot_as_received() {
        let snapshot = SnapshotBuilder::new("echo")
            .primary(json!({"apiVersion": "test.wasmop.dev/v1", "kind": "Echo",
                            "metadata": {"name": "e", "namespace": "ns"}}))
            .build();
        let plan = run::<Echo>(&snapshot).unwrap();
        let status = plan.status.unwrap();
        assert_eq!(status["snapshot"]["primary"]["metadata"]["name"], "e");
        assert_eq!(status["snapshot"]["controller"], "echo");
    }
}
