//! Whole-plugin tests of the security steps (auth, engine TLS, gateway
//! TLS), through the SDK's `testing::run`.

use serde_json::{Value, json};
use wasmop_sdk::Plan;
use wasmop_sdk::testing::{SnapshotBuilder, run};

use crate::InstancePlugin;
use crate::pem::encode;

const UID: &str = "4b1d5c0e-0000-4000-8000-000000000001";
const ID: &str = "01JGFJJZ00ABCDEFGHJKMNPQRS";
const NOW: &str = "2025-01-01T00:00:00Z";
const CA: &str = include_str!("testdata/ca-p384.crt");
const CA2: &str = include_str!("testdata/ca-p256.crt");
const CA_FP: &str = "fad3cac8b473ff0c7974841c057f6102c25265e18638c58c3bf20f19e47c79f8";
const CA2_FP: &str = "1b9ded21d19f31076afe0e038872063c847f39aece82d4801bb207bb226ade74";
const PASSWORD: &str = "correct horse battery staple";

fn instance(extra: Value, status: Value) -> Value {
    let mut spec = json!({"id": ID, "metadata": {}, "gateway": {}});
    for (k, v) in extra.as_object().unwrap() {
        spec[k] = v.clone();
    }
    json!({
        "apiVersion": "compute.firebolt.io/v1alpha1",
        "kind": "FireboltInstance",
        "metadata": {"name": "fb", "namespace": "ns", "uid": UID, "generation": 1},
        "spec": spec,
        "status": status,
    })
}

fn auth(rotation: bool) -> Value {
    let mut keys = json!({"certManager": {"issuerRef": {"name": "ca"}}});
    if rotation {
        keys["rotationInterval"] = json!("720h");
        keys["retainDuration"] = json!("24h");
    }
    json!({"auth": {"enabled": true, "local": {
        "admin": {"password": {"name": "admin", "key": "password"}},
        "signingKeys": keys}}})
}

fn owned(kind: &str, name: &str, component: &str, rest: Value) -> Value {
    let api = match kind {
        "Deployment" | "StatefulSet" => "apps/v1",
        "Certificate" => "cert-manager.io/v1",
        _ => "v1",
    };
    let mut o = json!({
        "apiVersion": api, "kind": kind,
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
                     "resourceVersion": "7",
                     "labels": {"firebolt.io/instance": "fb", "firebolt.io/component": component}},
    });
    for (k, v) in rest.as_object().unwrap() {
        o[k] = v.clone();
    }
    o
}

/// A Secret as an issuer leaves it.
fn issued(name: &str, component: &str, ca: &str) -> Value {
    owned(
        "Secret",
        name,
        component,
        json!({"type": "kubernetes.io/tls", "data": {
            "tls.crt": encode(ca.as_bytes()), "tls.key": encode(b"key"), "ca.crt": encode(ca.as_bytes())}}),
    )
}

fn ready_components() -> Vec<Value> {
    let deployment = |name: &str, component: &str, replicas: i64| {
        owned(
            "Deployment",
            name,
            component,
            json!({"metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
                                "generation": 1, "resourceVersion": "7",
                                "labels": {"firebolt.io/instance": "fb", "firebolt.io/component": component}},
                   "spec": {"replicas": replicas, "template": {}},
                   "status": {"observedGeneration": 1, "replicas": replicas, "updatedReplicas": replicas,
                              "availableReplicas": replicas}}),
        )
    };
    vec![
        owned(
            "Secret",
            "fb-metadata-postgres-creds",
            "postgres",
            json!({"data": {"username": "eA==", "password": "eA=="}}),
        ),
        owned(
            "StatefulSet",
            "fb-metadata-pg",
            "postgres",
            json!({"spec": {"template": {}}, "status": {"replicas": 1, "readyReplicas": 1}}),
        ),
        deployment("fb-metadata", "metadata", 1),
        deployment("fb-gateway", "gateway", 2),
    ]
}

fn admin_secret() -> Value {
    json!({"apiVersion": "v1", "kind": "Secret",
           "metadata": {"name": "admin", "namespace": "ns"},
           "data": {"password": encode(PASSWORD.as_bytes())}})
}

fn engine(name: &str, auth_hash: &str, tls_hash: &str) -> Value {
    json!({"apiVersion": "compute.firebolt.io/v1alpha1", "kind": "FireboltEngine",
           "metadata": {"name": name, "namespace": "ns"},
           "spec": {"instanceRef": "fb", "replicas": 1},
           "status": {"observedAuthHash": auth_hash, "observedEngineTLSHash": tls_hash}})
}

struct Case {
    primary: Value,
    owned: Vec<Value>,
    related: Vec<(&'static str, Value)>,
}

impl Case {
    fn new(extra: Value, status: Value) -> Self {
        Case {
            primary: instance(extra, status),
            owned: ready_components(),
            related: Vec::new(),
        }
    }

    fn owned(mut self, o: Value) -> Self {
        self.owned.retain(|x| {
            !(x["kind"] == o["kind"] && x["metadata"]["name"] == o["metadata"]["name"])
        });
        self.owned.push(o);
        self
    }

    fn related(mut self, read: &'static str, o: Value) -> Self {
        self.related.push((read, o));
        self
    }

    fn plan(&self) -> Plan {
        let mut b = SnapshotBuilder::new("instance")
            .primary(&self.primary)
            .now(NOW);
        for o in &self.owned {
            b = b.owned(o);
        }
        for (read, o) in &self.related {
            b = b.related(read, o);
        }
        run::<InstancePlugin>(&b.build()).expect("a plan")
    }
}

fn condition<'a>(p: &'a Plan, t: &str) -> (&'a str, &'a str) {
    let c = p.status.as_ref().unwrap()["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == t)
        .unwrap();
    (c["status"].as_str().unwrap(), c["reason"].as_str().unwrap())
}

fn applied<'a>(p: &'a Plan, kind: &str, name: &str) -> Option<&'a Value> {
    p.apply
        .iter()
        .map(|op| &op.object)
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
}

fn envoy(p: &Plan) -> Value {
    serde_json::from_str(
        applied(p, "ConfigMap", "fb-gateway-config").unwrap()["data"]["envoy.json"]
            .as_str()
            .unwrap(),
    )
    .unwrap()
}

fn status(p: &Plan) -> &Value {
    p.status.as_ref().unwrap()
}

// ---- auth ----

#[test]
fn auth_provisions_the_first_key_through_cert_manager_and_waits_for_it() {
    let p = Case::new(auth(false), json!({}))
        .related("admin-password", admin_secret())
        .plan();
    let cert = applied(&p, "Certificate", "fb-auth-signing-1").unwrap();
    assert_eq!(cert["spec"]["secretName"], "fb-auth-signing-1");
    assert_eq!(cert["spec"]["privateKey"]["rotationPolicy"], "Never");
    let secret_op = p
        .apply
        .iter()
        .find(|op| {
            op.object["kind"] == "Secret" && op.object["metadata"]["name"] == "fb-auth-signing-1"
        })
        .unwrap();
    assert_eq!(
        secret_op.precondition,
        Some(wasmop_sdk::Precondition::Absent),
        "the key's Secret is created once, never rewritten"
    );
    assert_eq!(condition(&p, "AuthReady"), ("False", "SigningKeyPending"));
    let a = &status(&p)["auth"];
    assert_eq!(a["signingKeyGeneration"], 1);
    assert_eq!(a["signingKeys"][0]["id"], "signing-1");
    assert_eq!(a["signingKeys"][0]["phase"], "Active");
    assert!(a.get("authHash").is_none(), "engines wait for the key");
    assert_eq!(
        condition(&p, "Ready").0,
        "True",
        "AuthReady is not rolled up"
    );
    assert_eq!(
        p.requeue_after_ms,
        Some(30_000),
        "a key waiting for its issuer is looked at again, event or not"
    );
}

fn provisioned_status() -> Value {
    json!({"auth": {"signingKeyGeneration": 1, "signingKeys": [
        {"id": "signing-1", "secretName": "fb-auth-signing-1", "createdAt": "2024-11-01T00:00:00Z",
         "phase": "Active", "issued": false}]}})
}

#[test]
fn an_issued_key_publishes_the_auth_hash_and_no_plaintext_is_written() {
    let p = Case::new(auth(false), provisioned_status())
        .related("admin-password", admin_secret())
        .owned(issued("fb-auth-signing-1", "auth-signing", CA))
        .plan();
    assert_eq!(condition(&p, "AuthReady"), ("True", "Provisioned"));
    let a = &status(&p)["auth"];
    assert_eq!(a["signingKeys"][0]["issued"], true);
    assert_eq!(a["authHash"].as_str().unwrap().len(), 16);
    let text = serde_json::to_string(&p).unwrap();
    assert!(!text.contains(PASSWORD) && !text.contains(&encode(PASSWORD.as_bytes())));
    assert!(
        !text.contains(&encode(b"key")),
        "no private key in the plan"
    );
}

#[test]
fn the_admin_password_preflight_fails_alone() {
    for admin in [
        None,
        Some(json!({"apiVersion": "v1", "kind": "Secret",
                                     "metadata": {"name": "admin", "namespace": "ns"},
                                     "data": {"other": "eA=="}})),
    ] {
        let mut case = Case::new(auth(false), provisioned_status());
        if let Some(a) = admin {
            case = case.related("admin-password", a);
        }
        let p = case.plan();
        assert_eq!(
            condition(&p, "AuthReady"),
            ("False", "AdminPasswordSecretPreflightFailed")
        );
        assert!(status(&p)["auth"].get("authHash").is_none());
        assert_eq!(
            status(&p)["auth"]["signingKeys"][0]["id"],
            "signing-1",
            "keys kept"
        );
        // Metadata and gateway stay up and published.
        assert_eq!(condition(&p, "Ready"), ("True", "AllComponentsReady"));
        assert_eq!(
            status(&p)["gatewayEndpoint"],
            "fb-gateway.ns.svc.cluster.local"
        );
        assert!(applied(&p, "Deployment", "fb-gateway").is_some());
        assert!(
            p.delete.is_empty() && applied(&p, "Certificate", "fb-auth-signing-1").is_none(),
            "a failed step neither writes nor prunes its objects"
        );
    }
}

#[test]
fn an_invalid_auth_spec_is_reported_on_auth_ready() {
    let mut spec = auth(true);
    spec["auth"]["local"]["signingKeys"]["retainDuration"] = json!(null);
    let p = Case::new(spec, json!({}))
        .related("admin-password", admin_secret())
        .plan();
    assert_eq!(condition(&p, "AuthReady"), ("False", "AuthSpecInvalid"));
    assert_eq!(status(&p)["phase"], "Ready");
}

fn rotating_status(extra: Value) -> Value {
    let mut s = json!({"auth": {"signingKeyGeneration": 2, "signingKeys": [
        {"id": "signing-1", "secretName": "fb-auth-signing-1", "createdAt": "2024-11-01T00:00:00Z",
         "phase": "Active", "issued": true},
        {"id": "signing-2", "secretName": "fb-auth-signing-2", "createdAt": "2024-12-31T00:00:00Z",
         "phase": "ValidationOnly", "issued": true}]}});
    for (k, v) in extra.as_object().unwrap() {
        s["auth"][k] = v.clone();
    }
    s
}

#[test]
fn a_parked_rotation_names_its_step_and_lagging_engines_then_proceeds() {
    let base = || {
        Case::new(auth(true), rotating_status(json!({})))
            .related("admin-password", admin_secret())
            .owned(issued("fb-auth-signing-1", "auth-signing", CA))
            .owned(issued("fb-auth-signing-2", "auth-signing", CA))
    };
    // The hash engines must report: the one of the current render (a
    // lagging engine keeps the ring as it is).
    let current = base().related("engines", engine("x", "old", "")).plan();
    let hash = status(&current)["auth"]["authHash"]
        .as_str()
        .unwrap()
        .to_owned();

    let parked = base()
        .related("engines", engine("fast", &hash, ""))
        .related("engines", engine("slow", "old", ""))
        .plan();
    assert_eq!(
        condition(&parked, "AuthReady"),
        ("True", "RotationWaitingForEngines")
    );
    let a = &status(&parked)["auth"];
    assert_eq!(a["pendingRotationStep"], "AwaitingPromotion");
    assert_eq!(a["pendingSince"], NOW);
    assert_eq!(a["laggingEngines"], json!(["slow"]));
    assert_eq!(a["laggingEngineCount"], 1);
    assert_eq!(a["signingKeys"][0]["phase"], "Active", "nothing promoted");
    assert_eq!(a["authHash"], hash.as_str());
    assert_eq!(
        parked.requeue_after_ms,
        Some(30_000),
        "a step waiting on engines is looked at again, event or not"
    );

    // The same state as gauges for alerting.
    let gauge = |plan: &Plan, suffix: &str| {
        let name = format!("firebolt_instance_signing_key_rotation_{suffix}");
        plan.gauges
            .iter()
            .find(|g| g.name == name)
            .map(|g| (g.labels.clone(), g.value))
            .unwrap_or_else(|| panic!("no gauge {name}: {:?}", plan.gauges))
    };
    let (labels, value) = gauge(&parked, "pending");
    assert_eq!(value, 1.0);
    assert_eq!(
        labels.get("step").map(String::as_str),
        Some("AwaitingPromotion")
    );
    assert_eq!(gauge(&parked, "lagging_engines").1, 1.0);
    // 2025-01-01T00:00:00Z.
    assert_eq!(
        gauge(&parked, "pending_since_timestamp_seconds").1,
        1_735_689_600.0
    );
    assert_eq!(gauge(&parked, "keys").1, 2.0);

    // Still parked later: pendingSince stays.
    let mut later = base()
        .related("engines", engine("fast", &hash, ""))
        .related("engines", engine("slow", "old", ""));
    later.primary["status"] = rotating_status(json!({
        "pendingRotationStep": "AwaitingPromotion", "pendingSince": "2024-12-31T12:00:00Z"}));
    let later = later.plan();
    assert_eq!(
        status(&later)["auth"]["pendingSince"],
        "2024-12-31T12:00:00Z"
    );
    // Twelve hours before NOW.
    assert_eq!(
        gauge(&later, "pending_since_timestamp_seconds").1,
        1_735_689_600.0 - 43_200.0
    );

    // The slow engine rolls: promotion, one step only.
    let promoted = base()
        .related("engines", engine("fast", &hash, ""))
        .related("engines", engine("slow", &hash, ""))
        .plan();
    let a = &status(&promoted)["auth"];
    assert!(a.get("pendingRotationStep").is_none());
    let (labels, value) = gauge(&promoted, "pending");
    assert_eq!((labels.len(), value), (0, 0.0), "no step waits");
    assert_eq!(gauge(&promoted, "pending_since_timestamp_seconds").1, 0.0);
    assert_eq!(a["signingKeys"][0]["phase"], "ValidationOnly");
    assert_eq!(a["signingKeys"][0]["demotedAt"], NOW);
    assert!(
        a["signingKeys"][0].get("retireEligibleAt").is_none(),
        "one step per reconcile"
    );
    assert_eq!(a["signingKeys"][1]["phase"], "Active");
    assert_ne!(a["authHash"], hash.as_str(), "the render changed");
    assert_eq!(condition(&promoted, "AuthReady"), ("True", "Provisioned"));
    assert!(
        promoted
            .events
            .iter()
            .any(|e| e.reason == "SigningKeyRotation")
    );
}

#[test]
fn a_removed_key_is_deleted_once_every_engine_dropped_it() {
    let removing = json!({"auth": {"signingKeyGeneration": 2, "signingKeys": [
        {"id": "signing-1", "secretName": "fb-auth-signing-1", "createdAt": "2024-11-01T00:00:00Z",
         "phase": "Removing", "issued": true, "demotedAt": "2024-12-01T00:00:00Z",
         "retireEligibleAt": "2024-12-02T00:00:00Z"},
        {"id": "signing-2", "secretName": "fb-auth-signing-2", "createdAt": "2024-11-30T00:00:00Z",
         "phase": "Active", "issued": true}]}});
    let case = || {
        Case::new(auth(true), removing.clone())
            .related("admin-password", admin_secret())
            .owned(issued("fb-auth-signing-1", "auth-signing", CA))
            .owned(issued("fb-auth-signing-2", "auth-signing", CA))
            .owned(owned(
                "Certificate",
                "fb-auth-signing-1",
                "auth-signing",
                json!({}),
            ))
    };
    let parked = case().related("engines", engine("e", "old", "")).plan();
    let hash = status(&parked)["auth"]["authHash"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        status(&parked)["auth"]["pendingRotationStep"],
        "AwaitingRemoval"
    );
    assert!(parked.delete.is_empty());
    let done = case().related("engines", engine("e", &hash, "")).plan();
    let deleted: Vec<(&str, &str)> = done
        .delete
        .iter()
        .map(|d| (d.target.kind.as_str(), d.target.name.as_str()))
        .collect();
    assert!(
        deleted.contains(&("Certificate", "fb-auth-signing-1")),
        "{deleted:?}"
    );
    assert!(
        deleted.contains(&("Secret", "fb-auth-signing-1")),
        "{deleted:?}"
    );
    assert_eq!(
        status(&done)["auth"]["signingKeys"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

#[test]
fn a_lost_ring_is_rebuilt_from_the_owned_keys_and_nothing_is_deleted() {
    // Status as a rotation left it: signing-1 Active, signing-2 fresh.
    let kept = json!({"auth": {"signingKeyGeneration": 2, "signingKeys": [
        {"id": "signing-1", "secretName": "fb-auth-signing-1", "createdAt": "2024-11-01T00:00:00Z",
         "phase": "Active", "issued": true},
        {"id": "signing-2", "secretName": "fb-auth-signing-2", "createdAt": "2024-12-31T00:00:00Z",
         "phase": "ValidationOnly", "issued": true}]}});
    let keys = |status: Value| {
        Case::new(auth(true), status)
            .related("admin-password", admin_secret())
            .owned(issued("fb-auth-signing-1", "auth-signing", CA))
            .owned(issued("fb-auth-signing-2", "auth-signing", CA))
            .owned(owned(
                "Certificate",
                "fb-auth-signing-1",
                "auth-signing",
                json!({}),
            ))
            .owned(owned(
                "Certificate",
                "fb-auth-signing-2",
                "auth-signing",
                json!({}),
            ))
    };
    // The hash of that render (an engine that lags holds the promotion).
    let hash = status(
        &keys(kept.clone())
            .related("engines", engine("a", "old", ""))
            .plan(),
    )["auth"]["authHash"]
        .as_str()
        .unwrap()
        .to_owned();
    let phases = |p: &Plan| -> Vec<(String, String)> {
        status(p)["auth"]["signingKeys"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| {
                (
                    k["id"].as_str().unwrap().to_owned(),
                    k["phase"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    };
    let pair = |a: &str, b: &str| (a.to_owned(), b.to_owned());

    // Engines run signing-1 Active: the rebuild finds that render.
    let rebuilt = keys(json!({}))
        .related("engines", engine("a", &hash, ""))
        .related("engines", engine("b", &hash, ""))
        .plan();
    assert!(rebuilt.delete.is_empty(), "{:?}", rebuilt.delete);
    assert_eq!(
        phases(&rebuilt),
        [
            pair("signing-1", "Active"),
            pair("signing-2", "ValidationOnly")
        ]
    );
    assert_eq!(status(&rebuilt)["auth"]["authHash"], hash.as_str());
    assert_eq!(status(&rebuilt)["auth"]["signingKeyGeneration"], 2);
    assert!(
        rebuilt
            .events
            .iter()
            .any(|e| e.reason == "SigningKeyRingRebuilt")
    );
    for n in [1, 2] {
        let name = format!("fb-auth-signing-{n}");
        assert!(
            applied(&rebuilt, "Certificate", &name).is_some(),
            "{name} kept"
        );
    }

    // No engine: nothing signs, the newest issued key becomes Active.
    let alone = keys(json!({})).plan();
    assert!(alone.delete.is_empty());
    assert_eq!(
        phases(&alone),
        [
            pair("signing-1", "ValidationOnly"),
            pair("signing-2", "Active")
        ]
    );

    // Engines that disagree: parked and reported, every key kept.
    let parked = keys(json!({}))
        .related("engines", engine("a", &hash, ""))
        .related("engines", engine("b", "other", ""))
        .plan();
    assert!(parked.delete.is_empty(), "{:?}", parked.delete);
    assert_eq!(
        condition(&parked, "AuthReady"),
        ("False", "SigningKeyRingLost")
    );
    assert!(
        status(&parked)
            .get("auth")
            .is_none_or(|a| a.get("authHash").is_none()),
        "engines wait"
    );
}

// ---- engine TLS ----

fn engine_tls() -> Value {
    json!({"tls": {"engine": {"enabled": true, "certManager": {"issuerRef": {"name": "ca"}}}}})
}

#[test]
fn engine_tls_waits_for_its_anchor_and_is_rolled_up() {
    let p = Case::new(engine_tls(), json!({})).plan();
    assert_eq!(condition(&p, "EngineTLSReady"), ("False", "SecretPending"));
    assert_eq!(condition(&p, "Ready"), ("False", "SecretPending"));
    assert!(
        status(&p).get("engineTLS").is_none(),
        "engines do not roll yet"
    );
    let cert = applied(&p, "Certificate", "fb-engine-tls").unwrap();
    assert_eq!(cert["spec"]["dnsNames"], json!(["*.ns.svc.cluster.local"]));
    assert_eq!(cert["spec"]["privateKey"]["rotationPolicy"], "Always");
}

fn engine_tls_secret(engine: &str, g: i64, ca: &str) -> Value {
    let mut s = issued(&format!("{engine}-g{g}-engine-tls"), "engine-tls", ca);
    s["metadata"]["labels"]["firebolt.io/engine"] = json!(engine);
    s["metadata"]["labels"]["firebolt.io/generation"] = json!(g.to_string());
    s
}

#[test]
fn the_gateway_re_encrypts_only_once_every_engine_serves_tls() {
    let case =
        || Case::new(engine_tls(), json!({})).owned(issued("fb-engine-tls", "engine-tls", CA));
    let first = case().plan();
    let tls_hash = status(&first)["engineTLS"]["tlsHash"]
        .as_str()
        .unwrap()
        .to_owned();

    let converging = case()
        .related("engines", engine("a", "", &tls_hash))
        .related("engines", engine("b", "", ""))
        .plan();
    let s = &status(&converging)["engineTLS"];
    assert_eq!(s["secretName"], "fb-engine-tls");
    assert_eq!(s["reencrypting"], false);
    assert_eq!(
        condition(&converging, "EngineTLSReady"),
        ("False", "Converging")
    );
    assert!(envoy(&converging)["static_resources"]["clusters"][0]["transport_socket"].is_null());

    let converged = case()
        .related("engines", engine("a", "", &tls_hash))
        .related("engines", engine("b", "", &tls_hash))
        .related("engine-tls-secrets", engine_tls_secret("a", 3, CA2))
        .plan();
    assert_eq!(status(&converged)["engineTLS"]["reencrypting"], true);
    assert_eq!(condition(&converged, "EngineTLSReady"), ("True", "Ready"));
    let up = &envoy(&converged)["static_resources"]["clusters"][0]["transport_socket"];
    assert_eq!(
        up["typed_config"]["common_tls_context"]["validation_context"]["trusted_ca"]["filename"],
        "/etc/envoy/engine-ca/ca.crt"
    );
    // The bundle is the union of the anchor's CA and every live generation's.
    let bundle = applied(&converged, "Secret", "fb-engine-ca-bundle").unwrap();
    let mut fps = [CA_FP, CA2_FP];
    fps.sort_unstable();
    assert_eq!(
        bundle["metadata"]["annotations"]["firebolt.io/engine-trust-cas"],
        fps.join(",")
    );
    let gw = applied(&converged, "Deployment", "fb-gateway").unwrap();
    assert_eq!(
        gw["spec"]["template"]["metadata"]["annotations"]["firebolt.io/engine-trust-cas"],
        fps.join(",")
    );
    let volumes = gw["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap();
    assert!(
        volumes
            .iter()
            .any(|v| v["secret"]["secretName"] == "fb-engine-ca-bundle")
    );
}

#[test]
fn rolled_trust_is_what_every_gateway_pod_trusts() {
    let case = |rolled: bool| {
        let status = json!({"engineTLS": {"secretName": "fb-engine-tls", "createdAt": NOW,
                                          "reencrypting": true},
                            "rolledEngineTrustCAs": [CA_FP]});
        let mut gw = owned(
            "Deployment",
            "fb-gateway",
            "gateway",
            json!({"spec": {"replicas": 2, "template": {"metadata": {"annotations": {
                       "firebolt.io/engine-trust-cas": format!("{CA2_FP},{CA_FP}")}}}},
                   "status": {"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2,
                              "availableReplicas": 2}}),
        );
        gw["metadata"]["generation"] = json!(1);
        if !rolled {
            gw["status"]["replicas"] = json!(3);
        }
        Case::new(engine_tls(), status)
            .owned(issued("fb-engine-tls", "engine-tls", CA))
            .owned(gw)
            .plan()
    };
    let mut both = vec![CA_FP, CA2_FP];
    both.sort_unstable();
    assert_eq!(status(&case(true))["rolledEngineTrustCAs"], json!(both));
    assert_eq!(
        status(&case(false))["rolledEngineTrustCAs"],
        json!([CA_FP]),
        "mid-roll: only what old and new pods both trust"
    );
}

#[test]
fn disabling_engine_tls_keeps_re_encrypting_until_every_engine_is_plaintext() {
    let was = json!({"engineTLS": {"secretName": "fb-engine-tls", "createdAt": NOW,
                                   "reencrypting": true, "tlsHash": "t"}});
    let case = |b_hash: &str| {
        Case::new(json!({}), was.clone())
            .owned(issued("fb-engine-tls", "engine-tls", CA))
            .owned(owned(
                "Certificate",
                "fb-engine-tls",
                "engine-tls",
                json!({}),
            ))
            .related("engines", engine("a", "", ""))
            .related("engines", engine("b", "", b_hash))
            .plan()
    };
    let draining = case("t");
    assert_eq!(status(&draining)["engineTLS"]["reencrypting"], true);
    assert_eq!(
        condition(&draining, "EngineTLSReady"),
        ("False", "Converging")
    );
    assert!(!envoy(&draining)["static_resources"]["clusters"][0]["transport_socket"].is_null());
    assert!(draining.delete.is_empty(), "the anchor stays");

    let done = case("");
    assert!(status(&done).get("engineTLS").is_none());
    assert_eq!(condition(&done, "EngineTLSReady"), ("True", "Disabled"));
    assert!(envoy(&done)["static_resources"]["clusters"][0]["transport_socket"].is_null());
    assert!(done.delete.iter().any(|d| d.target.kind == "Certificate"));
}

#[test]
fn an_engine_tls_failure_keeps_the_gateway_upstream_posture() {
    let spec = json!({"tls": {"engine": {"enabled": true, "certManager": {"issuerRef": {"name": "ca"}},
                                         "crlSecretRef": {"name": "engine-crl"}}}});
    let crl = json!({"apiVersion": "v1", "kind": "Secret",
                     "metadata": {"name": "engine-crl", "namespace": "ns", "resourceVersion": "31"},
                     "data": {"crl.pem": encode(b"a list")}});
    let first = Case::new(spec.clone(), json!({}))
        .owned(issued("fb-engine-tls", "engine-tls", CA))
        .plan();
    let tls_hash = status(&first)["engineTLS"]["tlsHash"]
        .as_str()
        .unwrap()
        .to_owned();
    let was = json!({"engineTLS": {"secretName": "fb-engine-tls", "createdAt": NOW,
                                   "reencrypting": true, "tlsHash": tls_hash}});
    let converged = |spec: Value, anchor: Value, bundle: Option<&Value>, gw: Option<&Value>| {
        let mut case = Case::new(spec, was.clone())
            .owned(anchor)
            .related("engines", engine("a", "", &tls_hash))
            .related("engine-tls-secrets", engine_tls_secret("a", 3, CA2))
            .related("engine-tls-crl", crl.clone());
        for o in bundle.into_iter().chain(gw) {
            let mut o = o.clone();
            o["metadata"]["uid"] =
                json!(format!("uid-{}", o["metadata"]["name"].as_str().unwrap()));
            o["metadata"]["resourceVersion"] = json!("9");
            case = case.owned(o);
        }
        case.plan()
    };
    let healthy = converged(
        spec.clone(),
        issued("fb-engine-tls", "engine-tls", CA),
        None,
        None,
    );
    assert_eq!(condition(&healthy, "EngineTLSReady"), ("True", "Ready"));
    let bundle = applied(&healthy, "Secret", "fb-engine-ca-bundle")
        .unwrap()
        .clone();
    let mut gateway = applied(&healthy, "Deployment", "fb-gateway")
        .unwrap()
        .clone();
    gateway["status"] = json!({"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2,
                               "availableReplicas": 2});
    gateway["metadata"]["generation"] = json!(1);
    let posture = |p: &Plan| {
        let d = applied(p, "Deployment", "fb-gateway").unwrap();
        let t = &d["spec"]["template"];
        (
            t["metadata"]["annotations"].clone(),
            t["spec"]["volumes"].clone(),
            envoy(p)["static_resources"]["clusters"][0]["transport_socket"].clone(),
        )
    };
    let before = posture(&healthy);
    assert!(!before.2.is_null(), "re-encrypting");

    // The anchor Secret loses its keys.
    let emptied = owned(
        "Secret",
        "fb-engine-tls",
        "engine-tls",
        json!({"type": "kubernetes.io/tls", "data": {}}),
    );
    let lost = converged(spec.clone(), emptied, Some(&bundle), Some(&gateway));
    assert_eq!(
        condition(&lost, "EngineTLSReady"),
        ("False", "SecretPending")
    );
    assert_eq!(
        posture(&lost),
        before,
        "hash, trust and CRL mount as they were"
    );
    assert_eq!(status(&lost)["engineTLS"], was["engineTLS"]);
    assert!(lost.delete.is_empty(), "{:?}", lost.delete);

    // spec.tls.engine becomes invalid (certManager and secretRef both).
    let mut invalid = spec.clone();
    invalid["tls"]["engine"]["secretRef"] = json!({"name": "mine"});
    let refused = converged(
        invalid,
        issued("fb-engine-tls", "engine-tls", CA),
        Some(&bundle),
        Some(&gateway),
    );
    assert_eq!(
        condition(&refused, "EngineTLSReady"),
        ("False", "TLSSpecInvalid")
    );
    assert_eq!(posture(&refused), before);
    assert_eq!(status(&refused)["engineTLS"], was["engineTLS"]);
}

// ---- gateway TLS ----

fn gateway_tls(client_ca: bool) -> Value {
    let mut g = json!({"enabled": true, "certManager": {"issuerRef": {"name": "ca"}},
                       "dnsNames": ["fb.example.com"]});
    if client_ca {
        g["clientCASecretRef"] = json!({"name": "client-ca"});
    }
    json!({"tls": {"gateway": g}})
}

fn gateway_running(listener: &str, rolled: bool) -> Value {
    let mut d = owned(
        "Deployment",
        "fb-gateway",
        "gateway",
        json!({"spec": {"replicas": 2, "template": {"metadata": {"annotations": {
                   "firebolt.io/client-listener": listener}}}},
               "status": {"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2,
                          "availableReplicas": 2}}),
    );
    d["metadata"]["generation"] = json!(if rolled { 1 } else { 2 });
    d
}

fn client_ca(ca: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "client-ca", "namespace": "ns"},
           "data": {"ca.crt": encode(ca.as_bytes())}})
}

fn listener_names(p: &Plan) -> Vec<String> {
    envoy(p)["static_resources"]["listeners"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["name"].as_str().unwrap().to_owned())
        .collect()
}

fn strategy(p: &Plan) -> &Value {
    &applied(p, "Deployment", "fb-gateway").unwrap()["spec"]["strategy"]
}

#[test]
fn tightening_to_tls_closes_and_drains_before_any_secure_pod() {
    let serving = issued("fb-gateway-tls", "gateway-tls", CA);
    // Plaintext pods run; the certificate is issued.
    let p = Case::new(gateway_tls(false), json!({}))
        .owned(serving.clone())
        .owned(gateway_running("plaintext", true))
        .plan();
    assert_eq!(
        condition(&p, "GatewayTLSReady"),
        ("False", "FailClosedStaging")
    );
    assert_eq!(condition(&p, "GatewayReady"), ("False", "FailedClosed"));
    assert_eq!(listener_names(&p), ["metrics"]);
    assert!(status(&p).get("gatewayTLS").is_none());
    assert_eq!(strategy(&p)["rollingUpdate"]["maxUnavailable"], "100%");
    assert_eq!(strategy(&p)["rollingUpdate"]["maxSurge"], 0);
    let cert = applied(&p, "Certificate", "fb-gateway-tls").unwrap();
    assert_eq!(
        cert["spec"]["dnsNames"],
        json!([
            "fb-gateway",
            "fb-gateway.ns",
            "fb-gateway.ns.svc",
            "fb-gateway.ns.svc.cluster.local",
            "fb.example.com"
        ])
    );
    // Closed pods still rolling out: stay closed.
    let p = Case::new(gateway_tls(false), json!({}))
        .owned(serving.clone())
        .owned(gateway_running("closed", false))
        .plan();
    assert_eq!(listener_names(&p), ["metrics"]);
    // Only closed pods left: serve TLS.
    let p = Case::new(gateway_tls(false), json!({}))
        .owned(serving)
        .owned(gateway_running("closed", true))
        .plan();
    assert_eq!(condition(&p, "GatewayTLSReady"), ("True", "Ready"));
    assert_eq!(listener_names(&p), ["queries", "metrics"]);
    assert_eq!(status(&p)["gatewayTLS"]["mode"], "TLS");
    assert_eq!(status(&p)["gatewayTLS"]["secretName"], "fb-gateway-tls");
    let tmpl = &applied(&p, "Deployment", "fb-gateway").unwrap()["spec"]["template"];
    assert_eq!(
        tmpl["metadata"]["annotations"]["firebolt.io/client-listener"],
        "tls"
    );
    // Probes stay on the plaintext metrics port.
    assert_eq!(
        tmpl["spec"]["containers"][0]["readinessProbe"]["httpGet"]["port"],
        "metrics"
    );
}

#[test]
fn loosening_and_steady_state_skip_staging_and_a_ca_swap_tightens() {
    let serving = issued("fb-gateway-tls", "gateway-tls", CA);
    // The client CA fingerprint is the SHA-256 of its ca.crt file.
    let ca_file_fp = crate::pem::fingerprint(CA.as_bytes());
    let mutual = json!({"gatewayTLS": {"secretName": "fb-gateway-tls", "createdAt": NOW,
                                       "mode": "MutualTLS", "clientCAFingerprint": ca_file_fp}});
    // mTLS -> TLS: loosening, immediate.
    let p = Case::new(gateway_tls(false), mutual.clone())
        .owned(serving.clone())
        .owned(gateway_running("mtls", true))
        .plan();
    assert_eq!(listener_names(&p), ["queries", "metrics"]);
    assert!(strategy(&p).is_null());
    assert_eq!(status(&p)["gatewayTLS"]["mode"], "TLS");
    // Same CA: steady.
    let p = Case::new(gateway_tls(true), mutual.clone())
        .owned(serving.clone())
        .owned(gateway_running("mtls", true))
        .related("gateway-client-ca", client_ca(CA))
        .plan();
    assert_eq!(listener_names(&p), ["queries", "metrics"]);
    assert_eq!(
        status(&p)["gatewayTLS"]["clientCAFingerprint"],
        ca_file_fp.as_str()
    );
    // A different client CA: tightening, closed first.
    let p = Case::new(gateway_tls(true), mutual)
        .owned(serving)
        .owned(gateway_running("mtls", true))
        .related("gateway-client-ca", client_ca(CA2))
        .plan();
    assert_eq!(listener_names(&p), ["metrics"]);
    assert!(status(&p).get("gatewayTLS").is_none());
    // Disabling TLS: plaintext at once.
    let p = Case::new(
        json!({}),
        json!({"gatewayTLS": {"secretName": "fb-gateway-tls",
                                                       "createdAt": NOW, "mode": "TLS"}}),
    )
    .owned(gateway_running("tls", true))
    .plan();
    assert_eq!(listener_names(&p), ["queries", "metrics"]);
    assert_eq!(condition(&p, "GatewayTLSReady"), ("True", "Disabled"));
}

#[test]
fn a_missing_client_ca_keeps_the_gateway_closed() {
    let p = Case::new(gateway_tls(true), json!({}))
        .owned(issued("fb-gateway-tls", "gateway-tls", CA))
        .plan();
    assert_eq!(condition(&p, "GatewayTLSReady"), ("False", "SecretPending"));
    assert_eq!(listener_names(&p), ["metrics"]);
}
