//! Test plugin `guarded`: for each `Guard` (`test.wasmop.dev/v1`) it applies
//! two `Guarded` objects in the primary's namespace, `<name>-a` with
//! `spec.size: 1` and then `<name>-b` with the Guard's `spec.size`
//! (default 1), and writes `status.size`. The Guarded CRD
//! (tests/fixtures/crds/dryrun-kinds.yaml) has a CEL rule allowing a size
//! of at most 10, so a Guard with a larger size makes a plan whose second
//! write the API server refuses: what `dryRunFirst` must catch before the
//! first write is made.

use serde_json::{Value, json};
use wasmop_sdk::{
    Controller, KindRef, Manifest, Plan, Plugin, ReconcileError, SettingsProblem, Snapshot,
};

/// The `guarded` plugin.
#[derive(Debug)]
pub struct Guarded;

fn guarded(name: String, namespace: Option<&str>, size: u64) -> Value {
    json!({
        "apiVersion": "test.wasmop.dev/v1", "kind": "Guarded",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"size": size},
    })
}

impl Plugin for Guarded {
    fn manifest() -> Manifest {
        Manifest::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")).controller(
            Controller::new(
                "guarded",
                KindRef::namespaced("test.wasmop.dev", "v1", "Guard", "guards"),
            )
            .owns(KindRef::namespaced(
                "test.wasmop.dev",
                "v1",
                "Guarded",
                "guardeds",
            )),
        )
    }

    fn validate_settings(settings: &Value) -> Result<(), Vec<SettingsProblem>> {
        wasmop_sdk::settings::only_keys(settings, &[])
    }

    fn reconcile(snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
        if snapshot.deleting {
            return Ok(Plan::new().cleanup_complete());
        }
        let size = snapshot
            .primary
            .pointer("/spec/size")
            .and_then(Value::as_u64)
            .unwrap_or(1);
        let name = snapshot.primary_name();
        let namespace = snapshot.primary_namespace();
        Ok(Plan::new()
            .apply(guarded(format!("{name}-a"), namespace, 1))
            .apply(guarded(format!("{name}-b"), namespace, size))
            .status(json!({"size": size})))
    }
}

#[cfg(target_arch = "wasm32")]
wasmop_sdk::export_plugin!(Guarded);
