//! What is told about executed plans besides the primary's status:
//! recordings of live reconciles ([`record`]), comparisons with a shadow
//! candidate ([`shadow`]), Events on the operator's own Pod
//! ([`selfevent`]), and the process's HTTP endpoint ([`health`]: metrics,
//! liveness, readiness, shadow reports).
//!
//! # Guarantees
//! - Nothing here writes to a primary or its owned objects: a failing
//!   report never changes what a reconcile writes.

pub mod health;
pub mod record;
pub mod selfevent;
pub mod shadow;
