//! Tests of the observer against loopback servers.

use super::*;

use std::net::SocketAddr;
use std::sync::atomic::AtomicUsize;

use crate::judge::validate::SecretHeader;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const UID: &str = "uid-primary";

fn primary() -> PrimaryInfo {
    PrimaryInfo {
        uid: UID.into(),
        namespace: "ns".into(),
        name: "p".into(),
        plugin: "observer".into(),
        plugin_version: "0.1.0".into(),
    }
}

/// Test shorthand: `ALLOW_LIST_TARGET` stands for an allow-listed base
/// URL (`object`), anything else for a declared target.
const ALLOW_LIST_TARGET: &str = "(allow-list)";

fn get(id: &str, target: &str, object: &str, port: u16, path: &str) -> HttpRequest {
    let mut request = if target == ALLOW_LIST_TARGET {
        HttpRequest::allow_listed(id, HttpMethod::Get, object, path)
    } else {
        HttpRequest::get(id, target, object, port, path)
    };
    request.port = port;
    request
}

/// What a test server answers: status, body, and how long it waits
/// after reading a request before answering (the slowness under test).
#[derive(Clone)]
struct Reply {
    status: u16,
    body: Vec<u8>,
    delay: Duration,
}

impl Reply {
    fn ok(body: &str) -> Self {
        Reply {
            status: 200,
            body: body.as_bytes().to_vec(),
            delay: Duration::ZERO,
        }
    }

    fn slow(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }
}

/// A loopback HTTP/1.1 server with canned replies that counts what it sees.
struct TestServer {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    max_in_flight: Arc<AtomicUsize>,
    /// Each request as received (head and body), lowercased.
    requests: Arc<Mutex<Vec<String>>>,
}

impl TestServer {
    async fn start(reply: Reply) -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let server = TestServer {
            addr: listener.local_addr().expect("local addr"),
            connections: Arc::default(),
            max_in_flight: Arc::default(),
            requests: Arc::default(),
        };
        let (connections, max_in_flight, requests) = (
            server.connections.clone(),
            server.max_in_flight.clone(),
            server.requests.clone(),
        );
        let in_flight = Arc::new(AtomicUsize::new(0));
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                connections.fetch_add(1, Ordering::SeqCst);
                let (reply, in_flight, max_in_flight, requests) = (
                    reply.clone(),
                    in_flight.clone(),
                    max_in_flight.clone(),
                    requests.clone(),
                );
                tokio::spawn(async move {
                    answer(stream, reply, in_flight, max_in_flight, requests).await;
                });
            }
        });
        server
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().expect("requests lock").clone()
    }
}

async fn answer(
    mut stream: TcpStream,
    reply: Reply,
    in_flight: Arc<AtomicUsize>,
    max_in_flight: Arc<AtomicUsize>,
    requests: Arc<Mutex<Vec<String>>>,
) {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    let head_end = loop {
        if let Some(at) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
        }
    };
    let head = String::from_utf8_lossy(&seen[..head_end]).to_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while seen.len() < head_end + length {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
        }
    }
    requests
        .lock()
        .expect("requests lock")
        .push(String::from_utf8_lossy(&seen).to_lowercase());
    // In flight from the request read until just before the answer: the
    // client holds its permit for all of that window.
    let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    max_in_flight.fetch_max(now, Ordering::SeqCst);
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    in_flight.fetch_sub(1, Ordering::SeqCst);
    let mut out = format!(
        "HTTP/1.1 {} Canned\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        reply.status,
        reply.body.len()
    )
    .into_bytes();
    out.extend_from_slice(&reply.body);
    let _ = stream.write_all(&out).await;
    let _ = stream.shutdown().await;
}

fn observer(config: ObserveConfig) -> Arc<Observer> {
    Observer::new(config)
}

fn allowing(server: &TestServer) -> ObserveConfig {
    ObserveConfig {
        allow_list: vec![server.url()],
        ..ObserveConfig::default()
    }
}

fn no_objects(_: &KindRef, _: &str) -> Option<Value> {
    None
}

fn no_secrets(_: &str) -> Option<Value> {
    None
}

/// Prepares and runs `requests` for [`primary`].
async fn run(observer: &Observer, requests: &[HttpRequest]) -> SubmitOutcome {
    let resolved = observer.prepare(requests, &[], no_objects, no_secrets);
    observer.run(&primary(), resolved).await
}

/// `POST /v1/teams` with body `{"name":"a"}`, under id `create`.
fn create_team(server: &TestServer) -> HttpRequest {
    let mut post = probe(server, "/v1/teams");
    post.id = "create".into();
    post.method = HttpMethod::Post;
    post.body = r#"{"name":"a"}"#.into();
    post
}

fn probe(server: &TestServer, path: &str) -> HttpRequest {
    get(
        "probe",
        ALLOW_LIST_TARGET,
        &server.url(),
        server.addr.port(),
        path,
    )
}

fn observed_at(o: &Observation) -> Timestamp {
    o.observed_at.parse().expect("observedAt is RFC 3339")
}

#[tokio::test]
async fn a_get_result_is_stored_and_returned_with_its_age() {
    let server = TestServer::start(Reply::ok(r#"{"state":"up"}"#)).await;
    let obs = observer(allowing(&server));
    let outcome = run(&obs, &[probe(&server, "/state?full=1")]).await;
    assert_eq!(
        outcome,
        SubmitOutcome {
            sent: 1,
            changed: 1,
            ..SubmitOutcome::default()
        }
    );
    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    assert!(
        requests[0].starts_with("get /state?full=1 http/1.1\r\n"),
        "{requests:?}"
    );
    assert!(
        requests[0].contains(&format!("host: {}", server.addr)),
        "{requests:?}"
    );

    let first = obs.results(UID, Timestamp::now());
    assert_eq!(first.len(), 1);
    let later = observed_at(&first[0]) + jiff::SignedDuration::from_millis(1500);
    let results = obs.results(UID, later);
    assert_eq!(
        results,
        vec![Observation {
            id: "probe".into(),
            status: Some(200),
            body: r#"{"state":"up"}"#.into(),
            error: None,
            observed_at: first[0].observed_at.clone(),
            age_ms: 1500,
            outcome: Some(ObservationOutcome::Complete),
        }]
    );
    assert!(obs.results("another-uid", later).is_empty());
    let m = obs.metrics();
    assert_eq!((m.sent, m.succeeded, m.failed), (1, 1, 0));
}

#[tokio::test]
async fn a_base_url_off_the_allow_list_is_refused_before_any_connection() {
    let server = TestServer::start(Reply::ok("never")).await;
    let obs = observer(ObserveConfig {
        allow_list: vec!["http://127.0.0.1:1".into()],
        ..ObserveConfig::default()
    });
    let outcome = run(&obs, &[probe(&server, "/state")]).await;
    assert_eq!((outcome.sent, outcome.refused), (0, 1));
    assert_eq!(server.connections(), 0);
    let results = obs.results(UID, Timestamp::now());
    assert_eq!(results[0].status, None);
    assert_eq!(
        results[0].error.as_deref(),
        Some(
            format!(
                "refused before sending: http://{} is not on the operator's allow-list",
                server.addr
            )
            .as_str()
        )
    );
    assert_eq!(results[0].outcome, Some(ObservationOutcome::Failed));
    assert_eq!(obs.metrics().refused, 1);
    assert_eq!(obs.metrics().sent, 0);
}

#[test]
fn allow_list_matching_is_exact_on_scheme_host_and_port() {
    let list = vec![
        "http://Terdut.Example:8080".to_owned(),
        "http://plain.example".to_owned(),
        "https://secure.example".to_owned(),
    ];
    let resolve_at = |object: &str, port: u16, path: &str| {
        resolve(
            &get("x", ALLOW_LIST_TARGET, object, port, path),
            &[],
            &list,
            no_objects,
        )
        .map(|u| u.to_string())
    };
    assert_eq!(
        resolve_at("http://terdut.example:8080", 0, "/v1/teams?x=1").as_deref(),
        Ok("http://terdut.example:8080/v1/teams?x=1")
    );
    assert_eq!(
        resolve_at("http://terdut.example:8080/api/", 8080, "/teams").as_deref(),
        Ok("http://terdut.example:8080/api/teams")
    );
    assert_eq!(
        resolve_at("http://plain.example:80", 80, "/").as_deref(),
        Ok("http://plain.example:80/")
    );
    assert_eq!(
        resolve_at("http://terdut.example:8081", 0, "/"),
        Err(Refusal::NotAllowListed {
            origin: "http://terdut.example:8081".into()
        })
    );
    assert_eq!(
        resolve_at("http://terdut.example:8080", 9090, "/"),
        Err(Refusal::PortMismatch {
            port: 9090,
            origin: "http://terdut.example:8080".into()
        })
    );
    assert_eq!(
        resolve_at("https://secure.example", 0, "/v1").as_deref(),
        Ok("https://secure.example:443/v1")
    );
    assert_eq!(
        resolve_at("http://secure.example:443", 0, "/"),
        Err(Refusal::NotAllowListed {
            origin: "http://secure.example:443".into()
        }),
        "the scheme is part of the origin"
    );
    assert!(matches!(
        resolve_at("http://user@terdut.example:8080", 0, "/"),
        Err(Refusal::BadBaseUrl { .. })
    ));
    assert!(matches!(
        resolve_at("http://terdut.example:8080", 0, "relative"),
        Err(Refusal::BadPath { .. })
    ));
    assert!(matches!(
        resolve_at("http://terdut.example:8080", 0, "/a b"),
        Err(Refusal::BadPath { .. })
    ));
    let mut config = ObserveConfig {
        allow_list: list,
        ..ObserveConfig::default()
    };
    assert_eq!(config.allow_list_problems(), Vec::<String>::new());
    config.allow_list.push("ftp://files.example".into());
    assert_eq!(config.allow_list_problems().len(), 1);
}

fn pod_and_service_targets() -> Vec<HttpTarget> {
    vec![
        HttpTarget {
            id: "members".into(),
            kind: KindRef::namespaced("", "v1", "Pod", "pods"),
            ports: vec![8080],
        },
        HttpTarget {
            id: "api".into(),
            kind: KindRef::namespaced("", "v1", "Service", "services"),
            ports: vec![80, 8443],
        },
    ]
}

/// The snapshot of these tests: Pods `m-0` (IPv4), `m-1` (IPv6),
/// `pending` (no IP) and Service `api`, all in `ns`.
fn snapshot_objects(kind: &KindRef, name: &str) -> Option<Value> {
    let meta = json!({"name": name, "namespace": "ns"});
    match (kind.kind.as_str(), name) {
        ("Pod", "m-0") => Some(json!({"metadata": meta, "status": {"podIP": "10.244.1.7"}})),
        ("Pod", "m-1") => Some(json!({"metadata": meta, "status": {"podIP": "fd00::5"}})),
        ("Pod", "pending") => Some(json!({"metadata": meta, "status": {}})),
        ("Service", "api") => Some(json!({"metadata": meta,
            "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.12", "selector": {"app": "api"}}})),
        ("Service", "alias") => Some(json!({"metadata": meta,
            "spec": {"type": "ExternalName", "externalName": "example.com"}})),
        ("Service", "manual") => Some(json!({"metadata": meta,
            "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.13"}})),
        ("Service", "headless") => Some(json!({"metadata": meta,
            "spec": {"clusterIP": "None", "selector": {"app": "api"}}})),
        ("Service", "node") => Some(json!({"metadata": meta,
            "spec": {"type": "NodePort", "clusterIP": "10.96.0.14", "selector": {"app": "api"}}})),
        ("Service", "fresh") => Some(json!({"metadata": meta,
            "spec": {"selector": {"app": "api"}}})),
        _ => None,
    }
}

#[test]
fn pods_and_services_resolve_to_their_cluster_urls_without_connecting() {
    let targets = pod_and_service_targets();
    let at = |target: &str, object: &str, port: u16| {
        resolve(
            &get("x", target, object, port, "/state"),
            &targets,
            &[],
            snapshot_objects,
        )
        .map(|u| u.to_string())
    };
    assert_eq!(
        at("members", "m-0", 8080).as_deref(),
        Ok("http://10.244.1.7:8080/state")
    );
    assert_eq!(
        at("members", "m-1", 8080).as_deref(),
        Ok("http://[fd00::5]:8080/state")
    );
    assert_eq!(
        at("api", "api", 80).as_deref(),
        Ok("http://10.96.0.12:80/state")
    );
    for (service, why) in [
        ("alias", "ExternalName"),
        ("manual", "no selector"),
        ("headless", "headless"),
        ("node", "only Services of type ClusterIP"),
        ("fresh", "no cluster IP yet"),
    ] {
        match at("api", service, 80) {
            Err(refusal @ Refusal::ServiceNotRoutable { .. }) => {
                assert!(refusal.to_string().contains(why), "{service}: {refusal}");
            }
            other => panic!("{service}: expected a refusal, got {other:?}"),
        }
    }
    assert_eq!(
        at("members", "m-0", 9090),
        Err(Refusal::PortNotDeclared {
            port: 9090,
            target: "members".into()
        })
    );
    assert_eq!(
        at("members", "pending", 8080),
        Err(Refusal::NoPodIp {
            name: "pending".into()
        })
    );
    assert_eq!(
        at("members", "stranger", 8080),
        Err(Refusal::ObjectNotFound {
            kind: "Pod".into(),
            name: "stranger".into()
        })
    );
    assert_eq!(
        at("nowhere", "m-0", 8080),
        Err(Refusal::UnknownTarget {
            target: "nowhere".into()
        })
    );
}

#[tokio::test]
async fn a_slow_server_hits_the_deadline() {
    let server = TestServer::start(Reply::ok("late").slow(Duration::from_secs(30))).await;
    let obs = observer(allowing(&server));
    let mut request = probe(&server, "/slow");
    request.timeout_ms = 200;
    let outcome = run(&obs, &[request]).await;
    assert_eq!(outcome.sent, 1);
    let results = obs.results(UID, Timestamp::now());
    assert_eq!(results[0].status, None);
    assert_eq!(
        results[0].error.as_deref(),
        Some("deadline of 200 ms exceeded")
    );
    assert_eq!(results[0].outcome, Some(ObservationOutcome::TimedOut));
    assert_eq!(obs.metrics().failed, 1);
}

#[tokio::test]
async fn an_oversized_body_is_cut_at_the_cap_with_an_error() {
    let big = "x".repeat(5000);
    let server = TestServer::start(Reply::ok(&big)).await;
    let obs = observer(allowing(&server));
    let mut request = probe(&server, "/big");
    request.max_response_bytes = 100;
    run(&obs, &[request]).await;
    let results = obs.results(UID, Timestamp::now());
    assert_eq!(results[0].status, Some(200));
    assert_eq!(results[0].body, "x".repeat(100));
    assert_eq!(
        results[0].error.as_deref(),
        Some("response body exceeds the cap of 100 bytes and was cut at 100 bytes")
    );
    assert_eq!(results[0].outcome, Some(ObservationOutcome::Oversized));
    assert_eq!(obs.metrics().cut, 1);

    // A body of exactly the cap is whole.
    let exact = TestServer::start(Reply::ok(&"y".repeat(100))).await;
    let obs = observer(allowing(&exact));
    let mut request = probe(&exact, "/exact");
    request.max_response_bytes = 100;
    run(&obs, &[request]).await;
    let whole = &obs.results(UID, Timestamp::now())[0];
    assert_eq!(whole.error, None);
    assert_eq!(whole.outcome, Some(ObservationOutcome::Complete));
}

#[tokio::test]
async fn a_get_is_not_resent_for_a_primary_within_the_interval() {
    let server = TestServer::start(Reply::ok("up")).await;
    let obs = observer(allowing(&server));
    let request = probe(&server, "/state");
    assert_eq!(run(&obs, std::slice::from_ref(&request)).await.sent, 1);
    let again = run(&obs, std::slice::from_ref(&request)).await;
    assert_eq!(
        again,
        SubmitOutcome {
            rate_limited: 1,
            ..SubmitOutcome::default()
        }
    );
    assert_eq!(server.connections(), 1);
    assert_eq!(obs.results(UID, Timestamp::now())[0].body, "up");

    // Another primary has its own interval.
    let other = PrimaryInfo {
        uid: "uid-other".into(),
        ..primary()
    };
    let resolved = obs.prepare(std::slice::from_ref(&request), &[], no_objects, no_secrets);
    assert_eq!(obs.run(&other, resolved).await.sent, 1);
    // A changed URL under the same id is a new request.
    assert_eq!(run(&obs, &[probe(&server, "/other")]).await.sent, 1);
    assert_eq!(server.connections(), 3);
    assert_eq!(obs.metrics().rate_limited, 1);
}

#[tokio::test]
async fn at_most_max_concurrent_requests_are_in_flight() {
    let server = TestServer::start(Reply::ok("ok").slow(Duration::from_millis(150))).await;
    let obs = observer(ObserveConfig {
        max_concurrent: 2,
        ..allowing(&server)
    });
    let requests: Vec<HttpRequest> = (0..5)
        .map(|i| {
            let mut r = probe(&server, &format!("/n/{i}"));
            r.id = format!("r{i}");
            r
        })
        .collect();
    let outcome = run(&obs, &requests).await;
    assert_eq!(outcome.sent, 5);
    assert_eq!(server.connections(), 5);
    assert_eq!(server.max_in_flight.load(Ordering::SeqCst), 2);
    assert_eq!(obs.results(UID, Timestamp::now()).len(), 5);
}

#[tokio::test]
async fn mutating_calls_carry_an_idempotency_key_and_are_sent_each_time_asked() {
    let server = TestServer::start(Reply::ok("created")).await;
    let obs = observer(allowing(&server));
    let post = create_team(&server);
    run(&obs, std::slice::from_ref(&post)).await;
    run(&obs, std::slice::from_ref(&post)).await;
    let key = idempotency_key(UID, "create", HttpMethod::Post, "/v1/teams", &post.body);
    assert_eq!(key.len(), 64);
    let requests = server.requests();
    assert_eq!(requests.len(), 2, "a repeated POST is sent again");
    for seen in &requests {
        assert!(seen.starts_with("post /v1/teams http/1.1\r\n"), "{seen}");
        assert!(
            seen.contains(&format!("idempotency-key: {key}\r\n")),
            "{seen}"
        );
        assert!(seen.ends_with(r#"{"name":"a"}"#), "{seen}");
    }
    assert_ne!(
        key,
        idempotency_key(UID, "create", HttpMethod::Put, "/v1/teams", &post.body)
    );
    // GETs carry none.
    run(&obs, &[probe(&server, "/v1/teams")]).await;
    assert!(!server.requests()[2].contains("idempotency-key"));
}

#[tokio::test]
async fn a_mutating_call_in_flight_is_not_sent_again_by_a_later_plan() {
    let server = TestServer::start(Reply::ok("created").slow(Duration::from_millis(1500))).await;
    let obs = observer(allowing(&server));
    let mut post = probe(&server, "/v1/teams");
    post.id = "create".into();
    post.method = HttpMethod::Post;
    let (first, second) = tokio::join!(run(&obs, std::slice::from_ref(&post)), async {
        // The second plan lists the POST once the first is on the wire.
        let deadline = Instant::now() + Duration::from_secs(10);
        while server.connections() == 0 {
            assert!(Instant::now() < deadline, "the first POST never arrived");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        run(&obs, std::slice::from_ref(&post)).await
    });
    assert_eq!((first.sent, first.in_flight), (1, 0));
    assert_eq!((second.sent, second.in_flight), (0, 1));
    assert_eq!(server.requests().len(), 1, "sent once");
    let kept = obs.results(UID, Timestamp::now());
    assert_eq!(kept[0].body, "created", "the answer in flight is stored");
    // Once answered, the id may be sent again (another plan asked anew).
    let third = run(&obs, std::slice::from_ref(&post)).await;
    assert_eq!((third.sent, third.in_flight), (1, 0));
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn a_mutating_call_answered_after_the_plans_snapshot_is_not_sent_again() {
    let server = TestServer::start(Reply::ok("created")).await;
    let obs = observer(allowing(&server));
    let post = create_team(&server);
    let send = |request: &HttpRequest, seen: &SeenResults| {
        let resolved = obs.prepare(std::slice::from_ref(request), &[], no_objects, no_secrets);
        let seen = seen.clone();
        let obs = &obs;
        async move { obs.run_planned(&primary(), resolved, Some(&seen)).await }
    };
    // Two plans made from the same snapshot, before any answer (as a spec
    // edit's reconcile whose snapshot was taken while the first POST was
    // on the wire, and whose plan runs after it answered). The second
    // changed the body: a hashed Idempotency-Key would differ too.
    let (before, seen_before) = obs.snapshot(UID, Timestamp::now());
    assert!(before.is_empty());
    let first = send(&post, &seen_before).await;
    assert_eq!((first.sent, first.changed, first.superseded), (1, 1, 0));
    let mut renamed = post.clone();
    renamed.body = r#"{"name":"b"}"#.into();
    let second = send(&renamed, &seen_before).await;
    assert_eq!(
        (second.sent, second.superseded),
        (0, 1),
        "a plan that has not seen the answer does not repeat the call"
    );
    assert_eq!(server.requests().len(), 1, "the server saw one POST");
    // A plan made after the answer was stored may ask again: its plugin
    // saw the answer and still wants the call.
    let (after, seen_after) = obs.snapshot(UID, Timestamp::now());
    assert_eq!(after[0].body, "created");
    let third = send(&renamed, &seen_after).await;
    assert_eq!((third.sent, third.superseded), (1, 0));
    assert_eq!(server.requests().len(), 2);
    // The mark is the result itself, not its content: the third answer
    // equals the first, and a plan from the snapshot before it still
    // has not seen it.
    let fourth = send(&renamed, &seen_after).await;
    assert_eq!((fourth.sent, fourth.superseded), (0, 1));
    // After a forget, results stored anew are not the ones seen before.
    obs.forget(UID);
    let fifth = send(&renamed, &seen_after).await;
    assert_eq!(fifth.sent, 1, "nothing stored for the id: sent");
    let sixth = send(&renamed, &seen_after).await;
    assert_eq!((sixth.sent, sixth.superseded), (0, 1));
    assert_eq!(server.requests().len(), 3);
}

#[tokio::test]
async fn a_plans_gets_are_sent_after_its_mutating_calls_answered() {
    // Slow answers: sent together, the GET would be on the wire while the
    // PATCH is still unanswered.
    let server = TestServer::start(Reply::ok("{}").slow(Duration::from_millis(200))).await;
    let obs = observer(allowing(&server));
    let list = probe_id(&server, "list");
    let mut patch = probe(&server, "/v1/things/7");
    patch.id = "rename".into();
    patch.method = HttpMethod::Patch;
    patch.body = r#"{"name":"b"}"#.into();
    // The GET is listed first; the write still goes first.
    let outcome = run(&obs, &[list, patch]).await;
    assert_eq!(outcome.sent, 2);
    let seen = server.requests();
    assert!(seen[0].starts_with("patch /v1/things/7 "), "{seen:?}");
    assert!(seen[1].starts_with("get "), "{seen:?}");
    assert_eq!(server.max_in_flight.load(Ordering::SeqCst), 1);
    let kept = obs.results(UID, Timestamp::now());
    let age = |id: &str| kept.iter().find(|o| o.id == id).expect(id).age_ms;
    assert!(age("list") < age("rename"), "the GET's result is the newer");
}

#[tokio::test]
async fn results_older_than_max_age_are_dropped() {
    let server = TestServer::start(Reply::ok("fresh")).await;
    let obs = observer(allowing(&server));
    let mut request = probe(&server, "/state");
    request.max_age_ms = 1000;
    run(&obs, &[request]).await;
    let at = observed_at(&obs.results(UID, Timestamp::now())[0]);
    let young = obs.results(UID, at + jiff::SignedDuration::from_millis(1000));
    assert_eq!(young.len(), 1);
    assert_eq!(young[0].age_ms, 1000);
    assert!(
        obs.results(UID, at + jiff::SignedDuration::from_millis(1001))
            .is_empty()
    );
}

/// Collects what a tracing subscriber writes, for the test thread.
#[derive(Clone, Default)]
struct LogBuffer(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log lock").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn secret_header_values_are_sent_but_never_logged() {
    const VALUE: &str = "s3cr3t-t0ken-value";
    let logs = LogBuffer::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let server = TestServer::start(Reply::ok("ok")).await;
    let obs = observer(allowing(&server));
    let mut request = probe(&server, "/v1/teams");
    request.headers = vec![("X-Team".into(), "blue".into())];
    request.secret_headers = vec![SecretHeader {
        name: "Authorization".into(),
        secret: "terdut-admin".into(),
        key: "token".into(),
        prefix: "Bearer ".into(),
    }];
    let encoded = base64::engine::general_purpose::STANDARD.encode(VALUE);
    let secrets = |name: &str| {
        (name == "terdut-admin").then(|| json!({"kind": "Secret", "data": {"token": encoded}}))
    };
    let resolved = obs.prepare(std::slice::from_ref(&request), &[], no_objects, secrets);
    assert!(!format!("{resolved:?}").contains(VALUE), "Debug hides it");
    let outcome = obs.run(&primary(), resolved).await;
    assert_eq!(outcome.sent, 1);

    let seen = &server.requests()[0];
    assert!(
        seen.contains(&format!("authorization: bearer {}", VALUE.to_lowercase())),
        "{seen}"
    );
    assert!(seen.contains("x-team: blue"), "{seen}");
    let logged = String::from_utf8_lossy(&logs.0.lock().expect("log lock")).into_owned();
    assert!(logged.contains("observation request"), "{logged}");
    assert!(
        logged.contains("ns/p") && logged.contains("observer"),
        "{logged}"
    );
    assert!(!logged.contains(VALUE), "{logged}");
    assert!(!logged.contains(&encoded), "{logged}");
}

#[test]
fn a_missing_secret_or_key_is_a_refusal_naming_it_not_its_value() {
    let mut request = get("x", ALLOW_LIST_TARGET, "http://a", 0, "/");
    request.secret_headers = vec![SecretHeader {
        name: "Authorization".into(),
        secret: "creds".into(),
        key: "token".into(),
        prefix: String::new(),
    }];
    assert_eq!(
        resolve_headers(&request, no_secrets)
            .unwrap_err()
            .to_string(),
        "Secret \"creds\" is not in the primary's snapshot"
    );
    let other_key = |_: &str| Some(json!({"data": {"password": "aHVudGVyMg=="}}));
    let refusal = resolve_headers(&request, other_key).unwrap_err();
    assert_eq!(refusal.to_string(), "Secret \"creds\" has no key \"token\"");
    request.headers = vec![("Host".into(), "elsewhere".into())];
    assert_eq!(
        resolve_headers(&request, no_secrets),
        Err(Refusal::ReservedHeader {
            name: "Host".into()
        })
    );
}

#[tokio::test]
async fn submit_reports_its_outcome_and_forget_drops_everything() {
    let server = TestServer::start(Reply::ok("up")).await;
    let obs = observer(allowing(&server));
    let resolved = obs.prepare(&[probe(&server, "/state")], &[], no_objects, no_secrets);
    let (tx, rx) = tokio::sync::oneshot::channel();
    obs.submit(
        primary(),
        resolved,
        SeenResults::default(),
        move |outcome| {
            let _ = tx.send(outcome);
        },
    );
    let outcome = rx.await.expect("on_done is called");
    assert_eq!((outcome.sent, outcome.changed), (1, 1));
    assert_eq!(obs.results(UID, Timestamp::now()).len(), 1);

    obs.forget(UID);
    assert!(obs.results(UID, Timestamp::now()).is_empty());
    assert_eq!(run(&obs, &[probe(&server, "/state")]).await.changed, 1);
    // The same answer again is no change: nothing new for the plugin.
    assert_eq!(run(&obs, &[probe(&server, "/other")]).await.changed, 0);
}

fn budget(server: &TestServer, change: impl FnOnce(&mut ObserveConfig)) -> Arc<Observer> {
    let mut config = allowing(server);
    change(&mut config);
    observer(config)
}

fn probe_id(server: &TestServer, id: &str) -> HttpRequest {
    let mut request = probe(server, "/state");
    request.id = id.into();
    request
}

#[tokio::test]
async fn every_request_counts_toward_the_per_primary_budget() {
    let server = TestServer::start(Reply::ok("done")).await;
    let obs = budget(&server, |c| c.max_requests_per_primary = 3);
    let mut post = probe(&server, "/v1/things");
    post.id = "make".into();
    post.method = HttpMethod::Post;
    let mut rate_limited = 0;
    for _ in 0..3 {
        rate_limited += run(&obs, std::slice::from_ref(&post)).await.rate_limited;
    }
    // Two POSTs and a GET of another id: the fourth request of the
    // interval is not sent, whatever its method.
    let fresh = run(&obs, &[probe_id(&server, "other")]).await;
    assert_eq!(rate_limited, 0);
    assert_eq!(fresh.rate_limited, 1);
    assert_eq!(server.requests().len(), 3);
    // Another primary has its own budget.
    let mut other = primary();
    other.uid = "another-uid".into();
    let resolved = obs.prepare(&[probe_id(&server, "other")], &[], no_objects, no_secrets);
    assert_eq!(obs.run(&other, resolved).await.sent, 1);
}

#[tokio::test]
async fn kept_results_stay_within_the_per_primary_byte_budget() {
    let server = TestServer::start(Reply::ok(&"x".repeat(1000))).await;
    let obs = budget(&server, |c| c.max_result_bytes_per_primary = 2500);
    for id in ["a", "b", "c", "d"] {
        run(&obs, &[probe_id(&server, id)]).await;
    }
    let kept = obs.results(UID, Timestamp::now());
    let ids: Vec<&str> = kept.iter().map(|o| o.id.as_str()).collect();
    assert_eq!(ids, ["c", "d"], "the oldest results go first");
    let bytes: usize = kept.iter().map(|o| o.body.len()).sum();
    assert!(bytes <= 2500, "{bytes}");
}

#[tokio::test]
async fn a_result_larger_than_the_budget_keeps_its_status_and_an_error() {
    let server = TestServer::start(Reply::ok(&"y".repeat(5000))).await;
    let obs = budget(&server, |c| c.max_result_bytes_per_primary = 2500);
    run(&obs, &[probe_id(&server, "big")]).await;
    let kept = obs.results(UID, Timestamp::now());
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0].status, Some(200));
    assert!(kept[0].body.is_empty());
    let error = kept[0].error.as_deref().unwrap_or_default();
    assert!(error.contains("observation budget"), "{error}");
}

#[tokio::test]
async fn kept_results_stay_within_the_total_byte_budget() {
    let server = TestServer::start(Reply::ok(&"z".repeat(1000))).await;
    let obs = budget(&server, |c| c.max_result_bytes_total = 2500);
    for n in 0..4 {
        let mut who = primary();
        who.uid = format!("uid-{n}");
        let resolved = obs.prepare(&[probe_id(&server, "s")], &[], no_objects, no_secrets);
        obs.run(&who, resolved).await;
    }
    let now = Timestamp::now();
    let kept: Vec<usize> = (0..4)
        .map(|n| obs.results(&format!("uid-{n}"), now).len())
        .collect();
    assert_eq!(
        kept,
        [0, 0, 1, 1],
        "the oldest results of any primary go first"
    );
}

#[tokio::test]
async fn max_age_zero_means_the_maximum_age_not_forever() {
    let server = TestServer::start(Reply::ok("fresh")).await;
    let obs = budget(&server, |c| c.max_result_age = Duration::from_secs(1));
    let mut request = probe(&server, "/state");
    request.max_age_ms = 0;
    let mut long = probe_id(&server, "long");
    long.max_age_ms = 3_600_000;
    run(&obs, &[request, long]).await;
    // The two requests may finish in different milliseconds.
    let times: Vec<Timestamp> = obs
        .results(UID, Timestamp::now())
        .iter()
        .map(observed_at)
        .collect();
    let (first, last) = (
        *times.iter().min().expect("results"),
        *times.iter().max().expect("results"),
    );
    assert_eq!(
        obs.results(UID, first + jiff::SignedDuration::from_millis(1000))
            .len(),
        2
    );
    assert!(
        obs.results(UID, last + jiff::SignedDuration::from_millis(1001))
            .is_empty(),
        "both expire at the maximum age"
    );
}

/// An `https` GET of the stand-in terdut-server at `url`, trusting `ca`.
fn version_over_tls(url: &str, ca: Option<CaBundle>) -> HttpRequest {
    let mut request = HttpRequest::allow_listed("version", HttpMethod::Get, url, "/api/version");
    request.ca_bundle = ca;
    request
}

#[tokio::test]
async fn https_is_verified_against_the_system_roots_and_the_ca_bundle() {
    let standin = terdut_standin::StandIn::start_tls()
        .await
        .expect("stand-in");
    let ca = standin
        .ca_pem()
        .expect("a TLS stand-in has a CA")
        .to_owned();
    let obs = observer(ObserveConfig {
        allow_list: vec![standin.url().to_owned()],
        ..ObserveConfig::default()
    });
    let uid = |n: &str| {
        let mut p = primary();
        p.uid = n.into();
        p
    };

    // Trusting the test CA inline: answered over TLS.
    let trusted = obs.prepare(
        &[version_over_tls(
            standin.url(),
            Some(CaBundle::Pem(ca.clone())),
        )],
        &[],
        no_objects,
        no_secrets,
    );
    obs.run(&uid("inline"), trusted).await;
    let got = &obs.results("inline", Timestamp::now())[0];
    assert_eq!(got.status, Some(200), "{got:?}");
    assert!(got.body.contains("\"capabilities\""), "{}", got.body);

    // The same CA from a Secret of the primary's namespace.
    let secret = json!({"data": {"ca.crt": base64::engine::general_purpose::STANDARD.encode(&ca)}});
    let from_secret = obs.prepare(
        &[version_over_tls(
            standin.url(),
            Some(CaBundle::Secret {
                name: "terdut-ca".into(),
                key: "ca.crt".into(),
            }),
        )],
        &[],
        no_objects,
        |name: &str| (name == "terdut-ca").then(|| secret.clone()),
    );
    obs.run(&uid("secret"), from_secret).await;
    assert_eq!(obs.results("secret", Timestamp::now())[0].status, Some(200));

    // The system's roots alone do not know the test CA: no response.
    let untrusted = obs.prepare(
        &[version_over_tls(standin.url(), None)],
        &[],
        no_objects,
        no_secrets,
    );
    obs.run(&uid("system"), untrusted).await;
    let got = &obs.results("system", Timestamp::now())[0];
    assert_eq!(got.status, None);
    let error = got.error.as_deref().unwrap_or_default();
    assert!(error.contains("TLS handshake"), "{error}");
    assert_eq!(
        standin.log().len(),
        2,
        "only the two trusted calls reached the server"
    );

    // A bundle that is not PEM, or a Secret that is not there: refused
    // before anything is sent, naming the source, never the content.
    for (bundle, expect) in [
        (
            CaBundle::Pem("not a certificate".into()),
            "holds no PEM certificate",
        ),
        (
            CaBundle::Secret {
                name: "missing".into(),
                key: "ca.crt".into(),
            },
            "Secret missing key ca.crt: the Secret is not in the snapshot",
        ),
    ] {
        let refused = obs.prepare(
            &[version_over_tls(standin.url(), Some(bundle))],
            &[],
            no_objects,
            no_secrets,
        );
        let Err(refusal) = &refused[0].endpoint else {
            panic!("a bad CA bundle was accepted");
        };
        assert!(refusal.to_string().contains(expect), "{refusal}");
    }
}
