//! The sharder and the shard's side of hand-over, on the operator (see
//! [`super::shard`] for the model, the ring, the Lease and the fence a
//! write checks): making this replica a shard, the label selector of its
//! primary watches, the leader's assignment rounds, acknowledging a
//! drain, and claiming the owned objects of a primary that arrives.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, ListParams};

use super::leader;
use super::shard::{
    CLAIM_WAIT, Claim, DRAIN_LABEL, MOVE_WRITES, Move, Ring, Round, SHARD_LABEL, Sharding,
    Standing, acknowledge, claim_object, plan_move, read_live, write_move,
};
use crate::object;
use crate::plugin::manifest::OwnedKind;
use crate::reconcile::validate::ExistingObject;
impl super::Operator {
    /// Makes this operator a shard (`wasmop run --sharding`): call before
    /// the first plugin is added. Returns false when it already was one.
    pub fn enable_sharding(&self, sharding: Arc<Sharding>) -> bool {
        self.sharding.set(sharding).is_ok()
    }

    /// This replica as a shard, if sharding is on.
    pub fn sharding(&self) -> Option<&Arc<Sharding>> {
        self.sharding.get()
    }

    /// The label selector of `c`'s primary watch: this shard's label when
    /// sharding is on and `c` is per-object, unless a controller (of this
    /// plugin, `incoming`, or a running one) reads or owns that kind too
    /// and so needs it whole.
    pub(super) fn primary_selector(
        &self,
        c: &crate::plugin::manifest::Controller,
        incoming: &[crate::plugin::manifest::Controller],
    ) -> Option<String> {
        let s = self.sharding.get()?;
        if c.scope != wasmop_contract::Scope::Object {
            return None;
        }
        let key = super::kind_key(&c.primary);
        let uses = |o: &crate::plugin::manifest::Controller| {
            o.reads.iter().any(|r| super::kind_key(&r.kind) == key)
                || o.owns.iter().any(|w| super::kind_key(&w.kind) == key)
        };
        let shared = incoming.iter().any(uses)
            || self
                .controllers
                .read()
                .expect("controllers lock")
                .values()
                .any(|a| uses(&a.spec));
        (!shared).then(|| s.selector())
    }

    /// The label selector of the watch of a kind `c` owns, `managed_only`
    /// when no controller reads the kind: this shard's label when sharding
    /// is on and `c` is per-object (the cache then holds only the objects
    /// of this shard's primaries). A kind read by some controller is
    /// watched whole, and the watch of a kind a kind-scoped controller
    /// also owns is widened by [`crate::watch::cache::Cache::ensure`].
    pub(super) fn owned_selector(
        &self,
        c: &crate::plugin::manifest::Controller,
        managed_only: bool,
    ) -> Option<String> {
        let s = self.sharding.get()?;
        (managed_only && c.scope == wasmop_contract::Scope::Object).then(|| s.selector())
    }

    /// The shard that fences `a`'s writes: this replica's when sharding is
    /// on and `a` is per-object.
    pub(super) fn shard_for(&self, a: &super::Active) -> Option<&Sharding> {
        self.sharding
            .get()
            .filter(|_| a.spec.scope == wasmop_contract::Scope::Object)
            .map(|s| &**s)
    }

    /// How this shard stands to `key` as its watch shows it now.
    pub(super) fn standing(
        &self,
        s: &Sharding,
        a: &super::Active,
        key: &super::PrimaryKey,
    ) -> Standing {
        self.cache
            .kind(&a.primary)
            .and_then(|kc| kc.get(&key.namespace, &key.name))
            .map_or(Standing::NotMine, |o| s.standing(&o.labels()))
    }

    /// True while writes for `key` of `a` are allowed: the shard fence
    /// with sharding, the leader fence otherwise.
    pub(super) fn may_write_for(&self, a: &super::Active, key: &super::PrimaryKey) -> bool {
        match self.shard_for(a) {
            Some(s) => s.in_term() && self.standing(s, a, key) == Standing::Mine,
            None => leader::may_write(&self.leader, &self.lease_until),
        }
    }

    /// Gives up `primary` as the sharder asked: removes this shard's label,
    /// at the resourceVersion the drain mark was seen at. Runs as the
    /// primary's reconcile, so no reconcile of it is running meanwhile.
    pub(super) async fn acknowledge_drain(
        &self,
        a: &super::Active,
        key: &super::PrimaryKey,
        primary: &serde_json::Value,
    ) {
        let Some(s) = self.shard_for(a) else { return };
        if !s.in_term() {
            return;
        }
        let api: Api<kube::api::DynamicObject> = if key.namespace.is_empty() {
            Api::all_with(self.client.clone(), &a.primary_resource)
        } else {
            Api::namespaced_with(self.client.clone(), &key.namespace, &a.primary_resource)
        };
        let rv = crate::object::resource_version(primary);
        match acknowledge(&api, &key.name, rv).await {
            Ok(()) => {
                s.forget_claim(object::uid(primary));
                crate::metrics::global()
                    .inc("wasmop_shard_handovers_total", &[("controller", &a.id)]);
                tracing::info!(primary = %key, shard = %s.identity, "drain acknowledged; primary given up");
                self.queue.forget(key);
                self.backoff.reset(key);
            }
            Err(e) => {
                tracing::info!(primary = %key, error = %e, "drain acknowledgement failed; trying again");
                self.queue
                    .add_after(key.clone(), Duration::from_millis(200));
            }
        }
    }

    /// Claims the owned objects of `primary` before this shard reconciles
    /// it for the first time since it came here (a join, a leave, a crash,
    /// a drain): true when the reconcile may go on, its snapshot seeing
    /// every object the primary controls; false when the primary was put
    /// back in the queue (objects relabelled and not in the caches yet, a
    /// conflict, a failed list or write, the fence closed).
    ///
    /// For each owned kind whose cache is filtered by this shard's label,
    /// the objects carrying the primary's UID in `wasmop.dev/owner-uid`
    /// but not this shard's label are listed from the API server
    /// ([`Sharding::claim_selector`], filtered there), in every namespace
    /// the primary may write to that the cache watches. Each one the
    /// primary controls, by the rule validation uses
    /// ([`ExistingObject::is_controlled_by`] under the kind's ownership),
    /// is relabelled for this shard at the resourceVersion it was listed
    /// at, each write under the shard fence; one it does not control is
    /// left untouched (counted and logged), so a claim adopts nothing.
    /// The reconcile then waits until the caches hold every relabelled
    /// object (their watch events queue the primary again).
    pub(super) async fn claim_owned(
        &self,
        s: &Sharding,
        a: &super::Active,
        key: &super::PrimaryKey,
        primary: &serde_json::Value,
    ) -> bool {
        let uid = object::uid(primary);
        match s.claim(uid) {
            Some(Claim::Done) => return true,
            Some(Claim::Waiting { objects, since }) => {
                let arrived = objects.iter().all(|(kind, uid)| {
                    self.cache
                        .kind(&crate::watch::cache::KindKey(kind.clone()))
                        .is_some_and(|kc| kc.get_by_uid(uid).is_some())
                });
                if arrived {
                    s.set_claim(uid, Claim::Done);
                    return true;
                }
                if since.elapsed() < CLAIM_WAIT {
                    // The relabelled objects' watch events queue the
                    // primary again; this is the backstop.
                    self.queue.add_after(key.clone(), Duration::from_secs(1));
                    return false;
                }
                // One of them may be gone: list again.
            }
            None => {}
        }
        let selector = s.selector();
        let mut relabelled = Vec::new();
        let mut refused = 0usize;
        for o in a.spec.owns.iter().filter(|o| !o.is_dependent()) {
            let kind = super::kind_key(&o.kind);
            let filtered = self
                .cache
                .kind(&kind)
                .is_some_and(|kc| kc.spec().selector.as_deref() == Some(selector.as_str()));
            if !filtered {
                // Watched whole: the cache holds them wherever they are labelled.
                continue;
            }
            for api in self.claim_scopes(a, o, primary) {
                let lp = ListParams::default().labels(&s.claim_selector(uid));
                let listed = match api.list_metadata(&lp).await {
                    Ok(l) => l.items,
                    Err(e) => {
                        tracing::info!(primary = %key, kind = %kind, error = %e,
                            "claiming owned objects: list failed; trying again");
                        self.queue
                            .add_after(key.clone(), Duration::from_millis(500));
                        return false;
                    }
                };
                for item in listed {
                    let meta = serde_json::json!({ "metadata": &item.metadata });
                    let name = item.metadata.name.clone().unwrap_or_default();
                    let namespace = item.metadata.namespace.clone();
                    if !ExistingObject::of(&meta).is_controlled_by(uid, &o.ownership) {
                        refused += 1;
                        crate::metrics::global().inc(
                            "wasmop_shard_claims_total",
                            &[("controller", &a.id), ("result", "not_controlled")],
                        );
                        tracing::info!(primary = %key, kind = %kind, object = %name,
                            "claiming owned objects: carries the primary's owner label but the \
                             primary does not control it; left as it is");
                        continue;
                    }
                    if !self.may_write_for(a, key) {
                        return false;
                    }
                    let target: Api<kube::api::DynamicObject> = match &namespace {
                        Some(ns) => Api::namespaced_with(
                            self.client.clone(),
                            ns,
                            &super::api_resource(&o.kind),
                        ),
                        None => Api::all_with(self.client.clone(), &super::api_resource(&o.kind)),
                    };
                    let rv = item.metadata.resource_version.clone().unwrap_or_default();
                    match claim_object(&target, &name, &rv, &s.identity).await {
                        Ok(written) => {
                            crate::metrics::global().inc(
                                "wasmop_shard_claims_total",
                                &[("controller", &a.id), ("result", "relabelled")],
                            );
                            relabelled
                                .push((kind.0.clone(), written.metadata.uid.unwrap_or_default()));
                        }
                        Err(e) => {
                            tracing::info!(primary = %key, kind = %kind, object = %name, error = %e,
                                "claiming owned objects: relabel failed; trying again");
                            self.queue
                                .add_after(key.clone(), Duration::from_millis(200));
                            return false;
                        }
                    }
                }
            }
        }
        if relabelled.is_empty() {
            s.set_claim(uid, Claim::Done);
            return true;
        }
        tracing::info!(primary = %key, shard = %s.identity, relabelled = relabelled.len(), refused,
            "owned objects claimed");
        s.set_claim(
            uid,
            Claim::Waiting {
                objects: relabelled,
                since: std::time::Instant::now(),
            },
        );
        self.queue.add_after(key.clone(), Duration::from_secs(1));
        false
    }

    /// Where the objects of owned kind `o` of `primary` may be, as API
    /// handles to list them: the whole cluster for a cluster-scoped kind;
    /// otherwise the primary's namespace and the controller's write
    /// namespaces (every namespace for `*` or a cluster-scoped primary),
    /// each only where the cache watches.
    fn claim_scopes(
        &self,
        a: &super::Active,
        o: &OwnedKind,
        primary: &serde_json::Value,
    ) -> Vec<Api<kube::api::DynamicObject>> {
        let resource = super::api_resource(&o.kind);
        let all = || vec![Api::all_with(self.client.clone(), &resource)];
        if !o.kind.namespaced {
            return all();
        }
        let own = object::namespace(primary).filter(|_| a.spec.primary.namespaced);
        let watched = self.cache.namespaces();
        let mut namespaces: Vec<&str> =
            if own.is_none() || a.spec.write_namespaces.iter().any(|n| n == "*") {
                if watched.is_empty() {
                    return all();
                }
                watched.iter().map(String::as_str).collect()
            } else {
                own.into_iter()
                    .chain(a.spec.write_namespaces.iter().map(String::as_str))
                    .filter(|ns| self.cache.watches_namespace(true, Some(ns)))
                    .collect()
            };
        namespaces.sort_unstable();
        namespaces.dedup();
        namespaces
            .into_iter()
            .map(|ns| Api::namespaced_with(self.client.clone(), ns, &resource))
            .collect()
    }

    /// One round of the sharder: reads the live shards and every primary
    /// of every per-object controller, and writes the moves
    /// ([`plan_move`]) onto the primaries.
    ///
    /// # Errors
    /// When the shard Leases cannot be read (a primary that cannot be
    /// listed or written is counted in [`Round::failed`]).
    pub async fn shard_round(&self) -> Result<Round, kube::Error> {
        let Some(s) = self.sharding.get() else {
            return Ok(Round::default());
        };
        let live = read_live(&self.client, s).await?;
        let mut round = Round {
            live: live.len(),
            ..Round::default()
        };
        if live.is_empty() {
            return Ok(round);
        }
        s.live.store(live.len(), Ordering::Relaxed);
        let ring = Ring::new(live.iter().map(String::as_str));
        let actives: Vec<Arc<super::Active>> = self
            .actives()
            .into_iter()
            .filter(|a| a.spec.scope == wasmop_contract::Scope::Object)
            .collect();
        let namespaces: Vec<Option<String>> = if self.cache.namespaces().is_empty() {
            vec![None]
        } else {
            self.cache.namespaces().iter().cloned().map(Some).collect()
        };
        for a in &actives {
            for ns in &namespaces {
                let api: Api<kube::api::DynamicObject> = match ns {
                    Some(ns) if a.spec.primary.namespaced => {
                        Api::namespaced_with(self.client.clone(), ns, &a.primary_resource)
                    }
                    _ => Api::all_with(self.client.clone(), &a.primary_resource),
                };
                let mut lp = ListParams::default().limit(500);
                loop {
                    let page = match api.list_metadata(&lp).await {
                        Ok(p) => p,
                        Err(e) => {
                            tracing::warn!(controller = %a.id, error = %e, "sharder: cannot list primaries");
                            round.failed += 1;
                            break;
                        }
                    };
                    let mut moves = Vec::new();
                    for p in &page.items {
                        round.primaries += 1;
                        let m = &p.metadata;
                        let (Some(uid), Some(name), Some(rv)) =
                            (&m.uid, &m.name, &m.resource_version)
                        else {
                            continue;
                        };
                        let labels = m.labels.clone().unwrap_or_default();
                        let Some(desired) = ring.shard_of(uid) else {
                            continue;
                        };
                        let mv = plan_move(
                            labels.get(SHARD_LABEL).map(String::as_str),
                            labels.contains_key(DRAIN_LABEL),
                            desired,
                            &live,
                        );
                        if mv == Move::Keep {
                            continue;
                        }
                        let target: Api<kube::api::DynamicObject> = match &m.namespace {
                            Some(ns) => {
                                Api::namespaced_with(self.client.clone(), ns, &a.primary_resource)
                            }
                            None => Api::all_with(self.client.clone(), &a.primary_resource),
                        };
                        moves.push((target, name.clone(), rv.clone(), mv));
                    }
                    // A page's moves are written MOVE_WRITES at a time, each
                    // only while this replica is the acting leader.
                    let written: Vec<(Move, Result<(), kube::Error>)> =
                        futures::stream::iter(moves)
                            .map(|(target, name, rv, mv)| async move {
                                if !leader::may_write(&self.leader, &self.lease_until) {
                                    return (mv, Ok(()));
                                }
                                let r = write_move(&target, &name, &rv, &mv).await;
                                if let Err(e) = &r {
                                    tracing::debug!(primary = %name, error = %e,
                                        "sharder move failed; next round");
                                }
                                (mv, r)
                            })
                            .buffer_unordered(MOVE_WRITES)
                            .collect()
                            .await;
                    if !leader::may_write(&self.leader, &self.lease_until) {
                        return Ok(round);
                    }
                    for (mv, r) in written {
                        if r.is_err() {
                            round.failed += 1;
                            continue;
                        }
                        let what = match &mv {
                            Move::Assign(_) => {
                                round.assigned += 1;
                                "assign"
                            }
                            Move::Drain => {
                                round.drained += 1;
                                "drain"
                            }
                            _ => {
                                round.undrained += 1;
                                "undrain"
                            }
                        };
                        crate::metrics::global().inc(
                            "wasmop_shard_moves_total",
                            &[("controller", &a.id), ("move", what)],
                        );
                    }
                    match page.metadata.continue_.filter(|c| !c.is_empty()) {
                        Some(c) => lp = lp.continue_token(&c),
                        None => break,
                    }
                }
            }
        }
        Ok(round)
    }

    /// The sharder: while this replica leads, one [`Self::shard_round`]
    /// every third of the shard lease duration; as a follower it only
    /// counts the live shards (for the deletion budget share).
    pub async fn run_sharder(self: Arc<Self>) {
        let Some(s) = self.sharding.get().cloned() else {
            return;
        };
        let mut tick =
            tokio::time::interval((s.lease_duration / 3).max(Duration::from_millis(100)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last: Option<Round> = None;
        loop {
            tick.tick().await;
            if !leader::may_write(&self.leader, &self.lease_until) {
                if let Ok(live) = read_live(&self.client, &s).await {
                    s.live.store(live.len().max(1), Ordering::Relaxed);
                }
                last = None;
                continue;
            }
            match self.shard_round().await {
                Ok(r) => {
                    crate::metrics::global().set("wasmop_shards_live", &[], r.live as f64);
                    let moved = r.assigned + r.drained + r.undrained;
                    if moved > 0 || last.as_ref().is_none_or(|l| l.live != r.live) {
                        tracing::info!(
                            live = r.live,
                            primaries = r.primaries,
                            assigned = r.assigned,
                            drained = r.drained,
                            undrained = r.undrained,
                            failed = r.failed,
                            "sharder round"
                        );
                    }
                    last = Some(r);
                }
                Err(e) => tracing::warn!(error = %e, "sharder: cannot read the shard Leases"),
            }
        }
    }
}
