//! The echo of the operator's own write, when the API server's watch event
//! of it overtakes the write's answer — forced against the real API
//! server: the [`Interposer`] on the operator's client holds the answer to
//! the ConfigMap's apply back until the router has seen the ConfigMap's
//! watch event. The change must be held, then recognised as the write's
//! echo when the answer comes: one echo, no foreground reconcile.
//!
//! Alone in its test binary: it asserts exact counts of process-wide
//! metrics.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use http::Method;
use kube::api::{DynamicObject, PostParams};
use serde_json::json;
use wasmop_tests::faults::metric;
use wasmop_tests::interpose::Interposer;
use wasmop_tests::operator::{RunningOperator, load_plugin};
use wasmop_tests::widgets::widgets;
use wasmop_tests::{DEFAULT_DEADLINE, TestNamespace, apply_test_crds, wait_for};

const CONTROLLER: &str = "good/widget";

fn held() -> f64 {
    metric("wasmop_echoes_held_total", &[("controller", CONTROLLER)])
}

fn echoes() -> f64 {
    metric(
        "wasmop_reconcile_echoes_total",
        &[("controller", CONTROLLER)],
    )
}

#[tokio::test]
async fn a_watch_event_that_overtakes_its_writes_answer_is_still_its_echo() -> Result<()> {
    let ns = TestNamespace::new("overtake").await?;
    apply_test_crds(&ns.client).await?;
    let (held_before, echoes_before) = (held(), echoes());
    let (seen, client) = Interposer::new(ns.client.clone());
    // The operator's write of w1's ConfigMap (a server-side apply, or a
    // create): its answer waits until the router held the ConfigMap's
    // watch event, which the API server sent meanwhile.
    let configmaps = format!("/namespaces/{}/configmaps", ns.name);
    let one = format!("{configmaps}/w1-cm");
    let overtaken = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&overtaken);
    seen.after(
        move |m: &Method, path: &str| {
            let path = path.split('?').next().unwrap_or_default();
            (*m == Method::PATCH && path.ends_with(&one))
                || (*m == Method::POST && path.ends_with(&configmaps))
        },
        move || async move {
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline {
                if held() > held_before {
                    flag.store(true, Ordering::SeqCst);
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        },
    );
    let op = RunningOperator::start(
        client,
        vec![ns.name.clone()],
        vec![load_plugin("good", json!({}))?],
    )
    .await?;
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
        "metadata": {"name": "w1"}, "spec": {"value": "v1"},
    }))?;
    widgets(&ns).create(&PostParams::default(), &obj).await?;

    wait_for(
        "the ConfigMap written, its echo settled, the operator idle",
        DEFAULT_DEADLINE,
        || async {
            Ok((!seen.pending()
                && echoes() > echoes_before
                && op.operator.pending_reconciles() == 0)
                .then_some(()))
        },
    )
    .await?;
    ensure!(
        overtaken.load(Ordering::SeqCst),
        "the ConfigMap's watch event was never held while its write was in flight"
    );
    ensure!(
        held() == held_before + 1.0,
        "{} changes held for one ConfigMap create",
        held() - held_before
    );
    ensure!(
        echoes() == echoes_before + 1.0,
        "{} echoes for one ConfigMap create (the held change must settle as its echo)",
        echoes() - echoes_before
    );
    let written = seen
        .writes()
        .into_iter()
        .filter(|w| w.path.contains("/configmaps") && w.status < 300)
        .count();
    ensure!(written == 1, "{written} ConfigMap writes for one Widget");
    op.stop().await;
    Ok(())
}
