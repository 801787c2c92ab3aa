//! The wasmop plugin SDK.
