//! Sharding primaries across operator replicas (`wasmop run --sharding`).
//!
//! Without sharding every replica watches and plans everything and only
//! the leader writes. With it, each replica is a *shard*: it holds a Lease
//! of its own, `wasmop-shard-<identity>` in the operator's namespace, and
//! reconciles only the primaries assigned to it.
//!
//! - **Membership.** A shard is live while its Lease is held and renewed
//!   within its duration (the same [`super::leader`] protocol,
//!   on a Lease nobody else takes). A shard whose Lease expired is gone.
//! - **Assignment.** The acting leader (the *sharder*) puts every primary
//!   of every per-object controller on a consistent-hash [`Ring`] of the
//!   live shards (virtual nodes, keyed by the primary's UID) and writes
//!   the result on the primary as the label [`SHARD_LABEL`]` = <shard>`.
//!   Each shard watches its primary kinds with the label selector
//!   `SHARD_LABEL=<itself>`, so its primary caches hold about 1/N of the
//!   primaries. A primary's owned objects are reconciled with it, by the
//!   shard that owns the primary.
//! - **Owned objects follow their primary.** A shard stamps every owned
//!   object it writes with `SHARD_LABEL=<itself>` and, where control is
//!   an ownerReference, with `wasmop.dev/owner-uid=<primary uid>` too
//!   (owner-label kinds carry it already); both are part of the applied
//!   object, so server-side apply keeps them. Its owned-kind watches
//!   select `app.kubernetes.io/managed-by=wasmop,SHARD_LABEL=<itself>`,
//!   so its owned caches hold about 1/N of the objects as well.
//! - **Claim before the first reconcile.** A primary that arrives at a
//!   shard (join, leave, crash, drain) may have owned objects labelled for
//!   its old shard, which the new shard's caches cannot see. Before its
//!   first reconcile there, the shard *claims* them: the reconcile asks
//!   the shard's claimer, which takes the requests in batches of up to
//!   [`CLAIM_BATCH`] primaries and, per owned kind, lists from the API
//!   server with [`Sharding::claim_selector`] (the batch's UIDs as owner
//!   label, not this shard's label; filtered by the server), and for each
//!   object its primary controls (the rule validation uses) writes a merge
//!   patch of [`SHARD_LABEL`] at the resourceVersion it was listed at,
//!   under the primary's shard fence ([`CLAIM_WRITES`] at a time). The reconcile waits until the caches hold
//!   every relabelled object (their watch events queue it again), so a
//!   moved primary's objects are never seen as absent, never made again.
//!   An object that names the primary by label but is not controlled by
//!   it is left as it is (logged, `wasmop_shard_claims_total{result=
//!   "not_controlled"}`): a claim adopts nothing. The claim is remembered
//!   per primary UID until the primary leaves the shard.
//! - **Hand-over, drain then assign.** A primary whose owner is live but
//!   no longer its place on the ring is asked to move: the sharder adds
//!   [`DRAIN_LABEL`]. The owner's next reconcile of it (never concurrent
//!   with a running one: the work queue runs one reconcile per primary at
//!   a time) writes nothing but the acknowledgement, removing
//!   [`SHARD_LABEL`]. Only then, or once the owner's Lease expired, does
//!   the sharder assign the primary to its new shard (and remove the drain
//!   mark). Every label write of the sharder and of the acknowledgement
//!   carries the resourceVersion it was judged at, so a race is a
//!   conflict, tried again in the next round.
//!
//! This module is the model every write checks (the ring, the Lease, the
//! standing of a primary, the label writes); the sharder's rounds and the
//! acknowledgement on the operator are in `controller/sharder.rs`.
//!
//! # Guarantees
//! - **Per-write fence.** Every write of a shard's plan (and its failure
//!   reports and HTTP requests) is made only while (a) its shard Lease
//!   term runs by the local clock (as the leader fence does) and (b) the
//!   primary, as its watch last showed it, carries `SHARD_LABEL=<this
//!   shard>` and no [`DRAIN_LABEL`]. A drain mark seen mid-plan stops the
//!   rest of the plan.
//! - **A shard that lost its term stops.** When the shard Lease term ends
//!   without a shutdown (renewals failed for a whole lease duration, or
//!   the process was frozen), the process exits (code 3): its caches may
//!   be stale and the sharder may have given its primaries away, so it
//!   must not act on them again. Its Deployment restarts it with fresh
//!   caches; its primaries have been re-homed by then.
//! - Kind-scoped controllers (one call over the whole kind) are not
//!   sharded: their primaries carry no shard label, their caches are
//!   whole, and only the leader writes for them, as without sharding.
//!
//! # Caveats
//! - Read kinds are watched whole by every shard, and so is an owned kind
//!   some controller also reads, or that a kind-scoped controller owns
//!   (those caches are not split; nothing needs claiming there).
//! - Every batch of primaries that arrive at a shard costs one list per
//!   owned kind (and namespace they may write to) before their first
//!   reconcile, plus one write per object to relabel; a shard's first
//!   start claims each of its primaries once (lists that find nothing
//!   when nothing moved).
//! - Owned objects written before `--sharding` was turned on carry no
//!   shard label (and, for owner-reference kinds, no owner label), so no
//!   shard's cache or claim sees them: the plan that applies such an
//!   object again meets a conflict (its create is fenced to fail if the
//!   object exists), the retry reads it from the API server and, if the
//!   primary controls it, applies it with the labels. Until then a plan
//!   cannot see (or delete) it.
//! - The sharder lists the metadata of every primary once per round. Its
//!   rounds run back to back while they write (or fail to), every
//!   [`ACK_POLL`] while drains wait for acknowledgements, and otherwise
//!   every third of the shard lease duration or just after the first live
//!   shard Lease expires ([`Round::pause`]); a new primary waits for the
//!   next round to be reconciled.
//! - HTTP requests a plan started before its primary was drained run to
//!   their end; their results stay with the old shard.
//! - Deletion budgets (`maxDeletesPerMinute`) are kept per shard: each
//!   shard enforces the plugin's budget divided by the number of live
//!   shards it last saw (rounded up, at least 1), so the cluster-wide sum
//!   stays within the budget as long as membership is steady.

mod api;
mod ring;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;

use super::leader::{self, LeaseDeadline};
use wasmop_contract::{MANAGED_BY_LABEL, MANAGED_BY_VALUE, OWNER_UID_LABEL};

pub(crate) use self::api::{acknowledge, claim_object, write_move};
pub use self::api::{forged_label_conflict, forged_label_message, read_live, read_membership};
pub use self::ring::{Move, Ring, plan_move};

/// Label on a primary naming the shard that reconciles it.
pub const SHARD_LABEL: &str = "shard.wasmop.dev/shard";

/// Label the sharder puts on a primary whose owner must give it up.
pub const DRAIN_LABEL: &str = "shard.wasmop.dev/drain";

/// Prefix of the shard Leases' names: `wasmop-shard-<identity>`.
pub const SHARD_LEASE_PREFIX: &str = "wasmop-shard-";

/// Field manager of the sharder's label writes.
pub const SHARDER_MANAGER: &str = "wasmop-sharder";

/// Field manager of a shard's drain acknowledgements.
pub const SHARD_MANAGER: &str = "wasmop-shard";

/// Field manager of a shard's claims (the shard label of an owned object
/// relabelled for the shard its primary moved to), told apart from the
/// acknowledgements in an audit log and in `managedFields`.
pub const CLAIM_MANAGER: &str = "wasmop-claim";

/// Virtual nodes per shard on the ring.
pub const VIRTUAL_NODES: usize = 128;

/// Label writes the sharder has in flight at once.
pub const MOVE_WRITES: usize = 64;

/// Exit code of a shard whose Lease term ended without a shutdown.
pub const LOST_TERM_EXIT_CODE: i32 = 3;

/// The shard Lease's name for `identity`.
pub fn lease_name(identity: &str) -> String {
    format!("{SHARD_LEASE_PREFIX}{identity}")
}

/// Checks that `identity` can name a shard: a label value and, prefixed, a
/// Lease name (lower-case letters, digits, `-` and `.`, starting and
/// ending with a letter or digit, at most 63 characters).
///
/// # Errors
/// A sentence saying what is wrong.
pub fn check_identity(identity: &str) -> Result<(), String> {
    let ok_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.';
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if identity.is_empty() || identity.len() > 63 {
        return Err(format!(
            "shard identity {identity:?} must be 1 to 63 characters (set POD_NAME)"
        ));
    }
    if !identity.chars().all(ok_char)
        || !alnum(identity.chars().next())
        || !alnum(identity.chars().last())
    {
        return Err(format!(
            "shard identity {identity:?} must be lower-case letters, digits, '-' and '.', \
             starting and ending with a letter or digit (set POD_NAME)"
        ));
    }
    Ok(())
}

/// The live shards among the Leases of the operator's namespace: those
/// named `wasmop-shard-<holder>` whose holder renewed within the lease
/// duration at `now`.
pub fn live_shards(leases: &[Lease], now: jiff::Timestamp, default: Duration) -> BTreeSet<String> {
    leases
        .iter()
        .filter_map(|l| {
            let name = l.metadata.name.as_deref()?;
            let id = name.strip_prefix(SHARD_LEASE_PREFIX)?;
            let spec = l.spec.as_ref()?;
            let holder = spec.holder_identity.as_deref()?;
            let expires = leader::expiry(spec, default)?;
            (holder == id && expires > now).then(|| id.to_owned())
        })
        .collect()
}

/// When the first of the `live` shards' Leases expires unless renewed
/// (the moment the sharder must look again to re-home a crashed shard's
/// primaries without delay).
pub fn next_expiry(
    leases: &[Lease],
    live: &BTreeSet<String>,
    default: Duration,
) -> Option<jiff::Timestamp> {
    leases
        .iter()
        .filter_map(|l| {
            let id = l
                .metadata
                .name
                .as_deref()?
                .strip_prefix(SHARD_LEASE_PREFIX)?;
            live.contains(id)
                .then(|| leader::expiry(l.spec.as_ref()?, default))
                .flatten()
        })
        .min()
}

/// How a shard stands to one primary, from its labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Assigned to this shard and not draining: it may write.
    Mine,
    /// Assigned to this shard but asked to move: acknowledge, write nothing.
    Draining,
    /// Not this shard's.
    NotMine,
}

/// This replica as a shard: its identity and its Lease term, kept by the
/// shard Lease loop.
#[derive(Debug)]
pub struct Sharding {
    /// The shard's name (its Lease holder identity and label value).
    pub identity: String,
    /// Namespace of the shard Leases.
    pub namespace: String,
    /// The shard Lease duration.
    pub lease_duration: Duration,
    /// True while this replica holds its shard Lease.
    pub flag: Arc<AtomicBool>,
    /// The local-clock end of its term.
    pub until: LeaseDeadline,
    /// Live shards the sharder or this shard last counted (at least 1),
    /// for the split deletion budget.
    pub live: AtomicUsize,
    /// Where the claim of each primary's owned objects stands, by the
    /// primary's UID (see [`Claim`]); a primary not in it has not been
    /// claimed since it came to this shard.
    claims: Mutex<HashMap<String, Claim>>,
    /// Primaries whose claim was requested, in order, for the claimer,
    /// with their UID and ticket.
    requested: Mutex<Vec<ClaimRequest>>,
    /// The last ticket handed out.
    tickets: std::sync::atomic::AtomicU64,
    /// Wakes the claimer.
    claim_wanted: tokio::sync::Notify,
    /// Wakes the sharder: a primary without a shard label was seen (see
    /// [`crate::controller::Operator::run_sharder`]).
    pub(crate) unlabelled_seen: tokio::sync::Notify,
}

/// How far this shard's claim of one primary's owned objects got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// Waiting for the claimer (see [`Sharding::request_claim`]); the
    /// ticket tells this request from an earlier one of the same primary.
    Requested(u64),
    /// Every object the primary controls carries this shard's label and
    /// the owned caches held them (or there was none): reconcile.
    Done,
    /// These objects were relabelled for this shard at `since`; the
    /// reconcile waits until the owned caches hold every one of them.
    Waiting {
        /// `(kind key, uid)` of each relabelled object.
        objects: Vec<(String, String)>,
        /// When they were relabelled.
        since: Instant,
    },
}

/// One primary whose claim was requested.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRequest {
    /// Its queue key.
    pub key: crate::key::PrimaryKey,
    /// Its UID.
    pub uid: String,
    /// Which request of it this is ([`Claim::Requested`]).
    pub ticket: u64,
}

/// Primaries whose owned objects one list of the claimer asks for (by
/// their UIDs in one set-based label selector).
pub const CLAIM_BATCH: usize = 100;

/// Relabelling writes the claimer has in flight at once.
pub const CLAIM_WRITES: usize = 32;

/// How long a claim waits for its relabelled objects to reach the owned
/// caches before it lists them again (one of them may have been deleted
/// meanwhile).
pub const CLAIM_WAIT: Duration = Duration::from_secs(10);

impl Sharding {
    /// A shard named `identity` with its Lease in `namespace`.
    pub fn new(identity: String, namespace: String, lease_duration: Duration) -> Arc<Self> {
        Arc::new(Self {
            identity,
            namespace,
            lease_duration,
            flag: Arc::new(AtomicBool::new(false)),
            until: Arc::new(std::sync::Mutex::new(None)),
            live: AtomicUsize::new(1),
            claims: Mutex::new(HashMap::new()),
            requested: Mutex::new(Vec::new()),
            tickets: std::sync::atomic::AtomicU64::new(0),
            claim_wanted: tokio::sync::Notify::new(),
            unlabelled_seen: tokio::sync::Notify::new(),
        })
    }

    /// The label selector of this shard's primary watches and of its
    /// owned-kind watches (which also select the managed-by label).
    pub fn selector(&self) -> String {
        format!("{SHARD_LABEL}={}", self.identity)
    }

    /// The label selector that finds, on the API server, the objects the
    /// primaries with UIDs `owner_uids` may control that are not labelled
    /// for this shard: the ones their claims must relabel.
    pub fn claim_selector<'a>(&self, owner_uids: impl IntoIterator<Item = &'a str>) -> String {
        let uids: Vec<&str> = owner_uids.into_iter().collect();
        format!(
            "{MANAGED_BY_LABEL}={MANAGED_BY_VALUE},{OWNER_UID_LABEL} in ({}),{SHARD_LABEL}!={}",
            uids.join(","),
            self.identity
        )
    }

    /// Asks the claimer to claim the owned objects of `key` (UID `uid`),
    /// unless that was asked already: true when this call asked.
    pub fn request_claim(&self, key: &crate::key::PrimaryKey, uid: &str) -> bool {
        let ticket = self.tickets.fetch_add(1, Ordering::Relaxed) + 1;
        {
            let mut claims = self.claims.lock().expect("claims lock");
            if matches!(claims.get(uid), Some(Claim::Requested(_))) {
                return false;
            }
            claims.insert(uid.to_owned(), Claim::Requested(ticket));
        }
        self.requested
            .lock()
            .expect("requested lock")
            .push(ClaimRequest {
                key: key.clone(),
                uid: uid.to_owned(),
                ticket,
            });
        self.claim_wanted.notify_one();
        true
    }

    /// Records how far the claim of `request` got, unless the primary
    /// left this shard (or asked again) since it was requested: true when
    /// recorded. A claim that comes too late for its primary decides
    /// nothing.
    pub fn finish_claim(&self, request: &ClaimRequest, claim: Claim) -> bool {
        let mut claims = self.claims.lock().expect("claims lock");
        if claims.get(&request.uid) != Some(&Claim::Requested(request.ticket)) {
            return false;
        }
        claims.insert(request.uid.clone(), claim);
        true
    }

    /// The next batch of requested claims (at most [`CLAIM_BATCH`], oldest
    /// first), waiting until there is one.
    pub async fn next_claims(&self) -> Vec<ClaimRequest> {
        loop {
            {
                let mut requested = self.requested.lock().expect("requested lock");
                if !requested.is_empty() {
                    let n = requested.len().min(CLAIM_BATCH);
                    return requested.drain(..n).collect();
                }
            }
            self.claim_wanted.notified().await;
        }
    }

    /// Where the claim of the primary with UID `uid` stands.
    pub fn claim(&self, uid: &str) -> Option<Claim> {
        self.claims.lock().expect("claims lock").get(uid).cloned()
    }

    /// Records how far the claim of the primary with UID `uid` got.
    pub fn set_claim(&self, uid: &str, claim: Claim) {
        self.claims
            .lock()
            .expect("claims lock")
            .insert(uid.to_owned(), claim);
    }

    /// Forgets the claim of a primary that left this shard (drained,
    /// deleted, or labelled for another shard): if it comes back, its
    /// objects are claimed again.
    pub fn forget_claim(&self, uid: &str) {
        self.claims.lock().expect("claims lock").remove(uid);
    }

    /// How this shard stands to a primary with `labels`.
    pub fn standing(&self, labels: &BTreeMap<String, String>) -> Standing {
        if labels.get(SHARD_LABEL).map(String::as_str) != Some(self.identity.as_str()) {
            Standing::NotMine
        } else if labels.contains_key(DRAIN_LABEL) {
            Standing::Draining
        } else {
            Standing::Mine
        }
    }

    /// True while the shard's Lease term runs.
    pub fn in_term(&self) -> bool {
        leader::may_write(&self.flag, &self.until)
    }

    /// The plugin's per-minute deletion budget as this shard enforces it:
    /// split evenly over the live shards, rounded up, at least 1 (0 stays
    /// 0: no deletes at all).
    pub fn deletion_share(&self, budget: usize) -> usize {
        if budget == 0 {
            return 0;
        }
        budget
            .div_ceil(self.live.load(Ordering::Relaxed).max(1))
            .max(1)
    }
}

/// The labels of an object as JSON.
pub fn labels_of(obj: &serde_json::Value) -> BTreeMap<String, String> {
    obj.pointer("/metadata/labels")
        .and_then(serde_json::Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}

/// What one sharder round did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Round {
    /// Live shards.
    pub live: usize,
    /// Primaries looked at.
    pub primaries: usize,
    /// Label writes by kind of move.
    pub assigned: usize,
    /// Drain marks put.
    pub drained: usize,
    /// Drain marks removed.
    pub undrained: usize,
    /// Writes that met a conflict or failed (tried again next round).
    pub failed: usize,
    /// Primaries marked to drain whose owner has not acknowledged yet.
    pub waiting: usize,
    /// When the first live shard's Lease expires unless renewed.
    pub next_expiry: Option<jiff::Timestamp>,
}

impl Round {
    /// How long the sharder waits before its next round: none while the
    /// last one wrote or failed something (more work is likely: the
    /// acknowledgements of its drains, the next page of moves); a short
    /// pause while owners still have to acknowledge drains; otherwise
    /// `period`, cut short to just after the first live Lease's expiry
    /// so a crashed shard's primaries are re-homed at once.
    pub fn pause(&self, period: Duration, now: jiff::Timestamp) -> Duration {
        if self.assigned + self.drained + self.undrained + self.failed > 0 {
            return Duration::ZERO;
        }
        let mut pause = period;
        if self.waiting > 0 {
            pause = pause.min(ACK_POLL);
        }
        if let Some(at) = self.next_expiry {
            let until = at.duration_since(now).try_into().unwrap_or(Duration::ZERO);
            pause = pause.min(until + EXPIRY_MARGIN);
        }
        pause
    }
}

/// How often the sharder looks again while drains wait for their
/// acknowledgement.
pub const ACK_POLL: Duration = Duration::from_millis(200);

/// How long after a Lease's expiry the sharder looks (clock skew between
/// the shard's renewals and the sharder's reading).
pub const EXPIRY_MARGIN: Duration = Duration::from_millis(100);

/// Counts of primaries per shard label value (`""` for none), for logs.
pub fn tally<'a>(owners: impl IntoIterator<Item = Option<&'a str>>) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for o in owners {
        *out.entry(o.unwrap_or_default().to_owned()).or_insert(0) += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};

    fn uids(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("uid-{i:05}")).collect()
    }

    #[test]
    fn ring_spreads_keys_about_evenly() {
        let ring = Ring::new(["a", "b", "c", "d"]);
        let counts = tally(uids(10_000).iter().map(|u| ring.shard_of(u)));
        assert_eq!(counts.len(), 4, "{counts:?}");
        for (shard, n) in &counts {
            assert!(
                (1_700..=3_300).contains(n),
                "{shard} got {n} of 10000: {counts:?}"
            );
        }
    }

    #[test]
    fn adding_a_shard_moves_only_keys_to_the_new_shard() {
        let before = Ring::new(["a", "b", "c"]);
        let after = Ring::new(["a", "b", "c", "d"]);
        let keys = uids(10_000);
        let mut moved = 0;
        for k in &keys {
            let (x, y) = (before.shard_of(k).unwrap(), after.shard_of(k).unwrap());
            if x != y {
                assert_eq!(y, "d", "{k} moved from {x} to {y}, not to the new shard");
                moved += 1;
            }
        }
        assert!((1_500..=3_500).contains(&moved), "{moved} keys moved");
    }

    #[test]
    fn removing_a_shard_moves_only_its_keys() {
        let before = Ring::new(["a", "b", "c"]);
        let after = Ring::new(["a", "c"]);
        for k in &uids(5_000) {
            let (x, y) = (before.shard_of(k).unwrap(), after.shard_of(k).unwrap());
            if x != "b" {
                assert_eq!(x, y, "{k} of a live shard moved");
            }
        }
    }

    #[test]
    fn ring_is_the_same_whatever_the_order_and_empty_has_no_shard() {
        let a = Ring::new(["x", "y", "z"]);
        let b = Ring::new(["z", "x", "y", "x"]);
        for k in &uids(500) {
            assert_eq!(a.shard_of(k), b.shard_of(k));
        }
        assert_eq!(Ring::new([]).shard_of("k"), None);
    }

    fn live(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn an_unassigned_primary_or_one_of_a_gone_shard_is_assigned_at_once() {
        let l = live(&["a", "b"]);
        assert_eq!(plan_move(None, false, "a", &l), Move::Assign("a".into()));
        assert_eq!(plan_move(Some(""), true, "b", &l), Move::Assign("b".into()));
        assert_eq!(
            plan_move(Some("gone"), false, "b", &l),
            Move::Assign("b".into())
        );
        assert_eq!(
            plan_move(Some("gone"), true, "a", &l),
            Move::Assign("a".into())
        );
    }

    #[test]
    fn a_live_owner_is_asked_to_drain_and_never_overwritten() {
        let l = live(&["a", "b"]);
        assert_eq!(plan_move(Some("a"), false, "b", &l), Move::Drain);
        assert_eq!(
            plan_move(Some("a"), true, "b", &l),
            Move::Keep,
            "waits for the acknowledgement"
        );
        assert_eq!(plan_move(Some("b"), false, "b", &l), Move::Keep);
        assert_eq!(plan_move(Some("b"), true, "b", &l), Move::Undrain);
    }

    fn lease(name: &str, holder: Option<&str>, renewed_secs_ago: i64) -> Lease {
        let now = jiff::Timestamp::now();
        Lease {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_owned),
                lease_duration_seconds: Some(10),
                renew_time: Some(MicroTime(
                    now.checked_sub(jiff::SignedDuration::from_secs(renewed_secs_ago))
                        .unwrap(),
                )),
                ..LeaseSpec::default()
            }),
        }
    }

    #[test]
    fn live_shards_are_held_unexpired_shard_leases_named_after_their_holder() {
        let leases = vec![
            lease("wasmop-shard-a", Some("a"), 1),
            lease("wasmop-shard-b", Some("b"), 20),
            lease("wasmop-shard-c", None, 1),
            lease("wasmop-shard-d", Some("e"), 1),
            lease("wasmop-leader", Some("f"), 1),
        ];
        assert_eq!(
            live_shards(&leases, jiff::Timestamp::now(), Duration::from_secs(10)),
            live(&["a"])
        );
    }

    #[test]
    fn standing_needs_my_label_and_no_drain_mark() {
        let s = Sharding::new("a".into(), "ns".into(), Duration::from_secs(2));
        let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(s.standing(&labels(&[(SHARD_LABEL, "a")])), Standing::Mine);
        assert_eq!(
            s.standing(&labels(&[(SHARD_LABEL, "a"), (DRAIN_LABEL, "true")])),
            Standing::Draining
        );
        assert_eq!(
            s.standing(&labels(&[(SHARD_LABEL, "b")])),
            Standing::NotMine
        );
        assert_eq!(s.standing(&labels(&[])), Standing::NotMine);
    }

    #[test]
    fn a_claim_selects_the_owners_managed_objects_not_labelled_for_this_shard() {
        let s = Sharding::new("shard-a".into(), "ns".into(), Duration::from_secs(2));
        let sel =
            crate::contract::selector::LabelSelector::parse(&s.claim_selector(["u-1", "u-3"]))
                .expect("a valid selector");
        let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let managed = (MANAGED_BY_LABEL, MANAGED_BY_VALUE);
        let owner = (OWNER_UID_LABEL, "u-1");
        assert!(sel.matches(&labels(&[managed, owner, (SHARD_LABEL, "shard-b")])));
        assert!(sel.matches(&labels(&[managed, owner])), "unlabelled too");
        assert!(!sel.matches(&labels(&[managed, owner, (SHARD_LABEL, "shard-a")])));
        assert!(!sel.matches(&labels(&[managed, (OWNER_UID_LABEL, "u-2")])));
        assert!(!sel.matches(&labels(&[owner])), "not managed by wasmop");
        assert!(sel.matches(&labels(&[managed, (OWNER_UID_LABEL, "u-3")])));
    }

    #[test]
    fn a_claim_is_requested_once_until_the_claimer_takes_it() {
        let s = Sharding::new("a".into(), "ns".into(), Duration::from_secs(2));
        let key = |n: &str| crate::key::PrimaryKey {
            controller: "p/c".into(),
            namespace: "ns".into(),
            name: n.into(),
        };
        assert!(s.request_claim(&key("x"), "u-x"));
        assert!(!s.request_claim(&key("x"), "u-x"), "asked once");
        assert!(s.request_claim(&key("y"), "u-y"));
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let batch = rt.block_on(s.next_claims());
        let got: Vec<(crate::key::PrimaryKey, String)> = batch
            .iter()
            .map(|r| (r.key.clone(), r.uid.clone()))
            .collect();
        assert_eq!(
            got,
            vec![(key("x"), "u-x".to_owned()), (key("y"), "u-y".to_owned())]
        );
        assert!(matches!(s.claim("u-x"), Some(Claim::Requested(_))));
        assert!(s.finish_claim(&batch[0], Claim::Done));
        assert_eq!(s.claim("u-x"), Some(Claim::Done));
    }

    #[test]
    fn a_claim_finished_after_its_primary_left_or_asked_again_decides_nothing() {
        let s = Sharding::new("a".into(), "ns".into(), Duration::from_secs(2));
        let key = crate::key::PrimaryKey {
            controller: "p/c".into(),
            namespace: "ns".into(),
            name: "x".into(),
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        s.request_claim(&key, "u");
        let old = rt.block_on(s.next_claims()).remove(0);
        s.forget_claim("u");
        assert!(!s.finish_claim(&old, Claim::Done), "left meanwhile");
        assert_eq!(s.claim("u"), None);
        // It came back and asked again: the old answer is not the new one's.
        s.request_claim(&key, "u");
        assert!(!s.finish_claim(&old, Claim::Done));
        assert!(matches!(s.claim("u"), Some(Claim::Requested(_))));
    }

    #[test]
    fn the_sharder_goes_on_at_once_while_it_moves_and_looks_at_the_first_expiry() {
        let now = jiff::Timestamp::now();
        let period = Duration::from_secs(5);
        let busy = Round {
            assigned: 3,
            ..Round::default()
        };
        assert_eq!(busy.pause(period, now), Duration::ZERO);
        let failing = Round {
            failed: 1,
            ..Round::default()
        };
        assert_eq!(failing.pause(period, now), Duration::ZERO);
        let acks = Round {
            waiting: 2,
            ..Round::default()
        };
        assert_eq!(acks.pause(period, now), ACK_POLL);
        assert_eq!(Round::default().pause(period, now), period);
        let soon = Round {
            next_expiry: now.checked_add(jiff::SignedDuration::from_secs(1)).ok(),
            ..Round::default()
        };
        assert_eq!(
            soon.pause(period, now),
            Duration::from_secs(1) + EXPIRY_MARGIN
        );
        let past = Round {
            next_expiry: now.checked_sub(jiff::SignedDuration::from_secs(1)).ok(),
            ..Round::default()
        };
        assert_eq!(past.pause(period, now), EXPIRY_MARGIN);
    }

    #[test]
    fn the_next_expiry_is_the_first_live_shards() {
        let leases = vec![
            lease("wasmop-shard-a", Some("a"), 1),
            lease("wasmop-shard-b", Some("b"), 5),
            lease("wasmop-shard-c", Some("c"), 20),
            lease("wasmop-leader", Some("a"), 9),
        ];
        let live = live_shards(&leases, jiff::Timestamp::now(), Duration::from_secs(10));
        assert_eq!(live, ["a", "b"].map(String::from).into());
        let b = leader::expiry(leases[1].spec.as_ref().unwrap(), Duration::from_secs(10));
        assert_eq!(
            next_expiry(&leases, &live, Duration::from_secs(10)),
            b,
            "b renewed first of the live ones; c is gone already"
        );
    }

    #[test]
    fn a_claim_is_forgotten_when_its_primary_leaves() {
        let s = Sharding::new("a".into(), "ns".into(), Duration::from_secs(2));
        assert_eq!(s.claim("u"), None);
        s.set_claim("u", Claim::Done);
        assert_eq!(s.claim("u"), Some(Claim::Done));
        s.forget_claim("u");
        assert_eq!(s.claim("u"), None, "claimed again when it comes back");
    }

    #[test]
    fn deletion_budget_is_split_over_live_shards_rounded_up() {
        let s = Sharding::new("a".into(), "ns".into(), Duration::from_secs(2));
        assert_eq!(s.deletion_share(10), 10);
        s.live.store(3, Ordering::Relaxed);
        assert_eq!(s.deletion_share(10), 4);
        assert_eq!(s.deletion_share(1), 1);
        assert_eq!(s.deletion_share(0), 0);
    }

    #[test]
    fn identities_that_cannot_name_a_lease_or_label_are_refused() {
        assert!(check_identity("wasmop-7d9f-x2").is_ok());
        assert!(check_identity("Host-12").is_err());
        assert!(check_identity("-a").is_err());
        assert!(check_identity("a_b").is_err());
        assert!(check_identity(&"a".repeat(64)).is_err());
        assert!(check_identity("").is_err());
    }

    #[test]
    fn an_apply_conflict_over_a_shard_label_is_a_forged_label() {
        let e = "conflict on ConfigMap ns/w-cm: Apply failed with 1 conflict: conflict with \
                 \"kubectl-label\" using v1: .metadata.labels.shard.wasmop.dev/shard";
        assert!(forged_label_conflict(e));
        let m = forged_label_message(&e);
        assert!(
            m.contains("ConfigMap ns/w-cm") && m.contains(SHARD_LABEL),
            "{m}"
        );
        assert!(!forged_label_conflict(
            "conflict on ConfigMap ns/w-cm: Operation cannot be fulfilled: the object has been modified"
        ));
        assert!(!forged_label_conflict(
            "conflict with \"x\" using v1: .data.value"
        ));
    }
}
