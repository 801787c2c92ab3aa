//! Per-object checks: each target's kind is owned, its namespace allowed
//! (for the controller, and for the kind when it narrows the controller's
//! write namespaces) and suited to the kind's scope, its name DNS-1123, and it is targeted
//! once; an applied object is well formed and sets neither ownerReferences
//! nor the host's labels; `primaryPatch` touches only `primary-fields` and
//! none of the host's labels; HTTP requests name declared targets and ports
//! with unique ids.

use std::collections::BTreeSet;

use serde_json::Value;

use super::{
    GeneratedKey, HttpRequest, MANAGED_BY_LABEL, OWNER_UID_LABEL, PLUGIN_LABEL, PROTECTED_LABEL,
    RequestTarget, Rule, Validator,
};
use crate::contract::manifest::{Controller, OwnedKind, Ownership, split_api_version};
use crate::names;
use crate::object;

/// The prefix of the labels sharding puts on primaries and owned objects
/// (`shard.wasmop.dev/shard`, `shard.wasmop.dev/drain`): the host owns
/// every label under it.
pub const SHARD_LABEL_PREFIX: &str = "shard.wasmop.dev/";

/// Whether the host owns label `key` on every object, the primary included:
/// the shard labels ([`SHARD_LABEL_PREFIX`]), `app.kubernetes.io/managed-by`,
/// `wasmop.dev/plugin` and `wasmop.dev/owner-uid`. No plan sets, changes or
/// removes one ([`super::Rule::HostLabelForged`]); `wasmop.dev/protected`
/// ([`PROTECTED_LABEL`]) is people's, and no plan touches it either.
pub fn is_host_label(key: &str) -> bool {
    key.starts_with(SHARD_LABEL_PREFIX)
        || [MANAGED_BY_LABEL, PLUGIN_LABEL, OWNER_UID_LABEL].contains(&key)
}

/// How many random bytes a generated Secret key may ask for.
pub const GENERATED_BYTES: std::ops::RangeInclusive<u16> = 16..=1024;

/// True for a valid Secret data key: 1 to 253 of `[-._a-zA-Z0-9]`.
fn secret_key_valid(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 253
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
}

impl<'a> Validator<'a> {
    /// Checks an apply's `generate` list (see [`GeneratedKey`]): a `v1`
    /// Secret, valid keys, each once, none set by the plugin, a bounded
    /// number of bytes.
    pub(super) fn generated(&mut self, obj: &Value, keys: &[GeneratedKey]) {
        let desc = object::describe(obj);
        if object::api_version(obj) != "v1" || object::kind(obj) != "Secret" {
            self.push(
                Rule::GeneratedKeyInvalid,
                desc,
                "only the keys of a v1 Secret can be generated".to_owned(),
            );
            return;
        }
        let mut seen = BTreeSet::new();
        for g in keys {
            let problem = if !secret_key_valid(&g.key) {
                Some(format!(
                    "generated key {:?} is not a valid Secret key (1 to 253 of a-z, A-Z, 0-9, '-', '.', '_')",
                    g.key
                ))
            } else if !seen.insert(g.key.as_str()) {
                Some(format!("generated key {:?} is listed twice", g.key))
            } else if ["data", "stringData"]
                .iter()
                .any(|field| obj.get(field).and_then(|m| m.get(&g.key)).is_some())
            {
                Some(format!(
                    "generated key {:?} is also set by the plugin; the host makes its value",
                    g.key
                ))
            } else if !GENERATED_BYTES.contains(&g.bytes) {
                Some(format!(
                    "generated key {:?} asks for {} bytes; between {} and {} are allowed",
                    g.key,
                    g.bytes,
                    GENERATED_BYTES.start(),
                    GENERATED_BYTES.end()
                ))
            } else {
                None
            };
            if let Some(message) = problem {
                self.push(Rule::GeneratedKeyInvalid, desc.clone(), message);
            }
        }
    }

    /// Checks kind, namespace, name and uniqueness shared by applies and
    /// deletes; returns the owned kind when the target is acceptable so far.
    pub(super) fn target(
        &mut self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
        what: &str,
    ) -> Option<&'a OwnedKind> {
        let desc = object::describe_parts(kind, namespace, name);
        let controller: &'a Controller = self.controller;
        let Some(owned) = controller.owned_kind(api_version, kind) else {
            self.push(
                Rule::KindNotOwned,
                desc,
                format!(
                    "kind {kind} ({api_version}) is not owned by controller {}",
                    controller.name
                ),
            );
            return None;
        };
        let mut ok = true;
        if let Err(why) = names::dns1123_subdomain(name) {
            self.push(
                Rule::InvalidName,
                desc.clone(),
                format!("name {name:?} {why}"),
            );
            ok = false;
        }
        match (owned.kind.namespaced, namespace) {
            (true, None) => {
                self.push(
                    Rule::NamespaceNotAllowed,
                    desc.clone(),
                    format!("{kind} is namespaced but the {what} names no namespace"),
                );
                ok = false;
            }
            (true, Some(ns)) => {
                if let Err(why) = names::dns1123_label(ns) {
                    self.push(
                        Rule::InvalidName,
                        desc.clone(),
                        format!("namespace {ns:?} {why}"),
                    );
                    ok = false;
                } else if !controller.may_write_namespace(self.primary_namespace, ns) {
                    let message = match self.primary_namespace {
                        Some(own) => format!(
                            "namespace {ns} is not the primary's ({own}) nor in write-namespaces of controller {}",
                            controller.name
                        ),
                        None => format!(
                            "the primary is cluster-scoped and namespace {ns} is not in write-namespaces of controller {}",
                            controller.name
                        ),
                    };
                    self.push(Rule::NamespaceNotAllowed, desc.clone(), message);
                    ok = false;
                } else if owned.ownership == Ownership::OwnerReference
                    && self.primary_namespace.is_some_and(|own| own != ns)
                {
                    self.push(
                        Rule::NamespaceNotAllowed,
                        desc.clone(),
                        format!(
                            "an ownerReference cannot cross from namespace {} to {ns}; \
                             controller {} must own {kind} by label (owner-label) to write it there",
                            self.primary_namespace.unwrap_or_default(),
                            controller.name
                        ),
                    );
                    ok = false;
                } else if !controller.may_write_kind(owned, self.primary_namespace, ns) {
                    let scope = controller.kind_write_namespaces(owned).join(", ");
                    let c = &controller.name;
                    let message = match (self.primary_namespace, scope.is_empty()) {
                        (Some(own), true) => format!(
                            "controller {c} may write {kind} only in the primary's namespace ({own}), not in namespace {ns}"
                        ),
                        (Some(own), false) => format!(
                            "controller {c} may write {kind} only in the primary's namespace ({own}) and in {scope}, not in namespace {ns}"
                        ),
                        (None, true) => format!(
                            "the primary is cluster-scoped and controller {c} may write {kind} in no namespace, not in namespace {ns}"
                        ),
                        (None, false) => format!(
                            "the primary is cluster-scoped and controller {c} may write {kind} only in {scope}, not in namespace {ns}"
                        ),
                    };
                    self.push(Rule::NamespaceNotAllowed, desc.clone(), message);
                    ok = false;
                }
            }
            (false, Some(ns)) => {
                self.push(
                    Rule::NamespaceNotAllowed,
                    desc.clone(),
                    format!("{kind} is cluster-scoped but the {what} names namespace {ns}"),
                );
                ok = false;
            }
            (false, None) => {}
        }
        let (group, _) = split_api_version(api_version);
        let key = (
            group.to_owned(),
            kind.to_owned(),
            namespace.unwrap_or_default().to_owned(),
            name.to_owned(),
        );
        if !self.seen.insert(key) {
            self.push(
                Rule::DuplicateTarget,
                desc,
                "the plan targets this object more than once".to_owned(),
            );
            ok = false;
        }
        ok.then_some(owned)
    }

    /// Checks what an applied object carries on its own: apiVersion, kind
    /// and name, no ownerReferences, none of the host's labels. False when it
    /// is malformed, and nothing more can be judged about it.
    pub(super) fn apply_fields(&mut self, obj: &Value) -> bool {
        let desc = object::describe(obj);
        if !obj.is_object()
            || object::api_version(obj).is_empty()
            || object::kind(obj).is_empty()
            || object::name(obj).is_empty()
        {
            self.push(
                Rule::Malformed,
                desc,
                "an applied object needs apiVersion, kind and metadata.name".to_owned(),
            );
            return false;
        }
        if object::value_at(obj, "metadata.ownerReferences").is_some_and(|v| !v.is_null()) {
            self.push(
                Rule::OwnerReferencesForged,
                desc.clone(),
                "the plugin may not set metadata.ownerReferences; the host sets them".to_owned(),
            );
        }
        let (api_version, kind) = (object::api_version(obj), object::kind(obj));
        let labels = object::labels(obj);
        let extra = self
            .controller
            .owned_kind(api_version, kind)
            .and_then(OwnedKind::extra_label_key);
        for label in [MANAGED_BY_LABEL, PLUGIN_LABEL, OWNER_UID_LABEL]
            .into_iter()
            .chain(extra)
        {
            if labels.contains_key(label) {
                self.push(
                    Rule::HostLabelForged,
                    desc.clone(),
                    format!("the plugin may not set label {label}; the host sets it"),
                );
            }
        }
        for key in labels.keys().filter(|k| k.starts_with(SHARD_LABEL_PREFIX)) {
            self.push(
                Rule::HostLabelForged,
                desc.clone(),
                format!("the plugin may not set label {key}; the host's sharding sets it"),
            );
        }
        if labels.contains_key(PROTECTED_LABEL) {
            // A forced apply could otherwise take the label off a
            // protected object and delete it on the next reconcile.
            self.push(
                Rule::HostLabelForged,
                desc.clone(),
                format!("the plugin may not set label {PROTECTED_LABEL}; people set it"),
            );
        }
        true
    }

    pub(super) fn primary_patch(&mut self, patch: &Value) {
        if !patch.is_object() {
            self.push(
                Rule::PrimaryFieldNotAllowed,
                "primary".to_owned(),
                "primaryPatch must be a JSON object".to_owned(),
            );
            return;
        }
        self.primary_patch_labels(patch);
        let mut leaves = Vec::new();
        leaf_paths(patch, Vec::new(), &mut leaves);
        let declared: Vec<Vec<String>> = self
            .controller
            .primary_fields
            .iter()
            .map(|f| field_segments(f))
            .collect();
        for path in leaves {
            // Whole segments only: `metadata.labels.app` does not allow the
            // label `app.kubernetes.io/name`.
            if !declared.iter().any(|d| path.starts_with(d)) {
                self.push(
                    Rule::PrimaryFieldNotAllowed,
                    "primary".to_owned(),
                    format!(
                        "primaryPatch sets {}, which is not in primary-fields of controller {}",
                        path.join("."),
                        self.controller.name
                    ),
                );
            }
        }
    }

    /// The labels a `primaryPatch` (a JSON merge patch) would set, change
    /// or remove: none of the host's ([`is_host_label`]) nor
    /// [`PROTECTED_LABEL`], whatever `primary-fields` declares, and never
    /// `metadata` or `metadata.labels` replaced whole (null or not an
    /// object), which would remove them all. Otherwise a plugin could take
    /// the protection off its own primary and delete it on the next
    /// reconcile, or move its primary to another shard mid-plan.
    fn primary_patch_labels(&mut self, patch: &Value) {
        let whole = |what: &str| {
            format!(
                "primaryPatch replaces {what} whole, which would remove the host's labels \
                 and {PROTECTED_LABEL}; patch single labels instead"
            )
        };
        let labels = match patch.get("metadata") {
            None => return,
            Some(Value::Object(m)) => match m.get("labels") {
                None => return,
                Some(Value::Object(l)) => l,
                Some(_) => {
                    let message = whole("metadata.labels");
                    self.push(Rule::HostLabelForged, "primary".to_owned(), message);
                    return;
                }
            },
            Some(_) => {
                let message = whole("metadata");
                self.push(Rule::HostLabelForged, "primary".to_owned(), message);
                return;
            }
        };
        for key in labels.keys() {
            let message = if key == PROTECTED_LABEL {
                format!(
                    "primaryPatch may not set, change or remove label {key}: people set it, \
                     and no plan takes it off"
                )
            } else if is_host_label(key) {
                format!("primaryPatch may not set, change or remove label {key}: the host owns it")
            } else {
                continue;
            };
            self.push(Rule::HostLabelForged, "primary".to_owned(), message);
        }
    }

    pub(super) fn http_requests(&mut self, requests: &[HttpRequest]) {
        let mut ids = BTreeSet::new();
        for (i, req) in requests.iter().enumerate() {
            let desc = format!("httpRequests[{i}] ({})", req.id);
            if req.id.is_empty() || !ids.insert(req.id.as_str()) {
                self.push(
                    Rule::HttpTargetNotAllowed,
                    desc.clone(),
                    "request ids must be non-empty and unique".to_owned(),
                );
            }
            if !req.path.starts_with('/') {
                self.push(
                    Rule::HttpTargetNotAllowed,
                    desc.clone(),
                    format!("path {:?} must start with /", req.path),
                );
            }
            // Allow-listed base URLs are checked against the operator's
            // allow-list when requests are performed.
            let (target_id, target_object) = match &req.target {
                RequestTarget::AllowList { .. } => continue,
                RequestTarget::Declared { id, object } => (id, object),
            };
            match self
                .controller
                .http_targets
                .iter()
                .find(|t| t.id == *target_id)
            {
                None => self.push(
                    Rule::HttpTargetNotAllowed,
                    desc,
                    format!(
                        "target {target_id:?} is not an http-target of controller {}",
                        self.controller.name
                    ),
                ),
                Some(target) if !target.ports.contains(&req.port) => self.push(
                    Rule::HttpTargetNotAllowed,
                    desc,
                    format!("port {} is not a port of target {:?}", req.port, target.id),
                ),
                Some(_) => {
                    if let Err(why) = names::dns1123_subdomain(target_object) {
                        self.push(
                            Rule::InvalidName,
                            desc,
                            format!("object name {target_object:?} {why}"),
                        );
                    }
                }
            }
        }
    }
}

/// The paths (as key segments) of the leaves of a JSON object. Anything
/// that is not a non-empty object is a leaf — an empty object too, since a
/// merge patch writes it.
fn leaf_paths(value: &Value, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (k, v) in map {
                let mut path = prefix.clone();
                path.push(k.clone());
                leaf_paths(v, path, out);
            }
        }
        _ => out.push(prefix),
    }
}

/// The key segments of a declared primary field: a label or annotation key
/// is one segment whatever dots it holds (`metadata.labels.app.kubernetes.io/name`
/// is `metadata`, `labels`, `app.kubernetes.io/name`); anything else splits
/// at dots.
fn field_segments(field: &str) -> Vec<String> {
    for map in ["metadata.labels.", "metadata.annotations."] {
        if let Some(key) = field.strip_prefix(map) {
            let mut out: Vec<String> = map
                .trim_end_matches('.')
                .split('.')
                .map(str::to_owned)
                .collect();
            out.push(key.to_owned());
            return out;
        }
    }
    field.split('.').map(str::to_owned).collect()
}
