//! Write economy: which writes of a plan would change nothing, so are not
//! made.
//!
//! A reconcile whose desired objects already hold makes no API write. An
//! apply is skipped when the object as judged (same UID, same
//! resourceVersion) already holds every field of the object the host would
//! apply **and** carries the [`APPLIED_ANNOTATION`] digest of exactly that
//! body. The digest is what makes a skip safe without the object's
//! `managedFields` (which the caches drop): a field the plugin stopped
//! setting changes the digest, so the apply that removes the field is made;
//! a field someone else changed or removed breaks "holds", so the apply that
//! restores it is made.
//!
//! # Caveats
//!
//! "Holds" is structural: maps are compared key by key (extra keys on the
//! server, such as defaults, are fine), lists item by item with equal
//! length, scalars by equality. A value the API server normalises (a
//! Quantity `1000m` stored as `1`) never holds, so such an object is
//! applied on every reconcile, as before: a wasted write, never a missed
//! one.

use std::collections::HashMap;
use std::sync::Mutex;

use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

/// Annotation on every applied object: a digest of the body the host last
/// applied (`sha256:` and 16 hex digits).
pub const APPLIED_ANNOTATION: &str = "wasmop.dev/applied";

/// Puts the [`APPLIED_ANNOTATION`] digest of `obj` (as it is, without the
/// annotation) on `obj`.
pub fn stamp(obj: &mut Value) {
    // The body without a stamp; an empty annotations map and none are the
    // same body. (`get_mut`, not indexing, which would insert nulls.)
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut)
        && let Some(ann) = meta.get_mut("annotations").and_then(Value::as_object_mut)
    {
        ann.remove(APPLIED_ANNOTATION);
        if ann.is_empty() {
            meta.remove("annotations");
        }
    }
    let digest = Sha256::digest(obj.to_string().as_bytes());
    let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    let ann = meta
        .entry("annotations")
        .or_insert_with(|| Value::Object(Map::new()));
    if !ann.is_object() {
        *ann = json!({});
    }
    ann[APPLIED_ANNOTATION] = json!(format!("sha256:{hex}"));
}

/// True when `current` already holds every field of `desired`: an apply of
/// `desired` would change nothing. A null, empty map or empty list in
/// `desired` holds when `current` lacks the field.
pub fn holds(desired: &Value, current: &Value) -> bool {
    match (desired, current) {
        (Value::Object(d), Value::Object(c)) => d.iter().all(|(k, dv)| match c.get(k) {
            Some(cv) => holds(dv, cv),
            None => is_empty(dv),
        }),
        (Value::Array(d), Value::Array(c)) => {
            d.len() == c.len() && d.iter().zip(c).all(|(dv, cv)| holds(dv, cv))
        }
        (Value::Object(_) | Value::Array(_), Value::Null) => is_empty(desired),
        (d, c) => d == c,
    }
}

/// True when a JSON merge patch applied to `current` would change nothing:
/// every non-null field of `patch` holds and every null names an absent
/// field.
pub fn patch_holds(patch: &Value, current: &Value) -> bool {
    match (patch, current) {
        (Value::Object(p), Value::Object(c)) => p.iter().all(|(k, pv)| match (pv, c.get(k)) {
            (Value::Null, found) => found.is_none_or(Value::is_null),
            (_, Some(cv)) => patch_holds(pv, cv),
            (_, None) => false,
        }),
        (Value::Object(p), _) => p.values().all(Value::is_null),
        (p, c) => p == c,
    }
}

/// The status this process last wrote per primary UID, with the
/// resourceVersion the primary had before the write. Until the watch
/// delivers that write the cache shows the primary at the older version:
/// the worker does not plan from it ([`behind_own_status`]), and a status
/// compared while it is so is compared with what was written
/// ([`current_status`]), not the stale cached one.
static WRITTEN_STATUS: Mutex<Option<HashMap<String, (String, Value)>>> = Mutex::new(None);

/// Bound on [`WRITTEN_STATUS`]; when reached, it starts over (a forgotten
/// entry costs at most one redundant write).
const WRITTEN_STATUS_MAX: usize = 100_000;

/// Records that `status` was written to the primary `uid`, which was at
/// `before_rv` when the write was made.
pub fn remember_status(uid: &str, before_rv: &str, status: &Value) {
    let mut memo = WRITTEN_STATUS.lock().unwrap_or_else(|p| p.into_inner());
    let memo = memo.get_or_insert_with(HashMap::new);
    if memo.len() >= WRITTEN_STATUS_MAX {
        memo.clear();
    }
    memo.insert(uid.to_owned(), (before_rv.to_owned(), status.clone()));
}

/// True when the cache shows the primary `uid` at `rv`, the version this
/// process's last status write to it was made over: the server already
/// holds that write, the cache does not yet. A plan made from this primary
/// would start from a status it replaced, and its status write would put
/// the older state back.
pub fn behind_own_status(uid: &str, rv: &str) -> bool {
    let memo = WRITTEN_STATUS.lock().unwrap_or_else(|p| p.into_inner());
    memo.as_ref()
        .and_then(|m| m.get(uid))
        .is_some_and(|(before, _)| before == rv)
}

/// The status the primary `uid` has on the server when the cache shows it
/// at `rv` with `cached`: what this process wrote if `rv` is the version it
/// wrote over, else `cached`.
pub fn current_status(uid: &str, rv: &str, cached: &Value) -> Value {
    let memo = WRITTEN_STATUS.lock().unwrap_or_else(|p| p.into_inner());
    match memo.as_ref().and_then(|m| m.get(uid)) {
        Some((before, written)) if before == rv => written.clone(),
        _ => cached.clone(),
    }
}

/// Gives each condition of `status` whose type and status are unchanged
/// from `current` the `lastTransitionTime` it has there: nothing
/// transitioned, whatever the snapshot (possibly older than our last write)
/// led the plugin to compute.
pub fn keep_transition_times(status: &mut Value, current: &Value) {
    let Some(now) = status["conditions"].as_array_mut() else {
        return;
    };
    let Some(before) = current["conditions"].as_array() else {
        return;
    };
    for c in now {
        if let Some(old) = before
            .iter()
            .find(|o| o["type"] == c["type"] && o["status"] == c["status"])
            && old.get("lastTransitionTime").is_some()
        {
            c["lastTransitionTime"] = old["lastTransitionTime"].clone();
        }
    }
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_defaults_and_other_fields_still_hold() {
        let desired = json!({"metadata": {"name": "a", "labels": {"x": "1"}},
            "spec": {"ports": [{"port": 80}]}, "data": {}});
        let current = json!({"metadata": {"name": "a", "uid": "u", "labels": {"x": "1", "y": "2"}},
            "spec": {"ports": [{"port": 80, "protocol": "TCP"}]}});
        assert!(holds(&desired, &current));
    }

    #[test]
    fn a_changed_missing_or_extra_item_does_not_hold() {
        let desired = json!({"data": {"a": "1"}, "list": [1, 2]});
        assert!(!holds(
            &desired,
            &json!({"data": {"a": "2"}, "list": [1, 2]})
        ));
        assert!(!holds(&desired, &json!({"data": {}, "list": [1, 2]})));
        assert!(!holds(&desired, &json!({"data": {"a": "1"}, "list": [1]})));
        assert!(!holds(
            &desired,
            &json!({"data": {"a": "1"}, "list": [1, 2, 3]})
        ));
        assert!(!holds(&json!({"n": 1}), &json!({"n": "1"})));
    }

    #[test]
    fn the_stamp_changes_with_the_body_and_ignores_an_old_stamp() {
        let mut a = json!({"metadata": {"name": "a"}, "data": {"k": "v"}});
        stamp(&mut a);
        let first = a["metadata"]["annotations"][APPLIED_ANNOTATION].clone();
        assert!(first.as_str().unwrap().starts_with("sha256:"));
        // Stamping again (the old stamp is not part of the digest) is stable.
        stamp(&mut a);
        assert_eq!(a["metadata"]["annotations"][APPLIED_ANNOTATION], first);
        // A field the plugin stopped setting changes the digest, so an
        // object still holding the old field no longer holds the new body.
        let mut b = json!({"metadata": {"name": "a"}, "data": {}});
        stamp(&mut b);
        assert_ne!(b["metadata"]["annotations"][APPLIED_ANNOTATION], first);
        assert!(!holds(&b, &a));
        assert!(holds(&a, &a));
    }

    #[test]
    fn a_status_written_over_the_cached_version_is_the_current_one() {
        let cached = json!({"value": "old"});
        assert_eq!(current_status("uid-memo", "5", &cached), cached);
        remember_status("uid-memo", "5", &json!({"value": "new"}));
        // The cache still shows version 5: the status on the server is ours.
        assert_eq!(
            current_status("uid-memo", "5", &cached),
            json!({"value": "new"})
        );
        // A later version is the truth, whatever it holds.
        assert_eq!(current_status("uid-memo", "7", &cached), cached);
    }

    #[test]
    fn a_primary_cached_from_before_our_status_write_is_behind_it() {
        assert!(!behind_own_status("uid-behind", "5"), "nothing written");
        remember_status("uid-behind", "5", &json!({"ring": 2}));
        assert!(behind_own_status("uid-behind", "5"), "cache still at 5");
        assert!(!behind_own_status("uid-behind", "6"), "the write arrived");
        assert!(!behind_own_status("uid-other", "5"), "another primary");
    }

    #[test]
    fn an_unchanged_condition_keeps_its_transition_time() {
        let current = json!({"conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": "t1"},
            {"type": "Done", "status": "False", "lastTransitionTime": "t1"}]});
        let mut status = json!({"conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": "t2"},
            {"type": "Done", "status": "True", "lastTransitionTime": "t2"}]});
        keep_transition_times(&mut status, &current);
        assert_eq!(status["conditions"][0]["lastTransitionTime"], "t1");
        assert_eq!(status["conditions"][1]["lastTransitionTime"], "t2");
    }

    #[test]
    fn a_merge_patch_holds_when_it_changes_nothing() {
        let current = json!({"metadata": {"annotations": {"a": "1"}}, "spec": {"x": 1}});
        assert!(patch_holds(&json!({"spec": {"x": 1}}), &current));
        assert!(patch_holds(
            &json!({"metadata": {"annotations": {"b": null}}}),
            &current
        ));
        assert!(!patch_holds(
            &json!({"metadata": {"annotations": {"a": null}}}),
            &current
        ));
        assert!(!patch_holds(&json!({"spec": {"y": 2}}), &current));
        assert!(!patch_holds(&json!({"spec": {"x": 2}}), &current));
    }
}
