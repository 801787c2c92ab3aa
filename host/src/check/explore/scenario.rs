//! What varies between seeded runs: the scenario of the modelled
//! controllers' knobs ([`scenario`]) and the order of reconciles drawn
//! from a seeded random source ([`Rng`]), on a fixed clock ([`EPOCH`],
//! [`ROUND_SECS`]).
//!
//! # Guarantees
//! - A seed gives the same scenario and the same order on every machine:
//!   a finding is reproduced from its seed.

use crate::check::controllers::Knobs;

/// The number of scenarios one seed cycles through.
pub const SCENARIOS: usize = 6;

/// The scenario of a seed.
pub fn scenario(seed: u64) -> Knobs {
    match seed % SCENARIOS as u64 {
        1 => Knobs::default(),
        2 => Knobs {
            slow: true,
            ..Knobs::default()
        },
        3 => Knobs {
            never_ready: true,
            ..Knobs::default()
        },
        4 => Knobs {
            image_pull: true,
            ..Knobs::default()
        },
        5 => Knobs {
            node_lost_at: Some(3 + (seed / SCENARIOS as u64 % 4) as u32),
            ..Knobs::default()
        },
        _ => Knobs {
            job_fails: true,
            ..Knobs::default()
        },
    }
}

/// A small deterministic generator (splitmix64).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// Seeded.
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }

    /// Shuffles in place.
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i + 1);
            v.swap(i, j);
        }
    }
}

/// The start of every world's clock.
pub const EPOCH: &str = "2026-01-01T00:00:00Z";
