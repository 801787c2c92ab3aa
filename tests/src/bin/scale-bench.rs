//! Scale benchmark (not a test): N Widgets reconciled by the `good` plugin
//! in an in-process operator against the local control plane, each figure
//! next to a floor measured in the same run by a plain kube-rs client that
//! makes the same necessary writes with the same concurrency.
//!
//! Run it through `tests/bench-scale.sh` (builds the plugins, starts the
//! local control plane, runs this in release mode):
//!
//! ```sh
//! bash tests/bench-scale.sh 100 1000 10000
//! ```
//!
//! For each N it prints one line per phase:
//! - `converge`: first create → every Widget Ready and Reconciled, writes
//!   per Widget (the API server's `apiserver_request_total`, Widgets and
//!   ConfigMaps, the bench's own creates included), and the process's RSS;
//! - `rollover1`, `rollover2`, …: `good` swapped for `good-v2` in the
//!   plugin directory → every ConfigMap relabelled and every Widget
//!   reconciled by 0.2.0, then back to `good` (0.1.0), and so on
//!   (`WASMOP_BENCH_ROLLOVERS`, default 3), each round next to a floor
//!   rollover, the order of the two alternating between rounds; then the
//!   medians and the median of the rounds' ratios, and the process's RSS
//!   after the rollovers with its peak so far (the floor's client runs in
//!   the same process, so the peak covers it too);
//! - each operator line also gives when the operator became idle ("idle
//!   after"): its queue empty, the echoes of its own writes reconciled
//!   too (they wait behind every first reconcile, so the Widgets are
//!   Ready first). Writes, plugin calls (and how many reconciles were
//!   queued as such echoes) and CPU are counted up to then, and the next
//!   phase starts only after it;
//! - each line also gives the CPU seconds the bench process, the API
//!   server and etcd used during the phase (the machine's cores are
//!   shared by all three), and with `WASMOP_BENCH_REQUESTS=1` every
//!   request the API server counted, by verb and resource;
//! - an unmeasured warm-up (200 Widgets written the floor's way) comes
//!   first, so neither side pays for the control plane's first writes;
//! - the floor of each: N creates (16 at once, like the operator's) piped
//!   into one ConfigMap apply and one status apply per Widget, as many at
//!   once as the operator has workers, each object with the fields the
//!   operator writes (its labels, annotation and conditions);
//! - the bench follows the operator's progress through the operator's own
//!   Widget cache, not a watch of its own, so the API server serves the
//!   operator's watches and nothing more;
//! - `sweep`: one orphan sweep of the converged namespace (every owner
//!   alive, so N ConfigMaps looked at and none collected; median of three)
//!   next to its floor, the paged metadata list of the same ConfigMaps
//!   that any sweep must make;
//! - `memory`: bytes of RSS per cached object, the host's watch cache
//!   (`wasmop::watch::cache`, what every snapshot reads) against a minimal
//!   kube-rs reflector holding the same objects (DynamicObject Widgets,
//!   typed ConfigMaps, managedFields dropped like the host does), each in a
//!   child process of its own over the converged namespace, less the RSS
//!   of a child that only made a client.
//!
//! `--memory-only N...` (or `WASMOP_BENCH_MEMORY_ONLY=1` through the
//! script) measures only the last figure, over N Widgets and their
//! ConfigMaps written the floor's way (create, ConfigMap apply, status
//! apply), without the operator or the floor timings.

use std::collections::HashSet;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use wasmop_tests::widgets::{create_numbered, numbered_widget, widgets_in};

use anyhow::{Context, Result, bail};
use futures::{StreamExt, stream};
use kube::Client;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};
use wasmop::LoadOptions;
use wasmop::controller::OperatorConfig;
use wasmop::delivery::hotswap::{OptionsFor, PluginDir};
use wasmop::watch::cache::KindKey;
use wasmop_tests::apiwrites::{self, Writes};
use wasmop_tests::operator::{RunningOperator, load_plugin, plugin_path, sandbox, test_config};
use wasmop_tests::{TestNamespace, apply_test_crds};

/// The ConfigMap label and the plugin version the Widgets converge to
/// (`good`); the rollovers go to `good-v2` ("v2", "0.2.0") and back.
const FIRST: (&str, &str) = ("v1", "0.1.0");

/// Creates in flight at once, for the operator run and the floor alike.
const CREATE_CONCURRENCY: usize = 16;

/// The resources whose writes are counted.
const RESOURCES: &[&str] = &["widgets", "configmaps"];

fn total(w: &Writes) -> f64 {
    w.values().sum()
}

/// A `/proc/self/status` memory field (`VmRSS:`, `VmHWM:`) in KiB.
fn status_kib(field: &str) -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0)
}

/// (VmRSS, VmHWM) of this process in MiB.
fn rss() -> (f64, f64) {
    (status_kib("VmRSS:") / 1024.0, status_kib("VmHWM:") / 1024.0)
}

/// Waits until `done` answers true, polling every `every`, for at most
/// `deadline`; returns when it became true.
async fn until<F, Fut>(
    what: &str,
    every: Duration,
    deadline: Duration,
    mut done: F,
) -> Result<Instant>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool>>,
{
    let start = Instant::now();
    loop {
        if done().await? {
            return Ok(Instant::now());
        }
        if start.elapsed() > deadline {
            bail!("{what}: not within {deadline:?}");
        }
        // Poll interval of a bounded wait, not a synchronisation sleep.
        tokio::time::sleep(every).await;
    }
}

fn reconciled_by(w: &Value, version: &str) -> bool {
    let conds = w["status"]["conditions"].as_array();
    let has = |t: &str, pred: &dyn Fn(&Value) -> bool| {
        conds.is_some_and(|cs| cs.iter().any(|c| c["type"] == t && pred(c)))
    };
    has("Ready", &|c| c["status"] == "True")
        && has("Reconciled", &|c| {
            c["status"] == "True"
                && c["message"]
                    .as_str()
                    .is_some_and(|m| m.contains(&format!(" {version} ")))
        })
}

/// Which Widgets the operator's cache last stored reconciled by the
/// version the bench waits for, and (on a channel) how many, with the instant of the event
/// that made that count.
struct Progress {
    version: String,
    done: HashSet<String>,
    count: tokio::sync::watch::Sender<(usize, Instant)>,
}

impl Progress {
    /// Counts from now on the Widgets reconciled by `version`.
    fn wait_for(&mut self, version: &str) {
        self.version = version.to_owned();
        self.done.clear();
        self.count.send_replace((0, Instant::now()));
    }

    fn seen(&mut self, name: &str, w: &Value) {
        let changed = if reconciled_by(w, &self.version) {
            self.done.insert(name.to_owned())
        } else {
            self.done.remove(name)
        };
        if changed {
            self.count.send_replace((self.done.len(), Instant::now()));
        }
    }
}

/// How the bench follows the Widgets: progress, a count of reconciled
/// Widgets with the instant of the event that changed it, and the task.
type WidgetWatch = (
    Arc<Mutex<Progress>>,
    tokio::sync::watch::Receiver<(usize, Instant)>,
    tokio::task::JoinHandle<()>,
);

/// Follows every Widget the operator's own watch stores in its cache
/// ([`wasmop::watch::cache::KindCache::observe`]). Completion is judged at
/// the watch event that completes it (no polling: the figure's resolution
/// is the event's delivery). The bench opens no watch or list of its own
/// while it measures: the API server would serve it on top of the
/// operator's watches, and the floor, which has none, would not pay for it.
fn watch_widgets(op: &RunningOperator) -> Result<WidgetWatch> {
    let widgets = op
        .operator
        .cache()
        .kind(&KindKey::new("test.wasmop.dev", "v1", "Widget"))
        .context("the operator does not cache Widgets")?;
    let mut stored = widgets.observe();
    let (tx, rx) = tokio::sync::watch::channel((0, Instant::now()));
    let progress = Arc::new(Mutex::new(Progress {
        version: String::new(),
        done: HashSet::new(),
        count: tx,
    }));
    let events = {
        let progress = progress.clone();
        async move {
            while let Some(w) = stored.recv().await {
                let value = w.value();
                progress
                    .lock()
                    .expect("progress lock")
                    .seen(w.name(), &value);
            }
        }
    };
    Ok((progress, rx, tokio::spawn(events)))
}

/// Waits until the operator's cache held all `n` Widgets reconciled; returns the
/// instant of the event that completed them.
async fn all_reconciled(
    count: &mut tokio::sync::watch::Receiver<(usize, Instant)>,
    n: usize,
    what: &str,
    deadline: Duration,
) -> Result<Instant> {
    let reached = tokio::time::timeout(deadline, count.wait_for(|(c, _)| *c >= n))
        .await
        .with_context(|| format!("{what}: not within {deadline:?}"))?
        .context("the bench's observer of the operator's cache ended")?;
    Ok(reached.1)
}

fn install(src: &Path, dst: &Path) -> Result<()> {
    let tmp = dst.with_extension("tmp");
    std::fs::copy(src, &tmp)?;
    std::fs::rename(&tmp, dst)?;
    Ok(())
}

struct Phase {
    /// Every request the API server counted during the phase (cluster
    /// wide), printed with `WASMOP_BENCH_REQUESTS=1`.
    requests: Writes,
    seconds: f64,
    /// Until the operator had nothing left to do (its queue empty, the
    /// echoes of its own writes reconciled too); the floor is idle when
    /// done. Writes, CPU and calls are counted up to this instant.
    idle_seconds: f64,
    writes: f64,
    cpu: Cpu,
    /// Plugin calls the in-process operator made during the phase (none
    /// for the floor).
    calls: f64,
    /// Of the reconciles queued, how many were echoes of the operator's
    /// own writes.
    echoes: f64,
}

/// Plugin calls this process's operators made so far (the count of
/// `wasmop_plugin_call_duration_seconds`).
fn plugin_calls() -> f64 {
    metric_sum("wasmop_plugin_call_duration_seconds_count")
}

/// Reconciles queued as echoes of the operator's own writes so far.
fn echoes() -> f64 {
    metric_sum("wasmop_reconcile_echoes_total")
}

/// The sum of every series of this process's metric `name`.
fn metric_sum(name: &str) -> f64 {
    wasmop::metrics::global()
        .render()
        .lines()
        .filter(|l| l.split(['{', ' ']).next() == Some(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// CPU seconds spent during a phase by this process (operator or floor
/// client, and the bench's observer of the operator's cache), the API
/// server and etcd.
#[derive(Clone, Copy, Default)]
struct Cpu {
    bench: f64,
    apiserver: f64,
    etcd: f64,
}

impl Cpu {
    /// CPU seconds used so far by each.
    fn now() -> Cpu {
        let dir = std::env::var("WASMOP_CLUSTER_DIR").unwrap_or_else(|_| {
            format!(
                "{}/wasmop-cluster",
                std::env::var("TMPDIR").unwrap_or_else(|_| "/tmp".into())
            )
        });
        let of = |component: &str| {
            std::fs::read_to_string(format!("{dir}/pids/{component}.pid"))
                .ok()
                .and_then(|pid| proc_cpu(pid.trim()))
                .unwrap_or(f64::NAN)
        };
        Cpu {
            bench: proc_cpu("self").unwrap_or(f64::NAN),
            apiserver: of("kube-apiserver"),
            etcd: of("etcd"),
        }
    }

    /// What was used since `before`.
    fn since(before: Cpu) -> Cpu {
        let now = Cpu::now();
        Cpu {
            bench: now.bench - before.bench,
            apiserver: now.apiserver - before.apiserver,
            etcd: now.etcd - before.etcd,
        }
    }
}

/// User + system CPU seconds of process `pid` (`/proc/<pid>/stat`, in
/// clock ticks of 1/100 s).
fn proc_cpu(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command (which may hold spaces) in parentheses.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

impl Phase {
    fn line(&self, n: usize, name: &str, floor: &Phase) {
        println!(
            "N={n:>6} {name:<9} {:>8.2} s  floor {:>8.2} s  ratio {:>5.2}  idle after {:>8.2} s  writes/primary {:>5.2}  floor {:>5.2}  CPU s bench/apiserver/etcd {:.1}/{:.1}/{:.1}  floor {:.1}/{:.1}/{:.1}  plugin calls/primary {:.2} (echoes {:.2})",
            self.seconds,
            floor.seconds,
            self.seconds / floor.seconds.max(1e-9),
            self.idle_seconds,
            self.writes / n as f64,
            floor.writes / n as f64,
            self.cpu.bench,
            self.cpu.apiserver,
            self.cpu.etcd,
            floor.cpu.bench,
            floor.cpu.apiserver,
            floor.cpu.etcd,
            self.calls / n as f64,
            self.echoes / n as f64,
        );
        if std::env::var("WASMOP_BENCH_REQUESTS").is_ok_and(|v| v == "1") {
            for (side, phase) in [("operator", self), ("floor", floor)] {
                let list: Vec<String> = phase
                    .requests
                    .iter()
                    .map(|(k, v)| format!("{k}={v:.0}"))
                    .collect();
                println!("N={n:>6} {name:<9} {side} requests: {}", list.join(" "));
            }
        }
    }
}

/// Child process: holds the Widgets and ConfigMaps of `ns` (`n` of each)
/// the way `mode` says (`none`, `cache`, `reflector`) and prints its RSS.
async fn memory_child(mode: &str, ns: &str, n: usize) -> Result<()> {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::{WatchStreamExt, reflector, watcher};
    let client = wasmop_tests::client().await?;
    let widgets = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("test.wasmop.dev", "v1", "Widget"),
        "widgets",
    );
    let configmaps = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("", "v1", "ConfigMap"),
        "configmaps",
    );
    // Settled once every object is held (ConfigMaps: the Widgets' and the
    // namespace's kube-root-ca.crt).
    let settle = Duration::from_secs(120);
    match mode {
        "none" => {
            // The same client work as the others, without keeping anything.
            let api = widgets_in(&client, ns);
            let _ = api.list(&ListParams::default().limit(1)).await?;
        }
        "cache" => {
            use wasmop::watch::cache::{Cache, WatchSpec};
            let (cache, _changes) = Cache::new(client.clone(), vec![ns.to_owned()]);
            let mut held = Vec::new();
            for resource in [widgets, configmaps] {
                let kc = cache.ensure(WatchSpec {
                    resource,
                    namespaced: true,
                    managed_only: false,
                    selector: None,
                });
                held.push(kc);
            }
            until(
                "the cache to hold every object",
                Duration::from_millis(50),
                settle,
                || {
                    let ok = held.iter().all(|kc| kc.synced() && kc.len() >= n);
                    async move { Ok(ok) }
                },
            )
            .await?;
            println!("RSS_KIB {}", status_kib("VmRSS:"));
            drop(cache);
            return Ok(());
        }
        "reflector" => {
            let wwriter = reflector::store::Writer::<DynamicObject>::new(widgets.clone());
            let wstore = wwriter.as_reader();
            let (cstore, cwriter) = reflector::store::<ConfigMap>();
            let wapi: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &widgets);
            let capi: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
            let w = reflector(
                wwriter,
                watcher(wapi, watcher::Config::default()).modify(|o| {
                    o.metadata.managed_fields = None;
                }),
            )
            .applied_objects()
            .for_each(|_| async {});
            let c = reflector(
                cwriter,
                watcher(capi, watcher::Config::default()).modify(|o| {
                    o.metadata.managed_fields = None;
                }),
            )
            .applied_objects()
            .for_each(|_| async {});
            tokio::spawn(w);
            tokio::spawn(c);
            until(
                "the reflectors to hold every object",
                Duration::from_millis(50),
                settle,
                || {
                    let ok = wstore.len() >= n && cstore.len() >= n;
                    async move { Ok(ok) }
                },
            )
            .await?;
        }
        other => bail!("unknown memory mode {other}"),
    }
    println!("RSS_KIB {}", status_kib("VmRSS:"));
    Ok(())
}

/// RSS in KiB that a child in `mode` reports over `ns`.
async fn child_rss(mode: &str, ns: &str, n: usize) -> Result<f64> {
    let out = tokio::process::Command::new(std::env::current_exe()?)
        .args(["--memory-child", mode, ns, &n.to_string()])
        .output()
        .await?;
    if !out.status.success() {
        bail!(
            "memory child {mode}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("RSS_KIB "))
        .and_then(|v| v.trim().parse().ok())
        .context("memory child printed no RSS")
}

/// Bytes of RSS per held object for the host's cache and for the
/// reflector, over the `2n` objects of `ns` (best of three runs each, the
/// least disturbed by the allocator's timing).
async fn memory_per_object(ns: &str, n: usize) -> Result<(f64, f64)> {
    let mut best = [f64::MAX; 3];
    for _ in 0..3 {
        for (i, mode) in ["none", "cache", "reflector"].iter().enumerate() {
            best[i] = best[i].min(child_rss(mode, ns, n).await?);
        }
    }
    let per = |kib: f64| (kib - best[0]).max(0.0) * 1024.0 / (2 * n) as f64;
    Ok((per(best[1]), per(best[2])))
}

/// What a phase is measured from: the API server's counters, CPU so far
/// and the instant it started.
struct Meter {
    writes: Writes,
    requests: Writes,
    cpu: Cpu,
    calls: f64,
    echoes: f64,
    t0: Instant,
}

impl Meter {
    async fn start(client: &Client) -> Result<Meter> {
        let requests = apiwrites::requests(client).await?;
        Ok(Meter {
            writes: apiwrites::writes_of(&requests, RESOURCES),
            requests,
            cpu: Cpu::now(),
            calls: plugin_calls(),
            echoes: echoes(),
            t0: Instant::now(),
        })
    }

    /// The phase from the start to now, idle now (the floor's: it has no
    /// work left once its last write is answered).
    async fn ended_now(self, client: &Client) -> Result<Phase> {
        let now = Instant::now();
        self.phase(client, now, now).await
    }

    /// The phase from the start to `end`, idle at `idle` (counted up to
    /// now, which is `idle` or just after it).
    async fn phase(self, client: &Client, end: Instant, idle: Instant) -> Result<Phase> {
        let cpu = Cpu::since(self.cpu);
        let requests = apiwrites::requests(client).await?;
        Ok(Phase {
            seconds: (end - self.t0).as_secs_f64(),
            idle_seconds: (idle - self.t0).as_secs_f64(),
            cpu,
            calls: plugin_calls() - self.calls,
            echoes: echoes() - self.echoes,
            writes: total(&apiwrites::delta(
                &apiwrites::writes_of(&requests, RESOURCES),
                &self.writes,
            )),
            requests: apiwrites::delta(&requests, &self.requests),
        })
    }
}

/// The operator side: an in-process operator over its own namespace, its
/// plugin directory, and the bench's observer of its Widget cache.
struct OperatorBench {
    n: usize,
    ns: TestNamespace,
    dir: std::path::PathBuf,
    op: RunningOperator,
    plugins: PluginDir,
    progress: Arc<Mutex<Progress>>,
    count: tokio::sync::watch::Receiver<(usize, Instant)>,
    watching: tokio::task::JoinHandle<()>,
    deadline: Duration,
}

impl OperatorBench {
    /// Starts the operator with `good` (0.1.0) loaded, before any Widget.
    async fn start(n: usize, config: &OperatorConfig) -> Result<OperatorBench> {
        let ns = TestNamespace::new(&format!("scale{n}")).await?;
        let client = ns.client.clone();
        let dir = std::env::temp_dir().join(format!("wasmop-scale-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        install(&plugin_path("good")?, &dir.join("good.wasm"))?;
        let op = RunningOperator::start_with(
            client.clone(),
            vec![ns.name.clone()],
            vec![],
            config.clone(),
        )
        .await?;
        let options: OptionsFor = Arc::new(|_stem: &str| LoadOptions::default());
        let mut plugins = PluginDir::new(dir.clone(), sandbox(), op.operator.clone(), options);
        let first = plugins.scan(false).await;
        if first.activated.is_empty() {
            bail!("good did not load: {first:?}");
        }
        let (progress, count, watching) = watch_widgets(&op)?;
        Ok(OperatorBench {
            n,
            ns,
            dir,
            op,
            plugins,
            progress,
            count,
            watching,
            deadline: Duration::from_secs(60 + n as u64 / 10),
        })
    }

    /// First create → every Widget Ready and reconciled by 0.1.0.
    async fn converge(&mut self) -> Result<Phase> {
        let client = self.ns.client.clone();
        let api = widgets_in(&client, &self.ns.name);
        self.progress
            .lock()
            .expect("progress lock")
            .wait_for("0.1.0");
        let meter = Meter::start(&client).await?;
        create_numbered(&api, self.n, CREATE_CONCURRENCY).await?;
        let done = all_reconciled(
            &mut self.count,
            self.n,
            "every Widget reconciled by 0.1.0",
            self.deadline,
        )
        .await?;
        let idle = self.caught_up().await?;
        meter.phase(&client, done, idle).await
    }

    /// Waits until the operator has nothing left to reconcile: the Widgets
    /// are Ready before the echoes of its last writes are reconciled
    /// (they wait behind every first reconcile, see
    /// `wasmop::controller::queue`). The next phase starts from an idle
    /// operator, and this phase's calls, writes and CPU include them.
    async fn caught_up(&self) -> Result<Instant> {
        let operator = &self.op.operator;
        until(
            "the operator's queue to empty",
            Duration::from_millis(20),
            self.deadline,
            || async { Ok(operator.pending_reconciles() == 0) },
        )
        .await
    }

    /// The orphan sweep over the converged namespace (every owner alive:
    /// N ConfigMaps looked at, none collected), three times, next to its
    /// floor in the same run: the paged list of the same ConfigMaps
    /// (metadata only, same selector and page size) that any sweep must
    /// make. Prints the medians and their ratio.
    async fn sweep_line(&self) -> Result<()> {
        let cms: Api<k8s_openapi::api::core::v1::ConfigMap> =
            Api::namespaced(self.ns.client.clone(), &self.ns.name);
        let selector = "app.kubernetes.io/managed-by=wasmop,wasmop.dev/plugin=good";
        let (mut sweeps, mut floors) = (Vec::new(), Vec::new());
        let mut looked = 0;
        for round in 0..3 {
            let floor = async {
                let started = Instant::now();
                let mut params = ListParams::default()
                    .labels(selector)
                    .limit(wasmop::controller::orphans::SWEEP_PAGE);
                let mut seen = 0usize;
                loop {
                    let page = cms.list_metadata(&params).await?;
                    seen += page.items.len();
                    match page.metadata.continue_.filter(|c| !c.is_empty()) {
                        Some(token) => params = params.continue_token(&token),
                        None => break,
                    }
                }
                anyhow::Ok((started.elapsed().as_secs_f64(), seen))
            };
            let sweep = async {
                let started = Instant::now();
                let (seen, collected) = self.op.operator.sweep_orphans().await;
                if collected != 0 {
                    bail!("the sweep collected {collected} objects of a converged namespace");
                }
                anyhow::Ok((started.elapsed().as_secs_f64(), seen))
            };
            // The order alternates between rounds.
            let ((s, seen), (f, listed)) = if round % 2 == 0 {
                let s = sweep.await?;
                (s, floor.await?)
            } else {
                let f = floor.await?;
                (sweep.await?, f)
            };
            if seen != self.n || listed != self.n {
                bail!(
                    "the sweep looked at {seen} and the floor listed {listed}, not {}",
                    self.n
                );
            }
            looked = seen;
            sweeps.push(s);
            floors.push(f);
        }
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (s, f) = (median(sweeps), median(floors));
        println!(
            "N={:>6} sweep     {s:>8.3} s  floor {f:>8.3} s  ratio {:>5.2} (median of 3; {looked} owned objects looked at, none collected)",
            self.n,
            s / f.max(1e-9)
        );
        Ok(())
    }

    /// `plugin` (of `version`) replaces the loaded one in the plugin
    /// directory → every Widget reconciled by `version`.
    async fn rollover(&mut self, plugin: &str, version: &str) -> Result<Phase> {
        let client = self.ns.client.clone();
        self.progress
            .lock()
            .expect("progress lock")
            .wait_for(version);
        let meter = Meter::start(&client).await?;
        install(&plugin_path(plugin)?, &self.dir.join("good.wasm"))?;
        let swapped = self.plugins.scan(false).await;
        if swapped.activated.is_empty() {
            bail!("{plugin} did not load: {swapped:?}");
        }
        let done = all_reconciled(
            &mut self.count,
            self.n,
            &format!("every Widget reconciled by {version}"),
            self.deadline,
        )
        .await?;
        let idle = self.caught_up().await?;
        meter.phase(&client, done, idle).await
    }

    /// Stops the operator; then the memory per cached object over its
    /// converged namespace.
    async fn finish(self) -> Result<(f64, f64)> {
        self.watching.abort();
        self.op.stop().await;
        let _ = std::fs::remove_dir_all(&self.dir);
        memory_per_object(&self.ns.name, self.n).await
    }
}

/// The necessary writes of one Widget as a plain client makes them: its
/// ConfigMap (server-side apply, owner reference) and its status, with the
/// same fields the operator writes for the `good` plugin of `version`
/// (ConfigMap label `label`): the host's two labels and its applied-body
/// annotation on the ConfigMap, and a status with the plugin's `Ready` and
/// the host's `Reconciled` conditions and `observedGeneration`. The API
/// server's work for an apply and for each watch event grows with the
/// fields of the object, so a floor writing fewer would be cheaper for
/// reasons that are not the operator's overhead.
async fn floor_writes(
    client: &Client,
    ns: &str,
    name: &str,
    uid: &str,
    (label, version): (&str, &str),
) -> Result<()> {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let cms: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        ns,
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("", "v1", "ConfigMap"),
            "configmaps",
        ),
    );
    let pp = PatchParams::apply("floor").force();
    // As long as the host's `sha256:` of the body (8 bytes in hex), and
    // changing with the body as it does.
    let mut body = DefaultHasher::new();
    (name, label).hash(&mut body);
    let applied = format!("sha256:{:016x}", body.finish());
    let cm = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": format!("{name}-cm"), "namespace": ns,
            "labels": {"test.wasmop.dev/version": label,
                "app.kubernetes.io/managed-by": "wasmop", "wasmop.dev/plugin": "good"},
            "annotations": {"wasmop.dev/applied": applied},
            "ownerReferences": [{"apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
                "name": name, "uid": uid, "controller": true, "blockOwnerDeletion": true}]},
        "data": {"value": name},
    });
    cms.patch(&format!("{name}-cm"), &pp, &Patch::Apply(&cm))
        .await
        .context("floor ConfigMap apply")?;
    let status = json!({
        "apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
        "metadata": {"name": name, "namespace": ns},
        "status": {"value": name, "observedGeneration": 1, "conditions": [
            {"type": "Ready", "status": "True", "reason": "Reconciled",
             "message": format!("ConfigMap {name}-cm holds the value"),
             "observedGeneration": 1, "lastTransitionTime": "2026-01-01T00:00:00Z"},
            {"type": "Reconciled", "status": "True", "reason": "Reconciled",
             "message": format!("reconciled by plugin good {version} sha256:0123456789ab"),
             "observedGeneration": 1, "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
    });
    widgets_in(client, ns)
        .patch_status(name, &pp, &Patch::Apply(&status))
        .await
        .context("floor status apply")?;
    Ok(())
}

/// The floor's side: its namespace and its Widgets (name, UID).
struct FloorBench {
    ns: TestNamespace,
    widgets: Vec<(String, String)>,
    workers: usize,
}

impl FloorBench {
    /// Creates `n` Widgets (16 at once), each handed on as it lands to
    /// `workers` writers making its two necessary writes.
    async fn converge(n: usize, workers: usize) -> Result<(Phase, FloorBench)> {
        let ns = TestNamespace::new(&format!("floor{n}")).await?;
        let client = ns.client.clone();
        let api = widgets_in(&client, &ns.name);
        let meter = Meter::start(&client).await?;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<(String, String)>();
        let creating = {
            let api = api.clone();
            async move {
                let results: Vec<Result<()>> = stream::iter(0..n)
                    .map(|i| {
                        let api = api.clone();
                        let tx = tx.clone();
                        async move {
                            let created = api
                                .create(&PostParams::default(), &numbered_widget(i)?)
                                .await?;
                            let uid = created.metadata.uid.unwrap_or_default();
                            let _ = tx.send((format!("w{i}"), uid));
                            Ok(())
                        }
                    })
                    .buffer_unordered(CREATE_CONCURRENCY)
                    .collect()
                    .await;
                results.into_iter().collect::<Result<()>>()
            }
        };
        let writing = {
            let client = client.clone();
            let ns = ns.name.clone();
            async move {
                let results: Vec<Result<(String, String)>> = tokio_stream_from(rx)
                    .map(|(name, uid)| {
                        let client = client.clone();
                        let ns = ns.clone();
                        async move {
                            floor_writes(&client, &ns, &name, &uid, FIRST).await?;
                            Ok((name, uid))
                        }
                    })
                    .buffer_unordered(workers)
                    .collect()
                    .await;
                results.into_iter().collect::<Result<Vec<_>>>()
            }
        };
        let (c, w) = tokio::join!(creating, writing);
        c?;
        let widgets = w?;
        let converge = meter.ended_now(&client).await?;
        Ok((
            converge,
            FloorBench {
                ns,
                widgets,
                workers,
            },
        ))
    }

    /// The same two writes per Widget for `release` (label, version).
    async fn rollover(&self, release: (&str, &str)) -> Result<Phase> {
        let client = self.ns.client.clone();
        let watches = if std::env::var("WASMOP_BENCH_FLOOR_WATCHES").is_ok_and(|v| v == "1") {
            self.open_watches().await
        } else {
            Vec::new()
        };
        let meter = Meter::start(&client).await?;
        let results: Vec<Result<()>> = stream::iter(self.widgets.iter())
            .map(|(name, uid)| {
                let client = client.clone();
                let ns = self.ns.name.clone();
                async move { floor_writes(&client, &ns, name, uid, release).await }
            })
            .buffer_unordered(self.workers)
            .collect()
            .await;
        results.into_iter().collect::<Result<()>>()?;
        let phase = meter.ended_now(&client).await;
        for w in watches {
            w.abort();
        }
        phase
    }

    /// With `WASMOP_BENCH_FLOOR_WATCHES=1`: the watches an operator holds
    /// (the namespace's Widgets, and its ConfigMaps with the host's label),
    /// opened and listed before the phase and drained during it, to price
    /// what the API server spends serving them.
    async fn open_watches(&self) -> Vec<tokio::task::JoinHandle<()>> {
        use kube::runtime::watcher;
        let cms: Api<DynamicObject> = Api::namespaced_with(
            self.ns.client.clone(),
            &self.ns.name,
            &ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("", "v1", "ConfigMap"),
                "configmaps",
            ),
        );
        let selected = watcher::Config::default().labels("app.kubernetes.io/managed-by=wasmop");
        let mut handles = Vec::new();
        for (api, config) in [
            (
                widgets_in(&self.ns.client, &self.ns.name),
                watcher::Config::default(),
            ),
            (cms, selected),
        ] {
            let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(1);
            handles.push(tokio::spawn(async move {
                let mut events = watcher(api, config).boxed();
                while let Some(e) = events.next().await {
                    if matches!(e, Ok(watcher::Event::InitDone)) {
                        let _ = tx.try_send(());
                    }
                }
            }));
            let _ = rx.recv().await;
        }
        handles
    }
}

/// The memory figure alone: N Widgets with a ConfigMap and a status each,
/// written by the floor's client, then the three children over them.
async fn memory_only(n: usize, workers: usize) -> Result<(f64, f64)> {
    let ns = TestNamespace::new(&format!("mem{n}")).await?;
    let client = ns.client.clone();
    let api = widgets_in(&client, &ns.name);
    let results: Vec<Result<()>> = stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            let client = client.clone();
            let ns = ns.name.clone();
            async move {
                let created = api
                    .create(&PostParams::default(), &numbered_widget(i)?)
                    .await?;
                let uid = created.metadata.uid.unwrap_or_default();
                floor_writes(&client, &ns, &format!("w{i}"), &uid, FIRST).await
            }
        })
        .buffer_unordered(workers.max(CREATE_CONCURRENCY))
        .collect()
        .await;
    results.into_iter().collect::<Result<()>>()?;
    memory_per_object(&ns.name, n).await
}

fn tokio_stream_from<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::UnboundedReceiver<T>,
) -> impl futures::Stream<Item = T> {
    stream::poll_fn(move |cx| rx.poll_recv(cx))
}

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--memory-child") {
        let [_, mode, ns, n] = &args[..] else {
            bail!("usage: scale-bench --memory-child MODE NAMESPACE N");
        };
        return memory_child(mode, ns, n.parse()?).await;
    }
    let memory_only_flag = args.first().map(String::as_str) == Some("--memory-only")
        || std::env::var("WASMOP_BENCH_MEMORY_ONLY").is_ok_and(|v| v == "1");
    let sizes: Vec<usize> = args
        .iter()
        .filter(|a| *a != "--memory-only")
        .map(|a| a.parse().context("sizes are numbers of Widgets"))
        .collect::<Result<_>>()?;
    let sizes = if sizes.is_empty() {
        vec![100, 1000]
    } else {
        sizes
    };
    let rollovers: usize = std::env::var("WASMOP_BENCH_ROLLOVERS")
        .ok()
        .map(|v| v.parse().context("WASMOP_BENCH_ROLLOVERS is a number"))
        .transpose()?
        .unwrap_or(3)
        .max(1);
    let client = wasmop_tests::client().await?;
    apply_test_crds(&client).await?;
    let config = test_config();
    // Both plugins go through the compile cache once before anything is
    // measured, so the first size's swap is a load, not a compile (cold
    // start has a bench of its own).
    for plugin in ["good", "good-v2"] {
        load_plugin(plugin, json!({}))?;
    }
    if !memory_only_flag {
        // Warm-up, not measured: the first writes after the control plane
        // starts are slower (connections, the API server's caches, etcd),
        // and would count against whichever side goes first.
        settle(&client).await?;
        drop(FloorBench::converge(200, config.workers).await?);
        settle(&client).await?;
    }
    for n in sizes {
        if memory_only_flag {
            let (cache, reflector) = memory_only(n, config.workers).await?;
            println!(
                "N={n:>6} per-object cache {cache:>7.0} B  reflector {reflector:>7.0} B  ratio {:>5.2}",
                cache / reflector.max(1e-9)
            );
            continue;
        }
        let (floor_converge, floor) = FloorBench::converge(n, config.workers).await?;
        let mut operator = OperatorBench::start(n, &config).await?;
        let converge = operator.converge().await?;
        let (rss_now, rss_peak) = rss();
        converge.line(n, "converge", &floor_converge);
        operator.sweep_line().await?;
        // Rollovers back and forth (good-v2, then good again, ...), each
        // next to a floor rollover in the same round, the order of the two
        // alternating from round to round; the median ratio is the figure.
        let mut rounds = Vec::new();
        for round in 0..rollovers {
            let (plugin, version, label) = if round % 2 == 0 {
                ("good-v2", "0.2.0", "v2")
            } else {
                ("good", "0.1.0", "v1")
            };
            let (op, fl) = if round % 2 == 0 {
                let fl = floor.rollover((label, version)).await?;
                (operator.rollover(plugin, version).await?, fl)
            } else {
                let op = operator.rollover(plugin, version).await?;
                (op, floor.rollover((label, version)).await?)
            };
            op.line(n, &format!("rollover{}", round + 1), &fl);
            rounds.push((op, fl));
        }
        let (rss_rolled, rss_peak_rolled) = rss();
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        println!(
            "N={n:>6} rollover  median of {rollovers}: {:>8.2} s  floor {:>8.2} s  ratio {:>5.2} (median of the rounds' ratios)  idle after {:>8.2} s",
            median(rounds.iter().map(|(o, _)| o.seconds).collect()),
            median(rounds.iter().map(|(_, f)| f.seconds).collect()),
            median(
                rounds
                    .iter()
                    .map(|(o, f)| o.seconds / f.seconds.max(1e-9))
                    .collect()
            ),
            median(rounds.iter().map(|(o, _)| o.idle_seconds).collect()),
        );
        drop(floor);
        let (cache, reflector) = operator.finish().await?;
        println!(
            "N={n:>6} memory    RSS {rss_now:.1} MiB after converging, peak {rss_peak:.1} MiB; after the rollovers {rss_rolled:.1} MiB, peak {rss_peak_rolled:.1} MiB"
        );
        println!(
            "N={n:>6} per-object cache {cache:>7.0} B  reflector {reflector:>7.0} B  ratio {:>5.2}",
            cache / reflector.max(1e-9)
        );
        settle(&client).await?;
    }
    Ok(())
}

/// Waits until no namespace is terminating. A size's namespaces (and the
/// warm-up's, and those of an earlier run) are deleted when it ends, and
/// the control plane deletes their objects in the background for up to
/// minutes; measured meanwhile, the next size would share the machine
/// with that deletion.
async fn settle(client: &Client) -> Result<()> {
    use k8s_openapi::api::core::v1::Namespace;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let start = Instant::now();
    let waited = std::cell::Cell::new(false);
    until(
        "the namespaces of earlier runs to be deleted",
        Duration::from_millis(250),
        Duration::from_secs(1800),
        || {
            let namespaces = namespaces.clone();
            let waited = &waited;
            async move {
                let terminating = namespaces
                    .list(&ListParams::default())
                    .await?
                    .items
                    .iter()
                    .filter(|n| {
                        n.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Terminating")
                    })
                    .count();
                waited.set(waited.get() || terminating > 0);
                Ok(terminating == 0)
            }
        },
    )
    .await?;
    if waited.get() {
        eprintln!(
            "waited {:.1} s for terminating namespaces to go",
            start.elapsed().as_secs_f64()
        );
    }
    Ok(())
}
