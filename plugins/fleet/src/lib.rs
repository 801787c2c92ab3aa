//! The `fleet` plugin: reconciles CelldFleet (`celld.eric.dev/v1alpha1`) as
//! the celld operator does — a fleet of celld members on one dedicated
//! bucket, bound to the fleet's UID by a cluster-scoped
//! CelldStorageReservation.
//!
//! | module | what |
//! | --- | --- |
//! | [`api`] | the CelldFleet spec as read, the fixed and tuning parts as raw JSON |
//! | [`validate`] | configuration rules the plugin enforces itself (env names, layout, image) |
//! | [`render`] | workload, Services, NetworkPolicy, PodDisruptionBudget, Pod template and `CELLD_*` env |
//! | [`reservation`] | the reservation object, its hash and the trusted tuning record |
//! | [`reconcile`] | blockers, scaling one member at a time, pause, member replacement, deletion order, status |
//! | [`names`] | names, labels and annotations |
//! | [`settings`] | the operator settings |
//! | [`preview`] | CelldPreview: the generated preview fleet, its routing, seed and TTL |
//!
//! Objects are owned by label (owner-label ownership: the host stamps
//! `wasmop.dev/owner-uid` and `celld.eric.dev/fleet-uid`), never by
//! ownerReference: deletion must not cascade before the lifecycle gate
//! (finalizer `celld.eric.dev/lifecycle-protection`). Member claims are made
//! by the StatefulSet from a claim template that carries both labels, so
//! they are this fleet's too and its plans may delete them.

pub mod api;
pub mod application;
pub mod mesh;
pub mod names;
pub mod preview;
pub mod previews;
pub mod reconcile;
pub mod render;
pub mod reservation;
pub mod routing;
pub mod settings;
pub mod validate;

#[cfg(test)]
mod tests;

use names::FLEET_UID_LABEL;
use serde_json::Value;
use wasmop_sdk::k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use wasmop_sdk::k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Service, ServiceAccount};
use wasmop_sdk::k8s_openapi::api::networking::v1::NetworkPolicy;
use wasmop_sdk::k8s_openapi::api::policy::v1::PodDisruptionBudget;
use wasmop_sdk::k8s_openapi::api::storage::v1::StorageClass;
use wasmop_sdk::{
    Controller, KindRef, Manifest, OwnedKind, Plan, Plugin, Read, ReconcileError, Selector,
    SettingsProblem, Snapshot,
};

/// Name of the CelldFleet controller.
pub const FLEET_CONTROLLER: &str = "fleet";
/// Read: member Pods of the namespace (label `celld.eric.dev/fleet-uid`).
pub const PODS_READ: &str = "pods";
/// Read: member claims of the namespace (same label).
pub const CLAIMS_READ: &str = "claims";
/// Read: every storage reservation (a fleet must see one it does not hold).
pub const RESERVATIONS_READ: &str = "reservations";
/// Read: the fleet's ServiceAccount.
pub const SERVICE_ACCOUNT_READ: &str = "serviceaccount";
/// Read: Ingresses of the namespace (a same-named Ingress of another owner
/// is left alone).
pub const INGRESSES_READ: &str = "ingresses";
/// Read (optional API): HTTPRoutes of the namespace (a same-named route of
/// another owner is left alone).
pub const HTTP_ROUTES_READ: &str = "httproutes";
/// Read (optional API): Istio AuthorizationPolicies of the namespace (a
/// same-named policy of another owner blocks the mesh).
pub const AUTHORIZATION_POLICIES_READ: &str = "authorizationpolicies";
/// Read (optional API): Istio PeerAuthentications of the namespace.
pub const PEER_AUTHENTICATIONS_READ: &str = "peerauthentications";
/// Read: the PersistentFleet StorageClass.
pub const STORAGE_CLASS_READ: &str = "storageclass";

/// The plugin.
#[derive(Debug)]
pub struct FleetPlugin;

impl Plugin for FleetPlugin {
    fn manifest() -> Manifest {
        Manifest::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION"))
            .controller(
                Controller::new(FLEET_CONTROLLER, api::fleet_kind())
                    .owns_by_label(KindRef::of::<Deployment>(), Some(FLEET_UID_LABEL))
                    .owns_by_label(KindRef::of::<StatefulSet>(), Some(FLEET_UID_LABEL))
                    .owns_by_label(KindRef::of::<Service>(), Some(FLEET_UID_LABEL))
                    .owns_by_label(KindRef::of::<NetworkPolicy>(), Some(FLEET_UID_LABEL))
                    .owns_by_label(KindRef::of::<PodDisruptionBudget>(), Some(FLEET_UID_LABEL))
                    .owns_by_label(
                        KindRef::of::<PersistentVolumeClaim>(),
                        Some(FLEET_UID_LABEL),
                    )
                    .owns_by_label(api::reservation_kind(), Some(FLEET_UID_LABEL))
                    // Member replacement deletes a member Pod; the StatefulSet
                    // (owned above) controls it, so it is a dependent kind.
                    .deletes_dependents(KindRef::of::<Pod>())
                    .owns_by_label(routing::ingress_kind(), Some(FLEET_UID_LABEL))
                    .owns_kind(
                        OwnedKind::label(routing::http_route_kind())
                            .extra_label(FLEET_UID_LABEL)
                            .optional(),
                    )
                    .owns_kind(
                        OwnedKind::label(mesh::authorization_policy_kind())
                            .extra_label(FLEET_UID_LABEL)
                            .optional(),
                    )
                    .owns_kind(
                        OwnedKind::label(mesh::peer_authentication_kind())
                            .extra_label(FLEET_UID_LABEL)
                            .optional(),
                    )
                    .primary_field(&format!(
                        "metadata.annotations.{}",
                        mesh::ISTIO_CONTROL_PLANE_ANNOTATION
                    ))
                    .finalizer(names::FINALIZER)
                    .http_target(
                        application::MEMBERS_TARGET,
                        KindRef::of::<Pod>(),
                        &[names::PEER_PORT as u16],
                    )
                    .reads(Read::new(
                        PODS_READ,
                        KindRef::of::<Pod>(),
                        Selector::Labels(names::FLEET_UID_LABEL.to_owned()),
                    ))
                    .reads(Read::new(
                        CLAIMS_READ,
                        KindRef::of::<PersistentVolumeClaim>(),
                        Selector::Labels(names::FLEET_UID_LABEL.to_owned()),
                    ))
                    .reads(Read::new(
                        RESERVATIONS_READ,
                        api::reservation_kind(),
                        Selector::ClusterWide,
                    ))
                    .reads(Read::new(
                        SERVICE_ACCOUNT_READ,
                        KindRef::of::<ServiceAccount>(),
                        Selector::field("spec.serviceAccountName"),
                    ))
                    .reads(Read::new(
                        INGRESSES_READ,
                        routing::ingress_kind(),
                        Selector::SameNamespace,
                    ))
                    .reads(
                        Read::new(
                            HTTP_ROUTES_READ,
                            routing::http_route_kind(),
                            Selector::SameNamespace,
                        )
                        .optional(),
                    )
                    .reads(
                        Read::new(
                            AUTHORIZATION_POLICIES_READ,
                            mesh::authorization_policy_kind(),
                            Selector::SameNamespace,
                        )
                        .optional(),
                    )
                    .reads(
                        Read::new(
                            PEER_AUTHENTICATIONS_READ,
                            mesh::peer_authentication_kind(),
                            Selector::SameNamespace,
                        )
                        .optional(),
                    )
                    .reads(Read::new(
                        STORAGE_CLASS_READ,
                        KindRef::of::<StorageClass>(),
                        Selector::field("spec.storage.storageClassName"),
                    )),
            )
            .controller(preview::controller())
    }

    fn validate_settings(settings: &Value) -> Result<(), Vec<SettingsProblem>> {
        settings::validate(settings)
    }

    fn reconcile(snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
        if snapshot.controller == preview::PREVIEW_CONTROLLER {
            return preview::reconcile(snapshot);
        }
        reconcile::reconcile(snapshot)
    }
}

#[cfg(target_arch = "wasm32")]
wasmop_sdk::export_plugin!(FleetPlugin);
