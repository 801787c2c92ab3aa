//! `wasmop check` against the `flawed` test plugin (tests/plugins/flawed),
//! built by `tests/build-plugins.sh` into `target/plugins` (or
//! `$WASMOP_PLUGIN_DIR`): unbroken it holds every property; told to break
//! one, `check` reports that property with a trace, and `wasmop replay`
//! recomputes every plan of the trace as recorded.

use std::path::{Path, PathBuf};
use std::process::Command;

fn plugin_dir() -> PathBuf {
    match std::env::var_os("WASMOP_PLUGIN_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/plugins"),
    }
}

fn plugin(name: &str) -> PathBuf {
    let path = plugin_dir().join(format!("{name}.wasm"));
    assert!(
        path.is_file(),
        "plugin {} is missing: run `bash tests/build-plugins.sh` first \
         (or point WASMOP_PLUGIN_DIR at the built plugins)",
        path.display()
    );
    path
}

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

fn scratch(test: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("check-{test}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

fn cache() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("check-compiled");
    std::fs::create_dir_all(&dir).expect("cache dir");
    dir
}

struct Ran {
    code: i32,
    stdout: String,
    stderr: String,
}

fn wasmop(args: &[&std::ffi::OsStr]) -> Ran {
    let out = Command::new(env!("CARGO_BIN_EXE_wasmop"))
        .args(args)
        .env("WASMOP_COMPILE_CACHE", cache())
        .output()
        .expect("run wasmop");
    Ran {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `wasmop check` of `flawed` breaking `breaks` (none: unbroken), on the
/// Webapp example with its CRD, only `properties`.
fn check_flawed(test: &str, breaks: Option<&str>, properties: &str) -> (Ran, PathBuf) {
    let dir = scratch(test);
    let settings = dir.join("settings.yaml");
    let text = match breaks {
        Some(b) => format!("breaks: {b}\n"),
        None => "{}\n".to_owned(),
    };
    std::fs::write(&settings, text).unwrap();
    let traces = dir.join("traces");
    let ran = wasmop(&[
        "check".as_ref(),
        plugin("flawed").as_os_str(),
        "-f".as_ref(),
        repo("tests/fixtures/check/webapp.yaml").as_os_str(),
        "--crds".as_ref(),
        repo("tests/fixtures/check/webapp-crd.yaml").as_os_str(),
        "--settings".as_ref(),
        settings.as_os_str(),
        "--property".as_ref(),
        properties.as_ref(),
        "--trace-dir".as_ref(),
        traces.as_os_str(),
    ]);
    (ran, traces)
}

#[test]
fn the_unbroken_plugin_holds_every_property() {
    let (ran, _) = check_flawed("unbroken", None, "1,2,3,4,5,6,7,8");
    assert_eq!(ran.code, 0, "{}\n{}", ran.stdout, ran.stderr);
    assert!(ran.stdout.contains("8 deletion ok"), "{}", ran.stdout);
}

/// `check` reports `property` (and its number) for `flawed` breaking it,
/// writes the trace, and `wasmop replay` reproduces every plan of it.
fn reports_and_replays(property: &str, number: u8) {
    let (ran, traces) = check_flawed(property, Some(property), property);
    assert_eq!(ran.code, 1, "{}\n{}", ran.stdout, ran.stderr);
    let headline = format!("property {number} ({property}) fails from example webapp");
    assert!(ran.stdout.contains(&headline), "{}", ran.stdout);
    assert!(ran.stdout.contains("step 1 (round 1)"), "{}", ran.stdout);
    let dir = traces.join(format!("flawed-webapp-{property}"));
    assert!(dir.join("trace.txt").is_file(), "{}", dir.display());
    assert!(dir.join("0001.json").is_file(), "{}", dir.display());
    let replay = wasmop(&[
        "replay".as_ref(),
        dir.as_os_str(),
        "--plugin".as_ref(),
        plugin("flawed").as_os_str(),
    ]);
    assert_eq!(replay.code, 0, "{}\n{}", replay.stdout, replay.stderr);
    assert!(replay.stdout.contains("0 different"), "{}", replay.stdout);
}

#[test]
fn convergence_is_reported_with_a_trace_that_replays() {
    reports_and_replays("convergence", 1);
}

#[test]
fn determinism_is_reported_with_a_trace_that_replays() {
    reports_and_replays("determinism", 2);
}

#[test]
fn oscillation_is_reported_with_a_trace_that_replays() {
    reports_and_replays("no-oscillation", 3);
}

#[test]
fn a_crash_between_writes_is_reported_with_a_trace_that_replays() {
    reports_and_replays("crash", 4);
}

#[test]
fn a_stale_snapshot_is_reported_with_a_trace_that_replays() {
    reports_and_replays("stale", 5);
}

#[test]
fn dishonest_ready_is_reported_with_a_trace_that_replays() {
    reports_and_replays("ready-honesty", 6);
}

#[test]
fn a_trap_on_a_valid_spec_change_is_reported_with_a_trace_that_replays() {
    reports_and_replays("spec-mutation", 7);
}

#[test]
fn a_finalizer_never_released_is_reported_with_a_trace_that_replays() {
    reports_and_replays("deletion", 8);
}

#[test]
fn bad_arguments_are_one_line_and_exit_2() {
    let ran = wasmop(&[
        "check".as_ref(),
        plugin("flawed").as_os_str(),
        "-f".as_ref(),
        repo("tests/fixtures/check/webapp.yaml").as_os_str(),
        "--property".as_ref(),
        "nine".as_ref(),
    ]);
    assert_eq!(ran.code, 2, "{}", ran.stderr);
    assert!(ran.stderr.contains("--property \"nine\""), "{}", ran.stderr);
}
