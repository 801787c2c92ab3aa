//! Spec mutations from a CRD's OpenAPI schema (property 7, after Acto):
//! for every field of `spec` the schema describes, changes that stay
//! within it (each other enum value, a toggled boolean, the bounds of a
//! number, a list grown and shrunk, an optional field removed) and
//! changes that leave it (a number past its bound, a list past its
//! length, an empty string that must not be, a value of the wrong type).
//! Each mutation says whether the CRD's structural schema admits it
//! ([`admits`]): what it refuses never reaches a plugin.
//!
//! Not modelled: `pattern` and `format` (no mutation of a string that has
//! one), CEL `x-kubernetes-validations`, defaulting.

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// One changed primary.
#[derive(Clone, Debug)]
pub struct Mutation {
    /// What changed, for messages: `spec.replicas = 0`.
    pub describe: String,
    /// The primary with the change.
    pub object: Value,
    /// True when the CRD's schema admits it.
    pub admitted: bool,
}

/// The `openAPIV3Schema` of every kind the CRD documents in `docs` hold
/// (the storage version's, else the first served), by kind.
pub fn schemas(docs: &[Value]) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    for d in docs {
        if d["kind"] != "CustomResourceDefinition" {
            continue;
        }
        let Some(kind) = d["spec"]["names"]["kind"].as_str() else {
            continue;
        };
        let versions = d["spec"]["versions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let chosen = versions
            .iter()
            .find(|v| v["storage"] == true)
            .or_else(|| versions.first());
        if let Some(s) = chosen.map(|v| v["schema"]["openAPIV3Schema"].clone())
            && s.is_object()
        {
            out.insert(kind.to_owned(), s);
        }
    }
    out
}

/// The mutations of `primary`'s spec that `schema` (its
/// `openAPIV3Schema`) describes, in a fixed order.
pub fn mutations(schema: &Value, primary: &Value) -> Vec<Mutation> {
    let mut out = Vec::new();
    let spec_schema = &schema["properties"]["spec"];
    let mut path = vec!["spec".to_owned()];
    walk(schema, spec_schema, primary, &mut path, &mut out, 0);
    out
}

fn get<'v>(v: &'v Value, path: &[String]) -> Option<&'v Value> {
    path.iter().try_fold(v, |v, p| v.get(p))
}

fn set(v: &Value, path: &[String], new: Option<Value>) -> Value {
    let mut out = v.clone();
    let Some((last, parents)) = path.split_last() else {
        return out;
    };
    let mut cur = &mut out;
    for p in parents {
        if !cur.get(p).is_some_and(Value::is_object) {
            cur[p] = json!({});
        }
        cur = &mut cur[p];
    }
    match new {
        Some(n) => cur[last] = n,
        None => {
            if let Some(m) = cur.as_object_mut() {
                m.remove(last);
            }
        }
    }
    out
}

fn walk(
    root: &Value,
    s: &Value,
    primary: &Value,
    path: &mut Vec<String>,
    out: &mut Vec<Mutation>,
    depth: usize,
) {
    if depth > 6 || !s.is_object() {
        return;
    }
    let current = get(primary, path).cloned();
    let mut push = |describe: String, new: Option<Value>| {
        let object = set(primary, path, new);
        let admitted = admits(root, &object);
        out.push(Mutation {
            describe,
            object,
            admitted,
        });
    };
    let at = path.join(".");
    if let Some(values) = s["enum"].as_array() {
        for v in values {
            if Some(v) != current.as_ref() {
                push(format!("{at} = {v}"), Some(v.clone()));
            }
        }
        push(
            format!("{at} = \"not-in-enum\""),
            Some(json!("not-in-enum")),
        );
        return;
    }
    match s["type"].as_str() {
        Some("boolean") => {
            let b = current.as_ref().and_then(Value::as_bool).unwrap_or(false);
            push(format!("{at} = {}", !b), Some(json!(!b)));
            push(format!("{at} = \"yes\" (a string)"), Some(json!("yes")));
        }
        Some("integer" | "number") => {
            let cur = current.as_ref().and_then(Value::as_i64);
            let min = s["minimum"].as_i64();
            let max = s["maximum"].as_i64();
            if let Some(m) = min {
                push(format!("{at} = {m} (its minimum)"), Some(json!(m)));
                push(
                    format!("{at} = {} (below its minimum)", m - 1),
                    Some(json!(m - 1)),
                );
            } else {
                push(format!("{at} = -1 (no minimum declared)"), Some(json!(-1)));
                push(format!("{at} = 0"), Some(json!(0)));
            }
            if let Some(m) = max {
                push(format!("{at} = {m} (its maximum)"), Some(json!(m)));
                push(
                    format!("{at} = {} (above its maximum)", m + 1),
                    Some(json!(m + 1)),
                );
            } else {
                let big = cur.unwrap_or(1).saturating_add(1);
                push(format!("{at} = {big}"), Some(json!(big)));
            }
            push(format!("{at} = \"x\" (a string)"), Some(json!("x")));
        }
        Some("string") => {
            if s.get("pattern").is_some() || s.get("format").is_some() {
                return;
            }
            push(format!("{at} = \"\""), Some(json!("")));
            push(
                format!("{at} = \"check-mutated\""),
                Some(json!("check-mutated")),
            );
        }
        Some("array") => {
            let list = current.as_ref().and_then(Value::as_array).cloned();
            if let Some(list) = list {
                if let Some(last) = list.last() {
                    let mut grown = list.clone();
                    grown.push(last.clone());
                    push(
                        format!("{at} grown to {} items", grown.len()),
                        Some(json!(grown)),
                    );
                    let mut shrunk = list.clone();
                    shrunk.pop();
                    push(
                        format!("{at} shrunk to {} items", shrunk.len()),
                        Some(json!(shrunk)),
                    );
                }
                if !list.is_empty() {
                    push(format!("{at} emptied"), Some(json!([])));
                }
            }
        }
        _ => {}
    }
    if let Some(props) = s["properties"].as_object() {
        let required: Vec<&str> = s["required"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        for (name, sub) in props {
            path.push(name.clone());
            let present = get(primary, path).is_some();
            if present && !required.contains(&name.as_str()) {
                let object = set(primary, path, None);
                let admitted = admits(root, &object);
                out.push(Mutation {
                    describe: format!("{} removed", path.join(".")),
                    object,
                    admitted,
                });
            }
            walk(root, sub, primary, path, out, depth + 1);
            path.pop();
        }
    }
}

/// True when `schema` (structural, as a CRD's `openAPIV3Schema`) admits
/// `obj`'s `spec`: types, enums, numeric bounds, lengths, item counts and
/// required fields.
pub fn admits(schema: &Value, obj: &Value) -> bool {
    match obj.get("spec") {
        Some(spec) => valid(&schema["properties"]["spec"], spec),
        None => true,
    }
}

fn valid(s: &Value, v: &Value) -> bool {
    if !s.is_object() {
        return true;
    }
    if v.is_null() {
        return s["nullable"] == true;
    }
    if let Some(values) = s["enum"].as_array()
        && !values.contains(v)
    {
        return false;
    }
    if s["x-kubernetes-int-or-string"] == true {
        return v.is_i64() || v.is_string();
    }
    let ok_type = match s["type"].as_str() {
        Some("object") => v.is_object(),
        Some("array") => v.is_array(),
        Some("string") => v.is_string(),
        Some("integer") => v.is_i64() || v.is_u64(),
        Some("number") => v.is_number(),
        Some("boolean") => v.is_boolean(),
        _ => true,
    };
    if !ok_type {
        return false;
    }
    if let Some(n) = v.as_f64()
        && (s["minimum"].as_f64().is_some_and(|m| n < m)
            || s["maximum"].as_f64().is_some_and(|m| n > m))
    {
        return false;
    }
    if let Some(t) = v.as_str() {
        let len = t.chars().count() as u64;
        if s["minLength"].as_u64().is_some_and(|m| len < m)
            || s["maxLength"].as_u64().is_some_and(|m| len > m)
        {
            return false;
        }
    }
    if let Some(a) = v.as_array() {
        let n = a.len() as u64;
        if s["minItems"].as_u64().is_some_and(|m| n < m)
            || s["maxItems"].as_u64().is_some_and(|m| n > m)
        {
            return false;
        }
        if !a.iter().all(|x| valid(&s["items"], x)) {
            return false;
        }
    }
    if let Some(m) = v.as_object() {
        let required = s["required"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str);
        for r in required {
            if !m.contains_key(r) {
                return false;
            }
        }
        if let Some(props) = s["properties"].as_object() {
            for (k, x) in m {
                if let Some(sub) = props.get(k)
                    && !valid(sub, x)
                {
                    return false;
                }
            }
        }
        if let Some(extra) = s.get("additionalProperties").filter(|a| a.is_object()) {
            for x in m.values() {
                if !valid(extra, x) {
                    return false;
                }
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema() -> Value {
        json!({"type": "object", "properties": {"spec": {"type": "object", "required": ["size"],
            "properties": {
                "size": {"type": "integer", "minimum": 1, "maximum": 5},
                "mode": {"type": "string", "enum": ["A", "B"]},
                "on": {"type": "boolean"},
                "tags": {"type": "array", "maxItems": 2, "items": {"type": "string"}}}}}})
    }

    #[test]
    fn mutations_stay_in_and_leave_the_schema_and_say_which() {
        let p = json!({"spec": {"size": 2, "mode": "A", "tags": ["x", "y"]}});
        assert!(admits(&schema(), &p));
        let all = mutations(&schema(), &p);
        let find = |d: &str| {
            all.iter()
                .find(|m| m.describe == d)
                .unwrap_or_else(|| panic!("{d}: {all:#?}"))
        };
        assert!(find("spec.mode = \"B\"").admitted);
        assert!(!find("spec.mode = \"not-in-enum\"").admitted);
        assert!(find("spec.size = 5 (its maximum)").admitted);
        assert!(!find("spec.size = 6 (above its maximum)").admitted);
        assert!(!find("spec.size = 0 (below its minimum)").admitted);
        assert!(find("spec.on = true").admitted);
        assert!(!find("spec.tags grown to 3 items").admitted);
        assert!(find("spec.tags shrunk to 1 items").admitted);
    }
}
