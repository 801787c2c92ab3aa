//! Bounds against the real control plane: plugins that block in WASI
//! clock waits (`sleeper`, `sleepy-manifest`) neither stall the operator
//! nor its shutdown, and a `wasmop run` process ends on SIGTERM in time.

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};
use wasmop::delivery::hotswap::{OptionsFor, PluginDir};
use wasmop::{Limits, LoadOptions, LoadedPlugin};
use wasmop_tests::operator::{RunningOperator, load_plugin, plugin_path, sandbox};
use wasmop_tests::{DEFAULT_DEADLINE, TestNamespace, apply_test_crds, kubeconfig_path, wait_for};

fn test_kind(ns: &TestNamespace, kind: &str, plural: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("test.wasmop.dev", "v1", kind);
    let ar = ApiResource::from_gvk_with_plural(&gvk, plural);
    Api::namespaced_with(ns.client.clone(), &ns.name, &ar)
}

async fn create(api: &Api<DynamicObject>, kind: &str, name: &str, spec: Value) -> Result<()> {
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "test.wasmop.dev/v1", "kind": kind,
        "metadata": {"name": name}, "spec": spec,
    }))?;
    api.create(&PostParams::default(), &obj).await?;
    Ok(())
}

/// Waits until `name` has condition `Reconciled` with `reason`.
async fn wait_reason(
    api: &Api<DynamicObject>,
    name: &str,
    reason: &str,
    within: Duration,
) -> Result<()> {
    wait_for(
        &format!("{name}: Reconciled reason {reason}"),
        within,
        || {
            let api = api.clone();
            async move {
                let obj = api.get(name).await?;
                let conds = obj.data["status"]["conditions"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                match conds.iter().find(|c| c["type"] == "Reconciled") {
                    Some(c) if c["reason"] == reason => Ok(Some(())),
                    Some(c) => bail!("condition is {c}"),
                    None => bail!("no Reconciled condition yet"),
                }
            }
        },
    )
    .await
}

/// A temporary directory removed on drop.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new(prefix: &str) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let path = std::env::temp_dir().join(format!("{prefix}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&path).expect("temp dir");
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn install(plugin: &str, dir: &Path, as_name: &str) -> Result<()> {
    std::fs::copy(plugin_path(plugin)?, dir.join(format!("{as_name}.wasm")))
        .with_context(|| format!("installing {plugin}"))?;
    Ok(())
}

#[tokio::test]
async fn sleeping_plugins_time_out_and_other_plugins_keep_reconciling() -> Result<()> {
    let ns = TestNamespace::new("bounds-sleepers").await?;
    apply_test_crds(&ns.client).await?;
    let plugins = vec![
        load_plugin("good", json!({}))?,
        load_plugin("sleeper", json!({}))?,
    ];
    let _op = RunningOperator::start(ns.client.clone(), vec![ns.name.clone()], plugins).await?;
    let sleepers = test_kind(&ns, "Sleeper", "sleepers");
    for n in 0..8 {
        create(&sleepers, "Sleeper", &format!("s{n}"), json!({})).await?;
    }
    // While eight sleeping primaries are queued (and retried with backoff),
    // a Widget is reconciled promptly.
    let widgets = test_kind(&ns, "Widget", "widgets");
    let started = Instant::now();
    create(&widgets, "Widget", "w", json!({"value": "x"})).await?;
    wait_reason(&widgets, "w", "Reconciled", Duration::from_secs(20)).await?;
    let widget_took = started.elapsed();
    for n in 0..8 {
        wait_reason(
            &sleepers,
            &format!("s{n}"),
            "PluginTimedOut",
            DEFAULT_DEADLINE,
        )
        .await?;
    }
    eprintln!("the Widget was reconciled {widget_took:?} after creation");
    Ok(())
}

#[tokio::test]
async fn hot_swap_to_a_plugin_whose_manifest_sleeps_is_refused_in_time() -> Result<()> {
    let ns = TestNamespace::new("bounds-swap").await?;
    apply_test_crds(&ns.client).await?;
    let deadline = Duration::from_millis(500);
    let limits = Limits {
        deadline,
        ..Limits::default()
    };
    let options = move |_: &str| LoadOptions {
        limits,
        ..LoadOptions::default()
    };
    // Compile the replacement once (into the compile cache the scans use),
    // so what is timed below is the refusal, not Cranelift.
    let warm = LoadedPlugin::load(
        &sandbox(),
        &plugin_path("sleepy-manifest")?,
        &options("sleepy-manifest"),
    );
    assert!(warm.is_err(), "sleepy-manifest must not load");

    let dir = TempDir::new("bounds-swap");
    install("sleeper", &dir.0, "sleeper")?;
    let op = RunningOperator::start(ns.client.clone(), vec![ns.name.clone()], vec![]).await?;
    let options: OptionsFor = Arc::new(options);
    let mut plugins = PluginDir::new(dir.0.clone(), sandbox(), op.operator.clone(), options);
    let first = plugins.scan(false).await;
    assert_eq!(first.activated.len(), 1, "{first:?}");

    install("sleepy-manifest", &dir.0, "sleeper")?;
    // A changed file is loaded once it held still for one scan.
    let started = Instant::now();
    let mut rejected = Vec::new();
    for _ in 0..3 {
        let report = plugins.scan(true).await;
        rejected.extend(report.rejected);
        if !rejected.is_empty() {
            break;
        }
    }
    let took = started.elapsed();
    assert_eq!(rejected.len(), 1, "the swap is refused");
    let reason = &rejected[0].1;
    assert!(reason.contains("manifest"), "{reason}");
    assert!(reason.contains("deadline"), "{reason}");
    assert!(
        took < deadline + Duration::from_secs(1),
        "refusing the swap took {took:?}"
    );
    assert_eq!(
        op.operator.plugins().len(),
        1,
        "the running version stays: {:?}",
        op.operator.plugins()
    );
    Ok(())
}

#[tokio::test]
async fn sigterm_ends_wasmop_run_within_the_deadline_and_a_second() -> Result<()> {
    let ns = TestNamespace::new("bounds-sigterm").await?;
    apply_test_crds(&ns.client).await?;
    let dir = TempDir::new("bounds-sigterm");
    let plugins = dir.0.join("plugins");
    std::fs::create_dir_all(&plugins)?;
    install("sleeper", &plugins, "sleeper")?;
    install("good", &plugins, "good")?;
    let deadline = Duration::from_millis(1500);
    let config = dir.0.join("operator.yaml");
    std::fs::write(
        &config,
        format!(
            "workers: 4\nplugins:\n  sleeper: {{deadlineMs: {}}}\n  good: {{deadlineMs: {}}}\n",
            deadline.as_millis(),
            deadline.as_millis()
        ),
    )?;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_wasmop-under-test"))
        .arg("run")
        .arg("--plugins")
        .arg(&plugins)
        .arg("--config")
        .arg(&config)
        .arg("--kubeconfig")
        .arg(kubeconfig_path())
        .arg("--namespace")
        .arg(&ns.name)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .context("spawning wasmop run")?;
    let pid = child.id().context("child pid")?;

    // The operator is running and busy with sleeping plugins.
    let sleepers = test_kind(&ns, "Sleeper", "sleepers");
    for n in 0..8 {
        create(&sleepers, "Sleeper", &format!("s{n}"), json!({})).await?;
    }
    let widgets = test_kind(&ns, "Widget", "widgets");
    create(&widgets, "Widget", "w", json!({"value": "x"})).await?;
    wait_reason(&sleepers, "s0", "PluginTimedOut", DEFAULT_DEADLINE).await?;
    wait_reason(&widgets, "w", "Reconciled", DEFAULT_DEADLINE).await?;
    assert!(child.try_wait()?.is_none(), "wasmop run exited early");

    let signalled = Instant::now();
    let kill = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .context("running kill")?;
    assert!(kill.success(), "kill -TERM failed");
    let limit = deadline + Duration::from_secs(1);
    let status = tokio::time::timeout(limit + Duration::from_secs(5), child.wait())
        .await
        .context("wasmop run did not exit")??;
    let took = signalled.elapsed();
    eprintln!("wasmop run exited {took:?} after SIGTERM with {status}");
    assert!(
        took < limit,
        "wasmop run took {took:?} to stop (limit {limit:?})"
    );
    assert!(status.success(), "exit status {status}");
    Ok(())
}

/// A loopback server that counts the connections it accepts.
struct CountingServer {
    port: u16,
    accepted: Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl CountingServer {
    async fn start() -> Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        let task = tokio::spawn(async move {
            while let Ok((_stream, _)) = listener.accept().await {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        });
        Ok(CountingServer {
            port,
            accepted,
            task,
        })
    }

    fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for CountingServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[tokio::test]
async fn external_name_and_selector_less_service_targets_are_refused() -> Result<()> {
    use k8s_openapi::api::core::v1::Service;
    let ns = TestNamespace::new("bounds-services").await?;
    apply_test_crds(&ns.client).await?;
    let server = CountingServer::start().await?;
    let services: Api<Service> = ns.api();
    // An alias for the loopback server, and a Service without a selector
    // (whose endpoints anyone could write by hand).
    let alias: Service = serde_json::from_value(json!({
        "metadata": {"name": "alias"},
        "spec": {"type": "ExternalName", "externalName": "localhost",
                 "ports": [{"port": 80, "targetPort": server.port}]}
    }))?;
    let manual: Service = serde_json::from_value(json!({
        "metadata": {"name": "manual"},
        "spec": {"ports": [{"port": 80, "targetPort": server.port}]}
    }))?;
    services.create(&PostParams::default(), &alias).await?;
    services.create(&PostParams::default(), &manual).await?;

    let _op = RunningOperator::start(
        ns.client.clone(),
        vec![ns.name.clone()],
        vec![load_plugin("service-caller", json!({}))?],
    )
    .await?;
    let callers = test_kind(&ns, "ServiceCaller", "servicecallers");
    for (name, service, why) in [
        ("c-alias", "alias", "ExternalName"),
        ("c-manual", "manual", "no selector"),
    ] {
        create(&callers, "ServiceCaller", name, json!({"service": service})).await?;
        let observed = wait_for(
            &format!("{name}: refusal observed"),
            DEFAULT_DEADLINE,
            || {
                let callers = callers.clone();
                async move {
                    let obj = callers.get(name).await?;
                    let observed = obj.data["status"]["observed"].clone();
                    if observed.is_null() {
                        bail!("nothing observed yet: {}", obj.data["status"]);
                    }
                    Ok(Some(observed))
                }
            },
        )
        .await?;
        let error = observed["error"].as_str().unwrap_or_default();
        assert!(
            error.contains("refused before sending"),
            "{name}: {observed}"
        );
        assert!(error.contains(why), "{name}: {observed}");
        assert!(observed["status"].is_null(), "{name}: {observed}");
    }
    assert_eq!(server.accepted(), 0, "no request may reach the server");
    Ok(())
}
