//! `TerdutTeam`: one team on a TerdutServer, possibly in another namespace.
//!
//! Every reconcile first resolves `spec.serverRef` and re-checks consent
//! (§4.6): a server in another namespace must admit this namespace through
//! `spec.allowedTeams` (for `Selector`, against the labels of this team's
//! own Namespace, which the controller reads by name). Without consent the
//! team is `Ready=False/RefNotPermitted` and nothing is sent to the server:
//! no change, and no delete, also not when the TerdutTeam itself is deleted.
//!
//! With consent, the REST sync (§5):
//! - `status.teamID` unset: `POST /api/teams`; a 409 adopts the same-named
//!   team found by `GET /api/teams?name=`.
//! - set: `GET /api/teams/{id}` (at most every 15 s, and again at every
//!   periodic resync), then `PUT` the name and the OIDC groups when the
//!   newest thing known of the server differs from the spec. A team gone
//!   from the server is created again.
//! - deleted: `DELETE /api/teams/{id}`; while it fails the finalizer stays,
//!   with `Degraded=True` and a Warning Event.
//!
//! It calls the server with the credentials Secret in its own namespace:
//! the server's own (same namespace), the mirror the server controller
//! writes (other namespaces), or its team-scoped key when the server offers
//! those. `status.apiURL` and `status.credentialsSecretRef` tell the team's
//! children how to call the server.

use serde::Deserialize;
use serde_json::{Value, json};
use wasmop_sdk::{HttpMethod, Observation, Plan, ReconcileError, Snapshot};

use crate::api::{
    self, API_KEY, Conditions, Endpoint, NamedRef, SecretKey, Settings, TEAM_SCOPED_CAPABILITY,
    body_of, describe, find_secret, labels_of, permits,
};
use crate::server::encode;

/// Read id: the TerdutServer named by `spec.serverRef`.
pub const READ_SERVER: &str = "server";
/// Read id: the team's own Namespace (labels, for `Selector` consent).
pub const READ_NAMESPACE: &str = "namespace";
/// Read id: Secrets in the team's namespace.
pub const READ_SECRETS: &str = "secrets";

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Spec {
    #[serde(default)]
    server_ref: NamedRef,
    #[serde(default)]
    display_name: String,
    #[serde(default)]
    oidc: Oidc,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
struct Oidc {
    #[serde(default)]
    member_group: String,
    #[serde(default)]
    owner_group: String,
}

/// The credentials Secret a team in `team_namespace` named `team` uses for
/// `server` (the TerdutServer object).
pub fn credentials_secret(server: &Value, team: &str, team_namespace: &str) -> Option<String> {
    let team_scoped = server["status"]["capabilities"]
        .as_array()
        .is_some_and(|c| c.iter().any(|c| c == TEAM_SCOPED_CAPABILITY));
    let name = server["metadata"]["name"].as_str()?;
    let namespace = server["metadata"]["namespace"].as_str()?;
    if team_scoped {
        Some(api::team_key_name(team))
    } else if namespace == team_namespace {
        server["status"]["operatorCredentialsSecretRef"]["name"]
            .as_str()
            .map(str::to_owned)
    } else {
        Some(api::mirror_name(name, namespace))
    }
}

fn team_path(id: u64) -> String {
    format!("/api/teams/{id}")
}

/// The newest successful observation among `ids` holding a team object.
fn newest_team<'a>(snapshot: &'a Snapshot, ids: &[&str]) -> Option<(&'a Observation, Value)> {
    ids.iter()
        .filter_map(|id| snapshot.observation(id))
        .filter_map(|o| body_of(o).filter(|b| b["id"].is_u64()).map(|b| (o, b)))
        .min_by_key(|(o, _)| o.age_ms)
}

/// Reconciles one TerdutTeam.
///
/// # Errors
/// Only for a snapshot that does not parse.
pub fn reconcile(snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
    let settings = Settings::of(snapshot);
    let name = snapshot.primary_name().to_owned();
    let namespace = snapshot.primary_namespace().unwrap_or_default().to_owned();
    let spec: Spec = serde_json::from_value(snapshot.primary["spec"].clone())
        .map_err(|e| ReconcileError::invalid_spec(format!("spec: {e}")))?;
    let old = &snapshot.primary["status"];
    let mut status = old
        .as_object()
        .cloned()
        .map(Value::Object)
        .unwrap_or_else(|| json!({}));
    let mut conds = Conditions::of(snapshot)?;
    let mut plan = Plan::new();
    let team_id = old["teamID"].as_u64();
    let incarnation = old["incarnation"].as_u64().unwrap_or(0);
    let server_ns = spec
        .server_ref
        .namespace
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| namespace.clone());
    let server_label = format!("{server_ns}/{}", spec.server_ref.name);

    let finish = |mut plan: Plan, mut status: Value, conds: Conditions, requeue| {
        status["conditions"] = conds.to_json();
        plan = plan.status(status);
        Ok(plan.requeue_after(requeue))
    };

    // Resolve the server and re-check consent, every time.
    let Some(server) = snapshot.related(READ_SERVER).next() else {
        if snapshot.deleting {
            return Ok(orphaned(
                plan,
                team_id,
                &format!("TerdutServer {server_label} is gone"),
            ));
        }
        conds.set(
            "Ready",
            false,
            "ServerNotFound",
            &format!("TerdutServer {server_label} does not exist"),
        );
        return finish(plan, status, conds, settings.retry);
    };
    let ns_labels = snapshot
        .related(READ_NAMESPACE)
        .next()
        .map(labels_of)
        .unwrap_or_default();
    if !permits(server, &namespace, &ns_labels) {
        if snapshot.deleting {
            return Ok(orphaned(
                plan,
                team_id,
                &format!("TerdutServer {server_label} no longer admits namespace {namespace}"),
            ));
        }
        conds.set(
            "Ready",
            false,
            "RefNotPermitted",
            &format!("TerdutServer {server_label} does not admit TerdutTeams from namespace {namespace} (its spec.allowedTeams); nothing is changed on the server until it does"),
        );
        return finish(plan, status, conds, settings.resync);
    }
    let url = server["status"]["apiURL"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let secret = credentials_secret(server, &name, &namespace).unwrap_or_default();
    let have_secret =
        !secret.is_empty() && find_secret(snapshot, READ_SECRETS, &namespace, &secret).is_some();
    if url.is_empty() || !have_secret {
        if snapshot.deleting && team_id.is_none() {
            return Ok(plan.cleanup_complete());
        }
        let why = if url.is_empty() {
            format!("TerdutServer {server_label} has no API URL in its status yet")
        } else if secret.is_empty() {
            format!("TerdutServer {server_label} has no operator credentials yet")
        } else {
            format!("waiting for the credentials Secret {secret} in namespace {namespace}")
        };
        conds.set("Ready", false, "WaitingForServer", &why);
        return finish(plan, status, conds, settings.retry);
    }
    let ca = server["spec"]["networking"]["caBundle"]
        .as_str()
        .filter(|c| !c.trim().is_empty());
    let ep = Endpoint::new(&url, Some(SecretKey::new(&secret, API_KEY)))
        .map_err(|e| {
            ReconcileError::not_ready(format!("TerdutServer {server_label} status.apiURL: {e}"))
        })?
        .with_ca(ca);
    status["apiURL"] = json!(url);
    // The children call the same server: they trust what the team trusts.
    // Absent, not null, when the server has none: the status is written by
    // server-side apply, which drops a field the plugin no longer sets, and
    // the schema types it as a string.
    match ca {
        Some(c) => status["caBundle"] = json!(c),
        None => {
            if let Some(s) = status.as_object_mut() {
                s.remove("caBundle");
            }
        }
    }
    status["credentialsSecretRef"] = json!({"name": secret});
    status["serverRef"] = json!({"name": spec.server_ref.name, "namespace": server_ns});

    if snapshot.deleting {
        let Some(id) = team_id else {
            return Ok(plan.cleanup_complete());
        };
        let deleted = snapshot.observation("delete");
        match deleted {
            Some(o) if o.is_success() || (o.error.is_none() && o.status == Some(404)) => {
                return Ok(plan
                    .event("TeamDeleted", format!("deleted team {id} on the server"))
                    .cleanup_complete());
            }
            Some(o) => {
                let was = conds.reason("Degraded").map(str::to_owned);
                let message = format!(
                    "DELETE {}: {}; the finalizer stays until the server-side team is deleted",
                    team_path(id),
                    describe(o)
                );
                conds.set("Degraded", true, "DeleteFailed", &message);
                if was.as_deref() != Some("DeleteFailed") {
                    plan = plan.warning("DeleteFailed", message);
                }
            }
            None => {}
        }
        plan = plan.http(ep.request("delete", HttpMethod::Delete, &team_path(id), None));
        return finish(plan, status, conds, settings.retry);
    }
    conds.remove("Degraded");

    let desired_name = if spec.display_name.is_empty() {
        name.clone()
    } else {
        spec.display_name.clone()
    };
    let Some(id) = team_id else {
        // Create, or adopt the same-named team a lost create left behind.
        let create_id = format!("create.{incarnation}");
        let lookup_id = format!("lookup.{incarnation}");
        let created = snapshot.observation(&create_id);
        let adopted = created
            .and_then(body_of)
            .filter(|b| b["id"].is_u64())
            .map(|b| (b, false))
            .or_else(|| {
                let found = body_of(snapshot.observation(&lookup_id)?)?;
                let team = found
                    .as_array()?
                    .iter()
                    .find(|t| t["name"] == desired_name.as_str())?
                    .clone();
                Some((team, true))
            });
        if let Some((team, was_lookup)) = adopted {
            let id = team["id"].as_u64().unwrap_or_default();
            status["teamID"] = json!(id);
            status["observedTeam"] = json!({"name": team["name"], "memberGroup": team["member_group"], "ownerGroup": team["owner_group"]});
            plan = if was_lookup {
                plan.event(
                    "TeamAdopted",
                    format!("adopted the existing team {id} named {desired_name:?} on the server"),
                )
            } else {
                plan.event("TeamCreated", format!("created team {id} on the server"))
            };
            conds.set(
                "Ready",
                false,
                "Syncing",
                &format!("team {id} is on the server; checking it"),
            );
            return finish(plan, status, conds, std::time::Duration::from_millis(100));
        }
        // A 409 says some team held the name POSTed then. A lookup made
        // since, for the name wanted now, that finds no such team (the name
        // changed, or the holder is gone) sends the create again.
        let name_free = created.is_some_and(|c| {
            snapshot.observation(&lookup_id).is_some_and(|l| {
                api::newer(l, Some(c))
                    && body_of(l)
                        .and_then(|b| b.as_array().cloned())
                        .is_some_and(|teams| {
                            !teams.iter().any(|t| t["name"] == desired_name.as_str())
                        })
            })
        });
        match created {
            Some(o) if o.error.is_none() && o.status == Some(409) && !name_free => {
                let lookup = snapshot.observation(&lookup_id);
                if let Some(l) = lookup.filter(|l| !l.is_success()) {
                    conds.set(
                        "Ready",
                        false,
                        "AdoptFailed",
                        &format!("GET /api/teams?name=: {}", describe(l)),
                    );
                } else {
                    conds.set(
                        "Ready",
                        false,
                        "Adopting",
                        &format!("a team named {desired_name:?} exists on the server; adopting it"),
                    );
                }
                plan = plan.http(ep.get(
                    &lookup_id,
                    &format!("/api/teams?name={}", encode(&desired_name)),
                ));
            }
            other => {
                if let Some(o) = other {
                    conds.set(
                        "Ready",
                        false,
                        "CreateFailed",
                        &format!("POST /api/teams: {}", describe(o)),
                    );
                } else {
                    conds.set(
                        "Ready",
                        false,
                        "Creating",
                        &format!("creating team {desired_name:?} on the server"),
                    );
                }
                plan = plan.http(ep.request(
                    &create_id,
                    HttpMethod::Post,
                    "/api/teams",
                    Some(json!({"name": desired_name, "member_group": spec.oidc.member_group, "owner_group": spec.oidc.owner_group})),
                ));
            }
        }
        return finish(plan, status, conds, settings.retry);
    };

    // Sync an existing team: the newest thing known of it wins.
    plan = plan.http(ep.get("get", &team_path(id)));
    let get = snapshot.observation("get");
    let known = newest_team(snapshot, &["get", "rename", "oidc"]);
    if let Some(g) = get
        && g.error.is_none()
        && g.status == Some(404)
        && api::newer(g, known.as_ref().map(|(o, _)| *o))
    {
        // Deleted on the server behind our back: create it again.
        let next = incarnation + 1;
        status["incarnation"] = json!(next);
        status["teamID"] = Value::Null;
        status["observedTeam"] = Value::Null;
        plan = plan.warning(
            "TeamMissingOnServer",
            format!("team {id} is gone from the server; creating it again"),
        );
        conds.set(
            "Ready",
            false,
            "Creating",
            "the team was deleted on the server; creating it again",
        );
        return finish(plan, status, conds, std::time::Duration::from_millis(100));
    }
    // The name comes from the newest of GET and rename, the groups from the
    // newest of GET and oidc: the two PUTs run concurrently.
    let groups_from = newest_team(snapshot, &["get", "oidc"]).map(|(_, b)| b);
    let known = newest_team(snapshot, &["get", "rename"])
        .map(|(_, b)| b)
        .or(known.map(|(_, b)| b))
        .map(|mut b| {
            if let Some(g) = &groups_from {
                b["member_group"] = g["member_group"].clone();
                b["owner_group"] = g["owner_group"].clone();
            }
            b
        });
    let current = known.or_else(|| {
        let o = &old["observedTeam"];
        o.is_object().then(|| json!({"id": id, "name": o["name"], "member_group": o["memberGroup"], "owner_group": o["ownerGroup"]}))
    });
    let Some(current) = current else {
        let why = get.map_or_else(
            || "reading the team from the server".to_owned(),
            |g| format!("GET {}: {}", team_path(id), describe(g)),
        );
        conds.set("Ready", false, "Syncing", &why);
        return finish(plan, status, conds, settings.retry);
    };
    status["observedTeam"] = json!({"name": current["name"], "memberGroup": current["member_group"], "ownerGroup": current["owner_group"]});
    let mut pending = Vec::new();
    if current["name"] != desired_name.as_str() {
        plan = plan.http(ep.request(
            "rename",
            HttpMethod::Put,
            &team_path(id),
            Some(json!({"name": desired_name})),
        ));
        pending.push(failure_or(
            snapshot,
            "rename",
            format!("renaming to {desired_name:?}"),
        ));
    }
    if current["member_group"] != spec.oidc.member_group.as_str()
        || current["owner_group"] != spec.oidc.owner_group.as_str()
    {
        plan = plan.http(ep.request(
            "oidc",
            HttpMethod::Put,
            &format!("{}/oidc-groups", team_path(id)),
            Some(json!({"member_group": spec.oidc.member_group, "owner_group": spec.oidc.owner_group})),
        ));
        pending.push(failure_or(
            snapshot,
            "oidc",
            "setting the OIDC groups".to_owned(),
        ));
    }
    if pending.is_empty() {
        conds.set(
            "Ready",
            true,
            "Synced",
            &format!("team {id} on {url} matches the spec"),
        );
        finish(plan, status, conds, settings.resync)
    } else {
        conds.set("Ready", false, "Syncing", &pending.join("; "));
        finish(plan, status, conds, settings.retry)
    }
}

/// The failure of the last `id` request if it failed, else `doing`.
fn failure_or(snapshot: &Snapshot, id: &str, doing: String) -> String {
    match snapshot.observation(id) {
        Some(o) if !o.is_success() => format!("{doing}: {}", describe(o)),
        _ => doing,
    }
}

/// A deleted team whose server is out of reach by design (gone, or no
/// longer consenting): the finalizer goes, the server-side team stays.
fn orphaned(plan: Plan, team_id: Option<u64>, why: &str) -> Plan {
    let plan = match team_id {
        Some(id) => plan.warning(
            "TeamLeftOnServer",
            format!("{why}: team {id} is left on the server"),
        ),
        None => plan,
    };
    plan.cleanup_complete()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_secret_per_mode() {
        let server = |caps: Value| {
            json!({"metadata": {"name": "terdut", "namespace": "oncall"},
            "status": {"capabilities": caps, "operatorCredentialsSecretRef": {"name": "terdut-operator-credentials"}}})
        };
        let plain = server(json!(["teams"]));
        assert_eq!(
            credentials_secret(&plain, "t", "oncall").as_deref(),
            Some("terdut-operator-credentials")
        );
        assert_eq!(
            credentials_secret(&plain, "t", "team-a").as_deref(),
            Some("terdut.oncall-terdut-credentials")
        );
        let scoped = server(json!(["teams", TEAM_SCOPED_CAPABILITY]));
        assert_eq!(
            credentials_secret(&scoped, "t", "team-a").as_deref(),
            Some("t-terdut-team-credentials")
        );
        assert_eq!(
            credentials_secret(&scoped, "t", "oncall").as_deref(),
            Some("t-terdut-team-credentials")
        );
    }
}
