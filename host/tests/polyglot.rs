//! Plugins in JavaScript and Python (componentize-js, componentize-py)
//! against the same host and the same checks as the Rust ones:
//! `good`'s golden plans and answers for its ports `good-js` and
//! `good-py`, and the sandbox's hostile cases for each language
//! (`hostile-js`, `hostile-py`). Built by `tests/build-plugins.sh`
//! like every test plugin; a missing one fails the test.

mod offline_call;
use offline_call::reconcile_with;

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use wasmop::plugin::OutputProblem;
use wasmop::plugin::PluginErrorKind;
use wasmop::{
    CallError, CompileCache, Limits, LoadError, LoadOptions, LoadedPlugin, Sandbox, SandboxConfig,
};

/// The ports of `good`, by language.
const GOOD_PORTS: [&str; 2] = ["good-js", "good-py"];
/// The ports of `referrer`, by language.
const REFERRER_PORTS: [&str; 2] = ["referrer-js", "referrer-py"];
/// The hostile plugins, by language.
const HOSTILE: [&str; 2] = ["hostile-js", "hostile-py"];

fn plugin_path(name: &str) -> PathBuf {
    let dir = match std::env::var_os("WASMOP_PLUGIN_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/plugins"),
    };
    let path = dir.join(format!("{name}.wasm"));
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

/// The compile cache every other test and the live operator use
/// (`LoadOptions::default()`): these components take long to compile
/// (seconds each in a release build, minutes in a loaded dev build), so
/// each digest compiles once per machine.
fn cache() -> Option<CompileCache> {
    LoadOptions::default().cache
}

fn try_load(name: &str, settings: Value, limits: Limits) -> Result<LoadedPlugin, LoadError> {
    // One load at a time: each component compiles once (seconds for these
    // sizes) and later loads come from the compile cache.
    static LOADING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = LOADING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    LoadedPlugin::load(
        &sandbox(),
        &plugin_path(name),
        &LoadOptions {
            settings,
            limits,
            cache: cache(),
        },
    )
}

fn load(name: &str, limits: Limits) -> LoadedPlugin {
    try_load(name, json!({}), limits).unwrap_or_else(|e| panic!("{name} loads: {e}"))
}

fn reconcile(plugin: &LoadedPlugin, primary: Value) -> Result<wasmop::Plan, CallError> {
    reconcile_with(plugin, primary, vec![])
}

fn widget(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
           "metadata": {"name": name, "namespace": "ns", "uid": "uid-w", "generation": 3},
           "spec": spec})
}

fn hostile(mode: &str) -> Value {
    json!({"apiVersion": "test.wasmop.dev/v1", "kind": "Hostile",
           "metadata": {"name": "h", "namespace": "ns", "uid": "uid-h", "generation": 1},
           "spec": {"mode": mode}})
}

#[test]
fn the_ports_of_good_pass_goods_golden_plans() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/good");
    let rust = wasmop::reconcile::golden::check(&plugin_path("good"), &fixtures)
        .unwrap_or_else(|e| panic!("good: {e}"));
    for port in GOOD_PORTS {
        let report = wasmop::reconcile::golden::check(&plugin_path(port), &fixtures)
            .unwrap_or_else(|e| panic!("{port}: {e}"));
        assert!(report.blessed.is_empty(), "{port}: {report:?}");
        assert_eq!(
            report.fixture_names(),
            rust.fixture_names(),
            "{port} checked every fixture of good"
        );
        assert!(report.matched.len() >= 5, "{port}: {report:?}");
    }
}

/// The same manifest, and the same answer to every input `good`'s unit
/// tests cover: a spec, a missing value, a value of the wrong type, an
/// existing Ready condition, settings, a deletion.
#[test]
fn the_ports_of_good_answer_what_good_answers() {
    let good = load("good", Limits::default());
    let ready = json!({"conditions": [{"type": "Ready", "status": "True", "reason": "Reconciled",
        "message": "old", "observedGeneration": 1, "lastTransitionTime": "2020-01-01T00:00:00Z"},
        {"type": "Other", "status": "False", "reason": "R", "message": "m",
         "lastTransitionTime": "2021-01-01T00:00:00Z"}]});
    let mut with_status = widget("w", json!({"value": "new"}));
    with_status["status"] = ready;
    let mut deleting = widget("w", json!({"value": "v"}));
    deleting["metadata"]["deletionTimestamp"] = json!("2025-01-01T00:00:00Z");
    let inputs = [
        widget("w", json!({"value": "hello"})),
        widget("w", json!({})),
        json!({"apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
               "metadata": {"name": "bare", "namespace": "ns", "uid": "u"}}),
        widget("w", json!({"value": 3})),
        with_status,
        deleting,
    ];
    for port in GOOD_PORTS {
        let plugin = load(port, Limits::default());
        assert_eq!(plugin.manifest(), good.manifest(), "{port}");
        for input in &inputs {
            let want = reconcile(&good, input.clone());
            let got = reconcile(&plugin, input.clone());
            match (&want, &got) {
                (Ok(w), Ok(g)) => assert_eq!(w, g, "{port} on {input}"),
                (Err(w), Err(g)) => assert_eq!(w.reason(), g.reason(), "{port} on {input}: {g}"),
                _ => panic!("{port} on {input}: good answered {want:?}, the port {got:?}"),
            }
        }
        let custom = try_load(port, json!({"label": "custom"}), Limits::default())
            .unwrap_or_else(|e| panic!("{port} takes a label: {e}"));
        let plan = reconcile(&custom, widget("w", json!({}))).expect("plan");
        assert_eq!(
            plan.apply[0].object["metadata"]["labels"]["test.wasmop.dev/version"],
            "custom"
        );
        let err = try_load(
            port,
            json!({"label": 7, "colour": "red"}),
            Limits::default(),
        )
        .expect_err("bad settings refuse the load");
        let want = try_load(
            "good",
            json!({"label": 7, "colour": "red"}),
            Limits::default(),
        )
        .expect_err("bad settings refuse the load");
        assert!(matches!(err, LoadError::InvalidSettings { .. }), "{err}");
        assert_eq!(err.to_string(), want.to_string(), "{port}");
    }
}

/// `referrer`'s ports: the same manifest (a read by field reference, an
/// owned kind, a primary field, a finalizer) and the same plans, with and
/// without the referenced ConfigMap, before and after spec.id is set, and
/// while deleting with and without leave.
#[test]
fn the_ports_of_referrer_answer_what_referrer_answers() {
    let referrer = load("referrer", Limits::default());
    let primary = |spec: Value, deleting: bool| {
        let mut p = json!({"apiVersion": "test.wasmop.dev/v1", "kind": "Referrer",
            "metadata": {"name": "r", "namespace": "ns", "uid": "0123456789abcdef",
                         "generation": 1, "finalizers": ["test.wasmop.dev/cleanup"]},
            "spec": spec});
        if deleting {
            p["metadata"]["deletionTimestamp"] = json!("2025-01-01T00:00:00Z");
        }
        p
    };
    let src = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "src", "namespace": "ns", "uid": "src-uid", "resourceVersion": "4"},
        "data": {"k": "one", "other": "two"}});
    let elsewhere = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "src", "namespace": "other", "uid": "x", "resourceVersion": "5"},
        "data": {"k": "not this one"}});
    let cases = [
        (primary(json!({"configRef": "src"}), false), vec![]),
        (
            primary(json!({"configRef": "src"}), false),
            vec![src.clone(), elsewhere.clone()],
        ),
        (
            primary(json!({"configRef": "src", "id": "id-set"}), false),
            vec![src.clone()],
        ),
        (
            primary(json!({"configRef": "src"}), true),
            vec![src.clone()],
        ),
        (
            primary(json!({"configRef": "src", "allowCleanup": true}), true),
            vec![src],
        ),
    ];
    for port in REFERRER_PORTS {
        let plugin = load(port, Limits::default());
        assert_eq!(plugin.manifest(), referrer.manifest(), "{port}");
        for (input, others) in &cases {
            let want = reconcile_with(&referrer, input.clone(), others.clone())
                .unwrap_or_else(|e| panic!("referrer on {input}: {e}"));
            let got = reconcile_with(&plugin, input.clone(), others.clone())
                .unwrap_or_else(|e| panic!("{port} on {input}: {e}"));
            assert_eq!(want, got, "{port} on {input}");
        }
    }
}

/// What each language's component imports: the JavaScript one is built
/// with every WASI feature off and imports only the contract; the Python
/// one imports WASI preview 2, which the host links with nothing granted.
#[test]
fn javascript_imports_only_the_contract_and_python_imports_wasi() {
    let contract = [
        "wasmop:reconciler/diagnostics@0.4.0",
        "wasmop:reconciler/types@0.4.0",
    ];
    let js = load("good-js", Limits::default());
    assert!(
        js.imports().iter().all(|i| contract.contains(&i.as_str())),
        "{:?}",
        js.imports()
    );
    let py = load("good-py", Limits::default());
    assert!(
        py.imports().iter().any(|i| i.starts_with("wasi:cli/")),
        "{:?}",
        py.imports()
    );
}

#[test]
fn a_busy_loop_times_out_within_its_deadline_in_each_language() {
    let deadline = Duration::from_millis(500);
    for name in HOSTILE {
        let plugin = load(
            name,
            Limits {
                deadline,
                ..Limits::default()
            },
        );
        let started = Instant::now();
        let err = reconcile(&plugin, hostile("loop")).expect_err("times out");
        let elapsed = started.elapsed();
        assert!(matches!(err, CallError::Timeout { .. }), "{name}: {err}");
        assert!(
            elapsed >= deadline,
            "{name}: interrupted early: {elapsed:?}"
        );
        assert!(
            elapsed < deadline + Duration::from_secs(1),
            "{name}: interrupted late: {elapsed:?}"
        );
        // The plugin is still usable afterwards.
        reconcile(&plugin, hostile("none")).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[test]
fn unbounded_allocation_hits_the_memory_cap_in_each_language() {
    // At the default cap, then at one an operator's config raised
    // (`memoryMiB: 96`): the call ends at exactly the cap it was given.
    for cap in [Limits::default().memory_bytes, 96 << 20] {
        for name in HOSTILE {
            let plugin = load(
                name,
                Limits {
                    memory_bytes: cap,
                    ..Limits::default()
                },
            );
            let err = reconcile(&plugin, hostile("allocate")).expect_err("runs out");
            assert!(
                matches!(err, CallError::OutOfMemory { cap_bytes } if cap_bytes == cap),
                "{name} at {cap}: {err}"
            );
            reconcile(&plugin, hostile("none")).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }
}

/// A component of 12-18 MB that starts with 9-13 MB of memory gets the
/// same per-call memory cap as any plugin: the host raises it only where
/// the operator's config asks (`memoryMiB`, which becomes
/// [`Limits::memory_bytes`]), never because the component is large; and
/// a good port's call runs within that default.
#[test]
fn the_default_memory_cap_holds_for_big_components() {
    let default = Limits::default().memory_bytes;
    assert_eq!(default, 64 << 20);
    for port in GOOD_PORTS.iter().chain(&HOSTILE) {
        let plugin = load(port, Limits::default());
        assert_eq!(plugin.limits().memory_bytes, default, "{port}");
        let size = std::fs::metadata(plugin_path(port)).expect("size").len();
        assert!(size > 8 << 20, "{port} is only {size} bytes");
        let start = plugin.start_memory_bytes();
        assert!(
            start > 4 << 20 && start < default / 2,
            "{port} starts with {start} bytes of memory"
        );
    }
    for port in GOOD_PORTS {
        let plugin = load(port, Limits::default());
        reconcile(&plugin, widget("w", json!({"value": "x".repeat(64 << 10)})))
            .unwrap_or_else(|e| panic!("{port} within the default cap: {e}"));
    }
}

/// A plan of more JSON values than the host reads of one (300 000 zeros,
/// a text of 600 KB) is refused at the default limits.
#[test]
fn a_plan_of_too_many_values_is_refused_in_each_language() {
    for name in HOSTILE {
        let plugin = load(name, Limits::default());
        let err = reconcile(&plugin, hostile("dense")).expect_err("refused");
        assert!(
            matches!(
                err,
                CallError::MalformedOutput(OutputProblem::TooManyValues { .. })
            ),
            "{name}: {err}"
        );
        reconcile(&plugin, hostile("none")).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

/// A plan of 9 MiB, over the 8 MiB the host reads of one. Building it
/// takes a language runtime several copies of it (the string, its JSON
/// text, the text lowered into the host) and seconds of interpreted
/// string work: at the default limits (64 MiB, 2 s) the call ends at the
/// cap or the deadline; with the limits a config raised for it
/// (`memoryMiB: 256`, `deadlineMs: 20000`) the plan is made and the host
/// refuses it as too large. Either way nothing of it is applied.
#[test]
fn a_huge_plan_is_refused_in_each_language() {
    for name in HOSTILE {
        let plugin = load(name, Limits::default());
        let err = reconcile(&plugin, hostile("huge-plan")).expect_err("refused");
        assert!(
            matches!(
                err,
                CallError::MalformedOutput(OutputProblem::TooLarge { .. })
                    | CallError::OutOfMemory {
                        cap_bytes: 0x400_0000
                    }
                    | CallError::Timeout { .. }
            ),
            "{name}: {err}"
        );
        let raised = load(
            name,
            Limits {
                memory_bytes: 256 << 20,
                deadline: Duration::from_secs(20),
                ..Limits::default()
            },
        );
        let err = reconcile(&raised, hostile("huge-plan")).expect_err("refused");
        assert!(
            matches!(
                err,
                CallError::MalformedOutput(OutputProblem::TooLarge { .. })
            ),
            "{name} with 256 MiB and 20 s: {err}"
        );
    }
}

#[test]
fn a_thrown_error_is_the_plugins_internal_error_in_each_language() {
    for name in HOSTILE {
        let plugin = load(name, Limits::default());
        let err = reconcile(&plugin, hostile("throw")).expect_err("fails");
        assert!(
            matches!(
                &err,
                CallError::PluginError { kind: PluginErrorKind::Internal, message }
                    if message.contains("TypeError")
            ),
            "{name}: {err}"
        );
    }
}

/// Module state (a JavaScript `let`, a Python global) does not survive a
/// call: every call, serial or from many threads, starts from the
/// component's initial memory.
#[test]
fn no_call_sees_what_an_earlier_call_left_in_each_language() {
    for name in HOSTILE {
        let plugin = Arc::new(load(name, Limits::default()));
        let check = move |plugin: &LoadedPlugin, who: &str| {
            let mut p = hostile("remember");
            p["metadata"]["name"] = json!(who);
            let plan = reconcile(plugin, p).unwrap_or_else(|e| panic!("{who}: {e}"));
            let status = plan.status.expect("status");
            assert_eq!(status["calls"], 1, "{who}: {status}");
            assert_eq!(status["seen"], json!([who]), "{who}: {status}");
        };
        for i in 0..3 {
            check(&plugin, &format!("{name}-serial-{i}"));
        }
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let plugin = Arc::clone(&plugin);
                std::thread::spawn(move || {
                    for i in 0..3 {
                        check(&plugin, &format!("{name}-thread-{t}-{i}"));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("thread");
        }
    }
}
