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
//! - A file whose load options changed (settings or limits, from a re-read
//!   operator configuration) is reloaded with them through the same
//!   validate-before-swap path, once per change: a plugin that refuses the
//!   new settings keeps running with the old ones.
//! - A plugin that needs a kind the API server does not serve (404: its
//!   CRD is not installed) is not rejected: it **waits**. One warning
//!   `plugin P waits for CRD C (install ...)`, the gauge
//!   `wasmop_plugin_waiting_for_crd{plugin,crd}` 1, a `[!] waiting` line on
//!   `/readyz`; it is tried again every [`WAIT_RETRY`] with the same loaded
//!   plugin and becomes active once the CRD is served (a version already
//!   active keeps serving meanwhile).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::controller::Operator;
use crate::metrics;
use crate::plugin::{LoadOptions, LoadedPlugin, digest};
use crate::sandbox::Sandbox;

/// How often a plugin that waits for a kind not served is tried again.
pub const WAIT_RETRY: Duration = Duration::from_secs(5);

/// A loaded plugin waiting for a kind the API server does not serve.
struct Waiting {
    plugin: Arc<LoadedPlugin>,
    crd: String,
    next_try: Instant,
    load_ms: u128,
}

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

/// What a poll compares to tell a file changed: size, modification time
/// and inode (an atomic rename changes the inode even when the rest holds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stat {
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
    /// [`options_key`] of the options it was last tried with.
    options: Option<String>,
}

/// What identifies load options: the settings and the limits (the compile
/// cache does not change what runs).
fn options_key(options: &LoadOptions) -> String {
    format!("{} {:?}", options.settings, options.limits)
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
    waiting: BTreeMap<PathBuf, Waiting>,
}

impl std::fmt::Debug for PluginDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginDir")
            .field("dirs", &self.dirs)
            .finish_non_exhaustive()
    }
}

/// The [`Stat`] of the regular file at `path` (symlinks followed), or
/// `None` when there is none.
pub(crate) fn stat(path: &Path) -> Option<Stat> {
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

fn is_shadow(path: &Path) -> bool {
    stem(path).ends_with(crate::report::shadow::SUFFIX)
}

/// The stem whose options a file is loaded with: its own, or for a shadow
/// `NAME.shadow.wasm` the shadowed plugin's `NAME`.
fn options_stem(path: &Path) -> String {
    let stem = stem(path);
    match stem.strip_suffix(crate::report::shadow::SUFFIX) {
        Some(base) => base.to_owned(),
        None => stem,
    }
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
            waiting: BTreeMap::new(),
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
        // Shadow candidates after the plugins they shadow.
        files.sort_by_key(|p| is_shadow(p));
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
            self.stop_waiting(&path);
            let Some(name) = self.known.remove(&path).and_then(|k| k.plugin) else {
                continue;
            };
            let removed = match name.strip_suffix(crate::report::shadow::SUFFIX) {
                Some(active) => self.operator.remove_shadow(active),
                None => self.operator.remove_plugin(&name),
            };
            if removed {
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
            // Tried before with other options (the configuration changed):
            // load the same bytes again with the new ones.
            // (Once per change, even when the file cannot be read.)
            let options_changed = known.options.is_some() && {
                let key = options_key(&(self.options)(&options_stem(&path)));
                let changed = known.options.as_ref() != Some(&key);
                if changed {
                    known.options = Some(key);
                }
                changed
            };
            if !known.pending && !options_changed {
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
            if known.digest.as_deref() == Some(d.as_str()) && !options_changed {
                continue;
            }
            if options_changed {
                tracing::info!(file = %path.display(), "plugin configuration changed; reloading");
            }
            known.digest = Some(d);
            self.load(&path, bytes, &mut report).await;
        }
        self.retry_waiting(&mut report).await;
        // A shadow refused for want of its active plugin is tried again
        // once a plugin became active.
        if !report.activated.is_empty() {
            for (path, known) in &mut self.known {
                if is_shadow(path) && known.plugin.is_none() && known.digest.is_none() {
                    known.pending = true;
                }
            }
        }
        report
    }

    async fn load(&mut self, path: &Path, bytes: Vec<u8>, report: &mut ScanReport) {
        // A new version replaces one that waited.
        self.stop_waiting(path);
        let stem = stem(path);
        // `NAME.shadow.wasm`: a shadow candidate, loaded with NAME's
        // settings and limits.
        let shadow_of = stem
            .strip_suffix(crate::report::shadow::SUFFIX)
            .map(str::to_owned);
        let options = (self.options)(&options_stem(path));
        if let Some(k) = self.known.get_mut(path) {
            k.options = Some(options_key(&options));
        }
        let sandbox = self.sandbox.clone();
        let origin = path.display().to_string();
        let started = Instant::now();
        let loaded = tokio::task::spawn_blocking(move || {
            LoadedPlugin::from_bytes(&sandbox, &bytes, &origin, &options)
        })
        .await;
        // How long the load took (a compile, unless the artifact was
        // cached): a plugin with very large functions can take seconds.
        let load_ms = started.elapsed().as_millis();
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
        if let Some(base) = shadow_of {
            if plugin.name() != base {
                let msg = format!(
                    "a shadow file is named after the plugin it shadows: {} holds plugin {}, not {base}",
                    path.display(),
                    plugin.name()
                );
                reject(report, path, "ShadowNameMismatch", &msg);
                return;
            }
            match self.operator.set_shadow(plugin.clone()) {
                Ok(()) => {
                    let marker = format!("{base}{}", crate::report::shadow::SUFFIX);
                    if let Some(k) = self.known.get_mut(path) {
                        k.plugin = Some(marker.clone());
                    }
                    report
                        .activated
                        .push((marker, plugin.version().to_string()));
                }
                Err(e) => {
                    // Tried again when the file changes; the active plugin
                    // may simply not have loaded yet.
                    if let Some(k) = self.known.get_mut(path) {
                        k.digest = None;
                    }
                    reject(report, path, "NoActivePlugin", &e);
                }
            }
            return;
        }
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
        self.activate(path, plugin, load_ms, report).await;
    }

    /// Hands a loaded plugin to the operator: active, waiting for a kind
    /// not served, or refused.
    async fn activate(
        &mut self,
        path: &Path,
        plugin: Arc<LoadedPlugin>,
        load_ms: u128,
        report: &mut ScanReport,
    ) {
        let name = plugin.name().to_string();
        let previous = self.known.get(path).and_then(|k| k.plugin.clone());
        match self.operator.add_plugin(plugin.clone()).await {
            Ok(()) => {
                if let Some(w) = self.waiting.remove(path) {
                    tracing::info!(file = %path.display(), plugin = %name, crd = %w.crd,
                        "the CRD the plugin waited for is served now");
                    metrics::global().set(
                        "wasmop_plugin_waiting_for_crd",
                        &[("plugin", &name), ("crd", &w.crd)],
                        0.0,
                    );
                }
                crate::report::health::global().clear_waiting(&name);
                tracing::info!(file = %path.display(), plugin = %name, version = plugin.version(),
                    digest = plugin.digest(), from_cache = plugin.compiled_from_cache(), load_ms,
                    "plugin active");
                if let Some(prev) = previous.filter(|p| *p != name) {
                    self.operator.remove_plugin(&prev);
                    report.removed.push(prev);
                }
                if let Some(k) = self.known.get_mut(path) {
                    k.plugin = Some(name.clone());
                }
                report.activated.push((name, plugin.version().to_string()));
            }
            Err(e @ crate::controller::OperatorError::KindNotServed { .. }) => {
                let crate::controller::OperatorError::KindNotServed { crd, .. } = &e else {
                    unreachable!()
                };
                let line = e.to_string();
                let same = self
                    .waiting
                    .get(path)
                    .is_some_and(|w| w.crd == *crd && Arc::ptr_eq(&w.plugin, &plugin));
                if !same {
                    if let Some(old) = self.waiting.get(path) {
                        metrics::global().set(
                            "wasmop_plugin_waiting_for_crd",
                            &[("plugin", &name), ("crd", &old.crd)],
                            0.0,
                        );
                    }
                    // The one line that says why the plugin is not active.
                    tracing::warn!(file = %path.display(), plugin = %name, crd = %crd,
                        retry_every = ?WAIT_RETRY, "{line}");
                    metrics::global().set(
                        "wasmop_plugin_waiting_for_crd",
                        &[("plugin", &name), ("crd", crd)],
                        1.0,
                    );
                    crate::report::health::global().set_waiting(&name, line, plugin.clone());
                }
                self.waiting.insert(
                    path.to_owned(),
                    Waiting {
                        plugin,
                        crd: crd.clone(),
                        next_try: Instant::now() + WAIT_RETRY,
                        load_ms,
                    },
                );
            }
            Err(e) => {
                self.stop_waiting(path);
                reject(report, path, "Refused", &e.to_string());
            }
        }
    }

    /// Tries again every waiting plugin whose turn has come.
    async fn retry_waiting(&mut self, report: &mut ScanReport) {
        let now = Instant::now();
        let due: Vec<PathBuf> = self
            .waiting
            .iter()
            .filter(|(_, w)| w.next_try <= now)
            .map(|(p, _)| p.clone())
            .collect();
        for path in due {
            let Some((plugin, load_ms)) = self
                .waiting
                .get(&path)
                .map(|w| (w.plugin.clone(), w.load_ms))
            else {
                continue;
            };
            self.activate(&path, plugin, load_ms, report).await;
        }
    }

    /// Forgets that the plugin of `path` waited (its file changed or went).
    fn stop_waiting(&mut self, path: &Path) {
        if let Some(w) = self.waiting.remove(path) {
            let name = w.plugin.name().to_owned();
            metrics::global().set(
                "wasmop_plugin_waiting_for_crd",
                &[("plugin", &name), ("crd", &w.crd)],
                0.0,
            );
            crate::report::health::global().clear_waiting(&name);
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
    crate::report::selfevent::plugin_rejected(&path.display().to_string(), reason, message);
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
