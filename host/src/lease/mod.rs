//! The Leases every write checks: the leader's ([`leader`]) and, with
//! `--sharding`, each shard's and its assignment ([`shard`]).
//!
//! # Guarantees
//! - A write of `execute` goes out only under the fence these modules
//!   keep: the leader flag while the Lease is held and renewed in time,
//!   and, with sharding, the shard's own Lease and the primary's
//!   assignment to it. The sharder's rounds that move assignments are
//!   `controller/sharder`, above.

pub mod leader;
pub mod shard;
