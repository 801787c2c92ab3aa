//! The wasmop contract's JSON types, defined once for both sides.
//!
//! The WIT package `wasmop:reconciler` (`wit/reconciler.wit`) describes the
//! calls between the host and a plugin. What a plugin *returns* — its
//! [`Manifest`], its settings problems and its [`Plan`] — crosses that
//! boundary as one JSON text each, in the shape of the types here. The host
//! parses that text with these same types and the SDK serializes it with
//! them, so the two sides cannot drift: there is no second copy.
//!
//! Why JSON text and not WIT records: a WIT list of records is lifted into
//! host memory element by element, and list entries may alias the same guest
//! bytes, so a small guest could make the host allocate gigabytes. One text
//! is at most as large as the guest's memory, and the host checks how many
//! JSON values it holds before parsing it (see the host's
//! `reconcile::bounds`).
//!
//! Snapshots go the other way (host → plugin) as typed WIT records; each
//! side keeps its own snapshot representation (the host shares `Arc`s, the
//! SDK owns values), and [`Observation`] is their common JSON form.
//!
//! Modules, one concept each:
//!
//! - [`manifest`] — what a plugin declares: [`Manifest`], [`Controller`],
//!   [`OwnedKind`] and its [`Ownership`], [`Read`], [`HttpTarget`].
//! - [`plan`] — what a reconcile answers: [`Plan`] and its operations,
//!   with builder methods.
//! - [`observation`] — the result of an earlier HTTP request.
//! - [`error`] — [`ReconcileError`] and [`SettingsProblem`].
//! - [`admission`] — what a plugin admits ([`AdmissionRule`]) and answers
//!   ([`AdmissionResponse`]) through its optional `admit` export.
//!
//! This crate depends on `serde` and `serde_json` only (plus `k8s-openapi`
//! behind the `k8s` feature, for [`KindRef::of`]); it builds for
//! `wasm32-unknown-unknown`, `wasm32-wasip2` and natively.

#![warn(missing_docs)]

pub mod admission;
pub mod error;
pub mod manifest;
pub mod observation;
pub mod plan;

pub use admission::{AdmissionOperation, AdmissionRead, AdmissionResponse, AdmissionRule};
pub use error::{ReconcileError, SettingsProblem};
pub use manifest::{
    Controller, FieldRef, HttpTarget, KindRef, Manifest, OwnedKind, Ownership, Read,
    SETTING_PREFIX, Scope, Selector, split_api_version,
};
pub use observation::{Observation, ObservationOutcome};
pub use plan::{
    ApplyOp, CaBundle, DeleteOp, Event, EventType, Gauge, GeneratedKey, HttpMethod, HttpRequest,
    ObjectPlan, ObjectRef, Plan, Precondition, RequestTarget, SecretEncoding, SecretHeader,
};

/// The WIT package this crate's types belong to.
pub const WIT_PACKAGE: &str = "wasmop:reconciler@0.4.0";

/// The label the host sets on every object it writes: `app.kubernetes.io/managed-by`.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// The value of [`MANAGED_BY_LABEL`].
pub const MANAGED_BY_VALUE: &str = "wasmop";
/// The label naming the plugin that wrote an object.
pub const PLUGIN_LABEL: &str = "wasmop.dev/plugin";
/// The label holding the UID of the primary that owns an object under
/// [`Ownership::OwnerLabel`].
pub const OWNER_UID_LABEL: &str = "wasmop.dev/owner-uid";
/// The read id under which a snapshot lists the controller's optional kinds
/// (see [`Read::optional`](Read#structfield.optional) and
/// [`OwnedKind::optional`](OwnedKind#structfield.optional)) that are not
/// listed, because the API server does not serve them (yet): one object
/// `{"apiVersion":"wasmop.dev/v1","kind":"AbsentKind","metadata":{"name":
/// "<plural>.<group>"},"spec":{"group","version","kind","plural"}}` each.
pub const ABSENT_KIND_READ: &str = "wasmop.dev/absent-kinds";
/// The read id under which a snapshot carries the typed outcomes of its
/// observations across the WIT boundary (see
/// [`observation::ObservationOutcome`]); reserved like [`ABSENT_KIND_READ`].
pub const OBSERVATION_OUTCOMES_READ: &str = "wasmop.dev/observation-outcomes";

/// `apiVersion` of the primary a kind-scoped controller's snapshot holds
/// (see [`Scope::Kind`]).
pub const KIND_SNAPSHOT_API_VERSION: &str = "v1";
/// `kind` of the primary a kind-scoped controller's snapshot holds: a
/// `{"apiVersion":"v1","kind":"List","items":[…]}` of every primary of the
/// kind that is not being deleted without the controller's finalizer,
/// sorted by namespace and name.
pub const KIND_SNAPSHOT_KIND: &str = "List";

/// The string at a dotted path of a JSON object (`metadata.name`), if any.
pub fn str_at<'a>(object: &'a serde_json::Value, dotted: &str) -> Option<&'a str> {
    dotted
        .split('.')
        .try_fold(object, |v, key| v.get(key))
        .and_then(serde_json::Value::as_str)
}

/// `Kind namespace/name`, or `Kind name` without a namespace: how the
/// contract names an object in messages.
pub fn describe_parts(kind: &str, namespace: Option<&str>, name: &str) -> String {
    let kind = if kind.is_empty() { "object" } else { kind };
    let name = if name.is_empty() { "(unnamed)" } else { name };
    match namespace.filter(|ns| !ns.is_empty()) {
        Some(ns) => format!("{kind} {ns}/{name}"),
        None => format!("{kind} {name}"),
    }
}
