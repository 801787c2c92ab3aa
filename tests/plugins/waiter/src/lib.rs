//! Test plugin `waiter`: its primary kind, `Waiter` in
//! `waiting.wasmop.dev/v1`, has a CRD (`tests/fixtures/waiting/`) that
//! only the test of a plugin waiting for a kind not served installs, and
//! only once the operator has started without it. Reconcile writes
//! `status.seen`.

use wasmop_sdk::serde_json::{Value, json};
use wasmop_sdk::{
    Controller, KindRef, Manifest, Plan, Plugin, ReconcileError, SettingsProblem, Snapshot,
};

/// The `waiter` plugin.
#[derive(Debug)]
pub struct Waiter;

impl Plugin for Waiter {
    fn manifest() -> Manifest {
        Manifest::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")).controller(
            Controller::new(
                "waiter",
                KindRef::namespaced("waiting.wasmop.dev", "v1", "Waiter", "waiters"),
            ),
        )
    }

    fn validate_settings(_settings: &Value) -> Result<(), Vec<SettingsProblem>> {
        Ok(())
    }

    fn reconcile(_snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
        Ok(Plan::new().status(json!({ "seen": true })))
    }
}

wasmop_sdk::export_plugin!(Waiter);

#[cfg(test)]
mod tests {
    use super::*;
    use wasmop_sdk::testing::{SnapshotBuilder, run};

    #[test]
    fn the_status_says_seen() {
        let snapshot = SnapshotBuilder::new("waiter")
            .primary(
                json!({"apiVersion": "waiting.wasmop.dev/v1", "kind": "Waiter",
                            "metadata": {"name": "w", "namespace": "ns"}}),
            )
            .build();
        let plan = run::<Waiter>(&snapshot).unwrap();
        assert_eq!(plan.status.unwrap()["seen"], true);
    }
}
