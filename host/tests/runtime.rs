//! The plugin runtime against the real test plugins (`tests/plugins/*`),
//! built by `tests/build-plugins.sh` into `target/plugins` (or
//! `$WASMOP_PLUGIN_DIR`). A missing plugin fails the test; nothing here is
//! skipped.

mod offline_call;
use offline_call::reconcile_with as reconcile;

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

/// Every plugin built here is linked to start with 2 MiB of linear memory
/// (`.cargo/config.toml`), so that calls with snapshots up to about 64 KB
/// never grow it (BENCHMARKS.md). A build that lost the setting, e.g. to a
/// `RUSTFLAGS` variable, which replaces it, starts at the linker's default
/// of about 1.1 MiB and fails here.
#[test]
fn plugins_start_with_two_mib_of_linear_memory() {
    for name in ["good", "instance", "engine", "backup", "fleet", "team"] {
        let bytes = load(name, Limits::default()).start_memory_bytes();
        // The linear memory, plus the tables at a pointer per element.
        assert!(
            (2 << 20..(2 << 20) + (64 << 10)).contains(&bytes),
            "{name} starts with {bytes} bytes"
        );
    }
}

/// Plugins are built without WASI (tests/build-plugins.sh): each imports
/// only the contract's interfaces, which the host serves from nothing the
/// guest could use to reach the world. The test plugins that exercise WASI
/// are built for wasm32-wasip2 and import it.
#[test]
fn plugins_built_without_wasi_import_only_the_contract() {
    let contract = [
        "wasmop:reconciler/diagnostics@0.4.0",
        "wasmop:reconciler/types@0.4.0",
    ];
    for name in [
        "good", "panicker", "instance", "engine", "backup", "fleet", "team", "admitter",
    ] {
        let plugin = load(name, Limits::default());
        let imports = plugin.imports();
        assert!(
            imports.iter().all(|i| contract.contains(&i.as_str())),
            "{name} imports {imports:?}"
        );
        assert!(
            imports.iter().any(|i| i == contract[0]),
            "{name} reports panics through diagnostics: {imports:?}"
        );
    }
    let sleeper = load("sleeper", Limits::default());
    assert!(
        sleeper
            .imports()
            .iter()
            .any(|i| i.starts_with("wasi:clocks/")),
        "{:?}",
        sleeper.imports()
    );
}

#[test]
fn panicker_traps_with_its_panic_message() {
    let plugin = load("panicker", Limits::default());
    let err = reconcile(&plugin, primary("Panicker", json!({})), vec![]).expect_err("panics");
    let CallError::Trap { message } = &err else {
        panic!("expected a trap, got {err}");
    };
    assert!(message.contains("deliberate panic"), "{message}");
    // Where it panicked, as the SDK's hook reports it.
    assert!(
        message.contains("panicked at tests/plugins/panicker/src/lib.rs:"),
        "{message}"
    );
    assert!(!message.contains('\n'), "{message}");
    assert_eq!(err.reason(), "PluginTrapped");
}

/// A plugin that floods `diagnostics.panic-text` (100,000 calls, each
/// claiming 255 bytes) still ends as a trap with a bounded message, and
/// what it reported is gone by the next call.
#[test]
fn a_flood_of_panic_text_is_bounded_and_ends_with_its_call() {
    // A deadline no debug build of the host comes near: the flood must
    // end as the panic's trap, not as a timeout.
    let plugin = load(
        "panicker",
        Limits {
            deadline: Duration::from_secs(60),
            ..Limits::default()
        },
    );
    let err = reconcile(
        &plugin,
        primary("Panicker", json!({"flood": 100_000})),
        vec![],
    )
    .expect_err("panics");
    let CallError::Trap { message } = &err else {
        panic!("expected a trap, got {err}");
    };
    // The host kept 8 bytes a call at most: the flood's 0xff bytes, shown
    // lossily, fill the message up to its cap, which ends with `…`.
    assert!(message.starts_with('\u{fffd}'), "{message:.80}");
    assert!(message.ends_with('…'), "{message:.80}");
    assert!(message.len() <= 1024 + '…'.len_utf8(), "{}", message.len());
    assert!(!message.contains("deliberate panic"), "{message:.80}");
    // The next call starts with nothing reported.
    let err = reconcile(&plugin, primary("Panicker", json!({})), vec![]).expect_err("panics");
    let CallError::Trap { message } = &err else {
        panic!("expected a trap, got {err}");
    };
    assert!(message.starts_with("panicked at "), "{message}");
    assert!(message.contains("deliberate panic"), "{message}");
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

/// `rememberer` keeps a counter and a list in statics: every call must
/// start from the plugin's initial memory (calls one after another reuse
/// the same pool slots), with its clock at the snapshot's `now`, from one
/// thread or many at once.
#[test]
fn no_call_sees_what_an_earlier_call_left() {
    let check = |plugin: &LoadedPlugin, name: &str| {
        let mut p = primary("Widget", json!({}));
        p["metadata"]["name"] = json!(name);
        let plan = reconcile(plugin, p, vec![]).expect("plan");
        let status = plan.status.expect("status");
        assert_eq!(status["calls"], 1, "{name}: {status}");
        assert_eq!(status["seen"], json!([name]), "{name}: {status}");
        // 2025-01-01T00:00:00Z, the snapshot's `now`.
        assert_eq!(status["clock"], 1_735_689_600, "{name}: {status}");
    };
    let plugin = Arc::new(load("rememberer", Limits::default()));
    for i in 0..4 {
        check(&plugin, &format!("serial-{i}"));
    }
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let plugin = Arc::clone(&plugin);
            std::thread::spawn(move || {
                for i in 0..8 {
                    check(&plugin, &format!("thread-{t}-{i}"));
                }
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

#[test]
fn the_host_and_the_sdk_agree_on_every_field_of_a_snapshot() {
    // The `echo` plugin answers with the snapshot as the SDK parsed it from
    // the WIT record the host lowered; every field must come back as sent.
    let plugin = load("echo", Limits::default());
    let controller = &plugin.manifest().controllers[0];
    let primary = Arc::new(json!({"apiVersion": "test.wasmop.dev/v1", "kind": "Echo",
        "metadata": {"name": "e", "namespace": "ns", "uid": "uid-e", "generation": 3,
                     "deletionTimestamp": "2025-01-01T00:00:00Z", "finalizers": ["x/y"]},
        "spec": {"secretRef": "s", "unicode": "žluťoučký ☃", "n": 1.5, "big": 9007199254740993_u64}}));
    let owned = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "e-cm", "namespace": "ns", "uid": "uid-cm",
                     "ownerReferences": [{"apiVersion": "test.wasmop.dev/v1", "kind": "Echo",
                                          "name": "e", "uid": "uid-e", "controller": true}]},
        "data": {"k": "v"}});
    let secret = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "s", "namespace": "ns", "uid": "uid-s"}, "data": {"k": "dg=="}});
    let source = MemorySource::new(vec![(*primary).clone(), owned.clone(), secret.clone()]);
    let observations = vec![
        wasmop::Observation {
            id: "a".into(),
            status: Some(200),
            body: "{\"ok\":true}".into(),
            error: None,
            observed_at: "2025-01-01T00:00:00Z".into(),
            age_ms: 12,
            outcome: None,
        },
        wasmop::Observation {
            id: "b".into(),
            status: None,
            body: String::new(),
            error: Some("timed out".into()),
            observed_at: "2025-01-01T00:00:01Z".into(),
            age_ms: 0,
            outcome: None,
        },
    ];
    let snapshot = build_snapshot(
        controller,
        Arc::clone(&primary),
        &source,
        "2025-01-01T00:00:02Z",
        &json!({"setting": ["x"]}),
        observations.clone(),
    );
    let plan = plugin.reconcile(&snapshot).expect("echo answers");
    let seen = &plan.status.expect("status")["snapshot"];
    assert_eq!(seen["controller"], "echo");
    assert_eq!(seen["primary"], *primary);
    assert_eq!(seen["owned"], json!([owned]));
    assert_eq!(
        seen["related"],
        json!([{"read": "secret", "object": secret}])
    );
    assert_eq!(seen["now"], "2025-01-01T00:00:02Z");
    assert_eq!(seen["deleting"], true);
    assert_eq!(seen["settings"], json!({"setting": ["x"]}));
    assert_eq!(
        seen["observations"],
        serde_json::to_value(&observations).unwrap()
    );
}

/// Loads `name` with `settings`, or returns why it does not load.
fn try_load_with(name: &str, settings: Value, limits: Limits) -> Result<LoadedPlugin, LoadError> {
    let mut opts = options(limits);
    opts.settings = settings;
    LoadedPlugin::load(&sandbox(), &plugin_path(name), &opts)
}

/// A short deadline for the blocking plugins, and how late a call may end:
/// one epoch tick, plus slack for a loaded test machine.
const SHORT: Duration = Duration::from_millis(400);
const LATE: Duration = Duration::from_millis(250);

fn short() -> Limits {
    Limits {
        deadline: SHORT,
        ..Limits::default()
    }
}

fn assert_on_time(what: &str, started: Instant) {
    let elapsed = started.elapsed();
    assert!(
        elapsed < SHORT + LATE,
        "{what} took {elapsed:?}, deadline {SHORT:?}"
    );
}

#[test]
fn a_reconcile_sleeping_in_a_wasi_clock_wait_times_out_on_time() {
    let plugin = try_load_with("sleeper", json!({}), short()).expect("sleeper loads");
    for _ in 0..2 {
        let started = Instant::now();
        let err = reconcile(&plugin, primary("Sleeper", json!({})), vec![]).expect_err("blocks");
        assert_on_time("sleeping reconcile", started);
        assert!(matches!(err, CallError::Timeout { .. }), "{err}");
        assert_eq!(err.reason(), "PluginTimedOut");
        assert!(err.to_string().contains("deadline"), "{err}");
    }
}

#[test]
fn a_validate_settings_that_sleeps_refuses_the_load_on_time() {
    // The first load compiles (into the shared cache); time the call only.
    let _ = try_load_with("sleeper", json!({"block": "validate-settings"}), short());
    let started = Instant::now();
    let err = try_load_with("sleeper", json!({"block": "validate-settings"}), short())
        .expect_err("load refused");
    assert_on_time("sleeping validate-settings", started);
    match &err {
        LoadError::Call { export, source, .. } => {
            assert_eq!(*export, "validate-settings");
            assert_eq!(source.reason(), "PluginTimedOut", "{err}");
        }
        other => panic!("expected a call error, got {other}"),
    }
}

#[test]
fn a_manifest_that_sleeps_refuses_the_load_on_time() {
    // The first load compiles (into the shared cache); time the call only.
    let _ = try_load_with("sleepy-manifest", json!({}), short());
    let started = Instant::now();
    let err = try_load_with("sleepy-manifest", json!({}), short()).expect_err("load refused");
    assert_on_time("sleeping manifest", started);
    match &err {
        LoadError::Call { export, source, .. } => {
            assert_eq!(*export, "manifest");
            assert_eq!(source.reason(), "PluginTimedOut", "{err}");
        }
        other => panic!("expected a call error, got {other}"),
    }
}

#[test]
fn reading_stdin_does_not_block() {
    let plugin = try_load_with("sleeper", json!({"block": "stdin"}), short()).expect("loads");
    let started = Instant::now();
    let plan = reconcile(&plugin, primary("Sleeper", json!({})), vec![]).expect("empty plan");
    assert_on_time("stdin reconcile", started);
    assert!(plan.apply.is_empty());
}

#[test]
fn a_stack_overflow_traps_and_the_host_thread_survives() {
    let plugin = Arc::new(
        try_load_with("sleeper", json!({"block": "recurse"}), Limits::default()).expect("loads"),
    );
    let on_thread = Arc::clone(&plugin);
    // A host stack overflow would abort the whole process; a guest one
    // must come back as an error on the calling thread.
    let err = std::thread::spawn(move || {
        reconcile(&on_thread, primary("Sleeper", json!({})), vec![]).expect_err("overflows")
    })
    .join()
    .expect("the calling thread survives");
    let CallError::Trap { message } = &err else {
        panic!("expected a trap, got {err}");
    };
    assert!(message.contains("stack"), "{message}");
    assert_eq!(err.reason(), "PluginTrapped");
    // The plugin stays usable.
    let again = reconcile(&plugin, primary("Sleeper", json!({})), vec![]).expect_err("again");
    assert_eq!(again.reason(), "PluginTrapped");
}

#[test]
fn a_plugin_has_256_kib_of_stack_in_its_memory_and_overflowing_it_traps() {
    // Plugins link a 256 KiB stack (`.cargo/config.toml`) so that their data
    // lies within the 512 KiB the sandbox rewrites after every call; 192 KiB
    // of frames in linear memory must still fit.
    let fits =
        try_load_with("sleeper", json!({"block": "stack-192k"}), Limits::default()).expect("loads");
    let plan = reconcile(&fits, primary("Sleeper", json!({})), vec![]).expect("192 KiB fit");
    assert!(plan.apply.is_empty());
    // Beyond it the stack, first in memory, runs below address 0: a trap,
    // never a write over the plugin's data.
    let over = try_load_with(
        "sleeper",
        json!({"block": "stack-overflow"}),
        Limits::default(),
    )
    .expect("loads");
    let err = reconcile(&over, primary("Sleeper", json!({})), vec![]).expect_err("overflows");
    let CallError::Trap { message } = &err else {
        panic!("expected a trap, got {err}");
    };
    assert!(message.contains("memory"), "{message}");
    assert_eq!(err.reason(), "PluginTrapped");
    // The next call starts from the plugin's initial memory.
    reconcile(&fits, primary("Sleeper", json!({})), vec![]).expect("fits again");
}

#[test]
fn a_primary_with_the_most_observations_the_store_keeps_still_reconciles() {
    // The store never hands a snapshot more than its per-primary budget
    // (unit-tested in observe), in at most this many results.
    let config = wasmop::observe::ObserveConfig::default();
    let each = config.max_result_bytes_per_primary / config.max_results_per_primary;
    let observations: Vec<wasmop::Observation> = (0..config.max_results_per_primary)
        .map(|n| wasmop::Observation {
            id: format!("probe-{n}"),
            status: Some(200),
            body: "o".repeat(each),
            error: None,
            observed_at: "2025-01-01T00:00:00Z".into(),
            age_ms: 0,
            outcome: None,
        })
        .collect();
    let plugin = load("good", Limits::default());
    let controller = &plugin.manifest().controllers[0];
    let primary = Arc::new(primary("Widget", json!({"value": "v"})));
    let source = MemorySource::new(vec![(*primary).clone()]);
    let snapshot = build_snapshot(
        controller,
        primary,
        &source,
        "2025-01-01T00:00:00Z",
        plugin.settings(),
        observations,
    );
    let plan = plugin
        .reconcile(&snapshot)
        .expect("reconciles with a full observation store, under the default memory cap");
    assert_eq!(plan.apply.len(), 1);
}

/// A kind call's recording (what `wasmop run --record` writes for a
/// kind-scoped controller) holds every primary the call covered, replays
/// equal with the plugin that made it, and a replay names each primary
/// whose object plan differs.
#[test]
fn a_recorded_kind_call_replays_equal_and_names_each_primary_that_differs() {
    let plugin = load("backup", Limits::default());
    let golden = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../plugins/backup/tests/golden/01-created-together.yaml");
    let text = std::fs::read_to_string(&golden).expect("golden input");
    let input = offline::parse_input(&text, "01-created-together.yaml").expect("parses");
    let run = offline::run(&plugin, &input, None, None).expect("runs");
    let decided = run
        .kind
        .as_ref()
        .expect("the EtcdBackup controller is kind-scoped");
    let doc = wasmop::record::kind_recording(&wasmop::record::Redactor::new(), &plugin, decided)
        .expect("the plugin was called");
    let items = doc["items"].as_array().expect("a List");
    let backups: Vec<&str> = items
        .iter()
        .filter(|o| o["kind"] == "EtcdBackup")
        .map(|o| o["metadata"]["name"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(backups, ["a", "b", "c"], "every primary of the call, once");
    let recorded = items
        .iter()
        .position(|o| o["kind"] == wasmop::record::RECORDED_KIND)
        .expect("a Recorded document");
    assert_eq!(items[recorded]["primary"]["scope"], "Kind");
    assert_eq!(items[recorded]["primary"]["primaries"], 3);

    let load_args = wasmop::cli::PluginArgs {
        compile_cache: Some(scratch_dir("kind-replay-cache")),
        no_compile_cache: false,
        deadline_ms: 2000,
        memory_mib: 64,
    };
    let replay = |doc: &Value, dir: &str| {
        let dir = scratch_dir(dir);
        std::fs::write(dir.join("kind-call.json"), doc.to_string()).expect("written");
        wasmop::cli::replay::replay(&dir, &plugin_path("backup"), &[], &load_args)
            .unwrap_or_else(|e| panic!("replays: {e}"))
    };
    let same = replay(&doc, "kind-replay-same");
    assert_eq!(
        (same.recordings, same.equal, same.different),
        (1, 1, 0),
        "{:?}",
        same.replays
    );

    // What the live call decided, changed: b's status, and c's object plan
    // missing. The replay names exactly those two primaries.
    let mut changed = doc.clone();
    let plans = changed["items"][recorded]["outcome"]["objects"]
        .as_array_mut()
        .expect("object plans");
    assert_eq!(plans.len(), 3);
    plans[1]["status"] = json!({"conditions": []});
    plans.truncate(2);
    let different = replay(&changed, "kind-replay-changed");
    assert_eq!((different.equal, different.different), (0, 1));
    let named: Vec<(&str, Vec<&str>)> = different
        .replays
        .iter()
        .map(|r| {
            (
                r.primary.as_str(),
                r.differences.iter().map(|d| d.op.as_str()).collect(),
            )
        })
        .collect();
    assert_eq!(named.len(), 2, "{named:?}");
    assert_eq!(named[0].0, "EtcdBackup b");
    assert!(named[0].1.iter().all(|op| *op == "status"), "{named:?}");
    assert_eq!(named[1], ("EtcdBackup c", vec!["result"]));
}
