//! The plugin runtime against the real test plugins (`tests/plugins/*`),
//! built by `tests/build-plugins.sh` into `target/plugins` (or
//! `$WASMOP_PLUGIN_DIR`). A missing plugin fails the test; nothing here is
//! skipped.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use wasmop::plugin::OutputProblem;
use wasmop::reconcile::decide::Decision;
use wasmop::reconcile::offline;
use wasmop::reconcile::validate::Rule;
use wasmop::{
    CallError, CompileCache, Limits, LoadError, LoadOptions, LoadedPlugin, MemorySource, Sandbox,
    SandboxConfig, build_snapshot, validate,
};

fn plugin_dir() -> PathBuf {
    match std::env::var_os("WASMOP_PLUGIN_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/plugins"),
    }
}

fn plugin_path(name: &str) -> PathBuf {
    let path = plugin_dir().join(format!("{name}.wasm"));
    assert!(
        path.is_file(),
        "test plugin {} is missing: run `bash tests/build-plugins.sh` first \
         (or point WASMOP_PLUGIN_DIR at the built plugins)",
        path.display()
    );
    path
}

fn sandbox() -> Arc<Sandbox> {
    static SANDBOX: OnceLock<Arc<Sandbox>> = OnceLock::new();
    SANDBOX
        .get_or_init(|| Sandbox::new(SandboxConfig::default()).expect("sandbox"))
        .clone()
}

/// A directory private to one test, emptied first, under Cargo's
/// per-target scratch space (so runs do not pile up in the system's temp).
fn scratch_dir(test: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("runtime-{test}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// Shared by tests that do not look at the cache, so each plugin compiles once.
fn shared_cache() -> CompileCache {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    CompileCache::new(DIR.get_or_init(|| scratch_dir("shared")).clone())
}

fn options(limits: Limits) -> LoadOptions {
    LoadOptions {
        settings: json!({}),
        limits,
        cache: Some(shared_cache()),
    }
}

fn load(name: &str, limits: Limits) -> LoadedPlugin {
    // One load at a time, so each plugin compiles once and later loads
    // (in other tests) come from the shared compile cache.
    static LOADING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = LOADING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    LoadedPlugin::load(&sandbox(), &plugin_path(name), &options(limits))
        .unwrap_or_else(|e| panic!("{name} loads: {e}"))
}

fn primary(kind: &str, spec: Value) -> Value {
    json!({"apiVersion": "test.wasmop.dev/v1", "kind": kind,
           "metadata": {"name": "w", "namespace": "ns", "uid": "uid-w", "generation": 1},
           "spec": spec})
}

fn reconcile(
    plugin: &LoadedPlugin,
    primary: Value,
    others: Vec<Value>,
) -> Result<wasmop::Plan, CallError> {
    let controller = &plugin.manifest().controllers[0];
    let primary = Arc::new(primary);
    let mut objects = others;
    objects.push((*primary).clone());
    let source = MemorySource::new(objects);
    let snapshot = build_snapshot(
        controller,
        primary,
        &source,
        "2025-01-01T00:00:00Z",
        plugin.settings(),
        vec![],
    );
    plugin.reconcile(&snapshot)
}

#[test]
fn good_plugin_returns_a_valid_plan() {
    let plugin = load("good", Limits::default());
    assert_eq!(plugin.name(), "good");
    assert!(plugin.digest().starts_with("sha256:"));
    let p = primary("Widget", json!({"value": "hello"}));
    let plan = reconcile(&plugin, p.clone(), vec![]).expect("good plans");
    assert_eq!(plan.apply.len(), 1);
    assert_eq!(plan.apply[0].object["metadata"]["name"], "w-cm");
    assert_eq!(plan.apply[0].object["data"]["value"], "hello");
    assert_eq!(plan.status.as_ref().expect("status")["value"], "hello");
    let source = MemorySource::new(vec![p.clone()]);
    validate(&plan, &plugin.manifest().controllers[0], &p, &source).expect("valid plan");
}

#[test]
fn good_plugin_plans_are_deterministic() {
    let plugin = load("good", Limits::default());
    let p = primary("Widget", json!({"value": "x"}));
    let a = reconcile(&plugin, p.clone(), vec![]).expect("plan");
    let b = reconcile(&plugin, p, vec![]).expect("plan");
    assert_eq!(a, b);
}

#[test]
fn settings_reach_the_plugin_and_bad_settings_reject_the_load() {
    let sandbox = sandbox();
    let path = plugin_path("good");
    let mut opts = options(Limits::default());
    opts.settings = json!({"label": "custom"});
    let plugin = LoadedPlugin::load(&sandbox, &path, &opts).expect("loads with settings");
    let plan = reconcile(&plugin, primary("Widget", json!({})), vec![]).expect("plan");
    assert_eq!(
        plan.apply[0].object["metadata"]["labels"]["test.wasmop.dev/version"],
        "custom"
    );

    opts.settings = json!({"colour": "blue"});
    let err = LoadedPlugin::load(&sandbox, &path, &opts).expect_err("unknown setting rejected");
    assert!(matches!(err, LoadError::InvalidSettings { .. }), "{err}");
    assert!(err.to_string().contains("colour"), "{err}");
}

#[test]
fn looper_times_out_within_its_deadline() {
    let deadline = Duration::from_millis(300);
    let plugin = load(
        "looper",
        Limits {
            deadline,
            ..Limits::default()
        },
    );
    let started = Instant::now();
    let err = reconcile(&plugin, primary("Looper", json!({})), vec![]).expect_err("times out");
    let elapsed = started.elapsed();
    assert!(matches!(err, CallError::Timeout { .. }), "{err}");
    assert_eq!(err.reason(), "PluginTimedOut");
    assert!(elapsed >= deadline, "interrupted early: {elapsed:?}");
    assert!(
        elapsed < deadline + Duration::from_secs(1),
        "interrupted late: {elapsed:?}"
    );
}

#[test]
fn hog_hits_its_memory_cap() {
    let plugin = load(
        "hog",
        Limits {
            memory_bytes: 32 << 20,
            ..Limits::default()
        },
    );
    let err = reconcile(&plugin, primary("Hog", json!({})), vec![]).expect_err("runs out");
    assert!(
        matches!(err, CallError::OutOfMemory { cap_bytes } if cap_bytes == 32 << 20),
        "{err}"
    );
    assert_eq!(err.reason(), "PluginOutOfMemory");
}

#[test]
fn panicker_traps_with_its_panic_message() {
    let plugin = load("panicker", Limits::default());
    let err = reconcile(&plugin, primary("Panicker", json!({})), vec![]).expect_err("panics");
    let CallError::Trap { message } = &err else {
        panic!("expected a trap, got {err}");
    };
    assert!(message.contains("deliberate panic"), "{message}");
    assert!(!message.contains('\n'), "{message}");
    assert_eq!(err.reason(), "PluginTrapped");
}

#[test]
fn a_trapped_call_leaves_the_plugin_usable() {
    let panicker = load("panicker", Limits::default());
    let good = load("good", Limits::default());
    for _ in 0..3 {
        assert!(reconcile(&panicker, primary("Panicker", json!({})), vec![]).is_err());
        reconcile(&good, primary("Widget", json!({})), vec![]).expect("good still plans");
    }
}

#[test]
fn malformed_output_is_reported() {
    let plugin = load("malformed", Limits::default());
    let err = reconcile(&plugin, primary("Malformed", json!({})), vec![]).expect_err("malformed");
    assert!(matches!(err, CallError::MalformedOutput(_)), "{err}");
    assert_eq!(err.reason(), "PluginOutputMalformed");
    if let CallError::MalformedOutput(problem) = &err {
        assert!(
            matches!(
                problem,
                OutputProblem::NotJson { .. }
                    | OutputProblem::NotAnObject { .. }
                    | OutputProblem::MissingIdentity { .. }
            ),
            "{problem}"
        );
    }
}

#[test]
fn bad_writer_plan_violates_ownership_naming_the_secret() {
    let plugin = load("bad-writer", Limits::default());
    let p = primary("BadWriter", json!({}));
    let plan = reconcile(&plugin, p.clone(), vec![]).expect("plans");
    let source = MemorySource::new(vec![p.clone()]);
    let violations = validate(&plan, &plugin.manifest().controllers[0], &p, &source)
        .expect_err("the Secret is not owned");
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert_eq!(violations[0].rule, Rule::KindNotOwned);
    assert!(
        violations[0].to_string().starts_with("Secret ns/w-secret:"),
        "{}",
        violations[0]
    );
}

#[test]
fn bad_deleter_cannot_delete_another_owners_object() {
    let plugin = load("bad-deleter", Limits::default());
    let p = primary(
        "BadDeleter",
        json!({"victim": "theirs", "victimUid": "u-9", "victimResourceVersion": "3"}),
    );
    let victim = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "theirs", "namespace": "ns", "uid": "u-9", "resourceVersion": "3",
                     "ownerReferences": [{"uid": "someone-else", "controller": true}]}});
    let plan = reconcile(&plugin, p.clone(), vec![victim.clone()]).expect("plans");
    let source = MemorySource::new(vec![p.clone(), victim]);
    let violations = validate(&plan, &plugin.manifest().controllers[0], &p, &source)
        .expect_err("not ours to delete");
    assert_eq!(
        violations[0].rule,
        Rule::NotControlledByPrimary,
        "{violations:?}"
    );
}

#[test]
fn a_truncated_component_is_a_load_error() {
    let bytes = std::fs::read(plugin_path("good")).expect("read good.wasm");
    let dir = scratch_dir("truncated");
    let truncated = dir.join("truncated.wasm");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).expect("write");
    let err = LoadedPlugin::load(&sandbox(), &truncated, &options(Limits::default()))
        .expect_err("truncated file rejected");
    assert!(matches!(err, LoadError::Compile { .. }), "{err}");
    assert!(!err.to_string().contains('\n'), "{err}");
}

#[test]
fn a_missing_file_is_a_read_error() {
    let err = LoadedPlugin::load(
        &sandbox(),
        Path::new("no/such/plugin.wasm"),
        &options(Limits::default()),
    )
    .expect_err("missing");
    assert!(matches!(err, LoadError::Read { .. }), "{err}");
}

#[test]
fn the_compile_cache_is_hit_on_the_second_load() {
    let dir = scratch_dir("cache");
    let opts = LoadOptions {
        settings: json!({}),
        limits: Limits::default(),
        cache: Some(CompileCache::new(&dir)),
    };
    let first = LoadedPlugin::load(&sandbox(), &plugin_path("good"), &opts).expect("first load");
    assert!(!first.compiled_from_cache());
    let artifact = CompileCache::new(&dir).path_for(sandbox().engine(), first.digest());
    assert!(artifact.is_file(), "{} was not written", artifact.display());
    let second = LoadedPlugin::load(&sandbox(), &plugin_path("good"), &opts).expect("second load");
    assert!(second.compiled_from_cache());
    assert_eq!(first.digest(), second.digest());
    reconcile(&second, primary("Widget", json!({})), vec![]).expect("cached plugin plans");

    // A corrupt artifact is discarded and the plugin compiled again. The
    // artifact is mapped into memory while a plugin loaded from it lives,
    // so it is replaced by rename, never rewritten in place (as the cache
    // itself does).
    drop((first, second));
    let corrupt = dir.join("corrupt.tmp");
    std::fs::write(&corrupt, b"not a compiled component").expect("corrupt");
    std::fs::rename(&corrupt, &artifact).expect("replace");
    let third = LoadedPlugin::load(&sandbox(), &plugin_path("good"), &opts).expect("third load");
    assert!(!third.compiled_from_cache());
}

#[test]
fn calls_run_concurrently_from_many_threads() {
    let plugin = Arc::new(load("good", Limits::default()));
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let plugin = Arc::clone(&plugin);
            std::thread::spawn(move || {
                let plan = reconcile(
                    &plugin,
                    primary("Widget", json!({"value": format!("v{i}")})),
                    vec![],
                )
                .expect("plan");
                assert_eq!(plan.apply[0].object["data"]["value"], format!("v{i}"));
            })
        })
        .collect();
    for t in threads {
        t.join().expect("thread");
    }
}

#[test]
fn offline_run_picks_the_primary_and_reports_violations() {
    let plugin = load("bad-writer", Limits::default());
    let input = offline::parse_input(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: first}\n---\n\
         apiVersion: test.wasmop.dev/v1\nkind: BadWriter\nmetadata: {name: b, namespace: ns}\n",
        "inline.yaml",
    )
    .expect("input");
    let run = offline::run(&plugin, &input, Some("2025-01-01T00:00:00Z"), None).expect("runs");
    assert_eq!(run.controller, "badwriter");
    assert_eq!(wasmop::object::uid(&run.primary), offline::PRIMARY_UID);
    let Decision::Rejected { violations, .. } = &run.decision else {
        panic!("expected violations, got {:?}", run.decision);
    };
    assert_eq!(
        violations[0].to_string(),
        "Secret ns/b-secret: kind Secret (v1) is not owned by controller badwriter"
    );
}

#[test]
fn golden_plans_of_the_good_plugin() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/good");
    let report = wasmop::reconcile::golden::check(&plugin_path("good"), &fixtures)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        report.matched.len() + report.blessed.len() >= 3,
        "{report:?}"
    );
}

#[test]
fn golden_plans_record_rejected_plans() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/bad-writer");
    let report = wasmop::reconcile::golden::check(&plugin_path("bad-writer"), &fixtures)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(report.matched.len() + report.blessed.len(), 1, "{report:?}");
    let expected =
        std::fs::read_to_string(fixtures.join("unowned-secret.plan.json")).expect("expected plan");
    assert!(expected.contains("\"KindNotOwned\""), "{expected}");
}

#[test]
fn golden_plans_cover_observations_on_both_sides() {
    // Requests declared by the plan and results handed in by the host, in
    // the same fixture format `wasmop plan` reads.
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/observer");
    let report = wasmop::reconcile::golden::check(&plugin_path("observer"), &fixtures)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(report.matched.len() + report.blessed.len(), 3, "{report:?}");
    let probe = std::fs::read_to_string(fixtures.join("probe.plan.json")).expect("expected plan");
    assert!(
        probe.contains("\"httpRequests\"") && probe.contains("/state"),
        "{probe}"
    );
    let observed =
        std::fs::read_to_string(fixtures.join("observed.plan.json")).expect("expected plan");
    assert!(observed.contains("members"), "{observed}");
}
