//! The team's children: `TerdutEscalationRule`, `TerdutDeadmanSwitch`,
//! `TerdutAlertSource`. Each names a TerdutTeam in its own namespace by
//! `spec.teamRef.name` and resolves it on every reconcile (§5, "owner
//! chain for status resolution"): the team's `status.teamID`,
//! `status.apiURL` and `status.credentialsSecretRef`. Until the team has
//! them (or while the team is not permitted on its server) the child is
//! `Ready=False/WaitingForTeam` and sends nothing.
//!
//! Strategies per resource (§5):
//! - escalation policy: `GET` the whole policy, `PUT` the whole desired one
//!   when they differ; on delete, `PUT` the empty policy.
//! - dead man's switch: `POST`; any change other than the name (diffed
//!   against `status.applied`, not the server) deletes and recreates it;
//!   the server has no rename, so a name change is reported, not applied.
//! - alert source: `POST` returns the webhook URL and key once; they go into
//!   the owner-referenced Secret `<name>-terdut-webhook` and nowhere else.
//!   A kind change deletes and recreates the integration, which rotates the
//!   key: a Warning Event says so. A rename is a `PATCH` of the name, which
//!   keeps the integration and its key.
//!
//! A create that answers 409 (a lost earlier create) adopts the same-named
//! object found by name; an alert source adopted without its Secret is
//! recreated, since its key cannot be read back. Deletes run from the
//! finalizer; a failed one keeps it, with `Degraded=True` and a Warning.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};
use wasmop_sdk::{HttpMethod, HttpRequest, Observation, Plan, ReconcileError, Snapshot};

use crate::api::{
    API_KEY, Conditions, Endpoint, SecretKey, Settings, body_of, describe, find_secret, newer,
};
use crate::server::encode;

/// Read id: the TerdutTeam named by `spec.teamRef.name`.
pub const READ_TEAM: &str = "team";
/// Read id: Secrets in the child's namespace.
pub const READ_SECRETS: &str = "secrets";

#[derive(Clone, Debug, Default, Deserialize)]
struct TeamRef {
    #[serde(default)]
    name: String,
}

/// The parent team, resolved.
#[derive(Clone, Debug)]
struct Parent {
    team_id: u64,
    ep: Endpoint,
}

/// Why a child has no parent to call through.
struct NoParent {
    why: String,
    /// True when the team exists and may still get there (credentials or
    /// a team ID to come); false when it is gone or not permitted.
    transient: bool,
}

impl NoParent {
    fn gone(why: String) -> Self {
        NoParent {
            why,
            transient: false,
        }
    }

    fn later(why: String) -> Self {
        NoParent {
            why,
            transient: true,
        }
    }
}

/// The parent, or why the child waits.
fn parent(snapshot: &Snapshot) -> Result<Parent, NoParent> {
    let team_ref: TeamRef =
        serde_json::from_value(snapshot.primary["spec"]["teamRef"].clone()).unwrap_or_default();
    let namespace = snapshot.primary_namespace().unwrap_or_default();
    let Some(team) = snapshot.related(READ_TEAM).next() else {
        return Err(NoParent::gone(format!(
            "TerdutTeam {:?} does not exist in namespace {namespace}",
            team_ref.name
        )));
    };
    let st = &team["status"];
    let reason = st["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
        .and_then(|c| c["reason"].as_str())
        .unwrap_or_default();
    if reason == "RefNotPermitted" {
        return Err(NoParent::gone(format!(
            "TerdutTeam {} is not permitted on its server",
            team_ref.name
        )));
    }
    let (Some(team_id), Some(url), Some(secret)) = (
        st["teamID"].as_u64(),
        st["apiURL"].as_str(),
        st["credentialsSecretRef"]["name"].as_str(),
    ) else {
        return Err(NoParent::later(format!(
            "TerdutTeam {} has no team ID on the server yet",
            team_ref.name
        )));
    };
    if find_secret(snapshot, READ_SECRETS, namespace, secret).is_none() {
        return Err(NoParent::later(format!(
            "the credentials Secret {secret} of TerdutTeam {} is not there yet",
            team_ref.name
        )));
    }
    let ep = Endpoint::new(url, Some(SecretKey::new(secret, API_KEY)))
        .map_err(|e| NoParent::later(format!("TerdutTeam {} status.apiURL: {e}", team_ref.name)))?
        .with_ca(st["caBundle"].as_str());
    Ok(Parent { team_id, ep })
}

/// A response meaning "deleted" (2xx) or "not there" (404).
fn gone(o: &Observation) -> bool {
    o.is_success() || (o.error.is_none() && o.status == Some(404))
}

/// Common shape of the end of a reconcile.
fn finish(
    plan: Plan,
    mut status: Value,
    conds: &Conditions,
    requeue: Duration,
) -> Result<Plan, ReconcileError> {
    status["conditions"] = conds.to_json();
    Ok(plan.status(status).requeue_after(requeue))
}

fn old_status(snapshot: &Snapshot) -> Value {
    snapshot.primary["status"]
        .as_object()
        .cloned()
        .map_or_else(|| json!({}), Value::Object)
}

/// The server-side row a child's status says it applied, for a message;
/// `None` when it never applied one.
fn applied_row(snapshot: &Snapshot) -> Option<String> {
    let st = &snapshot.primary["status"];
    let team = st["teamID"].as_u64()?;
    if let Some(id) = st["switchID"].as_u64() {
        return Some(format!("dead man's switch {id} of team {team}"));
    }
    if let Some(id) = st["integrationID"].as_u64() {
        return Some(format!("integration {id} of team {team}"));
    }
    (snapshot.primary["kind"] == "TerdutEscalationRule")
        .then(|| format!("the escalation policy of team {team}"))
}

/// A child whose parent cannot be resolved: waiting. Deleting, it never
/// drops a row silently: with nothing applied it goes; while the team may
/// still get its credentials or ID it holds the finalizer with
/// `Degraded=True/WaitingForTeam`; with the team gone or not permitted it
/// goes with a Warning `LeftOnServer` naming the row left behind (as a
/// team does, §4.6).
fn waiting(
    snapshot: &Snapshot,
    no_parent: &NoParent,
    settings: &Settings,
) -> Result<Plan, ReconcileError> {
    let why = no_parent.why.as_str();
    if snapshot.deleting {
        let Some(row) = applied_row(snapshot) else {
            return Ok(Plan::new().cleanup_complete());
        };
        if !no_parent.transient {
            return Ok(Plan::new()
                .warning(
                    "LeftOnServer",
                    format!("{why}: {row} was not deleted on the server and is left there (a team deleted on the server takes its rows with it)"),
                )
                .cleanup_complete());
        }
        let mut conds = Conditions::of(snapshot)?;
        conds.set(
            "Degraded",
            true,
            "WaitingForTeam",
            &format!("{why}: the finalizer stays until {row} can be deleted"),
        );
        return finish(Plan::new(), old_status(snapshot), &conds, settings.retry);
    }
    let mut conds = Conditions::of(snapshot)?;
    conds.set("Ready", false, "WaitingForTeam", why);
    conds.set("Synced", false, "WaitingForTeam", why);
    finish(Plan::new(), old_status(snapshot), &conds, settings.retry)
}

/// One request of the finalizer: `method path` with an optional body.
struct Call {
    id: String,
    method: HttpMethod,
    path: String,
    body: Option<Value>,
}

/// The finalizer's delete: the call until it answers 2xx or 404.
fn delete_step(
    snapshot: &Snapshot,
    conds: &mut Conditions,
    status: Value,
    ep: &Endpoint,
    call: Call,
    settings: &Settings,
) -> Result<Plan, ReconcileError> {
    let mut plan = Plan::new();
    match snapshot.observation(&call.id) {
        Some(o) if gone(o) => return Ok(plan.cleanup_complete()),
        Some(o) => {
            let was = conds.reason("Degraded").map(str::to_owned);
            let message = format!(
                "{} {}: {}; the finalizer stays until it succeeds",
                method_name(call.method),
                call.path,
                describe(o)
            );
            conds.set("Degraded", true, "DeleteFailed", &message);
            if was.as_deref() != Some("DeleteFailed") {
                plan = plan.warning("DeleteFailed", message);
            }
        }
        None => {}
    }
    plan = plan.http(ep.request(&call.id, call.method, &call.path, call.body));
    finish(plan, status, conds, settings.retry)
}

fn method_name(m: HttpMethod) -> &'static str {
    match m {
        HttpMethod::Get => "GET",
        HttpMethod::Post => "POST",
        HttpMethod::Put => "PUT",
        HttpMethod::Patch => "PATCH",
        HttpMethod::Delete => "DELETE",
    }
}

/// What a create (POST, adopting by name on 409) came to.
enum Created {
    /// The POST answered with the new object.
    New(Value),
    /// The POST answered 409 and the lookup by name found this one.
    Found(Value),
    /// Still under way: the plan holds the next request; the reason and
    /// message say which.
    Pending(Box<Plan>, &'static str, String),
}

/// One create of `want` under `base` (the `attempt`-th, ids `create.<tid>.<attempt>`
/// and `lookup.<tid>.<attempt>`): `POST base`; when that answers 409 (an
/// earlier create whose answer was lost), `GET base?name=` and take the
/// object of that name. `complete` says whether a POST answer is usable.
#[allow(clippy::too_many_arguments)]
fn create_or_find(
    snapshot: &Snapshot,
    ep: &Endpoint,
    plan: Plan,
    base: &str,
    want: &Value,
    ids: (String, String),
    what: &str,
    complete: impl Fn(&Value) -> bool,
) -> Created {
    let (create_id, lookup_id) = ids;
    let created = snapshot.observation(&create_id);
    if let Some(body) = created.and_then(body_of).filter(|b| complete(b)) {
        return Created::New(body);
    }
    match created {
        Some(o) if o.error.is_none() && o.status == Some(409) => {
            let found = snapshot
                .observation(&lookup_id)
                .and_then(body_of)
                .and_then(|l| {
                    l.as_array()?
                        .iter()
                        .find(|i| i["name"] == want["name"])
                        .cloned()
                });
            if let Some(found) = found {
                return Created::Found(found);
            }
            let name = want["name"].as_str().unwrap_or_default();
            let plan = plan.http(ep.get(&lookup_id, &format!("{base}?name={}", encode(name))));
            Created::Pending(
                Box::new(plan),
                "Adopting",
                format!("a {what} of that name exists; looking it up to adopt it"),
            )
        }
        other => {
            let plan =
                plan.http(ep.request(&create_id, HttpMethod::Post, base, Some(want.clone())));
            match other {
                Some(o) => Created::Pending(
                    Box::new(plan),
                    "CreateFailed",
                    format!("POST {base}: {}", describe(o)),
                ),
                None => {
                    Created::Pending(Box::new(plan), "Creating", format!("creating the {what}"))
                }
            }
        }
    }
}

/// The first half of delete-and-recreate, for what the server cannot
/// update in place: `DELETE path` (id `delete.<id>`) until it answers 2xx or
/// 404; then `reset` readies the status for the next create (a new
/// attempt) and the next reconcile creates it anew. `why` says what is
/// being recreated, `anew` what happens next.
#[allow(clippy::too_many_arguments)]
fn recreate(
    snapshot: &Snapshot,
    ep: &Endpoint,
    mut plan: Plan,
    mut status: Value,
    conds: &mut Conditions,
    settings: &Settings,
    (id, path): (u64, String),
    (why, anew): (String, &str),
    reset: impl FnOnce(&mut Value, Plan) -> Plan,
) -> Result<Plan, ReconcileError> {
    let delete_id = format!("delete.{id}");
    if snapshot.observation(&delete_id).is_some_and(gone) {
        let attempt = snapshot.primary["status"]["attempt"].as_u64().unwrap_or(0);
        status["attempt"] = json!(attempt + 1);
        plan = reset(&mut status, plan);
        conds.set("Synced", false, "Recreating", anew);
        conds.set("Ready", false, "Recreating", anew);
        return finish(plan, status, conds, Duration::from_millis(100));
    }
    plan = plan.http(ep.request(&delete_id, HttpMethod::Delete, &path, None));
    let why = match snapshot.observation(&delete_id) {
        Some(o) => format!("DELETE {path}: {}", describe(o)),
        None => why,
    };
    conds.set("Synced", false, "Recreating", &why);
    conds.set("Ready", false, "Recreating", &why);
    finish(plan, status, conds, settings.retry)
}

/// The periodic resync of one row the server lists (§5): `GET base` with
/// id `check.<tid>.<row>`, for every plan of a child that is not being
/// recreated (the host sends a GET again once its per-primary interval has
/// passed, so this is the resync). The id names the row, so no answer about an earlier row is
/// taken for this one. Returns the observation and, when it listed the
/// team's rows, the row (`None`: gone from the server).
fn check_row<'a>(
    snapshot: &'a Snapshot,
    ep: &Endpoint,
    base: &str,
    (tid, row): (u64, u64),
) -> (HttpRequest, Option<(&'a Observation, Option<Value>)>) {
    let id = format!("check.{tid}.{row}");
    let get = ep.get(&id, base);
    let seen = snapshot.observation(&id).and_then(|o| {
        let list = body_of(o)?;
        let found = list
            .as_array()?
            .iter()
            .find(|r| r["id"].as_u64() == Some(row))
            .cloned();
        Some((o, found))
    });
    (get, seen)
}

/// Synced and Ready both true with `message`.
fn synced(conds: &mut Conditions, message: &str) {
    conds.set("Synced", true, "Synced", message);
    conds.set("Ready", true, "Synced", message);
}

// ---------------------------------------------------------------------------
// TerdutEscalationRule

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RuleSpec {
    #[serde(default)]
    repeat_count: u64,
    #[serde(default)]
    fallback_topic: String,
    #[serde(default)]
    levels: Vec<Level>,
}

#[derive(Clone, Debug, Default, Deserialize)]
struct Level {
    #[serde(default)]
    timeout: String,
    #[serde(default)]
    targets: Vec<Target>,
}

#[derive(Clone, Debug, Default, Deserialize)]
struct Target {
    #[serde(default)]
    kind: String,
    #[serde(default)]
    username: Option<String>,
}

/// The policy as the server stores it, with usernames resolved by `users`.
///
/// # Errors
/// The usernames `users` does not know.
pub fn desired_policy(spec: &Value, users: &BTreeMap<String, u64>) -> Result<Value, Vec<String>> {
    let spec: RuleSpec = serde_json::from_value(spec.clone()).unwrap_or_default();
    let mut unknown = Vec::new();
    let levels: Vec<Value> = spec
        .levels
        .iter()
        .map(|l| {
            let targets: Vec<Value> = l
                .targets
                .iter()
                .map(|t| match (t.kind.as_str(), &t.username) {
                    ("user", Some(u)) => match users.get(u) {
                        Some(id) => json!({"kind": "user", "user_id": id}),
                        None => {
                            unknown.push(u.clone());
                            Value::Null
                        }
                    },
                    _ => json!({"kind": "oncall"}),
                })
                .collect();
            json!({"timeout": l.timeout, "targets": targets})
        })
        .collect();
    if unknown.is_empty() {
        Ok(
            json!({"repeat_count": spec.repeat_count, "fallback_topic": spec.fallback_topic, "levels": levels}),
        )
    } else {
        Err(unknown)
    }
}

/// Reconciles one TerdutEscalationRule.
///
/// # Errors
/// Only for a snapshot that does not parse.
pub fn reconcile_escalation(snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
    let settings = Settings::of(snapshot);
    let p = match parent(snapshot) {
        Ok(p) => p,
        Err(no) => return waiting(snapshot, &no, &settings),
    };
    let tid = p.team_id;
    let path = format!("/api/teams/{tid}/escalation");
    let mut conds = Conditions::of(snapshot)?;
    let mut status = old_status(snapshot);
    status["teamID"] = json!(tid);
    if snapshot.deleting {
        let empty = json!({"repeat_count": 0, "fallback_topic": "", "levels": []});
        return delete_step(
            snapshot,
            &mut conds,
            status,
            &p.ep,
            Call {
                id: format!("clear.{tid}"),
                method: HttpMethod::Put,
                path: path.clone(),
                body: Some(empty),
            },
            &settings,
        );
    }
    conds.remove("Degraded");
    let mut plan = Plan::new();
    let needs_users = snapshot.primary["spec"]["levels"]
        .as_array()
        .is_some_and(|ls| {
            ls.iter().any(|l| {
                l["targets"]
                    .as_array()
                    .is_some_and(|ts| ts.iter().any(|t| t["kind"] == "user"))
            })
        });
    let users: BTreeMap<String, u64> = if needs_users {
        plan = plan.http(p.ep.get("users", "/api/users"));
        match snapshot.observation("users").and_then(body_of) {
            Some(list) => list
                .as_array()
                .map(|l| {
                    l.iter()
                        .filter_map(|u| {
                            Some((u["username"].as_str()?.to_owned(), u["id"].as_u64()?))
                        })
                        .collect()
                })
                .unwrap_or_default(),
            None => {
                conds.set(
                    "Synced",
                    false,
                    "ResolvingUsers",
                    "reading the server's users to resolve usernames",
                );
                conds.set(
                    "Ready",
                    false,
                    "ResolvingUsers",
                    "reading the server's users to resolve usernames",
                );
                return finish(plan, status, &conds, settings.retry);
            }
        }
    } else {
        BTreeMap::new()
    };
    let desired = match desired_policy(&snapshot.primary["spec"], &users) {
        Ok(d) => d,
        Err(unknown) => {
            let m = format!("no user named {} on the server", unknown.join(", "));
            conds.set("Synced", false, "UnknownUser", &m);
            conds.set("Ready", false, "UnknownUser", &m);
            return finish(plan, status, &conds, settings.retry);
        }
    };
    let get_id = format!("get.{tid}");
    let put_id = format!("put.{tid}");
    plan = plan.http(p.ep.get(&get_id, &path));
    let current = [&get_id, &put_id]
        .iter()
        .filter_map(|id| snapshot.observation(id))
        .filter_map(|o| body_of(o).map(|b| (o.age_ms, b)))
        .min_by_key(|(age, _)| *age)
        .map(|(_, b)| b);
    match current {
        None => {
            let why = snapshot.observation(&get_id).map_or_else(
                || "reading the policy".to_owned(),
                |o| format!("GET {path}: {}", describe(o)),
            );
            conds.set("Synced", false, "Syncing", &why);
            conds.set("Ready", false, "Syncing", &why);
            finish(plan, status, &conds, settings.retry)
        }
        Some(c) if c == desired => {
            conds.set(
                "Synced",
                true,
                "Synced",
                &format!("the escalation policy of team {tid} matches the spec"),
            );
            conds.set(
                "Ready",
                true,
                "Synced",
                &format!("the escalation policy of team {tid} matches the spec"),
            );
            finish(plan, status, &conds, settings.resync)
        }
        Some(_) => {
            plan = plan.http(p.ep.request(&put_id, HttpMethod::Put, &path, Some(desired)));
            let why = match snapshot.observation(&put_id) {
                Some(o) if !o.is_success() => format!("PUT {path}: {}", describe(o)),
                _ => "writing the whole policy".to_owned(),
            };
            conds.set("Synced", false, "Syncing", &why);
            conds.set("Ready", false, "Syncing", &why);
            finish(plan, status, &conds, settings.retry)
        }
    }
}

// ---------------------------------------------------------------------------
// TerdutDeadmanSwitch

const SWITCH_FIELDS: [&str; 3] = ["matcher", "timeout", "severity"];

fn switch_spec(spec: &Value) -> Value {
    json!({"name": spec["name"].as_str().unwrap_or_default(),
           "matcher": spec["matcher"].as_str().unwrap_or_default(),
           "timeout": spec["timeout"].as_str().unwrap_or_default(),
           "severity": spec["severity"].as_str().unwrap_or_default()})
}

/// Reconciles one TerdutDeadmanSwitch.
///
/// # Errors
/// Only for a snapshot that does not parse.
pub fn reconcile_deadman(snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
    let settings = Settings::of(snapshot);
    let p = match parent(snapshot) {
        Ok(p) => p,
        Err(no) => return waiting(snapshot, &no, &settings),
    };
    let tid = p.team_id;
    let base = format!("/api/teams/{tid}/deadman-switches");
    let mut conds = Conditions::of(snapshot)?;
    let mut status = old_status(snapshot);
    let old = snapshot.primary["status"].clone();
    let switch_id = old["switchID"]
        .as_u64()
        .filter(|_| old["teamID"].as_u64() == Some(tid));
    let attempt = old["attempt"].as_u64().unwrap_or(0);
    status["teamID"] = json!(tid);
    let plan = Plan::new();

    if snapshot.deleting {
        return match switch_id {
            None => Ok(plan.cleanup_complete()),
            Some(sid) => delete_step(
                snapshot,
                &mut conds,
                status,
                &p.ep,
                Call {
                    id: format!("delete.{sid}"),
                    method: HttpMethod::Delete,
                    path: format!("{base}/{sid}"),
                    body: None,
                },
                &settings,
            ),
        };
    }
    conds.remove("Degraded");
    let want = switch_spec(&snapshot.primary["spec"]);
    let Some(sid) = switch_id else {
        let ids = (
            format!("create.{tid}.{attempt}"),
            format!("lookup.{tid}.{attempt}"),
        );
        let (sw, adopted) =
            match create_or_find(snapshot, &p.ep, plan, &base, &want, ids, "switch", |b| {
                b["id"].is_u64()
            }) {
                Created::New(sw) => (sw, false),
                Created::Found(sw) => (sw, true),
                Created::Pending(plan, reason, why) => {
                    conds.set("Synced", false, reason, &why);
                    conds.set("Ready", false, reason, &why);
                    return finish(*plan, status, &conds, settings.retry);
                }
            };
        let sid = sw["id"].as_u64().unwrap_or_default();
        status["switchID"] = json!(sid);
        status["applied"] = switch_spec(&sw);
        let plan = if adopted {
            Plan::new().event(
                "SwitchAdopted",
                format!("adopted the existing dead man's switch {sid}"),
            )
        } else {
            Plan::new().event("SwitchCreated", format!("created dead man's switch {sid}"))
        };
        synced(&mut conds, &format!("dead man's switch {sid} was created"));
        return finish(plan, status, &conds, Duration::from_millis(100));
    };
    let (check, seen) = check_row(snapshot, &p.ep, &base, (tid, sid));
    let deleting_it = snapshot.observation(&format!("delete.{sid}")).is_some();
    let applied = match seen {
        Some((_, None)) if !deleting_it => {
            // Deleted on the server behind our back: create it anew.
            status["switchID"] = Value::Null;
            status["applied"] = Value::Null;
            status["attempt"] = json!(attempt + 1);
            let m = format!("dead man's switch {sid} is gone from the server; creating it again");
            conds.set("Synced", false, "Recreating", &m);
            conds.set("Ready", false, "Recreating", &m);
            let plan = Plan::new().warning("SwitchMissingOnServer", m);
            return finish(plan, status, &conds, Duration::from_millis(100));
        }
        // As the server has it: a change there is drift like a spec change.
        Some((_, Some(row))) => switch_spec(&row),
        _ => old["applied"].clone(),
    };
    let applied = &applied;
    let changed: Vec<&str> = SWITCH_FIELDS
        .iter()
        .copied()
        .filter(|f| applied[*f] != want[*f])
        .collect();
    if !changed.is_empty() {
        // No update verb: delete, then create anew (a new attempt).
        let changed = changed.join(", ");
        return recreate(
            snapshot,
            &p.ep,
            plan,
            status,
            &mut conds,
            &settings,
            (sid, format!("{base}/{sid}")),
            (
                format!("{changed} changed: deleting switch {sid} to recreate it"),
                "creating the switch anew",
            ),
            |status, plan| {
                status["switchID"] = Value::Null;
                status["applied"] = Value::Null;
                plan.event(
                    "SwitchRecreating",
                    format!(
                        "deleted dead man's switch {sid} to recreate it with the new {changed}"
                    ),
                )
            },
        );
    }
    if applied["name"] != want["name"] {
        let m = format!(
            "terdut-server cannot rename a dead man's switch; it stays {} (recreate the object to rename it)",
            applied["name"]
        );
        conds.set("Synced", false, "NameImmutable", &m);
        conds.set(
            "Ready",
            true,
            "Synced",
            &format!("dead man's switch {sid} is active"),
        );
        return finish(plan.http(check), status, &conds, settings.resync);
    }
    synced(
        &mut conds,
        &format!("dead man's switch {sid} matches the spec"),
    );
    finish(plan.http(check), status, &conds, settings.resync)
}

// ---------------------------------------------------------------------------
// TerdutAlertSource

/// `<name>-terdut-webhook`: the Secret holding an alert source's url and key.
pub fn webhook_secret_name(source: &str) -> String {
    format!("{source}-terdut-webhook")
}

/// Reconciles one TerdutAlertSource.
///
/// # Errors
/// Only for a snapshot that does not parse.
pub fn reconcile_alert_source(snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
    let settings = Settings::of(snapshot);
    let p = match parent(snapshot) {
        Ok(p) => p,
        Err(no) => return waiting(snapshot, &no, &settings),
    };
    let tid = p.team_id;
    let name = snapshot.primary_name().to_owned();
    let namespace = snapshot.primary_namespace().unwrap_or_default().to_owned();
    let base = format!("/api/teams/{tid}/integrations");
    let secret_name = webhook_secret_name(&name);
    let mut conds = Conditions::of(snapshot)?;
    let mut status = old_status(snapshot);
    let old = snapshot.primary["status"].clone();
    let iid = old["integrationID"]
        .as_u64()
        .filter(|_| old["teamID"].as_u64() == Some(tid));
    let attempt = old["attempt"].as_u64().unwrap_or(0);
    status["teamID"] = json!(tid);
    let mut plan = Plan::new();

    if snapshot.deleting {
        return match iid {
            None => Ok(plan.cleanup_complete()),
            Some(iid) => delete_step(
                snapshot,
                &mut conds,
                status,
                &p.ep,
                Call {
                    id: format!("delete.{iid}"),
                    method: HttpMethod::Delete,
                    path: format!("{base}/{iid}"),
                    body: None,
                },
                &settings,
            ),
        };
    }
    conds.remove("Degraded");
    let want = json!({"name": snapshot.primary["spec"]["name"].as_str().filter(|n| !n.is_empty()).unwrap_or(&name),
                      "kind": snapshot.primary["spec"]["kind"].as_str().unwrap_or("alertmanager")});
    let have_secret = snapshot
        .owned
        .iter()
        .any(|o| o["kind"] == "Secret" && o["metadata"]["name"] == secret_name.as_str());
    let Some(iid) = iid else {
        let ids = (
            format!("create.{tid}.{attempt}"),
            format!("lookup.{tid}.{attempt}"),
        );
        let body = match create_or_find(
            snapshot,
            &p.ep,
            plan,
            &base,
            &want,
            ids,
            "integration",
            |b| b["id"].is_u64() && b["key"].is_string(),
        ) {
            Created::New(body) => body,
            Created::Found(i) if have_secret => {
                let found_id = i["id"].as_u64().unwrap_or_default();
                status["integrationID"] = json!(found_id);
                status["applied"] = json!({"name": i["name"], "kind": i["kind"]});
                status["webhookURLSecretRef"] = json!({"name": secret_name});
                let plan = Plan::new().event("IntegrationAdopted", format!("adopted the existing integration {found_id}; its key is in Secret {secret_name} already"));
                synced(&mut conds, &format!("integration {found_id} adopted"));
                return finish(plan, status, &conds, Duration::from_millis(100));
            }
            Created::Found(i) => {
                // Its key was shown once, to a create whose answer was
                // lost: only a new integration has a usable key.
                let found_id = i["id"].as_u64().unwrap_or_default();
                return recreate(
                    snapshot,
                    &p.ep,
                    Plan::new(),
                    status,
                    &mut conds,
                    &settings,
                    (found_id, format!("{base}/{found_id}")),
                    (
                        format!(
                            "integration {found_id} exists but its key is unknown: deleting it to create it anew"
                        ),
                        "recreating the integration to get a key",
                    ),
                    |status, plan| {
                        status["rotating"] = json!(true);
                        plan
                    },
                );
            }
            Created::Pending(plan, reason, why) => {
                conds.set("Synced", false, reason, &why);
                conds.set("Ready", false, reason, &why);
                return finish(*plan, status, &conds, settings.retry);
            }
        };
        let new_id = body["id"].as_u64().unwrap_or_default();
        let key = body["key"].as_str().unwrap_or_default();
        let url = body["url"].as_str().unwrap_or_default();
        let mut plan = Plan::new().apply(crate::api::secret(
            &secret_name,
            &namespace,
            json!({"terdut.ryuvia.com/alert-source": name}),
            &[("url", url), ("key", key)],
        ));
        status["integrationID"] = json!(new_id);
        status["applied"] = json!({"name": body["name"], "kind": body["kind"]});
        status["webhookURLSecretRef"] = json!({"name": secret_name});
        status["rotating"] = Value::Null;
        plan = if old["rotating"].as_bool() == Some(true) {
            plan.warning(
                "WebhookKeyRotated",
                format!("integration recreated as {new_id}: the webhook URL and key changed; senders must use the new ones in Secret {secret_name}"),
            )
        } else {
            plan.event(
                "IntegrationCreated",
                format!(
                    "created integration {new_id}; its URL and key are in Secret {secret_name}"
                ),
            )
        };
        synced(&mut conds, &format!("integration {new_id} was created"));
        return finish(plan, status, &conds, Duration::from_millis(100));
    };
    let (check, seen) = check_row(snapshot, &p.ep, &base, (tid, iid));
    let rename_id = format!("rename.{iid}");
    let server_newer = seen
        .as_ref()
        .is_some_and(|(o, _)| newer(o, snapshot.observation(&rename_id)));
    let deleting_it = snapshot.observation(&format!("delete.{iid}")).is_some();
    // A list that shows the name we are renaming from, newer than our
    // PATCH's answer, may be a GET sent before the PATCH and answered after
    // it (an earlier plan's resync still in flight): it does not undo the
    // rename. A server truly renamed back shows on the next resync, whose
    // GET is sent after the rename is recorded.
    let list_shows_old_name = seen
        .as_ref()
        .and_then(|(_, row)| row.as_ref())
        .is_some_and(|row| row["name"] == old["applied"]["name"]);
    let mut applied = old["applied"].clone();
    match seen {
        Some((_, None)) if !deleting_it => {
            // Deleted on the server behind our back: only a new integration
            // has a usable key, so this rotates it (Warning on create).
            status["integrationID"] = Value::Null;
            status["applied"] = Value::Null;
            status["rotating"] = json!(true);
            status["attempt"] = json!(attempt + 1);
            let m = format!(
                "integration {iid} is gone from the server; creating it again (a new webhook key)"
            );
            conds.set("Synced", false, "Recreating", &m);
            conds.set("Ready", false, "Recreating", &m);
            let plan = Plan::new().warning("IntegrationMissingOnServer", m);
            return finish(plan, status, &conds, Duration::from_millis(100));
        }
        // As the server has it, unless our own rename is newer.
        Some((_, Some(row))) if server_newer => {
            applied = json!({"name": row["name"], "kind": row["kind"]});
        }
        _ => {}
    }
    let applied = &applied;
    if applied["kind"] != want["kind"] {
        return recreate(
            snapshot,
            &p.ep,
            plan,
            status,
            &mut conds,
            &settings,
            (iid, format!("{base}/{iid}")),
            (
                format!(
                    "kind changed from {} to {}: recreating integration {iid}, which rotates its key",
                    applied["kind"], want["kind"]
                ),
                "creating the integration anew with the new kind",
            ),
            |status, plan| {
                status["integrationID"] = Value::Null;
                status["applied"] = Value::Null;
                status["rotating"] = json!(true);
                plan
            },
        );
    }
    if !have_secret {
        let m = format!(
            "Secret {secret_name} is gone; the key cannot be read back from the server (change the kind to rotate it)"
        );
        conds.set("Ready", false, "WebhookSecretMissing", &m);
    }
    if applied["name"] != want["name"] {
        // A rename keeps the integration and its key: PATCH the name.
        let path = format!("{base}/{iid}");
        // Our PATCH answered, unless the server has said otherwise since.
        let renamed = (!server_newer || list_shows_old_name)
            && snapshot
                .observation(&rename_id)
                .filter(|o| o.is_success())
                .and_then(body_of)
                .is_some_and(|b| b["name"] == want["name"]);
        if renamed {
            status["applied"]["name"] = want["name"].clone();
            plan = plan.event(
                "IntegrationRenamed",
                format!(
                    "renamed integration {iid} from {} to {}",
                    applied["name"], want["name"]
                ),
            );
            conds.set(
                "Synced",
                true,
                "Synced",
                &format!("integration {iid} was renamed"),
            );
            if have_secret {
                conds.set(
                    "Ready",
                    true,
                    "Synced",
                    &format!("integration {iid} is active"),
                );
            }
            return finish(plan, status, &conds, Duration::from_millis(100));
        }
        // Not with the list GET: sent together, the GET may be answered
        // from before the PATCH yet arrive after it, and look newer.
        plan = plan.http(p.ep.request(
            &rename_id,
            HttpMethod::Patch,
            &path,
            Some(json!({"name": want["name"]})),
        ));
        let (reason, m) = match snapshot.observation(&rename_id) {
            Some(o) if !o.is_success() => {
                ("RenameFailed", format!("PATCH {path}: {}", describe(o)))
            }
            _ => (
                "Renaming",
                format!(
                    "renaming integration {iid} from {} to {}",
                    applied["name"], want["name"]
                ),
            ),
        };
        conds.set("Synced", false, reason, &m);
        if have_secret {
            conds.set(
                "Ready",
                true,
                "Synced",
                &format!("integration {iid} is active"),
            );
        }
        return finish(plan, status, &conds, settings.retry);
    }
    conds.set(
        "Synced",
        true,
        "Synced",
        &format!("integration {iid} matches the spec"),
    );
    if have_secret {
        conds.set(
            "Ready",
            true,
            "Synced",
            &format!("integration {iid} matches the spec"),
        );
    }
    finish(plan.http(check), status, &conds, settings.resync)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_resolves_usernames() {
        let spec = json!({"repeatCount": 2, "fallbackTopic": "t", "levels": [
            {"timeout": "5m", "targets": [{"kind": "oncall"}, {"kind": "user", "username": "alice"}]}]});
        let users: BTreeMap<String, u64> = [("alice".to_owned(), 7)].into();
        assert_eq!(
            desired_policy(&spec, &users).unwrap(),
            json!({"repeat_count": 2, "fallback_topic": "t", "levels": [
                {"timeout": "5m", "targets": [{"kind": "oncall"}, {"kind": "user", "user_id": 7}]}]})
        );
        assert_eq!(
            desired_policy(&spec, &BTreeMap::new()).unwrap_err(),
            ["alice"]
        );
    }
}
