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

//!
//! The rules live by family: [`counts`] (how many applies, deletes, Events,
//! HTTP requests and gauges one plan may carry: [`PlanLimits`],
//! [`check_counts`], [`check_gauges`]), [`ownership`] (whose objects a plan
//! may write or delete, the primary included) and [`per_object`] (each
//! object's kind, namespace, name and host labels, the `primaryPatch` fields
//! and the HTTP targets). [`validate`] runs the last two over a whole plan.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;

use crate::contract::manifest::Controller;
use crate::object;

pub use wasmop_contract::plan::{
    ApplyOp, CaBundle, DeleteOp, Event, EventType, GeneratedKey, HttpMethod, HttpRequest,
    ObjectRef, Plan, Precondition, RequestTarget, SecretEncoding, SecretHeader,
};
pub use wasmop_contract::{MANAGED_BY_LABEL, MANAGED_BY_VALUE, OWNER_UID_LABEL, PLUGIN_LABEL};

pub use crate::judge::existing::{BeforeCreate, ExistingLookup, ExistingObject};

pub mod counts;
pub mod ownership;
pub mod per_object;

pub use counts::{
    DEFAULT_MAX_DELETES, DEFAULT_MAX_DELETES_PER_MINUTE, HOST_GAUGE_LABELS, MAX_GAUGE_LABEL_VALUE,
    MAX_GAUGE_LABELS, MAX_GAUGES, PlanLimits, check_counts, check_gauges,
};
pub use ownership::{PROTECTED_LABEL, is_primary};
pub use per_object::GENERATED_BYTES;
pub use per_object::{SHARD_LABEL_PREFIX, is_host_label};

/// The rule a [`Violation`] breaks.
///
/// Serialized as its [`Rule::as_str`] name (`"KindNotOwned"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Rule {
    /// An object lacks apiVersion, kind or metadata.name, or is not an object.
    Malformed,
    /// The kind is not in the controller's `owns`.
    KindNotOwned,
    /// The namespace is neither the primary's nor in `write-namespaces`
    /// (the controller's, or the narrower list of the object's kind), or
    /// the namespace does not suit the kind's scope.
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
    /// The plan sets, changes or removes a label the host owns
    /// ([`is_host_label`]: the shard labels, managed-by, plugin, owner-uid)
    /// or `wasmop.dev/protected`, on an applied object or on its primary
    /// (`primaryPatch`), whatever `primary-fields` declares.
    HostLabelForged,
    /// `primaryPatch` touches a field outside `primary-fields`.
    PrimaryFieldNotAllowed,
    /// One object is the target of two operations.
    DuplicateTarget,
    /// An HTTP request names an undeclared target or port, or repeats an id.
    HttpTargetNotAllowed,
    /// More applies than the plugin's [`PlanLimits::max_applies`].
    TooManyApplies,
    /// More deletes than one of the plugin's deletion budgets: per
    /// reconcile ([`PlanLimits::max_deletes`], checked with the other
    /// counts) or per minute ([`PlanLimits::max_deletes_per_minute`],
    /// checked by the executor against what the plugin deleted in the last
    /// minute). The plan is rejected whole until a person raises the budget.
    DeletionBudgetExceeded,
    /// More Events than the plugin's [`PlanLimits::max_events`].
    TooManyEvents,
    /// More HTTP requests than the plugin's [`PlanLimits::max_http_requests`].
    TooManyHttpRequests,
    /// The plan deletes an object labelled `wasmop.dev/protected=true`
    /// ([`PROTECTED_LABEL`]): no plan deletes it, whoever owns it.
    ProtectedObject,
    /// A gauge with a name or labels the host does not expose: not a
    /// Prometheus name, a host metric prefix, a `_total` name, a host label,
    /// a value that is not finite, too many labels, or more than
    /// [`MAX_GAUGES`] gauges.
    GaugeInvalid,
    /// An apply's `generate` list is not usable: the object is not a `v1`
    /// Secret, a key is not a valid Secret key, repeats, is set by the
    /// plugin itself, or asks for fewer than 16 or more than 1024 bytes.
    GeneratedKeyInvalid,
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
            Rule::TooManyApplies => "TooManyApplies",
            Rule::DeletionBudgetExceeded => "DeletionBudgetExceeded",
            Rule::TooManyEvents => "TooManyEvents",
            Rule::TooManyHttpRequests => "TooManyHttpRequests",
            Rule::GaugeInvalid => "GaugeInvalid",
            Rule::ProtectedObject => "ProtectedObject",
            Rule::GeneratedKeyInvalid => "GeneratedKeyInvalid",
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
///   in `write-namespaces` (`*` = any), and in the kind's own narrower list
///   when it declares one ([`Controller::kind_write_namespaces`]): for
///   applies and deletes alike; cluster-scoped objects carry none.
/// - An applied object either does not exist or is controlled by this
///   primary (by UID); a deleted object exists, is controlled by this
///   primary and has the uid the plan names.
/// - A delete may name the primary itself (same apiVersion, kind,
///   namespace and name, and the primary's uid) only when the controller
///   declares `delete-primary`; such a plan may not also patch the primary.
/// - A `generate` list names only keys of a `v1` Secret, each once, each
///   a valid Secret key the object does not set itself, 16 to 1024 bytes
///   ([`GENERATED_BYTES`]).
/// - The plugin sets no ownerReferences and none of the host's labels
///   (nor `wasmop.dev/protected`), and its `primaryPatch` sets, changes or
///   removes none of them on the primary;
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
) -> Result<Judgement, Vec<Violation>> {
    validate_with_owned(plan, controller, primary, existing, &[])
}

/// [`validate`], knowing the objects of the primary's snapshot `owned` list:
/// a delete of a [`dependent`](wasmop_contract::Ownership::Dependent) kind is
/// allowed only for an object one of them controls.
///
/// # Errors
///
/// As [`validate`].
pub fn validate_with_owned(
    plan: &Plan,
    controller: &Controller,
    primary: &Value,
    existing: &dyn ExistingLookup,
    owned: &[Arc<Value>],
) -> Result<Judgement, Vec<Violation>> {
    let mut v = Validator {
        owned_uids: owned
            .iter()
            .map(|o| object::uid(o))
            .filter(|u| !u.is_empty())
            .collect(),
        controller,
        primary_uid: object::uid(primary),
        primary_protected: object::labels_get(primary, PROTECTED_LABEL) == Some("true"),
        primary_namespace: if controller.primary.namespaced {
            object::namespace(primary)
        } else {
            None
        },
        existing,
        seen: BTreeSet::new(),
        out: Vec::new(),
        judgement: Judgement::default(),
    };
    for op in &plan.apply {
        let judged = v.apply(&op.object, op.precondition.as_ref());
        v.judgement.applies.push(judged);
        if !op.generate.is_empty() {
            v.generated(&op.object, &op.generate);
        }
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
    if v.out.is_empty() {
        Ok(v.judgement)
    } else {
        Err(v.out)
    }
}

/// What validation found out about the objects of a plan that passed: the
/// facts the writes are fenced with.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Judgement {
    /// One entry per apply op, in plan order.
    pub applies: Vec<ApplyJudgement>,
}

/// What was judged about one applied object.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ApplyJudgement {
    /// The object as it existed when judged; `None` when it did not exist
    /// (the write is then a create, which fails if the object appeared
    /// meanwhile).
    pub existing: Option<Judged>,
    /// The object exists, nothing controls it, and the controller declares
    /// adoption of its kind: the write adopts it (fenced by its
    /// resourceVersion, so it adopts exactly what was judged).
    pub adopts: bool,
    /// Judged absent because the lookup does not hold it, without asking
    /// the API server ([`BeforeCreate::Unasked`]): the fenced create finds
    /// out, and a conflict means it may exist and be someone else's.
    pub unasked: bool,
}

/// The identity of an existing object at judgement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Judged {
    /// Its UID.
    pub uid: String,
    /// Its resourceVersion.
    pub resource_version: String,
}

/// The state of one [`validate`] run; its checks live in [`ownership`] and
/// [`per_object`].
struct Validator<'a> {
    controller: &'a Controller,
    primary_uid: &'a str,
    primary_namespace: Option<&'a str>,
    /// The primary carries [`PROTECTED_LABEL`]`=true`.
    primary_protected: bool,
    existing: &'a dyn ExistingLookup,
    /// UIDs of the objects this primary controls (its snapshot's `owned`).
    owned_uids: BTreeSet<&'a str>,
    seen: BTreeSet<(String, String, String, String)>,
    out: Vec<Violation>,
    judgement: Judgement,
}

impl<'a> Validator<'a> {
    fn push(&mut self, rule: Rule, object: String, message: String) {
        self.out.push(Violation {
            rule,
            object,
            message,
        });
    }
}

#[cfg(test)]
mod tests;
