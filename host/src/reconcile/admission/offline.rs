//! Admission without a cluster: `wasmop plan -f review.yaml` and golden
//! fixtures decide an AdmissionReview with the plugin's `admit`, the other
//! objects of the file standing in for the API server (live reads) and
//! the caches alike.
//!
//! The rule is the plugin's first admission rule whose kind (group and
//! kind) and operations match the review's `request.kind` and
//! `request.operation`.

use std::sync::Arc;

use serde_json::Value;
use thiserror::Error;
use wasmop_contract::{AdmissionOperation, AdmissionRule, str_at};

use super::review::{self, Selection};
use crate::contract::selector::selector_matches;
use crate::object;
use crate::plugin::{AdmitInput, LoadedPlugin};

/// `apiVersion` of the AdmissionReview documents understood.
pub const REVIEW_API_VERSION: &str = "admission.k8s.io/v1";

/// Why a review cannot be decided offline.
#[derive(Debug, Error)]
pub enum OfflineAdmissionError {
    /// The review has no `request` with a `uid`, `kind` and `operation`.
    #[error("the AdmissionReview needs request.uid, request.kind and request.operation")]
    Incomplete,
    /// No rule of the plugin matches.
    #[error("plugin {plugin} has no admission rule for {operation} of {kind}")]
    NoRule {
        /// The plugin.
        plugin: String,
        /// `Kind.group`.
        kind: String,
        /// The operation.
        operation: String,
    },
}

/// The rule of `plugin` that admits `request`.
fn rule_for<'a>(plugin: &'a LoadedPlugin, request: &Value) -> Option<&'a AdmissionRule> {
    let group = str_at(request, "kind.group").unwrap_or_default();
    let kind = str_at(request, "kind.kind")?;
    let operation = request["operation"]
        .as_str()
        .and_then(AdmissionOperation::parse)?;
    if !plugin.admits() {
        return None;
    }
    plugin
        .manifest()
        .admission
        .iter()
        .find(|r| r.kind.group == group && r.kind.kind == kind && r.operations.contains(&operation))
}

/// The AdmissionReview answering `review`, decided by `plugin` with
/// `objects` as everything its reads can see, at `now`.
///
/// # Errors
/// [`OfflineAdmissionError`] when the review is incomplete or no rule
/// matches it. A plugin failure is not an error: it is a denial.
pub fn decide(
    plugin: &LoadedPlugin,
    review: &Value,
    objects: &[Value],
    now: &str,
) -> Result<Value, OfflineAdmissionError> {
    let request = &review["request"];
    let uid = request["uid"]
        .as_str()
        .ok_or(OfflineAdmissionError::Incomplete)?;
    let rule = rule_for(plugin, request).ok_or_else(|| {
        if request["kind"].is_object() && request["operation"].is_string() {
            OfflineAdmissionError::NoRule {
                plugin: plugin.name().to_owned(),
                kind: format!(
                    "{}.{}",
                    str_at(request, "kind.kind").unwrap_or_default(),
                    str_at(request, "kind.group").unwrap_or_default()
                ),
                operation: request["operation"].as_str().unwrap_or_default().to_owned(),
            }
        } else {
            OfflineAdmissionError::Incomplete
        }
    })?;
    let mut related = Vec::new();
    for read in &rule.reads {
        let of_kind = |o: &&Value| {
            let (group, _) = wasmop_contract::split_api_version(object::api_version(o));
            group == read.kind.group && object::kind(o) == read.kind.kind
        };
        let in_namespace = |o: &Value, ns: &Option<String>| {
            ns.as_deref()
                .is_none_or(|ns| object::namespace(o).unwrap_or("default") == ns)
        };
        let selected: Vec<&Value> =
            match review::selection(&read.selector, read.kind.namespaced, request) {
                Selection::Nothing => Vec::new(),
                Selection::Get { namespace, name } => objects
                    .iter()
                    .filter(of_kind)
                    .filter(|o| object::name(o) == name && in_namespace(o, &namespace))
                    .take(1)
                    .collect(),
                Selection::List { namespace, labels } => objects
                    .iter()
                    .filter(of_kind)
                    .filter(|o| in_namespace(o, &namespace))
                    .filter(|o| {
                        labels
                            .as_deref()
                            .is_none_or(|l| selector_matches(l, &object::labels(o)))
                    })
                    .collect(),
            };
        related.extend(
            selected
                .into_iter()
                .map(|o| (read.id.clone(), Arc::new(o.clone()))),
        );
    }
    let input = AdmitInput {
        rule: rule.name.clone(),
        request: request.clone(),
        related,
        now: now.to_owned(),
    };
    let (answer, _) = review::decide(plugin, &input);
    Ok(review::review(uid, &answer))
}
