//! Test plugin `crossref`: a manifest the host must refuse at load. Its
//! namespaced `Widget` controller owns ConfigMaps by ownerReference while
//! writing into every namespace, and owns the cluster-scoped `Badge` by
//! ownerReference. Neither can work (the garbage collector treats such
//! references as dangling); both must be refused naming `owner-label`.

use serde_json::Value;
use wasmop_sdk::k8s_openapi::api::core::v1::ConfigMap;
use wasmop_sdk::{
    Controller, KindRef, Manifest, Plan, Plugin, ReconcileError, SettingsProblem, Snapshot,
};

/// The `crossref` plugin.
#[derive(Debug)]
pub struct CrossRef;

impl Plugin for CrossRef {
    fn manifest() -> Manifest {
        Manifest::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")).controller(
            Controller::new(
                "widget",
                KindRef::namespaced("test.wasmop.dev", "v1", "Widget", "widgets"),
            )
            .owns(KindRef::of::<ConfigMap>())
            .owns(KindRef::cluster_scoped(
                "test.wasmop.dev",
                "v1",
                "Badge",
                "badges",
            ))
            .write_namespace("*"),
        )
    }

    fn validate_settings(_settings: &Value) -> Result<(), Vec<SettingsProblem>> {
        Ok(())
    }

    fn reconcile(_snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
        Ok(Plan::new())
    }
}

#[cfg(target_arch = "wasm32")]
wasmop_sdk::export_plugin!(CrossRef);
