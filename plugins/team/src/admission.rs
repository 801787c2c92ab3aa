//! Admission: one TerdutEscalationRule per team. terdut-server stores one
//! whole escalation policy per team (§5), so two rules naming the same team
//! would overwrite each other's policy on every resync. The rule reads the
//! namespace's escalation rules live (a `teamRef` is same-namespace only,
//! §1) and denies a create or update that would make a second one.

use serde_json::Value;
use wasmop_sdk::admission::{
    AdmissionOperation, AdmissionRead, AdmissionRequest, AdmissionResponse, AdmissionRule,
};
use wasmop_sdk::{Manifest, Selector};

use crate::api::escalation_kind;

/// The admission rule's name.
pub const ONE_POLICY_RULE: &str = "one-escalation-rule-per-team";
/// Its read: the escalation rules of the request's namespace.
pub const RULES_READ: &str = "rules";

/// Adds the rule to `manifest`.
pub fn rules(manifest: Manifest) -> Manifest {
    manifest.admission(
        AdmissionRule::new(ONE_POLICY_RULE, escalation_kind())
            .operation(AdmissionOperation::Create)
            .operation(AdmissionOperation::Update)
            .reads(AdmissionRead::live(
                RULES_READ,
                escalation_kind(),
                Selector::SameNamespace,
            )),
    )
}

fn team_of(rule: &Value) -> Option<&str> {
    rule.pointer("/spec/teamRef/name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
}

/// Decides one request.
pub fn admit(request: &AdmissionRequest) -> AdmissionResponse {
    if request.rule != ONE_POLICY_RULE {
        return AdmissionResponse::deny(format!(
            "the team plugin has no admission rule {}",
            request.rule
        ));
    }
    let rule = request.object();
    // A rule on its way out (finalizer removal) is never held up.
    if rule.pointer("/metadata/deletionTimestamp").is_some() {
        return AdmissionResponse::allow();
    }
    let Some(team) = team_of(rule) else {
        return AdmissionResponse::allow();
    };
    let name = request.name();
    let mut others: Vec<&str> = request
        .related_of(RULES_READ)
        .filter(|r| r.pointer("/metadata/name").and_then(Value::as_str) != Some(name))
        .filter(|r| r.pointer("/metadata/deletionTimestamp").is_none())
        .filter(|r| team_of(r) == Some(team))
        .filter_map(|r| r.pointer("/metadata/name").and_then(Value::as_str))
        .collect();
    if others.is_empty() {
        return AdmissionResponse::allow();
    }
    others.sort_unstable();
    AdmissionResponse::deny(format!(
        "TerdutTeam {team:?} already has TerdutEscalationRule {:?} in namespace {:?}: terdut-server \
         keeps one escalation policy per team, so a team takes one rule; change that one instead",
        others.join(", "),
        request.namespace()
    ))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn rule(name: &str, team: &str) -> Value {
        json!({"apiVersion": "terdut.ryuvia.com/v1alpha1", "kind": "TerdutEscalationRule",
               "metadata": {"name": name, "namespace": "ns"}, "spec": {"teamRef": {"name": team}}})
    }

    fn request(operation: &str, object: Value) -> AdmissionRequest {
        AdmissionRequest::from_review_request(
            ONE_POLICY_RULE,
            json!({"operation": operation, "namespace": "ns", "name": object["metadata"]["name"],
                   "object": object, "oldObject": null}),
        )
    }

    #[test]
    fn a_second_rule_for_a_team_is_denied_naming_the_first() {
        let denied = admit(
            &request("CREATE", rule("b", "platform")).related(RULES_READ, rule("a", "platform")),
        );
        assert!(!denied.allowed);
        let message = denied.message.unwrap();
        assert!(
            message.contains("TerdutTeam \"platform\" already has TerdutEscalationRule \"a\""),
            "{message}"
        );
        // Another team's rule, or none: allowed.
        assert!(
            admit(
                &request("CREATE", rule("b", "platform")).related(RULES_READ, rule("a", "other"))
            )
            .allowed
        );
        assert!(admit(&request("CREATE", rule("b", "platform"))).allowed);
        // An update of the one rule (it lists itself): allowed.
        assert!(
            admit(
                &request("UPDATE", rule("a", "platform"))
                    .related(RULES_READ, rule("a", "platform"))
            )
            .allowed
        );
        // Re-pointing a rule at a team that has one: denied.
        assert!(
            !admit(
                &request("UPDATE", rule("b", "platform"))
                    .related(RULES_READ, rule("a", "platform"))
                    .related(RULES_READ, rule("b", "other"))
            )
            .allowed
        );
        // The other being deleted, or this one being deleted: allowed.
        let mut going = rule("a", "platform");
        going["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        assert!(
            admit(&request("CREATE", rule("b", "platform")).related(RULES_READ, going.clone()))
                .allowed
        );
        let mut leaving = rule("b", "platform");
        leaving["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        assert!(
            admit(&request("UPDATE", leaving).related(RULES_READ, rule("a", "platform"))).allowed
        );
    }

    #[test]
    fn an_unknown_rule_is_denied() {
        let r = AdmissionRequest::from_review_request(
            "nope",
            json!({"operation": "CREATE", "namespace": "ns", "object": rule("a", "t")}),
        );
        assert!(!admit(&r).allowed);
    }
}
