//! The modelled cluster seen as a snapshot's object source ([`View`]), so
//! `wasmop check` builds snapshots the way the live operator does.
//!
//! # Guarantees
//! - A view answers from the world as it is at that step, the same reads
//!   the live caches answer (by kind, namespace, name, owner and label
//!   selector).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

use super::ObjKey;
use crate::contract::manifest::KindRef;
use crate::judge::snapshot::ObjectSource;
use crate::object;

/// A point-in-time view of the world's objects: what a snapshot is built
/// from and validation judges against. Stale views (property 5) are views
/// with objects left out or at older versions.
#[derive(Clone, Debug, Default)]
pub struct View {
    /// The objects.
    pub objects: BTreeMap<ObjKey, Arc<Value>>,
}

pub(super) fn kind_matches(k: &ObjKey, kind: &KindRef) -> bool {
    k.0 == kind.group && k.1 == kind.kind
}

impl ObjectSource for View {
    fn owned_by(&self, kind: &KindRef, owner_uid: &str) -> Vec<Arc<Value>> {
        self.objects
            .iter()
            .filter(|(k, o)| kind_matches(k, kind) && object::owner_uids(o).contains(&owner_uid))
            .map(|(_, o)| Arc::clone(o))
            .collect()
    }

    fn get(&self, kind: &KindRef, namespace: Option<&str>, name: &str) -> Option<Arc<Value>> {
        let ns = if kind.namespaced {
            namespace.unwrap_or_default()
        } else {
            ""
        };
        self.objects
            .get(&(
                kind.group.clone(),
                kind.kind.clone(),
                ns.to_owned(),
                name.to_owned(),
            ))
            .cloned()
    }

    fn list(&self, kind: &KindRef, namespace: Option<&str>) -> Vec<Arc<Value>> {
        self.objects
            .iter()
            .filter(|(k, _)| kind_matches(k, kind) && namespace.is_none_or(|ns| ns == k.2))
            .map(|(_, o)| Arc::clone(o))
            .collect()
    }
}
