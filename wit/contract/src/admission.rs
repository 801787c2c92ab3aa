//! Admission (contract 0.4): what a plugin declares it admits
//! ([`AdmissionRule`]) and what its `admit` export answers
//! ([`AdmissionResponse`]).
//!
//! A plugin that exports the `admitting-plugin` world lists rules in its
//! manifest's `admission`. The host registers one validating webhook per
//! rule; for each AdmissionReview that matches, it resolves the rule's
//! reads — from its watch caches, or, for a read marked `live`, from the
//! API server at that moment — and calls `admit` in the same sandbox as a
//! reconcile (fresh store, memory cap, deadline). A trap, timeout or
//! malformed answer denies the request.
//!
//! Admission adds cross-object checks only; rules about one object's own
//! fields belong in the CRD's CEL validation.
//!
//! ```
//! use wasmop_contract::{AdmissionOperation, AdmissionRead, AdmissionResponse, AdmissionRule,
//!                       KindRef, Selector};
//!
//! let class = KindRef::namespaced("compute.firebolt.io", "v1alpha1", "FireboltEngineClass", "fireboltengineclasses");
//! let engine = KindRef::namespaced("compute.firebolt.io", "v1alpha1", "FireboltEngine", "fireboltengines");
//! let rule = AdmissionRule::new("class-in-use", class)
//!     .operation(AdmissionOperation::Delete)
//!     .reads(AdmissionRead::live("engines", engine, Selector::SameNamespace));
//! assert!(rule.reads[0].live);
//!
//! let denied = AdmissionResponse::deny("class is used by engine e1").warning("look at e1");
//! assert!(!denied.allowed);
//! ```
//!
//! # JSON shape
//!
//! A rule: `{"name":"class-in-use","kind":{…KindRef…},"operations":["DELETE"],
//! "reads":[{"id":"engines","kind":{…},"selector":"sameNamespace","live":true}]}`.
//! A response: `{"allowed":false,"message":"…","warnings":[]}`.

use serde::{Deserialize, Serialize};

use crate::manifest::{KindRef, Selector};

/// An operation an admission rule applies to, spelled as Kubernetes does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum AdmissionOperation {
    /// `CREATE`.
    Create,
    /// `UPDATE`.
    Update,
    /// `DELETE`.
    Delete,
}

impl AdmissionOperation {
    /// The Kubernetes spelling: `CREATE`, `UPDATE`, `DELETE`.
    pub fn as_str(self) -> &'static str {
        match self {
            AdmissionOperation::Create => "CREATE",
            AdmissionOperation::Update => "UPDATE",
            AdmissionOperation::Delete => "DELETE",
        }
    }

    /// Parses the Kubernetes spelling.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "CREATE" => Some(AdmissionOperation::Create),
            "UPDATE" => Some(AdmissionOperation::Update),
            "DELETE" => Some(AdmissionOperation::Delete),
            _ => None,
        }
    }
}

impl std::fmt::Display for AdmissionOperation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Objects an admission call sees besides the request. The selector is
/// evaluated against the admitted object (`oldObject` for a DELETE):
/// [`Selector::Field`] names one object through its fields,
/// [`Selector::SameNamespace`], [`Selector::Labels`] and
/// [`Selector::ClusterWide`] list. [`Selector::OwnedByPrimary`] is not
/// allowed here.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRead {
    /// Name under which the objects appear in the request's `related` list,
    /// unique within a rule.
    pub id: String,
    /// The kind read.
    pub kind: KindRef,
    /// Which objects of the kind are selected.
    pub selector: Selector,
    /// True: read from the API server at admission time (a quorum read), as
    /// checks that must not race a cache need. False: from the host's watch
    /// cache when it holds the kind (a controller reads or owns it), else
    /// from the API server too.
    #[serde(default)]
    pub live: bool,
}

impl AdmissionRead {
    /// A read served from the host's caches when it can be.
    pub fn cached(id: &str, kind: KindRef, selector: Selector) -> Self {
        AdmissionRead {
            id: id.to_owned(),
            kind,
            selector,
            live: false,
        }
    }

    /// A read served by the API server at admission time.
    pub fn live(id: &str, kind: KindRef, selector: Selector) -> Self {
        AdmissionRead {
            live: true,
            ..AdmissionRead::cached(id, kind, selector)
        }
    }
}

/// One validating webhook a plugin asks the host to serve.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRule {
    /// Name, unique within the plugin; a DNS label (it becomes part of the
    /// webhook's name `<rule>.<plugin>.admission.wasmop.dev` and of its
    /// URL path).
    pub name: String,
    /// The kind admitted (matched by group and kind; `matchPolicy:
    /// Equivalent` sends other served versions too).
    pub kind: KindRef,
    /// The operations admitted; at least one.
    pub operations: Vec<AdmissionOperation>,
    /// What the call sees besides the request.
    #[serde(default)]
    pub reads: Vec<AdmissionRead>,
}

impl AdmissionRule {
    /// A rule for `kind` with no operations or reads yet.
    pub fn new(name: &str, kind: KindRef) -> Self {
        AdmissionRule {
            name: name.to_owned(),
            kind,
            operations: Vec::new(),
            reads: Vec::new(),
        }
    }

    /// Adds an operation.
    pub fn operation(mut self, operation: AdmissionOperation) -> Self {
        if !self.operations.contains(&operation) {
            self.operations.push(operation);
        }
        self
    }

    /// Adds a read.
    pub fn reads(mut self, read: AdmissionRead) -> Self {
        self.reads.push(read);
        self
    }
}

/// What `admit` answers: JSON text of this type.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionResponse {
    /// True to admit the request.
    pub allowed: bool,
    /// Why it was denied (shown to the user by kubectl); ignored when allowed.
    #[serde(default)]
    pub message: Option<String>,
    /// Warnings shown to the user either way (at most 32 are passed on,
    /// each cut at 256 characters).
    #[serde(default)]
    pub warnings: Vec<String>,
}

impl AdmissionResponse {
    /// Admits the request.
    pub fn allow() -> Self {
        AdmissionResponse {
            allowed: true,
            message: None,
            warnings: Vec::new(),
        }
    }

    /// Denies the request with a message for the user.
    pub fn deny(message: impl Into<String>) -> Self {
        AdmissionResponse {
            allowed: false,
            message: Some(message.into()),
            warnings: Vec::new(),
        }
    }

    /// Adds a warning.
    pub fn warning(mut self, warning: impl Into<String>) -> Self {
        self.warnings.push(warning.into());
        self
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn rules_and_responses_have_the_documented_json() {
        let rule = AdmissionRule::new("r", KindRef::namespaced("g", "v1", "K", "ks"))
            .operation(AdmissionOperation::Create)
            .operation(AdmissionOperation::Create)
            .operation(AdmissionOperation::Update)
            .reads(AdmissionRead::live(
                "others",
                KindRef::namespaced("g", "v1", "O", "os"),
                Selector::SameNamespace,
            ));
        let v = serde_json::to_value(&rule).unwrap();
        assert_eq!(v["operations"], json!(["CREATE", "UPDATE"]));
        assert_eq!(v["reads"][0]["live"], json!(true));
        assert_eq!(v["reads"][0]["selector"], json!("sameNamespace"));
        let back: AdmissionRule = serde_json::from_value(v).unwrap();
        assert_eq!(back, rule);

        assert_eq!(
            serde_json::to_value(AdmissionResponse::deny("no").warning("w")).unwrap(),
            json!({"allowed": false, "message": "no", "warnings": ["w"]})
        );
        let bare: AdmissionResponse = serde_json::from_str(r#"{"allowed":true}"#).unwrap();
        assert_eq!(bare, AdmissionResponse::allow());
    }

    #[test]
    fn operations_parse_their_kubernetes_spelling() {
        for op in [
            AdmissionOperation::Create,
            AdmissionOperation::Update,
            AdmissionOperation::Delete,
        ] {
            assert_eq!(AdmissionOperation::parse(op.as_str()), Some(op));
        }
        assert_eq!(AdmissionOperation::parse("CONNECT"), None);
    }
}
