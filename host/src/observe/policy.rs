//! What the operator allows: the observation limits and allow-list
//! ([`ObserveConfig`]), why a request is refused ([`Refusal`]), and the
//! idempotency key of mutating calls.

use super::*;

/// The header carrying [`idempotency_key`] on mutating calls.
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";

/// Headers the host sets or that belong to the connection; a plan may not
/// set them.
pub(crate) const RESERVED_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "upgrade",
    "te",
    "trailer",
    IDEMPOTENCY_KEY_HEADER,
];

/// Limits and the allow-list of the [`Observer`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObserveConfig {
    /// A GET with the same id for the same primary is not re-sent within
    /// this interval of its last send (the earlier result stays). Default 15 s.
    pub per_primary_interval: Duration,
    /// Requests in flight at once, over all primaries (at least 1). Default 8.
    pub max_concurrent: usize,
    /// Deadline of a request whose `timeoutMs` is 0. Default 10 s.
    pub default_timeout: Duration,
    /// The longest deadline a request may ask for. Default 60 s.
    pub timeout_ceiling: Duration,
    /// Response bytes kept for a request whose `maxResponseBytes` is 0.
    /// Default 1 MiB.
    pub default_max_response_bytes: usize,
    /// The largest `maxResponseBytes` a request may ask for. Default 16 MiB.
    pub response_bytes_ceiling: usize,
    /// Results kept per primary; beyond it the oldest is dropped. Default 64.
    pub max_results_per_primary: usize,
    /// Bytes (bodies and error texts) kept per primary; beyond it the
    /// oldest results are dropped. This is also the most observation data
    /// one snapshot carries. Default 4 MiB.
    pub max_result_bytes_per_primary: usize,
    /// Bytes kept over all primaries; beyond it the oldest results of any
    /// primary are dropped. Default 256 MiB.
    pub max_result_bytes_total: usize,
    /// The longest a result is kept; a request's `maxAgeMs` of 0 (or more
    /// than this) means this. Default 1 hour.
    pub max_result_age: Duration,
    /// Requests sent per primary within `per_primary_interval`, whatever
    /// their method; beyond it a request is rate-limited (not sent, its
    /// earlier result stays). Default 16.
    pub max_requests_per_primary: usize,
    /// Base URLs requests with target `allow-list` may call, e.g.
    /// `http://terdut.example:8080`. Matched on scheme, host and port.
    pub allow_list: Vec<String>,
}

impl Default for ObserveConfig {
    fn default() -> Self {
        ObserveConfig {
            per_primary_interval: Duration::from_secs(15),
            max_concurrent: 8,
            default_timeout: Duration::from_secs(10),
            timeout_ceiling: Duration::from_secs(60),
            default_max_response_bytes: 1024 * 1024,
            response_bytes_ceiling: 16 * 1024 * 1024,
            max_results_per_primary: 64,
            max_result_bytes_per_primary: 4 << 20,
            max_result_bytes_total: 256 << 20,
            max_result_age: Duration::from_secs(3600),
            max_requests_per_primary: 16,
            allow_list: Vec::new(),
        }
    }
}

impl ObserveConfig {
    /// The allow-list entries that are not `http[s]://host[:port]` base
    /// URLs, each with the reason, for the CLI to reject at start-up. Such
    /// entries never match a request.
    pub fn allow_list_problems(&self) -> Vec<String> {
        self.allow_list
            .iter()
            .filter_map(|entry| {
                Origin::parse(entry)
                    .err()
                    .map(|why| format!("allow-list entry {entry:?}: {why}"))
            })
            .collect()
    }
}

/// Who a batch of requests is for: logged with every call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrimaryInfo {
    /// `metadata.uid` of the primary; results are kept under it.
    pub uid: String,
    /// Namespace of the primary, empty for a cluster-scoped one.
    pub namespace: String,
    /// Name of the primary.
    pub name: String,
    /// Name of the plugin whose plan asked.
    pub plugin: String,
    /// Version of that plugin.
    pub plugin_version: String,
}

impl PrimaryInfo {
    /// The info of `primary` (uid, namespace, name) for a plugin.
    pub fn of(primary: &Value, plugin: &str, plugin_version: &str) -> Self {
        PrimaryInfo {
            uid: object::uid(primary).to_owned(),
            namespace: object::namespace(primary).unwrap_or_default().to_owned(),
            name: object::name(primary).to_owned(),
            plugin: plugin.to_owned(),
            plugin_version: plugin_version.to_owned(),
        }
    }
}

impl std::fmt::Display for PrimaryInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.namespace.is_empty() {
            f.write_str(&self.name)
        } else {
            write!(f, "{}/{}", self.namespace, self.name)
        }
    }
}

/// Why a request was not sent. Every refusal happens before anything is
/// sent, and none carries a Secret value.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum Refusal {
    /// The base URL of an `allow-list` request is not on the allow-list.
    #[error("{origin} is not on the operator's allow-list")]
    NotAllowListed {
        /// `scheme://host:port` of the request.
        origin: String,
    },
    /// The request's `caBundle` cannot be used.
    #[error("CA bundle {source_name}: {why}")]
    BadCaBundle {
        /// `inline PEM` or `Secret <name> key <key>`.
        source_name: String,
        /// What is wrong with it (never its content).
        why: String,
    },
    /// The `object` of an `allow-list` request is not a usable base URL.
    #[error("base URL {url:?} {why}")]
    BadBaseUrl {
        /// The `object` as the plan gave it.
        url: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// The request's port is neither 0 nor the port of its base URL.
    #[error("port {port} is not the port of {origin}")]
    PortMismatch {
        /// The request's port.
        port: u16,
        /// `scheme://host:port` of the base URL.
        origin: String,
    },
    /// The target is neither `allow-list` nor an `http-target` of the controller.
    #[error("target {target:?} is not an http-target of the controller")]
    UnknownTarget {
        /// The request's target.
        target: String,
    },
    /// The `http-target` addresses a kind other than core Pod or Service.
    #[error("target {target:?} addresses {kind}, which is neither a Pod nor a Service")]
    UnsupportedKind {
        /// The request's target.
        target: String,
        /// The target's kind.
        kind: String,
    },
    /// The port is not one the `http-target` declares.
    #[error("port {port} is not declared by target {target:?}")]
    PortNotDeclared {
        /// The request's port.
        port: u16,
        /// The request's target.
        target: String,
    },
    /// The Pod or Service is not in the primary's snapshot.
    #[error("{kind} {name:?} is not in the primary's snapshot")]
    ObjectNotFound {
        /// `Pod` or `Service`.
        kind: String,
        /// The request's object.
        name: String,
    },
    /// The Pod has no usable `status.podIP` (not scheduled yet, or garbage).
    #[error("Pod {name:?} has no usable status.podIP yet")]
    NoPodIp {
        /// The Pod's name.
        name: String,
    },
    /// The Service may not be called (ExternalName, no selector, headless,
    /// not ClusterIP, or no cluster IP yet).
    #[error("Service {name:?} cannot be called: {why}")]
    ServiceNotRoutable {
        /// The Service's name.
        name: String,
        /// Why not.
        why: &'static str,
    },
    /// The path does not start with `/` or is not a valid request path.
    #[error("path {path:?} must start with / and hold only URL characters, without a fragment")]
    BadPath {
        /// The request's path.
        path: String,
    },
    /// A header name or plain value is not valid HTTP.
    #[error("header {name:?} is not a valid HTTP header")]
    BadHeader {
        /// The header's name.
        name: String,
    },
    /// The header is set by the host (or the connection) only.
    #[error("header {name:?} is set by the host and may not be set by a plan")]
    ReservedHeader {
        /// The header's name.
        name: String,
    },
    /// The Secret a header names is not readable by the controller.
    #[error("Secret {secret:?} is not in the primary's snapshot")]
    SecretMissing {
        /// The Secret's name.
        secret: String,
    },
    /// The Secret has no such key in its `data`.
    #[error("Secret {secret:?} has no key {key:?}")]
    SecretKeyMissing {
        /// The Secret's name.
        secret: String,
        /// The key.
        key: String,
    },
    /// The Secret's value is not base64, or with its prefix is not a valid
    /// header value.
    #[error("Secret {secret:?} key {key:?} does not hold a valid value for header {header:?}")]
    SecretValueUnusable {
        /// The Secret's name.
        secret: String,
        /// The key.
        key: String,
        /// The header it was meant for.
        header: String,
    },
}

/// Where a request goes and with which headers (Secret values included,
/// marked sensitive so `Debug` hides them).
#[derive(Clone, Debug)]
pub struct Endpoint {
    /// The full URL: `http[s]://host:port/path?query`.
    pub uri: Uri,
    /// Plain and Secret headers of the plan.
    pub headers: HeaderMap,
    /// For `https`: the TLS client configuration (the system's roots and
    /// the request's CA bundle).
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

/// One request of a plan, resolved by [`Observer::prepare`].
#[derive(Clone, Debug)]
pub struct ResolvedRequest {
    /// The request as the plan declared it.
    pub request: HttpRequest,
    /// Where to send it, or why it is refused.
    pub endpoint: Result<Endpoint, Refusal>,
}

/// What one [`Observer::run`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SubmitOutcome {
    /// Requests sent.
    pub sent: usize,
    /// Requests refused (their refusal is stored as the result).
    pub refused: usize,
    /// GETs not re-sent because of the per-primary interval.
    pub rate_limited: usize,
    /// Mutating requests not sent because one with the same id was still
    /// in flight for the primary (its answer is what gets stored).
    pub in_flight: usize,
    /// Mutating requests not sent because a result for their id was stored
    /// after the snapshot the plan was made from ([`SeenResults`]): the
    /// plan repeats a call whose answer it has not seen. Re-queue the
    /// primary when this is non-zero, so the plugin sees that answer.
    pub superseded: usize,
    /// Stored results whose status, body or error differ from what was
    /// stored under that id before (or that are new). Re-queue the primary
    /// when this is non-zero: the plugin has something new to see. A
    /// re-queue when nothing changed would only loop.
    pub changed: usize,
}

/// Which stored result of each id a snapshot carried, as
/// [`Observer::snapshot`] handed them out. A plan made from that snapshot
/// is run with it ([`Observer::run_planned`]), so a mutating call the plan
/// repeats is sent only when its plugin saw the latest result for that id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SeenResults {
    /// The stored result's sequence number per id (numbers grow across all
    /// primaries, so a result stored after a `forget` is never mistaken
    /// for one seen before it).
    pub(crate) seq: HashMap<String, u64>,
}

impl SeenResults {
    /// True when `stored`, now kept under `id`, is not the result the
    /// snapshot carried for that id.
    pub(crate) fn missed(&self, id: &str, stored: Option<u64>) -> bool {
        stored.is_some_and(|now| self.seq.get(id) != Some(&now))
    }
}

/// Counters of every request the [`Observer`] handled since it started.
/// Requests sent end as exactly one of succeeded, failed or cut.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ObserveMetrics {
    /// Requests sent (a connection was attempted).
    pub sent: u64,
    /// Sent requests answered with a complete response (any status).
    pub succeeded: u64,
    /// Sent requests without a complete response: connection error,
    /// protocol error or deadline.
    pub failed: u64,
    /// Refused before sending.
    pub refused: u64,
    /// Sent requests whose body was cut at the size cap.
    pub cut: u64,
    /// GETs not re-sent because of the per-primary interval.
    pub rate_limited: u64,
}

/// The `Idempotency-Key` of a mutating call: hex SHA-256 over the primary's
/// uid, the request id, the method, the path and the body (each
/// length-prefixed). Stable across retries, restarts and replicas, so the
/// remote side can recognise a repeated call.
pub fn idempotency_key(
    primary_uid: &str,
    request_id: &str,
    method: HttpMethod,
    path: &str,
    body: &str,
) -> String {
    let mut hasher = Sha256::new();
    for part in [primary_uid, request_id, method_name(method), path, body] {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part.as_bytes());
    }
    hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
