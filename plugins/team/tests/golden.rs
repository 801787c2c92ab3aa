//! Golden plans: the built `team.wasm` over the fixtures in `tests/golden/`,
//! through the host's offline path (snapshot selection, plugin call, plan
//! validation), compared with the checked-in `*.plan.json`. Bless with
//! `WASMOP_BLESS=1`.
#![cfg(not(target_arch = "wasm32"))]

use std::path::Path;

#[test]
fn golden_plans_match_the_built_component() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let report = match wasmop::reconcile::golden::check_plugin("team", &dir) {
        Ok(report) => report,
        Err(e) => panic!("{}", e.chain()),
    };
    let mut fixtures: Vec<String> = std::fs::read_dir(&dir)
        .expect("fixture dir")
        .filter_map(Result::ok)
        .filter_map(|e| {
            let p = e.path();
            (p.extension().is_some_and(|x| x == "yaml"))
                .then(|| p.file_stem()?.to_str().map(str::to_owned))
                .flatten()
        })
        .collect();
    fixtures.sort();
    assert_eq!(report.fixture_names(), fixtures, "every fixture is checked");
}

/// The keys the fixtures' servers hand out (`tdk_CANARY…`) reach only
/// Secret `data`, base64-encoded: never a status, an Event or a request.
#[test]
fn canary_keys_never_appear_in_plain_text_in_any_plan() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir)
        .expect("fixture dir")
        .filter_map(Result::ok)
    {
        let path = entry.path();
        if !path.to_string_lossy().ends_with(".plan.json") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("plan");
        assert!(!text.contains("CANARY"), "{} leaks a key", path.display());
        checked += 1;
    }
    assert!(checked >= 30, "only {checked} plans checked");
}
