//! Test plugin `hog`: reconcile allocates 1 MiB chunks forever, writing
//! every byte and keeping them all, so only the host's memory cap ends the
//! call (the allocation fails and the instance traps).

use std::hint::black_box;

use wasmop_sdk::k8s_openapi::api::core::v1::ConfigMap;
use wasmop_sdk::serde_json::Value;
use wasmop_sdk::{
    Controller, KindRef, Manifest, Plan, Plugin, ReconcileError, SettingsProblem, Snapshot,
};

/// Size of one chunk.
pub const CHUNK: usize = 1 << 20;

/// The `hog` plugin.
#[derive(Debug)]
pub struct Hog;

impl Plugin for Hog {
    fn manifest() -> Manifest {
        Manifest::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")).controller(
            Controller::new(
                "hog",
                KindRef::namespaced("test.wasmop.dev", "v1", "Hog", "hogs"),
            )
            .owns(KindRef::of::<ConfigMap>()),
        )
    }

    fn validate_settings(settings: &Value) -> Result<(), Vec<SettingsProblem>> {
        wasmop_sdk::settings::only_keys(settings, &[])
    }

    fn reconcile(_snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
        hoard(usize::MAX);
        Err(ReconcileError::internal("hog: the memory never ran out"))
    }
}

/// Allocates and fills up to `chunks` chunks, keeping them all alive, and
/// returns how many bytes it holds.
pub fn hoard(chunks: usize) -> usize {
    let mut hoard: Vec<Vec<u8>> = Vec::new();
    for i in 0..chunks {
        // `vec![b; n]` with b != 0 writes every byte: the pages are touched.
        hoard.push(black_box(vec![(i % 251 + 1) as u8; CHUNK]));
    }
    black_box(&hoard).iter().map(Vec::len).sum()
}

wasmop_sdk::export_plugin!(Hog);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hoard_keeps_every_chunk_it_allocates() {
        assert_eq!(hoard(3), 3 * CHUNK);
        assert_eq!(Hog::manifest().controllers[0].primary.kind, "Hog");
    }
}
