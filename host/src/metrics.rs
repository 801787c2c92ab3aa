//! Operator metrics in the Prometheus text format, served on
//! `--metrics-addr` at `/metrics`.
//!
//! | metric | labels | meaning |
//! | --- | --- | --- |
//! | `wasmop_plugin_info` | plugin, version, digest | 1 for each active plugin version |
//! | `wasmop_plugin_loads_total` | plugin | versions activated (start-up and hot swaps) |
//! | `wasmop_plugin_load_failures_total` | file, reason | plugin files rejected |
//! | `wasmop_reconcile_total` | controller, result | reconciles by outcome reason |
//! | `wasmop_reconcile_seconds_total` | controller | time spent in plugin calls |
//! | `wasmop_http_requests_total` | controller, outcome | plan HTTP requests: sent, refused, rate_limited |
//! | `wasmop_leader` | | 1 while this replica holds the leader Lease (with `--leader-elect`) |
//! | `wasmop_watch_streams` | kind, state | watch streams of a kind (one per watched namespace) that are `synced`, `relisting` or `backing_off` |
//! | `wasmop_watch_lists_total` | kind, reason | lists started: `initial`, or a relist after the watch `expired` (410) or an `error` (client-go: `reflector_lists_total`) |
//! | `wasmop_watch_errors_total` | kind, reason | watch and list failures: `expired` (410), `unavailable` (unreachable, 429, 5xx), `rejected` (other 4xx), `stalled` (an attempt unanswered while recovering, abandoned) |
//! | `wasmop_watch_recovery_seconds` | kind | how long the kind's last watch failure lasted, from the first error to objects flowing again |

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::{Mutex, OnceLock};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

type Labels = Vec<(String, String)>;

/// A set of counters and gauges keyed by name and labels.
#[derive(Debug, Default)]
pub struct Metrics {
    series: Mutex<BTreeMap<String, BTreeMap<Labels, f64>>>,
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

impl Metrics {
    /// Adds `by` to a counter.
    pub fn add(&self, name: &str, pairs: &[(&str, &str)], by: f64) {
        let mut s = self.series.lock().expect("metrics lock");
        *s.entry(name.to_string())
            .or_default()
            .entry(labels(pairs))
            .or_insert(0.0) += by;
    }

    /// Adds one to a counter.
    pub fn inc(&self, name: &str, pairs: &[(&str, &str)]) {
        self.add(name, pairs, 1.0);
    }

    /// Sets a gauge.
    pub fn set(&self, name: &str, pairs: &[(&str, &str)], value: f64) {
        let mut s = self.series.lock().expect("metrics lock");
        s.entry(name.to_string())
            .or_default()
            .insert(labels(pairs), value);
    }

    /// Removes every series of `name` whose label `key` equals `value`.
    pub fn remove_where(&self, name: &str, key: &str, value: &str) {
        let mut s = self.series.lock().expect("metrics lock");
        if let Some(series) = s.get_mut(name) {
            series.retain(|l, _| !l.iter().any(|(k, v)| k == key && v == value));
        }
    }

    /// The current value of one series.
    pub fn get(&self, name: &str, pairs: &[(&str, &str)]) -> Option<f64> {
        let s = self.series.lock().expect("metrics lock");
        s.get(name)?.get(&labels(pairs)).copied()
    }

    /// Everything in the Prometheus text exposition format.
    pub fn render(&self) -> String {
        let s = self.series.lock().expect("metrics lock");
        let mut out = String::new();
        for (name, series) in s.iter() {
            let kind = if name.ends_with("_total") {
                "counter"
            } else {
                "gauge"
            };
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for (l, v) in series {
                let body: Vec<String> = l
                    .iter()
                    .map(|(k, v)| {
                        format!("{k}=\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\""))
                    })
                    .collect();
                if body.is_empty() {
                    let _ = writeln!(out, "{name} {v}");
                } else {
                    let _ = writeln!(out, "{name}{{{}}} {v}", body.join(","));
                }
            }
        }
        out
    }
}

/// The process-wide metrics.
pub fn global() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::default)
}

/// Serves [`global`] metrics at `http://addr/metrics` until the task is
/// dropped.
///
/// # Errors
/// When the address cannot be bound.
pub async fn serve(addr: SocketAddr) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let listener = TcpListener::bind(addr).await?;
    tracing::info!(%addr, "serving metrics at /metrics");
    Ok(tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let mut buf = [0u8; 2048];
                let n = sock.read(&mut buf).await.unwrap_or(0);
                let request = String::from_utf8_lossy(&buf[..n]);
                let (status, body) = if request.starts_with("GET /metrics") {
                    ("200 OK", global().render())
                } else {
                    ("404 Not Found", "not found\n".to_string())
                };
                let response = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = sock.write_all(response.as_bytes()).await;
            });
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_and_gauges_with_escaped_labels() {
        let m = Metrics::default();
        m.inc(
            "wasmop_reconcile_total",
            &[("controller", "a/b"), ("result", "ok")],
        );
        m.inc(
            "wasmop_reconcile_total",
            &[("controller", "a/b"), ("result", "ok")],
        );
        m.set("wasmop_plugin_info", &[("plugin", "p\"q")], 1.0);
        let text = m.render();
        assert!(text.contains("# TYPE wasmop_reconcile_total counter"));
        assert!(text.contains("wasmop_reconcile_total{controller=\"a/b\",result=\"ok\"} 2"));
        assert!(text.contains("wasmop_plugin_info{plugin=\"p\\\"q\"} 1"));
        m.remove_where("wasmop_plugin_info", "plugin", "p\"q");
        assert!(!m.render().contains("plugin=\"p"));
    }

    #[tokio::test]
    async fn serves_metrics_over_http_on_loopback() {
        global().inc("wasmop_test_served_total", &[]);
        let probe = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = probe.local_addr().unwrap();
        drop(probe);
        let task = serve(addr).await.unwrap();
        let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
        sock.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        sock.read_to_string(&mut out).await.unwrap();
        assert!(out.starts_with("HTTP/1.1 200 OK"));
        assert!(out.contains("wasmop_test_served_total 1"));
        task.abort();
    }
}
