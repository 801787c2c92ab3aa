//! Values upstream draws from a random source, derived deterministically
//! here: plugins have no clock and no randomness (the same snapshot must
//! give the same plan), so everything "random" is a hash of the snapshot.
//!
//! - [`ulid`]: `spec.id`. Its 48-bit timestamp is the snapshot's `now`
//!   (when the ID was generated, as a ULID means), its 80 "random" bits are
//!   the first 80 bits of SHA-256 over the primary's UID. UIDs are unique
//!   per object, so IDs are unique per instance; reconciling the same
//!   snapshot twice yields the same ID. It is generated once: after it is
//!   written to the spec it is only ever read.
//!
//! Credentials are not derived: the provisioned PostgreSQL's password is
//! random bytes the host generates once (see [`crate::postgres`]), which no
//! reader of the instance can compute.

use sha2::{Digest, Sha256};

/// Crockford's base32 alphabet, as ULIDs use it.
const CROCKFORD: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";

/// Length of a ULID in characters.
pub const ULID_LEN: usize = 26;

/// The ULID for an object with UID `uid` generated at `unix_ms`
/// milliseconds since the epoch (clamped to the 48 bits a ULID holds).
pub fn ulid(unix_ms: i64, uid: &str) -> String {
    let time = u128::try_from(unix_ms.clamp(0, (1 << 48) - 1)).unwrap_or_default();
    let digest = Sha256::digest(uid.as_bytes());
    let random = digest[..10]
        .iter()
        .fold(0u128, |acc, b| (acc << 8) | u128::from(*b));
    let value = (time << 80) | random;
    (0..ULID_LEN)
        .map(|i| {
            let shift = 5 * (ULID_LEN - 1 - i);
            let index = usize::try_from((value >> shift) & 0x1f).unwrap_or_default();
            char::from(CROCKFORD[index])
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ulid_is_26_crockford_chars_led_by_the_timestamp() {
        // 2025-01-01T00:00:00Z
        let id = ulid(1_735_689_600_000, "uid-1");
        assert_eq!(id.len(), ULID_LEN);
        assert!(id.bytes().all(|b| CROCKFORD.contains(&b)), "{id}");
        // The first 10 characters encode the 48-bit timestamp.
        assert_eq!(&id[..10], "01JGFJJZ00");
    }

    #[test]
    fn same_inputs_same_ulid_other_uid_other_ulid() {
        let a = ulid(1_735_689_600_000, "uid-1");
        assert_eq!(a, ulid(1_735_689_600_000, "uid-1"));
        let b = ulid(1_735_689_600_000, "uid-2");
        assert_ne!(a, b);
        assert_eq!(a[..10], b[..10], "same time, same prefix");
    }

    #[test]
    fn ulids_sort_by_time() {
        assert!(ulid(1_000, "z") < ulid(2_000, "a"));
    }
}
