//! Test plugin `good`: a well-behaved reconciler used by the host's tests.
//!
//! For each `Widget` (`test.wasmop.dev/v1`, namespaced) it applies ConfigMap
//! `<name>-cm` holding `data.value = spec.value` (default `""`) and labelled
//! `test.wasmop.dev/version: v1`, and sets status
//! `{"conditions": [Ready=True], "value": spec.value}`.
//!
//! Settings: `{"label": "<string>"}` overrides the label value, so tests can
//! see settings take effect. Any other key, or a non-string label, is
//! rejected at load.
//!
//! `good-v2` reuses [`manifest`], [`validate_settings`] and
//! [`reconcile_with`] with label `v2`.

use serde::Deserialize;
use serde_json::{Value, json};
use wasmop_sdk::conditions::{conditions_of, set_condition};
use wasmop_sdk::k8s_openapi::api::core::v1::ConfigMap;
use wasmop_sdk::{
    Controller, KindRef, Manifest, Plan, Plugin, ReconcileError, SettingsProblem, Snapshot,
    settings,
};

/// API group of the test kinds.
pub const GROUP: &str = "test.wasmop.dev";
/// Label put on every ConfigMap, with the plugin's version label as value.
pub const VERSION_LABEL: &str = "test.wasmop.dev/version";
/// Name of the one controller.
pub const CONTROLLER: &str = "widget";

/// The manifest of a Widget reconciler with this plugin name and version.
pub fn manifest(name: &str, version: &str) -> Manifest {
    Manifest::new(name, version).controller(
        Controller::new(
            CONTROLLER,
            KindRef::namespaced(GROUP, "v1", "Widget", "widgets"),
        )
        .owns(KindRef::of::<ConfigMap>()),
    )
}

/// Accepts `{}` and `{"label": "<string>"}`; reports every other key and a
/// non-string label.
///
/// # Errors
///
/// Every problem found.
pub fn validate_settings(settings: &Value) -> Result<(), Vec<SettingsProblem>> {
    let mut problems = Vec::new();
    problems.extend(
        settings::only_keys(settings, &["label"])
            .err()
            .unwrap_or_default(),
    );
    problems.extend(
        settings::optional_string(settings, "label")
            .err()
            .unwrap_or_default(),
    );
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

#[derive(Deserialize)]
struct Widget {
    #[serde(default)]
    spec: WidgetSpec,
}

#[derive(Default, Deserialize)]
struct WidgetSpec {
    #[serde(default)]
    value: String,
}

#[derive(Default, Deserialize)]
struct Settings {
    label: Option<String>,
}

/// The plan for one Widget, labelling the ConfigMap `version_label` unless
/// the settings give a `label`.
///
/// # Errors
///
/// [`ReconcileError::InvalidSpec`] when `spec.value` is not a string.
pub fn reconcile_with(snapshot: &Snapshot, version_label: &str) -> Result<Plan, ReconcileError> {
    if snapshot.deleting {
        // Nothing outside Kubernetes to clean up; ownerReferences do the rest.
        return Ok(Plan::new().cleanup_complete());
    }
    let widget: Widget = snapshot.primary_as()?;
    let settings: Settings = snapshot.settings_as()?;
    let label = settings.label.as_deref().unwrap_or(version_label);
    let name = format!("{}-cm", snapshot.primary_name());
    let value = widget.spec.value;

    let config_map = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": snapshot.primary_namespace(),
            "labels": {VERSION_LABEL: label},
        },
        "data": {"value": value},
    });

    let mut conditions = conditions_of(&snapshot.primary);
    set_condition(
        &mut conditions,
        "Ready",
        true,
        "Reconciled",
        &format!("ConfigMap {name} holds the value"),
        snapshot.primary_generation(),
        &snapshot.now()?,
    );

    Ok(Plan::new()
        .apply(config_map)
        .status(json!({"conditions": conditions, "value": value})))
}

/// The `good` plugin.
#[derive(Debug)]
pub struct Good;

impl Plugin for Good {
    fn manifest() -> Manifest {
        manifest(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION"))
    }

    fn validate_settings(settings: &Value) -> Result<(), Vec<SettingsProblem>> {
        validate_settings(settings)
    }

    fn reconcile(snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
        reconcile_with(snapshot, "v1")
    }
}

#[cfg(feature = "export")]
wasmop_sdk::export_plugin!(Good);

#[cfg(test)]
mod tests {
    use super::*;
    use wasmop_sdk::testing::{SnapshotBuilder, run};

    const WIDGET: &str = "
apiVersion: test.wasmop.dev/v1
kind: Widget
metadata: {name: w, namespace: ns, generation: 2}
spec: {value: hello}
";

    #[test]
    fn manifest_names_the_crate_and_claims_widgets() {
        let m = Good::manifest();
        assert_eq!((m.name.as_str(), m.version.as_str()), ("good", "0.1.0"));
        let c = &m.controllers[0];
        assert_eq!(
            c.primary,
            KindRef::namespaced(GROUP, "v1", "Widget", "widgets")
        );
        assert_eq!(
            c.owns,
            [wasmop_sdk::OwnedKind::reference(KindRef::namespaced(
                "",
                "v1",
                "ConfigMap",
                "configmaps"
            ))]
        );
    }

    #[test]
    fn applies_the_config_map_and_reports_ready() {
        let snapshot = SnapshotBuilder::from_yaml(CONTROLLER, WIDGET)
            .now("2025-05-05T05:05:05Z")
            .build();
        let plan = run::<Good>(&snapshot).unwrap();
        assert_eq!(
            plan.apply[0].object,
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "w-cm", "namespace": "ns",
                                "labels": {"test.wasmop.dev/version": "v1"}},
                   "data": {"value": "hello"}})
        );
        assert_eq!(plan.apply[0].precondition, None);
        assert_eq!(
            plan.status,
            Some(json!({"conditions": [{
                "type": "Ready", "status": "True", "reason": "Reconciled",
                "message": "ConfigMap w-cm holds the value", "observedGeneration": 2,
                "lastTransitionTime": "2025-05-05T05:05:05Z"}],
                "value": "hello"}))
        );
        assert!(plan.delete.is_empty());
    }

    #[test]
    fn missing_value_defaults_to_empty_and_non_string_is_invalid() {
        let snapshot = SnapshotBuilder::new(CONTROLLER)
            .primary(json!({"kind": "Widget", "metadata": {"name": "w", "namespace": "ns"}}))
            .build();
        let plan = run::<Good>(&snapshot).unwrap();
        assert_eq!(plan.apply[0].object["data"]["value"], "");

        let snapshot = SnapshotBuilder::new(CONTROLLER)
            .primary(json!({"kind": "Widget", "metadata": {"name": "w"}, "spec": {"value": 3}}))
            .build();
        assert!(matches!(
            run::<Good>(&snapshot),
            Err(ReconcileError::InvalidSpec(_))
        ));
    }

    #[test]
    fn ready_keeps_its_transition_time_across_reconciles() {
        let primary = json!({
            "kind": "Widget", "metadata": {"name": "w", "namespace": "ns", "generation": 3},
            "spec": {"value": "new"},
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Reconciled",
                        "message": "old", "observedGeneration": 1,
                        "lastTransitionTime": "2020-01-01T00:00:00Z"}]}});
        let snapshot = SnapshotBuilder::new(CONTROLLER)
            .primary(primary)
            .now("2025-01-01T00:00:00Z")
            .build();
        let plan = run::<Good>(&snapshot).unwrap();
        let ready = &plan.status.unwrap()["conditions"][0];
        assert_eq!(ready["lastTransitionTime"], "2020-01-01T00:00:00Z");
        assert_eq!(ready["observedGeneration"], 3);
    }

    #[test]
    fn label_setting_overrides_the_version_label() {
        let snapshot = SnapshotBuilder::from_yaml(CONTROLLER, WIDGET)
            .settings(json!({"label": "custom"}))
            .build();
        let plan = run::<Good>(&snapshot).unwrap();
        assert_eq!(
            plan.apply[0].object["metadata"]["labels"][VERSION_LABEL],
            "custom"
        );
        let plan = reconcile_with(
            &SnapshotBuilder::from_yaml(CONTROLLER, WIDGET).build(),
            "v2",
        )
        .unwrap();
        assert_eq!(
            plan.apply[0].object["metadata"]["labels"][VERSION_LABEL],
            "v2"
        );
    }

    #[test]
    fn settings_with_unknown_keys_or_a_non_string_label_are_rejected() {
        assert_eq!(Good::validate_settings(&json!({})), Ok(()));
        assert_eq!(Good::validate_settings(&json!({"label": "x"})), Ok(()));
        let problems = Good::validate_settings(&json!({"label": 7, "colour": "red"})).unwrap_err();
        let paths: Vec<&str> = problems.iter().map(|p| p.path.as_str()).collect();
        assert_eq!(paths, ["colour", "label"]);
        assert_eq!(problems[1].message, "`label` must be a string, got number");
    }

    #[test]
    fn deleting_widget_completes_cleanup_and_writes_nothing() {
        let snapshot = SnapshotBuilder::from_yaml(CONTROLLER, WIDGET)
            .deleting(true)
            .build();
        let plan = run::<Good>(&snapshot).unwrap();
        assert!(plan.cleanup_complete);
        assert!(plan.apply.is_empty() && plan.status.is_none());
    }
}
