//! The low-level escape hatch: the WIT-level types and trait, exactly as
//! `wit-bindgen` generates them from `wit/reconciler.wit`.
//!
//! Here the manifest, settings problems and plan are the JSON *text* the
//! contract defines and nothing is checked, so a [`RawPlugin`] can return
//! anything — including output the typed path never produces, such as a
//! plan that is not JSON or an apply op whose object is a string. Only tests
//! of the host need that; plugins use [`crate::Plugin`] and
//! [`crate::export_plugin!`].
//!
//! A raw plugin can still build most of its answer with the typed API and
//! edit the text:
//!
//! ```
//! let plan = wasmop_sdk::Plan::new().event("Odd", "see apply");
//! let text = wasmop_sdk::serde_json::to_string(&plan).unwrap();
//! let broken = text.replace(r#""apply":[]"#, r#""apply":[{"object":"not an object"}]"#);
//! assert!(broken.contains("not an object"));
//! ```
//!
//! Export a raw plugin with [`crate::export_raw_plugin!`].

use std::marker::PhantomData;

pub use crate::bindings::Guest as RawPlugin;
pub use crate::bindings::wasmop::reconciler::types::{
    AdmissionRequest, Observation, ReconcileError, RelatedObject, Snapshot,
};

use crate::Plugin;
use crate::glue::json_text;

/// Adapts a typed [`Plugin`] to the WIT-level [`RawPlugin`]: parses the
/// snapshot's JSON text, calls the plugin, serializes what goes out.
/// [`crate::export_plugin!`] exports this type.
pub struct Export<P>(PhantomData<P>);

impl<P> std::fmt::Debug for Export<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Export")
    }
}

impl<P: Plugin> RawPlugin for Export<P> {
    fn manifest() -> String {
        crate::glue::report_panics();
        json_text(&P::manifest())
    }

    fn validate_settings(settings: String) -> Result<(), String> {
        crate::glue::report_panics();
        crate::glue::validate_settings::<P>(&settings)
    }

    fn reconcile(snapshot: Snapshot) -> Result<String, ReconcileError> {
        crate::glue::report_panics();
        let snapshot = crate::Snapshot::try_from(snapshot)?;
        let text = P::reconcile(&snapshot).map(|plan| {
            let text = json_text(&plan);
            discard(plan);
            text
        });
        discard(snapshot);
        text.map_err(Into::into)
    }
}

/// Makes a panic in this call reach the host with its text (WIT
/// `diagnostics.panic-text`), as [`Export`] does at the start of every
/// export. A [`RawPlugin`] built for `wasm32-unknown-unknown` has no
/// stderr: without this its panics trap with no message. Does nothing
/// natively.
pub fn report_panics() {
    crate::glue::report_panics();
}

/// Drops `value` natively. In a component it is left in memory instead:
/// the host runs every call in a new instance and throws the instance's
/// memory away after it, so walking the parsed snapshot and plan to free
/// every node would only cost time.
fn discard<T>(value: T) {
    if cfg!(target_family = "wasm") {
        std::mem::forget(value);
    } else {
        drop(value);
    }
}
