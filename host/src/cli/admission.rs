//! The `--admission-*` flags of `wasmop run` (see [`crate::admission`]).

use std::time::Duration;

use clap::Args;

use crate::admission::tls::CertSource;
use crate::admission::{AdmissionConfig, server};
use crate::contract::admission::Endpoint;
use crate::delivery::config::RunError;

/// Admission webhook options. Admission is off unless `--admission-port`
/// is given.
#[derive(Debug, Clone, Args)]
pub struct AdmissionArgs {
    /// Serve validating webhooks for plugins that export `admit`, over
    /// HTTPS on this port (every replica serves).
    #[arg(long, value_name = "PORT")]
    pub admission_port: Option<u16>,
    /// Address to listen on.
    #[arg(long, value_name = "IP", default_value = "0.0.0.0")]
    pub admission_bind: std::net::IpAddr,
    /// The operator's namespace: holds the certificate Secret and is never
    /// admitted [default: `$POD_NAMESPACE`].
    #[arg(long, value_name = "NS")]
    pub admission_namespace: Option<String>,
    /// The Service in front of the operator's Pods, in its namespace: the
    /// webhooks' clientConfig.service (in-cluster deploys).
    #[arg(long, value_name = "NAME", default_value = "wasmop")]
    pub admission_service: String,
    /// The Service's port.
    #[arg(long, value_name = "PORT", default_value_t = 443)]
    pub admission_service_port: u16,
    /// Base URL the API server calls instead of the Service, e.g.
    /// `https://127.0.0.1:9443` when it runs beside the operator.
    #[arg(long, value_name = "URL")]
    pub admission_url: Option<String>,
    /// Name of the ValidatingWebhookConfiguration; one per install (a
    /// configuration another install wrote is never overwritten).
    #[arg(long, value_name = "NAME", default_value = "wasmop-admission")]
    pub admission_webhook_config: String,
    /// `timeoutSeconds` of each webhook (1–30); keep it above the plugins'
    /// call deadline.
    #[arg(long, value_name = "SECONDS", default_value_t = 10,
          value_parser = clap::value_parser!(u8).range(1..=30))]
    pub admission_timeout_secs: u8,
    /// Name of the Secret with `ca.crt`, `tls.crt` and `tls.key`.
    #[arg(long, value_name = "NAME", default_value = "wasmop-admission-tls")]
    pub admission_secret: String,
    /// The Secret is maintained by cert-manager (or by hand): read it,
    /// never create or renew it.
    #[arg(long)]
    pub admission_cert_manager: bool,
    /// Validity of the serving certificate the host issues, in seconds;
    /// it is renewed when a third is left.
    #[arg(long, value_name = "SECONDS", default_value_t = 30 * 24 * 3600)]
    pub admission_cert_validity_secs: u64,
}

impl AdmissionArgs {
    /// The admission configuration, or `None` when admission is off.
    ///
    /// # Errors
    /// [`RunError::Config`] for an unusable combination of flags.
    pub fn config(&self, watched: &[String]) -> Result<Option<AdmissionConfig>, RunError> {
        let Some(port) = self.admission_port else {
            return Ok(None);
        };
        let bad = |reason: String| RunError::Config {
            path: "--admission-port".into(),
            reason,
        };
        let namespace = self
            .admission_namespace
            .clone()
            .or_else(|| std::env::var("POD_NAMESPACE").ok())
            .filter(|n| !n.is_empty())
            .ok_or_else(
                || bad("admission needs --admission-namespace (or POD_NAMESPACE)".into()),
            )?;
        let mut names = vec![
            format!("{}.{namespace}.svc", self.admission_service),
            format!("{}.{namespace}.svc.cluster.local", self.admission_service),
            "localhost".to_owned(),
            "127.0.0.1".to_owned(),
        ];
        let endpoint = match &self.admission_url {
            Some(url) => {
                let host = url
                    .strip_prefix("https://")
                    .ok_or_else(|| bad(format!("--admission-url {url:?} is not an https:// URL")))?
                    .split(['/', '?'])
                    .next()
                    .unwrap_or_default();
                let host = match host.rsplit_once(':') {
                    Some((h, p)) if p.parse::<u16>().is_ok() => h,
                    _ => host,
                };
                let host = host.trim_start_matches('[').trim_end_matches(']');
                if host.is_empty() {
                    return Err(bad(format!("--admission-url {url:?} has no host")));
                }
                if !names.iter().any(|n| n == host) {
                    names.push(host.to_owned());
                }
                Endpoint::Url(url.trim_end_matches('/').to_owned())
            }
            None => Endpoint::Service {
                namespace: namespace.clone(),
                name: self.admission_service.clone(),
                port: self.admission_service_port,
            },
        };
        let validity = Duration::from_secs(self.admission_cert_validity_secs.max(3));
        Ok(Some(AdmissionConfig {
            listen: std::net::SocketAddr::new(self.admission_bind, port),
            namespace: namespace.clone(),
            endpoint,
            only_namespaces: watched.to_vec(),
            configuration_name: self.admission_webhook_config.clone(),
            install: namespace.clone(),
            timeout_seconds: self.admission_timeout_secs,
            cert: CertSource {
                namespace,
                name: self.admission_secret.clone(),
                self_signed: !self.admission_cert_manager,
                names,
                validity,
            },
            cert_check: (validity / 10).clamp(Duration::from_secs(1), Duration::from_secs(60)),
        }))
    }
}

/// Starts admission for `operator` when configured.
///
/// # Errors
/// [`RunError::Config`] when the port cannot be bound.
pub async fn start(
    config: Option<AdmissionConfig>,
    client: kube::Client,
    operator: &std::sync::Arc<crate::controller::Operator>,
) -> Result<Vec<tokio::task::AbortHandle>, RunError> {
    let Some(config) = config else {
        return Ok(Vec::new());
    };
    let op = operator.clone();
    // The active plugins, and those waiting for a CRD (loaded, not active):
    // a waiting plugin's webhooks stay registered (failurePolicy Fail) and
    // its `admit` keeps deciding them, so nothing it would refuse is let in
    // while it waits. A plugin name is served by its active version.
    let plugins: server::Plugins = std::sync::Arc::new(move || {
        let mut plugins = op.loaded_plugins();
        for waiting in crate::report::health::global().waiting_plugins() {
            if !plugins.iter().any(|p| p.name() == waiting.name()) {
                plugins.push(waiting);
            }
        }
        plugins
    });
    crate::admission::start(
        config,
        client,
        operator.cache().clone(),
        plugins,
        crate::admission::WriteFence {
            leader: operator.leader_flag(),
            lease_until: operator.lease_deadline(),
        },
    )
    .await
    .map_err(|e| RunError::Config {
        path: "--admission-port".into(),
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> AdmissionArgs {
        use clap::Parser;
        let argv = ["wasmop", "run", "--plugins", "p"].iter().chain(extra);
        match crate::cli::Cli::try_parse_from(argv).unwrap().command {
            crate::cli::Command::Run(run) => run.admission,
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn admission_is_off_without_a_port() {
        assert!(args(&[]).config(&[]).unwrap().is_none());
    }

    #[test]
    fn a_url_endpoint_adds_its_host_to_the_certificate() {
        let config = args(&[
            "--admission-port",
            "9443",
            "--admission-namespace",
            "ops",
            "--admission-url",
            "https://admission.example:9443/",
        ])
        .config(&["a".into()])
        .unwrap()
        .unwrap();
        assert_eq!(
            config.endpoint,
            Endpoint::Url("https://admission.example:9443".into())
        );
        assert!(config.cert.names.contains(&"admission.example".to_owned()));
        assert!(config.cert.names.contains(&"wasmop.ops.svc".to_owned()));
        assert!(config.cert.self_signed);
        assert_eq!(config.only_namespaces, ["a"]);
        let plain = args(&[
            "--admission-port",
            "9443",
            "--admission-namespace",
            "ops",
            "--admission-url",
            "http://x",
        ])
        .config(&[]);
        assert!(plain.is_err());
    }
}
