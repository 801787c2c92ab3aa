//! `wasmop check PLUGIN.wasm -f EXAMPLES…`: explore a plugin in a modelled
//! cluster from each example and check the eight properties of
//! [`crate::check`]. Prints each failing property with the shortest trace
//! found (seed, scenario, one line per reconcile) and writes that trace as
//! recordings into `--trace-dir` (one directory per finding), so
//! `wasmop replay DIR --plugin PLUGIN.wasm` recomputes every plan of it.
//!
//! Exit code: 0 when every property holds, 1 when one does not, 2 when the
//! plugin or the examples cannot be used.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;
use serde::Deserialize;
use serde_json::Value;

use crate::check::cluster::{Host, Scripted};
use crate::check::explore::{Explorer, Finding, Options, Report};
use crate::check::mutate::schemas;
use crate::check::properties::Property;
use crate::cli::{CliError, PluginArgs, read, read_settings};
use crate::plugin::LoadedPlugin;
use crate::reconcile::offline;
use crate::sandbox::{Sandbox, SandboxConfig};

/// Arguments of `wasmop check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The plugin component.
    #[arg(value_name = "PLUGIN.wasm")]
    pub plugin: PathBuf,
    /// Example files (YAML or JSON, as `wasmop plan -f` reads them): the
    /// primaries and what they need. Each file is explored on its own.
    #[arg(short = 'f', long = "filename", value_name = "EXAMPLES", num_args = 1.., required = true)]
    pub examples: Vec<PathBuf>,
    /// Objects added to every example's world (what other operators or
    /// people provide: an instance another plugin provisions, a Secret).
    #[arg(long, value_name = "FILE")]
    pub with: Vec<PathBuf>,
    /// The plugin's settings (YAML or JSON file) [default: the first
    /// example's PlanOptions settings, else none].
    #[arg(long, value_name = "FILE")]
    pub settings: Option<PathBuf>,
    /// CRD files or directories: the primaries' OpenAPI schemas, for spec
    /// mutations (property 7 is skipped for a kind without one).
    #[arg(long, value_name = "PATH")]
    pub crds: Vec<PathBuf>,
    /// Scripted answers to the plugin's HTTP requests: a YAML list of
    /// `{id, method, status, body, error}` (`id` a prefix when it ends in
    /// `*`); an unscripted request fails as unreachable.
    #[arg(long, value_name = "FILE")]
    pub observations: Option<PathBuf>,
    /// Kinds the plugin documents as outliving its primary (property 8
    /// checks they are kept, not that they go).
    #[arg(long, value_name = "KIND")]
    pub kept: Vec<String>,
    /// Properties with known findings (names or numbers): reported, but
    /// they do not fail the check (for a deviation a plugin documents).
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub known: Vec<String>,
    /// Only these properties (names or numbers, e.g. `convergence,4`).
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub property: Vec<String>,
    /// The first seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Seeds per example (each a scenario of the cluster's knobs and an
    /// order of reconciles).
    #[arg(long, default_value_t = 6)]
    pub seeds: u64,
    /// Rounds a run may take to reach its fixpoint.
    #[arg(long, default_value_t = 40)]
    pub rounds: usize,
    /// Every crash point and stale view, and seeds on until the budget is
    /// spent.
    #[arg(long)]
    pub deep: bool,
    /// Time budget in seconds, per example [default: 30; 600 with --deep].
    #[arg(long, value_name = "SECS")]
    pub budget: Option<u64>,
    /// Where to write the traces of findings.
    #[arg(long, value_name = "DIR", default_value = "check-traces")]
    pub trace_dir: PathBuf,
    /// Plugin loading options.
    #[command(flatten)]
    pub load: PluginArgs,
}

/// Runs `wasmop check`.
///
/// # Errors
/// [`CliError`] when the plugin, an example, a CRD or the script cannot be
/// used.
pub fn check_command(args: CheckArgs) -> Result<ExitCode, CliError> {
    let started = Instant::now();
    let mut examples = Vec::new();
    for path in &args.examples {
        let origin = path.display().to_string();
        let input = offline::parse_input(&read(path)?, &origin)?;
        examples.push((path.clone(), input));
    }
    let mut extra = Vec::new();
    for path in &args.with {
        let origin = path.display().to_string();
        extra.extend(offline::parse_input(&read(path)?, &origin)?.objects);
    }
    for (_, input) in &mut examples {
        input.objects.extend(extra.iter().cloned());
    }
    let settings = match &args.settings {
        Some(p) => read_settings(p)?,
        None => examples
            .first()
            .map(|(_, i)| i.options.settings_or_empty())
            .unwrap_or_else(|| Value::Object(Default::default())),
    };
    let sandbox = Sandbox::new(SandboxConfig::default())?;
    let plugin = LoadedPlugin::load(&sandbox, &args.plugin, &args.load.load_options(settings))?;
    let script: Vec<Scripted> = match &args.observations {
        Some(p) => serde_yaml::from_str(&read(p)?).map_err(|e| CliError::Check {
            reason: format!(
                "{}: not a list of {{id, method, status, body, error}}: {e}",
                p.display()
            ),
        })?,
        None => Vec::new(),
    };
    let mut crd_docs = Vec::new();
    for p in &args.crds {
        for file in yaml_files(p)? {
            let text = read(&file)?;
            for doc in serde_yaml::Deserializer::from_str(&text) {
                if let Ok(v) = Value::deserialize(doc) {
                    crd_docs.push(v);
                }
            }
        }
    }
    let parse = |flag: &str, list: &[String]| -> Result<BTreeSet<Property>, CliError> {
        list.iter()
            .map(|p| {
                Property::parse(p.trim()).ok_or_else(|| CliError::Check {
                    reason: format!(
                        "--{flag} {p:?}: not one of {}",
                        Property::ALL.map(Property::name).join(", ")
                    ),
                })
            })
            .collect()
    };
    let mut properties = parse("property", &args.property)?;
    let known = parse("known", &args.known)?;
    if properties.is_empty() {
        properties = Property::ALL.into_iter().collect();
    }
    let opts = Options {
        rounds: args.rounds,
        seed: args.seed,
        seeds: args.seeds,
        deep: args.deep,
        budget: Duration::from_secs(args.budget.unwrap_or(if args.deep { 600 } else { 30 })),
        kept: args.kept.clone(),
        properties,
        schemas: schemas(&crd_docs),
    };
    let manifest = plugin.effective_manifest();
    let mut total = Report::default();
    for (path, input) in &examples {
        let host = Host {
            plugin: &plugin,
            script: &script,
        };
        let mut explorer = Explorer::new(host, manifest, &opts);
        let name = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("example")
            .to_owned();
        if !input.objects.iter().any(|o| {
            manifest
                .controller_for(crate::object::api_version(o), crate::object::kind(o))
                .is_some()
        }) {
            return Err(CliError::Check {
                reason: format!(
                    "{}: no object is of a kind plugin {} reconciles",
                    path.display(),
                    plugin.name()
                ),
            });
        }
        explorer.explore(&name, &input.objects);
        let r = explorer.finish();
        total.runs += r.runs;
        total.reconciles += r.reconciles;
        total.findings.extend(r.findings);
        total.notes.extend(r.notes);
    }
    total
        .findings
        .sort_by_key(|f| (f.property, f.example.clone()));
    for f in &total.findings {
        let dir = write_trace(&args.trace_dir, plugin.name(), f)?;
        print_finding(f, &dir, &args.plugin);
    }
    for n in &total.notes {
        println!("note: {n}");
    }
    let failed: BTreeSet<Property> = total.findings.iter().map(|f| f.property).collect();
    for p in known.difference(&failed) {
        if opts.properties.contains(p) {
            println!(
                "note: property {} ({}) is listed as known but held",
                p.number(),
                p.name()
            );
        }
    }
    println!(
        "checked plugin {} {} on {} example(s): {} runs, {} reconciles, {:.1} s; {}",
        plugin.name(),
        plugin.version(),
        examples.len(),
        total.runs,
        total.reconciles,
        started.elapsed().as_secs_f64(),
        opts.properties
            .iter()
            .map(|p| format!(
                "{} {} {}",
                p.number(),
                p.name(),
                match (failed.contains(p), known.contains(p)) {
                    (true, true) => "FAILED (known)",
                    (true, false) => "FAILED",
                    _ => "ok",
                }
            ))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(if failed.is_subset(&known) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn yaml_files(p: &Path) -> Result<Vec<PathBuf>, CliError> {
    if !p.is_dir() {
        return Ok(vec![p.to_owned()]);
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(p)
        .map_err(|source| CliError::Read {
            path: p.to_owned(),
            source,
        })?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|f| {
            f.extension()
                .is_some_and(|x| x == "yaml" || x == "yml" || x == "json")
        })
        .collect();
    files.sort();
    Ok(files)
}

/// Writes the finding's trace: one recording per reconcile
/// (`NNNN.json`), and `trace.txt` with the lines printed.
fn write_trace(root: &Path, plugin: &str, f: &Finding) -> Result<PathBuf, CliError> {
    let dir = root.join(format!("{plugin}-{}-{}", f.example, f.property.name()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|source| CliError::Write {
        path: dir.clone(),
        source,
    })?;
    let mut n = 0;
    for s in &f.steps {
        if s.recording.is_null() {
            continue;
        }
        n += 1;
        let path = dir.join(format!("{n:04}.json"));
        let mut text = serde_json::to_string_pretty(&s.recording).unwrap_or_default();
        text.push('\n');
        std::fs::write(&path, text).map_err(|source| CliError::Write { path, source })?;
    }
    let path = dir.join("trace.txt");
    std::fs::write(&path, trace_text(f)).map_err(|source| CliError::Write { path, source })?;
    Ok(dir)
}

fn trace_text(f: &Finding) -> String {
    let mut out = format!(
        "property {} ({}) fails from example {} (seed {}, scenario {}):\n  {}\n",
        f.property.number(),
        f.property.name(),
        f.example,
        f.seed,
        f.scenario,
        f.message
    );
    let mut n = 0;
    for (i, s) in f.steps.iter().enumerate() {
        let file = if s.recording.is_null() {
            String::new()
        } else {
            n += 1;
            format!(" [{n:04}.json]")
        };
        out.push_str(&format!(
            "  step {} (round {}){file}: {}\n",
            i + 1,
            s.round,
            s.summary
        ));
    }
    out
}

fn print_finding(f: &Finding, dir: &Path, plugin: &Path) {
    print!("{}", trace_text(f));
    println!(
        "  trace: {} (replay: wasmop replay {} --plugin {})",
        dir.display(),
        dir.display(),
        plugin.display()
    );
}
