//! Test plugin `flawed`: a small Webapp reconciler for `wasmop check` that
//! holds every property unless its `breaks` setting names one, which it
//! then breaks on purpose (tests/tests/check.rs shows `check` reports each).
//!
//! A `Webapp` (`test.wasmop.dev/v1`, namespaced; CRD in
//! `tests/fixtures/check/webapp-crd.yaml`) gets a StatefulSet `<name>`
//! (`spec.replicas`, default 1; image `spec.image`, default `nginx`) and a
//! ConfigMap `<name>-config` (`data.mode = spec.mode`); `Ready=True` once
//! the StatefulSet has rolled the current template out and every replica is
//! ready. A finalizer holds the Webapp until cleanup is done.
//!
//! `breaks`, one of:
//! - `convergence`: counts its passes in `status.passes` (never quiet);
//! - `determinism`: writes `now` into `status.lastPass` (a plan that
//!   depends on when it is asked, not on what is);
//! - `no-oscillation`: flips `data.flip` of the ConfigMap between `a` and
//!   `b` on every pass;
//! - `crash`: deletes a ConfigMap it finds without its own `status.step`
//!   (taking it for a leftover), which a crash between its two writes leaves;
//! - `stale`: deletes the StatefulSet when the ConfigMap is not in the
//!   snapshot;
//! - `ready-honesty`: says Ready as soon as the StatefulSet exists;
//! - `spec-mutation`: panics on `spec.mode: Safe`;
//! - `deletion`: never releases its finalizer.

use serde::Deserialize;
use serde_json::{Value, json};
use wasmop_sdk::conditions::{conditions_of, set_condition};
use wasmop_sdk::k8s_openapi::api::apps::v1::StatefulSet;
use wasmop_sdk::k8s_openapi::api::core::v1::ConfigMap;
use wasmop_sdk::{
    Controller, KindRef, Manifest, Plan, Plugin, ReconcileError, SettingsProblem, Snapshot,
    settings,
};

/// The finalizer.
pub const FINALIZER: &str = "test.wasmop.dev/webapp";

/// The properties it can break.
pub const BREAKS: [&str; 8] = [
    "convergence",
    "determinism",
    "no-oscillation",
    "crash",
    "stale",
    "ready-honesty",
    "spec-mutation",
    "deletion",
];

#[derive(Default, Deserialize)]
struct Settings {
    breaks: Option<String>,
}

#[derive(Default, Deserialize)]
struct Spec {
    replicas: Option<i64>,
    image: Option<String>,
    mode: Option<String>,
}

#[derive(Deserialize)]
struct Webapp {
    #[serde(default)]
    spec: Spec,
}

/// The plugin.
#[derive(Debug)]
pub struct Flawed;

fn rolled_out(sts: &Value) -> bool {
    let want = sts["spec"]["replicas"].as_i64().unwrap_or(1);
    let s = &sts["status"];
    s["observedGeneration"] == sts["metadata"]["generation"]
        && s["readyReplicas"].as_i64().unwrap_or(0) >= want
        && s["updatedReplicas"].as_i64().unwrap_or(0) >= want
}

impl Plugin for Flawed {
    fn manifest() -> Manifest {
        Manifest::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")).controller(
            Controller::new(
                "webapp",
                KindRef::namespaced("test.wasmop.dev", "v1", "Webapp", "webapps"),
            )
            .owns(KindRef::of::<StatefulSet>())
            .owns(KindRef::of::<ConfigMap>())
            .finalizer(FINALIZER),
        )
    }

    fn validate_settings(s: &Value) -> Result<(), Vec<SettingsProblem>> {
        settings::only_keys(s, &["breaks"])?;
        settings::optional_string(s, "breaks")
    }

    fn reconcile(snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
        let breaks: Settings = snapshot.settings_as()?;
        let breaks = breaks.breaks.unwrap_or_default();
        let is = |p: &str| breaks == p;
        if snapshot.deleting {
            return Ok(if is("deletion") {
                Plan::new()
            } else {
                Plan::new().cleanup_complete()
            });
        }
        let app: Webapp = snapshot.primary_as()?;
        let name = snapshot.primary_name().to_owned();
        let ns = snapshot.primary_namespace().map(str::to_owned);
        let replicas = app.spec.replicas.unwrap_or(1);
        if replicas < 0 {
            return Err(ReconcileError::invalid_spec(format!(
                "spec.replicas is {replicas}; it must be 0 or more"
            )));
        }
        let mode = app.spec.mode.clone().unwrap_or_else(|| "Fast".into());
        if is("spec-mutation") && mode == "Safe" {
            panic!("mode Safe is not implemented");
        }
        let cm_name = format!("{name}-config");
        let cm = snapshot.owned_named("ConfigMap", &cm_name);
        let sts = snapshot.owned_named("StatefulSet", &name);
        let step = snapshot.primary["status"]["step"].as_i64();

        let mut plan = Plan::new();
        let mut data = json!({"mode": mode});
        if is("no-oscillation") {
            let flip = cm.map(|c| c["data"]["flip"].clone());
            data["flip"] = json!(if flip == Some(json!("a")) { "b" } else { "a" });
        }
        let config = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": cm_name, "namespace": ns}, "data": data});
        if is("crash") && step.is_none() && cm.is_some() {
            // "A ConfigMap without our step: a leftover; start again."
            plan = plan.delete_owned(cm.cloned().unwrap_or_default())?;
        } else {
            plan = plan.apply(config);
        }
        let statefulset = json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"replicas": replicas, "serviceName": name,
                "selector": {"matchLabels": {"app": name}},
                "template": {"metadata": {"labels": {"app": name}},
                    "spec": {"containers": [{"name": "app",
                        "image": app.spec.image.clone().unwrap_or_else(|| "nginx".into())}]}}}});
        if is("stale") && cm.is_none() && sts.is_some() {
            // "No configuration: tear the workload down."
            plan = plan.delete_owned(sts.cloned().unwrap_or_default())?;
        } else {
            plan = plan.apply(statefulset.clone());
        }
        // Ready: the StatefulSet as applied now is rolled out. An apply
        // that changes its template is not rolled out yet.
        let template_same = sts.is_some_and(|s| {
            s["spec"]["template"] == statefulset["spec"]["template"]
                && s["spec"]["replicas"] == statefulset["spec"]["replicas"]
        });
        let ready = if is("ready-honesty") {
            sts.is_some()
        } else {
            sts.is_some_and(rolled_out) && template_same
        };
        let mut conditions = conditions_of(&snapshot.primary);
        set_condition(
            &mut conditions,
            "Ready",
            ready,
            if ready { "RolledOut" } else { "RollingOut" },
            &format!("StatefulSet {name}"),
            snapshot.primary_generation(),
            &snapshot.now()?,
        );
        let mut status = json!({"conditions": conditions, "step": 1});
        if is("crash") && step.is_some() {
            status["step"] = json!(2);
        }
        if is("convergence") {
            status["passes"] =
                json!(snapshot.primary["status"]["passes"].as_i64().unwrap_or(0) + 1);
        }
        if is("determinism") {
            status["lastPass"] = json!(snapshot.now);
        }
        Ok(plan.status(status))
    }
}

wasmop_sdk::export_plugin!(Flawed);

#[cfg(test)]
mod tests {
    use super::*;
    use wasmop_sdk::testing::{SnapshotBuilder, run};

    #[test]
    fn a_fresh_webapp_gets_its_objects_and_is_not_ready_yet() {
        let snapshot = SnapshotBuilder::from_yaml(
            "webapp",
            "
apiVersion: test.wasmop.dev/v1
kind: Webapp
metadata: {name: w, namespace: ns, generation: 1}
spec: {replicas: 2}
",
        )
        .build();
        let plan = run::<Flawed>(&snapshot).unwrap();
        assert_eq!(plan.apply.len(), 2);
        let status = plan.status.unwrap();
        assert_eq!(status["conditions"][0]["status"], "False");
    }
}
