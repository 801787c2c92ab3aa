//! wasmop: a Kubernetes operator whose reconcile logic runs as WebAssembly
//! components.
