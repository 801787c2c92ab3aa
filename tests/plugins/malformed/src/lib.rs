//! Test plugin `malformed`: reconcile returns a plan whose apply op's
//! object is not a JSON object but a string ([`BROKEN_OBJECT`]). The host
//! must reject the plan as malformed output and write nothing.
//!
//! The typed SDK path always produces well-formed plans, so this plugin
//! uses the SDK's low-level escape hatch: it implements [`RawPlugin`] over
//! the WIT-level types (plan as JSON text) and exports with
//! `export_raw_plugin!`.

use wasmop_sdk::k8s_openapi::api::core::v1::ConfigMap;
use wasmop_sdk::raw::{self, RawPlugin};
use wasmop_sdk::{Controller, KindRef, Manifest};

/// The apply op's object: a JSON string where an object must be.
pub const BROKEN_OBJECT: &str = r#""apiVersion: v1, kind: ConfigMap""#;

/// The plan text the plugin returns.
pub fn broken_plan() -> String {
    format!(r#"{{"apply":[{{"object":{BROKEN_OBJECT},"precondition":null,"force":false}}]}}"#)
}

/// The `malformed` plugin.
#[derive(Debug)]
pub struct Malformed;

fn manifest() -> Manifest {
    Manifest::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")).controller(
        Controller::new(
            "malformed",
            KindRef::namespaced("test.wasmop.dev", "v1", "Malformed", "malformeds"),
        )
        .owns(KindRef::of::<ConfigMap>()),
    )
}

impl RawPlugin for Malformed {
    fn manifest() -> String {
        wasmop_sdk::serde_json::to_string(&manifest()).unwrap_or_default()
    }

    fn validate_settings(settings: String) -> Result<(), String> {
        let problems = match wasmop_sdk::serde_json::from_str(&settings) {
            Ok(value) => wasmop_sdk::settings::only_keys(&value, &[])
                .err()
                .unwrap_or_default(),
            Err(e) => vec![wasmop_sdk::SettingsProblem::new(
                "",
                format!("not JSON: {e}"),
            )],
        };
        if problems.is_empty() {
            Ok(())
        } else {
            Err(wasmop_sdk::serde_json::to_string(&problems).unwrap_or_default())
        }
    }

    fn reconcile(_snapshot: raw::Snapshot) -> Result<String, raw::ReconcileError> {
        Ok(broken_plan())
    }
}

wasmop_sdk::export_raw_plugin!(Malformed);

#[cfg(test)]
mod tests {
    use super::*;
    use wasmop_sdk::testing::SnapshotBuilder;

    #[test]
    fn the_plan_is_json_but_its_object_is_not_an_object() {
        let snapshot = SnapshotBuilder::new("malformed").build();
        let text = Malformed::reconcile(snapshot.into()).unwrap();
        let plan: wasmop_sdk::serde_json::Value =
            wasmop_sdk::serde_json::from_str(&text).expect("the plan text is JSON");
        assert!(plan["apply"][0]["object"].is_string());
    }

    #[test]
    fn manifest_and_settings_are_well_formed() {
        let m: wasmop_sdk::Manifest =
            wasmop_sdk::serde_json::from_str(&Malformed::manifest()).unwrap();
        assert_eq!(m.name, "malformed");
        assert_eq!(m.controllers[0].primary.kind, "Malformed");
        assert!(Malformed::validate_settings("{}".into()).is_ok());
        let problems: Vec<wasmop_sdk::SettingsProblem> = wasmop_sdk::serde_json::from_str(
            &Malformed::validate_settings(r#"{"x":1}"#.into()).unwrap_err(),
        )
        .unwrap();
        assert_eq!(problems.len(), 1);
    }
}
