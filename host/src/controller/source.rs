//! The live caches seen as the snapshot builder's object source and as
//! routing's primary lookup ([`CacheSource`]).
//!
//! # Guarantees
//! - An object is read as the cache holds it; a kind whose cache has not
//!   synced is reported absent, never empty.
//! - With a Secret reader, a Secret named by a field reference is read by
//!   name from the API server (it is not watched), only from a blocking
//!   task.

use std::sync::Arc;

use serde_json::Value;

use super::kind_key;
use super::route::PrimaryLookup;
use crate::contract::manifest::KindRef;
use crate::contract::selector::LabelSelector;
use crate::judge::snapshot::ObjectSource;
use crate::watch::by_name::{self, SecretReads};
use crate::watch::cache::{Cache, CachedObject, KindKey};

/// The live caches as the snapshot builder's object source and routing's
/// primary lookup. With `secrets`, field references to Secrets are read
/// from the API server (blocking: only from a blocking task).
#[derive(Clone)]
pub(crate) struct CacheSource {
    pub(crate) cache: Arc<Cache>,
    pub(crate) secrets: Option<(Arc<SecretReads>, tokio::runtime::Handle)>,
}

impl ObjectSource for CacheSource {
    fn absent(&self, kind: &KindRef) -> bool {
        self.cache
            .kind(&kind_key(kind))
            .is_some_and(|kc| !kc.synced())
    }

    fn owned_by(&self, kind: &KindRef, owner_uid: &str) -> Vec<Arc<Value>> {
        self.cache
            .kind(&kind_key(kind))
            .map(|kc| parsed(kc.owned_by(owner_uid)))
            .unwrap_or_default()
    }

    fn get(&self, kind: &KindRef, namespace: Option<&str>, name: &str) -> Option<Arc<Value>> {
        self.cache
            .kind(&kind_key(kind))?
            .get(namespace.unwrap_or_default(), name)
            .map(|o| Arc::new(o.value()))
    }

    fn list(&self, kind: &KindRef, namespace: Option<&str>) -> Vec<Arc<Value>> {
        self.cache
            .kind(&kind_key(kind))
            .map(|kc| parsed(kc.list(namespace)))
            .unwrap_or_default()
    }

    fn list_matching(
        &self,
        kind: &KindRef,
        namespace: Option<&str>,
        selector: &LabelSelector,
    ) -> Vec<Arc<Value>> {
        self.cache
            .kind(&kind_key(kind))
            .map(|kc| {
                let mut objects = kc.list(namespace);
                objects.retain(|o| selector.matches(&o.labels()));
                parsed(objects)
            })
            .unwrap_or_default()
    }

    fn get_named(&self, kind: &KindRef, namespace: Option<&str>, name: &str) -> Option<Arc<Value>> {
        match (&self.secrets, namespace) {
            (Some((secrets, runtime)), Some(ns)) if by_name::is_secret(kind) => {
                secrets.get_blocking(runtime, ns, name)
            }
            _ => self.get(kind, namespace, name),
        }
    }
}

/// Cached objects parsed, for a snapshot.
pub(super) fn parsed(objects: Vec<Arc<CachedObject>>) -> Vec<Arc<Value>> {
    objects.iter().map(|o| Arc::new(o.value())).collect()
}

impl PrimaryLookup for CacheSource {
    fn by_uid(&self, kind: &KindKey, uid: &str) -> Option<Arc<CachedObject>> {
        self.cache.kind(kind)?.get_by_uid(uid)
    }

    fn list(&self, kind: &KindKey, namespace: Option<&str>) -> Vec<Arc<CachedObject>> {
        self.cache
            .kind(kind)
            .map(|kc| kc.list(namespace))
            .unwrap_or_default()
    }

    fn by_name(&self, kind: &KindKey, namespace: &str, name: &str) -> Option<Arc<CachedObject>> {
        self.cache.kind(kind)?.get(namespace, name)
    }
}
