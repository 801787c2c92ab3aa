//! Test plugin `sleeper`: misbehaves in the export its settings name, in a
//! way epoch interruption alone cannot stop or that must not harm the host.
//!
//! Setting `block` (default `reconcile`):
//! - `reconcile`: reconcile sleeps for an hour (`std::thread::sleep`, on
//!   wasm32-wasip2 a monotonic-clock subscription and a blocking poll);
//! - `validate-settings`: validate-settings sleeps for an hour;
//! - `stdin`: reconcile reads stdin to its end, then returns an empty plan;
//! - `recurse`: reconcile recurses without end (a stack overflow);
//! - `stack-192k`: reconcile puts 192 KiB on its stack in linear memory
//!   (48 frames of 4 KiB), then returns an empty plan;
//! - `stack-overflow`: the same with 4 MiB, far beyond the 256 KiB stack
//!   plugins are linked with (`.cargo/config.toml`).

use std::hint::black_box;
use std::io::Read;
use std::time::Duration;

use wasmop_sdk::k8s_openapi::api::core::v1::ConfigMap;
use wasmop_sdk::serde_json::Value;
use wasmop_sdk::{
    Controller, KindRef, Manifest, Plan, Plugin, ReconcileError, SettingsProblem, Snapshot,
};

/// How long a sleep lasts: far beyond any deadline.
pub const SLEEP: Duration = Duration::from_secs(3600);

/// The `sleeper` plugin.
#[derive(Debug)]
pub struct Sleeper;

/// Where the plugin misbehaves (setting `block`).
fn block(settings: &Value) -> &str {
    settings
        .get("block")
        .and_then(Value::as_str)
        .unwrap_or("reconcile")
}

impl Plugin for Sleeper {
    fn manifest() -> Manifest {
        Manifest::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")).controller(
            Controller::new(
                "sleeper",
                KindRef::namespaced("test.wasmop.dev", "v1", "Sleeper", "sleepers"),
            )
            .owns(KindRef::of::<ConfigMap>()),
        )
    }

    fn validate_settings(settings: &Value) -> Result<(), Vec<SettingsProblem>> {
        wasmop_sdk::settings::only_keys(settings, &["block"])?;
        wasmop_sdk::settings::optional_string(settings, "block")?;
        if block(settings) == "validate-settings" {
            std::thread::sleep(SLEEP);
        }
        Ok(())
    }

    fn reconcile(snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
        match block(&snapshot.settings) {
            "stdin" => {
                let mut input = Vec::new();
                let _ = std::io::stdin().read_to_end(&mut input);
                Ok(Plan::new())
            }
            "stack-192k" => {
                black_box(fill_stack(black_box(48)));
                Ok(Plan::new())
            }
            "stack-overflow" => Err(ReconcileError::internal(format!(
                "4 MiB of stack did not overflow: {}",
                fill_stack(black_box(1024))
            ))),
            "recurse" => Err(ReconcileError::internal(format!(
                "recursion ended at depth {}",
                recurse(black_box(0))
            ))),
            "reconcile" => {
                std::thread::sleep(SLEEP);
                Err(ReconcileError::internal("sleeper: woke up"))
            }
            _ => Ok(Plan::new()),
        }
    }
}

/// Calls itself, not in tail position, until the wasm call stack runs out
/// (each frame is small, so that happens long before `u64::MAX`).
#[inline(never)]
pub fn recurse(depth: u64) -> u64 {
    if depth == u64::MAX {
        return depth;
    }
    recurse(black_box(depth + 1)).wrapping_add(1)
}

/// Recurses `depth` times with a 4 KiB buffer in each frame. The buffer's
/// address is taken, so it lives on the stack in linear memory (not in
/// wasm locals), and it is read after the inner call, so every frame stays.
#[inline(never)]
pub fn fill_stack(depth: u32) -> u64 {
    let mut frame = [0u8; 4096];
    frame[depth as usize % 4096] = depth as u8;
    let frame = black_box(&mut frame);
    let below = if depth == 0 {
        0
    } else {
        fill_stack(black_box(depth - 1))
    };
    below + u64::from(frame[0]) + u64::from(frame[4095])
}

wasmop_sdk::export_plugin!(Sleeper);

#[cfg(test)]
mod tests {
    use super::*;
    use wasmop_sdk::serde_json::json;

    #[test]
    fn block_defaults_to_reconcile_and_settings_are_checked() {
        assert_eq!(block(&json!({})), "reconcile");
        assert_eq!(block(&json!({"block": "stdin"})), "stdin");
        assert!(Sleeper::validate_settings(&json!({"block": "stdin"})).is_ok());
        assert!(Sleeper::validate_settings(&json!({"other": 1})).is_err());
        assert_eq!(Sleeper::manifest().controllers[0].primary.kind, "Sleeper");
    }
}
