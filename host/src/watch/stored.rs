//! How the watch cache holds one object: its compact JSON text, with the
//! few fields the cache indexes and routing read read from it once.
//!
//! A parsed `serde_json::Value` costs several times its text: each JSON
//! object is a `BTreeMap` whose nodes are allocated for eleven entries
//! whatever the map holds, and a Kubernetes object is many small maps.
//! The text is what crosses into a plugin anyway; a reader that needs the
//! tree parses it ([`CachedObject::value`]).
//!
//! # Guarantees
//! - [`CachedObject::value`] gives back the value the object was made from
//!   ([`CachedObject::from_value`]), key for key.
//! - The identity fields ([`CachedObject::namespace`], `name`, `uid`,
//!   `resource_version`, `owner_uids`) answer what the functions of
//!   [`crate::object`] answer on that value, without a parse.
//! - [`CachedObject::labels`] answers what [`crate::object::labels`] answers
//!   on the value, reading the text without building the tree.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use crate::object;

/// One cached object: compact JSON text and its identity fields.
#[derive(Debug, PartialEq, Eq)]
pub struct CachedObject {
    text: Box<str>,
    namespace: Box<str>,
    name: Box<str>,
    uid: Box<str>,
    resource_version: Box<str>,
    /// [`object::owner_uids`] of the value.
    owners: Box<[Box<str>]>,
}

impl CachedObject {
    /// The object `v` as cached: its compact JSON text and identity.
    pub fn from_value(v: &Value) -> Self {
        Self {
            // Serializing a `Value` cannot fail: its keys are strings.
            text: serde_json::to_string(v)
                .unwrap_or_else(|_| "null".to_owned())
                .into_boxed_str(),
            namespace: object::namespace(v).unwrap_or_default().into(),
            name: object::name(v).into(),
            uid: object::uid(v).into(),
            resource_version: object::resource_version(v).into(),
            owners: object::owner_uids(v).into_iter().map(Box::from).collect(),
        }
    }

    /// The object as compact JSON text.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The object parsed (a new tree each call).
    pub fn value(&self) -> Value {
        // The text was written from a `Value`, so it parses.
        serde_json::from_str(&self.text).unwrap_or(Value::Null)
    }

    /// `metadata.namespace`, empty when cluster-scoped.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// `metadata.name`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `metadata.uid` (empty when absent).
    pub fn uid(&self) -> &str {
        &self.uid
    }

    /// `metadata.resourceVersion` (empty when absent).
    pub fn resource_version(&self) -> &str {
        &self.resource_version
    }

    /// The UIDs that may own the object, as [`object::owner_uids`] says.
    pub fn owner_uids(&self) -> impl Iterator<Item = &str> {
        self.owners.iter().map(|o| &**o)
    }

    /// `metadata.labels` as [`object::labels`] reads them, from the text.
    pub fn labels(&self) -> BTreeMap<String, String> {
        #[derive(Deserialize)]
        struct Top {
            #[serde(default)]
            metadata: Option<Meta>,
        }
        #[derive(Deserialize)]
        struct Meta {
            #[serde(default)]
            labels: Option<BTreeMap<String, Value>>,
        }
        match serde_json::from_str::<Top>(&self.text) {
            Ok(top) => top
                .metadata
                .and_then(|m| m.labels)
                .unwrap_or_default()
                .into_iter()
                .filter_map(|(k, v)| match v {
                    Value::String(s) => Some((k, s)),
                    _ => None,
                })
                .collect(),
            // Not an object with an object for metadata: read it the
            // general way.
            Err(_) => object::labels(&self.value()),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn widget() -> Value {
        json!({"apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
            "metadata": {"name": "w", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
                "labels": {"a": "1", "wasmop.dev/owner-uid": "u9", "odd": 3},
                "ownerReferences": [{"uid": "u0", "controller": false},
                                    {"uid": "u8", "controller": true}]},
            "spec": {"value": "v", "list": [1, 2.5, null, true, {"x": "é\"\\"}]},
            "status": {}})
    }

    #[test]
    fn a_cached_object_round_trips_and_answers_like_its_value() {
        let v = widget();
        let c = CachedObject::from_value(&v);
        assert_eq!(c.value(), v);
        assert_eq!(c.text(), serde_json::to_string(&v).expect("text"));
        assert_eq!(c.namespace(), "ns");
        assert_eq!(c.name(), "w");
        assert_eq!(c.uid(), "u1");
        assert_eq!(c.resource_version(), "7");
        assert_eq!(c.owner_uids().collect::<Vec<_>>(), object::owner_uids(&v));
        assert_eq!(c.owner_uids().collect::<Vec<_>>(), ["u8", "u9"]);
        assert_eq!(c.labels(), object::labels(&v));
        assert_eq!(c.labels().len(), 2);
    }

    #[test]
    fn missing_fields_read_empty() {
        for v in [
            json!({"metadata": {"name": "c"}}),
            json!({"metadata": {"name": "c", "labels": null}}),
            json!({"metadata": null}),
            json!({}),
            json!([1]),
        ] {
            let c = CachedObject::from_value(&v);
            assert_eq!(c.value(), v);
            assert_eq!(c.namespace(), "");
            assert_eq!(c.uid(), "");
            assert_eq!(c.owner_uids().count(), 0);
            assert_eq!(c.labels(), object::labels(&v), "{v}");
        }
    }
}
