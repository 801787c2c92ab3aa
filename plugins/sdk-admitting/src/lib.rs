//! The guest bindings of the `admitting-plugin` world (the `plugin` world
//! plus `admit`, contract 0.4) and [`export_admitting_plugin!`].
//!
//! They live in their own crate, apart from `wasmop-sdk`, so that a plugin
//! without admission never links this world's component-type section:
//! `wit-component` merges every such section it finds into the world it
//! builds, and would then require an `admit` export from every plugin.
//!
//! A plugin that decides admission depends on both crates, implements
//! [`wasmop_sdk::Plugin`] and [`wasmop_sdk::admission::Admit`], and ends
//! with `wasmop_sdk_admitting::export_admitting_plugin!(MyPlugin);`.

#![warn(missing_docs)]

// Lets the export macro name this crate as `wasmop_sdk_admitting` both from
// inside it and from plugin crates.
extern crate self as wasmop_sdk_admitting;

use wasmop_sdk::admission::Admit;
use wasmop_sdk::raw::{AdmissionRequest, Export, RawPlugin, ReconcileError, Snapshot};

/// Exports a plugin that implements [`Admit`] as the component's
/// `admitting-plugin` world. Use it instead of `wasmop_sdk::export_plugin!`,
/// once per crate. It expands to nothing for non-wasm targets.
#[macro_export]
macro_rules! export_admitting_plugin {
    ($plugin:ty) => {
        #[cfg(target_arch = "wasm32")]
        #[allow(unsafe_code)]
        const _: () = {
            type __WasmopAdmittingGuest = $crate::__private::wasmop_sdk::raw::Export<$plugin>;
    $crate::bindings::export!(__WasmopAdmittingGuest with_types_in $crate::bindings);
        };
    };
}

/// The generated bindings, sharing the WIT types of `wasmop_sdk::bindings`.
#[allow(unsafe_code, missing_docs, missing_debug_implementations, clippy::all)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "admitting-plugin",
        pub_export_macro: true,
        default_bindings_module: "wasmop_sdk_admitting::bindings",
        runtime_path: "wasmop_sdk_admitting::__private::wit_bindgen::rt",
        with: {
            "wasmop:reconciler/types@0.4.0": wasmop_sdk::bindings::wasmop::reconciler::types,
            "wasmop:reconciler/diagnostics@0.4.0": wasmop_sdk::bindings::wasmop::reconciler::diagnostics,
        },
    });
}

#[doc(hidden)]
pub mod __private {
    pub use wasmop_sdk;
    pub use wit_bindgen;
}

impl<P: Admit> bindings::Guest for Export<P> {
    fn manifest() -> String {
        <Self as RawPlugin>::manifest()
    }

    fn validate_settings(settings: String) -> Result<(), String> {
        <Self as RawPlugin>::validate_settings(settings)
    }

    fn reconcile(snapshot: Snapshot) -> Result<String, ReconcileError> {
        <Self as RawPlugin>::reconcile(snapshot)
    }

    fn admit(request: AdmissionRequest) -> Result<String, String> {
        wasmop_sdk::admission::admit_json::<P>(request)
    }
}
