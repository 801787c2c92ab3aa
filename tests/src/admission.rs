//! Admission servers for tests: the host's real HTTPS admission server,
//! in this process, on a loopback port the local API server calls
//! (`clientConfig.url`), with its ValidatingWebhookConfiguration deleted
//! when the test is done.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::Result;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kube::Client;
use kube::api::{Api, DeleteParams};
use tokio::net::TcpListener;
use wasmop::admission::rules::Endpoint;
use wasmop::admission::server::Plugins;
use wasmop::admission::tls::CertSource;
use wasmop::admission::{AdmissionConfig, WriteFence, start_on};
use wasmop::controller::Operator;

/// One running admission server.
pub struct Admission {
    /// The port it listens on (127.0.0.1).
    pub port: u16,
    /// Name of its webhook configuration.
    pub configuration: String,
    /// Name of its certificate Secret (in the operator namespace).
    pub secret: String,
    tasks: Vec<tokio::task::AbortHandle>,
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admission")
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

/// How to start one.
#[derive(Clone, Debug)]
pub struct AdmissionOptions {
    /// Namespace of the Secret (the "operator's" namespace).
    pub operator_namespace: String,
    /// Namespaces admitted.
    pub watched: Vec<String>,
    /// Name of the configuration (unique per test).
    pub configuration: String,
    /// The URL the configuration names; `None`: this server's own.
    pub url: Option<String>,
    /// Validity of the serving certificate.
    pub cert_validity: Duration,
}

impl Admission {
    /// Starts admission for `operator`'s loaded plugins, writing the
    /// configuration while `leader` is set, within `operator`'s Lease term.
    ///
    /// # Errors
    /// When no loopback port can be bound.
    pub async fn start(
        client: Client,
        operator: &Arc<Operator>,
        leader: Arc<AtomicBool>,
        options: AdmissionOptions,
    ) -> Result<Self> {
        let lease_until = operator.lease_deadline();
        Self::start_in_term(client, operator, leader, lease_until, options).await
    }

    /// As [`Admission::start`], writing the configuration while `leader`
    /// is set and `lease_until` has not passed (the Lease term). Its
    /// install is named after `options.operator_namespace`.
    ///
    /// # Errors
    /// When no loopback port can be bound.
    pub async fn start_in_term(
        client: Client,
        operator: &Arc<Operator>,
        leader: Arc<AtomicBool>,
        lease_until: wasmop::controller::leader::LeaseDeadline,
        options: AdmissionOptions,
    ) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let secret = format!("{}-tls", options.configuration);
        let config = AdmissionConfig {
            listen: listener.local_addr()?,
            namespace: options.operator_namespace.clone(),
            endpoint: Endpoint::Url(
                options
                    .url
                    .unwrap_or_else(|| format!("https://127.0.0.1:{port}")),
            ),
            only_namespaces: options.watched,
            configuration_name: options.configuration.clone(),
            install: format!("{}/wasmop-leader", options.operator_namespace),
            timeout_seconds: 10,
            cert: CertSource {
                namespace: options.operator_namespace,
                name: secret.clone(),
                self_signed: true,
                names: vec!["localhost".into(), "127.0.0.1".into()],
                validity: options.cert_validity,
            },
            cert_check: (options.cert_validity / 10)
                .clamp(Duration::from_millis(200), Duration::from_secs(60)),
        };
        let op = operator.clone();
        let plugins: Plugins = Arc::new(move || op.loaded_plugins());
        let tasks = start_on(
            listener,
            config,
            client,
            operator.cache().clone(),
            plugins,
            WriteFence {
                leader,
                lease_until,
            },
        );
        Ok(Self {
            port,
            configuration: options.configuration,
            secret,
            tasks,
        })
    }

    /// Stops serving (the port closes, open connections end); the
    /// configuration stays, as when the operator process stops.
    pub fn stop(&mut self) {
        for t in self.tasks.drain(..) {
            t.abort();
        }
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Deletes a webhook configuration (test cleanup).
///
/// # Errors
/// When the API refuses for another reason than absence.
pub async fn delete_configuration(client: &Client, name: &str) -> Result<()> {
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}
