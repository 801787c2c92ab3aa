//! The wasmop plugin SDK: what a plugin author uses to write a reconciler
//! that runs inside the wasmop host as a WebAssembly component.
//!
//! A plugin is a type implementing [`Plugin`] over plain Rust types, exported
//! with [`export_plugin!`]:
//!
//! ```
//! use wasmop_sdk::{Controller, KindRef, Manifest, Plan, Plugin, ReconcileError,
//!                  SettingsProblem, Snapshot};
//!
//! struct Hello;
//!
//! impl Plugin for Hello {
//!     fn manifest() -> Manifest {
//!         Manifest::new("hello", "0.1.0").controller(
//!             Controller::new("hello", KindRef::namespaced("example.com", "v1", "Hello", "hellos"))
//!                 .owns(KindRef::namespaced("", "v1", "ConfigMap", "configmaps")),
//!         )
//!     }
//!
//!     fn validate_settings(settings: &serde_json::Value) -> Result<(), Vec<SettingsProblem>> {
//!         wasmop_sdk::settings::only_keys(settings, &[])
//!     }
//!
//!     fn reconcile(snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
//!         let name = snapshot.primary_name();
//!         Ok(Plan::new().apply(serde_json::json!({
//!             "apiVersion": "v1",
//!             "kind": "ConfigMap",
//!             "metadata": {"name": format!("{name}-hello"), "namespace": snapshot.primary_namespace()},
//!             "data": {"greeting": "hello"},
//!         })))
//!     }
//! }
//!
//! wasmop_sdk::export_plugin!(Hello);
//! # fn main() {}
//! ```
//!
//! The contract itself is `wit/reconciler.wit` (package
//! `wasmop:reconciler@0.4.0`); this crate is the only place its guest
//! bindings are generated. The manifest, plan and error types are those of
//! the `wasmop-contract` crate (`wit/contract/`), which the host parses the
//! plugin's output with, so both sides share one definition. Their serde
//! form is the JSON text that crosses the boundary and the shape the host
//! prints for plans (camelCase fields, every list always present). The
//! snapshot is this crate's own type, with Kubernetes objects parsed into
//! [`serde_json::Value`].
//!
//! Modules, one concept each:
//!
//! - [`admission`] — the optional `admit` export ([`admission::Admit`];
//!   exported with `export_admitting_plugin!` of the `wasmop-sdk-admitting`
//!   crate): validating webhooks the host serves.
//! - [`manifest`] — what the plugin declares ([`Manifest`], [`Controller`], …).
//! - [`snapshot`] — what a reconcile sees, with typed accessors.
//! - [`plan`] — what a reconcile answers, with a builder.
//! - [`error`] — [`ReconcileError`].
//! - [`settings`] — [`SettingsProblem`] and helpers for `validate_settings`.
//! - [`conditions`] — `metav1.Condition` helpers.
//! - [`hash`] — [`stable_hash`] for rollout annotations.
//! - [`raw`] — the low-level escape hatch (WIT-level types, [`export_raw_plugin!`]).
//! - `testing` (feature `testing`) — run a plugin natively on fixture objects.

#![warn(missing_docs)]

// Lets the generated bindings and the export macros name this crate as
// `wasmop_sdk` both from inside it and from plugin crates.
extern crate self as wasmop_sdk;

pub mod admission;
pub mod conditions;
pub mod error;
pub mod hash;
pub mod manifest;
pub mod plan;
pub mod raw;
pub mod settings;
pub mod snapshot;
#[cfg(feature = "testing")]
pub mod testing;

mod glue;
mod json;

#[cfg(any(
    test,
    all(
        feature = "call-allocator",
        target_arch = "wasm32",
        not(target_feature = "atomics")
    )
))]
#[allow(unsafe_code)]
mod alloc;

/// With feature `call-allocator` (on by default): a heap that lives for
/// one call (see `alloc`).
#[cfg(all(
    feature = "call-allocator",
    target_arch = "wasm32",
    not(target_feature = "atomics")
))]
#[global_allocator]
static CALL_ALLOCATOR: alloc::CallArena = alloc::CallArena::new();

pub use conditions::{ConditionStatus, find_condition, is_true, set_condition};
pub use error::ReconcileError;
pub use hash::stable_hash;
pub use manifest::{
    Controller, FieldRef, HttpTarget, KindRef, Manifest, OwnedKind, Ownership, Read, Scope,
    Selector,
};
pub use plan::{
    ApplyOp, CaBundle, DeleteOp, Event, EventType, Gauge, GeneratedKey, HttpMethod, HttpRequest,
    ObjectPlan, ObjectRef, Plan, Precondition, RequestTarget, SecretEncoding, SecretHeader,
};
pub use settings::SettingsProblem;
pub use snapshot::{Observation, ObservationOutcome, RelatedObject, Snapshot};
/// The contract's JSON types (re-exported `wasmop-contract`).
pub use wasmop_contract as contract;

/// Kubernetes API types (re-exported `k8s-openapi`, feature `v1_34`), so
/// plugins use the same version as the SDK.
pub use k8s_openapi;
/// JSON values (re-exported `serde_json`): the form objects take in the SDK.
pub use serde_json;

/// A reconciler plugin, written over the SDK's native types.
///
/// Implement it on a unit struct and export that with [`export_plugin!`].
/// Every function is a pure function of its arguments: the host grants no
/// clock, filesystem, network or randomness (the current time is
/// [`Snapshot::now`]).
pub trait Plugin {
    /// Describes the plugin: name, version and controllers. Called once at load.
    fn manifest() -> Manifest;

    /// Checks the operator's settings for this plugin (`{}` when none were
    /// given).
    ///
    /// # Errors
    ///
    /// Every problem found; any problem rejects the plugin at load.
    fn validate_settings(settings: &serde_json::Value) -> Result<(), Vec<SettingsProblem>>;

    /// Computes the plan for one primary object from its snapshot.
    ///
    /// # Errors
    ///
    /// A [`ReconcileError`] when no plan can be made; nothing is written then.
    fn reconcile(snapshot: &Snapshot) -> Result<Plan, ReconcileError>;
}

/// Exports a [`Plugin`] implementation as the component's `plugin` world.
///
/// Use it once, at the top level of the plugin crate (a `cdylib`):
/// `wasmop_sdk::export_plugin!(MyPlugin);`. It expands to nothing when the
/// crate is compiled for a non-wasm target, so the same crate builds and
/// unit-tests natively.
#[macro_export]
macro_rules! export_plugin {
    ($plugin:ty) => {
        #[cfg(target_arch = "wasm32")]
        #[allow(unsafe_code)]
        const _: () = {
            type __WasmopGuest = $crate::raw::Export<$plugin>;
    $crate::bindings::export!(__WasmopGuest with_types_in $crate::bindings);
        };
    };
}

/// Exports a [`raw::RawPlugin`] implementation (WIT-level types and JSON
/// text, no conversion) as the component's `plugin` world.
///
/// This is the escape hatch for plugins that must produce output the typed
/// path never would, such as the host's malformed-output tests. Prefer
/// [`export_plugin!`].
#[macro_export]
macro_rules! export_raw_plugin {
    ($plugin:ident) => {
        #[cfg(target_arch = "wasm32")]
        #[allow(unsafe_code)]
        const _: () = {
    $crate::bindings::export!($plugin with_types_in $crate::bindings);
        };
    };
}

/// The guest bindings generated from `wit/` by `wit-bindgen` (the crate's
/// `wit/reconciler.wit` is a link to the repository's `wit/reconciler.wit`,
/// so the packaged crate carries the contract it was built against).
///
/// Plugin crates normally never name this module: [`export_plugin!`] uses
/// it. Its types are re-exported under friendlier names in [`raw`].
#[allow(unsafe_code, missing_docs, missing_debug_implementations, clippy::all)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "wit",
        world: "plugin",
        pub_export_macro: true,
        default_bindings_module: "wasmop_sdk::bindings",
        runtime_path: "wasmop_sdk::__private::wit_bindgen::rt",
    });
}

#[doc(hidden)]
pub mod __private {
    pub use wit_bindgen;
}

/// Compiles the README's examples as doc tests, so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
