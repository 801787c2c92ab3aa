//! `wasmop push`, and the registry options `run` shares with it.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::cli::CliError;
use crate::delivery::oci::{self, PluginSource, RegistryOptions};

/// How registries are reached (shared by `run` and `push`).
#[derive(Debug, Clone, Default, Args)]
pub struct RegistryArgs {
    /// A registry (`HOST[:PORT]`) reached over plain HTTP instead of HTTPS;
    /// repeat for several. For a registry on loopback or a private network.
    #[arg(long = "insecure-registry", value_name = "HOST[:PORT]")]
    pub insecure_registries: Vec<String>,
    /// Registry credentials: a Docker config file (`{"auths": {HOST:
    /// {"auth": …}}}`, the content of a `kubernetes.io/dockerconfigjson`
    /// Secret). Default: anonymous.
    #[arg(long, env = "WASMOP_REGISTRY_AUTH", value_name = "FILE")]
    pub registry_auth: Option<PathBuf>,
}

impl RegistryArgs {
    /// The registry options these arguments describe.
    ///
    /// # Errors
    /// [`CliError::Registry`] when the credentials file is unusable.
    pub fn options(&self) -> Result<RegistryOptions, CliError> {
        let mut opts = RegistryOptions {
            insecure: self.insecure_registries.clone(),
            ..RegistryOptions::default()
        };
        if let Some(path) = &self.registry_auth {
            opts.read_auth_file(path)
                .map_err(|reason| CliError::Registry { reason })?;
        }
        Ok(opts)
    }
}

/// Arguments of `wasmop push`.
#[derive(Debug, Args)]
pub struct PushArgs {
    /// The plugin component to publish.
    #[arg(value_name = "FILE.wasm")]
    pub plugin: PathBuf,
    /// Where: `oci://HOST[:PORT]/REPOSITORY:TAG`.
    #[arg(value_name = "oci://REF")]
    pub reference: String,
    /// Registry access.
    #[command(flatten)]
    pub registry: RegistryArgs,
}

/// `wasmop push`: publishes a plugin as a wasm OCI artifact and prints its
/// digest reference (`oci://…@sha256:…`), the form to pin in production.
///
/// # Errors
/// [`CliError`] for an unreadable or non-component file, a bad reference, or
/// a registry that refuses the push.
pub fn push_command(args: PushArgs) -> Result<ExitCode, CliError> {
    let bytes = std::fs::read(&args.plugin).map_err(|source| CliError::Read {
        path: args.plugin.clone(),
        source,
    })?;
    if !oci::is_component(&bytes) {
        return Err(CliError::Registry {
            reason: format!(
                "{} is not a WebAssembly component (build it for wasm32-unknown-unknown with wasm-component-ld as the linker, or for wasm32-wasip2)",
                args.plugin.display()
            ),
        });
    }
    let source = match args.reference.parse::<PluginSource>() {
        Ok(PluginSource::Oci(s)) => s,
        Ok(PluginSource::Dir(_)) => {
            return Err(CliError::Registry {
                reason: format!("{}: expected oci://HOST/REPOSITORY:TAG", args.reference),
            });
        }
        Err(reason) => return Err(CliError::Registry { reason }),
    };
    let options = args.registry.options()?;
    let file_name = args
        .plugin
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("plugin.wasm")
        .to_owned();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::Registry {
            reason: format!("runtime: {e}"),
        })?;
    let digest = runtime
        .block_on(oci::push(&options, &source.reference, &file_name, bytes))
        .map_err(|reason| CliError::Registry { reason })?;
    let repo = format!(
        "{}/{}",
        source.reference.registry(),
        source.reference.repository()
    );
    println!("{}{repo}@{digest}", oci::SCHEME);
    Ok(ExitCode::SUCCESS)
}
