//! `wasmop run`: the live operator process.
//!
//! Loads every `*.wasm` component in the plugin directory (with settings and
//! limits from the optional operator configuration file), registers their
//! controllers, and reconciles until SIGINT or SIGTERM. A plugin file that
//! does not load is reported and skipped; the others run.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde::Deserialize;
use serde_json::Value;
use thiserror::Error;

use crate::controller::{Operator, OperatorConfig};
use crate::plugin::{CompileCache, LoadOptions, LoadedPlugin};
use crate::sandbox::{Limits, Sandbox, SandboxConfig};

/// Arguments of `wasmop run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Directory of plugin components (`*.wasm`).
    #[arg(long, value_name = "DIR")]
    pub plugins: PathBuf,
    /// Namespace to watch; repeat for several. Default: all namespaces.
    #[arg(long = "namespace", short = 'n', value_name = "NS")]
    pub namespaces: Vec<String>,
    /// Kubeconfig to use. Default: `$KUBECONFIG`, `~/.kube/config`, or the
    /// in-cluster service account.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Operator configuration (YAML): workers and per-plugin settings and
    /// limits, keyed by plugin file name without `.wasm`.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Directory of the compiled-plugin cache
    /// [default: ${XDG_CACHE_HOME:-$HOME/.cache}/wasmop/compiled].
    #[arg(long, env = "WASMOP_COMPILE_CACHE", value_name = "DIR")]
    pub compile_cache: Option<PathBuf>,
}

/// The operator configuration file.
///
/// ```yaml
/// workers: 4                 # reconciles running at once
/// plugins:
///   backup:                  # plugins/backup.wasm
///     settings: {targetNamespace: openshift-etcd}
///     deadlineMs: 2000       # per call
///     memoryMiB: 64          # per call
/// ```
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OperatorFile {
    /// Reconciles running at once.
    #[serde(default)]
    pub workers: Option<usize>,
    /// Per-plugin configuration, keyed by file stem.
    #[serde(default)]
    pub plugins: BTreeMap<String, PluginConfig>,
}

/// Configuration of one plugin.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PluginConfig {
    /// Settings handed to the plugin (validated by it at load).
    #[serde(default)]
    pub settings: Option<Value>,
    /// Deadline of one call in milliseconds (default 2000).
    #[serde(default)]
    pub deadline_ms: Option<u64>,
    /// Memory cap of one call in MiB (default 64).
    #[serde(default, rename = "memoryMiB")]
    pub memory_mib: Option<usize>,
}

/// Why `wasmop run` could not start.
#[derive(Debug, Error)]
pub enum RunError {
    /// The configuration file is unreadable or invalid.
    #[error("operator configuration {path}: {reason}")]
    Config {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The plugin directory cannot be listed.
    #[error("cannot list plugin directory {path}: {source}")]
    PluginDir {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// No plugin loaded.
    #[error("no plugin could be loaded from {0} (see the errors above)")]
    NoPlugins(PathBuf),
    /// No usable Kubernetes configuration.
    #[error("no Kubernetes configuration: {0}")]
    Kube(String),
    /// The wasm engine could not be built.
    #[error("cannot start the wasm engine: {0}")]
    Sandbox(String),
    /// The async runtime could not start.
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
}

fn read_config(path: &Path) -> Result<OperatorFile, RunError> {
    let text = std::fs::read_to_string(path).map_err(|e| RunError::Config {
        path: path.to_owned(),
        reason: e.to_string(),
    })?;
    serde_yaml::from_str(&text).map_err(|e| RunError::Config {
        path: path.to_owned(),
        reason: e.to_string(),
    })
}

/// The `*.wasm` files of a directory, sorted. Follows symlinks, so a
/// mounted ConfigMap (files behind `..data` symlinks) works.
///
/// # Errors
/// When the directory cannot be listed.
pub fn plugin_files(dir: &Path) -> Result<Vec<PathBuf>, RunError> {
    let entries = std::fs::read_dir(dir).map_err(|source| RunError::PluginDir {
        path: dir.to_owned(),
        source,
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "wasm") && p.is_file())
        .collect();
    files.sort();
    Ok(files)
}

/// Runs the operator until SIGINT or SIGTERM.
///
/// # Errors
/// [`RunError`] when nothing can run: bad configuration, no cluster, no
/// plugin loaded. A single broken plugin is logged and skipped.
pub fn run(args: RunArgs) -> Result<ExitCode, RunError> {
    let file = match &args.config {
        Some(p) => read_config(p)?,
        None => OperatorFile::default(),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(RunError::Runtime)?;
    runtime.block_on(run_async(args, file))
}

async fn run_async(args: RunArgs, file: OperatorFile) -> Result<ExitCode, RunError> {
    let sandbox = Sandbox::new(SandboxConfig::default()).map_err(|e| RunError::Sandbox(e.to_string()))?;
    let cache = args
        .compile_cache
        .clone()
        .or_else(CompileCache::default_dir)
        .map(CompileCache::new);
    let mut plugins = Vec::new();
    for path in plugin_files(&args.plugins)? {
        let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or_default().to_string();
        let conf = file.plugins.get(&stem);
        let defaults = Limits::default();
        let options = LoadOptions {
            settings: conf
                .and_then(|c| c.settings.clone())
                .unwrap_or_else(|| Value::Object(Default::default())),
            limits: Limits {
                deadline: conf
                    .and_then(|c| c.deadline_ms)
                    .map(Duration::from_millis)
                    .unwrap_or(defaults.deadline),
                memory_bytes: conf
                    .and_then(|c| c.memory_mib)
                    .map(|m| m.saturating_mul(1 << 20))
                    .unwrap_or(defaults.memory_bytes),
            },
            cache: cache.clone(),
        };
        let sandbox = sandbox.clone();
        let loaded = tokio::task::spawn_blocking(move || LoadedPlugin::load(&sandbox, &path, &options).map_err(|e| (path, e)))
            .await;
        match loaded {
            Ok(Ok(p)) => {
                tracing::info!(plugin = p.name(), version = p.version(), digest = p.digest(),
                    from_cache = p.compiled_from_cache(), "plugin loaded");
                plugins.push(Arc::new(p));
            }
            Ok(Err((path, e))) => {
                tracing::error!(file = %path.display(), error = %error_chain(&e), "plugin rejected; not loaded");
            }
            Err(e) => tracing::error!(error = %e, "plugin load task failed"),
        }
    }
    for name in file.plugins.keys() {
        if !args.plugins.join(format!("{name}.wasm")).is_file() {
            tracing::warn!(plugin = %name, "configuration names a plugin that is not in the plugin directory");
        }
    }
    if plugins.is_empty() {
        return Err(RunError::NoPlugins(args.plugins));
    }

    let client = client(args.kubeconfig.as_deref()).await?;
    let config = OperatorConfig {
        workers: file.workers.unwrap_or(OperatorConfig::default().workers),
        ..OperatorConfig::default()
    };
    let (operator, changes) = Operator::new(client, args.namespaces.clone(), config);
    let mut started = 0;
    for p in plugins {
        let name = p.name().to_string();
        match operator.add_plugin(p).await {
            Ok(()) => started += 1,
            Err(e) => tracing::error!(plugin = %name, error = %e, "plugin not started"),
        }
    }
    if started == 0 {
        return Err(RunError::NoPlugins(args.plugins));
    }
    tracing::info!(controllers = ?operator.controller_ids(), "operator running");
    operator.run(changes, shutdown_signal()).await;
    tracing::info!("operator stopped");
    Ok(ExitCode::SUCCESS)
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        out.push_str(": ");
        out.push_str(&s.to_string());
        cur = s.source();
    }
    out
}

async fn client(kubeconfig: Option<&Path>) -> Result<Client, RunError> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path).map_err(|e| RunError::Kube(format!("{}: {e}", path.display())))?;
            Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(|e| RunError::Kube(format!("{}: {e}", path.display())))?
        }
        None => Config::infer().await.map_err(|e| RunError::Kube(e.to_string()))?,
    };
    Client::try_from(config).map_err(|e| RunError::Kube(e.to_string()))
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
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

    #[test]
    fn operator_file_rejects_unknown_keys() {
        let bad: Result<OperatorFile, _> = serde_yaml::from_str("plugins: {a: {setings: {}}}");
        assert!(bad.unwrap_err().to_string().contains("setings"));
        let good: OperatorFile =
            serde_yaml::from_str("workers: 2\nplugins: {a: {settings: {x: 1}, deadlineMs: 10, memoryMiB: 8}}").unwrap();
        assert_eq!(good.workers, Some(2));
        assert_eq!(good.plugins["a"].memory_mib, Some(8));
    }
}
