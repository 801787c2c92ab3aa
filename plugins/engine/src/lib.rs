//! The `engine` plugin: reconciles FireboltEngine and FireboltEngineClass
//! (`compute.firebolt.io/v1alpha1`) as the upstream firebolt operator
//! does: engines run as blue-green generations of a StatefulSet behind a
//! stable `<e>-service`, gated on their FireboltInstance, with pod
//! templates merged from operator defaults, the engine's class and the
//! engine.
//!
//! | controller | primary | module |
//! | --- | --- | --- |
//! | `engine` | FireboltEngine | [`engine`] (phase machine), [`gate`], [`render`], [`merge`], [`drain`] |
//! | `engineclass` | FireboltEngineClass | [`class`] (deletion guard finalizer) |
//!
//! The engine controller reads its instance and class through field
//! references (`spec.instanceRef`, `spec.engineClassRef`), so the host
//! re-triggers every referencing engine when either changes; it reads the
//! Pods labelled `firebolt.io/engine` in its namespace for readiness and
//! the drain check, which it performs through host observations on the
//! metrics port. The wasm glue is the `export_admitting_plugin!` line at
//! the bottom: the plugin also decides two validating webhooks the host
//! serves ([`admission`]): an engine must name an existing class, and a
//! class cannot be deleted while engines reference it.

pub mod admission;
pub mod class;
pub mod drain;
pub mod engine;
pub mod gate;
pub mod merge;
pub mod names;
pub mod render;
pub mod security;
pub mod settings;
pub mod spec;
pub mod stuck;

#[cfg(test)]
mod tests;

use serde_json::Value;
use wasmop_sdk::admission::{AdmissionRequest, AdmissionResponse, Admit};
use wasmop_sdk::k8s_openapi::api::apps::v1::StatefulSet;
use wasmop_sdk::k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};
use wasmop_sdk::{
    Controller, KindRef, Manifest, Plan, Plugin, Read, ReconcileError, Selector, SettingsProblem,
    Snapshot,
};

/// Name of the FireboltEngine controller.
pub const ENGINE_CONTROLLER: &str = "engine";
/// Name of the FireboltEngineClass controller.
pub const CLASS_CONTROLLER: &str = "engineclass";
/// Read of the engine's FireboltInstance.
pub const INSTANCE_READ: &str = "instance";
/// Read of the engine's FireboltEngineClass.
pub const CLASS_READ: &str = "class";
/// Read of the engine Pods of the namespace.
pub const POD_READ: &str = "pods";
/// HTTP target: engine Pods, metrics port only.
pub const POD_TARGET: &str = "pods";
/// Read of the class's namespace's engines.
pub const ENGINES_READ: &str = "engines";

/// The plugin.
#[derive(Debug)]
pub struct EnginePlugin;

impl Plugin for EnginePlugin {
    fn manifest() -> Manifest {
        admission::rules(Manifest::new(
            env!("CARGO_PKG_NAME"),
            env!("CARGO_PKG_VERSION"),
        ))
        .controller(
            Controller::new(ENGINE_CONTROLLER, spec::engine_kind())
                .owns(KindRef::of::<StatefulSet>())
                .owns(KindRef::of::<Service>())
                .owns(KindRef::of::<ConfigMap>())
                .owns(KindRef::of::<Secret>())
                .owns(names::certificate_kind())
                .reads(Read::new(
                    INSTANCE_READ,
                    spec::instance_kind(),
                    Selector::field("spec.instanceRef"),
                ))
                .reads(Read::new(
                    CLASS_READ,
                    spec::class_kind(),
                    Selector::field("spec.engineClassRef"),
                ))
                .reads(Read::new(
                    POD_READ,
                    KindRef::of::<Pod>(),
                    Selector::Labels(names::ENGINE_LABEL.to_owned()),
                ))
                .http_target(
                    POD_TARGET,
                    KindRef::of::<Pod>(),
                    &[names::METRICS_PORT as u16],
                ),
        )
        .controller(
            Controller::new(CLASS_CONTROLLER, spec::class_kind())
                .reads(Read::new(
                    ENGINES_READ,
                    spec::engine_kind(),
                    Selector::SameNamespace,
                ))
                .finalizer(class::DELETION_GUARD),
        )
    }

    fn validate_settings(settings: &Value) -> Result<(), Vec<SettingsProblem>> {
        settings::validate(settings)
    }

    fn reconcile(snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
        match snapshot.controller.as_str() {
            CLASS_CONTROLLER => class::reconcile(snapshot),
            _ => engine::reconcile(snapshot),
        }
    }
}

impl Admit for EnginePlugin {
    fn admit(request: &AdmissionRequest) -> AdmissionResponse {
        admission::admit(request)
    }
}

#[cfg(target_arch = "wasm32")]
wasmop_sdk_admitting::export_admitting_plugin!(EnginePlugin);
