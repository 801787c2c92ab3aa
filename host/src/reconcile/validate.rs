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
use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;

use crate::names;
use crate::object;
use crate::plugin::manifest::{Controller, OwnedKind, Ownership, split_api_version};

pub use wasmop_contract::plan::{
    ApplyOp, CaBundle, DeleteOp, Event, EventType, HttpMethod, HttpRequest, ObjectRef, Plan,
    Precondition, RequestTarget, SecretHeader,
};
pub use wasmop_contract::{MANAGED_BY_LABEL, MANAGED_BY_VALUE, OWNER_UID_LABEL, PLUGIN_LABEL};

pub use crate::execute::prepare::prepare_apply;
pub use crate::reconcile::existing::{BeforeCreate, ExistingLookup, ExistingObject};

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
}

/// The label a person sets (`true`) on an object no plan may delete. Plugins
/// may not set it: protection is a person's decision, not the plugin's.
pub const PROTECTED_LABEL: &str = "wasmop.dev/protected";

/// Most gauges one plan may set.
pub const MAX_GAUGES: usize = 64;
/// Most labels one gauge may carry (besides the host's).
pub const MAX_GAUGE_LABELS: usize = 8;
/// Longest label value.
pub const MAX_GAUGE_LABEL_VALUE: usize = 256;
/// Metric name prefixes the host's own metrics use.
const HOST_METRIC_PREFIXES: &[&str] = &[
    "wasmop_",
    "controller_runtime_",
    "workqueue_",
    "rest_client_",
];
/// Labels the host sets on every plugin gauge.
pub const HOST_GAUGE_LABELS: &[&str] = &["controller", "namespace", "name"];

fn prometheus_name(text: &str) -> bool {
    let mut chars = text.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Checks the plan's gauges ([`Rule::GaugeInvalid`]): one violation per bad
/// gauge, or one for too many.
pub fn check_gauges(plan: &Plan) -> Vec<Violation> {
    let mut out = Vec::new();
    if plan.gauges.len() > MAX_GAUGES {
        out.push(Violation {
            rule: Rule::GaugeInvalid,
            object: "gauges".to_owned(),
            message: format!(
                "the plan has {} gauges, more than the {MAX_GAUGES} allowed",
                plan.gauges.len()
            ),
        });
        return out;
    }
    let mut seen = std::collections::BTreeSet::new();
    for (i, g) in plan.gauges.iter().enumerate() {
        let why = if !prometheus_name(&g.name) {
            Some(format!("{:?} is not a Prometheus metric name", g.name))
        } else if let Some(p) = HOST_METRIC_PREFIXES
            .iter()
            .find(|p| g.name.starts_with(**p))
        {
            Some(format!("{} uses the host's prefix {p}", g.name))
        } else if g.name.ends_with("_total") {
            Some(format!(
                "{} ends in _total, which names counters; gauges only",
                g.name
            ))
        } else if !g.value.is_finite() {
            Some(format!(
                "{} has the value {}, not a finite number",
                g.name, g.value
            ))
        } else if g.labels.len() > MAX_GAUGE_LABELS {
            Some(format!(
                "{} has {} labels, more than {MAX_GAUGE_LABELS}",
                g.name,
                g.labels.len()
            ))
        } else if let Some(k) = g.labels.keys().find(|k| {
            !prometheus_name(k) || k.starts_with("__") || HOST_GAUGE_LABELS.contains(&k.as_str())
        }) {
            Some(format!(
                "{}: label {k:?} is not a label name a plugin may set",
                g.name
            ))
        } else if let Some(v) = g.labels.values().find(|v| v.len() > MAX_GAUGE_LABEL_VALUE) {
            Some(format!(
                "{}: a label value is {} bytes, more than {MAX_GAUGE_LABEL_VALUE}",
                g.name,
                v.len()
            ))
        } else if !seen.insert((g.name.as_str(), &g.labels)) {
            Some(format!("{} is set twice with the same labels", g.name))
        } else {
            None
        };
        if let Some(message) = why {
            out.push(Violation {
                rule: Rule::GaugeInvalid,
                object: format!("gauges[{i}]"),
                message,
            });
        }
    }
    out
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

/// How much one plan may ask for, and how it is executed; configurable per
/// plugin (operator file keys `maxApplies`, `maxDeletes`,
/// `maxDeletesPerMinute`, `maxEvents`, `maxHttpRequests`, `minRequeueMs`,
/// `dryRunFirst`). Each apply, delete, Event and HTTP request is an API
/// call or a connection, so their number is bounded whatever their size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanLimits {
    /// Most applies in one plan. Default 500.
    pub max_applies: usize,
    /// The per-reconcile deletion budget: most deletes in one plan.
    /// Default 500. A plan over it is rejected whole
    /// ([`Rule::DeletionBudgetExceeded`]).
    pub max_deletes: usize,
    /// The per-minute deletion budget: most deletes the plugin's plans may
    /// execute in any 60 seconds, across all its primaries. Default 1000.
    /// A plan that would go over it is rejected whole, and so is every
    /// later plan of the plugin that deletes, until the budget is raised
    /// (see [`crate::execute::budget`]).
    pub max_deletes_per_minute: usize,
    /// Most Events in one plan. Default 50.
    pub max_events: usize,
    /// Most HTTP requests in one plan. Default 32.
    pub max_http_requests: usize,
    /// Shortest `requeueAfterMs` honoured; shorter ones (0 included) wait
    /// this long. Default 1000.
    pub min_requeue_ms: u64,
    /// Send every write of a plan with `dryRun=All` first, and write
    /// nothing when the API server refuses one (schema, CEL rules,
    /// admission webhooks, quota). Default false.
    pub dry_run_first: bool,
}

/// Default per-reconcile deletion budget ([`PlanLimits::max_deletes`]).
pub const DEFAULT_MAX_DELETES: usize = 500;
/// Default per-minute deletion budget ([`PlanLimits::max_deletes_per_minute`]).
pub const DEFAULT_MAX_DELETES_PER_MINUTE: usize = 1000;

impl Default for PlanLimits {
    fn default() -> Self {
        PlanLimits {
            max_applies: 500,
            max_deletes: DEFAULT_MAX_DELETES,
            max_deletes_per_minute: DEFAULT_MAX_DELETES_PER_MINUTE,
            max_events: 50,
            max_http_requests: 32,
            min_requeue_ms: 1000,
            dry_run_first: false,
        }
    }
}

impl PlanLimits {
    /// When the plan asks to be reconciled again: its `requeueAfterMs`,
    /// raised to [`PlanLimits::min_requeue_ms`].
    pub fn requeue_after(&self, plan: &Plan) -> Option<std::time::Duration> {
        plan.requeue_after_ms
            .map(|ms| std::time::Duration::from_millis(ms.max(self.min_requeue_ms)))
    }
}

/// Checks the counts of a plan against `limits`: one violation per list
/// that is too long ([`Rule::TooManyApplies`],
/// [`Rule::DeletionBudgetExceeded`] for the per-reconcile deletion budget,
/// [`Rule::TooManyEvents`], [`Rule::TooManyHttpRequests`]). Cheap: it looks
/// at lengths only, so it runs before the per-object rules of [`validate`].
pub fn check_counts(plan: &Plan, limits: &PlanLimits) -> Vec<Violation> {
    let mut out = Vec::new();
    if plan.delete.len() > limits.max_deletes {
        out.push(Violation {
            rule: Rule::DeletionBudgetExceeded,
            object: "delete".to_owned(),
            message: format!(
                "the plan deletes {} objects, more than the per-reconcile deletion budget of {}; \
                 nothing is written until a person raises maxDeletes of this plugin in the \
                 operator configuration",
                plan.delete.len(),
                limits.max_deletes
            ),
        });
    }
    let lists = [
        (
            plan.apply.len(),
            limits.max_applies,
            Rule::TooManyApplies,
            "apply",
            "applies",
        ),
        (
            plan.events.len(),
            limits.max_events,
            Rule::TooManyEvents,
            "events",
            "Events",
        ),
        (
            plan.http_requests.len(),
            limits.max_http_requests,
            Rule::TooManyHttpRequests,
            "httpRequests",
            "HTTP requests",
        ),
    ];
    out.extend(lists.into_iter().filter(|(len, max, ..)| len > max).map(
        |(len, max, rule, field, what)| Violation {
            rule,
            object: field.to_owned(),
            message: format!("the plan has {len} {what}, more than the {max} allowed"),
        },
    ));
    out
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

    /// Checks kind, namespace, name and uniqueness shared by applies and
    /// deletes; returns the owned kind when the target is acceptable so far.
    fn target(
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

    fn apply(&mut self, obj: &Value, precondition: Option<&Precondition>) -> ApplyJudgement {
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
            return ApplyJudgement::default();
        }
        if object::value_at(obj, "metadata.ownerReferences").is_some_and(|v| !v.is_null()) {
            self.push(
                Rule::OwnerReferencesForged,
                desc.clone(),
                "the plugin may not set metadata.ownerReferences; the host sets them".to_owned(),
            );
        }
        let (api_version, kind, namespace, name) = (
            object::api_version(obj),
            object::kind(obj),
            object::namespace(obj),
            object::name(obj),
        );
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
        if labels.contains_key(PROTECTED_LABEL) {
            // A forced apply could otherwise take the label off a
            // protected object and delete it on the next reconcile.
            self.push(
                Rule::HostLabelForged,
                desc.clone(),
                format!("the plugin may not set label {PROTECTED_LABEL}; people set it"),
            );
        }
        let Some(owned) = self.target(api_version, kind, namespace, name, "object") else {
            return ApplyJudgement::default();
        };
        if owned.is_dependent() {
            self.push(
                Rule::KindNotOwned,
                desc,
                format!(
                    "{} is a dependent kind of controller {}: a plan may delete objects that its \
                     owned objects control, never apply one",
                    owned.kind, self.controller.name
                ),
            );
            return ApplyJudgement::default();
        }
        // An object the lookup does not hold may be judged absent without
        // asking further only when the write fails should it exist: a
        // create, or an apply fenced as absent. An apply that carries the
        // plugin's resourceVersion would succeed on any object at that
        // version, so its object is always looked up.
        let fenced_as_absent = matches!(precondition, None | Some(Precondition::Absent));
        let found = if fenced_as_absent {
            match self
                .existing
                .existing_before_create(&owned.kind, namespace, name)
            {
                BeforeCreate::Exists(found) => Some(found),
                BeforeCreate::Absent => None,
                BeforeCreate::Unasked => {
                    return ApplyJudgement {
                        unasked: true,
                        ..ApplyJudgement::default()
                    };
                }
            }
        } else {
            self.existing.existing(&owned.kind, namespace, name)
        };
        let Some(found) = found else {
            return ApplyJudgement::default();
        };
        let judged = ApplyJudgement {
            existing: Some(Judged {
                uid: found.uid.clone(),
                resource_version: found.resource_version.clone(),
            }),
            adopts: false,
            unasked: false,
        };
        if found.is_controlled_by(self.primary_uid, &owned.ownership) {
            return judged;
        }
        if found.is_orphan() && owned.adopt {
            return ApplyJudgement {
                adopts: true,
                ..judged
            };
        }
        let message = match (&found.controller_uid, &found.owner_label) {
            (Some(other), _) if other != self.primary_uid => {
                format!("exists and is controlled by another owner (uid {other})")
            }
            (_, Some(other)) if other != self.primary_uid => {
                format!("exists and is owned by label by another primary (uid {other})")
            }
            (None, None) => format!(
                "exists and nothing controls it; controller {} does not declare adoption of {}, \
                 so it is left alone",
                self.controller.name, owned.kind
            ),
            _ => format!(
                "exists and is not marked as this primary's the way {} is owned ({})",
                owned.kind,
                ownership_name(&owned.ownership)
            ),
        };
        self.push(Rule::NotControlledByPrimary, desc, message);
        judged
    }

    fn delete(&mut self, op: &DeleteOp) {
        let t = &op.target;
        let namespace = Some(t.namespace.as_str()).filter(|ns| !ns.is_empty());
        let desc = t.to_string();
        let Some(owned) = self.target(&t.api_version, &t.kind, namespace, &t.name, "delete") else {
            return;
        };
        match self.existing.existing(&owned.kind, namespace, &t.name) {
            None => self.push(
                Rule::DeleteTargetMissing,
                desc,
                "the object to delete does not exist".to_owned(),
            ),
            Some(found) if found.protected => self.push(
                Rule::ProtectedObject,
                desc,
                format!(
                    "the object is labelled {PROTECTED_LABEL}=true, so no plan deletes it; \
                     remove the label to let this plan proceed"
                ),
            ),
            Some(found) if owned.is_dependent() => {
                let by_owned = found
                    .controller_uid
                    .as_deref()
                    .is_some_and(|c| self.owned_uids.contains(c));
                if !by_owned {
                    self.push(
                        Rule::NotControlledByPrimary,
                        desc.clone(),
                        match &found.controller_uid {
                            Some(c) => format!(
                                "the object to delete is controlled by uid {c}, which is not an \
                                 object this primary owns"
                            ),
                            None => "the object to delete has no controller; only objects this \
                                     primary's owned objects control may be deleted"
                                .to_owned(),
                        },
                    );
                } else if found.uid != op.uid {
                    self.push(
                        Rule::UidMismatch,
                        desc,
                        format!(
                            "the delete names uid {:?} but the object has uid {:?}",
                            op.uid, found.uid
                        ),
                    );
                }
            }
            Some(found) if !found.is_controlled_by(self.primary_uid, &owned.ownership) => self
                .push(
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
        if self.primary_protected {
            self.push(
                Rule::ProtectedObject,
                desc.clone(),
                format!(
                    "the primary is labelled {PROTECTED_LABEL}=true, so no plan deletes it; \
                     remove the label to let this plan proceed"
                ),
            );
        }
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
        if !patch.is_object() {
            self.push(
                Rule::PrimaryFieldNotAllowed,
                "primary".to_owned(),
                "primaryPatch must be a JSON object".to_owned(),
            );
            return;
        }
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

/// `owner-reference` or `owner-label`, as the manifest docs name them.
fn ownership_name(ownership: &Ownership) -> &'static str {
    match ownership {
        Ownership::OwnerReference => "owner-reference",
        Ownership::OwnerLabel { .. } => "owner-label",
        Ownership::Dependent => "dependent",
    }
}

#[cfg(test)]
mod count_tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_million_empty_events_break_the_event_count_rule() {
        let event = Event {
            event_type: EventType::Normal,
            reason: String::new(),
            message: String::new(),
        };
        let plan = Plan {
            events: vec![event; 1_000_000],
            ..Plan::default()
        };
        let violations = check_counts(&plan, &PlanLimits::default());
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert_eq!(violations[0].rule.as_str(), "TooManyEvents");
        assert!(
            violations[0].message.contains("1000000"),
            "{}",
            violations[0]
        );
    }

    #[test]
    fn every_list_has_its_own_rule_and_limits_are_inclusive() {
        let limits = PlanLimits {
            max_applies: 1,
            max_deletes: 0,
            max_events: 2,
            max_http_requests: 0,
            ..PlanLimits::default()
        };
        let mut plan: Plan = serde_json::from_value(json!({
            "apply": [{"object": {}}],
            "delete": [{"target": {"apiVersion": "v1", "kind": "ConfigMap", "name": "a"}, "uid": "u", "resourceVersion": "1"}],
            "events": [{"type": "Normal", "reason": "R", "message": ""},
                       {"type": "Normal", "reason": "R", "message": ""}]
        }))
        .expect("plan");
        plan.http_requests.push(HttpRequest::allow_listed(
            "a",
            HttpMethod::Get,
            "http://127.0.0.1:1",
            "/",
        ));
        let rules: Vec<&str> = check_counts(&plan, &limits)
            .iter()
            .map(|v| v.rule.as_str())
            .collect();
        assert_eq!(rules, ["DeletionBudgetExceeded", "TooManyHttpRequests"]);
        plan.delete.clear();
        plan.http_requests.clear();
        assert!(check_counts(&plan, &limits).is_empty());
    }

    #[test]
    fn the_per_reconcile_deletion_budget_names_the_count_the_budget_and_the_setting() {
        let limits = PlanLimits {
            max_deletes: 10,
            ..PlanLimits::default()
        };
        let one: Value = json!({"target": {"apiVersion": "v1", "kind": "ConfigMap", "name": "a"},
                                "uid": "u", "resourceVersion": "1"});
        let mut plan: Plan =
            serde_json::from_value(json!({"delete": vec![one; 50]})).expect("plan");
        let violations = check_counts(&plan, &limits);
        assert_eq!(violations.len(), 1, "{violations:?}");
        let v = &violations[0];
        assert_eq!(v.rule.as_str(), "DeletionBudgetExceeded");
        for part in ["deletes 50 objects", "deletion budget of 10", "maxDeletes"] {
            assert!(v.message.contains(part), "{part}: {v}");
        }
        // The budget is inclusive, and the other lists' rules are untouched.
        plan.delete.truncate(10);
        assert!(check_counts(&plan, &limits).is_empty());
        assert_eq!(PlanLimits::default().max_deletes, DEFAULT_MAX_DELETES);
        const { assert!(DEFAULT_MAX_DELETES_PER_MINUTE >= DEFAULT_MAX_DELETES) };
    }

    #[test]
    fn requeue_delays_have_a_floor() {
        let limits = PlanLimits::default();
        let mut plan = Plan {
            requeue_after_ms: Some(0),
            ..Plan::default()
        };
        assert_eq!(
            limits.requeue_after(&plan),
            Some(std::time::Duration::from_secs(1))
        );
        plan.requeue_after_ms = Some(30_000);
        assert_eq!(
            limits.requeue_after(&plan),
            Some(std::time::Duration::from_secs(30))
        );
        plan.requeue_after_ms = None;
        assert_eq!(limits.requeue_after(&plan), None);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;
    use crate::plugin::manifest::tests::controller;
    use crate::plugin::manifest::{HttpTarget, KindRef};

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
                    owner_label: None,
                    resource_version: "5".into(),
                    protected: false,
                },
            );
            self
        }

        fn labelled(mut self, kind: &str, ns: &str, name: &str, uid: &str, owner: &str) -> Self {
            self.0.insert(
                (kind.into(), ns.into(), name.into()),
                ExistingObject {
                    uid: uid.into(),
                    controller_uid: None,
                    owner_label: Some(owner.into()),
                    resource_version: "5".into(),
                    protected: false,
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
            Ok(_) => vec![],
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
        c.owns[0] = OwnedKind::label(KindRef::namespaced("", "v1", "ConfigMap", "configmaps"));
        c.finalizer = Some("f".into());
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
    fn primary_fields_match_whole_segments_and_empty_objects_count() {
        let mut c = controller();
        c.primary_fields = vec!["metadata.labels.app".into(), "spec.id".into()];
        let v = |patch: Value| -> Vec<String> {
            let plan = Plan {
                primary_patch: Some(patch),
                ..Plan::default()
            };
            match validate(&plan, &c, &primary(), &World::default()) {
                Ok(_) => vec![],
                Err(vs) => vs.into_iter().map(|v| v.message).collect(),
            }
        };
        assert!(v(json!({"metadata": {"labels": {"app": "x"}}})).is_empty());
        assert_eq!(
            v(json!({"metadata": {"labels": {"app.kubernetes.io/name": "x"}}})),
            [
                "primaryPatch sets metadata.labels.app.kubernetes.io/name, which is not in primary-fields of controller widget"
            ]
        );
        assert_eq!(
            v(json!({"spec": {"idx": 1}})),
            ["primaryPatch sets spec.idx, which is not in primary-fields of controller widget"]
        );
        assert_eq!(
            v(json!({"spec": {"other": {}}})),
            ["primaryPatch sets spec.other, which is not in primary-fields of controller widget"]
        );
        assert!(v(json!({"spec": {"id": {}}})).is_empty());
    }

    /// A lookup that holds nothing and answers every object to create as
    /// unasked, while `existing` (what a read would find) knows `world`.
    struct Unasked(World);

    impl ExistingLookup for Unasked {
        fn existing(&self, kind: &KindRef, ns: Option<&str>, name: &str) -> Option<ExistingObject> {
            self.0.existing(kind, ns, name)
        }

        fn existing_before_create(&self, _: &KindRef, _: Option<&str>, _: &str) -> BeforeCreate {
            BeforeCreate::Unasked
        }
    }

    #[test]
    fn only_creates_fenced_as_absent_may_go_unasked() {
        let lookup = Unasked(World::default().with("ConfigMap", "ns", "a", "u-a", None));
        // No precondition (an apply fenced as absent) and `absent`: judged
        // absent without asking, and marked so.
        let mut plan = apply(vec![cm("ns", "a")]);
        let judged = validate(&plan, &controller(), &primary(), &lookup).unwrap();
        assert_eq!(judged.applies[0].existing, None);
        assert!(judged.applies[0].unasked);
        plan.apply[0].precondition = Some(Precondition::Absent);
        let judged = validate(&plan, &controller(), &primary(), &lookup).unwrap();
        assert!(judged.applies[0].unasked);
        // The plugin's resourceVersion would let the apply succeed on
        // whatever object is at that version: it is always looked up, and
        // someone else's object is refused before anything is written.
        plan.apply[0].precondition = Some(Precondition::ResourceVersion("5".into()));
        let vs = validate(&plan, &controller(), &primary(), &lookup).unwrap_err();
        assert_eq!(vs[0].rule, Rule::NotControlledByPrimary);
        // A lookup that asks (the default) never marks a judgement unasked.
        let world = World::default();
        let judged = validate(
            &apply(vec![cm("ns", "a")]),
            &controller(),
            &primary(),
            &world,
        )
        .unwrap();
        assert!(!judged.applies[0].unasked);
    }

    #[test]
    fn an_existing_object_nothing_controls_is_refused_unless_adoption_is_declared() {
        let world = World::default().with("ConfigMap", "ns", "a", "u-a", None);
        let plan = apply(vec![cm("ns", "a")]);
        let vs = validate(&plan, &controller(), &primary(), &world).unwrap_err();
        assert_eq!(vs[0].rule, Rule::NotControlledByPrimary);
        assert!(
            vs[0].message.contains("does not declare adoption"),
            "{}",
            vs[0].message
        );

        let mut adopting = controller();
        adopting.owns[0].adopt = true;
        let judged = validate(&plan, &adopting, &primary(), &world).unwrap();
        assert!(judged.applies[0].adopts);
        assert_eq!(
            judged.applies[0]
                .existing
                .as_ref()
                .unwrap()
                .resource_version,
            "5"
        );

        // Adoption never takes what something else controls.
        let owned_elsewhere = World::default().with("ConfigMap", "ns", "a", "u-a", Some("other"));
        assert!(validate(&plan, &adopting, &primary(), &owned_elsewhere).is_err());
        let labelled_elsewhere = World::default().labelled("ConfigMap", "ns", "a", "u-a", "other");
        assert!(validate(&plan, &adopting, &primary(), &labelled_elsewhere).is_err());
    }

    #[test]
    fn label_owned_objects_are_judged_by_the_owner_label() {
        let mut c = controller();
        c.owns[0] = OwnedKind::label(KindRef::namespaced("", "v1", "ConfigMap", "configmaps"))
            .extra_label("example.com/owner");
        c.finalizer = Some("example.com/f".into());
        c.write_namespaces = vec!["*".into()];
        let ours = World::default().labelled("ConfigMap", "other-ns", "a", "u-a", PRIMARY_UID);
        let plan = apply(vec![cm("other-ns", "a")]);
        let judged = validate(&plan, &c, &primary(), &ours).unwrap();
        assert!(!judged.applies[0].adopts);
        // Another primary's label, or a controller reference only, is not ours.
        let theirs = World::default().labelled("ConfigMap", "other-ns", "a", "u-a", "other");
        assert!(validate(&plan, &c, &primary(), &theirs).is_err());
        let by_ref = World::default().with("ConfigMap", "other-ns", "a", "u-a", Some(PRIMARY_UID));
        assert!(validate(&plan, &c, &primary(), &by_ref).is_err());
        // The plan may not set the owner labels itself.
        let mut forged = cm("other-ns", "b");
        forged["metadata"]["labels"] = json!({"example.com/owner": PRIMARY_UID});
        let vs = validate(&apply(vec![forged]), &c, &primary(), &World::default()).unwrap_err();
        assert_eq!(vs[0].rule, Rule::HostLabelForged);
        let mut forged = cm("other-ns", "b");
        forged["metadata"]["labels"] = json!({"wasmop.dev/owner-uid": "x"});
        let vs = validate(&apply(vec![forged]), &c, &primary(), &World::default()).unwrap_err();
        assert_eq!(vs[0].rule, Rule::HostLabelForged);
        // Deletes are judged the same way.
        let del = Plan {
            delete: vec![delete_cm("other-ns", "a", "u-a")],
            ..Plan::default()
        };
        assert!(validate(&del, &c, &primary(), &ours).is_ok());
        assert!(validate(&del, &c, &primary(), &theirs).is_err());
    }

    #[test]
    fn an_owner_reference_never_crosses_namespaces() {
        let mut c = controller();
        c.write_namespaces = vec!["other-ns".into()];
        let vs = validate(
            &apply(vec![cm("other-ns", "a")]),
            &c,
            &primary(),
            &World::default(),
        )
        .unwrap_err();
        assert_eq!(vs[0].rule, Rule::NamespaceNotAllowed);
        assert!(vs[0].message.contains("owner-label"), "{}", vs[0].message);
    }

    #[test]
    fn prepare_apply_marks_label_owned_objects_without_owner_references() {
        let owned = OwnedKind::label(KindRef::namespaced("", "v1", "ConfigMap", "configmaps"))
            .extra_label("example.com/owner");
        let out = prepare_apply(&cm("other-ns", "a"), &primary(), "widget", &owned);
        assert!(out["metadata"].get("ownerReferences").is_none());
        assert_eq!(
            out["metadata"]["labels"]["wasmop.dev/owner-uid"],
            PRIMARY_UID
        );
        assert_eq!(out["metadata"]["labels"]["example.com/owner"], PRIMARY_UID);
        assert_eq!(out["metadata"]["labels"]["wasmop.dev/plugin"], "widget");
    }

    #[test]
    fn protected_objects_are_never_deleted_and_plugins_cannot_unprotect_them() {
        let mut world = World::default().with("ConfigMap", "ns", "keep", "u1", Some(PRIMARY_UID));
        if let Some(o) = world
            .0
            .get_mut(&("ConfigMap".into(), "ns".into(), "keep".into()))
        {
            o.protected = true;
        }
        let plan = Plan {
            delete: vec![delete_cm("ns", "keep", "u1")],
            ..Plan::default()
        };
        let vs = validate(&plan, &controller(), &primary(), &world).unwrap_err();
        assert_eq!(vs.len(), 1, "{vs:?}");
        assert_eq!(vs[0].rule, Rule::ProtectedObject);
        assert!(vs[0].object.contains("keep"), "{}", vs[0].object);
        // Read from a live object's labels.
        let live = json!({"metadata": {"uid": "u1", "labels": {PROTECTED_LABEL: "true"}}});
        assert!(ExistingObject::of(&live).protected);
        let other = json!({"metadata": {"uid": "u1", "labels": {PROTECTED_LABEL: "false"}}});
        assert!(!ExistingObject::of(&other).protected);
        // A plugin may not set (or clear) the label itself.
        let mut obj = cm("ns", "keep");
        obj["metadata"]["labels"] = json!({PROTECTED_LABEL: "false"});
        let forged = Plan {
            apply: vec![ApplyOp {
                object: obj,
                precondition: None,
                force: true,
            }],
            ..Plan::default()
        };
        let vs = validate(&forged, &controller(), &primary(), &world).unwrap_err();
        assert!(vs.iter().any(|v| v.rule == Rule::HostLabelForged), "{vs:?}");
        // The primary itself, under delete-primary.
        let mut c = controller();
        c.delete_primary = true;
        let mut p = primary();
        p["metadata"]["labels"] = json!({PROTECTED_LABEL: "true"});
        let vs = validate(&delete_self(PRIMARY_UID), &c, &p, &World::default()).unwrap_err();
        assert_eq!(vs[0].rule, Rule::ProtectedObject, "{vs:?}");
    }

    #[test]
    fn gauges_are_checked_for_names_labels_values_and_count() {
        use wasmop_contract::Gauge;
        let g = |name: &str, labels: &[(&str, &str)], value: f64| Gauge {
            name: name.to_owned(),
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            value,
        };
        let good = Plan {
            gauges: vec![
                g("firebolt_rotation_pending", &[("step", "promote")], 1.0),
                g("firebolt_rotation_pending", &[("step", "retain")], 0.0),
                g("firebolt_lagging_engines", &[], 2.0),
            ],
            ..Plan::default()
        };
        assert!(check_gauges(&good).is_empty());
        let long = "x".repeat(MAX_GAUGE_LABEL_VALUE + 1);
        let many: Vec<(String, String)> = (0..=MAX_GAUGE_LABELS)
            .map(|i| (format!("l{i}"), "v".to_owned()))
            .collect();
        let many_refs: Vec<(&str, &str)> =
            many.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let bad = [
            g("1starts_with_a_digit", &[], 1.0),
            g("has-dash", &[], 1.0),
            g("wasmop_reconcile_seconds", &[], 1.0),
            g("workqueue_depth", &[], 1.0),
            g("my_events_total", &[], 1.0),
            g("my_gauge", &[], f64::NAN),
            g("my_gauge", &[], f64::INFINITY),
            g("my_gauge", &[("namespace", "other")], 1.0),
            g("my_gauge", &[("__name__", "x")], 1.0),
            g("my_gauge", &[("bad-key", "x")], 1.0),
            g("my_gauge", &[("k", long.as_str())], 1.0),
            g("my_gauge", &many_refs, 1.0),
        ];
        for gauge in bad {
            let plan = Plan {
                gauges: vec![gauge.clone()],
                ..Plan::default()
            };
            let v = check_gauges(&plan);
            assert_eq!(v.len(), 1, "{gauge:?}");
            assert_eq!(v[0].rule, Rule::GaugeInvalid);
        }
        let twice = Plan {
            gauges: vec![g("a", &[("k", "v")], 1.0), g("a", &[("k", "v")], 2.0)],
            ..Plan::default()
        };
        assert_eq!(check_gauges(&twice).len(), 1);
        let flood = Plan {
            gauges: (0..=MAX_GAUGES)
                .map(|i| g("a", &[("i", &i.to_string())], 1.0))
                .collect(),
            ..Plan::default()
        };
        let v = check_gauges(&flood);
        assert_eq!(v.len(), 1);
        assert!(v[0].message.contains("gauges"), "{}", v[0].message);
    }

    #[test]
    fn collected_label_owned_objects_get_a_gc_reference_only_at_home() {
        let owned =
            OwnedKind::label(KindRef::namespaced("", "v1", "ConfigMap", "configmaps")).collected();
        let home = object::namespace(&primary())
            .expect("namespaced primary")
            .to_owned();
        let out = prepare_apply(&cm(&home, "a"), &primary(), "widget", &owned);
        assert_eq!(
            out["metadata"]["ownerReferences"],
            json!([{"apiVersion": "test.wasmop.dev/v1", "kind": "Widget", "name": "w",
                    "uid": PRIMARY_UID, "controller": false, "blockOwnerDeletion": false}])
        );
        assert_eq!(
            out["metadata"]["labels"]["wasmop.dev/owner-uid"],
            PRIMARY_UID
        );
        // Still judged by the label: the reference is not a controller.
        let existing = ExistingObject::of(&out);
        assert!(existing.is_controlled_by(PRIMARY_UID, &owned.ownership));
        let away = prepare_apply(&cm("other-ns", "a"), &primary(), "widget", &owned);
        assert!(away["metadata"].get("ownerReferences").is_none());
        assert_eq!(
            away["metadata"]["labels"]["wasmop.dev/owner-uid"],
            PRIMARY_UID
        );
        // The manifest JSON names it only when set.
        let json = serde_json::to_value(&owned.ownership).expect("serializes");
        assert_eq!(json["ownerLabel"]["collected"], true);
        let plain = serde_json::to_value(
            &OwnedKind::label(KindRef::namespaced("", "v1", "ConfigMap", "configmaps")).ownership,
        )
        .expect("serializes");
        assert!(plain["ownerLabel"].get("collected").is_none(), "{plain}");
    }

    #[test]
    fn http_requests_must_name_declared_targets_and_ports() {
        let mut c = controller();
        c.http_targets = vec![HttpTarget {
            id: "members".into(),
            kind: KindRef::namespaced("", "v1", "Pod", "pods"),
            ports: vec![8080],
        }];
        let req = |target: &str, port: u16| {
            let mut r = HttpRequest::get(
                &format!("{target}-{port}"),
                target,
                "pod-0",
                port,
                "/healthz",
            );
            r.method = HttpMethod::Get;
            r
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
            &OwnedKind::reference(KindRef::namespaced("", "v1", "ConfigMap", "configmaps")),
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

    #[test]
    fn dependents_are_deleted_only_when_an_owned_object_controls_them() {
        // The Pods of a StatefulSet the primary owns.
        let mut c = controller();
        c.owns.push(OwnedKind::dependent(KindRef::namespaced(
            "", "v1", "Pod", "pods",
        )));
        let owned_set = Arc::new(json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": "s", "namespace": "ns", "uid": "u-set"}}));
        let pod = |controller: Option<&str>| {
            World::default().with("Pod", "ns", "s-0", "u-pod", controller)
        };
        let delete_pod = |uid: &str| Plan {
            delete: vec![DeleteOp {
                target: ObjectRef {
                    api_version: "v1".into(),
                    kind: "Pod".into(),
                    namespace: "ns".into(),
                    name: "s-0".into(),
                },
                uid: uid.into(),
                resource_version: "1".into(),
            }],
            ..Plan::default()
        };
        let owned = [owned_set];
        let check = |plan: &Plan, world: &World| {
            validate_with_owned(plan, &c, &primary(), world, &owned)
                .err()
                .unwrap_or_default()
                .iter()
                .map(|v| v.rule.as_str())
                .collect::<Vec<_>>()
        };
        assert!(check(&delete_pod("u-pod"), &pod(Some("u-set"))).is_empty());
        // Controlled by something the primary does not own, by the primary
        // itself, or by nothing: refused.
        assert_eq!(
            check(&delete_pod("u-pod"), &pod(Some("u-other"))),
            ["NotControlledByPrimary"]
        );
        assert_eq!(
            check(&delete_pod("u-pod"), &pod(Some(PRIMARY_UID))),
            ["NotControlledByPrimary"]
        );
        assert_eq!(
            check(&delete_pod("u-pod"), &pod(None)),
            ["NotControlledByPrimary"]
        );
        // Without the owned object in the snapshot, nothing vouches for it.
        assert!(validate(&delete_pod("u-pod"), &c, &primary(), &pod(Some("u-set"))).is_err());
        // The uid precondition still holds; a missing Pod is reported.
        assert_eq!(
            check(&delete_pod("u-old"), &pod(Some("u-set"))),
            ["UidMismatch"]
        );
        assert_eq!(
            check(&delete_pod("u-pod"), &World::default()),
            ["DeleteTargetMissing"]
        );
        // A plan never applies a dependent.
        let apply_pod = apply(vec![json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "s-9", "namespace": "ns"}})]);
        assert_eq!(check(&apply_pod, &World::default()), ["KindNotOwned"]);
    }
}
