//! The `wasmop` program ([`wasmop::cli::main`], exactly what the `wasmop`
//! binary runs), built in this package so integration tests can spawn it
//! as a process (`CARGO_BIN_EXE_wasmop-under-test`).

use std::process::ExitCode;

fn main() -> ExitCode {
    wasmop::cli::main()
}
