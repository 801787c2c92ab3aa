//! The results kept per primary, with the per-primary GET rate limit, and
//! the counters behind [`ObserveMetrics`].

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
}

impl Stored {
    pub(crate) fn age_ms(&self, now: Timestamp) -> u64 {
        let ms = now.duration_since(self.observed_at).as_millis();
        u64::try_from(ms.max(0)).unwrap_or(u64::MAX)
    }

    pub(crate) fn expired(&self, now: Timestamp) -> bool {
        self.max_age_ms > 0 && self.age_ms(now) > self.max_age_ms
    }

    pub(crate) fn same_content(&self, other: &Stored) -> bool {
        self.status == other.status && self.body == other.body && self.error == other.error
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
}

impl PrimaryState {
    /// Stores `stored` under `id`; true when its content changed.
    pub(crate) fn store(&mut self, id: &str, stored: Stored, cap: usize) -> bool {
        let changed = self
            .results
            .get(id)
            .is_none_or(|old| !old.same_content(&stored));
        self.results.insert(id.to_owned(), stored);
        while self.results.len() > cap.max(1) {
            let oldest = self
                .results
                .iter()
                .min_by_key(|(_, s)| s.observed_at)
                .map(|(id, _)| id.clone());
            match oldest {
                Some(oldest) => self.results.remove(&oldest),
                None => break,
            };
        }
        changed
    }
}
