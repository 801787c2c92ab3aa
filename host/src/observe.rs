//! Observations: the HTTP requests a plan declares, performed by the host,
//! and their results kept for the primary's next snapshot.
//!
//! Plugins never open a socket. A plan lists `httpRequests`; after the
//! plan's writes the host performs them and the next snapshot of that
//! primary carries each result as an [`Observation`] keyed by the request's
//! id. The live controller drives this module in four calls:
//!
//! 1. [`Observer::prepare`] — resolves every request of the plan to a URL
//!    and its headers, or to a [`Refusal`]. Pure: it reads the snapshot's
//!    objects and Secrets through closures and sends nothing.
//! 2. [`Observer::submit`] (spawns) or [`Observer::run`] (awaits) — records
//!    refusals as results, sends the rest and stores their results. The
//!    [`SubmitOutcome`] says whether a stored result changed, which is when
//!    a re-queue of the primary is worth it.
//! 3. [`Observer::results`] — the stored results of a primary, with their
//!    age, for [`crate::build_snapshot`].
//! 4. [`Observer::forget`] — when the primary is gone.
//!
//! # Limits ([`ObserveConfig`] defaults, the fleet seed's numbers)
//!
//! | limit | default |
//! | --- | --- |
//! | a GET with the same id re-sent for one primary at most every | 15 s |
//! | requests in flight, all primaries together | 8 |
//! | deadline of one request (plan `timeoutMs` overrides, up to 60 s) | 10 s |
//! | response body kept (plan `maxResponseBytes` overrides, up to 16 MiB) | 1 MiB |
//! | results kept per primary (oldest dropped first) | 64 |
//!
//! # Guarantees
//!
//! - A request is refused before anything is sent unless its target is a
//!   Pod or Service the manifest declares as an `http-target` (on a declared
//!   port) and the snapshot holds, or a base URL on the operator's
//!   allow-list ([`resolve`]).
//! - Mutating calls (POST, PUT, DELETE) carry an `Idempotency-Key` header
//!   ([`idempotency_key`]) and are sent once per [`Observer::run`] that
//!   lists them: the host never retries them on its own.
//! - Secret header values are sent, never logged, and print as `Sensitive`
//!   in `Debug` output.
//!
//! # Caveats
//!
//! - Plain `http://` only: there is no TLS client here yet, so an `https`
//!   base URL is refused with [`Refusal::HttpsUnsupported`].
//! - One connection per request (no pooling): observations are rare and
//!   rate-limited, and a fresh connection cannot carry state between
//!   primaries.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap};
use std::error::Error as _;
use std::hash::{Hash, Hasher};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use base64::Engine as _;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::header::{HOST, HeaderMap, HeaderName, HeaderValue, USER_AGENT};
use hyper::http::uri::PathAndQuery;
use hyper::{Method, Uri};
use hyper_util::rt::TokioIo;
use jiff::Timestamp;
use serde_json::Value;
use sha2::{Digest, Sha256};
use thiserror::Error;
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

use crate::manifest::{HttpTarget, KindRef};
use crate::names;
use crate::object;
use crate::plan::{HttpMethod, HttpRequest};
use crate::snapshot::Observation;

/// The `target` of a request addressed to a base URL on the operator's
/// allow-list rather than to a manifest `http-target`.
pub const ALLOW_LIST_TARGET: &str = "allow-list";

/// The header carrying [`idempotency_key`] on mutating calls.
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";

/// Headers the host sets or that belong to the connection; a plan may not
/// set them.
const RESERVED_HEADERS: &[&str] = &[
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
            allow_list: Vec::new(),
        }
    }
}

impl ObserveConfig {
    /// The allow-list entries that are not plain `http://host[:port]` base
    /// URLs, each with the reason, for the CLI to reject at start-up. Such
    /// entries never match a request.
    pub fn allow_list_problems(&self) -> Vec<String> {
        self.allow_list
            .iter()
            .filter_map(|entry| match Origin::parse(entry) {
                Err(why) => Some(format!("allow-list entry {entry:?}: {why}")),
                Ok(o) if o.scheme == "https" => Some(format!(
                    "allow-list entry {entry:?}: https is not supported yet"
                )),
                Ok(_) => None,
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
    /// The URL is `https`; only plain `http` is supported for now.
    #[error("{origin}: https is not supported yet, only http:// targets can be called")]
    HttpsUnsupported {
        /// `scheme://host:port` of the request.
        origin: String,
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
    /// The Service's name or namespace cannot form a DNS name.
    #[error("Service {name:?} in namespace {namespace:?} has no usable DNS name")]
    NoServiceName {
        /// The Service's name.
        name: String,
        /// Its namespace (empty when missing).
        namespace: String,
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
    /// The full URL: `http://host:port/path?query`.
    pub uri: Uri,
    /// Plain and Secret headers of the plan.
    pub headers: HeaderMap,
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
    /// Stored results whose status, body or error differ from what was
    /// stored under that id before (or that are new). Re-queue the primary
    /// when this is non-zero: the plugin has something new to see. A
    /// re-queue when nothing changed would only loop.
    pub changed: usize,
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

#[derive(Debug, Default)]
struct Counters {
    sent: AtomicU64,
    succeeded: AtomicU64,
    failed: AtomicU64,
    refused: AtomicU64,
    cut: AtomicU64,
    rate_limited: AtomicU64,
}

/// How a sent request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ending {
    Succeeded,
    Failed,
    Cut,
}

impl Ending {
    fn as_str(self) -> &'static str {
        match self {
            Ending::Succeeded => "succeeded",
            Ending::Failed => "failed",
            Ending::Cut => "cut",
        }
    }
}

/// A result as kept between snapshots.
#[derive(Clone, Debug)]
struct Stored {
    status: Option<u16>,
    body: String,
    error: Option<String>,
    observed_at: Timestamp,
    max_age_ms: u64,
}

impl Stored {
    fn age_ms(&self, now: Timestamp) -> u64 {
        let ms = now.duration_since(self.observed_at).as_millis();
        u64::try_from(ms.max(0)).unwrap_or(u64::MAX)
    }

    fn expired(&self, now: Timestamp) -> bool {
        self.max_age_ms > 0 && self.age_ms(now) > self.max_age_ms
    }

    fn same_content(&self, other: &Stored) -> bool {
        self.status == other.status && self.body == other.body && self.error == other.error
    }
}

/// What is kept for one primary.
#[derive(Debug)]
struct PrimaryState {
    /// Distinguishes this state from one created after a `forget`, so a
    /// request in flight across a `forget` stores nothing.
    epoch: u64,
    results: BTreeMap<String, Stored>,
    /// Last send of each GET id, with the fingerprint of what was sent.
    last_get: HashMap<String, (Instant, u64)>,
}

impl PrimaryState {
    /// Stores `stored` under `id`; true when its content changed.
    fn store(&mut self, id: &str, stored: Stored, cap: usize) -> bool {
        let changed = self
            .results
            .get(id)
            .is_none_or(|old| !old.same_content(&stored));
        self.results.insert(id.to_owned(), stored);
        while self.results.len() > cap.max(1) {
            let oldest = self
                .results
                .iter()
                .min_by_key(|(_, s)| s.observed_at)
                .map(|(id, _)| id.clone());
            match oldest {
                Some(oldest) => self.results.remove(&oldest),
                None => break,
            };
        }
        changed
    }
}

/// Performs plan HTTP requests and keeps their results per primary.
///
/// Shared by every controller of the operator (one global concurrency
/// bound); create it once with [`Observer::new`].
#[derive(Debug)]
pub struct Observer {
    config: ObserveConfig,
    permits: Semaphore,
    state: Mutex<HashMap<String, PrimaryState>>,
    next_epoch: AtomicU64,
    counters: Counters,
}

impl Observer {
    /// An observer with `config`. Allow-list entries that do not parse are
    /// logged and never match (see [`ObserveConfig::allow_list_problems`]).
    pub fn new(config: ObserveConfig) -> Arc<Observer> {
        for problem in config.allow_list_problems() {
            tracing::warn!(problem, "observation allow-list entry ignored");
        }
        Arc::new(Observer {
            permits: Semaphore::new(config.max_concurrent.max(1)),
            config,
            state: Mutex::new(HashMap::new()),
            next_epoch: AtomicU64::new(1),
            counters: Counters::default(),
        })
    }

    /// The configuration in use.
    pub fn config(&self) -> &ObserveConfig {
        &self.config
    }

    /// Resolves every request of a plan, in plan order, with [`resolve`]
    /// and [`resolve_headers`] against the operator's allow-list. Sends
    /// nothing.
    ///
    /// `objects` answers "the object of this kind with this name in the
    /// primary's namespace", and `secrets` "the Secret with this name in the
    /// primary's namespace"; both must answer only with objects the
    /// primary's snapshot holds (owned or read by its controller), so a plan
    /// reaches nothing its manifest does not declare.
    pub fn prepare(
        &self,
        requests: &[HttpRequest],
        targets: &[HttpTarget],
        objects: impl Fn(&KindRef, &str) -> Option<Value>,
        secrets: impl Fn(&str) -> Option<Value>,
    ) -> Vec<ResolvedRequest> {
        requests
            .iter()
            .map(|request| {
                let endpoint = resolve(request, targets, &self.config.allow_list, &objects)
                    .and_then(|uri| {
                        let headers = resolve_headers(request, &secrets)?;
                        Ok(Endpoint { uri, headers })
                    });
                ResolvedRequest {
                    request: request.clone(),
                    endpoint,
                }
            })
            .collect()
    }

    /// Runs [`Observer::run`] on a new tokio task and calls `on_done` with
    /// its outcome. Call it after the plan's writes succeeded.
    ///
    /// # Panics
    ///
    /// When called outside a tokio runtime.
    pub fn submit(
        self: &Arc<Self>,
        primary: PrimaryInfo,
        requests: Vec<ResolvedRequest>,
        on_done: impl FnOnce(SubmitOutcome) + Send + 'static,
    ) -> tokio::task::JoinHandle<()> {
        let observer = Arc::clone(self);
        tokio::spawn(async move {
            let outcome = observer.run(&primary, requests).await;
            on_done(outcome);
        })
    }

    /// Handles the resolved requests of one plan and returns when every
    /// result is stored.
    ///
    /// # Guarantees
    ///
    /// - A refused request is not sent; its result is stored with no
    ///   status and the refusal as `error`.
    /// - A GET whose id was sent for this primary less than
    ///   `per_primary_interval` ago, to the same URL with the same headers
    ///   and body, is not sent again and its earlier result stays. A GET
    ///   whose URL changed (a new Pod IP, another path) is sent at once.
    /// - Mutating calls are sent once per call of `run`, with their
    ///   `Idempotency-Key`; the host never retries them.
    /// - Requests run concurrently, at most `max_concurrent` in flight over
    ///   all primaries, each under its own deadline and body cap.
    /// - Each result replaces the one stored under its id for this primary.
    ///   A result arriving after [`Observer::forget`] is dropped.
    pub async fn run(
        &self,
        primary: &PrimaryInfo,
        requests: Vec<ResolvedRequest>,
    ) -> SubmitOutcome {
        let mut outcome = SubmitOutcome::default();
        let mut to_send = Vec::new();
        let epoch = {
            let mut state = self.lock();
            let entry = state
                .entry(primary.uid.clone())
                .or_insert_with(|| PrimaryState {
                    epoch: self.next_epoch.fetch_add(1, Ordering::Relaxed),
                    results: BTreeMap::new(),
                    last_get: HashMap::new(),
                });
            let now = Instant::now();
            let interval = self.config.per_primary_interval;
            entry
                .last_get
                .retain(|_, (at, _)| now.duration_since(*at) < interval);
            for ResolvedRequest { request, endpoint } in requests {
                let endpoint = match endpoint {
                    Ok(endpoint) => endpoint,
                    Err(refusal) => {
                        self.counters.refused.fetch_add(1, Ordering::Relaxed);
                        outcome.refused += 1;
                        tracing::warn!(
                            primary = %primary, uid = %primary.uid, plugin = %primary.plugin,
                            version = %primary.plugin_version, id = %request.id,
                            method = method_name(request.method), target = %request.target,
                            object = %request.object, path = %request.path,
                            outcome = "refused", reason = %refusal,
                            "observation request refused before sending"
                        );
                        let stored = Stored {
                            status: None,
                            body: String::new(),
                            error: Some(format!("refused before sending: {refusal}")),
                            observed_at: now_ms(),
                            max_age_ms: request.max_age_ms,
                        };
                        if entry.store(&request.id, stored, self.config.max_results_per_primary) {
                            outcome.changed += 1;
                        }
                        continue;
                    }
                };
                if request.method == HttpMethod::Get {
                    let print = fingerprint(&request, &endpoint);
                    if let Some((_, last)) = entry.last_get.get(&request.id)
                        && *last == print
                    {
                        self.counters.rate_limited.fetch_add(1, Ordering::Relaxed);
                        outcome.rate_limited += 1;
                        tracing::debug!(
                            primary = %primary, id = %request.id, url = %endpoint.uri,
                            "observation GET not re-sent within the per-primary interval"
                        );
                        continue;
                    }
                    entry.last_get.insert(request.id.clone(), (now, print));
                }
                to_send.push((request, endpoint));
            }
            entry.epoch
        };

        outcome.sent = to_send.len();
        let results = futures::future::join_all(
            to_send
                .iter()
                .map(|(request, endpoint)| self.perform(primary, request, endpoint)),
        )
        .await;

        let mut state = self.lock();
        if let Some(entry) = state.get_mut(&primary.uid)
            && entry.epoch == epoch
        {
            for ((request, _), stored) in to_send.iter().zip(results) {
                if entry.store(&request.id, stored, self.config.max_results_per_primary) {
                    outcome.changed += 1;
                }
            }
        }
        outcome
    }

    /// The stored results of a primary at `now`, sorted by id, each with its
    /// `ageMs`. Results older than their request's `maxAgeMs` (when
    /// non-zero) are dropped, here and from storage.
    pub fn results(&self, primary_uid: &str, now: Timestamp) -> Vec<Observation> {
        let mut state = self.lock();
        let Some(entry) = state.get_mut(primary_uid) else {
            return Vec::new();
        };
        entry.results.retain(|_, s| !s.expired(now));
        entry
            .results
            .iter()
            .map(|(id, s)| Observation {
                id: id.clone(),
                status: s.status,
                body: s.body.clone(),
                error: s.error.clone(),
                observed_at: s.observed_at.to_string(),
                age_ms: s.age_ms(now),
            })
            .collect()
    }

    /// Drops everything kept for a primary (results and rate state). A
    /// request still in flight for it stores nothing.
    pub fn forget(&self, primary_uid: &str) {
        self.lock().remove(primary_uid);
    }

    /// The counters so far.
    pub fn metrics(&self) -> ObserveMetrics {
        let c = &self.counters;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ObserveMetrics {
            sent: load(&c.sent),
            succeeded: load(&c.succeeded),
            failed: load(&c.failed),
            refused: load(&c.refused),
            cut: load(&c.cut),
            rate_limited: load(&c.rate_limited),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, PrimaryState>> {
        // The state stays consistent across a panic (every update is one
        // insert or remove), so a poisoned lock is still usable.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Sends one request under the concurrency bound, its deadline and its
    /// body cap; logs and counts it.
    async fn perform(
        &self,
        primary: &PrimaryInfo,
        request: &HttpRequest,
        endpoint: &Endpoint,
    ) -> Stored {
        let deadline = if request.timeout_ms == 0 {
            self.config.default_timeout
        } else {
            Duration::from_millis(u64::from(request.timeout_ms)).min(self.config.timeout_ceiling)
        };
        let cap = if request.max_response_bytes == 0 {
            self.config.default_max_response_bytes
        } else {
            usize::try_from(request.max_response_bytes)
                .unwrap_or(usize::MAX)
                .min(self.config.response_bytes_ceiling)
        };

        // The semaphore is never closed; should it be, the request goes out
        // unbounded rather than not at all.
        let _permit = self.permits.acquire().await.ok();
        self.counters.sent.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let mut progress = Progress::default();
        let exchanged = tokio::time::timeout(
            deadline,
            exchange(&primary.uid, request, endpoint, cap, &mut progress),
        )
        .await;
        let (ending, error) = match exchanged {
            Ok(Ok(false)) => (Ending::Succeeded, None),
            Ok(Ok(true)) => (
                Ending::Cut,
                Some(format!(
                    "response body exceeds the cap of {cap} bytes and was cut at {cap} bytes"
                )),
            ),
            Ok(Err(why)) => (Ending::Failed, Some(why)),
            Err(_) => {
                let when = if progress.status.is_some() {
                    " while reading the body"
                } else {
                    ""
                };
                (
                    Ending::Failed,
                    Some(format!(
                        "deadline of {} ms exceeded{when}",
                        deadline.as_millis()
                    )),
                )
            }
        };
        let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let counter = match ending {
            Ending::Succeeded => &self.counters.succeeded,
            Ending::Failed => &self.counters.failed,
            Ending::Cut => &self.counters.cut,
        };
        counter.fetch_add(1, Ordering::Relaxed);

        // Headers are never logged: they may hold Secret values.
        macro_rules! log_call {
            ($level:ident) => {
                tracing::$level!(
                    primary = %primary, uid = %primary.uid, plugin = %primary.plugin,
                    version = %primary.plugin_version, id = %request.id,
                    method = method_name(request.method), target = %request.target,
                    url = %endpoint.uri, status = progress.status, outcome = ending.as_str(),
                    error = error.as_deref(), elapsed_ms, "observation request"
                )
            };
        }
        if ending == Ending::Succeeded {
            log_call!(info);
        } else {
            log_call!(warn);
        }

        let body = if ending == Ending::Failed {
            String::new()
        } else {
            String::from_utf8_lossy(&progress.body).into_owned()
        };
        Stored {
            status: progress.status,
            body,
            error,
            observed_at: now_ms(),
            max_age_ms: request.max_age_ms,
        }
    }
}

/// What arrived of a response so far; kept outside the deadline so a
/// status that arrived before it still counts.
#[derive(Debug, Default)]
struct Progress {
    status: Option<u16>,
    body: Vec<u8>,
}

/// Aborts a spawned task when dropped (the connection driver of one
/// request, when the request ends or its deadline passes).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Connects, sends (with the `Idempotency-Key` of `primary_uid` when
/// mutating), and reads the body into `progress` up to `cap` bytes.
/// `Ok(true)` when the body was cut at the cap.
async fn exchange(
    primary_uid: &str,
    request: &HttpRequest,
    endpoint: &Endpoint,
    cap: usize,
    progress: &mut Progress,
) -> Result<bool, String> {
    let uri = &endpoint.uri;
    let authority = uri.authority().map(|a| a.as_str()).unwrap_or_default();
    let host = uri.host().unwrap_or_default();
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port = uri.port_u16().unwrap_or(80);
    let stream = TcpStream::connect((host, port))
        .await
        .map_err(|e| format!("cannot connect to {authority}: {e}"))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("HTTP handshake with {authority} failed: {}", chain(&e)))?;
    let _driver = AbortOnDrop(tokio::spawn(async move {
        // Its errors surface through `send_request` and the body.
        let _ = connection.await;
    }));

    let target = uri
        .path_and_query()
        .map_or("/", PathAndQuery::as_str)
        .to_owned();
    let mut builder = hyper::Request::builder()
        .method(method(request.method))
        .uri(target)
        .header(HOST, authority)
        .header(USER_AGENT, concat!("wasmop/", env!("CARGO_PKG_VERSION")));
    if let Some(headers) = builder.headers_mut() {
        headers.extend(endpoint.headers.clone());
    }
    if request.method != HttpMethod::Get {
        let key = idempotency_key(
            primary_uid,
            &request.id,
            request.method,
            &request.path,
            &request.body,
        );
        builder = builder.header(IDEMPOTENCY_KEY_HEADER, key);
    }
    let outgoing = builder
        .body(Full::new(Bytes::from(request.body.clone())))
        .map_err(|e| format!("cannot build the request: {e}"))?;
    let response = sender
        .send_request(outgoing)
        .await
        .map_err(|e| format!("request to {authority} failed: {}", chain(&e)))?;
    progress.status = Some(response.status().as_u16());

    let mut body = response.into_body();
    while let Some(frame) = body.frame().await {
        let frame =
            frame.map_err(|e| format!("reading the response body failed: {}", chain(&e)))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let room = cap.saturating_sub(progress.body.len());
        if data.len() > room {
            progress.body.extend_from_slice(&data[..room]);
            return Ok(true);
        }
        progress.body.extend_from_slice(&data);
    }
    Ok(false)
}

/// An error and its sources, `: `-separated (hyper's own message is terse).
fn chain(e: &hyper::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

fn method(m: HttpMethod) -> Method {
    match m {
        HttpMethod::Get => Method::GET,
        HttpMethod::Post => Method::POST,
        HttpMethod::Put => Method::PUT,
        HttpMethod::Delete => Method::DELETE,
    }
}

fn method_name(m: HttpMethod) -> &'static str {
    match m {
        HttpMethod::Get => "GET",
        HttpMethod::Post => "POST",
        HttpMethod::Put => "PUT",
        HttpMethod::Delete => "DELETE",
    }
}

/// Now, to the millisecond (the precision of `ageMs`).
fn now_ms() -> Timestamp {
    let now = Timestamp::now();
    now.round(jiff::Unit::Millisecond).unwrap_or(now)
}

/// What identifies a sent GET for the rate limit: URL, headers, body.
fn fingerprint(request: &HttpRequest, endpoint: &Endpoint) -> u64 {
    let mut h = DefaultHasher::new();
    endpoint.uri.to_string().hash(&mut h);
    for (name, value) in &endpoint.headers {
        name.as_str().hash(&mut h);
        value.as_bytes().hash(&mut h);
    }
    request.body.hash(&mut h);
    h.finish()
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

/// A base URL: `scheme://host:port` and an optional base path.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Origin {
    scheme: String,
    /// Lowercase; IPv6 addresses in brackets.
    host: String,
    port: u16,
    /// Without a trailing `/`; empty for none.
    base_path: String,
}

impl Origin {
    fn parse(text: &str) -> Result<Origin, &'static str> {
        if text.contains('#') || text.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err("holds a fragment, blanks or control characters");
        }
        let uri: Uri = text.parse().map_err(|_| "is not a URL")?;
        let scheme = uri
            .scheme_str()
            .ok_or("has no scheme")?
            .to_ascii_lowercase();
        let default_port = match scheme.as_str() {
            "http" => 80,
            "https" => 443,
            _ => return Err("must start with http://"),
        };
        let authority = uri.authority().ok_or("has no host")?;
        if authority.as_str().contains('@') {
            return Err("may not hold user information");
        }
        let host = authority.host().to_ascii_lowercase();
        if host.is_empty() {
            return Err("has no host");
        }
        let port = authority.port_u16().unwrap_or(default_port);
        if port == 0 {
            return Err("has port 0");
        }
        if uri.query().is_some() {
            return Err("may not hold a query");
        }
        Ok(Origin {
            scheme,
            host,
            port,
            base_path: uri.path().trim_end_matches('/').to_owned(),
        })
    }

    fn same_origin(&self, other: &Origin) -> bool {
        self.scheme == other.scheme && self.host == other.host && self.port == other.port
    }
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}://{}:{}", self.scheme, self.host, self.port)
    }
}

/// Resolves where a request goes, or why it may not go anywhere. Pure: it
/// sends nothing and reads objects only through `objects`.
///
/// - Target `allow-list`: `object` is a base URL (`http://host[:port][/base]`)
///   whose scheme, host and port must equal those of an `allow_list`
///   entry; the request's `port` is 0 or that port. URL = base URL + path.
/// - Any other target names an `http-target` of the manifest (`targets`),
///   of core kind Pod or Service, declaring the request's port; `objects`
///   must find the named object (in the primary's namespace, in its
///   snapshot). URL = `http://<status.podIP>:<port><path>` for a Pod,
///   `http://<name>.<namespace>.svc:<port><path>` for a Service.
///
/// # Errors
///
/// The [`Refusal`] naming the first rule the request breaks.
pub fn resolve(
    request: &HttpRequest,
    targets: &[HttpTarget],
    allow_list: &[String],
    objects: impl Fn(&KindRef, &str) -> Option<Value>,
) -> Result<Uri, Refusal> {
    let bad_path = || Refusal::BadPath {
        path: request.path.clone(),
    };
    let path = &request.path;
    if !path.starts_with('/') || path.contains('#') || !path.chars().all(|c| c.is_ascii_graphic()) {
        return Err(bad_path());
    }
    PathAndQuery::try_from(path.as_str()).map_err(|_| bad_path())?;

    let base = if request.target == ALLOW_LIST_TARGET {
        allow_listed_base(request, allow_list)?
    } else {
        cluster_base(request, targets, objects)?
    };
    format!("{base}{path}").parse().map_err(|_| bad_path())
}

fn allow_listed_base(request: &HttpRequest, allow_list: &[String]) -> Result<String, Refusal> {
    let origin = Origin::parse(&request.object).map_err(|why| Refusal::BadBaseUrl {
        url: request.object.clone(),
        why,
    })?;
    let listed = allow_list
        .iter()
        .filter_map(|entry| Origin::parse(entry).ok())
        .any(|entry| entry.same_origin(&origin));
    if !listed {
        return Err(Refusal::NotAllowListed {
            origin: origin.to_string(),
        });
    }
    if origin.scheme != "http" {
        return Err(Refusal::HttpsUnsupported {
            origin: origin.to_string(),
        });
    }
    if request.port != 0 && request.port != origin.port {
        return Err(Refusal::PortMismatch {
            port: request.port,
            origin: origin.to_string(),
        });
    }
    Ok(format!(
        "http://{}:{}{}",
        origin.host, origin.port, origin.base_path
    ))
}

fn cluster_base(
    request: &HttpRequest,
    targets: &[HttpTarget],
    objects: impl Fn(&KindRef, &str) -> Option<Value>,
) -> Result<String, Refusal> {
    let target = targets
        .iter()
        .find(|t| t.id == request.target)
        .ok_or_else(|| Refusal::UnknownTarget {
            target: request.target.clone(),
        })?;
    let kind = target.kind.kind.as_str();
    if !target.kind.group.is_empty() || !matches!(kind, "Pod" | "Service") {
        return Err(Refusal::UnsupportedKind {
            target: target.id.clone(),
            kind: target.kind.to_string(),
        });
    }
    if request.port == 0 || !target.ports.contains(&request.port) {
        return Err(Refusal::PortNotDeclared {
            port: request.port,
            target: target.id.clone(),
        });
    }
    let found = objects(&target.kind, &request.object).ok_or_else(|| Refusal::ObjectNotFound {
        kind: kind.to_owned(),
        name: request.object.clone(),
    })?;
    let port = request.port;
    if kind == "Pod" {
        let ip: IpAddr = object::str_at(&found, "status.podIP")
            .and_then(|ip| ip.parse().ok())
            .ok_or_else(|| Refusal::NoPodIp {
                name: request.object.clone(),
            })?;
        Ok(match ip {
            IpAddr::V4(v4) => format!("http://{v4}:{port}"),
            IpAddr::V6(v6) => format!("http://[{v6}]:{port}"),
        })
    } else {
        let name = object::name(&found);
        let namespace = object::namespace(&found).unwrap_or_default();
        if names::dns1123_label(name).is_err() || names::dns1123_label(namespace).is_err() {
            return Err(Refusal::NoServiceName {
                name: name.to_owned(),
                namespace: namespace.to_owned(),
            });
        }
        Ok(format!("http://{name}.{namespace}.svc:{port}"))
    }
}

/// The request's plain headers and its Secret headers (prefix + the
/// base64-decoded `data[key]` of the Secret `secrets` finds by name),
/// Secret values marked sensitive. Pure.
///
/// # Errors
///
/// A [`Refusal`] for an invalid or host-reserved header, or a Secret or key
/// that is missing or unusable — naming the Secret and key, never the value.
pub fn resolve_headers(
    request: &HttpRequest,
    secrets: impl Fn(&str) -> Option<Value>,
) -> Result<HeaderMap, Refusal> {
    let mut headers = HeaderMap::new();
    for (name, value) in &request.headers {
        let header = header_name(name)?;
        let value =
            HeaderValue::from_str(value).map_err(|_| Refusal::BadHeader { name: name.clone() })?;
        headers.append(header, value);
    }
    for sh in &request.secret_headers {
        let header = header_name(&sh.name)?;
        let secret = secrets(&sh.secret).ok_or_else(|| Refusal::SecretMissing {
            secret: sh.secret.clone(),
        })?;
        let encoded = secret
            .get("data")
            .and_then(|d| d.get(&sh.key))
            .and_then(Value::as_str)
            .ok_or_else(|| Refusal::SecretKeyMissing {
                secret: sh.secret.clone(),
                key: sh.key.clone(),
            })?;
        let unusable = || Refusal::SecretValueUnusable {
            secret: sh.secret.clone(),
            key: sh.key.clone(),
            header: sh.name.clone(),
        };
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .map_err(|_| unusable())?;
        let mut bytes = sh.prefix.as_bytes().to_vec();
        bytes.extend_from_slice(&decoded);
        let mut value = HeaderValue::from_bytes(&bytes).map_err(|_| unusable())?;
        value.set_sensitive(true);
        headers.append(header, value);
    }
    Ok(headers)
}

fn header_name(name: &str) -> Result<HeaderName, Refusal> {
    let header = HeaderName::from_bytes(name.as_bytes()).map_err(|_| Refusal::BadHeader {
        name: name.to_owned(),
    })?;
    if RESERVED_HEADERS.contains(&header.as_str()) {
        return Err(Refusal::ReservedHeader {
            name: name.to_owned(),
        });
    }
    Ok(header)
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::sync::atomic::AtomicUsize;

    use serde_json::json;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;
    use crate::plan::SecretHeader;

    const UID: &str = "uid-primary";

    fn primary() -> PrimaryInfo {
        PrimaryInfo {
            uid: UID.into(),
            namespace: "ns".into(),
            name: "p".into(),
            plugin: "observer".into(),
            plugin_version: "0.1.0".into(),
        }
    }

    fn get(id: &str, target: &str, object: &str, port: u16, path: &str) -> HttpRequest {
        HttpRequest {
            id: id.into(),
            target: target.into(),
            object: object.into(),
            port,
            method: HttpMethod::Get,
            path: path.into(),
            body: String::new(),
            headers: vec![],
            secret_headers: vec![],
            timeout_ms: 0,
            max_response_bytes: 0,
            max_age_ms: 0,
        }
    }

    /// What a test server answers: status, body, and how long it waits
    /// after reading a request before answering (the slowness under test).
    #[derive(Clone)]
    struct Reply {
        status: u16,
        body: Vec<u8>,
        delay: Duration,
    }

    impl Reply {
        fn ok(body: &str) -> Self {
            Reply {
                status: 200,
                body: body.as_bytes().to_vec(),
                delay: Duration::ZERO,
            }
        }

        fn slow(mut self, delay: Duration) -> Self {
            self.delay = delay;
            self
        }
    }

    /// A loopback HTTP/1.1 server with canned replies that counts what it sees.
    struct TestServer {
        addr: SocketAddr,
        connections: Arc<AtomicUsize>,
        max_in_flight: Arc<AtomicUsize>,
        /// Each request as received (head and body), lowercased.
        requests: Arc<Mutex<Vec<String>>>,
    }

    impl TestServer {
        async fn start(reply: Reply) -> TestServer {
            let listener = TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind loopback");
            let server = TestServer {
                addr: listener.local_addr().expect("local addr"),
                connections: Arc::default(),
                max_in_flight: Arc::default(),
                requests: Arc::default(),
            };
            let (connections, max_in_flight, requests) = (
                server.connections.clone(),
                server.max_in_flight.clone(),
                server.requests.clone(),
            );
            let in_flight = Arc::new(AtomicUsize::new(0));
            tokio::spawn(async move {
                while let Ok((stream, _)) = listener.accept().await {
                    connections.fetch_add(1, Ordering::SeqCst);
                    let (reply, in_flight, max_in_flight, requests) = (
                        reply.clone(),
                        in_flight.clone(),
                        max_in_flight.clone(),
                        requests.clone(),
                    );
                    tokio::spawn(async move {
                        answer(stream, reply, in_flight, max_in_flight, requests).await;
                    });
                }
            });
            server
        }

        fn url(&self) -> String {
            format!("http://{}", self.addr)
        }

        fn connections(&self) -> usize {
            self.connections.load(Ordering::SeqCst)
        }

        fn requests(&self) -> Vec<String> {
            self.requests.lock().expect("requests lock").clone()
        }
    }

    async fn answer(
        mut stream: TcpStream,
        reply: Reply,
        in_flight: Arc<AtomicUsize>,
        max_in_flight: Arc<AtomicUsize>,
        requests: Arc<Mutex<Vec<String>>>,
    ) {
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        let head_end = loop {
            if let Some(at) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        };
        let head = String::from_utf8_lossy(&seen[..head_end]).to_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        while seen.len() < head_end + length {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
        requests
            .lock()
            .expect("requests lock")
            .push(String::from_utf8_lossy(&seen).to_lowercase());
        // In flight from the request read until just before the answer: the
        // client holds its permit for all of that window.
        let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        max_in_flight.fetch_max(now, Ordering::SeqCst);
        if !reply.delay.is_zero() {
            tokio::time::sleep(reply.delay).await;
        }
        in_flight.fetch_sub(1, Ordering::SeqCst);
        let mut out = format!(
            "HTTP/1.1 {} Canned\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            reply.status,
            reply.body.len()
        )
        .into_bytes();
        out.extend_from_slice(&reply.body);
        let _ = stream.write_all(&out).await;
        let _ = stream.shutdown().await;
    }

    fn observer(config: ObserveConfig) -> Arc<Observer> {
        Observer::new(config)
    }

    fn allowing(server: &TestServer) -> ObserveConfig {
        ObserveConfig {
            allow_list: vec![server.url()],
            ..ObserveConfig::default()
        }
    }

    fn no_objects(_: &KindRef, _: &str) -> Option<Value> {
        None
    }

    fn no_secrets(_: &str) -> Option<Value> {
        None
    }

    /// Prepares and runs `requests` for [`primary`].
    async fn run(observer: &Observer, requests: &[HttpRequest]) -> SubmitOutcome {
        let resolved = observer.prepare(requests, &[], no_objects, no_secrets);
        observer.run(&primary(), resolved).await
    }

    fn probe(server: &TestServer, path: &str) -> HttpRequest {
        get(
            "probe",
            ALLOW_LIST_TARGET,
            &server.url(),
            server.addr.port(),
            path,
        )
    }

    fn observed_at(o: &Observation) -> Timestamp {
        o.observed_at.parse().expect("observedAt is RFC 3339")
    }

    #[tokio::test]
    async fn a_get_result_is_stored_and_returned_with_its_age() {
        let server = TestServer::start(Reply::ok(r#"{"state":"up"}"#)).await;
        let obs = observer(allowing(&server));
        let outcome = run(&obs, &[probe(&server, "/state?full=1")]).await;
        assert_eq!(
            outcome,
            SubmitOutcome {
                sent: 1,
                changed: 1,
                ..SubmitOutcome::default()
            }
        );
        let requests = server.requests();
        assert_eq!(requests.len(), 1);
        assert!(
            requests[0].starts_with("get /state?full=1 http/1.1\r\n"),
            "{requests:?}"
        );
        assert!(
            requests[0].contains(&format!("host: {}", server.addr)),
            "{requests:?}"
        );

        let first = obs.results(UID, Timestamp::now());
        assert_eq!(first.len(), 1);
        let later = observed_at(&first[0]) + jiff::SignedDuration::from_millis(1500);
        let results = obs.results(UID, later);
        assert_eq!(
            results,
            vec![Observation {
                id: "probe".into(),
                status: Some(200),
                body: r#"{"state":"up"}"#.into(),
                error: None,
                observed_at: first[0].observed_at.clone(),
                age_ms: 1500,
            }]
        );
        assert!(obs.results("another-uid", later).is_empty());
        let m = obs.metrics();
        assert_eq!((m.sent, m.succeeded, m.failed), (1, 1, 0));
    }

    #[tokio::test]
    async fn a_base_url_off_the_allow_list_is_refused_before_any_connection() {
        let server = TestServer::start(Reply::ok("never")).await;
        let obs = observer(ObserveConfig {
            allow_list: vec!["http://127.0.0.1:1".into()],
            ..ObserveConfig::default()
        });
        let outcome = run(&obs, &[probe(&server, "/state")]).await;
        assert_eq!((outcome.sent, outcome.refused), (0, 1));
        assert_eq!(server.connections(), 0);
        let results = obs.results(UID, Timestamp::now());
        assert_eq!(results[0].status, None);
        assert_eq!(
            results[0].error.as_deref(),
            Some(
                format!(
                    "refused before sending: http://{} is not on the operator's allow-list",
                    server.addr
                )
                .as_str()
            )
        );
        assert_eq!(obs.metrics().refused, 1);
        assert_eq!(obs.metrics().sent, 0);
    }

    #[test]
    fn allow_list_matching_is_exact_on_scheme_host_and_port() {
        let list = vec![
            "http://Terdut.Example:8080".to_owned(),
            "http://plain.example".to_owned(),
            "https://secure.example".to_owned(),
        ];
        let resolve_at = |object: &str, port: u16, path: &str| {
            resolve(
                &get("x", ALLOW_LIST_TARGET, object, port, path),
                &[],
                &list,
                no_objects,
            )
            .map(|u| u.to_string())
        };
        assert_eq!(
            resolve_at("http://terdut.example:8080", 0, "/v1/teams?x=1").as_deref(),
            Ok("http://terdut.example:8080/v1/teams?x=1")
        );
        assert_eq!(
            resolve_at("http://terdut.example:8080/api/", 8080, "/teams").as_deref(),
            Ok("http://terdut.example:8080/api/teams")
        );
        assert_eq!(
            resolve_at("http://plain.example:80", 80, "/").as_deref(),
            Ok("http://plain.example:80/")
        );
        assert_eq!(
            resolve_at("http://terdut.example:8081", 0, "/"),
            Err(Refusal::NotAllowListed {
                origin: "http://terdut.example:8081".into()
            })
        );
        assert_eq!(
            resolve_at("http://terdut.example:8080", 9090, "/"),
            Err(Refusal::PortMismatch {
                port: 9090,
                origin: "http://terdut.example:8080".into()
            })
        );
        let https = resolve_at("https://secure.example", 0, "/").unwrap_err();
        assert!(
            https.to_string().contains("https is not supported yet"),
            "{https}"
        );
        assert!(matches!(
            resolve_at("http://user@terdut.example:8080", 0, "/"),
            Err(Refusal::BadBaseUrl { .. })
        ));
        assert!(matches!(
            resolve_at("http://terdut.example:8080", 0, "relative"),
            Err(Refusal::BadPath { .. })
        ));
        assert!(matches!(
            resolve_at("http://terdut.example:8080", 0, "/a b"),
            Err(Refusal::BadPath { .. })
        ));
        let config = ObserveConfig {
            allow_list: list,
            ..ObserveConfig::default()
        };
        assert_eq!(config.allow_list_problems().len(), 1);
    }

    fn pod_and_service_targets() -> Vec<HttpTarget> {
        vec![
            HttpTarget {
                id: "members".into(),
                kind: KindRef::namespaced("", "v1", "Pod", "pods"),
                ports: vec![8080],
            },
            HttpTarget {
                id: "api".into(),
                kind: KindRef::namespaced("", "v1", "Service", "services"),
                ports: vec![80, 8443],
            },
        ]
    }

    /// The snapshot of these tests: Pods `m-0` (IPv4), `m-1` (IPv6),
    /// `pending` (no IP) and Service `api`, all in `ns`.
    fn snapshot_objects(kind: &KindRef, name: &str) -> Option<Value> {
        let meta = json!({"name": name, "namespace": "ns"});
        match (kind.kind.as_str(), name) {
            ("Pod", "m-0") => Some(json!({"metadata": meta, "status": {"podIP": "10.244.1.7"}})),
            ("Pod", "m-1") => Some(json!({"metadata": meta, "status": {"podIP": "fd00::5"}})),
            ("Pod", "pending") => Some(json!({"metadata": meta, "status": {}})),
            ("Service", "api") => Some(json!({"metadata": meta})),
            _ => None,
        }
    }

    #[test]
    fn pods_and_services_resolve_to_their_cluster_urls_without_connecting() {
        let targets = pod_and_service_targets();
        let at = |target: &str, object: &str, port: u16| {
            resolve(
                &get("x", target, object, port, "/state"),
                &targets,
                &[],
                snapshot_objects,
            )
            .map(|u| u.to_string())
        };
        assert_eq!(
            at("members", "m-0", 8080).as_deref(),
            Ok("http://10.244.1.7:8080/state")
        );
        assert_eq!(
            at("members", "m-1", 8080).as_deref(),
            Ok("http://[fd00::5]:8080/state")
        );
        assert_eq!(
            at("api", "api", 80).as_deref(),
            Ok("http://api.ns.svc:80/state")
        );
        assert_eq!(
            at("members", "m-0", 9090),
            Err(Refusal::PortNotDeclared {
                port: 9090,
                target: "members".into()
            })
        );
        assert_eq!(
            at("members", "pending", 8080),
            Err(Refusal::NoPodIp {
                name: "pending".into()
            })
        );
        assert_eq!(
            at("members", "stranger", 8080),
            Err(Refusal::ObjectNotFound {
                kind: "Pod".into(),
                name: "stranger".into()
            })
        );
        assert_eq!(
            at("nowhere", "m-0", 8080),
            Err(Refusal::UnknownTarget {
                target: "nowhere".into()
            })
        );
    }

    #[tokio::test]
    async fn a_slow_server_hits_the_deadline() {
        let server = TestServer::start(Reply::ok("late").slow(Duration::from_secs(30))).await;
        let obs = observer(allowing(&server));
        let mut request = probe(&server, "/slow");
        request.timeout_ms = 200;
        let outcome = run(&obs, &[request]).await;
        assert_eq!(outcome.sent, 1);
        let results = obs.results(UID, Timestamp::now());
        assert_eq!(results[0].status, None);
        assert_eq!(
            results[0].error.as_deref(),
            Some("deadline of 200 ms exceeded")
        );
        assert_eq!(obs.metrics().failed, 1);
    }

    #[tokio::test]
    async fn an_oversized_body_is_cut_at_the_cap_with_an_error() {
        let big = "x".repeat(5000);
        let server = TestServer::start(Reply::ok(&big)).await;
        let obs = observer(allowing(&server));
        let mut request = probe(&server, "/big");
        request.max_response_bytes = 100;
        run(&obs, &[request]).await;
        let results = obs.results(UID, Timestamp::now());
        assert_eq!(results[0].status, Some(200));
        assert_eq!(results[0].body, "x".repeat(100));
        assert_eq!(
            results[0].error.as_deref(),
            Some("response body exceeds the cap of 100 bytes and was cut at 100 bytes")
        );
        assert_eq!(obs.metrics().cut, 1);

        // A body of exactly the cap is whole.
        let exact = TestServer::start(Reply::ok(&"y".repeat(100))).await;
        let obs = observer(allowing(&exact));
        let mut request = probe(&exact, "/exact");
        request.max_response_bytes = 100;
        run(&obs, &[request]).await;
        assert_eq!(obs.results(UID, Timestamp::now())[0].error, None);
    }

    #[tokio::test]
    async fn a_get_is_not_resent_for_a_primary_within_the_interval() {
        let server = TestServer::start(Reply::ok("up")).await;
        let obs = observer(allowing(&server));
        let request = probe(&server, "/state");
        assert_eq!(run(&obs, std::slice::from_ref(&request)).await.sent, 1);
        let again = run(&obs, std::slice::from_ref(&request)).await;
        assert_eq!(
            again,
            SubmitOutcome {
                rate_limited: 1,
                ..SubmitOutcome::default()
            }
        );
        assert_eq!(server.connections(), 1);
        assert_eq!(obs.results(UID, Timestamp::now())[0].body, "up");

        // Another primary has its own interval.
        let other = PrimaryInfo {
            uid: "uid-other".into(),
            ..primary()
        };
        let resolved = obs.prepare(std::slice::from_ref(&request), &[], no_objects, no_secrets);
        assert_eq!(obs.run(&other, resolved).await.sent, 1);
        // A changed URL under the same id is a new request.
        assert_eq!(run(&obs, &[probe(&server, "/other")]).await.sent, 1);
        assert_eq!(server.connections(), 3);
        assert_eq!(obs.metrics().rate_limited, 1);
    }

    #[tokio::test]
    async fn at_most_max_concurrent_requests_are_in_flight() {
        let server = TestServer::start(Reply::ok("ok").slow(Duration::from_millis(150))).await;
        let obs = observer(ObserveConfig {
            max_concurrent: 2,
            ..allowing(&server)
        });
        let requests: Vec<HttpRequest> = (0..5)
            .map(|i| {
                let mut r = probe(&server, &format!("/n/{i}"));
                r.id = format!("r{i}");
                r
            })
            .collect();
        let outcome = run(&obs, &requests).await;
        assert_eq!(outcome.sent, 5);
        assert_eq!(server.connections(), 5);
        assert_eq!(server.max_in_flight.load(Ordering::SeqCst), 2);
        assert_eq!(obs.results(UID, Timestamp::now()).len(), 5);
    }

    #[tokio::test]
    async fn mutating_calls_carry_an_idempotency_key_and_are_sent_each_time_asked() {
        let server = TestServer::start(Reply::ok("created")).await;
        let obs = observer(allowing(&server));
        let mut post = probe(&server, "/v1/teams");
        post.id = "create".into();
        post.method = HttpMethod::Post;
        post.body = r#"{"name":"a"}"#.into();
        run(&obs, std::slice::from_ref(&post)).await;
        run(&obs, std::slice::from_ref(&post)).await;
        let key = idempotency_key(UID, "create", HttpMethod::Post, "/v1/teams", &post.body);
        assert_eq!(key.len(), 64);
        let requests = server.requests();
        assert_eq!(requests.len(), 2, "a repeated POST is sent again");
        for seen in &requests {
            assert!(seen.starts_with("post /v1/teams http/1.1\r\n"), "{seen}");
            assert!(
                seen.contains(&format!("idempotency-key: {key}\r\n")),
                "{seen}"
            );
            assert!(seen.ends_with(r#"{"name":"a"}"#), "{seen}");
        }
        assert_ne!(
            key,
            idempotency_key(UID, "create", HttpMethod::Put, "/v1/teams", &post.body)
        );
        // GETs carry none.
        run(&obs, &[probe(&server, "/v1/teams")]).await;
        assert!(!server.requests()[2].contains("idempotency-key"));
    }

    #[tokio::test]
    async fn results_older_than_max_age_are_dropped() {
        let server = TestServer::start(Reply::ok("fresh")).await;
        let obs = observer(allowing(&server));
        let mut request = probe(&server, "/state");
        request.max_age_ms = 1000;
        run(&obs, &[request]).await;
        let at = observed_at(&obs.results(UID, Timestamp::now())[0]);
        let young = obs.results(UID, at + jiff::SignedDuration::from_millis(1000));
        assert_eq!(young.len(), 1);
        assert_eq!(young[0].age_ms, 1000);
        assert!(
            obs.results(UID, at + jiff::SignedDuration::from_millis(1001))
                .is_empty()
        );
    }

    /// Collects what a tracing subscriber writes, for the test thread.
    #[derive(Clone, Default)]
    struct LogBuffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for LogBuffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("log lock").extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn secret_header_values_are_sent_but_never_logged() {
        const VALUE: &str = "s3cr3t-t0ken-value";
        let logs = LogBuffer::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        let _guard = tracing::subscriber::set_default(subscriber);

        let server = TestServer::start(Reply::ok("ok")).await;
        let obs = observer(allowing(&server));
        let mut request = probe(&server, "/v1/teams");
        request.headers = vec![("X-Team".into(), "blue".into())];
        request.secret_headers = vec![SecretHeader {
            name: "Authorization".into(),
            secret: "terdut-admin".into(),
            key: "token".into(),
            prefix: "Bearer ".into(),
        }];
        let encoded = base64::engine::general_purpose::STANDARD.encode(VALUE);
        let secrets = |name: &str| {
            (name == "terdut-admin").then(|| json!({"kind": "Secret", "data": {"token": encoded}}))
        };
        let resolved = obs.prepare(std::slice::from_ref(&request), &[], no_objects, secrets);
        assert!(!format!("{resolved:?}").contains(VALUE), "Debug hides it");
        let outcome = obs.run(&primary(), resolved).await;
        assert_eq!(outcome.sent, 1);

        let seen = &server.requests()[0];
        assert!(
            seen.contains(&format!("authorization: bearer {}", VALUE.to_lowercase())),
            "{seen}"
        );
        assert!(seen.contains("x-team: blue"), "{seen}");
        let logged = String::from_utf8_lossy(&logs.0.lock().expect("log lock")).into_owned();
        assert!(logged.contains("observation request"), "{logged}");
        assert!(
            logged.contains("ns/p") && logged.contains("observer"),
            "{logged}"
        );
        assert!(!logged.contains(VALUE), "{logged}");
        assert!(!logged.contains(&encoded), "{logged}");
    }

    #[test]
    fn a_missing_secret_or_key_is_a_refusal_naming_it_not_its_value() {
        let mut request = get("x", ALLOW_LIST_TARGET, "http://a", 0, "/");
        request.secret_headers = vec![SecretHeader {
            name: "Authorization".into(),
            secret: "creds".into(),
            key: "token".into(),
            prefix: String::new(),
        }];
        assert_eq!(
            resolve_headers(&request, no_secrets)
                .unwrap_err()
                .to_string(),
            "Secret \"creds\" is not in the primary's snapshot"
        );
        let other_key = |_: &str| Some(json!({"data": {"password": "aHVudGVyMg=="}}));
        let refusal = resolve_headers(&request, other_key).unwrap_err();
        assert_eq!(refusal.to_string(), "Secret \"creds\" has no key \"token\"");
        request.headers = vec![("Host".into(), "elsewhere".into())];
        assert_eq!(
            resolve_headers(&request, no_secrets),
            Err(Refusal::ReservedHeader {
                name: "Host".into()
            })
        );
    }

    #[tokio::test]
    async fn submit_reports_its_outcome_and_forget_drops_everything() {
        let server = TestServer::start(Reply::ok("up")).await;
        let obs = observer(allowing(&server));
        let resolved = obs.prepare(&[probe(&server, "/state")], &[], no_objects, no_secrets);
        let (tx, rx) = tokio::sync::oneshot::channel();
        obs.submit(primary(), resolved, move |outcome| {
            let _ = tx.send(outcome);
        });
        let outcome = rx.await.expect("on_done is called");
        assert_eq!((outcome.sent, outcome.changed), (1, 1));
        assert_eq!(obs.results(UID, Timestamp::now()).len(), 1);

        obs.forget(UID);
        assert!(obs.results(UID, Timestamp::now()).is_empty());
        assert_eq!(run(&obs, &[probe(&server, "/state")]).await.changed, 1);
        // The same answer again is no change: nothing new for the plugin.
        assert_eq!(run(&obs, &[probe(&server, "/other")]).await.changed, 0);
    }
}
