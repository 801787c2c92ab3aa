//! Golden plans: the built `fleet.wasm` run by the real host over the
//! fixtures in `tests/golden/`, compared with the checked-in `*.plan.json`.
//! `WASMOP_BLESS=1` rewrites the expectations (read them before
//! committing).
//!
//! The component is `$WASMOP_PLUGIN_DIR/fleet.wasm`, by default
//! `<repo>/target/plugins/fleet.wasm`; build it with
//! `bash tests/build-plugins.sh`.

#![cfg(not(target_arch = "wasm32"))]

use std::path::{Path, PathBuf};

/// One fixture per profile and per mutation.
const FIXTURES: [&str; 43] = [
    "application-converged",
    "application-converging",
    "application-mixed",
    "application-unknown",
    "bucket-first-workload",
    "bucket-reserve",
    "bucket-settled",
    "deletion-claims",
    "deletion-complete",
    "deletion-compute",
    "mutation-env",
    "mutation-fixed-field",
    "mutation-layout",
    "mutation-paused",
    "mutation-reserved-env",
    "mutation-restart-token",
    "mutation-scale-in",
    "mutation-scale-out",
    "mutation-telemetry-export",
    "ordered-first-workload",
    "persistent-first-workload",
    "persistent-lost-claim",
    "persistent-member-down",
    "preview-created",
    "preview-expired",
    "preview-expired-gone",
    "preview-parent-missing",
    "preview-parent-without-previews",
    "preview-prefix-held",
    "preview-seed-unavailable",
    "preview-seeded",
    "previews-child-foreign-pool",
    "previews-child-prefix-held",
    "previews-child-reserves-prefix",
    "previews-pool-reserves",
    "recreated-same-name",
    "routing-gateway-accepted",
    "routing-gateway-unavailable",
    "routing-ingress-added",
    "routing-preflight-failed",
    "routing-removed",
    "routing-removed-policy",
    "routing-switch-deletes-ingress",
];

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

#[test]
fn golden_plans_match_the_component() {
    let report = wasmop::reconcile::golden::check_plugin("fleet", &golden_dir())
        .unwrap_or_else(|e| panic!("{}", e.chain()));
    assert_eq!(
        report.fixture_names(),
        FIXTURES,
        "every fixture the issue asks for was checked"
    );
}
