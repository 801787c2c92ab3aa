//! wasmop: a Kubernetes operator whose reconcile logic runs as WebAssembly
//! components.
//!
//! The folders follow the data flow of one reconcile:
//!
//! ```text
//! watch/       caches of every kind a plugin declares, with owner, UID and
//!              namespace indexes; label selectors
//! controller/  routing a cache change to the primaries it concerns (pure
//!              `route`), the work queue, the worker, the plugin registry
//!              and hot swap of running controllers, leader election,
//!              sharding primaries across replicas (`shard`)
//! reconcile/   `decide`: snapshot → plugin call → whole-plan validation,
//!              the one path used live and offline (`wasmop plan`, golden)
//! plugin/      loading a component: compile cache, bindings, conversions at
//!              the WIT boundary, manifest checks, RBAC, the plugin directory
//! sandbox.rs   the wasmtime engine and the only way to get a bounded store
//! execute/     fenced writes of a validated plan, status, finalizers, Events
//!              and failure reports
//! observe/     HTTP requests plans declare: policy, resolution, transport,
//!              the results store
//! cli/         the `wasmop` command line and `wasmop run`
//! ```
//!
//! Small shared helpers: [`object`] (JSON object accessors), [`names`]
//! (Kubernetes name rules), [`conditions`], [`metrics`], [`health`].
//!
//! The contract's JSON types (manifest, plan, observation) are the
//! `wasmop-contract` crate's, shared with the plugin SDK.

pub mod admission;
pub mod cli;
pub mod conditions;
pub mod controller;
pub mod execute;
pub mod health;
pub mod logging;
pub mod metrics;
pub mod names;
pub mod object;
pub mod observe;
pub mod plugin;
pub mod reconcile;
pub mod record;
pub mod sandbox;
pub mod selfevent;
pub mod shadow;
pub mod watch;

pub use plugin::manifest::{Controller, KindRef, Manifest, ManifestProblem};
pub use plugin::{CallError, CompileCache, LoadError, LoadOptions, LoadedPlugin};
pub use reconcile::decide::{Decision, decide};
pub use reconcile::snapshot::{
    FieldReference, MemorySource, ObjectSource, Observation, Snapshot, build_snapshot,
    referenced_names,
};
pub use reconcile::validate::{
    ExistingLookup, ExistingObject, Plan, PlanLimits, Rule, Violation, check_counts, prepare_apply,
    validate,
};
pub use sandbox::{Limits, Sandbox, SandboxConfig};
pub use watch::selector::{LabelSelector, selector_matches};
