//! The ring that assigns primaries to shards: consistent hashing with
//! [`VIRTUAL_NODES`] points per shard ([`Ring`]) and the move of a primary
//! whose shard changed ([`plan_move`]).
//!
//! # Guarantees
//! - A pure function of the live shards and the primary's UID: every
//!   replica computes the same owner, and a shard joining or leaving moves
//!   only the primaries it gains or loses.

use std::collections::BTreeSet;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::VIRTUAL_NODES;

pub(super) fn hash(text: &str) -> u64 {
    let digest = Sha256::digest(text.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

/// A consistent-hash ring of shards with [`VIRTUAL_NODES`] points each.
/// Adding or removing one shard moves only the keys of the arcs it gains
/// or loses (about 1/N of them).
#[derive(Debug, Clone)]
pub struct Ring {
    points: Vec<(u64, Arc<str>)>,
}

impl Ring {
    /// The ring of `shards` (duplicates count once).
    pub fn new<'a>(shards: impl IntoIterator<Item = &'a str>) -> Self {
        let unique: BTreeSet<&str> = shards.into_iter().collect();
        let mut points = Vec::with_capacity(unique.len() * VIRTUAL_NODES);
        for s in unique {
            let name: Arc<str> = s.into();
            for v in 0..VIRTUAL_NODES {
                points.push((hash(&format!("{s}#{v}")), name.clone()));
            }
        }
        points.sort();
        Self { points }
    }

    /// The shard of `key` (a primary's UID); `None` on an empty ring.
    pub fn shard_of(&self, key: &str) -> Option<&str> {
        if self.points.is_empty() {
            return None;
        }
        let h = hash(key);
        let i = self.points.partition_point(|(p, _)| *p < h) % self.points.len();
        Some(&self.points[i].1)
    }
}

/// What the sharder does with one primary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Move {
    /// Nothing: it is where it belongs (or waits for its owner's
    /// acknowledgement).
    Keep,
    /// Assign it to this shard (no owner, or its owner is gone), removing
    /// any drain mark.
    Assign(String),
    /// Ask its live owner to give it up.
    Drain,
    /// Its owner is where it belongs again: remove the drain mark.
    Undrain,
}

/// Decides the [`Move`] of a primary labelled with `owner` (and the drain
/// mark when `draining`), whose place on the ring is `desired`, given the
/// `live` shards.
pub fn plan_move(
    owner: Option<&str>,
    draining: bool,
    desired: &str,
    live: &BTreeSet<String>,
) -> Move {
    match owner.filter(|o| !o.is_empty()) {
        None => Move::Assign(desired.to_owned()),
        Some(o) if !live.contains(o) => Move::Assign(desired.to_owned()),
        Some(o) if o == desired => {
            if draining {
                Move::Undrain
            } else {
                Move::Keep
            }
        }
        Some(_) if draining => Move::Keep,
        Some(_) => Move::Drain,
    }
}
