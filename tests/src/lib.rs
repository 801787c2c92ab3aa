//! Test harness for wasmop's integration tests.
