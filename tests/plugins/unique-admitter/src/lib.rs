//! Test plugin `unique-admitter`: reconciles Widgets with empty plans and
//! refuses (rule [`RULE`], CREATE) a Widget whose `spec.value` another
//! Widget of its namespace already holds. The other Widgets come from a
//! *cached* admission read ([`READ`]): the host serves it from its watch
//! cache only when that cache holds every Widget, which a shard's
//! label-filtered cache of its own primaries does not.

use wasmop_sdk::admission::{
    AdmissionOperation, AdmissionRead, AdmissionRequest, AdmissionResponse, AdmissionRule, Admit,
};
use wasmop_sdk::serde_json::Value;
use wasmop_sdk::{
    Controller, KindRef, Manifest, Plan, Plugin, ReconcileError, Selector, SettingsProblem,
    Snapshot,
};

/// The admission rule.
pub const RULE: &str = "unique-value";
/// The read of the namespace's Widgets.
pub const READ: &str = "widgets";
/// The start of a denial.
pub const DENIAL: &str = "unique-admitter: spec.value is already held by Widget";

/// The Widget kind.
pub fn widget() -> KindRef {
    KindRef::namespaced("test.wasmop.dev", "v1", "Widget", "widgets")
}

/// The `unique-admitter` plugin.
#[derive(Debug)]
pub struct UniqueAdmitter;

impl Plugin for UniqueAdmitter {
    fn manifest() -> Manifest {
        Manifest::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION"))
            .controller(Controller::new("widgets", widget()))
            .admission(
                AdmissionRule::new(RULE, widget())
                    .operation(AdmissionOperation::Create)
                    .reads(AdmissionRead::cached(
                        READ,
                        widget(),
                        Selector::SameNamespace,
                    )),
            )
    }

    fn validate_settings(settings: &Value) -> Result<(), Vec<SettingsProblem>> {
        wasmop_sdk::settings::only_keys(settings, &[])
    }

    fn reconcile(_snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
        Ok(Plan::new())
    }
}

fn value(widget: &Value) -> Option<&str> {
    widget.pointer("/spec/value").and_then(Value::as_str)
}

impl Admit for UniqueAdmitter {
    fn admit(request: &AdmissionRequest) -> AdmissionResponse {
        let Some(wanted) = value(request.object()) else {
            return AdmissionResponse::allow();
        };
        let holder = request.related_of(READ).find(|w| {
            value(w) == Some(wanted)
                && w.pointer("/metadata/name").and_then(Value::as_str) != Some(request.name())
        });
        match holder.and_then(|w| w.pointer("/metadata/name").and_then(Value::as_str)) {
            Some(name) => AdmissionResponse::deny(format!("{DENIAL} {name}")),
            None => AdmissionResponse::allow(),
        }
    }
}

wasmop_sdk_admitting::export_admitting_plugin!(UniqueAdmitter);

#[cfg(test)]
mod tests {
    use super::*;
    use wasmop_sdk::serde_json::json;

    fn request(name: &str, value: &str, others: &[(&str, &str)]) -> AdmissionRequest {
        let object = json!({"metadata": {"name": name}, "spec": {"value": value}});
        let mut r = AdmissionRequest::from_review_request(
            RULE,
            json!({"operation": "CREATE", "name": name, "object": object}),
        );
        for (n, v) in others {
            r.related.push(wasmop_sdk::RelatedObject {
                read: READ.to_owned(),
                object: json!({"metadata": {"name": n}, "spec": {"value": v}}),
            });
        }
        r
    }

    #[test]
    fn a_value_another_widget_holds_is_refused() {
        let denied = UniqueAdmitter::admit(&request("b", "x", &[("a", "x")]));
        assert_eq!(denied.message.as_deref(), Some(&*format!("{DENIAL} a")));
        assert!(UniqueAdmitter::admit(&request("b", "y", &[("a", "x")])).allowed);
        assert!(UniqueAdmitter::admit(&request("a", "x", &[("a", "x")])).allowed);
    }
}
