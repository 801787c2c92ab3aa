//! Per-object differences between two decisions of the same snapshot:
//! what `wasmop replay` prints and shadow runs count.
//!
//! Both sides are in the golden form ([`super::offline::to_golden_text`]):
//! a plan, or `{"rejected": {violations, plan}}`, `{"failed": {reason,
//! message}}`, `{"skipped": {reason}}`. Applies and deletes are matched by
//! `apiVersion`, `kind`, namespace and name; within a matched apply the
//! difference is given field by field. [`diff_kind`] compares two calls
//! of a kind-scoped controller, object plan by object plan.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;
use serde_json::Value;

use crate::reconcile::decide::Decision;
use crate::reconcile::kind::KindDecided;
use crate::reconcile::offline::{to_golden_text, to_kind_golden_text};

/// The golden form of `decision` as a JSON value.
pub fn outcome_of(decision: &Decision) -> Value {
    serde_json::from_str(&to_golden_text(decision)).unwrap_or(Value::Null)
}

/// The golden form of a kind call as a JSON value (what [`diff_kind`]
/// compares).
pub fn kind_outcome_of(kind: &KindDecided) -> Value {
    serde_json::from_str(&to_kind_golden_text(kind)).unwrap_or(Value::Null)
}

/// One difference.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Difference {
    /// What differs: `result`, `apply`, `delete`, `status`,
    /// `primaryPatch`, `event`, `requeue`, `httpRequest`, `gauge`,
    /// `cleanupComplete`, `violation`.
    pub op: String,
    /// The object (`Kind namespace/name`), empty when not about one.
    pub object: String,
    /// The field within it (`.data.key`), empty for the whole.
    pub path: String,
    /// The recorded side (`None`: absent there).
    pub before: Option<Value>,
    /// The candidate side (`None`: absent there).
    pub after: Option<Value>,
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.op)?;
        if !self.object.is_empty() {
            write!(f, " {}", self.object)?;
        }
        if !self.path.is_empty() {
            write!(f, " {}", self.path)?;
        }
        let show = |v: &Option<Value>| match v {
            None => "(absent)".to_owned(),
            Some(v) => {
                let text = v.to_string();
                if text.len() > 200 {
                    format!("{}…", &text[..text.floor_char_boundary(200)])
                } else {
                    text
                }
            }
        };
        write!(f, ": {} → {}", show(&self.before), show(&self.after))
    }
}

fn result_of(outcome: &Value) -> (&'static str, Option<&Value>) {
    if let Some(r) = outcome.get("rejected") {
        ("Rejected", r.get("plan"))
    } else if outcome.get("failed").is_some() {
        ("Failed", None)
    } else if outcome.get("skipped").is_some() {
        ("Skipped", None)
    } else {
        ("Planned", Some(outcome))
    }
}

fn object_key(o: &Value) -> String {
    // An apply's object, or a delete's `target` ({apiVersion, kind,
    // namespace, name}).
    let target = o.get("target");
    let o = target.unwrap_or(o);
    let s = |p: &str| o.pointer(p).and_then(Value::as_str).unwrap_or_default();
    let (ns, name) = if target.is_some() {
        (s("/namespace"), s("/name"))
    } else {
        (s("/metadata/namespace"), s("/metadata/name"))
    };
    let kind = s("/kind");
    let group = s("/apiVersion")
        .split_once('/')
        .map(|(g, _)| g)
        .unwrap_or("");
    let kind = if group.is_empty() {
        kind.to_owned()
    } else {
        format!("{kind}.{group}")
    };
    if ns.is_empty() {
        format!("{kind} {name}")
    } else {
        format!("{kind} {ns}/{name}")
    }
}

/// `path` + `.key`, quoted when the key is not a plain identifier.
fn child(path: &str, key: &str) -> String {
    if !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        format!("{path}.{key}")
    } else {
        format!("{path}[{key:?}]")
    }
}

/// Field-level differences of two JSON values.
fn fields(
    op: &str,
    object: &str,
    path: &str,
    a: Option<&Value>,
    b: Option<&Value>,
    out: &mut Vec<Difference>,
) {
    match (a, b) {
        (Some(Value::Object(x)), Some(Value::Object(y))) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                fields(op, object, &child(path, k), x.get(k), y.get(k), out);
            }
        }
        (Some(Value::Array(x)), Some(Value::Array(y))) if x.len() == y.len() => {
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                fields(op, object, &format!("{path}[{i}]"), Some(p), Some(q), out);
            }
        }
        (a, b) if a != b => out.push(Difference {
            op: op.to_owned(),
            object: object.to_owned(),
            path: path.to_owned(),
            before: a.cloned(),
            after: b.cloned(),
        }),
        _ => {}
    }
}

fn keyed<'a>(
    items: Option<&'a Value>,
    get: impl Fn(&'a Value) -> &'a Value,
) -> BTreeMap<String, &'a Value> {
    items
        .and_then(Value::as_array)
        .map(|a| a.iter().map(|i| (object_key(get(i)), i)).collect())
        .unwrap_or_default()
}

/// The object of an apply operation.
fn obj(op: &Value) -> &Value {
    op.get("object").unwrap_or(op)
}

/// Every difference between the recorded outcome `before` and the
/// candidate's `after`; empty when they are the same.
pub fn diff(before: &Value, after: &Value) -> Vec<Difference> {
    let mut out = Vec::new();
    let (ra, pa) = result_of(before);
    let (rb, pb) = result_of(after);
    let summary = |r: &str, o: &Value| match r {
        "Planned" => Value::String(r.to_owned()),
        "Rejected" => serde_json::json!({"rejected": o.pointer("/rejected/violations")}),
        _ => o.clone(),
    };
    if ra != rb || (matches!(ra, "Failed" | "Skipped") && before != after) {
        out.push(Difference {
            op: "result".into(),
            object: String::new(),
            path: String::new(),
            before: Some(summary(ra, before)),
            after: Some(summary(rb, after)),
        });
        return out;
    }
    if ra == "Rejected" {
        fields(
            "violation",
            "",
            "",
            before.pointer("/rejected/violations"),
            after.pointer("/rejected/violations"),
            &mut out,
        );
    }
    let (Some(pa), Some(pb)) = (pa, pb) else {
        return out;
    };
    // Applies, by object.
    let aa = keyed(pa.get("apply"), obj);
    let ab = keyed(pb.get("apply"), obj);
    let keys: std::collections::BTreeSet<&String> = aa.keys().chain(ab.keys()).collect();
    for k in keys {
        match (aa.get(k), ab.get(k)) {
            (Some(x), Some(y)) => {
                fields("apply", k, "", Some(obj(x)), Some(obj(y)), &mut out);
                let pre = |v: &'_ Value| v.get("precondition").cloned();
                let (p, q) = (pre(x), pre(y));
                fields(
                    "apply",
                    k,
                    "(precondition)",
                    p.as_ref(),
                    q.as_ref(),
                    &mut out,
                );
            }
            (x, y) => out.push(Difference {
                op: "apply".into(),
                object: k.clone(),
                path: String::new(),
                before: x.map(|v| obj(v).clone()),
                after: y.map(|v| obj(v).clone()),
            }),
        }
    }
    // Deletes, by object.
    let da = keyed(pa.get("delete"), |v| v);
    let db = keyed(pb.get("delete"), |v| v);
    let keys: std::collections::BTreeSet<&String> = da.keys().chain(db.keys()).collect();
    for k in keys {
        let (x, y) = (da.get(k), db.get(k));
        if x != y {
            out.push(Difference {
                op: "delete".into(),
                object: k.clone(),
                path: String::new(),
                before: x.map(|v| (*v).clone()),
                after: y.map(|v| (*v).clone()),
            });
        }
    }
    // Everything else, field by field.
    for (key, op) in [
        ("status", "status"),
        ("primaryPatch", "primaryPatch"),
        ("events", "event"),
        ("requeueAfterMs", "requeue"),
        ("httpRequests", "httpRequest"),
        ("gauges", "gauge"),
        ("cleanupComplete", "cleanupComplete"),
    ] {
        fields(op, "", "", pa.get(key), pb.get(key), &mut out);
    }
    out
}

/// The differences between two kind calls in the golden form of
/// [`super::offline::to_kind_golden_text`], per primary (`namespace/name`,
/// or `name` when cluster-scoped): [`diff`] of the object plans both name,
/// a `result` difference for a primary only one side planned, and for the
/// whole call (under the empty name) a `result` difference when either side
/// is not split into object plans (failed, skipped) and they differ, or a
/// `refused` difference when the refused object plans differ. Empty when
/// the calls decided the same.
pub fn diff_kind(before: &Value, after: &Value) -> Vec<(String, Vec<Difference>)> {
    let whole = |op: &str, a: Option<&Value>, b: Option<&Value>| Difference {
        op: op.to_owned(),
        object: String::new(),
        path: String::new(),
        before: a.cloned(),
        after: b.cloned(),
    };
    let (Some(oa), Some(ob)) = (before.get("objects"), after.get("objects")) else {
        return if before == after {
            Vec::new()
        } else {
            vec![(
                String::new(),
                vec![whole("result", Some(before), Some(after))],
            )]
        };
    };
    let by_primary = |objects: &Value| -> BTreeMap<String, Value> {
        objects
            .as_array()
            .map(|plans| {
                plans
                    .iter()
                    .map(|p| {
                        let s = |k: &str| p.get(k).and_then(Value::as_str).unwrap_or_default();
                        let key = match s("namespace") {
                            "" => s("name").to_owned(),
                            ns => format!("{ns}/{}", s("name")),
                        };
                        let mut outcome = p.clone();
                        if let Some(fields) = outcome.as_object_mut() {
                            fields.remove("namespace");
                            fields.remove("name");
                        }
                        (key, outcome)
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let (pa, pb) = (by_primary(oa), by_primary(ob));
    let mut out = Vec::new();
    let (ra, rb) = (before.get("refused"), after.get("refused"));
    if ra != rb {
        out.push((String::new(), vec![whole("refused", ra, rb)]));
    }
    let keys: std::collections::BTreeSet<&String> = pa.keys().chain(pb.keys()).collect();
    for k in keys {
        let differences = match (pa.get(k), pb.get(k)) {
            (Some(a), Some(b)) => diff(a, b),
            (a, b) => vec![whole("result", a, b)],
        };
        if !differences.is_empty() {
            out.push((k.clone(), differences));
        }
    }
    out
}

/// One entry of an allow-list of expected differences: every field given
/// must match (`*` matches any run of characters).
#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Allowed {
    /// The difference's `op` (apply, delete, status, …).
    #[serde(default)]
    pub op: Option<String>,
    /// The object, `Kind namespace/name` (`Kind.group` for grouped kinds).
    #[serde(default)]
    pub object: Option<String>,
    /// The field path (`.metadata.labels.version`).
    #[serde(default)]
    pub path: Option<String>,
}

/// `*`-glob match.
pub fn glob(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == text;
    }
    let mut rest = text;
    for (i, part) in parts.iter().enumerate() {
        if i == 0 {
            let Some(r) = rest.strip_prefix(part) else {
                return false;
            };
            rest = r;
        } else if i == parts.len() - 1 {
            return rest.ends_with(part);
        } else {
            match rest.find(part) {
                Some(at) => rest = &rest[at + part.len()..],
                None => return false,
            }
        }
    }
    true
}

impl Allowed {
    /// True when `d` is expected.
    pub fn matches(&self, d: &Difference) -> bool {
        let ok = |p: &Option<String>, v: &str| p.as_deref().is_none_or(|p| glob(p, v));
        ok(&self.op, &d.op) && ok(&self.object, &d.object) && ok(&self.path, &d.path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cm(name: &str, v: &str) -> Value {
        json!({"object": {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "ns", "labels": {"test.wasmop.dev/version": v}},
            "data": {"value": "x"}}})
    }

    #[test]
    fn equal_plans_have_no_difference() {
        let p = json!({"apply": [cm("a", "v1")], "delete": [], "status": {"ready": true}, "events": []});
        assert!(diff(&p, &p).is_empty());
    }

    #[test]
    fn changed_fields_added_deletes_and_outcomes_are_named() {
        let a = json!({"apply": [cm("a", "v1"), cm("b", "v1")], "delete": [],
            "status": {"ready": true}, "events": []});
        let b = json!({"apply": [cm("a", "v2")], "delete": [{"target": {"apiVersion": "v1", "kind": "ConfigMap",
            "name": "b", "namespace": "ns"}}], "status": {"ready": false}, "events": []});
        let d: Vec<String> = diff(&a, &b).iter().map(ToString::to_string).collect();
        assert_eq!(
            d,
            [
                "apply ConfigMap ns/a .metadata.labels[\"test.wasmop.dev/version\"]: \"v1\" → \"v2\"",
                "apply ConfigMap ns/b: {\"apiVersion\":\"v1\",\"data\":{\"value\":\"x\"},\"kind\":\"ConfigMap\",\"metadata\":{\"labels\":{\"test.wasmop.dev/version\":\"v1\"},\"name\":\"b\",\"namespace\":\"ns\"}} → (absent)",
                "delete ConfigMap ns/b: (absent) → {\"target\":{\"apiVersion\":\"v1\",\"kind\":\"ConfigMap\",\"name\":\"b\",\"namespace\":\"ns\"}}",
                "status .ready: true → false",
            ]
        );
        let failed = json!({"failed": {"reason": "PluginTrapped", "message": "boom"}});
        let d = diff(&a, &failed);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].op, "result");
        assert!(diff(&failed, &failed).is_empty());
    }

    #[test]
    fn the_allow_list_matches_by_glob() {
        let d = Difference {
            op: "apply".into(),
            object: "ConfigMap ns/a-cm".into(),
            path: ".metadata.labels[\"test.wasmop.dev/version\"]".into(),
            before: None,
            after: None,
        };
        let allow: Allowed = serde_yaml::from_str(
            "{op: apply, object: 'ConfigMap */*-cm', path: '.metadata.labels*'}",
        )
        .unwrap();
        assert!(allow.matches(&d));
        let other: Allowed = serde_yaml::from_str("{op: delete}").unwrap();
        assert!(!other.matches(&d));
        assert!(glob("a*b*c", "axxbyyc") && !glob("a*b*c", "axxbyy") && glob("*", ""));
        assert!(serde_yaml::from_str::<Allowed>("{opp: apply}").is_err());
    }

    #[test]
    fn kind_calls_differ_per_primary_and_as_a_whole() {
        let plan = |v: &str| json!({"apply": [cm("a", v)], "delete": [], "status": {"ready": true}, "events": []});
        let entry = |ns: &str, name: &str, v: &str| {
            let mut e = plan(v);
            e["namespace"] = json!(ns);
            e["name"] = json!(name);
            e
        };
        let call = |entries: Vec<Value>, refused: Vec<&str>| json!({"objects": entries, "refused": refused});
        let before = call(vec![entry("ns", "x", "v1"), entry("ns", "y", "v1")], vec![]);
        assert!(diff_kind(&before, &before).is_empty());
        // The order of object plans does not matter.
        let swapped = call(vec![entry("ns", "y", "v1"), entry("ns", "x", "v1")], vec![]);
        assert!(diff_kind(&before, &swapped).is_empty());
        // One primary's plan changed, another is planned by one side only,
        // and the refusals differ.
        let after = call(
            vec![entry("ns", "x", "v2"), entry("", "z", "v1")],
            vec!["object plan for ns/gone: not in the snapshot"],
        );
        let found = diff_kind(&before, &after);
        let names: Vec<&str> = found.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(names, ["", "ns/x", "ns/y", "z"], "{found:?}");
        assert_eq!(found[0].1[0].op, "refused");
        assert_eq!(found[1].1[0].op, "apply");
        assert_eq!(
            found[1].1[0].path,
            ".metadata.labels[\"test.wasmop.dev/version\"]"
        );
        assert_eq!(found[2].1[0].op, "result");
        assert!(found[2].1[0].after.is_none());
        assert!(found[3].1[0].before.is_none());
        // A failed call against a split one is one difference of the whole.
        let failed = json!({"failed": {"reason": "PluginTrapped", "message": "boom"}});
        let found = diff_kind(&before, &failed);
        assert_eq!(found.len(), 1);
        assert_eq!(
            (found[0].0.as_str(), found[0].1[0].op.as_str()),
            ("", "result")
        );
        assert!(diff_kind(&failed, &failed).is_empty());
    }
}
