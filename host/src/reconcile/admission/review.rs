//! One AdmissionReview, from request to response: which objects the rule's
//! reads select, the plugin's decision, and the response the API server
//! gets. Used live by the HTTPS server and offline by `wasmop plan`.
//!
//! # Guarantees
//! - Anything short of a well-formed `allowed: true` from the plugin
//!   denies: a trap, a timeout, the memory cap, malformed output, the
//!   plugin's own error, or a rule no loaded plugin serves. This matches
//!   the webhook's `failurePolicy: Fail`.
//! - The response always carries the request's `uid`.

use serde_json::{Value, json};
use wasmop_contract::{AdmissionResponse, AdmissionRule, Selector, str_at};

use crate::plugin::{AdmitInput, CallError, LoadedPlugin};

/// Most warnings passed on, and the longest one.
const MAX_WARNINGS: usize = 32;
const MAX_WARNING_CHARS: usize = 256;
/// Longest denial message passed on.
const MAX_MESSAGE_CHARS: usize = 2048;

/// What a read asks for, given the admitted object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Selection {
    /// One object by name (`namespace` is `None` for cluster-scoped kinds).
    Get {
        /// Namespace.
        namespace: Option<String>,
        /// Name.
        name: String,
    },
    /// Every object in a namespace (or everywhere), optionally by labels.
    List {
        /// Namespace, or `None` for all / cluster-scoped.
        namespace: Option<String>,
        /// A label selector in kubectl syntax.
        labels: Option<String>,
    },
    /// Nothing (a field reference that is empty).
    Nothing,
}

/// The object an admission request is about: `oldObject` for a DELETE,
/// `object` otherwise.
pub fn subject(request: &Value) -> &Value {
    if request["operation"].as_str() == Some("DELETE") {
        &request["oldObject"]
    } else {
        &request["object"]
    }
}

/// What `selector` of a read of a kind (`namespaced`) selects for `request`.
pub fn selection(selector: &Selector, namespaced: bool, request: &Value) -> Selection {
    let object = subject(request);
    let own_namespace = request["namespace"]
        .as_str()
        .filter(|n| !n.is_empty())
        .or_else(|| str_at(object, "metadata.namespace"))
        .map(str::to_owned);
    let scope = |ns: Option<String>| if namespaced { ns } else { None };
    match selector {
        Selector::Field(field) => {
            let Some(name) = str_at(object, &field.name_path).filter(|n| !n.is_empty()) else {
                return Selection::Nothing;
            };
            let namespace = field
                .namespace_path
                .as_deref()
                .filter(|p| !p.is_empty())
                .and_then(|p| str_at(object, p))
                .filter(|n| !n.is_empty())
                .map(str::to_owned)
                .or(own_namespace);
            Selection::Get {
                namespace: scope(namespace),
                name: name.to_owned(),
            }
        }
        Selector::SameNamespace => Selection::List {
            namespace: scope(own_namespace),
            labels: None,
        },
        Selector::Labels(labels) => Selection::List {
            namespace: scope(own_namespace),
            labels: Some(labels.clone()),
        },
        Selector::ClusterWide => Selection::List {
            namespace: None,
            labels: None,
        },
        Selector::OwnedByPrimary => Selection::Nothing,
    }
}

/// The rule of `plugin` called `rule`, if the plugin is loaded, exports
/// `admit` and declares it.
pub fn find_rule<'a>(plugin: &'a LoadedPlugin, rule: &str) -> Option<&'a AdmissionRule> {
    if !plugin.admits() {
        return None;
    }
    plugin.manifest().admission.iter().find(|r| r.name == rule)
}

/// The plugin's answer to `input`, with any failure turned into a denial
/// that names it.
pub fn decide(plugin: &LoadedPlugin, input: &AdmitInput) -> (AdmissionResponse, Option<String>) {
    match plugin.admit(input) {
        Ok(answer) => (answer, None),
        Err(e) => (
            failure_denial(plugin.name(), &e),
            Some(e.reason().to_owned()),
        ),
    }
}

/// The denial answered when a plugin cannot decide.
pub fn failure_denial(plugin: &str, error: &CallError) -> AdmissionResponse {
    AdmissionResponse::deny(format!(
        "plugin {plugin} could not decide ({}: {error}); wasmop denies what a plugin cannot \
         decide",
        error.reason()
    ))
}

fn cut(text: &str, chars: usize) -> String {
    if text.chars().count() <= chars {
        text.to_owned()
    } else {
        let mut out: String = text.chars().take(chars).collect();
        out.push('…');
        out
    }
}

/// The `response` of an AdmissionReview for request `uid`.
pub fn response(uid: &str, answer: &AdmissionResponse) -> Value {
    let mut response = json!({"uid": uid, "allowed": answer.allowed});
    if !answer.allowed {
        let message = answer
            .message
            .as_deref()
            .filter(|m| !m.trim().is_empty())
            .unwrap_or("denied by the plugin without a message");
        response["status"] = json!({
            "code": 403,
            "reason": "Forbidden",
            "message": cut(message, MAX_MESSAGE_CHARS),
        });
    }
    let warnings: Vec<String> = answer
        .warnings
        .iter()
        .take(MAX_WARNINGS)
        .map(|w| cut(w, MAX_WARNING_CHARS))
        .collect();
    if !warnings.is_empty() {
        response["warnings"] = json!(warnings);
    }
    response
}

/// A whole AdmissionReview answering request `uid`.
pub fn review(uid: &str, answer: &AdmissionResponse) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": response(uid, answer),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmop_contract::FieldRef;

    #[test]
    fn field_reads_name_one_object_in_the_subjects_namespace() {
        let create = json!({"operation": "CREATE", "namespace": "ns",
            "object": {"metadata": {"name": "e"}, "spec": {"classRef": "c"}}});
        assert_eq!(
            selection(&Selector::field("spec.classRef"), true, &create),
            Selection::Get {
                namespace: Some("ns".into()),
                name: "c".into()
            }
        );
        let elsewhere = Selector::Field(FieldRef {
            name_path: "spec.classRef".into(),
            namespace_path: Some("spec.ns".into()),
        });
        assert_eq!(
            selection(&elsewhere, true, &create),
            Selection::Get {
                namespace: Some("ns".into()),
                name: "c".into()
            }
        );
        assert_eq!(
            selection(&Selector::field("spec.none"), true, &create),
            Selection::Nothing
        );
        let delete = json!({"operation": "DELETE", "namespace": "ns", "object": null,
            "oldObject": {"metadata": {"name": "c"}}});
        assert_eq!(
            selection(&Selector::SameNamespace, true, &delete),
            Selection::List {
                namespace: Some("ns".into()),
                labels: None
            }
        );
        assert_eq!(
            selection(&Selector::SameNamespace, false, &delete),
            Selection::List {
                namespace: None,
                labels: None
            }
        );
    }

    #[test]
    fn denials_carry_a_message_and_warnings_are_bounded() {
        let mut answer = AdmissionResponse::deny("");
        for i in 0..40 {
            answer = answer.warning(format!("w{i}{}", "x".repeat(300)));
        }
        let r = response("u1", &answer);
        assert_eq!(r["uid"], "u1");
        assert_eq!(r["allowed"], false);
        assert_eq!(r["status"]["code"], 403);
        assert_eq!(
            r["status"]["message"],
            "denied by the plugin without a message"
        );
        assert_eq!(r["warnings"].as_array().unwrap().len(), MAX_WARNINGS);
        assert_eq!(
            r["warnings"][0].as_str().unwrap().chars().count(),
            MAX_WARNING_CHARS + 1
        );
        let ok = response("u2", &AdmissionResponse::allow());
        assert!(ok.get("status").is_none());
        assert!(ok.get("warnings").is_none());
    }

    #[test]
    fn a_plugin_failure_is_a_denial_naming_it() {
        let denial = failure_denial(
            "engine",
            &CallError::Timeout {
                deadline: std::time::Duration::from_secs(2),
            },
        );
        assert!(!denial.allowed);
        let message = denial.message.unwrap();
        assert!(message.contains("plugin engine could not decide (PluginTimedOut"));
    }
}
