//! The low-level escape hatch: the WIT-level types and trait, exactly as
//! `wit-bindgen` generates them from `wit/reconciler.wit`.
//!
//! Here objects are JSON *text* and nothing is checked or converted, so a
//! [`RawPlugin`] can return anything the WIT types can hold — including
//! output the typed path never produces, such as an apply op whose object is
//! not JSON. Only tests of the host need that; plugins use
//! [`crate::Plugin`] and [`crate::export_plugin!`].
//!
//! Every native type converts to its WIT twin with `From`/`Into`, and back
//! with `From` (or `TryFrom` where JSON text must be parsed, failing with
//! [`crate::ReconcileError::Internal`]), so a raw plugin can build most of
//! its answer with the typed API:
//!
//! ```
//! use wasmop_sdk::raw;
//!
//! let mut plan: raw::Plan = wasmop_sdk::Plan::new().event("Odd", "see apply").into();
//! plan.apply.push(raw::ApplyOp { object: "{not json".into(), precondition: None, force: false });
//! assert_eq!(plan.events.len(), 1);
//! ```
//!
//! Export a raw plugin with [`crate::export_raw_plugin!`].

use std::marker::PhantomData;

pub use crate::bindings::Guest as RawPlugin;
pub use crate::bindings::wasmop::reconciler::types::{
    ApplyOp, Controller, DeleteOp, Event, EventType, FieldRef, HttpMethod, HttpRequest, HttpTarget,
    KindRef, Manifest, ObjectRef, Observation, Plan, Precondition, Read, ReconcileError,
    RelatedObject, SecretHeader, Selector, SettingsProblem, Snapshot,
};

use crate::Plugin;

/// Adapts a typed [`Plugin`] to the WIT-level [`RawPlugin`]: parses the JSON
/// text coming in, calls the plugin, serializes what goes out.
/// [`crate::export_plugin!`] exports this type.
pub struct Export<P>(PhantomData<P>);

impl<P> std::fmt::Debug for Export<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Export")
    }
}

impl<P: Plugin> RawPlugin for Export<P> {
    fn manifest() -> Manifest {
        P::manifest().into()
    }

    fn validate_settings(settings: String) -> Result<(), Vec<SettingsProblem>> {
        crate::glue::validate_settings::<P>(&settings)
            .map_err(|problems| problems.into_iter().map(Into::into).collect())
    }

    fn reconcile(snapshot: Snapshot) -> Result<Plan, ReconcileError> {
        let snapshot = crate::Snapshot::try_from(snapshot)?;
        P::reconcile(&snapshot).map(Into::into).map_err(Into::into)
    }
}
