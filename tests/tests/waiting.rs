//! A plugin that needs a kind the API server does not serve (its CRD is not
//! installed) waits for it: the real `wasmop run` process, the real
//! `waiter.wasm` (primary kind `Waiter`, `waiting.wasmop.dev`, whose CRD
//! only this test installs) next to `good.wasm`.
//!
//! One test at a time touches the Waiter CRD: it is cluster-wide, and only
//! this file uses it.

use std::path::Path;
use std::process::Stdio;

use anyhow::{Context, Result, bail};
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use wasmop_tests::operator::plugin_path;
use wasmop_tests::widgets::TempDir;
use wasmop_tests::{
    DEFAULT_DEADLINE, TestNamespace, apply_crd_files, apply_test_crds, delete_crds,
    kubeconfig_path, repo_root, wait_for,
};

const CRD: &str = "waiters.waiting.wasmop.dev";
const LINE: &str = "plugin waiter waits for CRD waiters.waiting.wasmop.dev (install its CRD)";

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
    let ns = TestNamespace::new("waiting").await?;
    apply_test_crds(&ns.client).await?;
    // Left by an earlier run, or never there.
    delete_crds(&ns.client, &[CRD.to_owned()]).await?;

    let dir = TempDir::new("waiting");
    let plugins = dir.0.join("plugins");
    std::fs::create_dir_all(&plugins)?;
    for p in ["waiter", "good"] {
        std::fs::copy(plugin_path(p)?, plugins.join(format!("{p}.wasm")))?;
    }
    let log = dir.0.join("wasmop.log");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_wasmop-under-test"))
        .args(["run", "--metrics-addr", "127.0.0.1:0", "--plugins"])
        .arg(&plugins)
        .arg("--kubeconfig")
        .arg(kubeconfig_path())
        .arg("--namespace")
        .arg(&ns.name)
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(dir.0.join("wasmop.out"))?)
        .stderr(std::fs::File::create(&log)?)
        .kill_on_drop(true)
        .spawn()
        .context("spawning wasmop run")?;

    // The one line, the gauge, /readyz.
    let addr = wait_for("the operator's metrics address", DEFAULT_DEADLINE, || {
        let text = log_text(&log);
        async move {
            let addr = text
                .lines()
                .find(|l| l.contains("serving metrics"))
                .and_then(|l| l.split("addr=").nth(1))
                .map(|a| a.split_whitespace().next().unwrap_or_default().to_owned());
            Ok(addr)
        }
    })
    .await?;
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
