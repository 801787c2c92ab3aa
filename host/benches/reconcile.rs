//! One reconcile through the host — fresh store, instantiate, pass the
//! snapshot, call, convert the plan — against the same plugin logic (the
//! `good` test plugin) run natively, and the stages of one call measured
//! one by one.
//!
//! Snapshots of about 4 KB, 64 KB and 1 MB: a Widget plus owned
//! ConfigMaps of about 4 KB each. Needs `target/plugins/good.wasm` and
//! `target/plugins/malformed.wasm` (`bash tests/build-plugins.sh`) or
//! `$WASMOP_PLUGIN_DIR`.
//!
//! Groups (criterion filters select them, e.g. `-- stages`):
//!
//! - `stages/<step>`: the 4 KB call taken apart — a store; a store and
//!   instantiation; the cheapest export (`validate-settings` of `{}`); the
//!   host turning the snapshot into JSON texts; the `malformed` plugin,
//!   which ignores its snapshot (store, instantiate, the snapshot's texts
//!   copied into the guest, a constant answer); `good` without parsing its
//!   plan; the host parsing and checking the plan; the whole call.
//! - first, printed (not criterion): `wasm` against each other variant
//!   below, the two run alternately call by call so both see the same
//!   machine load; medians and their ratio. On a busy machine these ratios
//!   are the ones to trust. Then the CPU per call of wasm and native (all
//!   threads of the process), from batches of calls that alternate between
//!   the two for the same reason.
//! - `reconcile/<variant>/<size>`:
//!   - `wasm`: [`LoadedPlugin::reconcile`] on the sandbox as shipped;
//!   - `wasm_wasmtime_defaults`: the same on a sandbox with wasmtime's
//!     default pooling settings (the sandbox before this benchmark's
//!     tuning);
//!   - `wasm_no_epoch`: the shipped settings without epoch interruption
//!     (no deadline: what the deadline checks cost);
//!   - `wasm_inlining` (interleaved only): the shipped settings with
//!     Cranelift's inlining within a plugin (`Tuning::inlining`; not
//!     shipped: it makes compiling a plugin about 5x slower);
//!   - `wasm_dirty_pages`: the faster reset of a call's memory
//!     (`--memory-reset=dirty-pages`: only dirty pages, found with
//!     `PAGEMAP_SCAN`, copied back; the shipped reset rewrites the first
//!     512 KiB and returns every other touched page), where this machine
//!     allows it (the bench prints which);
//!   - `wasm_none_rewritten`: the shipped reset with nothing rewritten and
//!     kept (`Tuning::rewrite_resident` 0: every touched page returned, as
//!     shipped before the 512 KiB were kept);
//!   - `wasm_baseline_plugin`: when `WASMOP_BENCH_BASELINE_PLUGIN` names
//!     another build of `good` in the plugin dir (e.g. one built with an
//!     older SDK), that build on the shipped settings;
//!   - `native`: the same work without the component boundary — the host's
//!     JSON texts of the snapshot, the SDK's guest glue (parse, the
//!     plugin's `reconcile`, the plan's JSON text) called in-process, and
//!     the host's parse and check of the plan;
//!   - `native_sdk_run`: `wasmop_sdk::testing::run`, the comparison this
//!     benchmark made before (it also clones the snapshot and validates the
//!     settings every call, and skips the host's plan check).
//!
//! ```sh
//! cargo bench -p wasmop --bench reconcile
//! ```

mod widget;
use widget::{owned_config_map, primary};

use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, UNIX_EPOCH};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use serde_json::{Value, json};
use wasmop::plugin::stages;
use wasmop::sandbox::Tuning;
use wasmop::watch::CachedObject;
use wasmop::{
    Limits, LoadOptions, LoadedPlugin, MemorySource, Sandbox, SandboxConfig, Snapshot,
    build_snapshot,
};
use wasmop_sdk::raw::{self, RawPlugin};
use wasmop_sdk::testing::{SnapshotBuilder, run};

const NOW: &str = "2025-01-01T00:00:00Z";

fn plugin_path(name: &str) -> PathBuf {
    wasmop::reconcile::golden::built_plugin(name).unwrap_or_else(|e| panic!("{e}"))
}

fn load(sandbox: &Arc<Sandbox>, name: &str) -> LoadedPlugin {
    let plugin = LoadedPlugin::load(sandbox, &plugin_path(name), &LoadOptions::default())
        .unwrap_or_else(|e| panic!("{name}.wasm loads: {e}"));
    assert_eq!(plugin.limits(), Limits::default());
    plugin
}

fn snapshot_of(plugin: &LoadedPlugin, owned: &[Value]) -> Snapshot {
    let controller = &plugin.manifest().controllers[0];
    let mut objects = owned.to_vec();
    objects.push(primary());
    build_snapshot(
        controller,
        Arc::new(primary()),
        &MemorySource::new(objects),
        NOW,
        &json!({}),
        vec![],
    )
}

fn text(v: &Value) -> String {
    serde_json::to_string(v).expect("JSON")
}

/// The native counterpart of one wasm call: the host's texts of the
/// snapshot, the guest glue the component runs, the host's plan check.
fn native(s: &Snapshot) -> wasmop::Plan {
    let input = raw::Snapshot {
        controller: s.controller.clone(),
        primary: text(&s.primary),
        owned: s.owned.iter().map(|o| text(o)).collect(),
        related: s
            .related
            .iter()
            .map(|r| raw::RelatedObject {
                read: r.read.clone(),
                object: text(&r.object),
            })
            .collect(),
        now: s.now.clone(),
        deleting: s.deleting,
        settings: text(&s.settings),
        observations: Vec::new(),
    };
    let plan = <raw::Export<good::Good> as RawPlugin>::reconcile(input).expect("plan");
    stages::plan_from_json(&plan).expect("plan")
}

fn bench(c: &mut Criterion) {
    let config = SandboxConfig::default;
    let shipped = Sandbox::new(config()).expect("sandbox");
    eprintln!("memory reset after each call: {}", shipped.memory_reset());
    let tuned = |tuning| Sandbox::tuned(config(), tuning).expect("sandbox");
    let defaults = tuned(Tuning::wasmtime_defaults());
    let no_epoch = tuned(Tuning {
        epoch_interruption: false,
        ..Tuning::default()
    });
    let inlining = tuned(Tuning {
        inlining: true,
        ..Tuning::default()
    });
    let none_rewritten = tuned(Tuning {
        rewrite_resident: 0,
        ..Tuning::default()
    });
    // The faster reset (`--memory-reset=dirty-pages`), where this machine
    // allows it.
    let dirty_pages = Sandbox::new(SandboxConfig {
        dirty_pages_reset: true,
        ..config()
    })
    .expect("sandbox");
    eprintln!(
        "memory reset of wasm_dirty_pages: {}",
        dirty_pages.memory_reset()
    );
    let good = load(&shipped, "good");
    let good_dirty_pages = load(&dirty_pages, "good");
    // A build of `good` to compare with (e.g. against an older SDK), named
    // by `WASMOP_BENCH_BASELINE_PLUGIN` (a plugin name in the plugin dir).
    let baseline = std::env::var("WASMOP_BENCH_BASELINE_PLUGIN")
        .ok()
        .filter(|name| !name.is_empty())
        .map(|name| load(&shipped, &name));
    let good_defaults = load(&defaults, "good");
    let good_no_epoch = load(&no_epoch, "good");
    let good_inlining = load(&inlining, "good");
    let good_none_rewritten = load(&none_rewritten, "good");
    let malformed = load(&shipped, "malformed");
    let malformed_defaults = load(&defaults, "malformed");

    // The 4 KB call, stage by stage, on both pool settings.
    let small = snapshot_of(&good, &[owned_config_map(0)]);
    let plan_text = good.bench_reconcile_text(&small).expect("plan");
    let mut group = c.benchmark_group("stages");
    for (variant, sandbox, good, malformed) in [
        ("shipped", &shipped, &good, &malformed),
        (
            "wasmtime_defaults",
            &defaults,
            &good_defaults,
            &malformed_defaults,
        ),
    ] {
        let limits = Limits::default();
        group.bench_function(BenchmarkId::new("store", variant), |b| {
            b.iter(|| black_box(sandbox.store(&limits, UNIX_EPOCH)));
        });
        group.bench_function(BenchmarkId::new("instantiate", variant), |b| {
            b.iter(|| good.bench_instantiate().expect("instantiates"));
        });
        group.bench_function(BenchmarkId::new("trivial_call", variant), |b| {
            b.iter(|| good.bench_trivial_call().expect("calls"));
        });
        group.bench_function(BenchmarkId::new("ignored_snapshot", variant), |b| {
            b.iter(|| {
                malformed
                    .bench_reconcile_text(black_box(&small))
                    .expect("text")
            });
        });
        group.bench_function(BenchmarkId::new("call_unparsed", variant), |b| {
            b.iter(|| good.bench_reconcile_text(black_box(&small)).expect("text"));
        });
        group.bench_function(BenchmarkId::new("full", variant), |b| {
            b.iter(|| good.reconcile(black_box(&small)).expect("plan"));
        });
    }
    group.bench_function("host_snapshot_texts", |b| {
        b.iter(|| black_box(stages::snapshot_to_wit(black_box(&small))));
    });
    // The live source holds objects as text (`wasmop::watch::CachedObject`)
    // and parses each snapshot object once per call: the 4 KB snapshot's.
    let cached: Vec<CachedObject> = std::iter::once(&small.primary)
        .chain(small.owned.iter())
        .map(|v| CachedObject::from_value(v))
        .collect();
    group.bench_function("host_snapshot_parse", |b| {
        b.iter(|| {
            black_box(&cached)
                .iter()
                .map(CachedObject::value)
                .collect::<Vec<_>>()
        });
    });
    group.bench_function("host_plan_check", |b| {
        b.iter(|| stages::plan_from_json(black_box(&plan_text)).expect("plan"));
    });
    group.bench_function("native_guest_glue", |b| {
        b.iter(|| native(black_box(&small)));
    });
    group.finish();

    interleaved(
        &good,
        &good_defaults,
        &good_no_epoch,
        &good_inlining,
        &good_dirty_pages,
        &good_none_rewritten,
        baseline.as_ref(),
    );

    let mut group = c.benchmark_group("reconcile");
    for (label, owned) in [("4KB", 1usize), ("64KB", 16), ("1MB", 256)] {
        let owned: Vec<Value> = (0..owned).map(owned_config_map).collect();
        let snapshot = snapshot_of(&good, &owned);
        let size = snapshot.approximate_size();
        eprintln!(
            "snapshot {label}: {size} bytes of objects, {} owned",
            snapshot.owned.len()
        );
        // Every variant computes the same plan.
        let expected = native(&snapshot);
        let mut variants = vec![
            ("wasm", &good),
            ("wasm_wasmtime_defaults", &good_defaults),
            ("wasm_no_epoch", &good_no_epoch),
            ("wasm_dirty_pages", &good_dirty_pages),
            ("wasm_none_rewritten", &good_none_rewritten),
        ];
        if let Some(baseline) = &baseline {
            variants.push(("wasm_baseline_plugin", baseline));
        }
        for (_, plugin) in &variants {
            assert_eq!(plugin.reconcile(&snapshot).expect("plan"), expected);
        }
        group.throughput(Throughput::Bytes(size as u64));

        for (variant, plugin) in variants {
            group.bench_with_input(BenchmarkId::new(variant, label), &snapshot, |b, s| {
                b.iter(|| plugin.reconcile(black_box(s)).expect("plan"));
            });
        }
        group.bench_with_input(BenchmarkId::new("native", label), &snapshot, |b, s| {
            b.iter(|| native(black_box(s)));
        });

        let mut sdk = SnapshotBuilder::new(&snapshot.controller)
            .primary(primary())
            .now(NOW);
        for object in owned {
            sdk = sdk.owned(object);
        }
        let sdk = sdk.build();
        group.bench_with_input(BenchmarkId::new("native_sdk_run", label), &sdk, |b, s| {
            b.iter(|| run::<good::Good>(black_box(s)).expect("plan"));
        });
    }
    group.finish();
}

/// A measured case and its name.
type Named<'a> = (&'static str, Box<dyn FnMut() + 'a>);

/// Ratios that hold up on a busy machine: each pair of variants run
/// alternately, call by call, so both see the same load; the median of each
/// and their ratio are printed. Criterion's separate runs of the same cases
/// follow.
fn interleaved(
    good: &LoadedPlugin,
    defaults: &LoadedPlugin,
    no_epoch: &LoadedPlugin,
    inlining: &LoadedPlugin,
    dirty_pages: &LoadedPlugin,
    none_rewritten: &LoadedPlugin,
    baseline: Option<&LoadedPlugin>,
) {
    fn median(mut samples: Vec<Duration>) -> Duration {
        samples.sort();
        samples[samples.len() / 2]
    }
    fn time(f: &mut dyn FnMut()) -> Duration {
        let start = Instant::now();
        f();
        start.elapsed()
    }
    // The 4 KB call's stages, round robin, medians.
    {
        let s = snapshot_of(good, &[owned_config_map(0)]);
        let text = good.bench_reconcile_text(&s).expect("plan");
        let limits = Limits::default();
        let sandbox = Sandbox::new(SandboxConfig::default()).expect("sandbox");
        let malformed = load(&sandbox, "malformed");
        let mut stages: Vec<Named<'_>> = vec![
            (
                "store",
                Box::new(|| drop(black_box(sandbox.store(&limits, UNIX_EPOCH)))),
            ),
            (
                "store + instantiate",
                Box::new(|| good.bench_instantiate().expect("instantiates")),
            ),
            (
                "+ trivial call",
                Box::new(|| good.bench_trivial_call().expect("calls")),
            ),
            (
                "host snapshot texts",
                Box::new(|| drop(black_box(stages::snapshot_to_wit(black_box(&s))))),
            ),
            (
                "ignored snapshot (malformed)",
                Box::new(|| drop(malformed.bench_reconcile_text(black_box(&s)))),
            ),
            (
                "call, plan unparsed",
                Box::new(|| drop(good.bench_reconcile_text(black_box(&s)))),
            ),
            (
                "host plan check",
                Box::new(|| drop(stages::plan_from_json(black_box(&text)))),
            ),
            (
                "full call",
                Box::new(|| drop(good.reconcile(black_box(&s)))),
            ),
            (
                "native guest glue",
                Box::new(|| drop(black_box(native(black_box(&s))))),
            ),
        ];
        let mut times = vec![Vec::new(); stages.len()];
        for _ in 0..3000 {
            for (i, (_, f)) in stages.iter_mut().enumerate() {
                times[i].push(time(f));
            }
        }
        eprintln!("4 KB call by stage, round robin, medians:");
        for ((name, _), t) in stages.iter().zip(times) {
            eprintln!("  {name:<30} {:>8.1?}", median(t));
        }
    }
    eprintln!("interleaved medians (A, B, A/B):");
    for (label, owned, pairs) in [
        ("4KB", 1usize, 4000usize),
        ("64KB", 16, 1000),
        ("1MB", 256, 150),
    ] {
        let owned: Vec<Value> = (0..owned).map(owned_config_map).collect();
        let s = snapshot_of(good, &owned);
        fn call<'a>(p: &'a LoadedPlugin, s: &'a Snapshot) -> impl FnMut() + 'a {
            move || {
                black_box(p.reconcile(black_box(s)).expect("plan"));
            }
        }
        let wasm = |p| call(p, &s);
        let mut cases: Vec<Named<'_>> = vec![
            ("wasm_wasmtime_defaults", Box::new(wasm(defaults))),
            ("wasm_no_epoch", Box::new(wasm(no_epoch))),
            ("wasm_inlining", Box::new(wasm(inlining))),
            ("wasm_dirty_pages", Box::new(wasm(dirty_pages))),
            ("wasm_none_rewritten", Box::new(wasm(none_rewritten))),
            (
                "native",
                Box::new(|| {
                    black_box(native(black_box(&s)));
                }),
            ),
        ];
        if let Some(baseline) = baseline {
            cases.push(("wasm_baseline_plugin", Box::new(wasm(baseline))));
        }
        let mut a = wasm(good);
        for (name, b) in &mut cases {
            let (mut ta, mut tb) = (Vec::new(), Vec::new());
            for i in 0..pairs {
                if i % 2 == 0 {
                    ta.push(time(&mut a));
                    tb.push(time(b));
                } else {
                    tb.push(time(b));
                    ta.push(time(&mut a));
                }
            }
            let (ma, mb) = (median(ta), median(tb));
            eprintln!(
                "  {label:>5}  wasm {ma:>10.1?}  {name:<22} {mb:>10.1?}  wasm/{name} = {:.2}",
                ma.as_secs_f64() / mb.as_secs_f64()
            );
        }
        // CPU, not latency: every thread of the process (the epoch
        // ticker included), in batches of calls one after another that
        // alternate between wasm and native (a few milliseconds each), so
        // both see the same machine load.
        let batch = usize::try_from(4_000_000 / native_time(&s).as_nanos().max(1))
            .unwrap_or(100)
            .clamp(1, 100);
        let (mut wasm_cpu, mut native_cpu) = (Duration::ZERO, Duration::ZERO);
        let (mut wasm_faults, mut native_faults) = (0u64, 0u64);
        let batches = pairs.div_ceil(batch);
        for _ in 0..batches {
            let (start, faults) = (process_cpu(), minor_faults());
            for _ in 0..batch {
                a();
            }
            wasm_cpu += process_cpu() - start;
            wasm_faults += minor_faults() - faults;
            let (start, faults) = (process_cpu(), minor_faults());
            for _ in 0..batch {
                black_box(native(black_box(&s)));
            }
            native_cpu += process_cpu() - start;
            native_faults += minor_faults() - faults;
        }
        let calls = u32::try_from(batches * batch).expect("calls fit");
        let (wasm_cpu, native_cpu) = (wasm_cpu / calls, native_cpu / calls);
        eprintln!(
            "  {label:>5}  CPU per call, all threads: wasm {wasm_cpu:>10.1?}  native {native_cpu:>10.1?}  wasm/native = {:.2}",
            wasm_cpu.as_secs_f64() / native_cpu.as_secs_f64()
        );
        eprintln!(
            "  {label:>5}  page faults per call: wasm {:.1}  native {:.1}",
            wasm_faults as f64 / f64::from(calls),
            native_faults as f64 / f64::from(calls)
        );
    }
}

/// One native call's duration (median of a few), to size CPU batches.
fn native_time(s: &Snapshot) -> Duration {
    let mut times: Vec<Duration> = (0..5)
        .map(|_| {
            let start = Instant::now();
            black_box(native(black_box(s)));
            start.elapsed()
        })
        .collect();
    times.sort();
    times[2]
}

/// Minor page faults of this process so far (every thread; Linux
/// `/proc/self/stat`, field 10).
fn minor_faults() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // The command name (field 2) is in parentheses and may hold spaces.
    let after_name = &stat[stat.rfind(')').expect("stat's name") + 2..];
    after_name
        .split_whitespace()
        .nth(7)
        .and_then(|n| n.parse().ok())
        .expect("minflt")
}

/// CPU time of every thread of this process so far
/// (`CLOCK_PROCESS_CPUTIME_ID`, which brings the calling thread's own time
/// up to date; per-thread `schedstat` lags by up to a scheduler tick for
/// a thread that is running, longer than a batch of 4 KB calls).
fn process_cpu() -> Duration {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(
        u64::try_from(now.tv_sec).expect("non-negative seconds"),
        u32::try_from(now.tv_nsec).expect("nanoseconds below a second"),
    )
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20);
    targets = bench
}
criterion_main!(benches);
