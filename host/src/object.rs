//! Read-only accessors for Kubernetes objects held as JSON.
//!
//! The host keeps objects as `serde_json::Value` — the one JSON shape that
//! crosses the plugin boundary — and reads the few metadata fields it
//! needs through these helpers. Missing fields read as empty / `None`.

use std::collections::BTreeMap;

use serde_json::Value;

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

/// The UID of the object's controller: the ownerReference with
/// `controller: true`, if any.
pub fn controller_uid(object: &Value) -> Option<&str> {
    value_at(object, "metadata.ownerReferences")?
        .as_array()?
        .iter()
        .find(|r| r.get("controller").and_then(Value::as_bool) == Some(true))?
        .get("uid")?
        .as_str()
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
