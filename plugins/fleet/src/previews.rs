//! Previews: a fleet with `spec.previews` is a preview pool; preview fleets
//! (children) run in its preview bucket.
//!
//! - The pool reserves the preview bucket (`spec.previews.storage.bucket`,
//!   never its own bucket: CEL) to its own UID, with a second
//!   CelldStorageReservation marked `celld.eric.dev/preview-pool`. The
//!   `PreviewsReady` condition reports it; a preview bucket another fleet
//!   holds is `PreviewsReady=False/StorageScopeConflict` and never blocks
//!   the pool's own runtime. `spec.previews` may be added once and is
//!   immutable after that (CEL on the CRD), and is not part of the pool's
//!   runtime reservation hash.
//! - A child names the pool in `storage.previewFleetRef` (name, UID) and a
//!   one-segment `storage.prefix` (the CRD requires both or neither). It
//!   runs only while the preview bucket's reservation is the pool's
//!   (otherwise `Blocked/StorageScopeConflict`), and reserves its prefix
//!   with a reservation of its own, named after bucket and prefix, so no
//!   two children share a prefix: a second child asking for a held prefix
//!   is `Blocked/StorageScopeConflict`. A child's reservation carries no
//!   tuning record, so its tuning stays tied to the reservation hash.

use serde_json::{Value, json};
use wasmop_sdk::hash::stable_hash;

use crate::api::{API_VERSION, Fleet};
use crate::names::reservation_name;

/// Marks the reservation of a pool's preview bucket.
pub const PREVIEW_POOL_ANNOTATION: &str = "celld.eric.dev/preview-pool";
/// Condition type of a pool.
pub const PREVIEWS_READY: &str = "PreviewsReady";

/// The child's prefix, when the fleet is a preview fleet.
pub fn child_prefix(fleet: &Fleet) -> Option<&str> {
    let s = &fleet.spec.storage;
    s.preview_fleet_ref.as_ref()?;
    s.prefix.as_deref().filter(|p| !p.is_empty())
}

/// The name of the fleet's own reservation: after the bucket, or after
/// bucket and prefix for a preview fleet (bucket names hold no `/`, so the
/// two never meet).
pub fn own_reservation_name(fleet: &Fleet) -> String {
    let bucket = &fleet.spec.storage.bucket;
    match child_prefix(fleet) {
        Some(prefix) => reservation_name(&format!("{bucket}/{prefix}")),
        None => reservation_name(bucket),
    }
}

/// The reservation of the pool's bucket a fleet depends on: the preview
/// bucket a pool reserves, or the pool bucket a child runs in.
pub fn pool_reservation_name(fleet: &Fleet) -> Option<String> {
    if child_prefix(fleet).is_some() {
        return Some(reservation_name(&fleet.spec.storage.bucket));
    }
    preview_bucket(fleet).map(reservation_name)
}

/// `spec.previews.storage.bucket` of a pool.
pub fn preview_bucket(fleet: &Fleet) -> Option<&str> {
    fleet.spec.previews.as_ref()?["storage"]["bucket"].as_str()
}

/// Why a child may not run in its bucket: `None` when the bucket's
/// reservation is the named pool's.
pub fn child_problem(fleet: &Fleet, pool: Option<&Value>) -> Option<String> {
    let reference = fleet.spec.storage.preview_fleet_ref.as_ref()?;
    child_prefix(fleet)?;
    let bucket = &fleet.spec.storage.bucket;
    let Some(pool) = pool else {
        return Some(format!(
            "preview bucket {bucket} is not reserved by preview pool {} (uid {}) yet",
            reference.name, reference.uid
        ));
    };
    let spec = &pool["spec"];
    let marked = pool["metadata"]["annotations"][PREVIEW_POOL_ANNOTATION] == "true";
    if spec["fleetUID"].as_str() != Some(reference.uid.as_str()) || !marked {
        return Some(format!(
            "bucket {bucket} is reserved by fleet {}/{} (uid {}){}, not as the preview bucket of \
             preview pool {} (uid {}) that storage.previewFleetRef names",
            spec["fleetNamespace"].as_str().unwrap_or("?"),
            spec["fleetName"].as_str().unwrap_or("?"),
            spec["fleetUID"].as_str().unwrap_or("?"),
            if marked { "" } else { " for its runtime" },
            reference.name,
            reference.uid,
        ));
    }
    None
}

/// What a pool's preview bucket reservation looks like from this reconcile.
#[derive(Clone, Debug, PartialEq)]
pub enum Pool {
    /// Not reserved yet: create `object` (if absent).
    Reserve {
        /// The reservation.
        object: Value,
    },
    /// Reserved to this pool.
    Reserved,
    /// Held by another fleet, or not as a preview bucket.
    Conflict {
        /// Why.
        message: String,
    },
}

/// The state of a pool's preview bucket, `None` for a fleet without
/// `spec.previews`.
pub fn pool(fleet: &Fleet, existing: Option<&Value>) -> Option<Pool> {
    let previews = fleet.spec.previews.as_ref()?;
    let bucket = preview_bucket(fleet)?;
    let Some(existing) = existing else {
        let mut spec = json!({
            "bucket": bucket,
            "fleetName": fleet.metadata.name,
            "fleetNamespace": fleet.metadata.namespace,
            "fleetUID": fleet.metadata.uid,
            "specHash": stable_hash(&json!({"previewStorage": previews["storage"]})),
        });
        if let Some(url) = previews["storage"]["endpoint"]["url"].as_str() {
            spec["endpoint"] = json!(url);
        }
        return Some(Pool::Reserve {
            object: json!({
                "apiVersion": API_VERSION,
                "kind": "CelldStorageReservation",
                "metadata": {
                    "name": reservation_name(bucket),
                    "annotations": {PREVIEW_POOL_ANNOTATION: "true"},
                },
                "spec": spec,
            }),
        });
    };
    let spec = &existing["spec"];
    let marked = existing["metadata"]["annotations"][PREVIEW_POOL_ANNOTATION] == "true";
    if spec["fleetUID"].as_str() == Some(fleet.metadata.uid.as_str()) && marked {
        return Some(Pool::Reserved);
    }
    Some(Pool::Conflict {
        message: format!(
            "preview bucket {bucket} is reserved by fleet {}/{} (uid {}){}; previews need a \
             bucket of their own",
            spec["fleetNamespace"].as_str().unwrap_or("?"),
            spec["fleetName"].as_str().unwrap_or("?"),
            spec["fleetUID"].as_str().unwrap_or("?"),
            if marked { "" } else { " for its runtime" },
        ),
    })
}
