//! Plugins from an OCI registry, against a real registry (distribution,
//! built from its Go module) and the real local control plane: `wasmop
//! push` publishes, a tag is pulled and polled, a new digest hot-swaps, a
//! broken artifact is refused while the running version keeps serving, a
//! registry outage loses nothing, and after a restart the cache serves the
//! last digest (tags) or the pinned one (digests) without the network.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Result, bail, ensure};
use clap::Parser;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use wasmop::LoadOptions;
use wasmop::delivery::hotswap::{OptionsFor, PluginDir};
use wasmop::delivery::oci::{OciMirror, OciSource, PluginSource, RegistryOptions, SyncOutcome};
use wasmop::metrics;
use wasmop_tests::operator::{RunningOperator, plugin_path, sandbox};
use wasmop_tests::registry::Registry;
use wasmop_tests::widgets::{TempDir, create_widget, settle};
use wasmop_tests::{DEFAULT_DEADLINE, TestNamespace, apply_test_crds, wait_for};

/// Waits until Widget `name`'s ConfigMap carries version label `v`.
async fn wait_version(ns: &TestNamespace, name: &str, v: &str) -> Result<()> {
    let cms: Api<ConfigMap> = ns.api();
    let cm = format!("{name}-cm");
    wait_for(&format!("{cm} labelled {v}"), DEFAULT_DEADLINE, || {
        let cms = cms.clone();
        let cm = cm.clone();
        async move {
            let got = cms.get_opt(&cm).await?.and_then(|c| {
                c.metadata
                    .labels
                    .and_then(|l| l.get("test.wasmop.dev/version").cloned())
            });
            if got.as_deref() == Some(v) {
                Ok(Some(()))
            } else {
                bail!("{cm} has version {got:?}")
            }
        }
    })
    .await
}

/// `wasmop push FILE oci://REF --insecure-registry HOST`, through the real
/// command line; returns what it printed (the digest reference).
async fn push(registry: &Registry, file: &Path, reference: &str) -> Result<String> {
    let argv: Vec<String> = vec![
        "wasmop".into(),
        "push".into(),
        file.display().to_string(),
        format!("oci://{}/{reference}", registry.host),
        "--insecure-registry".into(),
        registry.host.clone(),
    ];
    let cli = wasmop::cli::Cli::try_parse_from(&argv)?;
    let code = tokio::task::spawn_blocking(move || wasmop::cli::execute(cli)).await??;
    ensure!(code == std::process::ExitCode::SUCCESS, "push failed");
    // What the tag resolves to now (the command printed the same).
    let opts = RegistryOptions {
        insecure: vec![registry.host.clone()],
        ..RegistryOptions::default()
    };
    let source = oci_source(registry, reference)?;
    let digest = opts
        .client()
        .fetch_manifest_digest(&source.reference, &opts.auth(&source.reference))
        .await?;
    Ok(digest)
}

fn oci_source(registry: &Registry, reference: &str) -> Result<OciSource> {
    match format!("oci://{}/{reference}", registry.host).parse::<PluginSource>() {
        Ok(PluginSource::Oci(s)) => Ok(s),
        other => bail!("not an oci source: {other:?}"),
    }
}

fn mirror(registry: &Registry, cache: &Path, reference: &str) -> Result<OciMirror> {
    let registry_options = RegistryOptions {
        insecure: vec![registry.host.clone()],
        ..RegistryOptions::default()
    };
    Ok(OciMirror::new(
        cache.to_owned(),
        vec![oci_source(registry, reference)?],
        registry_options,
        wasmop::delivery::oci::DEFAULT_MAX_BYTES,
    )?)
}

#[tokio::test]
async fn a_tag_is_pulled_polled_and_swapped_and_an_outage_loses_nothing() -> Result<()> {
    let ns = TestNamespace::new("oci-tag").await?;
    apply_test_crds(&ns.client).await?;
    let mut registry = Registry::start().await?;
    let cache = TempDir::new("wasmop-oci-cache");

    // v1 published and pulled: the operator runs it.
    let d1 = push(&registry, &plugin_path("good")?, "wasmop/good:stable").await?;
    let mut mirror = mirror(&registry, &cache.0, "wasmop/good:stable")?;
    let synced = mirror.sync().await;
    assert_eq!(
        synced,
        vec![SyncOutcome::Installed("good".into(), d1.clone())]
    );
    assert_eq!(
        std::fs::read(mirror.active_dir().join("good.wasm"))?,
        std::fs::read(plugin_path("good")?)?,
        "the pulled layer is the pushed file"
    );
    let op = RunningOperator::start(ns.client.clone(), vec![ns.name.clone()], vec![]).await?;
    let options: OptionsFor = Arc::new(|_stem: &str| LoadOptions::default());
    let mut plugins = PluginDir::with_dirs(
        vec![mirror.active_dir().to_owned()],
        sandbox(),
        op.operator.clone(),
        options,
    );
    let first = plugins.scan(false).await;
    assert_eq!(first.activated, vec![("good".into(), "0.1.0".into())]);
    create_widget(&ns, "w1").await?;
    wait_version(&ns, "w1", "v1").await?;

    // Polling an unchanged tag changes nothing.
    assert_eq!(
        mirror.sync().await,
        vec![SyncOutcome::Unchanged(d1.clone())]
    );

    // A broken artifact under the tag is pulled (it is a valid artifact)
    // but refused by the plugin directory: v1 keeps serving.
    let broken = TempDir::new("wasmop-broken");
    let broken_file = broken.0.join("good.wasm");
    std::fs::write(&broken_file, b"\0asm\x0d\0\x01\0not really a component")?;
    let d_broken = push(&registry, &broken_file, "wasmop/good:stable").await?;
    assert_ne!(d_broken, d1);
    assert_eq!(
        mirror.sync().await,
        vec![SyncOutcome::Installed("good".into(), d_broken.clone())]
    );
    let report = settle(&mut plugins).await;
    assert!(report.activated.is_empty(), "{report:?}");
    assert_eq!(report.rejected.len(), 1, "{report:?}");
    assert_eq!(op.operator.plugins()[0].1, "0.1.0");

    // v2 under the same tag: polled, pulled, hot-swapped.
    let d2 = push(&registry, &plugin_path("good-v2")?, "wasmop/good:stable").await?;
    assert!(d2 != d1 && d2 != d_broken);
    assert_eq!(
        mirror.sync().await,
        vec![SyncOutcome::Installed("good".into(), d2.clone())]
    );
    let report = settle(&mut plugins).await;
    assert_eq!(
        report.activated,
        vec![("good".into(), "0.2.0".into())],
        "{report:?}"
    );
    wait_version(&ns, "w1", "v2").await?;
    assert_eq!(
        metrics::global().get("wasmop_plugin_source_up", &[("plugin", "good")]),
        Some(1.0)
    );

    // The registry goes away: the sync fails, is reported, and nothing is
    // lost: v2 keeps serving new primaries.
    registry.stop();
    let synced = mirror.sync().await;
    assert!(
        matches!(&synced[..], [SyncOutcome::Failed(name, reason, _)] if name == "good" && reason == "RegistryUnreachable"),
        "{synced:?}"
    );
    assert_eq!(
        metrics::global().get("wasmop_plugin_source_up", &[("plugin", "good")]),
        Some(0.0)
    );
    assert!(settle(&mut plugins).await.removed.is_empty());
    create_widget(&ns, "w2").await?;
    wait_version(&ns, "w2", "v2").await?;

    // A restart with the registry still down: the tag runs the digest it
    // last resolved to, from the cache.
    drop(mirror);
    let mut restarted = self::mirror(&registry, &cache.0, "wasmop/good:stable")?;
    let synced = restarted.sync().await;
    assert!(
        matches!(&synced[..], [SyncOutcome::Failed(_, reason, _)] if reason == "RegistryUnreachable"),
        "{synced:?}"
    );
    assert_eq!(
        std::fs::read(restarted.active_dir().join("good.wasm"))?,
        std::fs::read(plugin_path("good-v2")?)?,
        "the cached v2 is installed while the registry is down"
    );

    // A digest reference is served from the cache without the network.
    let mut pinned = self::mirror(&registry, &cache.0, &format!("wasmop/good@{d1}"))?;
    assert_eq!(
        pinned.sync().await,
        vec![SyncOutcome::Installed("good".into(), d1.clone())]
    );
    assert_eq!(
        std::fs::read(pinned.active_dir().join("good.wasm"))?,
        std::fs::read(plugin_path("good")?)?
    );
    drop(op);
    Ok(())
}

/// A child process killed on drop, its output in a file.
struct Process {
    child: std::process::Child,
    log: PathBuf,
}
impl Process {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}
impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn the_run_command_runs_swaps_and_survives_a_registry_outage() -> Result<()> {
    let ns = TestNamespace::new("oci-run").await?;
    apply_test_crds(&ns.client).await?;
    let mut registry = Registry::start().await?;
    let work = TempDir::new("wasmop-oci-run");
    push(&registry, &plugin_path("good")?, "wasmop/good:stable").await?;

    let log = work.0.join("operator.log");
    let child = std::process::Command::new(wasmop_tests::wasmop_bin()?)
        .args(["run", "--plugins"])
        .arg(format!("oci://{}/wasmop/good:stable", registry.host))
        .args(["--insecure-registry", &registry.host])
        .args(["--oci-poll-interval-ms", "300", "--poll-interval-ms", "200"])
        .arg("--oci-cache")
        .arg(work.0.join("cache"))
        .arg("--compile-cache")
        .arg(work.0.join("compiled"))
        .args(["--namespace", &ns.name])
        .arg("--kubeconfig")
        .arg(wasmop_tests::kubeconfig_path())
        .stdin(std::process::Stdio::null())
        .stdout(std::fs::File::create(&log)?)
        .stderr(std::fs::File::create(work.0.join("operator.err"))?)
        .spawn()?;
    let operator = Process {
        child,
        log: work.0.join("operator.err"),
    };
    let step = async {
        create_widget(&ns, "w1").await?;
        wait_version(&ns, "w1", "v1").await?;
        // v2 under the same tag: the running process polls and swaps.
        push(&registry, &plugin_path("good-v2")?, "wasmop/good:stable").await?;
        wait_version(&ns, "w1", "v2").await?;
        // The registry goes away: v2 keeps serving new primaries, and the
        // process says why it cannot update.
        registry.stop();
        create_widget(&ns, "w2").await?;
        wait_version(&ns, "w2", "v2").await?;
        wait_for(
            "the operator to report the unreachable registry",
            DEFAULT_DEADLINE,
            || {
                let text = operator.log();
                async move {
                    if text.contains("cannot update the plugin from its registry") {
                        Ok(Some(()))
                    } else {
                        bail!("not reported yet")
                    }
                }
            },
        )
        .await?;
        anyhow::Ok(())
    }
    .await;
    if let Err(e) = step {
        bail!("{e:#}\noperator log:\n{}", operator.log());
    }
    Ok(())
}

#[tokio::test]
async fn a_digest_reference_never_moves_and_push_refuses_a_non_component() -> Result<()> {
    let registry = Registry::start().await?;
    let cache = TempDir::new("wasmop-oci-pin");
    let d1 = push(&registry, &plugin_path("good")?, "wasmop/pinned:v1").await?;
    let mut pinned = mirror(&registry, &cache.0, &format!("wasmop/pinned@{d1}"))?;
    assert_eq!(
        pinned.sync().await,
        vec![SyncOutcome::Installed("pinned".into(), d1.clone())]
    );
    // The tag moves; the digest reference does not.
    push(&registry, &plugin_path("good-v2")?, "wasmop/pinned:v1").await?;
    assert_eq!(
        pinned.sync().await,
        vec![SyncOutcome::Unchanged(d1.clone())]
    );
    assert_eq!(
        std::fs::read(pinned.active_dir().join("pinned.wasm"))?,
        std::fs::read(plugin_path("good")?)?
    );

    // A digest the registry does not have: refused, nothing installed.
    let missing = format!("sha256:{}", "0".repeat(64));
    let cache2 = TempDir::new("wasmop-oci-missing");
    let mut absent = mirror(&registry, &cache2.0, &format!("wasmop/pinned@{missing}"))?;
    let synced = absent.sync().await;
    assert!(
        matches!(&synced[..], [SyncOutcome::Failed(..)]),
        "{synced:?}"
    );
    assert!(!absent.active_dir().join("pinned.wasm").exists());

    // `wasmop push` refuses a file that is not a component.
    let junk = TempDir::new("wasmop-junk");
    let file = junk.0.join("junk.wasm");
    std::fs::write(&file, b"#!/bin/sh\n")?;
    let cli = wasmop::cli::Cli::try_parse_from([
        "wasmop".to_owned(),
        "push".to_owned(),
        file.display().to_string(),
        format!("oci://{}/wasmop/junk:v1", registry.host),
        "--insecure-registry".to_owned(),
        registry.host.clone(),
    ])?;
    let err = tokio::task::spawn_blocking(move || wasmop::cli::execute(cli))
        .await?
        .expect_err("a non-component is refused");
    assert!(
        err.to_string().contains("not a WebAssembly component"),
        "{err}"
    );
    Ok(())
}

/// Plugins in JavaScript and Python hold their language's engine (12-18
/// MB), more than a ConfigMap holds: they come by OCI. Each is pushed with
/// `wasmop push`, pulled by its digest, installed byte for byte, and loads.
#[tokio::test]
async fn javascript_and_python_plugins_are_pushed_and_pulled_by_digest() -> Result<()> {
    let registry = Registry::start().await?;
    for port in ["good-js", "good-py"] {
        let file = plugin_path(port)?;
        let size = std::fs::metadata(&file)?.len();
        ensure!(size > 4 << 20, "{port} is only {size} bytes");
        let digest = push(&registry, &file, &format!("wasmop/{port}:v1")).await?;
        let cache = TempDir::new("wasmop-oci-lang");
        let mut pinned = mirror(&registry, &cache.0, &format!("wasmop/{port}@{digest}"))?;
        assert_eq!(
            pinned.sync().await,
            vec![SyncOutcome::Installed(port.into(), digest.clone())]
        );
        let installed = pinned.active_dir().join(format!("{port}.wasm"));
        ensure!(
            std::fs::read(&installed)? == std::fs::read(&file)?,
            "{port}: the pulled component differs from the pushed one"
        );
        let plugin = wasmop::LoadedPlugin::load(&sandbox(), &installed, &LoadOptions::default())?;
        ensure!(
            (plugin.name(), plugin.version()) == ("good", "0.1.0"),
            "{port}: {} {}",
            plugin.name(),
            plugin.version()
        );
    }
    Ok(())
}
