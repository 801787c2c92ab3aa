//! Test plugin `patcher`: exercises `primaryPatch` against its one declared
//! primary field, `metadata.labels.app`.
//!
//! For each `Patcher` (`test.wasmop.dev/v1`):
//! - with `spec.patch` (any JSON), returns it verbatim as the plan's
//!   `primaryPatch`, so tests can ask for patches outside the declared
//!   field (a label that merely starts with `app`, an empty object);
//! - otherwise sets the label `app` to `spec.app` (default `plugin`) once:
//!   only while the primary has no `app` label, so a value someone else set
//!   meanwhile is kept.
//!
//! The status records the `app` label the snapshot saw (`status.app`).
//!
//! A second, hostile controller reconciles `Relabeller`
//! (`test.wasmop.dev/v1`): it declares the host's own labels as primary
//! fields (`wasmop.dev/protected`, `shard.wasmop.dev/shard`,
//! `app.kubernetes.io/managed-by`), may delete its primary
//! (`delete-primary`) and owns ConfigMaps. For each Relabeller:
//! - with `spec.patch` (any JSON), returns it verbatim as `primaryPatch`
//!   (the host must refuse a patch of its labels, or the removal of
//!   `wasmop.dev/protected`, whatever `primary-fields` says);
//! - with `spec.deleteSelf: true`, deletes its own primary;
//! - with `spec.objectLabels` (an object), applies ConfigMap `<name>-cm`
//!   carrying those labels (a shard label the host must refuse).
//!
//! Its status records the labels the snapshot saw (`status.labels`).

use serde_json::{Value, json};
use wasmop_sdk::k8s_openapi::api::core::v1::ConfigMap;
use wasmop_sdk::{
    Controller, KindRef, Manifest, Plan, Plugin, ReconcileError, SettingsProblem, Snapshot,
};

/// The `patcher` plugin.
#[derive(Debug)]
pub struct Patcher;

impl Plugin for Patcher {
    fn manifest() -> Manifest {
        Manifest::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION"))
            .controller(
                Controller::new(
                    "patcher",
                    KindRef::namespaced("test.wasmop.dev", "v1", "Patcher", "patchers"),
                )
                .primary_field("metadata.labels.app"),
            )
            .controller(
                Controller::new(
                    "relabeller",
                    KindRef::namespaced("test.wasmop.dev", "v1", "Relabeller", "relabellers"),
                )
                .primary_field("metadata.labels.wasmop.dev/protected")
                .primary_field("metadata.labels.shard.wasmop.dev/shard")
                .primary_field("metadata.labels.app.kubernetes.io/managed-by")
                .owns(KindRef::of::<ConfigMap>())
                .delete_primary(),
            )
    }

    fn validate_settings(settings: &Value) -> Result<(), Vec<SettingsProblem>> {
        wasmop_sdk::settings::only_keys(settings, &[])
    }

    fn reconcile(snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
        if snapshot.deleting {
            return Ok(Plan::new().cleanup_complete());
        }
        if snapshot.primary["kind"] == "Relabeller" {
            return relabel(snapshot);
        }
        let seen = snapshot
            .primary
            .pointer("/metadata/labels/app")
            .cloned()
            .unwrap_or(Value::Null);
        let plan = Plan::new().status(json!({"app": seen}));
        if let Some(patch) = snapshot
            .primary
            .pointer("/spec/patch")
            .filter(|p| !p.is_null())
        {
            return Ok(plan.primary_patch(patch.clone()));
        }
        if seen.is_null() {
            let app = snapshot
                .primary
                .pointer("/spec/app")
                .and_then(Value::as_str)
                .unwrap_or("plugin");
            return Ok(plan.primary_patch(json!({"metadata": {"labels": {"app": app}}})));
        }
        Ok(plan)
    }
}

/// The hostile `relabeller` controller (see the crate docs).
fn relabel(snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
    let p = &snapshot.primary;
    let labels = p.pointer("/metadata/labels").cloned().unwrap_or(json!({}));
    let mut plan = Plan::new().status(json!({"labels": labels}));
    if let Some(patch) = p.pointer("/spec/patch").filter(|v| !v.is_null()) {
        plan = plan.primary_patch(patch.clone());
    }
    if p.pointer("/spec/deleteSelf").and_then(Value::as_bool) == Some(true) {
        plan = plan.delete_self(snapshot)?;
    }
    if let Some(object_labels) = p.pointer("/spec/objectLabels").filter(|v| v.is_object()) {
        let name = p
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("x");
        plan = plan.apply(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": format!("{name}-cm"), "namespace": snapshot.primary_namespace(),
                         "labels": object_labels},
            "data": {"from": name},
        }));
    }
    Ok(plan)
}

#[cfg(target_arch = "wasm32")]
wasmop_sdk::export_plugin!(Patcher);
