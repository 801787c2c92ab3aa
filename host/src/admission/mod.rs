//! Admission: validating webhooks served by the host and decided by
//! plugins' optional `admit` export (contract 0.4).
//!
//! ```text
//! API server ──HTTPS──▶ server ──reads (cache | live)──▶ plugin.admit ──▶ AdmissionReview
//! loaded manifests ──▶ sync (leader) ──▶ ValidatingWebhookConfiguration (caBundle from tls)
//! ```
//!
//! - [`rules`]: load-time checks of a manifest's `admission` rules and the
//!   webhook configuration they become.
//! - [`review`]: one review, request to response; shared with `wasmop plan`.
//! - [`offline`]: deciding an AdmissionReview fixture without a cluster.
//! - [`tls`]: the CA and serving certificate Secret, rotation.
//! - [`server`]: the rustls HTTPS server every replica runs.
//!
//! # Guarantees
//! - Every replica serves admission; only the leader writes the webhook
//!   configuration (with `--sharding` too: the holder of the leader
//!   Lease, not every shard). Any replica may create or renew the
//!   certificate Secret, with preconditions.
//! - Every replica decides a request alike: a rule's cached read is served
//!   from a watch cache only when that cache holds the whole kind; one
//!   filtered by label (a shard's own primaries, or only the objects the
//!   host manages) is read from the API server instead.
//! - Webhooks are `failurePolicy: Fail`, `sideEffects: None`,
//!   `matchPolicy: Equivalent`, and skip the operator's own namespace; when
//!   the operator watches only some namespaces, only those are admitted.
//! - The configuration follows the loaded plugins: a hot swap that adds,
//!   changes or drops a rule (or the whole `admit` export) is reflected
//!   within [`SYNC_INTERVAL`].

pub mod offline;
pub mod review;
pub mod rules;
pub mod server;
pub mod tls;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use wasmop_contract::AdmissionRule;

use self::rules::{Endpoint, WebhookSettings};
use self::server::{Handler, Plugins};
use self::tls::{CertSource, Resolver};
use crate::watch::cache::Cache;

/// How often the webhook configuration is compared with the loaded plugins.
pub const SYNC_INTERVAL: Duration = Duration::from_millis(500);
/// How often the configuration is re-applied even when nothing changed
/// (repairs an edit or deletion by someone else).
const REFRESH_INTERVAL: Duration = Duration::from_secs(30);
/// Field manager of the configuration.
const FIELD_MANAGER: &str = "wasmop-admission";

/// Everything `wasmop run --admission-port` configures.
#[derive(Clone, Debug)]
pub struct AdmissionConfig {
    /// Address the HTTPS server listens on.
    pub listen: std::net::SocketAddr,
    /// The operator's namespace: holds the certificate Secret and is never
    /// admitted.
    pub namespace: String,
    /// How the API server reaches the server.
    pub endpoint: Endpoint,
    /// Namespaces the webhooks apply to; empty: all but `namespace`.
    pub only_namespaces: Vec<String>,
    /// Name of the ValidatingWebhookConfiguration.
    pub configuration_name: String,
    /// `timeoutSeconds` of each webhook.
    pub timeout_seconds: u8,
    /// Certificate Secret and how it is maintained.
    pub cert: CertSource,
    /// How often the Secret is re-read (rotation).
    pub cert_check: Duration,
}

/// Why admission could not start.
#[derive(Debug, thiserror::Error)]
pub enum AdmissionError {
    /// The port could not be bound.
    #[error("cannot listen for admission on {addr}: {source}")]
    Listen {
        /// The address.
        addr: std::net::SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
}

/// The webhook rules of the loaded plugins that export `admit`, sorted by
/// plugin and rule.
pub fn loaded_rules(plugins: &[Arc<crate::plugin::LoadedPlugin>]) -> Vec<(String, AdmissionRule)> {
    let mut out: Vec<(String, AdmissionRule)> = plugins
        .iter()
        .filter(|p| p.admits())
        .flat_map(|p| {
            p.manifest()
                .admission
                .iter()
                .map(|r| (p.name().to_owned(), r.clone()))
                .collect::<Vec<_>>()
        })
        .collect();
    out.sort_by(|a, b| (&a.0, &a.1.name).cmp(&(&b.0, &b.1.name)));
    out
}

/// Starts the server, the certificate refresh and the configuration sync.
/// Returns once the port is bound; the tasks run until aborted.
///
/// # Errors
/// [`AdmissionError::Listen`] when the port cannot be bound.
pub async fn start(
    config: AdmissionConfig,
    client: Client,
    cache: Arc<Cache>,
    plugins: Plugins,
    leader: Arc<AtomicBool>,
) -> Result<Vec<tokio::task::AbortHandle>, AdmissionError> {
    let listener =
        TcpListener::bind(config.listen)
            .await
            .map_err(|source| AdmissionError::Listen {
                addr: config.listen,
                source,
            })?;
    Ok(start_on(listener, config, client, cache, plugins, leader))
}

/// As [`start`], on a listener already bound (`config.listen` unused).
pub fn start_on(
    listener: TcpListener,
    config: AdmissionConfig,
    client: Client,
    cache: Arc<Cache>,
    plugins: Plugins,
    leader: Arc<AtomicBool>,
) -> Vec<tokio::task::AbortHandle> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    tracing::info!(addr = ?listener.local_addr().ok(), endpoint = ?config.endpoint, "admission server listening");
    let resolver = Arc::new(Resolver::default());
    let (ca_tx, ca_rx) = tokio::sync::watch::channel(String::new());
    let handler = Handler {
        plugins: plugins.clone(),
        client: client.clone(),
        cache,
    };
    let server = tokio::spawn(server::serve(listener, resolver.clone(), handler));
    let certs = tokio::spawn(refresh_certificate(
        Api::namespaced(client.clone(), &config.namespace),
        config.cert.clone(),
        config.cert_check,
        resolver,
        ca_tx,
    ));
    let settings = WebhookSettings {
        configuration_name: config.configuration_name.clone(),
        endpoint: config.endpoint.clone(),
        exclude_namespace: Some(config.namespace.clone()),
        timeout_seconds: config.timeout_seconds,
    };
    let sync = tokio::spawn(sync_configuration(
        Api::all(client),
        settings,
        config.only_namespaces.clone(),
        plugins,
        leader,
        ca_rx,
    ));
    vec![
        server.abort_handle(),
        certs.abort_handle(),
        sync.abort_handle(),
    ]
}

/// Keeps the resolver and the CA bundle in step with the Secret.
async fn refresh_certificate(
    api: Api<Secret>,
    source: CertSource,
    every: Duration,
    resolver: Arc<Resolver>,
    ca: tokio::sync::watch::Sender<String>,
) {
    let mut serving: Option<tls::Material> = None;
    loop {
        match tls::ensure(&api, &source).await {
            Ok(material) if serving.as_ref() != Some(&material) => {
                match tls::certified_key(&material) {
                    Ok(key) => {
                        resolver.set(key);
                        tracing::info!(secret = %source.name, not_after = ?material.not_after, "admission serving certificate loaded");
                        ca.send_replace(material.ca_crt.clone());
                        serving = Some(material);
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "admission certificate unusable; keeping the previous one")
                    }
                }
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "admission certificate not refreshed"),
        }
        // Until a certificate is served, try again soon.
        let wait = if resolver.ready() {
            every
        } else {
            every.min(Duration::from_secs(1))
        };
        tokio::time::sleep(wait).await;
    }
}

/// The configuration with `only_namespaces` applied.
fn desired(
    settings: &WebhookSettings,
    only_namespaces: &[String],
    rules: &[(String, AdmissionRule)],
    ca: &str,
) -> Value {
    let mut config = rules::configuration(settings, rules, ca);
    if !only_namespaces.is_empty()
        && let Some(hooks) = config["webhooks"].as_array_mut()
    {
        for hook in hooks {
            hook["namespaceSelector"] = json!({"matchExpressions": [{
                "key": "kubernetes.io/metadata.name",
                "operator": "In",
                "values": only_namespaces,
            }]});
        }
    }
    config
}

/// Applies the configuration the loaded plugins call for, while leader.
async fn sync_configuration(
    api: Api<ValidatingWebhookConfiguration>,
    settings: WebhookSettings,
    only_namespaces: Vec<String>,
    plugins: Plugins,
    leader: Arc<AtomicBool>,
    mut ca: tokio::sync::watch::Receiver<String>,
) {
    let mut applied: Option<(Value, Instant)> = None;
    loop {
        let bundle = ca.borrow_and_update().clone();
        if leader.load(Ordering::SeqCst) && !bundle.is_empty() {
            let rules = loaded_rules(&plugins());
            let want = desired(&settings, &only_namespaces, &rules, &bundle);
            let stale = applied
                .as_ref()
                .is_none_or(|(had, at)| *had != want || at.elapsed() >= REFRESH_INTERVAL);
            if stale {
                let params = PatchParams::apply(FIELD_MANAGER).force();
                match api
                    .patch(&settings.configuration_name, &params, &Patch::Apply(&want))
                    .await
                {
                    Ok(_) => {
                        if applied.as_ref().is_none_or(|(had, _)| *had != want) {
                            tracing::info!(configuration = %settings.configuration_name,
                                webhooks = rules.len(), "admission webhook configuration applied");
                        }
                        applied = Some((want, Instant::now()));
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot apply the admission webhook configuration")
                    }
                }
            }
        } else if !leader.load(Ordering::SeqCst) {
            // A follower forgets what it applied: when it becomes the
            // leader it applies its view at once.
            applied = None;
        }
        tokio::select! {
            _ = tokio::time::sleep(SYNC_INTERVAL) => {}
            changed = ca.changed() => if changed.is_err() {
                // The certificate task is gone: admission is shutting down.
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watched_namespaces_narrow_the_namespace_selector() {
        let settings = WebhookSettings {
            configuration_name: "c".into(),
            endpoint: Endpoint::Url("https://127.0.0.1:1".into()),
            exclude_namespace: Some("ops".into()),
            timeout_seconds: 5,
        };
        let rules = vec![(
            "p".to_owned(),
            AdmissionRule::new(
                "r",
                wasmop_contract::KindRef::namespaced("g", "v1", "K", "ks"),
            )
            .operation(wasmop_contract::AdmissionOperation::Create),
        )];
        let all = desired(&settings, &[], &rules, "ca");
        assert_eq!(
            all["webhooks"][0]["namespaceSelector"]["matchExpressions"][0]["operator"],
            "NotIn"
        );
        let some = desired(&settings, &["a".into()], &rules, "ca");
        assert_eq!(
            some["webhooks"][0]["namespaceSelector"]["matchExpressions"][0],
            json!({"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["a"]})
        );
    }
}
