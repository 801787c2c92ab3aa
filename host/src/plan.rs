//! The plan a plugin answers with, its JSON shape, and the validation that
//! decides — before anything is written — whether it may be executed.
//!
//! # JSON shape
//!
//! ```json
//! {"apply":[{"object":{…},"precondition":null,"force":false}],
//!  "delete":[{"target":{"apiVersion":"v1","kind":"ConfigMap","namespace":"ns","name":"n"},
//!             "uid":"…","resourceVersion":"…"}],
//!  "status":{…}, "primaryPatch":null,
//!  "events":[{"type":"Normal","reason":"…","message":"…"}],
//!  "requeueAfterMs":1000, "cleanupComplete":false, "httpRequests":[]}
//! ```
//!
//! A precondition is `null`, `{"absent":true}` or `{"resourceVersion":"123"}`.
//! `force` is always printed; when read, a missing `force` is `false` (plans
//! written before it existed still parse).
//! `wasmop plan` prints this shape and the live operator logs it.
//!
//! # Validation
//!
//! [`validate`] enforces DESIGN.md invariants 1–3 on a whole plan. It is a
//! pure function: the caller answers "what exists" through
//! [`ExistingLookup`], which every [`crate::ObjectSource`] provides. A plan
//! with any [`Violation`] must write nothing.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::manifest::{Controller, KindRef, split_api_version};
use crate::names;
use crate::object;

/// The label the host sets on every object it writes: `wasmop`.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// The value of [`MANAGED_BY_LABEL`].
pub const MANAGED_BY_VALUE: &str = "wasmop";
/// The label naming the plugin that wrote an object.
pub const PLUGIN_LABEL: &str = "wasmop.dev/plugin";

/// What the plugin wants done for one primary (WIT `plan`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Plan {
    /// Objects to create or update by server-side apply.
    pub apply: Vec<ApplyOp>,
    /// Owned objects to delete.
    pub delete: Vec<DeleteOp>,
    /// The primary's new `.status`; `None` leaves it as is.
    pub status: Option<Value>,
    /// Fields of the primary to set (only the manifest's `primary-fields`).
    pub primary_patch: Option<Value>,
    /// Events to record on the primary.
    pub events: Vec<Event>,
    /// Reconcile again after this many milliseconds.
    pub requeue_after_ms: Option<u64>,
    /// While deleting: cleanup is done and the finalizer may go.
    pub cleanup_complete: bool,
    /// HTTP requests for the host to perform after the writes.
    pub http_requests: Vec<HttpRequest>,
}

/// Create or update one object (WIT `apply-op`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApplyOp {
    /// The desired object.
    pub object: Value,
    /// What must hold of the current object for the plan to be written.
    #[serde(default)]
    pub precondition: Option<Precondition>,
    /// Take ownership of fields another field manager set (server-side
    /// apply with `force`); ignored by an [`Precondition::Absent`] create.
    #[serde(default)]
    pub force: bool,
}

/// A condition an apply requires of the current object (WIT `precondition`).
///
/// JSON: `{"absent":true}` or `{"resourceVersion":"…"}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "PreconditionJson", into = "PreconditionJson")]
pub enum Precondition {
    /// The object must not exist yet.
    Absent,
    /// The object must exist at exactly this resourceVersion.
    ResourceVersion(String),
}

#[derive(Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PreconditionJson {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    absent: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    resource_version: Option<String>,
}

impl From<Precondition> for PreconditionJson {
    fn from(p: Precondition) -> Self {
        match p {
            Precondition::Absent => PreconditionJson {
                absent: Some(true),
                resource_version: None,
            },
            Precondition::ResourceVersion(rv) => PreconditionJson {
                absent: None,
                resource_version: Some(rv),
            },
        }
    }
}

impl TryFrom<PreconditionJson> for Precondition {
    type Error = &'static str;

    fn try_from(p: PreconditionJson) -> Result<Self, Self::Error> {
        match (p.absent, p.resource_version) {
            (Some(true), None) => Ok(Precondition::Absent),
            (None, Some(rv)) => Ok(Precondition::ResourceVersion(rv)),
            _ => Err(r#"a precondition is {"absent":true} or {"resourceVersion":"…"}"#),
        }
    }
}

/// The identity of one existing object (WIT `object-ref`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    /// `apiVersion`, e.g. `apps/v1`.
    pub api_version: String,
    /// Kind.
    pub kind: String,
    /// Namespace, empty for cluster-scoped objects.
    #[serde(default)]
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl std::fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ns = Some(self.namespace.as_str()).filter(|ns| !ns.is_empty());
        f.write_str(&object::describe_parts(&self.kind, ns, &self.name))
    }
}

/// Delete one owned object if it is still the one the plugin saw (WIT `delete-op`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeleteOp {
    /// Which object.
    pub target: ObjectRef,
    /// `metadata.uid` the plugin saw.
    pub uid: String,
    /// `metadata.resourceVersion` the plugin saw.
    pub resource_version: String,
}

/// Kind of an Event. JSON: `"Normal"` or `"Warning"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventType {
    /// Something worth knowing happened.
    Normal,
    /// Something went wrong or needs attention.
    Warning,
}

/// An Event to record on the primary (WIT `event`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    /// Normal or Warning.
    #[serde(rename = "type")]
    pub event_type: EventType,
    /// Short CamelCase reason.
    pub reason: String,
    /// Message for a person.
    pub message: String,
}

/// HTTP method. JSON: `"GET"`, `"POST"`, `"PUT"`, `"DELETE"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum HttpMethod {
    /// Read-only.
    Get,
    /// Mutating.
    Post,
    /// Mutating.
    Put,
    /// Mutating.
    Delete,
}

/// A header whose value the host reads from a Secret (WIT `secret-header`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SecretHeader {
    /// Header name.
    pub name: String,
    /// Secret name in the primary's namespace.
    pub secret: String,
    /// Key in the Secret's data.
    pub key: String,
    /// Text put before the value.
    pub prefix: String,
}

/// An HTTP request for the host to perform (WIT `http-request`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpRequest {
    /// Id of the result.
    pub id: String,
    /// `http-target` id from the manifest, or `allow-list`.
    pub target: String,
    /// Name of the Pod or Service, or the base URL for `allow-list`.
    pub object: String,
    /// Port.
    pub port: u16,
    /// Method.
    pub method: HttpMethod,
    /// Path and query, starting with `/`.
    pub path: String,
    /// Request body (UTF-8 text).
    #[serde(default)]
    pub body: String,
    /// Plain headers.
    #[serde(default)]
    pub headers: Vec<(String, String)>,
    /// Headers whose values come from Secrets.
    #[serde(default)]
    pub secret_headers: Vec<SecretHeader>,
    /// Deadline in ms (0: host default).
    #[serde(default)]
    pub timeout_ms: u32,
    /// Largest response body kept (0: host default).
    #[serde(default)]
    pub max_response_bytes: u32,
    /// Results older than this are dropped (0: keep).
    #[serde(default)]
    pub max_age_ms: u64,
}

/// What the validator needs to know about an object that already exists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExistingObject {
    /// Its `metadata.uid`.
    pub uid: String,
    /// The UID of its controller ownerReference, if it has one.
    pub controller_uid: Option<String>,
}

/// Answers "does this object exist, and who controls it" for [`validate`].
///
/// Implemented for every [`crate::ObjectSource`], so the offline CLI's
/// `MemorySource` and the live watch cache both answer it.
pub trait ExistingLookup {
    /// The object of `kind` at `namespace`/`name`, if it exists.
    fn existing(
        &self,
        kind: &KindRef,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<ExistingObject>;
}

impl<S: crate::snapshot::ObjectSource + ?Sized> ExistingLookup for S {
    fn existing(
        &self,
        kind: &KindRef,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<ExistingObject> {
        let found = self.get(kind, namespace, name)?;
        Some(ExistingObject {
            uid: object::uid(&found).to_owned(),
            controller_uid: object::controller_uid(&found).map(str::to_owned),
        })
    }
}

/// The rule a [`Violation`] breaks.
///
/// Serialized as its [`Rule::as_str`] name (`"KindNotOwned"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Rule {
    /// An object lacks apiVersion, kind or metadata.name, or is not an object.
    Malformed,
    /// The kind is not in the controller's `owns`.
    KindNotOwned,
    /// The namespace is neither the primary's nor in `write-namespaces`,
    /// or the namespace does not suit the kind's scope.
    NamespaceNotAllowed,
    /// The name (or namespace) is not a valid DNS-1123 name.
    InvalidName,
    /// The object exists and its controller is not this primary.
    NotControlledByPrimary,
    /// The delete's uid is not the uid of the object that exists.
    UidMismatch,
    /// The object to delete does not exist.
    DeleteTargetMissing,
    /// The plugin set `metadata.ownerReferences` (the host sets them).
    OwnerReferencesForged,
    /// The plugin set a label the host owns.
    HostLabelForged,
    /// `primaryPatch` touches a field outside `primary-fields`.
    PrimaryFieldNotAllowed,
    /// One object is the target of two operations.
    DuplicateTarget,
    /// An HTTP request names an undeclared target or port, or repeats an id.
    HttpTargetNotAllowed,
}

impl Rule {
    /// A CamelCase name for the rule, for Conditions and Events.
    pub fn as_str(self) -> &'static str {
        match self {
            Rule::Malformed => "Malformed",
            Rule::KindNotOwned => "KindNotOwned",
            Rule::NamespaceNotAllowed => "NamespaceNotAllowed",
            Rule::InvalidName => "InvalidName",
            Rule::NotControlledByPrimary => "NotControlledByPrimary",
            Rule::UidMismatch => "UidMismatch",
            Rule::DeleteTargetMissing => "DeleteTargetMissing",
            Rule::OwnerReferencesForged => "OwnerReferencesForged",
            Rule::HostLabelForged => "HostLabelForged",
            Rule::PrimaryFieldNotAllowed => "PrimaryFieldNotAllowed",
            Rule::DuplicateTarget => "DuplicateTarget",
            Rule::HttpTargetNotAllowed => "HttpTargetNotAllowed",
        }
    }
}

/// One broken rule: which rule, which object, and a sentence for a person.
///
/// Displays as `ConfigMap ns/name: kind Secret is not owned by controller widget`
/// — the object first, then what is wrong.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// The rule broken.
    pub rule: Rule,
    /// The object concerned (`Secret ns/name`, `primary`, `httpRequests[0]`).
    pub object: String,
    /// What is wrong.
    pub message: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.object, self.message)
    }
}

/// Checks a whole plan against DESIGN.md invariants 1–3 before any write.
///
/// `primary` is the primary object as the snapshot held it (its uid and
/// namespace decide ownership and the default namespace). `existing`
/// answers for objects the plan applies or deletes.
///
/// # Guarantees
///
/// - Applies and deletes only name kinds in `controller.owns` (apiVersion
///   and kind both match).
/// - Namespaced objects carry a namespace that is the primary's or listed
///   in `write-namespaces` (`*` = any); cluster-scoped objects carry none.
/// - An applied object either does not exist or is controlled by this
///   primary (by UID); a deleted object exists, is controlled by this
///   primary and has the uid the plan names.
/// - A delete may name the primary itself (same apiVersion, kind,
///   namespace and name, and the primary's uid) only when the controller
///   declares `delete-primary`; such a plan may not also patch the primary.
/// - The plugin sets no ownerReferences and none of the host's labels;
///   names and namespaces are DNS-1123; no object is targeted twice;
///   `primaryPatch` only touches `primary-fields`; HTTP requests name
///   declared targets and ports with unique ids.
///
/// # Errors
///
/// Every [`Violation`] found, in plan order. A plan with any violation must
/// write nothing.
pub fn validate(
    plan: &Plan,
    controller: &Controller,
    primary: &Value,
    existing: &dyn ExistingLookup,
) -> Result<(), Vec<Violation>> {
    let mut v = Validator {
        controller,
        primary_uid: object::uid(primary),
        primary_namespace: if controller.primary.namespaced {
            object::namespace(primary)
        } else {
            None
        },
        existing,
        seen: BTreeSet::new(),
        out: Vec::new(),
    };
    for op in &plan.apply {
        v.apply(&op.object);
    }
    for op in &plan.delete {
        if is_primary(&op.target, controller, primary) {
            v.delete_primary(op, plan.primary_patch.is_some());
        } else {
            v.delete(op);
        }
    }
    if let Some(patch) = &plan.primary_patch {
        v.primary_patch(patch);
    }
    v.http_requests(&plan.http_requests);
    if v.out.is_empty() { Ok(()) } else { Err(v.out) }
}

/// True when `target` names the primary object (apiVersion, kind, namespace
/// and name; the namespace only for a namespaced primary).
pub fn is_primary(target: &ObjectRef, controller: &Controller, primary: &Value) -> bool {
    let namespace = if controller.primary.namespaced {
        object::namespace(primary).unwrap_or_default()
    } else {
        ""
    };
    target.api_version == object::api_version(primary)
        && target.kind == object::kind(primary)
        && target.namespace == namespace
        && target.name == object::name(primary)
}

struct Validator<'a> {
    controller: &'a Controller,
    primary_uid: &'a str,
    primary_namespace: Option<&'a str>,
    existing: &'a dyn ExistingLookup,
    seen: BTreeSet<(String, String, String, String)>,
    out: Vec<Violation>,
}

impl<'a> Validator<'a> {
    fn push(&mut self, rule: Rule, object: String, message: String) {
        self.out.push(Violation {
            rule,
            object,
            message,
        });
    }

    /// Checks kind, namespace, name and uniqueness shared by applies and
    /// deletes; returns the owned kind when the target is acceptable so far.
    fn target(
        &mut self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
        what: &str,
    ) -> Option<&'a KindRef> {
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
        match (owned.namespaced, namespace) {
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

    fn apply(&mut self, obj: &Value) {
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
            return;
        }
        if object::value_at(obj, "metadata.ownerReferences").is_some_and(|v| !v.is_null()) {
            self.push(
                Rule::OwnerReferencesForged,
                desc.clone(),
                "the plugin may not set metadata.ownerReferences; the host sets them".to_owned(),
            );
        }
        let labels = object::labels(obj);
        for label in [MANAGED_BY_LABEL, PLUGIN_LABEL] {
            if labels.contains_key(label) {
                self.push(
                    Rule::HostLabelForged,
                    desc.clone(),
                    format!("the plugin may not set label {label}; the host sets it"),
                );
            }
        }
        let (api_version, kind, namespace, name) = (
            object::api_version(obj),
            object::kind(obj),
            object::namespace(obj),
            object::name(obj),
        );
        let Some(owned) = self.target(api_version, kind, namespace, name, "object") else {
            return;
        };
        if let Some(found) = self.existing.existing(owned, namespace, name)
            && found.controller_uid.as_deref() != Some(self.primary_uid)
        {
            let message = match found.controller_uid {
                Some(other) => format!("exists and is controlled by another owner (uid {other})"),
                None => "exists and has no controller; wasmop does not adopt objects".to_owned(),
            };
            self.push(Rule::NotControlledByPrimary, desc, message);
        }
    }

    fn delete(&mut self, op: &DeleteOp) {
        let t = &op.target;
        let namespace = Some(t.namespace.as_str()).filter(|ns| !ns.is_empty());
        let desc = t.to_string();
        let Some(owned) = self.target(&t.api_version, &t.kind, namespace, &t.name, "delete") else {
            return;
        };
        match self.existing.existing(owned, namespace, &t.name) {
            None => self.push(
                Rule::DeleteTargetMissing,
                desc,
                "the object to delete does not exist".to_owned(),
            ),
            Some(found) if found.controller_uid.as_deref() != Some(self.primary_uid) => self.push(
                Rule::NotControlledByPrimary,
                desc,
                "the object to delete is not controlled by this primary".to_owned(),
            ),
            Some(found) if found.uid != op.uid => self.push(
                Rule::UidMismatch,
                desc,
                format!(
                    "the delete names uid {:?} but the object has uid {:?}",
                    op.uid, found.uid
                ),
            ),
            Some(_) => {}
        }
    }

    /// A delete of the primary itself: allowed only under `delete-primary`,
    /// with the primary's uid, once, and not next to a `primaryPatch`.
    fn delete_primary(&mut self, op: &DeleteOp, patched: bool) {
        let desc = op.target.to_string();
        if !self.controller.delete_primary {
            self.push(
                Rule::KindNotOwned,
                desc,
                format!(
                    "the delete names the primary itself, and controller {} does not declare delete-primary",
                    self.controller.name
                ),
            );
            return;
        }
        if op.uid != self.primary_uid {
            self.push(
                Rule::UidMismatch,
                desc.clone(),
                format!(
                    "the delete names uid {:?} but the primary has uid {:?}",
                    op.uid, self.primary_uid
                ),
            );
        }
        let (group, _) = split_api_version(&op.target.api_version);
        let key = (
            group.to_owned(),
            op.target.kind.clone(),
            op.target.namespace.clone(),
            op.target.name.clone(),
        );
        if !self.seen.insert(key) {
            self.push(
                Rule::DuplicateTarget,
                desc.clone(),
                "the plan targets this object more than once".to_owned(),
            );
        }
        if patched {
            self.push(
                Rule::DuplicateTarget,
                desc,
                "the plan deletes the primary and also sets primaryPatch".to_owned(),
            );
        }
    }

    fn primary_patch(&mut self, patch: &Value) {
        let mut leaves = Vec::new();
        leaf_paths(patch, String::new(), &mut leaves);
        for path in leaves {
            let allowed = self
                .controller
                .primary_fields
                .iter()
                .any(|field| path == *field || path.starts_with(&format!("{field}.")));
            if !allowed {
                let message = if path.is_empty() {
                    "primaryPatch must be a JSON object".to_owned()
                } else {
                    format!(
                        "primaryPatch sets {path}, which is not in primary-fields of controller {}",
                        self.controller.name
                    )
                };
                self.push(Rule::PrimaryFieldNotAllowed, "primary".to_owned(), message);
            }
        }
    }

    fn http_requests(&mut self, requests: &[HttpRequest]) {
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
            // `allow-list` targets are checked against the operator's
            // allow-list when requests are performed.
            if req.target == "allow-list" {
                continue;
            }
            match self
                .controller
                .http_targets
                .iter()
                .find(|t| t.id == req.target)
            {
                None => self.push(
                    Rule::HttpTargetNotAllowed,
                    desc,
                    format!(
                        "target {:?} is not an http-target of controller {}",
                        req.target, self.controller.name
                    ),
                ),
                Some(target) if !target.ports.contains(&req.port) => self.push(
                    Rule::HttpTargetNotAllowed,
                    desc,
                    format!("port {} is not a port of target {:?}", req.port, target.id),
                ),
                Some(_) => {
                    if let Err(why) = names::dns1123_subdomain(&req.object) {
                        self.push(
                            Rule::InvalidName,
                            desc,
                            format!("object name {:?} {why}", req.object),
                        );
                    }
                }
            }
        }
    }
}

/// Dotted paths of the leaves of a JSON object; an empty object is no leaf
/// (it writes nothing), anything else that is not an object is one.
fn leaf_paths(value: &Value, prefix: String, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                leaf_paths(v, path, out);
            }
        }
        _ => out.push(prefix),
    }
}

/// The object as the host writes it: `obj` plus the controller
/// ownerReference to `primary` (`controller: true`,
/// `blockOwnerDeletion: true`) and the labels
/// `app.kubernetes.io/managed-by: wasmop` and `wasmop.dev/plugin: <plugin>`.
///
/// # Caveats
///
/// Call it only on objects [`validate`] accepted: it overwrites
/// `metadata.ownerReferences` (which validation guarantees the plugin did
/// not set). Kubernetes ignores a namespaced ownerReference across
/// namespaces, so objects written outside the primary's namespace are not
/// garbage-collected with it.
pub fn prepare_apply(obj: &Value, primary: &Value, plugin_name: &str) -> Value {
    let mut out = obj.clone();
    let Some(root) = out.as_object_mut() else {
        return out;
    };
    let metadata = root
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if !metadata.is_object() {
        *metadata = Value::Object(Map::new());
    }
    let Some(metadata) = metadata.as_object_mut() else {
        return out;
    };
    metadata.insert(
        "ownerReferences".to_owned(),
        json!([{
            "apiVersion": object::api_version(primary),
            "kind": object::kind(primary),
            "name": object::name(primary),
            "uid": object::uid(primary),
            "controller": true,
            "blockOwnerDeletion": true,
        }]),
    );
    let labels = metadata
        .entry("labels")
        .or_insert_with(|| Value::Object(Map::new()));
    if !labels.is_object() {
        *labels = Value::Object(Map::new());
    }
    if let Some(labels) = labels.as_object_mut() {
        labels.insert(MANAGED_BY_LABEL.to_owned(), json!(MANAGED_BY_VALUE));
        labels.insert(PLUGIN_LABEL.to_owned(), json!(plugin_name));
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;
    use crate::manifest::HttpTarget;
    use crate::manifest::tests::controller;

    const PRIMARY_UID: &str = "uid-primary";

    fn primary() -> Value {
        json!({"apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
               "metadata": {"name": "w", "namespace": "ns", "uid": PRIMARY_UID}})
    }

    /// Existing objects keyed by (kind, namespace, name).
    #[derive(Default)]
    struct World(BTreeMap<(String, String, String), ExistingObject>);

    impl World {
        fn with(
            mut self,
            kind: &str,
            ns: &str,
            name: &str,
            uid: &str,
            controller: Option<&str>,
        ) -> Self {
            self.0.insert(
                (kind.into(), ns.into(), name.into()),
                ExistingObject {
                    uid: uid.into(),
                    controller_uid: controller.map(Into::into),
                },
            );
            self
        }
    }

    impl ExistingLookup for World {
        fn existing(&self, kind: &KindRef, ns: Option<&str>, name: &str) -> Option<ExistingObject> {
            self.0
                .get(&(
                    kind.kind.clone(),
                    ns.unwrap_or_default().into(),
                    name.into(),
                ))
                .cloned()
        }
    }

    fn cm(ns: &str, name: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns}})
    }

    fn apply(objects: Vec<Value>) -> Plan {
        Plan {
            apply: objects
                .into_iter()
                .map(|object| ApplyOp {
                    object,
                    precondition: None,
                    force: false,
                })
                .collect(),
            ..Plan::default()
        }
    }

    fn delete_cm(ns: &str, name: &str, uid: &str) -> DeleteOp {
        DeleteOp {
            target: ObjectRef {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
                namespace: ns.into(),
                name: name.into(),
            },
            uid: uid.into(),
            resource_version: "1".into(),
        }
    }

    fn violations(plan: &Plan, world: &World) -> Vec<String> {
        match validate(plan, &controller(), &primary(), world) {
            Ok(()) => vec![],
            Err(vs) => vs.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn a_plan_creating_owned_objects_in_the_primarys_namespace_is_valid() {
        assert_eq!(
            violations(&apply(vec![cm("ns", "w-cm")]), &World::default()),
            Vec::<String>::new()
        );
    }

    #[test]
    fn applying_an_unowned_kind_is_a_violation_naming_the_kind() {
        let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": "ns"}});
        assert_eq!(
            violations(&apply(vec![secret]), &World::default()),
            vec!["Secret ns/s: kind Secret (v1) is not owned by controller widget"]
        );
    }

    #[test]
    fn owned_kinds_match_on_api_version_too() {
        let wrong = json!({"apiVersion": "v2", "kind": "ConfigMap", "metadata": {"name": "s", "namespace": "ns"}});
        assert_eq!(violations(&apply(vec![wrong]), &World::default()).len(), 1);
    }

    #[test]
    fn writing_outside_the_primarys_namespace_needs_write_namespaces() {
        let plan = apply(vec![cm("other", "w-cm")]);
        assert_eq!(
            violations(&plan, &World::default()),
            vec![
                "ConfigMap other/w-cm: namespace other is not the primary's (ns) nor in write-namespaces of controller widget"
            ]
        );
        let mut c = controller();
        c.write_namespaces = vec!["*".into()];
        assert!(validate(&plan, &c, &primary(), &World::default()).is_ok());
    }

    #[test]
    fn a_cluster_scoped_primary_writes_namespaced_objects_only_where_declared() {
        let mut c = controller();
        c.primary.namespaced = false;
        let primary = json!({"apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
                             "metadata": {"name": "w", "uid": PRIMARY_UID}});
        let plan = apply(vec![cm("target", "w-cm")]);
        assert!(validate(&plan, &c, &primary, &World::default()).is_err());
        c.write_namespaces = vec!["target".into()];
        assert!(validate(&plan, &c, &primary, &World::default()).is_ok());
    }

    #[test]
    fn namespaced_objects_must_name_their_namespace() {
        let obj = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}});
        assert_eq!(
            violations(&apply(vec![obj]), &World::default()),
            vec!["ConfigMap x: ConfigMap is namespaced but the object names no namespace"]
        );
    }

    #[test]
    fn applying_over_an_object_of_another_controller_is_a_violation() {
        let world = World::default().with("ConfigMap", "ns", "taken", "u1", Some("someone-else"));
        assert_eq!(
            violations(&apply(vec![cm("ns", "taken")]), &world),
            vec![
                "ConfigMap ns/taken: exists and is controlled by another owner (uid someone-else)"
            ]
        );
    }

    #[test]
    fn applying_over_an_uncontrolled_object_is_a_violation() {
        let world = World::default().with("ConfigMap", "ns", "loose", "u1", None);
        assert_eq!(violations(&apply(vec![cm("ns", "loose")]), &world).len(), 1);
    }

    #[test]
    fn applying_over_our_own_object_is_valid() {
        let world = World::default().with("ConfigMap", "ns", "mine", "u1", Some(PRIMARY_UID));
        assert!(violations(&apply(vec![cm("ns", "mine")]), &world).is_empty());
    }

    #[test]
    fn deleting_requires_our_control_and_the_right_uid() {
        let world = World::default()
            .with("ConfigMap", "ns", "mine", "u1", Some(PRIMARY_UID))
            .with("ConfigMap", "ns", "theirs", "u2", Some("other"));
        let plan = Plan {
            delete: vec![
                delete_cm("ns", "mine", "u1"),
                delete_cm("ns", "theirs", "u2"),
                delete_cm("ns", "gone", "u3"),
            ],
            ..Plan::default()
        };
        assert_eq!(
            violations(&plan, &world),
            vec![
                "ConfigMap ns/theirs: the object to delete is not controlled by this primary",
                "ConfigMap ns/gone: the object to delete does not exist",
            ]
        );
        let stale = Plan {
            delete: vec![delete_cm("ns", "mine", "old-uid")],
            ..Plan::default()
        };
        assert_eq!(
            violations(&stale, &world),
            vec![
                "ConfigMap ns/mine: the delete names uid \"old-uid\" but the object has uid \"u1\""
            ]
        );
    }

    fn delete_self(uid: &str) -> Plan {
        Plan {
            delete: vec![DeleteOp {
                target: ObjectRef {
                    api_version: "test.wasmop.dev/v1".into(),
                    kind: "Widget".into(),
                    namespace: "ns".into(),
                    name: "w".into(),
                },
                uid: uid.into(),
                resource_version: "7".into(),
            }],
            ..Plan::default()
        }
    }

    #[test]
    fn deleting_the_primary_is_refused_without_delete_primary() {
        let vs = validate(
            &delete_self(PRIMARY_UID),
            &controller(),
            &primary(),
            &World::default(),
        )
        .unwrap_err();
        assert_eq!(vs.len(), 1, "{vs:?}");
        assert_eq!(vs[0].rule, Rule::KindNotOwned);
        assert_eq!(
            vs[0].to_string(),
            "Widget ns/w: the delete names the primary itself, and controller widget does not declare delete-primary"
        );
    }

    #[test]
    fn deleting_the_primary_is_valid_when_the_controller_declares_it() {
        let mut c = controller();
        c.delete_primary = true;
        // The primary is not in `existing` (it is not an owned kind): the
        // snapshot's primary is the evidence, its uid the check.
        assert!(validate(&delete_self(PRIMARY_UID), &c, &primary(), &World::default()).is_ok());
        let stale =
            validate(&delete_self("old-uid"), &c, &primary(), &World::default()).unwrap_err();
        assert_eq!(
            stale.iter().map(|v| v.rule).collect::<Vec<_>>(),
            vec![Rule::UidMismatch]
        );
        let mut twice = delete_self(PRIMARY_UID);
        twice.delete.push(twice.delete[0].clone());
        twice.primary_patch = Some(json!({"spec": {"id": "x"}}));
        let rules: Vec<Rule> = validate(&twice, &c, &primary(), &World::default())
            .unwrap_err()
            .into_iter()
            .map(|v| v.rule)
            .collect();
        assert_eq!(
            rules,
            vec![
                Rule::DuplicateTarget,
                Rule::DuplicateTarget,
                Rule::DuplicateTarget
            ]
        );
    }

    #[test]
    fn delete_primary_covers_only_the_primary_itself() {
        let mut c = controller();
        c.delete_primary = true;
        // Another Widget (same kind, other name) is still not owned.
        let mut other = delete_self("u2");
        other.delete[0].target.name = "w2".into();
        let vs = validate(&other, &c, &primary(), &World::default()).unwrap_err();
        assert_eq!(vs[0].rule, Rule::KindNotOwned);
        // The primary's name in another namespace is another object.
        let mut elsewhere = delete_self(PRIMARY_UID);
        elsewhere.delete[0].target.namespace = "other".into();
        assert!(validate(&elsewhere, &c, &primary(), &World::default()).is_err());
    }

    #[test]
    fn plans_without_force_still_parse_and_force_is_always_printed() {
        let plan: Plan = serde_json::from_value(json!({
            "apply": [{"object": cm("ns", "a"), "precondition": null}]
        }))
        .expect("parses");
        assert!(!plan.apply[0].force);
        let mut forced = plan.clone();
        forced.apply[0].force = true;
        let text = serde_json::to_value(&forced).expect("serializes");
        assert_eq!(text["apply"][0]["force"], json!(true));
    }

    #[test]
    fn forged_owner_references_and_host_labels_are_rejected() {
        let obj = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
            "name": "x", "namespace": "ns",
            "ownerReferences": [{"uid": "u"}],
            "labels": {"app.kubernetes.io/managed-by": "me", "wasmop.dev/plugin": "other"}}});
        let rules: Vec<Rule> = validate(
            &apply(vec![obj]),
            &controller(),
            &primary(),
            &World::default(),
        )
        .unwrap_err()
        .into_iter()
        .map(|v| v.rule)
        .collect();
        assert_eq!(
            rules,
            vec![
                Rule::OwnerReferencesForged,
                Rule::HostLabelForged,
                Rule::HostLabelForged
            ]
        );
    }

    #[test]
    fn duplicate_targets_are_rejected_across_applies_and_deletes() {
        let world = World::default().with("ConfigMap", "ns", "a", "u1", Some(PRIMARY_UID));
        let mut plan = apply(vec![cm("ns", "a"), cm("ns", "a")]);
        plan.delete.push(delete_cm("ns", "a", "u1"));
        let rules: Vec<Rule> = validate(&plan, &controller(), &primary(), &world)
            .unwrap_err()
            .into_iter()
            .map(|v| v.rule)
            .collect();
        assert_eq!(rules, vec![Rule::DuplicateTarget, Rule::DuplicateTarget]);
    }

    #[test]
    fn names_must_be_dns1123() {
        assert_eq!(
            violations(&apply(vec![cm("ns", "Bad_Name")]), &World::default()),
            vec![
                "ConfigMap ns/Bad_Name: name \"Bad_Name\" may contain only lowercase letters, digits, '-' and '.'"
            ]
        );
    }

    #[test]
    fn primary_patch_may_only_touch_primary_fields() {
        let ok = Plan {
            primary_patch: Some(json!({"spec": {"id": "abc"}})),
            ..Plan::default()
        };
        assert!(violations(&ok, &World::default()).is_empty());
        let bad = Plan {
            primary_patch: Some(
                json!({"spec": {"id": "abc", "replicas": 3}, "metadata": {"labels": {"a": "b"}}}),
            ),
            ..Plan::default()
        };
        assert_eq!(
            violations(&bad, &World::default()),
            vec![
                "primary: primaryPatch sets metadata.labels.a, which is not in primary-fields of controller widget",
                "primary: primaryPatch sets spec.replicas, which is not in primary-fields of controller widget",
            ]
        );
    }

    #[test]
    fn http_requests_must_name_declared_targets_and_ports() {
        let mut c = controller();
        c.http_targets = vec![HttpTarget {
            id: "members".into(),
            kind: KindRef::namespaced("", "v1", "Pod", "pods"),
            ports: vec![8080],
        }];
        let req = |target: &str, port: u16| HttpRequest {
            id: format!("{target}-{port}"),
            target: target.into(),
            object: "pod-0".into(),
            port,
            method: HttpMethod::Get,
            path: "/healthz".into(),
            body: String::new(),
            headers: vec![],
            secret_headers: vec![],
            timeout_ms: 0,
            max_response_bytes: 0,
            max_age_ms: 0,
        };
        let plan = Plan {
            http_requests: vec![
                req("members", 8080),
                req("members", 9090),
                req("nowhere", 80),
            ],
            ..Plan::default()
        };
        let vs = validate(&plan, &c, &primary(), &World::default()).unwrap_err();
        assert_eq!(vs.len(), 2, "{vs:?}");
        assert!(vs.iter().all(|v| v.rule == Rule::HttpTargetNotAllowed));
    }

    #[test]
    fn prepare_apply_sets_the_controller_reference_and_host_labels() {
        let out = prepare_apply(
            &json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "x", "namespace": "ns", "labels": {"app": "w"}}}),
            &primary(),
            "widget",
        );
        assert_eq!(
            out["metadata"]["ownerReferences"],
            json!([{"apiVersion": "test.wasmop.dev/v1", "kind": "Widget", "name": "w",
                    "uid": PRIMARY_UID, "controller": true, "blockOwnerDeletion": true}])
        );
        assert_eq!(
            out["metadata"]["labels"],
            json!({"app": "w", "app.kubernetes.io/managed-by": "wasmop", "wasmop.dev/plugin": "widget"})
        );
    }

    #[test]
    fn plan_json_uses_the_documented_shape() {
        let plan = Plan {
            apply: vec![ApplyOp {
                object: cm("ns", "a"),
                precondition: Some(Precondition::Absent),
                force: false,
            }],
            events: vec![Event {
                event_type: EventType::Warning,
                reason: "R".into(),
                message: "m".into(),
            }],
            requeue_after_ms: Some(1000),
            ..Plan::default()
        };
        let text = serde_json::to_value(&plan).expect("serializes");
        assert_eq!(
            text,
            json!({"apply": [{"object": cm("ns", "a"), "precondition": {"absent": true}, "force": false}],
                   "delete": [], "status": null, "primaryPatch": null,
                   "events": [{"type": "Warning", "reason": "R", "message": "m"}],
                   "requeueAfterMs": 1000, "cleanupComplete": false, "httpRequests": []})
        );
        let back: Plan = serde_json::from_value(text).expect("round-trips");
        assert_eq!(back, plan);
        let rv: Precondition =
            serde_json::from_value(json!({"resourceVersion": "12"})).expect("parses");
        assert_eq!(rv, Precondition::ResourceVersion("12".into()));
    }
}
