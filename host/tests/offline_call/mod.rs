//! A plugin's reconcile of a primary, offline: what the test binaries that
//! call loaded plugins directly (`runtime.rs`, `polyglot.rs`) share.

use std::sync::Arc;

use serde_json::Value;
use wasmop::{CallError, LoadedPlugin, MemorySource, build_snapshot};

/// A reconcile of `primary` with `others` in the cluster (what the
/// plugin's first controller reads of them is in the snapshot).
pub fn reconcile_with(
    plugin: &LoadedPlugin,
    primary: Value,
    others: Vec<Value>,
) -> Result<wasmop::Plan, CallError> {
    let controller = &plugin.manifest().controllers[0];
    let primary = Arc::new(primary);
    let mut objects = others;
    objects.push((*primary).clone());
    let source = MemorySource::new(objects);
    let snapshot = build_snapshot(
        controller,
        primary,
        &source,
        "2025-01-01T00:00:00Z",
        plugin.settings(),
        vec![],
    );
    plugin.reconcile(&snapshot)
}
