//! One reconcile through the host — fresh store, instantiate, pass the
//! snapshot, call, convert the plan — against the same plugin logic (the
//! `good` test plugin) called natively through the SDK's `testing::run`,
//! which makes the same JSON-text round trip a component makes.
//!
//! Snapshots of about 4 KB, 64 KB and 1 MB: a Widget plus owned
//! ConfigMaps of about 4 KB each. Needs `target/plugins/good.wasm`
//! (`bash tests/build-plugins.sh`) or `$WASMOP_PLUGIN_DIR`.
//!
//! ```sh
//! cargo bench -p wasmop --bench reconcile
//! ```

use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use serde_json::{Value, json};
use wasmop::{
    Limits, LoadOptions, LoadedPlugin, MemorySource, Sandbox, SandboxConfig, build_snapshot,
};
use wasmop_sdk::testing::{SnapshotBuilder, run};

const NOW: &str = "2025-01-01T00:00:00Z";
const UID: &str = "00000000-0000-0000-0000-000000000001";

fn plugin_path() -> PathBuf {
    wasmop::reconcile::golden::built_plugin("good").unwrap_or_else(|e| panic!("{e}"))
}

fn primary() -> Value {
    json!({"apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
           "metadata": {"name": "w", "namespace": "ns", "uid": UID, "generation": 1},
           "spec": {"value": "hello"}})
}

/// A ConfigMap owned by the Widget, about 4 KB as JSON.
fn owned_config_map(i: usize) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": format!("w-data-{i:04}"), "namespace": "ns",
                        "uid": format!("uid-{i}"), "resourceVersion": "1",
                        "ownerReferences": [{"apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
                                             "name": "w", "uid": UID, "controller": true}]},
           "data": {"payload": "x".repeat(3800)}})
}

fn bench(c: &mut Criterion) {
    let sandbox = Sandbox::new(SandboxConfig::default()).expect("sandbox");
    let plugin = LoadedPlugin::load(&sandbox, &plugin_path(), &LoadOptions::default())
        .expect("good.wasm loads");
    let controller = plugin.manifest().controllers[0].clone();
    assert_eq!(plugin.limits(), Limits::default());

    let mut group = c.benchmark_group("reconcile");
    for (label, owned) in [("4KB", 1usize), ("64KB", 16), ("1MB", 256)] {
        let owned: Vec<Value> = (0..owned).map(owned_config_map).collect();
        let mut objects = owned.clone();
        objects.push(primary());
        let source = MemorySource::new(objects);
        let snapshot = build_snapshot(
            &controller,
            Arc::new(primary()),
            &source,
            NOW,
            &json!({}),
            vec![],
        );
        let size = snapshot.approximate_size();
        eprintln!(
            "snapshot {label}: {size} bytes of objects, {} owned",
            snapshot.owned.len()
        );
        group.throughput(Throughput::Bytes(size as u64));

        group.bench_with_input(BenchmarkId::new("wasm", label), &snapshot, |b, s| {
            b.iter(|| plugin.reconcile(black_box(s)).expect("plan"));
        });

        let mut native = SnapshotBuilder::new(&controller.name)
            .primary(primary())
            .now(NOW);
        for object in owned {
            native = native.owned(object);
        }
        let native = native.build();
        group.bench_with_input(BenchmarkId::new("native", label), &native, |b, s| {
            b.iter(|| run::<good::Good>(black_box(s)).expect("plan"));
        });
    }
    group.finish();
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
