//! JavaScript and Python plugins against Rust: the same plugin (`good`,
//! and its ports `good-js` and `good-py`), one run, medians of calls made
//! round robin across the three so that all see the same machine load.
//!
//! Per plugin: the component's size; compiling it (no compile cache) and
//! loading it from the compile cache; the memory a fresh instance holds
//! before it runs; and per call, medians: a fresh store and instantiation
//! alone; the cheapest export (`validate-settings` of `{}`); reconcile of
//! a snapshot of about 4 KB and of about 64 KB (a Widget and 1 or 16
//! owned ConfigMaps of about 4 KB), the whole call and without the host's
//! parse of the plan. The guest's own work is the whole call less the
//! instantiation and the host's halves.
//!
//! Needs `good`, `good-js` and `good-py` in the plugin dir
//! (`bash tests/build-plugins.sh`, or `$WASMOP_PLUGIN_DIR`).
//!
//! ```sh
//! cargo bench -p wasmop --bench polyglot
//! ```

mod widget;
use widget::{owned_config_map, primary};

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use wasmop::{
    CompileCache, LoadOptions, LoadedPlugin, MemorySource, Sandbox, SandboxConfig, Snapshot,
    build_snapshot,
};

const PLUGINS: [&str; 3] = ["good", "good-js", "good-py"];
/// Calls per measure and plugin (round robin).
const ROUNDS: usize = 60;

fn snapshot_of(plugin: &LoadedPlugin, owned: usize) -> Snapshot {
    let controller = &plugin.manifest().controllers[0];
    let mut objects: Vec<Value> = (0..owned).map(owned_config_map).collect();
    objects.push(primary());
    build_snapshot(
        controller,
        Arc::new(primary()),
        &MemorySource::new(objects),
        "2025-01-01T00:00:00Z",
        &json!({}),
        vec![],
    )
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn time(f: &mut dyn FnMut()) -> Duration {
    let t = Instant::now();
    f();
    t.elapsed()
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1e3)
}

fn main() {
    let sandbox = Sandbox::new(SandboxConfig::default()).expect("sandbox");
    let cache_dir =
        std::env::temp_dir().join(format!("wasmop-bench-polyglot-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache_dir);
    std::fs::create_dir_all(&cache_dir).expect("cache dir");

    // Load and compile: once without a cache (a compile), then from the
    // compile cache the first load filled.
    let mut plugins = Vec::new();
    eprintln!("plugin   | bytes      | compile+load ms | cached load ms | start memory MiB");
    for name in PLUGINS {
        let path = wasmop::reconcile::golden::built_plugin(name).unwrap_or_else(|e| panic!("{e}"));
        let bytes = std::fs::metadata(&path).expect("plugin file").len();
        let options = LoadOptions {
            cache: Some(CompileCache::new(cache_dir.clone())),
            ..LoadOptions::default()
        };
        let t = Instant::now();
        let cold = LoadedPlugin::load(&sandbox, &path, &options).expect("loads");
        let compile = t.elapsed();
        assert!(!cold.compiled_from_cache());
        let t = Instant::now();
        let warm = LoadedPlugin::load(&sandbox, &path, &options).expect("loads");
        let cached = t.elapsed();
        assert!(warm.compiled_from_cache());
        eprintln!(
            "{name:8} | {bytes:10} | {:>15} | {:>14} | {:.1}",
            ms(compile),
            ms(cached),
            warm.start_memory_bytes() as f64 / f64::from(1 << 20)
        );
        plugins.push((name, warm));
    }
    let _ = std::fs::remove_dir_all(&cache_dir);

    let snapshots: Vec<(Snapshot, Snapshot)> = plugins
        .iter()
        .map(|(_, p)| (snapshot_of(p, 1), snapshot_of(p, 16)))
        .collect();
    let sizes = |s: &Snapshot| {
        serde_json::to_string(&*s.primary).map_or(0, |t| t.len())
            + s.owned
                .iter()
                .map(|o| serde_json::to_string(&**o).map_or(0, |t| t.len()))
                .sum::<usize>()
    };
    eprintln!(
        "\nsnapshots: {} and {} bytes of objects",
        sizes(&snapshots[0].0),
        sizes(&snapshots[0].1)
    );

    type Measure<'a> = (
        &'a str,
        Box<dyn Fn(&LoadedPlugin, &(Snapshot, Snapshot)) + 'a>,
    );
    let measures: Vec<Measure> = vec![
        (
            "instantiate",
            Box::new(|p, _| p.bench_instantiate().expect("instantiates")),
        ),
        (
            "trivial call",
            Box::new(|p, _| p.bench_trivial_call().expect("calls")),
        ),
        (
            "4 KB call",
            Box::new(|p, s| {
                black_box(p.reconcile(&s.0).expect("plans"));
            }),
        ),
        (
            "4 KB, plan text",
            Box::new(|p, s| {
                black_box(p.bench_reconcile_text(&s.0).expect("plans"));
            }),
        ),
        (
            "64 KB call",
            Box::new(|p, s| {
                black_box(p.reconcile(&s.1).expect("plans"));
            }),
        ),
        (
            "64 KB, plan text",
            Box::new(|p, s| {
                black_box(p.bench_reconcile_text(&s.1).expect("plans"));
            }),
        ),
    ];
    eprintln!("\nper call, medians of {ROUNDS} round robin, ms (ratio to good):");
    eprintln!(
        "{:16} | {:>9} | {:>18} | {:>18}",
        "measure", "good", "good-js", "good-py"
    );
    for (what, f) in &measures {
        // Warm up every plugin once.
        for ((_, p), s) in plugins.iter().zip(&snapshots) {
            f(p, s);
        }
        let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); plugins.len()];
        for _ in 0..ROUNDS {
            for (i, ((_, p), s)) in plugins.iter().zip(&snapshots).enumerate() {
                samples[i].push(time(&mut || f(p, s)));
            }
        }
        let medians: Vec<Duration> = samples.into_iter().map(median).collect();
        let ratio = |d: Duration| d.as_secs_f64() / medians[0].as_secs_f64().max(1e-9);
        eprintln!(
            "{what:16} | {:>9} | {:>9} ({:>5.1}x) | {:>9} ({:>5.1}x)",
            ms(medians[0]),
            ms(medians[1]),
            ratio(medians[1]),
            ms(medians[2]),
            ratio(medians[2]),
        );
    }
}
