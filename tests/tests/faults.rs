//! Fault recovery against the real local control plane: the API server is
//! killed and started again with the same flags, or its watch cache is made
//! to expire every watch (410); the operator, running the real `good`
//! plugin, must be back to work within 5 s of `/readyz`.
//!
//! These tests disturb the API server, so they live in a test binary of
//! their own (cargo runs test binaries one after another; `tests/run.sh`
//! gives this one and the chaos soak's a control plane of their own, beside
//! the other tests) and take a lock so that its tests run one at a time.
//! The last one checks how `tests/cluster/component.sh` starts
//! kube-controller-manager, which every other fault test relies on.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;
use wasmop_tests::faults::{Fault, component, metric, wait_metric, wait_readyz};
use wasmop_tests::operator::{RunningOperator, load_plugin};
use wasmop_tests::{DEFAULT_DEADLINE, TestNamespace, apply_test_crds, wait_for};

/// One test at a time: each one takes the API server or etcd away.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The host's key of the Widget kind, as the watch metrics label it.
const WIDGET: &str = "test.wasmop.dev/v1/Widget";
/// Primaries edited across the fault.
const PRIMARIES: usize = 5;
/// What the issue asks: converged within this long of `/readyz`.
const RECOVERY_BOUND: Duration = Duration::from_secs(5);
/// After the forced 410 the API server itself takes a few seconds to rebuild
/// its watch cache and close the watches (about 2.5 s here) before the
/// operator can know; its own part, the relist, is asserted separately.
const EXPIRY_BOUND: Duration = Duration::from_secs(10);

fn widgets(ns: &TestNamespace) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("test.wasmop.dev", "v1", "Widget");
    let ar = ApiResource::from_gvk_with_plural(&gvk, "widgets");
    Api::namespaced_with(ns.client.clone(), &ns.name, &ar)
}

/// Starts an operator with the `good` plugin and `PRIMARIES` Widgets whose
/// ConfigMaps hold `value`.
async fn converged_operator(ns: &TestNamespace, value: &str) -> Result<RunningOperator> {
    apply_test_crds(&ns.client).await?;
    let op = RunningOperator::start(
        ns.client.clone(),
        vec![ns.name.clone()],
        vec![load_plugin("good", json!({}))?],
    )
    .await?;
    let api = widgets(ns);
    for i in 0..PRIMARIES {
        let w: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
            "metadata": {"name": format!("w{i}")}, "spec": {"value": value},
        }))?;
        api.create(&PostParams::default(), &w).await?;
    }
    wait_converged(ns, value, DEFAULT_DEADLINE).await?;
    wait_metric(
        "the Widget watch to be synced",
        DEFAULT_DEADLINE,
        "wasmop_watch_streams",
        &[("kind", WIDGET), ("state", "synced")],
        |v| v >= 1.0,
    )
    .await?;
    Ok(op)
}

/// Waits until every Widget's ConfigMap holds `value`.
async fn wait_converged(ns: &TestNamespace, value: &str, deadline: Duration) -> Result<()> {
    let cms: Api<ConfigMap> = ns.api();
    wait_for(
        &format!("every Widget's ConfigMap to hold {value:?}"),
        deadline,
        || {
            let cms = cms.clone();
            async move {
                let mut behind = Vec::new();
                for i in 0..PRIMARIES {
                    let name = format!("w{i}-cm");
                    let got = cms
                        .get_opt(&name)
                        .await?
                        .and_then(|cm| cm.data.unwrap_or_default().remove("value"));
                    if got.as_deref() != Some(value) {
                        behind.push(format!("{name}={got:?}"));
                    }
                }
                if behind.is_empty() {
                    Ok(Some(()))
                } else {
                    bail!("behind: {}", behind.join(", "))
                }
            }
        },
    )
    .await
}

/// Sets every Widget's `spec.value`, retrying a write that meets a server
/// still settling.
async fn edit_all(ns: &TestNamespace, value: &str) -> Result<()> {
    let api = widgets(ns);
    for i in 0..PRIMARIES {
        let name = format!("w{i}");
        wait_for(&format!("the edit of {name}"), RECOVERY_BOUND, || {
            let api = api.clone();
            let name = name.clone();
            async move {
                api.patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"value": value}})),
                )
                .await?;
                Ok(Some(()))
            }
        })
        .await?;
    }
    Ok(())
}

fn count(name: &str, reason: &str) -> f64 {
    metric(name, &[("kind", WIDGET), ("reason", reason)])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_converges_within_5s_of_readyz_after_the_api_server_restarts() -> Result<()> {
    let _serial = SERIAL.lock().await;
    let ns = TestNamespace::new("faults-restart").await?;
    let op = converged_operator(&ns, "before").await?;
    let unavailable_before = count("wasmop_watch_errors_total", "unavailable");

    // SIGKILL kube-apiserver and keep it down for 15 s.
    let outage = Fault::kill("kube-apiserver").await?;
    let down_at = Instant::now();
    let hold = Duration::from_secs(15);
    wait_metric(
        "the Widget watch to back off while the API server is down",
        hold,
        "wasmop_watch_streams",
        &[("kind", WIDGET), ("state", "backing_off")],
        |v| v >= 1.0,
    )
    .await?;
    // The outage itself lasts 15 s: this wait is the fault, not a
    // synchronisation.
    tokio::time::sleep_until((down_at + hold).into()).await;
    let retries = count("wasmop_watch_errors_total", "unavailable") - unavailable_before;
    // Backoff capped at 2 s: at least one attempt per 2.5 s of outage.
    assert!(
        retries >= 6.0,
        "the Widget watch retried {retries} times in {hold:?}: the backoff is not capped at a few seconds"
    );
    let relists_before =
        count("wasmop_watch_lists_total", "expired") + count("wasmop_watch_lists_total", "error");

    // Start it again with the same flags; time /readyz ourselves.
    let starting = tokio::spawn(outage.start());
    let ready_at = wait_readyz(&ns.client, Duration::from_secs(120)).await?;
    eprintln!(
        "kube-apiserver was down {:?}; /readyz answered {:?} after the kill",
        hold,
        ready_at - down_at
    );
    starting.await??;

    edit_all(&ns, "after").await?;
    wait_converged(&ns, "after", Duration::from_secs(60)).await?;
    let took = ready_at.elapsed();
    eprintln!(
        "recovery: {PRIMARIES} edited Widgets converged {took:?} after /readyz; the Widget watch failed for {:.1}s",
        metric("wasmop_watch_recovery_seconds", &[("kind", WIDGET)])
    );
    assert!(
        took <= RECOVERY_BOUND,
        "converged {took:?} after /readyz, more than {RECOVERY_BOUND:?}"
    );
    // The Widget watch failed through the outage and came back. It may
    // have started over with a list (410 Expired: its resourceVersion
    // predates the new API server's cache; or an attempt the starting
    // server held was abandoned), or resumed from its resourceVersion when
    // the new server still serves it (when the newest write before the
    // kill was a Widget's): both lose nothing, and which one happens
    // depends on that timing. The relist after 410 Expired is asserted on
    // its own by the compaction test below.
    let relists = count("wasmop_watch_lists_total", "expired")
        + count("wasmop_watch_lists_total", "error")
        - relists_before;
    let failed_for = metric("wasmop_watch_recovery_seconds", &[("kind", WIDGET)]);
    eprintln!("the Widget watch relisted {relists} times after the restart");
    assert!(
        failed_for >= hold.as_secs_f64() - 1.0,
        "the Widget watch's last failure lasted {failed_for:.1}s, not the {hold:?} outage: it did not recover from this one"
    );
    assert!(
        metric(
            "wasmop_watch_streams",
            &[("kind", WIDGET), ("state", "synced")]
        ) >= 1.0
    );
    op.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_watch_relists_at_once_and_converges() -> Result<()> {
    let _serial = SERIAL.lock().await;
    let ns = TestNamespace::new("faults-expired").await?;
    let op = converged_operator(&ns, "before").await?;
    let expired_before = count("wasmop_watch_errors_total", "expired");
    let relists_before = count("wasmop_watch_lists_total", "expired");

    // Make the API server's watch cache start over past every resourceVersion
    // its clients hold: freeze it, restart etcd and compact etcd's history
    // beyond what the API server has seen. When it resumes, its own etcd
    // watches find their revisions compacted, it rebuilds the cache and
    // closes every watch; a watch resumed from an older resourceVersion then
    // gets 410 Expired.
    let frozen = Fault::freeze("kube-apiserver").await?;
    Fault::kill("etcd").await?.start().await?;
    component(&["compact-etcd", "--bump", "3"]).await?;
    frozen.thaw().await?;
    let ready_at = wait_readyz(&ns.client, Duration::from_secs(60)).await?;

    edit_all(&ns, "after").await?;
    wait_converged(&ns, "after", Duration::from_secs(60)).await?;
    let took = ready_at.elapsed();
    eprintln!("after a forced 410: {PRIMARIES} edited Widgets converged {took:?} after /readyz");
    assert!(
        count("wasmop_watch_errors_total", "expired") > expired_before,
        "the Widget watch never got 410 Expired"
    );
    assert!(
        count("wasmop_watch_lists_total", "expired") > relists_before,
        "the Widget watch did not relist after 410"
    );
    // At once: from the 410 to the relist completed.
    let relist = metric("wasmop_watch_recovery_seconds", &[("kind", WIDGET)]);
    eprintln!("the Widget watch relisted {relist:.3}s after its 410");
    assert!(
        relist < 1.0,
        "the Widget watch took {relist}s from 410 to a completed relist"
    );
    assert!(
        took <= EXPIRY_BOUND,
        "converged {took:?} after /readyz, more than {EXPIRY_BOUND:?}"
    );
    op.stop().await;
    Ok(())
}

/// kube-controller-manager started while the API server is down exits at
/// once (it cannot load its client CA) or after waiting 10 s for the API
/// server's `/healthz`. `component.sh start` must not take that process
/// for a started one: it starts it again until it runs its controllers,
/// as a kubelet restarts a static Pod. Before, a start that met an API
/// server restart left the cluster without controllers (no ReplicaSets,
/// no Jobs' Pods, no garbage collection) until the next start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_manager_started_while_the_api_server_is_down_runs_once_it_is_back()
-> Result<()> {
    let _serial = SERIAL.lock().await;
    let ns = TestNamespace::new("faults-kcm").await?;
    let log = wasmop_tests::kubeconfig_path()
        .parent()
        .context("the cluster directory")?
        .join("logs/kube-controller-manager.log");
    let stopped = Fault::kill("kube-controller-manager").await?;
    let api = Fault::kill("kube-apiserver").await?;
    let before = std::fs::metadata(&log)?.len();
    let starting = tokio::spawn(stopped.start());
    // It fails at least once while the API server is away.
    wait_for(
        "kube-controller-manager to fail to start without the API server",
        DEFAULT_DEADLINE,
        || {
            let log = log.clone();
            async move {
                let text = std::fs::read(&log)?;
                let since = String::from_utf8_lossy(&text[(before as usize).min(text.len())..])
                    .into_owned();
                Ok(since.contains("command failed").then_some(()))
            }
        },
    )
    .await?;
    api.start().await?;
    tokio::time::timeout(Duration::from_secs(120), starting)
        .await
        .context("component.sh start of kube-controller-manager did not return in 120 s")???;
    // And its controllers work: a Deployment gets its ReplicaSet.
    let deployments: Api<Deployment> = ns.api();
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "probe"},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": "probe"}},
            "template": {
                "metadata": {"labels": {"app": "probe"}},
                "spec": {"containers": [{"name": "c", "image": "example.invalid/probe"}]}
            }
        }
    }))?;
    deployments
        .create(&PostParams::default(), &deployment)
        .await?;
    let sets: Api<ReplicaSet> = ns.api();
    wait_for(
        "the Deployment controller to make the probe's ReplicaSet",
        DEFAULT_DEADLINE,
        || {
            let sets = sets.clone();
            async move {
                Ok((!sets.list(&Default::default()).await?.items.is_empty()).then_some(()))
            }
        },
    )
    .await?;
    // Still running, not gone after its start: `ensure` finds nothing to do.
    let found = component(&["ensure", "kube-controller-manager"]).await?;
    assert!(
        found.is_empty(),
        "kube-controller-manager was not running after its start returned:\n{found}"
    );
    Ok(())
}
