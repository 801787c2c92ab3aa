//! Leader election with a `coordination.k8s.io/v1` Lease.
//!
//! Leader election gates writes, not reads (DESIGN invariant 8, ADR-0014):
//! every replica watches and computes plans; only the replica holding the
//! Lease writes. [`run`] keeps one write flag (the operator's
//! [`leader_flag`](crate::controller::Operator::leader_flag)) true exactly
//! while this replica holds a Lease it renewed within the lease duration.
//!
//! The protocol, one attempt every [`LeaderConfig::renew_every`]:
//!
//! 1. GET the Lease (a quorum read, never a cache).
//! 2. [`decide`] what to do with it: create it, renew it, take it over,
//!    or follow its holder.
//! 3. Write with optimistic concurrency: `create` (a conflict means another
//!    replica created it first) or `replace` carrying the resourceVersion
//!    that was read (a conflict means someone wrote in between). Never
//!    forced.
//!
//! The flag goes true after a successful create, renewal or take-over, and
//! false as soon as another holder is seen or the last successful renewal
//! is older than the lease duration. On shutdown the Lease is released
//! (holder cleared) so a successor need not wait for it to expire.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Client;
use kube::api::{Api, PostParams};
use tokio::time::Instant;

/// When this replica's write permission ends by its own clock: one lease
/// duration after the last successful Lease write was sent. `None` while
/// no term is running (and always without leader election, where the flag
/// alone gates writes). Every write of a plan checks it, so a replica
/// whose election loop is starved still stops writing in time.
pub type LeaseDeadline = Arc<std::sync::Mutex<Option<std::time::Instant>>>;

/// True while writes are allowed: the flag is set and, when a term
/// deadline is known, it has not passed on the local clock.
pub fn may_write(
    flag: &AtomicBool,
    deadline: &std::sync::Mutex<Option<std::time::Instant>>,
) -> bool {
    flag.load(Ordering::SeqCst)
        && deadline
            .lock()
            .map(|d| d.is_none_or(|d| std::time::Instant::now() < d))
            .unwrap_or(false)
}

/// Default name of the Lease.
pub const DEFAULT_LEASE_NAME: &str = "wasmop-leader";

/// Default lease duration: how long a holder that stopped renewing keeps
/// the Lease before another replica may take it over.
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);

/// Where the Lease lives, who this replica is, and the timing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderConfig {
    /// Name of the Lease (default [`DEFAULT_LEASE_NAME`]).
    pub lease_name: String,
    /// Namespace of the Lease.
    pub namespace: String,
    /// This replica's identity, written as `holderIdentity`; unique per
    /// replica (default [`default_identity`]).
    pub identity: String,
    /// Lease duration (default [`DEFAULT_LEASE_DURATION`]); written as
    /// whole seconds, rounded up, at least one.
    pub lease_duration: Duration,
    /// Time between attempts (default a third of the lease duration); must
    /// be shorter than the lease duration.
    pub renew_every: Duration,
}

impl LeaderConfig {
    /// The defaults, with the Lease in `namespace`.
    pub fn new(namespace: impl Into<String>) -> Self {
        Self {
            lease_name: DEFAULT_LEASE_NAME.to_string(),
            namespace: namespace.into(),
            identity: default_identity(),
            lease_duration: DEFAULT_LEASE_DURATION,
            renew_every: DEFAULT_LEASE_DURATION / 3,
        }
    }

    /// Sets the lease duration and renews every third of it.
    #[must_use]
    pub fn with_lease_duration(mut self, lease_duration: Duration) -> Self {
        self.lease_duration = lease_duration;
        self.renew_every = lease_duration / 3;
        self
    }

    /// The lease duration as written in `leaseDurationSeconds`.
    pub fn lease_duration_seconds(&self) -> i32 {
        let secs =
            self.lease_duration.as_secs() + u64::from(self.lease_duration.subsec_nanos() > 0);
        i32::try_from(secs.max(1)).unwrap_or(i32::MAX)
    }
}

/// `$POD_NAME` when set (the Deployment passes it), else the host name and
/// the process id.
pub fn default_identity() -> String {
    if let Some(pod) = std::env::var("POD_NAME").ok().filter(|p| !p.is_empty()) {
        return pod;
    }
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "wasmop".to_string());
    format!("{host}-{}", std::process::id())
}

/// What to do with the Lease as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// There is no Lease: create it with this replica as holder.
    Create,
    /// This replica holds the Lease and its term has not expired: write a
    /// new `renewTime`.
    Renew,
    /// Another replica holds the Lease and its term has not expired: do not
    /// write anything, to the Lease or elsewhere.
    Follow {
        /// The holder.
        holder: String,
        /// When its term expires unless it renews.
        expires: Timestamp,
    },
    /// The Lease is released (no holder) or its holder's term expired:
    /// become the holder, counting one more transition.
    TakeOver {
        /// The holder whose term expired; `None` when the Lease was released.
        previous: Option<String>,
    },
    /// The Lease names this replica but its term expired (renewals failed
    /// for longer than the lease duration, or the clocks disagree): stop
    /// writing now, then acquire it again as a new term.
    StepDownAndReacquire,
}

/// When the holder's term ends: `renewTime` (else `acquireTime`) plus
/// `leaseDurationSeconds` (else `default_duration`). `None` when the Lease
/// carries neither time: nothing proves its holder alive.
pub fn expiry(spec: &LeaseSpec, default_duration: Duration) -> Option<Timestamp> {
    let since = spec.renew_time.as_ref().or(spec.acquire_time.as_ref())?.0;
    let duration = match spec.lease_duration_seconds {
        Some(s) if s > 0 => SignedDuration::from_secs(i64::from(s)),
        _ => SignedDuration::try_from(default_duration).unwrap_or(SignedDuration::MAX),
    };
    Some(since.checked_add(duration).unwrap_or(Timestamp::MAX))
}

/// Decides what this replica (`identity`) does with `lease` as read at
/// `now`; `default_duration` stands in for a missing
/// `leaseDurationSeconds`.
///
/// # Caveats
/// Expiry compares the holder's `renewTime` with this replica's clock:
/// replicas whose clocks disagree by a good part of the lease duration may
/// overlap. Keep node clocks synchronised (as Kubernetes itself assumes).
pub fn decide(
    lease: Option<&Lease>,
    now: Timestamp,
    identity: &str,
    default_duration: Duration,
) -> Action {
    let Some(lease) = lease else {
        return Action::Create;
    };
    let spec = lease.spec.clone().unwrap_or_default();
    let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
    let expires = expiry(&spec, default_duration);
    let fresh = expires.is_some_and(|e| e > now);
    match holder {
        None => Action::TakeOver { previous: None },
        Some(h) if h == identity => {
            if fresh {
                Action::Renew
            } else {
                Action::StepDownAndReacquire
            }
        }
        Some(h) => match expires {
            Some(expires) if fresh => Action::Follow { holder: h, expires },
            _ => Action::TakeOver { previous: Some(h) },
        },
    }
}

/// Whether this replica may write: it renewed `since_renewal` ago (`None`:
/// it holds no renewed Lease), and that is less than `lease_duration`.
pub fn may_lead(since_renewal: Option<Duration>, lease_duration: Duration) -> bool {
    since_renewal.is_some_and(|d| d < lease_duration)
}

/// A new Lease held by `config.identity` since `now`.
pub fn new_lease(config: &LeaderConfig, now: Timestamp) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(config.lease_name.clone()),
            namespace: Some(config.namespace.clone()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(config.identity.clone()),
            lease_duration_seconds: Some(config.lease_duration_seconds()),
            acquire_time: Some(MicroTime(now)),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(0),
            ..LeaseSpec::default()
        }),
    }
}

/// `lease` (as read, resourceVersion kept) acquired by `config.identity`
/// at `now`; `leaseTransitions` counts one more when the holder changes.
pub fn acquired(mut lease: Lease, config: &LeaderConfig, now: Timestamp) -> Lease {
    let mut spec = lease.spec.take().unwrap_or_default();
    if spec.holder_identity.as_deref() != Some(config.identity.as_str()) {
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
    }
    spec.holder_identity = Some(config.identity.clone());
    spec.lease_duration_seconds = Some(config.lease_duration_seconds());
    spec.acquire_time = Some(MicroTime(now));
    spec.renew_time = Some(MicroTime(now));
    lease.spec = Some(spec);
    lease
}

/// `lease` (as read, resourceVersion kept) renewed at `now`.
pub fn renewed(mut lease: Lease, config: &LeaderConfig, now: Timestamp) -> Lease {
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.renew_time = Some(MicroTime(now));
    spec.lease_duration_seconds = Some(config.lease_duration_seconds());
    lease
}

/// `lease` (as read, resourceVersion kept) with its holder cleared, so any
/// replica may take it over at once.
pub fn released(mut lease: Lease) -> Lease {
    if let Some(spec) = lease.spec.as_mut() {
        spec.holder_identity = None;
    }
    lease
}

/// The result of one attempt.
#[derive(Debug)]
enum Outcome {
    /// This replica holds the Lease, renewed at the instant given.
    Holding(Instant),
    /// Another replica holds it.
    Following(String),
    /// A concurrent write won; read again at once.
    Conflict,
    /// The API call failed.
    Failed(kube::Error),
}

/// The state of one replica's election.
struct Elector<F> {
    api: Api<Lease>,
    config: LeaderConfig,
    flag: Arc<AtomicBool>,
    until: LeaseDeadline,
    on_elected: F,
    /// Called after each true→false transition of the flag that is not a
    /// shutdown (the term ended).
    on_lost: Box<dyn Fn() + Send + Sync>,
    /// The gauge that is 1 while the term runs.
    gauge: &'static str,
    /// When the last successful write of this replica's term was sent.
    renewed_at: Option<Instant>,
    /// The holder last logged as followed.
    following: Option<String>,
}

impl<F: Fn()> Elector<F> {
    fn lease_ref(&self) -> String {
        format!("{}/{}", self.config.namespace, self.config.lease_name)
    }

    async fn attempt(&self) -> Outcome {
        // Taken before the read: the renewTime written and the local
        // deadline both start no later than the write itself.
        let sent = Instant::now();
        let now = Timestamp::now();
        let name = &self.config.lease_name;
        let lease = match self.api.get_opt(name).await {
            Ok(l) => l,
            Err(e) => return Outcome::Failed(e),
        };
        let action = decide(
            lease.as_ref(),
            now,
            &self.config.identity,
            self.config.lease_duration,
        );
        let pp = PostParams::default();
        let written = match (action, lease) {
            (Action::Follow { holder, .. }, _) => return Outcome::Following(holder),
            (Action::Create, _) => self.api.create(&pp, &new_lease(&self.config, now)).await,
            (Action::Renew, Some(lease)) => {
                self.api
                    .replace(name, &pp, &renewed(lease, &self.config, now))
                    .await
            }
            (Action::StepDownAndReacquire, Some(lease)) => {
                self.step_down("the Lease shows this replica's term expired");
                self.api
                    .replace(name, &pp, &acquired(lease, &self.config, now))
                    .await
            }
            (Action::TakeOver { previous }, Some(lease)) => {
                tracing::info!(lease = %self.lease_ref(), previous = previous.as_deref().unwrap_or("<released>"),
                    "taking over the Lease");
                self.api
                    .replace(name, &pp, &acquired(lease, &self.config, now))
                    .await
            }
            // `decide` answers Create for an absent Lease and nothing else.
            (_, None) => return Outcome::Conflict,
        };
        match written {
            Ok(_) => Outcome::Holding(sent),
            Err(kube::Error::Api(s)) if s.is_conflict() || s.is_already_exists() => {
                Outcome::Conflict
            }
            Err(e) => Outcome::Failed(e),
        }
    }

    fn leading(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }

    /// The instant after which this replica may no longer write.
    fn deadline(&self) -> Option<Instant> {
        self.renewed_at.map(|t| t + self.config.lease_duration)
    }

    fn step_down(&self, why: &str) {
        if self.flag.swap(false, Ordering::SeqCst) {
            crate::metrics::global().set(self.gauge, &[], 0.0);
            tracing::warn!(lease = %self.lease_ref(), identity = %self.config.identity, why, "lost leadership");
            (self.on_lost)();
        }
    }

    /// Updates the flag from `outcome`; true when it was a conflict.
    fn record(&mut self, outcome: Outcome) -> bool {
        match outcome {
            Outcome::Holding(at) => {
                self.renewed_at = Some(at);
                if let Ok(mut until) = self.until.lock() {
                    *until = Some((at + self.config.lease_duration).into_std());
                }
                self.following = None;
                if may_lead(Some(at.elapsed()), self.config.lease_duration)
                    && !self.flag.swap(true, Ordering::SeqCst)
                {
                    crate::metrics::global().set(self.gauge, &[], 1.0);
                    tracing::info!(lease = %self.lease_ref(), identity = %self.config.identity, "became leader");
                    (self.on_elected)();
                }
                false
            }
            Outcome::Following(holder) => {
                self.renewed_at = None;
                self.step_down(&format!("{holder} holds the Lease"));
                if self.following.as_deref() != Some(holder.as_str()) {
                    tracing::info!(lease = %self.lease_ref(), identity = %self.config.identity, %holder, "following");
                    self.following = Some(holder);
                }
                false
            }
            Outcome::Conflict => {
                tracing::debug!(lease = %self.lease_ref(), "the Lease changed since it was read; reading it again");
                true
            }
            Outcome::Failed(e) => {
                tracing::warn!(lease = %self.lease_ref(), error = %e, "leader election: Lease request failed");
                false
            }
        }
    }

    fn check_deadline(&self) {
        let since = self.renewed_at.map(|t| t.elapsed());
        if self.leading() && !may_lead(since, self.config.lease_duration) {
            self.step_down("no renewal within the lease duration");
        }
    }

    async fn release(&self) {
        let Ok(Some(lease)) = self.api.get_opt(&self.config.lease_name).await else {
            return;
        };
        let holder = lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref());
        if holder != Some(self.config.identity.as_str()) {
            return;
        }
        match self
            .api
            .replace(
                &self.config.lease_name,
                &PostParams::default(),
                &released(lease),
            )
            .await
        {
            Ok(_) => tracing::info!(lease = %self.lease_ref(), "released the Lease"),
            Err(e) => {
                tracing::warn!(lease = %self.lease_ref(), error = %e, "could not release the Lease")
            }
        }
    }
}

/// Runs leader election until `shutdown` resolves, then releases the Lease.
///
/// `until` is the operator's [`LeaseDeadline`], kept at one lease duration
/// after the last successful write of the term.
///
/// `flag` is the operator's write flag: set true only while this replica
/// holds a Lease it renewed within [`LeaderConfig::lease_duration`], false
/// otherwise. `on_elected` runs after each false→true transition (pass
/// [`Operator::requeue_all`](crate::controller::Operator::requeue_all), so
/// the writes skipped while following are made).
///
/// # Guarantees
/// - The Lease is only written with `create` or with a `replace` carrying
///   the resourceVersion that was read; a conflict is never overridden.
/// - The flag drops at the latest one lease duration after the last
///   successful renewal was sent, even when the API server does not
///   answer (every request is bounded by that deadline).
/// - On shutdown the flag is cleared first, then the Lease released if
///   this replica still holds it.
///
/// # Caveats
/// - A write that passed the flag check just before the flag dropped may
///   still land; the window is one API call.
/// - Dropping the future (or aborting its task) skips the release: the
///   others wait for the Lease to expire, as after a crash.
/// - Clock skew between replicas: see [`decide`].
pub async fn run<F>(
    client: Client,
    config: LeaderConfig,
    flag: Arc<AtomicBool>,
    until: LeaseDeadline,
    on_elected: F,
    shutdown: impl Future<Output = ()>,
) where
    F: Fn(),
{
    run_with_loss(
        client,
        config,
        flag,
        until,
        on_elected,
        TermHooks {
            on_lost: Box::new(|| {}),
            gauge: "wasmop_leader",
        },
        shutdown,
    )
    .await;
}

/// What [`run_with_loss`] does beyond [`run`].
pub struct TermHooks {
    /// Called each time the term ends other than by shutdown.
    pub on_lost: Box<dyn Fn() + Send + Sync>,
    /// The gauge kept at 1 while the term runs.
    pub gauge: &'static str,
}

impl std::fmt::Debug for TermHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TermHooks")
            .field("gauge", &self.gauge)
            .finish()
    }
}

/// [`run`], calling `on_lost` each time the term ends other than by
/// `shutdown` (the flag dropped: another holder, or no renewal within the
/// lease duration), and keeping the gauge `gauge` (instead of
/// `wasmop_leader`) at 1 while the term runs. A shard uses it for its own
/// Lease (see [`shard`](crate::lease::shard)).
pub async fn run_with_loss<F>(
    client: Client,
    config: LeaderConfig,
    flag: Arc<AtomicBool>,
    until: LeaseDeadline,
    on_elected: F,
    hooks: TermHooks,
    shutdown: impl Future<Output = ()>,
) where
    F: Fn(),
{
    let mut config = config;
    if config.renew_every.is_zero() || config.renew_every >= config.lease_duration {
        let fixed = config.lease_duration / 3;
        tracing::warn!(renew_every = ?config.renew_every, lease_duration = ?config.lease_duration,
            using = ?fixed, "renew interval must be shorter than the lease duration");
        config.renew_every = fixed;
    }
    let mut elector = Elector {
        api: Api::namespaced(client, &config.namespace),
        config,
        flag,
        until,
        on_elected,
        on_lost: hooks.on_lost,
        gauge: hooks.gauge,
        renewed_at: None,
        following: None,
    };
    tracing::info!(lease = %elector.lease_ref(), identity = %elector.config.identity, "leader election started");
    tokio::pin!(shutdown);
    // A conflict is retried at once, but not twice in a row: a Lease that
    // keeps changing under us is read again at the normal pace.
    let mut retried = false;
    loop {
        let started = Instant::now();
        // While leading, no request may outlive the term; otherwise one
        // lease duration bounds a request.
        let budget = match elector.deadline().filter(|_| elector.leading()) {
            Some(d) => d.saturating_duration_since(started),
            None => elector.config.lease_duration,
        };
        let outcome = tokio::select! {
            () = &mut shutdown => break,
            o = tokio::time::timeout(budget, elector.attempt()) => o,
        };
        let conflict = match outcome {
            Ok(o) => elector.record(o),
            Err(_) => {
                tracing::warn!(lease = %elector.lease_ref(), timeout = ?budget, "leader election: Lease request timed out");
                false
            }
        };
        let again_now = conflict && !retried;
        retried = again_now;
        elector.check_deadline();
        let mut wake = if again_now {
            Instant::now()
        } else {
            started + elector.config.renew_every
        };
        if let Some(d) = elector.deadline().filter(|_| elector.leading()) {
            wake = wake.min(d);
        }
        tokio::select! {
            () = &mut shutdown => break,
            () = tokio::time::sleep_until(wake) => {},
        }
        elector.check_deadline();
    }
    if elector.flag.swap(false, Ordering::SeqCst) {
        crate::metrics::global().set(elector.gauge, &[], 0.0);
        tracing::info!(lease = %elector.lease_ref(), identity = %elector.config.identity, "stepped down: shutting down");
    }
    let bound = elector.config.lease_duration;
    if tokio::time::timeout(bound, elector.release())
        .await
        .is_err()
    {
        tracing::warn!(lease = %elector.lease_ref(), "could not release the Lease in time; it expires on its own");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_stop_at_the_local_deadline_even_while_the_flag_is_set() {
        let flag = AtomicBool::new(true);
        let until = std::sync::Mutex::new(None);
        assert!(
            may_write(&flag, &until),
            "no term known: the flag alone decides"
        );
        *until.lock().unwrap() = Some(std::time::Instant::now() + Duration::from_secs(60));
        assert!(may_write(&flag, &until));
        *until.lock().unwrap() = Some(std::time::Instant::now() - Duration::from_millis(1));
        assert!(
            !may_write(&flag, &until),
            "the term ended by the local clock"
        );
        flag.store(false, Ordering::SeqCst);
        *until.lock().unwrap() = None;
        assert!(!may_write(&flag, &until));
    }

    const ME: &str = "replica-a";
    const OTHER: &str = "replica-b";

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_767_225_600 + secs).expect("valid timestamp")
    }

    fn config() -> LeaderConfig {
        LeaderConfig {
            identity: ME.to_string(),
            ..LeaderConfig::new("wasmop").with_lease_duration(Duration::from_secs(15))
        }
    }

    /// A Lease held by `holder`, renewed at `renewed`, for 15 s.
    fn lease(holder: Option<&str>, renewed: Timestamp) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(DEFAULT_LEASE_NAME.to_string()),
                namespace: Some("wasmop".to_string()),
                resource_version: Some("42".to_string()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_string),
                lease_duration_seconds: Some(15),
                acquire_time: Some(MicroTime(t(0))),
                renew_time: Some(MicroTime(renewed)),
                lease_transitions: Some(3),
                ..LeaseSpec::default()
            }),
        }
    }

    fn decide_at(lease: Option<&Lease>, now: Timestamp) -> Action {
        decide(lease, now, ME, DEFAULT_LEASE_DURATION)
    }

    #[test]
    fn absent_lease_is_created() {
        assert_eq!(decide_at(None, t(100)), Action::Create);
    }

    #[test]
    fn lease_held_by_me_and_fresh_is_renewed() {
        let l = lease(Some(ME), t(100));
        assert_eq!(decide_at(Some(&l), t(110)), Action::Renew);
    }

    #[test]
    fn lease_held_by_another_and_fresh_is_followed() {
        let l = lease(Some(OTHER), t(100));
        assert_eq!(
            decide_at(Some(&l), t(114)),
            Action::Follow {
                holder: OTHER.to_string(),
                expires: t(115)
            }
        );
    }

    #[test]
    fn lease_held_by_another_and_expired_is_taken_over() {
        let l = lease(Some(OTHER), t(100));
        assert_eq!(
            decide_at(Some(&l), t(115)),
            Action::TakeOver {
                previous: Some(OTHER.to_string())
            }
        );
    }

    #[test]
    fn released_lease_is_taken_over_at_once() {
        let l = lease(None, t(100));
        assert_eq!(
            decide_at(Some(&l), t(101)),
            Action::TakeOver { previous: None }
        );
        let mut empty = lease(Some(""), t(100));
        assert_eq!(
            decide_at(Some(&empty), t(101)),
            Action::TakeOver { previous: None }
        );
        empty.spec = None;
        assert_eq!(
            decide_at(Some(&empty), t(101)),
            Action::TakeOver { previous: None }
        );
    }

    #[test]
    fn my_stale_lease_steps_down_before_reacquiring() {
        let l = lease(Some(ME), t(100));
        assert_eq!(decide_at(Some(&l), t(116)), Action::StepDownAndReacquire);
    }

    #[test]
    fn my_renewal_older_than_the_lease_duration_steps_down() {
        let d = Duration::from_secs(15);
        assert!(may_lead(Some(Duration::from_secs(14)), d));
        assert!(!may_lead(Some(d), d));
        assert!(!may_lead(Some(Duration::from_secs(60)), d));
        assert!(!may_lead(None, d), "no renewal at all never leads");
    }

    #[test]
    fn holder_without_any_time_is_taken_over() {
        let mut l = lease(Some(OTHER), t(100));
        let spec = l.spec.as_mut().expect("spec");
        spec.renew_time = None;
        spec.acquire_time = None;
        assert_eq!(
            decide_at(Some(&l), t(0)),
            Action::TakeOver {
                previous: Some(OTHER.to_string())
            }
        );
    }

    #[test]
    fn missing_duration_falls_back_to_the_configured_one() {
        let mut l = lease(Some(OTHER), t(100));
        l.spec.as_mut().expect("spec").lease_duration_seconds = None;
        let short = Duration::from_secs(2);
        assert!(matches!(
            decide(Some(&l), t(101), ME, short),
            Action::Follow { .. }
        ));
        assert!(matches!(
            decide(Some(&l), t(102), ME, short),
            Action::TakeOver { .. }
        ));
    }

    #[test]
    fn take_over_counts_a_transition_and_keeps_the_resource_version() {
        let now = t(200);
        let taken = acquired(lease(Some(OTHER), t(100)), &config(), now);
        assert_eq!(taken.metadata.resource_version.as_deref(), Some("42"));
        let spec = taken.spec.expect("spec");
        assert_eq!(spec.holder_identity.as_deref(), Some(ME));
        assert_eq!(spec.lease_transitions, Some(4));
        assert_eq!(spec.acquire_time, Some(MicroTime(now)));
        assert_eq!(spec.renew_time, Some(MicroTime(now)));
        // Re-acquiring my own expired Lease is not a transition.
        let again = acquired(lease(Some(ME), t(100)), &config(), now);
        assert_eq!(again.spec.expect("spec").lease_transitions, Some(3));
    }

    #[test]
    fn renewal_moves_only_the_renew_time() {
        let r = renewed(lease(Some(ME), t(100)), &config(), t(105));
        assert_eq!(r.metadata.resource_version.as_deref(), Some("42"));
        let spec = r.spec.expect("spec");
        assert_eq!(spec.renew_time, Some(MicroTime(t(105))));
        assert_eq!(spec.acquire_time, Some(MicroTime(t(0))));
        assert_eq!(spec.lease_transitions, Some(3));
        assert_eq!(spec.holder_identity.as_deref(), Some(ME));
    }

    #[test]
    fn release_clears_the_holder_so_others_take_over_at_once() {
        let r = released(lease(Some(ME), t(100)));
        assert_eq!(r.metadata.resource_version.as_deref(), Some("42"));
        assert_eq!(
            decide(Some(&r), t(101), OTHER, DEFAULT_LEASE_DURATION),
            Action::TakeOver { previous: None }
        );
    }

    #[test]
    fn new_lease_names_me_with_whole_seconds() {
        let c = config().with_lease_duration(Duration::from_millis(1500));
        assert_eq!(c.renew_every, Duration::from_millis(500));
        let l = new_lease(&c, t(0));
        let spec = l.spec.expect("spec");
        assert_eq!(spec.holder_identity.as_deref(), Some(ME));
        assert_eq!(spec.lease_duration_seconds, Some(2));
        assert_eq!(spec.lease_transitions, Some(0));
        assert_eq!(
            LeaderConfig::new("x")
                .with_lease_duration(Duration::from_millis(10))
                .lease_duration_seconds(),
            1
        );
    }
}
