//! The FireboltInstance resource as the plugin reads it: serde structs for
//! the parts of the spec the reconcile steps use.
//!
//! The field names are upstream's (`compute.firebolt.io/v1alpha1`), so a
//! manifest written for the upstream operator means the same here. Fields
//! the plugin does not act on yet (most of `auth` and `tls`) are read only
//! as far as the steps need them; unknown fields are ignored, never
//! rejected: the CRD schema is the authority on shape.

use serde::Deserialize;
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
    /// Engine authentication (not provisioned yet; see `security`).
    #[serde(default)]
    pub auth: Toggle,
    /// TLS for engines and the gateway (not provisioned yet).
    #[serde(default)]
    pub tls: TlsSpec,
    /// Experimental next-generation metadata configuration.
    #[serde(default, rename = "metadataNG")]
    pub metadata_ng: bool,
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
#[derive(Clone, Debug, Default, Deserialize)]
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

/// Anything with an `enabled` switch (`spec.auth`, `spec.tls.engine`, …).
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Toggle {
    /// Whether the feature is requested.
    #[serde(default)]
    pub enabled: bool,
}

/// `spec.tls`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct TlsSpec {
    /// TLS on engine query listeners.
    #[serde(default)]
    pub engine: Toggle,
    /// TLS on the gateway's client listener.
    #[serde(default)]
    pub gateway: Toggle,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
