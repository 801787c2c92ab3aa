//! Test plugin `admitter-plain`: the `admitter` plugin (same plugin name,
//! same controller) built without admission: no rules and no `admit`
//! export. Installing it over `admitter` in a hot swap must remove the
//! admitter's webhook.

use wasmop_sdk::serde_json::Value;
use wasmop_sdk::{
    Controller, KindRef, Manifest, Plan, Plugin, ReconcileError, SettingsProblem, Snapshot,
};

/// The plugin (named `admitter`).
#[derive(Debug)]
pub struct AdmitterPlain;

impl Plugin for AdmitterPlain {
    fn manifest() -> Manifest {
        Manifest::new("admitter", "0.2.0").controller(Controller::new(
            "widgets",
            KindRef::namespaced("test.wasmop.dev", "v1", "Widget", "widgets"),
        ))
    }

    fn validate_settings(settings: &Value) -> Result<(), Vec<SettingsProblem>> {
        wasmop_sdk::settings::only_keys(settings, &[])
    }

    fn reconcile(_snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
        Ok(Plan::new())
    }
}

wasmop_sdk::export_plugin!(AdmitterPlain);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plain_admitter_declares_no_admission() {
        let m = AdmitterPlain::manifest();
        assert_eq!(m.name, "admitter");
        assert!(m.admission.is_empty());
    }
}
