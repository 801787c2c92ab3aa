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

use crate::names;
use crate::object;
use crate::plugin::manifest::{HttpTarget, KindRef};
use crate::reconcile::snapshot::Observation;
use crate::reconcile::validate::{HttpMethod, HttpRequest, RequestTarget};

mod policy;
mod resolve;
mod store;
#[cfg(test)]
mod tests;
mod transport;

pub use policy::*;
pub use resolve::*;
use store::*;
use transport::*;

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
                            path = %request.path,
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
}
