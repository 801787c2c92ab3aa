//! Test plugin `good-pruner`: the `good` plugin at version 0.3.0 that has
//! retired its ConfigMaps: it deletes each Widget's owned ConfigMaps
//! instead of applying one, and keeps the same status. Replay and shadow
//! tests use it as the candidate that "deletes more".
//!
//! Its manifest keeps the plugin *name* `good`, like `good-v2`.

use serde_json::Value;
use wasmop_sdk::{Manifest, Plan, Plugin, ReconcileError, SettingsProblem, Snapshot};

/// Plugin name in the manifest: the plugin this one replaces.
pub const PLUGIN_NAME: &str = "good";

/// The `good-pruner` plugin.
#[derive(Debug)]
pub struct GoodPruner;

impl Plugin for GoodPruner {
    fn manifest() -> Manifest {
        good::manifest(PLUGIN_NAME, env!("CARGO_PKG_VERSION"))
    }

    fn validate_settings(settings: &Value) -> Result<(), Vec<SettingsProblem>> {
        good::validate_settings(settings)
    }

    fn reconcile(snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
        let plan = good::reconcile_with(snapshot, "v1")?;
        let mut pruned = Plan::new();
        if let Some(status) = plan.status.clone() {
            pruned = pruned.status(status);
        }
        for owned in &snapshot.owned {
            pruned = pruned.delete_owned(owned)?;
        }
        if plan.cleanup_complete {
            pruned = pruned.cleanup_complete();
        }
        Ok(pruned)
    }
}

wasmop_sdk::export_plugin!(GoodPruner);

#[cfg(test)]
mod tests {
    use super::*;
    use wasmop_sdk::testing::{SnapshotBuilder, run};

    #[test]
    fn deletes_the_owned_config_map_instead_of_applying_it() {
        let m = GoodPruner::manifest();
        assert_eq!((m.name.as_str(), m.version.as_str()), ("good", "0.3.0"));
        let snapshot = SnapshotBuilder::new(good::CONTROLLER)
            .primary(serde_json::json!({"kind": "Widget",
                "metadata": {"name": "w", "namespace": "ns", "uid": "u1"}, "spec": {"value": "x"}}))
            .owned(serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "w-cm", "namespace": "ns", "uid": "u2", "resourceVersion": "7"}}))
            .build();
        let plan = run::<GoodPruner>(&snapshot).unwrap();
        assert!(plan.apply.is_empty());
        assert_eq!(plan.delete.len(), 1);
        assert!(plan.status.is_some());
    }
}
