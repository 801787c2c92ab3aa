//! The host side of the WIT contract, generated in exactly one place from
//! the root `wit/` (package `wasmop:reconciler@0.2.0`, world `plugin`).
//!
//! Nothing outside [`crate::plugin`] touches these types: the rest of the
//! host works with the native types of [`crate::manifest`],
//! [`crate::snapshot`] and [`crate::plan`].

#![allow(missing_docs)]

wasmtime::component::bindgen!({
    path: "../wit",
    world: "plugin",
});

pub use self::wasmop::reconciler::types;
