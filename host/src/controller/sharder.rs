//! The sharder and the shard's side of hand-over, on the operator (see
//! [`super::shard`] for the model, the ring, the Lease and the fence a
//! write checks): making this replica a shard, the label selector of its
//! primary watches and the fence of its writes, acknowledging a drain;
//! the leader's assignment rounds are `rounds`, claiming the owned objects
//! of a primary that arrives is `claims`.
//!
//! # Guarantees
//! - A replica writes for a primary only while the primary is assigned to
//!   it, not draining, and its own shard Lease holds (`Operator::may_write_for`).
//! - A drain is acknowledged only once no reconcile of the primary runs
//!   on this shard.

mod claims;
mod rounds;

use std::sync::Arc;
use std::time::Duration;

use kube::api::Api;
use serde_json::Value;

use crate::lease::leader;
use crate::lease::shard::{CLAIM_WAIT, Claim, Sharding, Standing, acknowledge};
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
}
