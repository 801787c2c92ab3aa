//! Hot swap in a running operator against the real local control plane:
//! a new version takes over every primary without a restart, broken or
//! conflicting files are refused while the running version keeps serving,
//! and removing a file stops its controllers without deleting anything.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Result, bail};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;
use wasmop::LoadOptions;
use wasmop::delivery::hotswap::{OptionsFor, PluginDir};
use wasmop::metrics;
use wasmop_tests::operator::{RunningOperator, plugin_path, sandbox};
use wasmop_tests::{DEFAULT_DEADLINE, TestNamespace, apply_test_crds, wait_for};

fn widgets(ns: &TestNamespace) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("test.wasmop.dev", "v1", "Widget");
    Api::namespaced_with(
        ns.client.clone(),
        &ns.name,
        &ApiResource::from_gvk_with_plural(&gvk, "widgets"),
    )
}

async fn create_widget(api: &Api<DynamicObject>, name: &str) -> Result<()> {
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
        "metadata": {"name": name}, "spec": {"value": name},
    }))?;
    api.create(&PostParams::default(), &obj).await?;
    Ok(())
}

/// Replaces `dst` atomically with the bytes of `src` (write + rename, as a
/// ConfigMap volume update or `kubectl cp` + `mv` would).
fn install(src: &Path, dst: &Path) -> Result<()> {
    let tmp = dst.with_extension("tmp");
    std::fs::copy(src, &tmp)?;
    std::fs::rename(&tmp, dst)?;
    Ok(())
}

/// Names of ConfigMaps carrying version label `v`, and of all managed ones.
async fn labelled(ns: &TestNamespace, v: &str) -> Result<(usize, usize)> {
    let cms: Api<ConfigMap> = ns.api();
    let all = cms
        .list(&ListParams::default().labels("app.kubernetes.io/managed-by=wasmop"))
        .await?
        .items;
    let with = all
        .iter()
        .filter(|c| {
            c.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("test.wasmop.dev/version"))
                .map(String::as_str)
                == Some(v)
        })
        .count();
    Ok((with, all.len()))
}

struct Setup {
    ns: TestNamespace,
    dir: tempdir::Dir,
    op: RunningOperator,
    plugins: PluginDir,
}

mod tempdir {
    /// A temporary directory removed on drop.
    pub struct Dir(pub std::path::PathBuf);
    impl Dir {
        pub fn new(prefix: &str) -> Self {
            let p = std::env::temp_dir().join(format!(
                "{prefix}-{}-{}",
                std::process::id(),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_nanos()
            ));
            std::fs::create_dir_all(&p).expect("temp dir");
            Dir(p)
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

async fn setup(prefix: &str) -> Result<Setup> {
    setup_with(prefix, "good").await
}

/// [`setup`] with `first` (good or one of its ports, all `good` 0.1.0)
/// installed as `good.wasm`.
async fn setup_with(prefix: &str, first: &str) -> Result<Setup> {
    let ns = TestNamespace::new(prefix).await?;
    apply_test_crds(&ns.client).await?;
    let dir = tempdir::Dir::new(prefix);
    install(&plugin_path(first)?, &dir.0.join("good.wasm"))?;
    let op = RunningOperator::start(ns.client.clone(), vec![ns.name.clone()], vec![]).await?;
    let options: OptionsFor = Arc::new(|_stem: &str| LoadOptions::default());
    let mut plugins = PluginDir::new(dir.0.clone(), sandbox(), op.operator.clone(), options);
    let first = plugins.scan(false).await;
    assert_eq!(
        first.activated,
        vec![("good".to_string(), "0.1.0".to_string())],
        "{first:?}"
    );
    Ok(Setup {
        ns,
        dir,
        op,
        plugins,
    })
}

/// Scans until the change to the directory has been applied (a changed
/// file is read once it held still for one scan).
async fn settle(plugins: &mut PluginDir) -> wasmop::delivery::hotswap::ScanReport {
    let first = plugins.scan(true).await;
    let second = plugins.scan(true).await;
    wasmop::delivery::hotswap::ScanReport {
        activated: [first.activated, second.activated].concat(),
        rejected: [first.rejected, second.rejected].concat(),
        removed: [first.removed, second.removed].concat(),
    }
}

#[tokio::test]
async fn new_version_takes_over_every_primary_while_primaries_keep_arriving() -> Result<()> {
    takes_over_while_primaries_arrive("swap-stream", "good", "good-v2").await
}

/// Hot swap between languages: good in JavaScript, then the Rust good-v2.
#[tokio::test]
async fn rust_takes_over_from_javascript_while_primaries_keep_arriving() -> Result<()> {
    takes_over_while_primaries_arrive("swap-js", "good-js", "good-v2").await
}

/// Hot swap between languages: the Rust good, then good-v2 in Python.
#[tokio::test]
async fn python_takes_over_from_rust_while_primaries_keep_arriving() -> Result<()> {
    takes_over_while_primaries_arrive("swap-py", "good", "good-v2-py").await
}

/// `next` (good 0.2.0 in some language) replaces `first` (good 0.1.0)
/// while Widgets keep being created, and reconciles every one of them.
async fn takes_over_while_primaries_arrive(prefix: &str, first: &str, next: &str) -> Result<()> {
    let mut s = setup_with(prefix, first).await?;
    let api = widgets(&s.ns);
    const BEFORE: usize = 15;
    const DURING: usize = 15;
    for i in 0..BEFORE {
        create_widget(&api, &format!("a{i:02}")).await?;
    }
    // A steady stream of new primaries while the swap happens.
    let stream = {
        let api = api.clone();
        tokio::spawn(async move {
            for i in 0..DURING {
                create_widget(&api, &format!("b{i:02}")).await?;
            }
            anyhow::Ok(())
        })
    };
    let started = Instant::now();
    install(&plugin_path(next)?, &s.dir.0.join("good.wasm"))?;
    let report = settle(&mut s.plugins).await;
    assert_eq!(
        report.activated,
        vec![("good".to_string(), "0.2.0".to_string())],
        "{report:?}"
    );
    assert_eq!(s.op.operator.plugins()[0].1, "0.2.0");
    stream.await??;

    let total = BEFORE + DURING;
    wait_for(
        "every Widget's ConfigMap to carry the v2 label",
        DEFAULT_DEADLINE,
        || {
            let ns = &s.ns;
            async move {
                let (v2, all) = labelled(ns, "v2").await?;
                if v2 == total && all == total {
                    Ok(Some(()))
                } else {
                    bail!("{v2} of {all} ConfigMaps on v2, {total} expected")
                }
            }
        },
    )
    .await?;
    eprintln!(
        "swap measured: file replaced to all {total} primaries on v2 in {:?}",
        started.elapsed()
    );
    // Every primary says which version reconciled it, and none failed.
    for w in api.list(&ListParams::default()).await?.items {
        let name = w.metadata.name.clone().unwrap_or_default();
        wait_for(
            &format!("{name} reconciled by 0.2.0"),
            DEFAULT_DEADLINE,
            || {
                let api = api.clone();
                let name = name.clone();
                async move {
                    let w = api.get(&name).await?;
                    let conds = w.data["status"]["conditions"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default();
                    let failed = conds
                        .iter()
                        .any(|c| c["type"] == "Reconciled" && c["status"] != "True");
                    assert!(!failed, "{name} has a failed reconcile: {conds:?}");
                    // The Reconciled condition names the version (and digest).
                    let by = conds
                        .iter()
                        .find(|c| c["type"] == "Reconciled")
                        .and_then(|c| c["message"].as_str())
                        .unwrap_or_default();
                    Ok(by
                        .starts_with("reconciled by plugin good 0.2.0 sha256:")
                        .then_some(()))
                }
            },
        )
        .await?;
    }
    Ok(())
}

#[tokio::test]
async fn broken_files_and_conflicting_plugins_are_refused_and_the_old_version_keeps_serving()
-> Result<()> {
    let mut s = setup("swap-refuse").await?;
    let api = widgets(&s.ns);
    create_widget(&api, "w").await?;
    wait_for("w-cm on v1", DEFAULT_DEADLINE, || {
        let ns = &s.ns;
        async move { Ok((labelled(ns, "v1").await? == (1, 1)).then_some(())) }
    })
    .await?;
    let failures = |reason: &str| {
        metrics::global()
            .get(
                "wasmop_plugin_load_failures_total",
                &[("file", "good.wasm"), ("reason", reason)],
            )
            .unwrap_or(0.0)
    };

    // A truncated file.
    let before = failures("LoadFailed");
    let bytes = std::fs::read(plugin_path("good-v2")?)?;
    let tmp = s.dir.0.join("good.tmp");
    std::fs::write(&tmp, &bytes[..bytes.len() / 3])?;
    std::fs::rename(&tmp, s.dir.0.join("good.wasm"))?;
    let report = settle(&mut s.plugins).await;
    assert!(report.activated.is_empty(), "{report:?}");
    assert_eq!(report.rejected.len(), 1, "{report:?}");
    assert_eq!(failures("LoadFailed"), before + 1.0);
    assert_eq!(s.op.operator.plugins()[0].1, "0.1.0");

    // A component whose manifest is invalid.
    install(&plugin_path("bad-manifest")?, &s.dir.0.join("good.wasm"))?;
    let report = settle(&mut s.plugins).await;
    assert!(report.activated.is_empty(), "{report:?}");
    let why = &report.rejected[0].1;
    assert!(
        why.contains("manifest"),
        "rejection names the manifest: {why}"
    );
    assert_eq!(s.op.operator.plugins()[0].1, "0.1.0");

    // A second plugin claiming the kind `good` reconciles.
    install(&plugin_path("claimer")?, &s.dir.0.join("claimer.wasm"))?;
    let report = settle(&mut s.plugins).await;
    assert!(report.activated.is_empty(), "{report:?}");
    assert!(
        report.rejected[0].1.contains("already reconciled"),
        "{report:?}"
    );

    // The old version still serves: a spec change is reconciled by v1.
    api.patch(
        "w",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"value": "changed"}})),
    )
    .await?;
    let cms: Api<ConfigMap> = s.ns.api();
    wait_for("v1 to reconcile the change", DEFAULT_DEADLINE, || {
        let cms = cms.clone();
        async move {
            let cm = cms.get("w-cm").await?;
            Ok(
                (cm.data.unwrap_or_default().get("value").map(String::as_str) == Some("changed"))
                    .then_some(()),
            )
        }
    })
    .await?;
    assert_eq!(labelled(&s.ns, "v1").await?, (1, 1));
    Ok(())
}

#[tokio::test]
async fn removing_the_file_stops_the_plugin_and_deletes_nothing() -> Result<()> {
    let mut s = setup("swap-remove").await?;
    let api = widgets(&s.ns);
    create_widget(&api, "keep").await?;
    wait_for("keep-cm", DEFAULT_DEADLINE, || {
        let ns = &s.ns;
        async move { Ok((labelled(ns, "v1").await? == (1, 1)).then_some(())) }
    })
    .await?;
    std::fs::remove_file(s.dir.0.join("good.wasm"))?;
    let report = s.plugins.scan(true).await;
    assert_eq!(report.removed, vec!["good".to_string()]);
    assert!(s.op.operator.plugins().is_empty());
    assert!(s.op.operator.controller_ids().is_empty());
    // Nothing was deleted: the primary and what it owned are still there.
    assert!(api.get_opt("keep").await?.is_some());
    assert_eq!(labelled(&s.ns, "v1").await?, (1, 1));

    // Putting the file back brings the plugin up again, without a restart.
    let started = Instant::now();
    install(&plugin_path("good")?, &s.dir.0.join("good.wasm"))?;
    let report = settle(&mut s.plugins).await;
    assert_eq!(report.activated.len(), 1, "{report:?}");
    eprintln!(
        "re-activation from a cached artifact took {:?}",
        started.elapsed()
    );
    Ok(())
}

#[tokio::test]
async fn an_unlistable_directory_unloads_nothing() -> Result<()> {
    let mut s = setup("swap-unlistable").await?;
    let moved = s.dir.0.with_extension("moved");
    std::fs::rename(&s.dir.0, &moved)?;
    let report = s.plugins.scan(true).await;
    std::fs::rename(&moved, &s.dir.0)?;
    assert!(report.removed.is_empty(), "{report:?}");
    assert_eq!(s.op.operator.plugins().len(), 1, "the running plugin stays");
    Ok(())
}
