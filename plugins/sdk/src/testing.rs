//! Run a plugin natively on fixture objects, in unit tests (feature
//! `testing`; add `wasmop-sdk = { workspace = true, features = ["testing"] }`
//! to the plugin's `[dev-dependencies]`).
//!
//! ```
//! use wasmop_sdk::testing::{run, SnapshotBuilder};
//! # use wasmop_sdk::*;
//! # struct MyPlugin;
//! # impl Plugin for MyPlugin {
//! #     fn manifest() -> Manifest { Manifest::new("p", "0.1.0") }
//! #     fn validate_settings(_: &serde_json::Value) -> Result<(), Vec<SettingsProblem>> { Ok(()) }
//! #     fn reconcile(s: &Snapshot) -> Result<Plan, ReconcileError> {
//! #         Ok(Plan::new().event("Seen", s.primary_name()))
//! #     }
//! # }
//!
//! let snapshot = SnapshotBuilder::from_yaml("widget", r#"
//! apiVersion: test.wasmop.dev/v1
//! kind: Widget
//! metadata: {name: w, namespace: ns}
//! spec: {value: hello}
//! ---
//! apiVersion: v1
//! kind: ConfigMap
//! metadata: {name: w-cm, namespace: ns, uid: u1, resourceVersion: "5"}
//! "#)
//! .now("2025-06-01T12:00:00Z")
//! .build();
//! let plan = run::<MyPlugin>(&snapshot).unwrap();
//! assert_eq!(plan.events[0].message, "w");
//! ```

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::raw as wit;
use crate::{Observation, Plan, Plugin, ReconcileError, RelatedObject, Snapshot};

/// The `now` of a [`SnapshotBuilder`] unless set: a fixed instant, so plans
/// are deterministic.
pub const DEFAULT_NOW: &str = "2025-01-01T00:00:00Z";

/// Builds a [`Snapshot`] piece by piece.
///
/// Defaults: primary `{}`, nothing owned or related, `now` =
/// [`DEFAULT_NOW`], not deleting, settings `{}`, no observations.
#[derive(Clone, Debug)]
pub struct SnapshotBuilder {
    snapshot: Snapshot,
}

impl SnapshotBuilder {
    /// An empty snapshot for the controller named `controller`.
    pub fn new(controller: &str) -> Self {
        SnapshotBuilder {
            snapshot: Snapshot {
                controller: controller.to_owned(),
                primary: Value::Object(Default::default()),
                owned: Vec::new(),
                related: Vec::new(),
                now: DEFAULT_NOW.to_owned(),
                deleting: false,
                settings: Value::Object(Default::default()),
                observations: Vec::new(),
            },
        }
    }

    /// A builder from multi-document YAML: the first document is the
    /// primary, every further one an owned object. Empty documents are
    /// skipped.
    ///
    /// # Panics
    ///
    /// When the YAML does not parse or holds no document (a broken fixture).
    pub fn from_yaml(controller: &str, yaml: &str) -> Self {
        let mut objects = objects_from_yaml(yaml).into_iter();
        let Some(primary) = objects.next() else {
            panic!("fixture YAML holds no document; the first one is the primary");
        };
        let mut builder = SnapshotBuilder::new(controller).primary(primary);
        for object in objects {
            builder = builder.owned(object);
        }
        builder
    }

    /// Sets the primary object.
    pub fn primary(mut self, object: impl Serialize) -> Self {
        self.snapshot.primary = json(object);
        self
    }

    /// Makes this the snapshot of a kind-scoped controller (see
    /// [`crate::Scope::Kind`]): the primary is a `v1` `List` of `objects`,
    /// in the order given (the host sorts them by namespace and name).
    pub fn primaries<T: Serialize>(mut self, objects: impl IntoIterator<Item = T>) -> Self {
        let items: Vec<Value> = objects.into_iter().map(json).collect();
        self.snapshot.primary = serde_json::json!({
            "apiVersion": wasmop_contract::KIND_SNAPSHOT_API_VERSION,
            "kind": wasmop_contract::KIND_SNAPSHOT_KIND,
            "items": items,
        });
        self
    }

    /// Adds an owned object.
    pub fn owned(mut self, object: impl Serialize) -> Self {
        self.snapshot.owned.push(json(object));
        self
    }

    /// Adds an object selected by the read `read`.
    pub fn related(mut self, read: &str, object: impl Serialize) -> Self {
        self.snapshot.related.push(RelatedObject {
            read: read.to_owned(),
            object: json(object),
        });
        self
    }

    /// Names `kind`, an optional read's or owned kind's, as not served (see
    /// [`crate::Snapshot::kind_absent`]), as the host does.
    pub fn absent_kind(self, kind: &crate::KindRef) -> Self {
        self.related(
            crate::contract::ABSENT_KIND_READ,
            serde_json::json!({
                "apiVersion": "wasmop.dev/v1",
                "kind": "AbsentKind",
                "metadata": {"name": format!("{}.{}", kind.plural, kind.group)},
                "spec": {"group": kind.group, "version": kind.version,
                         "kind": kind.kind, "plural": kind.plural},
            }),
        )
    }

    /// Sets the current time (RFC 3339).
    pub fn now(mut self, rfc3339: &str) -> Self {
        self.snapshot.now = rfc3339.to_owned();
        self
    }

    /// Marks the primary as being deleted (or not).
    pub fn deleting(mut self, deleting: bool) -> Self {
        self.snapshot.deleting = deleting;
        self
    }

    /// Sets the plugin's settings.
    pub fn settings(mut self, settings: impl Serialize) -> Self {
        self.snapshot.settings = json(settings);
        self
    }

    /// Adds the result of an earlier HTTP request.
    pub fn observation(mut self, observation: Observation) -> Self {
        self.snapshot.observations.push(observation);
        self
    }

    /// The snapshot, with owned objects sorted by kind, namespace and name
    /// as the host sorts them.
    pub fn build(mut self) -> Snapshot {
        self.snapshot
            .owned
            .sort_by(|a, b| sort_key(a).cmp(&sort_key(b)));
        self.snapshot
    }
}

fn sort_key(object: &Value) -> (&str, &str, &str) {
    let s = |path: &[&str]| crate::snapshot::str_at(object, path);
    (
        s(&["kind"]),
        s(&["metadata", "namespace"]),
        s(&["metadata", "name"]),
    )
}

fn json(value: impl Serialize) -> Value {
    match serde_json::to_value(value) {
        Ok(v) => v,
        Err(e) => panic!("fixture object does not serialize to JSON: {e}"),
    }
}

/// Every non-empty document of a multi-document YAML text, as JSON values.
///
/// # Panics
///
/// When the YAML does not parse.
pub fn objects_from_yaml(yaml: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(yaml)
        .enumerate()
        .map(|(i, doc)| match Value::deserialize(doc) {
            Ok(v) => v,
            Err(e) => panic!("fixture YAML document {i} does not parse: {e}"),
        })
        .filter(|v| !v.is_null())
        .collect()
}

/// The snapshot of [`SnapshotBuilder::from_yaml`] with all other defaults.
///
/// # Panics
///
/// As [`SnapshotBuilder::from_yaml`].
pub fn snapshot_from_yaml(yaml: &str, controller: &str) -> Snapshot {
    SnapshotBuilder::from_yaml(controller, yaml).build()
}

/// Runs `P`'s reconcile on `snapshot` the way the host would, natively.
///
/// The snapshot goes through the same conversions as in the component (to
/// the WIT types, JSON text, and back), and the plan through the same JSON
/// text the host parses, so what this returns is what the host would
/// receive.
///
/// # Errors
///
/// The plugin's [`ReconcileError`], or an internal error if the plan does not
/// survive the trip through its JSON text.
///
/// # Panics
///
/// When `P::validate_settings` rejects the snapshot's settings: the host
/// would not have loaded the plugin with them.
pub fn run<P: Plugin>(snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
    if let Err(problems) = P::validate_settings(&snapshot.settings) {
        panic!("the plugin rejects the snapshot's settings: {problems:?}");
    }
    let crossed = Snapshot::try_from(wit::Snapshot::from(snapshot.clone()))?;
    let plan = P::reconcile(&crossed)?;
    let text = crate::glue::json_text(&plan);
    // The SDK writes the plan's text itself (faster in a plugin); every
    // plan a test runs checks that it is serde_json's text, byte for byte.
    assert_eq!(
        serde_json::to_string(&plan).ok().as_ref(),
        Some(&text),
        "the SDK's JSON text of the plan differs from serde_json's"
    );
    serde_json::from_str(&text).map_err(|e| {
        ReconcileError::internal(format!("the plan does not survive its JSON text: {e}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Manifest, SettingsProblem};
    use serde_json::json;

    struct Echo;

    impl Plugin for Echo {
        fn manifest() -> Manifest {
            Manifest::new("echo", "0.1.0")
        }

        fn validate_settings(settings: &Value) -> Result<(), Vec<SettingsProblem>> {
            crate::settings::only_keys(settings, &["ok"])
        }

        fn reconcile(snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
            if snapshot.deleting {
                return Err(ReconcileError::not_ready("deleting"));
            }
            let names: Vec<&str> = snapshot
                .owned
                .iter()
                .map(|o| crate::snapshot::str_at(o, &["metadata", "name"]))
                .collect();
            Ok(Plan::new().status(json!({"owned": names, "now": snapshot.now})))
        }
    }

    const FIXTURE: &str = "
kind: Widget
metadata: {name: w, namespace: ns}
---
kind: ConfigMap
metadata: {name: b, namespace: ns}
---
---
kind: ConfigMap
metadata: {name: a, namespace: ns}
";

    #[test]
    fn yaml_fixture_gives_primary_then_owned_sorted_like_the_host() {
        let s = snapshot_from_yaml(FIXTURE, "widget");
        assert_eq!(s.controller, "widget");
        assert_eq!(s.primary_name(), "w");
        assert_eq!(s.now, DEFAULT_NOW);
        let plan = run::<Echo>(&s).unwrap();
        assert_eq!(
            plan.status,
            Some(json!({"owned": ["a", "b"], "now": DEFAULT_NOW}))
        );
    }

    #[test]
    fn builder_sets_every_part() {
        let s = SnapshotBuilder::from_yaml("c", FIXTURE)
            .related("r", json!({"kind": "X"}))
            .now("2030-01-01T00:00:00Z")
            .deleting(true)
            .settings(json!({"ok": 1}))
            .build();
        assert_eq!(s.related("r").count(), 1);
        assert_eq!(s.now, "2030-01-01T00:00:00Z");
        assert_eq!(s.settings, json!({"ok": 1}));
        assert_eq!(run::<Echo>(&s), Err(ReconcileError::not_ready("deleting")));
    }

    #[test]
    #[should_panic(expected = "rejects the snapshot's settings")]
    fn run_refuses_settings_the_plugin_rejects() {
        let s = SnapshotBuilder::new("c")
            .settings(json!({"nope": 1}))
            .build();
        let _ = run::<Echo>(&s);
    }

    #[test]
    #[should_panic(expected = "holds no document")]
    fn empty_fixture_is_a_broken_fixture() {
        let _ = snapshot_from_yaml("---\n", "c");
    }
}
