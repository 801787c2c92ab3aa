//! What one reconcile answers: [`Plan`], built with chained methods.
//!
//! ```
//! use std::time::Duration;
//! use wasmop_contract::Plan;
//! use serde_json::json;
//!
//! let config = json!({"apiVersion": "v1", "kind": "ConfigMap",
//!                     "metadata": {"name": "w-cm", "namespace": "ns"}});
//! let plan = Plan::new()
//!     .apply(&config)
//!     .status(json!({"phase": "Ready"}))
//!     .event("Configured", "wrote w-cm")
//!     .requeue_after(Duration::from_secs(30));
//! assert_eq!(plan.apply.len(), 1);
//! assert_eq!(plan.requeue_after_ms, Some(30_000));
//! ```
//!
//! # JSON shape
//!
//! The serde form of [`Plan`] is the text a plugin returns, the plan
//! `wasmop plan` prints and the live operator logs: camelCase fields, every
//! list present even when empty, `null` for absent options. When read,
//! missing fields take their empty values.
//!
//! ```json
//! {"apply":[{"object":{…},"precondition":null,"force":false,
//!            "generate":[{"key":"password","bytes":32,"encoding":"hex"}]}],
//!  "delete":[{"target":{"apiVersion":"v1","kind":"ConfigMap","namespace":"ns","name":"n"},
//!             "uid":"…","resourceVersion":"…"}],
//!  "status":{…}, "primaryPatch":null,
//!  "events":[{"type":"Normal","reason":"…","message":"…"}],
//!  "requeueAfterMs":1000, "cleanupComplete":false,
//!  "httpRequests":[{"id":"…","target":{"declared":{"id":"members","object":"pod-0"}},"port":8080,…}]}
//! ```

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ReconcileError;

/// Whatever holds the primary a plan is computed for: the SDK's snapshot,
/// or the primary object itself.
pub trait PrimaryObject {
    /// The primary object as JSON.
    fn primary_object(&self) -> &Value;
}

impl PrimaryObject for Value {
    fn primary_object(&self) -> &Value {
        self
    }
}

/// What the plugin wants done for one primary.
///
/// JSON: `{"apply":[…],"delete":[…],"status":{…}|null,"primaryPatch":{…}|null,
/// "events":[…],"requeueAfterMs":n|null,"cleanupComplete":bool,"httpRequests":[…],
/// "gauges":[…],"holdObservedGeneration":true}` (`gauges` omitted when
/// empty, `holdObservedGeneration` when false).
/// When read from JSON, missing fields take their empty values.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Plan {
    /// Objects to create or update by server-side apply.
    pub apply: Vec<ApplyOp>,
    /// Owned objects to delete.
    pub delete: Vec<DeleteOp>,
    /// The primary's new `.status`; `None` leaves it as is.
    pub status: Option<Value>,
    /// Fields of the primary to set (only `primary-fields` of the manifest).
    pub primary_patch: Option<Value>,
    /// Events to record on the primary.
    pub events: Vec<Event>,
    /// Reconcile again after this many milliseconds (the host waits at
    /// least its floor, 1 s by default, also for 0).
    pub requeue_after_ms: Option<u64>,
    /// While deleting: cleanup is done and the finalizer may be removed.
    pub cleanup_complete: bool,
    /// HTTP requests for the host to perform after the writes.
    pub http_requests: Vec<HttpRequest>,
    /// Gauges the host exposes on its `/metrics` for this primary, labelled
    /// with the controller and the primary's namespace and name. Each
    /// executed plan replaces the primary's previous set (an empty list
    /// clears it); they go when the primary does. Omitted from JSON when
    /// empty.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub gauges: Vec<Gauge>,
    /// The answer of a kind-scoped controller (see
    /// [`Scope::Kind`](crate::manifest::Scope::Kind)): one plan per
    /// primary, each naming its primary. A kind plan holds nothing but
    /// `objects`; a per-object plan holds no `objects`. Omitted from JSON
    /// when empty.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub objects: Vec<ObjectPlan>,
    /// True when this plan has not yet applied the primary's current
    /// generation (say, a change still being synced with an outside
    /// system): the host then leaves `status.observedGeneration` as the
    /// primary has it (absent stays absent; a value the plugin's `status`
    /// sets is ignored) instead of setting it to `metadata.generation`. False,
    /// the default and what a plan without the field means, sets it on
    /// every clean pass, as before. JSON `holdObservedGeneration`, omitted
    /// when false.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub hold_observed_generation: bool,
}

/// The plan for one primary inside a kind plan.
///
/// JSON: `{"namespace":"…","name":"…","uid":"…", <the fields of a Plan>}`
/// (`namespace` empty or missing for cluster-scoped primaries). The uid
/// must be the primary's as the snapshot showed it; the host refuses an
/// object plan naming a primary that is not in the snapshot.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectPlan {
    /// The primary's namespace (empty for a cluster-scoped one).
    #[serde(default)]
    pub namespace: String,
    /// The primary's name.
    pub name: String,
    /// The primary's uid.
    pub uid: String,
    /// What to do for it.
    #[serde(flatten)]
    pub plan: Plan,
}

impl ObjectPlan {
    /// The plan `plan` for `primary` (its namespace, name and uid are
    /// taken from its metadata).
    pub fn new(primary: &Value, plan: Plan) -> Self {
        let text = |key: &str| {
            primary
                .pointer(&format!("/metadata/{key}"))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        ObjectPlan {
            namespace: text("namespace"),
            name: text("name"),
            uid: text("uid"),
            plan,
        }
    }
}

/// One gauge value for the host's `/metrics`.
///
/// JSON: `{"name","labels":{…},"value":n}`. The name is a Prometheus
/// metric name of the plugin's own (not `wasmop_`, `controller_runtime_`,
/// `workqueue_` or `rest_client_`, not ending in `_total`); label keys are
/// Prometheus label names other than `controller`, `namespace` and `name`,
/// which the host sets.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Gauge {
    /// Metric name, e.g. `firebolt_instance_signing_key_rotation_pending`.
    pub name: String,
    /// Extra labels.
    #[serde(default)]
    pub labels: std::collections::BTreeMap<String, String>,
    /// The value (finite).
    pub value: f64,
}

impl Gauge {
    /// A gauge named `name` with these extra labels and value.
    #[must_use]
    pub fn new(name: &str, labels: &[(&str, &str)], value: f64) -> Self {
        Self {
            name: name.to_owned(),
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            value,
        }
    }
}

/// Create or update one object.
///
/// JSON: `{"object":{…},"precondition":null|{"absent":true}|{"resourceVersion":"…"},"force":false}`
/// (a missing `force` reads as `false`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApplyOp {
    /// The desired object (apiVersion, kind, metadata.name, and
    /// metadata.namespace for namespaced kinds).
    pub object: Value,
    /// What must hold of the current object for the plan to be written.
    pub precondition: Option<Precondition>,
    /// Take ownership of fields another field manager set (server-side
    /// apply with `force=true`) instead of failing on the conflict. An
    /// [`Precondition::Absent`] create ignores it.
    #[serde(default)]
    pub force: bool,
    /// Keys of this `v1` Secret whose values the host makes: random bytes,
    /// written once and never again (see [`GeneratedKey`]). Omitted from
    /// JSON when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub generate: Vec<GeneratedKey>,
}

/// A key of a Secret whose value the host generates: `bytes` random bytes
/// from the operating system's generator, written as `encoding`.
///
/// JSON: `{"key":"password","bytes":32,"encoding":"hex"}` (`encoding`
/// `hex`, the default when missing, `base64url` without padding, or
/// `raw`).
///
/// # Guarantees (kept by the host)
///
/// - The value is made only by the host, at execution, never by the
///   plugin: plans, `wasmop plan`, recordings, replays and shadows carry
///   the key's name, never a value, so they stay deterministic.
/// - It is written once, while the Secret lacks the key: right after the
///   create, or later if the key went missing (a crash between the create
///   and the fill, a person deleting the key). The fill is a separate
///   write under the field manager `<plugin manager>-generated`, fenced by
///   the resourceVersion at which the key was seen missing, so it never
///   overwrites a value: an object that changed meanwhile is a conflict.
/// - Later applies never rewrite or remove it: the plugin's field manager
///   never owns the key (the plugin may not set it), so neither a forced
///   apply nor an apply that leaves it out touches it, and the
///   `wasmop.dev/applied` digest is taken over the body without it.
/// - The value never appears in a log line, Event or condition.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GeneratedKey {
    /// The key in the Secret's `data`.
    pub key: String,
    /// How many random bytes (16 to 1024).
    pub bytes: u16,
    /// How the bytes are written as the key's value.
    #[serde(default)]
    pub encoding: SecretEncoding,
}

impl GeneratedKey {
    /// `bytes` random bytes written as lowercase hex (`2 × bytes`
    /// characters): safe in environment variables, URLs and config files.
    pub fn hex(key: &str, bytes: u16) -> Self {
        GeneratedKey {
            key: key.to_owned(),
            bytes,
            encoding: SecretEncoding::Hex,
        }
    }

    /// The same key with another encoding.
    #[must_use]
    pub fn encoded(mut self, encoding: SecretEncoding) -> Self {
        self.encoding = encoding;
        self
    }
}

/// How generated bytes are written. JSON: `"hex"`, `"base64url"`, `"raw"`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SecretEncoding {
    /// Lowercase hexadecimal.
    #[default]
    Hex,
    /// URL-safe base64 without padding.
    Base64url,
    /// The bytes themselves (for binary keys; not for passwords).
    Raw,
}

/// A condition an apply requires of the current object.
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

/// The JSON form of [`Precondition`].
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
    type Error = String;

    fn try_from(p: PreconditionJson) -> Result<Self, String> {
        match (p.absent, p.resource_version) {
            (Some(true), None) => Ok(Precondition::Absent),
            (None, Some(rv)) => Ok(Precondition::ResourceVersion(rv)),
            _ => Err(
                "a precondition is either {\"absent\":true} or {\"resourceVersion\":\"…\"}"
                    .to_owned(),
            ),
        }
    }
}

/// The identity of one existing object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    /// `apiVersion`, e.g. `apps/v1`.
    pub api_version: String,
    /// Kind.
    pub kind: String,
    /// Namespace, empty for cluster-scoped objects (a missing field reads
    /// as empty).
    #[serde(default)]
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl std::fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&crate::describe_parts(
            &self.kind,
            Some(self.namespace.as_str()),
            &self.name,
        ))
    }
}

/// Delete one owned object if it is still the one the plugin saw.
///
/// JSON: `{"target":{"apiVersion","kind","namespace","name"},"uid","resourceVersion"}`.
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

impl DeleteOp {
    /// The delete of `seen`, an object as it appears in the snapshot, with
    /// its uid and resourceVersion as preconditions.
    ///
    /// # Errors
    ///
    /// [`ReconcileError::Internal`] when `seen` lacks apiVersion, kind,
    /// metadata.name, metadata.uid or metadata.resourceVersion (objects from a
    /// snapshot always have them).
    pub fn of(seen: &Value) -> Result<Self, ReconcileError> {
        let field = |path: &[&str]| -> Result<String, ReconcileError> {
            let s = path_str(seen, path);
            if s.is_empty() {
                Err(ReconcileError::internal(format!(
                    "cannot delete {} {}: it has no {}",
                    path_str(seen, &["kind"]),
                    path_str(seen, &["metadata", "name"]),
                    path.join(".")
                )))
            } else {
                Ok(s.to_owned())
            }
        };
        Ok(DeleteOp {
            target: ObjectRef {
                api_version: field(&["apiVersion"])?,
                kind: field(&["kind"])?,
                namespace: path_str(seen, &["metadata", "namespace"]).to_owned(),
                name: field(&["metadata", "name"])?,
            },
            uid: field(&["metadata", "uid"])?,
            resource_version: field(&["metadata", "resourceVersion"])?,
        })
    }
}

/// Kind of an Event. JSON: `"Normal"` or `"Warning"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventType {
    /// Something worth knowing happened.
    Normal,
    /// Something went wrong or needs attention.
    Warning,
}

/// An Event to record on the primary.
///
/// JSON: `{"type":"Normal"|"Warning","reason","message"}`.
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

/// HTTP method of a request. JSON: `"GET"`, `"POST"`,
/// `"PUT"`, `"PATCH"`, `"DELETE"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum HttpMethod {
    /// Read-only.
    Get,
    /// Mutating.
    Post,
    /// Mutating.
    Put,
    /// Mutating (a partial update).
    Patch,
    /// Mutating.
    Delete,
}

/// What an [`HttpRequest`] calls.
///
/// JSON: `{"declared":{"id":"members","object":"pod-0"}}` or
/// `{"allowList":{"baseUrl":"http://127.0.0.1:8080"}}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum RequestTarget {
    /// An object of an `http-target` the controller declares.
    #[serde(rename_all = "camelCase")]
    Declared {
        /// The `HttpTarget::id` from the manifest.
        id: String,
        /// Name of the Pod or Service, in the primary's namespace.
        object: String,
    },
    /// A base URL on the operator's allow-list (`wasmop run --allow-url`).
    #[serde(rename_all = "camelCase")]
    AllowList {
        /// `http://host[:port][/base]`.
        base_url: String,
    },
}

impl std::fmt::Display for RequestTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RequestTarget::Declared { id, object } => write!(f, "{id}/{object}"),
            RequestTarget::AllowList { base_url } => write!(f, "{base_url}"),
        }
    }
}

/// A header whose value the host reads from a Secret.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SecretHeader {
    /// Header name, e.g. `Authorization`.
    pub name: String,
    /// Secret name in the primary's namespace.
    pub secret: String,
    /// Key in the Secret's data.
    pub key: String,
    /// Text put before the value, e.g. `Bearer `.
    pub prefix: String,
}

/// An HTTP request for the host to perform; its result
/// comes back as an [`crate::Observation`] with the same id.
///
/// JSON: `{"id","target":{…},"port","method","path","body":"text",
/// "headers":[["k","v"]],"secretHeaders":[…],"timeoutMs","maxResponseBytes","maxAgeMs"}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpRequest {
    /// Id of the result; a new request with the same id replaces the old
    /// result.
    pub id: String,
    /// What is called.
    pub target: RequestTarget,
    /// Port of a declared target; for an allow-listed base URL, 0 or the
    /// URL's own port.
    pub port: u16,
    /// Method.
    pub method: HttpMethod,
    /// Path and query, starting with `/`.
    pub path: String,
    /// Request body (text).
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
    /// Largest response body kept, in bytes (0: host default).
    #[serde(default)]
    pub max_response_bytes: u32,
    /// Results older than this (ms) are dropped (0, or more than the host's
    /// maximum: the host's maximum age, 1 h by default).
    #[serde(default)]
    pub max_age_ms: u64,
    /// For an `https` URL: certificates trusted besides the system's roots
    /// (none: the system's roots only). Ignored for `http`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_bundle: Option<CaBundle>,
}

/// PEM certificates an `https` request trusts besides the system's roots.
///
/// JSON: `{"pem":"-----BEGIN CERTIFICATE-----…"}` or
/// `{"secret":{"name":"terdut-ca","key":"ca.crt"}}` (a Secret in the
/// primary's namespace, which its snapshot must hold).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum CaBundle {
    /// The certificates themselves (they are public; no Secret needed).
    Pem(String),
    /// A key of a Secret in the primary's namespace holding them.
    Secret {
        /// Secret name.
        name: String,
        /// Key in its data.
        key: String,
    },
}

impl HttpRequest {
    /// A request to `object` (a Pod or Service) of the declared http-target
    /// `target`, with an empty body, no headers and host defaults for the
    /// limits.
    pub fn new(
        id: &str,
        method: HttpMethod,
        target: &str,
        object: &str,
        port: u16,
        path: &str,
    ) -> Self {
        HttpRequest::to(
            id,
            method,
            RequestTarget::Declared {
                id: target.to_owned(),
                object: object.to_owned(),
            },
            port,
            path,
        )
    }

    /// A request to a base URL on the operator's allow-list (its port is
    /// the URL's).
    pub fn allow_listed(id: &str, method: HttpMethod, base_url: &str, path: &str) -> Self {
        HttpRequest::to(
            id,
            method,
            RequestTarget::AllowList {
                base_url: base_url.to_owned(),
            },
            0,
            path,
        )
    }

    /// A request to any [`RequestTarget`].
    pub fn to(id: &str, method: HttpMethod, target: RequestTarget, port: u16, path: &str) -> Self {
        HttpRequest {
            id: id.to_owned(),
            target,
            port,
            method,
            path: path.to_owned(),
            body: String::new(),
            headers: Vec::new(),
            secret_headers: Vec::new(),
            timeout_ms: 0,
            max_response_bytes: 0,
            max_age_ms: 0,
            ca_bundle: None,
        }
    }

    /// A GET request.
    pub fn get(id: &str, target: &str, object: &str, port: u16, path: &str) -> Self {
        HttpRequest::new(id, HttpMethod::Get, target, object, port, path)
    }

    /// Sets the body.
    pub fn body(mut self, body: impl Into<String>) -> Self {
        self.body = body.into();
        self
    }

    /// Adds a plain header.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Adds a header whose value is `prefix` followed by `key` of Secret `secret`.
    pub fn secret_header(mut self, name: &str, secret: &str, key: &str, prefix: &str) -> Self {
        self.secret_headers.push(SecretHeader {
            name: name.to_owned(),
            secret: secret.to_owned(),
            key: key.to_owned(),
            prefix: prefix.to_owned(),
        });
        self
    }

    /// Sets the deadline (rounded down to ms, saturating).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout_ms = u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX);
        self
    }

    /// Sets the largest response body kept.
    pub fn max_response_bytes(mut self, bytes: u32) -> Self {
        self.max_response_bytes = bytes;
        self
    }

    /// Sets the age after which the result is dropped from snapshots.
    pub fn max_age(mut self, age: Duration) -> Self {
        self.max_age_ms = millis(age);
        self
    }
}

impl Plan {
    /// An empty plan: writes nothing, deletes nothing, leaves status alone.
    pub fn new() -> Self {
        Plan::default()
    }

    /// True when the plan asks for nothing at all.
    pub fn is_empty(&self) -> bool {
        *self == Plan::default()
    }

    /// Adds the plan for one primary of a kind-scoped controller's call
    /// (see [`ObjectPlan`]); `primary` is the item of the snapshot's
    /// primary list it is for.
    pub fn object(mut self, primary: &Value, plan: Plan) -> Self {
        self.objects.push(ObjectPlan::new(primary, plan));
        self
    }

    /// Applies `object` (a `serde_json::Value` or any serializable type, such
    /// as a `k8s-openapi` object) with no precondition.
    ///
    /// # Panics
    ///
    /// When `object` fails to serialize to JSON, which `Value` and the
    /// `k8s-openapi` types never do.
    pub fn apply(self, object: impl Serialize) -> Self {
        self.apply_with(object, None)
    }

    /// Applies `object` only if it does not exist yet (create only).
    ///
    /// # Panics
    ///
    /// As [`Plan::apply`].
    pub fn apply_if_absent(self, object: impl Serialize) -> Self {
        self.apply_with(object, Some(Precondition::Absent))
    }

    /// Applies `object` only if the current one is at `resource_version`.
    ///
    /// # Panics
    ///
    /// As [`Plan::apply`].
    pub fn apply_at(self, object: impl Serialize, resource_version: impl Into<String>) -> Self {
        self.apply_with(
            object,
            Some(Precondition::ResourceVersion(resource_version.into())),
        )
    }

    /// Applies `object` with no precondition, taking ownership of any field
    /// another field manager set (server-side apply `force=true`). Without
    /// `force`, such a field fails the apply and the reconcile.
    ///
    /// # Panics
    ///
    /// As [`Plan::apply`].
    pub fn apply_forced(mut self, object: impl Serialize) -> Self {
        self = self.apply_with(object, None);
        if let Some(op) = self.apply.last_mut() {
            op.force = true;
        }
        self
    }

    /// Applies the `v1` Secret `object` (no precondition) and has the host
    /// fill each of `keys` with random bytes once (see [`GeneratedKey`]).
    /// `object` must not set those keys itself; keep the apply in every
    /// plan, so a key that went missing is filled again.
    ///
    /// ```
    /// use wasmop_contract::{GeneratedKey, Plan};
    /// use serde_json::json;
    /// let secret = json!({"apiVersion": "v1", "kind": "Secret",
    ///                     "metadata": {"name": "db-creds", "namespace": "ns"},
    ///                     "data": {"username": "YXBw"}});
    /// let plan = Plan::new().apply_generating(&secret, [GeneratedKey::hex("password", 32)]);
    /// assert_eq!(serde_json::to_value(&plan.apply[0]).unwrap()["generate"],
    ///            json!([{"key": "password", "bytes": 32, "encoding": "hex"}]));
    /// ```
    ///
    /// # Panics
    ///
    /// As [`Plan::apply`].
    pub fn apply_generating(
        mut self,
        object: impl Serialize,
        keys: impl IntoIterator<Item = GeneratedKey>,
    ) -> Self {
        self = self.apply_with(object, None);
        if let Some(op) = self.apply.last_mut() {
            op.generate = keys.into_iter().collect();
        }
        self
    }

    fn apply_with(mut self, object: impl Serialize, precondition: Option<Precondition>) -> Self {
        self.apply.push(ApplyOp {
            object: to_json(object),
            precondition,
            force: false,
            generate: Vec::new(),
        });
        self
    }

    /// Deletes `seen`, an owned object as the snapshot showed it; its uid and
    /// resourceVersion become the delete's preconditions.
    ///
    /// # Errors
    ///
    /// As [`DeleteOp::of`].
    ///
    /// # Panics
    ///
    /// As [`Plan::apply`].
    pub fn delete_owned(mut self, seen: impl Serialize) -> Result<Self, ReconcileError> {
        self.delete.push(DeleteOp::of(&to_json(seen))?);
        Ok(self)
    }

    /// Deletes the snapshot's primary itself, with its uid and
    /// resourceVersion as preconditions. The host accepts it only from a
    /// controller declared with [`crate::Controller::delete_primary`]; it
    /// runs after the plan's other writes, and the plan's status is not
    /// written once the primary is deleted.
    ///
    /// # Errors
    ///
    /// As [`DeleteOp::of`].
    pub fn delete_self(mut self, snapshot: &impl PrimaryObject) -> Result<Self, ReconcileError> {
        self.delete.push(DeleteOp::of(snapshot.primary_object())?);
        Ok(self)
    }

    /// Adds a delete operation built by hand.
    pub fn delete(mut self, op: DeleteOp) -> Self {
        self.delete.push(op);
        self
    }

    /// Sets the primary's new `.status`.
    ///
    /// # Panics
    ///
    /// As [`Plan::apply`].
    pub fn status(mut self, status: impl Serialize) -> Self {
        self.status = Some(to_json(status));
        self
    }

    /// Sets fields of the primary (paths the manifest lists in
    /// `primary-fields`), e.g. `json!({"spec": {"id": "…"}})`.
    ///
    /// # Panics
    ///
    /// As [`Plan::apply`].
    pub fn primary_patch(mut self, patch: impl Serialize) -> Self {
        self.primary_patch = Some(to_json(patch));
        self
    }

    /// Records a Normal event.
    pub fn event(self, reason: &str, message: impl Into<String>) -> Self {
        self.event_of(EventType::Normal, reason, message)
    }

    /// Records a Warning event.
    pub fn warning(self, reason: &str, message: impl Into<String>) -> Self {
        self.event_of(EventType::Warning, reason, message)
    }

    fn event_of(mut self, event_type: EventType, reason: &str, message: impl Into<String>) -> Self {
        self.events.push(Event {
            event_type,
            reason: reason.to_owned(),
            message: message.into(),
        });
        self
    }

    /// Asks to be reconciled again after `after` (ms precision, saturating;
    /// the host waits at least its floor, 1 s by default).
    pub fn requeue_after(mut self, after: Duration) -> Self {
        self.requeue_after_ms = Some(millis(after));
        self
    }

    /// Declares cleanup complete: the host may remove the finalizer.
    pub fn cleanup_complete(mut self) -> Self {
        self.cleanup_complete = true;
        self
    }

    /// Says the primary's current generation is not applied yet: the host
    /// keeps `status.observedGeneration` where it was (see
    /// [`Plan::hold_observed_generation`](Plan#structfield.hold_observed_generation)).
    ///
    /// ```
    /// use wasmop_contract::Plan;
    /// let plan = Plan::new().not_yet_applied();
    /// assert!(plan.hold_observed_generation);
    /// assert_eq!(serde_json::to_value(&plan).unwrap()["holdObservedGeneration"], true);
    /// assert!(!serde_json::from_str::<Plan>("{}").unwrap().hold_observed_generation);
    /// ```
    pub fn not_yet_applied(mut self) -> Self {
        self.hold_observed_generation = true;
        self
    }

    /// Adds an HTTP request.
    pub fn http(mut self, request: HttpRequest) -> Self {
        self.http_requests.push(request);
        self
    }

    /// Adds a GET request with host defaults (see [`HttpRequest::get`]).
    pub fn http_get(self, id: &str, target: &str, object: &str, port: u16, path: &str) -> Self {
        self.http(HttpRequest::get(id, target, object, port, path))
    }

    /// Sets a gauge for this primary (see [`Plan::gauges`]).
    pub fn gauge(mut self, name: &str, labels: &[(&str, &str)], value: f64) -> Self {
        self.gauges.push(Gauge::new(name, labels, value));
        self
    }
}

/// The string at `path` of `value`, empty when missing.
fn path_str<'a>(value: &'a Value, path: &[&str]) -> &'a str {
    path.iter()
        .try_fold(value, |v, key| v.get(key))
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn to_json(value: impl Serialize) -> Value {
    match serde_json::to_value(value) {
        Ok(v) => v,
        Err(e) => panic!("wasmop-sdk: object does not serialize to JSON: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use serde_json::json;

    #[test]
    fn empty_plan_json_has_every_field_and_empty_lists() {
        assert_eq!(
            serde_json::to_value(Plan::new()).unwrap(),
            json!({"apply": [], "delete": [], "status": null, "primaryPatch": null, "events": [],
                   "requeueAfterMs": null, "cleanupComplete": false, "httpRequests": []})
        );
        assert!(Plan::new().is_empty());
        assert!(!Plan::new().cleanup_complete().is_empty());
    }

    #[test]
    fn preconditions_serialize_as_documented_and_parse_back() {
        let obj = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}});
        let plan = Plan::new()
            .apply(&obj)
            .apply_if_absent(&obj)
            .apply_at(&obj, "42");
        let v = serde_json::to_value(&plan).unwrap();
        assert_eq!(v["apply"][0]["precondition"], json!(null));
        assert_eq!(v["apply"][1]["precondition"], json!({"absent": true}));
        assert_eq!(
            v["apply"][2]["precondition"],
            json!({"resourceVersion": "42"})
        );
        let back: Plan = serde_json::from_value(v).unwrap();
        assert_eq!(back, plan);
        assert!(serde_json::from_value::<Precondition>(json!({"absent": false})).is_err());
        assert!(serde_json::from_value::<Precondition>(json!({})).is_err());
    }

    #[test]
    fn only_apply_forced_asks_to_force_and_force_defaults_to_false() {
        let obj = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}});
        let plan = Plan::new().apply(&obj).apply_forced(&obj);
        let v = serde_json::to_value(&plan).unwrap();
        assert_eq!(v["apply"][0]["force"], json!(false));
        assert_eq!(v["apply"][1]["force"], json!(true));
        assert_eq!(v["apply"][1]["precondition"], json!(null));
        let old: ApplyOp =
            serde_json::from_value(json!({"object": obj, "precondition": null})).unwrap();
        assert!(!old.force);
    }

    #[test]
    fn delete_self_names_the_primary_with_its_uid_and_resource_version() {
        let primary = json!({"apiVersion": "g/v1", "kind": "K",
                             "metadata": {"name": "p", "uid": "u-p", "resourceVersion": "12"}});
        let plan = Plan::new().delete_self(&primary).unwrap();
        assert_eq!(
            serde_json::to_value(&plan.delete[0]).unwrap(),
            json!({"target": {"apiVersion": "g/v1", "kind": "K", "namespace": "", "name": "p"},
                   "uid": "u-p", "resourceVersion": "12"})
        );
    }

    #[test]
    fn typed_k8s_objects_apply_with_api_version_and_kind() {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some("a".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let plan = Plan::new().apply(&cm);
        assert_eq!(plan.apply[0].object["apiVersion"], "v1");
        assert_eq!(plan.apply[0].object["kind"], "ConfigMap");
    }

    #[test]
    fn delete_owned_takes_uid_and_resource_version_from_the_object_seen() {
        let seen = json!({"apiVersion": "v1", "kind": "ConfigMap",
                          "metadata": {"name": "a", "namespace": "ns", "uid": "u-1", "resourceVersion": "9"}});
        let plan = Plan::new().delete_owned(&seen).unwrap();
        assert_eq!(
            serde_json::to_value(&plan.delete[0]).unwrap(),
            json!({"target": {"apiVersion": "v1", "kind": "ConfigMap", "namespace": "ns", "name": "a"},
                   "uid": "u-1", "resourceVersion": "9"})
        );
        let no_uid = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "resourceVersion": "9"}});
        assert_eq!(
            Plan::new().delete_owned(&no_uid).unwrap_err(),
            ReconcileError::internal("cannot delete ConfigMap a: it has no metadata.uid")
        );
    }

    #[test]
    fn events_requeue_and_http_serialize_in_camel_case() {
        let plan = Plan::new()
            .event("Created", "made it")
            .warning("Broken", "it broke")
            .requeue_after(Duration::from_millis(1500))
            .http(
                HttpRequest::get("health", "members", "pod-0", 8080, "/health")
                    .header("Accept", "application/json")
                    .secret_header("Authorization", "token", "value", "Bearer ")
                    .timeout(Duration::from_secs(2))
                    .max_age(Duration::from_secs(60)),
            );
        let v = serde_json::to_value(&plan).unwrap();
        assert_eq!(
            v["events"][0],
            json!({"type": "Normal", "reason": "Created", "message": "made it"})
        );
        assert_eq!(v["events"][1]["type"], "Warning");
        assert_eq!(v["requeueAfterMs"], 1500);
        assert_eq!(
            v["httpRequests"][0],
            json!({"id": "health", "target": {"declared": {"id": "members", "object": "pod-0"}}, "port": 8080,
                   "method": "GET", "path": "/health", "body": "",
                   "headers": [["Accept", "application/json"]],
                   "secretHeaders": [{"name": "Authorization", "secret": "token", "key": "value", "prefix": "Bearer "}],
                   "timeoutMs": 2000, "maxResponseBytes": 0, "maxAgeMs": 60000})
        );
    }

    #[test]
    fn allow_listed_targets_are_a_variant_not_a_magic_string() {
        let req = HttpRequest::allow_listed("p", HttpMethod::Post, "http://127.0.0.1:9", "/x");
        assert_eq!(
            serde_json::to_value(&req.target).unwrap(),
            json!({"allowList": {"baseUrl": "http://127.0.0.1:9"}})
        );
        assert_eq!(req.port, 0);
        // A target id that happens to read "allow-list" is an ordinary declared target.
        let declared = HttpRequest::get("p", "allow-list", "x", 1, "/");
        assert!(matches!(declared.target, RequestTarget::Declared { .. }));
    }

    #[test]
    fn durations_saturate_instead_of_wrapping() {
        let plan = Plan::new().requeue_after(Duration::MAX);
        assert_eq!(plan.requeue_after_ms, Some(u64::MAX));
        let req = HttpRequest::get("a", "b", "c", 1, "/").timeout(Duration::from_secs(u64::MAX));
        assert_eq!(req.timeout_ms, u32::MAX);
    }
}
