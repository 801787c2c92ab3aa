//! The engine plugin's validating webhooks (served by the wasmop host,
//! decided here). They add only what CEL in the CRDs cannot express,
//! because it spans objects:
//!
//! | rule | kind | operations | denies when |
//! | --- | --- | --- | --- |
//! | [`CLASS_EXISTS_RULE`] | FireboltEngine | CREATE, UPDATE | `spec.engineClassRef` names no FireboltEngineClass in the engine's namespace |
//! | [`CLASS_IN_USE_RULE`] | FireboltEngineClass | DELETE | a live list finds engines in its namespace referencing it (up to [`NAMED_ENGINES`] are named) |
//!
//! Both reads are `live`: the class check must not race a class created a
//! moment earlier, and the delete guard must not trust a cache (or the
//! class's `status.boundEngines`, which starts at 0) that may lag a new
//! engine. An engine that is being deleted may still be updated (its
//! finalizer must come off) even if its class is gone.

use serde_json::Value;
use wasmop_sdk::admission::{
    AdmissionOperation, AdmissionRead, AdmissionRequest, AdmissionResponse, AdmissionRule,
};
use wasmop_sdk::{Manifest, Selector};

use crate::spec;

/// FireboltEngine CREATE/UPDATE: the class must exist.
pub const CLASS_EXISTS_RULE: &str = "engine-class-exists";
/// FireboltEngineClass DELETE: no engine may reference it.
pub const CLASS_IN_USE_RULE: &str = "class-in-use";
/// Read of the class an engine names.
pub const CLASS_READ: &str = "class";
/// Read of the engines in a class's namespace.
pub const ENGINES_READ: &str = "engines";
/// How many referencing engines a denial names.
pub const NAMED_ENGINES: usize = 10;

/// Adds the two rules to `manifest`.
pub fn rules(manifest: Manifest) -> Manifest {
    manifest
        .admission(
            AdmissionRule::new(CLASS_EXISTS_RULE, spec::engine_kind())
                .operation(AdmissionOperation::Create)
                .operation(AdmissionOperation::Update)
                .reads(AdmissionRead::live(
                    CLASS_READ,
                    spec::class_kind(),
                    Selector::field("spec.engineClassRef"),
                )),
        )
        .admission(
            AdmissionRule::new(CLASS_IN_USE_RULE, spec::class_kind())
                .operation(AdmissionOperation::Delete)
                .reads(AdmissionRead::live(
                    ENGINES_READ,
                    spec::engine_kind(),
                    Selector::SameNamespace,
                )),
        )
}

/// Decides one request.
pub fn admit(request: &AdmissionRequest) -> AdmissionResponse {
    match request.rule.as_str() {
        CLASS_EXISTS_RULE => class_exists(request),
        CLASS_IN_USE_RULE => class_in_use(request),
        other => {
            AdmissionResponse::deny(format!("the engine plugin has no admission rule {other}"))
        }
    }
}

fn class_ref(engine: &Value) -> Option<&str> {
    engine
        .pointer("/spec/engineClassRef")
        .and_then(Value::as_str)
        .filter(|r| !r.is_empty())
}

fn class_exists(request: &AdmissionRequest) -> AdmissionResponse {
    let engine = request.object();
    let Some(wanted) = class_ref(engine) else {
        return AdmissionResponse::allow();
    };
    if engine.pointer("/metadata/deletionTimestamp").is_some() {
        return AdmissionResponse::allow();
    }
    let found = request
        .related_of(CLASS_READ)
        .any(|c| c.pointer("/metadata/name").and_then(Value::as_str) == Some(wanted));
    if found {
        AdmissionResponse::allow()
    } else {
        AdmissionResponse::deny(format!(
            "spec.engineClassRef: FireboltEngineClass {wanted:?} does not exist in namespace {:?}; \
             create the class first or name an existing one",
            request.namespace()
        ))
    }
}

fn class_in_use(request: &AdmissionRequest) -> AdmissionResponse {
    let class = request.name();
    let mut users: Vec<&str> = request
        .related_of(ENGINES_READ)
        .filter(|e| class_ref(e) == Some(class))
        .filter_map(|e| e.pointer("/metadata/name").and_then(Value::as_str))
        .collect();
    if users.is_empty() {
        return AdmissionResponse::allow();
    }
    users.sort_unstable();
    let total = users.len();
    let mut named = users
        .iter()
        .take(NAMED_ENGINES)
        .copied()
        .collect::<Vec<_>>()
        .join(", ");
    if total > NAMED_ENGINES {
        named.push_str(&format!(" and {} more", total - NAMED_ENGINES));
    }
    AdmissionResponse::deny(format!(
        "FireboltEngineClass {class:?} is referenced by {total} FireboltEngine(s) in namespace \
         {:?}: {named}; delete them or change their spec.engineClassRef first",
        request.namespace()
    ))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn engine(name: &str, class: &str) -> Value {
        json!({"apiVersion": "compute.firebolt.io/v1alpha1", "kind": "FireboltEngine",
               "metadata": {"name": name, "namespace": "ns"}, "spec": {"engineClassRef": class}})
    }

    fn create(object: Value) -> AdmissionRequest {
        AdmissionRequest::from_review_request(
            CLASS_EXISTS_RULE,
            json!({"operation": "CREATE", "namespace": "ns", "name": object["metadata"]["name"],
                   "object": object, "oldObject": null}),
        )
    }

    #[test]
    fn an_engine_naming_a_missing_class_is_denied() {
        let denied = admit(&create(engine("e", "small")));
        assert!(!denied.allowed);
        assert!(
            denied
                .message
                .unwrap()
                .contains("FireboltEngineClass \"small\" does not exist in namespace \"ns\"")
        );
        let class = json!({"metadata": {"name": "small", "namespace": "ns"}});
        assert!(admit(&create(engine("e", "small")).related(CLASS_READ, class)).allowed);
        assert!(admit(&create(json!({"metadata": {"name": "e"}, "spec": {}}))).allowed);
    }

    #[test]
    fn an_engine_being_deleted_may_lose_its_finalizer_without_its_class() {
        let mut e = engine("e", "gone");
        e["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        let update = AdmissionRequest::from_review_request(
            CLASS_EXISTS_RULE,
            json!({"operation": "UPDATE", "namespace": "ns", "object": e, "oldObject": e}),
        );
        assert!(admit(&update).allowed);
    }

    #[test]
    fn deleting_a_referenced_class_is_denied_naming_its_engines() {
        let mut request = AdmissionRequest::from_review_request(
            CLASS_IN_USE_RULE,
            json!({"operation": "DELETE", "namespace": "ns", "name": "small", "object": null,
                   "oldObject": {"metadata": {"name": "small", "namespace": "ns"}}}),
        )
        .related(ENGINES_READ, engine("other", "large"));
        assert!(admit(&request).allowed);
        for i in 0..12 {
            request = request.related(ENGINES_READ, engine(&format!("e{i:02}"), "small"));
        }
        let denied = admit(&request);
        assert!(!denied.allowed);
        let message = denied.message.unwrap();
        assert!(
            message.contains("referenced by 12 FireboltEngine(s)"),
            "{message}"
        );
        assert!(message.contains("e00, e01"), "{message}");
        assert!(message.contains("e09 and 2 more"), "{message}");
        assert!(!message.contains("other"), "{message}");
    }

    #[test]
    fn the_manifest_declares_both_rules_with_live_reads() {
        let m = rules(Manifest::new("engine", "0.1.0"));
        assert_eq!(m.admission.len(), 2);
        assert!(m.admission.iter().all(|r| r.reads.iter().all(|x| x.live)));
    }
}
