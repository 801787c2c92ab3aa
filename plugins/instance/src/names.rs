//! Names, labels and endpoints generated for an instance `<i>`, as upstream
//! generates them:
//!
//! | component | objects |
//! | --- | --- |
//! | postgres | Secret `<i>-metadata-postgres-creds`, StatefulSet and headless Service `<i>-metadata-pg` |
//! | metadata | ConfigMap `<i>-metadata-config`, Deployment and Service `<i>-metadata` |
//! | gateway | ConfigMap `<i>-gateway-config`, Deployment, Service and PodDisruptionBudget `<i>-gateway` |
//!
//! Every object carries the labels `firebolt.io/instance=<i>` and
//! `firebolt.io/component=<component>`; the workloads select their pods by
//! both.

use std::collections::BTreeMap;

/// Label naming the instance an object belongs to.
pub const INSTANCE_LABEL: &str = "firebolt.io/instance";
/// Label naming the component an object belongs to.
pub const COMPONENT_LABEL: &str = "firebolt.io/component";
/// Label engines put on their per-generation TLS Secrets (with
/// `firebolt.io/component=engine-tls` and the instance label).
pub const ENGINE_LABEL: &str = "firebolt.io/engine";
/// Gateway pod-template annotation: what the client listener serves
/// (`plaintext`, `closed`, `tls`, `mtls`).
pub const CLIENT_LISTENER_ANNOTATION: &str = "firebolt.io/client-listener";
/// Gateway pod-template and bundle annotation: fingerprints of the engine
/// CAs the gateway trusts, comma-separated.
pub const ENGINE_TRUST_CAS_ANNOTATION: &str = "firebolt.io/engine-trust-cas";
/// Pod-template annotation holding the hash of the component's inputs.
pub const CONFIG_HASH_ANNOTATION: &str = "firebolt.io/config-hash";

/// Longest instance name: `<i>-metadata-pg` and the labels its pods get
/// (`controller-revision-hash: <i>-metadata-pg-<10 chars>`) must stay
/// within 63 characters. The CRD enforces the same limit.
pub const MAX_INSTANCE_NAME: usize = 40;

/// Port of the metadata service (gRPC).
pub const METADATA_PORT: i32 = 7000;
/// Port of the PostgreSQL server.
pub const POSTGRES_PORT: i32 = 5432;
/// Port of the gateway's client listener in the pod.
pub const GATEWAY_LISTEN_PORT: i32 = 8080;
/// Port of the gateway Service.
pub const GATEWAY_SERVICE_PORT: i32 = 80;
/// Port of an engine's query listener (on the engine's `<e>-service`).
pub const ENGINE_QUERY_PORT: i32 = 3473;

/// A part of the instance that owns objects, named by the
/// `firebolt.io/component` label of those objects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Component {
    /// The provisioned PostgreSQL.
    Postgres,
    /// The metadata service.
    Metadata,
    /// The Envoy gateway.
    Gateway,
    /// JWT signing keys (Certificates and Secrets).
    AuthSigning,
    /// The engine TLS anchor Certificate and Secret.
    EngineTls,
    /// The gateway's engine trust bundle.
    EngineCaBundle,
    /// The gateway's serving Certificate and Secret.
    GatewayTls,
}

impl Component {
    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            Component::Postgres => "postgres",
            Component::Metadata => "metadata",
            Component::Gateway => "gateway",
            Component::AuthSigning => "auth-signing",
            Component::EngineTls => "engine-tls",
            Component::EngineCaBundle => "engine-ca-bundle",
            Component::GatewayTls => "gateway-tls",
        }
    }
}

/// The generated names of one instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Names {
    instance: String,
    namespace: String,
    cluster_domain: String,
}

impl Names {
    /// Names for instance `instance` in `namespace`, with endpoints under
    /// `cluster_domain`.
    ///
    /// # Errors
    ///
    /// A message when the instance name is longer than
    /// [`MAX_INSTANCE_NAME`].
    pub fn new(instance: &str, namespace: &str, cluster_domain: &str) -> Result<Self, String> {
        if instance.len() > MAX_INSTANCE_NAME {
            return Err(format!(
                "instance name {instance:?} is longer than {MAX_INSTANCE_NAME} characters; \
                 the names generated from it would not be valid"
            ));
        }
        Ok(Names {
            instance: instance.to_owned(),
            namespace: namespace.to_owned(),
            cluster_domain: cluster_domain.to_owned(),
        })
    }

    /// The instance's name.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// The instance's namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Secret with the provisioned PostgreSQL's credentials.
    pub fn postgres_secret(&self) -> String {
        format!("{}-metadata-postgres-creds", self.instance)
    }

    /// StatefulSet and headless Service of the provisioned PostgreSQL.
    pub fn postgres(&self) -> String {
        format!("{}-metadata-pg", self.instance)
    }

    /// ConfigMap of the metadata service.
    pub fn metadata_config(&self) -> String {
        format!("{}-metadata-config", self.instance)
    }

    /// Deployment and Service of the metadata service.
    pub fn metadata(&self) -> String {
        format!("{}-metadata", self.instance)
    }

    /// ConfigMap of the gateway.
    pub fn gateway_config(&self) -> String {
        format!("{}-gateway-config", self.instance)
    }

    /// Deployment, Service and PodDisruptionBudget of the gateway.
    pub fn gateway(&self) -> String {
        format!("{}-gateway", self.instance)
    }

    /// Certificate and Secret of signing key number `n` (kid `signing-<n>`).
    pub fn auth_signing(&self, n: u64) -> String {
        format!("{}-auth-signing-{n}", self.instance)
    }

    /// Certificate and Secret of the engine TLS anchor.
    pub fn engine_tls(&self) -> String {
        format!("{}-engine-tls", self.instance)
    }

    /// Secret with the gateway's engine trust bundle.
    pub fn engine_ca_bundle(&self) -> String {
        format!("{}-engine-ca-bundle", self.instance)
    }

    /// Certificate and Secret of the gateway's client listener.
    pub fn gateway_tls(&self) -> String {
        format!("{}-gateway-tls", self.instance)
    }

    /// DNS names of the gateway Service, short to fully qualified.
    pub fn gateway_dns_names(&self) -> Vec<String> {
        let g = self.gateway();
        vec![
            g.clone(),
            format!("{g}.{}", self.namespace),
            format!("{g}.{}.svc", self.namespace),
            self.gateway_endpoint(),
        ]
    }

    /// Fully qualified DNS name of a Service in the instance's namespace.
    pub fn service_host(&self, service: &str) -> String {
        format!("{service}.{}.svc.{}", self.namespace, self.cluster_domain)
    }

    /// `host:port` of the metadata service, as engines use it.
    pub fn metadata_endpoint(&self) -> String {
        format!("{}:{METADATA_PORT}", self.service_host(&self.metadata()))
    }

    /// Host name of the gateway Service.
    pub fn gateway_endpoint(&self) -> String {
        self.service_host(&self.gateway())
    }

    /// What follows an engine's name in the `host:port` of its query
    /// Service (`<e>-service`, port 3473).
    pub fn engine_authority_suffix(&self) -> String {
        format!(
            "-service.{}.svc.{}:{ENGINE_QUERY_PORT}",
            self.namespace, self.cluster_domain
        )
    }

    /// Labels of a component's objects and pods (also their selector).
    pub fn labels(&self, component: Component) -> BTreeMap<String, String> {
        BTreeMap::from([
            (INSTANCE_LABEL.to_owned(), self.instance.clone()),
            (COMPONENT_LABEL.to_owned(), component.label().to_owned()),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_endpoints_follow_upstream() {
        let n = Names::new("prod", "fb", "cluster.local").unwrap();
        assert_eq!(n.postgres_secret(), "prod-metadata-postgres-creds");
        assert_eq!(n.postgres(), "prod-metadata-pg");
        assert_eq!(n.metadata_config(), "prod-metadata-config");
        assert_eq!(n.metadata(), "prod-metadata");
        assert_eq!(n.gateway_config(), "prod-gateway-config");
        assert_eq!(n.gateway(), "prod-gateway");
        assert_eq!(
            n.metadata_endpoint(),
            "prod-metadata.fb.svc.cluster.local:7000"
        );
        assert_eq!(n.gateway_endpoint(), "prod-gateway.fb.svc.cluster.local");
        assert_eq!(
            n.engine_authority_suffix(),
            "-service.fb.svc.cluster.local:3473"
        );
        assert_eq!(
            n.labels(Component::Gateway)["firebolt.io/component"],
            "gateway"
        );
    }

    #[test]
    fn the_longest_allowed_name_keeps_generated_names_valid() {
        let longest = "a".repeat(MAX_INSTANCE_NAME);
        let n = Names::new(&longest, "ns", "cluster.local").unwrap();
        // The StatefulSet controller labels pods with `<sts>-<10-char hash>`.
        assert!(n.postgres().len() + 11 <= 63);
        assert!(Names::new(&format!("{longest}b"), "ns", "cluster.local").is_err());
    }
}
