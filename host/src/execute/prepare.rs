//! The object as the host writes it: the plugin's object plus the marks
//! of ownership and the host's labels.

use serde_json::{Map, Value, json};

use crate::contract::manifest::{OwnedKind, Ownership};
use crate::judge::validate::{MANAGED_BY_LABEL, MANAGED_BY_VALUE, OWNER_UID_LABEL, PLUGIN_LABEL};
use crate::lease::shard::SHARD_LABEL;
use crate::object;

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
/// Call it only on objects [`crate::judge::validate::validate`] accepted: it overwrites
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

/// With `--sharding`, the labels of the shard that writes an owned object,
/// added to an object [`prepare_apply`] made: `shard.wasmop.dev/shard:
/// <shard>` (the shard's owned-kind watches select it) and, where the
/// ownership mark is an ownerReference, `wasmop.dev/owner-uid: <primary
/// uid>` too (owner-label kinds have it already), so a shard the primary
/// moves to finds the object by its owner's UID and claims it (see
/// [`crate::lease::shard`]). For owner-reference kinds the label
/// decides nothing about control: the controller ownerReference does.
///
/// Added after the [`super::economy`] digest is taken, so the digest of
/// an object is the same whichever shard wrote it: a claimed object that
/// still holds the plan is not written again.
pub fn stamp_shard(obj: &mut Value, primary: &Value, shard: &str, owned: &OwnedKind) {
    let Some(labels) = obj
        .get_mut("metadata")
        .and_then(Value::as_object_mut)
        .map(|m| {
            m.entry("labels")
                .or_insert_with(|| Value::Object(Map::new()))
        })
    else {
        return;
    };
    if !labels.is_object() {
        *labels = Value::Object(Map::new());
    }
    let Some(labels) = labels.as_object_mut() else {
        return;
    };
    labels.insert(SHARD_LABEL.to_owned(), json!(shard));
    if matches!(owned.ownership, Ownership::OwnerReference) {
        labels.insert(OWNER_UID_LABEL.to_owned(), json!(object::uid(primary)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::manifest::KindRef;

    fn primary() -> Value {
        json!({"apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
               "metadata": {"name": "w", "namespace": "ns", "uid": "u-1"}})
    }

    fn config_map() -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "c", "namespace": "ns"}, "data": {"a": "b"}})
    }

    fn kind() -> KindRef {
        KindRef::namespaced("", "v1", "ConfigMap", "configmaps")
    }

    fn labels(obj: &Value) -> BTreeMapOf {
        object::labels(obj).into_iter().collect()
    }

    type BTreeMapOf = std::collections::BTreeMap<String, String>;

    #[test]
    fn a_shard_stamps_its_label_and_the_owner_uid_on_owner_reference_kinds() {
        let owned = OwnedKind::reference(kind());
        let mut obj = prepare_apply(&config_map(), &primary(), "good", &owned);
        stamp_shard(&mut obj, &primary(), "shard-a", &owned);
        let l = labels(&obj);
        assert_eq!(l.get(SHARD_LABEL).map(String::as_str), Some("shard-a"));
        assert_eq!(l.get(OWNER_UID_LABEL).map(String::as_str), Some("u-1"));
        assert_eq!(object::controller_uid(&obj), Some("u-1"));
    }

    #[test]
    fn a_shard_keeps_the_owner_label_of_owner_label_kinds_as_it_is() {
        let owned = OwnedKind::label(kind());
        let mut obj = prepare_apply(&config_map(), &primary(), "good", &owned);
        let before = labels(&obj);
        stamp_shard(&mut obj, &primary(), "shard-b", &owned);
        let mut want = before;
        want.insert(SHARD_LABEL.to_owned(), "shard-b".to_owned());
        assert_eq!(labels(&obj), want);
    }

    #[test]
    fn the_applied_digest_is_the_same_whichever_shard_writes() {
        let owned = OwnedKind::reference(kind());
        let stamped = |shard: Option<&str>| {
            let mut obj = prepare_apply(&config_map(), &primary(), "good", &owned);
            super::super::economy::stamp(&mut obj);
            if let Some(s) = shard {
                stamp_shard(&mut obj, &primary(), s, &owned);
            }
            obj["metadata"]["annotations"][super::super::economy::APPLIED_ANNOTATION].clone()
        };
        assert_eq!(stamped(Some("shard-a")), stamped(Some("shard-b")));
        assert_eq!(stamped(Some("shard-a")), stamped(None));
    }
}
