//! "Does it exist, and who controls it" answered from the API server's
//! truth when the cache cannot answer.
//!
//! The caches of owned-only kinds are filtered by the managed-by label, and
//! namespaces outside `--namespace` are not watched at all, so "not in the
//! cache" does not mean "does not exist". [`TruthLookup`] answers from the
//! cache when the cache holds the object (its staleness is covered by the
//! write fences), and otherwise reads the object's metadata from the API
//! server before validation judges the plan.
//!
//! # Guarantees
//!
//! - An object that exists is never judged absent because the cache could
//!   not see it: a create is planned only after the API server said 404.
//! - An object created after that read makes the create fail with a
//!   conflict; the next reconcile reads it and refuses the plan.
//! - A read that fails (not a 404) is treated as "exists and is not ours":
//!   the plan is refused rather than written blind.
//!
//! # Caveats
//!
//! Each read blocks the calling thread; call it from a blocking task (the
//! worker runs `decide` in `spawn_blocking`).

use kube::Client;
use kube::api::{Api, DynamicObject};
use tokio::runtime::Handle;

use crate::controller::CacheSource;
use crate::execute::api_resource;
use crate::plugin::manifest::KindRef;
use crate::reconcile::snapshot::ObjectSource;
use crate::reconcile::validate::{ExistingLookup, ExistingObject};

/// The cache first, the API server when the cache does not hold the object.
pub(crate) struct TruthLookup {
    pub(crate) cache: CacheSource,
    pub(crate) client: Client,
    pub(crate) runtime: Handle,
}

impl TruthLookup {
    fn read(&self, kind: &KindRef, namespace: Option<&str>, name: &str) -> Option<ExistingObject> {
        let resource = api_resource(kind);
        let api: Api<DynamicObject> = match namespace.filter(|_| kind.namespaced) {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, &resource),
            None => Api::all_with(self.client.clone(), &resource),
        };
        match self.runtime.block_on(api.get_metadata_opt(name)) {
            Ok(None) => None,
            Ok(Some(meta)) => {
                let value = serde_json::to_value(meta).unwrap_or_default();
                Some(ExistingObject::of(&value))
            }
            Err(e) => {
                tracing::warn!(kind = %kind, namespace, name, error = %e,
                    "could not read an object before writing it; judging it not ours");
                Some(ExistingObject {
                    uid: String::new(),
                    controller_uid: Some(format!("(unknown: {e})")),
                    owner_label: None,
                    resource_version: String::new(),
                    protected: false,
                })
            }
        }
    }
}

impl ExistingLookup for TruthLookup {
    fn existing(
        &self,
        kind: &KindRef,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<ExistingObject> {
        match self.cache.get(kind, namespace, name) {
            Some(found) => Some(ExistingObject::of(&found)),
            None => self.read(kind, namespace, name),
        }
    }
}

impl std::fmt::Debug for TruthLookup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TruthLookup")
    }
}
