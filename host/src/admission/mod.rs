//! Admission: validating webhooks served by the host and decided by
//! plugins' optional `admit` export (contract 0.4).
//!
//! ```text
//! API server ──HTTPS──▶ server ──reads (cache | live)──▶ plugin.admit ──▶ AdmissionReview
//! loaded manifests ──▶ sync (leader) ──▶ ValidatingWebhookConfiguration (caBundle from tls)
//! ```
//!
//! - [`tls`]: the CA and serving certificate Secret, rotation.
//! - [`server`]: the rustls HTTPS server every replica runs.
//!
//! What is decided lives below the server, in lower layers, and is
//! re-exported here: [`rules`] (`contract/admission.rs`: load-time checks
//! of a manifest's `admission` rules and the webhook configuration they
//! become), [`review`] (`reconcile/admission/review.rs`: one review,
//! request to response; shared with `wasmop plan`) and [`offline`]
//! (`reconcile/admission/offline.rs`: deciding an AdmissionReview fixture
//! without a cluster).
//!
//! # Guarantees
//! - Every replica serves admission; only the leader writes the webhook
//!   configuration (with `--sharding` too: the holder of the leader
//!   Lease, not every shard), and only within its Lease term, checked
//!   right before each write as every write of a plan is (the flag and the
//!   term's deadline on the local clock). Any replica may create or renew
//!   the certificate Secret, with preconditions.
//! - The configuration names the install that wrote it (annotation
//!   [`INSTALL_ANNOTATION`]: the operator's namespace and Lease name). An
//!   install never writes a configuration of that name that another
//!   install wrote, nor one that no wasmop install wrote: it reads the
//!   configuration first and writes only at the resourceVersion it read
//!   (or only if it is still absent), so two installs given one name
//!   cannot overwrite each other; the refused one logs an error and
//!   counts `wasmop_admission_configuration_refused_total`. A
//!   configuration an older wasmop wrote (field manager
//!   `wasmop-admission`, no annotation) is taken over.
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
pub use crate::contract::admission as rules;
pub use crate::reconcile::admission::{offline, review};
use crate::watch::cache::Cache;

/// How often the webhook configuration is compared with the loaded plugins.
pub const SYNC_INTERVAL: Duration = Duration::from_millis(500);
/// How often the configuration is re-applied even when nothing changed
/// (repairs an edit or deletion by someone else).
const REFRESH_INTERVAL: Duration = Duration::from_secs(30);
/// Field manager of the configuration.
const FIELD_MANAGER: &str = "wasmop-admission";
/// Annotation of the configuration naming the install that writes it.
pub const INSTALL_ANNOTATION: &str = "wasmop.dev/install";
/// A resourceVersion no object reaches: an apply carrying it creates an
/// absent object and conflicts with any existing one.
const ABSENT_VERSION: &str = "18446744073709551615";

/// When this replica may write the configuration: the leader flag and the
/// end of its Lease term (see `crate::lease::leader::may_write`).
#[derive(Clone, Debug)]
pub struct WriteFence {
    /// True while this replica leads.
    pub leader: Arc<AtomicBool>,
    /// The end of the Lease term on the local clock.
    pub lease_until: crate::lease::leader::LeaseDeadline,
}

impl WriteFence {
    /// True while writes are allowed.
    pub fn may_write(&self) -> bool {
        crate::lease::leader::may_write(&self.leader, &self.lease_until)
    }
}

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
    /// Who this install is (`<namespace>/<Lease name>`), written on the
    /// configuration ([`INSTALL_ANNOTATION`]).
    pub install: String,
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
    fence: WriteFence,
) -> Result<Vec<tokio::task::AbortHandle>, AdmissionError> {
    let listener =
        TcpListener::bind(config.listen)
            .await
            .map_err(|source| AdmissionError::Listen {
                addr: config.listen,
                source,
            })?;
    Ok(start_on(listener, config, client, cache, plugins, fence))
}

/// As [`start`], on a listener already bound (`config.listen` unused).
pub fn start_on(
    listener: TcpListener,
    config: AdmissionConfig,
    client: Client,
    cache: Arc<Cache>,
    plugins: Plugins,
    fence: WriteFence,
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
        config.install.clone(),
        plugins,
        fence,
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

/// Why the configuration was not written.
#[derive(Debug)]
enum NotWritten {
    /// Another install's (or no wasmop install's): never written.
    Refused(String),
    /// The term ended before the write.
    NotInTerm,
    /// The read or the write failed (a conflict included): tried again.
    Failed(kube::Error),
}

/// Who wrote `existing`, as far as this install is concerned: `Ok` when
/// this install may write it (its own, or an older wasmop's without the
/// annotation), `Err` naming the writer otherwise.
fn writable_by(existing: &ValidatingWebhookConfiguration, install: &str) -> Result<(), String> {
    let meta = &existing.metadata;
    match meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(INSTALL_ANNOTATION))
    {
        Some(owner) if owner == install => Ok(()),
        Some(owner) => Err(format!("the wasmop install {owner}")),
        None if meta
            .managed_fields
            .iter()
            .flatten()
            .any(|m| m.manager.as_deref() == Some(FIELD_MANAGER)) =>
        {
            Ok(())
        }
        None => Err("something other than wasmop".to_owned()),
    }
}

/// `want` marked as this install's, at the resourceVersion the
/// configuration was read at (or [`ABSENT_VERSION`]).
fn fenced_configuration(want: &Value, install: &str, resource_version: &str) -> Value {
    let mut body = want.clone();
    body["metadata"]["annotations"][INSTALL_ANNOTATION] = json!(install);
    body["metadata"]["resourceVersion"] = json!(resource_version);
    body
}

/// Reads the configuration, then applies `want` at the version read, if
/// it is this install's to write and the term still runs.
async fn write_configuration(
    api: &Api<ValidatingWebhookConfiguration>,
    name: &str,
    install: &str,
    want: &Value,
    fence: &WriteFence,
) -> Result<(), NotWritten> {
    let resource_version = match api.get_opt(name).await.map_err(NotWritten::Failed)? {
        Some(existing) => {
            writable_by(&existing, install).map_err(NotWritten::Refused)?;
            existing.metadata.resource_version.unwrap_or_default()
        }
        None => ABSENT_VERSION.to_owned(),
    };
    if !fence.may_write() {
        return Err(NotWritten::NotInTerm);
    }
    let body = fenced_configuration(want, install, &resource_version);
    let params = PatchParams::apply(FIELD_MANAGER).force();
    api.patch(name, &params, &Patch::Apply(&body))
        .await
        .map(|_| ())
        .map_err(NotWritten::Failed)
}

/// Applies the configuration the loaded plugins call for, while this
/// replica leads and within its term.
async fn sync_configuration(
    api: Api<ValidatingWebhookConfiguration>,
    settings: WebhookSettings,
    only_namespaces: Vec<String>,
    install: String,
    plugins: Plugins,
    fence: WriteFence,
    mut ca: tokio::sync::watch::Receiver<String>,
) {
    let mut applied: Option<(Value, Instant)> = None;
    let name = settings.configuration_name.clone();
    let leader = fence.leader.clone();
    loop {
        let bundle = ca.borrow_and_update().clone();
        let in_term = fence.may_write();
        if !in_term && leader.load(Ordering::SeqCst) && !bundle.is_empty() {
            // Leading by the flag, but the term's deadline has passed (the
            // election loop is late renewing it): nothing is written.
            crate::metrics::global().inc(
                "wasmop_admission_configuration_outside_term_total",
                &[("configuration", &name)],
            );
        }
        if in_term && !bundle.is_empty() {
            let rules = loaded_rules(&plugins());
            let want = desired(&settings, &only_namespaces, &rules, &bundle);
            let stale = applied
                .as_ref()
                .is_none_or(|(had, at)| *had != want || at.elapsed() >= REFRESH_INTERVAL);
            if stale {
                match write_configuration(&api, &name, &install, &want, &fence).await {
                    Ok(()) => {
                        if applied.as_ref().is_none_or(|(had, _)| *had != want) {
                            tracing::info!(configuration = %name, install = %install,
                                webhooks = rules.len(), "admission webhook configuration applied");
                        }
                        applied = Some((want, Instant::now()));
                    }
                    Err(NotWritten::Refused(owner)) => {
                        crate::metrics::global().inc(
                            "wasmop_admission_configuration_refused_total",
                            &[("configuration", &name)],
                        );
                        tracing::error!(configuration = %name, install = %install, written_by = %owner,
                            "the admission webhook configuration of this name belongs to {owner}; \
                             not writing it (give this install its own --admission-webhook-config)");
                    }
                    Err(NotWritten::NotInTerm) => {}
                    Err(NotWritten::Failed(e)) => {
                        tracing::warn!(error = %e, "cannot apply the admission webhook configuration")
                    }
                }
            }
        } else if !in_term {
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
    fn a_configuration_is_written_only_by_its_own_install_at_the_version_read() {
        let config = |annotation: Option<&str>, manager: Option<&str>| {
            let mut c = ValidatingWebhookConfiguration::default();
            if let Some(a) = annotation {
                c.metadata.annotations =
                    Some([(INSTALL_ANNOTATION.to_owned(), a.to_owned())].into());
            }
            if let Some(m) = manager {
                c.metadata.managed_fields = Some(vec![
                    k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry {
                        manager: Some(m.to_owned()),
                        ..Default::default()
                    },
                ]);
            }
            c
        };
        assert!(writable_by(&config(Some("ops/l"), None), "ops/l").is_ok());
        assert!(writable_by(&config(Some("other/l"), None), "ops/l").is_err());
        assert!(writable_by(&config(None, Some(FIELD_MANAGER)), "ops/l").is_ok());
        assert!(writable_by(&config(None, Some("kubectl")), "ops/l").is_err());
        let body = fenced_configuration(&json!({"metadata": {"name": "c"}}), "ops/l", "7");
        assert_eq!(body["metadata"]["annotations"][INSTALL_ANNOTATION], "ops/l");
        assert_eq!(body["metadata"]["resourceVersion"], "7");
    }

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
