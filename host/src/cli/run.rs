//! `wasmop run`: the live operator process.
//!
//! Loads every `*.wasm` component in the plugin directory (with settings and
//! limits from the optional operator configuration file), registers their
//! controllers, and reconciles until SIGINT or SIGTERM. A plugin file that
//! does not load is reported and skipped; the others run.
//!
//! On SIGINT or SIGTERM in-flight reconciles may finish for the largest
//! plugin deadline plus [`SHUTDOWN_SLACK`]; whatever is still running then
//! is abandoned, so the process ends within a plugin deadline and a second
//! whatever plugins do (every plugin call ends by its deadline anyway; the
//! grace also bounds the writes that follow a call).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::controller::{Operator, OperatorConfig};
pub use crate::delivery::config::{OperatorFile, PluginConfig, RunError, read_config};
use crate::delivery::config_watch::ConfigWatch;
use crate::delivery::hotswap::{OptionsFor, PluginDir};
use crate::lease::leader::{self, LeaderConfig};
use crate::metrics;
use crate::plugin::CompileCache;
use crate::sandbox::{Limits, MemoryReset, Sandbox, SandboxConfig};

/// Arguments of `wasmop run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Where plugins come from: a directory of components (`*.wasm`,
    /// watched for changes) or one plugin in an OCI registry,
    /// `[NAME=]oci://HOST[:PORT]/REPOSITORY:TAG` or `…@sha256:…` (a tag is
    /// polled and a new digest hot-swapped; NAME defaults to the
    /// repository's last segment). Repeat for several.
    #[arg(long, value_name = "DIR|oci://REF", required = true)]
    pub plugins: Vec<crate::delivery::oci::PluginSource>,
    /// Registry access for `oci://` plugins.
    #[command(flatten)]
    pub registry: crate::cli::oci::RegistryArgs,
    /// Record every decided reconcile (snapshot, plugin digest, outcome;
    /// Secret values redacted) into this directory, for `wasmop replay`.
    #[arg(long, value_name = "DIR")]
    pub record: Option<PathBuf>,
    /// Most bytes the recordings may take; the oldest are deleted first.
    #[arg(long, value_name = "MIB", default_value_t = 256)]
    pub record_max_mib: u64,
    /// How often `oci://` tags are resolved again.
    #[arg(long, value_name = "MS", default_value_t = 60_000)]
    pub oci_poll_interval_ms: u64,
    /// Cache of plugins pulled from registries, by digest
    /// [default: ${XDG_CACHE_HOME:-$HOME/.cache}/wasmop/oci].
    #[arg(long, env = "WASMOP_OCI_CACHE", value_name = "DIR")]
    pub oci_cache: Option<PathBuf>,
    /// The largest plugin pulled from a registry, in MiB.
    #[arg(long, value_name = "MIB", default_value_t = crate::delivery::oci::DEFAULT_MAX_BYTES >> 20)]
    pub oci_max_mib: u64,
    /// Namespace to watch; repeat for several. Default: all namespaces.
    #[arg(long = "namespace", short = 'n', value_name = "NS")]
    pub namespaces: Vec<String>,
    /// Kubeconfig to use. Default: `$KUBECONFIG`, `~/.kube/config`, or the
    /// in-cluster service account.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Operator configuration (YAML): workers and per-plugin settings and
    /// limits, keyed by plugin file name without `.wasm`. Re-read when it
    /// changes: plugins whose settings or limits changed are reloaded; a
    /// bad file is reported and the running configuration stays.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Directory of the compiled-plugin cache
    /// [default: ${XDG_CACHE_HOME:-$HOME/.cache}/wasmop/compiled].
    #[arg(long, env = "WASMOP_COMPILE_CACHE", value_name = "DIR")]
    pub compile_cache: Option<PathBuf>,
    /// How often the plugin directory is checked for changes (hot swap).
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    pub poll_interval_ms: u64,
    /// How often Secrets that primaries name through field references are
    /// read again (they are read by name, never listed or watched).
    #[arg(long, value_name = "MS", default_value_t = 30_000)]
    pub secret_poll_interval_ms: u64,
    /// How often the leader sweeps for objects its plugins made whose
    /// owner is gone (the garbage collector missed them) and deletes them;
    /// 0 turns the sweep off (objects refused to a plan are still
    /// collected).
    #[arg(long, value_name = "SECS", default_value_t = crate::controller::DEFAULT_ORPHAN_SWEEP_INTERVAL.as_secs())]
    pub orphan_sweep_interval_secs: u64,
    /// How often the `PluginRollout` objects are read and, on the leader,
    /// driven (staged plugin rollouts); 0 turns rollouts off.
    #[arg(long, value_name = "MS", default_value_t = 2000)]
    pub rollout_interval_ms: u64,
    /// Follow only the PluginRollouts whose labels match (kubectl selector
    /// syntax), when several operator Deployments share a cluster.
    #[arg(long, value_name = "SELECTOR")]
    pub rollout_selector: Option<String>,
    /// Base URL (`http://host:port` or `https://host:port`) that plans may call with target
    /// `allow-list`; repeat for several.
    #[arg(long = "allow-url", value_name = "URL")]
    pub allow_urls: Vec<String>,
    /// Serve Prometheus metrics at http://ADDR/metrics.
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// `/healthz` (on the metrics address) fails when one reconcile has
    /// been running longer than this many seconds: the worker is stuck.
    #[arg(long, value_name = "SECS", default_value_t = crate::report::health::DEFAULT_STUCK_AFTER.as_secs())]
    pub stuck_after_secs: u64,
    /// Elect a leader through a Lease: every replica watches and computes
    /// plans, only the leader writes. Without it this process always acts
    /// as the leader (one replica).
    #[arg(long)]
    pub leader_elect: bool,
    /// Namespace of the leader-election Lease [default: `$POD_NAMESPACE`].
    #[arg(
        long,
        env = "POD_NAMESPACE",
        value_name = "NS",
        required_if_eq("leader_elect", "true")
    )]
    pub leader_election_namespace: Option<String>,
    /// Name of the leader-election Lease.
    #[arg(long, value_name = "NAME", default_value = leader::DEFAULT_LEASE_NAME)]
    pub leader_election_id: String,
    /// Lease duration of the leader Lease (and, with `--sharding`, of the
    /// shard Leases), in milliseconds [default: 15000].
    #[arg(long, value_name = "MS", requires = "leader_elect")]
    pub lease_duration_ms: Option<u64>,
    /// Shard primaries across the replicas: each replica holds a shard
    /// Lease of its own and reconciles only the primaries the leader
    /// assigns to it (label `shard.wasmop.dev/shard`). Needs
    /// `--leader-elect`. See the README's "Sharding".
    #[arg(long, requires = "leader_elect")]
    pub sharding: bool,
    /// Admission webhooks (off unless `--admission-port` is given).
    #[command(flatten)]
    pub admission: crate::cli::admission::AdmissionArgs,
    /// How a plugin call's memory is made fresh for the next call: `whole`
    /// rewrites the first 512 KiB from the plugin's image and returns every
    /// other page the call touched to the kernel; `dirty-pages` copies back
    /// only the pages the call dirtied (Linux 6.7+, and only where no swap
    /// can reach the operator; `whole` elsewhere), a little faster, but a
    /// page the kernel is migrating as the call ends keeps that call's data
    /// for the next call of the plugin.
    #[arg(long, env = "WASMOP_MEMORY_RESET", value_enum, default_value_t = MemoryResetArg::Whole)]
    pub memory_reset: MemoryResetArg,
}

/// `--memory-reset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MemoryResetArg {
    /// The first 512 KiB rewritten, every other touched page returned to
    /// the kernel, after every call.
    Whole,
    /// Only dirty pages copied back, where swap cannot reach the operator.
    DirtyPages,
}

/// Runs the operator until SIGINT or SIGTERM.
///
/// # Errors
/// [`RunError`] when nothing can run: bad configuration, no cluster, no
/// cluster. A broken plugin file is logged and skipped; the directory is
/// watched, so fixing the file brings the plugin up without a restart.
pub fn run(args: RunArgs) -> Result<ExitCode, RunError> {
    let file = match &args.config {
        Some(p) => read_config(p)?,
        None => OperatorFile::default(),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(RunError::Runtime)?;
    let code = runtime.block_on(run_async(args, file));
    // Do not wait for blocking threads still busy (a plugin load or call
    // the grace period gave up on): they end by their deadline, but the
    // process need not wait for that.
    runtime.shutdown_timeout(Duration::from_millis(100));
    code
}

/// Beyond the largest plugin deadline, how long in-flight reconciles may
/// take to finish after SIGTERM before they are abandoned.
pub const SHUTDOWN_SLACK: Duration = Duration::from_millis(400);

/// How long releasing the leader Lease may take at shutdown.
const LEASE_RELEASE_GRACE: Duration = Duration::from_millis(300);

/// The largest call deadline any plugin may be given by `file`.
fn largest_deadline(file: &OperatorFile) -> Duration {
    file.plugins
        .values()
        .filter_map(|c| c.deadline_ms)
        .map(Duration::from_millis)
        .fold(Limits::default().deadline, Duration::max)
}

async fn run_async(args: RunArgs, file: OperatorFile) -> Result<ExitCode, RunError> {
    let sandbox = Sandbox::new(SandboxConfig {
        dirty_pages_reset: args.memory_reset == MemoryResetArg::DirtyPages,
        ..SandboxConfig::default()
    })
    .map_err(|e| RunError::Sandbox(e.to_string()))?;
    let reset = sandbox.memory_reset();
    match reset {
        MemoryReset::DirtyPages => tracing::info!(
            %reset,
            "plugin call memory (--memory-reset=dirty-pages): a page the kernel is moving as a call ends may keep that call's data for the next call"
        ),
        MemoryReset::Whole { .. } if args.memory_reset == MemoryResetArg::Whole => {
            tracing::info!(%reset, "plugin call memory")
        }
        MemoryReset::Whole { .. } => tracing::warn!(
            %reset,
            "plugin call memory: --memory-reset=dirty-pages cannot be used here, the whole reset is used instead"
        ),
    }
    let (dirs, oci_sources) = split_sources(&args.plugins)?;
    for name in file.plugins.keys() {
        if !dirs
            .iter()
            .any(|d| d.join(format!("{name}.wasm")).is_file())
            && !oci_sources.iter().any(|s| &s.name == name)
        {
            tracing::warn!(plugin = %name, "configuration names a plugin that is in no plugin directory and no oci:// source");
        }
    }
    let mirror = if oci_sources.is_empty() {
        None
    } else {
        let registry = args
            .registry
            .options()
            .map_err(|e| RunError::Oci(e.to_string()))?;
        let root = args
            .oci_cache
            .clone()
            .or_else(|| CompileCache::default_dir().and_then(|d| d.parent().map(|p| p.join("oci"))))
            .ok_or_else(|| RunError::Oci("no cache directory: pass --oci-cache".to_owned()))?;
        let mirror = crate::delivery::oci::OciMirror::new(
            root.clone(),
            oci_sources,
            registry,
            args.oci_max_mib.saturating_mul(1 << 20),
        )
        .map_err(|e| RunError::Oci(format!("cache {}: {e}", root.display())))?;
        Some(mirror)
    };
    let election = leader_config(&args)?;
    if let Some(cfg) = election.as_ref().filter(|_| args.sharding) {
        crate::lease::shard::check_identity(&cfg.identity).map_err(RunError::ShardIdentity)?;
    }
    let admission = args.admission.config(&args.namespaces)?.map(|mut a| {
        // The install: the operator's namespace and its Lease's name.
        a.install = format!("{}/{}", a.namespace, args.leader_election_id);
        a
    });
    let identity = election.as_ref().map(|c| c.identity.as_str());
    let client = client(args.kubeconfig.as_deref(), identity).await?;
    let mut config = OperatorConfig {
        workers: file.workers.unwrap_or(OperatorConfig::default().workers),
        secret_poll_interval: Duration::from_millis(args.secret_poll_interval_ms.max(100)),
        orphan_sweep_interval: (args.orphan_sweep_interval_secs > 0)
            .then(|| Duration::from_secs(args.orphan_sweep_interval_secs)),
        rollout_interval: (args.rollout_interval_ms > 0)
            .then(|| Duration::from_millis(args.rollout_interval_ms.max(100))),
        rollout_selector: args.rollout_selector.clone(),
        ..OperatorConfig::default()
    };
    config.observe.allow_list = args.allow_urls.clone();
    if let Some(dir) = &args.record {
        let recorder = crate::report::record::Recorder::new(
            dir.clone(),
            args.record_max_mib.saturating_mul(1 << 20),
        )
        .map_err(|e| RunError::Config {
            path: dir.clone(),
            reason: format!("cannot record here: {e}"),
        })?;
        tracing::info!(dir = %dir.display(), max_mib = args.record_max_mib, "recording every reconcile");
        config.recorder = Some(Arc::new(recorder));
    }
    if let Some(selector) = &config.rollout_selector
        && let Err(e) = crate::contract::selector::LabelSelector::parse(selector)
    {
        return Err(RunError::Config {
            path: PathBuf::from("--rollout-selector"),
            reason: e.to_string(),
        });
    }
    let problems = config.observe.allow_list_problems();
    if !problems.is_empty() {
        return Err(RunError::Config {
            path: PathBuf::from("--allow-url"),
            reason: problems.join("; "),
        });
    }
    let health = crate::report::health::global();
    health.set_stuck_after(Duration::from_secs(args.stuck_after_secs.max(1)));
    let scanned = Arc::new(std::sync::atomic::AtomicBool::new(false));
    {
        let scanned = scanned.clone();
        health.add_ready_check(
            "plugins",
            Box::new(move || {
                if scanned.load(std::sync::atomic::Ordering::SeqCst) {
                    Ok(())
                } else {
                    Err("the plugin directory is being loaded".to_owned())
                }
            }),
        );
    }
    if let Some(addr) = args.metrics_addr {
        crate::report::health::serve(addr)
            .await
            .map_err(|e| RunError::Kube(format!("cannot serve metrics on {addr}: {e}")))?;
    }
    if let Some(pod) = crate::report::selfevent::init(client.clone()).await {
        tracing::info!(%pod, "rejected plugin files raise Warning Events on this Pod");
    }
    let (operator, changes) = Operator::new(client.clone(), args.namespaces.clone(), config);
    // With leader election a replica starts as a follower: it watches and
    // computes plans but writes nothing until it holds the Lease.
    let election = election.map(|cfg| {
        let client = client.clone();
        operator
            .leader_flag()
            .store(false, std::sync::atomic::Ordering::SeqCst);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let op = operator.clone();
        let task = tokio::spawn(leader::run(
            client,
            cfg,
            operator.leader_flag(),
            operator.lease_deadline(),
            move || op.requeue_leader_fenced(),
            async {
                let _ = stopped.await;
            },
        ));
        (stop, task)
    });
    // With sharding, this replica's own shard Lease fences its writes for
    // per-object controllers; losing its term ends the process.
    let shard_tasks = election.as_ref().filter(|_| args.sharding).and_then(|_| {
        let cfg = leader_config(&args).ok().flatten()?;
        let sharding = crate::lease::shard::Sharding::new(
            cfg.identity.clone(),
            cfg.namespace.clone(),
            cfg.lease_duration,
        );
        operator.enable_sharding(sharding.clone());
        tracing::info!(shard = %sharding.identity, selector = %sharding.selector(), "sharding on");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let op = operator.clone();
        let identity = cfg.identity.clone();
        let membership = tokio::spawn(leader::run_with_loss(
            client.clone(),
            LeaderConfig {
                lease_name: crate::lease::shard::lease_name(&cfg.identity),
                ..cfg
            },
            sharding.flag.clone(),
            sharding.until.clone(),
            move || op.requeue_all(),
            leader::TermHooks {
                on_lost: Box::new(move || {
                    tracing::error!(shard = %identity,
                        "shard Lease term ended: its primaries may have been given away and its caches may be stale; exiting");
                    std::process::exit(crate::lease::shard::LOST_TERM_EXIT_CODE);
                }),
                gauge: "wasmop_shard_lease",
            },
            async {
                let _ = stopped.await;
            },
        ));
        let sharder = tokio::spawn(operator.clone().run_sharder());
        Some((stop, membership, sharder))
    });
    let compile_cache = args
        .compile_cache
        .clone()
        .or_else(CompileCache::default_dir)
        .map(CompileCache::new);
    let grace = largest_deadline(&file) + SHUTDOWN_SLACK;
    // The configuration file is re-read when it changes; plugins whose
    // settings or limits changed are reloaded by the plugin directory.
    let config_watch = ConfigWatch::new(args.config.clone().unwrap_or_default(), file);
    let options: OptionsFor = config_watch.options_for(compile_cache);
    let config_task = args.config.is_some().then(|| {
        tokio::spawn(config_watch.watch(Duration::from_millis(args.poll_interval_ms.max(100))))
    });
    let mut plugin_dirs = dirs.clone();
    let mirror_task = match mirror {
        Some(mut mirror) => {
            plugin_dirs.push(mirror.active_dir().to_owned());
            // Before the first scan, so registry plugins start with the rest.
            mirror.sync().await;
            Some(tokio::spawn(mirror.watch(Duration::from_millis(
                args.oci_poll_interval_ms.max(100),
            ))))
        }
        None => None,
    };
    let mut dir = PluginDir::with_dirs(plugin_dirs, sandbox, operator.clone(), options);
    {
        let op = operator.clone();
        health.add_ready_check("caches", Box::new(move || op.caches_synced()));
    }
    let first = dir.scan(false).await;
    scanned.store(true, std::sync::atomic::Ordering::SeqCst);
    // Admission is served once the first scan has loaded the plugins: a
    // replica still compiling them would otherwise deny every request for
    // them ("no loaded plugin is called ..."), and a webhook call can reach
    // a replica before it is ready (a URL or a front that is not a Service
    // of ready Pods).
    let admission_tasks =
        crate::cli::admission::start(admission, client.clone(), &operator).await?;
    if first.activated.is_empty() {
        tracing::warn!(sources = ?args.plugins, "no plugin active yet; watching the plugin sources");
    }
    tracing::info!(plugins = ?operator.plugins(), "operator running");
    let watcher = tokio::spawn(dir.watch(Duration::from_millis(args.poll_interval_ms)));
    let (signalled, on_signal) = tokio::sync::oneshot::channel::<()>();
    let running = operator.clone().run(changes, async move {
        shutdown_signal().await;
        let _ = signalled.send(());
    });
    tokio::pin!(running);
    tokio::select! {
        () = &mut running => {}
        () = async {
            if on_signal.await.is_ok() {
                tokio::time::sleep(grace).await;
            } else {
                std::future::pending::<()>().await;
            }
        } => {
            tracing::warn!(?grace, "in-flight reconciles did not finish in time; abandoning them");
            operator.abort();
        }
    }
    watcher.abort();
    if let Some(task) = config_task {
        task.abort();
    }
    if let Some(task) = mirror_task {
        task.abort();
    }
    for task in admission_tasks {
        task.abort();
    }
    // In-flight reconciles are done: release the shard Lease so the
    // sharder re-homes this shard's primaries at once.
    if let Some((stop, membership, sharder)) = shard_tasks {
        sharder.abort();
        let _ = stop.send(());
        if tokio::time::timeout(LEASE_RELEASE_GRACE, membership)
            .await
            .is_err()
        {
            tracing::warn!("the shard Lease was not released in time");
        }
    }
    // In-flight reconciles are done: release the Lease so a successor takes
    // over without waiting for it to expire.
    if let Some((stop, task)) = election {
        let _ = stop.send(());
        if tokio::time::timeout(LEASE_RELEASE_GRACE, task)
            .await
            .is_err()
        {
            tracing::warn!("the leader Lease was not released in time");
        }
    }
    tracing::info!("operator stopped");
    Ok(ExitCode::SUCCESS)
}

/// The directories (each must be one) and the OCI references of `sources`.
fn split_sources(
    sources: &[crate::delivery::oci::PluginSource],
) -> Result<(Vec<PathBuf>, Vec<crate::delivery::oci::OciSource>), RunError> {
    use crate::delivery::oci::PluginSource;
    let mut dirs = Vec::new();
    let mut oci = Vec::new();
    for source in sources {
        match source {
            PluginSource::Dir(path) => {
                if !path.is_dir() {
                    return Err(RunError::PluginDir {
                        path: path.clone(),
                        source: std::io::Error::new(
                            std::io::ErrorKind::NotFound,
                            "not a directory",
                        ),
                    });
                }
                dirs.push(path.clone());
            }
            PluginSource::Oci(s) => {
                if oci
                    .iter()
                    .any(|o: &crate::delivery::oci::OciSource| o.name == s.name)
                {
                    return Err(RunError::Oci(format!(
                        "two oci:// sources are named {}; name one with NAME=oci://…",
                        s.name
                    )));
                }
                oci.push(s.clone());
            }
        }
    }
    Ok((dirs, oci))
}

/// The leader-election configuration `args` ask for, if any.
fn leader_config(args: &RunArgs) -> Result<Option<LeaderConfig>, RunError> {
    if !args.leader_elect {
        return Ok(None);
    }
    let namespace = args
        .leader_election_namespace
        .clone()
        .filter(|n| !n.is_empty())
        .ok_or(RunError::LeaderNamespace)?;
    let mut config = LeaderConfig {
        lease_name: args.leader_election_id.clone(),
        ..LeaderConfig::new(namespace)
    };
    if let Some(ms) = args.lease_duration_ms {
        config = config.with_lease_duration(Duration::from_millis(ms.max(300)));
    }
    Ok(Some(config))
}

/// The `User-Agent` of every API request: `wasmop/<version>`, and with
/// leader election `wasmop/<version> (<identity>)`, so the API server's
/// audit log tells the replicas apart (the field managers stay the same in
/// every replica: fields a replica's manager owned would otherwise linger
/// after its primaries moved). An identity that cannot be a header value
/// is left out.
pub fn user_agent(identity: Option<&str>) -> http::HeaderValue {
    let plain = concat!("wasmop/", env!("CARGO_PKG_VERSION"));
    identity
        .and_then(|id| http::HeaderValue::from_str(&format!("{plain} ({id})")).ok())
        .unwrap_or_else(|| http::HeaderValue::from_static(plain))
}

pub(crate) async fn client(
    kubeconfig: Option<&Path>,
    identity: Option<&str>,
) -> Result<Client, RunError> {
    let mut config = match kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path)
                .map_err(|e| RunError::Kube(format!("{}: {e}", path.display())))?;
            Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(|e| RunError::Kube(format!("{}: {e}", path.display())))?
        }
        None => Config::infer()
            .await
            .map_err(|e| RunError::Kube(e.to_string()))?,
    };
    config
        .headers
        .push((http::header::USER_AGENT, user_agent(identity)));
    // Every API request is counted (`rest_client_requests_total`).
    Ok(kube::client::ClientBuilder::try_from(config)
        .map_err(|e| RunError::Kube(e.to_string()))?
        .with_layer(&metrics::RestClientMetrics)
        .build())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
    tracing::info!("shutting down: finishing in-flight reconciles");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delivery::config::load_options;
    use crate::judge::validate::PlanLimits;

    fn parse(extra: &[&str]) -> Result<RunArgs, clap::Error> {
        use clap::Parser;
        #[derive(Parser)]
        struct Wrap {
            #[command(flatten)]
            run: RunArgs,
        }
        Wrap::try_parse_from(std::iter::once("wasmop").chain(extra.iter().copied())).map(|w| w.run)
    }

    #[test]
    fn the_memory_reset_is_whole_unless_dirty_pages_are_asked_for() {
        let dir = std::env::temp_dir().display().to_string();
        let args = parse(&["--plugins", &dir]).unwrap();
        assert_eq!(args.memory_reset, MemoryResetArg::Whole);
        let args = parse(&["--plugins", &dir, "--memory-reset", "dirty-pages"]).unwrap();
        assert_eq!(args.memory_reset, MemoryResetArg::DirtyPages);
        let err = parse(&["--plugins", &dir, "--memory-reset", "fast"])
            .expect_err("an unknown reset is refused")
            .to_string();
        assert!(
            err.contains("dirty-pages") && err.contains("whole"),
            "{err}"
        );
    }

    #[test]
    fn plugins_come_from_directories_and_oci_references() {
        let dir = std::env::temp_dir();
        let dir_text = dir.display().to_string();
        let args = parse(&[
            "--plugins",
            &dir_text,
            "--plugins",
            "oci://127.0.0.1:5000/wasmop/good:v1",
            "--plugins",
            "other=oci://ghcr.io/x/good@sha256:0000000000000000000000000000000000000000000000000000000000000000",
            "--insecure-registry",
            "127.0.0.1:5000",
        ])
        .unwrap();
        assert_eq!(args.registry.insecure_registries, vec!["127.0.0.1:5000"]);
        assert_eq!(args.record, None);
        let recording = parse(&[
            "--plugins",
            &dir_text,
            "--record",
            "rec",
            "--record-max-mib",
            "8",
        ])
        .unwrap();
        assert_eq!(recording.record, Some(PathBuf::from("rec")));
        assert_eq!(recording.record_max_mib, 8);
        let (dirs, oci) = split_sources(&args.plugins).unwrap();
        assert_eq!(dirs, vec![dir.clone()]);
        let names: Vec<&str> = oci.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["good", "other"]);
        // Two references under one name, a missing directory, no source,
        // and a malformed reference are refused before anything runs.
        let twice = parse(&[
            "--plugins",
            "oci://ghcr.io/a/good:1",
            "--plugins",
            "oci://ghcr.io/b/good:1",
        ])
        .unwrap();
        let err = split_sources(&twice.plugins).unwrap_err().to_string();
        assert!(err.contains("two oci:// sources are named good"), "{err}");
        let missing = parse(&["--plugins", "/nonexistent/wasmop-plugins"]).unwrap();
        assert!(matches!(
            split_sources(&missing.plugins),
            Err(RunError::PluginDir { .. })
        ));
        assert!(parse(&[]).is_err());
        let err = parse(&["--plugins", "oci://ghcr.io/UPPER/x:1"])
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("not an OCI reference"), "{err}");
    }

    #[test]
    fn operator_file_rejects_unknown_keys() {
        let bad: Result<OperatorFile, _> = serde_yaml::from_str("plugins: {a: {setings: {}}}");
        assert!(bad.unwrap_err().to_string().contains("setings"));
        let good: OperatorFile = serde_yaml::from_str(
            "workers: 2\nplugins: {a: {settings: {x: 1}, deadlineMs: 10, memoryMiB: 8}}",
        )
        .unwrap();
        assert_eq!(good.workers, Some(2));
        assert_eq!(good.plugins["a"].memory_mib, Some(8));
    }

    #[test]
    fn plan_limits_are_configurable_per_plugin_with_defaults() {
        let file: OperatorFile = serde_yaml::from_str(
            "plugins: {a: {maxEvents: 5, minRequeueMs: 0, maxHttpRequests: 2}}",
        )
        .unwrap();
        let a = load_options(&file, "a", None).limits.plan;
        assert_eq!(
            (a.max_events, a.min_requeue_ms, a.max_http_requests),
            (5, 0, 2)
        );
        assert!(!a.dry_run_first);
        assert_eq!(a.max_applies, PlanLimits::default().max_applies);
        let b = load_options(&file, "b", None).limits.plan;
        assert_eq!(b, PlanLimits::default());
        assert_eq!(largest_deadline(&file), Limits::default().deadline);
    }

    fn run_args(extra: &[&str]) -> Result<RunArgs, clap::Error> {
        use clap::Parser;
        let argv = ["wasmop", "run", "--plugins", "p"].iter().chain(extra);
        let cli = crate::cli::Cli::try_parse_from(argv)?;
        match cli.command {
            crate::cli::Command::Run(args) => Ok(*args),
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn deletion_budgets_and_dry_runs_are_configurable_per_plugin() {
        let file: OperatorFile = serde_yaml::from_str(
            "plugins: {a: {maxDeletes: 10, maxDeletesPerMinute: 20, dryRunFirst: true}}",
        )
        .unwrap();
        let a = load_options(&file, "a", None).limits.plan;
        assert_eq!((a.max_deletes, a.max_deletes_per_minute), (10, 20));
        assert!(a.dry_run_first);
        let b = load_options(&file, "b", None).limits.plan;
        assert_eq!(
            (b.max_deletes, b.max_deletes_per_minute, b.dry_run_first),
            (500, 1000, false)
        );
    }

    #[test]
    fn leader_election_is_off_by_default() {
        let args = run_args(&[]).unwrap();
        assert!(!args.leader_elect);
        assert_eq!(leader_config(&args).unwrap(), None);
    }

    #[test]
    fn leader_election_uses_the_namespace_and_lease_name_given() {
        let args = run_args(&[
            "--leader-elect",
            "--leader-election-namespace",
            "ops",
            "--leader-election-id",
            "my-lease",
        ])
        .unwrap();
        let config = leader_config(&args).unwrap().expect("election configured");
        assert_eq!(config.namespace, "ops");
        assert_eq!(config.lease_name, "my-lease");
        assert_eq!(config.lease_duration, leader::DEFAULT_LEASE_DURATION);
    }

    #[test]
    fn leader_election_without_a_namespace_is_refused() {
        let args = RunArgs {
            leader_elect: true,
            leader_election_namespace: None,
            ..run_args(&[]).unwrap()
        };
        assert!(matches!(
            leader_config(&args),
            Err(RunError::LeaderNamespace)
        ));
        // On the command line clap refuses it, unless POD_NAMESPACE is set.
        if std::env::var_os("POD_NAMESPACE").is_none() {
            assert!(run_args(&["--leader-elect"]).is_err());
        }
    }

    #[test]
    fn the_user_agent_names_the_replica_when_there_is_one() {
        let version = env!("CARGO_PKG_VERSION");
        assert_eq!(user_agent(None), format!("wasmop/{version}").as_str());
        assert_eq!(
            user_agent(Some("wasmop-7d9f-x2")),
            format!("wasmop/{version} (wasmop-7d9f-x2)").as_str()
        );
        assert_eq!(
            user_agent(Some("bad\nname")),
            format!("wasmop/{version}").as_str()
        );
    }

    #[test]
    fn sharding_is_off_by_default_and_needs_leader_election() {
        assert!(!run_args(&[]).unwrap().sharding);
        assert!(run_args(&["--sharding"]).is_err());
        assert!(run_args(&["--lease-duration-ms", "2000"]).is_err());
        let args = run_args(&[
            "--leader-elect",
            "--leader-election-namespace",
            "ops",
            "--sharding",
            "--lease-duration-ms",
            "2000",
        ])
        .unwrap();
        assert!(args.sharding);
        let config = leader_config(&args).unwrap().expect("election configured");
        assert_eq!(config.lease_duration, Duration::from_secs(2));
    }
}
