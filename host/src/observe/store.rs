//! The results kept per primary, with the per-primary rate limit, and the
//! counters behind [`ObserveMetrics`].
//!
//! What is kept is bounded three ways ([`ObserveConfig`]): results per
//! primary (count), bytes per primary (every result's body and error
//! text), and bytes over all primaries. Beyond a bound the oldest results
//! go first; a single result larger than the per-primary budget keeps its
//! status and an error saying so, without its body. Every result expires:
//! a `maxAgeMs` of 0 (or above the maximum) means the maximum age. So a
//! snapshot never carries more observation bytes than the per-primary
//! budget, which is far below any plugin memory cap.

use super::*;

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) sent: AtomicU64,
    pub(crate) succeeded: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) refused: AtomicU64,
    pub(crate) cut: AtomicU64,
    pub(crate) rate_limited: AtomicU64,
}

/// How a sent request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ending {
    Succeeded,
    Failed,
    Cut,
}

impl Ending {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Ending::Succeeded => "succeeded",
            Ending::Failed => "failed",
            Ending::Cut => "cut",
        }
    }
}

/// A result as kept between snapshots.
#[derive(Clone, Debug)]
pub(crate) struct Stored {
    pub(crate) status: Option<u16>,
    pub(crate) body: String,
    pub(crate) error: Option<String>,
    pub(crate) observed_at: Timestamp,
    pub(crate) max_age_ms: u64,
    /// The typed outcome the plugin sees (`Observation::outcome`).
    pub(crate) outcome: ObservationOutcome,
    /// Set when stored: grows with every result stored for any primary.
    pub(crate) seq: u64,
}

impl Stored {
    pub(crate) fn age_ms(&self, now: Timestamp) -> u64 {
        let ms = now.duration_since(self.observed_at).as_millis();
        u64::try_from(ms.max(0)).unwrap_or(u64::MAX)
    }

    /// True when older than its `maxAgeMs`, or than `max_age` when that is
    /// 0 or larger.
    pub(crate) fn expired(&self, now: Timestamp, max_age: Duration) -> bool {
        let ceiling = u64::try_from(max_age.as_millis()).unwrap_or(u64::MAX);
        let max_age_ms = match self.max_age_ms {
            0 => ceiling,
            ms => ms.min(ceiling),
        };
        self.age_ms(now) > max_age_ms
    }

    /// What the result costs against the byte budgets.
    pub(crate) fn bytes(&self) -> usize {
        self.body.len() + self.error.as_ref().map_or(0, String::len)
    }

    pub(crate) fn same_content(&self, other: &Stored) -> bool {
        self.status == other.status
            && self.body == other.body
            && self.error == other.error
            && self.outcome == other.outcome
    }
}

/// What is kept for one primary.
#[derive(Debug)]
pub(crate) struct PrimaryState {
    /// Distinguishes this state from one created after a `forget`, so a
    /// request in flight across a `forget` stores nothing.
    pub(crate) epoch: u64,
    pub(crate) results: BTreeMap<String, Stored>,
    /// Last send of each GET id, with the fingerprint of what was sent.
    pub(crate) last_get: HashMap<String, (Instant, u64)>,
    /// When requests were sent for this primary within the last
    /// `per_primary_interval` (every method counts), oldest first.
    pub(crate) sends: std::collections::VecDeque<Instant>,
    /// Ids of the mutating requests being sent for this primary right now:
    /// a plan listing one again before its answer arrived does not send it
    /// twice.
    pub(crate) in_flight: std::collections::HashSet<String>,
}

impl PrimaryState {
    pub(crate) fn new(epoch: u64) -> Self {
        PrimaryState {
            epoch,
            results: BTreeMap::new(),
            last_get: HashMap::new(),
            sends: std::collections::VecDeque::new(),
            in_flight: std::collections::HashSet::new(),
        }
    }

    /// Bytes of all kept results.
    pub(crate) fn bytes(&self) -> usize {
        self.results.values().map(Stored::bytes).sum()
    }

    /// Takes one send from the per-primary budget (`max` sends per
    /// `interval`); false when it is spent.
    pub(crate) fn take_send(&mut self, now: Instant, interval: Duration, max: usize) -> bool {
        while self
            .sends
            .front()
            .is_some_and(|at| now.duration_since(*at) >= interval)
        {
            self.sends.pop_front();
        }
        if self.sends.len() >= max {
            return false;
        }
        self.sends.push_back(now);
        true
    }

    /// Stores `stored` under `id` within the per-primary bounds of
    /// `config`; true when its content changed.
    pub(crate) fn store(&mut self, id: &str, mut stored: Stored, config: &ObserveConfig) -> bool {
        let budget = config.max_result_bytes_per_primary;
        if stored.bytes() > budget {
            let size = stored.body.len();
            stored.body = String::new();
            stored.error = Some(format!(
                "response of {size} bytes not kept: over the per-primary observation budget of {budget} bytes"
            ));
            stored.outcome = ObservationOutcome::Oversized;
            if stored.bytes() > budget {
                stored.error = None;
            }
        }
        let changed = self
            .results
            .get(id)
            .is_none_or(|old| !old.same_content(&stored));
        self.results.insert(id.to_owned(), stored);
        while self.results.len() > config.max_results_per_primary.max(1) || self.bytes() > budget {
            if !self.drop_oldest_except(id) {
                break;
            }
        }
        changed
    }

    /// Drops the oldest result other than `keep`; false when there is none.
    pub(crate) fn drop_oldest_except(&mut self, keep: &str) -> bool {
        let oldest = self
            .results
            .iter()
            .filter(|(id, _)| id.as_str() != keep)
            .min_by_key(|(_, s)| s.observed_at)
            .map(|(id, _)| id.clone());
        match oldest {
            Some(oldest) => self.results.remove(&oldest).is_some(),
            None => false,
        }
    }
}

/// Drops the oldest results over all primaries until their bytes fit
/// `config.max_result_bytes_total`; `keep` (primary uid, id) is the result
/// just stored and goes last.
pub(crate) fn enforce_total(
    state: &mut HashMap<String, PrimaryState>,
    config: &ObserveConfig,
    keep: (&str, &str),
) {
    let mut total: usize = state.values().map(PrimaryState::bytes).sum();
    while total > config.max_result_bytes_total {
        let oldest = state
            .iter()
            .filter_map(|(uid, p)| {
                let at = p
                    .results
                    .iter()
                    .filter(|(id, _)| (uid.as_str(), id.as_str()) != keep)
                    .map(|(_, s)| s.observed_at)
                    .min()?;
                Some((at, uid.clone()))
            })
            .min();
        let Some((_, uid)) = oldest else { break };
        let Some(primary) = state.get_mut(&uid) else {
            break;
        };
        let before = primary.bytes();
        let skip = if uid == keep.0 { keep.1 } else { "" };
        if !primary.drop_oldest_except(skip) {
            break;
        }
        total -= before - primary.bytes();
    }
}
