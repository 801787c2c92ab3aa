//! Test plugin `service-caller`: for each `ServiceCaller`
//! (`test.wasmop.dev/v1`) it reads the Service named by `spec.service` and
//! plans a GET with id `call` to it through the declared http-target
//! `service` (port 80), then writes the result to `status.observed`. The
//! host decides whether that Service may be called at all.

use wasmop_sdk::k8s_openapi::api::core::v1::Service;
use wasmop_sdk::serde_json::{Value, json};
use wasmop_sdk::{
    Controller, HttpMethod, HttpRequest, KindRef, Manifest, Plan, Plugin, Read, ReconcileError,
    Selector, SettingsProblem, Snapshot, settings,
};

/// Id of the request and of its observation.
pub const CALL: &str = "call";

/// The port declared for the target.
pub const PORT: u16 = 80;

/// The `service-caller` plugin.
#[derive(Debug)]
pub struct ServiceCaller;

impl Plugin for ServiceCaller {
    fn manifest() -> Manifest {
        Manifest::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")).controller(
            Controller::new(
                "servicecaller",
                KindRef::namespaced("test.wasmop.dev", "v1", "ServiceCaller", "servicecallers"),
            )
            .reads(Read::new(
                "service",
                KindRef::of::<Service>(),
                Selector::field("spec.service"),
            ))
            .http_target("service", KindRef::of::<Service>(), &[PORT]),
        )
    }

    fn validate_settings(settings: &Value) -> Result<(), Vec<SettingsProblem>> {
        settings::only_keys(settings, &[])
    }

    fn reconcile(snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
        let service = snapshot
            .primary
            .pointer("/spec/service")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        if service.is_empty() {
            return Err(ReconcileError::invalid_spec("spec.service is required"));
        }
        let request = HttpRequest::new(CALL, HttpMethod::Get, "service", &service, PORT, "/");
        let mut plan = Plan::new().http(request);
        if let Some(o) = snapshot.observation(CALL) {
            plan = plan.status(json!({
                "observed": {"status": o.status, "body": o.body, "error": o.error},
            }));
        }
        Ok(plan)
    }
}

#[cfg(target_arch = "wasm32")]
wasmop_sdk::export_plugin!(ServiceCaller);

#[cfg(test)]
mod tests {
    use super::*;
    use wasmop_sdk::testing::{SnapshotBuilder, run};

    #[test]
    fn plans_a_get_to_the_named_service() {
        let snapshot = SnapshotBuilder::from_yaml(
            "servicecaller",
            "apiVersion: test.wasmop.dev/v1\nkind: ServiceCaller\n\
             metadata: {name: c, namespace: ns, uid: u-1}\nspec: {service: api}\n",
        )
        .build();
        let plan = run::<ServiceCaller>(&snapshot).unwrap();
        assert_eq!(
            plan.http_requests,
            vec![HttpRequest::new(
                CALL,
                HttpMethod::Get,
                "service",
                "api",
                PORT,
                "/"
            )]
        );
        let m = ServiceCaller::manifest();
        assert_eq!(m.controllers[0].http_targets[0].ports, vec![PORT]);
    }
}
