//! The HTTPS server: `POST /admit/<plugin>/<rule>` with an AdmissionReview,
//! `GET /healthz` for probes.
//!
//! Every replica serves; nothing here depends on leadership. Each request
//! resolves the rule's reads (cache or API server), calls the plugin on a
//! blocking thread and answers an AdmissionReview. A request the server
//! cannot parse is answered 400; everything else gets a review, denying
//! when anything went wrong.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use kube::Client;
use kube::api::{Api, DynamicObject, ListParams};
use serde_json::Value;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use wasmop_contract::{AdmissionResponse, AdmissionRule};

use super::tls::Resolver;
use crate::contract::selector::LabelSelector;
use crate::controller::{api_resource, kind_key};
use crate::metrics;
use crate::plugin::{AdmitInput, LoadedPlugin};
use crate::reconcile::admission::review::{self, Selection};
use crate::watch::cache::Cache;

/// Largest AdmissionReview accepted.
const MAX_BODY_BYTES: usize = 16 << 20;
/// How long a TLS handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The loaded plugins, asked per request (hot swaps apply at once).
pub type Plugins = Arc<dyn Fn() -> Vec<Arc<LoadedPlugin>> + Send + Sync>;

/// What a request handler needs.
#[derive(Clone)]
pub struct Handler {
    /// The loaded plugins.
    pub plugins: Plugins,
    /// For live reads.
    pub client: Client,
    /// The operator's watch caches, for cached reads.
    pub cache: Arc<Cache>,
}

impl std::fmt::Debug for Handler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handler").finish_non_exhaustive()
    }
}

/// Accepts TLS connections on `listener` until the task is dropped; the
/// open connections end with it.
pub async fn serve(listener: TcpListener, resolver: Arc<Resolver>, handler: Handler) {
    let mut config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = TlsAcceptor::from(Arc::new(config));
    // Owned here, so aborting this task closes every connection too.
    let mut connections = tokio::task::JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(error = %e, "admission server cannot accept a connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let acceptor = acceptor.clone();
        let handler = handler.clone();
        connections.spawn(async move {
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "admission TLS handshake failed");
                    return;
                }
                Err(_) => return,
            };
            let service = service_fn(move |req| {
                let handler = handler.clone();
                async move { Ok::<_, Infallible>(handler.handle(req).await) }
            });
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tls), service)
                .await
            {
                tracing::debug!(%peer, error = %e, "admission connection ended with an error");
            }
        });
    }
}

fn reply(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}

impl Handler {
    async fn handle(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let path = req.uri().path().to_owned();
        if req.method() == Method::GET && path == "/healthz" {
            return reply(StatusCode::OK, "\"ok\"".into());
        }
        let Some((plugin, rule)) = path
            .strip_prefix("/admit/")
            .and_then(|rest| rest.split_once('/'))
            .map(|(p, r)| (p.to_owned(), r.to_owned()))
        else {
            return reply(StatusCode::NOT_FOUND, "\"not found\"".into());
        };
        if req.method() != Method::POST {
            return reply(StatusCode::METHOD_NOT_ALLOWED, "\"POST only\"".into());
        }
        let body = match Limited::new(req.into_body(), MAX_BODY_BYTES)
            .collect()
            .await
        {
            Ok(body) => body.to_bytes(),
            Err(e) => return reply(StatusCode::BAD_REQUEST, format!("{:?}", e.to_string())),
        };
        let review: Value = match serde_json::from_slice(&body) {
            Ok(v) => v,
            Err(e) => {
                return reply(
                    StatusCode::BAD_REQUEST,
                    format!("{:?}", format!("not an AdmissionReview: {e}")),
                );
            }
        };
        let request = review["request"].clone();
        let Some(uid) = request["uid"].as_str().map(str::to_owned) else {
            return reply(
                StatusCode::BAD_REQUEST,
                "\"AdmissionReview without request.uid\"".into(),
            );
        };
        let started = Instant::now();
        let answer = self.decide(&plugin, &rule, request).await;
        let allowed = if answer.allowed { "true" } else { "false" };
        metrics::global().inc(
            "wasmop_admission_requests_total",
            &[("plugin", &plugin), ("rule", &rule), ("allowed", allowed)],
        );
        tracing::info!(plugin = %plugin, rule = %rule, uid = %uid, allowed = answer.allowed, message = answer.message.as_deref().unwrap_or_default(),
            ms = started.elapsed().as_millis() as u64, "admission decided");
        reply(StatusCode::OK, review::review(&uid, &answer).to_string())
    }

    async fn decide(
        &self,
        plugin_name: &str,
        rule_name: &str,
        request: Value,
    ) -> AdmissionResponse {
        let Some(plugin) = (self.plugins)()
            .into_iter()
            .find(|p| p.name() == plugin_name)
        else {
            return AdmissionResponse::deny(format!(
                "no loaded plugin is called {plugin_name}; wasmop denies what no plugin decides"
            ));
        };
        let Some(rule) = review::find_rule(&plugin, rule_name).cloned() else {
            return AdmissionResponse::deny(format!(
                "plugin {plugin_name} has no admission rule {rule_name}; wasmop denies what no \
                 plugin decides"
            ));
        };
        let related = match self.related(&rule, &request).await {
            Ok(related) => related,
            Err(message) => return AdmissionResponse::deny(message),
        };
        let input = AdmitInput {
            rule: rule.name.clone(),
            request,
            related,
            now: jiff::Timestamp::now().to_string(),
        };
        let called = tokio::task::spawn_blocking(move || review::decide(&plugin, &input)).await;
        match called {
            Ok((answer, failure)) => {
                if let Some(reason) = failure {
                    tracing::warn!(
                        plugin = plugin_name,
                        rule = rule_name,
                        reason,
                        "admission call failed; denied"
                    );
                }
                answer
            }
            Err(e) => AdmissionResponse::deny(format!(
                "plugin {plugin_name} could not decide ({e}); wasmop denies what a plugin cannot \
                 decide"
            )),
        }
    }

    /// The objects the rule's reads select: from the watch cache when the
    /// read is not live and the kind is cached whole and synced, else from
    /// the API server. A cache filtered by label (a shard's own primaries
    /// under `--sharding`, or only the objects the host manages) is not
    /// whole: served from it, two replicas could decide the same request
    /// differently.
    async fn related(
        &self,
        rule: &AdmissionRule,
        request: &Value,
    ) -> Result<Vec<(String, Arc<Value>)>, String> {
        let mut out = Vec::new();
        for read in &rule.reads {
            let selection = review::selection(&read.selector, read.kind.namespaced, request);
            let cached = (!read.live)
                .then(|| self.cache.kind(&kind_key(&read.kind)))
                .flatten()
                .filter(|kc| {
                    kc.synced() && !kc.spec().managed_only && kc.spec().selector.is_none()
                });
            let objects: Vec<Arc<Value>> = match (cached, &selection) {
                (_, Selection::Nothing) => Vec::new(),
                (Some(kc), Selection::Get { namespace, name }) => kc
                    .get(namespace.as_deref().unwrap_or_default(), name)
                    .map(|o| Arc::new(o.value()))
                    .into_iter()
                    .collect(),
                (Some(kc), Selection::List { namespace, labels }) => {
                    let selector = match labels {
                        Some(text) => Some(LabelSelector::parse(text).map_err(|e| e.to_string())?),
                        None => None,
                    };
                    kc.list(namespace.as_deref())
                        .into_iter()
                        .filter(|o| selector.as_ref().is_none_or(|s| s.matches(&o.labels())))
                        .map(|o| Arc::new(o.value()))
                        .collect()
                }
                (None, selection) => self
                    .live(&read.kind, selection)
                    .await
                    .map_err(|e| format!("wasmop cannot read {} for admission: {e}", read.kind))?,
            };
            out.extend(objects.into_iter().map(|o| (read.id.clone(), o)));
        }
        Ok(out)
    }

    async fn live(
        &self,
        kind: &wasmop_contract::KindRef,
        selection: &Selection,
    ) -> Result<Vec<Arc<Value>>, kube::Error> {
        let resource = api_resource(kind);
        let api = |namespace: Option<&str>| -> Api<DynamicObject> {
            match namespace {
                Some(ns) if kind.namespaced => {
                    Api::namespaced_with(self.client.clone(), ns, &resource)
                }
                _ => Api::all_with(self.client.clone(), &resource),
            }
        };
        let with_type = |o: DynamicObject| {
            let mut v = serde_json::to_value(o).unwrap_or(Value::Null);
            if v.get("apiVersion").is_none_or(Value::is_null) {
                v["apiVersion"] = Value::String(kind.api_version());
            }
            if v.get("kind").is_none_or(Value::is_null) {
                v["kind"] = Value::String(kind.kind.clone());
            }
            Arc::new(v)
        };
        Ok(match selection {
            Selection::Nothing => Vec::new(),
            Selection::Get { namespace, name } => api(namespace.as_deref())
                .get_opt(name)
                .await?
                .into_iter()
                .map(with_type)
                .collect(),
            Selection::List { namespace, labels } => {
                let mut params = ListParams::default();
                if let Some(labels) = labels {
                    params = params.labels(labels);
                }
                api(namespace.as_deref())
                    .list(&params)
                    .await?
                    .items
                    .into_iter()
                    .map(with_type)
                    .collect()
            }
        })
    }
}
