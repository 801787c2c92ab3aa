//! Test plugin `bad-deleter`: for each `BadDeleter` it plans the delete of
//! the ConfigMap named in `spec.victim` (with `spec.victimUid` and
//! `spec.victimResourceVersion` as the delete's preconditions), in the
//! primary's namespace. The test points it at a ConfigMap another owner
//! controls, so the host must refuse the plan and delete nothing.

use wasmop_sdk::k8s_openapi::api::core::v1::ConfigMap;
use wasmop_sdk::serde_json::Value;
use wasmop_sdk::{
    Controller, DeleteOp, KindRef, Manifest, ObjectRef, Plan, Plugin, ReconcileError,
    SettingsProblem, Snapshot,
};

/// The `bad-deleter` plugin.
#[derive(Debug)]
pub struct BadDeleter;

fn spec_str<'a>(snapshot: &'a Snapshot, field: &str) -> Result<&'a str, ReconcileError> {
    snapshot
        .primary
        .pointer(&format!("/spec/{field}"))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| {
            ReconcileError::invalid_spec(format!("spec.{field} must be a non-empty string"))
        })
}

impl Plugin for BadDeleter {
    fn manifest() -> Manifest {
        Manifest::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")).controller(
            Controller::new(
                "baddeleter",
                KindRef::namespaced("test.wasmop.dev", "v1", "BadDeleter", "baddeleters"),
            )
            .owns(KindRef::of::<ConfigMap>()),
        )
    }

    fn validate_settings(settings: &Value) -> Result<(), Vec<SettingsProblem>> {
        wasmop_sdk::settings::only_keys(settings, &[])
    }

    fn reconcile(snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
        Ok(Plan::new().delete(DeleteOp {
            target: ObjectRef {
                api_version: "v1".to_owned(),
                kind: "ConfigMap".to_owned(),
                namespace: snapshot.primary_namespace().unwrap_or_default().to_owned(),
                name: spec_str(snapshot, "victim")?.to_owned(),
            },
            uid: spec_str(snapshot, "victimUid")?.to_owned(),
            resource_version: spec_str(snapshot, "victimResourceVersion")?.to_owned(),
        }))
    }
}

wasmop_sdk::export_plugin!(BadDeleter);

#[cfg(test)]
mod tests {
    use super::*;
    use wasmop_sdk::serde_json::json;
    use wasmop_sdk::testing::{SnapshotBuilder, run};

    #[test]
    fn plans_the_delete_of_the_named_victim() {
        let snapshot = SnapshotBuilder::new("baddeleter")
            .primary(
                json!({"kind": "BadDeleter", "metadata": {"name": "d", "namespace": "ns"},
                            "spec": {"victim": "someone-elses", "victimUid": "u-9",
                                     "victimResourceVersion": "77"}}),
            )
            .build();
        let plan = run::<BadDeleter>(&snapshot).unwrap();
        assert_eq!(
            wasmop_sdk::serde_json::to_value(&plan.delete).unwrap(),
            json!([{"target": {"apiVersion": "v1", "kind": "ConfigMap", "namespace": "ns",
                               "name": "someone-elses"},
                    "uid": "u-9", "resourceVersion": "77"}])
        );
        assert!(plan.apply.is_empty());
    }

    #[test]
    fn missing_victim_is_an_invalid_spec() {
        let snapshot = SnapshotBuilder::new("baddeleter")
            .primary(json!({"kind": "BadDeleter", "metadata": {"name": "d", "namespace": "ns"}}))
            .build();
        assert_eq!(
            run::<BadDeleter>(&snapshot),
            Err(ReconcileError::invalid_spec(
                "spec.victim must be a non-empty string"
            ))
        );
    }
}
