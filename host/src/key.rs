//! How the host names things every layer shares: one primary of one
//! controller ([`PrimaryKey`], the work queue's key and the logs' `primary`
//! field) and a manifest kind's coordinates on the API server
//! ([`api_resource`]). A leaf: the watch caches, the logs, the executor and
//! the controller all use it, and it imports nothing of the crate.

use std::sync::Arc;

use kube::api::ApiResource;

use wasmop_contract::manifest::KindRef;

/// Identity of one primary for one controller.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PrimaryKey {
    /// `plugin/controller`.
    pub controller: Arc<str>,
    /// Namespace, empty for cluster-scoped primaries.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl std::fmt::Display for PrimaryKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "{} {}", self.controller, self.name)
        } else {
            write!(f, "{} {}/{}", self.controller, self.namespace, self.name)
        }
    }
}

/// Kubernetes API coordinates of a manifest kind.
pub fn api_resource(kind: &KindRef) -> ApiResource {
    ApiResource {
        group: kind.group.clone(),
        version: kind.version.clone(),
        api_version: kind.api_version(),
        kind: kind.kind.clone(),
        plural: kind.plural.clone(),
    }
}
