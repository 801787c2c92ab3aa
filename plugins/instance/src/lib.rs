//! The `instance` plugin: reconciles FireboltInstance
//! (`compute.firebolt.io/v1alpha1`), the shared infrastructure Firebolt
//! engines run against — PostgreSQL, the metadata service and the Envoy
//! gateway — and publishes the endpoints engines need.
//!
//! A reconcile ([`reconcile::reconcile`]) settles `spec.id` (a ULID,
//! generated once, see [`ids`]) and runs isolated steps, each reporting on
//! its own condition:
//!
//! | step | module | condition |
//! | --- | --- | --- |
//! | auth (rotation: [`rotation`]) | [`auth`] via [`security`] | `AuthReady` |
//! | engine TLS, trust bundle | [`engine_tls`] via [`security`] | `EngineTLSReady` |
//! | gateway TLS (fail-closed) | [`gateway_tls`] via [`security`] | `GatewayTLSReady` |
//! | postgres | [`postgres`] | `PostgresReady` |
//! | metadata | [`metadata`] | `MetadataReady` |
//! | gateway | [`gateway`] (config: [`envoy`]) | `GatewayReady` |
//! | status | [`status`] | `Ready` roll-up, phase, endpoints |
//!
//! Every step is a plain function over typed inputs ([`step::Context`]);
//! the wasm glue is the one `export_plugin!` line at the bottom of this
//! file. Deletion needs no finalizer: everything the instance creates
//! carries its ownerReference and is garbage-collected with it.

pub mod auth;
pub mod certs;
pub mod duration;
pub mod engine_tls;
pub mod envoy;
pub mod fleet;
pub mod gateway;
pub mod gateway_tls;
pub mod ids;
pub mod metadata;
pub mod names;
pub mod pem;
pub mod podtemplate;
pub mod postgres;
pub mod reconcile;
pub mod rotation;
pub mod security;
pub mod settings;
pub mod spec;
pub mod status;
pub mod step;
pub mod validate;
pub mod workload;

#[cfg(test)]
mod rotation_model;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_security;

use serde_json::Value;
use wasmop_sdk::k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use wasmop_sdk::k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use wasmop_sdk::k8s_openapi::api::policy::v1::PodDisruptionBudget;
use wasmop_sdk::{
    Controller, KindRef, Manifest, Plan, Plugin, Read, ReconcileError, Selector, SettingsProblem,
    Snapshot,
};

/// Name of the plugin's one controller.
pub const CONTROLLER: &str = "instance";

/// The plugin.
#[derive(Debug)]
pub struct InstancePlugin;

impl Plugin for InstancePlugin {
    fn manifest() -> Manifest {
        Manifest::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")).controller(
            Controller::new(CONTROLLER, spec::kind_ref())
                .owns(KindRef::of::<StatefulSet>())
                .owns(KindRef::of::<Deployment>())
                .owns(KindRef::of::<Service>())
                .owns(KindRef::of::<ConfigMap>())
                .owns(KindRef::of::<Secret>())
                .owns(KindRef::of::<PodDisruptionBudget>())
                .owns(certs::kind_ref())
                .reads(Read::new(
                    postgres::CREDENTIALS_READ,
                    KindRef::of::<Secret>(),
                    Selector::field(postgres::CREDENTIALS_FIELD),
                ))
                .reads(Read::new(
                    auth::ADMIN_PASSWORD_READ,
                    KindRef::of::<Secret>(),
                    Selector::field(auth::ADMIN_PASSWORD_FIELD),
                ))
                .reads(Read::new(
                    gateway_tls::CLIENT_CA_READ,
                    KindRef::of::<Secret>(),
                    Selector::field(gateway_tls::CLIENT_CA_FIELD),
                ))
                .reads(Read::new(
                    gateway_tls::USER_SECRET_READ,
                    KindRef::of::<Secret>(),
                    Selector::field(gateway_tls::USER_SECRET_FIELD),
                ))
                .reads(Read::new(
                    engine_tls::USER_SECRET_READ,
                    KindRef::of::<Secret>(),
                    Selector::field(engine_tls::USER_SECRET_FIELD),
                ))
                .reads(Read::new(
                    engine_tls::CRL_READ,
                    KindRef::of::<Secret>(),
                    Selector::field(engine_tls::CRL_FIELD),
                ))
                .reads(Read::new(
                    gateway_tls::CRL_READ,
                    KindRef::of::<Secret>(),
                    Selector::field(gateway_tls::CRL_FIELD),
                ))
                .reads(Read::new(
                    engine_tls::ENGINE_SECRETS_READ,
                    KindRef::of::<Secret>(),
                    Selector::Labels(engine_tls::ENGINE_SECRETS_SELECTOR.to_owned()),
                ))
                .reads(Read::new(
                    fleet::ENGINES_READ,
                    KindRef::namespaced(
                        spec::GROUP,
                        spec::VERSION,
                        "FireboltEngine",
                        "fireboltengines",
                    ),
                    Selector::SameNamespace,
                ))
                .primary_field("spec.id"),
        )
    }

    fn validate_settings(settings: &Value) -> Result<(), Vec<SettingsProblem>> {
        settings::validate(settings)
    }

    fn reconcile(snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
        reconcile::reconcile(snapshot)
    }
}

#[cfg(target_arch = "wasm32")]
wasmop_sdk::export_plugin!(InstancePlugin);
