//! What the test binaries that reset a pooled slot under the kernel's feet
//! (`swap.rs`, `compaction.rs`) share.

use std::sync::Arc;
use std::time::Duration;

use wasmop::sandbox::{StoreState, Tuning};
use wasmop::{Sandbox, SandboxConfig};
use wasmtime::component::{Component, InstancePre, Linker};

/// A sandbox of one pool slot, so every call gets the last one's memory;
/// `dirty_pages_reset` asks for the faster reset
/// (`--memory-reset=dirty-pages`).
pub fn one_slot(max_memory_bytes: usize, dirty_pages_reset: bool, tuning: Tuning) -> Arc<Sandbox> {
    let config = SandboxConfig {
        max_instances: 1,
        max_memory_bytes,
        epoch_tick: Duration::from_millis(10),
        dirty_pages_reset,
    };
    Sandbox::tuned(config, tuning).expect("sandbox")
}

/// The component `wat` (which imports nothing), compiled and linked.
pub fn link(sandbox: &Sandbox, wat: &str) -> InstancePre<StoreState> {
    let component =
        Component::new(sandbox.engine(), wat::parse_str(wat).expect("parses")).expect("compiles");
    Linker::<StoreState>::new(sandbox.engine())
        .instantiate_pre(&component)
        .expect("links")
}
