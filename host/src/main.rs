//! The `wasmop` binary: parses the command line and reports errors as one
//! line on stderr.

use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let cli = wasmop::cli::Cli::parse();
    // The operator reports what it does; the one-shot commands only warn.
    let default_level = match cli.command {
        wasmop::cli::Command::Run(_) => "wasmop=info",
        _ => "warn",
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            EnvFilter::try_from_env("WASMOP_LOG").unwrap_or_else(|_| EnvFilter::new(default_level)),
        )
        .init();
    let result: anyhow::Result<ExitCode> = wasmop::cli::execute(cli).map_err(anyhow::Error::from);
    match result {
        Ok(code) => code,
        Err(e) => {
            // `{:#}` joins the error and its causes on one line, no backtrace.
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
