//! The `wasmop` binary: [`wasmop::cli::main`].

use std::process::ExitCode;

fn main() -> ExitCode {
    wasmop::cli::main()
}
