//! Kind-scoped controllers: the `backup` plugin's EtcdBackup controller
//! over N EtcdBackups, before and after it became kind-scoped.
//!
//! - **before** — what one change cost when the controller was
//!   per-object: every EtcdBackup is re-queued (each one reads all
//!   EtcdBackups cluster-wide), so N reconciles, each building its
//!   snapshot over all N backups, calling the plugin and validating the
//!   plan ([`wasmop::reconcile::decide::decide`] with the per-object
//!   manifest: no `scope`, plus the cluster-wide `etcdbackups` read).
//! - **after** — one kind call: the kind snapshot over all N, one plugin
//!   call, the split and validation of the N object plans
//!   ([`wasmop::reconcile::kind::decide_kind`]).
//!
//! Both run the same built `backup.wasm` (its EtcdBackup logic answers a
//! per-object snapshot as it did before), through the host's in-memory
//! object source; nothing is written. The state: a third of the backups
//! completed (their Jobs completed), one running, the rest queued.
//!
//! ```sh
//! bash tests/build-plugins.sh            # or WASMOP_PLUGIN_DIR=<dir of backup.wasm>
//! cargo bench -p wasmop --bench kind     # N = 100 and 1000; KIND_BENCH_N=1000 for one size
//! ```
//!
//! Prints one line per size: wall time of before and after (the median
//! of a few runs each) and their ratio.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use wasmop::plugin::manifest::{Read, Selector};
use wasmop::reconcile::decide::{DecideInput, Decision, decide};
use wasmop::reconcile::kind::{KindOutcome, decide_kind};
use wasmop::{Limits, LoadOptions, LoadedPlugin, MemorySource, Sandbox, SandboxConfig};

const NS: &str = "openshift-etcd";
const NOW: &str = "2025-01-01T12:00:00Z";

fn job_name(uid: &str) -> String {
    format!("cluster-backup-job-{}", &uid[uid.len() - 10..])
}

/// N EtcdBackups (a third completed, one running, the rest queued), their
/// Jobs and the PVC.
fn world(n: usize) -> (Vec<Value>, Vec<Value>) {
    let mut backups = Vec::new();
    let mut others = vec![json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "etcd-backup-pvc", "namespace": NS, "uid": "uid-pvc",
                     "resourceVersion": "1"}})];
    let completed = n / 3;
    for i in 0..n {
        let name = format!("backup-{i:05}");
        let uid = format!("00000000-0000-0000-0000-{i:012}");
        let created = format!(
            "2025-01-01T{:02}:{:02}:{:02}Z",
            i / 3600,
            (i / 60) % 60,
            i % 60
        );
        let mut b = json!({"apiVersion": "operator.openshift.io/v1alpha1", "kind": "EtcdBackup",
            "metadata": {"name": name, "uid": uid, "generation": 1, "resourceVersion": "2",
                         "creationTimestamp": created},
            "spec": {"pvcName": "etcd-backup-pvc"}});
        let job = |finished: bool| {
            let mut job = json!({"apiVersion": "batch/v1", "kind": "Job",
                "metadata": {"name": job_name(&uid), "namespace": NS, "uid": format!("job-{uid}"),
                             "resourceVersion": "3",
                             "labels": {"app": "cluster-backup-job", "backup-name": name},
                             "ownerReferences": [{"apiVersion": "operator.openshift.io/v1alpha1",
                                 "kind": "EtcdBackup", "name": name, "uid": uid, "controller": true}]},
                "spec": {"template": {"spec": {"containers": [{"name": "cluster-backup",
                    "env": [{"name": "CLUSTER_BACKUP_PATH",
                             "value": format!("/etc/kubernetes/cluster-backup/backup-{name}")}]}]}}},
                "status": {}});
            if finished {
                job["status"]["conditions"] = json!([{"type": "Complete", "status": "True"}]);
            }
            job
        };
        let job_ref = json!({"namespace": NS, "name": job_name(&uid)});
        if i < completed {
            b["status"] = json!({"backupJob": job_ref, "conditions": [
                {"type": "BackupPending", "status": "False", "reason": "BackupPending",
                 "message": "done", "lastTransitionTime": "2025-01-01T10:00:00Z"},
                {"type": "BackupCompleted", "status": "True", "reason": "BackupCompleted",
                 "message": "saved", "lastTransitionTime": "2025-01-01T10:00:00Z"}]});
            others.push(job(true));
        } else if i == completed {
            b["status"] = json!({"backupJob": job_ref, "conditions": [
                {"type": "BackupPending", "status": "True", "reason": "BackupPending",
                 "message": "running", "lastTransitionTime": "2025-01-01T11:59:00Z"}]});
            others.push(job(false));
        } else {
            b["status"] = json!({"conditions": [
                {"type": "BackupPending", "status": "True", "reason": "BackupQueued",
                 "message": "waiting", "lastTransitionTime": "2025-01-01T11:00:00Z"}]});
        }
        backups.push(b);
    }
    (backups, others)
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn main() {
    let path = wasmop::reconcile::golden::built_plugin("backup").unwrap_or_else(|e| panic!("{e}"));
    let sandbox = Sandbox::new(SandboxConfig::default()).expect("sandbox");
    let options = LoadOptions {
        settings: json!({}),
        limits: Limits {
            // Generous for the baseline's N-sized snapshots; both sides
            // get the same.
            deadline: Duration::from_secs(30),
            memory_bytes: 256 << 20,
            ..Limits::default()
        },
        ..LoadOptions::default()
    };
    let plugin = LoadedPlugin::load(&sandbox, &path, &options).expect("backup.wasm loads");
    let kind_controller = plugin
        .effective_manifest()
        .controller_named("etcdbackup")
        .expect("etcdbackup controller")
        .clone();
    // The controller as it was: per object, reading every EtcdBackup.
    let mut per_object = kind_controller.clone();
    per_object.scope = wasmop_contract::Scope::Object;
    per_object.reads.insert(
        0,
        Read::new(
            "etcdbackups",
            kind_controller.primary.clone(),
            Selector::ClusterWide,
        ),
    );
    let now: jiff::Timestamp = NOW.parse().expect("now");
    let sizes: Vec<usize> = match std::env::var("KIND_BENCH_N") {
        Ok(n) => vec![n.parse().expect("KIND_BENCH_N is a number")],
        Err(_) => vec![100, 1000],
    };
    println!("| EtcdBackups | before: N per-object reconciles | after: one kind call | ratio |");
    println!("| ---: | ---: | ---: | ---: |");
    for n in sizes {
        let (backups, others) = world(n);
        let source = MemorySource::new(backups.iter().chain(&others).cloned());
        let primaries: Vec<Arc<Value>> = backups.into_iter().map(Arc::new).collect();

        let before_runs = if n > 500 { 3 } else { 5 };
        let mut before = Vec::new();
        for _ in 0..before_runs {
            let started = Instant::now();
            let mut planned = 0usize;
            for p in &primaries {
                let decided = decide(
                    DecideInput {
                        plugin: &plugin,
                        controller: &per_object,
                        source: &source,
                        existing: &source,
                        now,
                    },
                    Arc::clone(p),
                    vec![],
                );
                match decided.decision {
                    Decision::Planned { .. } => planned += 1,
                    other => panic!("before: {other:?}"),
                }
            }
            before.push(started.elapsed());
            assert_eq!(planned, n);
        }

        let mut after = Vec::new();
        for _ in 0..10 {
            let started = Instant::now();
            let decided = decide_kind(
                DecideInput {
                    plugin: &plugin,
                    controller: &kind_controller,
                    source: &source,
                    existing: &source,
                    now,
                },
                primaries.clone(),
            );
            after.push(started.elapsed());
            match decided.outcome {
                KindOutcome::Split { decisions, refused } => {
                    assert!(refused.is_empty(), "{refused:?}");
                    assert_eq!(decisions.len(), n);
                    assert!(
                        decisions
                            .iter()
                            .all(|(_, d)| matches!(d, Decision::Planned { .. }))
                    );
                }
                other => panic!("after: {other:?}"),
            }
        }
        let (b, a) = (median(before), median(after));
        println!(
            "| {n} | {:.1} ms | {:.2} ms | {:.0}× |",
            b.as_secs_f64() * 1e3,
            a.as_secs_f64() * 1e3,
            b.as_secs_f64() / a.as_secs_f64()
        );
    }
}
