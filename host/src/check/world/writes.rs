//! What the modelled API server does to an object it is given: the
//! normal form objects are compared in ([`normalise`]), defaults on
//! create, Secret `stringData`, immutable fields, and merges of applies
//! and patches.
//!
//! # Guarantees
//! - A write the real API server would refuse for an immutable field is
//!   refused ([`WriteError`]), so a plugin that relies on changing one is
//!   found offline.
//! - Two objects that differ only in what the API server fills in compare
//!   equal after [`normalise`].

use std::collections::BTreeSet;

use base64::Engine as _;
use serde_json::{Map, Value, json};

use super::WriteError;
use crate::object;

/// The object without uids, resourceVersions, generations and times.
pub fn normalise(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.retain(|k, _| {
                !(k == "uid"
                    || k == "resourceVersion"
                    || k == "generation"
                    || k == "observedGeneration"
                    || k.ends_with("Time")
                    || k.ends_with("Timestamp")
                    || k.ends_with("At")
                    || k == "clusterIP"
                    || k == "clusterIPs"
                    || k == "message")
            });
            m.values_mut().for_each(normalise);
            // Conditions in type order: the order a history added them in
            // is no part of the state.
            if let Some(Value::Array(list)) = m.get_mut("conditions") {
                list.sort_by(|a, b| a["type"].to_string().cmp(&b["type"].to_string()));
            }
        }
        Value::Array(a) => a.iter_mut().for_each(normalise),
        _ => {}
    }
}

/// Every field but `metadata` and `status`.
pub(super) fn spec_of(v: &Value) -> Value {
    let mut out = v.clone();
    if let Some(m) = out.as_object_mut() {
        m.remove("metadata");
        m.remove("status");
    }
    out
}

pub(super) fn secret_string_data(o: &mut Value) {
    if object::api_version(o) != "v1" || object::kind(o) != "Secret" {
        return;
    }
    let Some(sd) = o.as_object_mut().and_then(|m| m.remove("stringData")) else {
        return;
    };
    if let Some(sd) = sd.as_object() {
        let b64 = base64::engine::general_purpose::STANDARD;
        for (k, v) in sd {
            o["data"][k] = json!(b64.encode(v.as_str().unwrap_or_default()));
        }
    }
}

/// What the server defaults on create that plugins meet.
pub(super) fn defaults_on_create(o: &mut Value, seq: u64) {
    if object::api_version(o) == "v1"
        && object::kind(o) == "Service"
        && o["spec"]["clusterIP"].is_null()
    {
        let ip = format!("10.96.{}.{}", (seq / 250) % 250, seq % 250 + 1);
        o["spec"]["clusterIP"] = json!(ip);
        o["spec"]["clusterIPs"] = json!([ip]);
    }
}

pub(super) fn immutable(old: &Value, new: &Value) -> Result<(), WriteError> {
    let changed = |path: &str| object::value_at(old, path) != object::value_at(new, path);
    let what = object::describe(new);
    let refuse = |field: &str| Err(WriteError::Invalid(format!("{what}: {field} is immutable")));
    match (object::api_version(new), object::kind(new)) {
        ("batch/v1", "Job") => {
            for f in ["spec.template", "spec.selector", "spec.completions"] {
                if changed(f) {
                    return refuse(f);
                }
            }
        }
        ("apps/v1", "StatefulSet") => {
            let allowed = [
                "replicas",
                "template",
                "updateStrategy",
                "minReadySeconds",
                "ordinals",
                "persistentVolumeClaimRetentionPolicy",
            ];
            let keys: BTreeSet<&String> = old["spec"]
                .as_object()
                .into_iter()
                .chain(new["spec"].as_object())
                .flat_map(Map::keys)
                .collect();
            for k in keys {
                if !allowed.contains(&k.as_str()) && old["spec"].get(k) != new["spec"].get(k) {
                    return refuse(&format!("spec.{k}"));
                }
            }
        }
        ("apps/v1", "Deployment") if changed("spec.selector") => {
            return refuse("spec.selector");
        }
        ("v1", "Service") if changed("spec.clusterIP") && !old["spec"]["clusterIP"].is_null() => {
            return refuse("spec.clusterIP");
        }
        _ => {}
    }
    Ok(())
}

/// The leaf paths of an object (maps are walked; lists and scalars are
/// leaves), without `metadata` other than labels and annotations.
pub(super) fn leaf_paths(v: &Value) -> BTreeSet<Vec<String>> {
    fn walk(v: &Value, at: &mut Vec<String>, out: &mut BTreeSet<Vec<String>>) {
        match v {
            Value::Object(m) if !m.is_empty() => {
                for (k, x) in m {
                    at.push(k.clone());
                    walk(x, at, out);
                    at.pop();
                }
            }
            _ => {
                out.insert(at.clone());
            }
        }
    }
    let mut out = BTreeSet::new();
    let mut at = Vec::new();
    walk(v, &mut at, &mut out);
    out.retain(|p| {
        p.first().map(String::as_str) != Some("metadata")
            || matches!(p.get(1).map(String::as_str), Some("labels" | "annotations"))
    });
    out
}

pub(super) fn remove_path(v: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut cur = v;
    for p in parents {
        match cur.get_mut(p) {
            Some(next) => cur = next,
            None => return,
        }
    }
    if let Some(m) = cur.as_object_mut() {
        m.remove(last);
    }
}

/// Deep merge of maps; anything else replaces.
pub(super) fn merge(into: &mut Value, from: &Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                match a.get_mut(k) {
                    Some(slot) if slot.is_object() && v.is_object() => merge(slot, v),
                    _ => {
                        a.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (slot, v) => *slot = v.clone(),
    }
}

/// RFC 7386 merge patch.
pub(super) fn merge_patch(into: &mut Value, patch: &Value) {
    let Some(p) = patch.as_object() else {
        *into = patch.clone();
        return;
    };
    if !into.is_object() {
        *into = json!({});
    }
    let Some(a) = into.as_object_mut() else {
        return;
    };
    for (k, v) in p {
        if v.is_null() {
            a.remove(k);
        } else {
            merge_patch(a.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}
