//! Deciding one reconcile, the same way live and offline: the snapshot of a
//! primary, the plugin call and the whole-plan check (the snapshot and the
//! check are the `judge` layer below, re-exported here as [`snapshot`] and
//! [`validate`]) chained by [`decide()`], or by [`kind`] for a kind-scoped
//! controller; [`offline`] (`wasmop plan`) and [`golden`] plan tests run it
//! over objects from files, [`diff`] compares two plans. Which version of
//! a plugin decides for a primary is [`rollout`], and admission answers,
//! decided the same way, are [`admission`].

pub mod admission;
pub mod decide;
pub mod diff;
pub mod golden;
pub mod kind;
pub mod offline;
pub mod rollout;

pub use crate::judge::{existing, snapshot, validate};
pub use decide::{DecideInput, Decided, Decision, SkipReason, decide, format_now};
