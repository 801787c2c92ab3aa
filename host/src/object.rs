//! Accessors for Kubernetes objects held as JSON.
//!
//! The host keeps objects as `serde_json::Value` — the one JSON shape that
//! crosses the plugin boundary — and reads the few metadata fields it
//! needs through these helpers. Missing fields read as empty / `None`.
//! [`strip_bookkeeping`] is the one that changes an object: what the host
//! holds and hands to plugins leaves out the API server's and kubectl's
//! own bookkeeping.

use std::collections::BTreeMap;

use serde_json::Value;

/// kubectl's client-side apply record: the whole object as last applied,
/// as an annotation (for a `kubectl apply`-ed object, about as large as the
/// rest of it).
pub const LAST_APPLIED_ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Removes `metadata.managedFields` and kubectl's last-applied annotation
/// ([`LAST_APPLIED_ANNOTATION`], and `metadata.annotations` if that was its
/// only entry): bookkeeping of the API server's and of kubectl that no
/// plugin needs, which would otherwise be held in every cache and copied
/// into every snapshot. Nothing is written back from such a copy: the
/// host's writes are server-side applies of the plan's objects and merge
/// patches of single fields, which leave both on the server as they are.
pub fn strip_bookkeeping(object: &mut Value) {
    let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    meta.remove("managedFields");
    if let Some(annotations) = meta.get_mut("annotations").and_then(Value::as_object_mut)
        && annotations.remove(LAST_APPLIED_ANNOTATION).is_some()
        && annotations.is_empty()
    {
        meta.remove("annotations");
    }
}

/// The string at a dotted path (`spec.instanceRef`), if it is a string.
pub fn str_at<'a>(object: &'a Value, dotted: &str) -> Option<&'a str> {
    value_at(object, dotted)?.as_str()
}

/// The value at a dotted path.
pub fn value_at<'a>(object: &'a Value, dotted: &str) -> Option<&'a Value> {
    dotted
        .split('.')
        .try_fold(object, |v, segment| v.as_object()?.get(segment))
}

/// `apiVersion`, empty when absent.
pub fn api_version(object: &Value) -> &str {
    str_at(object, "apiVersion").unwrap_or_default()
}

/// `kind`, empty when absent.
pub fn kind(object: &Value) -> &str {
    str_at(object, "kind").unwrap_or_default()
}

/// `metadata.name`, empty when absent.
pub fn name(object: &Value) -> &str {
    str_at(object, "metadata.name").unwrap_or_default()
}

/// `metadata.namespace`, `None` when absent or empty.
pub fn namespace(object: &Value) -> Option<&str> {
    str_at(object, "metadata.namespace").filter(|ns| !ns.is_empty())
}

/// `metadata.uid`, empty when absent.
pub fn uid(object: &Value) -> &str {
    str_at(object, "metadata.uid").unwrap_or_default()
}

/// `metadata.resourceVersion`, empty when absent.
pub fn resource_version(object: &Value) -> &str {
    str_at(object, "metadata.resourceVersion").unwrap_or_default()
}

/// The object's controller reference: the ownerReference with
/// `controller: true`, if any.
pub fn controller_ref(object: &Value) -> Option<&Value> {
    value_at(object, "metadata.ownerReferences")?
        .as_array()?
        .iter()
        .find(|r| r.get("controller").and_then(Value::as_bool) == Some(true))
}

/// The UID of the object's controller ([`controller_ref`]), if any.
pub fn controller_uid(object: &Value) -> Option<&str> {
    controller_ref(object)?.get("uid")?.as_str()
}

/// The UIDs that may own the object: its controller ownerReference's and
/// its `wasmop.dev/owner-uid` label's (deduplicated, in that order). The
/// caches index objects under each, so both kinds of ownership find their
/// objects without a scan; whether an object is really controlled is
/// decided by the owned kind's ownership mode.
pub fn owner_uids(object: &Value) -> Vec<&str> {
    let mut out: Vec<&str> = controller_uid(object).into_iter().collect();
    if let Some(label) = value_at(object, "metadata.labels")
        .and_then(|l| l.get(wasmop_contract::OWNER_UID_LABEL))
        .and_then(Value::as_str)
        && !out.contains(&label)
    {
        out.push(label);
    }
    out
}

/// The value of one label, if set.
pub fn labels_get<'a>(object: &'a Value, key: &str) -> Option<&'a str> {
    value_at(object, "metadata.labels")?.get(key)?.as_str()
}

/// `metadata.finalizers` (non-strings skipped).
pub fn finalizers(object: &Value) -> Vec<String> {
    value_at(object, "metadata.finalizers")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|f| f.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// `metadata.labels` as a map; non-string values are skipped.
pub fn labels(object: &Value) -> BTreeMap<String, String> {
    value_at(object, "metadata.labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}

/// True when `metadata.deletionTimestamp` is set.
pub fn is_deleting(object: &Value) -> bool {
    value_at(object, "metadata.deletionTimestamp").is_some_and(|v| !v.is_null())
}

/// `Kind namespace/name` or `Kind name`, for messages.
pub fn describe(object: &Value) -> String {
    describe_parts(kind(object), namespace(object), name(object))
}

/// `Kind namespace/name` or `Kind name` from parts, for messages.
pub fn describe_parts(kind: &str, namespace: Option<&str>, name: &str) -> String {
    let kind = if kind.is_empty() { "object" } else { kind };
    let name = if name.is_empty() { "(unnamed)" } else { name };
    match namespace {
        Some(ns) if !ns.is_empty() => format!("{kind} {ns}/{name}"),
        _ => format!("{kind} {name}"),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn strip_bookkeeping_leaves_out_managed_fields_and_the_last_applied_annotation() {
        let mut obj = json!({"metadata": {
            "name": "a",
            "managedFields": [{"manager": "kubectl"}],
            "annotations": {LAST_APPLIED_ANNOTATION: "{}", "keep": "me"},
        }, "spec": {"x": 1}});
        strip_bookkeeping(&mut obj);
        assert_eq!(
            obj,
            json!({"metadata": {"name": "a", "annotations": {"keep": "me"}}, "spec": {"x": 1}})
        );
        // Annotations that held only the record go; an empty map someone
        // wrote stays as written.
        let mut only = json!({"metadata": {"annotations": {LAST_APPLIED_ANNOTATION: "{}"}}});
        strip_bookkeeping(&mut only);
        assert_eq!(only, json!({"metadata": {}}));
        let mut empty = json!({"metadata": {"annotations": {}}});
        strip_bookkeeping(&mut empty);
        assert_eq!(empty, json!({"metadata": {"annotations": {}}}));
        // Not an object, or no metadata: left alone.
        for mut odd in [
            json!(null),
            json!("x"),
            json!({"spec": {}}),
            json!({"metadata": 3}),
        ] {
            let before = odd.clone();
            strip_bookkeeping(&mut odd);
            assert_eq!(odd, before);
        }
    }

    #[test]
    fn controller_uid_reads_only_the_controller_reference() {
        let obj = json!({"metadata": {"ownerReferences": [
            {"uid": "a", "controller": false},
            {"uid": "b", "controller": true},
        ]}});
        assert_eq!(controller_uid(&obj), Some("b"));
        assert_eq!(controller_uid(&json!({"metadata": {}})), None);
    }

    #[test]
    fn dotted_paths_walk_objects_only() {
        let obj = json!({"spec": {"ref": {"name": "x"}, "list": ["a"]}});
        assert_eq!(str_at(&obj, "spec.ref.name"), Some("x"));
        assert_eq!(str_at(&obj, "spec.list.0"), None);
        assert_eq!(str_at(&obj, "spec.missing"), None);
    }
}
