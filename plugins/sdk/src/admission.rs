//! Admission (contract 0.4): a plugin that implements [`Admit`] and is
//! exported with `wasmop_sdk_admitting::export_admitting_plugin!` (its own
//! crate, so plugins without admission never link that world) decides the
//! validating webhooks its manifest declares ([`AdmissionRule`]).
//!
//! ```
//! use wasmop_sdk::admission::{AdmissionRequest, AdmissionResponse};
//! use serde_json::json;
//!
//! let request = AdmissionRequest::from_review_request(
//!     "class-in-use",
//!     json!({"operation": "DELETE", "namespace": "ns", "name": "c",
//!            "oldObject": {"metadata": {"name": "c", "namespace": "ns"}}}),
//! )
//! .related("engines", json!({"metadata": {"name": "e1"}, "spec": {"engineClassRef": "c"}}));
//! assert_eq!(request.subject()["metadata"]["name"], "c");
//! let users: Vec<_> = request.related_of("engines").collect();
//! let answer = if users.is_empty() {
//!     AdmissionResponse::allow()
//! } else {
//!     AdmissionResponse::deny(format!("class c is used by {} engine(s)", users.len()))
//! };
//! assert!(!answer.allowed);
//! ```

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use wasmop_contract::admission::{
    AdmissionOperation, AdmissionRead, AdmissionResponse, AdmissionRule,
};

use crate::{Plugin, RelatedObject};

/// A plugin that also decides admission. Export it with
/// `wasmop_sdk_admitting::export_admitting_plugin!` instead of
/// [`crate::export_plugin!`].
pub trait Admit: Plugin {
    /// Decides one request of one of the manifest's admission rules.
    /// Deny with [`AdmissionResponse::deny`]; the message reaches the user.
    /// A panic (or running past the deadline) denies the request too, with
    /// a message naming the plugin's failure.
    fn admit(request: &AdmissionRequest) -> AdmissionResponse;
}

/// What one admission call sees (WIT `admission-request`).
///
/// JSON: `{"rule","request":{…},"related":[{"read","object"}],"now","settings":{…}}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest {
    /// The admission rule (from the manifest) that matched.
    pub rule: String,
    /// The AdmissionReview's `request`, exactly as the API server sent it.
    pub request: Value,
    /// Objects the rule's reads selected.
    #[serde(default)]
    pub related: Vec<RelatedObject>,
    /// The current time, RFC 3339 in UTC.
    #[serde(default)]
    pub now: String,
    /// The plugin's settings (`{}` when none were given).
    #[serde(default = "empty_object")]
    pub settings: Value,
}

fn empty_object() -> Value {
    Value::Object(serde_json::Map::new())
}

static NULL: Value = Value::Null;

impl AdmissionRequest {
    /// A request for `rule` built from an AdmissionReview's `request`, with
    /// nothing related (for tests and fixtures).
    pub fn from_review_request(rule: &str, request: Value) -> Self {
        AdmissionRequest {
            rule: rule.to_owned(),
            request,
            related: Vec::new(),
            now: String::new(),
            settings: empty_object(),
        }
    }

    /// Adds a related object under `read` (for tests and fixtures).
    pub fn related(mut self, read: &str, object: Value) -> Self {
        self.related.push(RelatedObject {
            read: read.to_owned(),
            object,
        });
        self
    }

    /// The operation, when it is one a rule can name.
    pub fn operation(&self) -> Option<AdmissionOperation> {
        self.request["operation"]
            .as_str()
            .and_then(AdmissionOperation::parse)
    }

    /// The object being created or updated (`null` for a DELETE).
    pub fn object(&self) -> &Value {
        self.request.get("object").unwrap_or(&NULL)
    }

    /// The object before the request (`null` for a CREATE).
    pub fn old_object(&self) -> &Value {
        self.request.get("oldObject").unwrap_or(&NULL)
    }

    /// The object the request is about: `oldObject` for a DELETE, `object`
    /// otherwise.
    pub fn subject(&self) -> &Value {
        if self.operation() == Some(AdmissionOperation::Delete) {
            self.old_object()
        } else {
            self.object()
        }
    }

    /// The request's namespace (empty for cluster-scoped objects).
    pub fn namespace(&self) -> &str {
        self.request["namespace"].as_str().unwrap_or_default()
    }

    /// The object's name.
    pub fn name(&self) -> &str {
        self.request["name"]
            .as_str()
            .filter(|n| !n.is_empty())
            .or_else(|| self.subject()["metadata"]["name"].as_str())
            .unwrap_or_default()
    }

    /// True for a dry-run request (nothing will be persisted).
    pub fn dry_run(&self) -> bool {
        self.request["dryRun"].as_bool().unwrap_or(false)
    }

    /// The objects the read `id` selected.
    pub fn related_of<'a>(&'a self, id: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
        self.related
            .iter()
            .filter(move |r| r.read == id)
            .map(|r| &r.object)
    }
}

/// The WIT-level `admit`: parses the request, asks `P`, answers the
/// response's JSON text (the `wasmop-sdk-admitting` export calls this).
///
/// # Errors
/// A message when the request's JSON texts do not parse (the host then
/// denies the request).
pub fn admit_json<P: Admit>(request: crate::raw::AdmissionRequest) -> Result<String, String> {
    crate::glue::report_panics();
    let request = AdmissionRequest::try_from(request)?;
    Ok(crate::glue::json_text(&P::admit(&request)))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_subject_of_a_delete_is_the_old_object() {
        let create = AdmissionRequest::from_review_request(
            "r",
            json!({"operation": "CREATE", "object": {"metadata": {"name": "new"}}, "oldObject": null}),
        );
        assert_eq!(create.operation(), Some(AdmissionOperation::Create));
        assert_eq!(create.name(), "new");
        assert!(create.old_object().is_null());
        let delete = AdmissionRequest::from_review_request(
            "r",
            json!({"operation": "DELETE", "namespace": "ns", "oldObject": {"metadata": {"name": "old"}}}),
        );
        assert_eq!(delete.subject()["metadata"]["name"], "old");
        assert_eq!((delete.name(), delete.namespace()), ("old", "ns"));
        assert!(!delete.dry_run());
    }
}
