//! Golden plans: the built `backup.wasm` over the fixtures in
//! `tests/golden/`, through the host's offline path (snapshot selection,
//! plugin call, plan validation), compared with the checked-in
//! `*.plan.json`. Bless with `WASMOP_BLESS=1`.
#![cfg(not(target_arch = "wasm32"))]

use std::path::Path;

#[test]
fn golden_plans_match_the_built_component() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let report = match wasmop::reconcile::golden::check_plugin("backup", &dir) {
        Ok(report) => report,
        Err(e) => panic!("{}", e.chain()),
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
