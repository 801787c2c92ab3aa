//! What the operator does with a cache change: route it to the primaries
//! it concerns and queue them ([`crate::controller::route`] decides, pure),
//! poll the Secrets read by name, and queue a controller's primaries again
//! when an optional kind becomes served.
//!
//! # Guarantees
//! - A change is queued for exactly the primaries routing names; the echo
//!   of the operator's own write waits behind every other change.
//! - A kind-scoped controller gets one debounced call for any number of
//!   changes within [`KIND_DEBOUNCE`](super::KIND_DEBOUNCE).
//! - A primary that is gone leaves nothing behind: its queue entry,
//!   backoff, observations and shard claim are forgotten.

use std::sync::Arc;

use wasmop_contract::Scope;

use super::route::{Route, cached_key_of};
use super::{
    Active, CacheSource, KIND_DEBOUNCE, Operator, PrimaryKey, echo, route, watched_kinds,
    whole_kind_key,
};
use crate::metrics;
use crate::watch::by_name;
use crate::watch::cache::{Change, KindKey};

impl Operator {
    /// Reads again the Secrets primaries name through field references and
    /// routes each change like a watch event.
    pub(super) async fn poll_secrets(&self) {
        let secret = by_name::secret_key();
        let mut referenced: Vec<by_name::SecretId> = self
            .controllers
            .read()
            .expect("controllers lock")
            .values()
            .flat_map(|a| a.route.refs.lock().expect("refs lock").targets_of(&secret))
            .collect();
        referenced.sort();
        referenced.dedup();
        for change in self.secrets.poll(&referenced).await {
            self.route(&change);
        }
    }

    /// A kind was listed for the first time. Its objects, if any, came as
    /// changes of their own; but a controller for which the kind is
    /// optional decided its primaries while the kind was absent (its CRD
    /// not installed, the snapshot naming it absent), and nothing else
    /// would tell it the kind is served now when the list is empty. Every
    /// primary of such a controller is queued again, in the background
    /// like a swap's re-queues. Kinds a controller requires were synced
    /// before it started, so they re-queue nothing.
    pub(super) fn kind_listed(&self, kind: &KindKey, actives: &[Arc<Active>]) {
        for a in actives {
            if a.primary == *kind
                || a.kinds.contains(kind)
                || !watched_kinds(&a.spec).contains(kind)
            {
                continue;
            }
            tracing::info!(controller = %a.id, kind = %kind,
                "optional kind served now; reconciling the controller's primaries again");
            if a.spec.scope == Scope::Kind {
                self.queue.add_after(whole_kind_key(&a.id), KIND_DEBOUNCE);
                continue;
            }
            if let Some(kc) = self.cache.kind(&a.primary) {
                for obj in kc.list(None) {
                    self.queue.add_background(cached_key_of(&a.id, &obj));
                }
            }
        }
    }

    /// Every running controller, as of now.
    pub(super) fn actives(&self) -> Vec<Arc<Active>> {
        self.controllers
            .read()
            .expect("controllers lock")
            .values()
            .cloned()
            .collect()
    }

    /// Routes a cache change to the primaries it concerns.
    pub(super) fn route(&self, change: &Change) {
        let actives = self.actives();
        if change.is_listed() {
            self.kind_listed(&change.kind, &actives);
            return;
        }
        let routes: Vec<&Route> = actives.iter().map(|a| &a.route).collect();
        let source = CacheSource {
            cache: Arc::clone(&self.cache),
            secrets: None,
        };
        let routed = route::route(&routes, change, &source);
        let kind_scoped = |key: &PrimaryKey| {
            actives
                .iter()
                .any(|a| a.id == key.controller && a.spec.scope == Scope::Kind)
        };
        let seen = self.echoes.take(change, |writer| {
            !kind_scoped(writer) && routed.keys.contains(writer)
        });
        for (key, uid) in routed.gone {
            if let Some(s) = self.sharding.get() {
                s.forget_claim(&uid);
            }
            self.observer.forget(&uid);
            self.queue.forget(&key);
            self.backoff.reset(&key);
            self.read_before_create
                .lock()
                .expect("read-before-create lock")
                .remove(&key);
            if kind_scoped(&key) {
                // The others may move up (e.g. a queue): one more call.
                metrics::global().set_primary_gauges(
                    &key.controller,
                    &key.namespace,
                    &key.name,
                    &[],
                );
                self.queue
                    .add_after(whole_kind_key(&key.controller), KIND_DEBOUNCE);
            }
        }
        for key in routed.keys {
            if kind_scoped(&key) {
                self.queue
                    .add_after(whole_kind_key(&key.controller), KIND_DEBOUNCE);
            } else {
                match &seen {
                    echo::Seen::Echo(writer) if *writer == key => {
                        echo::settle(
                            &self.queue,
                            echo::Settled {
                                primary: key,
                                echo: true,
                            },
                        );
                    }
                    // Settled when the write's answer comes.
                    echo::Seen::Held(writer) if *writer == key => {
                        metrics::global().inc(
                            "wasmop_echoes_held_total",
                            &[("controller", &key.controller)],
                        );
                    }
                    _ => self.queue.add(key),
                }
            }
        }
    }
}
