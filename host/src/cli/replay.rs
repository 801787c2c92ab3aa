//! `wasmop replay DIR --plugin CANDIDATE.wasm`: recompute every recording
//! of `wasmop run --record DIR` with a candidate plugin and print, per
//! recording, how its plan differs from what the live plugin decided.
//!
//! Exit code: 0 when every plan is the same (or differs only as the
//! `--allow` file expects), 1 when any differs, 2 when the recordings or
//! the candidate cannot be used. So `wasmop replay` gates a plugin change
//! in CI.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use serde::Serialize;
use serde_json::Value;

use crate::cli::{CliError, Format, PluginArgs, read, render};
use crate::plugin::{LoadError, LoadedPlugin};
use crate::reconcile::diff::{Allowed, Difference, diff, diff_kind, kind_outcome_of, outcome_of};
use crate::reconcile::offline;
use crate::sandbox::{Sandbox, SandboxConfig};

/// Arguments of `wasmop replay`.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// Directory of recordings (`wasmop run --record DIR`), or one file.
    #[arg(value_name = "DIR")]
    pub recordings: PathBuf,
    /// The candidate plugin.
    #[arg(long, value_name = "FILE.wasm")]
    pub plugin: PathBuf,
    /// Differences to expect (YAML list of `{op, object, path}`, each
    /// optional, `*` wildcards): they are printed but do not fail.
    #[arg(long, value_name = "FILE")]
    pub allow: Option<PathBuf>,
    /// Output: text (one line per difference) or a JSON/YAML report.
    #[arg(short, long, value_enum)]
    pub output: Option<Format>,
    /// Plugin loading options.
    #[command(flatten)]
    pub load: PluginArgs,
}

/// The result of replaying one recording.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Replayed {
    /// The recording file.
    pub file: String,
    /// `Kind namespace/name` of the primary (for a recorded kind call, one
    /// entry per primary that differs, and `Kind (kind call)` for the
    /// call as a whole).
    pub primary: String,
    /// The plugin and version recorded.
    pub recorded_by: String,
    /// Unexpected differences.
    pub differences: Vec<Difference>,
    /// Differences the allow-list expects.
    pub allowed: Vec<Difference>,
}

/// The whole report.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// The candidate, `name version digest`.
    pub candidate: String,
    /// Recordings replayed.
    pub recordings: usize,
    /// Recordings of other plugins, not replayed.
    pub other_plugins: usize,
    /// Recordings whose plan is the same.
    pub equal: usize,
    /// Recordings that differ only as allowed.
    pub allowed: usize,
    /// Recordings that differ unexpectedly.
    pub different: usize,
    /// The recordings that differ at all.
    pub replays: Vec<Replayed>,
}

fn usage(reason: String) -> CliError {
    CliError::Replay { reason }
}

/// Runs `wasmop replay`.
///
/// # Errors
/// [`CliError`] when the recordings, the allow-list or the candidate cannot
/// be used (exit 2 through the caller); differences are exit code 1.
pub fn replay_command(args: ReplayArgs) -> Result<ExitCode, CliError> {
    let allow: Vec<Allowed> = match &args.allow {
        Some(path) => serde_yaml::from_str(&read(path)?).map_err(|e| {
            usage(format!(
                "{}: not a list of {{op, object, path}}: {e}",
                path.display()
            ))
        })?,
        None => Vec::new(),
    };
    let report = replay(&args.recordings, &args.plugin, &allow, &args.load)?;
    match args.output {
        Some(format) => print!("{}", render(&report, format)?),
        None => print_text(&report),
    }
    Ok(if report.different == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Replays the recordings at `recordings` (a directory or one file) with
/// the candidate `plugin`; differences matching `allow` are expected.
///
/// # Errors
/// [`CliError`] when the recordings or the candidate cannot be used, or
/// none of the recordings is of the candidate's plugin.
pub fn replay(
    recordings: &Path,
    plugin_file: &Path,
    allow: &[Allowed],
    load: &PluginArgs,
) -> Result<Report, CliError> {
    let files: Vec<PathBuf> = if recordings.is_dir() {
        let mut files: Vec<PathBuf> = std::fs::read_dir(recordings)
            .map_err(|source| CliError::Read {
                path: recordings.to_owned(),
                source,
            })?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        files.sort();
        files
    } else {
        vec![recordings.to_owned()]
    };
    if files.is_empty() {
        return Err(usage(format!(
            "{}: no recordings (*.json) to replay",
            recordings.display()
        )));
    }
    let sandbox = Sandbox::new(SandboxConfig::default())?;
    let bytes = std::fs::read(plugin_file).map_err(|source| CliError::Read {
        path: plugin_file.to_owned(),
        source,
    })?;
    // One load per distinct settings (a recording carries the settings the
    // live plugin ran with).
    let mut loaded: HashMap<String, LoadedPlugin> = HashMap::new();
    let mut candidate_name: Option<String> = None;
    let mut report = Report {
        candidate: String::new(),
        recordings: 0,
        other_plugins: 0,
        equal: 0,
        allowed: 0,
        different: 0,
        replays: Vec::new(),
    };
    for file in &files {
        let origin = file.display().to_string();
        let input = offline::parse_input(&read(file)?, &origin)?;
        let Some(recorded) = &input.recorded else {
            return Err(usage(format!(
                "{origin}: not a recording (no wasmop.dev/v1 Recorded document)"
            )));
        };
        let recorded_name = recorded
            .pointer("/plugin/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        if candidate_name.as_ref().is_some_and(|n| *n != recorded_name) {
            report.other_plugins += 1;
            continue;
        }
        let settings = input.options.settings_or_empty();
        let key = settings.to_string();
        if !loaded.contains_key(&key) {
            let origin = plugin_file.display().to_string();
            match LoadedPlugin::from_bytes(&sandbox, &bytes, &origin, &load.load_options(settings))
            {
                Ok(plugin) => {
                    loaded.insert(key.clone(), plugin);
                }
                // Another plugin's recording, whose settings this one
                // does not take.
                Err(LoadError::InvalidSettings { plugin, .. }) if plugin != recorded_name => {
                    candidate_name = Some(plugin);
                    report.other_plugins += 1;
                    continue;
                }
                Err(e) => return Err(e.into()),
            }
        }
        let plugin = &loaded[&key];
        candidate_name = Some(plugin.name().to_owned());
        if plugin.name() != recorded_name {
            report.other_plugins += 1;
            continue;
        }
        if report.candidate.is_empty() {
            report.candidate =
                format!("{} {} {}", plugin.name(), plugin.version(), plugin.digest());
        }
        report.recordings += 1;
        let run = offline::run(plugin, &input, None, None)?;
        let before = recorded.get("outcome").cloned().unwrap_or(Value::Null);
        let s = |k: &str| text_at(recorded, "primary", k);
        let kind_recording = s("scope") == "Kind";
        let whole_call = || format!("{} (kind call)", s("kind"));
        // Differences per primary: one entry for a reconcile, one per
        // primary that differs (and one for the whole call) for a kind call.
        let per_primary: Vec<(String, Vec<Difference>)> = match (&run.kind, kind_recording) {
            (None, false) => vec![(
                primary_label(&s("kind"), &s("namespace"), &s("name")),
                diff(&before, &outcome_of(&run.decision)),
            )],
            (Some(kind), true) => diff_kind(&before, &kind_outcome_of(kind))
                .into_iter()
                .map(|(primary, differences)| {
                    let label = if primary.is_empty() {
                        whole_call()
                    } else {
                        format!("{} {primary}", s("kind"))
                    };
                    (label, differences)
                })
                .collect(),
            // The candidate's controller is kind-scoped where the recorded
            // one was not, or the other way round: the outcomes differ as
            // a whole.
            (kind, _) => {
                let after = kind
                    .as_ref()
                    .map_or_else(|| outcome_of(&run.decision), kind_outcome_of);
                let label = if kind_recording {
                    whole_call()
                } else {
                    primary_label(&s("kind"), &s("namespace"), &s("name"))
                };
                vec![(
                    label,
                    vec![Difference {
                        op: "result".into(),
                        object: String::new(),
                        path: "(scope)".into(),
                        before: Some(before.clone()),
                        after: Some(after),
                    }],
                )]
            }
        };
        let ps = |k: &str| text_at(recorded, "plugin", k);
        let (mut any_allowed, mut any_different) = (false, false);
        for (primary, found) in per_primary {
            let (allowed, differences): (Vec<Difference>, Vec<Difference>) = found
                .into_iter()
                .partition(|d| allow.iter().any(|a| a.matches(d)));
            any_allowed |= !allowed.is_empty();
            any_different |= !differences.is_empty();
            if differences.is_empty() && allowed.is_empty() {
                continue;
            }
            report.replays.push(Replayed {
                file: file
                    .file_name()
                    .and_then(|n| n.to_str())
                    .unwrap_or_default()
                    .to_owned(),
                primary,
                recorded_by: format!("{} {}", ps("name"), ps("version")),
                differences,
                allowed,
            });
        }
        match (any_different, any_allowed) {
            (false, false) => report.equal += 1,
            (false, true) => report.allowed += 1,
            (true, _) => report.different += 1,
        }
    }
    if report.recordings == 0 {
        return Err(usage(format!(
            "{}: no recording of plugin {} ({} of other plugins)",
            recordings.display(),
            candidate_name.unwrap_or_default(),
            report.other_plugins
        )));
    }
    Ok(report)
}

/// The text at `recorded.doc.key`, empty when absent.
fn text_at(recorded: &Value, doc: &str, key: &str) -> String {
    recorded
        .pointer(&format!("/{doc}/{key}"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

/// `Kind namespace/name` of a recorded primary, `Kind name` when it is
/// cluster-scoped (as a kind call's entries name theirs).
fn primary_label(kind: &str, namespace: &str, name: &str) -> String {
    if namespace.is_empty() {
        format!("{kind} {name}")
    } else {
        format!("{kind} {namespace}/{name}")
    }
}

fn print_text(report: &Report) {
    for r in &report.replays {
        println!("{} ({}, recorded by {}):", r.primary, r.file, r.recorded_by);
        for d in &r.differences {
            println!("  {d}");
        }
        for d in &r.allowed {
            println!("  (allowed) {d}");
        }
    }
    println!(
        "replayed {} recording(s) with {}: {} equal, {} different only as allowed, {} different ({} of other plugins skipped)",
        report.recordings,
        report.candidate,
        report.equal,
        report.allowed,
        report.different,
        report.other_plugins
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_scoped_primaries_are_named_without_a_namespace() {
        assert_eq!(primary_label("Widget", "demo", "w1"), "Widget demo/w1");
        assert_eq!(primary_label("EtcdBackup", "", "b"), "EtcdBackup b");
    }
}
