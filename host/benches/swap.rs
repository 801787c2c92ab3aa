//! What a hot swap costs between "the file changed" and "the new version is
//! active", less the directory poll interval: reading the file, digesting
//! it, compiling it (or deserialising the cached artifact), instantiating
//! it to read the manifest and validate the settings.
//!
//! Measured with an empty compile cache (first time this version is seen)
//! and with the artifact already cached by digest (a restart, or a file
//! swapped back), in the same run.
//!
//! `cold_start/<plugin>` does the same for each shipped plugin
//! (`plugins/*`) with all of them in one warm cache (`cached`) and with an
//! empty cache (`uncached`, a real compile): what each plugin costs when the
//! operator starts.
//!
//! ```sh
//! cargo bench -p wasmop --bench swap
//! ```

use std::path::PathBuf;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use wasmop::{CompileCache, LoadOptions, LoadedPlugin, Sandbox, SandboxConfig};

fn plugin_path(name: &str) -> PathBuf {
    wasmop::reconcile::golden::built_plugin(name).unwrap_or_else(|e| panic!("{e}"))
}

fn bench(c: &mut Criterion) {
    let sandbox = Sandbox::new(SandboxConfig::default()).expect("sandbox");
    let path = plugin_path("good-v2");
    let scratch = std::env::temp_dir().join(format!("wasmop-bench-swap-{}", std::process::id()));
    let mut group = c.benchmark_group("swap");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(10));

    // Criterion calls the routine more than once (warm-up, measurement):
    // the counter lives outside it so every iteration gets a new directory.
    let fresh = std::sync::atomic::AtomicU64::new(0);
    group.bench_function("load_uncached", |b| {
        b.iter(|| {
            // A fresh, empty cache directory every time: a real compile.
            let i = fresh.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let options = LoadOptions {
                cache: Some(CompileCache::new(scratch.join(format!("cold-{i}")))),
                ..LoadOptions::default()
            };
            let p = LoadedPlugin::load(&sandbox, &path, &options).expect("loads");
            assert!(!p.compiled_from_cache());
        });
    });

    let warm = LoadOptions {
        cache: Some(CompileCache::new(scratch.join("warm"))),
        ..LoadOptions::default()
    };
    LoadedPlugin::load(&sandbox, &path, &warm).expect("fills the cache");
    group.bench_function("load_cached", |b| {
        b.iter(|| {
            let p = LoadedPlugin::load(&sandbox, &path, &warm).expect("loads");
            assert!(p.compiled_from_cache());
        });
    });
    // The same on a sandbox with wasmtime's default pool settings.
    let defaults = wasmop::Sandbox::tuned(
        SandboxConfig::default(),
        wasmop::sandbox::Tuning::wasmtime_defaults(),
    )
    .expect("sandbox");
    LoadedPlugin::load(&defaults, &path, &warm).expect("fills the cache");
    group.bench_function("load_cached_wasmtime_defaults", |b| {
        b.iter(|| {
            let p = LoadedPlugin::load(&defaults, &path, &warm).expect("loads");
            assert!(p.compiled_from_cache());
        });
    });
    group.finish();

    // Cold start: every shipped plugin, from one warm cache and uncached.
    let mut group = c.benchmark_group("cold_start");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(5));
    let shared = LoadOptions {
        cache: Some(CompileCache::new(scratch.join("shipped"))),
        ..LoadOptions::default()
    };
    for name in SHIPPED {
        let path = plugin_path(name);
        LoadedPlugin::load(&sandbox, &path, &shared).expect("fills the cache");
    }
    for name in SHIPPED {
        let path = plugin_path(name);
        group.bench_function(format!("cached/{name}"), |b| {
            b.iter(|| {
                let p = LoadedPlugin::load(&sandbox, &path, &shared).expect("loads");
                assert!(p.compiled_from_cache());
            });
        });
    }
    for name in SHIPPED {
        let path = plugin_path(name);
        group.bench_function(format!("uncached/{name}"), |b| {
            b.iter(|| {
                let i = fresh.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let options = LoadOptions {
                    cache: Some(CompileCache::new(scratch.join(format!("cold-{i}")))),
                    ..LoadOptions::default()
                };
                let p = LoadedPlugin::load(&sandbox, &path, &options).expect("loads");
                assert!(!p.compiled_from_cache());
            });
        });
    }
    group.finish();
    let _ = std::fs::remove_dir_all(&scratch);
}

/// The shipped plugins (`plugins/*`).
const SHIPPED: [&str; 5] = ["instance", "backup", "fleet", "engine", "team"];

criterion_group!(benches, bench);
criterion_main!(benches);
