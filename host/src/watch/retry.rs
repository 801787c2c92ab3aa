//! How a watch stream recovers from errors: what an error says about the API
//! server ([`Failure`]), how long to wait ([`RetryPolicy`], [`RetryState`]),
//! and the state each stream reports ([`WatchState`]). Pure and unit-tested
//! in `cache.rs`'s tests; the watch loop in `cache.rs` follows it.

use std::time::Duration;

use kube::runtime::watcher;

// --- Fault recovery ----------------------------------------------------------
//
// A watch stream reacts to an error by what it says about the API server:
// - 410 Gone/Expired: the server is there but no longer serves the
//   resourceVersion the watch resumed from. The stream relists at once, as
//   client-go's reflector does; only a second 410 before the relist completed
//   waits (so a list that keeps expiring cannot spin).
// - The server is unreachable or not ready (transport errors, 429, 5xx): the
//   stream retries with jittered exponential backoff capped at
//   [`RetryPolicy::unavailable_max`] (2 s), so it is back within that time
//   of the server answering again.
// - The server refuses (another 4xx, e.g. 403 while RBAC is missing) or sends
//   something unusable: the same backoff, capped at
//   [`RetryPolicy::rejected_max`] (30 s, as client-go), so a misconfigured
//   operator does not hammer the server.
// - While a stream recovers (it failed and nothing arrived since), an attempt
//   that goes unanswered for [`RetryPolicy::stall_base`] (2 s, doubling per
//   abandoned attempt up to 60 s) is abandoned and the stream starts over
//   with a list. A request sent while the API server is still starting can
//   be held by it well past `/readyz` (for a custom resource, about 5 s in
//   the local control plane); a fresh request is answered at once. The cost
//   is one extra list when a watch resumed cleanly on a quiet scope.
// Counters restart after progress (an object listed or watched) and after a
// quiet period without errors.

/// What one watch stream is doing. The gauge `wasmop_watch_streams{kind,
/// state}` counts the streams of each kind in each state (one stream per
/// watched namespace, or one for all namespaces).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchState {
    /// Listing: the first list, or a relist after the watch expired or a
    /// list failed.
    Relisting,
    /// The cache holds a complete list; the watch is connected or
    /// reconnecting from its last resourceVersion.
    Synced,
    /// Waiting after an error before the next attempt.
    BackingOff,
}

impl WatchState {
    /// Every state, in the order the metrics show them.
    pub const ALL: [WatchState; 3] = [
        WatchState::Synced,
        WatchState::Relisting,
        WatchState::BackingOff,
    ];

    /// The `state` label value.
    pub fn label(self) -> &'static str {
        match self {
            WatchState::Relisting => "relisting",
            WatchState::Synced => "synced",
            WatchState::BackingOff => "backing_off",
        }
    }
}

/// What a watch error says about the API server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// 410 Gone/Expired: the resourceVersion is no longer served.
    Expired,
    /// The server could not be reached or is not ready: a transport error,
    /// 429 or 5xx.
    Unavailable,
    /// The server refused the request (another 4xx) or its answer was
    /// unusable.
    Rejected,
}

impl Failure {
    /// Classifies an error of the kube-runtime watcher.
    pub fn of(err: &watcher::Error) -> Self {
        match err {
            watcher::Error::WatchError(status) => Self::of_code(status.code),
            watcher::Error::InitialListFailed(e)
            | watcher::Error::WatchStartFailed(e)
            | watcher::Error::WatchFailed(e) => Self::of_client(e),
            watcher::Error::NoResourceVersion => Self::Rejected,
        }
    }

    fn of_client(err: &kube::Error) -> Self {
        match err {
            kube::Error::Api(status) => Self::of_code(status.code),
            kube::Error::SerdeError(_)
            | kube::Error::FromUtf8(_)
            | kube::Error::BuildRequest(_)
            | kube::Error::HttpError(_) => Self::Rejected,
            // Connection refused or reset, TLS handshakes cut short, a body
            // ending mid-stream: the server went away.
            _ => Self::Unavailable,
        }
    }

    /// Classifies an HTTP status code the API server answered with.
    pub fn of_code(code: u16) -> Self {
        match code {
            410 => Self::Expired,
            429 | 500..=599 => Self::Unavailable,
            // A watch error event without a code: treat as transient.
            0 => Self::Unavailable,
            _ => Self::Rejected,
        }
    }

    /// The `reason` label value of `wasmop_watch_errors_total`.
    pub fn label(self) -> &'static str {
        match self {
            Failure::Expired => "expired",
            Failure::Unavailable => "unavailable",
            Failure::Rejected => "rejected",
        }
    }
}

/// How long watch retries wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// The first wait; each further failure in a row doubles it.
    pub base: Duration,
    /// Cap while the server is unreachable or not ready.
    pub unavailable_max: Duration,
    /// Cap while the server refuses the request.
    pub rejected_max: Duration,
    /// After this long without an error, the next failure counts as the
    /// first again.
    pub quiet_reset: Duration,
    /// While a stream recovers, how long an attempt may go unanswered before
    /// it is abandoned; doubles per abandoned attempt in a row.
    pub stall_base: Duration,
    /// Cap of the doubling stall timeout.
    pub stall_max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            base: Duration::from_millis(200),
            unavailable_max: Duration::from_secs(2),
            rejected_max: Duration::from_secs(30),
            quiet_reset: Duration::from_secs(60),
            stall_base: Duration::from_secs(2),
            stall_max: Duration::from_secs(60),
        }
    }
}

/// What a watch stream does after a failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Start over with a fresh list.
    pub relist: bool,
    /// Wait this long before the next attempt (zero: at once).
    pub delay: Duration,
}

/// Consecutive failures of one watch stream, by kind of failure.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RetryState {
    expired: u32,
    unavailable: u32,
    rejected: u32,
    stalls: u32,
    last_failure: Option<std::time::Instant>,
}

impl RetryState {
    /// Records a failure at `now` and decides what to do. `jitter` is a
    /// random number in [0, 1) that spreads the wait between half and all of
    /// the exponential delay, so watches do not retry in lockstep.
    pub fn on_failure(
        &mut self,
        policy: &RetryPolicy,
        failure: Failure,
        now: std::time::Instant,
        jitter: f64,
    ) -> Decision {
        self.note(policy, now);
        let (count, max) = match failure {
            Failure::Expired => (&mut self.expired, policy.unavailable_max),
            Failure::Unavailable => (&mut self.unavailable, policy.unavailable_max),
            Failure::Rejected => (&mut self.rejected, policy.rejected_max),
        };
        let attempt = *count;
        *count = count.saturating_add(1);
        match failure {
            // The first expiry relists at once; an expiry again before the
            // relist completed waits like any other failure.
            Failure::Expired if attempt == 0 => Decision {
                relist: true,
                delay: Duration::ZERO,
            },
            Failure::Expired => Decision {
                relist: true,
                delay: backoff_delay(policy.base, max, attempt - 1, jitter),
            },
            _ => Decision {
                relist: false,
                delay: backoff_delay(policy.base, max, attempt, jitter),
            },
        }
    }

    /// How long the next attempt of a recovering stream may go unanswered.
    pub fn stall_timeout(&self, policy: &RetryPolicy) -> Duration {
        policy
            .stall_base
            .checked_mul(1u32.checked_shl(self.stalls.min(31)).unwrap_or(u32::MAX))
            .unwrap_or(policy.stall_max)
            .min(policy.stall_max)
    }

    /// Records an attempt abandoned at `now` after [`RetryState::stall_timeout`].
    /// The stream starts over with a list at once: the wait already passed.
    pub fn on_stall(&mut self, policy: &RetryPolicy, now: std::time::Instant) -> Decision {
        self.note(policy, now);
        self.stalls = self.stalls.saturating_add(1);
        Decision {
            relist: true,
            delay: Duration::ZERO,
        }
    }

    fn note(&mut self, policy: &RetryPolicy, now: std::time::Instant) {
        if self
            .last_failure
            .is_some_and(|t| now.saturating_duration_since(t) >= policy.quiet_reset)
        {
            *self = Self::default();
        }
        self.last_failure = Some(now);
    }

    /// Objects arrived: the server answers again.
    pub fn on_progress(&mut self) {
        self.unavailable = 0;
        self.rejected = 0;
        self.stalls = 0;
    }

    /// A list completed.
    pub fn on_synced(&mut self) {
        *self = Self::default();
    }
}

/// The wait before retry number `attempt` (0 for the first): `base` doubled
/// per attempt, capped at `max`, then scaled into [1/2, 1] of itself by
/// `jitter` in [0, 1).
pub fn backoff_delay(base: Duration, max: Duration, attempt: u32, jitter: f64) -> Duration {
    let exp = base
        .checked_mul(1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX))
        .unwrap_or(max)
        .min(max);
    let jitter = if jitter.is_finite() {
        jitter.clamp(0.0, 1.0)
    } else {
        0.0
    };
    exp / 2 + exp.mul_f64(jitter / 2.0)
}

/// A random number in [0, 1) for [`backoff_delay`], from the standard
/// library's randomly keyed hasher.
pub(crate) fn jitter() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}
