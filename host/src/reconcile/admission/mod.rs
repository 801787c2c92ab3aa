//! Admission answers, decided like a reconcile: which plugins a review
//! concerns and what they answer ([`review`]), and the same offline for
//! `wasmop plan` and golden tests ([`offline`]). The server that receives
//! reviews is the `admission` folder, above.
//!
//! # Guarantees
//! - The same review, reads and plugins give the same answer live and
//!   offline; anything short of a well-formed `allowed: true` denies (see
//!   [`review`]).

pub mod offline;
pub mod review;
