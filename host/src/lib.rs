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
//! check/       `wasmop check`: the plugin explored in a modelled cluster
//! cli/         the `wasmop` command line and `wasmop run`
//! ```
//!
//! Small shared helpers: [`object`] (JSON object accessors), [`names`]
//! (Kubernetes name rules), [`key`] (a primary's key, a kind's API
//! coordinates), [`conditions`], [`metrics`], [`health`].
//!
//! # Layers
//!
//! A module uses only modules of its own layer or of the layers below it,
//! and no two modules use each other, directly or round a circle. The order
//! follows the data of one reconcile upward: what a plugin declares, the
//! caches built from it, the snapshot and the rules a plan must pass, the
//! sandbox and the plugin call, the decision, its execution, what is
//! reported about it, the controller that runs all of it, and at the top
//! what delivers plugins and serves the process. Top to bottom:
//!
//! - `cli` — the command line; `cli/mod.rs` dispatches to the commands,
//!   `cli/run` uses the admission and configuration-watch modules, and
//!   `cli/config` (the operator file) is read by those and by `cli/rbac`
//!   and uses none of them.
//! - `plugin/hotswap`, `plugin/oci`, `admission` — delivering plugins
//!   (the watched plugin directory, OCI pulls) into a running operator,
//!   and the admission webhook server; all three drive the controller.
//! - `controller` — routing, the queue, the workers, the running
//!   controllers: it calls every layer below.
//! - `check` — `wasmop check`: a plugin explored offline in a modelled
//!   cluster (its world, built-in controllers, properties), deciding
//!   through `decide` and writing its traces as recordings.
//! - `health`, `observe`, `record`, `selfevent`, `shadow` — what follows
//!   an executed plan (its HTTP requests, recordings, shadow comparisons,
//!   the operator's own Events) and the process's HTTP endpoint: `health`
//!   serves `/metrics`, `/healthz`, `/readyz` and `/shadow`, so the
//!   metrics registry below imports neither health nor shadow.
//! - `execute`, `controller/leader`, `controller/shard` — the fenced writes
//!   of a plan, and the Leases (the leader's; with `--sharding`, the
//!   shard's and its assignment) that every one of those writes checks;
//!   the sharder's rounds on the operator are `controller/sharder`.
//! - `reconcile`, `rollout`, `admission/offline`, `admission/review` —
//!   deciding: the one path from snapshot to judged plan (`decide`,
//!   `kind`), the same offline (`offline`, `golden`, `diff`, which compares
//!   them), which version of a plugin decides for a primary (`rollout`:
//!   the steps, shares and analysis of a staged rollout, pure data), and
//!   the admission answers built the same way.
//! - `plugin` — loading and calling a component: compile cache, the
//!   conversions at the WIT boundary, RBAC of a manifest.
//! - `sandbox` — the wasmtime engine and its bounded stores.
//! - `reconcile/existing`, `reconcile/snapshot`, `reconcile/validate` —
//!   what a plugin call reads and the rules its plan must pass: pure data
//!   and pure checks, no I/O; `existing` is the lookup both others share.
//! - `watch` — the caches of every declared kind.
//! - `plugin/manifest`, `plugin/bindings`, `watch/selector`,
//!   `admission/rules` — the contract: what a plugin declares (its
//!   manifest, label selectors, admission rules) and the generated WIT
//!   bindings.
//! - `names`, `object`, `conditions`, `key`, `logging`, `metrics` —
//!   leaves.
//!
//! A module belongs to the longest path listed (`plugin/manifest` is in the
//! contract layer, `plugin/cache` in the `plugin` layer). The list is read by `host/tests/layers.rs`, which
//! checks every `crate::`, `super::` and `self::` path in the non-test code
//! of every file under `src/` against it and fails on an import that
//! points up a layer or closes a circle, naming the file and line; a
//! module that declares submodules may use them (that is not a circle).
//!
//! The contract's JSON types (manifest, plan, observation) are the
//! `wasmop-contract` crate's, shared with the plugin SDK.

pub mod admission;
pub mod check;
pub mod cli;
pub mod conditions;
pub mod controller;
pub mod execute;
pub mod health;
pub mod key;
pub mod logging;
pub mod metrics;
pub mod names;
pub mod object;
pub mod observe;
pub mod plugin;
pub mod reconcile;
pub mod record;
pub mod rollout;
pub mod sandbox;
pub mod selfevent;
pub mod shadow;
pub mod watch;

pub use execute::prepare::prepare_apply;
pub use plugin::manifest::{Controller, KindRef, Manifest, ManifestProblem};
pub use plugin::{CallError, CompileCache, LoadError, LoadOptions, LoadedPlugin};
pub use reconcile::decide::{Decision, decide};
pub use reconcile::snapshot::{
    FieldReference, MemorySource, ObjectSource, Observation, Snapshot, build_snapshot,
    referenced_names,
};
pub use reconcile::validate::{
    ExistingLookup, ExistingObject, Plan, PlanLimits, Rule, Violation, check_counts, validate,
};
pub use sandbox::{Limits, Sandbox, SandboxConfig};
pub use watch::selector::{LabelSelector, selector_matches};
