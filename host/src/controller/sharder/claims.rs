//! Claiming the owned objects of a primary that arrives at this shard:
//! relabelling them with the shard's label in batches, so this shard's
//! watches see them before it writes for the primary.
//!
//! # Guarantees
//! - A primary is reconciled here only once its owned objects are claimed
//!   and in this shard's caches: a reconcile never judges from a cache
//!   that misses its own objects.
//! - Only objects the primary controls are relabelled, each at the
//!   resourceVersion it was listed at and under the primary's shard fence;
//!   a claim adopts nothing, and one whose list or writes failed is made
//!   again at the primary's next reconcile.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, DynamicObject, ListParams};
use serde_json::json;
use wasmop_contract::OWNER_UID_LABEL;

use super::Claimed;
use crate::contract::manifest::OwnedKind;
use crate::judge::validate::ExistingObject;
use crate::lease::shard::{CLAIM_WRITES, Claim, ClaimRequest, Sharding, claim_object};
use crate::object;

impl crate::controller::Operator {
    /// The claimer: claims the owned objects of the primaries that arrived
    /// at this shard, in batches of up to [`super::shard::CLAIM_BATCH`]
    /// requested by [`Self::claimed`], then queues each primary again.
    ///
    /// For each owned kind whose cache is filtered by this shard's label,
    /// the objects carrying one of the batch's primary UIDs in
    /// `wasmop.dev/owner-uid` but not this shard's label are listed from
    /// the API server ([`Sharding::claim_selector`], filtered there), in
    /// every namespace the primaries may write to that the cache watches.
    /// Each one its primary controls, by the rule validation uses
    /// ([`ExistingObject::is_controlled_by`] under the kind's ownership),
    /// is relabelled for this shard at the resourceVersion it was listed
    /// at ([`CLAIM_WRITES`] at a time), each write under the primary's
    /// shard fence; one it does not control is left untouched (counted
    /// and logged), so a claim adopts nothing. A primary whose list or
    /// writes failed is claimed again at its next reconcile.
    pub(super) async fn run_claimer(self: Arc<Self>, s: Arc<Sharding>) {
        loop {
            let batch = s.next_claims().await;
            self.claim_batch(&s, batch).await;
        }
    }

    /// Claims one batch (see [`Self::run_claimer`]).
    pub(super) async fn claim_batch(&self, s: &Sharding, batch: Vec<ClaimRequest>) {
        // By controller and namespace: one list per owned kind and scope.
        let mut groups: BTreeMap<(Arc<str>, String), Vec<ClaimRequest>> = BTreeMap::new();
        for r in batch {
            groups
                .entry((r.key.controller.clone(), r.key.namespace.clone()))
                .or_default()
                .push(r);
        }
        for ((controller, namespace), members) in groups {
            let active = self
                .controllers
                .read()
                .expect("controllers lock")
                .get(&controller)
                .cloned();
            let Some(a) = active else {
                for r in &members {
                    s.forget_claim(&r.uid);
                }
                continue;
            };
            let outcome = self.claim_group(s, &a, &namespace, &members).await;
            for r in &members {
                let claim = match outcome.get(r.uid.as_str()) {
                    Some(Ok(objects)) if objects.is_empty() => Claim::Done,
                    Some(Ok(objects)) => {
                        tracing::info!(primary = %r.key, shard = %s.identity,
                            relabelled = objects.len(), "owned objects claimed");
                        Claim::Waiting {
                            objects: objects.clone(),
                            since: std::time::Instant::now(),
                        }
                    }
                    _ => {
                        // Asked again by its next reconcile.
                        s.forget_claim(&r.uid);
                        self.queue
                            .add_after(r.key.clone(), Duration::from_millis(500));
                        continue;
                    }
                };
                if s.finish_claim(r, claim) {
                    self.queue.add(r.key.clone());
                }
            }
        }
    }

    /// Claims the owned objects of `members` (primaries of `a` in
    /// `namespace`): per member UID, the `(kind key, uid)` of each object
    /// relabelled, or an error when a list or a write failed.
    pub(super) async fn claim_group(
        &self,
        s: &Sharding,
        a: &crate::controller::Active,
        namespace: &str,
        members: &[ClaimRequest],
    ) -> HashMap<String, Claimed> {
        let mut out: HashMap<String, Claimed> = members
            .iter()
            .map(|r| (r.uid.clone(), Ok(Vec::new())))
            .collect();
        let keys: HashMap<&str, &crate::controller::PrimaryKey> =
            members.iter().map(|r| (r.uid.as_str(), &r.key)).collect();
        let selector = s.selector();
        let claim_selector = s.claim_selector(members.iter().map(|r| r.uid.as_str()));
        let mut writes = Vec::new();
        for o in a.spec.owns.iter().filter(|o| !o.is_dependent()) {
            let kind = crate::controller::kind_key(&o.kind);
            let filtered = self
                .cache
                .kind(&kind)
                .is_some_and(|kc| kc.spec().selector.as_deref() == Some(selector.as_str()));
            if !filtered {
                // Watched whole: the cache holds them however labelled.
                continue;
            }
            let resource = crate::execute::api_resource(&o.kind);
            for api in self.claim_scopes(a, o, namespace) {
                let lp = ListParams::default().labels(&claim_selector);
                let listed = match api.list_metadata(&lp).await {
                    Ok(l) => l.items,
                    Err(e) => {
                        tracing::info!(controller = %a.id, kind = %kind, error = %e,
                            "claiming owned objects: list failed; trying again");
                        for r in out.values_mut() {
                            *r = Err(());
                        }
                        return out;
                    }
                };
                for item in listed {
                    let meta = json!({ "metadata": &item.metadata });
                    let name = item.metadata.name.clone().unwrap_or_default();
                    let Some((owner, key)) = object::labels_get(&meta, OWNER_UID_LABEL)
                        .and_then(|u| keys.get_key_value(u))
                        .map(|(u, k)| (u.to_string(), *k))
                    else {
                        continue;
                    };
                    if !ExistingObject::of(&meta).is_controlled_by(&owner, &o.ownership) {
                        crate::metrics::global().inc(
                            "wasmop_shard_claims_total",
                            &[("controller", &a.id), ("result", "not_controlled")],
                        );
                        tracing::info!(primary = %key, kind = %kind, object = %name,
                            "claiming owned objects: carries the primary's owner label but the \
                             primary does not control it; left as it is");
                        continue;
                    }
                    let target: Api<DynamicObject> = match &item.metadata.namespace {
                        Some(ns) => Api::namespaced_with(self.client.clone(), ns, &resource),
                        None => Api::all_with(self.client.clone(), &resource),
                    };
                    let rv = item.metadata.resource_version.clone().unwrap_or_default();
                    writes.push((owner, key.clone(), kind.0.clone(), target, name, rv));
                }
            }
        }
        let written: Vec<(String, String, Result<String, ()>)> = futures::stream::iter(writes)
            .map(|(owner, key, kind, target, name, rv)| async move {
                if !self.may_write_for(a, &key, &owner) {
                    return (owner, kind, Err(()));
                }
                match claim_object(&target, &name, &rv, &s.identity).await {
                    Ok(w) => {
                        crate::metrics::global().inc(
                            "wasmop_shard_claims_total",
                            &[("controller", &a.id), ("result", "relabelled")],
                        );
                        (owner, kind, Ok(w.metadata.uid.unwrap_or_default()))
                    }
                    Err(e) => {
                        tracing::info!(primary = %key, object = %name, error = %e,
                            "claiming owned objects: relabel failed; trying again");
                        (owner, kind, Err(()))
                    }
                }
            })
            .buffer_unordered(CLAIM_WRITES)
            .collect()
            .await;
        for (owner, kind, r) in written {
            let Some(entry) = out.get_mut(&owner) else {
                continue;
            };
            match (entry, r) {
                (Ok(objects), Ok(uid)) => objects.push((kind, uid)),
                (entry, Err(())) => *entry = Err(()),
                (Err(()), Ok(_)) => {}
            }
        }
        out
    }

    /// Where the objects of owned kind `o` of `a`'s primaries in
    /// `namespace` may be, as API handles to list them: the whole cluster
    /// for a cluster-scoped kind; otherwise the primaries' namespace and
    /// the controller's write namespaces (every namespace for `*` or a
    /// cluster-scoped primary), each only where the cache watches.
    pub(super) fn claim_scopes(
        &self,
        a: &crate::controller::Active,
        o: &OwnedKind,
        namespace: &str,
    ) -> Vec<Api<DynamicObject>> {
        let resource = crate::execute::api_resource(&o.kind);
        let all = || vec![Api::all_with(self.client.clone(), &resource)];
        if !o.kind.namespaced {
            return all();
        }
        let own = Some(namespace).filter(|ns| a.spec.primary.namespaced && !ns.is_empty());
        let watched = self.cache.namespaces();
        let mut namespaces: Vec<&str> =
            if own.is_none() || a.spec.write_namespaces.iter().any(|n| n == "*") {
                if watched.is_empty() {
                    return all();
                }
                watched.iter().map(String::as_str).collect()
            } else {
                own.into_iter()
                    .chain(a.spec.write_namespaces.iter().map(String::as_str))
                    .filter(|ns| self.cache.watches_namespace(true, Some(ns)))
                    .collect()
            };
        namespaces.sort_unstable();
        namespaces.dedup();
        namespaces
            .into_iter()
            .map(|ns| Api::namespaced_with(self.client.clone(), ns, &resource))
            .collect()
    }
}
