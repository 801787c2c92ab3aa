//! The `wasmop` command line.
//!
//! Each subcommand is one [`Command`] variant holding its arguments and one
//! function `fn name(args) -> Result<ExitCode, CliError>`, dispatched in
//! [`execute`]. Errors are [`CliError`]s that display as one line.

pub mod admission;
pub mod check;
pub mod new;
pub mod oci;
pub mod rbac;
pub mod replay;
pub mod rollout;
pub mod run;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use serde::Serialize;
use serde_json::Value;
use thiserror::Error;

use crate::contract::manifest::Manifest;
pub use crate::delivery::{config, config_watch};
use crate::plugin::{CompileCache, LoadError, LoadOptions, LoadedPlugin};
use crate::reconcile::decide::Decision;
use crate::reconcile::offline::{self, InputError, OfflineError};
use crate::sandbox::{Limits, Sandbox, SandboxConfig, SandboxError};

/// wasmop: a Kubernetes operator whose reconcile logic runs as WebAssembly
/// components.
#[derive(Debug, Parser)]
#[command(name = "wasmop", version, about)]
pub struct Cli {
    /// Log line format on stderr: `text` (colours only on a terminal) or
    /// `json` (one object per line).
    #[arg(long, global = true, value_enum, env = "WASMOP_LOG_FORMAT", default_value_t = crate::logging::LogFormat::Text)]
    pub log_format: crate::logging::LogFormat,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show a plugin's manifest, digest and the RBAC rules it needs.
    Inspect(InspectArgs),
    /// Compute a plugin's plan offline from objects in a YAML file (or, when
    /// the file holds an AdmissionReview, the plugin's admission answer).
    Plan(PlanArgs),
    /// Explore a plugin offline in a modelled cluster from examples and
    /// check the eight properties a plugin must hold; exit 1 on a finding.
    Check(Box<crate::cli::check::CheckArgs>),
    /// Scaffold a plugin crate of its own (SDK as a git or path
    /// dependency), with a golden fixture and a README.
    New(crate::cli::new::NewArgs),
    /// Print the least-privilege RBAC (ClusterRole, or Roles per
    /// namespace) the plugins in a directory and the operator need.
    Rbac(crate::cli::rbac::RbacArgs),
    /// Run the operator: reconcile with the plugins in directories or OCI
    /// registries, and hot-swap them as they change.
    Run(Box<crate::cli::run::RunArgs>),
    /// Recompute recorded reconciles (`run --record DIR`) with a candidate
    /// plugin and print how its plans differ; exit 1 on a difference.
    Replay(crate::cli::replay::ReplayArgs),
    /// Publish a plugin to an OCI registry (a wasm artifact, as the CNCF
    /// wasm working group lays it out); prints its digest reference.
    Push(crate::cli::oci::PushArgs),
    /// Show the staged plugin rollouts (PluginRollout objects), or undo
    /// one: every primary back to the current version.
    Rollout(crate::cli::rollout::RolloutArgs),
}

/// Output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Pretty-printed JSON.
    Json,
    /// YAML.
    Yaml,
}

/// Options shared by commands that load a plugin.
#[derive(Debug, Clone, Args)]
pub struct PluginArgs {
    /// Directory of the compiled-plugin cache
    /// [default: ${XDG_CACHE_HOME:-$HOME/.cache}/wasmop/compiled].
    #[arg(long, env = "WASMOP_COMPILE_CACHE", value_name = "DIR")]
    pub compile_cache: Option<PathBuf>,
    /// Compile the plugin without reading or writing the cache.
    #[arg(long)]
    pub no_compile_cache: bool,
    /// Deadline of one plugin call, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 2000)]
    pub deadline_ms: u64,
    /// Memory cap of one plugin call, in MiB.
    #[arg(long, value_name = "MIB", default_value_t = 64)]
    pub memory_mib: usize,
}

impl PluginArgs {
    fn load_options(&self, settings: Value) -> LoadOptions {
        let cache = if self.no_compile_cache {
            None
        } else {
            self.compile_cache
                .clone()
                .or_else(CompileCache::default_dir)
                .map(CompileCache::new)
        };
        LoadOptions {
            settings,
            limits: Limits {
                deadline: Duration::from_millis(self.deadline_ms),
                memory_bytes: self.memory_mib.saturating_mul(1 << 20),
                ..Limits::default()
            },
            cache,
        }
    }
}

/// Arguments of `wasmop inspect`.
#[derive(Debug, Args)]
pub struct InspectArgs {
    /// The plugin component.
    #[arg(value_name = "FILE.wasm")]
    pub plugin: PathBuf,
    /// Settings to load the plugin with (YAML or JSON file).
    #[arg(long, value_name = "FILE")]
    pub settings: Option<PathBuf>,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Format::Yaml)]
    pub output: Format,
    /// Plugin loading options.
    #[command(flatten)]
    pub load: PluginArgs,
}

/// Arguments of `wasmop plan`.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// The plugin component.
    #[arg(long, value_name = "FILE.wasm")]
    pub plugin: PathBuf,
    /// Objects (multi-document YAML or JSON; `kind: List` accepted).
    #[arg(short = 'f', long = "filename", value_name = "OBJECTS.yaml")]
    pub objects: PathBuf,
    /// The plugin's settings (YAML or JSON file).
    #[arg(long, value_name = "FILE")]
    pub settings: Option<PathBuf>,
    /// The snapshot's time, RFC 3339 [default: now].
    #[arg(long, value_name = "RFC3339")]
    pub now: Option<String>,
    /// Which controller to run, when the plugin has several.
    #[arg(long, value_name = "NAME")]
    pub controller: Option<String>,
    /// Output format of the plan.
    #[arg(short, long, value_enum, default_value_t = Format::Json)]
    pub output: Format,
    /// Plugin loading options.
    #[command(flatten)]
    pub load: PluginArgs,
}

/// Why a command failed. Displays as one line (with its sources joined).
#[derive(Debug, Error)]
pub enum CliError {
    /// A file could not be read.
    #[error("cannot read {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A settings file is not YAML or JSON.
    #[error("{path} is not valid YAML or JSON: {reason}")]
    Settings {
        /// The file.
        path: PathBuf,
        /// The parser's complaint.
        reason: String,
    },
    /// The objects file is not usable.
    #[error(transparent)]
    Input(#[from] InputError),
    /// The sandbox could not be built.
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    /// The plugin could not be loaded.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The offline run could not start.
    #[error(transparent)]
    Offline(#[from] OfflineError),
    /// An AdmissionReview could not be decided offline.
    #[error(transparent)]
    Admission(#[from] crate::reconcile::admission::offline::OfflineAdmissionError),
    /// The operator could not start.
    #[error(transparent)]
    Run(#[from] crate::cli::run::RunError),
    /// `wasmop rollout` failed.
    #[error(transparent)]
    Rollout(#[from] crate::cli::rollout::RolloutError),
    /// A file could not be written.
    #[error("cannot write {path}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// `wasmop new` refused its arguments.
    #[error("{reason}")]
    Scaffold {
        /// What is wrong.
        reason: String,
    },
    /// A registry could not be used (bad reference, credentials or push).
    #[error("{reason}")]
    Registry {
        /// What went wrong.
        reason: String,
    },
    /// `wasmop check` cannot use its inputs.
    #[error("{reason}")]
    Check {
        /// What is wrong.
        reason: String,
    },
    /// `wasmop replay` cannot use its recordings or allow-list.
    #[error("{reason}")]
    Replay {
        /// What is wrong.
        reason: String,
    },
    /// The result could not be printed.
    #[error("cannot print the result: {reason}")]
    Render {
        /// The serializer's complaint.
        reason: String,
    },
}

/// The whole `wasmop` program: parses the process's arguments, sets up
/// logging (`WASMOP_LOG`, default `wasmop=info` for `run` and `warn`
/// otherwise; `--log-format`), runs the command and reports an error as one line on
/// stderr. The `wasmop` binary is this function; the integration tests
/// build the same program under another name to spawn it.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    // `replay` exits 1 for "plans differ", `check` for a finding: their
    // own errors are 2.
    let error_code = if matches!(cli.command, Command::Replay(_) | Command::Check(_)) {
        ExitCode::from(2)
    } else {
        ExitCode::FAILURE
    };
    let default_level = match cli.command {
        Command::Run(_) => "wasmop=info",
        _ => "warn",
    };
    crate::logging::init(
        cli.log_format,
        tracing_subscriber::EnvFilter::try_from_env("WASMOP_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level)),
    );
    match execute(cli) {
        Ok(code) => code,
        Err(e) => {
            // `{:#}` joins the error and its causes on one line, no backtrace.
            eprintln!("error: {:#}", anyhow::Error::from(e));
            error_code
        }
    }
}

/// Runs the parsed command line.
///
/// # Errors
///
/// [`CliError`] for anything that stops a command from running. A plan
/// with violations or a failing plugin is not an error: the command
/// reports it and returns [`ExitCode::FAILURE`].
pub fn execute(cli: Cli) -> Result<ExitCode, CliError> {
    match cli.command {
        Command::Inspect(args) => inspect(args),
        Command::Plan(args) => plan(args),
        Command::Check(args) => crate::cli::check::check_command(*args),
        Command::New(args) => crate::cli::new::new_command(args),
        Command::Rbac(args) => crate::cli::rbac::rbac_command(args),
        Command::Run(args) => Ok(crate::cli::run::run(*args)?),
        Command::Push(args) => crate::cli::oci::push_command(args),
        Command::Replay(args) => crate::cli::replay::replay_command(args),
        Command::Rollout(args) => Ok(crate::cli::rollout::rollout_command(args)?),
    }
}

fn read(path: &Path) -> Result<String, CliError> {
    std::fs::read_to_string(path).map_err(|source| CliError::Read {
        path: path.to_owned(),
        source,
    })
}

fn read_settings(path: &Path) -> Result<Value, CliError> {
    let text = read(path)?;
    let value: Value = serde_yaml::from_str(&text).map_err(|e| CliError::Settings {
        path: path.to_owned(),
        reason: e.to_string(),
    })?;
    Ok(if value.is_null() {
        Value::Object(serde_json::Map::new())
    } else {
        value
    })
}

fn render<T: Serialize>(value: &T, format: Format) -> Result<String, CliError> {
    let text = match format {
        Format::Json => serde_json::to_string_pretty(value)
            .map(|mut s| {
                s.push('\n');
                s
            })
            .map_err(|e| e.to_string()),
        Format::Yaml => serde_yaml::to_string(value).map_err(|e| e.to_string()),
    };
    text.map_err(|reason| CliError::Render { reason })
}

/// What `wasmop inspect` prints.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Inspection<'a> {
    name: &'a str,
    version: &'a str,
    digest: &'a str,
    manifest: &'a Manifest,
    /// Per controller, the write namespaces the host enforces with these
    /// settings (`setting:<key>` entries resolved); an owned kind with a
    /// `writeNamespaces` of its own in `manifest` is narrowed to it.
    effective_write_namespaces: std::collections::BTreeMap<&'a str, &'a [String]>,
    cluster_role: k8s_openapi::api::rbac::v1::ClusterRole,
    /// What a fresh instance holds against the memory cap before it runs:
    /// initial linear memory and tables.
    start_memory_bytes: usize,
    /// The memory cap of each call with these options.
    memory_cap_bytes: usize,
    /// What the component imports: the contract's interfaces, and WASI's
    /// when it was built for `wasm32-wasip2`.
    imports: &'a [String],
}

fn inspect(args: InspectArgs) -> Result<ExitCode, CliError> {
    let settings = match &args.settings {
        Some(path) => read_settings(path)?,
        None => Value::Object(serde_json::Map::new()),
    };
    let sandbox = Sandbox::new(SandboxConfig::default())?;
    let plugin = LoadedPlugin::load(&sandbox, &args.plugin, &args.load.load_options(settings))?;
    let manifest = plugin.manifest();
    let inspection = Inspection {
        name: plugin.name(),
        version: plugin.version(),
        digest: plugin.digest(),
        manifest,
        effective_write_namespaces: plugin
            .effective_manifest()
            .controllers
            .iter()
            .map(|c| (c.name.as_str(), c.write_namespaces.as_slice()))
            .collect(),
        cluster_role: crate::plugin::rbac::cluster_role(manifest),
        start_memory_bytes: plugin.start_memory_bytes(),
        memory_cap_bytes: plugin.limits().memory_bytes,
        imports: plugin.imports(),
    };
    print!("{}", render(&inspection, args.output)?);
    Ok(ExitCode::SUCCESS)
}

fn plan(args: PlanArgs) -> Result<ExitCode, CliError> {
    let text = read(&args.objects)?;
    let input = offline::parse_input(&text, &args.objects.display().to_string())?;
    let settings = match &args.settings {
        Some(path) => read_settings(path)?,
        None => input.options.settings_or_empty(),
    };
    let sandbox = Sandbox::new(SandboxConfig::default())?;
    let plugin = LoadedPlugin::load(&sandbox, &args.plugin, &args.load.load_options(settings))?;
    if let Some(review) = &input.review {
        // An AdmissionReview: print the plugin's answer to it.
        let now = args
            .now
            .clone()
            .or_else(|| input.options.now.clone())
            .unwrap_or_else(|| jiff::Timestamp::now().to_string());
        let answer =
            crate::reconcile::admission::offline::decide(&plugin, review, &input.objects, &now)?;
        print!("{}", render(&answer, args.output)?);
        return Ok(ExitCode::SUCCESS);
    }
    let run = offline::run(
        &plugin,
        &input,
        args.now.as_deref(),
        args.controller.as_deref(),
    )?;
    if let Some(kind) = &run.kind {
        // A kind-scoped controller: one call over every primary in the
        // input, printed per primary.
        use crate::reconcile::kind::KindOutcome;
        print!("{}", offline::to_kind_golden_text(kind));
        let ok = match &kind.outcome {
            KindOutcome::Empty => true,
            KindOutcome::Failed(e) => {
                eprintln!(
                    "error: plugin {} failed ({}): {e}",
                    plugin.name(),
                    e.reason()
                );
                false
            }
            KindOutcome::Split { decisions, refused } => {
                for r in refused {
                    eprintln!("error: refused {r}");
                }
                refused.is_empty()
                    && decisions
                        .iter()
                        .all(|(_, d)| matches!(d, Decision::Planned { .. }))
            }
        };
        return Ok(if ok {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        });
    }
    if let Some(plan) = run.decision.plan() {
        print!("{}", render(plan, args.output)?);
    }
    match &run.decision {
        Decision::Planned { .. } => Ok(ExitCode::SUCCESS),
        Decision::Skipped(reason) => {
            eprintln!(
                "the plugin is not called ({}): the primary is being deleted and holds no \
                 finalizer of this controller, so garbage collection removes what it owns",
                reason.as_str()
            );
            Ok(ExitCode::SUCCESS)
        }
        Decision::Rejected { violations, .. } => {
            eprintln!(
                "error: the plan breaks {} rule(s); nothing of it would be written:",
                violations.len()
            );
            for v in violations {
                eprintln!("  - {}: {v}", v.rule.as_str());
            }
            Ok(ExitCode::FAILURE)
        }
        Decision::Failed(e) => {
            eprintln!(
                "error: plugin {} failed ({}): {e}",
                plugin.name(),
                e.reason()
            );
            Ok(ExitCode::FAILURE)
        }
    }
}
