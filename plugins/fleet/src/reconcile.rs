//! One reconcile of a CelldFleet: checks, reservation, infrastructure,
//! workload (scaling one member at a time on the way down, held while
//! paused), member replacement, deletion order, status.

use std::time::Duration;

use serde_json::{Value, json};
use wasmop_sdk::conditions::{ConditionStatus, conditions_of, find_condition, set_condition};
use wasmop_sdk::hash::stable_hash;
use wasmop_sdk::k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use wasmop_sdk::{Plan, ReconcileError, Snapshot};

use crate::api::Fleet;
use crate::application;
use crate::mesh;
use crate::names::*;
use crate::previews;
use crate::render;
use crate::reservation::{Binding, binding};
use crate::routing;
use crate::settings::Settings;
use crate::validate;
use crate::{
    AUTHORIZATION_POLICIES_READ, CLAIMS_READ, HTTP_ROUTES_READ, INGRESSES_READ,
    PEER_AUTHENTICATIONS_READ, PODS_READ, RESERVATIONS_READ, SERVICE_ACCOUNT_READ,
    STORAGE_CLASS_READ,
};

/// Fallback requeue while something is in motion (owned and read objects
/// re-trigger the fleet sooner).
pub const PROGRESS_REQUEUE: Duration = Duration::from_secs(5);
/// How often a fleet waiting for an optional API (Gateway API, Istio)
/// looks again: an API that appears raises no event for it.
pub const API_POLL: Duration = Duration::from_secs(30);

/// Condition types, as upstream.
pub mod types {
    /// Every desired member is ready.
    pub const READY: &str = "Ready";
    /// Services, NetworkPolicy, PodDisruptionBudget and reservation exist.
    pub const INFRASTRUCTURE_READY: &str = "InfrastructureReady";
    /// Something the operator cannot fix stops the fleet; the reason says what.
    pub const BLOCKED: &str = "Blocked";
    /// A rollout, scale or replacement is under way.
    pub const PROGRESSING: &str = "Progressing";
    /// `maintenance.paused` holds workload changes.
    pub const MAINTENANCE_PAUSED: &str = "MaintenancePaused";
    /// Deletion is removing compute, then claims.
    pub const DELETING: &str = "Deleting";
    /// The settle signal: the workload matches the current generation and every member is ready.
    pub const PROVISIONED: &str = "Provisioned";
}

/// Blocker reasons, as upstream.
pub mod reasons {
    /// The spec cannot be run as written, or changes a field fixed at creation.
    pub const INVALID_CONFIGURATION: &str = "InvalidConfiguration";
    /// `spec.serviceAccountName` does not exist.
    pub const SERVICE_ACCOUNT_MISSING: &str = "ServiceAccountMissing";
    /// The PersistentFleet StorageClass does not exist.
    pub const STORAGE_CLASS_MISSING: &str = "StorageClassMissing";
    /// The bucket is reserved by another fleet UID, or the hash no longer verifies.
    pub const STORAGE_SCOPE_CONFLICT: &str = "StorageScopeConflict";
    /// An API the spec needs (Istio's `security.istio.io/v1`) is not served.
    pub const INFRASTRUCTURE_BLOCKED: &str = "InfrastructureBlocked";
}

/// What the fleet's objects look like in this snapshot.
#[derive(Debug, Default)]
pub struct Observed<'a> {
    /// The Deployment or StatefulSet named after the fleet.
    pub workload: Option<&'a Value>,
    /// Owned Services, NetworkPolicy and PodDisruptionBudget.
    pub infrastructure: Vec<&'a Value>,
    /// Member Pods (label `celld.eric.dev/fleet-uid=<uid>`).
    pub pods: Vec<&'a Value>,
    /// Member claims (same label).
    pub claims: Vec<&'a Value>,
    /// The fleet's own reservation (named after the bucket, or after
    /// bucket and prefix for a preview fleet), whoever holds it.
    pub reservation: Option<&'a Value>,
    /// The reservation of the preview pool's bucket: a pool's preview
    /// bucket, or the bucket a preview fleet runs in.
    pub pool: Option<&'a Value>,
    /// The ServiceAccount exists.
    pub service_account: bool,
    /// The StorageClass exists.
    pub storage_class: bool,
}

fn labelled<'a>(objects: impl Iterator<Item = &'a Value>, uid: &str) -> Vec<&'a Value> {
    objects
        .filter(|o| o["metadata"]["labels"][FLEET_UID_LABEL].as_str() == Some(uid))
        .collect()
}

impl<'a> Observed<'a> {
    /// Collects the fleet's objects from `snapshot`.
    pub fn of(snapshot: &'a Snapshot, fleet: &Fleet) -> Self {
        let name = fleet.metadata.name.as_str();
        let peers = peers_service(name);
        let named = |o: &&Value, kinds: &[&str], names: &[&str]| {
            kinds.contains(&o["kind"].as_str().unwrap_or(""))
                && names.contains(&o["metadata"]["name"].as_str().unwrap_or(""))
        };
        let workload = snapshot
            .owned
            .iter()
            .find(|o| named(o, &["Deployment", "StatefulSet"], &[name]));
        let infrastructure = snapshot
            .owned
            .iter()
            .filter(|o| {
                named(o, &["Service"], &[name, peers.as_str()])
                    || named(o, &["NetworkPolicy", "PodDisruptionBudget"], &[name])
            })
            .collect();
        let reservation_name = previews::own_reservation_name(fleet);
        let pool_name = previews::pool_reservation_name(fleet);
        let reserved = |name: &str| {
            snapshot
                .related(RESERVATIONS_READ)
                .find(|r| r["metadata"]["name"].as_str() == Some(name))
        };
        Observed {
            workload,
            infrastructure,
            pods: labelled(snapshot.related(PODS_READ), &fleet.metadata.uid),
            claims: labelled(snapshot.related(CLAIMS_READ), &fleet.metadata.uid),
            reservation: reserved(&reservation_name),
            pool: pool_name.as_deref().and_then(reserved),
            service_account: snapshot.related(SERVICE_ACCOUNT_READ).next().is_some(),
            storage_class: snapshot.related(STORAGE_CLASS_READ).next().is_some(),
        }
    }

    fn infrastructure_complete(&self) -> bool {
        self.infrastructure.len() == 4
    }
}

fn terminating(pod: &Value) -> bool {
    !pod["metadata"]["deletionTimestamp"].is_null()
}

fn nonterminal(pod: &Value) -> bool {
    !terminating(pod)
        && !matches!(
            pod["status"]["phase"].as_str(),
            Some("Succeeded" | "Failed")
        )
}

fn pod_ready_condition(pod: &Value) -> Option<&Value> {
    pod["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")
}

fn ready(pod: &Value) -> bool {
    nonterminal(pod) && pod_ready_condition(pod).is_some_and(|c| c["status"] == "True")
}

/// Member counts for status and /scale.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Pods not terminating and not finished (`status.replicas`, served by /scale).
    pub nonterminal: i64,
    /// Ready nonterminal Pods.
    pub ready: i64,
    /// Pods being deleted.
    pub terminating: i64,
    /// Every Pod seen.
    pub observed: i64,
}

fn counts(pods: &[&Value]) -> Counts {
    let n = |f: fn(&Value) -> bool| pods.iter().filter(|p| f(p)).count() as i64;
    Counts {
        nonterminal: n(nonterminal),
        ready: n(ready),
        terminating: n(terminating),
        observed: pods.len() as i64,
    }
}

fn int_at(v: &Value, path: &[&str]) -> i64 {
    path.iter().fold(v, |v, k| &v[*k]).as_i64().unwrap_or(0)
}

/// True when the workload's controller has caught up with its spec and
/// every one of its replicas is updated and ready.
pub fn workload_settled(workload: &Value) -> bool {
    let want = int_at(workload, &["spec", "replicas"]);
    let status = &workload["status"];
    int_at(status, &["observedGeneration"]) >= int_at(workload, &["metadata", "generation"])
        && int_at(status, &["replicas"]) == want
        && int_at(status, &["updatedReplicas"]) == want
        && int_at(status, &["readyReplicas"]) == want
}

fn workload_annotation<'v>(workload: &'v Value, key: &str) -> Option<&'v str> {
    workload["metadata"]["annotations"][key].as_str()
}

struct Status<'a> {
    conditions: Vec<Condition>,
    generation: Option<i64>,
    now: Time,
    primary: &'a Value,
}

impl Status<'_> {
    fn set(&mut self, type_: &str, status: bool, reason: &str, message: &str) {
        set_condition(
            &mut self.conditions,
            type_,
            status,
            reason,
            message,
            self.generation,
            &self.now,
        );
    }

    fn set_any(&mut self, type_: &str, status: ConditionStatus, reason: &str, message: &str) {
        set_condition(
            &mut self.conditions,
            type_,
            status,
            reason,
            message,
            self.generation,
            &self.now,
        );
    }

    fn drop_condition(&mut self, type_: &str) {
        self.conditions.retain(|c| c.type_ != type_);
    }

    fn was(&self, type_: &str) -> Option<&Condition> {
        find_condition(&self.conditions, type_)
    }

    fn document(
        &self,
        fleet: &Fleet,
        c: Counts,
        applied: Option<i64>,
        blocked_since: Option<String>,
    ) -> Value {
        let mut status = json!({
            "replicas": c.nonterminal,
            "labelSelector": selector_text(&fleet.metadata.uid),
            "readyReplicas": c.ready,
            "terminatingReplicas": c.terminating,
            "observedReplicas": c.observed,
            "desiredReplicas": fleet.spec.replicas(),
            "reservation": previews::own_reservation_name(fleet),
            "conditions": self.conditions,
        });
        if let Some(a) = applied {
            status["appliedReplicas"] = json!(a);
        }
        if let Some(since) = blocked_since {
            status["blockedSince"] = json!(since);
        }
        status
    }
}

/// The reconcile of one CelldFleet.
///
/// # Errors
///
/// `InvalidSpec` when the fleet does not have the CRD's shape (the host
/// reports it on the fleet); `Internal` when a snapshot object lacks its
/// identity.
pub fn reconcile(snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
    let settings: Settings = snapshot.settings_as()?;
    let fleet: Fleet = snapshot.primary_as()?;
    let observed = Observed::of(snapshot, &fleet);
    let mut st = Status {
        conditions: conditions_of(&snapshot.primary),
        generation: snapshot.primary_generation(),
        now: snapshot.now()?,
        primary: &snapshot.primary,
    };
    let routes = routing::Owned::of(snapshot, &fleet);
    let mesh_name = mesh::mesh_name(&fleet.metadata.name);
    let mesh_objects: Vec<&Value> = ["AuthorizationPolicy", "PeerAuthentication"]
        .into_iter()
        .filter_map(|k| snapshot.owned_named(k, &mesh_name))
        .collect();
    if snapshot.deleting {
        let mut closing = routes.all();
        closing.extend(mesh_objects.iter().copied());
        return deletion(&fleet, &observed, &closing, &mut st);
    }
    st.set(types::DELETING, false, "NotDeleting", "");
    let c = counts(&observed.pods);
    let applied = observed.workload.map(|w| int_at(w, &["spec", "replicas"]));

    if let Some((reason, message)) = blocker(snapshot, &fleet, &observed) {
        return Ok(blocked(
            &fleet, &observed, &mut st, c, applied, reason, &message,
        ));
    }

    if let Some(message) = previews::child_problem(&fleet, observed.pool) {
        return Ok(blocked(
            &fleet,
            &observed,
            &mut st,
            c,
            applied,
            reasons::STORAGE_SCOPE_CONFLICT,
            &message,
        ));
    }
    let mut plan = Plan::new();
    match binding(&fleet, &snapshot.primary, observed.reservation) {
        Binding::Conflict { message } => {
            return Ok(blocked(
                &fleet,
                &observed,
                &mut st,
                c,
                applied,
                reasons::STORAGE_SCOPE_CONFLICT,
                &message,
            ));
        }
        Binding::Missing { object } => {
            // The reservation comes first, alone: nothing else is created
            // until the bucket is bound to this UID (its creation re-triggers).
            st.set(types::BLOCKED, false, "NotBlocked", "");
            let scope = match previews::child_prefix(&fleet) {
                Some(prefix) => format!("prefix {prefix} of bucket {}", fleet.spec.storage.bucket),
                None => format!("bucket {}", fleet.spec.storage.bucket),
            };
            st.set(
                types::INFRASTRUCTURE_READY,
                false,
                "ReservingStorage",
                &format!("reserving {scope}"),
            );
            st.set(
                types::PROVISIONED,
                false,
                "Provisioning",
                "reserving storage",
            );
            st.set(
                types::PROGRESSING,
                true,
                "Provisioning",
                "reserving storage",
            );
            pause_condition(&fleet, &mut st);
            ready_condition(&fleet, c, &mut st);
            let status = st.document(&fleet, c, applied, None);
            return Ok(plan
                .apply_if_absent(object)
                .status(status)
                .event(
                    "StorageReserved",
                    format!("reserving {scope} for this fleet"),
                )
                .requeue_after(PROGRESS_REQUEUE));
        }
        Binding::Bound { record } => {
            if let Some(record) = record {
                plan = plan.apply(record);
            }
        }
    }
    st.set(types::BLOCKED, false, "NotBlocked", "");
    // A pool's preview bucket: its own condition, never blocking the runtime.
    match previews::pool(&fleet, observed.pool) {
        Some(previews::Pool::Reserve { object }) => {
            let bucket = previews::preview_bucket(&fleet).unwrap_or("");
            plan = plan.apply_if_absent(object).event(
                "PreviewStorageReserved",
                format!("reserving preview bucket {bucket} for this fleet's previews"),
            );
            st.set_any(
                previews::PREVIEWS_READY,
                ConditionStatus::Unknown,
                "ReservingStorage",
                &format!("reserving preview bucket {bucket}"),
            );
        }
        Some(previews::Pool::Reserved) => st.set(
            previews::PREVIEWS_READY,
            true,
            "Reserved",
            &format!(
                "preview bucket {} is reserved to this fleet",
                previews::preview_bucket(&fleet).unwrap_or("")
            ),
        ),
        Some(previews::Pool::Conflict { message }) => st.set(
            previews::PREVIEWS_READY,
            false,
            reasons::STORAGE_SCOPE_CONFLICT,
            &message,
        ),
        None => {}
    }

    // The mesh: every member Pod (terminating ones too) must run a proxy
    // before the peer port goes strict; on departure istiod egress, the
    // PeerAuthentication and the identity-free peer rule are kept until the
    // last proxy has exited.
    let istio = fleet.spec.istio().cloned();
    let any_proxy = observed.pods.iter().any(|p| mesh::has_proxy(p));
    let all_proxied = !observed.pods.is_empty() && observed.pods.iter().all(|p| mesh::has_proxy(p));
    let recorded_plane = fleet
        .metadata
        .annotations
        .get(mesh::ISTIO_CONTROL_PLANE_ANNOTATION)
        .and_then(Value::as_str)
        .map(str::to_owned);
    let istiod = match &istio {
        Some(i) => Some(i.control_plane().to_owned()),
        None if any_proxy => Some(
            recorded_plane
                .clone()
                .unwrap_or_else(|| "istio-system".to_owned()),
        ),
        None => None,
    };

    // Departure: the Pod template drops the proxy only once the snapshot
    // shows the permissive peer policy in place (a pass later than the one
    // that applies it), never in the same plan.
    let keeping_proxy = istio.is_none()
        && any_proxy
        && observed.workload.is_some_and(mesh::template_in_mesh)
        && !mesh::departure_in_place(
            snapshot.owned_named("AuthorizationPolicy", &mesh_name),
            snapshot.owned_named("PeerAuthentication", &mesh_name),
        );
    let template_fleet = keeping_proxy.then(|| mesh::keeping_proxy(&fleet));
    let template_fleet = template_fleet.as_ref().unwrap_or(&fleet);

    // Infrastructure: never held by maintenance.
    plan = plan
        .apply(render::application_service(&fleet))
        .apply(render::peers_service_object(&fleet))
        .apply(render::network_policy_with(
            &fleet,
            &settings,
            istiod.as_deref(),
        ))
        .apply(render::disruption_budget(&fleet));
    match &istio {
        Some(i) => {
            if recorded_plane.as_deref() != Some(i.control_plane()) {
                plan = plan.primary_patch(json!({"metadata": {"annotations": {
                    (mesh::ISTIO_CONTROL_PLANE_ANNOTATION): i.control_plane()
                }}}));
            }
            plan = plan.apply(mesh::authorization_policy(
                &fleet,
                i,
                &settings,
                all_proxied,
            ));
            if !all_proxied {
                plan = plan.apply(mesh::peer_authentication(&fleet));
            } else if let Some(pa) = snapshot
                .owned_named("PeerAuthentication", &mesh_name)
                .filter(|o| o["metadata"]["deletionTimestamp"].is_null())
            {
                plan = plan.delete_owned(pa)?;
            }
        }
        None if !any_proxy => {
            for o in mesh_objects
                .iter()
                .filter(|o| o["metadata"]["deletionTimestamp"].is_null())
            {
                plan = plan.delete_owned(o)?;
            }
        }
        None => {
            // Departure: members without a proxy speak plaintext peer RPC
            // to members that still run one, so 8081 stays PERMISSIVE and
            // the peer rule identity-free until the last proxy has exited.
            // Port 8080 keeps the access the policy had.
            let departing = mesh::departing(
                snapshot.owned_named("AuthorizationPolicy", &mesh_name),
                recorded_plane.as_deref(),
            );
            plan = plan
                .apply(mesh::authorization_policy(
                    &fleet, &departing, &settings, false,
                ))
                .apply(mesh::peer_authentication(&fleet));
        }
    }
    // Routing: its own condition; never touches the workload or the
    // reservation and never blocks them.
    let world = routing::World {
        gateway_api: !snapshot.kind_absent(&routing::http_route_kind()),
        service: observed.infrastructure.iter().any(|o| {
            o["kind"] == "Service" && o["metadata"]["name"] == fleet.metadata.name.as_str()
        }),
        isolation: observed.infrastructure.iter().any(|o| {
            o["kind"] == "NetworkPolicy" && o["metadata"]["name"] == fleet.metadata.name.as_str()
        }),
        foreign_ingress: snapshot.related(INGRESSES_READ).any(|i| {
            i["metadata"]["name"] == routing::routing_name(&fleet.metadata.name).as_str()
                && i["metadata"]["labels"][FLEET_UID_LABEL].as_str()
                    != Some(fleet.metadata.uid.as_str())
        }),
        foreign_route: snapshot.related(HTTP_ROUTES_READ).any(|i| {
            i["metadata"]["name"] == routing::routing_name(&fleet.metadata.name).as_str()
                && i["metadata"]["labels"][FLEET_UID_LABEL].as_str()
                    != Some(fleet.metadata.uid.as_str())
        }),
        owned: routes,
    };
    let (with_routing, verdict) = routing::reconcile(
        plan,
        &fleet,
        snapshot.primary["spec"].get("routing"),
        &world,
    )?;
    plan = with_routing;
    // A missing optional API raises no watch event when it appears: poll.
    let mut api_poll = None;
    match verdict {
        None => st.drop_condition(routing::ROUTING_READY),
        Some(v) => {
            if v.reason == routing::reasons::GATEWAY_API_UNAVAILABLE {
                api_poll = Some(API_POLL);
            }
            let status = match v.status {
                "True" => ConditionStatus::True,
                "False" => ConditionStatus::False,
                _ => ConditionStatus::Unknown,
            };
            st.set_any(routing::ROUTING_READY, status, v.reason, &v.message);
        }
    }
    if observed.infrastructure_complete() {
        st.set(
            types::INFRASTRUCTURE_READY,
            true,
            "Provisioned",
            "Services, NetworkPolicy, PodDisruptionBudget and storage reservation exist",
        );
    } else {
        st.set(
            types::INFRASTRUCTURE_READY,
            false,
            "Provisioning",
            "creating Services, NetworkPolicy and PodDisruptionBudget",
        );
    }

    let fixed = render::fixed_hash(&snapshot.primary);
    let desired = i64::from(fleet.spec.replicas());
    let template_hash = stable_hash(&render::pod_template(template_fleet));
    let paused = fleet.spec.paused();
    pause_condition(&fleet, &mut st);

    // The workload and its replica count: grow at once, contract one member
    // at a time once the workload has settled.
    let mut progress: Option<(&str, String)> = None;
    let target = match observed.workload {
        None => desired,
        Some(w) => {
            let live = int_at(w, &["spec", "replicas"]);
            if desired >= live {
                desired
            } else if workload_settled(w) && c.terminating == 0 {
                live - 1
            } else {
                live
            }
        }
    };
    if paused {
        match observed.workload {
            Some(w) => {
                let stale = workload_annotation(w, TEMPLATE_HASH_ANNOTATION)
                    != Some(&template_hash)
                    || int_at(w, &["spec", "replicas"]) != desired;
                if stale {
                    progress = Some((
                        "MaintenancePaused",
                        "a workload change is held while maintenance.paused is true".into(),
                    ));
                }
            }
            None => {
                progress = Some((
                    "MaintenancePaused",
                    "the workload is not created while maintenance.paused is true".into(),
                ));
            }
        }
    } else {
        let replicas = i32::try_from(target).unwrap_or(i32::MAX);
        plan = plan.apply(render::workload(template_fleet, &fixed, replicas));
    }
    let settled_now = observed.workload.is_some_and(|w| {
        workload_annotation(w, TEMPLATE_HASH_ANNOTATION) == Some(&template_hash)
            && int_at(w, &["spec", "replicas"]) == desired
            && workload_settled(w)
    }) && c.nonterminal == desired
        && c.ready == desired
        && c.terminating == 0;
    if progress.is_none() && istio.is_some() && !all_proxied && !paused {
        progress = Some((
            "Provisioning",
            "waiting for the Istio proxy in every member Pod".into(),
        ));
    }
    if progress.is_none() && keeping_proxy && !paused {
        progress = Some((
            "Provisioning",
            "leaving the mesh: members keep their Istio proxy until the permissive peer policy is in place"
                .into(),
        ));
    }
    if progress.is_none() && !settled_now {
        progress = Some(match observed.workload {
            None => (
                "Provisioning",
                format!("creating the workload with {desired} members"),
            ),
            Some(w) if int_at(w, &["spec", "replicas"]) > desired => (
                "ScalingIn",
                format!("contracting one member at a time to {desired}"),
            ),
            Some(w) if int_at(w, &["spec", "replicas"]) < desired => {
                ("ScalingOut", format!("expanding to {desired} members"))
            }
            Some(w) if workload_annotation(w, TEMPLATE_HASH_ANNOTATION) != Some(&template_hash) => {
                (
                    "RollingUpdate",
                    "replacing members one at a time with the new template".into(),
                )
            }
            Some(_) => (
                "Provisioning",
                format!("{} of {desired} members ready", c.ready),
            ),
        });
    }

    // Member replacement (PersistentFleet): one per reconcile.
    let mut requeue = api_poll;
    if fleet.spec.persistent() && !paused {
        match replacement(&fleet, &observed, &settings, &st.now) {
            Replacement::None => {}
            Replacement::Later(after) => {
                requeue = Some(requeue.map_or(after, |r: Duration| r.min(after)));
            }
            Replacement::Now { pod, claim, why } => {
                // The claim, then the member's Pod (a dependent: the
                // StatefulSet the fleet owns controls it). The claim stays
                // Terminating while the Pod holds it; the StatefulSet
                // recreates the Pod and makes a fresh claim for it.
                plan = plan.delete_owned(claim)?;
                let message = match pod {
                    Some(p) => {
                        plan = plan.delete_owned(p)?;
                        let pod_name = p["metadata"]["name"].as_str().unwrap_or("");
                        format!(
                            "{why}; claim and member Pod {pod_name} deleted, the Pod is recreated on a fresh claim"
                        )
                    }
                    None => {
                        format!("{why}; claim deleted, the member is recreated on a fresh claim")
                    }
                };
                plan = plan.event("MemberReplaced", message);
                progress = Some((
                    "ReplacingMember",
                    "a member is being replaced on a fresh claim".into(),
                ));
            }
        }
    }

    match &progress {
        Some((reason, message)) => {
            st.set(types::PROGRESSING, !paused, reason, message);
            st.set(types::PROVISIONED, false, reason, message);
            requeue = Some(requeue.map_or(PROGRESS_REQUEUE, |r: Duration| r.min(PROGRESS_REQUEUE)));
        }
        None => {
            st.set(
                types::PROGRESSING,
                false,
                "Settled",
                "the workload matches the spec",
            );
            st.set(
                types::PROVISIONED,
                true,
                "Provisioned",
                &format!("{desired} members ready on the current template"),
            );
        }
    }
    ready_condition(&fleet, c, &mut st);
    // Application observation: reported, never gating anything above.
    let mut application_status = None;
    if settings.observe_applications {
        plan = application::plan(plan, &observed.pods);
        let summary = application::summarise(snapshot, &observed.pods, &st.now);
        let status = match summary.condition {
            "True" => ConditionStatus::True,
            "False" => ConditionStatus::False,
            _ => ConditionStatus::Unknown,
        };
        st.set_any(
            application::APPLICATION_CONVERGED,
            status,
            summary.reason,
            &summary.message,
        );
        application_status = Some(summary.status);
        if c.nonterminal > 0 {
            requeue = Some(requeue.map_or(application::INTERVAL, |r| r.min(application::INTERVAL)));
        }
    }
    let mut status = st.document(&fleet, c, applied, None);
    if let Some(a) = application_status {
        status["application"] = a;
    }
    plan = plan.status(status);
    if let Some(after) = requeue {
        plan = plan.requeue_after(after);
    }
    Ok(plan)
}

fn pause_condition(fleet: &Fleet, st: &mut Status) {
    if fleet.spec.paused() {
        st.set(
            types::MAINTENANCE_PAUSED,
            true,
            "Paused",
            "maintenance.paused holds workload changes",
        );
    } else {
        st.set(types::MAINTENANCE_PAUSED, false, "NotPaused", "");
    }
}

fn ready_condition(fleet: &Fleet, c: Counts, st: &mut Status) {
    let desired = i64::from(fleet.spec.replicas());
    let message = format!("{} of {desired} members ready", c.ready);
    if c.ready >= desired && desired > 0 {
        st.set(types::READY, true, "Ready", &message);
    } else {
        st.set(types::READY, false, "MembersNotReady", &message);
    }
}

/// The first blocker among configuration, fixed-field drift, the
/// ServiceAccount and the StorageClass.
fn blocker(
    snapshot: &Snapshot,
    fleet: &Fleet,
    observed: &Observed,
) -> Option<(&'static str, String)> {
    let problems = validate::problems(&fleet.spec);
    if !problems.is_empty() {
        return Some((reasons::INVALID_CONFIGURATION, problems.join("; ")));
    }
    if let Some(w) = observed.workload {
        let kind = w["kind"].as_str().unwrap_or("");
        let want = if fleet.spec.stateful() {
            "StatefulSet"
        } else {
            "Deployment"
        };
        if kind != want {
            return Some((
                reasons::INVALID_CONFIGURATION,
                format!(
                    "the fleet runs as a {kind}; its layout is never converted in place to a {want}"
                ),
            ));
        }
        if let Some(recorded) = workload_annotation(w, FIXED_CONFIG_ANNOTATION)
            && recorded != render::fixed_hash(&snapshot.primary)
        {
            return Some((
                reasons::INVALID_CONFIGURATION,
                "profile, serviceAccountName, storage, bucketWorkload and placement are fixed at \
                 creation; restore them (nothing running was changed)"
                    .into(),
            ));
        }
    }
    if fleet.spec.istio().is_some() && snapshot.kind_absent(&mesh::authorization_policy_kind()) {
        return Some((
            reasons::INFRASTRUCTURE_BLOCKED,
            "spec.mesh.istio needs security.istio.io/v1 (AuthorizationPolicy, \
             PeerAuthentication), which the API server does not serve"
                .into(),
        ));
    }
    if fleet.spec.istio().is_some() {
        let name = mesh::mesh_name(&fleet.metadata.name);
        for (read, kind) in [
            (AUTHORIZATION_POLICIES_READ, "AuthorizationPolicy"),
            (PEER_AUTHENTICATIONS_READ, "PeerAuthentication"),
        ] {
            let foreign = snapshot.related(read).any(|o| {
                o["metadata"]["name"] == name.as_str()
                    && o["metadata"]["labels"][FLEET_UID_LABEL].as_str()
                        != Some(fleet.metadata.uid.as_str())
            });
            if foreign {
                return Some((
                    reasons::INFRASTRUCTURE_BLOCKED,
                    format!(
                        "{kind} {name} exists and does not belong to this fleet; \
                         remove or rename it so the fleet can own its mesh policies"
                    ),
                ));
            }
        }
    }
    if !observed.service_account {
        return Some((
            reasons::SERVICE_ACCOUNT_MISSING,
            format!(
                "ServiceAccount {} does not exist",
                fleet.spec.service_account_name
            ),
        ));
    }
    if fleet.spec.persistent() && !observed.storage_class {
        return Some((
            reasons::STORAGE_CLASS_MISSING,
            format!(
                "StorageClass {} does not exist",
                fleet
                    .spec
                    .storage
                    .storage_class_name
                    .as_deref()
                    .unwrap_or("")
            ),
        ));
    }
    None
}

/// The plan of a blocked fleet: status only (and a Warning when the
/// blocker is new); nothing running changes.
fn blocked(
    fleet: &Fleet,
    observed: &Observed,
    st: &mut Status,
    c: Counts,
    applied: Option<i64>,
    reason: &str,
    message: &str,
) -> Plan {
    let previous = st.was(types::BLOCKED).cloned();
    let already = previous
        .as_ref()
        .is_some_and(|p| p.status == "True" && p.reason == reason && p.message == message);
    let since = match (&previous, st.primary["status"]["blockedSince"].as_str()) {
        (Some(p), Some(since)) if p.status == "True" => since.to_owned(),
        _ => st.now.0.to_string(),
    };
    st.set(types::BLOCKED, true, reason, message);
    st.set(types::PROVISIONED, false, reason, message);
    st.set(
        types::PROGRESSING,
        false,
        reason,
        "blocked: nothing running changes",
    );
    if observed.infrastructure_complete() {
        st.set(
            types::INFRASTRUCTURE_READY,
            true,
            "Provisioned",
            "infrastructure exists",
        );
    } else {
        st.set(types::INFRASTRUCTURE_READY, false, reason, message);
    }
    pause_condition(fleet, st);
    ready_condition(fleet, c, st);
    let status = st.document(fleet, c, applied, Some(since));
    let mut plan = Plan::new().status(status);
    if reason == reasons::INFRASTRUCTURE_BLOCKED {
        plan = plan.requeue_after(API_POLL);
    }
    if already {
        plan
    } else {
        plan.warning(reason, message.to_owned())
    }
}

/// A member replacement decision.
#[derive(Debug)]
pub enum Replacement<'a> {
    /// Nothing to replace.
    None,
    /// The one member down may be replaced after this long.
    Later(Duration),
    /// Delete this claim; the StatefulSet makes a fresh claim when the
    /// member's Pod is recreated.
    Now {
        /// The member Pod, when it exists (named in the event).
        pod: Option<&'a Value>,
        /// Its claim.
        claim: &'a Value,
        /// Event message.
        why: String,
    },
}

fn parse_time(text: &str) -> Option<Time> {
    text.parse().ok().map(Time)
}

/// Whether a PersistentFleet member must be replaced: a member whose claim
/// is `Lost`; or the one member down for longer than the replacement delay
/// while every other member is ready.
pub fn replacement<'a>(
    fleet: &Fleet,
    observed: &Observed<'a>,
    settings: &Settings,
    now: &Time,
) -> Replacement<'a> {
    let pod_named = |name: &str| {
        observed
            .pods
            .iter()
            .copied()
            .find(|p| p["metadata"]["name"].as_str() == Some(name))
    };
    let claim_named = |name: &str| {
        observed
            .claims
            .iter()
            .copied()
            .find(|c| c["metadata"]["name"].as_str() == Some(name))
    };
    let prefix = format!("{DATA_VOLUME}-{}-", fleet.metadata.name);
    for claim in &observed.claims {
        let name = claim["metadata"]["name"].as_str().unwrap_or("");
        if claim["status"]["phase"] == "Lost"
            && !terminating(claim)
            && let Some(pod_name) = name
                .strip_prefix(DATA_VOLUME)
                .and_then(|s| s.strip_prefix('-'))
            && name.starts_with(&prefix)
        {
            return Replacement::Now {
                pod: pod_named(pod_name).filter(|p| !terminating(p)),
                claim,
                why: format!(
                    "member {pod_name}: claim {name} is Lost; replacing it on a fresh claim"
                ),
            };
        }
    }
    let desired = usize::try_from(fleet.spec.replicas()).unwrap_or(0);
    let live: Vec<&Value> = observed
        .pods
        .iter()
        .copied()
        .filter(|p| nonterminal(p))
        .collect();
    if live.len() != desired || desired < 2 {
        return Replacement::None;
    }
    let down: Vec<&Value> = live.iter().copied().filter(|p| !ready(p)).collect();
    let [member] = down.as_slice() else {
        return Replacement::None;
    };
    let since = pod_ready_condition(member)
        .and_then(|c| c["lastTransitionTime"].as_str())
        .or_else(|| member["metadata"]["creationTimestamp"].as_str())
        .and_then(parse_time);
    let Some(since) = since else {
        return Replacement::None;
    };
    let delay = Duration::from_secs(settings.member_replacement_delay_seconds);
    let elapsed = now.0.duration_since(since.0).unsigned_abs();
    if elapsed < delay {
        return Replacement::Later(delay - elapsed + Duration::from_secs(1));
    }
    let pod_name = member["metadata"]["name"].as_str().unwrap_or("");
    match claim_named(&claim_of_pod(pod_name)).filter(|c| !terminating(c)) {
        Some(claim) => Replacement::Now {
            pod: Some(member),
            claim,
            why: format!(
                "member {pod_name} has been the one member down for over {}s while the rest are ready; \
                 replacing it on a fresh claim",
                delay.as_secs()
            ),
        },
        None => Replacement::None,
    }
}

/// Deletion, in order: compute (the workload; its Pods go with it), then
/// claims and the remaining objects; the reservation is kept; then the
/// finalizer comes off.
fn deletion(
    fleet: &Fleet,
    observed: &Observed,
    closing: &[&Value],
    st: &mut Status,
) -> Result<Plan, ReconcileError> {
    let c = counts(&observed.pods);
    let applied = observed.workload.map(|w| int_at(w, &["spec", "replicas"]));
    let mut plan = Plan::new();
    // Routing and the mesh policies close when deletion starts, without
    // delaying the rest.
    for o in closing.iter().filter(|o| !terminating(o)) {
        plan = plan.delete_owned(o)?;
    }
    let (phase, message) = if let Some(w) = observed.workload {
        plan = plan.delete_owned(w)?;
        (
            "RemovingCompute",
            "removing the workload; claims wait until every member has stopped".to_owned(),
        )
    } else if !observed.pods.is_empty() {
        (
            "RemovingCompute",
            format!("waiting for {} members to stop", observed.pods.len()),
        )
    } else if !observed.claims.is_empty() || !observed.infrastructure.is_empty() {
        for claim in observed.claims.iter().filter(|c| !terminating(c)) {
            plan = plan.delete_owned(claim)?;
        }
        for object in observed.infrastructure.iter().filter(|o| !terminating(o)) {
            plan = plan.delete_owned(object)?;
        }
        (
            "RemovingClaims",
            format!(
                "compute is gone; removing {} claims and the fleet's Services, NetworkPolicy and \
             PodDisruptionBudget; the storage reservation is kept",
                observed.claims.len()
            ),
        )
    } else if !closing.is_empty() {
        (
            "RemovingPolicies",
            "waiting for the route and the mesh policies to go".to_owned(),
        )
    } else {
        st.set(
            types::DELETING,
            true,
            "Complete",
            "compute and claims are gone; the storage reservation is kept",
        );
        let status = st.document(fleet, c, applied, None);
        return Ok(plan.status(status).cleanup_complete());
    };
    st.set(types::DELETING, true, phase, &message);
    st.set(types::PROVISIONED, false, "Deleting", &message);
    st.set(types::PROGRESSING, true, phase, &message);
    ready_condition(fleet, c, st);
    let status = st.document(fleet, c, applied, None);
    Ok(plan.status(status).requeue_after(PROGRESS_REQUEUE))
}
