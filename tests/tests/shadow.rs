//! Shadow runs against the real local control plane: `good.shadow.wasm`
//! beside `good.wasm` is called on every live snapshot, its different plans
//! are counted and shown at `/shadow`, and it writes nothing — asserted on
//! every request the operator's client sent (an interposed client). A
//! rename promotes it through the usual hot swap.

use std::sync::Arc;

use anyhow::{Result, bail, ensure};
use http::Method;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use wasmop::LoadOptions;
use wasmop::delivery::hotswap::{OptionsFor, PluginDir};
use wasmop::metrics;
use wasmop_tests::interpose::Interposer;
use wasmop_tests::operator::{RunningOperator, plugin_path, sandbox, test_config};
use wasmop_tests::widgets::{create_widget, install, settle, widgets};
use wasmop_tests::{DEFAULT_DEADLINE, TestNamespace, apply_test_crds, wait_for};

fn shadow_count(result: &str) -> f64 {
    metrics::global()
        .get(
            "wasmop_shadow_plans_total",
            &[("controller", "good/widget"), ("result", result)],
        )
        .unwrap_or(0.0)
}

#[tokio::test]
async fn a_shadow_is_compared_on_live_snapshots_writes_nothing_and_is_promoted_by_rename()
-> Result<()> {
    let ns = TestNamespace::new("shadow").await?;
    apply_test_crds(&ns.client).await?;
    let dir = std::env::temp_dir().join(format!("wasmop-shadow-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    install(&plugin_path("good")?, &dir.join("good.wasm"))?;
    let (interposer, client) = Interposer::new(ns.client.clone());
    let op =
        RunningOperator::start_with(client, vec![ns.name.clone()], vec![], test_config()).await?;
    let options: OptionsFor = Arc::new(|_stem: &str| LoadOptions::default());
    let mut plugins = PluginDir::new(dir.clone(), sandbox(), op.operator.clone(), options);
    assert_eq!(
        plugins.scan(false).await.activated,
        vec![("good".to_string(), "0.1.0".to_string())]
    );
    for w in ["w1", "w2"] {
        create_widget(&ns, w).await?;
    }
    let cms: Api<ConfigMap> = ns.api();
    wait_for("both ConfigMaps", DEFAULT_DEADLINE, || {
        let cms = cms.clone();
        async move {
            if cms.get_opt("w1-cm").await?.is_some() && cms.get_opt("w2-cm").await?.is_some() {
                Ok(Some(()))
            } else {
                bail!("not yet")
            }
        }
    })
    .await?;

    // A shadow that would delete every ConfigMap.
    install(&plugin_path("good-pruner")?, &dir.join("good.shadow.wasm"))?;
    let report = settle(&mut plugins).await;
    assert_eq!(
        report.activated,
        vec![("good.shadow".to_string(), "0.3.0".to_string())],
        "{report:?}"
    );
    assert_eq!(
        op.operator.plugins()[0].1,
        "0.1.0",
        "the active plugin is unchanged"
    );
    let writes_before = interposer.writes().len();
    let different_before = shadow_count("different");

    // Live snapshots: a new Widget and a changed one.
    create_widget(&ns, "w3").await?;
    widgets(&ns)
        .patch(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"value": "changed"}})),
        )
        .await?;
    wait_for("the shadow to differ on both", DEFAULT_DEADLINE, || {
        let n = shadow_count("different") - different_before;
        async move {
            if n >= 2.0 {
                Ok(Some(()))
            } else {
                bail!("{n} different shadow plans")
            }
        }
    })
    .await?;
    wait_for(
        "w3's ConfigMap and w1's new value",
        DEFAULT_DEADLINE,
        || {
            let cms = cms.clone();
            async move {
                let w1 = cms.get_opt("w1-cm").await?;
                let w1_value = w1
                    .and_then(|c| c.data)
                    .and_then(|d| d.get("value").cloned());
                if cms.get_opt("w3-cm").await?.is_some() && w1_value.as_deref() == Some("changed") {
                    Ok(Some(()))
                } else {
                    bail!("not yet")
                }
            }
        },
    )
    .await?;
    // The shadow wrote nothing: the operator sent no DELETE at all, and
    // every ConfigMap is still there.
    let deletes: Vec<_> = interposer.writes()[writes_before..]
        .iter()
        .filter(|w| w.method == Method::DELETE)
        .cloned()
        .collect();
    ensure!(deletes.is_empty(), "the operator deleted: {deletes:?}");
    for name in ["w1-cm", "w2-cm", "w3-cm"] {
        ensure!(cms.get_opt(name).await?.is_some(), "{name} is gone");
    }
    // The differences are shown, per object.
    let shown = wasmop::shadow::report();
    ensure!(
        shown.contains(&format!("{}/w3", ns.name)) && shown.contains("\"op\": \"delete\""),
        "{shown}"
    );

    // Promotion is a rename: the shadow stops, the candidate is active.
    std::fs::rename(dir.join("good.shadow.wasm"), dir.join("good.wasm"))?;
    let report = settle(&mut plugins).await;
    ensure!(
        report.removed.contains(&"good.shadow".to_string())
            && report
                .activated
                .contains(&("good".to_string(), "0.3.0".to_string())),
        "{report:?}"
    );
    ensure!(op.operator.shadow("good").is_none());
    // Now it acts: the ConfigMaps are deleted by the promoted version.
    wait_for(
        "the promoted pruner to delete the ConfigMaps",
        DEFAULT_DEADLINE,
        || {
            let cms = cms.clone();
            async move {
                let left = [
                    cms.get_opt("w1-cm").await?.is_some(),
                    cms.get_opt("w2-cm").await?.is_some(),
                    cms.get_opt("w3-cm").await?.is_some(),
                ];
                if left.iter().any(|x| *x) {
                    bail!("left: {left:?}")
                } else {
                    Ok(Some(()))
                }
            }
        },
    )
    .await?;
    // A shadow of a plugin that is not running is refused, not started.
    install(&plugin_path("labeller")?, &dir.join("nosuch.shadow.wasm"))?;
    let report = settle(&mut plugins).await;
    ensure!(report.rejected.len() == 1, "{report:?}");
    drop(op);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// good's port to JavaScript as the shadow of the Rust good.
#[tokio::test]
async fn good_in_javascript_as_the_shadow_of_good_plans_exactly_what_good_plans() -> Result<()> {
    a_port_shadows_good_equal("shadow-js", "good-js").await
}

/// good's port to Python as the shadow of the Rust good.
#[tokio::test]
async fn good_in_python_as_the_shadow_of_good_plans_exactly_what_good_plans() -> Result<()> {
    a_port_shadows_good_equal("shadow-py", "good-py").await
}

/// `port` (good 0.1.0 in another language) as `good.shadow.wasm` beside
/// the Rust good: on live snapshots (Widgets created, one changed, one
/// deleted) every comparison is equal, none of this namespace's primaries
/// is among the differences `/shadow` shows, and the ConfigMaps are the
/// active plugin's.
async fn a_port_shadows_good_equal(prefix: &str, port: &str) -> Result<()> {
    let ns = TestNamespace::new(prefix).await?;
    apply_test_crds(&ns.client).await?;
    let dir = std::env::temp_dir().join(format!("wasmop-{prefix}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    install(&plugin_path("good")?, &dir.join("good.wasm"))?;
    let op = RunningOperator::start_with(
        ns.client.clone(),
        vec![ns.name.clone()],
        vec![],
        test_config(),
    )
    .await?;
    let options: OptionsFor = Arc::new(|_stem: &str| LoadOptions::default());
    let mut plugins = PluginDir::new(dir.clone(), sandbox(), op.operator.clone(), options);
    ensure!(plugins.scan(false).await.activated == vec![("good".to_string(), "0.1.0".to_string())]);
    install(&plugin_path(port)?, &dir.join("good.shadow.wasm"))?;
    let report = settle(&mut plugins).await;
    ensure!(
        report.activated == vec![("good.shadow".to_string(), "0.1.0".to_string())],
        "{report:?}"
    );
    ensure!(op.operator.shadow("good").is_some(), "{port} is no shadow");
    let equal_before = shadow_count("equal");

    let names = ["w1", "w2", "w3"];
    for w in names {
        create_widget(&ns, w).await?;
    }
    widgets(&ns)
        .patch(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"value": "changed"}})),
        )
        .await?;
    let cms: Api<ConfigMap> = ns.api();
    wait_for("every ConfigMap, w1's changed", DEFAULT_DEADLINE, || {
        let cms = cms.clone();
        async move {
            let mut values = Vec::new();
            for w in names {
                values.push(
                    cms.get_opt(&format!("{w}-cm"))
                        .await?
                        .and_then(|c| c.data)
                        .and_then(|d| d.get("value").cloned()),
                );
            }
            if values
                == [
                    Some("changed".to_string()),
                    Some("w2".to_string()),
                    Some("w3".to_string()),
                ]
            {
                Ok(Some(()))
            } else {
                bail!("values {values:?}")
            }
        }
    })
    .await?;
    // Each Widget's creation and w1's change were compared (at least).
    wait_for("the shadow's comparisons", DEFAULT_DEADLINE, || {
        let n = shadow_count("equal") - equal_before;
        async move {
            if n >= 4.0 {
                Ok(Some(()))
            } else {
                bail!("{n} equal shadow plans")
            }
        }
    })
    .await?;
    let shown = wasmop::shadow::report();
    ensure!(
        !shown.contains(&format!("\"{}/", ns.name)),
        "{port} planned differently: {shown}"
    );
    drop(op);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
