//! Test plugin `bad-writer`: for each `BadWriter` it plans its own ConfigMap
//! *and* a Secret. Secrets are not an owned kind, so the host must refuse the
//! whole plan and write neither object.

use wasmop_sdk::k8s_openapi::api::core::v1::ConfigMap;
use wasmop_sdk::serde_json::{Value, json};
use wasmop_sdk::{
    Controller, KindRef, Manifest, Plan, Plugin, ReconcileError, SettingsProblem, Snapshot,
};

/// The `bad-writer` plugin.
#[derive(Debug)]
pub struct BadWriter;

impl Plugin for BadWriter {
    fn manifest() -> Manifest {
        Manifest::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")).controller(
            Controller::new(
                "badwriter",
                KindRef::namespaced("test.wasmop.dev", "v1", "BadWriter", "badwriters"),
            )
            .owns(KindRef::of::<ConfigMap>()),
        )
    }

    fn validate_settings(settings: &Value) -> Result<(), Vec<SettingsProblem>> {
        wasmop_sdk::settings::only_keys(settings, &[])
    }

    fn reconcile(snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
        let name = snapshot.primary_name();
        let namespace = snapshot.primary_namespace();
        Ok(Plan::new()
            .apply(json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": format!("{name}-cm"), "namespace": namespace},
                "data": {"value": "allowed"},
            }))
            .apply(json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": format!("{name}-secret"), "namespace": namespace},
                "stringData": {"value": "forbidden"},
            })))
    }
}

wasmop_sdk::export_plugin!(BadWriter);

#[cfg(test)]
mod tests {
    use super::*;
    use wasmop_sdk::testing::{SnapshotBuilder, run};

    #[test]
    fn plans_an_owned_config_map_and_an_unowned_secret() {
        let manifest = BadWriter::manifest();
        assert_eq!(manifest.name, "bad-writer");
        assert_eq!(manifest.controllers[0].primary.kind, "BadWriter");
        assert!(
            manifest.controllers[0]
                .owns
                .iter()
                .all(|k| k.kind.kind != "Secret")
        );

        let snapshot = SnapshotBuilder::new("badwriter")
            .primary(json!({"kind": "BadWriter", "metadata": {"name": "b", "namespace": "ns"}}))
            .build();
        let plan = run::<BadWriter>(&snapshot).unwrap();
        let kinds: Vec<&Value> = plan.apply.iter().map(|op| &op.object["kind"]).collect();
        assert_eq!(kinds, [&json!("ConfigMap"), &json!("Secret")]);
        assert_eq!(plan.apply[1].object["metadata"]["name"], "b-secret");
    }
}
