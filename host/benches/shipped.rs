//! The shipped plugins on their own inputs: what one reconcile call of
//! `instance`, `engine`, `fleet`, `team` and `backup` costs for each of
//! their golden fixtures (`plugins/*/tests/golden/*.yaml`), and what the
//! deadline's epoch checks add to it.
//!
//! Each fixture is decided once as `wasmop plan` decides it
//! ([`wasmop::reconcile::offline::run`]); the snapshot the plugin got is
//! then handed to [`LoadedPlugin::reconcile`] (store, instantiation, the
//! call, the plan's check) on two sandboxes, the shipped one and one without
//! epoch interruption, alternately call by call (`rounds` pairs, the order
//! swapped every pair) so both see the same machine. A kind-scoped
//! controller's fixture is its one call over every primary in the file.
//! Admission fixtures, and fixtures the plugin is not called for (a primary
//! being deleted without its finalizer), are left out and counted in the
//! output (`measured+left out`).
//!
//! The plugins are the built components (`bash tests/build-plugins.sh`, or
//! `WASMOP_PLUGIN_DIR` naming a directory that holds them):
//!
//! ```sh
//! cargo bench -p wasmop --bench shipped            # every plugin
//! cargo bench -p wasmop --bench shipped -- fleet   # some of them
//! WASMOP_BENCH_ROUNDS=2000 cargo bench -p wasmop --bench shipped
//! WASMOP_BENCH_EACH=1 cargo bench -p wasmop --bench shipped      # per fixture
//! WASMOP_BENCH_INLINING=1 cargo bench -p wasmop --bench shipped  # Cranelift inlining on
//! WASMOP_BENCH_FUEL=1 cargo bench -p wasmop --bench shipped      # fuel instead of epochs
//! WASMOP_BENCH_COUNT_CHECKS=1 cargo bench -p wasmop --bench shipped  # where the checks are
//! WASMOP_BENCH_SETS=5 cargo bench -p wasmop --bench shipped     # 5 sets, then their medians
//! WASMOP_BENCH_DIRTY_PAGES=1 cargo bench -p wasmop --bench shipped  # the faster memory reset
//! ```
//!
//! The ratio of one set moves by a point or two from one set to the next
//! on the same build (BENCHMARKS.md); `WASMOP_BENCH_SETS=n` measures every
//! plugin `n` times over, one plugin after the other in each set, and ends
//! with each plugin's median ratio of the sets and their range.
//!
//! `WASMOP_BENCH_COUNT_CHECKS=1` times nothing: it makes one call per
//! fixture on a sandbox that counts every epoch check against the guest
//! function it is in (`Tuning::count_checks`) and prints, per plugin, the
//! checks per call and the functions with the most. Plugins built by
//! `tests/build-plugins.sh` have no function names (they are stripped), so
//! functions show as `#` and their index unless the plugin was built with
//! its name section kept.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use wasmop::reconcile::golden::{GOLDEN_NOW, built_plugin};
use wasmop::reconcile::offline;
use wasmop::sandbox::{CheckPlace, Tuning};
use wasmop::{LoadOptions, LoadedPlugin, Sandbox, SandboxConfig, Snapshot};

const SHIPPED: [&str; 5] = ["instance", "engine", "fleet", "team", "backup"];

/// One fixture's medians.
struct Measured {
    fixture: String,
    snapshot_bytes: usize,
    epoch: Duration,
    no_epoch: Duration,
}

fn main() {
    let wanted: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let rounds: usize = std::env::var("WASMOP_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(600);
    let sets: usize = std::env::var("WASMOP_BENCH_SETS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(1)
        .max(1);
    // WASMOP_BENCH_INLINING=1: both sandboxes with Cranelift's inlining
    // on (`Tuning::inlining`), to price the checks it removes.
    let inlining = std::env::var_os("WASMOP_BENCH_INLINING").is_some_and(|v| v != "0");
    let tuning = Tuning {
        inlining,
        ..Tuning::default()
    };
    // WASMOP_BENCH_FUEL=1: the first arm counts fuel instead of epochs
    // (`Tuning::fuel`), wasmtime's other way to stop a guest.
    let fuel = std::env::var_os("WASMOP_BENCH_FUEL").is_some_and(|v| v != "0");
    // WASMOP_BENCH_COUNT_CHECKS=1: count the checks instead of timing.
    let count = std::env::var_os("WASMOP_BENCH_COUNT_CHECKS").is_some_and(|v| v != "0");
    // WASMOP_BENCH_DIRTY_PAGES=1: both sandboxes with the faster reset of a
    // call's memory (`--memory-reset=dirty-pages`) where the machine
    // allows it.
    let config = || SandboxConfig {
        dirty_pages_reset: std::env::var_os("WASMOP_BENCH_DIRTY_PAGES").is_some_and(|v| v != "0"),
        ..SandboxConfig::default()
    };
    let shipped = Sandbox::tuned(
        config(),
        Tuning {
            epoch_interruption: !fuel,
            fuel,
            count_checks: count,
            ..tuning
        },
    )
    .expect("sandbox");
    eprintln!("memory reset after each call: {}", shipped.memory_reset());
    let no_epoch = Sandbox::tuned(
        config(),
        Tuning {
            epoch_interruption: false,
            ..tuning
        },
    )
    .expect("sandbox");

    if count {
        eprintln!(
            "each shipped plugin on its golden fixtures: epoch checks of one call per fixture, by guest function"
        );
    } else {
        eprintln!(
            "each shipped plugin on its golden fixtures, {rounds} interleaved pairs per fixture, medians{}",
            if inlining {
                ", Cranelift inlining on"
            } else {
                ""
            }
        );
        let arm = if fuel { "fuel" } else { "epoch" };
        eprintln!(
            "  {:<9} {:>8} {:>14} {:>12} {:>12} {:>17}",
            "plugin",
            "fixtures",
            "call (median)",
            format!("sum {arm}"),
            "sum neither",
            format!("{arm}/neither")
        );
    }
    // Per plugin, each set's sums with checks and without.
    let mut sums: BTreeMap<&str, Vec<(Duration, Duration)>> = BTreeMap::new();
    for set in 1..=if count { 1 } else { sets } {
        if sets > 1 && !count {
            eprintln!("  set {set} of {sets}");
        }
        for name in SHIPPED {
            if !wanted.is_empty() && !wanted.iter().any(|w| w == name) {
                continue;
            }
            let path = built_plugin(name).unwrap_or_else(|e| panic!("{e}"));
            let (measured, left_out, checks) =
                measure(&shipped, &no_epoch, &path, name, rounds, count);
            if count {
                report_checks(name, checks, measured.len(), left_out);
            } else {
                report(name, &measured, left_out);
                sums.entry(name).or_default().push((
                    measured.iter().map(|m| m.epoch).sum(),
                    measured.iter().map(|m| m.no_epoch).sum(),
                ));
            }
        }
    }
    if sets > 1 && !count {
        eprintln!("  medians of the {sets} sets (sums of the fixtures' medians):");
        for (name, sets) in sums {
            report_sets(name, &sets);
        }
    }
}

/// A plugin's median sums and median ratio over the sets, and the range of
/// the sets' ratios.
fn report_sets(name: &str, sets: &[(Duration, Duration)]) {
    let ratio = |(with, without): &(Duration, Duration)| {
        with.as_secs_f64() / without.as_secs_f64().max(f64::MIN_POSITIVE)
    };
    let mut ratios: Vec<f64> = sets.iter().map(ratio).collect();
    ratios.sort_by(f64::total_cmp);
    let with = median(sets.iter().map(|s| s.0).collect());
    let without = median(sets.iter().map(|s| s.1).collect());
    eprintln!(
        "  {name:<9} {with:>12.3?} {without:>12.3?} ratio {:.3} ({:.3}–{:.3})",
        ratios[ratios.len() / 2],
        ratios[0],
        ratios[ratios.len() - 1]
    );
}

/// Every reconcile fixture of plugin `name`, measured; how many fixtures
/// were left out; and, when `count`ing, the epoch checks of one call of
/// each per guest function (then nothing is timed).
fn measure(
    shipped: &Arc<Sandbox>,
    no_epoch: &Arc<Sandbox>,
    path: &Path,
    name: &str,
    rounds: usize,
    count: bool,
) -> (Vec<Measured>, usize, BTreeMap<CheckPlace, u64>) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../plugins")
        .join(name)
        .join("tests/golden");
    let mut fixtures: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    fixtures.sort();
    // Plugins loaded once per settings, on each sandbox.
    let mut loaded: BTreeMap<String, (LoadedPlugin, LoadedPlugin)> = BTreeMap::new();
    let mut measured = Vec::new();
    let mut left_out = 0;
    // Counting: only the checks of the one call per fixture below are kept.
    let mut counted: BTreeMap<CheckPlace, u64> = BTreeMap::new();
    for fixture in fixtures {
        let text = std::fs::read_to_string(&fixture).expect("fixture");
        let input = offline::parse_input(&text, &fixture.display().to_string())
            .unwrap_or_else(|e| panic!("{e}"));
        if input.review.is_some() {
            left_out += 1;
            continue;
        }
        let settings = input.options.settings_or_empty();
        let (with, without) = loaded.entry(settings.to_string()).or_insert_with(|| {
            let load = |sandbox: &Arc<Sandbox>| {
                let options = LoadOptions {
                    settings: settings.clone(),
                    ..LoadOptions::default()
                };
                LoadedPlugin::load(sandbox, path, &options)
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            };
            (load(shipped), load(no_epoch))
        });
        let now = input.options.now.as_deref().unwrap_or(GOLDEN_NOW);
        let run = offline::run(with, &input, Some(now), None)
            .unwrap_or_else(|e| panic!("{}: {e}", fixture.display()));
        let Some(snapshot) = run.snapshot else {
            left_out += 1;
            continue;
        };
        // Both sandboxes answer alike (the plan, or the same error).
        assert_eq!(
            format!("{:?}", with.reconcile(&snapshot)),
            format!("{:?}", without.reconcile(&snapshot)),
            "{}: the two sandboxes disagree",
            fixture.display()
        );
        let (epoch, no_epoch) = if count {
            shipped.take_check_counts();
            drop(black_box(with.reconcile(&snapshot)));
            for (place, n) in shipped.take_check_counts() {
                *counted.entry(place).or_insert(0) += n;
            }
            (Duration::ZERO, Duration::ZERO)
        } else {
            interleaved(with, without, &snapshot, rounds)
        };
        measured.push(Measured {
            fixture: fixture
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default(),
            snapshot_bytes: snapshot_bytes(&snapshot),
            epoch,
            no_epoch,
        });
    }
    (measured, left_out, counted)
}

/// Medians of `rounds` calls of `a` and of `b`, alternating.
fn interleaved(
    a: &LoadedPlugin,
    b: &LoadedPlugin,
    snapshot: &Snapshot,
    rounds: usize,
) -> (Duration, Duration) {
    let call = |p: &LoadedPlugin| {
        let start = Instant::now();
        drop(black_box(p.reconcile(black_box(snapshot))));
        start.elapsed()
    };
    let (mut ta, mut tb) = (Vec::with_capacity(rounds), Vec::with_capacity(rounds));
    for i in 0..rounds {
        if i % 2 == 0 {
            ta.push(call(a));
            tb.push(call(b));
        } else {
            tb.push(call(b));
            ta.push(call(a));
        }
    }
    (median(ta), median(tb))
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// Bytes of the snapshot's objects as JSON text.
fn snapshot_bytes(s: &Snapshot) -> usize {
    let len = |v: &Value| serde_json::to_string(v).map_or(0, |t| t.len());
    len(&s.primary)
        + s.owned.iter().map(|o| len(o)).sum::<usize>()
        + s.related.iter().map(|r| len(&r.object)).sum::<usize>()
}

/// Checks per call of plugin `name`, how many are at function entries (a
/// function's check at its lowest offset) and how many at loop headers,
/// and the functions with the most.
fn report_checks(name: &str, checks: BTreeMap<CheckPlace, u64>, calls: usize, left_out: usize) {
    // Per function: (entries, loop turns). The places of one function are
    // in offset order, so its first is its entry.
    let mut functions: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    for (place, n) in &checks {
        match functions.get_mut(place.function.as_str()) {
            Some((_, turns)) => *turns += n,
            None => {
                functions.insert(&place.function, (*n, 0));
            }
        }
    }
    let entries: u64 = functions.values().map(|f| f.0).sum();
    let turns: u64 = functions.values().map(|f| f.1).sum();
    let total = entries + turns;
    let per_call = |n: u64| n / u64::try_from(calls.max(1)).unwrap_or(1);
    #[allow(clippy::cast_precision_loss)]
    let share = |n: u64| n as f64 * 100.0 / total.max(1) as f64;
    eprintln!(
        "  {name:<9} {calls}+{left_out} fixtures, {} epoch checks per call (mean): {} at function entries ({:.0}%), {} at loop headers; in {} functions",
        per_call(total),
        per_call(entries),
        share(entries),
        per_call(turns),
        functions.len()
    );
    let mut by_count: Vec<(&str, (u64, u64))> = functions.into_iter().collect();
    by_count.sort_by_key(|(_, (entries, turns))| std::cmp::Reverse(entries + turns));
    eprintln!(
        "      {:>9} {:>6} {:>9} {:>9}  function",
        "checks", "share", "entries", "loops"
    );
    for (function, (entries, turns)) in by_count.iter().take(30) {
        let function = format!("{:#}", rustc_demangle::demangle(function));
        eprintln!(
            "      {:>9} {:>5.1}% {entries:>9} {turns:>9}  {function}",
            entries + turns,
            share(entries + turns)
        );
    }
}

fn report(name: &str, measured: &[Measured], left_out: usize) {
    if measured.is_empty() {
        eprintln!("  {name:<9} no reconcile fixtures ({left_out} left out)");
        return;
    }
    let sum = |f: fn(&Measured) -> Duration| measured.iter().map(f).sum::<Duration>();
    let (epoch, no_epoch) = (sum(|m| m.epoch), sum(|m| m.no_epoch));
    let mut calls: Vec<Duration> = measured.iter().map(|m| m.epoch).collect();
    calls.sort();
    let ratio = |m: &Measured| m.epoch.as_secs_f64() / m.no_epoch.as_secs_f64();
    let (lo, hi) = measured
        .iter()
        .map(ratio)
        .fold((f64::MAX, f64::MIN), |(lo, hi), r| (lo.min(r), hi.max(r)));
    eprintln!(
        "  {name:<9} {:>8} {:>14.1?} {:>12.1?} {:>12.1?} {:>8.3} ({lo:.2}–{hi:.2})",
        format!("{}+{left_out}", measured.len()),
        calls[calls.len() / 2],
        epoch,
        no_epoch,
        epoch.as_secs_f64() / no_epoch.as_secs_f64(),
    );
    if std::env::var_os("WASMOP_BENCH_EACH").is_some() {
        for m in measured {
            eprintln!(
                "      {:<48} {:>7} B {:>10.1?} {:>10.1?} {:>6.3}",
                m.fixture,
                m.snapshot_bytes,
                m.epoch,
                m.no_epoch,
                ratio(m)
            );
        }
    }
}
