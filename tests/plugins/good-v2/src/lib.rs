//! Test plugin `good-v2`: the `good` plugin at version 0.2.0, labelling its
//! ConfigMaps `test.wasmop.dev/version: v2`. Hot-swap tests replace `good`
//! with it and watch the label change.
//!
//! Its manifest keeps the plugin *name* `good`: it is a new version of the
//! same plugin (same field manager, same `wasmop.dev/plugin` label), not a
//! second plugin claiming Widgets.

use serde_json::Value;
use wasmop_sdk::{Manifest, Plan, Plugin, ReconcileError, SettingsProblem, Snapshot};

/// Plugin name in the manifest: the plugin this one replaces.
pub const PLUGIN_NAME: &str = "good";

/// The `good-v2` plugin.
#[derive(Debug)]
pub struct GoodV2;

impl Plugin for GoodV2 {
    fn manifest() -> Manifest {
        good::manifest(PLUGIN_NAME, env!("CARGO_PKG_VERSION"))
    }

    fn validate_settings(settings: &Value) -> Result<(), Vec<SettingsProblem>> {
        good::validate_settings(settings)
    }

    fn reconcile(snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
        good::reconcile_with(snapshot, "v2")
    }
}

wasmop_sdk::export_plugin!(GoodV2);

#[cfg(test)]
mod tests {
    use super::*;
    use wasmop_sdk::testing::{SnapshotBuilder, run};

    #[test]
    fn same_plugin_newer_version_v2_label() {
        let m = GoodV2::manifest();
        assert_eq!((m.name.as_str(), m.version.as_str()), ("good", "0.2.0"));
        assert_eq!(m.controllers[0].primary.kind, "Widget");

        let snapshot = SnapshotBuilder::new(good::CONTROLLER)
            .primary(
                serde_json::json!({"kind": "Widget", "metadata": {"name": "w", "namespace": "ns"},
                                        "spec": {"value": "x"}}),
            )
            .build();
        let plan = run::<GoodV2>(&snapshot).unwrap();
        assert_eq!(
            plan.apply[0].object["metadata"]["labels"][good::VERSION_LABEL],
            "v2"
        );
        assert_eq!(plan.apply[0].object["data"]["value"], "x");
    }
}
