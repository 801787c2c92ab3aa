//! HTTP observations declared in plans, performed by the host, seen by the
//! plugin in its next snapshot — against loopback test servers only.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Result, bail};
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use wasmop_tests::operator::{RunningOperator, load_plugin, test_config};
use wasmop_tests::{DEFAULT_DEADLINE, TestNamespace, apply_test_crds, wait_for};

/// A loopback HTTP server: `/ok` answers `hello`, `/slow` answers after
/// 5 s, `/big` answers 64 KiB. Counts connections.
struct TestServer {
    url: String,
    connections: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn server() -> Result<TestServer> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let connections = Arc::new(AtomicUsize::new(0));
    let count = connections.clone();
    let task = tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let n = sock.read(&mut buf).await.unwrap_or(0);
                let req = String::from_utf8_lossy(&buf[..n]).to_string();
                let body = if req.starts_with("GET /slow") {
                    // The slowness is the behaviour under test.
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    "late".to_string()
                } else if req.starts_with("GET /big") {
                    "x".repeat(64 * 1024)
                } else {
                    "hello".to_string()
                };
                let resp = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = sock.write_all(resp.as_bytes()).await;
            });
        }
    });
    Ok(TestServer {
        url,
        connections,
        task,
    })
}

fn observers(ns: &TestNamespace) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("test.wasmop.dev", "v1", "Observer");
    Api::namespaced_with(
        ns.client.clone(),
        &ns.name,
        &ApiResource::from_gvk_with_plural(&gvk, "observers"),
    )
}

async fn create(api: &Api<DynamicObject>, name: &str, url: &str, path: &str) -> Result<()> {
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "test.wasmop.dev/v1", "kind": "Observer",
        "metadata": {"name": name}, "spec": {"url": url, "path": path},
    }))?;
    api.create(&PostParams::default(), &obj).await?;
    Ok(())
}

async fn observed(api: &Api<DynamicObject>, name: &str) -> Result<Value> {
    wait_for(
        &format!("{name}: status.observed"),
        DEFAULT_DEADLINE,
        || {
            let api = api.clone();
            let name = name.to_string();
            async move {
                let o = api.get(&name).await?;
                let v = o.data["status"]["observed"].clone();
                if v.is_null() {
                    bail!("no observation yet; status: {}", o.data["status"]);
                }
                Ok(Some(v))
            }
        },
    )
    .await
}

async fn start(ns: &TestNamespace, allow: &str) -> Result<RunningOperator> {
    apply_test_crds(&ns.client).await?;
    let mut config = test_config();
    config.observe.allow_list = vec![allow.to_string()];
    config.observe.default_timeout = Duration::from_millis(500);
    config.observe.default_max_response_bytes = 1024;
    let plugin = load_plugin("observer", json!({}))?;
    RunningOperator::start_with(
        ns.client.clone(),
        vec![ns.name.clone()],
        vec![plugin],
        config,
    )
    .await
}

#[tokio::test]
async fn get_result_reaches_the_next_snapshot() -> Result<()> {
    let srv = server().await?;
    let ns = TestNamespace::new("observe-get").await?;
    let _op = start(&ns, &srv.url).await?;
    let api = observers(&ns);
    create(&api, "o", &srv.url, "/ok").await?;
    let v = observed(&api, "o").await?;
    assert_eq!(v["status"], json!(200), "{v}");
    assert_eq!(v["body"], json!("hello"), "{v}");
    assert!(v["error"].is_null(), "{v}");
    Ok(())
}

#[tokio::test]
async fn target_outside_the_allow_list_is_refused_before_anything_is_sent() -> Result<()> {
    let allowed = server().await?;
    let other = server().await?;
    let ns = TestNamespace::new("observe-refuse").await?;
    let _op = start(&ns, &allowed.url).await?;
    let api = observers(&ns);
    create(&api, "o", &other.url, "/ok").await?;
    let v = observed(&api, "o").await?;
    assert!(v["status"].is_null(), "{v}");
    let err = v["error"].as_str().unwrap_or_default();
    assert!(err.contains("allow-list"), "{v}");
    assert_eq!(
        other.connections.load(Ordering::SeqCst),
        0,
        "nothing was sent"
    );
    Ok(())
}

#[tokio::test]
async fn slow_server_hits_the_deadline() -> Result<()> {
    let srv = server().await?;
    let ns = TestNamespace::new("observe-slow").await?;
    let _op = start(&ns, &srv.url).await?;
    let api = observers(&ns);
    create(&api, "o", &srv.url, "/slow").await?;
    let v = observed(&api, "o").await?;
    assert!(v["status"].is_null(), "{v}");
    let err = v["error"].as_str().unwrap_or_default().to_lowercase();
    assert!(err.contains("deadline") || err.contains("timed out"), "{v}");
    Ok(())
}

#[tokio::test]
async fn oversized_body_is_cut_at_the_cap_with_an_error() -> Result<()> {
    let srv = server().await?;
    let ns = TestNamespace::new("observe-big").await?;
    let _op = start(&ns, &srv.url).await?;
    let api = observers(&ns);
    create(&api, "o", &srv.url, "/big").await?;
    let v = observed(&api, "o").await?;
    assert_eq!(v["status"], json!(200), "{v}");
    assert_eq!(
        v["body"].as_str().map(str::len),
        Some(1024),
        "cut at the cap"
    );
    assert!(v["error"].as_str().is_some_and(|e| !e.is_empty()), "{v}");
    Ok(())
}
