//! Runs the real wasmop operator in-process for a test: real `.wasm`
//! plugins, the real host, the local control plane; and the command line
//! of one shard when it runs as a process ([`shard_command`]).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::{Context, Result};
use kube::Client;
use serde_json::Value;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use wasmop::controller::leader::LeaderConfig;
use wasmop::controller::{Operator, OperatorConfig};
use wasmop::{LoadOptions, LoadedPlugin, Sandbox, SandboxConfig};

/// Path of a built plugin (`$WASMOP_PLUGIN_DIR/<name>.wasm`, else
/// `target/plugins/<name>.wasm`).
///
/// # Errors
/// When the file does not exist: the plugins must be built first.
pub fn plugin_path(name: &str) -> Result<PathBuf> {
    Ok(wasmop::reconcile::golden::built_plugin(name)?)
}

/// The engine shared by every operator in this test process.
pub fn sandbox() -> Arc<Sandbox> {
    static SANDBOX: OnceLock<Arc<Sandbox>> = OnceLock::new();
    SANDBOX
        .get_or_init(|| Sandbox::new(SandboxConfig::default()).expect("sandbox"))
        .clone()
}

/// Loads a built plugin with `settings`.
///
/// # Errors
/// When the plugin is missing or does not load.
pub fn load_plugin(name: &str, settings: Value) -> Result<Arc<LoadedPlugin>> {
    let path = plugin_path(name)?;
    let options = LoadOptions {
        settings,
        ..LoadOptions::default()
    };
    let plugin = LoadedPlugin::load(&sandbox(), &path, &options)
        .with_context(|| format!("loading {}", path.display()))?;
    Ok(Arc::new(plugin))
}

/// An operator running in this process; stopped when dropped.
pub struct RunningOperator {
    /// The operator.
    pub operator: Arc<Operator>,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for RunningOperator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningOperator").finish_non_exhaustive()
    }
}

impl RunningOperator {
    /// Starts an operator watching `namespaces` with `plugins`, with short
    /// backoffs for tests.
    ///
    /// # Errors
    /// When a plugin cannot be registered.
    pub async fn start(
        client: Client,
        namespaces: Vec<String>,
        plugins: Vec<Arc<LoadedPlugin>>,
    ) -> Result<Self> {
        Self::start_with(client, namespaces, plugins, test_config()).await
    }

    /// Starts an operator with an explicit configuration.
    ///
    /// # Errors
    /// When a plugin cannot be registered.
    pub async fn start_with(
        client: Client,
        namespaces: Vec<String>,
        plugins: Vec<Arc<LoadedPlugin>>,
        config: OperatorConfig,
    ) -> Result<Self> {
        Self::start_inner(client, namespaces, plugins, config, true).await
    }

    /// Starts an operator whose write flag is false from the start, as
    /// `wasmop run --leader-elect` does: it watches and computes plans but
    /// writes nothing until a [`LeaderLoop`] elects it.
    ///
    /// # Errors
    /// When a plugin cannot be registered.
    pub async fn start_follower(
        client: Client,
        namespaces: Vec<String>,
        plugins: Vec<Arc<LoadedPlugin>>,
        config: OperatorConfig,
    ) -> Result<Self> {
        Self::start_inner(client, namespaces, plugins, config, false).await
    }

    async fn start_inner(
        client: Client,
        namespaces: Vec<String>,
        plugins: Vec<Arc<LoadedPlugin>>,
        config: OperatorConfig,
        leader: bool,
    ) -> Result<Self> {
        init_tracing();
        let (operator, changes) = Operator::new(client, namespaces, config);
        operator
            .leader_flag()
            .store(leader, std::sync::atomic::Ordering::SeqCst);
        for p in plugins {
            operator.add_plugin(p).await?;
        }
        let (tx, rx) = oneshot::channel();
        let task = tokio::spawn(operator.clone().run(changes, async {
            let _ = rx.await;
        }));
        Ok(Self {
            operator,
            shutdown: Some(tx),
            task: Some(task),
        })
    }

    /// Stops the operator after in-flight reconciles finished.
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }

    /// Stops the operator at once, mid-reconcile if need be (a crash).
    pub fn kill(mut self) {
        self.operator.abort();
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

impl Drop for RunningOperator {
    fn drop(&mut self) {
        self.operator.abort();
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

/// A leader-election loop ([`wasmop::controller::leader::run`]) driving one operator's
/// write flag, as `wasmop run --leader-elect` runs it; aborted (without
/// releasing the Lease) when dropped.
pub struct LeaderLoop {
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for LeaderLoop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderLoop").finish_non_exhaustive()
    }
}

impl LeaderLoop {
    /// Starts electing for `operator`: its flag follows the Lease, and
    /// every election requeues all its primaries.
    pub fn start(client: Client, config: LeaderConfig, operator: &Arc<Operator>) -> Self {
        init_tracing();
        let (tx, rx) = oneshot::channel();
        let op = operator.clone();
        let task = tokio::spawn(wasmop::controller::leader::run(
            client,
            config,
            operator.leader_flag(),
            operator.lease_deadline(),
            move || op.requeue_all(),
            async {
                let _ = rx.await;
            },
        ));
        Self {
            shutdown: Some(tx),
            task: Some(task),
        }
    }

    /// Stops gracefully: steps down and releases the Lease.
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }

    /// Stops at once without releasing the Lease (a crash); returns once
    /// the loop can send nothing more.
    pub async fn kill(mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
            let _ = t.await;
        }
    }
}

impl Drop for LeaderLoop {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

/// The operator configuration tests use: short backoffs.
pub fn test_config() -> OperatorConfig {
    OperatorConfig {
        backoff_base: Duration::from_millis(200),
        backoff_max: Duration::from_secs(5),
        secret_poll_interval: Duration::from_millis(500),
        ..OperatorConfig::default()
    }
}

fn init_tracing() {
    crate::logs::init();
}

/// `bin run` as one shard of a sharded operator: the plugins in
/// `plugins`, watching `ns` and holding its Leases (of `lease`) there,
/// named `identity` (`POD_NAME`), JSON logs at info level written to
/// `log`, killed when dropped. The caller adds what else it needs
/// (kubeconfig, poll interval) and spawns it.
///
/// # Errors
/// When `log` cannot be created.
pub fn shard_command(
    bin: &Path,
    plugins: &Path,
    ns: &str,
    identity: &str,
    lease: Duration,
    log: &Path,
) -> Result<tokio::process::Command> {
    let mut cmd = tokio::process::Command::new(bin);
    cmd.args(["--log-format", "json", "run", "--plugins"])
        .arg(plugins)
        .args(["--namespace", ns])
        .args(["--leader-elect", "--leader-election-namespace", ns])
        .args(["--lease-duration-ms", &lease.as_millis().to_string()])
        .arg("--sharding")
        .env("POD_NAME", identity)
        .env_remove("POD_NAMESPACE")
        .env("WASMOP_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(
            std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?,
        ))
        .kill_on_drop(true);
    Ok(cmd)
}
