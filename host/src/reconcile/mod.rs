//! Deciding one reconcile, the same way live and offline: the snapshot of a
//! primary ([`snapshot`]), the plugin call and the whole-plan check
//! ([`validate`]) chained by [`decide()`]; [`offline`] (`wasmop plan`) and
//! [`golden`] plan tests run it over objects from files.

pub mod admission;
pub mod decide;
pub mod diff;
pub mod golden;
pub mod kind;
pub mod offline;
pub mod rollout;

pub use crate::judge::{existing, snapshot, validate};
pub use decide::{DecideInput, Decided, Decision, SkipReason, decide, format_now};
