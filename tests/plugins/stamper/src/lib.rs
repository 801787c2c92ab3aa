//! Test plugin `stamper`: writes the UID of the primary it was given where
//! the chaos soak can compare it with the object it lands on.
//!
//! For each `Stamp` (`test.wasmop.dev/v1`, namespaced) it waits
//! `spec.holdMs` milliseconds (a blocking WASI clock wait, at most
//! [`MAX_HOLD_MS`], well within the call's deadline), then applies
//! ConfigMap `<name>-stamp` with `data.uid` and sets status
//! `{"uid": <UID>, "conditions": [Ready=True]}`, where `<UID>` is
//! `metadata.uid` of the primary in its snapshot. The hold keeps the call
//! open while the soak deletes the Stamp and creates it again under its
//! name: a status decided for the old object that lands on the new one
//! names a UID other than its object's.
//!
//! No settings.

use std::time::Duration;

use wasmop_sdk::conditions::{conditions_of, set_condition};
use wasmop_sdk::k8s_openapi::api::core::v1::ConfigMap;
use wasmop_sdk::serde_json::{Value, json};
use wasmop_sdk::{
    Controller, KindRef, Manifest, Plan, Plugin, ReconcileError, SettingsProblem, Snapshot,
    settings,
};

/// The longest hold: the host's default call deadline is 2 s.
pub const MAX_HOLD_MS: u64 = 1200;

/// The `stamper` plugin.
#[derive(Debug)]
pub struct Stamper;

/// `spec.holdMs`, clamped to [`MAX_HOLD_MS`]; 0 when absent or not a
/// number.
pub fn hold(primary: &Value) -> Duration {
    let ms = primary
        .pointer("/spec/holdMs")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    Duration::from_millis(ms.min(MAX_HOLD_MS))
}

impl Plugin for Stamper {
    fn manifest() -> Manifest {
        Manifest::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")).controller(
            Controller::new(
                "stamp",
                KindRef::namespaced("test.wasmop.dev", "v1", "Stamp", "stamps"),
            )
            .owns(KindRef::of::<ConfigMap>()),
        )
    }

    fn validate_settings(value: &Value) -> Result<(), Vec<SettingsProblem>> {
        settings::only_keys(value, &[])
    }

    fn reconcile(snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
        if snapshot.deleting {
            return Ok(Plan::new().cleanup_complete());
        }
        let held = hold(&snapshot.primary);
        if !held.is_zero() {
            std::thread::sleep(held);
        }
        let uid = snapshot
            .primary
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let name = format!("{}-stamp", snapshot.primary_name());
        let config_map = json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": snapshot.primary_namespace()},
            "data": {"uid": uid},
        });
        let mut conditions = conditions_of(&snapshot.primary);
        set_condition(
            &mut conditions,
            "Ready",
            true,
            "Stamped",
            &format!("ConfigMap {name} holds the UID"),
            snapshot.primary_generation(),
            &snapshot.now()?,
        );
        Ok(Plan::new()
            .apply(config_map)
            .status(json!({"uid": uid, "conditions": conditions})))
    }
}

wasmop_sdk::export_plugin!(Stamper);

#[cfg(test)]
mod tests {
    use super::*;
    use wasmop_sdk::testing::{SnapshotBuilder, run};

    #[test]
    fn the_uid_given_goes_into_the_status_and_the_config_map() {
        let snapshot = SnapshotBuilder::new("stamp")
            .primary(json!({"kind": "Stamp",
                "metadata": {"name": "s", "namespace": "ns", "uid": "u-1", "generation": 1}}))
            .now("2025-01-01T00:00:00Z")
            .build();
        let plan = run::<Stamper>(&snapshot).unwrap();
        assert_eq!(plan.apply[0].object["metadata"]["name"], "s-stamp");
        assert_eq!(plan.apply[0].object["data"]["uid"], "u-1");
        assert_eq!(plan.status.unwrap()["uid"], "u-1");
    }

    #[test]
    fn the_hold_is_clamped_and_settings_are_refused() {
        assert_eq!(
            hold(&json!({"spec": {"holdMs": 50}})),
            Duration::from_millis(50)
        );
        assert_eq!(
            hold(&json!({"spec": {"holdMs": 999_999}})),
            Duration::from_millis(MAX_HOLD_MS)
        );
        assert_eq!(hold(&json!({})), Duration::ZERO);
        assert!(Stamper::validate_settings(&json!({"x": 1})).is_err());
        assert!(Stamper::validate_settings(&json!({})).is_ok());
    }

    #[test]
    fn a_deleted_stamp_completes_its_cleanup_at_once() {
        let snapshot = SnapshotBuilder::new("stamp")
            .primary(
                json!({"kind": "Stamp", "metadata": {"name": "s", "uid": "u"},
                "spec": {"holdMs": 1000}}),
            )
            .deleting(true)
            .build();
        let plan = run::<Stamper>(&snapshot).unwrap();
        assert!(plan.cleanup_complete && plan.status.is_none());
    }
}
