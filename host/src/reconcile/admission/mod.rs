//! Admission answers, decided like a reconcile: which plugins a review
//! concerns and what they answer ([`review`]), and the same offline for
//! `wasmop plan` and golden tests ([`offline`]). The server that receives
//! reviews is the `admission` folder, above.
//!
//! # Guarantees
//! - No I/O beyond the plugin call: the answer to a review depends only on
//!   the review, the rules and the plugins.

pub mod offline;
pub mod review;
