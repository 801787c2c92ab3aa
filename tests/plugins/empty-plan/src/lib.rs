//! Test plugin `empty-plan`: reconcile always returns an empty plan. The
//! host must treat that as "nothing to do" and never delete children because
//! a plan does not mention them.

use wasmop_sdk::k8s_openapi::api::core::v1::ConfigMap;
use wasmop_sdk::serde_json::Value;
use wasmop_sdk::{
    Controller, KindRef, Manifest, Plan, Plugin, ReconcileError, SettingsProblem, Snapshot,
};

/// The `empty-plan` plugin.
#[derive(Debug)]
pub struct EmptyPlan;

impl Plugin for EmptyPlan {
    fn manifest() -> Manifest {
        Manifest::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")).controller(
            Controller::new(
                "emptyplan",
                KindRef::namespaced("test.wasmop.dev", "v1", "EmptyPlan", "emptyplans"),
            )
            .owns(KindRef::of::<ConfigMap>()),
        )
    }

    fn validate_settings(settings: &Value) -> Result<(), Vec<SettingsProblem>> {
        wasmop_sdk::settings::only_keys(settings, &[])
    }

    fn reconcile(_snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
        Ok(Plan::new())
    }
}

wasmop_sdk::export_plugin!(EmptyPlan);

#[cfg(test)]
mod tests {
    use super::*;
    use wasmop_sdk::serde_json::json;
    use wasmop_sdk::testing::{SnapshotBuilder, run};

    #[test]
    fn plan_is_empty_even_with_owned_children() {
        let snapshot = SnapshotBuilder::new("emptyplan")
            .primary(json!({"kind": "EmptyPlan", "metadata": {"name": "e", "namespace": "ns"}}))
            .owned(json!({"apiVersion": "v1", "kind": "ConfigMap",
                          "metadata": {"name": "child", "namespace": "ns", "uid": "u", "resourceVersion": "1"}}))
            .build();
        let plan = run::<EmptyPlan>(&snapshot).unwrap();
        assert!(plan.is_empty());
        assert_eq!(
            EmptyPlan::manifest().controllers[0].primary.plural,
            "emptyplans"
        );
    }
}
