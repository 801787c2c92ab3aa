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

const FIXTURES: [&str; 5] = [
    "all-ready",
    "external-postgres-missing-secret",
    "fresh",
    "gateway-change",
    "postgres-ready-metadata-not",
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
