//! "Does it exist, and who controls it" answered from the API server's
//! truth when the cache cannot answer.
//!
//! The caches of owned-only kinds are filtered by the managed-by label
//! (with `--sharding`, by the shard's label too: see [`super::shard`]), and
//! namespaces outside `--namespace` are not watched at all, so "not in the
//! cache" does not mean "does not exist". [`TruthLookup`] answers from the
//! cache when the cache holds the object (its staleness is covered by the
//! write fences), and otherwise reads the object's metadata from the API
//! server before validation judges the plan — except for an object about to
//! be created in a namespace the cache watches, see below.
//!
//! # Guarantees
//!
//! - An object that exists is never written as if it were absent: a create
//!   is planned either after the API server said 404, or (see
//!   `TruthLookup::presume_absent`) fenced so that it fails with a
//!   conflict if the object exists; the retry of that reconcile reads every
//!   object the cache does not hold, and judges it exactly as a read
//!   before the first attempt would have (refused unless it is this
//!   primary's, or an orphan of a kind the controller adopts).
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

use crate::contract::manifest::KindRef;
use crate::controller::{CacheSource, kind_key};
use crate::execute::api_resource;
use crate::judge::snapshot::ObjectSource;
use crate::judge::validate::{BeforeCreate, ExistingLookup, ExistingObject};

/// The cache first, the API server when the cache does not hold the object.
pub(crate) struct TruthLookup {
    pub(crate) cache: CacheSource,
    pub(crate) client: Client,
    pub(crate) runtime: Handle,
    /// Judge an object to be created absent without a read when the cache
    /// of its kind has synced and watches its namespace: had this host
    /// written it, the cache would hold it (with sharding: this shard
    /// wrote it, or claimed it before the primary's first reconcile
    /// here), so it is absent or someone
    /// else's, and the write's fence ([`crate::execute::writer::Fence::ABSENT`],
    /// or a create) turns "someone else's" into a conflict. Off for the
    /// retry after such a conflict, which reads as before.
    pub(crate) presume_absent: bool,
    /// Objects collected because their owner was gone: the cache may
    /// still hold them for a moment, so the API server is asked instead.
    pub(crate) collected: std::sync::Arc<super::orphans::Collected>,
}

impl TruthLookup {
    /// The cache's copy, unless it is of an object this replica collected
    /// (gone, or about to be: the watch has not said so yet).
    fn cached(
        &self,
        kind: &KindRef,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Option<ExistingObject>, ()> {
        match self.cache.get(kind, namespace, name) {
            Some(found) if self.collected.contains(crate::object::uid(&found)) => Err(()),
            found => Ok(found.map(|f| ExistingObject::of(&f))),
        }
    }

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
        match self.cached(kind, namespace, name) {
            Ok(Some(found)) => Some(found),
            Ok(None) | Err(()) => self.read(kind, namespace, name),
        }
    }

    fn existing_before_create(
        &self,
        kind: &KindRef,
        namespace: Option<&str>,
        name: &str,
    ) -> BeforeCreate {
        let collected = match self.cached(kind, namespace, name) {
            Ok(Some(found)) => return BeforeCreate::Exists(found),
            Ok(None) => false,
            Err(()) => true,
        };
        let cache = &self.cache.cache;
        let seen_if_ours = cache.watches_namespace(kind.namespaced, namespace)
            && cache.kind(&kind_key(kind)).is_some_and(|kc| kc.synced());
        if self.presume_absent && seen_if_ours && !collected {
            return BeforeCreate::Unasked;
        }
        match self.read(kind, namespace, name) {
            Some(found) => BeforeCreate::Exists(found),
            None => BeforeCreate::Absent,
        }
    }
}

impl std::fmt::Debug for TruthLookup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TruthLookup")
    }
}
