//! The `team` plugin: terdut-server installs after the terdut-operator
//! design (`seeds/terdut-operator-design.md`), group
//! `terdut.ryuvia.com/v1alpha1`.
//!
//! Five controllers:
//! - `server` ([`server`]) — TerdutServer: Deployment, Service, database
//!   wiring, bootstrap, the operator's credentials, and the credentials it
//!   hands to the TerdutTeams it admits.
//! - `team` ([`team`]) — TerdutTeam: consent, then the team on the server.
//! - `escalationrule`, `deadmanswitch`, `alertsource` ([`children`]) — the
//!   team's escalation policy, dead man's switches and alert-source
//!   integrations.
//!
//! Everything on the server goes through the host's HTTP requests to the
//! server's API URL (`TerdutServer.status.apiURL`: `spec.networking.apiURL`,
//! else the Service's cluster DNS name), which must be on the operator's
//! `--allow-url` list. The logic is plain functions over the snapshot; the
//! WebAssembly glue is the one `export_admitting_plugin!` at the bottom:
//! the plugin also admits ([`admission`]: one escalation rule per team).

pub mod admission;
pub mod api;
pub mod children;
pub mod server;
pub mod team;

use serde_json::Value;
use wasmop_sdk::admission::{AdmissionRequest, AdmissionResponse, Admit};
use wasmop_sdk::k8s_openapi::api::apps::v1::Deployment;
use wasmop_sdk::k8s_openapi::api::core::v1::{Namespace, Secret, Service};
use wasmop_sdk::{
    Controller, HttpMethod, KindRef, Manifest, OwnedKind, Plan, Plugin, Read, ReconcileError,
    Selector, SettingsProblem, Snapshot,
};

use crate::api::{
    Settings, alert_source_kind, deadman_kind, escalation_kind, postgresql_kind, server_kind,
    team_kind,
};

/// Controller names.
pub const SERVER: &str = "server";
/// The TerdutTeam controller.
pub const TEAM: &str = "team";
/// The TerdutEscalationRule controller.
pub const ESCALATION: &str = "escalationrule";
/// The TerdutDeadmanSwitch controller.
pub const DEADMAN: &str = "deadmanswitch";
/// The TerdutAlertSource controller.
pub const ALERT_SOURCE: &str = "alertsource";

/// Finalizer of the server: the credentials it wrote into other namespaces
/// are deleted before it goes.
pub const SERVER_FINALIZER: &str = "terdut.ryuvia.com/credentials";
/// Finalizer of every kind with a server-side counterpart.
pub const SYNC_FINALIZER: &str = "terdut.ryuvia.com/server-side";

fn secrets_here(id: &str) -> Read {
    Read::new(id, KindRef::of::<Secret>(), Selector::SameNamespace)
}

fn child(name: &str, kind: KindRef) -> Controller {
    Controller::new(name, kind)
        .reads(Read::new(
            children::READ_TEAM,
            team_kind(),
            Selector::field("spec.teamRef.name"),
        ))
        .reads(secrets_here(children::READ_SECRETS))
        .finalizer(SYNC_FINALIZER)
}

/// The `team` plugin.
#[derive(Debug)]
pub struct TeamPlugin;

impl Plugin for TeamPlugin {
    fn manifest() -> Manifest {
        // Write scope per kind: the server's Deployment and Service only in
        // its own namespace; Secrets also in any other, for the mirrors.
        let server = Controller::new(SERVER, server_kind())
            .owns_kind(OwnedKind::reference(KindRef::of::<Deployment>()).own_namespace_only())
            .owns_kind(OwnedKind::reference(KindRef::of::<Service>()).own_namespace_only())
            // The operator credentials (same namespace) and, in the
            // namespaces of admitted teams, the mirrors and team keys. One
            // ownership per kind: owner labels, which work across
            // namespaces; the finalizer deletes them all, and garbage
            // collection too for those in the server's own namespace.
            .owns_kind(
                OwnedKind::label(KindRef::of::<Secret>())
                    .collected()
                    .write_namespace("*"),
            )
            .write_namespace("*")
            .reads(secrets_here(server::READ_SECRETS))
            // Optional: without Zalando's CRD a DSN server still runs and a
            // postgresClusterRef server says what is missing.
            .reads(
                Read::new(
                    server::READ_POSTGRES,
                    postgresql_kind(),
                    Selector::field("spec.database.postgresClusterRef.name"),
                )
                .optional(),
            )
            .reads(Read::new(
                server::READ_TEAMS,
                team_kind(),
                Selector::ClusterWide,
            ))
            .reads(Read::new(
                server::READ_NAMESPACES,
                KindRef::of::<Namespace>(),
                Selector::ClusterWide,
            ))
            .finalizer(SERVER_FINALIZER);
        let team = Controller::new(TEAM, team_kind())
            .reads(Read::new(
                team::READ_SERVER,
                server_kind(),
                Selector::field_in("spec.serverRef.name", "spec.serverRef.namespace"),
            ))
            .reads(Read::new(
                team::READ_NAMESPACE,
                KindRef::of::<Namespace>(),
                Selector::field("metadata.namespace"),
            ))
            .reads(secrets_here(team::READ_SECRETS))
            .finalizer(SYNC_FINALIZER);
        admission::rules(
            Manifest::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION"))
                .controller(server)
                .controller(team)
                .controller(child(ESCALATION, escalation_kind()))
                .controller(child(DEADMAN, deadman_kind()))
                .controller(child(ALERT_SOURCE, alert_source_kind()).owns(KindRef::of::<Secret>())),
        )
    }

    fn validate_settings(settings: &Value) -> Result<(), Vec<SettingsProblem>> {
        Settings::parse(settings).map(|_| ())
    }

    fn reconcile(snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
        let plan = match snapshot.controller.as_str() {
            SERVER => server::reconcile(snapshot),
            TEAM => team::reconcile(snapshot),
            ESCALATION => children::reconcile_escalation(snapshot),
            DEADMAN => children::reconcile_deadman(snapshot),
            ALERT_SOURCE => children::reconcile_alert_source(snapshot),
            other => Err(ReconcileError::internal(format!(
                "unknown controller {other:?}"
            ))),
        }?;
        Ok(hold_unless_applied(snapshot, gate_posts(snapshot, plan)))
    }
}

/// `status.observedGeneration` means "applied" (§7): the host advances it
/// only for a plan whose status says `Ready=True` and, where there is one,
/// `Synced=True`; any other plan (syncing, waiting, failed, not permitted)
/// keeps it where it was.
pub fn hold_unless_applied(snapshot: &Snapshot, plan: Plan) -> Plan {
    let status = plan.status.as_ref().unwrap_or(&snapshot.primary["status"]);
    let cond = |type_: &str| {
        status["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
            .map(|c| c["status"] == "True")
    };
    let applied = cond("Ready") == Some(true) && cond("Synced") != Some(false);
    if applied {
        plan
    } else {
        plan.not_yet_applied()
    }
}

/// Keeps a POST (a create: never safe to send twice) out of the plan while
/// an earlier one with the same id is still in flight, and records the
/// POSTs it lists in `status.pending` (see [`api::may_send`]).
pub fn gate_posts(snapshot: &Snapshot, mut plan: Plan) -> Plan {
    let is_post = |r: &wasmop_sdk::HttpRequest| r.method == HttpMethod::Post;
    plan.http_requests
        .retain(|r| !is_post(r) || api::may_send(snapshot, &r.id));
    let sent: Vec<String> = plan
        .http_requests
        .iter()
        .filter(|r| is_post(r))
        .map(|r| r.id.clone())
        .collect();
    let old = &snapshot.primary["status"]["pending"];
    let mut pending = serde_json::Map::new();
    if let Some(entries) = old.as_object() {
        for (id, at) in entries {
            if !api::may_send(snapshot, id) {
                pending.insert(id.clone(), at.clone());
            }
        }
    }
    for id in sent {
        pending.insert(id, Value::String(snapshot.now.clone()));
    }
    if plan.status.is_none() && (pending.is_empty() && old.is_null() || snapshot.deleting) {
        return plan;
    }
    let mut status = plan
        .status
        .take()
        .unwrap_or_else(|| snapshot.primary["status"].clone());
    if let Some(obj) = status.as_object_mut() {
        if pending.is_empty() {
            obj.remove("pending");
        } else {
            obj.insert("pending".into(), Value::Object(pending));
        }
    }
    plan.status(status)
}

impl Admit for TeamPlugin {
    fn admit(request: &AdmissionRequest) -> AdmissionResponse {
        admission::admit(request)
    }
}

#[cfg(target_arch = "wasm32")]
wasmop_sdk_admitting::export_admitting_plugin!(TeamPlugin);

#[cfg(test)]
mod tests;
