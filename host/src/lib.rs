//! wasmop: a Kubernetes operator whose reconcile logic runs as WebAssembly
//! components.
//!
//! # Layers
//!
//! Each folder of `src/` is one layer, and the files beside this one are
//! the bottom layer. A module uses only modules of its own layer or of the
//! layers below it, and no two modules use each other, directly or round a
//! circle. The order follows the data of one reconcile upward: what a
//! plugin declares, the caches built from it, the snapshot and the rules a
//! plan must pass, the sandbox and the plugin call, the decision, the
//! Leases every write checks, the writes, what follows them, the
//! controller that runs all of it, and at the top what delivers plugins,
//! serves admission and parses the command line. Top to bottom:
//!
//! - `cli` — the command line: `wasmop run`, `plan`, `check`, `replay`,
//!   `rbac`, `new`, `oci`, `rollout`, `admission`.
//! - `admission` — the admission webhook server: its TLS, its
//!   registration and the handler that asks the plugins; what to answer is
//!   decided below, in `reconcile/admission`.
//! - `delivery` — what reaches a running operator while it runs: the
//!   watched plugin directory and hot swap of running controllers
//!   (`hotswap`), OCI pulls (`oci`), the operator file (`config`) and its
//!   reload (`config_watch`); all of it drives the controller.
//! - `controller` — routing a cache change to the primaries it concerns
//!   (pure `route`), the work queue, the workers, the running controllers,
//!   the sharder's rounds, orphan collection, the truth read past the
//!   cache, a staged rollout's progress: it calls every layer below.
//! - `check` — `wasmop check`: a plugin explored offline in a modelled
//!   cluster (its world, built-in controllers, properties), deciding
//!   through `decide` and writing its traces as recordings.
//! - `report` — what is told about executed plans besides the primary's
//!   status: recordings (`record`), shadow comparisons (`shadow`), the
//!   operator's own Events (`selfevent`) and the process's HTTP endpoint
//!   (`health`: `/metrics`, `/healthz`, `/readyz`, `/shadow`, so the
//!   metrics registry below imports neither health nor shadow).
//! - `observe` — the HTTP requests plans declare: policy, resolution,
//!   transport, the results store.
//! - `execute` — the fenced writes of a validated plan, status,
//!   finalizers, Events and failure reports.
//! - `lease` — the Leases every write of `execute` checks: the leader's
//!   (`leader`) and, with `--sharding`, each shard's and its assignment
//!   (`shard`); the sharder's rounds on the operator are
//!   `controller/sharder`.
//! - `reconcile` — deciding: the one path from snapshot to judged plan
//!   (`decide`, `kind`), the same offline (`offline`, `golden`, `diff`,
//!   which compares them), which version of a plugin decides for a primary
//!   (`rollout`: the steps, shares and analysis of a staged rollout, pure
//!   data), and the admission answers built the same way (`admission`).
//! - `plugin` — loading and calling a component: compile cache, the
//!   conversions at the WIT boundary, the admit call, RBAC of a manifest,
//!   per-plugin budgets.
//! - `sandbox` — the wasmtime engine and the only way to get a bounded
//!   store.
//! - `judge` — what a plugin call reads and the rules its plan must pass:
//!   the snapshot (`snapshot`), the lookup of existing objects both share
//!   (`existing`), the whole-plan validation (`validate`); pure data and
//!   pure checks, no I/O.
//! - `watch` — the caches of every kind a plugin declares, with owner, UID
//!   and namespace indexes.
//! - `contract` — what a plugin declares: its manifest (`manifest`), label
//!   selectors (`selector`), admission rules (`admission`), and the
//!   generated WIT bindings (`bindings`).
//! - `names`, `object`, `conditions`, `key`, `logging`, `metrics` —
//!   leaves: Kubernetes name rules, JSON object accessors, status
//!   conditions, a primary's key and a kind's API coordinates, log
//!   fields, the metrics registry.
//!
//! Why this cut: a folder is what a reader opens, so each holds one step
//! of the data flow and nothing that a lower step depends on. What a
//! plugin declares sits apart from the code that loads it (`contract`
//! below `plugin`), because the caches, the snapshot and the validation
//! read the declarations, and the sandbox links the bindings, without
//! calling a plugin. The Leases sit apart from the controller (`lease`
//! below `execute`), because every write checks them and they need
//! nothing of the controller, which sits far above.
//! Delivering plugins and configuration into a running process
//! (`delivery`) drives the controller, so it sits above it, apart from the
//! plugin call it feeds. The admission server (`admission`) talks to the
//! API server and the controller; what it answers is pure and is decided
//! with the reconcile decisions (`reconcile/admission`), so `wasmop plan`
//! and golden tests answer admission reviews without a server. The pure
//! snapshot and validation (`judge`) are kept apart from deciding
//! (`reconcile`), because the sandbox and the plugin call use them and the
//! decision uses the plugin call.
//!
//! Some modules are also reachable under the path they had before this
//! cut (`wasmop::reconcile::validate`, `wasmop::controller::leader`,
//! `wasmop::cli::config`, `wasmop::plugin::manifest`, `wasmop::health`,
//! `wasmop::rollout`, …): a folder re-exports a module of a lower layer
//! under its old name, and this file re-exports the modules that were at
//! the crate's root. `plugin::hotswap` and `plugin::oci` are not kept (the
//! `plugin` layer would point up at `delivery`): they are
//! `delivery::hotswap` and `delivery::oci`. Code inside the crate names
//! each module by its own path.
//!
//! The list is read by `host/tests/layers.rs`, which checks that each
//! folder of `src/` is one listed layer (and each layer one folder, or the
//! files beside `lib.rs`), that every module of a folder belongs to its
//! folder's layer, that no folder uses a folder above it, and every
//! `crate::`, `super::` and `self::` path in the non-test code of every
//! file under `src/` against the list: it fails on an import that points
//! up a layer or closes a circle, naming the file and line; a module that
//! declares submodules may use them (that is not a circle).
//!
//! The contract's JSON types (manifest, plan, observation) are the
//! `wasmop-contract` crate's, shared with the plugin SDK.

pub mod admission;
pub mod check;
pub mod cli;
pub mod conditions;
pub mod contract;
pub mod controller;
pub mod delivery;
pub mod execute;
pub mod judge;
pub mod key;
pub mod lease;
pub mod logging;
pub mod metrics;
pub mod names;
pub mod object;
pub mod observe;
pub mod plugin;
pub mod reconcile;
pub mod report;
pub mod sandbox;
pub mod watch;

pub use reconcile::rollout;
pub use report::{health, record, selfevent, shadow};

pub use contract::manifest::{Controller, KindRef, Manifest, ManifestProblem};
pub use contract::selector::{LabelSelector, selector_matches};
pub use execute::prepare::prepare_apply;
pub use judge::snapshot::{
    FieldReference, MemorySource, ObjectSource, Observation, Snapshot, build_snapshot,
    referenced_names,
};
pub use judge::validate::{
    ExistingLookup, ExistingObject, Plan, PlanLimits, Rule, Violation, check_counts, validate,
};
pub use plugin::{CallError, CompileCache, LoadError, LoadOptions, LoadedPlugin};
pub use reconcile::decide::{Decision, decide};
pub use sandbox::{Limits, Sandbox, SandboxConfig};
