//! The object as the host writes it: the plugin's object plus the marks
//! of ownership and the host's labels.

use serde_json::{Map, Value, json};

use crate::object;
use crate::plugin::manifest::{OwnedKind, Ownership};
use crate::reconcile::validate::{
    MANAGED_BY_LABEL, MANAGED_BY_VALUE, OWNER_UID_LABEL, PLUGIN_LABEL,
};

/// The object as the host writes it: `obj` plus the marks of ownership and
/// the labels `app.kubernetes.io/managed-by: wasmop` and
/// `wasmop.dev/plugin: <plugin>`.
///
/// Ownership marks, by how the kind is owned:
/// - owner-reference: the controller ownerReference to `primary`
///   (`controller: true`, `blockOwnerDeletion: true`);
/// - owner-label: the label `wasmop.dev/owner-uid: <primary uid>` (and the
///   kind's extra label with the same value); no ownerReference.
///
/// # Caveats
///
/// Call it only on objects [`crate::reconcile::validate::validate`] accepted: it overwrites
/// `metadata.ownerReferences` and the owner labels (which validation
/// guarantees the plugin did not set).
pub fn prepare_apply(obj: &Value, primary: &Value, plugin_name: &str, owned: &OwnedKind) -> Value {
    let mut out = obj.clone();
    let Some(root) = out.as_object_mut() else {
        return out;
    };
    let metadata = root
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if !metadata.is_object() {
        *metadata = Value::Object(Map::new());
    }
    let Some(metadata) = metadata.as_object_mut() else {
        return out;
    };
    let uid = object::uid(primary);
    let mut host_labels = vec![
        (MANAGED_BY_LABEL, MANAGED_BY_VALUE),
        (PLUGIN_LABEL, plugin_name),
    ];
    match &owned.ownership {
        Ownership::OwnerReference => {
            metadata.insert(
                "ownerReferences".to_owned(),
                json!([{
                    "apiVersion": object::api_version(primary),
                    "kind": object::kind(primary),
                    "name": object::name(primary),
                    "uid": uid,
                    "controller": true,
                    "blockOwnerDeletion": true,
                }]),
            );
        }
        // Validation refuses applies of dependent kinds; nothing to stamp.
        Ownership::Dependent => {}
        Ownership::OwnerLabel {
            extra_label,
            collected,
        } => {
            metadata.remove("ownerReferences");
            // Garbage collection as a backstop to the finalizer, where an
            // ownerReference can reach the primary: its own namespace.
            let same_namespace = object::namespace(primary)
                .is_some_and(|ns| metadata.get("namespace").and_then(Value::as_str) == Some(ns));
            if *collected && same_namespace {
                metadata.insert(
                    "ownerReferences".to_owned(),
                    json!([{
                        "apiVersion": object::api_version(primary),
                        "kind": object::kind(primary),
                        "name": object::name(primary),
                        "uid": uid,
                        "controller": false,
                        "blockOwnerDeletion": false,
                    }]),
                );
            }
            host_labels.push((OWNER_UID_LABEL, uid));
            if let Some(key) = extra_label {
                host_labels.push((key.as_str(), uid));
            }
        }
    }
    let labels = metadata
        .entry("labels")
        .or_insert_with(|| Value::Object(Map::new()));
    if !labels.is_object() {
        *labels = Value::Object(Map::new());
    }
    if let Some(labels) = labels.as_object_mut() {
        for (key, value) in host_labels {
            labels.insert(key.to_owned(), json!(value));
        }
    }
    out
}
