//! Calling a plugin's optional `admit` export (world `admitting-plugin`).
//!
//! The call runs like a reconcile: a fresh store, the plugin's memory cap
//! and deadline, its clock reading the request's `now`. Whether a plugin
//! has the export is found at load ([`LoadedPlugin::admits`]).

use std::sync::Arc;

use serde_json::Value;
use wasmop_contract::AdmissionResponse;

use super::{CallError, LoadedPlugin, classify, convert, parse_now, trap_message};
use crate::contract::bindings::{admitting, types as wit};

/// What one admission call hands the plugin.
#[derive(Clone, Debug)]
pub struct AdmitInput {
    /// The admission rule that matched.
    pub rule: String,
    /// The AdmissionReview's `request`.
    pub request: Value,
    /// `(read id, object)` for every object the rule's reads selected.
    pub related: Vec<(String, Arc<Value>)>,
    /// The current time, RFC 3339 in UTC.
    pub now: String,
}

impl LoadedPlugin {
    /// True when the component exports `admit` (the `admitting-plugin` world).
    pub fn admits(&self) -> bool {
        self.admit_pre.is_some()
    }

    /// Decides one admission request.
    ///
    /// # Errors
    ///
    /// [`CallError`] for a plugin without `admit`, a trap, timeout, memory
    /// cap, malformed output, or the plugin's own error message (as
    /// [`CallError::PluginError`] of kind `Internal`). Every error means the
    /// request is denied.
    pub fn admit(&self, input: &AdmitInput) -> Result<AdmissionResponse, CallError> {
        let Some(pre) = &self.admit_pre else {
            return Err(CallError::PluginError {
                kind: super::PluginErrorKind::Internal,
                message: format!("plugin {} does not export admit", self.name),
            });
        };
        let text = |v: &Value| serde_json::to_string(v).unwrap_or_else(|_| "null".to_owned());
        let request = wit::AdmissionRequest {
            rule: input.rule.clone(),
            request: text(&input.request),
            related: input
                .related
                .iter()
                .map(|(read, object)| wit::RelatedObject {
                    read: read.clone(),
                    object: text(object),
                })
                .collect(),
            now: input.now.clone(),
            settings: text(&self.settings),
        };
        let mut store = self.sandbox.store(&self.limits, parse_now(&input.now));
        let plugin: admitting::AdmittingPlugin = match pre.instantiate(&mut store) {
            Ok(plugin) => plugin,
            Err(e) => {
                return Err(match classify(&e, store.data(), self.limits) {
                    Some(err) => err,
                    None => CallError::Instantiate(e.into()),
                });
            }
        };
        let answer = plugin.call_admit(&mut store, &request).map_err(|e| {
            classify(&e, store.data(), self.limits).unwrap_or_else(|| CallError::Trap {
                message: trap_message(&e, &store.data().stderr()),
            })
        })?;
        match answer {
            Ok(text) => {
                convert::admission_response_from_json(&text).map_err(CallError::MalformedOutput)
            }
            Err(message) => Err(CallError::PluginError {
                kind: super::PluginErrorKind::Internal,
                message,
            }),
        }
    }
}
