use super::*;

fn install() -> (State, String) {
    let mut s = State::new("http://standin");
    let key = s.bootstrap("admin").expect("empty install");
    (s, key)
}

fn call(s: &mut State, req: Request) -> (u16, Value) {
    let r = s.handle(&req);
    (r.status.expect("answered"), r.value())
}

#[test]
fn bootstrap_is_single_shot_per_install() {
    let mut s = State::new("http://standin");
    let (status, v) = call(&mut s, Request::new("GET", "/api/version"));
    assert_eq!(status, 200);
    assert_eq!(v["bootstrapped"], false);
    let (status, v) = call(&mut s, Request::new("POST", "/api/bootstrap"));
    assert_eq!(status, 201);
    let key = v["key"].as_str().unwrap().to_owned();
    assert!(key.starts_with("tdk_"));
    let (status, v) = call(&mut s, Request::new("POST", "/api/bootstrap"));
    assert_eq!(
        (status, v["error"].as_str()),
        (403, Some("already bootstrapped"))
    );
    assert_eq!(
        call(&mut s, Request::new("GET", "/api/version")).1["bootstrapped"],
        true
    );
    // The key works; no key or a wrong one does not.
    assert_eq!(
        call(&mut s, Request::new("GET", "/api/teams").bearer(&key)).0,
        200
    );
    assert_eq!(call(&mut s, Request::new("GET", "/api/teams")).0, 401);
    assert_eq!(
        call(&mut s, Request::new("GET", "/api/teams").bearer("nope")).0,
        401
    );
}

#[test]
fn without_proposed_routes_version_and_service_accounts_are_404() {
    let mut s = State::new("http://standin");
    s.controls.without_proposed_routes = true;
    assert_eq!(call(&mut s, Request::new("GET", "/api/version")).0, 404);
    let (status, v) = call(&mut s, Request::new("POST", "/api/bootstrap"));
    assert_eq!(status, 201);
    let key = v["key"].as_str().unwrap().to_owned();
    for req in [
        Request::new("POST", "/api/service-accounts").json(json!({"name": "x"})),
        Request::new("GET", "/api/service-accounts?name=x"),
        Request::new("POST", "/api/service-accounts/1/keys"),
    ] {
        assert_eq!(call(&mut s, req.bearer(&key)).0, 404);
    }
    assert!(s.service_accounts.is_empty());
    // What terdut-server has today still works.
    assert_eq!(
        call(&mut s, Request::new("GET", "/api/teams").bearer(&key)).0,
        200
    );
    assert_eq!(call(&mut s, Request::new("POST", "/api/bootstrap")).0, 403);
}

#[test]
fn a_lost_bootstrap_race_answers_403_and_leaves_one_admin() {
    let mut s = State::new("http://standin");
    s.controls.lose_next_bootstrap_race = true;
    assert_eq!(call(&mut s, Request::new("POST", "/api/bootstrap")).0, 403);
    assert_eq!(s.users.len(), 1);
    assert_eq!(s.users[0].username, "racer");
    assert!(!s.controls.lose_next_bootstrap_race, "one race only");
}

#[test]
fn teams_create_conflict_rename_oidc_list_delete() {
    let (mut s, key) = install();
    let (status, t) = call(
        &mut s,
        Request::new("POST", "/api/teams")
            .bearer(&key)
            .json(json!({"name": "Platform"})),
    );
    assert_eq!(status, 201);
    let id = t["id"].as_u64().unwrap();
    let dup = Request::new("POST", "/api/teams")
        .bearer(&key)
        .json(json!({"name": "Platform"}));
    assert_eq!(call(&mut s, dup).0, 409);
    let (status, list) = call(
        &mut s,
        Request::new("GET", "/api/teams?name=Platform").bearer(&key),
    );
    assert_eq!((status, list.as_array().unwrap().len()), (200, 1));
    assert_eq!(list[0]["id"], id);
    let (_, none) = call(
        &mut s,
        Request::new("GET", "/api/teams?name=Other").bearer(&key),
    );
    assert_eq!(none, json!([]));

    let path = format!("/api/teams/{id}");
    let (status, t) = call(
        &mut s,
        Request::new("PUT", &path)
            .bearer(&key)
            .json(json!({"name": "Plat form"})),
    );
    assert_eq!((status, t["name"].as_str()), (200, Some("Plat form")));
    assert_eq!(
        call(
            &mut s,
            Request::new("GET", "/api/teams?name=Plat%20form").bearer(&key)
        )
        .1[0]["id"],
        id
    );
    let (status, t) = call(
        &mut s,
        Request::new("PUT", &format!("{path}/oidc-groups"))
            .bearer(&key)
            .json(json!({"member_group": "m", "owner_group": "o"})),
    );
    assert_eq!(
        (
            status,
            t["member_group"].as_str(),
            t["owner_group"].as_str()
        ),
        (200, Some("m"), Some("o"))
    );
    assert_eq!(
        call(&mut s, Request::new("DELETE", &path).bearer(&key)).0,
        204
    );
    assert_eq!(call(&mut s, Request::new("GET", &path).bearer(&key)).0, 404);
    assert!(s.teams.is_empty());
}

#[test]
fn escalation_policy_is_read_and_written_whole() {
    let (mut s, key) = install();
    let alice = s.add_user("alice");
    let id = call(
        &mut s,
        Request::new("POST", "/api/teams")
            .bearer(&key)
            .json(json!({"name": "T"})),
    )
    .1["id"]
        .as_u64()
        .unwrap();
    let path = format!("/api/teams/{id}/escalation");
    assert_eq!(
        call(&mut s, Request::new("GET", &path).bearer(&key)).1,
        empty_policy()
    );
    let policy = json!({"repeat_count": 2, "fallback_topic": "t", "levels": [
        {"timeout": "5m", "targets": [{"kind": "oncall"}, {"kind": "user", "user_id": alice}]}]});
    let (status, stored) = call(
        &mut s,
        Request::new("PUT", &path).bearer(&key).json(policy.clone()),
    );
    assert_eq!((status, &stored), (200, &policy));
    assert_eq!(
        call(&mut s, Request::new("GET", &path).bearer(&key)).1,
        policy
    );
    let bad = json!({"levels": [{"timeout": "5m", "targets": [{"kind": "user", "user_id": 999}]}]});
    assert_eq!(
        call(&mut s, Request::new("PUT", &path).bearer(&key).json(bad)).0,
        400
    );
    assert_eq!(s.escalation[&id], policy, "a rejected PUT changes nothing");
}

#[test]
fn deadman_switches_have_no_update_verb() {
    let (mut s, key) = install();
    let id = call(
        &mut s,
        Request::new("POST", "/api/teams")
            .bearer(&key)
            .json(json!({"name": "T"})),
    )
    .1["id"]
        .as_u64()
        .unwrap();
    let base = format!("/api/teams/{id}/deadman-switches");
    let body = json!({"name": "w", "matcher": "alertname=Watchdog", "timeout": "15m", "severity": "critical"});
    let (status, sw) = call(
        &mut s,
        Request::new("POST", &base).bearer(&key).json(body.clone()),
    );
    assert_eq!(status, 201);
    assert_eq!(
        call(&mut s, Request::new("POST", &base).bearer(&key).json(body)).0,
        409
    );
    let sid = sw["id"].as_u64().unwrap();
    assert_eq!(
        call(
            &mut s,
            Request::new("PUT", &format!("{base}/{sid}"))
                .bearer(&key)
                .json(json!({}))
        )
        .0,
        404
    );
    assert_eq!(
        call(
            &mut s,
            Request::new("GET", &format!("{base}?name=w")).bearer(&key)
        )
        .1[0]["id"],
        sid
    );
    assert_eq!(
        call(
            &mut s,
            Request::new("DELETE", &format!("{base}/{sid}")).bearer(&key)
        )
        .0,
        204
    );
    assert!(s.switches.is_empty());
}

#[test]
fn integration_key_is_shown_once_and_rename_is_a_patch() {
    let (mut s, key) = install();
    let id = call(
        &mut s,
        Request::new("POST", "/api/teams")
            .bearer(&key)
            .json(json!({"name": "T"})),
    )
    .1["id"]
        .as_u64()
        .unwrap();
    let base = format!("/api/teams/{id}/integrations");
    let (status, i) = call(
        &mut s,
        Request::new("POST", &base)
            .bearer(&key)
            .json(json!({"name": "am", "kind": "alertmanager"})),
    );
    assert_eq!(status, 201);
    let iid = i["id"].as_u64().unwrap();
    assert!(i["key"].as_str().is_some_and(|k| k.starts_with("tdk_")));
    assert_eq!(i["url"], format!("http://standin/api/ingest/{iid}"));
    let (_, list) = call(&mut s, Request::new("GET", &base).bearer(&key));
    assert!(list[0].get("key").is_none(), "never re-readable: {list}");
    let (status, renamed) = call(
        &mut s,
        Request::new("PATCH", &format!("{base}/{iid}"))
            .bearer(&key)
            .json(json!({"name": "am2"})),
    );
    assert_eq!((status, renamed["name"].as_str()), (200, Some("am2")));
    assert!(renamed.get("key").is_none());
    let bad = Request::new("POST", &base)
        .bearer(&key)
        .json(json!({"name": "x", "kind": "pager"}));
    assert_eq!(call(&mut s, bad).0, 400);
    assert_eq!(
        call(
            &mut s,
            Request::new("DELETE", &format!("{base}/{iid}")).bearer(&key)
        )
        .0,
        204
    );
}

#[test]
fn deleting_a_team_deletes_its_rows() {
    let (mut s, key) = install();
    let id = call(
        &mut s,
        Request::new("POST", "/api/teams")
            .bearer(&key)
            .json(json!({"name": "T"})),
    )
    .1["id"]
        .as_u64()
        .unwrap();
    call(
        &mut s,
        Request::new("POST", &format!("/api/teams/{id}/integrations"))
            .bearer(&key)
            .json(json!({"name": "am", "kind": "alertmanager"})),
    );
    call(
        &mut s,
        Request::new("POST", &format!("/api/teams/{id}/deadman-switches"))
            .bearer(&key)
            .json(json!({"name": "w", "matcher": "a=b", "timeout": "1m"})),
    );
    assert_eq!(
        call(
            &mut s,
            Request::new("DELETE", &format!("/api/teams/{id}")).bearer(&key)
        )
        .0,
        204
    );
    assert!(s.integrations.is_empty() && s.switches.is_empty());
}

#[test]
fn service_accounts_create_look_up_and_rotate() {
    let (mut s, key) = install();
    let create = Request::new("POST", "/api/service-accounts")
        .bearer(&key)
        .json(json!({"name": "wasmop"}));
    let (status, sa) = call(&mut s, create.clone());
    assert_eq!((status, sa["scope"].as_str()), (201, Some("instance")));
    let sa_key = sa["key"].as_str().unwrap().to_owned();
    assert_eq!(call(&mut s, create).0, 409);
    let (_, found) = call(
        &mut s,
        Request::new("GET", "/api/service-accounts?name=wasmop").bearer(&key),
    );
    assert_eq!(found[0]["id"], sa["id"]);
    assert!(found[0].get("key").is_none());
    // The account's key is an admin's: it may create accounts and teams.
    assert_eq!(
        call(
            &mut s,
            Request::new("POST", "/api/teams")
                .bearer(&sa_key)
                .json(json!({"name": "T"}))
        )
        .0,
        201
    );
    let (status, rotated) = call(
        &mut s,
        Request::new("POST", &format!("/api/service-accounts/{}/keys", sa["id"])).bearer(&key),
    );
    assert_eq!(status, 201);
    assert_ne!(rotated["key"], sa["key"]);
    assert_eq!(
        call(&mut s, Request::new("GET", "/api/service-accounts")).0,
        401
    );
}

#[test]
fn team_scoped_accounts_need_the_capability_and_stay_in_their_team() {
    let (mut s, key) = install();
    let team_sa = Request::new("POST", "/api/service-accounts")
        .bearer(&key)
        .json(json!({"name": "t1", "scope": "team"}));
    assert_eq!(call(&mut s, team_sa.clone()).0, 400, "capability off");
    s.controls.team_scoped_accounts = true;
    let caps = call(&mut s, Request::new("GET", "/api/version")).1["capabilities"].clone();
    assert!(
        caps.as_array()
            .unwrap()
            .contains(&json!(TEAM_SCOPED_CAPABILITY))
    );
    let t1 = call(&mut s, team_sa).1["key"].as_str().unwrap().to_owned();
    let other = call(
        &mut s,
        Request::new("POST", "/api/teams")
            .bearer(&key)
            .json(json!({"name": "other"})),
    )
    .1["id"]
        .as_u64()
        .unwrap();
    let (status, mine) = call(
        &mut s,
        Request::new("POST", "/api/teams")
            .bearer(&t1)
            .json(json!({"name": "mine"})),
    );
    assert_eq!(status, 201);
    let mine = mine["id"].as_u64().unwrap();
    assert_eq!(
        call(
            &mut s,
            Request::new("POST", "/api/teams")
                .bearer(&t1)
                .json(json!({"name": "x"}))
        )
        .0,
        403
    );
    assert_eq!(
        call(
            &mut s,
            Request::new("GET", &format!("/api/teams/{other}")).bearer(&t1)
        )
        .0,
        403
    );
    assert_eq!(
        call(
            &mut s,
            Request::new("GET", &format!("/api/teams/{mine}")).bearer(&t1)
        )
        .0,
        200
    );
    assert_eq!(
        call(&mut s, Request::new("GET", "/api/teams").bearer(&t1))
            .1
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        call(
            &mut s,
            Request::new("GET", "/api/service-accounts").bearer(&t1)
        )
        .0,
        403
    );
}

#[test]
fn idempotency_keys_replay_mutations() {
    let (mut s, key) = install();
    let post = Request::new("POST", "/api/teams")
        .bearer(&key)
        .json(json!({"name": "T"}))
        .idempotency("k1");
    let first = s.handle(&post);
    let second = s.handle(&post);
    assert_eq!(first, second);
    assert_eq!(first.status, Some(201));
    assert_eq!(s.teams.len(), 1);
    assert!(s.log.last().unwrap().replayed);
    s.controls.honour_idempotency_keys = false;
    assert_eq!(s.handle(&post).status, Some(409));
}

#[test]
fn failure_rules_and_down() {
    let (mut s, key) = install();
    s.controls.fail.push(FailRule {
        method: Some("DELETE".into()),
        path_prefix: "/api/teams".into(),
        status: 503,
        remaining: Some(1),
    });
    assert_eq!(
        call(&mut s, Request::new("DELETE", "/api/teams/1").bearer(&key)).0,
        503
    );
    assert_eq!(
        call(&mut s, Request::new("DELETE", "/api/teams/1").bearer(&key)).0,
        404
    );
    s.controls.down = true;
    assert_eq!(s.handle(&Request::new("GET", "/healthz")).status, None);
    assert_eq!(s.log.last().unwrap().status, 0);
    assert_eq!(s.count("DELETE", "/api/teams"), 2);
}

#[test]
fn the_log_names_callers_not_keys() {
    let (mut s, key) = install();
    call(&mut s, Request::new("GET", "/api/teams").bearer(&key));
    let last = s.log.last().unwrap();
    assert_eq!(last.caller.as_deref(), Some("admin:1"));
    assert!(!format!("{last:?}").contains(&key));
}

#[test]
fn query_values_are_percent_decoded() {
    assert_eq!(
        query_param("a=1&name=x%2Fy+z", "name").as_deref(),
        Some("x/y z")
    );
    assert_eq!(query_param("name=%zz", "name").as_deref(), Some("%zz"));
    assert_eq!(query_param("name=%4", "name").as_deref(), Some("%4"));
    assert_eq!(query_param("other=1", "name"), None);
}

#[tokio::test]
async fn serves_over_loopback_http() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let standin = StandIn::start().await.unwrap();
    let addr = standin.url().trim_start_matches("http://").to_owned();
    let mut sock = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let body = "{}";
    let req = format!(
        "POST /api/bootstrap HTTP/1.1\r\nhost: {addr}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    sock.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    sock.read_to_string(&mut out).await.unwrap();
    assert!(out.starts_with("HTTP/1.1 201"), "{out}");
    assert!(out.contains("\"key\""), "{out}");
    assert_eq!(standin.with(|s| s.users.len()), 1);
    assert_eq!(standin.log()[0].path, "/api/bootstrap");

    standin.with(|s| s.controls.down = true);
    let mut sock = tokio::net::TcpStream::connect(&addr).await.unwrap();
    sock.write_all(format!("GET /healthz HTTP/1.1\r\nhost: {addr}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    let _ = sock.read_to_string(&mut out).await;
    assert!(out.is_empty(), "down: no answer, got {out}");
}
