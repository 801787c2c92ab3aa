//! Test plugin `labeller`: owns objects by label (`owner-label`) where an
//! ownerReference cannot work — a ConfigMap in another namespace and a
//! cluster-scoped `Badge` — behind a finalizer.
//!
//! Settings: `{"targetNamespace": "<ns>"}` names the namespace the
//! ConfigMaps go to (declared `write-namespaces: [setting:targetNamespace]`);
//! without it they go to the primary's namespace.
//!
//! For each `Labeller` (`test.wasmop.dev/v1`, namespaced):
//! - applies ConfigMap `<name>-mirror` in the target namespace with
//!   `data.value = spec.value` (default `""`), owned by label with the
//!   extra label `test.wasmop.dev/labeller-uid`;
//! - applies Badge `<namespace>-<name>` with `spec.value`, owned by label;
//! - with `spec.forgeLabel: true` also sets the host's owner label
//!   `wasmop.dev/owner-uid` on the ConfigMap itself (the host must refuse);
//! - writes `status.value`, `status.owned` (how many label-owned objects
//!   the snapshot held) and `status.notes` (the annotation
//!   `test.wasmop.dev/note` of each owned object, by kind), so tests see
//!   that a change of an owned object reached the primary.
//!
//! Deleting (finalizer `test.wasmop.dev/labeller`): with
//! `spec.holdCleanup: true` it only records a Warning `CleanupHeld`;
//! otherwise it deletes every object of its snapshot's `owned` and says
//! cleanup is complete, in one plan.

use serde_json::{Value, json};
use wasmop_sdk::k8s_openapi::api::core::v1::ConfigMap;
use wasmop_sdk::{
    Controller, DeleteOp, KindRef, Manifest, Plan, Plugin, ReconcileError, SettingsProblem,
    Snapshot, settings,
};

/// Finalizer held on every Labeller.
pub const FINALIZER: &str = "test.wasmop.dev/labeller";
/// The extra owner label on the ConfigMaps.
pub const EXTRA_LABEL: &str = "test.wasmop.dev/labeller-uid";

/// The cluster-scoped kind owned by label.
pub fn badge() -> KindRef {
    KindRef::cluster_scoped("test.wasmop.dev", "v1", "Badge", "badges")
}

/// The `labeller` plugin.
#[derive(Debug)]
pub struct Labeller;

fn spec_bool(snapshot: &Snapshot, field: &str) -> bool {
    snapshot
        .primary
        .pointer(&format!("/spec/{field}"))
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

impl Plugin for Labeller {
    fn manifest() -> Manifest {
        Manifest::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")).controller(
            Controller::new(
                "labeller",
                KindRef::namespaced("test.wasmop.dev", "v1", "Labeller", "labellers"),
            )
            .owns_by_label(KindRef::of::<ConfigMap>(), Some(EXTRA_LABEL))
            .owns_by_label(badge(), None)
            .finalizer(FINALIZER)
            .write_namespace_from_setting("targetNamespace"),
        )
    }

    fn validate_settings(value: &Value) -> Result<(), Vec<SettingsProblem>> {
        let mut problems = Vec::new();
        problems.extend(
            settings::only_keys(value, &["targetNamespace"])
                .err()
                .unwrap_or_default(),
        );
        problems.extend(
            settings::optional_string(value, "targetNamespace")
                .err()
                .unwrap_or_default(),
        );
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }

    fn reconcile(snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
        if snapshot.deleting {
            if spec_bool(snapshot, "holdCleanup") {
                return Ok(Plan::new().warning("CleanupHeld", "spec.holdCleanup is true"));
            }
            let mut plan = Plan::new();
            for owned in &snapshot.owned {
                plan = plan.delete(DeleteOp::of(owned)?);
            }
            return Ok(plan.cleanup_complete());
        }
        let value = snapshot
            .primary
            .pointer("/spec/value")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let primary_ns = snapshot.primary_namespace().unwrap_or_default();
        let target = snapshot
            .settings
            .get("targetNamespace")
            .and_then(Value::as_str)
            .unwrap_or(primary_ns);
        let mut labels = json!({"test.wasmop.dev/role": "mirror"});
        if spec_bool(snapshot, "forgeLabel") {
            labels["wasmop.dev/owner-uid"] = json!("forged");
        }
        let mut notes = serde_json::Map::new();
        for owned in &snapshot.owned {
            if let (Some(kind), Some(note)) = (
                owned["kind"].as_str(),
                owned.pointer("/metadata/annotations/test.wasmop.dev~1note"),
            ) {
                notes.insert(kind.to_owned(), note.clone());
            }
        }
        let name = snapshot.primary_name();
        Ok(Plan::new()
            .apply(json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": format!("{name}-mirror"), "namespace": target, "labels": labels},
                "data": {"value": value},
            }))
            .apply(json!({
                "apiVersion": "test.wasmop.dev/v1", "kind": "Badge",
                "metadata": {"name": format!("{primary_ns}-{name}")},
                "spec": {"value": value},
            }))
            .status(json!({"value": value, "owned": snapshot.owned.len(), "notes": notes})))
    }
}

#[cfg(target_arch = "wasm32")]
wasmop_sdk::export_plugin!(Labeller);
