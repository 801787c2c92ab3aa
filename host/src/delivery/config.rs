//! The operator configuration file (`--config`) of `wasmop run`: its shape
//! ([`OperatorFile`]), how it is read ([`read_config`]) and how one plugin's
//! entry becomes its load options (`load_options`); with [`RunError`], why
//! `wasmop run` could not start. `run`, the configuration watch, the
//! admission webhook and `wasmop rbac` all read it, so it sits below them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;
use thiserror::Error;

use crate::judge::validate::PlanLimits;
use crate::plugin::{CompileCache, LoadOptions};
use crate::sandbox::Limits;

/// The operator configuration file.
///
/// ```yaml
/// workers: 4                 # reconciles running at once
/// plugins:
///   backup:                  # plugins/backup.wasm
///     settings: {targetNamespace: openshift-etcd}
///     deadlineMs: 2000       # per call
///     memoryMiB: 64          # per call, all memories and tables together
///     maxApplies: 500        # per plan; more is PlanRejected (TooManyApplies)
///     maxDeletes: 500        # deletion budget per plan (DeletionBudgetExceeded)
///     maxDeletesPerMinute: 1000  # deletion budget per minute, all primaries
///     dryRunFirst: false     # send every write with dryRun=All first
///     maxEvents: 50          # per plan (TooManyEvents)
///     maxHttpRequests: 32    # per plan (TooManyHttpRequests)
///     minRequeueMs: 1000     # shorter requeueAfterMs (0 too) wait this long
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
    /// Most applies in one plan (default 500).
    #[serde(default)]
    pub max_applies: Option<usize>,
    /// Per-reconcile deletion budget: most deletes in one plan (default
    /// 500).
    #[serde(default)]
    pub max_deletes: Option<usize>,
    /// Per-minute deletion budget: most deletes the plugin's plans execute
    /// in any minute, across its primaries (default 1000).
    #[serde(default)]
    pub max_deletes_per_minute: Option<usize>,
    /// Dry-run every write of a plan (`dryRun=All`) before making any
    /// (default false).
    #[serde(default)]
    pub dry_run_first: Option<bool>,
    /// Most Events in one plan (default 50).
    #[serde(default)]
    pub max_events: Option<usize>,
    /// Most HTTP requests in one plan (default 32).
    #[serde(default)]
    pub max_http_requests: Option<usize>,
    /// Shortest requeue delay in milliseconds (default 1000).
    #[serde(default)]
    pub min_requeue_ms: Option<u64>,
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
    /// `oci://` plugins cannot be set up (credentials, cache directory).
    #[error("OCI plugins: {0}")]
    Oci(String),
    /// No usable Kubernetes configuration.
    #[error("no Kubernetes configuration: {0}")]
    Kube(String),
    /// The wasm engine could not be built.
    #[error("cannot start the wasm engine: {0}")]
    Sandbox(String),
    /// `--leader-elect` without a namespace for the Lease.
    #[error("--leader-elect needs --leader-election-namespace (or POD_NAMESPACE)")]
    LeaderNamespace,
    /// `--sharding` with an identity that cannot name a shard.
    #[error("--sharding: {0}")]
    ShardIdentity(String),
    /// The async runtime could not start.
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
}

/// Reads and parses the operator configuration file.
///
/// # Errors
/// [`RunError::Config`] when it cannot be read or is not a valid
/// configuration (unknown keys included).
pub fn read_config(path: &Path) -> Result<OperatorFile, RunError> {
    let text = std::fs::read_to_string(path).map_err(|e| RunError::Config {
        path: path.to_owned(),
        reason: e.to_string(),
    })?;
    serde_yaml::from_str(&text).map_err(|e| RunError::Config {
        path: path.to_owned(),
        reason: e.to_string(),
    })
}

/// Settings and limits for the plugin file with this stem.
pub(crate) fn load_options(
    file: &OperatorFile,
    stem: &str,
    cache: Option<CompileCache>,
) -> LoadOptions {
    let conf = file.plugins.get(stem);
    let defaults = Limits::default();
    macro_rules! plan_limits {
        ($($field:ident),*) => {
            PlanLimits {
                $($field: conf.and_then(|c| c.$field).unwrap_or(defaults.plan.$field),)*
            }
        };
    }
    LoadOptions {
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
            // Each plan limit the file gives for this plugin, else the default.
            plan: plan_limits!(
                max_applies,
                max_deletes,
                max_events,
                max_http_requests,
                min_requeue_ms,
                max_deletes_per_minute,
                dry_run_first
            ),
        },
        cache,
    }
}
