//! The sharder and the shard's side of hand-over, on the operator (see
//! [`super::shard`] for the model, the ring, the Lease and the fence a
//! write checks): making this replica a shard, the label selector of its
//! primary watches, the leader's assignment rounds, acknowledging a
//! drain, and claiming the owned objects of a primary that arrives.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use std::collections::{BTreeMap, HashMap};

use futures::StreamExt;
use kube::api::{Api, DynamicObject, ListParams};
use serde_json::{Value, json};
use wasmop_contract::OWNER_UID_LABEL;

use crate::contract::manifest::OwnedKind;
use crate::judge::validate::ExistingObject;
use crate::lease::leader;
use crate::lease::shard::{
    CLAIM_WAIT, CLAIM_WRITES, Claim, ClaimRequest, DRAIN_LABEL, MOVE_WRITES, Move, Ring, Round,
    SHARD_LABEL, Sharding, Standing, acknowledge, claim_object, plan_move, read_live,
    read_membership, write_move,
};
use crate::object;
/// What a claim relabelled (`(kind key, uid)` of each object), or that a
/// list or write failed.
type Claimed = Result<Vec<(String, String)>, ()>;

impl super::Operator {
    /// Makes this operator a shard (`wasmop run --sharding`): call before
    /// the first plugin is added, and run [`Self::run_sharder`] (which
    /// also claims the owned objects of arriving primaries: without it no
    /// primary is reconciled). Returns false when it already was one.
    pub fn enable_sharding(&self, sharding: Arc<Sharding>) -> bool {
        self.sharding.set(sharding).is_ok()
    }

    /// Queues again, in the queue's background, the primaries whose
    /// writes the leader Lease fences, after this replica became the
    /// leader: every primary ([`Self::requeue_all`]) without sharding;
    /// with it, only those of kind-scoped controllers (per-object ones are
    /// fenced by the shard Lease, whose own gain requeues them), so a new
    /// leader does not reconcile its whole share again while it is taking
    /// over a crashed shard's primaries.
    pub fn requeue_leader_fenced(&self) {
        if self.sharding.get().is_none() {
            self.requeue_all();
            return;
        }
        for a in self.actives() {
            if a.spec.scope == wasmop_contract::Scope::Kind {
                self.queue.add_background(super::whole_kind_key(&a.id));
            }
        }
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
        c: &crate::contract::manifest::Controller,
        incoming: &[crate::contract::manifest::Controller],
    ) -> Option<String> {
        let s = self.sharding.get()?;
        if c.scope != wasmop_contract::Scope::Object {
            return None;
        }
        let key = super::kind_key(&c.primary);
        let uses = |o: &crate::contract::manifest::Controller| {
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
        c: &crate::contract::manifest::Controller,
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

    /// How this shard stands to the primary `key` of UID `uid` as its
    /// watch shows it now. The object cached under the name counts only
    /// while it has that UID: a successor made under the same name is
    /// another primary, and its assignment says nothing of this one's.
    pub(super) fn standing(
        &self,
        s: &Sharding,
        a: &super::Active,
        key: &super::PrimaryKey,
        uid: &str,
    ) -> Standing {
        self.cache
            .kind(&a.primary)
            .and_then(|kc| kc.get(&key.namespace, &key.name))
            .filter(|o| !uid.is_empty() && o.uid() == uid)
            .map_or(Standing::NotMine, |o| s.standing(&o.labels()))
    }

    /// True while writes for the primary `key` of `a` whose UID is `uid`
    /// are allowed: the shard fence with sharding (the primary cached
    /// under the name is still that one, assigned here), the leader fence
    /// otherwise.
    pub(super) fn may_write_for(
        &self,
        a: &super::Active,
        key: &super::PrimaryKey,
        uid: &str,
    ) -> bool {
        match self.shard_for(a) {
            Some(s) => s.in_term() && self.standing(s, a, key, uid) == Standing::Mine,
            None => leader::may_write(&self.leader, &self.lease_until),
        }
    }

    /// Gives up `primary` as the sharder asked: removes this shard's label,
    /// at the resourceVersion the drain mark was seen at. Runs as the
    /// primary's reconcile, so no reconcile of it is running meanwhile;
    /// waits (queues the primary again) while a claim of its owned objects
    /// is running, so no write of this shard for it is answered after.
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
        if matches!(s.claim(object::uid(primary)), Some(Claim::Requested(_))) {
            // The claimer may be relabelling its owned objects: each write
            // passed the fence when it was sent, but may still be on its
            // way. The hand-over waits until they are answered, so the
            // next owner never writes before them; the claimer, which now
            // sees the drain, writes no more and queues the primary again.
            self.queue
                .add_after(key.clone(), Duration::from_millis(200));
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

    /// Whether this shard may reconcile `primary` now, as far as its
    /// claim goes: true once the owned objects of the primary are claimed
    /// and in the caches (see [`Self::run_claimer`]); otherwise false,
    /// after asking the claimer for the claim or, while relabelled objects
    /// are on their way into the caches, queueing a look again (their
    /// watch events queue the primary too).
    pub(super) fn claimed(&self, s: &Sharding, key: &super::PrimaryKey, primary: &Value) -> bool {
        let uid = object::uid(primary);
        match s.claim(uid) {
            Some(Claim::Done) => return true,
            // The claimer queues the primary when its batch is done.
            Some(Claim::Requested(_)) => return false,
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
                    self.queue.add_after(key.clone(), Duration::from_secs(1));
                    return false;
                }
                // One of them may be gone: claim again.
            }
            None => {}
        }
        s.request_claim(key, uid);
        false
    }

    /// The claimer: claims the owned objects of the primaries that arrived
    /// at this shard, in batches of up to [`super::shard::CLAIM_BATCH`]
    /// requested by [`Self::claimed`], then queues each primary again.
    ///
    /// For each owned kind whose cache is filtered by this shard's label,
    /// the objects carrying one of the batch's primary UIDs in
    /// `wasmop.dev/owner-uid` but not this shard's label are listed from
    /// the API server ([`Sharding::claim_selector`], filtered there), in
    /// every namespace the primaries may write to that the cache watches.
    /// Each one its primary controls, by the rule validation uses
    /// ([`ExistingObject::is_controlled_by`] under the kind's ownership),
    /// is relabelled for this shard at the resourceVersion it was listed
    /// at ([`CLAIM_WRITES`] at a time), each write under the primary's
    /// shard fence; one it does not control is left untouched (counted
    /// and logged), so a claim adopts nothing. A primary whose list or
    /// writes failed is claimed again at its next reconcile.
    async fn run_claimer(self: Arc<Self>, s: Arc<Sharding>) {
        loop {
            let batch = s.next_claims().await;
            self.claim_batch(&s, batch).await;
        }
    }

    /// Claims one batch (see [`Self::run_claimer`]).
    async fn claim_batch(&self, s: &Sharding, batch: Vec<ClaimRequest>) {
        // By controller and namespace: one list per owned kind and scope.
        let mut groups: BTreeMap<(Arc<str>, String), Vec<ClaimRequest>> = BTreeMap::new();
        for r in batch {
            groups
                .entry((r.key.controller.clone(), r.key.namespace.clone()))
                .or_default()
                .push(r);
        }
        for ((controller, namespace), members) in groups {
            let active = self
                .controllers
                .read()
                .expect("controllers lock")
                .get(&controller)
                .cloned();
            let Some(a) = active else {
                for r in &members {
                    s.forget_claim(&r.uid);
                }
                continue;
            };
            let outcome = self.claim_group(s, &a, &namespace, &members).await;
            for r in &members {
                let claim = match outcome.get(r.uid.as_str()) {
                    Some(Ok(objects)) if objects.is_empty() => Claim::Done,
                    Some(Ok(objects)) => {
                        tracing::info!(primary = %r.key, shard = %s.identity,
                            relabelled = objects.len(), "owned objects claimed");
                        Claim::Waiting {
                            objects: objects.clone(),
                            since: std::time::Instant::now(),
                        }
                    }
                    _ => {
                        // Asked again by its next reconcile.
                        s.forget_claim(&r.uid);
                        self.queue
                            .add_after(r.key.clone(), Duration::from_millis(500));
                        continue;
                    }
                };
                if s.finish_claim(r, claim) {
                    self.queue.add(r.key.clone());
                }
            }
        }
    }

    /// Claims the owned objects of `members` (primaries of `a` in
    /// `namespace`): per member UID, the `(kind key, uid)` of each object
    /// relabelled, or an error when a list or a write failed.
    async fn claim_group(
        &self,
        s: &Sharding,
        a: &super::Active,
        namespace: &str,
        members: &[ClaimRequest],
    ) -> HashMap<String, Claimed> {
        let mut out: HashMap<String, Claimed> = members
            .iter()
            .map(|r| (r.uid.clone(), Ok(Vec::new())))
            .collect();
        let keys: HashMap<&str, &super::PrimaryKey> =
            members.iter().map(|r| (r.uid.as_str(), &r.key)).collect();
        let selector = s.selector();
        let claim_selector = s.claim_selector(members.iter().map(|r| r.uid.as_str()));
        let mut writes = Vec::new();
        for o in a.spec.owns.iter().filter(|o| !o.is_dependent()) {
            let kind = super::kind_key(&o.kind);
            let filtered = self
                .cache
                .kind(&kind)
                .is_some_and(|kc| kc.spec().selector.as_deref() == Some(selector.as_str()));
            if !filtered {
                // Watched whole: the cache holds them however labelled.
                continue;
            }
            let resource = super::api_resource(&o.kind);
            for api in self.claim_scopes(a, o, namespace) {
                let lp = ListParams::default().labels(&claim_selector);
                let listed = match api.list_metadata(&lp).await {
                    Ok(l) => l.items,
                    Err(e) => {
                        tracing::info!(controller = %a.id, kind = %kind, error = %e,
                            "claiming owned objects: list failed; trying again");
                        for r in out.values_mut() {
                            *r = Err(());
                        }
                        return out;
                    }
                };
                for item in listed {
                    let meta = json!({ "metadata": &item.metadata });
                    let name = item.metadata.name.clone().unwrap_or_default();
                    let Some((owner, key)) = object::labels_get(&meta, OWNER_UID_LABEL)
                        .and_then(|u| keys.get_key_value(u))
                        .map(|(u, k)| (u.to_string(), *k))
                    else {
                        continue;
                    };
                    if !ExistingObject::of(&meta).is_controlled_by(&owner, &o.ownership) {
                        crate::metrics::global().inc(
                            "wasmop_shard_claims_total",
                            &[("controller", &a.id), ("result", "not_controlled")],
                        );
                        tracing::info!(primary = %key, kind = %kind, object = %name,
                            "claiming owned objects: carries the primary's owner label but the \
                             primary does not control it; left as it is");
                        continue;
                    }
                    let target: Api<DynamicObject> = match &item.metadata.namespace {
                        Some(ns) => Api::namespaced_with(self.client.clone(), ns, &resource),
                        None => Api::all_with(self.client.clone(), &resource),
                    };
                    let rv = item.metadata.resource_version.clone().unwrap_or_default();
                    writes.push((owner, key.clone(), kind.0.clone(), target, name, rv));
                }
            }
        }
        let written: Vec<(String, String, Result<String, ()>)> = futures::stream::iter(writes)
            .map(|(owner, key, kind, target, name, rv)| async move {
                if !self.may_write_for(a, &key, &owner) {
                    return (owner, kind, Err(()));
                }
                match claim_object(&target, &name, &rv, &s.identity).await {
                    Ok(w) => {
                        crate::metrics::global().inc(
                            "wasmop_shard_claims_total",
                            &[("controller", &a.id), ("result", "relabelled")],
                        );
                        (owner, kind, Ok(w.metadata.uid.unwrap_or_default()))
                    }
                    Err(e) => {
                        tracing::info!(primary = %key, object = %name, error = %e,
                            "claiming owned objects: relabel failed; trying again");
                        (owner, kind, Err(()))
                    }
                }
            })
            .buffer_unordered(CLAIM_WRITES)
            .collect()
            .await;
        for (owner, kind, r) in written {
            let Some(entry) = out.get_mut(&owner) else {
                continue;
            };
            match (entry, r) {
                (Ok(objects), Ok(uid)) => objects.push((kind, uid)),
                (entry, Err(())) => *entry = Err(()),
                (Err(()), Ok(_)) => {}
            }
        }
        out
    }

    /// Where the objects of owned kind `o` of `a`'s primaries in
    /// `namespace` may be, as API handles to list them: the whole cluster
    /// for a cluster-scoped kind; otherwise the primaries' namespace and
    /// the controller's write namespaces (every namespace for `*` or a
    /// cluster-scoped primary), each only where the cache watches.
    fn claim_scopes(
        &self,
        a: &super::Active,
        o: &OwnedKind,
        namespace: &str,
    ) -> Vec<Api<DynamicObject>> {
        let resource = super::api_resource(&o.kind);
        let all = || vec![Api::all_with(self.client.clone(), &resource)];
        if !o.kind.namespaced {
            return all();
        }
        let own = Some(namespace).filter(|ns| a.spec.primary.namespaced && !ns.is_empty());
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
        let (live, next_expiry) = read_membership(&self.client, s).await?;
        let mut round = Round {
            live: live.len(),
            next_expiry,
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
                            let owner = labels.get(SHARD_LABEL).map(String::as_str);
                            if labels.contains_key(DRAIN_LABEL) && owner != Some(desired) {
                                round.waiting += 1;
                            }
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

    /// The sharder, and this shard's claimer ([`Self::run_claimer`]).
    ///
    /// While this replica leads, [`Self::shard_round`]s: back to back
    /// while a round wrote something (or failed to), every
    /// [`super::shard::ACK_POLL`] while drains wait for their
    /// acknowledgement, otherwise every third of the shard lease duration
    /// or just after the first live shard Lease expires, whichever comes
    /// first ([`Round::pause`]); and at once when a primary without a shard
    /// label appears (a new one, or one its old shard gave up), which the
    /// leader watches for ([`unlabelled_watch`]). As a follower it only
    /// counts the live shards (for the deletion budget share), every third
    /// of the lease.
    pub async fn run_sharder(self: Arc<Self>) {
        let Some(s) = self.sharding.get().cloned() else {
            return;
        };
        let claimer = self.clone().run_claimer(s.clone());
        let period = (s.lease_duration / 3).max(Duration::from_millis(100));
        let rounds = async {
            let mut last: Option<Round> = None;
            let mut pause = Duration::ZERO;
            let mut watches = UnlabelledWatches::default();
            loop {
                tokio::select! {
                    () = tokio::time::sleep(pause) => {}
                    () = s.unlabelled_seen.notified() => {}
                }
                pause = period;
                if !leader::may_write(&self.leader, &self.lease_until) {
                    watches.stop_all();
                    if let Ok(live) = read_live(&self.client, &s).await {
                        s.live.store(live.len().max(1), Ordering::Relaxed);
                    }
                    last = None;
                    continue;
                }
                self.sync_unlabelled_watches(&s, &mut watches);
                self.sharder_round(&mut last, &mut pause, period).await;
            }
        };
        tokio::join!(claimer, rounds);
    }

    /// Starts a watch of unlabelled primaries ([`unlabelled_watch`]) for
    /// each per-object controller's primary kind and watched namespace
    /// that has none, and stops those no controller needs any more.
    fn sync_unlabelled_watches(&self, s: &Arc<Sharding>, watches: &mut UnlabelledWatches) {
        let mut wanted: BTreeMap<String, Api<MetaOnly>> = BTreeMap::new();
        for a in self.actives() {
            if a.spec.scope != wasmop_contract::Scope::Object {
                continue;
            }
            let kind = super::kind_key(&a.spec.primary);
            if !a.spec.primary.namespaced || self.cache.namespaces().is_empty() {
                wanted.insert(
                    kind.to_string(),
                    Api::all_with(self.client.clone(), &a.primary_resource),
                );
                continue;
            }
            for ns in self.cache.namespaces() {
                wanted.insert(
                    format!("{kind} in {ns}"),
                    Api::namespaced_with(self.client.clone(), ns, &a.primary_resource),
                );
            }
        }
        watches.0.retain(|key, task| {
            let keep = wanted.contains_key(key);
            if !keep {
                task.abort();
            }
            keep
        });
        for (key, api) in wanted {
            watches
                .0
                .entry(key)
                .or_insert_with(|| tokio::spawn(unlabelled_watch(api, s.clone())));
        }
    }

    /// One round of [`Self::run_sharder`] on the leader, logged when it
    /// moved something or the live shards changed; sets the pause before
    /// the next.
    async fn sharder_round(
        &self,
        last: &mut Option<Round>,
        pause: &mut Duration,
        period: Duration,
    ) {
        match self.shard_round().await {
            Ok(r) => {
                *pause = r.pause(period, jiff::Timestamp::now());
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
                        waiting = r.waiting,
                        "sharder round"
                    );
                }
                *last = Some(r);
            }
            Err(e) => tracing::warn!(error = %e, "sharder: cannot read the shard Leases"),
        }
    }
}

/// A primary's metadata only (the watch of unlabelled primaries asks
/// for no more).
type MetaOnly = kube::core::PartialObjectMeta<DynamicObject>;

/// The leader's watches of unlabelled primaries, by kind (and namespace).
#[derive(Default)]
struct UnlabelledWatches(BTreeMap<String, tokio::task::JoinHandle<()>>);

impl UnlabelledWatches {
    fn stop_all(&mut self) {
        for (_, task) in std::mem::take(&mut self.0) {
            task.abort();
        }
    }
}

impl Drop for UnlabelledWatches {
    fn drop(&mut self) {
        self.stop_all();
    }
}

/// Watches the metadata of the primaries `api` lists that carry no shard
/// label and wakes the sharder for each one seen, so a new primary (or
/// one whose old shard acknowledged its drain) is assigned within a round
/// rather than a period. A failed watch is started again after a pause;
/// the sharder's periodic rounds assign what it missed meanwhile.
async fn unlabelled_watch(api: Api<MetaOnly>, s: Arc<Sharding>) {
    use kube::runtime::watcher::{self, Event};
    let config = watcher::Config::default().labels(&format!("!{SHARD_LABEL}"));
    loop {
        let mut stream = watcher::watcher(api.clone(), config.clone()).boxed();
        while let Some(event) = stream.next().await {
            match event {
                Ok(Event::Apply(_) | Event::InitApply(_)) => s.unlabelled_seen.notify_one(),
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "sharder: watch of unlabelled primaries failed");
                    break;
                }
            }
        }
        tokio::time::sleep(s.lease_duration / 3).await;
    }
}
