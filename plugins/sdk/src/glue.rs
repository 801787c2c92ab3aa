//! Conversions between the native contract types and the WIT-level types
//! `wit-bindgen` generates ([`crate::raw`]).
//!
//! Objects are `serde_json::Value` on the native side and JSON text on the
//! WIT side; everything else maps field by field. Native → WIT never fails.
//! WIT → native parses JSON text and fails with
//! [`ReconcileError::Internal`] naming the field.

use serde_json::Value;

use crate::raw as wit;
use crate::{
    ApplyOp, Controller, DeleteOp, Event, EventType, FieldRef, HttpMethod, HttpRequest, HttpTarget,
    KindRef, Manifest, ObjectRef, Observation, Plan, Plugin, Precondition, Read, ReconcileError,
    RelatedObject, SecretHeader, Selector, SettingsProblem, Snapshot,
};

/// Field-wise conversion used by [`records!`]: identity for scalars, element
/// by element for lists and options, `From` for records.
trait Conv<T> {
    fn conv(self) -> T;
}

macro_rules! identity_conv {
    ($($t:ty),*) => { $(impl Conv<$t> for $t { fn conv(self) -> $t { self } })* };
}
identity_conv!(String, bool, u16, u32, u64, (String, String));

impl<A: Conv<B>, B> Conv<Vec<B>> for Vec<A> {
    fn conv(self) -> Vec<B> {
        self.into_iter().map(Conv::conv).collect()
    }
}

impl<A: Conv<B>, B> Conv<Option<B>> for Option<A> {
    fn conv(self) -> Option<B> {
        self.map(Conv::conv)
    }
}

/// Both `From` directions (and [`Conv`]) for records whose native and WIT
/// fields have the same names and convertible types.
macro_rules! records {
    ($($name:ident { $($field:ident),* $(,)? })*) => {$(
        impl From<$name> for wit::$name {
            fn from(n: $name) -> Self {
                wit::$name { $($field: Conv::conv(n.$field)),* }
            }
        }
        impl From<wit::$name> for $name {
            fn from(w: wit::$name) -> Self {
                $name { $($field: Conv::conv(w.$field)),* }
            }
        }
        impl Conv<wit::$name> for $name {
            fn conv(self) -> wit::$name { self.into() }
        }
        impl Conv<$name> for wit::$name {
            fn conv(self) -> $name { self.into() }
        }
    )*};
}

/// Both `From` directions (and [`Conv`]) for enums whose cases match one to one.
macro_rules! enums {
    ($($name:ident { $($case:ident $(($inner:ident))?),* $(,)? })*) => {$(
        impl From<$name> for wit::$name {
            fn from(n: $name) -> Self {
                match n { $($name::$case $(($inner))? => wit::$name::$case $((Conv::conv($inner)))?),* }
            }
        }
        impl From<wit::$name> for $name {
            fn from(w: wit::$name) -> Self {
                match w { $(wit::$name::$case $(($inner))? => $name::$case $((Conv::conv($inner)))?),* }
            }
        }
        impl Conv<wit::$name> for $name {
            fn conv(self) -> wit::$name { self.into() }
        }
        impl Conv<$name> for wit::$name {
            fn conv(self) -> $name { self.into() }
        }
    )*};
}

records! {
    KindRef { group, version, kind, plural, namespaced }
    FieldRef { name_path, namespace_path }
    Read { id, kind, selector }
    HttpTarget { id, kind, ports }
    Controller { name, primary, owns, reads, finalizer, write_namespaces, primary_fields, http_targets, delete_primary }
    Manifest { name, version, controllers }
    SettingsProblem { path, message }
    ObjectRef { api_version, kind, namespace, name }
    DeleteOp { target, uid, resource_version }
    Event { event_type, reason, message }
    SecretHeader { name, secret, key, prefix }
}

enums! {
    Selector { OwnedByPrimary, Field(f), SameNamespace, ClusterWide, Labels(l) }
    Precondition { Absent, ResourceVersion(rv) }
    EventType { Normal, Warning }
    HttpMethod { Get, Post, Put, Delete }
    ReconcileError { InvalidSpec(m), NotReady(m), Internal(m) }
}

fn text(value: &Value) -> String {
    value.to_string()
}

fn parse(what: impl FnOnce() -> String, text: &str) -> Result<Value, ReconcileError> {
    serde_json::from_str(text)
        .map_err(|e| ReconcileError::internal(format!("{} is not valid JSON: {e}", what())))
}

impl From<ApplyOp> for wit::ApplyOp {
    fn from(op: ApplyOp) -> Self {
        wit::ApplyOp {
            object: text(&op.object),
            precondition: op.precondition.conv(),
            force: op.force,
        }
    }
}

impl From<HttpRequest> for wit::HttpRequest {
    fn from(r: HttpRequest) -> Self {
        wit::HttpRequest {
            id: r.id,
            target: r.target,
            object: r.object,
            port: r.port,
            method: r.method.into(),
            path: r.path,
            body: r.body.into_bytes(),
            headers: r.headers,
            secret_headers: r.secret_headers.conv(),
            timeout_ms: r.timeout_ms,
            max_response_bytes: r.max_response_bytes,
            max_age_ms: r.max_age_ms,
        }
    }
}

impl From<Plan> for wit::Plan {
    fn from(p: Plan) -> Self {
        wit::Plan {
            apply: p.apply.into_iter().map(Into::into).collect(),
            delete: p.delete.conv(),
            status: p.status.as_ref().map(text),
            primary_patch: p.primary_patch.as_ref().map(text),
            events: p.events.conv(),
            requeue_after_ms: p.requeue_after_ms,
            cleanup_complete: p.cleanup_complete,
            http_requests: p.http_requests.into_iter().map(Into::into).collect(),
        }
    }
}

impl TryFrom<wit::Plan> for Plan {
    type Error = ReconcileError;

    fn try_from(p: wit::Plan) -> Result<Self, ReconcileError> {
        let apply = p
            .apply
            .into_iter()
            .enumerate()
            .map(|(i, op)| {
                Ok(ApplyOp {
                    object: parse(|| format!("plan apply[{i}].object"), &op.object)?,
                    precondition: op.precondition.conv(),
                    force: op.force,
                })
            })
            .collect::<Result<_, ReconcileError>>()?;
        let http_requests = p
            .http_requests
            .into_iter()
            .map(|r| {
                let body = String::from_utf8(r.body).map_err(|_| {
                    ReconcileError::internal(format!(
                        "plan http request `{}` body is not UTF-8",
                        r.id
                    ))
                })?;
                Ok(HttpRequest {
                    id: r.id,
                    target: r.target,
                    object: r.object,
                    port: r.port,
                    method: r.method.into(),
                    path: r.path,
                    body,
                    headers: r.headers,
                    secret_headers: r.secret_headers.conv(),
                    timeout_ms: r.timeout_ms,
                    max_response_bytes: r.max_response_bytes,
                    max_age_ms: r.max_age_ms,
                })
            })
            .collect::<Result<_, ReconcileError>>()?;
        Ok(Plan {
            apply,
            delete: p.delete.conv(),
            status: p
                .status
                .map(|s| parse(|| "plan status".to_owned(), &s))
                .transpose()?,
            primary_patch: p
                .primary_patch
                .map(|s| parse(|| "plan primary patch".to_owned(), &s))
                .transpose()?,
            events: p.events.conv(),
            requeue_after_ms: p.requeue_after_ms,
            cleanup_complete: p.cleanup_complete,
            http_requests,
        })
    }
}

impl From<Observation> for wit::Observation {
    fn from(o: Observation) -> Self {
        wit::Observation {
            id: o.id,
            status: o.status,
            body: o.body.into_bytes(),
            error: o.error,
            observed_at: o.observed_at,
            age_ms: o.age_ms,
        }
    }
}

impl From<wit::Observation> for Observation {
    fn from(o: wit::Observation) -> Self {
        Observation {
            id: o.id,
            status: o.status,
            body: match String::from_utf8(o.body) {
                Ok(s) => s,
                Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
            },
            error: o.error,
            observed_at: o.observed_at,
            age_ms: o.age_ms,
        }
    }
}

impl From<Snapshot> for wit::Snapshot {
    fn from(s: Snapshot) -> Self {
        wit::Snapshot {
            controller: s.controller,
            primary: text(&s.primary),
            owned: s.owned.iter().map(text).collect(),
            related: s
                .related
                .into_iter()
                .map(|r| wit::RelatedObject {
                    object: text(&r.object),
                    read: r.read,
                })
                .collect(),
            now: s.now,
            deleting: s.deleting,
            settings: text(&s.settings),
            observations: s.observations.into_iter().map(Into::into).collect(),
        }
    }
}

impl TryFrom<wit::Snapshot> for Snapshot {
    type Error = ReconcileError;

    fn try_from(s: wit::Snapshot) -> Result<Self, ReconcileError> {
        let owned = s
            .owned
            .iter()
            .enumerate()
            .map(|(i, o)| parse(|| format!("snapshot owned[{i}]"), o))
            .collect::<Result<_, _>>()?;
        let related = s
            .related
            .into_iter()
            .enumerate()
            .map(|(i, r)| {
                Ok(RelatedObject {
                    object: parse(|| format!("snapshot related[{i}] ({})", r.read), &r.object)?,
                    read: r.read,
                })
            })
            .collect::<Result<_, ReconcileError>>()?;
        Ok(Snapshot {
            controller: s.controller,
            primary: parse(|| "snapshot primary".to_owned(), &s.primary)?,
            owned,
            related,
            now: s.now,
            deleting: s.deleting,
            settings: parse(|| "snapshot settings".to_owned(), &s.settings)?,
            observations: s.observations.into_iter().map(Into::into).collect(),
        })
    }
}

/// Parses the settings text and hands it to the plugin.
pub(crate) fn validate_settings<P: Plugin>(settings: &str) -> Result<(), Vec<SettingsProblem>> {
    let value: Value = serde_json::from_str(settings).map_err(|e| {
        vec![SettingsProblem::new(
            "",
            format!("settings are not valid JSON: {e}"),
        )]
    })?;
    P::validate_settings(&value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::time::Duration;

    #[test]
    fn manifest_survives_a_round_trip_through_wit() {
        let manifest = Manifest::new("p", "1.2.3").controller(
            Controller::new("c", KindRef::namespaced("g", "v1", "K", "ks"))
                .owns(KindRef::cluster_scoped("", "v1", "Namespace", "namespaces"))
                .reads(Read::new(
                    "ref",
                    KindRef::namespaced("g", "v1", "R", "rs"),
                    Selector::field_in("spec.ref.name", "spec.ref.namespace"),
                ))
                .reads(Read::new(
                    "lbl",
                    KindRef::namespaced("g", "v1", "R", "rs"),
                    Selector::Labels("a=b".into()),
                ))
                .finalizer("g/f")
                .write_namespace("*")
                .write_namespace_from_setting("target")
                .delete_primary()
                .primary_field("spec.id")
                .http_target(
                    "api",
                    KindRef::namespaced("", "v1", "Service", "services"),
                    &[80, 443],
                ),
        );
        let wit_manifest: wit::Manifest = manifest.clone().into();
        assert_eq!(wit_manifest.controllers[0].http_targets[0].ports, [80, 443]);
        assert!(matches!(
            wit_manifest.controllers[0].reads[1].selector,
            wit::Selector::Labels(ref l) if l == "a=b"
        ));
        assert_eq!(Manifest::from(wit_manifest), manifest);
    }

    #[test]
    fn plan_objects_cross_as_json_text_and_come_back_equal() {
        let seen = json!({"apiVersion": "v1", "kind": "ConfigMap",
                          "metadata": {"name": "old", "namespace": "ns", "uid": "u", "resourceVersion": "1"}});
        let plan = Plan::new()
            .apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}}))
            .apply_at(json!({"kind": "X"}), "7")
            .apply_forced(json!({"kind": "Y"}))
            .delete_owned(&seen)
            .unwrap()
            .status(json!({"ready": true}))
            .primary_patch(json!({"spec": {"id": "x"}}))
            .warning("W", "w")
            .requeue_after(Duration::from_secs(1))
            .cleanup_complete()
            .http(HttpRequest::new("id", HttpMethod::Post, "t", "o", 1, "/p").body("{}"));
        let wit_plan: wit::Plan = plan.clone().into();
        assert_eq!(
            wit_plan.apply[0].object,
            r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a"}}"#
        );
        assert!(!wit_plan.apply[0].force && wit_plan.apply[2].force);
        assert_eq!(wit_plan.status.as_deref(), Some(r#"{"ready":true}"#));
        assert_eq!(wit_plan.http_requests[0].body, b"{}");
        assert_eq!(Plan::try_from(wit_plan).unwrap(), plan);
    }

    #[test]
    fn malformed_plan_json_is_reported_with_its_place() {
        let mut wit_plan: wit::Plan = Plan::new().into();
        wit_plan.apply.push(wit::ApplyOp {
            object: "{not json".into(),
            precondition: None,
            force: false,
        });
        let err = Plan::try_from(wit_plan).unwrap_err();
        assert!(
            err.message()
                .starts_with("plan apply[0].object is not valid JSON"),
            "{err}"
        );
    }

    #[test]
    fn snapshot_survives_a_round_trip_and_bad_json_is_internal() {
        let snapshot: Snapshot = serde_json::from_value(json!({
            "controller": "c", "primary": {"kind": "K"}, "owned": [{"kind": "A"}],
            "related": [{"read": "r", "object": {"kind": "B"}}], "now": "2025-01-01T00:00:00Z",
            "deleting": true, "settings": {"x": 1},
            "observations": [{"id": "o", "status": null, "body": "b", "error": "timeout",
                              "observedAt": "2025-01-01T00:00:00Z", "ageMs": 5}]
        }))
        .unwrap();
        let mut wit_snapshot: wit::Snapshot = snapshot.clone().into();
        assert_eq!(wit_snapshot.related[0].read, "r");
        assert_eq!(Snapshot::try_from(wit_snapshot.clone()).unwrap(), snapshot);

        wit_snapshot.owned[0] = "[".into();
        assert!(matches!(
            Snapshot::try_from(wit_snapshot),
            Err(ReconcileError::Internal(m)) if m.starts_with("snapshot owned[0] is not valid JSON")
        ));
    }

    #[test]
    fn observation_bodies_that_are_not_utf8_are_replaced_not_dropped() {
        let o = Observation::from(wit::Observation {
            id: "o".into(),
            status: Some(200),
            body: vec![b'o', b'k', 0xff],
            error: None,
            observed_at: String::new(),
            age_ms: 0,
        });
        assert_eq!(o.body, "ok\u{fffd}");
    }

    #[test]
    fn errors_keep_their_variant_across_the_boundary() {
        let e: wit::ReconcileError = ReconcileError::not_ready("later").into();
        assert!(matches!(e, wit::ReconcileError::NotReady(ref m) if m == "later"));
        assert_eq!(ReconcileError::from(e), ReconcileError::not_ready("later"));
    }
}
