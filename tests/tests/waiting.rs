//! A plugin that needs a kind the API server does not serve (its CRD is not
//! installed) waits for it: the real `wasmop run` process, the real
//! `waiter.wasm` (primary kind `Waiter`, `waiting.wasmop.dev`, whose CRD
//! only this test installs) next to `good.wasm`.
//!
//! One test at a time touches the Waiter CRD: it is cluster-wide, and only
//! this file uses it (each test holds [`CRD_LOCK`]).
//!
//! `waiter` also decides the admission of Widgets: with `--admission-port`,
//! its webhook stays registered (`failurePolicy: Fail`) and its `admit`
//! keeps deciding while it waits, through the real API server.

use std::path::Path;
use std::process::Stdio;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use wasmop_tests::admission::delete_configuration;
use wasmop_tests::net::free_port;
use wasmop_tests::operator::plugin_path;
use wasmop_tests::widgets::TempDir;
use wasmop_tests::{
    DEFAULT_DEADLINE, TestNamespace, apply_crd_files, apply_test_crds, delete_crds,
    kubeconfig_path, repo_root, wait_for,
};

const CRD: &str = "waiters.waiting.wasmop.dev";
const LINE: &str = "plugin waiter waits for CRD waiters.waiting.wasmop.dev (install its CRD)";
/// `waiter`'s denial of `wait-deny-*` Widgets (tests/plugins/waiter).
const DENIAL: &str = "waiter: widgets named wait-deny-* are not admitted";

/// Held by each test for its whole run: the tests of this file install and
/// delete the same cluster-wide CRD.
static CRD_LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `wasmop run` with the `plugins` of `dir`, watching `ns`, logging to
/// `dir/wasmop.log`; `extra` arguments appended.
fn spawn_operator(
    dir: &TempDir,
    ns: &TestNamespace,
    plugins: &[&str],
    extra: &[String],
) -> Result<tokio::process::Child> {
    let plugin_dir = dir.0.join("plugins");
    std::fs::create_dir_all(&plugin_dir)?;
    for p in plugins {
        std::fs::copy(plugin_path(p)?, plugin_dir.join(format!("{p}.wasm")))?;
    }
    tokio::process::Command::new(env!("CARGO_BIN_EXE_wasmop-under-test"))
        .args(["run", "--metrics-addr", "127.0.0.1:0", "--plugins"])
        .arg(&plugin_dir)
        .arg("--kubeconfig")
        .arg(kubeconfig_path())
        .arg("--namespace")
        .arg(&ns.name)
        .args(extra)
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(dir.0.join("wasmop.out"))?)
        .stderr(std::fs::File::create(dir.0.join("wasmop.log"))?)
        .kill_on_drop(true)
        .spawn()
        .context("spawning wasmop run")
}

/// The metrics address the operator logging to `log` serves on.
async fn metrics_addr(log: &Path) -> Result<String> {
    wait_for("the operator's metrics address", DEFAULT_DEADLINE, || {
        let text = log_text(log);
        async move {
            let addr = text
                .lines()
                .find(|l| l.contains("serving metrics"))
                .and_then(|l| l.split("addr=").nth(1))
                .map(|a| a.split_whitespace().next().unwrap_or_default().to_owned());
            Ok(addr)
        }
    })
    .await
}

/// `GET path` on `addr` (HTTP/1.0): status and body.
async fn http_get(addr: &str, path: &str) -> Result<(u16, String)> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let mut out = String::new();
    s.read_to_string(&mut out).await?;
    let (head, body) = out.split_once("\r\n\r\n").context("no HTTP head")?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("no status code")?;
    Ok((code, body.to_owned()))
}

/// The value of the series of `name` with every one of `labels`
/// (`key="value"`) in a /metrics page.
fn series(page: &str, name: &str, labels: &[&str]) -> Option<f64> {
    page.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .find(|l| labels.iter().all(|p| l.contains(p)))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.trim().parse().ok())
}

fn log_text(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

fn kind(ns: &TestNamespace, group: &str, kind: &str, plural: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk(group, "v1", kind);
    Api::namespaced_with(
        ns.client.clone(),
        &ns.name,
        &ApiResource::from_gvk_with_plural(&gvk, plural),
    )
}

async fn create(api: &Api<DynamicObject>, api_version: &str, kind: &str, name: &str) -> Result<()> {
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": api_version, "kind": kind,
        "metadata": {"name": name}, "spec": {"value": "x"},
    }))?;
    api.create(&PostParams::default(), &obj).await?;
    Ok(())
}

fn reconciled(obj: &DynamicObject) -> bool {
    obj.data["status"]["conditions"]
        .as_array()
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Reconciled" && c["status"] == "True")
        })
}

#[tokio::test]
async fn a_plugin_whose_crd_is_missing_waits_says_so_once_and_starts_when_it_appears() -> Result<()>
{
    let _crd = CRD_LOCK.lock().await;
    let ns = TestNamespace::new("waiting").await?;
    apply_test_crds(&ns.client).await?;
    // Left by an earlier run, or never there.
    delete_crds(&ns.client, &[CRD.to_owned()]).await?;

    let dir = TempDir::new("waiting");
    let log = dir.0.join("wasmop.log");
    let mut child = spawn_operator(&dir, &ns, &["waiter", "good"], &[])?;

    // The one line, the gauge, /readyz.
    let addr = metrics_addr(&log).await?;
    wait_for("the waiting line in the log", DEFAULT_DEADLINE, || {
        let found = log_text(&log).contains(LINE);
        async move { Ok(found.then_some(())) }
    })
    .await?;
    let (code, body) = wait_for("/readyz answering 200", DEFAULT_DEADLINE, || {
        let addr = addr.clone();
        async move {
            let (code, body) = http_get(&addr, "/readyz").await?;
            if code != 200 {
                bail!("{code}: {body}");
            }
            Ok(Some((code, body)))
        }
    })
    .await?;
    assert_eq!(code, 200);
    assert!(
        body.contains(&format!("[!] waiting: {LINE}")),
        "/readyz names the waiting plugin: {body}"
    );
    let (_, page) = http_get(&addr, "/metrics").await?;
    assert_eq!(
        series(
            &page,
            "wasmop_plugin_waiting_for_crd",
            &[&format!("crd=\"{CRD}\""), "plugin=\"waiter\""]
        ),
        Some(1.0),
        "the waiting gauge"
    );

    // The other plugin works meanwhile.
    let widgets = kind(&ns, "test.wasmop.dev", "Widget", "widgets");
    create(&widgets, "test.wasmop.dev/v1", "Widget", "w").await?;
    wait_for("Widget w reconciled", DEFAULT_DEADLINE, || {
        let widgets = widgets.clone();
        async move { Ok(reconciled(&widgets.get("w").await?).then_some(())) }
    })
    .await?;
    assert!(child.try_wait()?.is_none(), "wasmop run exited");

    // The CRD appears: the plugin becomes active and reconciles.
    apply_crd_files(
        &ns.client,
        &[repo_root().join("tests/fixtures/waiting/waiters.yaml")],
    )
    .await?;
    let waiters = kind(&ns, "waiting.wasmop.dev", "Waiter", "waiters");
    create(&waiters, "waiting.wasmop.dev/v1", "Waiter", "a").await?;
    let seen: Value = wait_for("Waiter a reconciled", DEFAULT_DEADLINE, || {
        let waiters = waiters.clone();
        async move {
            let w = waiters.get("a").await?;
            Ok(reconciled(&w).then(|| w.data["status"]["seen"].clone()))
        }
    })
    .await?;
    assert_eq!(seen, json!(true));

    let text = log_text(&log);
    assert_eq!(
        text.matches(LINE).count(),
        1,
        "said once, not at every retry:\n{text}"
    );
    assert!(
        text.contains("the CRD the plugin waited for is served now"),
        "{text}"
    );
    assert!(
        !text
            .lines()
            .any(|l| l.contains("WARN") && l.contains("watch failed") && l.contains("Waiter")),
        "no repeated watch warning for the missing kind:\n{text}"
    );
    let (code, body) = http_get(&addr, "/readyz").await?;
    assert_eq!(code, 200, "{body}");
    assert!(!body.contains("waiting"), "{body}");
    let (_, page) = http_get(&addr, "/metrics").await?;
    assert_eq!(
        series(
            &page,
            "wasmop_plugin_waiting_for_crd",
            &[&format!("crd=\"{CRD}\""), "plugin=\"waiter\""]
        ),
        Some(0.0)
    );

    child.kill().await?;
    delete_crds(&ns.client, &[CRD.to_owned()]).await?;
    Ok(())
}

/// Issue 40: the webhook of a plugin waiting for a CRD is not dropped. It
/// stays in the configuration with `failurePolicy: Fail`, and the API
/// server's calls reach the waiting plugin's `admit`, which denies and
/// admits as it would when active; `/readyz` names the wait meanwhile.
#[tokio::test]
async fn a_waiting_plugin_keeps_its_webhook_and_its_admit_decides() -> Result<()> {
    let _crd = CRD_LOCK.lock().await;
    let ns = TestNamespace::new("waiting-admit").await?;
    let ops = TestNamespace::new("waiting-admit-ops").await?;
    apply_test_crds(&ns.client).await?;
    delete_crds(&ns.client, &[CRD.to_owned()]).await?;
    let configuration = format!("wasmop-admission-{}", ns.name);
    let dir = TempDir::new("waiting-admit");
    let log = dir.0.join("wasmop.log");
    let port = free_port()?;
    let mut child = spawn_operator(
        &dir,
        &ns,
        &["waiter"],
        &[
            "--admission-port".into(),
            port.to_string(),
            "--admission-bind".into(),
            "127.0.0.1".into(),
            "--admission-url".into(),
            format!("https://127.0.0.1:{port}"),
            "--admission-namespace".into(),
            ops.name.clone(),
            "--admission-webhook-config".into(),
            configuration.clone(),
        ],
    )?;
    let run = async {
        let addr = metrics_addr(&log).await?;
        wait_for("the waiting line in the log", DEFAULT_DEADLINE, || {
            let found = log_text(&log).contains(LINE);
            async move { Ok(found.then_some(())) }
        })
        .await?;

        // The webhook is registered, failing closed.
        let configs: Api<ValidatingWebhookConfiguration> = Api::all(ns.client.clone());
        let hook = wait_for("the waiter's webhook", DEFAULT_DEADLINE, || {
            let configs = configs.clone();
            let configuration = configuration.clone();
            async move {
                let Some(c) = configs.get_opt(&configuration).await? else {
                    bail!("no configuration {configuration} yet");
                };
                Ok(c.webhooks
                    .unwrap_or_default()
                    .into_iter()
                    .find(|w| w.name.contains("waiter")))
            }
        })
        .await?;
        assert_eq!(hook.failure_policy.as_deref(), Some("Fail"), "{hook:?}");
        let rules = hook.rules.unwrap_or_default();
        assert_eq!(
            rules[0].resources.as_deref(),
            Some(&["widgets".to_owned()][..])
        );

        // The API server asks the waiting plugin: denied (dry runs until the
        // API server uses the new webhook, so an early admission leaves
        // nothing behind) and admitted.
        let widgets = kind(&ns, "test.wasmop.dev", "Widget", "widgets");
        let deny: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
            "metadata": {"name": "wait-deny-1"}, "spec": {"value": "x"},
        }))?;
        let dry_run = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        let denied = wait_for(
            "a wait-deny Widget refused by waiter",
            DEFAULT_DEADLINE,
            || {
                let (widgets, deny, dry_run) = (widgets.clone(), deny.clone(), dry_run.clone());
                async move {
                    match widgets.create(&dry_run, &deny).await {
                        Err(kube::Error::Api(e)) if e.message.contains(DENIAL) => {
                            Ok(Some(e.message))
                        }
                        Err(e) => bail!("refused otherwise: {e}"),
                        Ok(_) => bail!("wait-deny-1 was admitted"),
                    }
                }
            },
        )
        .await?;
        // And for real.
        match widgets.create(&PostParams::default(), &deny).await {
            Err(kube::Error::Api(e)) => assert!(e.message.contains(DENIAL), "{e:?}"),
            other => bail!("wait-deny-1 was not refused: {other:?}"),
        }
        assert!(denied.contains(DENIAL), "{denied}");
        assert!(widgets.get_opt("wait-deny-1").await?.is_none());
        create(&widgets, "test.wasmop.dev/v1", "Widget", "fine").await?;
        assert!(widgets.get_opt("fine").await?.is_some());

        // Still waiting, and /readyz says so.
        let (code, body) = http_get(&addr, "/readyz").await?;
        assert_eq!(code, 200, "{body}");
        assert!(
            body.contains(&format!("[!] waiting: {LINE}")),
            "/readyz names the waiting plugin: {body}"
        );
        assert!(child.try_wait()?.is_none(), "wasmop run exited");
        anyhow::Ok(())
    };
    let result = run.await;
    child.kill().await?;
    // A webhook failing closed towards a stopped operator would refuse
    // every later Widget of the namespace.
    delete_configuration(&ns.client, &configuration).await?;
    if let Err(e) = &result {
        eprintln!("operator log:\n{}", log_text(&log));
        return Err(anyhow::anyhow!("{e:#}"));
    }
    result
}
