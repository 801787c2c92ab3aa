//! The host side of the WIT contract, generated in exactly one place from
//! the root `wit/` (package `wasmop:reconciler@0.3.0`, world `plugin`).
//!
//! Nothing outside [`crate::plugin`] touches these types: the rest of the
//! host works with the native types of [`crate::plugin::manifest`],
//! [`crate::reconcile::snapshot`] and [`crate::reconcile::validate`].

#![allow(missing_docs)]

wasmtime::component::bindgen!({
    path: "../wit",
    world: "plugin",
});

pub use self::wasmop::reconciler::types;
