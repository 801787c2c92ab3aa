//! The operator configuration file (`wasmop run --config`), re-read when it
//! changes, so a person can raise a deletion budget, turn on `dryRunFirst`
//! or change a plugin's settings without a restart.
//!
//! # Guarantees
//! - The file is polled (size, modification time and inode, following
//!   symlinks, so a mounted ConfigMap's atomic `..data` swap is seen) and
//!   read once it held still for one poll.
//! - A file that cannot be read or parsed is reported (log line, Warning
//!   Event `ConfigRejected` on the operator's Pod, metric
//!   `wasmop_config_reload_failures_total`) and the running configuration
//!   stays in force; fixing the file is picked up by the next poll.
//! - A valid file replaces the configuration the plugin sources load with
//!   ([`ConfigWatch::options_for`]); the plugin directory sees which
//!   plugins' settings or limits changed and reloads just those, through
//!   its validate-before-swap path
//!   ([`crate::delivery::hotswap::PluginDir`]). A plugin that refuses its new
//!   settings keeps running with the old ones.
//! - `workers` is read at start only; a change is logged as needing a
//!   restart.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::delivery::config::{OperatorFile, load_options, read_config};
use crate::delivery::hotswap::{OptionsFor, Stat, stat};
use crate::metrics;
use crate::plugin::CompileCache;

/// What one [`ConfigWatch::check`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Checked {
    /// Nothing changed (or a change is still settling).
    Unchanged,
    /// A new configuration is in force.
    Reloaded,
    /// The changed file was refused; the running configuration stays.
    Rejected(String),
}

/// The operator configuration file and the configuration in force.
#[derive(Debug)]
pub struct ConfigWatch {
    path: PathBuf,
    current: Arc<RwLock<Arc<OperatorFile>>>,
    /// Metadata at the last poll, and whether it was read since.
    seen: Option<Stat>,
    read: bool,
}

impl ConfigWatch {
    /// Watches `path`, whose content `file` was read from at start.
    pub fn new(path: PathBuf, file: OperatorFile) -> Self {
        let seen = stat(&path);
        Self {
            path,
            current: Arc::new(RwLock::new(Arc::new(file))),
            seen,
            read: true,
        }
    }

    /// The configuration in force.
    pub fn current(&self) -> Arc<OperatorFile> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Load options for a plugin file stem, from the configuration in
    /// force at the time of the call.
    pub fn options_for(&self, cache: Option<CompileCache>) -> OptionsFor {
        let current = self.current.clone();
        Arc::new(move |stem: &str| {
            let file = current.read().unwrap_or_else(|e| e.into_inner()).clone();
            load_options(&file, stem, cache.clone())
        })
    }

    /// Looks at the file once: a change that held still since the last
    /// look is read, and replaces the configuration when it is valid.
    pub fn check(&mut self) -> Checked {
        let now = stat(&self.path);
        if now != self.seen {
            // Changed since the last look: let it settle for one poll.
            self.seen = now;
            self.read = false;
            return Checked::Unchanged;
        }
        if self.read {
            return Checked::Unchanged;
        }
        self.read = true;
        match read_config(&self.path) {
            Ok(file) => {
                let old = self.current();
                if file.workers != old.workers {
                    tracing::warn!(from = ?old.workers, to = ?file.workers,
                        "operator configuration: workers changes only at a restart");
                }
                let changed: std::collections::BTreeSet<&String> = file
                    .plugins
                    .keys()
                    .chain(old.plugins.keys())
                    .filter(|k| {
                        format!("{:?}", file.plugins.get(*k))
                            != format!("{:?}", old.plugins.get(*k))
                    })
                    .collect();
                tracing::info!(file = %self.path.display(), plugins = ?changed,
                    "operator configuration re-read; plugins with changed options reload");
                *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(file);
                Checked::Reloaded
            }
            Err(e) => {
                let message = e.to_string();
                tracing::error!(error = %message,
                    "operator configuration refused; the running configuration stays in force");
                crate::report::selfevent::warning(
                    "ConfigRejected",
                    &format!("{message}; the running configuration stays in force"),
                );
                metrics::global().inc("wasmop_config_reload_failures_total", &[]);
                Checked::Rejected(message)
            }
        }
    }

    /// Checks the file every `poll` until the task is dropped.
    pub async fn watch(mut self, poll: Duration) {
        loop {
            tokio::time::sleep(poll).await;
            self.check();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn write(path: &Path, text: &str) {
        // A new inode each time, as a ConfigMap volume's swap does, so the
        // change is seen whatever the clock's resolution.
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }

    #[test]
    fn a_changed_file_is_read_after_it_settles_and_a_bad_one_keeps_the_running_config() {
        let dir = std::env::temp_dir().join(format!("wasmop-config-watch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("config.yaml");
        write(&path, "plugins: {fanout: {maxDeletes: 10}}\n");
        let mut watch = ConfigWatch::new(path.clone(), read_config(&path).unwrap());
        let options = watch.options_for(None);
        assert_eq!(options("fanout").limits.plan.max_deletes, 10);
        assert_eq!(watch.check(), Checked::Unchanged);

        write(
            &path,
            "plugins: {fanout: {maxDeletes: 50, dryRunFirst: true}}\n",
        );
        assert_eq!(watch.check(), Checked::Unchanged, "settling");
        assert_eq!(options("fanout").limits.plan.max_deletes, 10);
        assert_eq!(watch.check(), Checked::Reloaded);
        let plan = options("fanout").limits.plan;
        assert_eq!(plan.max_deletes, 50);
        assert!(plan.dry_run_first);
        assert_eq!(watch.check(), Checked::Unchanged, "read once");

        write(&path, "plugins: {fanout: {maxDeletez: 100}}\n");
        watch.check();
        let Checked::Rejected(why) = watch.check() else {
            panic!("a bad file is refused")
        };
        assert!(why.contains("maxDeletez"), "{why}");
        assert_eq!(options("fanout").limits.plan.max_deletes, 50, "kept");

        std::fs::remove_file(&path).unwrap();
        watch.check();
        assert!(matches!(watch.check(), Checked::Rejected(_)), "gone");
        assert_eq!(options("fanout").limits.plan.max_deletes, 50, "kept");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
