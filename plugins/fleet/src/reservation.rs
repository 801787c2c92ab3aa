//! The storage reservation: a cluster-scoped CelldStorageReservation that
//! binds a bucket to exactly one fleet UID, for good.
//!
//! Its `specHash` covers the fields fixed at creation, the initial replica
//! count, and the creation-time tuning (execution, lifecycle, env,
//! telemetry). The tuning is recorded in the `celld.eric.dev/reserved-tuning`
//! annotation so the hash still verifies after the tuning changes; the record
//! is trusted only when it reproduces the hash. Deleting the fleet never
//! deletes the reservation, and a fleet recreated under the same name has a
//! new UID, so it does not inherit it.

use serde_json::{Value, json};
use wasmop_sdk::hash::stable_hash;

use crate::api::{API_VERSION, Fleet, fixed_config, tuning};
use crate::names::RESERVED_TUNING_ANNOTATION;

/// What the fleet's reservation looks like from this reconcile.
#[derive(Clone, Debug, PartialEq)]
pub enum Binding {
    /// No reservation for the bucket yet: create `object` first.
    Missing {
        /// The reservation to create.
        object: Value,
    },
    /// Bound to this fleet and verified. `record` is a reservation to apply
    /// when the tuning record is missing or untrusted and the current tuning
    /// reproduces the hash (so the record can be written now).
    Bound {
        /// A re-apply of the reservation carrying the tuning record.
        record: Option<Value>,
    },
    /// Bound to another fleet, or this fleet's configuration no longer
    /// reproduces the reservation hash: `Blocked/StorageScopeConflict`.
    Conflict {
        /// Why, naming the owner (never a value from a Secret).
        message: String,
    },
}

/// The hash of a reservation for `fixed`, `initial_replicas` and `tuning`.
pub fn spec_hash(fixed: &Value, initial_replicas: i64, tuning: &Value) -> String {
    stable_hash(&json!({"fixed": fixed, "initialReplicas": initial_replicas, "tuning": tuning}))
}

/// The reservation a new fleet creates.
pub fn reservation(fleet: &Fleet, primary: &Value) -> Value {
    let s = &fleet.spec;
    let fixed = fixed_config(primary);
    let tune = tuning(primary);
    let initial = i64::from(s.replicas());
    let mut spec = json!({
        "bucket": s.storage.bucket,
        "fleetName": fleet.metadata.name,
        "fleetNamespace": fleet.metadata.namespace,
        "fleetUID": fleet.metadata.uid,
        "initialReplicas": initial,
        "specHash": spec_hash(&fixed, initial, &tune),
    });
    if let Some(prefix) = s.storage.prefix.as_deref().filter(|p| !p.is_empty()) {
        spec["prefix"] = json!(prefix);
    }
    if let Some(e) = &s.storage.endpoint {
        spec["endpoint"] = json!(e.url);
    }
    // A preview fleet gets no tuning record: its tuning stays tied to the
    // reservation hash.
    let metadata = if crate::previews::child_prefix(fleet).is_some() {
        json!({"name": crate::previews::own_reservation_name(fleet)})
    } else {
        json!({
            "name": crate::previews::own_reservation_name(fleet),
            "annotations": { RESERVED_TUNING_ANNOTATION: record_text(&tune) },
        })
    };
    json!({
        "apiVersion": API_VERSION,
        "kind": "CelldStorageReservation",
        "metadata": metadata,
        "spec": spec,
    })
}

/// The tuning record: canonical (key-sorted) JSON text.
fn record_text(tuning: &Value) -> String {
    serde_json::to_string(tuning).unwrap_or_default()
}

/// Classifies the existing reservation `existing` (the one named after the
/// fleet's bucket, if any) for `fleet`.
pub fn binding(fleet: &Fleet, primary: &Value, existing: Option<&Value>) -> Binding {
    let Some(existing) = existing else {
        return Binding::Missing {
            object: reservation(fleet, primary),
        };
    };
    let spec = &existing["spec"];
    let owner_uid = spec["fleetUID"].as_str().unwrap_or("");
    if owner_uid != fleet.metadata.uid
        || spec["bucket"].as_str() != Some(&fleet.spec.storage.bucket)
    {
        let scope = match crate::previews::child_prefix(fleet) {
            Some(prefix) => format!("prefix {prefix} of bucket {}", fleet.spec.storage.bucket),
            None => format!("bucket {}", spec["bucket"].as_str().unwrap_or("?")),
        };
        return Binding::Conflict {
            message: format!(
                "{scope} is reserved by fleet {}/{} (uid {}), not by this fleet (uid {}); \
                 a recreated fleet never inherits a reservation",
                spec["fleetNamespace"].as_str().unwrap_or("?"),
                spec["fleetName"].as_str().unwrap_or("?"),
                owner_uid,
                fleet.metadata.uid,
            ),
        };
    }
    let want = spec["specHash"].as_str().unwrap_or("");
    let fixed = fixed_config(primary);
    let initial = spec["initialReplicas"]
        .as_i64()
        .unwrap_or_else(|| i64::from(fleet.spec.replicas()));
    let child = crate::previews::child_prefix(fleet).is_some();
    if child && spec["prefix"].as_str() != crate::previews::child_prefix(fleet) {
        return Binding::Conflict {
            message: format!(
                "reservation {} is not for prefix {} of bucket {}",
                existing["metadata"]["name"].as_str().unwrap_or("?"),
                crate::previews::child_prefix(fleet).unwrap_or(""),
                fleet.spec.storage.bucket
            ),
        };
    }
    let recorded: Option<Value> = existing["metadata"]["annotations"][RESERVED_TUNING_ANNOTATION]
        .as_str()
        .filter(|_| !child)
        .and_then(|t| serde_json::from_str(t).ok());
    if let Some(record) = &recorded
        && spec_hash(&fixed, initial, record) == want
    {
        return Binding::Bound { record: None };
    }
    let current = tuning(primary);
    if child && spec_hash(&fixed, initial, &current) == want {
        return Binding::Bound { record: None };
    }
    if spec_hash(&fixed, initial, &current) == want {
        let object = json!({
            "apiVersion": API_VERSION,
            "kind": "CelldStorageReservation",
            "metadata": {
                "name": existing["metadata"]["name"],
                "annotations": { RESERVED_TUNING_ANNOTATION: record_text(&current) },
            },
            "spec": spec,
        });
        return Binding::Bound {
            record: Some(object),
        };
    }
    Binding::Conflict {
        message: format!(
            "the fleet's configuration no longer reproduces reservation {}'s hash: its tuning \
             record is missing or untrusted and the current execution, lifecycle, env and \
             telemetry differ from those at creation; restore them",
            existing["metadata"]["name"].as_str().unwrap_or("?")
        ),
    }
}
