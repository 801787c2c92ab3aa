//! Test plugin `waiter`: its primary kind, `Waiter` in
//! `waiting.wasmop.dev/v1`, has a CRD (`tests/fixtures/waiting/`) that
//! only the test of a plugin waiting for a kind not served installs, and
//! only once the operator has started without it. Reconcile writes
//! `status.seen`.
//!
//! It also decides the admission of Widgets (`test.wasmop.dev`, a kind that
//! is served; rule [`RULE`], CREATE), as the `engine` plugin decides
//! FireboltEngines while it waits for cert-manager's CRD: `wait-deny-*` is
//! denied with [`DENIAL`], anything else admitted. So a test sees that a
//! waiting plugin's webhook stays registered and its `admit` keeps deciding.

use wasmop_sdk::admission::{
    AdmissionOperation, AdmissionRequest, AdmissionResponse, AdmissionRule, Admit,
};
use wasmop_sdk::serde_json::{Value, json};
use wasmop_sdk::{
    Controller, KindRef, Manifest, Plan, Plugin, ReconcileError, SettingsProblem, Snapshot,
};

/// The admission rule.
pub const RULE: &str = "widgets";
/// The denial of `wait-deny-*` Widgets.
pub const DENIAL: &str = "waiter: widgets named wait-deny-* are not admitted";

/// The `waiter` plugin.
#[derive(Debug)]
pub struct Waiter;

impl Plugin for Waiter {
    fn manifest() -> Manifest {
        Manifest::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION"))
            .controller(Controller::new(
                "waiter",
                KindRef::namespaced("waiting.wasmop.dev", "v1", "Waiter", "waiters"),
            ))
            .admission(
                AdmissionRule::new(
                    RULE,
                    KindRef::namespaced("test.wasmop.dev", "v1", "Widget", "widgets"),
                )
                .operation(AdmissionOperation::Create),
            )
    }

    fn validate_settings(_settings: &Value) -> Result<(), Vec<SettingsProblem>> {
        Ok(())
    }

    fn reconcile(_snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
        Ok(Plan::new().status(json!({ "seen": true })))
    }
}

impl Admit for Waiter {
    fn admit(request: &AdmissionRequest) -> AdmissionResponse {
        if request.name().starts_with("wait-deny-") {
            AdmissionResponse::deny(DENIAL)
        } else {
            AdmissionResponse::allow()
        }
    }
}

wasmop_sdk_admitting::export_admitting_plugin!(Waiter);

#[cfg(test)]
mod tests {
    use super::*;
    use wasmop_sdk::testing::{SnapshotBuilder, run};

    #[test]
    fn the_status_says_seen() {
        let snapshot = SnapshotBuilder::new("waiter")
            .primary(
                json!({"apiVersion": "waiting.wasmop.dev/v1", "kind": "Waiter",
                            "metadata": {"name": "w", "namespace": "ns"}}),
            )
            .build();
        let plan = run::<Waiter>(&snapshot).unwrap();
        assert_eq!(plan.status.unwrap()["seen"], true);
    }

    #[test]
    fn wait_deny_widgets_are_denied_others_admitted() {
        let request = |name: &str| {
            AdmissionRequest::from_review_request(
                RULE,
                json!({"operation": "CREATE", "name": name, "object": {"metadata": {"name": name}}}),
            )
        };
        assert_eq!(
            Waiter::admit(&request("wait-deny-1")).message.as_deref(),
            Some(DENIAL)
        );
        assert!(!Waiter::admit(&request("wait-deny-1")).allowed);
        assert!(Waiter::admit(&request("fine")).allowed);
    }
}
