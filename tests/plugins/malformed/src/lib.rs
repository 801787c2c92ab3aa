//! Test plugin `malformed`: reconcile returns an apply op whose object is
//! not valid JSON ([`BROKEN_OBJECT`]). The host must reject the plan as
//! malformed output and write nothing.
//!
//! The typed SDK path always serializes valid JSON, so this plugin uses the
//! SDK's low-level escape hatch: it implements [`RawPlugin`] over the
//! WIT-level types and exports with `export_raw_plugin!`.

use wasmop_sdk::k8s_openapi::api::core::v1::ConfigMap;
use wasmop_sdk::raw::{self, RawPlugin};
use wasmop_sdk::{Controller, KindRef, Manifest, Plan};

/// The apply op's object: JSON cut off in the middle.
pub const BROKEN_OBJECT: &str = r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"#;

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
    fn manifest() -> raw::Manifest {
        manifest().into()
    }

    fn validate_settings(settings: String) -> Result<(), Vec<raw::SettingsProblem>> {
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
            Err(problems.into_iter().map(Into::into).collect())
        }
    }

    fn reconcile(_snapshot: raw::Snapshot) -> Result<raw::Plan, raw::ReconcileError> {
        let mut plan: raw::Plan = Plan::new().into();
        plan.apply.push(raw::ApplyOp {
            object: BROKEN_OBJECT.to_owned(),
            precondition: None,
            force: false,
        });
        Ok(plan)
    }
}

wasmop_sdk::export_raw_plugin!(Malformed);

#[cfg(test)]
mod tests {
    use super::*;
    use wasmop_sdk::ReconcileError;
    use wasmop_sdk::testing::SnapshotBuilder;

    #[test]
    fn apply_object_is_not_json() {
        let snapshot = SnapshotBuilder::new("malformed").build();
        let plan = Malformed::reconcile(snapshot.into()).unwrap();
        assert_eq!(plan.apply.len(), 1);
        assert!(
            wasmop_sdk::serde_json::from_str::<wasmop_sdk::serde_json::Value>(
                &plan.apply[0].object
            )
            .is_err()
        );
        assert!(matches!(
            Plan::try_from(plan),
            Err(ReconcileError::Internal(m)) if m.starts_with("plan apply[0].object is not valid JSON")
        ));
    }

    #[test]
    fn manifest_and_settings_are_well_formed() {
        let m = Malformed::manifest();
        assert_eq!(m.name, "malformed");
        assert_eq!(m.controllers[0].primary.kind, "Malformed");
        assert!(Malformed::validate_settings("{}".into()).is_ok());
        assert_eq!(
            Malformed::validate_settings(r#"{"x":1}"#.into())
                .unwrap_err()
                .len(),
            1
        );
    }
}
