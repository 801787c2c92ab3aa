//! The watch stream of one kind (one per watched namespace): list, watch,
//! relist after expiry, retry with backoff after failures, and the
//! stream's state in the `wasmop_watch_streams` gauge.
//!
//! # Guarantees
//! - Errors never end the watch: it retries with capped, jittered backoff
//!   (see [`crate::watch::retry`]), and a relist replaces what its scope
//!   held and reports the differences, so no deletion is missed.
//! - A 404 before the first list marks the kind not served (its CRD is not
//!   installed) until a list succeeds.
//! - Objects are stored without managedFields and kubectl's last-applied
//!   annotation, always with `apiVersion` and `kind`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::watcher::{self, Event};
use serde_json::Value;
use tokio::sync::mpsc;
use wasmop_contract::{MANAGED_BY_LABEL, MANAGED_BY_VALUE};

use super::{CachedObject, Change, KindCache, KindKey, ObjKey, obj_key};
use crate::metrics;
use crate::watch::retry::*;

/// The state of one watch stream in the `wasmop_watch_streams` gauge; its
/// count goes away when the stream ends (the task is aborted or the kind is
/// no longer watched).
pub(super) struct StreamStatus {
    kind: String,
    state: WatchState,
}

impl StreamStatus {
    pub(super) fn new(kind: &str) -> Self {
        let m = metrics::global();
        for s in WatchState::ALL {
            // Every state has a series from the start, so "0 backing off"
            // reads as 0 and not as absent.
            m.add(
                "wasmop_watch_streams",
                &[("kind", kind), ("state", s.label())],
                0.0,
            );
        }
        m.add(
            "wasmop_watch_streams",
            &[("kind", kind), ("state", WatchState::Relisting.label())],
            1.0,
        );
        Self {
            kind: kind.to_string(),
            state: WatchState::Relisting,
        }
    }

    pub(super) fn set(&mut self, state: WatchState) {
        if state == self.state {
            return;
        }
        let m = metrics::global();
        m.add(
            "wasmop_watch_streams",
            &[("kind", &self.kind), ("state", self.state.label())],
            -1.0,
        );
        m.add(
            "wasmop_watch_streams",
            &[("kind", &self.kind), ("state", state.label())],
            1.0,
        );
        self.state = state;
    }
}

impl Drop for StreamStatus {
    fn drop(&mut self) {
        metrics::global().add(
            "wasmop_watch_streams",
            &[("kind", &self.kind), ("state", self.state.label())],
            -1.0,
        );
    }
}

/// Whether a watch error is the API server's 404 to a list or watch: the
/// resource is not served.
pub(super) fn is_not_found(err: &watcher::Error) -> bool {
    match err {
        watcher::Error::WatchError(status) => status.code == 404,
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => matches!(e, kube::Error::Api(s) if s.code == 404),
        watcher::Error::NoResourceVersion => false,
    }
}

/// Ends a failure episode of a watch stream: logs it and records how long it
/// lasted, from the first error to the first objects or completed list after
/// it, in `wasmop_watch_recovery_seconds{kind}`.
pub(super) fn note_recovered(
    failing_since: &mut Option<std::time::Instant>,
    key: &KindKey,
    scope: &str,
) {
    if let Some(since) = failing_since.take() {
        let took = since.elapsed();
        tracing::info!(kind = %key, scope, failing_for = ?took, "watch recovered");
        metrics::global().set(
            "wasmop_watch_recovery_seconds",
            &[("kind", &key.0)],
            took.as_secs_f64(),
        );
    }
}

pub(super) async fn run_watch(
    client: Client,
    kc: Arc<KindCache>,
    scope: Option<String>,
    pending: Arc<std::sync::atomic::AtomicUsize>,
    changes: mpsc::UnboundedSender<Change>,
) {
    let api: Api<DynamicObject> = match &scope {
        Some(ns) => Api::namespaced_with(client, ns, &kc.spec.resource),
        None => Api::all_with(client, &kc.spec.resource),
    };
    let mut config = watcher::Config::default();
    let mut selectors = Vec::new();
    if kc.spec.managed_only {
        selectors.push(format!("{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}"));
    }
    selectors.extend(kc.spec.selector.clone());
    if !selectors.is_empty() {
        config = config.labels(&selectors.join(","));
    }
    let kind = kc.key.to_string();
    let scope_name = scope.as_deref().unwrap_or("");
    let policy = RetryPolicy::default();
    let mut retry = RetryState::default();
    let mut status = StreamStatus::new(&kind);
    // The watcher is polled directly, without kube-runtime's default
    // backoff: that one also waits after a 410 and grows to 30 s while the
    // API server is down. Errors are handled below instead.
    let mut stream = watcher::watcher(api.clone(), config.clone()).boxed();
    let mut buffer: Option<BTreeMap<ObjKey, Arc<CachedObject>>> = None;
    let mut counted_sync = false;
    // A list is running (between Init and InitDone) or about to.
    let mut listing = true;
    let mut relist_reason = "initial";
    let mut failing_since: Option<std::time::Instant> = None;
    loop {
        let polled = if failing_since.is_some() {
            let budget = retry.stall_timeout(&policy);
            match tokio::time::timeout(budget, stream.next()).await {
                Ok(polled) => polled,
                Err(_) => {
                    metrics::global().inc(
                        "wasmop_watch_errors_total",
                        &[("kind", &kind), ("reason", "stalled")],
                    );
                    tracing::info!(kind = %kc.key, scope = scope_name, waited = ?budget,
                        "watch attempt unanswered while recovering; starting over with a list");
                    retry.on_stall(&policy, std::time::Instant::now());
                    stream = watcher::watcher(api.clone(), config.clone()).boxed();
                    listing = true;
                    if counted_sync {
                        relist_reason = "error";
                    }
                    status.set(WatchState::Relisting);
                    continue;
                }
            }
        } else {
            stream.next().await
        };
        let Some(event) = polled else { break };
        let stores = matches!(
            event,
            Ok(Event::InitDone | Event::Apply(_) | Event::Delete(_))
        );
        let event = match event {
            Ok(e) => e,
            Err(e) => {
                let failure = Failure::of(&e);
                metrics::global().inc(
                    "wasmop_watch_errors_total",
                    &[("kind", &kind), ("reason", failure.label())],
                );
                let decision =
                    retry.on_failure(&policy, failure, std::time::Instant::now(), jitter());
                let missing = !counted_sync && is_not_found(&e);
                if missing && !kc.not_served.send_replace(true) {
                    // Said once per cache; the plugin that needs the kind
                    // says it again in its own words (it waits).
                    tracing::info!(kind = %kc.key, scope = scope_name, crd = %kc.crd_name(),
                        "kind not served by the API server (404): its CRD is not installed; \
                         retrying until it is");
                }
                if missing {
                    tracing::debug!(kind = %kc.key, scope = scope_name, error = %e,
                        retry_in = ?decision.delay, "kind still not served");
                } else if failure == Failure::Expired {
                    tracing::info!(kind = %kc.key, scope = scope_name, error = %e,
                        "watch expired; relisting");
                } else if failing_since.is_none() {
                    tracing::warn!(kind = %kc.key, scope = scope_name, error = %e,
                        retry_in = ?decision.delay, "watch failed; retrying");
                } else {
                    tracing::debug!(kind = %kc.key, scope = scope_name, error = %e,
                        retry_in = ?decision.delay, "watch failed again; retrying");
                }
                failing_since.get_or_insert_with(std::time::Instant::now);
                if matches!(
                    e,
                    watcher::Error::InitialListFailed(_) | watcher::Error::NoResourceVersion
                ) {
                    // The watcher starts its list over by itself.
                    listing = true;
                }
                if decision.relist {
                    // A fresh watcher starts with a list. The kube-runtime
                    // watcher relists by itself after a 410 inside the watch
                    // stream, but not after a 410 answering the watch request.
                    stream = watcher::watcher(api.clone(), config.clone()).boxed();
                    listing = true;
                }
                if counted_sync && (decision.relist || listing) {
                    relist_reason = if failure == Failure::Expired {
                        "expired"
                    } else {
                        "error"
                    };
                }
                if !decision.delay.is_zero() {
                    status.set(WatchState::BackingOff);
                    tokio::time::sleep(decision.delay).await;
                }
                status.set(if listing || !counted_sync {
                    WatchState::Relisting
                } else {
                    WatchState::Synced
                });
                continue;
            }
        };
        match event {
            Event::Init => {
                buffer = Some(BTreeMap::new());
                listing = true;
                status.set(WatchState::Relisting);
                let reason = if counted_sync {
                    relist_reason
                } else {
                    "initial"
                };
                metrics::global().inc(
                    "wasmop_watch_lists_total",
                    &[("kind", &kind), ("reason", reason)],
                );
            }
            Event::InitApply(obj) => {
                retry.on_progress();
                if let Some(o) = to_cached(obj, &kc.spec.resource) {
                    buffer
                        .get_or_insert_with(BTreeMap::new)
                        .insert(obj_key(&o), Arc::new(o));
                }
            }
            Event::InitDone => {
                let fresh = buffer.take().unwrap_or_default();
                replace_scope(&kc, scope.as_deref(), fresh, &changes);
                listing = false;
                retry.on_synced();
                status.set(WatchState::Synced);
                note_recovered(&mut failing_since, &kc.key, scope_name);
                if kc.not_served.send_replace(false) {
                    tracing::info!(kind = %kc.key, crd = %kc.crd_name(), "kind served now");
                }
                if !counted_sync {
                    counted_sync = true;
                    if pending.fetch_sub(1, std::sync::atomic::Ordering::SeqCst) == 1 {
                        kc.synced.send_replace(true);
                        let _ = changes.send(Change::listed(kc.key.clone()));
                        tracing::debug!(kind = %kc.key, objects = kc.len(), "cache synced");
                    }
                }
            }
            Event::Apply(obj) => {
                retry.on_progress();
                note_recovered(&mut failing_since, &kc.key, scope_name);
                if let Some(o) = to_cached(obj, &kc.spec.resource) {
                    let key = obj_key(&o);
                    let new = Arc::new(o);
                    let old = kc
                        .data
                        .write()
                        .expect("cache lock")
                        .insert(key, new.clone());
                    kc.stored(&new);
                    let _ = changes.send(Change {
                        kind: kc.key.clone(),
                        old,
                        new: Some(new),
                    });
                }
            }
            Event::Delete(obj) => {
                retry.on_progress();
                note_recovered(&mut failing_since, &kc.key, scope_name);
                if let Some(o) = to_cached(obj, &kc.spec.resource) {
                    let key = obj_key(&o);
                    let old = kc.data.write().expect("cache lock").remove(&key);
                    let _ = changes.send(Change {
                        kind: kc.key.clone(),
                        old: old.or_else(|| Some(Arc::new(o))),
                        new: None,
                    });
                }
            }
        }
        if stores {
            metrics::global().set("wasmop_cache_objects", &[("kind", &kind)], kc.len() as f64);
        }
    }
    // The watcher stream never ends on its own; if it does, say so loudly.
    tracing::error!(kind = %kc.key, "watch stream ended");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

/// Replaces the objects of one scope with a fresh list and reports the
/// differences.
pub(super) fn replace_scope(
    kc: &KindCache,
    scope: Option<&str>,
    fresh: BTreeMap<ObjKey, Arc<CachedObject>>,
    changes: &mpsc::UnboundedSender<Change>,
) {
    let mut data = kc.data.write().expect("cache lock");
    let stale: Vec<ObjKey> = data
        .objects
        .keys()
        .filter(|(ns, _)| scope.is_none_or(|s| s == ns))
        .filter(|k| !fresh.contains_key(*k))
        .cloned()
        .collect();
    for key in stale {
        if let Some(old) = data.remove(&key) {
            let _ = changes.send(Change {
                kind: kc.key.clone(),
                old: Some(old),
                new: None,
            });
        }
    }
    for (key, new) in fresh {
        let unchanged = data
            .objects
            .get(&key)
            .is_some_and(|old| old.resource_version() == new.resource_version());
        if unchanged {
            continue;
        }
        let old = data.insert(key, new.clone());
        kc.stored(&new);
        let _ = changes.send(Change {
            kind: kc.key.clone(),
            old,
            new: Some(new),
        });
    }
}

/// The object as cached: without managedFields and kubectl's last-applied
/// annotation ([`crate::object::strip_bookkeeping`]), and with `apiVersion` and
/// `kind` always set (items of a list response may omit them, and plugins
/// tell objects apart by kind).
pub(super) fn to_cached(obj: DynamicObject, resource: &ApiResource) -> Option<CachedObject> {
    let mut v = serde_json::to_value(obj).ok()?;
    let map = v.as_object_mut()?;
    for (field, value) in [
        ("apiVersion", &resource.api_version),
        ("kind", &resource.kind),
    ] {
        if map
            .get(field)
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            map.insert(field.to_owned(), Value::String(value.clone()));
        }
    }
    crate::object::strip_bookkeeping(&mut v);
    Some(CachedObject::from_value(&v))
}
