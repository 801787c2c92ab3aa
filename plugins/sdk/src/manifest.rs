//! What a plugin declares about itself: [`Manifest`] and the records inside
//! it, from the `wasmop-contract` crate the host uses too. The host reads the
//! manifest once at load and enforces it on every plan.
//!
//! ```
//! use wasmop_sdk::{Controller, KindRef, Manifest, Read, Selector};
//! use wasmop_sdk::k8s_openapi::api::apps::v1::Deployment;
//!
//! let manifest = Manifest::new("engine", "0.1.0").controller(
//!     Controller::new("engine", KindRef::namespaced("firebolt.io", "v1", "FireboltEngine", "fireboltengines"))
//!         .owns(KindRef::of::<Deployment>())
//!         .reads(Read::new(
//!             "instance",
//!             KindRef::namespaced("firebolt.io", "v1", "FireboltInstance", "fireboltinstances"),
//!             Selector::field("spec.instanceRef"),
//!         ))
//!         .finalizer("firebolt.io/engine"),
//! );
//! assert_eq!(manifest.controllers[0].owns[0].kind.kind, "Deployment");
//! ```

pub use wasmop_contract::manifest::*;
