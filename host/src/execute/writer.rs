//! Execution of a validated plan against the Kubernetes API: server-side
//! apply under the plugin's field manager, preconditioned creates and
//! deletes, one status write, finalizers and Events.
//!
//! Nothing here decides *whether* a write is allowed; `plan::validate` did
//! that for the whole plan before the first call into this module.
//!
//! # Guarantees
//! - Deletes always carry UID and resourceVersion preconditions; a failed
//!   precondition is reported as [`ApplyError::Conflict`], never forced.
//! - An apply with a resourceVersion precondition sends it with the apply
//!   (optimistic concurrency); one that requires absence is a create.
//! - Fields owned by another field manager are never overwritten unless the
//!   plan asks for it: an apply is forced only when its op says `force`.
//!   The status is the plugin's outright: its write sets the whole status.
//! - The status write is fenced by identity: it lands only on the object
//!   with the UID the status was decided for, never on a successor made
//!   under the same name ([`Writer::write_status`]).
//! - A [`Writer::dry_run`] writer sends every call with `dryRun=All`: the
//!   API server runs validation, CEL rules, admission and quota and
//!   persists nothing.

use kube::Client;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions,
};
use kube::core::Resource;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::object::describe;

/// What must still hold of an existing object for a write to succeed: the
/// API server answers 409 Conflict otherwise, and the write is retried from
/// a fresh snapshot — never forced.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fence<'a> {
    /// The object must still have this UID (it was not deleted and made
    /// anew by someone else).
    pub uid: Option<&'a str>,
    /// The object must still be at exactly this resourceVersion.
    pub resource_version: Option<&'a str>,
}

impl Fence<'static> {
    /// The fence of an object judged absent. The API server creates an
    /// object whose apply carries a resourceVersion (it is ignored on
    /// create), but compares it with an existing object's: no object ever
    /// reaches this version, so an object that appeared since it was judged
    /// absent makes the apply a 409 Conflict instead of an adoption.
    pub const ABSENT: Fence<'static> = Fence {
        uid: None,
        resource_version: Some("18446744073709551615"),
    };
}

/// `obj` with the fence's uid and resourceVersion in its metadata, where an
/// update checks them.
fn fenced(obj: &Value, fence: &Fence<'_>) -> Value {
    let mut body = obj.clone();
    if let Some(uid) = fence.uid {
        body["metadata"]["uid"] = json!(uid);
    }
    if let Some(rv) = fence.resource_version {
        body["metadata"]["resourceVersion"] = json!(rv);
    }
    body
}

/// Why a write failed.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// A precondition did not hold (the object changed, exists, or is gone
    /// since the snapshot); the reconcile is retried, never forced.
    #[error("conflict on {target}: {message}")]
    Conflict {
        /// `Kind namespace/name` of the object.
        target: String,
        /// What the API server said.
        message: String,
    },
    /// The API server refused the write for another reason.
    #[error("writing {target} failed: {message}")]
    Api {
        /// `Kind namespace/name` of the object.
        target: String,
        /// What the API server said.
        message: String,
    },
}

impl ApplyError {
    /// Short CamelCase reason for conditions and Events.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Conflict { .. } => "WriteConflict",
            Self::Api { .. } => "WriteFailed",
        }
    }

    /// The same message, as a conflict when `other` is one (so a batch
    /// whose first failure is a conflict is retried as a conflict).
    pub fn with_reason_of(self, other: &ApplyError) -> Self {
        match (self, other) {
            (Self::Api { target, message }, Self::Conflict { .. }) => {
                Self::Conflict { target, message }
            }
            (me, _) => me,
        }
    }

    fn from_kube(target: String, e: kube::Error) -> Self {
        match &e {
            kube::Error::Api(status)
                if status.code == 409
                    || status.code == 422
                        && status.reason == "Invalid"
                        && (status.message.contains("Precondition")
                            || status.message.contains("metadata.uid")) =>
            {
                Self::Conflict {
                    target,
                    message: status.message.clone(),
                }
            }
            kube::Error::Api(status) => Self::Api {
                target,
                message: format!("{} ({})", status.message, status.code),
            },
            other => Self::Api {
                target,
                message: other.to_string(),
            },
        }
    }
}

/// What the host reads of the API server's answer to an apply: the
/// object's identity after the write, and the names of the non-empty keys
/// of its `data` (a Secret's, for [`GeneratedKey`](crate::judge::validate::GeneratedKey)s;
/// never the values). The rest of the answer (the whole object,
/// managedFields included) is skipped unparsed: the cache gets the object
/// from its watch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Written {
    /// The object's UID.
    pub uid: String,
    /// The object's resourceVersion after the write.
    pub resource_version: String,
    /// The keys of `data` with a non-empty value.
    pub data_keys: std::collections::BTreeSet<String>,
}

impl Written {
    /// What [`Written`] reads of `obj`, an object as JSON.
    pub fn of(obj: &Value) -> Self {
        Written {
            uid: obj["metadata"]["uid"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            resource_version: obj["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            data_keys: obj["data"]
                .as_object()
                .map(|m| {
                    m.iter()
                        .filter(|(_, v)| v.as_str().is_some_and(|v| !v.is_empty()))
                        .map(|(k, _)| k.clone())
                        .collect()
                })
                .unwrap_or_default(),
        }
    }
}

impl<'de> Deserialize<'de> for Written {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        /// A data value: only whether it is empty is kept.
        struct Filled(bool);
        impl<'de> Deserialize<'de> for Filled {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                Ok(Filled(
                    Option::<String>::deserialize(d)?.is_some_and(|v| !v.is_empty()),
                ))
            }
        }
        #[derive(Deserialize)]
        struct Meta {
            #[serde(default)]
            uid: String,
            #[serde(default, rename = "resourceVersion")]
            resource_version: String,
        }
        #[derive(Deserialize)]
        struct Answer {
            metadata: Meta,
            #[serde(default)]
            data: Option<std::collections::BTreeMap<String, Filled>>,
        }
        let a = Answer::deserialize(d)?;
        Ok(Written {
            uid: a.metadata.uid,
            resource_version: a.metadata.resource_version,
            data_keys: a
                .data
                .unwrap_or_default()
                .into_iter()
                .filter(|(_, f)| f.0)
                .map(|(k, _)| k)
                .collect(),
        })
    }
}

fn api_for(client: &Client, resource: &ApiResource, namespace: Option<&str>) -> Api<DynamicObject> {
    match namespace.filter(|n| !n.is_empty()) {
        Some(ns) => Api::namespaced_with(client.clone(), ns, resource),
        None => Api::all_with(client.clone(), resource),
    }
}

fn ns_of(obj: &Value) -> Option<&str> {
    obj["metadata"]["namespace"].as_str()
}

fn name_of(obj: &Value) -> &str {
    obj["metadata"]["name"].as_str().unwrap_or_default()
}

/// True when an apply conflict message names field managers and every one
/// of them is `manager` (`conflict with "wasmop-x" using v1: .data.a`).
fn only_self_conflicts(message: &str, manager: &str) -> bool {
    let mut named = message
        .split("with \"")
        .skip(1)
        .filter_map(|rest| rest.split('"').next())
        .peekable();
    named.peek().is_some() && named.all(|m| m == manager)
}

/// Server-side apply parameters for `field_manager`, forced when asked.
fn apply_params(field_manager: &str, force: bool) -> PatchParams {
    let params = PatchParams::apply(field_manager);
    if force { params.force() } else { params }
}

/// The JSON patch of a status write: a test of the object's UID, then the
/// whole status.
fn status_patch(uid: &str, status: &Value) -> Value {
    json!([
        {"op": "test", "path": "/metadata/uid", "value": uid},
        {"op": "add", "path": "/status", "value": status},
    ])
}

/// True when the API server refused a JSON patch because its `test`
/// operation failed (422; the message names the tested path).
fn is_failed_test(code: u16, message: &str) -> bool {
    code == 422 && message.contains("/metadata/uid")
}

/// Writes objects for one field manager.
#[derive(Clone)]
pub struct Writer {
    client: Client,
    field_manager: String,
    dry_run: bool,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer")
            .field("field_manager", &self.field_manager)
            .field("dry_run", &self.dry_run)
            .finish()
    }
}

impl Writer {
    /// A writer using `field_manager` for every write.
    pub fn new(client: Client, field_manager: impl Into<String>) -> Self {
        Self {
            client,
            field_manager: field_manager.into(),
            dry_run: false,
        }
    }

    /// The same writer, sending every call with `dryRun=All`: nothing it
    /// does is persisted, everything is validated as a real write would be.
    pub fn dry_run(&self) -> Self {
        Self {
            dry_run: true,
            ..self.clone()
        }
    }

    /// True for a [`Writer::dry_run`] writer.
    pub fn is_dry_run(&self) -> bool {
        self.dry_run
    }

    fn patch_params(&self, params: PatchParams) -> PatchParams {
        PatchParams {
            dry_run: self.dry_run,
            ..params
        }
    }

    /// The field manager name.
    pub fn field_manager(&self) -> &str {
        &self.field_manager
    }

    /// Server-side applies `obj` to an existing object, only while `fence`
    /// holds. With `force`, fields another field manager set move to this
    /// one instead of conflicting (`force=true`); the fence still holds.
    /// Returns the object's UID and new resourceVersion ([`Written`]).
    ///
    /// # Errors
    /// [`ApplyError::Conflict`] when another manager owns a field being
    /// changed (without `force`) or the fence does not hold;
    /// [`ApplyError::Api`] otherwise.
    pub async fn apply(
        &self,
        resource: &ApiResource,
        obj: &Value,
        fence: Fence<'_>,
        force: bool,
    ) -> Result<Written, ApplyError> {
        let body = fenced(obj, &fence);
        let send = |force| {
            self.send_apply(
                resource,
                obj,
                None,
                apply_params(&self.field_manager, force),
                &body,
            )
        };
        let applied = match send(force).await {
            // Fields this plugin's own manager holds from a create (an
            // "Update" entry) conflict with its applies; taking them back
            // from itself is no takeover, so only then is the apply forced.
            Err(kube::Error::Api(status))
                if !force
                    && status.code == 409
                    && only_self_conflicts(&status.message, &self.field_manager) =>
            {
                send(true).await
            }
            other => other,
        };
        applied.map_err(|e| ApplyError::from_kube(describe(obj), e))
    }

    /// Sends a server-side apply of `body` to `obj`'s name (or its
    /// `subresource`), and reads only [`Written`] from the answer.
    async fn send_apply(
        &self,
        resource: &ApiResource,
        obj: &Value,
        subresource: Option<&str>,
        params: PatchParams,
        body: &Value,
    ) -> Result<Written, kube::Error> {
        let request = kube::core::Request::new(DynamicObject::url_path(
            resource,
            ns_of(obj).filter(|n| !n.is_empty()),
        ));
        let params = self.patch_params(params);
        let patch = Patch::Apply(body);
        let mut http = match subresource {
            None => request.patch(name_of(obj), &params, &patch),
            Some(sub) => request.patch_subresource(sub, name_of(obj), &params, &patch),
        }
        .map_err(kube::Error::BuildRequest)?;
        http.extensions_mut().insert("patch");
        let text = self.client.request_text(http).await?;
        serde_json::from_str(&text).map_err(kube::Error::SerdeError)
    }

    /// Creates `obj`; fails with a conflict when it already exists.
    ///
    /// # Errors
    /// [`ApplyError::Conflict`] when the object exists.
    pub async fn create(&self, resource: &ApiResource, obj: &Value) -> Result<Value, ApplyError> {
        let dynamic: DynamicObject =
            serde_json::from_value(obj.clone()).map_err(|e| ApplyError::Api {
                target: describe(obj),
                message: format!("not a Kubernetes object: {e}"),
            })?;
        let api = api_for(&self.client, resource, ns_of(obj));
        let pp = PostParams {
            field_manager: Some(self.field_manager.clone()),
            dry_run: self.dry_run,
        };
        api.create(&pp, &dynamic)
            .await
            .map(|o| serde_json::to_value(o).unwrap_or_default())
            .map_err(|e| ApplyError::from_kube(describe(obj), e))
    }

    /// The field manager of the values the host generates
    /// ([`Writer::fill_data`]): `<field manager>-generated`, so the
    /// plugin's own manager never owns them.
    pub fn generated_manager(&self) -> String {
        format!("{}-generated", self.field_manager)
    }

    /// Sets `data` keys of `obj` (a Secret; `data` holds the base64 values)
    /// under [`Writer::generated_manager`], only while `obj` is still at
    /// `resource_version`: a merge patch (an update, so no later apply of
    /// the plugin's manager owns or removes them). The values are never
    /// logged.
    ///
    /// # Errors
    /// [`ApplyError::Conflict`] when the object changed since
    /// `resource_version`; [`ApplyError::Api`] when the API server refuses
    /// it.
    pub async fn fill_data(
        &self,
        resource: &ApiResource,
        obj: &Value,
        resource_version: &str,
        data: &serde_json::Map<String, Value>,
    ) -> Result<Written, ApplyError> {
        let patch = json!({
            "metadata": {"resourceVersion": resource_version},
            "data": data,
        });
        let api = api_for(&self.client, resource, ns_of(obj));
        let pp = self.patch_params(PatchParams {
            field_manager: Some(self.generated_manager()),
            ..PatchParams::default()
        });
        api.patch(name_of(obj), &pp, &Patch::Merge(&patch))
            .await
            .map(|o| Written::of(&serde_json::to_value(o).unwrap_or_default()))
            .map_err(|e| ApplyError::from_kube(describe(obj), e))
    }

    /// Deletes an object if it still has this UID and resourceVersion.
    /// An object that is already gone counts as deleted.
    ///
    /// # Errors
    /// [`ApplyError::Conflict`] when the preconditions do not hold.
    pub async fn delete(
        &self,
        resource: &ApiResource,
        namespace: Option<&str>,
        name: &str,
        uid: &str,
        resource_version: &str,
    ) -> Result<(), ApplyError> {
        let api = api_for(&self.client, resource, namespace);
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid.to_string()),
                resource_version: Some(resource_version.to_string()),
            }),
            dry_run: self.dry_run,
            ..DeleteParams::background()
        };
        let target = match namespace.filter(|n| !n.is_empty()) {
            Some(ns) => format!("{} {ns}/{name}", resource.kind),
            None => format!("{} {name}", resource.kind),
        };
        match api.delete(name, &dp).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(ApplyError::from_kube(target, e)),
        }
    }

    /// Writes `status` of `primary` through the status subresource, only
    /// while the object of that name is still the one with `primary`'s
    /// UID, and returns its UID and new resourceVersion.
    ///
    /// The write is a JSON patch whose first operation tests
    /// `/metadata/uid`: the API server applies it to the object it holds
    /// under the name, so a primary deleted and made anew under its name
    /// since it was read fails the test and receives nothing (a `uid` in an
    /// apply body would not fence it: the status subresource resets
    /// metadata). The second operation sets the whole status: the status
    /// belongs to the plugin.
    ///
    /// # Errors
    /// [`ApplyError::Conflict`] when the object under the name has another
    /// UID; [`ApplyError::Api`] when the API server refuses it otherwise
    /// (a primary that is gone is a 404).
    pub async fn write_status(
        &self,
        resource: &ApiResource,
        primary: &Value,
        status: &Value,
    ) -> Result<Written, ApplyError> {
        let uid = primary["metadata"]["uid"].as_str().unwrap_or_default();
        let patch = status_patch(uid, status);
        let target = describe(primary);
        let mut url = format!(
            "{}/{}/status?fieldManager={}",
            DynamicObject::url_path(resource, ns_of(primary).filter(|n| !n.is_empty())),
            name_of(primary),
            self.field_manager
        );
        if self.dry_run {
            url.push_str("&dryRun=All");
        }
        let body = serde_json::to_vec(&patch).map_err(|e| ApplyError::Api {
            target: target.clone(),
            message: e.to_string(),
        })?;
        let mut request = http::Request::patch(url)
            .header(http::header::CONTENT_TYPE, "application/json-patch+json")
            .body(body)
            .map_err(|e| ApplyError::Api {
                target: target.clone(),
                message: e.to_string(),
            })?;
        request.extensions_mut().insert("patch_status");
        let answer: Result<Written, kube::Error> = match self.client.request_text(request).await {
            Ok(text) => serde_json::from_str(&text).map_err(kube::Error::SerdeError),
            Err(e) => Err(e),
        };
        answer.map_err(|e| match e {
            kube::Error::Api(status) if is_failed_test(status.code, &status.message) => {
                ApplyError::Conflict {
                    target,
                    message: format!(
                        "the object under this name is no longer the one with uid {uid}: {}",
                        status.message
                    ),
                }
            }
            e => ApplyError::from_kube(target, e),
        })
    }

    /// JSON-merge-patches `patch` into `obj` under this field manager (an
    /// update, not an apply: fields set earlier are never removed because a
    /// later patch omits them), only while `obj` is still at the
    /// resourceVersion it has here: a concurrent edit is a conflict, not an
    /// overwrite.
    ///
    /// # Errors
    /// [`ApplyError::Conflict`] when `obj` changed meanwhile;
    /// [`ApplyError::Api`] when the API server refuses it.
    pub async fn merge_patch(
        &self,
        resource: &ApiResource,
        obj: &Value,
        patch: &Value,
    ) -> Result<Value, ApplyError> {
        let mut patch = patch.clone();
        if let Some(rv) = obj["metadata"]["resourceVersion"].as_str()
            && let Some(map) = patch.as_object_mut()
        {
            let meta = map.entry("metadata").or_insert_with(|| json!({}));
            if let Some(meta) = meta.as_object_mut() {
                meta.insert("resourceVersion".into(), json!(rv));
            }
        }
        let patch = &patch;
        let api = api_for(&self.client, resource, ns_of(obj));
        let pp = self.patch_params(PatchParams {
            field_manager: Some(self.field_manager.clone()),
            ..PatchParams::default()
        });
        api.patch(name_of(obj), &pp, &Patch::Merge(patch))
            .await
            .map(|o| serde_json::to_value(o).unwrap_or_default())
            .map_err(|e| ApplyError::from_kube(describe(obj), e))
    }

    /// Sets the finalizer list of `primary`, only while it is at the
    /// resourceVersion the snapshot saw.
    ///
    /// # Errors
    /// [`ApplyError::Conflict`] when the primary changed meanwhile.
    pub async fn set_finalizers(
        &self,
        resource: &ApiResource,
        primary: &Value,
        finalizers: &[String],
    ) -> Result<Value, ApplyError> {
        let patch = json!({"metadata": {
            "finalizers": finalizers,
            "resourceVersion": primary["metadata"]["resourceVersion"],
        }});
        let api = api_for(&self.client, resource, ns_of(primary));
        api.patch(
            name_of(primary),
            &self.patch_params(PatchParams::default()),
            &Patch::Merge(&patch),
        )
        .await
        .map(|o| serde_json::to_value(o).unwrap_or_default())
        .map_err(|e| ApplyError::from_kube(describe(primary), e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_apply_answer_is_read_for_its_identity_only() {
        let answer = json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "w-cm", "namespace": "ns", "uid": "u-1",
                "resourceVersion": "42",
                "managedFields": [{"manager": "wasmop-good", "operation": "Apply",
                    "fieldsType": "FieldsV1", "fieldsV1": {"f:data": {"f:value": {}}}}]},
            "data": {"value": "x"},
        });
        let written: Written = serde_json::from_str(&answer.to_string()).expect("parses");
        assert_eq!(
            written,
            Written {
                uid: "u-1".into(),
                resource_version: "42".into(),
                data_keys: ["value".to_owned()].into(),
            }
        );
        // An answer that is no object is an error, not an empty identity.
        assert!(serde_json::from_str::<Written>("[]").is_err());
        assert!(serde_json::from_str::<Written>(r#"{"kind":"Status"}"#).is_err());
    }

    #[test]
    fn applies_are_forced_only_when_asked() {
        assert!(!apply_params("wasmop-x", false).force);
        let forced = apply_params("wasmop-x", true);
        assert!(forced.force);
        assert_eq!(forced.field_manager.as_deref(), Some("wasmop-x"));
    }

    #[test]
    fn only_conflicts_with_the_own_manager_count_as_self_conflicts() {
        let one = r#"Apply failed with 1 conflict: conflict with "wasmop-x" using v1: .data.a"#;
        assert!(only_self_conflicts(one, "wasmop-x"));
        assert!(!only_self_conflicts(one, "wasmop-y"));
        let two = "Apply failed with 2 conflicts: conflicts with \"wasmop-x\" using v1:\n- .data.a\nconflict with \"kubectl-edit\" using v1: .data.b";
        assert!(!only_self_conflicts(two, "wasmop-x"));
        assert!(!only_self_conflicts(
            "the object has been modified",
            "wasmop-x"
        ));
    }

    #[test]
    fn a_status_write_tests_the_uid_first_and_a_failed_test_is_a_conflict() {
        let patch = status_patch("u-1", &json!({"value": "x"}));
        assert_eq!(
            patch[0],
            json!({"op": "test", "path": "/metadata/uid", "value": "u-1"})
        );
        assert_eq!(
            patch[1],
            json!({"op": "add", "path": "/status", "value": {"value": "x"}})
        );
        assert_eq!(patch.as_array().map(Vec::len), Some(2));
        assert!(is_failed_test(
            422,
            "testing value /metadata/uid failed: test failed"
        ));
        assert!(!is_failed_test(422, "status.value: Invalid value"));
        assert!(!is_failed_test(404, "/metadata/uid"));
    }

    #[test]
    fn a_fence_sets_uid_and_resource_version_in_the_body() {
        let o = json!({"kind":"ConfigMap","metadata":{"name":"a","namespace":"n"}});
        let body = fenced(
            &o,
            &Fence {
                uid: Some("u"),
                resource_version: Some("7"),
            },
        );
        assert_eq!(body["metadata"]["uid"], "u");
        assert_eq!(body["metadata"]["resourceVersion"], "7");
        assert_eq!(fenced(&o, &Fence::default()), o);
    }
}
