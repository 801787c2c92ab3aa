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
//! 3. [`Observer::snapshot`] — the stored results of a primary, with their
//!    age, for [`crate::build_snapshot`], and which result of each id they
//!    are ([`SeenResults`]), handed back to `submit` with the plan made
//!    from them.
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
//! | result bytes kept per primary, the most one snapshot carries | 4 MiB |
//! | result bytes kept over all primaries | 256 MiB |
//! | age of a kept result (`maxAgeMs` 0 means this) | 1 h |
//! | requests sent per primary within the 15 s interval, any method | 16 |
//!
//! # Guarantees
//!
//! - A request is refused before anything is sent unless its target is a
//!   Pod or Service the manifest declares as an `http-target` (on a declared
//!   port) and the snapshot holds (the primary owns or its controller reads
//!   it), or a base URL on the operator's allow-list ([`resolve`]). A Pod
//!   is called at its Pod IP; a Service only when it is of type ClusterIP
//!   with a selector, at its cluster IP (ExternalName, selector-less and
//!   headless Services are refused with the reason).
//! - Every request sent counts toward the primary's budget
//!   (`max_requests_per_primary` per `per_primary_interval`), whatever its
//!   method; a GET repeated unchanged within the interval is not re-sent
//!   and costs nothing.
//! - Mutating calls (POST, PUT, PATCH, DELETE) carry an `Idempotency-Key` header
//!   ([`idempotency_key`]) and are sent at most once per [`Observer::run`]
//!   that lists them (and within the budget): the host never retries them
//!   on its own. While one is in flight, a plan listing the same id again
//!   does not send it a second time; nor does a plan made from a snapshot
//!   taken before that call's answer was stored (it repeats a call whose
//!   answer its plugin has not seen, [`SeenResults`]): the primary is
//!   re-queued and the next plan sees the answer.
//! - A plan's GETs are sent after its mutating calls have answered, so a
//!   GET listed with a write observes it and its result is the newer one.
//! - Secret header values are sent, never logged, and print as `Sensitive`
//!   in `Debug` output.
//!
//! # Caveats
//!
//! - An `https` base URL is called over TLS (rustls) trusting the system's
//!   roots plus the request's `caBundle` (inline PEM, or a key of a Secret
//!   the snapshot holds); a bundle that cannot be used is refused with
//!   [`Refusal::BadCaBundle`]. Pods and Services are called over plain
//!   `http`.
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

use crate::contract::manifest::{HttpTarget, KindRef};
use crate::judge::snapshot::Observation;
use crate::judge::validate::{CaBundle, HttpMethod, HttpRequest, RequestTarget};
use crate::object;
use wasmop_contract::ObservationOutcome;

mod policy;
mod resolve;
mod store;
#[cfg(test)]
mod tests;
mod tls;
mod transport;

pub use policy::*;
pub use resolve::*;
use store::*;
use transport::*;

/// The mutating requests of one [`Observer::run`] marked in flight;
/// unmarked when dropped, after their results are stored.
struct InFlight<'a> {
    observer: &'a Observer,
    uid: &'a str,
    epoch: u64,
    ids: Vec<String>,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if self.ids.is_empty() {
            return;
        }
        let mut state = self.observer.lock();
        if let Some(entry) = state.get_mut(self.uid)
            && entry.epoch == self.epoch
        {
            for id in &self.ids {
                entry.in_flight.remove(id);
            }
        }
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
    /// Sequence number of the next result stored, for any primary.
    next_seq: AtomicU64,
    counters: Counters,
    tls: tls::Trust,
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
            next_seq: AtomicU64::new(1),
            counters: Counters::default(),
            tls: tls::Trust::default(),
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
                        let tls = if uri.scheme_str() == Some("https") {
                            Some(
                                self.tls
                                    .client_config(request.ca_bundle.as_ref(), &secrets)?,
                            )
                        } else {
                            None
                        };
                        Ok(Endpoint { uri, headers, tls })
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
        planned_from: SeenResults,
        on_done: impl FnOnce(SubmitOutcome) + Send + 'static,
    ) -> tokio::task::JoinHandle<()> {
        let observer = Arc::clone(self);
        tokio::spawn(async move {
            let outcome = observer
                .run_planned(&primary, requests, Some(&planned_from))
                .await;
            on_done(outcome);
        })
    }

    /// [`Observer::run_planned`] for a plan made from the results stored
    /// now: no mutating call counts as superseded.
    pub async fn run(
        &self,
        primary: &PrimaryInfo,
        requests: Vec<ResolvedRequest>,
    ) -> SubmitOutcome {
        self.run_planned(primary, requests, None).await
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
    /// - Mutating calls are sent at most once per call of `run`, with
    ///   their `Idempotency-Key`; the host never retries them. One whose
    ///   id is still in flight for this primary (listed by an earlier plan
    ///   whose answer has not arrived) is not sent again: the answer in
    ///   flight is stored under that id.
    /// - A mutating call whose id has a stored result other than the one
    ///   the plan's snapshot carried (`planned_from`: the result arrived
    ///   after the snapshot was taken) is not sent: the plan repeats a call
    ///   whose answer its plugin has not seen. It counts as `superseded`,
    ///   and the caller re-queues the primary so the plugin sees it.
    /// - Every request that would be sent takes one of the primary's
    ///   `max_requests_per_primary` sends per `per_primary_interval`; when
    ///   none is left it is rate-limited: not sent, its earlier result
    ///   stays, nothing changes (so no re-queue).
    /// - What is kept stays within the per-primary and total byte budgets
    ///   (oldest results dropped first).
    /// - Requests run concurrently, at most `max_concurrent` in flight over
    ///   all primaries, each under its own deadline and body cap; the
    ///   plan's GETs are sent only after its mutating calls have answered,
    ///   so a GET observes the writes listed with it.
    /// - Each result replaces the one stored under its id for this primary.
    ///   A result arriving after [`Observer::forget`] is dropped.
    pub async fn run_planned(
        &self,
        primary: &PrimaryInfo,
        requests: Vec<ResolvedRequest>,
        planned_from: Option<&SeenResults>,
    ) -> SubmitOutcome {
        let mut outcome = SubmitOutcome::default();
        let mut to_send = Vec::new();
        let mut refused_ids = Vec::new();
        let epoch = {
            let mut state = self.lock();
            let entry = state.entry(primary.uid.clone()).or_insert_with(|| {
                PrimaryState::new(self.next_epoch.fetch_add(1, Ordering::Relaxed))
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
                            outcome: ObservationOutcome::Failed,
                            seq: self.next_seq.fetch_add(1, Ordering::Relaxed),
                        };
                        if entry.store(&request.id, stored, &self.config) {
                            outcome.changed += 1;
                        }
                        refused_ids.push(request.id.clone());
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
                    if !entry.take_send(now, interval, self.config.max_requests_per_primary) {
                        self.rate_limited(primary, &request, &endpoint, &mut outcome);
                        continue;
                    }
                    entry.last_get.insert(request.id.clone(), (now, print));
                } else if entry.in_flight.contains(&request.id) {
                    outcome.in_flight += 1;
                    tracing::debug!(
                        primary = %primary, id = %request.id, url = %endpoint.uri,
                        method = method_name(request.method),
                        "mutating observation request not re-sent: the same id is in flight"
                    );
                    continue;
                } else if planned_from.is_some_and(|seen| {
                    seen.missed(&request.id, entry.results.get(&request.id).map(|s| s.seq))
                }) {
                    outcome.superseded += 1;
                    tracing::info!(
                        primary = %primary, uid = %primary.uid, plugin = %primary.plugin,
                        version = %primary.plugin_version, id = %request.id,
                        method = method_name(request.method), url = %endpoint.uri,
                        "mutating observation request not sent: its answer arrived after \
                         the snapshot this plan was made from; the plugin sees it next"
                    );
                    continue;
                } else if !entry.take_send(now, interval, self.config.max_requests_per_primary) {
                    self.rate_limited(primary, &request, &endpoint, &mut outcome);
                    continue;
                } else {
                    entry.in_flight.insert(request.id.clone());
                }
                to_send.push((request, endpoint));
            }
            let epoch = entry.epoch;
            for id in &refused_ids {
                enforce_total(&mut state, &self.config, (&primary.uid, id));
            }
            epoch
        };

        outcome.sent = to_send.len();
        // Clears the in-flight marks however this ends (also when the
        // future is dropped mid-send).
        let _in_flight = InFlight {
            observer: self,
            uid: &primary.uid,
            epoch,
            ids: to_send
                .iter()
                .filter(|(r, _)| r.method != HttpMethod::Get)
                .map(|(r, _)| r.id.clone())
                .collect(),
        };
        // Mutating calls first, then the GETs: a GET listed with a write
        // observes it (sent together, a GET answered from before the write
        // could arrive after it and look newer).
        let (writes, reads): (Vec<_>, Vec<_>) = to_send
            .iter()
            .partition(|(request, _)| request.method != HttpMethod::Get);
        let mut answered: Vec<(&HttpRequest, Stored)> = Vec::with_capacity(to_send.len());
        for phase in [writes, reads] {
            let stored = futures::future::join_all(
                phase
                    .iter()
                    .map(|(request, endpoint)| self.perform(primary, request, endpoint)),
            )
            .await;
            answered.extend(phase.iter().map(|(request, _)| request).zip(stored));
        }

        let mut state = self.lock();
        if let Some(entry) = state.get_mut(&primary.uid)
            && entry.epoch == epoch
        {
            let mut stored_ids = Vec::new();
            for (request, mut stored) in answered {
                stored.seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
                if entry.store(&request.id, stored, &self.config) {
                    outcome.changed += 1;
                }
                stored_ids.push(request.id.as_str());
            }
            for id in stored_ids {
                enforce_total(&mut state, &self.config, (&primary.uid, id));
            }
        }
        outcome
    }

    /// The stored results of a primary at `now`, sorted by id, each with its
    /// `ageMs`. Results older than their request's `maxAgeMs` (0 meaning
    /// [`ObserveConfig::max_result_age`]) are dropped, here and from
    /// storage. Their bytes never exceed
    /// [`ObserveConfig::max_result_bytes_per_primary`].
    pub fn results(&self, primary_uid: &str, now: Timestamp) -> Vec<Observation> {
        self.snapshot(primary_uid, now).0
    }

    /// [`Observer::results`], with which result of each id they are: run
    /// the plan made from them with [`Observer::submit`] or
    /// [`Observer::run_planned`] and these marks.
    pub fn snapshot(&self, primary_uid: &str, now: Timestamp) -> (Vec<Observation>, SeenResults) {
        let mut state = self.lock();
        let Some(entry) = state.get_mut(primary_uid) else {
            return (Vec::new(), SeenResults::default());
        };
        let max_age = self.config.max_result_age;
        entry.results.retain(|_, s| !s.expired(now, max_age));
        let seen = SeenResults {
            seq: entry
                .results
                .iter()
                .map(|(id, s)| (id.clone(), s.seq))
                .collect(),
        };
        let observations = entry
            .results
            .iter()
            .map(|(id, s)| Observation {
                id: id.clone(),
                status: s.status,
                body: s.body.clone(),
                error: s.error.clone(),
                observed_at: s.observed_at.to_string(),
                age_ms: s.age_ms(now),
                outcome: Some(s.outcome),
            })
            .collect();
        (observations, seen)
    }

    /// Counts and logs a request the per-primary budget did not allow.
    fn rate_limited(
        &self,
        primary: &PrimaryInfo,
        request: &HttpRequest,
        endpoint: &Endpoint,
        outcome: &mut SubmitOutcome,
    ) {
        self.counters.rate_limited.fetch_add(1, Ordering::Relaxed);
        outcome.rate_limited += 1;
        tracing::debug!(
            primary = %primary, id = %request.id, url = %endpoint.uri,
            limit = self.config.max_requests_per_primary,
            "observation request not sent: the primary's request budget is spent"
        );
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
