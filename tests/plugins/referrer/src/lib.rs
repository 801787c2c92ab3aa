//! Test plugin `referrer`: exercises the host features a plain owner does
//! not — field references, the reference index, primary fields and
//! finalizers.
//!
//! For each `Referrer` (`test.wasmop.dev/v1`):
//! - reads the ConfigMap named by `spec.configRef` (read id `config`) and
//!   applies ConfigMap `<name>-copy` with the same `data`; when the
//!   referenced ConfigMap is missing it writes `status.configFound: false`
//!   and asks for no requeue, so only a change of that ConfigMap (through
//!   the host's reference index) can bring the copy;
//! - sets `spec.id` once, to `id-` and the first 8 characters of its UID
//!   (declared in `primary-fields`);
//! - holds the finalizer `test.wasmop.dev/cleanup` and releases it on
//!   deletion only once `spec.allowCleanup` is true.

use serde::Deserialize;
use serde_json::{Map, Value, json};
use wasmop_sdk::k8s_openapi::api::core::v1::ConfigMap;
use wasmop_sdk::{
    Controller, KindRef, Manifest, Plan, Plugin, Read, ReconcileError, Selector, SettingsProblem,
    Snapshot,
};

/// Finalizer held on every Referrer.
pub const FINALIZER: &str = "test.wasmop.dev/cleanup";

#[derive(Deserialize)]
struct Referrer {
    metadata: Meta,
    #[serde(default)]
    spec: Spec,
}

#[derive(Deserialize)]
struct Meta {
    #[serde(default)]
    uid: String,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Spec {
    #[serde(default)]
    id: String,
    #[serde(default)]
    allow_cleanup: bool,
}

/// The `referrer` plugin.
#[derive(Debug)]
pub struct ReferrerPlugin;

impl Plugin for ReferrerPlugin {
    fn manifest() -> Manifest {
        Manifest::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")).controller(
            Controller::new(
                "referrer",
                KindRef::namespaced("test.wasmop.dev", "v1", "Referrer", "referrers"),
            )
            .owns(KindRef::of::<ConfigMap>())
            .reads(Read::new(
                "config",
                KindRef::of::<ConfigMap>(),
                Selector::field("spec.configRef"),
            ))
            .finalizer(FINALIZER)
            .primary_field("spec.id"),
        )
    }

    fn validate_settings(_settings: &Value) -> Result<(), Vec<SettingsProblem>> {
        Ok(())
    }

    fn reconcile(snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
        let primary: Referrer = snapshot.primary_as()?;
        if snapshot.deleting {
            return Ok(if primary.spec.allow_cleanup {
                Plan::new()
                    .event("CleanupDone", "external cleanup finished")
                    .cleanup_complete()
            } else {
                Plan::new().warning("CleanupBlocked", "waiting for spec.allowCleanup")
            });
        }
        let mut plan = Plan::new();
        if primary.spec.id.is_empty() {
            let id: String = primary.metadata.uid.chars().take(8).collect();
            plan = plan.primary_patch(json!({"spec": {"id": format!("id-{id}")}}));
        }
        let config = snapshot.related("config").next();
        let Some(config) = config else {
            return Ok(plan.status(json!({"configFound": false})));
        };
        let data = config["data"].as_object().cloned().unwrap_or_else(Map::new);
        let copy = json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {
                "name": format!("{}-copy", snapshot.primary_name()),
                "namespace": snapshot.primary_namespace(),
            },
            "data": data,
        });
        Ok(plan.apply(copy).status(json!({"configFound": true})))
    }
}

#[cfg(target_arch = "wasm32")]
wasmop_sdk::export_plugin!(ReferrerPlugin);

#[cfg(test)]
mod tests {
    use super::*;
    use wasmop_sdk::testing::{SnapshotBuilder, run};

    const PRIMARY: &str = "
apiVersion: test.wasmop.dev/v1
kind: Referrer
metadata: {name: r, namespace: ns, uid: 0123456789abcdef}
spec: {configRef: src}
";

    #[test]
    fn sets_the_id_once_and_reports_a_missing_config() {
        let plan = run::<ReferrerPlugin>(&SnapshotBuilder::from_yaml("referrer", PRIMARY).build())
            .unwrap();
        assert_eq!(
            plan.primary_patch,
            Some(json!({"spec": {"id": "id-01234567"}}))
        );
        assert_eq!(plan.status, Some(json!({"configFound": false})));
        assert!(plan.apply.is_empty());
    }

    #[test]
    fn holds_cleanup_until_allowed() {
        let yaml = PRIMARY.replace(
            "metadata: {",
            "metadata: {deletionTimestamp: '2026-01-01T00:00:00Z', ",
        );
        let plan = run::<ReferrerPlugin>(
            &SnapshotBuilder::from_yaml("referrer", &yaml)
                .deleting(true)
                .build(),
        )
        .unwrap();
        assert!(!plan.cleanup_complete);
        let yaml = yaml.replace("configRef: src", "configRef: src, allowCleanup: true");
        let plan = run::<ReferrerPlugin>(
            &SnapshotBuilder::from_yaml("referrer", &yaml)
                .deleting(true)
                .build(),
        )
        .unwrap();
        assert!(plan.cleanup_complete);
    }
}
