//! What a plugin declares, read by every layer above without calling the
//! plugin: its manifest ([`manifest`]), the label selectors of its reads
//! and watches ([`selector`]), its admission rules ([`admission`]), and the
//! WIT bindings generated from the contract (`bindings`).
//!
//! # Guarantees
//! - Nothing here does I/O or runs a plugin: a manifest, its selectors and
//!   its admission rules are checked as data, so every layer above reads
//!   the same declarations.

pub mod admission;
pub(crate) mod bindings;
pub mod manifest;
pub mod selector;
