//! wasmop: a Kubernetes operator whose reconcile logic runs as WebAssembly
//! components.
//!
//! The library follows the data flow of one reconcile:
//!
//! - [`sandbox`]: the shared wasmtime engine and bounded stores.
//! - [`plugin`]: loading a component (compile cache, manifest and settings
//!   checks) and calling `reconcile`.
//! - [`manifest`]: what a plugin declares, and [`rbac`] derived from it.
//! - [`snapshot`]: selecting the objects a primary's snapshot holds
//!   ([`ObjectSource`], [`build_snapshot`]); [`selector`] for label
//!   selectors.
//! - [`plan`]: the plan's JSON shape, [`validate`] before any write, and
//!   [`prepare_apply`].
//! - [`offline`]: the whole path without a cluster (`wasmop plan`), and
//!   [`golden`] plan tests built on it.
//! - [`leader`]: Lease-based leader election gating writes.
//! - [`cli`]: the `wasmop` command line.

pub mod apply;
mod bindings;
pub mod cache;
pub mod cli;
pub mod conditions;
pub mod controller;
pub mod golden;
pub mod hotswap;
pub mod leader;
pub mod manifest;
pub mod metrics;
pub mod names;
pub mod object;
pub mod observe;
pub mod offline;
pub mod plan;
pub mod plugin;
pub mod queue;
pub mod rbac;
pub mod run;
pub mod sandbox;
pub mod selector;
pub mod snapshot;

pub use manifest::{Controller, KindRef, Manifest, ManifestProblem};
pub use plan::{ExistingLookup, ExistingObject, Plan, Rule, Violation, prepare_apply, validate};
pub use plugin::{CallError, CompileCache, LoadError, LoadOptions, LoadedPlugin};
pub use sandbox::{Limits, Sandbox, SandboxConfig};
pub use selector::{LabelSelector, selector_matches};
pub use snapshot::{
    FieldReference, MemorySource, ObjectSource, Observation, Snapshot, build_snapshot,
    referenced_names,
};
