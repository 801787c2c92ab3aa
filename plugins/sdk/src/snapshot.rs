//! What one reconcile sees: [`Snapshot`], with typed accessors.
//!
//! Objects are kept as parsed JSON ([`serde_json::Value`]) exactly as the API
//! server returned them; the accessors deserialize them on demand into
//! `k8s-openapi` types or the plugin's own serde structs.
//!
//! ```
//! use wasmop_sdk::k8s_openapi::api::core::v1::ConfigMap;
//! use wasmop_sdk::testing::SnapshotBuilder;
//! use serde_json::json;
//!
//! #[derive(serde::Deserialize)]
//! struct Widget { spec: WidgetSpec }
//! #[derive(serde::Deserialize)]
//! struct WidgetSpec { value: String }
//!
//! let snapshot = SnapshotBuilder::new("widget")
//!     .primary(json!({"apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
//!                     "metadata": {"name": "w", "namespace": "ns"}, "spec": {"value": "v"}}))
//!     .owned(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "w-cm", "namespace": "ns"}}))
//!     .build();
//! let widget: Widget = snapshot.primary_as()?;
//! assert_eq!(widget.spec.value, "v");
//! let maps: Vec<ConfigMap> = snapshot.owned_of_kind()?;
//! assert_eq!(maps[0].metadata.name.as_deref(), Some("w-cm"));
//! # Ok::<(), wasmop_sdk::ReconcileError>(())
//! ```
//! (`SnapshotBuilder` is in the `testing` module, behind the `testing`
//! feature.)

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ReconcileError;

/// Everything a plugin sees of the world for one reconcile (WIT `snapshot`).
///
/// JSON: `{"controller","primary":{…},"owned":[…],"related":[{"read","object"}],
/// "now","deleting","settings":{…},"observations":[…]}`. When read from JSON,
/// missing lists default to empty, `deleting` to false and `settings` to `{}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Snapshot {
    /// Name of the controller (from the manifest) this call is for.
    pub controller: String,
    /// The primary object.
    pub primary: Value,
    /// Objects the primary owns (by controller ownerReference or owner
    /// label), sorted by kind, namespace and name.
    #[serde(default)]
    pub owned: Vec<Value>,
    /// Objects selected by the controller's reads.
    #[serde(default)]
    pub related: Vec<RelatedObject>,
    /// The current time, RFC 3339 in UTC. The only clock a plugin has.
    pub now: String,
    /// True when the primary has a deletionTimestamp.
    #[serde(default)]
    pub deleting: bool,
    /// The plugin's settings (`{}` when none were given).
    #[serde(default = "empty_object")]
    pub settings: Value,
    /// Results of earlier HTTP requests for this primary.
    #[serde(default)]
    pub observations: Vec<Observation>,
}

fn empty_object() -> Value {
    Value::Object(serde_json::Map::new())
}

/// An object selected by a read, tagged with the read's id (WIT `related-object`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RelatedObject {
    /// The `Read::id` that selected the object.
    pub read: String,
    /// The object.
    pub object: Value,
}

pub use wasmop_contract::{Observation, ObservationOutcome};

impl wasmop_contract::plan::PrimaryObject for Snapshot {
    fn primary_object(&self) -> &Value {
        &self.primary
    }
}

impl Snapshot {
    /// The primary deserialized into `T` (a `k8s-openapi` type or the
    /// plugin's own struct for a custom resource).
    ///
    /// # Errors
    ///
    /// [`ReconcileError::InvalidSpec`] when the primary does not have the
    /// shape of `T`.
    pub fn primary_as<T: DeserializeOwned>(&self) -> Result<T, ReconcileError> {
        T::deserialize(&self.primary).map_err(|e| {
            ReconcileError::invalid_spec(format!(
                "{} {}: {e}",
                str_at(&self.primary, &["kind"]),
                self.primary_name()
            ))
        })
    }

    /// `metadata.name` of the primary (empty when missing).
    pub fn primary_name(&self) -> &str {
        str_at(&self.primary, &["metadata", "name"])
    }

    /// `metadata.namespace` of the primary; `None` for a cluster-scoped one.
    pub fn primary_namespace(&self) -> Option<&str> {
        self.primary
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .filter(|ns| !ns.is_empty())
    }

    /// True when this is the snapshot of a kind-scoped controller (see
    /// [`crate::Scope::Kind`]): its primary is a `v1` `List` of every
    /// primary of the kind.
    pub fn is_kind(&self) -> bool {
        str_at(&self.primary, &["apiVersion"]) == wasmop_contract::KIND_SNAPSHOT_API_VERSION
            && str_at(&self.primary, &["kind"]) == wasmop_contract::KIND_SNAPSHOT_KIND
    }

    /// The primaries of a kind-scoped controller's snapshot (the items of
    /// its primary list, sorted by namespace and name); the primary alone
    /// for a per-object snapshot. Answer each with
    /// [`Plan::object`](crate::Plan::object).
    pub fn primaries(&self) -> &[Value] {
        if self.is_kind() {
            self.primary
                .get("items")
                .and_then(Value::as_array)
                .map_or(&[], Vec::as_slice)
        } else {
            std::slice::from_ref(&self.primary)
        }
    }

    /// The owned objects whose controller ownerReference names `uid` (in a
    /// kind-scoped snapshot, what one primary owns by reference).
    pub fn owned_by<'a>(&'a self, uid: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
        self.owned.iter().filter(move |o| {
            o.pointer("/metadata/ownerReferences")
                .and_then(Value::as_array)
                .is_some_and(|refs| {
                    refs.iter().any(|r| {
                        r.get("controller").and_then(Value::as_bool) == Some(true)
                            && r.get("uid").and_then(Value::as_str) == Some(uid)
                    })
                })
        })
    }

    /// `metadata.generation` of the primary, if set.
    pub fn primary_generation(&self) -> Option<i64> {
        self.primary
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
    }

    /// The owned objects of kind `K`, deserialized (matched on `apiVersion`
    /// and `kind`).
    ///
    /// # Errors
    ///
    /// [`ReconcileError::Internal`] when one of them does not deserialize.
    pub fn owned_of_kind<K>(&self) -> Result<Vec<K>, ReconcileError>
    where
        K: k8s_openapi::Resource + DeserializeOwned,
    {
        self.owned
            .iter()
            .filter(|o| {
                str_at(o, &["apiVersion"]) == K::API_VERSION && str_at(o, &["kind"]) == K::KIND
            })
            .map(|o| {
                K::deserialize(o).map_err(|e| {
                    ReconcileError::internal(format!(
                        "owned {} {}: {e}",
                        K::KIND,
                        str_at(o, &["metadata", "name"])
                    ))
                })
            })
            .collect()
    }

    /// The owned object with this `kind` and `metadata.name`, if any. Kinds
    /// are matched by name only; plugins owning two kinds of the same name in
    /// different groups should filter [`Snapshot::owned`] themselves.
    pub fn owned_named(&self, kind: &str, name: &str) -> Option<&Value> {
        self.owned
            .iter()
            .find(|o| str_at(o, &["kind"]) == kind && str_at(o, &["metadata", "name"]) == name)
    }

    /// The objects the read `read` selected, in snapshot order.
    pub fn related<'a>(&'a self, read: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
        self.related
            .iter()
            .filter(move |r| r.read == read)
            .map(|r| &r.object)
    }

    /// The objects the read `read` selected, deserialized into `T`.
    ///
    /// # Errors
    ///
    /// [`ReconcileError::Internal`] when one of them does not deserialize.
    pub fn related_as<T: DeserializeOwned>(&self, read: &str) -> Result<Vec<T>, ReconcileError> {
        self.related(read)
            .map(|o| deserialize_related(read, o))
            .collect()
    }

    /// The one object the read `read` selected (e.g. through a
    /// [`crate::Selector::Field`]), deserialized into `T`; `None` when it
    /// selected nothing.
    ///
    /// # Errors
    ///
    /// [`ReconcileError::Internal`] when it does not deserialize or when the
    /// read selected more than one object.
    pub fn related_one<T: DeserializeOwned>(
        &self,
        read: &str,
    ) -> Result<Option<T>, ReconcileError> {
        let mut objects = self.related(read);
        let Some(first) = objects.next() else {
            return Ok(None);
        };
        let more = objects.count();
        if more > 0 {
            return Err(ReconcileError::internal(format!(
                "read `{read}` selected {} objects, expected at most one",
                more + 1
            )));
        }
        deserialize_related(read, first).map(Some)
    }

    /// True when the API server does not serve `kind`, an optional owned
    /// kind ([`crate::OwnedKind::optional`]) whose CRD is not installed:
    /// the snapshot names it under [`wasmop_contract::ABSENT_KIND_READ`].
    /// A plan must not apply or delete objects of an absent kind.
    pub fn kind_absent(&self, kind: &crate::KindRef) -> bool {
        let name = format!("{}.{}", kind.plural, kind.group);
        self.related(wasmop_contract::ABSENT_KIND_READ)
            .any(|o| str_at(o, &["metadata", "name"]) == name)
    }

    /// The latest result of the HTTP request with this id, if any.
    pub fn observation(&self, id: &str) -> Option<&Observation> {
        self.observations.iter().find(|o| o.id == id)
    }

    /// The settings deserialized into `T`.
    ///
    /// # Errors
    ///
    /// [`ReconcileError::Internal`] when they do not fit `T` (the host
    /// validated them at load, so this is a plugin bug).
    pub fn settings_as<T: DeserializeOwned>(&self) -> Result<T, ReconcileError> {
        T::deserialize(&self.settings)
            .map_err(|e| ReconcileError::internal(format!("settings: {e}")))
    }

    /// [`Snapshot::now`] parsed, as the `metav1.Time` that conditions take.
    ///
    /// # Errors
    ///
    /// [`ReconcileError::Internal`] when `now` is not RFC 3339.
    pub fn now(&self) -> Result<Time, ReconcileError> {
        self.now
            .parse::<k8s_openapi::jiff::Timestamp>()
            .map(Time)
            .map_err(|e| ReconcileError::internal(format!("snapshot time `{}`: {e}", self.now)))
    }
}

fn deserialize_related<T: DeserializeOwned>(
    read: &str,
    object: &Value,
) -> Result<T, ReconcileError> {
    T::deserialize(object).map_err(|e| {
        ReconcileError::internal(format!(
            "related `{read}` {}: {e}",
            str_at(object, &["metadata", "name"])
        ))
    })
}

/// The string at a path of object keys, or `""`.
pub(crate) fn str_at<'a>(value: &'a Value, path: &[&str]) -> &'a str {
    path.iter()
        .try_fold(value, |v, key| v.get(key))
        .and_then(Value::as_str)
        .unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    use serde_json::json;

    fn snapshot() -> Snapshot {
        serde_json::from_value(json!({
            "controller": "widget",
            "primary": {"apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
                        "metadata": {"name": "w", "namespace": "ns", "generation": 3},
                        "spec": {"value": 7}},
            "owned": [
                {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}, "data": {"k": "v"}},
                {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "a"}},
            ],
            "related": [
                {"read": "instance", "object": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "i1"}}},
                {"read": "peers", "object": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "p1"}}},
                {"read": "peers", "object": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "p2"}}},
            ],
            "now": "2025-03-04T05:06:07Z",
            "observations": [{"id": "health", "status": 200, "body": "{\"ok\":true}", "observedAt": "2025-03-04T05:06:00Z", "ageMs": 7000}],
        }))
        .unwrap()
    }

    #[test]
    fn snapshot_json_uses_the_documented_camel_case_keys() {
        let v = serde_json::to_value(snapshot()).unwrap();
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        let mut expected = [
            "controller",
            "primary",
            "owned",
            "related",
            "now",
            "deleting",
            "settings",
            "observations",
        ];
        expected.sort_unstable();
        let mut keys = keys;
        keys.sort_unstable();
        assert_eq!(keys, expected);
        assert_eq!(
            v["observations"][0],
            json!({"id": "health", "status": 200, "body": "{\"ok\":true}", "error": null,
                   "observedAt": "2025-03-04T05:06:00Z", "ageMs": 7000})
        );
        assert_eq!(v["related"][0]["read"], "instance");
    }

    #[test]
    fn missing_fields_take_their_documented_defaults() {
        let s: Snapshot = serde_json::from_value(
            json!({"controller": "c", "primary": {}, "now": "2025-01-01T00:00:00Z"}),
        )
        .unwrap();
        assert!(s.owned.is_empty() && s.related.is_empty() && s.observations.is_empty());
        assert!(!s.deleting);
        assert_eq!(s.settings, json!({}));
    }

    #[test]
    fn primary_accessors_read_metadata() {
        let s = snapshot();
        assert_eq!(s.primary_name(), "w");
        assert_eq!(s.primary_namespace(), Some("ns"));
        assert_eq!(s.primary_generation(), Some(3));
    }

    #[test]
    fn primary_as_reports_a_shape_mismatch_as_invalid_spec() {
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct Spec {
            value: String,
        }
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct Widget {
            spec: Spec,
        }
        let err = snapshot().primary_as::<Widget>().unwrap_err();
        assert!(matches!(err, ReconcileError::InvalidSpec(_)), "{err:?}");
        assert!(err.message().starts_with("Widget w: "), "{err}");
    }

    #[test]
    fn owned_of_kind_filters_by_api_version_and_kind() {
        let s = snapshot();
        let maps: Vec<ConfigMap> = s.owned_of_kind().unwrap();
        assert_eq!(maps.len(), 1);
        assert_eq!(maps[0].data.as_ref().unwrap()["k"], "v");
        assert_eq!(s.owned_of_kind::<Secret>().unwrap().len(), 1);
        assert_eq!(
            s.owned_named("Secret", "a").unwrap()["kind"],
            json!("Secret")
        );
        assert!(s.owned_named("Secret", "b").is_none());
    }

    #[test]
    fn related_one_refuses_a_read_that_selected_several() {
        let s = snapshot();
        let one: Option<ConfigMap> = s.related_one("instance").unwrap();
        assert_eq!(one.unwrap().metadata.name.as_deref(), Some("i1"));
        assert!(s.related_one::<ConfigMap>("nothing").unwrap().is_none());
        let err = s.related_one::<ConfigMap>("peers").unwrap_err();
        assert_eq!(
            err,
            ReconcileError::internal("read `peers` selected 2 objects, expected at most one")
        );
        assert_eq!(s.related_as::<ConfigMap>("peers").unwrap().len(), 2);
    }

    #[test]
    fn observation_is_found_by_id_and_parsed() {
        let s = snapshot();
        let o = s.observation("health").unwrap();
        assert!(o.is_success());
        let body: serde_json::Value = o.json().unwrap();
        assert_eq!(body, json!({"ok": true}));
        assert!(s.observation("other").is_none());
    }

    #[test]
    fn now_parses_rfc3339_and_round_trips_through_metav1_time() {
        let s = snapshot();
        let now = s.now().unwrap();
        assert_eq!(
            serde_json::to_value(&now).unwrap(),
            json!("2025-03-04T05:06:07Z")
        );
        let bad = Snapshot {
            now: "yesterday".into(),
            ..s
        };
        assert!(matches!(bad.now(), Err(ReconcileError::Internal(_))));
    }

    #[test]
    fn settings_as_deserializes_the_settings() {
        #[derive(Deserialize)]
        struct Settings {
            label: Option<String>,
        }
        let mut s = snapshot();
        s.settings = json!({"label": "x"});
        assert_eq!(
            s.settings_as::<Settings>().unwrap().label.as_deref(),
            Some("x")
        );
        s.settings = json!({"label": 1});
        assert!(s.settings_as::<Settings>().is_err());
    }
}
