//! Test plugin `mirror`: copies a Secret, the way a plugin that mirrors
//! credentials does. Its plans carry Secret payloads, so tests can check
//! that no value leaks into logs, Events or conditions.
//!
//! For each `Mirror` (`test.wasmop.dev/v1`) it reads the Secret named by
//! `spec.secretRef` (read id `source`) and applies Secret `<name>-mirror`
//! with the same `data`. Two deliberate mistakes, for failure paths:
//! - `spec.rawData: true` prefixes every value with `not base64:`, which
//!   the API server refuses;
//! - `spec.forgeLabel: true` sets the host's label
//!   `app.kubernetes.io/managed-by` itself, which the host refuses.
//!
//! The status says whether the source was found and how many keys were
//! copied, never a value.

use serde_json::{Map, Value, json};
use wasmop_sdk::k8s_openapi::api::core::v1::Secret;
use wasmop_sdk::{
    Controller, KindRef, Manifest, Plan, Plugin, Read, ReconcileError, Selector, SettingsProblem,
    Snapshot,
};

/// The `mirror` plugin.
#[derive(Debug)]
pub struct Mirror;

fn spec_bool(snapshot: &Snapshot, field: &str) -> bool {
    snapshot
        .primary
        .pointer(&format!("/spec/{field}"))
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

impl Plugin for Mirror {
    fn manifest() -> Manifest {
        Manifest::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")).controller(
            Controller::new(
                "mirror",
                KindRef::namespaced("test.wasmop.dev", "v1", "Mirror", "mirrors"),
            )
            .owns(KindRef::of::<Secret>())
            .reads(Read::new(
                "source",
                KindRef::of::<Secret>(),
                Selector::field("spec.secretRef"),
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
        let Some(source) = snapshot.related("source").next() else {
            return Ok(Plan::new().status(json!({"found": false, "keys": 0})));
        };
        let mut data = source["data"].as_object().cloned().unwrap_or_else(Map::new);
        if spec_bool(snapshot, "rawData") {
            for v in data.values_mut() {
                *v = json!(format!("not base64: {}", v.as_str().unwrap_or_default()));
            }
        }
        let mut metadata = json!({
            "name": format!("{}-mirror", snapshot.primary_name()),
            "namespace": snapshot.primary_namespace(),
        });
        if spec_bool(snapshot, "forgeLabel") {
            metadata["labels"] = json!({"app.kubernetes.io/managed-by": "wasmop"});
        }
        let keys = data.len();
        Ok(Plan::new()
            .apply(json!({
                "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": metadata, "data": data,
            }))
            .status(json!({"found": true, "keys": keys}))
            .event("Mirrored", format!("copied {keys} keys")))
    }
}

#[cfg(target_arch = "wasm32")]
wasmop_sdk::export_plugin!(Mirror);
