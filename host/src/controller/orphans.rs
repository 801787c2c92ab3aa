//! Collecting what the garbage collector missed.
//!
//! Kubernetes' garbage collector deletes an object whose owners are all
//! gone, but only if it noticed the owner's deletion: when its discovery or
//! its watches failed at that moment (an API server restart, the
//! controller-manager down), the dependent stays, controlled by a UID that
//! no longer exists, until something else deletes it
//! (kubernetes/kubernetes#109748). A primary re-created under the same name
//! then plans an object of the same name, the validator finds it controlled
//! by another owner, and the plan is refused (`NotControlledByPrimary`) for
//! as long as the leak lasts — forever.
//!
//! The host collects such objects itself, in two places:
//! - **On a refusal.** When every rule a plan breaks is
//!   `NotControlledByPrimary` on objects it applies, each of those objects
//!   whose owner is gone is deleted, one Normal Event `CollectedOrphan`
//!   naming each goes on the primary, and the primary is reconciled again
//!   at once. An object already being deleted is left to finish.
//! - **By a sweep** ([`Operator::sweep_orphans`], every
//!   [`OperatorConfig::orphan_sweep_interval`](super::OperatorConfig)):
//!   every object of every owned kind that carries the plugin's labels is
//!   listed from the API server in pages of [`SWEEP_PAGE`], and those whose
//!   owner is gone are deleted, so a leak does not wait for a name to be
//!   used again.
//!
//! # Guarantees
//!
//! An object is deleted only when all of these hold:
//! - it carries `app.kubernetes.io/managed-by: wasmop` and
//!   `wasmop.dev/plugin: <this plugin>` (labels the host sets and a plugin
//!   cannot forge), and not `wasmop.dev/protected=true`;
//! - its kind is one the controller owns (not a `dependent` kind);
//! - it is controlled the way that kind is owned: a controller
//!   ownerReference naming the controller's primary kind (for
//!   `owner-reference` kinds), or the `wasmop.dev/owner-uid` label and no
//!   controller ownerReference (for `owner-label` kinds);
//! - it is where the controllers could have written it
//!   (`collectable_where_it_is`): cluster-scoped; or, controlled by an
//!   ownerReference, in a watched namespace (its owner's) or, for a
//!   cluster-scoped primary, one the controller declares for the kind;
//!   or, owned by label, in a namespace the controller declares for the
//!   kind (`writeNamespaces`), or naming its owner by an ownerReference
//!   too. A look-alike a user labelled, with a made-up owner, anywhere
//!   else is left alone;
//! - its owner is gone, by a **live** read that cannot predate the
//!   object: for an ownerReference, a read by name (made after the object
//!   was read) finds no object of the primary kind or one with another
//!   UID; for an owner label, no object of any primary kind of the
//!   plugin's controllers that own the kind by label has that UID in a
//!   list of the whole cluster from the API server (not only the watched
//!   namespaces: another operator may run the same plugin elsewhere)
//!   whose resourceVersion is not older than the object's, or that was
//!   made after the object was read (a sweep lists each kind once, and
//!   lists again before judging an object newer than its list: an owner
//!   made after the list, on another shard, is not judged gone). For
//!   either, an owner the watch cache holds counts as alive without a
//!   read, so a sweep reads only for the objects whose owner the cache
//!   lacks; the cache never says "gone" (with sharding it holds only this
//!   shard's primaries);
//! - this replica may write (the leader for a sweep; for a refusal, the
//!   fence of the refused primary's own writes, which with sharding is
//!   its shard's), and the delete carries the UID and
//!   resourceVersion the object was judged at, so a changed or re-created
//!   object is not deleted;
//! - the plugin's per-minute deletion budget (`maxDeletesPerMinute`) has
//!   room for one more delete: collections count against it like the
//!   plugin's own deletes, so a mass leak is collected at the budget's pace,
//!   never faster. One that does not fit is deferred to a later sweep or
//!   refusal (counted in `wasmop_orphans_deferred_total{controller}`,
//!   logged) and does not mark the budget exceeded.
//!
//! A user's object (no labels), an object another plugin made, one whose
//! owner exists (also while it is being deleted), and one whose owner is of
//! another kind are never touched. A read that fails counts as "owner
//! alive". Each collection is counted in `wasmop_orphans_collected_total`
//! (labels `controller`, `kind`, `found_by`: `refusal` or `sweep`) and
//! logged; a sweep's length and size are `wasmop_orphan_sweep_seconds` and
//! `wasmop_orphan_sweep_objects`.
//!
//! After a collection the watch cache may still hold the deleted object for
//! a moment; its UID is remembered (`Collected`) for
//! [`COLLECTED_MEMORY`], and the judgement of a plan
//! (`controller::truth`'s lookup) asks the API server instead of the cache
//! for an object with such a UID.

mod claim;

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::api::{Api, DynamicObject, ListParams, PartialObjectMeta};
use serde_json::Value;

use self::claim::not_older;
pub(crate) use self::claim::{Claim, claim_of, collectable_where_it_is, refused_applies};
use super::{Active, Operator, kind_key};
use crate::contract::manifest::{Controller, KindRef};
use crate::execute::api_resource;
use crate::judge::validate::{MANAGED_BY_LABEL, MANAGED_BY_VALUE, PLUGIN_LABEL, Plan, Violation};
use crate::metrics;
use crate::object;

/// How many objects one page of a sweep's list holds.
pub const SWEEP_PAGE: u32 = 500;

/// How long the UID of a collected object is remembered, so the cache's
/// copy of it (until the watch delivers the deletion) is not taken for the
/// object.
pub const COLLECTED_MEMORY: Duration = Duration::from_secs(120);

/// UIDs of objects this replica collected recently.
#[derive(Debug, Default)]
pub(crate) struct Collected(Mutex<HashMap<String, Instant>>);

impl Collected {
    fn remember(&self, uid: &str) {
        let mut map = self.0.lock().expect("collected lock");
        let now = Instant::now();
        map.retain(|_, at| now.duration_since(*at) < COLLECTED_MEMORY);
        map.insert(uid.to_owned(), now);
    }

    /// True when the object with this UID was collected within
    /// [`COLLECTED_MEMORY`].
    pub(crate) fn contains(&self, uid: &str) -> bool {
        !uid.is_empty()
            && self
                .0
                .lock()
                .expect("collected lock")
                .get(uid)
                .is_some_and(|at| at.elapsed() < COLLECTED_MEMORY)
    }
}

/// UIDs of every object of a primary kind as a list from the API server
/// found them, with that list's resourceVersion; read once per sweep (and
/// once per refusal) when an owner label must be checked, and read again
/// when it may predate the object judged (see [`Operator::owner_alive`]).
#[derive(Default)]
struct LiveUids(HashMap<String, Option<Listed>>);

/// One list of a primary kind's UIDs.
struct Listed {
    uids: HashSet<String>,
    /// The list's resourceVersion.
    resource_version: String,
}

/// How one object fared.
enum Outcome {
    Collected,
    Left,
    /// Its owner is gone, but the plugin's deletion budget has no room.
    Deferred,
}

impl Operator {
    /// Running controllers of `plugin`.
    fn plugin_controllers(&self, plugin: &str) -> Vec<std::sync::Arc<Active>> {
        let mut actives = self.actives();
        actives.retain(|a| a.plugin.name() == plugin);
        actives
    }

    /// True when the API server still has the owner `claim` names (also
    /// while it is being deleted), or when that cannot be told. An owner
    /// is judged gone only by a read that cannot predate the object (at
    /// `object_version`): for an ownerReference a GET by name, made after
    /// the object was read; for an owner label a list whose
    /// resourceVersion is not older than the object's, or one made after
    /// the object was read. The watch cache only ever says "alive": with
    /// sharding it holds only this shard's primaries.
    async fn owner_alive(&self, claim: &Claim, object_version: &str, live: &mut LiveUids) -> bool {
        match claim {
            Claim::Reference {
                kind,
                namespace,
                name,
                uid,
            } => {
                // Held by the watch cache: alive, without a read.
                if self
                    .cache
                    .kind(&kind_key(kind))
                    .is_some_and(|kc| kc.get_by_uid(uid).is_some())
                {
                    return true;
                }
                let resource = api_resource(kind);
                let api: Api<DynamicObject> = match namespace {
                    Some(ns) => Api::namespaced_with(self.client.clone(), ns, &resource),
                    None => Api::all_with(self.client.clone(), &resource),
                };
                match api.get_metadata_opt(name).await {
                    Ok(None) => false,
                    Ok(Some(meta)) => meta.metadata.uid.as_deref() == Some(uid.as_str()),
                    Err(e) => {
                        tracing::debug!(owner = %claim.describe(), error = %e,
                            "could not read an owner; taking it as alive");
                        true
                    }
                }
            }
            Claim::Label { kinds, uid } => {
                for kind in kinds {
                    if self
                        .cache
                        .kind(&kind_key(kind))
                        .is_some_and(|kc| kc.get_by_uid(uid).is_some())
                    {
                        return true;
                    }
                }
                // The lists of this sweep first; a list that may predate
                // the object (its owner may have been made after it) is
                // read again before the owner is judged gone: the list
                // then cannot predate the object, nor its owner, which
                // was made before it.
                for fresh in [false, true] {
                    let mut stale = false;
                    for kind in kinds {
                        let key = kind_key(kind).to_string();
                        let reuse = live.0.get(&key).is_some_and(|listed| {
                            !fresh
                                || listed
                                    .as_ref()
                                    .is_some_and(|l| not_older(&l.resource_version, object_version))
                        });
                        if !reuse {
                            let listed = self.list_uids(kind).await;
                            live.0.insert(key.clone(), listed);
                        }
                        match live.0.get(&key) {
                            Some(Some(l)) if !l.uids.contains(uid) => {
                                stale |= !not_older(&l.resource_version, object_version);
                            }
                            // Present, or the list failed: alive.
                            _ => return true,
                        }
                    }
                    if !stale {
                        return false;
                    }
                }
                false
            }
        }
    }

    /// The UIDs of every object of `kind` in the whole cluster, listed
    /// from the API server in pages; `None` when a page fails (e.g. the
    /// operator may not list the kind cluster-wide). Every namespace, not
    /// only the watched ones: another operator watching other namespaces
    /// may run the same plugin, and its primaries own by label too.
    async fn list_uids(&self, kind: &KindRef) -> Option<Listed> {
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &api_resource(kind));
        let mut uids = HashSet::new();
        let mut resource_version = None;
        let mut params = ListParams::default().limit(SWEEP_PAGE);
        loop {
            let page = match api.list_metadata(&params).await {
                Ok(page) => page,
                Err(e) => {
                    tracing::debug!(kind = %kind, error = %e, "could not list owners");
                    return None;
                }
            };
            // Every page of one list is of the first page's version.
            if resource_version.is_none() {
                resource_version = Some(page.metadata.resource_version.clone().unwrap_or_default());
            }
            uids.extend(page.items.into_iter().filter_map(|m| m.metadata.uid));
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => break,
            }
        }
        Some(Listed {
            uids,
            resource_version: resource_version.unwrap_or_default(),
        })
    }

    /// One API per namespace this operator watches (one for all of them
    /// when it watches every namespace, or for a cluster-scoped kind).
    fn list_apis(&self, kind: &KindRef) -> Vec<Api<DynamicObject>> {
        let resource = api_resource(kind);
        let namespaces = self.cache.namespaces();
        if !kind.namespaced || namespaces.is_empty() {
            return vec![Api::all_with(self.client.clone(), &resource)];
        }
        namespaces
            .iter()
            .map(|ns| Api::namespaced_with(self.client.clone(), ns, &resource))
            .collect()
    }

    /// Deletes `obj` (as read from the API server) when `plugin`'s
    /// controllers may collect it and its owner is gone; see the module
    /// guarantees.
    async fn collect_one(
        &self,
        a: &Active,
        controllers: &[&Controller],
        obj: &Value,
        live: &mut LiveUids,
        found_by: &str,
    ) -> Result<(Outcome, String), String> {
        let what = object::describe(obj);
        let claim = claim_of(obj, a.plugin.name(), controllers)
            .map_err(|why| format!("{what} is left alone: {why}"))?;
        if !obj["metadata"]["deletionTimestamp"].is_null() {
            // Being deleted already (with a finalizer, or in the
            // foreground by someone else): its deletion finishes without
            // another request, and is not counted again.
            return Ok((Outcome::Left, String::new()));
        }
        let watched = |ns: &str| self.cache.watches_namespace(true, Some(ns));
        collectable_where_it_is(obj, &claim, controllers, &watched)
            .map_err(|why| format!("{what} is left alone: {why}"))?;
        if self
            .owner_alive(&claim, object::resource_version(obj), live)
            .await
        {
            return Ok((Outcome::Left, String::new()));
        }
        // A sweep is the leader's; a refusal's collection is the fence of
        // the refused primary's writes (with sharding, its shard's term).
        let may_write = match self.shard_for(a).filter(|_| found_by == "refusal") {
            Some(s) => s.in_term(),
            None => crate::lease::leader::may_write(&self.leader, &self.lease_until),
        };
        if !may_write {
            return Ok((Outcome::Left, String::new()));
        }
        if found_by == "sweep" {
            // Tests hold a sweep here, between its reads and its deletes.
            crate::execute::failpoint::hold(
                "sweep-before-delete",
                &format!(
                    "{}/{}",
                    object::namespace(obj).unwrap_or_default(),
                    object::name(obj)
                ),
            )
            .await;
        }
        // claim_of found the kind among the controllers' owned kinds.
        let Some(kind) = controllers
            .iter()
            .find_map(|c| c.owned_kind(object::api_version(obj), object::kind(obj)))
            .map(|o| o.kind.clone())
        else {
            return Ok((Outcome::Left, String::new()));
        };
        let budget = a.plugin.limits().plan.max_deletes_per_minute;
        let Some(mut reservation) = self
            .deletion_budgets
            .reserve_collection(a.plugin.name(), budget)
        else {
            metrics::global().inc("wasmop_orphans_deferred_total", &[("controller", &a.id)]);
            tracing::warn!(controller = %a.id, object = %what, owner = %claim.describe(), budget,
                "an object whose owner is gone waits: the plugin's per-minute deletion budget has no room");
            return Ok((Outcome::Deferred, String::new()));
        };
        a.writer
            .delete(
                &api_resource(&kind),
                object::namespace(obj),
                object::name(obj),
                object::uid(obj),
                object::resource_version(obj),
            )
            .await
            .map_err(|e| format!("{what} could not be collected: {e}"))?;
        reservation.used();
        self.collected.remember(object::uid(obj));
        metrics::global().inc(
            "wasmop_orphans_collected_total",
            &[
                ("controller", &a.id),
                ("kind", object::kind(obj)),
                ("found_by", found_by),
            ],
        );
        let message = format!(
            "deleted {what}: it was controlled by {}, which no longer exists (the garbage \
             collector missed it)",
            claim.describe()
        );
        tracing::info!(controller = %a.id, object = %what, owner = %claim.describe(), found_by,
            "collected an object whose owner is gone");
        Ok((Outcome::Collected, message))
    }

    /// After a plan was refused: collects the objects it was refused for
    /// when every one of them is controlled by an owner that is gone (see
    /// the module docs). Returns true when all of them were collected and
    /// the primary should be reconciled again at once.
    pub(super) async fn collect_refused(
        &self,
        a: &Active,
        primary: &Value,
        plan: &Plan,
        violations: &[Violation],
    ) -> bool {
        let refused = refused_applies(plan, violations);
        if refused.is_empty()
            || !self.may_write_for(
                a,
                &super::route::key_of(&a.id, primary),
                object::uid(primary),
            )
        {
            return false;
        }
        let actives = self.plugin_controllers(a.plugin.name());
        let controllers: Vec<&Controller> = actives.iter().map(|a| &a.spec).collect();
        let mut live = LiveUids::default();
        let mut all = true;
        let mut notes: Vec<String> = Vec::new();
        for planned in refused {
            let Some(owned) = a
                .spec
                .owned_kind(object::api_version(planned), object::kind(planned))
            else {
                return false;
            };
            let resource = api_resource(&owned.kind);
            let api: Api<DynamicObject> = match object::namespace(planned) {
                Some(ns) if owned.kind.namespaced => {
                    Api::namespaced_with(self.client.clone(), ns, &resource)
                }
                _ => Api::all_with(self.client.clone(), &resource),
            };
            let found = match api.get_metadata_opt(object::name(planned)).await {
                Ok(Some(meta)) => meta_value(meta, &owned.kind),
                // Gone meanwhile: the retry will find it absent.
                Ok(None) => continue,
                Err(_) => {
                    all = false;
                    continue;
                }
            };
            match self
                .collect_one(a, &controllers, &found, &mut live, "refusal")
                .await
            {
                Ok((Outcome::Collected, message)) => notes.push(message),
                Ok((Outcome::Left | Outcome::Deferred, _)) => all = false,
                Err(why) => {
                    tracing::debug!(controller = %a.id, %why, "refused object not collected");
                    all = false;
                }
            }
        }
        // One Event for the refusal: the recorder folds Events of one
        // reason about one object into a series that keeps the first note,
        // so one Event per object would show only the first.
        if !notes.is_empty() {
            self.reporter
                .event(primary, false, "CollectedOrphan", &notes.join("; "))
                .await;
        }
        all
    }

    /// One sweep: lists, in pages of [`SWEEP_PAGE`], every object of every
    /// kind a running controller owns that carries its plugin's labels, and
    /// collects those whose owner is gone. Only while this replica may
    /// write. Returns how many objects were looked at and how many
    /// collected.
    pub async fn sweep_orphans(&self) -> (usize, usize) {
        if !crate::lease::leader::may_write(&self.leader, &self.lease_until) {
            return (0, 0);
        }
        let started = Instant::now();
        let actives = self.actives();
        let (mut seen, mut collected) = (0usize, 0usize);
        let mut swept: HashSet<(String, String)> = HashSet::new();
        for a in &actives {
            let siblings: Vec<&Controller> = actives
                .iter()
                .filter(|b| b.plugin.name() == a.plugin.name())
                .map(|b| &b.spec)
                .collect();
            let mut live = LiveUids::default();
            for owned in a.spec.owns.iter().filter(|o| !o.is_dependent()) {
                // Each kind once per plugin: sibling controllers share it.
                if !swept.insert((
                    a.plugin.name().to_owned(),
                    kind_key(&owned.kind).to_string(),
                )) {
                    continue;
                }
                let selector = format!(
                    "{MANAGED_BY_LABEL}={MANAGED_BY_VALUE},{PLUGIN_LABEL}={}",
                    a.plugin.name()
                );
                for api in self.list_apis(&owned.kind) {
                    let mut params = ListParams::default().labels(&selector).limit(SWEEP_PAGE);
                    loop {
                        let page = match api.list_metadata(&params).await {
                            Ok(page) => page,
                            Err(e) => {
                                tracing::warn!(kind = %owned.kind, error = %e,
                                    "orphan sweep: could not list; the next sweep tries again");
                                break;
                            }
                        };
                        for meta in page.items {
                            seen += 1;
                            let obj = meta_value(meta, &owned.kind);
                            if let Ok((Outcome::Collected, _)) = self
                                .collect_one(a, &siblings, &obj, &mut live, "sweep")
                                .await
                            {
                                collected += 1;
                            }
                        }
                        match page.metadata.continue_.filter(|c| !c.is_empty()) {
                            Some(token) => params = params.continue_token(&token),
                            None => break,
                        }
                    }
                }
            }
        }
        let m = metrics::global();
        m.set(
            "wasmop_orphan_sweep_seconds",
            &[],
            started.elapsed().as_secs_f64(),
        );
        m.set("wasmop_orphan_sweep_objects", &[], seen as f64);
        crate::execute::failpoint::hold("sweep-done", "").await;
        tracing::debug!(objects = seen, collected, elapsed = ?started.elapsed(), "orphan sweep");
        (seen, collected)
    }
}

/// An object's metadata as read from the API server, as the JSON the rest
/// of the host reads (apiVersion and kind filled in from `kind`: a list's
/// items may lack them).
fn meta_value(meta: PartialObjectMeta<DynamicObject>, kind: &KindRef) -> Value {
    let mut value = serde_json::to_value(&meta).unwrap_or_default();
    if let Some(root) = value.as_object_mut() {
        root.insert("apiVersion".to_owned(), Value::from(kind.api_version()));
        root.insert("kind".to_owned(), Value::from(kind.kind.clone()));
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::judge::validate::Rule;
    use serde_json::json;

    fn widget() -> KindRef {
        KindRef::namespaced("example.dev", "v1", "Widget", "widgets")
    }
    fn configmap() -> KindRef {
        KindRef::namespaced("", "v1", "ConfigMap", "configmaps")
    }
    fn secret() -> KindRef {
        KindRef::namespaced("", "v1", "Secret", "secrets")
    }

    fn controller() -> Controller {
        Controller::new("widget", widget())
            .owns(configmap())
            .owns_by_label(secret(), None)
    }

    fn cm(labels: Value, refs: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "w-cm", "namespace": "ns", "uid": "u-cm",
                "resourceVersion": "7", "labels": labels, "ownerReferences": refs}})
    }

    fn ours() -> Value {
        json!({"app.kubernetes.io/managed-by": "wasmop", "wasmop.dev/plugin": "good"})
    }

    fn widget_ref(uid: &str) -> Value {
        json!([{"apiVersion": "example.dev/v1", "kind": "Widget", "name": "w",
            "uid": uid, "controller": true, "blockOwnerDeletion": true}])
    }

    #[test]
    fn an_object_controlled_by_a_primary_of_the_controller_is_claimed_by_its_reference() {
        let c = controller();
        let claim = claim_of(&cm(ours(), widget_ref("old")), "good", &[&c]).unwrap();
        assert_eq!(
            claim,
            Claim::Reference {
                kind: widget(),
                namespace: Some("ns".into()),
                name: "w".into(),
                uid: "old".into()
            }
        );
    }

    #[test]
    fn objects_without_the_plugins_labels_are_left_alone() {
        let c = controller();
        // A user's object of the same name, with no labels.
        assert!(claim_of(&cm(json!({}), widget_ref("old")), "good", &[&c]).is_err());
        // Another plugin's.
        let other = json!({"app.kubernetes.io/managed-by": "wasmop", "wasmop.dev/plugin": "other"});
        assert!(claim_of(&cm(other, widget_ref("old")), "good", &[&c]).is_err());
        // Our plugin label but not managed by wasmop.
        let half = json!({"wasmop.dev/plugin": "good"});
        assert!(claim_of(&cm(half, widget_ref("old")), "good", &[&c]).is_err());
    }

    #[test]
    fn protected_objects_and_objects_controlled_by_other_kinds_are_left_alone() {
        let c = controller();
        let mut labels = ours();
        labels["wasmop.dev/protected"] = json!("true");
        assert!(claim_of(&cm(labels, widget_ref("old")), "good", &[&c]).is_err());
        let deployment = json!([{"apiVersion": "apps/v1", "kind": "Deployment", "name": "w",
            "uid": "d", "controller": true}]);
        assert_eq!(
            claim_of(&cm(ours(), deployment), "good", &[&c]),
            Err("its controller is not of a primary kind that owns it by reference")
        );
    }

    #[test]
    fn objects_nothing_controls_or_of_kinds_not_owned_are_left_alone() {
        let c = controller();
        assert_eq!(
            claim_of(&cm(ours(), json!(null)), "good", &[&c]),
            Err("nothing controls it")
        );
        let mut svc = cm(ours(), widget_ref("old"));
        svc["kind"] = json!("Service");
        assert!(claim_of(&svc, "good", &[&c]).is_err());
        // A dependent kind is never collected.
        let d = Controller::new("widget", widget()).deletes_dependents(configmap());
        assert!(claim_of(&cm(ours(), widget_ref("old")), "good", &[&d]).is_err());
    }

    #[test]
    fn a_label_owned_object_is_claimed_by_its_owner_uid_across_the_plugins_primary_kinds() {
        let c = controller();
        let other = Controller::new(
            "gadget",
            KindRef::namespaced("example.dev", "v1", "Gadget", "gadgets"),
        )
        .owns_by_label(secret(), None);
        let mut labels = ours();
        labels["wasmop.dev/owner-uid"] = json!("gone");
        let s = json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "s", "namespace": "elsewhere", "uid": "u", "labels": labels}});
        assert_eq!(
            claim_of(&s, "good", &[&c, &other]).unwrap(),
            Claim::Label {
                kinds: vec![
                    widget(),
                    KindRef::namespaced("example.dev", "v1", "Gadget", "gadgets")
                ],
                uid: "gone".into()
            }
        );
        // A ConfigMap is owned by reference: an owner label alone is not
        // how it is controlled.
        let mut labelled_cm = cm(ours(), json!(null));
        labelled_cm["metadata"]["labels"]["wasmop.dev/owner-uid"] = json!("gone");
        assert!(claim_of(&labelled_cm, "good", &[&c]).is_err());
    }

    #[test]
    fn only_refusals_made_entirely_of_foreign_control_over_applies_are_candidates() {
        let plan = Plan {
            apply: vec![wasmop_contract::plan::ApplyOp {
                object: json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "w-cm", "namespace": "ns"}}),
                precondition: None,
                force: false,
                generate: Vec::new(),
            }],
            ..Plan::default()
        };
        let foreign = Violation {
            rule: Rule::NotControlledByPrimary,
            object: "ConfigMap ns/w-cm".into(),
            message: "exists and is controlled by another owner (uid old)".into(),
        };
        assert_eq!(
            refused_applies(&plan, std::slice::from_ref(&foreign)).len(),
            1
        );
        let other = Violation {
            rule: Rule::KindNotOwned,
            object: "Secret ns/x".into(),
            message: String::new(),
        };
        assert!(refused_applies(&plan, &[foreign.clone(), other]).is_empty());
        // A refused delete is not a candidate.
        let delete = Violation {
            object: "ConfigMap ns/elsewhere".into(),
            ..foreign
        };
        assert!(refused_applies(&plan, &[delete]).is_empty());
    }

    #[test]
    fn a_label_owned_object_is_collectable_only_where_the_controller_writes_its_kind() {
        let c = Controller::new("widget", widget())
            .owns(configmap())
            .owns_by_label(secret(), None)
            .write_namespace("target");
        let watched = |ns: &str| ns == "ns" || ns == "target";
        let mut labels = ours();
        labels["wasmop.dev/owner-uid"] = json!("gone");
        let secret_in = |ns: &str, refs: Value| {
            json!({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "s", "namespace": ns, "uid": "u", "labels": labels.clone(),
                    "ownerReferences": refs}})
        };
        let claim = Claim::Label {
            kinds: vec![widget()],
            uid: "gone".into(),
        };
        // In the declared write namespace: yes.
        assert!(
            collectable_where_it_is(&secret_in("target", json!(null)), &claim, &[&c], &watched)
                .is_ok()
        );
        // In a watched namespace a primary may live in, by label alone: no
        // (a made-up owner could be anywhere).
        assert!(
            collectable_where_it_is(&secret_in("ns", json!(null)), &claim, &[&c], &watched)
                .is_err()
        );
        // There, naming its owner by a (non-controller) ownerReference too: yes.
        let named = json!([{"apiVersion": "example.dev/v1", "kind": "Widget", "name": "w",
            "uid": "gone"}]);
        assert!(collectable_where_it_is(&secret_in("ns", named), &claim, &[&c], &watched).is_ok());
        // An ownerReference-controlled object: in a watched namespace only.
        let claim = claim_of(&cm(ours(), widget_ref("old")), "good", &[&c]).unwrap();
        assert!(
            collectable_where_it_is(&cm(ours(), widget_ref("old")), &claim, &[&c], &watched)
                .is_ok()
        );
        let mut far = cm(ours(), widget_ref("old"));
        far["metadata"]["namespace"] = json!("elsewhere");
        assert!(collectable_where_it_is(&far, &claim, &[&c], &watched).is_err());
    }

    #[test]
    fn only_a_list_at_least_as_new_as_the_object_proves_its_owner_gone() {
        assert!(not_older("120", "100"));
        assert!(not_older("100", "100"));
        assert!(!not_older("99", "100"));
        assert!(!not_older("", "100"));
        assert!(!not_older("100", "x"));
    }

    #[test]
    fn collected_uids_are_remembered() {
        let c = Collected::default();
        assert!(!c.contains("a"));
        c.remember("a");
        assert!(c.contains("a"));
        assert!(!c.contains(""));
        assert!(!c.contains("b"));
    }
}
