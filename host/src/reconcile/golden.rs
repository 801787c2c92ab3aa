//! Golden plans: fixture YAML in, expected plan out, for any plugin.
//!
//! A fixture directory holds `NAME.yaml` files (input of
//! [`crate::reconcile::offline`]: objects plus optional `Observations` and
//! `PlanOptions` documents) and next to each the expected `NAME.plan.json`
//! ([`crate::reconcile::offline::to_golden_text`]). The snapshot
//! time is the fixture's `PlanOptions.now`, or [`GOLDEN_NOW`].
//!
//! ```no_run
//! # fn main() -> Result<(), wasmop::reconcile::golden::GoldenError> {
//! // In a plugin's test:
//! wasmop::reconcile::golden::check(
//!     std::path::Path::new("../../target/plugins/instance.wasm"),
//!     std::path::Path::new("tests/golden"),
//! )?;
//! # Ok(()) }
//! ```
//!
//! With `WASMOP_BLESS=1` in the environment, the expected files are
//! (re)written instead of compared.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::plugin::{LoadError, LoadOptions, LoadedPlugin};
use crate::reconcile::offline::{self, InputError, OfflineError};
use crate::sandbox::{Sandbox, SandboxConfig, SandboxError};

/// Snapshot time of fixtures that do not set one.
pub const GOLDEN_NOW: &str = "2025-01-01T00:00:00Z";

/// The environment variable that turns checking into (re)writing.
pub const BLESS_ENV: &str = "WASMOP_BLESS";

/// What a check did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct GoldenReport {
    /// Fixtures whose plan matched.
    pub matched: Vec<PathBuf>,
    /// Fixtures whose expected file was written (bless mode).
    pub blessed: Vec<PathBuf>,
}

impl GoldenReport {
    /// Names (file stems) of every fixture checked or blessed, sorted.
    pub fn fixture_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .matched
            .iter()
            .chain(&self.blessed)
            .filter_map(|p| p.file_stem()?.to_str().map(str::to_owned))
            .collect();
        names.sort();
        names
    }
}

/// Why a golden check failed.
#[derive(Debug, Error)]
pub enum GoldenError {
    /// The fixture directory or a file in it could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The plugin component has not been built.
    #[error(
        "{path} not found: build the plugins with `bash tests/build-plugins.sh` (or point WASMOP_PLUGIN_DIR at them)"
    )]
    MissingPlugin {
        /// Where it was looked for.
        path: PathBuf,
    },
    /// The directory holds no `*.yaml` fixture.
    #[error("no *.yaml fixtures in {dir}")]
    NoFixtures {
        /// The directory.
        dir: PathBuf,
    },
    /// The sandbox could not be built.
    #[error("cannot build the sandbox")]
    Sandbox(#[source] SandboxError),
    /// A fixture does not parse.
    #[error(transparent)]
    Input(#[from] InputError),
    /// The plugin does not load (with a fixture's settings).
    #[error("{fixture}: cannot load the plugin")]
    Load {
        /// The fixture.
        fixture: PathBuf,
        /// Why.
        #[source]
        source: LoadError,
    },
    /// A fixture cannot be run (no primary, bad `now`).
    #[error("{fixture}: cannot run")]
    Run {
        /// The fixture.
        fixture: PathBuf,
        /// Why.
        #[source]
        source: OfflineError,
    },
    /// An AdmissionReview fixture cannot be decided (no matching rule).
    #[error("{fixture}: cannot decide the AdmissionReview")]
    Admission {
        /// The fixture.
        fixture: PathBuf,
        /// Why.
        #[source]
        source: crate::reconcile::admission::offline::OfflineAdmissionError,
    },
    /// One or more plans differ from their expected files.
    #[error("{} golden plan(s) differ (run with WASMOP_BLESS=1 to accept):\n{}", .mismatches.len(), .mismatches.join("\n"))]
    Mismatch {
        /// One entry per fixture: its path and the first differing line.
        mismatches: Vec<String>,
    },
}

impl GoldenError {
    /// The error and its causes on one line, for a test's panic message.
    pub fn chain(&self) -> String {
        let mut text = self.to_string();
        let mut source = std::error::Error::source(self);
        while let Some(s) = source {
            text.push_str(": ");
            text.push_str(&s.to_string());
            source = s.source();
        }
        text
    }
}

/// The built component of plugin `name`: `$WASMOP_PLUGIN_DIR/<name>.wasm`,
/// else `<workspace>/target/plugins/<name>.wasm` (where
/// `tests/build-plugins.sh` puts it).
///
/// # Errors
/// [`GoldenError::MissingPlugin`] when the file does not exist, saying how
/// to build it.
pub fn built_plugin(name: &str) -> Result<PathBuf, GoldenError> {
    let dir = std::env::var_os("WASMOP_PLUGIN_DIR").map_or_else(
        || std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/plugins"),
        PathBuf::from,
    );
    let path = dir.join(format!("{name}.wasm"));
    if path.is_file() {
        Ok(path)
    } else {
        Err(GoldenError::MissingPlugin { path })
    }
}

/// [`check`] with the built component of plugin `name` ([`built_plugin`]).
///
/// # Errors
/// As [`built_plugin`] and [`check`].
pub fn check_plugin(name: &str, dir: &Path) -> Result<GoldenReport, GoldenError> {
    check(&built_plugin(name)?, dir)
}

/// Checks (or, with `WASMOP_BLESS=1`, writes) every fixture in `dir`
/// against the plugin at `plugin`.
///
/// # Errors
///
/// [`GoldenError::Mismatch`] listing every fixture whose plan differs,
/// or the first fixture that cannot be read, loaded or run.
pub fn check(plugin: &Path, dir: &Path) -> Result<GoldenReport, GoldenError> {
    let bless = std::env::var(BLESS_ENV).is_ok_and(|v| !v.is_empty() && v != "0");
    let fixtures = fixtures(dir)?;
    let sandbox = Sandbox::new(SandboxConfig::default()).map_err(GoldenError::Sandbox)?;
    let mut plugins: BTreeMap<String, LoadedPlugin> = BTreeMap::new();
    let mut report = GoldenReport::default();
    let mut mismatches = Vec::new();

    for fixture in fixtures {
        let text = std::fs::read_to_string(&fixture).map_err(|source| GoldenError::Io {
            path: fixture.clone(),
            source,
        })?;
        let input = offline::parse_input(&text, &fixture.display().to_string())?;
        let settings = input.options.settings_or_empty();
        let key = settings.to_string();
        if !plugins.contains_key(&key) {
            let options = LoadOptions {
                settings,
                ..LoadOptions::default()
            };
            let loaded = LoadedPlugin::load(&sandbox, plugin, &options).map_err(|source| {
                GoldenError::Load {
                    fixture: fixture.clone(),
                    source,
                }
            })?;
            plugins.insert(key.clone(), loaded);
        }
        let loaded = &plugins[&key];
        let now = input
            .options
            .now
            .clone()
            .unwrap_or_else(|| GOLDEN_NOW.to_owned());
        let actual = match &input.review {
            // An AdmissionReview fixture: the golden file is the answer.
            Some(review) => {
                let answer = crate::reconcile::admission::offline::decide(
                    loaded,
                    review,
                    &input.objects,
                    &now,
                )
                .map_err(|source| GoldenError::Admission {
                    fixture: fixture.clone(),
                    source,
                })?;
                let mut text = serde_json::to_string_pretty(&answer).unwrap_or_default();
                text.push('\n');
                text
            }
            None => {
                let run = offline::run(loaded, &input, Some(&now), None).map_err(|source| {
                    GoldenError::Run {
                        fixture: fixture.clone(),
                        source,
                    }
                })?;
                run.golden_text()
            }
        };
        let expected_path = expected_path(&fixture);
        if bless {
            std::fs::write(&expected_path, &actual).map_err(|source| GoldenError::Io {
                path: expected_path.clone(),
                source,
            })?;
            report.blessed.push(fixture);
            continue;
        }
        match std::fs::read_to_string(&expected_path) {
            Ok(expected) if expected == actual => report.matched.push(fixture),
            Ok(expected) => mismatches.push(format!(
                "  {}: {}",
                expected_path.display(),
                first_difference(&expected, &actual)
            )),
            Err(e) => mismatches.push(format!("  {}: {e}", expected_path.display())),
        }
    }
    drop(plugins);
    drop(sandbox);
    if mismatches.is_empty() {
        Ok(report)
    } else {
        Err(GoldenError::Mismatch { mismatches })
    }
}

/// `NAME.yaml` → `NAME.plan.json`.
pub fn expected_path(fixture: &Path) -> PathBuf {
    fixture.with_extension("plan.json")
}

fn fixtures(dir: &Path) -> Result<Vec<PathBuf>, GoldenError> {
    let entries = std::fs::read_dir(dir).map_err(|source| GoldenError::Io {
        path: dir.to_owned(),
        source,
    })?;
    let mut out: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml") && p.is_file())
        .collect();
    out.sort();
    if out.is_empty() {
        return Err(GoldenError::NoFixtures {
            dir: dir.to_owned(),
        });
    }
    Ok(out)
}

fn first_difference(expected: &str, actual: &str) -> String {
    let mut e = expected.lines();
    let mut a = actual.lines();
    let mut line = 1;
    loop {
        match (e.next(), a.next()) {
            (Some(x), Some(y)) if x == y => line += 1,
            (x, y) => {
                return format!(
                    "line {line}: expected {:?}, got {:?}",
                    x.unwrap_or("<end>").trim(),
                    y.unwrap_or("<end>").trim()
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_files_sit_next_to_fixtures() {
        assert_eq!(
            expected_path(Path::new("dir/basic.yaml")),
            PathBuf::from("dir/basic.plan.json")
        );
    }

    #[test]
    fn differences_name_the_first_differing_line() {
        assert_eq!(
            first_difference("{\n  \"a\": 1\n}\n", "{\n  \"a\": 2\n}\n"),
            "line 2: expected \"\\\"a\\\": 1\", got \"\\\"a\\\": 2\""
        );
    }
}
