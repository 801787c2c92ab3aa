//! Write economy against the real API server: a fresh primary converges
//! with at most one write per desired object plus one status write, and a
//! reconcile of converged primaries makes no write at all; an owned object
//! someone else changed is still restored.
//!
//! The operator's writes are counted as it sends them, through an
//! [`Interposer`] on its client: the API server's own counter is
//! cluster-wide, and the controller-manager keeps writing ConfigMaps of
//! other namespaces (kube-root-ca.crt, garbage collection of earlier
//! tests' objects). The scale benchmark counts with the API server.

use anyhow::Result;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;
use wasmop_tests::faults::metric;
use wasmop_tests::interpose::{Interposer, Recorded};
use wasmop_tests::operator::{RunningOperator, load_plugin};
use wasmop_tests::widgets::widgets;
use wasmop_tests::{DEFAULT_DEADLINE, TestNamespace, apply_test_crds, wait_for};

const WIDGETS: usize = 20;

const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// The writes to Widgets and ConfigMaps the operator sent through `seen`
/// (Events and the like left out).
fn object_writes(seen: &Interposer) -> Vec<Recorded> {
    seen.writes()
        .into_iter()
        .filter(|w| w.path.contains("/widgets") || w.path.contains("/configmaps"))
        .collect()
}

async fn all_ready(api: &Api<DynamicObject>) -> Result<Option<()>> {
    let list = api.list(&Default::default()).await?.items;
    let ready = list
        .iter()
        .filter(|w| {
            w.data["status"]["conditions"].as_array().is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
                    && cs
                        .iter()
                        .any(|c| c["type"] == "Reconciled" && c["status"] == "True")
            })
        })
        .count();
    Ok((list.len() == WIDGETS && ready == WIDGETS).then_some(()))
}

#[tokio::test]
async fn converging_costs_one_write_per_object_and_a_converged_primary_none() -> Result<()> {
    let ns = TestNamespace::new("economy").await?;
    apply_test_crds(&ns.client).await?;
    let api = widgets(&ns);

    // A fresh primary: the test's creates, then the operator's writes,
    // each recorded as the operator sent it.
    let (seen, client) = Interposer::new(ns.client.clone());
    let op = RunningOperator::start(
        client,
        vec![ns.name.clone()],
        vec![load_plugin("good", json!({}))?],
    )
    .await?;
    let n = WIDGETS;
    // w0 as `kubectl apply` leaves it: the operator's caches and the
    // plugin's snapshot leave the record out, the server keeps it.
    let last_applied = r#"{"apiVersion":"test.wasmop.dev/v1","kind":"Widget","metadata":{"name":"w0"},"spec":{"value":"v0"}}"#;
    for i in 0..WIDGETS {
        let mut obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
            "metadata": {"name": format!("w{i}")}, "spec": {"value": format!("v{i}")},
        }))?;
        if i == 0 {
            obj.metadata.annotations = Some(
                [(LAST_APPLIED.to_owned(), last_applied.to_owned())]
                    .into_iter()
                    .collect(),
            );
        }
        api.create(&PostParams::default(), &obj).await?;
    }
    wait_for("every Widget Ready", DEFAULT_DEADLINE, || all_ready(&api)).await?;
    let w0 = api.get("w0").await?;
    assert_eq!(
        w0.metadata
            .annotations
            .unwrap_or_default()
            .get(LAST_APPLIED)
            .map(String::as_str),
        Some(last_applied),
        "the Widget keeps kubectl's record through its reconciles"
    );
    // Each ConfigMap's create comes back as a watch event: its echo. It
    // re-queues its Widget behind other changes, and that reconcile writes
    // nothing (checked below with the other writes). Every one is
    // recognised, also when its event is routed before the worker has read
    // the create's answer (then it is held until the answer settles it).
    let echoes = || {
        metric(
            "wasmop_reconcile_echoes_total",
            &[("controller", "good/widget")],
        )
    };
    wait_for(
        "one echo per ConfigMap create, and the operator idle",
        DEFAULT_DEADLINE,
        || async {
            Ok((echoes() >= n as f64 && op.operator.pending_reconciles() == 0).then_some(()))
        },
    )
    .await?;
    assert_eq!(
        echoes(),
        n as f64,
        "{} echoes for {n} ConfigMap creates",
        echoes()
    );
    let converged = object_writes(&seen);
    // The count sees the operator: it created every ConfigMap.
    let applies = converged
        .iter()
        .filter(|w| w.path.contains("/configmaps/") && w.status < 300)
        .count();
    assert_eq!(applies, n, "{converged:?}");
    assert!(
        converged.len() <= 2 * n,
        "{} operator writes for {WIDGETS} fresh Widgets (at most one ConfigMap and one status \
         write each): {converged:?}",
        converged.len()
    );
    op.stop().await;

    // A new operator reconciles every primary again; all of them hold.
    let reconciled_before = metric(
        "wasmop_reconcile_total",
        &[("controller", "good/widget"), ("result", "Reconciled")],
    );
    let (seen, client) = Interposer::new(ns.client.clone());
    let op = RunningOperator::start(
        client,
        vec![ns.name.clone()],
        vec![load_plugin("good", json!({}))?],
    )
    .await?;
    wait_for(
        "the new operator to reconcile every Widget",
        DEFAULT_DEADLINE,
        || async {
            let m = metric(
                "wasmop_reconcile_total",
                &[("controller", "good/widget"), ("result", "Reconciled")],
            );
            Ok((m - reconciled_before >= n as f64).then_some(()))
        },
    )
    .await?;
    let steady = object_writes(&seen);
    assert!(
        steady.is_empty(),
        "reconciling {WIDGETS} converged Widgets wrote: {steady:?}"
    );

    // Skipping is never missing: a field someone else removed, and a body
    // without our digest, are applied again. (A field someone else *changed*
    // is theirs under server-side apply: the plugin's unforced apply
    // conflicts, as it did before any apply was skipped.)
    let cms: Api<ConfigMap> = Api::namespaced(ns.client.clone(), &ns.name);
    let pp = PatchParams::default();
    cms.patch(
        "w0-cm",
        &pp,
        &Patch::Merge(json!({"data": {"value": null}})),
    )
    .await?;
    cms.patch(
        "w1-cm",
        &pp,
        &Patch::Merge(json!({"metadata": {"annotations": {"wasmop.dev/applied": null}}})),
    )
    .await?;
    wait_for(
        "the operator to restore the drifted ConfigMaps",
        DEFAULT_DEADLINE,
        || async {
            let w0 = cms.get("w0-cm").await?;
            let w1 = cms.get("w1-cm").await?;
            let value = w0.data.unwrap_or_default().get("value").cloned();
            let stamped = w1
                .metadata
                .annotations
                .unwrap_or_default()
                .get("wasmop.dev/applied")
                .is_some_and(|d| d.starts_with("sha256:"));
            Ok((value.as_deref() == Some("v0") && stamped).then_some(()))
        },
    )
    .await?;
    op.stop().await;
    Ok(())
}
