//! Golden plans: the built `engine.wasm` run by the real host over the
//! fixtures in `tests/golden/`, compared with the checked-in `*.plan.json`.
//! `WASMOP_BLESS=1` rewrites the expectations (read them before
//! committing).
//!
//! The component is `$WASMOP_PLUGIN_DIR/engine.wasm`, by default
//! `<repo>/target/plugins/engine.wasm`; build it with
//! `bash tests/build-plugins.sh`.

#![cfg(not(target_arch = "wasm32"))]

use std::path::{Path, PathBuf};

const FIXTURES: [&str; 20] = [
    "admission-class-in-use",
    "admission-class-present",
    "admission-missing-class",
    "class-deletion-blocked",
    "class-deletion-released",
    "class-merge",
    "cleaning",
    "cleaning-reports-hashes",
    "draining",
    "first-creation",
    "hand-edited-pod-template",
    "hand-scaled-statefulset",
    "instance-without-metadata-endpoint",
    "missing-instance",
    "replica-change-mid-switch",
    "steady-state",
    "stopped-missing-configmap",
    "stuck-generation",
    "tls-certificate-pending",
    "tls-trust-pending",
];

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

#[test]
fn golden_plans_match_the_component() {
    let report = wasmop::reconcile::golden::check_plugin("engine", &golden_dir())
        .unwrap_or_else(|e| panic!("{}", e.chain()));
    assert_eq!(
        report.fixture_names(),
        FIXTURES,
        "every fixture the issue asks for was checked"
    );
}
