//! Golden plans: the built `backup.wasm` over the fixtures in
//! `tests/golden/`, through the host's offline path (snapshot selection,
//! plugin call, plan validation), compared with the checked-in
//! `*.plan.json`. Bless with `WASMOP_BLESS=1`.
#![cfg(not(target_arch = "wasm32"))]

use std::path::{Path, PathBuf};

/// `$WASMOP_PLUGIN_DIR/backup.wasm`, else `<repo>/target/plugins/backup.wasm`.
fn plugin_wasm() -> PathBuf {
    let dir = std::env::var_os("WASMOP_PLUGIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/plugins"));
    dir.join("backup.wasm")
}

#[test]
fn golden_plans_match_the_built_component() {
    let wasm = plugin_wasm();
    assert!(
        wasm.is_file(),
        "{} not found: build the plugins first with `bash tests/build-plugins.sh`",
        wasm.display()
    );
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let report = match wasmop::golden::check(&wasm, &dir) {
        Ok(report) => report,
        Err(e) => panic!("{e}"),
    };
    let fixtures = std::fs::read_dir(&dir)
        .expect("fixture dir")
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "yaml"))
        .count();
    assert_eq!(
        report.matched.len() + report.blessed.len(),
        fixtures,
        "every fixture is checked"
    );
}
