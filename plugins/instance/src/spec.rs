//! The FireboltInstance resource as the plugin reads it: serde structs for
//! the parts of the spec the reconcile steps use.
//!
//! The field names are upstream's (`compute.firebolt.io/v1alpha1`), so a
//! manifest written for the upstream operator means the same here. Fields
//! the plugin does not act on yet (most of `auth` and `tls`) are read only
//! as far as the steps need them; unknown fields are ignored, never
//! rejected: the CRD schema is the authority on shape.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use wasmop_sdk::KindRef;
use wasmop_sdk::k8s_openapi::api::core::v1::PodTemplateSpec;
use wasmop_sdk::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// API group of the Firebolt kinds.
pub const GROUP: &str = "compute.firebolt.io";
/// API version of FireboltInstance.
pub const VERSION: &str = "v1alpha1";
/// Kind of the primary.
pub const KIND: &str = "FireboltInstance";
/// Plural resource name.
pub const PLURAL: &str = "fireboltinstances";

/// Default number of gateway pods.
pub const DEFAULT_GATEWAY_REPLICAS: i32 = 2;
/// Default port of Envoy's metrics listener (also the probe port).
pub const DEFAULT_METRICS_PORT: i32 = 9090;
/// Default port of an external PostgreSQL server.
pub const DEFAULT_POSTGRES_PORT: i32 = 5432;

/// The primary kind, for the manifest.
pub fn kind_ref() -> KindRef {
    KindRef::namespaced(GROUP, VERSION, KIND, PLURAL)
}

/// A FireboltInstance.
#[derive(Clone, Debug, Deserialize)]
pub struct FireboltInstance {
    /// Object metadata.
    pub metadata: ObjectMeta,
    /// What the instance should run.
    #[serde(default)]
    pub spec: InstanceSpec,
}

/// `spec` of a FireboltInstance.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceSpec {
    /// The instance ULID; empty until the plugin generated it.
    #[serde(default)]
    pub id: String,
    /// Metadata service and its PostgreSQL.
    #[serde(default)]
    pub metadata: MetadataSpec,
    /// The Envoy gateway.
    #[serde(default)]
    pub gateway: GatewaySpec,
    /// Engine authentication (see [`crate::auth`]).
    #[serde(default)]
    pub auth: AuthSpec,
    /// TLS for engines and the gateway (see [`crate::engine_tls`],
    /// [`crate::gateway_tls`]).
    #[serde(default)]
    pub tls: TlsSpec,
    /// Experimental next-generation metadata configuration.
    #[serde(default, rename = "metadataNG")]
    pub metadata_ng: bool,
    /// How engine metrics are scraped: only `PodIP` is supported (the CRD
    /// refuses `ApiserverProxy`; one stored before is reported).
    #[serde(default)]
    pub metric_scrape_mode: Option<String>,
}

/// `spec.metadata`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MetadataSpec {
    /// Number of metadata pods (the CRD pins it to 1).
    #[serde(default)]
    pub replicas: Option<i32>,
    /// User pod template merged under the operator's container.
    #[serde(default)]
    pub template: Option<PodTemplateSpec>,
    /// External PostgreSQL; `None` means the operator provisions one.
    #[serde(default)]
    pub postgres: Option<ExternalPostgres>,
    /// Register engines in the metadata service.
    #[serde(default)]
    pub engine_registration: bool,
}

impl MetadataSpec {
    /// Number of metadata pods to run.
    pub fn replicas(&self) -> i32 {
        self.replicas.unwrap_or(1)
    }
}

/// `spec.metadata.postgres`: a database the user runs.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExternalPostgres {
    /// Host name or IP.
    pub host: String,
    /// Port.
    #[serde(default = "default_postgres_port")]
    pub port: i32,
    /// Database name.
    pub database: String,
    /// Schema name.
    #[serde(default = "default_schema")]
    pub schema: String,
    /// Secret with the keys `username` and `password`.
    #[serde(default)]
    pub credentials_secret_ref: SecretRef,
}

fn default_postgres_port() -> i32 {
    DEFAULT_POSTGRES_PORT
}

fn default_schema() -> String {
    "public".to_owned()
}

/// A reference to a Secret in the instance's namespace.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct SecretRef {
    /// The Secret's name.
    #[serde(default)]
    pub name: String,
}

/// `spec.gateway`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewaySpec {
    /// Number of gateway pods.
    #[serde(default)]
    pub replicas: Option<i32>,
    /// Port of the metrics listener (also the probe port).
    #[serde(default)]
    pub metrics_port: Option<i32>,
    /// User pod template merged under the operator's `envoy` container.
    #[serde(default)]
    pub template: Option<PodTemplateSpec>,
}

impl GatewaySpec {
    /// Number of gateway pods to run.
    pub fn replicas(&self) -> i32 {
        self.replicas.unwrap_or(DEFAULT_GATEWAY_REPLICAS)
    }

    /// The metrics port, [`DEFAULT_METRICS_PORT`] when unset or zero.
    pub fn metrics_port(&self) -> i32 {
        match self.metrics_port {
            Some(port) if port > 0 => port,
            _ => DEFAULT_METRICS_PORT,
        }
    }
}

/// `spec.auth`: authentication for every engine of the instance.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AuthSpec {
    /// Whether engines authenticate connections.
    #[serde(default)]
    pub enabled: bool,
    /// The embedded (`_local`) authorization server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local: Option<LocalAuth>,
    /// OIDC providers (rendered as given, keys in snake_case).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oidc: Option<Value>,
    /// Default authorization server for clients.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_authorization_server: Option<String>,
}

/// `spec.auth.local`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LocalAuth {
    /// The admin account.
    #[serde(default)]
    pub admin: AdminSpec,
    /// `admin_only` or `any_user`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_login: Option<String>,
    /// JWT signing algorithm (`ES384` by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signing_algorithm: Option<String>,
    /// How the signing keypair is provisioned and rotated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signing_keys: Option<SigningKeysSpec>,
    /// Go durations passed to the engines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_expiry: Option<String>,
    /// See `tokenExpiry`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_token_age: Option<String>,
    /// See `tokenExpiry`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock_skew_tolerance: Option<String>,
}

impl LocalAuth {
    /// The signing algorithm, `ES384` when unset.
    pub fn signing_algorithm(&self) -> &str {
        self.signing_algorithm
            .as_deref()
            .filter(|a| !a.is_empty())
            .unwrap_or("ES384")
    }
}

/// `spec.auth.local.admin`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct AdminSpec {
    /// Admin user name (`firebolt` by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The user's Secret key holding the admin password.
    #[serde(default)]
    pub password: SecretKeyRef,
}

/// A key of a Secret in the instance's namespace.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct SecretKeyRef {
    /// The Secret's name.
    #[serde(default)]
    pub name: String,
    /// The key.
    #[serde(default)]
    pub key: String,
}

/// `spec.auth.local.signingKeys`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SigningKeysSpec {
    /// The Certificate every key is issued through.
    #[serde(default)]
    pub cert_manager: CertManagerSpec,
    /// Mint a new key this often (Go duration); unset: one permanent key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotation_interval: Option<String>,
    /// Keep a demoted key this long after no engine signs with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retain_duration: Option<String>,
}

/// A cert-manager Certificate's issuer and key parameters.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct CertManagerSpec {
    /// The Issuer or ClusterIssuer.
    #[serde(default)]
    pub issuer_ref: IssuerRef,
    /// `ECDSA` (default) or `RSA`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub algorithm: Option<String>,
    /// Key size (default 384).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<i32>,
    /// Certificate lifetime (Go duration).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<String>,
    /// Renew this long before expiry (Go duration).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_before: Option<String>,
}

impl CertManagerSpec {
    /// The key algorithm, `ECDSA` when unset.
    pub fn algorithm(&self) -> &str {
        self.algorithm
            .as_deref()
            .filter(|a| !a.is_empty())
            .unwrap_or("ECDSA")
    }

    /// The key size, 384 when unset or zero.
    pub fn size(&self) -> i32 {
        self.size.filter(|s| *s > 0).unwrap_or(384)
    }
}

/// `issuerRef` of a [`CertManagerSpec`].
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct IssuerRef {
    /// The issuer's name.
    #[serde(default)]
    pub name: String,
    /// `Issuer` or `ClusterIssuer` (default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
}

impl IssuerRef {
    /// The issuer kind, `ClusterIssuer` when unset.
    pub fn kind(&self) -> &str {
        self.kind
            .as_deref()
            .filter(|k| !k.is_empty())
            .unwrap_or("ClusterIssuer")
    }
}

/// `spec.tls`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct TlsSpec {
    /// TLS on engine query listeners.
    #[serde(default)]
    pub engine: TlsListener,
    /// TLS on the gateway's client listener.
    #[serde(default)]
    pub gateway: TlsListener,
}

/// `spec.tls.engine` / `spec.tls.gateway`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct TlsListener {
    /// Whether the listener serves TLS.
    #[serde(default)]
    pub enabled: bool,
    /// Certificate issued by cert-manager.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_manager: Option<CertManagerSpec>,
    /// A Secret the user provides instead (`tls.crt`, `tls.key`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<SecretRef>,
    /// Client CA (`ca.crt`): mutual TLS (gateway only).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "clientCASecretRef"
    )]
    pub client_ca_secret_ref: Option<SecretRef>,
    /// Extra SANs (gateway only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns_names: Option<Vec<String>>,
    /// A revocation list (`crl.pem`) for the peers the gateway verifies on
    /// this listener: engines (engine) or clients (gateway, with
    /// `clientCASecretRef`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crl_secret_ref: Option<SecretRef>,
}

impl TlsListener {
    /// The client CA Secret's name, when mutual TLS is asked for.
    pub fn client_ca(&self) -> Option<&str> {
        self.client_ca_secret_ref
            .as_ref()
            .map(|r| r.name.as_str())
            .filter(|n| !n.is_empty())
    }

    /// The revocation list Secret's name, when one is given.
    pub fn crl(&self) -> Option<&str> {
        self.crl_secret_ref
            .as_ref()
            .map(|r| r.name.as_str())
            .filter(|n| !n.is_empty())
    }

    /// The user's serving Secret's name, when one is given.
    pub fn user_secret(&self) -> Option<&str> {
        self.secret_ref
            .as_ref()
            .map(|r| r.name.as_str())
            .filter(|n| !n.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_upstream_auth_tls_sample_reads_with_defaults() {
        let i: FireboltInstance = serde_json::from_value(json!({
            "metadata": {"name": "firebolt"},
            "spec": {"metadata": {}, "gateway": {},
              "auth": {"enabled": true, "local": {
                "admin": {"password": {"name": "admin", "key": "password"}},
                "signingKeys": {"certManager": {"issuerRef": {"name": "ca"}},
                                "rotationInterval": "720h", "retainDuration": "24h"}}},
              "tls": {"engine": {"enabled": true, "certManager": {"issuerRef": {"name": "ca"}}},
                      "gateway": {"enabled": true, "clientCASecretRef": {"name": "cas"},
                                  "secretRef": {"name": "mine"}}}},
        }))
        .unwrap();
        let local = i.spec.auth.local.unwrap();
        assert_eq!(local.signing_algorithm(), "ES384");
        let keys = local.signing_keys.unwrap();
        assert_eq!(keys.cert_manager.algorithm(), "ECDSA");
        assert_eq!(keys.cert_manager.size(), 384);
        assert_eq!(keys.cert_manager.issuer_ref.kind(), "ClusterIssuer");
        assert_eq!(i.spec.tls.gateway.client_ca(), Some("cas"));
        assert_eq!(i.spec.tls.gateway.user_secret(), Some("mine"));
        assert_eq!(i.spec.tls.engine.user_secret(), None);
    }

    #[test]
    fn an_upstream_minimal_spec_takes_every_default() {
        let i: FireboltInstance = serde_json::from_value(json!({
            "metadata": {"name": "firebolt"},
            "spec": {"metadata": {}, "gateway": {}},
        }))
        .unwrap();
        assert_eq!(i.spec.id, "");
        assert!(i.spec.metadata.postgres.is_none());
        assert_eq!(i.spec.metadata.replicas(), 1);
        assert_eq!(i.spec.gateway.replicas(), 2);
        assert_eq!(i.spec.gateway.metrics_port(), 9090);
        assert!(!i.spec.auth.enabled && !i.spec.tls.engine.enabled && !i.spec.tls.gateway.enabled);
    }

    #[test]
    fn external_postgres_defaults_port_and_schema() {
        let i: FireboltInstance = serde_json::from_value(json!({
            "metadata": {"name": "firebolt"},
            "spec": {"metadata": {"postgres": {"host": "pg", "database": "db",
                                                "credentialsSecretRef": {"name": "creds"}}},
                     "gateway": {"metricsPort": 0}, "metadataNG": true},
        }))
        .unwrap();
        let pg = i.spec.metadata.postgres.unwrap();
        assert_eq!((pg.port, pg.schema.as_str()), (5432, "public"));
        assert_eq!(pg.credentials_secret_ref.name, "creds");
        assert_eq!(
            i.spec.gateway.metrics_port(),
            9090,
            "zero means the default"
        );
        assert!(i.spec.metadata_ng);
    }
}
