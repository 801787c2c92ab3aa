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

const FIXTURES: [&str; 9] = [
    "class-merge",
    "cleaning",
    "draining",
    "first-creation",
    "instance-without-metadata-endpoint",
    "missing-instance",
    "replica-change-mid-switch",
    "steady-state",
    "stopped-missing-configmap",
];

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

fn plugin() -> PathBuf {
    let dir = std::env::var_os("WASMOP_PLUGIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/plugins"));
    let path = dir.join("engine.wasm");
    assert!(
        path.is_file(),
        "{} does not exist: build the plugins with `bash tests/build-plugins.sh` \
         (or set WASMOP_PLUGIN_DIR to where engine.wasm is)",
        path.display()
    );
    path
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[test]
fn golden_plans_match_the_component() {
    let report = wasmop::golden::check(&plugin(), &golden_dir())
        .unwrap_or_else(|e| panic!("{}", error_chain(&e)));
    let mut seen: Vec<String> = report
        .matched
        .iter()
        .chain(&report.blessed)
        .filter_map(|p| p.file_stem()?.to_str().map(str::to_owned))
        .collect();
    seen.sort();
    assert_eq!(
        seen, FIXTURES,
        "every fixture the issue asks for was checked"
    );
}
