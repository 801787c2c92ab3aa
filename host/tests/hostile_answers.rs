//! Plugins that answer with more than the host should take, written by hand
//! in WAT (no SDK, no guest-side checks) and compiled in the test: a
//! reconcile that returns a huge string, one that returns the same bytes
//! call after call, and plans with too many Events.
//!
//! This file is its own test process, so the resident-set figures it reads
//! from `/proc/self/status` are its own.

use std::sync::{Arc, Mutex, OnceLock};

use serde_json::json;
use wasmop::plugin::{MAX_OUTPUT_BYTES, OutputProblem};
use wasmop::reconcile::offline;
use wasmop::{CallError, Decision, Limits, LoadOptions, LoadedPlugin, Sandbox, SandboxConfig};
use wasmop_sdk::k8s_openapi::api::core::v1::ConfigMap;
use wasmop_sdk::{Controller, KindRef, Manifest};

/// Where things live in the hand-written module's memory.
const MANIFEST_RET: u32 = 0;
const ANSWER: u32 = 64;
const SETTINGS_RET: u32 = 96;
const PREFIX: u32 = 128;
const EVENT: u32 = 192;
const MANIFEST: u32 = 1024;
const PLAN: u32 = 64 << 10;

/// `{"events":[` and one empty Event with its comma.
const PREFIX_TEXT: &str = r#"{"events":["#;
const EVENT_TEXT: &str = r#"{"type":"Normal","reason":"","message":""},"#;

/// The memory cap the hostile plugins run under.
const CAP: usize = 64 << 20;

fn manifest_json() -> String {
    let manifest = Manifest::new("hostile", "0.1.0").controller(
        Controller::new(
            "hostile",
            KindRef::namespaced("test.wasmop.dev", "v1", "Hostile", "hostiles"),
        )
        .owns(KindRef::of::<ConfigMap>()),
    );
    serde_json::to_string(&manifest).expect("manifest JSON")
}

/// A WAT string literal holding `bytes`, every byte escaped.
fn wat_bytes(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("\\{b:02x}")).collect()
}

/// A component of the `plugin` world: a valid manifest, settings always
/// accepted, and a `reconcile` whose core body is `reconcile_body` (it must
/// leave the address of a `result<string, reconcile-error>` on the stack).
/// `plan_bytes` is the room reserved for the answer at [`PLAN`].
fn component(reconcile_body: &str, plan_bytes: u32) -> Vec<u8> {
    let manifest = manifest_json();
    let heap = (PLAN + plan_bytes + 7) & !7;
    let pages = (heap + (1 << 20)).div_ceil(64 << 10);
    let wat = format!(
        r#"(component
  (core module $m
    (memory (export "mem") {pages})
    (global $next (mut i32) (i32.const {heap}))
    (data (i32.const {MANIFEST}) "{manifest_data}")
    (data (i32.const {PREFIX}) "{prefix_data}")
    (data (i32.const {EVENT}) "{event_data}")
    (func (export "realloc") (param i32 i32 i32 i32) (result i32)
      (local $p i32)
      (local.set $p (i32.and
        (i32.add (global.get $next) (i32.sub (local.get 2) (i32.const 1)))
        (i32.xor (i32.sub (local.get 2) (i32.const 1)) (i32.const -1))))
      (global.set $next (i32.add (local.get $p) (local.get 3)))
      (local.get $p))
    (func (export "manifest") (result i32)
      (i32.store (i32.const {MANIFEST_RET}) (i32.const {MANIFEST}))
      (i32.store (i32.const {manifest_ret_len}) (i32.const {manifest_len}))
      (i32.const {MANIFEST_RET}))
    (func (export "validate-settings") (param i32 i32) (result i32)
      (i32.store8 (i32.const {SETTINGS_RET}) (i32.const 0))
      (i32.const {SETTINGS_RET}))
    (func (export "reconcile")
      (param i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32) (result i32)
      (local $dst i32) (local $i i32)
      {reconcile_body}))
  (core instance $i (instantiate $m))
  (alias core export $i "mem" (core memory $mem))
  (alias core export $i "realloc" (core func $realloc))
  (type $related' (record (field "read" string) (field "object" string)))
  (export $related "related-object" (type $related'))
  (type $observation' (record
    (field "id" string) (field "status" (option u16)) (field "body" (list u8))
    (field "error" (option string)) (field "observed-at" string) (field "age-ms" u64)))
  (export $observation "observation" (type $observation'))
  (type $snapshot' (record
    (field "controller" string) (field "primary" string) (field "owned" (list string))
    (field "related" (list $related)) (field "now" string) (field "deleting" bool)
    (field "settings" string) (field "observations" (list $observation))))
  (export $snapshot "snapshot" (type $snapshot'))
  (type $error' (variant
    (case "invalid-spec" string) (case "not-ready" string) (case "internal" string)))
  (export $error "reconcile-error" (type $error'))
  (func $manifest (result string)
    (canon lift (core func $i "manifest") (memory $mem) (realloc $realloc)))
  (func $validate (param "settings" string) (result (result (error string)))
    (canon lift (core func $i "validate-settings") (memory $mem) (realloc $realloc)))
  (func $reconcile (param "snapshot" $snapshot) (result (result string (error $error)))
    (canon lift (core func $i "reconcile") (memory $mem) (realloc $realloc)))
  (export "manifest" (func $manifest))
  (export "validate-settings" (func $validate))
  (export "reconcile" (func $reconcile))
)"#,
        manifest_data = wat_bytes(manifest.as_bytes()),
        manifest_len = manifest.len(),
        manifest_ret_len = MANIFEST_RET + 4,
        prefix_data = wat_bytes(PREFIX_TEXT.as_bytes()),
        event_data = wat_bytes(EVENT_TEXT.as_bytes()),
    );
    wat::parse_str(&wat).expect("the hand-written component parses")
}

/// `ok(string)` at [`ANSWER`]: `len` bytes from [`PLAN`] (whatever they
/// hold: zero bytes are valid UTF-8).
fn string_answer(len: u32) -> Vec<u8> {
    let body = format!(
        "(i32.store8 (i32.const {ANSWER}) (i32.const 0))
         (i32.store (i32.const {ptr}) (i32.const {PLAN}))
         (i32.store (i32.const {len_at}) (i32.const {len}))
         (i32.const {ANSWER})",
        ptr = ANSWER + 4,
        len_at = ANSWER + 8,
    );
    component(&body, len)
}

/// A plan of `events` empty Events, written by a loop in the guest.
fn events_answer(events: u32) -> Vec<u8> {
    let event_len = EVENT_TEXT.len() as u32;
    let prefix_len = PREFIX_TEXT.len() as u32;
    let body = format!(
        "(memory.copy (i32.const {PLAN}) (i32.const {PREFIX}) (i32.const {prefix_len}))
         (local.set $dst (i32.const {start}))
         (block $done (loop $more
           (br_if $done (i32.ge_u (local.get $i) (i32.const {events})))
           (memory.copy (local.get $dst) (i32.const {EVENT}) (i32.const {event_len}))
           (local.set $dst (i32.add (local.get $dst) (i32.const {event_len})))
           (local.set $i (i32.add (local.get $i) (i32.const 1)))
           (br $more)))
         ;; the last comma becomes the closing bracket
         (i32.store8 (i32.sub (local.get $dst) (i32.const 1)) (i32.const 93))
         (i32.store8 (local.get $dst) (i32.const 125))
         (local.set $dst (i32.add (local.get $dst) (i32.const 1)))
         (i32.store8 (i32.const {ANSWER}) (i32.const 0))
         (i32.store (i32.const {ptr}) (i32.const {PLAN}))
         (i32.store (i32.const {len_at}) (i32.sub (local.get $dst) (i32.const {PLAN})))
         (i32.const {ANSWER})",
        start = PLAN + prefix_len,
        ptr = ANSWER + 4,
        len_at = ANSWER + 8,
    );
    component(&body, prefix_len + events * event_len + 2)
}

fn sandbox() -> Arc<Sandbox> {
    static SANDBOX: OnceLock<Arc<Sandbox>> = OnceLock::new();
    SANDBOX
        .get_or_init(|| Sandbox::new(SandboxConfig::default()).expect("sandbox"))
        .clone()
}

fn load(bytes: &[u8], origin: &str) -> LoadedPlugin {
    let options = LoadOptions {
        settings: json!({}),
        limits: Limits {
            memory_bytes: CAP,
            ..Limits::default()
        },
        cache: None,
    };
    LoadedPlugin::from_bytes(&sandbox(), bytes, origin, &options)
        .unwrap_or_else(|e| panic!("{origin} loads: {e}"))
}

/// The live decision path (`wasmop plan`) on one Hostile primary.
fn decide(plugin: &LoadedPlugin) -> Decision {
    let input = offline::parse_input(
        "apiVersion: test.wasmop.dev/v1\nkind: Hostile\nmetadata: {name: h, namespace: ns}\n",
        "inline.yaml",
    )
    .expect("input");
    offline::run(plugin, &input, Some("2025-01-01T00:00:00Z"), None)
        .expect("runs")
        .decision
}

/// `VmRSS` or `VmHWM` of this process, in bytes.
fn status_bytes(field: &str) -> usize {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"));
    let kib: usize = line
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("cannot read {line:?}"));
    kib << 10
}

/// The tests here measure memory; they run one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// How far above its resident set before the calls this process may peak:
/// one copy of the largest answer the memory cap allows, plus slack for the
/// allocator and the test itself. The bound the issue asks to report.
const RSS_BOUND: usize = CAP + (32 << 20);

#[test]
fn a_huge_answer_returned_again_and_again_is_rejected_within_a_memory_bound() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // Nearly the whole memory cap: the largest string a guest can hand over.
    let len = (CAP - (3 << 20)) as u32;
    let plugin = load(&string_answer(len), "huge-answer");
    let before = status_bytes("VmRSS:");
    for call in 0..12 {
        match decide(&plugin) {
            Decision::Failed(CallError::MalformedOutput(OutputProblem::TooLarge {
                bytes,
                limit,
                ..
            })) => {
                assert_eq!(
                    (bytes, limit),
                    (len as usize, MAX_OUTPUT_BYTES),
                    "call {call}"
                );
            }
            other => panic!("call {call}: expected a too-large answer, got {other:?}"),
        }
    }
    let peak = status_bytes("VmHWM:");
    let after = status_bytes("VmRSS:");
    eprintln!(
        "resident before {} MiB, peak {} MiB, after {} MiB, bound {} MiB above before",
        before >> 20,
        peak >> 20,
        after >> 20,
        RSS_BOUND >> 20
    );
    assert!(
        peak <= before + RSS_BOUND,
        "peak resident set {} MiB exceeds {} MiB + {} MiB",
        peak >> 20,
        before >> 20,
        RSS_BOUND >> 20
    );
    assert!(
        after <= before + (16 << 20),
        "{} MiB still resident after the calls (before: {} MiB)",
        after >> 20,
        before >> 20
    );
}

#[test]
fn too_many_events_in_a_small_plan_break_the_count_rule() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // 1000 Events are 43 kB of JSON: far below the byte and value limits,
    // so only the count rule can stop them.
    let plugin = load(&events_answer(1000), "many-events");
    match decide(&plugin) {
        Decision::Rejected { plan, violations } => {
            assert_eq!(plan.events.len(), 1000);
            assert_eq!(violations.len(), 1, "{violations:?}");
            assert_eq!(violations[0].rule.as_str(), "TooManyEvents");
            assert!(
                violations[0].message.contains("1000 Events"),
                "{}",
                violations[0]
            );
        }
        other => panic!("expected a rejected plan, got {other:?}"),
    }
    // Within the limit, the same component's plan passes.
    let plugin = load(&events_answer(50), "enough-events");
    match decide(&plugin) {
        Decision::Planned { plan, .. } => assert_eq!(plan.events.len(), 50),
        other => panic!("expected a plan, got {other:?}"),
    }
}

#[test]
fn a_million_empty_events_are_refused_by_size_before_anything_is_parsed() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // A million Events are 43 MB of JSON: the byte limit refuses the text
    // before parsing (the count rule refuses such a plan too when it is
    // built natively; see `check_counts`'s unit tests).
    let plugin = load(&events_answer(1_000_000), "million-events");
    match decide(&plugin) {
        Decision::Failed(e @ CallError::MalformedOutput(OutputProblem::TooLarge { .. })) => {
            assert_eq!(e.reason(), "PluginOutputMalformed");
        }
        other => panic!("expected a too-large answer, got {other:?}"),
    }
}
