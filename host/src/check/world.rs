//! The in-memory API server of `wasmop check`: objects by kind, namespace
//! and name, with what the real server does that a plugin depends on.
//!
//! # Guarantees
//!
//! What it models below behaves as the real API server does, for the
//! parts a plugin depends on; what a written object becomes is `writes`,
//! the world as a snapshot's object source is `view`.
//!
//! # What it models
//!
//! - **Server-side apply, one manager deep.** An apply merges the applied
//!   fields into the object; the fields the plugin applied last time and
//!   leaves out now are removed; fields nobody applied (a Service's
//!   `clusterIP`, what the built-in controllers write) are kept. Lists are
//!   atomic. A change of anything but `metadata` and `status` bumps
//!   `metadata.generation`; every change bumps `resourceVersion`; an apply
//!   that changes nothing bumps nothing.
//! - **Status apart:** a status write changes only `status`.
//! - **Preconditions:** an apply with `absent` on an existing object, or
//!   with a `resourceVersion` the object does not have, and a delete whose
//!   UID or resourceVersion does not hold, are conflicts.
//! - **Deletes and finalizers:** an object with finalizers gets a
//!   `deletionTimestamp` and goes when the last finalizer does.
//! - **Garbage collection** (background): an object whose every
//!   ownerReference names a UID that no longer exists is deleted, in turn.
//! - **Immutable fields** the plugins meet: a Job's `spec.template` and
//!   `spec.selector`, a StatefulSet's `spec` other than `replicas`,
//!   `template`, `updateStrategy`, `minReadySeconds`, `ordinals` and
//!   `persistentVolumeClaimRetentionPolicy`, a Deployment's `spec.selector`,
//!   a Service's `spec.clusterIP`: changing one is refused (`Invalid`).
//! - `stringData` of a Secret becomes `data` (base64) as it is written.
//!
//! # What it does not model
//!
//! Admission (webhooks, CEL rules, quota), field managers other than the
//! plugin's own and the built-in controllers', strategic merge of lists,
//! defaulting beyond the few fields above, foreground deletion, watch
//! delays (the stale snapshots of property 5 stand in for them), and the
//! CRD schema (property 7 checks mutations against it apart).

mod view;
mod writes;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde_json::{Value, json};

use crate::contract::manifest::split_api_version;
use crate::object;

pub use self::view::View;
pub use self::writes::normalise;
use self::writes::{
    defaults_on_create, immutable, leaf_paths, merge, merge_patch, remove_path, secret_string_data,
    spec_of,
};

/// Where an object lives: group, kind, namespace (empty for
/// cluster-scoped objects), name.
pub type ObjKey = (String, String, String, String);

/// The key of `obj`.
pub fn key_of(obj: &Value) -> ObjKey {
    let (group, _) = split_api_version(object::api_version(obj));
    (
        group.to_owned(),
        object::kind(obj).to_owned(),
        object::namespace(obj).unwrap_or_default().to_owned(),
        object::name(obj).to_owned(),
    )
}

/// `Kind ns/name` of a key.
pub fn describe_key(k: &ObjKey) -> String {
    object::describe_parts(&k.1, Some(&k.2), &k.3)
}

/// Why a write was not made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteError {
    /// A precondition did not hold.
    Conflict(String),
    /// The server refused the change (an immutable field).
    Invalid(String),
    /// The object does not exist.
    NotFound(String),
}

impl std::fmt::Display for WriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WriteError::Conflict(m) => write!(f, "conflict: {m}"),
            WriteError::Invalid(m) => write!(f, "invalid: {m}"),
            WriteError::NotFound(m) => write!(f, "not found: {m}"),
        }
    }
}

/// The API server's state.
#[derive(Clone, Debug)]
pub struct World {
    objects: BTreeMap<ObjKey, Value>,
    /// The leaf paths the plugin applied last, per object.
    applied: BTreeMap<ObjKey, BTreeSet<Vec<String>>>,
    /// Earlier versions of every object, oldest first (bounded).
    history: BTreeMap<ObjKey, Vec<Value>>,
    rv: u64,
    uids: u64,
    /// Now, as the plugin sees it.
    pub now: jiff::Timestamp,
}

const HISTORY: usize = 8;

impl World {
    /// A world holding `objects` (uids, resourceVersions, generations and
    /// creation times filled where missing, deterministically).
    pub fn new(objects: impl IntoIterator<Item = Value>, now: jiff::Timestamp) -> Self {
        let mut w = World {
            objects: BTreeMap::new(),
            applied: BTreeMap::new(),
            history: BTreeMap::new(),
            rv: 0,
            uids: 0,
            now,
        };
        for mut o in objects {
            object::strip_bookkeeping(&mut o);
            w.insert_new(o);
        }
        w
    }

    /// `now` as RFC 3339.
    pub fn now_text(&self) -> String {
        crate::reconcile::decide::format_now(self.now)
    }

    fn next_rv(&mut self) -> String {
        self.rv += 1;
        self.rv.to_string()
    }

    /// A fresh UID.
    pub fn next_uid(&mut self) -> String {
        self.uids += 1;
        format!("00000000-0000-0000-00c4-{:012x}", self.uids)
    }

    /// Every object, in key order.
    pub fn objects(&self) -> impl Iterator<Item = (&ObjKey, &Value)> {
        self.objects.iter()
    }

    /// The object at `k`.
    pub fn get(&self, k: &ObjKey) -> Option<&Value> {
        self.objects.get(k)
    }

    /// The earlier versions of the object at `k`, oldest first.
    pub fn history(&self, k: &ObjKey) -> &[Value] {
        self.history.get(k).map_or(&[], Vec::as_slice)
    }

    /// The object whose uid is `uid`.
    pub fn by_uid(&self, uid: &str) -> Option<&Value> {
        self.objects.values().find(|o| object::uid(o) == uid)
    }

    fn insert_new(&mut self, mut o: Value) -> Value {
        let uid = if object::uid(&o).is_empty() {
            self.next_uid()
        } else {
            object::uid(&o).to_owned()
        };
        let rv = self.next_rv();
        let now = self.now_text();
        secret_string_data(&mut o);
        if let Some(meta) = o.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("uid".into(), json!(uid));
            meta.insert("resourceVersion".into(), json!(rv));
            meta.entry("generation").or_insert(json!(1));
            meta.entry("creationTimestamp").or_insert(json!(now));
        }
        self.objects.insert(key_of(&o), o.clone());
        o
    }

    fn replace(&mut self, k: &ObjKey, mut new: Value) -> Value {
        let rv = self.next_rv();
        new["metadata"]["resourceVersion"] = json!(rv);
        if let Some(old) = self.objects.insert(k.clone(), new.clone()) {
            let h = self.history.entry(k.clone()).or_default();
            h.push(old);
            if h.len() > HISTORY {
                h.remove(0);
            }
        }
        new
    }

    /// Creates `obj` (as a built-in controller does); a conflict when it
    /// exists.
    ///
    /// # Errors
    /// [`WriteError::Conflict`] when the object exists.
    pub fn create(&mut self, obj: Value) -> Result<Value, WriteError> {
        let k = key_of(&obj);
        if self.objects.contains_key(&k) {
            return Err(WriteError::Conflict(format!("{} exists", describe_key(&k))));
        }
        let mut obj = obj;
        if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("uid");
        }
        Ok(self.insert_new(obj))
    }

    /// A server-side apply of `obj` by the plugin's manager. `fence_uid`:
    /// the object must have this UID (or, `Some("")`, must be absent);
    /// `fence_rv`: this resourceVersion. Returns whether anything changed.
    ///
    /// # Errors
    /// [`WriteError`] when a fence fails or an immutable field changes.
    pub fn apply(
        &mut self,
        obj: &Value,
        fence_uid: Option<&str>,
        fence_rv: Option<&str>,
    ) -> Result<bool, WriteError> {
        let k = key_of(obj);
        let mut obj = obj.clone();
        secret_string_data(&mut obj);
        let paths = leaf_paths(&obj);
        let Some(current) = self.objects.get(&k).cloned() else {
            if fence_uid.is_some_and(|u| !u.is_empty()) || fence_rv.is_some() {
                return Err(WriteError::Conflict(format!(
                    "{} is gone",
                    describe_key(&k)
                )));
            }
            let mut new = obj;
            if let Some(status) = new.as_object_mut().and_then(|m| m.remove("status")) {
                // Status is not written by an apply of the main resource.
                let _ = status;
            }
            defaults_on_create(&mut new, self.rv + 1);
            self.insert_new(new);
            self.applied.insert(k, paths);
            return Ok(true);
        };
        if fence_uid == Some("") {
            return Err(WriteError::Conflict(format!("{} exists", describe_key(&k))));
        }
        if let Some(u) = fence_uid
            && object::uid(&current) != u
        {
            return Err(WriteError::Conflict(format!(
                "{} has uid {}, not {u}",
                describe_key(&k),
                object::uid(&current)
            )));
        }
        if let Some(rv) = fence_rv
            && object::resource_version(&current) != rv
        {
            return Err(WriteError::Conflict(format!(
                "{} is at resourceVersion {}, not {rv}",
                describe_key(&k),
                object::resource_version(&current)
            )));
        }
        let mut new = current.clone();
        let before = self.applied.get(&k).cloned().unwrap_or_default();
        for gone in before.difference(&paths) {
            if gone.first().map(String::as_str) != Some("status") {
                remove_path(&mut new, gone);
            }
        }
        let mut body = obj;
        if let Some(m) = body.as_object_mut() {
            m.remove("status");
        }
        merge(&mut new, &body);
        self.applied.insert(k.clone(), paths);
        if new == current {
            return Ok(false);
        }
        immutable(&current, &new)?;
        if spec_of(&new) != spec_of(&current) {
            let g = current["metadata"]["generation"].as_i64().unwrap_or(1);
            new["metadata"]["generation"] = json!(g + 1);
        }
        self.replace(&k, new);
        Ok(true)
    }

    /// Writes `status` of the object at `k`. Returns whether it changed.
    ///
    /// # Errors
    /// [`WriteError::NotFound`] when the object is gone.
    pub fn write_status(&mut self, k: &ObjKey, status: Value) -> Result<bool, WriteError> {
        let Some(cur) = self.objects.get(k).cloned() else {
            return Err(WriteError::NotFound(describe_key(k)));
        };
        if cur.get("status") == Some(&status) {
            return Ok(false);
        }
        let mut new = cur;
        new["status"] = status;
        self.replace(k, new);
        Ok(true)
    }

    /// A JSON merge patch of the object at `k` (spec fields: bumps the
    /// generation when they change). Returns whether it changed.
    ///
    /// # Errors
    /// [`WriteError::NotFound`] when the object is gone.
    pub fn merge_patch(&mut self, k: &ObjKey, patch: &Value) -> Result<bool, WriteError> {
        let Some(cur) = self.objects.get(k).cloned() else {
            return Err(WriteError::NotFound(describe_key(k)));
        };
        let mut new = cur.clone();
        merge_patch(&mut new, patch);
        if new == cur {
            return Ok(false);
        }
        if spec_of(&new) != spec_of(&cur) {
            let g = cur["metadata"]["generation"].as_i64().unwrap_or(1);
            new["metadata"]["generation"] = json!(g + 1);
        }
        self.replace(k, new);
        self.settle(k);
        Ok(true)
    }

    /// Replaces the object's finalizers; an object being deleted goes
    /// when it has none left. Returns whether it changed.
    ///
    /// # Errors
    /// [`WriteError::NotFound`] when the object is gone.
    pub fn set_finalizers(&mut self, k: &ObjKey, list: &[String]) -> Result<bool, WriteError> {
        let patch = json!({"metadata": {"finalizers": if list.is_empty() { Value::Null } else { json!(list) }}});
        self.merge_patch(k, &patch)
    }

    /// A user's (or the host's) edit of an object's spec: the object as
    /// given replaces the old one's spec and labels; generation bumps.
    pub fn edit(&mut self, k: &ObjKey, f: impl FnOnce(&mut Value)) -> bool {
        let Some(cur) = self.objects.get(k).cloned() else {
            return false;
        };
        let mut new = cur.clone();
        f(&mut new);
        if new == cur {
            return false;
        }
        if spec_of(&new) != spec_of(&cur) {
            let g = cur["metadata"]["generation"].as_i64().unwrap_or(1);
            new["metadata"]["generation"] = json!(g + 1);
        }
        self.replace(k, new);
        true
    }

    /// Deletes the object at `k` if `uid` and `rv` (when given) hold:
    /// a `deletionTimestamp` while it has finalizers, gone otherwise (and
    /// then garbage collection runs).
    ///
    /// # Errors
    /// [`WriteError::Conflict`] when a precondition fails.
    pub fn delete(
        &mut self,
        k: &ObjKey,
        uid: Option<&str>,
        rv: Option<&str>,
    ) -> Result<bool, WriteError> {
        let Some(cur) = self.objects.get(k).cloned() else {
            return Ok(false);
        };
        if let Some(u) = uid.filter(|u| !u.is_empty())
            && object::uid(&cur) != u
        {
            return Err(WriteError::Conflict(format!(
                "{} has uid {}, not {u}",
                describe_key(k),
                object::uid(&cur)
            )));
        }
        if let Some(r) = rv.filter(|r| !r.is_empty())
            && object::resource_version(&cur) != r
        {
            return Err(WriteError::Conflict(format!(
                "{} is at resourceVersion {}, not {r}",
                describe_key(k),
                object::resource_version(&cur)
            )));
        }
        if object::is_deleting(&cur) {
            return Ok(false);
        }
        if object::finalizers(&cur).is_empty() {
            self.remove(k);
        } else {
            let mut new = cur;
            new["metadata"]["deletionTimestamp"] = json!(self.now_text());
            self.replace(k, new);
        }
        Ok(true)
    }

    /// Removes an object being deleted once its finalizers are gone.
    fn settle(&mut self, k: &ObjKey) {
        if let Some(o) = self.objects.get(k)
            && object::is_deleting(o)
            && object::finalizers(o).is_empty()
        {
            self.remove(k);
        }
    }

    fn remove(&mut self, k: &ObjKey) {
        if let Some(old) = self.objects.remove(k) {
            self.applied.remove(k);
            self.history.entry(k.clone()).or_default().push(old);
            self.rv += 1;
        }
        self.collect_garbage();
    }

    /// Background garbage collection: deletes (in turn) every object whose
    /// ownerReferences all name UIDs that no longer exist.
    pub fn collect_garbage(&mut self) {
        loop {
            let uids: BTreeSet<String> = self
                .objects
                .values()
                .map(|o| object::uid(o).to_owned())
                .collect();
            let orphan = self.objects.iter().find_map(|(k, o)| {
                let refs = o["metadata"]["ownerReferences"].as_array()?;
                (!refs.is_empty()
                    && !object::is_deleting(o)
                    && refs
                        .iter()
                        .all(|r| !uids.contains(r["uid"].as_str().unwrap_or_default())))
                .then(|| k.clone())
            });
            let Some(k) = orphan else { return };
            if self.delete(&k, None, None).is_err() {
                return;
            }
        }
    }

    /// A view of every object, for snapshots and validation.
    pub fn view(&self) -> View {
        View {
            objects: self
                .objects
                .iter()
                .map(|(k, v)| (k.clone(), Arc::new(v.clone())))
                .collect(),
        }
    }

    /// The objects that `owner_uid` controls (controller ownerReference or
    /// the owner label).
    pub fn controlled_by(&self, owner_uid: &str) -> Vec<(&ObjKey, &Value)> {
        self.objects
            .iter()
            .filter(|(_, o)| object::owner_uids(o).contains(&owner_uid))
            .collect()
    }

    /// Every object without its resourceVersion and generations (which
    /// only count writes): two equal ones are the same state, for finding
    /// a cycle.
    pub fn cycle_content(&self) -> Vec<(ObjKey, Value)> {
        fn strip(v: &mut Value) {
            match v {
                Value::Object(m) => {
                    m.retain(|k, _| {
                        k != "resourceVersion" && k != "generation" && k != "observedGeneration"
                    });
                    m.values_mut().for_each(strip);
                }
                Value::Array(a) => a.iter_mut().for_each(strip),
                _ => {}
            }
        }
        self.objects
            .iter()
            .map(|(k, v)| {
                let mut v = v.clone();
                strip(&mut v);
                (k.clone(), v)
            })
            .collect()
    }

    /// [`World::content`] of the objects `uids` name and what they control.
    pub fn content_of(&self, uids: &BTreeSet<String>) -> BTreeMap<ObjKey, Value> {
        let keys: BTreeSet<ObjKey> = self
            .objects
            .iter()
            .filter(|(_, o)| {
                uids.contains(object::uid(o))
                    || object::owner_uids(o).iter().any(|u| uids.contains(*u))
            })
            .map(|(k, _)| k.clone())
            .collect();
        self.content()
            .into_iter()
            .filter(|(k, _)| keys.contains(k))
            .collect()
    }

    /// The world's content without what differs between equal histories
    /// (uids, resourceVersions, times), for comparing fixpoints.
    pub fn content(&self) -> BTreeMap<ObjKey, Value> {
        self.objects
            .iter()
            .map(|(k, v)| {
                let mut v = v.clone();
                normalise(&mut v);
                (k.clone(), v)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn world() -> World {
        World::new(
            vec![json!({"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": "a", "namespace": "ns"}, "data": {"x": "1"}})],
            "2026-01-01T00:00:00Z".parse().unwrap(),
        )
    }

    fn key(kind: &str, name: &str) -> ObjKey {
        (String::new(), kind.into(), "ns".into(), name.into())
    }

    #[test]
    fn an_apply_removes_what_it_applied_before_and_keeps_what_others_set() {
        let mut w = world();
        let svc = json!({"apiVersion": "v1", "kind": "Service",
                         "metadata": {"name": "s", "namespace": "ns", "labels": {"a": "1", "b": "2"}},
                         "spec": {"ports": [{"port": 80}]}});
        assert_eq!(w.apply(&svc, None, None), Ok(true));
        let ip = w.get(&key("Service", "s")).unwrap()["spec"]["clusterIP"].clone();
        assert!(ip.is_string());
        let mut less = svc.clone();
        less["metadata"]["labels"] = json!({"a": "1"});
        assert_eq!(w.apply(&less, None, None), Ok(true));
        let s = w.get(&key("Service", "s")).unwrap();
        assert_eq!(s["metadata"]["labels"], json!({"a": "1"}));
        assert_eq!(s["spec"]["clusterIP"], ip);
        // The same apply again changes nothing, not even the version.
        let rv = object::resource_version(s).to_owned();
        assert_eq!(w.apply(&less, None, None), Ok(false));
        assert_eq!(
            object::resource_version(w.get(&key("Service", "s")).unwrap()),
            rv
        );
    }

    #[test]
    fn generation_moves_with_the_spec_not_with_metadata_or_status() {
        let mut w = world();
        let k = key("ConfigMap", "a");
        let cm = |v: &str| {
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                                  "metadata": {"name": "a", "namespace": "ns"}, "data": {"x": v}})
        };
        w.apply(&cm("2"), None, None).unwrap();
        assert_eq!(w.get(&k).unwrap()["metadata"]["generation"], 2);
        w.write_status(&k, json!({"ok": true})).unwrap();
        assert_eq!(w.get(&k).unwrap()["metadata"]["generation"], 2);
    }

    #[test]
    fn finalizers_hold_a_delete_and_garbage_collection_follows_owners() {
        let mut w = world();
        let k = key("ConfigMap", "a");
        w.set_finalizers(&k, &["f".into()]).unwrap();
        let uid = object::uid(w.get(&k).unwrap()).to_owned();
        let child = json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "c", "namespace": "ns",
                         "ownerReferences": [{"uid": uid, "controller": true}]}});
        w.apply(&child, None, None).unwrap();
        assert_eq!(w.delete(&k, Some("wrong"), None).map_err(|_| ()), Err(()));
        w.delete(&k, None, None).unwrap();
        assert!(object::is_deleting(w.get(&k).unwrap()));
        assert!(w.get(&key("Secret", "c")).is_some());
        w.set_finalizers(&k, &[]).unwrap();
        assert!(w.get(&k).is_none());
        assert!(w.get(&key("Secret", "c")).is_none(), "collected");
    }

    #[test]
    fn immutable_fields_are_refused() {
        let mut w = world();
        let job = |image: &str| {
            json!({"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "j", "namespace": "ns"},
            "spec": {"template": {"spec": {"containers": [{"image": image}]}}}})
        };
        w.apply(&job("a"), None, None).unwrap();
        assert!(matches!(
            w.apply(&job("b"), None, None),
            Err(WriteError::Invalid(_))
        ));
    }
}
