//! The plugin directory: loads every `*.wasm` component at start-up and
//! keeps the running operator in step with the directory afterwards.
//!
//! # Guarantees
//! - A new or changed file is compiled and its manifest and settings are
//!   validated before it replaces anything; a file that fails any check is
//!   rejected with a log line and the `wasmop_plugin_load_failures_total`
//!   metric, and the version already running keeps serving.
//! - A file is read only once its size and modification time held still
//!   for one poll, so a half-copied file is not even tried.
//! - Symlinks are followed, so a mounted ConfigMap or volume, whose files
//!   change by an atomic swap of the `..data` symlink, is seen changing.
//! - A removed file stops its plugin's controllers; nothing is deleted.
//! - The same bytes are never compiled twice by this process, and the
//!   compile cache (by digest) spares recompiling after a restart.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::controller::Operator;
use crate::metrics;
use crate::plugin::{LoadOptions, LoadedPlugin, digest};
use crate::sandbox::Sandbox;

/// How to load the file with a given stem (settings and limits).
pub type OptionsFor = Arc<dyn Fn(&str) -> LoadOptions + Send + Sync>;

/// What one scan did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ScanReport {
    /// `(plugin, version)` activated.
    pub activated: Vec<(String, String)>,
    /// `(file, reason)` rejected.
    pub rejected: Vec<(PathBuf, String)>,
    /// Plugins stopped because their file went away.
    pub removed: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Stat {
    len: u64,
    modified: Option<SystemTime>,
    ino: u64,
}

#[derive(Debug, Default)]
struct Known {
    /// Metadata seen at the last scan.
    stat: Option<Stat>,
    /// Digest of the last content tried (active or rejected).
    digest: Option<String>,
    /// Plugin this file provides, when active.
    plugin: Option<String>,
    /// Changed since it was last tried.
    pending: bool,
}

/// Keeps an operator's plugins in step with one or more directories (the
/// user's plugin directories and the OCI mirror's, see
/// [`super::oci::OciMirror`]). A plugin name provided by two files is
/// refused for the second (`DuplicatePlugin`).
pub struct PluginDir {
    dirs: Vec<PathBuf>,
    sandbox: Arc<Sandbox>,
    operator: Arc<Operator>,
    options: OptionsFor,
    known: BTreeMap<PathBuf, Known>,
}

impl std::fmt::Debug for PluginDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginDir")
            .field("dirs", &self.dirs)
            .finish_non_exhaustive()
    }
}

fn stat(path: &Path) -> Option<Stat> {
    let m = std::fs::metadata(path).ok()?;
    if !m.is_file() {
        return None;
    }
    #[cfg(unix)]
    let ino = std::os::unix::fs::MetadataExt::ino(&m);
    #[cfg(not(unix))]
    let ino = 0;
    Some(Stat {
        len: m.len(),
        modified: m.modified().ok(),
        ino,
    })
}

/// The `*.wasm` files of `dir`, or `None` when it cannot be listed.
fn wasm_files(dir: &Path) -> Option<Vec<PathBuf>> {
    let entries = std::fs::read_dir(dir).ok()?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension().is_some_and(|x| x == "wasm")
                && !p
                    .file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with('.'))
        })
        .collect();
    files.sort();
    Some(files)
}

fn stem(path: &Path) -> String {
    path.file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or_default()
        .to_string()
}

impl PluginDir {
    /// A plugin directory feeding `operator`.
    pub fn new(
        dir: PathBuf,
        sandbox: Arc<Sandbox>,
        operator: Arc<Operator>,
        options: OptionsFor,
    ) -> Self {
        Self::with_dirs(vec![dir], sandbox, operator, options)
    }

    /// Plugin directories feeding `operator`.
    pub fn with_dirs(
        dirs: Vec<PathBuf>,
        sandbox: Arc<Sandbox>,
        operator: Arc<Operator>,
        options: OptionsFor,
    ) -> Self {
        Self {
            dirs,
            sandbox,
            operator,
            options,
            known: BTreeMap::new(),
        }
    }

    /// Looks at the directory once and applies what changed. `settle`
    /// requires a changed file to look the same as at the previous scan
    /// before it is read (false for the first scan at start-up).
    pub async fn scan(&mut self, settle: bool) -> ScanReport {
        let mut report = ScanReport::default();
        // A directory that cannot be listed (e.g. a volume being remounted)
        // says nothing about the plugins: keep every one running.
        let mut files = Vec::new();
        for dir in &self.dirs {
            let Some(mut found) = wasm_files(dir) else {
                tracing::warn!(dir = %dir.display(), "cannot list the plugin directory; keeping the running plugins");
                return report;
            };
            files.append(&mut found);
        }
        let present: HashMap<PathBuf, Option<Stat>> =
            files.iter().map(|p| (p.clone(), stat(p))).collect();

        // Files that went away: stop their plugins.
        let gone: Vec<PathBuf> = self
            .known
            .keys()
            .filter(|p| !present.get(*p).is_some_and(Option::is_some))
            .cloned()
            .collect();
        for path in gone {
            if let Some(name) = self.known.remove(&path).and_then(|k| k.plugin)
                && self.operator.remove_plugin(&name)
            {
                report.removed.push(name);
            }
        }

        for path in files {
            let Some(now) = present.get(&path).cloned().flatten() else {
                continue;
            };
            let known = self.known.entry(path.clone()).or_default();
            if known.stat.as_ref() != Some(&now) {
                known.stat = Some(now);
                known.pending = true;
                if settle {
                    // Changed (or new) since the last scan: let it settle.
                    continue;
                }
            }
            if !known.pending {
                continue;
            }
            known.pending = false;
            let bytes = match std::fs::read(&path) {
                Ok(b) => b,
                Err(e) => {
                    reject(
                        &mut report,
                        &path,
                        "Unreadable",
                        &format!("cannot read: {e}"),
                    );
                    continue;
                }
            };
            let d = digest(&bytes);
            if known.digest.as_deref() == Some(d.as_str()) {
                continue;
            }
            known.digest = Some(d);
            self.load(&path, bytes, &mut report).await;
        }
        report
    }

    async fn load(&mut self, path: &Path, bytes: Vec<u8>, report: &mut ScanReport) {
        let options = (self.options)(&stem(path));
        let sandbox = self.sandbox.clone();
        let origin = path.display().to_string();
        let loaded = tokio::task::spawn_blocking(move || {
            LoadedPlugin::from_bytes(&sandbox, &bytes, &origin, &options)
        })
        .await;
        let plugin = match loaded {
            Ok(Ok(p)) => Arc::new(p),
            Ok(Err(e)) => {
                reject(report, path, "LoadFailed", &error_chain(&e));
                return;
            }
            Err(e) => {
                reject(report, path, "LoadFailed", &e.to_string());
                return;
            }
        };
        let name = plugin.name().to_string();
        let other_file = self
            .known
            .iter()
            .find(|(p, k)| p.as_path() != path && k.plugin.as_deref() == Some(name.as_str()))
            .map(|(p, _)| p.clone());
        if let Some(other) = other_file {
            let msg = format!("plugin {name} is already provided by {}", other.display());
            reject(report, path, "DuplicatePlugin", &msg);
            return;
        }
        let previous = self.known.get(path).and_then(|k| k.plugin.clone());
        match self.operator.add_plugin(plugin.clone()).await {
            Ok(()) => {
                tracing::info!(file = %path.display(), plugin = %name, version = plugin.version(),
                    digest = plugin.digest(), from_cache = plugin.compiled_from_cache(), "plugin active");
                if let Some(prev) = previous.filter(|p| *p != name) {
                    self.operator.remove_plugin(&prev);
                    report.removed.push(prev);
                }
                if let Some(k) = self.known.get_mut(path) {
                    k.plugin = Some(name.clone());
                }
                report.activated.push((name, plugin.version().to_string()));
            }
            Err(e) => reject(report, path, "Refused", &e.to_string()),
        }
    }

    /// Scans every `poll` until the task is dropped.
    pub async fn watch(mut self, poll: Duration) {
        loop {
            tokio::time::sleep(poll).await;
            self.scan(true).await;
        }
    }
}

fn reject(report: &mut ScanReport, path: &Path, reason: &str, message: &str) {
    tracing::error!(file = %path.display(), reason, error = message, "plugin file rejected; the running version, if any, keeps serving");
    crate::selfevent::plugin_rejected(&path.display().to_string(), reason, message);
    metrics::global().inc(
        "wasmop_plugin_load_failures_total",
        &[
            (
                "file",
                path.file_name()
                    .and_then(|n| n.to_str())
                    .unwrap_or_default(),
            ),
            ("reason", reason),
        ],
    );
    report
        .rejected
        .push((path.to_owned(), format!("{reason}: {message}")));
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cur = s.source();
    }
    out
}
