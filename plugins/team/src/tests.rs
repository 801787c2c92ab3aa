//! Scenario tests of the five controllers over native snapshots.

use super::*;
use serde_json::json;
use wasmop_sdk::testing::{SnapshotBuilder, run};
use wasmop_sdk::{HttpMethod, Observation};

const SERVER_YAML: &str = "
apiVersion: terdut.ryuvia.com/v1alpha1
kind: TerdutServer
metadata: {name: terdut, namespace: oncall, uid: u-server, generation: 1}
spec:
  image: {repository: example/terdut-server, tag: v0.9.3}
  networking: {servicePort: 8080, apiURL: 'http://127.0.0.1:4000'}
  database:
    dsn: postgres://terdut@db:5432/terdut
    passwordSecretRef: {name: db, key: password}
  allowedTeams: {namespaces: {from: Selector, selector: {matchLabels: {terdut: allowed}}}}
";

const DB_SECRET: &str = "
apiVersion: v1
kind: Secret
metadata: {name: db, namespace: oncall, uid: u-db, resourceVersion: '7'}
data: {password: cHc=}
";

const CREDS: &str = "
apiVersion: v1
kind: Secret
metadata: {name: terdut-operator-credentials, namespace: oncall, uid: u-creds, resourceVersion: '3'}
data: {api-key: a2V5, url: eA==}
";

fn obs(id: &str, status: Option<u16>, body: serde_json::Value, age_ms: u64) -> Observation {
    Observation {
        id: id.into(),
        status,
        body: if body.is_null() {
            String::new()
        } else {
            body.to_string()
        },
        error: if status.is_none() {
            Some("cannot connect".into())
        } else {
            None
        },
        observed_at: "2025-01-01T00:00:00Z".into(),
        age_ms,
        outcome: None,
    }
}

fn one(yaml: &str) -> serde_json::Value {
    wasmop_sdk::testing::objects_from_yaml(yaml).remove(0)
}

fn server() -> SnapshotBuilder {
    SnapshotBuilder::from_yaml(SERVER, SERVER_YAML).related(server::READ_SECRETS, one(DB_SECRET))
}

fn condition<'a>(plan: &'a Plan, type_: &str) -> &'a serde_json::Value {
    plan.status
        .as_ref()
        .and_then(|s| s["conditions"].as_array())
        .and_then(|c| c.iter().find(|c| c["type"] == type_))
        .unwrap_or(&serde_json::Value::Null)
}

fn ids(plan: &Plan) -> Vec<(&str, HttpMethod, &str)> {
    plan.http_requests
        .iter()
        .map(|r| (r.id.as_str(), r.method, r.path.as_str()))
        .collect()
}

#[test]
fn manifest_declares_five_controllers_with_their_reads_and_finalizers() {
    let m = TeamPlugin::manifest();
    let names: Vec<&str> = m.controllers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, [SERVER, TEAM, ESCALATION, DEADMAN, ALERT_SOURCE]);
    for c in &m.controllers {
        assert_eq!(c.primary.group, "terdut.ryuvia.com");
        assert!(c.finalizer.is_some(), "{}", c.name);
    }
    let team = &m.controllers[1];
    let reads: Vec<&str> = team.reads.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(reads, ["server", "namespace", "secrets"]);
    assert_eq!(
        team.reads[0].selector,
        Selector::field_in("spec.serverRef.name", "spec.serverRef.namespace")
    );
    assert!(team.owns.is_empty(), "a team writes nothing in Kubernetes");
}

#[test]
fn the_server_writes_only_secrets_outside_its_namespace() {
    let m = TeamPlugin::manifest();
    let server = &m.controllers[0];
    let scope = |kind: &str| {
        let owned = server.owns.iter().find(|o| o.kind.kind == kind).unwrap();
        server.kind_write_namespaces(owned)
    };
    assert!(scope("Deployment").is_empty());
    assert!(scope("Service").is_empty());
    assert_eq!(scope("Secret"), ["*"]);
    let deployment = server
        .owns
        .iter()
        .find(|o| o.kind.kind == "Deployment")
        .unwrap();
    assert!(!server.may_write_kind(deployment, Some("terdut"), "team-a"));
    // Declared, not only implied by the owner reference.
    assert_eq!(deployment.write_namespaces, Some(vec![]));
}

#[test]
fn server_first_pass_renders_workloads_and_asks_for_the_version() {
    let plan = run::<TeamPlugin>(&server().build()).unwrap();
    let kinds: Vec<&str> = plan
        .apply
        .iter()
        .map(|a| a.object["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["Deployment", "Service"]);
    let d = &plan.apply[0].object;
    assert_eq!(d["spec"]["replicas"], 1);
    let env = &d["spec"]["template"]["spec"]["containers"][0]["env"];
    assert_eq!(
        env[0],
        json!({"name": "TERDUT_DATABASE_DSN", "value": "postgres://terdut@db:5432/terdut"})
    );
    assert_eq!(
        env[1]["valueFrom"]["secretKeyRef"],
        json!({"name": "db", "key": "password"})
    );
    assert_eq!(ids(&plan), [("version", HttpMethod::Get, "/api/version")]);
    assert!(
        plan.http_requests[0].secret_headers.is_empty(),
        "version is unauthenticated"
    );
    assert_eq!(condition(&plan, "Bootstrapped")["status"], "Unknown");
    assert_eq!(condition(&plan, "DatabaseReady")["status"], "True");
    assert_eq!(condition(&plan, "Ready")["status"], "False");
}

#[test]
fn server_bootstraps_an_empty_install_and_stores_the_key_only_in_its_secret() {
    let empty = obs(
        "version",
        Some(200),
        json!({"version": "1", "capabilities": ["teams"], "bootstrapped": false}),
        5,
    );
    let plan = run::<TeamPlugin>(&server().observation(empty.clone()).build()).unwrap();
    assert!(ids(&plan).contains(&("bootstrap", HttpMethod::Post, "/api/bootstrap")));

    let done = obs(
        "bootstrap",
        Some(201),
        json!({"user": {"id": 1}, "key": "tdk_CANARY"}),
        1,
    );
    let plan = run::<TeamPlugin>(&server().observation(empty).observation(done).build()).unwrap();
    let secret = plan
        .apply
        .iter()
        .find(|a| a.object["kind"] == "Secret")
        .expect("credentials Secret");
    assert_eq!(
        secret.object["metadata"]["name"],
        "terdut-operator-credentials"
    );
    assert_eq!(secret.object["data"]["api-key"], api::base64(b"tdk_CANARY"));
    assert!(
        !ids(&plan).iter().any(|(id, ..)| *id == "bootstrap"),
        "single shot"
    );
    let everything_but_applies = json!([plan.status, plan.events]).to_string();
    assert!(
        !everything_but_applies.contains("CANARY"),
        "{everything_but_applies}"
    );
    assert!(!everything_but_applies.contains(&api::base64(b"tdk_CANARY")));
    assert_eq!(condition(&plan, "Bootstrapped")["status"], "True");
}

#[test]
fn a_403_means_bootstrapped_elsewhere_reported_not_failed() {
    let empty = obs(
        "version",
        Some(200),
        json!({"capabilities": [], "bootstrapped": false}),
        5,
    );
    let lost = obs(
        "bootstrap",
        Some(403),
        json!({"error": "already bootstrapped"}),
        1,
    );
    let plan = run::<TeamPlugin>(&server().observation(empty).observation(lost).build()).unwrap();
    let c = condition(&plan, "Bootstrapped");
    assert_eq!(
        (c["status"].as_str(), c["reason"].as_str()),
        (Some("False"), Some("BootstrappedElsewhere"))
    );
    assert!(
        plan.http_requests
            .iter()
            .all(|r| r.method == HttpMethod::Get),
        "no second POST"
    );
    assert_eq!(plan.events[0].reason, "BootstrappedElsewhere");

    // An install the version endpoint reports as bootstrapped is never POSTed to.
    let taken = obs(
        "version",
        Some(200),
        json!({"capabilities": [], "bootstrapped": true}),
        5,
    );
    let plan = run::<TeamPlugin>(&server().observation(taken).build()).unwrap();
    assert_eq!(ids(&plan), [("version", HttpMethod::Get, "/api/version")]);
    assert_eq!(
        condition(&plan, "Bootstrapped")["reason"],
        "BootstrappedElsewhere"
    );
}

#[test]
fn a_bootstrap_answer_lost_with_its_replica_is_asked_for_once_more() {
    let taken = obs(
        "version",
        Some(200),
        json!({"capabilities": [], "bootstrapped": true}),
        5,
    );
    let with_reason = |reason: &str| {
        let mut s = wasmop_sdk::testing::objects_from_yaml(SERVER_YAML).remove(0);
        s["status"] = json!({"conditions": [{"type": "Bootstrapped", "status": "False",
            "reason": reason, "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]});
        if reason != "BootstrappedElsewhere" {
            s["status"]["bootstrapRequested"] = json!("wasmop.oncall.terdut");
        }
        SnapshotBuilder::new(SERVER)
            .primary(s)
            .related(server::READ_SECRETS, one(DB_SECRET))
            .observation(taken.clone())
    };
    // The status says our POST went out (the condition since overwritten
    // while the version was asked for); no answer is kept: the same POST
    // again (same id, path and body, so the same Idempotency-Key).
    let plan = run::<TeamPlugin>(&with_reason("WaitingForServer").build()).unwrap();
    let again = plan
        .http_requests
        .iter()
        .find(|r| r.id == "bootstrap")
        .expect("the bootstrap asked for again");
    assert_eq!(again.method, HttpMethod::Post);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&again.body).unwrap(),
        json!({"username": "wasmop.oncall.terdut"})
    );
    assert_eq!(condition(&plan, "Bootstrapped")["reason"], "Bootstrapping");
    assert!(plan.events.is_empty(), "not reported as someone else's yet");
    assert_eq!(
        plan.status.as_ref().unwrap()["bootstrapRequested"],
        "wasmop.oncall.terdut",
        "kept until an answer is"
    );
    // While the version is being asked for, the mark stays.
    let unknown = {
        let mut s = wasmop_sdk::testing::objects_from_yaml(SERVER_YAML).remove(0);
        s["status"] = json!({"bootstrapRequested": "wasmop.oncall.terdut"});
        SnapshotBuilder::new(SERVER)
            .primary(s)
            .related(server::READ_SECRETS, one(DB_SECRET))
            .build()
    };
    let plan = run::<TeamPlugin>(&unknown).unwrap();
    assert_eq!(
        plan.status.as_ref().unwrap()["bootstrapRequested"],
        "wasmop.oncall.terdut"
    );
    // Its 403 is kept: bootstrapped elsewhere, no third POST.
    let refused = obs(
        "bootstrap",
        Some(403),
        json!({"error": "already bootstrapped"}),
        1,
    );
    let plan =
        run::<TeamPlugin>(&with_reason("Bootstrapping").observation(refused).build()).unwrap();
    assert_eq!(
        condition(&plan, "Bootstrapped")["reason"],
        "BootstrappedElsewhere"
    );
    assert!(!ids(&plan).iter().any(|(id, ..)| *id == "bootstrap"));
    assert!(plan.status.as_ref().unwrap()["bootstrapRequested"].is_null());
    // Without the mark: someone else's, never POSTed to.
    let plan = run::<TeamPlugin>(&with_reason("BootstrappedElsewhere").build()).unwrap();
    assert_eq!(ids(&plan), [("version", HttpMethod::Get, "/api/version")]);
}

#[test]
fn with_an_admin_key_the_operator_creates_its_own_service_account() {
    let mut spec = wasmop_sdk::testing::objects_from_yaml(SERVER_YAML).remove(0);
    spec["spec"]["bootstrap"] = json!({"adminKeySecretRef": {"name": "chart-admin", "key": "key"}});
    let base = || {
        SnapshotBuilder::new(SERVER)
            .primary(spec.clone())
            .related(server::READ_SECRETS, one(DB_SECRET))
            .related(
                server::READ_SECRETS,
                json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "chart-admin", "namespace": "oncall"}, "data": {"key": "eA=="}}),
            )
            .observation(obs("version", Some(200), json!({"bootstrapped": true}), 9))
    };
    let plan = run::<TeamPlugin>(&base().build()).unwrap();
    let create = plan
        .http_requests
        .iter()
        .find(|r| r.id == "operator-sa.create")
        .unwrap();
    assert_eq!(
        (create.method, create.path.as_str()),
        (HttpMethod::Post, "/api/service-accounts")
    );
    assert_eq!(create.secret_headers[0].secret, "chart-admin");
    assert_eq!(create.secret_headers[0].key, "key");

    // 409: look it up, then add a key.
    let conflict = obs(
        "operator-sa.create",
        Some(409),
        json!({"error": "exists"}),
        3,
    );
    let plan = run::<TeamPlugin>(&base().observation(conflict.clone()).build()).unwrap();
    assert!(ids(&plan).contains(&(
        "operator-sa.lookup",
        HttpMethod::Get,
        "/api/service-accounts?name=wasmop.oncall.terdut"
    )));
    let found = obs(
        "operator-sa.lookup",
        Some(200),
        json!([{"id": 12, "name": "wasmop.oncall.terdut"}]),
        2,
    );
    let plan = run::<TeamPlugin>(
        &base()
            .observation(conflict.clone())
            .observation(found.clone())
            .build(),
    )
    .unwrap();
    assert!(ids(&plan).contains(&(
        "operator-sa.key",
        HttpMethod::Post,
        "/api/service-accounts/12/keys"
    )));
    let key = obs("operator-sa.key", Some(201), json!({"key": "tdk_x"}), 1);
    let plan = run::<TeamPlugin>(
        &base()
            .observation(conflict)
            .observation(found)
            .observation(key)
            .build(),
    )
    .unwrap();
    assert!(
        plan.apply
            .iter()
            .any(|a| a.object["metadata"]["name"] == "terdut-operator-credentials")
    );
    assert_eq!(
        condition(&plan, "Bootstrapped")["reason"],
        "ServiceAccountCreated"
    );
}

fn team_obj(ns: &str, name: &str, server_ns: Option<&str>) -> serde_json::Value {
    json!({"apiVersion": "terdut.ryuvia.com/v1alpha1", "kind": "TerdutTeam",
           "metadata": {"name": name, "namespace": ns},
           "spec": {"serverRef": {"name": "terdut", "namespace": server_ns}}})
}

fn namespace(name: &str, labels: serde_json::Value) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})
}

#[test]
fn the_mirror_goes_only_into_consenting_namespaces_that_reference_the_server() {
    let stale = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "terdut.oncall-terdut-credentials", "namespace": "gone", "uid": "u-stale", "resourceVersion": "4",
                     "labels": {"terdut.ryuvia.com/credentials": "mirror"}}});
    let snapshot = server()
        .owned(one(CREDS))
        .owned(stale)
        .related(server::READ_TEAMS, team_obj("team-a", "a", Some("oncall")))
        .related(server::READ_TEAMS, team_obj("team-a", "a2", Some("oncall")))
        .related(server::READ_TEAMS, team_obj("team-b", "b", Some("oncall")))
        .related(server::READ_TEAMS, team_obj("oncall", "local", None))
        .related(server::READ_TEAMS, team_obj("team-c", "other-server", None))
        .related(
            server::READ_NAMESPACES,
            namespace("team-a", json!({"terdut": "allowed"})),
        )
        .related(server::READ_NAMESPACES, namespace("team-b", json!({})))
        .observation(obs(
            "version",
            Some(200),
            json!({"capabilities": ["teams"], "bootstrapped": true}),
            1,
        ))
        .build();
    let plan = run::<TeamPlugin>(&snapshot).unwrap();
    let mirrors: Vec<(&str, &str)> = plan
        .apply
        .iter()
        .filter(|a| a.object["kind"] == "Secret")
        .map(|a| {
            (
                a.object["metadata"]["namespace"].as_str().unwrap(),
                a.object["metadata"]["name"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        mirrors,
        [("team-a", "terdut.oncall-terdut-credentials")],
        "one per namespace, consenting only"
    );
    let m = &plan
        .apply
        .iter()
        .find(|a| a.object["kind"] == "Secret")
        .unwrap()
        .object;
    assert_eq!(m["data"]["api-key"], "a2V5", "the operator's key, copied");
    assert_eq!(plan.delete.len(), 1);
    assert_eq!(plan.delete[0].target.namespace, "gone");
    assert_eq!(
        plan.status.as_ref().unwrap()["teamCredentials"],
        json!([{"namespace": "team-a", "secret": "terdut.oncall-terdut-credentials", "kind": "mirror"}])
    );
}

#[test]
fn with_team_scoped_accounts_each_admitted_team_gets_its_own_key() {
    let snapshot = server()
        .owned(one(CREDS))
        .related(server::READ_TEAMS, team_obj("team-a", "a", Some("oncall")))
        .related(
            server::READ_NAMESPACES,
            namespace("team-a", json!({"terdut": "allowed"})),
        )
        .observation(obs(
            "version",
            Some(200),
            json!({"capabilities": ["teams", "team-service-accounts"], "bootstrapped": true}),
            1,
        ))
        .observation(obs(
            "team-sa.team-a.a.create",
            Some(201),
            json!({"id": 4, "key": "tdk_team"}),
            1,
        ))
        .build();
    let plan = run::<TeamPlugin>(&snapshot).unwrap();
    let secrets: Vec<&serde_json::Value> = plan
        .apply
        .iter()
        .map(|a| &a.object)
        .filter(|o| o["kind"] == "Secret")
        .collect();
    assert_eq!(secrets.len(), 1, "no mirror");
    assert_eq!(secrets[0]["metadata"]["name"], "a-terdut-team-credentials");
    assert_eq!(secrets[0]["data"]["api-key"], api::base64(b"tdk_team"));
}

#[test]
fn a_deleted_server_removes_what_it_handed_out_before_its_finalizer_goes() {
    let mirror = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "terdut.oncall-terdut-credentials", "namespace": "team-a", "uid": "u-m", "resourceVersion": "4",
                     "labels": {"terdut.ryuvia.com/credentials": "mirror"}}});
    let plan = run::<TeamPlugin>(
        &server()
            .owned(one(CREDS))
            .owned(mirror)
            .deleting(true)
            .build(),
    )
    .unwrap();
    assert_eq!(
        plan.delete.len(),
        2,
        "the mirror and the credentials: all label-owned"
    );
    assert!(!plan.cleanup_complete);
    let plan = run::<TeamPlugin>(&server().deleting(true).build()).unwrap();
    assert!(plan.cleanup_complete);
}

#[test]
fn zalando_cluster_ref_waits_for_the_cluster_and_its_secret() {
    let mut s = wasmop_sdk::testing::objects_from_yaml(SERVER_YAML).remove(0);
    s["spec"]["database"] = json!({"postgresClusterRef": {"name": "pg"}});
    let plan = run::<TeamPlugin>(&SnapshotBuilder::new(SERVER).primary(s.clone()).build()).unwrap();
    assert_eq!(
        condition(&plan, "DatabaseReady")["reason"],
        "PostgresClusterNotFound"
    );
    assert!(plan.apply.is_empty(), "no Deployment without a database");
    let pg = json!({"apiVersion": "acid.zalan.do/v1", "kind": "postgresql", "metadata": {"name": "pg", "namespace": "oncall"},
                    "spec": {"users": {"terdut": []}, "databases": {"terdut": "terdut"}},
                    "status": {"PostgresClusterStatus": "Running"}});
    let plan = run::<TeamPlugin>(
        &SnapshotBuilder::new(SERVER)
            .primary(s.clone())
            .related(server::READ_POSTGRES, pg.clone())
            .build(),
    )
    .unwrap();
    assert_eq!(
        condition(&plan, "DatabaseReady")["reason"],
        "CredentialsSecretMissing"
    );
    let creds = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "terdut.pg.credentials.postgresql.acid.zalan.do", "namespace": "oncall"},
                       "data": {"username": "dA==", "password": "cA=="}});
    let plan = run::<TeamPlugin>(
        &SnapshotBuilder::new(SERVER)
            .primary(s)
            .related(server::READ_POSTGRES, pg)
            .related(server::READ_SECRETS, creds)
            .build(),
    )
    .unwrap();
    assert_eq!(condition(&plan, "DatabaseReady")["status"], "True");
    let env = &plan.apply[0].object["spec"]["template"]["spec"]["containers"][0]["env"];
    assert_eq!(
        env[0]["value"],
        "postgres://terdut@pg.oncall.svc:5432/terdut?sslmode=require"
    );
}

// ---------------------------------------------------------------------------
// TerdutTeam

fn server_ready(allowed: serde_json::Value) -> serde_json::Value {
    json!({"apiVersion": "terdut.ryuvia.com/v1alpha1", "kind": "TerdutServer",
           "metadata": {"name": "terdut", "namespace": "oncall"},
           "spec": {"allowedTeams": {"namespaces": allowed}},
           "status": {"apiURL": "http://127.0.0.1:4000", "capabilities": ["teams"],
                      "operatorCredentialsSecretRef": {"name": "terdut-operator-credentials"}}})
}

fn team(status: serde_json::Value) -> SnapshotBuilder {
    SnapshotBuilder::new(TEAM)
        .primary(json!({"apiVersion": "terdut.ryuvia.com/v1alpha1", "kind": "TerdutTeam",
            "metadata": {"name": "platform", "namespace": "team-a", "uid": "u-team", "generation": 2},
            "spec": {"serverRef": {"name": "terdut", "namespace": "oncall"}, "displayName": "Platform",
                     "oidc": {"memberGroup": "m", "ownerGroup": "o"}},
            "status": status}))
        .related(team::READ_SERVER, server_ready(json!({"from": "All"})))
        .related(team::READ_NAMESPACE, namespace("team-a", json!({})))
        .related(
            team::READ_SECRETS,
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "terdut.oncall-terdut-credentials", "namespace": "team-a"}, "data": {"api-key": "eA=="}}),
        )
}

#[test]
fn a_revoked_team_sends_nothing_and_deletes_nothing() {
    let snapshot = team(json!({"teamID": 42}))
        .related(team::READ_SERVER, json!(null))
        .build();
    // Replace the server with one that no longer admits team-a.
    let mut snapshot = snapshot;
    snapshot.related.retain(|r| r.read != team::READ_SERVER);
    snapshot.related.push(wasmop_sdk::RelatedObject {
        read: team::READ_SERVER.into(),
        object: server_ready(json!({"from": "Same"})),
    });
    let plan = run::<TeamPlugin>(&snapshot).unwrap();
    assert!(plan.http_requests.is_empty());
    let c = condition(&plan, "Ready");
    assert_eq!(
        (c["status"].as_str(), c["reason"].as_str()),
        (Some("False"), Some("RefNotPermitted"))
    );
    assert_eq!(plan.status.as_ref().unwrap()["teamID"], 42, "kept");

    snapshot.deleting = true;
    let plan = run::<TeamPlugin>(&snapshot).unwrap();
    assert!(plan.http_requests.is_empty(), "no DELETE on revocation");
    assert!(plan.cleanup_complete);
    assert_eq!(plan.events[0].reason, "TeamLeftOnServer");
}

#[test]
fn a_new_team_is_created_and_a_409_adopts_by_name() {
    let plan = run::<TeamPlugin>(&team(json!({})).build()).unwrap();
    assert_eq!(ids(&plan), [("create.0", HttpMethod::Post, "/api/teams")]);
    let r = &plan.http_requests[0];
    assert_eq!(
        r.secret_headers[0].secret,
        "terdut.oncall-terdut-credentials"
    );
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&r.body).unwrap()["name"],
        "Platform"
    );

    let conflict = obs("create.0", Some(409), json!({"error": "team exists"}), 2);
    let plan = run::<TeamPlugin>(&team(json!({})).observation(conflict.clone()).build()).unwrap();
    assert_eq!(
        ids(&plan),
        [("lookup.0", HttpMethod::Get, "/api/teams?name=Platform")]
    );
    let found = obs(
        "lookup.0",
        Some(200),
        json!([{"id": 42, "name": "Platform", "member_group": "", "owner_group": ""}]),
        1,
    );
    let plan = run::<TeamPlugin>(
        &team(json!({}))
            .observation(conflict)
            .observation(found)
            .build(),
    )
    .unwrap();
    assert_eq!(plan.status.as_ref().unwrap()["teamID"], 42);
    assert_eq!(plan.events[0].reason, "TeamAdopted");
    assert!(plan.http_requests.is_empty());
}

#[test]
fn a_409_for_a_name_no_longer_wanted_does_not_park_the_create() {
    // POST "Platform" answered 409; the display name then changed, and the
    // lookup of the new name finds no team: the create is sent again, with
    // the new name, rather than waiting to adopt a team that is not there.
    let conflict = obs("create.0", Some(409), json!({"error": "team exists"}), 5);
    let none = obs("lookup.0", Some(200), json!([]), 1);
    let mut snapshot = team(json!({}))
        .observation(conflict.clone())
        .observation(none)
        .build();
    snapshot.primary["spec"]["displayName"] = json!("Platform EU");
    let plan = run::<TeamPlugin>(&snapshot).unwrap();
    assert_eq!(ids(&plan), [("create.0", HttpMethod::Post, "/api/teams")]);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&plan.http_requests[0].body).unwrap()["name"],
        "Platform EU"
    );
    // A lookup older than the 409 says nothing about it: look again.
    let stale = obs("lookup.0", Some(200), json!([]), 9);
    let plan = run::<TeamPlugin>(
        &team(json!({}))
            .observation(conflict)
            .observation(stale)
            .build(),
    )
    .unwrap();
    assert_eq!(
        ids(&plan),
        [("lookup.0", HttpMethod::Get, "/api/teams?name=Platform")]
    );
}

#[test]
fn drift_on_the_server_is_put_back() {
    let status = json!({"teamID": 42});
    let drifted = obs(
        "get",
        Some(200),
        json!({"id": 42, "name": "Renamed", "member_group": "m", "owner_group": "x"}),
        1,
    );
    let plan =
        run::<TeamPlugin>(&team(status.clone()).observation(drifted.clone()).build()).unwrap();
    assert_eq!(
        ids(&plan),
        [
            ("get", HttpMethod::Get, "/api/teams/42"),
            ("rename", HttpMethod::Put, "/api/teams/42"),
            ("oidc", HttpMethod::Put, "/api/teams/42/oidc-groups"),
        ]
    );
    assert_eq!(condition(&plan, "Ready")["reason"], "Syncing");
    // The newer PUT answers win over the older GET.
    let renamed = obs(
        "rename",
        Some(200),
        json!({"id": 42, "name": "Platform", "member_group": "m", "owner_group": "x"}),
        0,
    );
    let grouped = obs(
        "oidc",
        Some(200),
        json!({"id": 42, "name": "Platform", "member_group": "m", "owner_group": "o"}),
        0,
    );
    let plan = run::<TeamPlugin>(
        &team(status)
            .observation(drifted)
            .observation(renamed)
            .observation(grouped)
            .build(),
    )
    .unwrap();
    assert_eq!(ids(&plan), [("get", HttpMethod::Get, "/api/teams/42")]);
    assert_eq!(condition(&plan, "Ready")["status"], "True");
    assert_eq!(plan.requeue_after_ms, Some(300_000), "periodic resync");
}

#[test]
fn a_failed_delete_keeps_the_finalizer_with_degraded() {
    let plan = run::<TeamPlugin>(&team(json!({"teamID": 42})).deleting(true).build()).unwrap();
    assert_eq!(
        ids(&plan),
        [("delete", HttpMethod::Delete, "/api/teams/42")]
    );
    assert!(!plan.cleanup_complete);
    let failed = obs("delete", None, json!(null), 1);
    let plan = run::<TeamPlugin>(
        &team(json!({"teamID": 42}))
            .deleting(true)
            .observation(failed)
            .build(),
    )
    .unwrap();
    assert!(!plan.cleanup_complete);
    assert_eq!(condition(&plan, "Degraded")["status"], "True");
    assert_eq!(plan.events[0].reason, "DeleteFailed");
    assert_eq!(plan.http_requests.len(), 1, "tries again");
    let done = obs("delete", Some(204), json!(null), 1);
    let plan = run::<TeamPlugin>(
        &team(json!({"teamID": 42}))
            .deleting(true)
            .observation(done)
            .build(),
    )
    .unwrap();
    assert!(plan.cleanup_complete);
}

// ---------------------------------------------------------------------------
// Children

fn parent_team(team_id: Option<u64>) -> serde_json::Value {
    json!({"apiVersion": "terdut.ryuvia.com/v1alpha1", "kind": "TerdutTeam",
           "metadata": {"name": "platform", "namespace": "team-a"},
           "status": {"teamID": team_id, "apiURL": "http://127.0.0.1:4000",
                      "credentialsSecretRef": {"name": "terdut.oncall-terdut-credentials"},
                      "conditions": [{"type": "Ready", "status": "True", "reason": "Synced"}]}})
}

fn child_of(
    controller: &str,
    kind: &str,
    spec: serde_json::Value,
    status: serde_json::Value,
    team_id: Option<u64>,
) -> SnapshotBuilder {
    SnapshotBuilder::new(controller)
        .primary(json!({"apiVersion": "terdut.ryuvia.com/v1alpha1", "kind": kind,
            "metadata": {"name": "c", "namespace": "team-a", "uid": "u-c", "generation": 3},
            "spec": spec, "status": status}))
        .related(children::READ_TEAM, parent_team(team_id))
        .related(
            children::READ_SECRETS,
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "terdut.oncall-terdut-credentials", "namespace": "team-a"}, "data": {"api-key": "eA=="}}),
        )
}

#[test]
fn children_wait_for_the_team_id() {
    let plan = run::<TeamPlugin>(
        &child_of(
            DEADMAN,
            "TerdutDeadmanSwitch",
            json!({"teamRef": {"name": "platform"}}),
            json!({}),
            None,
        )
        .build(),
    )
    .unwrap();
    assert_eq!(condition(&plan, "Ready")["reason"], "WaitingForTeam");
    assert_eq!(condition(&plan, "Synced")["reason"], "WaitingForTeam");
    assert!(plan.http_requests.is_empty());
}

#[test]
fn the_escalation_policy_is_put_whole_on_drift() {
    let spec = json!({"teamRef": {"name": "platform"}, "repeatCount": 1, "levels": [{"timeout": "5m", "targets": [{"kind": "oncall"}]}]});
    let b = || {
        child_of(
            ESCALATION,
            "TerdutEscalationRule",
            spec.clone(),
            json!({}),
            Some(42),
        )
    };
    let plan = run::<TeamPlugin>(&b().build()).unwrap();
    assert_eq!(
        ids(&plan),
        [("get.42", HttpMethod::Get, "/api/teams/42/escalation")]
    );
    let empty = obs(
        "get.42",
        Some(200),
        json!({"repeat_count": 0, "fallback_topic": "", "levels": []}),
        1,
    );
    let plan = run::<TeamPlugin>(&b().observation(empty.clone()).build()).unwrap();
    let put = plan
        .http_requests
        .iter()
        .find(|r| r.id == "put.42")
        .unwrap();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&put.body).unwrap(),
        json!({"repeat_count": 1, "fallback_topic": "", "levels": [{"timeout": "5m", "targets": [{"kind": "oncall"}]}]})
    );
    let stored = obs(
        "put.42",
        Some(200),
        serde_json::from_str(&put.body).unwrap(),
        0,
    );
    let plan = run::<TeamPlugin>(&b().observation(empty).observation(stored).build()).unwrap();
    assert_eq!(condition(&plan, "Synced")["status"], "True");
    assert_eq!(plan.http_requests.len(), 1, "only the GET");
}

#[test]
fn a_deadman_switch_is_recreated_on_a_diff_other_than_name() {
    let spec = json!({"teamRef": {"name": "platform"}, "name": "w", "matcher": "a=b", "timeout": "30m", "severity": "critical"});
    let status = json!({"teamID": 42, "switchID": 7, "applied": {"name": "w", "matcher": "a=b", "timeout": "15m", "severity": "critical"}});
    let b = || {
        child_of(
            DEADMAN,
            "TerdutDeadmanSwitch",
            spec.clone(),
            status.clone(),
            Some(42),
        )
    };
    let plan = run::<TeamPlugin>(&b().build()).unwrap();
    assert_eq!(
        ids(&plan),
        [(
            "delete.7",
            HttpMethod::Delete,
            "/api/teams/42/deadman-switches/7"
        )]
    );
    let plan = run::<TeamPlugin>(
        &b().observation(obs("delete.7", Some(204), json!(null), 0))
            .build(),
    )
    .unwrap();
    let st = plan.status.as_ref().unwrap();
    assert_eq!(
        (st["switchID"].clone(), st["attempt"].clone()),
        (json!(null), json!(1))
    );
    // A name-only diff is reported, not applied.
    let renamed = json!({"teamRef": {"name": "platform"}, "name": "w2", "matcher": "a=b", "timeout": "15m", "severity": "critical"});
    let plan = run::<TeamPlugin>(
        &child_of(
            DEADMAN,
            "TerdutDeadmanSwitch",
            renamed,
            status.clone(),
            Some(42),
        )
        .build(),
    )
    .unwrap();
    assert_eq!(
        ids(&plan),
        [(
            "check.42.7",
            HttpMethod::Get,
            "/api/teams/42/deadman-switches"
        )],
        "only the resync's GET"
    );
    assert_eq!(condition(&plan, "Synced")["reason"], "NameImmutable");
}

#[test]
fn the_resync_repairs_a_switch_changed_or_deleted_on_the_server() {
    let spec = json!({"teamRef": {"name": "platform"}, "name": "w", "matcher": "a=b", "timeout": "15m", "severity": "critical"});
    let status = json!({"teamID": 42, "switchID": 7, "attempt": 2, "applied": {"name": "w", "matcher": "a=b", "timeout": "15m", "severity": "critical"}});
    let b = || {
        child_of(
            DEADMAN,
            "TerdutDeadmanSwitch",
            spec.clone(),
            status.clone(),
            Some(42),
        )
    };
    // In sync: the resync GET is in the plan, nothing else.
    let plan = run::<TeamPlugin>(&b().build()).unwrap();
    assert_eq!(
        ids(&plan),
        [(
            "check.42.7",
            HttpMethod::Get,
            "/api/teams/42/deadman-switches"
        )]
    );
    assert_eq!(condition(&plan, "Synced")["status"], "True");
    // Changed on the server: delete and recreate, like a spec change.
    let changed = obs(
        "check.42.7",
        Some(200),
        json!([{"id": 7, "name": "w", "matcher": "a=b", "timeout": "1h", "severity": "critical"}]),
        0,
    );
    let plan = run::<TeamPlugin>(&b().observation(changed).build()).unwrap();
    assert_eq!(
        ids(&plan),
        [(
            "delete.7",
            HttpMethod::Delete,
            "/api/teams/42/deadman-switches/7"
        )]
    );
    // Deleted on the server: created anew (a new attempt), with a Warning.
    let gone = obs(
        "check.42.7",
        Some(200),
        json!([{"id": 8, "name": "other", "matcher": "x", "timeout": "1m", "severity": ""}]),
        0,
    );
    let plan = run::<TeamPlugin>(&b().observation(gone).build()).unwrap();
    let st = plan.status.as_ref().unwrap();
    assert_eq!(
        (st["switchID"].clone(), st["attempt"].clone()),
        (json!(null), json!(3))
    );
    assert_eq!(plan.events[0].reason, "SwitchMissingOnServer");
    assert!(plan.http_requests.is_empty());
    // A failed GET changes nothing.
    let failed = obs("check.42.7", Some(500), json!({"error": "boom"}), 0);
    let plan = run::<TeamPlugin>(&b().observation(failed).build()).unwrap();
    assert_eq!(condition(&plan, "Synced")["status"], "True");
    assert_eq!(plan.status.as_ref().unwrap()["switchID"], 7);
}

#[test]
fn the_resync_repairs_an_alert_source_renamed_or_deleted_on_the_server() {
    let spec = json!({"teamRef": {"name": "platform"}, "name": "am", "kind": "alertmanager"});
    let status = json!({"teamID": 42, "integrationID": 3, "applied": {"name": "am", "kind": "alertmanager"}});
    let b = || {
        child_of(
            ALERT_SOURCE,
            "TerdutAlertSource",
            spec.clone(),
            status.clone(),
            Some(42),
        )
    };
    // Renamed on the server: PATCHed back.
    let renamed = obs(
        "check.42.3",
        Some(200),
        json!([{"id": 3, "name": "hijacked", "kind": "alertmanager"}]),
        0,
    );
    let plan = run::<TeamPlugin>(&b().observation(renamed.clone()).build()).unwrap();
    assert!(
        ids(&plan).contains(&(
            "rename.3",
            HttpMethod::Patch,
            "/api/teams/42/integrations/3"
        )),
        "{:?}",
        ids(&plan)
    );
    // An older answer of our own PATCH does not count against a newer list.
    let old_patch = obs("rename.3", Some(200), json!({"id": 3, "name": "am"}), 50);
    let plan = run::<TeamPlugin>(&b().observation(renamed).observation(old_patch).build()).unwrap();
    assert!(ids(&plan).iter().any(|(id, ..)| *id == "rename.3"));
    // Our rename answered, then a list GET sent before it answered later
    // still showing the old name: the rename stands, no second PATCH.
    let mut want = spec.clone();
    want["name"] = json!("am-eu");
    let patched = obs("rename.3", Some(200), json!({"id": 3, "name": "am-eu"}), 50);
    let late_list = obs(
        "check.42.3",
        Some(200),
        json!([{"id": 3, "name": "am", "kind": "alertmanager"}]),
        10,
    );
    let plan = run::<TeamPlugin>(
        &child_of(
            ALERT_SOURCE,
            "TerdutAlertSource",
            want,
            status.clone(),
            Some(42),
        )
        .observation(patched)
        .observation(late_list)
        .build(),
    )
    .unwrap();
    assert!(
        !ids(&plan).iter().any(|(id, ..)| *id == "rename.3"),
        "a second PATCH: {:?}",
        ids(&plan)
    );
    assert_eq!(plan.status.as_ref().unwrap()["applied"]["name"], "am-eu");
    assert!(plan.events.iter().any(|e| e.reason == "IntegrationRenamed"));
    // Deleted on the server: created anew, which rotates the key.
    let gone = obs("check.42.3", Some(200), json!([]), 0);
    let plan = run::<TeamPlugin>(&b().observation(gone).build()).unwrap();
    let st = plan.status.as_ref().unwrap();
    assert_eq!(
        (st["integrationID"].clone(), st["rotating"].clone()),
        (json!(null), json!(true))
    );
    assert_eq!(plan.events[0].reason, "IntegrationMissingOnServer");
}

#[test]
fn an_alert_source_key_goes_to_its_secret_and_a_kind_change_rotates_it_with_a_warning() {
    let spec = json!({"teamRef": {"name": "platform"}, "name": "am", "kind": "alertmanager"});
    let created = obs(
        "create.42.0",
        Some(201),
        json!({"id": 3, "name": "am", "kind": "alertmanager", "url": "http://x/api/ingest/3", "key": "tdk_CANARY"}),
        0,
    );
    let plan = run::<TeamPlugin>(
        &child_of(
            ALERT_SOURCE,
            "TerdutAlertSource",
            spec.clone(),
            json!({}),
            Some(42),
        )
        .observation(created)
        .build(),
    )
    .unwrap();
    let secret = &plan.apply[0].object;
    assert_eq!(secret["metadata"]["name"], "c-terdut-webhook");
    assert_eq!(secret["data"]["key"], api::base64(b"tdk_CANARY"));
    let rest = json!([plan.status, plan.events]).to_string();
    assert!(
        !rest.contains("CANARY") && !rest.contains(&api::base64(b"tdk_CANARY")),
        "{rest}"
    );
    assert_eq!(
        plan.status.as_ref().unwrap()["webhookURLSecretRef"],
        json!({"name": "c-terdut-webhook"})
    );

    let grafana = json!({"teamRef": {"name": "platform"}, "name": "am", "kind": "grafana"});
    let status = json!({"teamID": 42, "integrationID": 3, "applied": {"name": "am", "kind": "alertmanager"}});
    let plan = run::<TeamPlugin>(
        &child_of(
            ALERT_SOURCE,
            "TerdutAlertSource",
            grafana.clone(),
            status.clone(),
            Some(42),
        )
        .build(),
    )
    .unwrap();
    assert_eq!(
        ids(&plan),
        [(
            "delete.3",
            HttpMethod::Delete,
            "/api/teams/42/integrations/3"
        )]
    );
    let plan = run::<TeamPlugin>(
        &child_of(
            ALERT_SOURCE,
            "TerdutAlertSource",
            grafana.clone(),
            status,
            Some(42),
        )
        .observation(obs("delete.3", Some(204), json!(null), 0))
        .build(),
    )
    .unwrap();
    let st = plan.status.clone().unwrap();
    assert_eq!(
        (st["rotating"].clone(), st["attempt"].clone()),
        (json!(true), json!(1))
    );
    let recreated = obs(
        "create.42.1",
        Some(201),
        json!({"id": 9, "name": "am", "kind": "grafana", "url": "u", "key": "k2"}),
        0,
    );
    let plan = run::<TeamPlugin>(
        &child_of(ALERT_SOURCE, "TerdutAlertSource", grafana, st, Some(42))
            .observation(recreated)
            .build(),
    )
    .unwrap();
    assert_eq!(plan.events[0].event_type, wasmop_sdk::EventType::Warning);
    assert_eq!(plan.events[0].reason, "WebhookKeyRotated");
    assert_eq!(plan.apply[0].object["data"]["key"], api::base64(b"k2"));
}

#[test]
fn a_create_in_flight_is_not_listed_again() {
    let empty = obs(
        "version",
        Some(200),
        json!({"capabilities": [], "bootstrapped": false}),
        5,
    );
    let plan = run::<TeamPlugin>(&server().observation(empty.clone()).build()).unwrap();
    assert!(ids(&plan).iter().any(|(id, ..)| *id == "bootstrap"));
    let pending = plan.status.as_ref().unwrap()["pending"].clone();
    assert_eq!(pending, json!({"bootstrap": "2025-01-01T00:00:00Z"}));

    // Five seconds later, no answer yet: not sent again.
    let mut primary = wasmop_sdk::testing::objects_from_yaml(SERVER_YAML).remove(0);
    primary["status"] = json!({"pending": pending});
    let later = || {
        SnapshotBuilder::new(SERVER)
            .primary(primary.clone())
            .related(server::READ_SECRETS, one(DB_SECRET))
            .observation(empty.clone())
            .now("2025-01-01T00:00:05Z")
    };
    let plan = run::<TeamPlugin>(&later().build()).unwrap();
    assert!(
        !ids(&plan).iter().any(|(id, ..)| *id == "bootstrap"),
        "in flight"
    );
    assert_eq!(
        plan.status.as_ref().unwrap()["pending"]["bootstrap"],
        "2025-01-01T00:00:00Z"
    );
    // An answer newer than the send ends it (and is used).
    let mut answered = obs("bootstrap", Some(201), json!({"key": "k"}), 0);
    answered.observed_at = "2025-01-01T00:00:01Z".into();
    let plan = run::<TeamPlugin>(&later().observation(answered).build()).unwrap();
    assert!(plan.status.as_ref().unwrap().get("pending").is_none());
    assert!(plan.apply.iter().any(|a| a.object["kind"] == "Secret"));
    // Without an answer for 30 s it may go again.
    let plan = run::<TeamPlugin>(&later().now("2025-01-01T00:00:31Z").build()).unwrap();
    assert!(ids(&plan).iter().any(|(id, ..)| *id == "bootstrap"));
}

#[test]
fn unknown_controller_is_internal() {
    assert!(matches!(
        run::<TeamPlugin>(&SnapshotBuilder::new("nope").build()),
        Err(ReconcileError::Internal(_))
    ));
}

#[test]
fn without_a_version_endpoint_the_plain_bootstrap_call_decides() {
    // A server without the proposed GET /api/version: 404.
    let missing = || obs("version", Some(404), json!({"error": "route not found"}), 5);
    let plan = run::<TeamPlugin>(&server().observation(missing()).build()).unwrap();
    assert!(
        ids(&plan).contains(&("bootstrap", HttpMethod::Post, "/api/bootstrap")),
        "{:?}",
        ids(&plan)
    );
    let c = condition(&plan, "Bootstrapped");
    assert_eq!(
        (c["status"].as_str(), c["reason"].as_str()),
        (Some("False"), Some("Bootstrapping"))
    );
    assert!(
        c["message"].as_str().unwrap().contains("GET /api/version"),
        "{c}"
    );

    // The 403: bootstrapped elsewhere, and the message names the missing endpoint.
    let lost = obs(
        "bootstrap",
        Some(403),
        json!({"error": "already bootstrapped"}),
        1,
    );
    let plan =
        run::<TeamPlugin>(&server().observation(missing()).observation(lost).build()).unwrap();
    let c = condition(&plan, "Bootstrapped");
    assert_eq!(c["reason"], "BootstrappedElsewhere");
    assert!(
        c["message"]
            .as_str()
            .unwrap()
            .contains("no GET /api/version"),
        "{c}"
    );
    assert!(
        plan.http_requests
            .iter()
            .all(|r| r.method == HttpMethod::Get)
    );

    // The 201: the key goes into the credentials Secret.
    let won = obs("bootstrap", Some(201), json!({"key": "tdk_x"}), 1);
    let plan =
        run::<TeamPlugin>(&server().observation(missing()).observation(won).build()).unwrap();
    assert_eq!(condition(&plan, "Bootstrapped")["status"], "True");
    assert!(
        plan.apply
            .iter()
            .any(|o| o.object["metadata"]["name"] == "terdut-operator-credentials")
    );
}

#[test]
fn without_service_account_endpoints_the_condition_names_the_missing_one() {
    let mut spec = wasmop_sdk::testing::objects_from_yaml(SERVER_YAML).remove(0);
    spec["spec"]["bootstrap"] = json!({"adminKeySecretRef": {"name": "chart-admin", "key": "key"}});
    let plan = run::<TeamPlugin>(
        &SnapshotBuilder::new(SERVER)
            .primary(spec)
            .related(server::READ_SECRETS, one(DB_SECRET))
            .related(
                server::READ_SECRETS,
                json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "chart-admin", "namespace": "oncall"}, "data": {"key": "eA=="}}),
            )
            .observation(obs("version", Some(404), json!({"error": "route not found"}), 9))
            .observation(obs(
                "operator-sa.create",
                Some(404),
                json!({"error": "route not found"}),
                1,
            ))
            .build(),
    )
    .unwrap();
    let c = condition(&plan, "Bootstrapped");
    assert_eq!(
        (c["status"].as_str(), c["reason"].as_str()),
        (Some("False"), Some("ServiceAccountFailed"))
    );
    assert!(
        c["message"]
            .as_str()
            .unwrap()
            .contains("POST /api/service-accounts answered 404"),
        "{c}"
    );
    assert!(
        !plan
            .http_requests
            .iter()
            .any(|r| r.method == HttpMethod::Post),
        "no retry POST against a missing route"
    );
}

#[test]
fn a_deleted_child_never_drops_its_row_silently() {
    let spec =
        json!({"teamRef": {"name": "platform"}, "name": "w", "matcher": "a=b", "timeout": "15m"});
    let status = json!({"teamID": 42, "switchID": 7, "applied": {"name": "w"}});
    let orphan_base = |team: Option<serde_json::Value>| {
        let b = SnapshotBuilder::new(DEADMAN)
            .primary(
                json!({"apiVersion": "terdut.ryuvia.com/v1alpha1", "kind": "TerdutDeadmanSwitch",
                "metadata": {"name": "c", "namespace": "team-a", "uid": "u-c", "generation": 3},
                "spec": spec, "status": status}),
            )
            .deleting(true);
        match team {
            Some(t) => b.related(children::READ_TEAM, t),
            None => b,
        }
    };
    // The team is gone: released, with a Warning naming the row.
    let plan = run::<TeamPlugin>(&orphan_base(None).build()).unwrap();
    assert!(plan.cleanup_complete);
    assert_eq!(plan.events.len(), 1);
    assert_eq!(plan.events[0].reason, "LeftOnServer");
    assert!(
        plan.events[0]
            .message
            .contains("dead man's switch 7 of team 42"),
        "{}",
        plan.events[0].message
    );
    // The team is not permitted on its server: the same.
    let mut refused = parent_team(Some(42));
    refused["status"]["conditions"][0] =
        json!({"type": "Ready", "status": "False", "reason": "RefNotPermitted"});
    let plan = run::<TeamPlugin>(&orphan_base(Some(refused)).build()).unwrap();
    assert!(plan.cleanup_complete);
    assert_eq!(plan.events[0].reason, "LeftOnServer");
    // The team exists but its credentials are not there (yet): held.
    let plan = run::<TeamPlugin>(&orphan_base(Some(parent_team(Some(42)))).build()).unwrap();
    assert!(
        !plan.cleanup_complete,
        "held while the row can still be deleted"
    );
    let c = condition(&plan, "Degraded");
    assert_eq!(
        (c["status"].as_str(), c["reason"].as_str()),
        (Some("True"), Some("WaitingForTeam"))
    );
    // Nothing applied: nothing to report.
    let plan = run::<TeamPlugin>(
        &SnapshotBuilder::new(DEADMAN)
            .primary(
                json!({"apiVersion": "terdut.ryuvia.com/v1alpha1", "kind": "TerdutDeadmanSwitch",
                "metadata": {"name": "c", "namespace": "team-a", "uid": "u-c", "generation": 3},
                "spec": {"teamRef": {"name": "platform"}}}),
            )
            .deleting(true)
            .build(),
    )
    .unwrap();
    assert!(plan.cleanup_complete);
    assert!(plan.events.is_empty());
}

#[test]
fn observed_generation_advances_only_for_an_applied_plan() {
    // A first pass (nothing bootstrapped): not applied.
    let plan = run::<TeamPlugin>(&server().build()).unwrap();
    assert!(plan.hold_observed_generation);
    // A synced child: applied.
    let spec = json!({"teamRef": {"name": "platform"}, "name": "w", "matcher": "a=b", "timeout": "15m", "severity": "critical"});
    let status = json!({"teamID": 42, "switchID": 7, "applied": {"name": "w", "matcher": "a=b", "timeout": "15m", "severity": "critical"}});
    let plan = run::<TeamPlugin>(
        &child_of(
            DEADMAN,
            "TerdutDeadmanSwitch",
            spec.clone(),
            status.clone(),
            Some(42),
        )
        .build(),
    )
    .unwrap();
    assert_eq!(condition(&plan, "Synced")["status"], "True");
    assert!(!plan.hold_observed_generation);
    // Ready but not Synced (a rename the server cannot apply): not applied.
    let mut renamed = spec;
    renamed["name"] = json!("w2");
    let plan = run::<TeamPlugin>(
        &child_of(DEADMAN, "TerdutDeadmanSwitch", renamed, status, Some(42)).build(),
    )
    .unwrap();
    assert_eq!(condition(&plan, "Ready")["status"], "True");
    assert!(plan.hold_observed_generation);
}

#[test]
fn every_env_name_given_to_the_server_is_in_the_assumed_table_and_can_be_renamed() {
    let full = wasmop_sdk::testing::objects_from_yaml(
        "
apiVersion: terdut.ryuvia.com/v1alpha1
kind: TerdutServer
metadata: {name: terdut, namespace: oncall, uid: u-server, generation: 1}
spec:
  networking: {apiURL: 'http://127.0.0.1:4000'}
  database: {dsn: 'postgres://x@db/terdut', passwordSecretRef: {name: db, key: password}}
  sweeper: {staleAfter: 6h, archiveAfter: 168h}
  deadman: {matchers: a=b, timeout: 15m, severity: critical}
  notify: {ntfyURL: 'http://ntfy', fallbackTopic: t, repeatEvery: 15m, tokenSecretRef: {name: tok, key: token}}
  oidc: {enabled: true, issuer: i, clientID: c, clientSecretRef: {name: s, key: k}, name: SSO,
         scopes: openid, allowedGroups: [a], adminGroup: g, sessionMaxAge: 12h, passwordLogin: true}
",
    )
    .remove(0);
    let render = |settings: serde_json::Value| {
        let plan = run::<TeamPlugin>(
            &SnapshotBuilder::new(SERVER)
                .primary(full.clone())
                .related(server::READ_SECRETS, one(DB_SECRET))
                .settings(settings)
                .build(),
        )
        .unwrap();
        plan.apply[0].object["spec"]["template"]["spec"]["containers"][0].clone()
    };
    let container = render(json!({}));
    let names: Vec<String> = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap().to_owned())
        .collect();
    let mut table: Vec<&str> = server::ASSUMED_ENV.iter().map(|(n, _)| *n).collect();
    let mut sorted = names.clone();
    sorted.sort();
    table.sort();
    assert_eq!(sorted, table, "the table lists exactly the names given");
    assert_eq!(
        container["readinessProbe"]["httpGet"]["path"],
        server::ASSUMED_HEALTH_PATH
    );

    // Every name, and the probe's path, can be overridden.
    let renamed = render(json!({
        "serverEnv": {"TERDUT_DATABASE_DSN": "DATABASE_URL", "TERDUT_OIDC_CLIENT": "OIDC_SECRET"},
        "healthPath": "/api/health"}));
    let env = renamed["env"].as_array().unwrap();
    assert_eq!(env[0]["name"], "DATABASE_URL");
    assert_eq!(env[0]["value"], "postgres://x@db/terdut");
    assert!(env.iter().any(|e| e["name"] == "OIDC_SECRET"
        && e["valueFrom"]["secretKeyRef"] == json!({"name": "s", "key": "k"})));
    assert!(!env.iter().any(|e| e["name"] == "TERDUT_DATABASE_DSN"));
    assert_eq!(renamed["readinessProbe"]["httpGet"]["path"], "/api/health");
}

#[test]
fn server_name_settings_are_validated() {
    let problems = |v: serde_json::Value| {
        api::Settings::parse(&v)
            .err()
            .unwrap_or_default()
            .into_iter()
            .map(|p| p.path)
            .collect::<Vec<_>>()
    };
    assert!(
        problems(json!({"serverEnv": {"PGPASSWORD": "DB_PASSWORD"}, "healthPath": "/ready"}))
            .is_empty()
    );
    assert_eq!(
        problems(json!({"serverEnv": {"TERDUT_TYPO": "X"}})),
        ["serverEnv.TERDUT_TYPO"]
    );
    assert_eq!(
        problems(json!({"serverEnv": {"PGPASSWORD": "1bad"}})),
        ["serverEnv.PGPASSWORD"]
    );
    assert_eq!(
        problems(json!({"serverEnv": {"PGPASSWORD": "has space"}})),
        ["serverEnv.PGPASSWORD"]
    );
    assert_eq!(
        problems(json!({"serverEnv": {"PGPASSWORD": "TERDUT_LISTEN"}})),
        ["serverEnv"]
    );
    assert_eq!(problems(json!({"serverEnv": ["x"]})), ["serverEnv"]);
    assert_eq!(problems(json!({"healthPath": "healthz"})), ["healthPath"]);
    assert_eq!(problems(json!({"healthPath": "/a b"})), ["healthPath"]);
}

#[test]
fn a_zalando_password_rotation_is_a_condition_until_the_deployment_restarts() {
    let mut s = wasmop_sdk::testing::objects_from_yaml(SERVER_YAML).remove(0);
    s["spec"]["database"] = json!({"postgresClusterRef": {"name": "pg"}});
    let pg = json!({"apiVersion": "acid.zalan.do/v1", "kind": "postgresql", "metadata": {"name": "pg", "namespace": "oncall"},
                    "spec": {"users": {"terdut": []}, "databases": {"terdut": "terdut"}}});
    let creds = |rv: &str| {
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "terdut.pg.credentials.postgresql.acid.zalan.do", "namespace": "oncall", "resourceVersion": rv},
               "data": {"password": "cA=="}})
    };
    let deployment = |restarted: &str| {
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "terdut", "namespace": "oncall", "uid": "u-d"},
               "spec": {"template": {"metadata": {"annotations": {"kubectl.kubernetes.io/restartedAt": restarted}}}}})
    };
    let run_with = |status: serde_json::Value, rv: &str, restarted: &str| {
        let mut primary = s.clone();
        primary["status"] = status;
        run::<TeamPlugin>(
            &SnapshotBuilder::new(SERVER)
                .primary(primary)
                .related(server::READ_POSTGRES, pg.clone())
                .related(server::READ_SECRETS, creds(rv))
                .owned(deployment(restarted))
                .build(),
        )
        .unwrap()
    };
    // Unchanged: current.
    let plan = run_with(json!({"databaseCredentialsVersion": "5"}), "5", "");
    let c = condition(&plan, "DatabaseCredentialsRotated");
    assert_eq!(
        (c["status"].as_str(), c["reason"].as_str()),
        (Some("False"), Some("Current"))
    );
    // Rotated: a Warning and the condition, which names the restart.
    let plan = run_with(json!({"databaseCredentialsVersion": "5"}), "6", "t0");
    let c = condition(&plan, "DatabaseCredentialsRotated");
    assert_eq!(
        (c["status"].as_str(), c["reason"].as_str()),
        (Some("True"), Some("RestartNeeded"))
    );
    assert!(c["message"].as_str().unwrap().contains("rollout restart"));
    assert!(
        plan.events
            .iter()
            .any(|e| e.reason == "DatabaseCredentialsRotated")
    );
    let st = plan.status.clone().unwrap();
    // The next pass, not restarted yet: still true, no second Warning.
    let plan = run_with(st.clone(), "6", "t0");
    assert_eq!(
        condition(&plan, "DatabaseCredentialsRotated")["status"],
        "True"
    );
    assert!(
        !plan
            .events
            .iter()
            .any(|e| e.reason == "DatabaseCredentialsRotated")
    );
    // Restarted: current again.
    let plan = run_with(st, "6", "t1");
    assert_eq!(
        condition(&plan, "DatabaseCredentialsRotated")["reason"],
        "Current"
    );
    assert!(plan.status.unwrap()["databaseCredentialsRotation"].is_null());
}

#[test]
fn hostname_and_gateway_listener_are_refused_plainly() {
    let mut s = wasmop_sdk::testing::objects_from_yaml(SERVER_YAML).remove(0);
    s["spec"]["networking"]["hostname"] = json!("terdut.example.com");
    let plan = run::<TeamPlugin>(
        &SnapshotBuilder::new(SERVER)
            .primary(s.clone())
            .related(server::READ_SECRETS, one(DB_SECRET))
            .build(),
    )
    .unwrap();
    let c = condition(&plan, "Exposed");
    assert_eq!(
        (c["status"].as_str(), c["reason"].as_str()),
        (Some("False"), Some("NotImplemented"))
    );
    assert!(
        c["message"]
            .as_str()
            .unwrap()
            .contains("spec.networking.hostname")
    );
    assert!(
        plan.events
            .iter()
            .any(|e| e.reason == "NetworkingNotImplemented")
    );
    assert!(!plan.apply.iter().any(|a| a.object["kind"] == "Ingress"));
    // Empty (the upstream sample's gatewayListener: ""): nothing said.
    let plan = run::<TeamPlugin>(&server().build()).unwrap();
    assert!(condition(&plan, "Exposed").is_null());
}

#[test]
fn after_its_own_bootstrap_the_server_never_posts_again() {
    // The status says the key went to the credentials Secret, but this
    // snapshot does not show the Secret (yet): no second POST.
    let mut s = wasmop_sdk::testing::objects_from_yaml(SERVER_YAML).remove(0);
    s["status"] = json!({"operatorCredentialsSecretRef": {"name": "terdut-operator-credentials"}});
    for version in [
        obs("version", Some(404), json!({"error": "route not found"}), 5),
        obs("version", Some(200), json!({"bootstrapped": false}), 5),
    ] {
        let plan = run::<TeamPlugin>(
            &SnapshotBuilder::new(SERVER)
                .primary(s.clone())
                .related(server::READ_SECRETS, one(DB_SECRET))
                .observation(version)
                .build(),
        )
        .unwrap();
        assert!(
            !ids(&plan).iter().any(|(id, ..)| *id == "bootstrap"),
            "{:?}",
            ids(&plan)
        );
        assert_eq!(
            condition(&plan, "Bootstrapped")["reason"],
            "CredentialsSecretMissing"
        );
        assert!(plan.events.is_empty(), "no BootstrappedElsewhere Warning");
        assert_eq!(
            plan.status.as_ref().unwrap()["operatorCredentialsSecretRef"]["name"],
            "terdut-operator-credentials",
            "kept, so the next pass does not POST either"
        );
    }
}
