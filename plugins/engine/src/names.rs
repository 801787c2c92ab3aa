//! Names and labels of the objects generated for an engine `<e>`, as
//! upstream generates them:
//!
//! | object | name | lifetime |
//! | --- | --- | --- |
//! | StatefulSet | `<e>-g<N>` | one generation |
//! | headless Service | `<e>-g<N>-hl` | one generation |
//! | ConfigMap (`config.yaml`) | `<e>-g<N>-config` | one generation |
//! | cluster Service | `<e>-service` | the engine's life |
//!
//! Every object carries `firebolt.io/engine=<e>`; the per-generation ones
//! also `firebolt.io/generation=<N>`, which is what the cluster Service
//! selects on.

use std::collections::BTreeMap;

/// Label naming the engine an object belongs to.
pub const ENGINE_LABEL: &str = "firebolt.io/engine";
/// Label naming the generation a per-generation object belongs to.
pub const GENERATION_LABEL: &str = "firebolt.io/generation";
/// StatefulSet annotation: hash of everything a generation is built from
/// (merged template, replicas, storage, rendered config). A different hash
/// is drift and rolls a new generation.
pub const SPEC_HASH_ANNOTATION: &str = "firebolt.io/spec-hash";
/// StatefulSet annotation: hash of the class template (only with a class).
pub const CLASS_HASH_ANNOTATION: &str = "firebolt.io/engine-class-hash";
/// StatefulSet annotation: hash of the merged `customEngineConfig` (only
/// when one is set).
pub const CUSTOM_CONFIG_HASH_ANNOTATION: &str = "firebolt.io/custom-engine-config-hash";
/// StatefulSet annotation: the metadata endpoint override (only when set).
pub const METADATA_OVERRIDE_ANNOTATION: &str = "firebolt.io/metadata-override";

/// StatefulSet annotation: the instance's `authHash` the generation
/// renders (only with auth).
pub const AUTH_HASH_ANNOTATION: &str = "firebolt.io/auth-hash";
/// StatefulSet annotation: the instance's engine `tlsHash` the generation
/// serves TLS under (only with engine TLS).
pub const ENGINE_TLS_HASH_ANNOTATION: &str = "firebolt.io/engine-tls-hash";
/// Label of the instance on a generation's TLS Secret.
pub const INSTANCE_LABEL: &str = "firebolt.io/instance";
/// Component label of a generation's TLS Secret and Certificate.
pub const COMPONENT_LABEL: &str = "firebolt.io/component";

/// cert-manager's Certificate kind.
pub fn certificate_kind() -> wasmop_sdk::KindRef {
    wasmop_sdk::KindRef::namespaced("cert-manager.io", "v1", "Certificate", "certificates")
}

/// Port of the query listener.
pub const QUERY_PORT: i32 = 3473;
/// Port of the health endpoints.
pub const HEALTH_PORT: i32 = 8122;
/// Port of the Prometheus metrics (and the drain check).
pub const METRICS_PORT: i32 = 9090;
/// Port of the optional UI sidecar.
pub const UI_PORT: i32 = 9100;

/// The generated names of one engine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Names {
    engine: String,
    namespace: String,
    cluster_domain: String,
}

impl Names {
    /// Names for engine `engine` in `namespace`, DNS under `cluster_domain`.
    pub fn new(engine: &str, namespace: &str, cluster_domain: &str) -> Self {
        Names {
            engine: engine.to_owned(),
            namespace: namespace.to_owned(),
            cluster_domain: cluster_domain.to_owned(),
        }
    }

    /// The engine's name.
    pub fn engine(&self) -> &str {
        &self.engine
    }

    /// The engine's namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// StatefulSet of generation `g`.
    pub fn statefulset(&self, g: i64) -> String {
        format!("{}-g{g}", self.engine)
    }

    /// Headless Service of generation `g`.
    pub fn headless(&self, g: i64) -> String {
        format!("{}-g{g}-hl", self.engine)
    }

    /// ConfigMap of generation `g`.
    pub fn config(&self, g: i64) -> String {
        format!("{}-g{g}-config", self.engine)
    }

    /// Certificate and Secret of generation `g`'s serving certificate.
    pub fn tls(&self, g: i64) -> String {
        format!("{}-g{g}-engine-tls", self.engine)
    }

    /// SANs of generation `g`'s certificate: every Service of the
    /// namespace (the gateway dials `<e>-service`) and every node of the
    /// generation.
    pub fn tls_dns_names(&self, g: i64) -> Vec<String> {
        vec![
            format!("*.{}.svc.{}", self.namespace, self.cluster_domain),
            format!(
                "*.{}.{}.svc.{}",
                self.headless(g),
                self.namespace,
                self.cluster_domain
            ),
        ]
    }

    /// The stable cluster Service.
    pub fn service(&self) -> String {
        format!("{}-service", self.engine)
    }

    /// DNS name of node `i` of generation `g`.
    pub fn node_host(&self, g: i64, i: i64) -> String {
        format!(
            "{}-{i}.{}.{}.svc.{}",
            self.statefulset(g),
            self.headless(g),
            self.namespace,
            self.cluster_domain
        )
    }

    /// Labels of every object of the engine.
    pub fn engine_labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([(ENGINE_LABEL.to_owned(), self.engine.clone())])
    }

    /// Labels (and selector) of generation `g`.
    pub fn generation_labels(&self, g: i64) -> BTreeMap<String, String> {
        let mut labels = self.engine_labels();
        labels.insert(GENERATION_LABEL.to_owned(), g.to_string());
        labels
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_generation_names_follow_upstream() {
        let n = Names::new("analytics", "fb", "cluster.local");
        assert_eq!(n.statefulset(3), "analytics-g3");
        assert_eq!(n.headless(3), "analytics-g3-hl");
        assert_eq!(n.config(0), "analytics-g0-config");
        assert_eq!(n.service(), "analytics-service");
        assert_eq!(
            n.node_host(2, 1),
            "analytics-g2-1.analytics-g2-hl.fb.svc.cluster.local"
        );
        assert_eq!(n.generation_labels(7)[GENERATION_LABEL], "7");
    }
}
