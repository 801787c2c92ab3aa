//! The leader's assignment rounds: reading the shards' Leases, planning
//! the moves of primaries on the ring, draining then assigning each, and
//! watching for primaries that carry no shard label yet.
//!
//! # Guarantees
//! - A primary moves drain-then-assign: the new shard gets it only after
//!   the old one acknowledged the drain (or its Lease expired), so two
//!   shards never write for one primary.
//! - Only the acting leader writes a move, checked right before each
//!   write; at most [`MOVE_WRITES`] are in flight at once.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, DynamicObject, ListParams};

use crate::lease::leader;
use crate::lease::shard::{
    DRAIN_LABEL, MOVE_WRITES, Move, Ring, Round, SHARD_LABEL, Sharding, plan_move, read_live,
    read_membership, write_move,
};

/// A primary's metadata only (the watch of unlabelled primaries asks
/// for no more).
pub(super) type MetaOnly = kube::core::PartialObjectMeta<DynamicObject>;

/// The leader's watches of unlabelled primaries, by kind (and namespace).
#[derive(Default)]
pub(super) struct UnlabelledWatches(BTreeMap<String, tokio::task::JoinHandle<()>>);

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
pub(super) async fn unlabelled_watch(api: Api<MetaOnly>, s: Arc<Sharding>) {
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

impl crate::controller::Operator {
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
        let actives: Vec<Arc<crate::controller::Active>> = self
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

    /// The sharder, and this shard's claimer (`run_claimer`).
    ///
    /// While this replica leads, [`Self::shard_round`]s: back to back
    /// while a round wrote something (or failed to), every
    /// [`crate::lease::shard::ACK_POLL`] while drains wait for their
    /// acknowledgement, otherwise every third of the shard lease duration
    /// or just after the first live shard Lease expires, whichever comes
    /// first ([`Round::pause`]); and at once when a primary without a shard
    /// label appears (a new one, or one its old shard gave up), which the
    /// leader watches for (`unlabelled_watch`). As a follower it only
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
    pub(super) fn sync_unlabelled_watches(
        &self,
        s: &Arc<Sharding>,
        watches: &mut UnlabelledWatches,
    ) {
        let mut wanted: BTreeMap<String, Api<MetaOnly>> = BTreeMap::new();
        for a in self.actives() {
            if a.spec.scope != wasmop_contract::Scope::Object {
                continue;
            }
            let kind = crate::controller::kind_key(&a.spec.primary);
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
    pub(super) async fn sharder_round(
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
