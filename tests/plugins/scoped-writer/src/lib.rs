//! Test plugin `scoped-writer`: a controller that may write into any
//! namespace (`write-namespaces: ["*"]`) but narrows that per owned kind,
//! as the `team` plugin's server does: label-owned Secrets anywhere,
//! label-owned Deployments only in the primary's namespace.
//!
//! For each `BadWriter` (`test.wasmop.dev/v1`, reused: only one plugin of a
//! test claims it), with `spec.target` naming another namespace:
//! - applies Secret `<name>-mirror` in `spec.target` (allowed);
//! - applies Deployment `<name>` in `spec.target` when
//!   `spec.deploymentIn` is `"target"` (a hostile plan: the host must
//!   refuse it whole, the Secret with it), else in the primary's namespace;
//! - with `spec.deleteVictim: {"name", "uid", "resourceVersion"}` also
//!   deletes that Deployment in `spec.target` (a foreign object named by a
//!   hostile plan: refused whole).
//!
//! Deleting (finalizer `test.wasmop.dev/scoped-writer`): deletes every
//! object of its snapshot's `owned` and says cleanup is complete.

use wasmop_sdk::k8s_openapi::api::apps::v1::Deployment;
use wasmop_sdk::k8s_openapi::api::core::v1::Secret;
use wasmop_sdk::serde_json::{Value, json};
use wasmop_sdk::{
    Controller, DeleteOp, KindRef, Manifest, ObjectRef, OwnedKind, Plan, Plugin, ReconcileError,
    SettingsProblem, Snapshot,
};

/// Finalizer held on every primary.
pub const FINALIZER: &str = "test.wasmop.dev/scoped-writer";

/// The `scoped-writer` plugin.
#[derive(Debug)]
pub struct ScopedWriter;

fn spec_str<'a>(snapshot: &'a Snapshot, field: &str) -> Option<&'a str> {
    snapshot
        .primary
        .pointer(&format!("/spec/{field}"))
        .and_then(Value::as_str)
}

fn deployment(name: &str, namespace: &str) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": "example.invalid/none:1"}]},
            },
        },
    })
}

impl Plugin for ScopedWriter {
    fn manifest() -> Manifest {
        Manifest::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")).controller(
            Controller::new(
                "scopedwriter",
                KindRef::namespaced("test.wasmop.dev", "v1", "BadWriter", "badwriters"),
            )
            .owns_kind(OwnedKind::label(KindRef::of::<Secret>()).write_namespace("*"))
            .owns_kind(OwnedKind::label(KindRef::of::<Deployment>()).own_namespace_only())
            .finalizer(FINALIZER)
            .write_namespace("*"),
        )
    }

    fn validate_settings(settings: &Value) -> Result<(), Vec<SettingsProblem>> {
        wasmop_sdk::settings::only_keys(settings, &[])
    }

    fn reconcile(snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
        if snapshot.deleting {
            let mut plan = Plan::new().cleanup_complete();
            for o in &snapshot.owned {
                plan = plan.delete(DeleteOp::of(o)?);
            }
            return Ok(plan);
        }
        let name = snapshot.primary_name();
        let home = snapshot.primary_namespace().unwrap_or_default();
        let target = spec_str(snapshot, "target")
            .ok_or_else(|| ReconcileError::invalid_spec("spec.target is required"))?;
        let deployment_ns = match spec_str(snapshot, "deploymentIn") {
            Some("target") => target,
            _ => home,
        };
        let mut plan = Plan::new()
            .apply(json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": format!("{name}-mirror"), "namespace": target},
                "stringData": {"value": "mirrored"},
            }))
            .apply(deployment(name, deployment_ns))
            .status(json!({"written": true}));
        if let Some(victim) = snapshot.primary.pointer("/spec/deleteVictim") {
            let field = |f: &str| victim[f].as_str().unwrap_or_default().to_owned();
            plan = plan.delete(DeleteOp {
                target: ObjectRef {
                    api_version: "apps/v1".into(),
                    kind: "Deployment".into(),
                    namespace: target.to_owned(),
                    name: field("name"),
                },
                uid: field("uid"),
                resource_version: field("resourceVersion"),
            });
        }
        Ok(plan)
    }
}

wasmop_sdk::export_plugin!(ScopedWriter);

#[cfg(test)]
mod tests {
    use super::*;
    use wasmop_sdk::testing::{SnapshotBuilder, run};

    fn primary(spec: Value) -> Value {
        json!({"apiVersion": "test.wasmop.dev/v1", "kind": "BadWriter",
               "metadata": {"name": "sw", "namespace": "home", "uid": "u"}, "spec": spec})
    }

    #[test]
    fn a_hostile_spec_plans_the_deployment_into_the_target() {
        let snapshot = SnapshotBuilder::new("scopedwriter")
            .primary(primary(json!({"target": "far", "deploymentIn": "target"})))
            .build();
        let plan = run::<ScopedWriter>(&snapshot).unwrap();
        assert_eq!(plan.apply[0].object["metadata"]["namespace"], "far");
        assert_eq!(plan.apply[1].object["metadata"]["namespace"], "far");
        let snapshot = SnapshotBuilder::new("scopedwriter")
            .primary(primary(json!({"target": "far"})))
            .build();
        let plan = run::<ScopedWriter>(&snapshot).unwrap();
        assert_eq!(plan.apply[1].object["metadata"]["namespace"], "home");
    }

    #[test]
    fn the_manifest_narrows_deployments_to_the_primarys_namespace() {
        let m = ScopedWriter::manifest();
        let c = &m.controllers[0];
        assert_eq!(c.kind_write_namespaces(&c.owns[0]), ["*"]);
        assert!(c.kind_write_namespaces(&c.owns[1]).is_empty());
    }
}
