//! Test plugin `adopter`: like `good`, but it declares adoption of orphan
//! ConfigMaps (`OwnedKind::reference(..).adopt_orphans()`).
//!
//! For each `Adopter` (`test.wasmop.dev/v1`) it applies ConfigMap
//! `<name>-cm` in the primary's namespace with `data.value = spec.value`
//! (default `"adopted"`) and no precondition. When a ConfigMap of that name
//! already exists and nothing controls it, the host adopts it; when
//! something else controls it, the host refuses the plan.

use serde_json::{Value, json};
use wasmop_sdk::k8s_openapi::api::core::v1::ConfigMap;
use wasmop_sdk::{
    Controller, KindRef, Manifest, OwnedKind, Plan, Plugin, ReconcileError, SettingsProblem,
    Snapshot,
};

/// The `adopter` plugin.
#[derive(Debug)]
pub struct Adopter;

impl Plugin for Adopter {
    fn manifest() -> Manifest {
        Manifest::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")).controller(
            Controller::new(
                "adopter",
                KindRef::namespaced("test.wasmop.dev", "v1", "Adopter", "adopters"),
            )
            .owns_kind(OwnedKind::reference(KindRef::of::<ConfigMap>()).adopt_orphans()),
        )
    }

    fn validate_settings(settings: &Value) -> Result<(), Vec<SettingsProblem>> {
        wasmop_sdk::settings::only_keys(settings, &[])
    }

    fn reconcile(snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
        if snapshot.deleting {
            return Ok(Plan::new().cleanup_complete());
        }
        let value = snapshot
            .primary
            .pointer("/spec/value")
            .and_then(Value::as_str)
            .unwrap_or("adopted");
        Ok(Plan::new()
            .apply(json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {
                    "name": format!("{}-cm", snapshot.primary_name()),
                    "namespace": snapshot.primary_namespace(),
                },
                "data": {"value": value},
            }))
            .status(json!({"value": value})))
    }
}

#[cfg(target_arch = "wasm32")]
wasmop_sdk::export_plugin!(Adopter);
