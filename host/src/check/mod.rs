//! `wasmop check`: a plugin explored offline, deterministically, in a
//! modelled cluster, against eight properties (after Sieve and Acto).
//!
//! - [`world`]: the in-memory API server (server-side apply one manager
//!   deep, generation and resourceVersion, status apart, preconditions,
//!   deletes, finalizers, owner-reference garbage collection, a few
//!   immutable fields).
//! - [`controllers`]: small models of StatefulSet, Deployment, Pod, Job,
//!   PersistentVolumeClaim and cert-manager's Certificate, with knobs
//!   (never ready, image pull failure, node lost, slow, Jobs failing).
//! - [`cluster`]: one reconcile: the snapshot from a view of the world, the
//!   plugin's plan through [`crate::reconcile::decide::decide`] (the live
//!   path and the host's validation), the plan's writes in the host's
//!   order, cut short after any prefix when asked; HTTP requests answered
//!   from a scripted table.
//! - [`properties`]: the eight properties and the checks of one state.
//! - [`mutate`]: spec mutations from a CRD's OpenAPI schema.
//! - [`explore`]: seeded runs from each example, keeping the shortest
//!   failing trace per property; a trace is written as recordings
//!   ([`crate::report::record::offline_recording`]: the format of `wasmop run
//!   --record`, not redacted, since the modelled cluster holds no
//!   cluster's Secrets), one per reconcile, so `wasmop replay` recomputes
//!   every plan of it.
//!
//! Everything is deterministic for a seed: the clock starts at
//! [`explore::EPOCH`] and moves [`explore::ROUND_SECS`] per round, UIDs and
//! resourceVersions are counters, and every order comes from the seed.

pub mod cluster;
pub mod controllers;
pub mod explore;
pub mod mutate;
pub mod properties;
pub mod world;
