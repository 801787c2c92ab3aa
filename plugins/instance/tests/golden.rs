//! Golden plans: the built `instance.wasm` run by the real host over the
//! fixtures in `tests/golden/`, compared with the checked-in `*.plan.json`.
//! `WASMOP_BLESS=1` rewrites the expectations (read them before
//! committing).
//!
//! The component is `$WASMOP_PLUGIN_DIR/instance.wasm`, by default
//! `<repo>/target/plugins/instance.wasm`; build it with
//! `bash tests/build-plugins.sh`.

#![cfg(not(target_arch = "wasm32"))]

use std::path::{Path, PathBuf};

use serde_json::Value;

const FIXTURES: [&str; 29] = [
    "all-ready",
    "auth-key-pending",
    "auth-preflight-failed",
    "auth-ring-lost",
    "auth-spec-invalid",
    "engine-tls-converging",
    "engine-tls-crl",
    "engine-tls-crl-missing",
    "engine-tls-disabled",
    "engine-tls-disabling",
    "engine-tls-reencrypt",
    "external-postgres-missing-secret",
    "fresh",
    "gateway-change",
    "gateway-tls-crl-missing",
    "gateway-tls-crl-without-client-ca",
    "gateway-tls-loosening",
    "gateway-tls-secure",
    "gateway-tls-staging",
    "postgres-ready-metadata-not",
    "rotation-delete",
    "rotation-mint",
    "rotation-parked-promotion",
    "rotation-parked-retire-anchor",
    "rotation-promote",
    "rotation-remint-outdated-key",
    "rotation-retire",
    "rotation-stamp-retire-anchor",
    "signing-key-replaced",
];

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

#[test]
fn golden_plans_match_the_component() {
    let report = wasmop::reconcile::golden::check_plugin("instance", &golden_dir())
        .unwrap_or_else(|e| panic!("{}", e.chain()));
    assert_eq!(
        report.fixture_names(),
        FIXTURES,
        "every fixture the issue asks for was checked"
    );
}

/// The fixture's objects, in file order.
fn fixture_objects(name: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(golden_dir().join(format!("{name}.yaml"))).unwrap();
    wasmop_sdk::testing::objects_from_yaml(&text)
}

fn expected_plan(name: &str) -> Value {
    let text = std::fs::read_to_string(golden_dir().join(format!("{name}.plan.json"))).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn hash_in(object: &Value) -> &str {
    object["spec"]["template"]["metadata"]["annotations"]["firebolt.io/config-hash"]
        .as_str()
        .unwrap_or_default()
}

/// (kind, name) → config hash of the pod template, for the workloads of
/// a list of objects.
fn hashes<'a>(objects: impl Iterator<Item = &'a Value>) -> Vec<(String, String, String)> {
    let mut out: Vec<(String, String, String)> = objects
        .filter(|o| o["kind"] == "Deployment" || o["kind"] == "StatefulSet")
        .map(|o| {
            (
                o["kind"].as_str().unwrap_or_default().to_owned(),
                o["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                hash_in(o).to_owned(),
            )
        })
        .collect();
    out.sort();
    out
}

fn planned_hashes(plan: &Value) -> Vec<(String, String, String)> {
    hashes(
        plan["apply"]
            .as_array()
            .unwrap()
            .iter()
            .map(|op| &op["object"]),
    )
}

// The two tests below read the expected plans, which the test above proves
// are what the component produces.

#[test]
fn gateway_change_rolls_the_gateway_and_nothing_else() {
    let before = hashes(fixture_objects("gateway-change").iter());
    let after = planned_hashes(&expected_plan("gateway-change"));
    assert_eq!(before.len(), 3, "{before:?}");
    assert_eq!(after.len(), 3, "{after:?}");
    for ((kind, name, old), (_, _, new)) in before.iter().zip(&after) {
        if name.ends_with("-gateway") {
            assert_ne!(old, new, "{kind} {name} must roll");
        } else {
            assert_eq!(old, new, "{kind} {name} must not roll");
        }
    }
}

#[test]
fn a_ready_instance_is_re_applied_without_rolling_anything() {
    let before = hashes(fixture_objects("all-ready").iter());
    let after = planned_hashes(&expected_plan("all-ready"));
    assert_eq!(before.len(), 3);
    assert_eq!(before, after);
}

/// The plan's status, events and applied objects of fixture `name`.
fn plan_parts(name: &str) -> (Value, Vec<Value>, Vec<Value>) {
    let plan = expected_plan(name);
    let status = plan["status"].clone();
    let events = plan["events"].as_array().cloned().unwrap_or_default();
    let objects = plan["apply"]
        .as_array()
        .unwrap()
        .iter()
        .map(|op| op["object"].clone())
        .collect();
    (status, events, objects)
}

fn condition<'a>(status: &'a Value, type_: &str) -> &'a Value {
    status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == type_)
        .unwrap()
}

fn applied<'a>(objects: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
}

fn envoy(objects: &[Value]) -> Value {
    let cm = applied(objects, "ConfigMap", "production-gateway-config").unwrap();
    serde_json::from_str(cm["data"]["envoy.json"].as_str().unwrap()).unwrap()
}

#[test]
fn the_new_security_transitions_say_what_their_fixtures_promise() {
    // An outdated key is replaced; the old Certificate keeps its parameters.
    let (status, events, objects) = plan_parts("rotation-remint-outdated-key");
    let keys = status["auth"]["signingKeys"].as_array().unwrap();
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[1]["phase"], "ValidationOnly");
    assert_eq!(
        (keys[1]["algorithm"].clone(), keys[1]["size"].clone()),
        ("ECDSA".into(), 384.into())
    );
    let old = applied(&objects, "Certificate", "production-auth-signing-1").unwrap();
    assert_eq!(old["spec"]["privateKey"]["size"], 256);
    let new = applied(&objects, "Certificate", "production-auth-signing-2").unwrap();
    assert_eq!(new["spec"]["privateKey"]["size"], 384);
    assert!(events.iter().any(|e| e["reason"] == "SigningKeyRotation"));

    // A replaced key is a Warning and is re-recorded.
    let (status, events, _) = plan_parts("signing-key-replaced");
    let fp = status["auth"]["signingKeys"][0]["observedPublicKeyFingerprint"]
        .as_str()
        .unwrap();
    assert_eq!(fp.len(), 64);
    assert_ne!(fp, "0".repeat(64));
    assert!(
        events
            .iter()
            .any(|e| e["reason"] == "SigningKeyReplaced" && e["type"] == "Warning"),
        "{events:?}"
    );

    // An invalid auth spec fails AuthReady only.
    let (status, _, objects) = plan_parts("auth-spec-invalid");
    let c = condition(&status, "AuthReady");
    assert_eq!(
        (c["status"].as_str(), c["reason"].as_str()),
        (Some("False"), Some("AuthSpecInvalid"))
    );
    assert!(c["message"].as_str().unwrap().contains("RS256"));
    assert_eq!(condition(&status, "Ready")["status"], "True");
    assert!(status["auth"]["authHash"].is_null());
    assert!(objects.iter().all(|o| o["kind"] != "Certificate"));

    // Engine CRL: missing is reported, present is loaded.
    let (status, _, objects) = plan_parts("engine-tls-crl-missing");
    let c = condition(&status, "EngineTLSReady");
    assert_eq!(c["reason"], "CRLSecretPreflightFailed");
    assert_eq!(status["engineTLS"]["reencrypting"], true);
    let up = &envoy(&objects)["static_resources"]["clusters"][0]["transport_socket"];
    assert!(up["typed_config"]["common_tls_context"]["validation_context"]["crl"].is_null());
    let (status, _, objects) = plan_parts("engine-tls-crl");
    assert_eq!(condition(&status, "EngineTLSReady")["reason"], "Ready");
    let up = &envoy(&objects)["static_resources"]["clusters"][0]["transport_socket"];
    assert_eq!(
        up["typed_config"]["common_tls_context"]["validation_context"]["crl"]["filename"],
        "/etc/envoy/engine-crl/crl.pem"
    );
    let gateway = applied(&objects, "Deployment", "production-gateway").unwrap();
    assert!(
        gateway["spec"]["template"]["spec"]["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["secret"]["secretName"] == "engine-crl")
    );

    // Gateway CRL: missing keeps the listener closed; without a client CA
    // the spec is invalid.
    for (fixture, reason) in [
        ("gateway-tls-crl-missing", "CRLSecretPreflightFailed"),
        ("gateway-tls-crl-without-client-ca", "TLSSpecInvalid"),
    ] {
        let (status, _, objects) = plan_parts(fixture);
        assert_eq!(
            condition(&status, "GatewayTLSReady")["reason"],
            reason,
            "{fixture}"
        );
        assert!(status["gatewayTLS"].is_null(), "{fixture}");
        let listeners = envoy(&objects)["static_resources"]["listeners"].clone();
        assert!(
            listeners
                .as_array()
                .unwrap()
                .iter()
                .all(|l| l["name"] != "queries"),
            "{fixture}: the client listener is omitted"
        );
        assert_eq!(
            condition(&status, "MetadataReady")["status"],
            "True",
            "{fixture}"
        );
    }
}
