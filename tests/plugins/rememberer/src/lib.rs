//! Test plugin `rememberer`: keeps a counter and a list of the primaries it
//! saw in statics, and reports both in the status it plans. Run natively
//! (one process, many calls) they grow; in the host every call starts from
//! the plugin's initial memory, so every plan says `calls: 1` and names
//! only its own primary. Built for WASI preview 2, it also reports the seconds
//! its wall clock reads (`clock`), which the host sets to the snapshot's
//! `now` for each call.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use wasmop_sdk::serde_json::{Value, json};
use wasmop_sdk::{
    Controller, KindRef, Manifest, Plan, Plugin, ReconcileError, SettingsProblem, Snapshot,
};

static CALLS: AtomicU32 = AtomicU32::new(0);
static SEEN: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// The `rememberer` plugin.
#[derive(Debug)]
pub struct Rememberer;

impl Plugin for Rememberer {
    fn manifest() -> Manifest {
        Manifest::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")).controller(
            Controller::new(
                "rememberer",
                KindRef::namespaced("test.wasmop.dev", "v1", "Widget", "widgets"),
            ),
        )
    }

    fn validate_settings(settings: &Value) -> Result<(), Vec<SettingsProblem>> {
        // Loading calls this: it counts too.
        CALLS.fetch_add(1, Ordering::SeqCst);
        wasmop_sdk::settings::only_keys(settings, &[])
    }

    fn reconcile(snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
        let calls = CALLS.fetch_add(1, Ordering::SeqCst) + 1;
        let name = snapshot.primary["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
        seen.push(name);
        let clock = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Ok(Plan::new().status(json!({"calls": calls, "seen": *seen, "clock": clock})))
    }
}

wasmop_sdk::export_plugin!(Rememberer);

#[cfg(test)]
mod tests {
    use super::*;
    use wasmop_sdk::testing::{SnapshotBuilder, run};

    #[test]
    fn natively_it_remembers() {
        let snapshot = |name: &str| {
            SnapshotBuilder::new("rememberer")
                .primary(json!({"kind": "Widget", "metadata": {"name": name, "namespace": "ns"}}))
                .build()
        };
        let first = run::<Rememberer>(&snapshot("a")).unwrap().status.unwrap();
        let second = run::<Rememberer>(&snapshot("b")).unwrap().status.unwrap();
        assert!(second["calls"].as_u64() > first["calls"].as_u64());
        assert_eq!(second["seen"].as_array().map(Vec::len), Some(2));
    }
}
