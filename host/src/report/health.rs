//! Liveness and readiness, served next to the metrics (`--metrics-addr`)
//! at `/healthz` and `/readyz`.
//!
//! - `/healthz` answers 500 when a worker has been busy with one reconcile
//!   for longer than the stuck deadline (`--stuck-after-secs`): a hung
//!   worker never takes the next key, so the kubelet should restart the
//!   process (the same idea as the etcd operator's alive checker). It
//!   answers 200 otherwise, also before the operator is ready.
//! - `/readyz` answers 200 once the plugin directory was scanned at start
//!   (every plugin that loads is active) and the cache of every kind an
//!   active controller reads has synced; 503 with the reasons before.
//!   A plugin that waits for a kind the API server does not serve (its CRD
//!   is not installed) gets a line `[!] waiting: plugin P waits for CRD
//!   C (...)` without failing the check: the other plugins work, and the
//!   admission webhooks this process serves must keep their endpoints.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::metrics;

/// A readiness check: `Err` holds what is not ready yet.
pub type ReadyCheck = Box<dyn Fn() -> Result<(), String> + Send + Sync>;

/// The default stuck deadline of one reconcile (`--stuck-after-secs`).
pub const DEFAULT_STUCK_AFTER: Duration = Duration::from_secs(120);

/// Liveness and readiness state of the process.
pub struct Health {
    next_id: AtomicU64,
    busy: Mutex<HashMap<u64, (Instant, String)>>,
    stuck_after: Mutex<Duration>,
    checks: Mutex<Vec<(String, ReadyCheck)>>,
    /// Plugins loaded but waiting for a kind that is not served: by plugin
    /// name, the line that says so and the loaded plugin.
    waiting: Mutex<BTreeMap<String, (String, Arc<crate::plugin::LoadedPlugin>)>>,
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Health").finish_non_exhaustive()
    }
}

impl Default for Health {
    fn default() -> Self {
        Self {
            next_id: AtomicU64::new(0),
            busy: Mutex::new(HashMap::new()),
            stuck_after: Mutex::new(DEFAULT_STUCK_AFTER),
            checks: Mutex::new(Vec::new()),
            waiting: Mutex::new(BTreeMap::new()),
        }
    }
}

/// Marks a worker busy with one piece of work until dropped.
#[derive(Debug)]
pub struct Busy<'a> {
    health: &'a Health,
    id: u64,
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.health
            .busy
            .lock()
            .expect("health lock")
            .remove(&self.id);
    }
}

impl Health {
    /// Sets how long one piece of work may take before `/healthz` fails.
    pub fn set_stuck_after(&self, after: Duration) {
        *self.stuck_after.lock().expect("health lock") = after;
    }

    /// Marks `what` as in progress from now until the guard is dropped.
    pub fn busy(&self, what: impl Into<String>) -> Busy<'_> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.busy
            .lock()
            .expect("health lock")
            .insert(id, (Instant::now(), what.into()));
        Busy { health: self, id }
    }

    /// Work in progress for longer than the stuck deadline at `now`, with
    /// how long it has been running, longest first.
    pub fn stuck(&self, now: Instant) -> Vec<(String, Duration)> {
        let after = *self.stuck_after.lock().expect("health lock");
        let mut out: Vec<(String, Duration)> = self
            .busy
            .lock()
            .expect("health lock")
            .values()
            .filter_map(|(since, what)| {
                let running = now.saturating_duration_since(*since);
                (running > after).then(|| (what.clone(), running))
            })
            .collect();
        out.sort_by_key(|b| std::cmp::Reverse(b.1));
        out
    }

    /// Adds a named readiness check (replacing one of the same name).
    pub fn add_ready_check(&self, name: &str, check: ReadyCheck) {
        let mut checks = self.checks.lock().expect("health lock");
        checks.retain(|(n, _)| n != name);
        checks.push((name.to_owned(), check));
    }

    /// Records that `plugin` (loaded) waits for what `line` says.
    pub fn set_waiting(
        &self,
        plugin: &str,
        line: String,
        loaded: Arc<crate::plugin::LoadedPlugin>,
    ) {
        self.waiting
            .lock()
            .expect("health lock")
            .insert(plugin.to_owned(), (line, loaded));
    }

    /// `plugin` waits no more (active, or its file went away or changed).
    pub fn clear_waiting(&self, plugin: &str) {
        self.waiting.lock().expect("health lock").remove(plugin);
    }

    /// The lines of the plugins that wait, by plugin name.
    pub fn waiting_lines(&self) -> Vec<String> {
        self.waiting
            .lock()
            .expect("health lock")
            .values()
            .map(|(line, _)| line.clone())
            .collect()
    }

    /// The plugins that wait (loaded, not active).
    pub fn waiting_plugins(&self) -> Vec<Arc<crate::plugin::LoadedPlugin>> {
        self.waiting
            .lock()
            .expect("health lock")
            .values()
            .map(|(_, p)| p.clone())
            .collect()
    }

    /// `(status, body)` of `/healthz`.
    pub fn healthz(&self, now: Instant) -> (u16, String) {
        let stuck = self.stuck(now);
        if stuck.is_empty() {
            return (200, "ok\n".to_owned());
        }
        let mut body = String::from("stuck workers:\n");
        for (what, running) in stuck {
            body.push_str(&format!(
                "  {what}: running for {:.0}s\n",
                running.as_secs_f64()
            ));
        }
        (500, body)
    }

    /// `(status, body)` of `/readyz`: one line per check.
    pub fn readyz(&self) -> (u16, String) {
        let checks = self.checks.lock().expect("health lock");
        if checks.is_empty() {
            return (503, "[-] starting\n".to_owned());
        }
        let mut ok = true;
        let mut body = String::new();
        for (name, check) in checks.iter() {
            match check() {
                Ok(()) => body.push_str(&format!("[+] {name} ok\n")),
                Err(why) => {
                    ok = false;
                    body.push_str(&format!("[-] {name}: {why}\n"));
                }
            }
        }
        drop(checks);
        for line in self.waiting_lines() {
            body.push_str(&format!("[!] waiting: {line}\n"));
        }
        (if ok { 200 } else { 503 }, body)
    }
}

/// The process-wide health state.
pub fn global() -> &'static Health {
    static HEALTH: OnceLock<Health> = OnceLock::new();
    HEALTH.get_or_init(Health::default)
}

/// Serves the [`metrics::global`] metrics at `http://addr/metrics`, this
/// module's checks at `/healthz` (also `/livez`) and `/readyz`, and the
/// [`crate::report::shadow`] report at `/shadow`, until the task is dropped. It
/// lives here, above the metrics registry, so that the registry imports
/// neither the checks nor the shadow report.
///
/// # Errors
/// When the address cannot be bound.
pub async fn serve(addr: SocketAddr) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let listener = TcpListener::bind(addr).await?;
    // The bound address: with port 0 the one the OS chose.
    let addr = listener.local_addr()?;
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
                let path = request
                    .strip_prefix("GET ")
                    .and_then(|r| r.split([' ', '?']).next())
                    .unwrap_or("");
                let (code, body) = match path {
                    "/metrics" => (
                        200,
                        metrics::global().render() + &crate::plugin::budget::render(),
                    ),
                    "/healthz" | "/livez" => global().healthz(std::time::Instant::now()),
                    "/readyz" => global().readyz(),
                    "/shadow" => (200, crate::report::shadow::report()),
                    _ => (404, "not found\n".to_string()),
                };
                let status = match code {
                    200 => "200 OK",
                    404 => "404 Not Found",
                    503 => "503 Service Unavailable",
                    _ => "500 Internal Server Error",
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
    fn healthz_fails_only_while_work_runs_past_the_deadline() {
        let h = Health::default();
        h.set_stuck_after(Duration::from_secs(10));
        let start = Instant::now();
        assert_eq!(h.healthz(start).0, 200);
        let guard = h.busy("good/widgets default/alpha");
        let _other = h.busy("good/widgets default/beta");
        assert_eq!(h.healthz(start + Duration::from_secs(5)).0, 200);
        let (code, body) = h.healthz(start + Duration::from_secs(60));
        assert_eq!(code, 500);
        assert!(body.contains("good/widgets default/alpha"), "{body}");
        drop(guard);
        let (_, body) = h.healthz(start + Duration::from_secs(60));
        assert!(!body.contains("alpha"), "{body}");
        assert!(body.contains("beta"), "{body}");
    }

    #[test]
    fn readyz_needs_every_check_to_pass() {
        let h = Health::default();
        assert_eq!(h.readyz().0, 503, "not ready before any check exists");
        let flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let f = flag.clone();
        h.add_ready_check(
            "plugins",
            Box::new(move || {
                if f.load(Ordering::SeqCst) {
                    Ok(())
                } else {
                    Err("scanning".into())
                }
            }),
        );
        h.add_ready_check("caches", Box::new(|| Ok(())));
        let (code, body) = h.readyz();
        assert_eq!(code, 503);
        assert!(body.contains("[-] plugins: scanning"), "{body}");
        assert!(body.contains("[+] caches ok"), "{body}");
        flag.store(true, Ordering::SeqCst);
        assert_eq!(h.readyz().0, 200);
    }

    #[tokio::test]
    async fn serves_metrics_over_http_on_loopback() {
        metrics::global().inc("wasmop_test_served_total", &[]);
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
