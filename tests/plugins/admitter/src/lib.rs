//! Test plugin `admitter`: reconciles Widgets with empty plans and decides
//! their admission (rule [`RULE`], CREATE and UPDATE) from the Widget's
//! name: `loop-*` never returns (only the host's deadline ends the call),
//! `trap-*` panics with [`PANIC`], `deny-*` is denied with [`DENIAL`], and
//! anything else is admitted with a warning.

use std::hint::black_box;

use wasmop_sdk::admission::{
    AdmissionOperation, AdmissionRequest, AdmissionResponse, AdmissionRule, Admit,
};
use wasmop_sdk::serde_json::Value;
use wasmop_sdk::{
    Controller, KindRef, Manifest, Plan, Plugin, ReconcileError, SettingsProblem, Snapshot,
};

/// The plugin's name (shared with `admitter-plain`).
pub const NAME: &str = "admitter";
/// The admission rule.
pub const RULE: &str = "widgets";
/// The panic message of `trap-*` Widgets.
pub const PANIC: &str = "admitter: deliberate panic in admit";
/// The denial of `deny-*` Widgets.
pub const DENIAL: &str = "admitter: widgets named deny-* are not admitted";

/// The Widget kind.
pub fn widget() -> KindRef {
    KindRef::namespaced("test.wasmop.dev", "v1", "Widget", "widgets")
}

/// The `admitter` plugin.
#[derive(Debug)]
pub struct Admitter;

impl Plugin for Admitter {
    fn manifest() -> Manifest {
        Manifest::new(NAME, env!("CARGO_PKG_VERSION"))
            .controller(Controller::new("widgets", widget()))
            .admission(
                AdmissionRule::new(RULE, widget())
                    .operation(AdmissionOperation::Create)
                    .operation(AdmissionOperation::Update),
            )
    }

    fn validate_settings(settings: &Value) -> Result<(), Vec<SettingsProblem>> {
        wasmop_sdk::settings::only_keys(settings, &[])
    }

    fn reconcile(_snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
        Ok(Plan::new())
    }
}

impl Admit for Admitter {
    fn admit(request: &AdmissionRequest) -> AdmissionResponse {
        let name = request.name();
        if name.starts_with("loop-") {
            spin()
        } else if name.starts_with("trap-") {
            panic!("{PANIC}")
        } else if name.starts_with("deny-") {
            AdmissionResponse::deny(DENIAL)
        } else {
            AdmissionResponse::allow().warning(format!("admitter admitted {name}"))
        }
    }
}

/// Counts forever.
fn spin() -> ! {
    let mut turns: u64 = 0;
    loop {
        turns = black_box(turns.wrapping_add(1));
    }
}

wasmop_sdk_admitting::export_admitting_plugin!(Admitter);

#[cfg(test)]
mod tests {
    use super::*;
    use wasmop_sdk::serde_json::json;

    fn request(name: &str) -> AdmissionRequest {
        AdmissionRequest::from_review_request(
            RULE,
            json!({"operation": "CREATE", "name": name, "object": {"metadata": {"name": name}}}),
        )
    }

    #[test]
    fn names_choose_the_answer() {
        assert!(Admitter::admit(&request("fine")).allowed);
        assert_eq!(
            Admitter::admit(&request("deny-1")).message.as_deref(),
            Some(DENIAL)
        );
        assert_eq!(Admitter::manifest().admission[0].name, RULE);
    }

    #[test]
    #[should_panic(expected = "deliberate panic in admit")]
    fn trap_widgets_panic() {
        let _ = Admitter::admit(&request("trap-1"));
    }
}
