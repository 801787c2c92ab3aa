//! Test plugin `fanout`: for each `Fanout` (`test.wasmop.dev/v1`) it applies
//! ConfigMaps `<name>-0` … `<name>-<count-1>` (`spec.count`, default 10) in
//! the primary's namespace, deletes the ones it owns beyond the count,
//! writes `status.count` and records a Normal Event `FannedOut`. A plan
//! with many writes, for tests that cut a plan short (leadership lost
//! mid-plan), and with deletes (protected objects).

use serde_json::{Value, json};
use wasmop_sdk::k8s_openapi::api::core::v1::ConfigMap;
use wasmop_sdk::{
    Controller, KindRef, Manifest, Plan, Plugin, ReconcileError, SettingsProblem, Snapshot,
};

/// The `fanout` plugin.
#[derive(Debug)]
pub struct Fanout;

impl Plugin for Fanout {
    fn manifest() -> Manifest {
        Manifest::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")).controller(
            Controller::new(
                "fanout",
                KindRef::namespaced("test.wasmop.dev", "v1", "Fanout", "fanouts"),
            )
            .owns(KindRef::of::<ConfigMap>()),
        )
    }

    fn validate_settings(settings: &Value) -> Result<(), Vec<SettingsProblem>> {
        wasmop_sdk::settings::only_keys(settings, &[])
    }

    fn reconcile(snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
        if snapshot.deleting {
            return Ok(Plan::new().cleanup_complete());
        }
        let count = snapshot
            .primary
            .pointer("/spec/count")
            .and_then(Value::as_u64)
            .unwrap_or(10);
        let mut plan = Plan::new();
        for i in 0..count {
            plan = plan.apply(json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {
                    "name": format!("{}-{i}", snapshot.primary_name()),
                    "namespace": snapshot.primary_namespace(),
                },
                "data": {"index": i.to_string()},
            }));
        }
        let prefix = format!("{}-", snapshot.primary_name());
        for owned in &snapshot.owned {
            let extra = owned["metadata"]["name"]
                .as_str()
                .and_then(|n| n.strip_prefix(&prefix))
                .and_then(|i| i.parse::<u64>().ok())
                .is_some_and(|i| i >= count);
            if extra {
                plan = plan.delete_owned(owned)?;
            }
        }
        Ok(plan
            .status(json!({"count": count}))
            .event("FannedOut", format!("applied {count} ConfigMaps")))
    }
}

#[cfg(target_arch = "wasm32")]
wasmop_sdk::export_plugin!(Fanout);
