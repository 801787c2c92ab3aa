//! What a plugin call reads and the rules its plan must pass: the snapshot
//! handed to the plugin ([`snapshot`]), the lookup of the objects that
//! exist, which both share ([`existing`]), and the whole-plan validation
//! ([`validate`]).
//!
//! # Guarantees
//! - Pure data and pure checks, no I/O: what they read comes through the
//!   [`snapshot::ObjectSource`] they are given, so the live path, `wasmop
//!   plan`, golden tests and `wasmop check` judge a plan the same way.

pub mod existing;
pub mod snapshot;
pub mod validate;
