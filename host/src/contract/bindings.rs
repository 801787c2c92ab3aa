//! The host side of the WIT contract, generated in exactly one place from
//! the root `wit/` (package `wasmop:reconciler@0.4.0`, worlds `plugin` and
//! `admitting-plugin`).
//!
//! Nothing outside [`crate::plugin`] and [`crate::sandbox`] touches these
//! types: the rest of the host works with the native types of
//! [`crate::contract::manifest`], [`crate::judge::snapshot`] and
//! [`crate::judge::validate`].

#![allow(missing_docs)]

wasmtime::component::bindgen!({
    path: "../wit",
    world: "plugin",
});

pub use self::wasmop::reconciler::types;

/// The `admitting-plugin` world (`plugin` plus `admit`), sharing the types
/// above. A component that fits it is a plugin with an admission export.
pub mod admitting {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "admitting-plugin",
        with: {
            "wasmop:reconciler/types": super::types,
        },
    });
}
