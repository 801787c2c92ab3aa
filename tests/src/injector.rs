//! A stand-in for Istio's sidecar injector, so mesh tests run against the
//! real API server without istiod: a mutating admission webhook, served over
//! HTTPS on a loopback port in this process, that adds an `istio-proxy`
//! container to every Pod created in one namespace with the label
//! `sidecar.istio.io/inject: "true"` — as a native sidecar (an init
//! container with `restartPolicy: Always`) when the Pod asks for one with
//! the annotation `sidecar.istio.io/nativeSidecar: "true"`, as an ordinary
//! container otherwise. Its MutatingWebhookConfiguration is deleted by
//! [`Injector::stop`].
//!
//! [`Injector::hold`] keeps the Pods created from then on waiting in
//! admission (up to [`MAX_HOLD`]) until [`Injector::release`], so a test
//! can look at what exists only while a member has no proxy yet.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use base64::Engine;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use kube::Client;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Name of the injected container (Istio's).
pub const PROXY_CONTAINER: &str = "istio-proxy";
/// Largest admission request read.
const MAX_REQUEST: usize = 4 * 1024 * 1024;
/// Longest a held admission waits for [`Injector::release`] (below the
/// webhook's timeout, after which the API server would refuse the Pod).
pub const MAX_HOLD: Duration = Duration::from_secs(25);

/// One running injector.
pub struct Injector {
    client: Client,
    /// Name of its MutatingWebhookConfiguration.
    pub configuration: String,
    injected: Arc<AtomicUsize>,
    /// True while admissions are held.
    held: tokio::sync::watch::Sender<bool>,
    task: tokio::task::AbortHandle,
}

impl std::fmt::Debug for Injector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Injector")
            .field("configuration", &self.configuration)
            .finish_non_exhaustive()
    }
}

impl Injector {
    /// Serves the webhook and registers it for Pods of `namespace`.
    ///
    /// # Errors
    /// When no certificate can be made, no port bound, or the configuration
    /// not created.
    pub async fn start(client: Client, namespace: &str) -> Result<Self> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let material = wasmop::admission::tls::bootstrap(
            &["127.0.0.1".to_owned()],
            Duration::from_secs(3600),
            jiff::Timestamp::now(),
        )?;
        let key = wasmop::admission::tls::certified_key(&material)?;
        let resolver = Arc::new(wasmop::admission::tls::Resolver::default());
        resolver.set(key);
        let mut config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_cert_resolver(resolver);
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let injected = Arc::new(AtomicUsize::new(0));
        let count = injected.clone();
        let (held, gate) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (acceptor, count, gate) = (acceptor.clone(), count.clone(), gate.clone());
                tokio::spawn(async move {
                    if let Ok(tls) = acceptor.accept(stream).await {
                        let _ = serve(tls, &count, gate).await;
                    }
                });
            }
        })
        .abort_handle();

        let configuration = format!("{namespace}-injector");
        let ca = base64::engine::general_purpose::STANDARD.encode(material.ca_crt.as_bytes());
        let webhook: MutatingWebhookConfiguration = serde_json::from_value(json!({
            "metadata": {"name": configuration},
            "webhooks": [{
                "name": "inject.sidecar.test.wasmop.dev",
                "clientConfig": {"url": format!("https://127.0.0.1:{port}/inject"), "caBundle": ca},
                "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                           "resources": ["pods"], "scope": "Namespaced"}],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "objectSelector": {"matchLabels": {"sidecar.istio.io/inject": "true"}},
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                // A Pod that should have a proxy is never created without one.
                "failurePolicy": "Fail",
                "timeoutSeconds": 30,
            }],
        }))?;
        Api::<MutatingWebhookConfiguration>::all(client.clone())
            .create(&PostParams::default(), &webhook)
            .await
            .with_context(|| {
                format!("cannot create MutatingWebhookConfiguration {configuration}")
            })?;
        Ok(Injector {
            client,
            configuration,
            injected,
            held,
            task,
        })
    }

    /// From now on, admissions wait (at most [`MAX_HOLD`] each) until
    /// [`Injector::release`]: the Pods being created stay uncreated.
    pub fn hold(&self) {
        self.held.send_replace(true);
    }

    /// Lets held and later admissions through.
    pub fn release(&self) {
        self.held.send_replace(false);
    }

    /// How many Pods it has given a proxy.
    pub fn injected(&self) -> usize {
        self.injected.load(Ordering::SeqCst)
    }

    /// Deletes the configuration (Pods are created without proxies from
    /// then on) and stops serving.
    ///
    /// # Errors
    /// When the configuration cannot be deleted.
    pub async fn stop(self) -> Result<()> {
        let api = Api::<MutatingWebhookConfiguration>::all(self.client.clone());
        let result = match api
            .delete(&self.configuration, &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            Err(e) => Err(e.into()),
        };
        self.task.abort();
        result
    }
}

/// Answers one HTTP/1.1 request on `stream` and closes it.
async fn serve<S>(
    mut stream: S,
    count: &AtomicUsize,
    mut gate: tokio::sync::watch::Receiver<bool>,
) -> Result<()>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    let (head_end, length) = loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(anyhow!("connection closed before a request"));
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > MAX_REQUEST {
            return Err(anyhow!("request too large"));
        }
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..at]).to_ascii_lowercase();
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            break (at + 4, length);
        }
    };
    while buf.len() < head_end + length {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(anyhow!("connection closed inside the body"));
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > MAX_REQUEST {
            return Err(anyhow!("request too large"));
        }
    }
    let review: Value = serde_json::from_slice(&buf[head_end..head_end + length])?;
    // Held: answer once released or after MAX_HOLD, whichever comes first.
    let _ = tokio::time::timeout(MAX_HOLD, gate.wait_for(|held| !*held)).await;
    let answer = serde_json::to_vec(&admit(&review, count))?;
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        answer.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(&answer).await?;
    stream.shutdown().await?;
    Ok(())
}

/// The AdmissionReview answering `review`: allowed, with a JSON patch
/// adding the proxy.
fn admit(review: &Value, count: &AtomicUsize) -> Value {
    let request = &review["request"];
    let pod = &request["object"];
    let native = pod["metadata"]["annotations"]["sidecar.istio.io/nativeSidecar"] == "true";
    let mut proxy = json!({
        "name": PROXY_CONTAINER,
        "image": "docker.io/istio/proxyv2:1.28.0",
        "args": ["proxy", "sidecar"],
    });
    let patch = if native {
        proxy["restartPolicy"] = json!("Always");
        match pod["spec"]["initContainers"].as_array() {
            Some(_) => json!([{"op": "add", "path": "/spec/initContainers/-", "value": proxy}]),
            None => json!([{"op": "add", "path": "/spec/initContainers", "value": [proxy]}]),
        }
    } else {
        json!([{"op": "add", "path": "/spec/containers/-", "value": proxy}])
    };
    count.fetch_add(1, Ordering::SeqCst);
    let patch = base64::engine::general_purpose::STANDARD.encode(patch.to_string());
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": request["uid"], "allowed": true, "patchType": "JSONPatch", "patch": patch},
    })
}
