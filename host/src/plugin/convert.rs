//! Crossing the plugin boundary: WIT records to and from host types, and
//! the checks that turn a plugin's raw output into a [`Plan`] or an
//! [`OutputProblem`].

use serde_json::Value;
use thiserror::Error;

use crate::bindings::types as wit;
use crate::manifest::{Controller, FieldRef, HttpTarget, KindRef, Manifest, Read, Selector};
use crate::object;
use crate::plan::{
    ApplyOp, DeleteOp, Event, EventType, HttpMethod, HttpRequest, ObjectRef, Plan, Precondition,
    SecretHeader,
};
use crate::snapshot::Snapshot;

/// Largest plan a plugin may return, counting every text it holds.
pub const MAX_OUTPUT_BYTES: usize = 8 << 20;

/// What is wrong with a plugin's output.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum OutputProblem {
    /// A JSON text does not parse.
    #[error("{field} is not valid JSON ({reason})")]
    NotJson {
        /// Where in the plan, e.g. `apply[0].object`.
        field: String,
        /// The parser's complaint.
        reason: String,
    },
    /// A JSON text parses but is not a JSON object.
    #[error("{field} is not a JSON object")]
    NotAnObject {
        /// Where in the plan.
        field: String,
    },
    /// An applied object lacks part of its identity.
    #[error("{field} has no {missing}")]
    MissingIdentity {
        /// Where in the plan.
        field: String,
        /// `apiVersion`, `kind` or `metadata.name`.
        missing: &'static str,
    },
    /// Bytes that must be UTF-8 text are not.
    #[error("{field} is not UTF-8 text")]
    NotUtf8 {
        /// Where in the plan.
        field: String,
    },
    /// The plan is larger than [`MAX_OUTPUT_BYTES`].
    #[error("the plan holds {bytes} bytes, more than the limit of {limit}")]
    TooLarge {
        /// Bytes of text in the plan.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
}

pub(crate) fn kind_from_wit(k: wit::KindRef) -> KindRef {
    KindRef {
        group: k.group,
        version: k.version,
        kind: k.kind,
        plural: k.plural,
        namespaced: k.namespaced,
    }
}

pub(crate) fn manifest_from_wit(m: wit::Manifest) -> Manifest {
    Manifest {
        name: m.name,
        version: m.version,
        controllers: m.controllers.into_iter().map(controller_from_wit).collect(),
    }
}

fn controller_from_wit(c: wit::Controller) -> Controller {
    Controller {
        name: c.name,
        primary: kind_from_wit(c.primary),
        owns: c.owns.into_iter().map(kind_from_wit).collect(),
        reads: c
            .reads
            .into_iter()
            .map(|r| Read {
                id: r.id,
                kind: kind_from_wit(r.kind),
                selector: match r.selector {
                    wit::Selector::OwnedByPrimary => Selector::OwnedByPrimary,
                    wit::Selector::Field(f) => Selector::Field(FieldRef {
                        name_path: f.name_path,
                        namespace_path: f.namespace_path,
                    }),
                    wit::Selector::SameNamespace => Selector::SameNamespace,
                    wit::Selector::ClusterWide => Selector::ClusterWide,
                    wit::Selector::Labels(s) => Selector::Labels(s),
                },
            })
            .collect(),
        finalizer: c.finalizer,
        write_namespaces: c.write_namespaces,
        primary_fields: c.primary_fields,
        http_targets: c
            .http_targets
            .into_iter()
            .map(|t| HttpTarget {
                id: t.id,
                kind: kind_from_wit(t.kind),
                ports: t.ports,
            })
            .collect(),
        delete_primary: c.delete_primary,
    }
}

fn json_text(v: &Value) -> String {
    // Serializing a `Value` cannot fail: its keys are strings.
    serde_json::to_string(v).unwrap_or_else(|_| "null".to_owned())
}

pub(crate) fn snapshot_to_wit(s: &Snapshot) -> wit::Snapshot {
    wit::Snapshot {
        controller: s.controller.clone(),
        primary: json_text(&s.primary),
        owned: s.owned.iter().map(|o| json_text(o)).collect(),
        related: s
            .related
            .iter()
            .map(|r| wit::RelatedObject {
                read: r.read.clone(),
                object: json_text(&r.object),
            })
            .collect(),
        now: s.now.clone(),
        deleting: s.deleting,
        settings: json_text(&s.settings),
        observations: s
            .observations
            .iter()
            .map(|o| wit::Observation {
                id: o.id.clone(),
                status: o.status,
                body: o.body.as_bytes().to_vec(),
                error: o.error.clone(),
                observed_at: o.observed_at.clone(),
                age_ms: o.age_ms,
            })
            .collect(),
    }
}

fn output_size(p: &wit::Plan) -> usize {
    let strings = |h: &[(String, String)]| h.iter().map(|(a, b)| a.len() + b.len()).sum::<usize>();
    p.apply.iter().map(|a| a.object.len()).sum::<usize>()
        + p.delete.len() * 256
        + p.status.as_ref().map_or(0, String::len)
        + p.primary_patch.as_ref().map_or(0, String::len)
        + p.events
            .iter()
            .map(|e| e.reason.len() + e.message.len())
            .sum::<usize>()
        + p.http_requests
            .iter()
            .map(|r| r.body.len() + r.path.len() + strings(&r.headers))
            .sum::<usize>()
}

fn parse_object(field: String, text: &str) -> Result<Value, OutputProblem> {
    let value: Value = serde_json::from_str(text).map_err(|e| OutputProblem::NotJson {
        field: field.clone(),
        reason: e.to_string(),
    })?;
    if value.is_object() {
        Ok(value)
    } else {
        Err(OutputProblem::NotAnObject { field })
    }
}

/// Converts a plugin's plan, checking everything the plugin boundary can:
/// size, JSON texts, object identities, UTF-8 bodies.
pub(crate) fn plan_from_wit(p: wit::Plan) -> Result<Plan, OutputProblem> {
    let bytes = output_size(&p);
    if bytes > MAX_OUTPUT_BYTES {
        return Err(OutputProblem::TooLarge {
            bytes,
            limit: MAX_OUTPUT_BYTES,
        });
    }
    let mut apply = Vec::with_capacity(p.apply.len());
    for (i, op) in p.apply.into_iter().enumerate() {
        let field = format!("apply[{i}].object");
        let obj = parse_object(field.clone(), &op.object)?;
        for (missing, present) in [
            ("apiVersion", !object::api_version(&obj).is_empty()),
            ("kind", !object::kind(&obj).is_empty()),
            ("metadata.name", !object::name(&obj).is_empty()),
        ] {
            if !present {
                return Err(OutputProblem::MissingIdentity { field, missing });
            }
        }
        apply.push(ApplyOp {
            object: obj,
            precondition: op.precondition.map(|c| match c {
                wit::Precondition::Absent => Precondition::Absent,
                wit::Precondition::ResourceVersion(rv) => Precondition::ResourceVersion(rv),
            }),
            force: op.force,
        });
    }
    let status = p
        .status
        .map(|s| parse_object("status".to_owned(), &s))
        .transpose()?;
    let primary_patch = p
        .primary_patch
        .map(|s| parse_object("primaryPatch".to_owned(), &s))
        .transpose()?;
    let mut http_requests = Vec::with_capacity(p.http_requests.len());
    for (i, r) in p.http_requests.into_iter().enumerate() {
        let body = String::from_utf8(r.body).map_err(|_| OutputProblem::NotUtf8 {
            field: format!("httpRequests[{i}].body"),
        })?;
        http_requests.push(HttpRequest {
            id: r.id,
            target: r.target,
            object: r.object,
            port: r.port,
            method: match r.method {
                wit::HttpMethod::Get => HttpMethod::Get,
                wit::HttpMethod::Post => HttpMethod::Post,
                wit::HttpMethod::Put => HttpMethod::Put,
                wit::HttpMethod::Delete => HttpMethod::Delete,
            },
            path: r.path,
            body,
            headers: r.headers,
            secret_headers: r
                .secret_headers
                .into_iter()
                .map(|h| SecretHeader {
                    name: h.name,
                    secret: h.secret,
                    key: h.key,
                    prefix: h.prefix,
                })
                .collect(),
            timeout_ms: r.timeout_ms,
            max_response_bytes: r.max_response_bytes,
            max_age_ms: r.max_age_ms,
        });
    }
    Ok(Plan {
        apply,
        delete: p
            .delete
            .into_iter()
            .map(|d| DeleteOp {
                target: ObjectRef {
                    api_version: d.target.api_version,
                    kind: d.target.kind,
                    namespace: d.target.namespace,
                    name: d.target.name,
                },
                uid: d.uid,
                resource_version: d.resource_version,
            })
            .collect(),
        status,
        primary_patch,
        events: p
            .events
            .into_iter()
            .map(|e| Event {
                event_type: match e.event_type {
                    wit::EventType::Normal => EventType::Normal,
                    wit::EventType::Warning => EventType::Warning,
                },
                reason: e.reason,
                message: e.message,
            })
            .collect(),
        requeue_after_ms: p.requeue_after_ms,
        cleanup_complete: p.cleanup_complete,
        http_requests,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan_with_object(text: &str) -> wit::Plan {
        wit::Plan {
            apply: vec![wit::ApplyOp {
                object: text.to_owned(),
                precondition: None,
                force: false,
            }],
            delete: vec![],
            status: None,
            primary_patch: None,
            events: vec![],
            requeue_after_ms: None,
            cleanup_complete: false,
            http_requests: vec![],
        }
    }

    #[test]
    fn object_text_must_be_json_objects_with_identity() {
        let err = plan_from_wit(plan_with_object("{not json")).unwrap_err();
        assert!(matches!(err, OutputProblem::NotJson { .. }), "{err}");
        let err = plan_from_wit(plan_with_object("[1]")).unwrap_err();
        assert_eq!(err.to_string(), "apply[0].object is not a JSON object");
        let err = plan_from_wit(plan_with_object(
            r#"{"apiVersion":"v1","kind":"ConfigMap"}"#,
        ))
        .unwrap_err();
        assert_eq!(err.to_string(), "apply[0].object has no metadata.name");
        let ok = r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a"}}"#;
        assert!(plan_from_wit(plan_with_object(ok)).is_ok());
    }

    #[test]
    fn status_must_be_an_object() {
        let mut p =
            plan_with_object(r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a"}}"#);
        p.status = Some("\"ready\"".into());
        assert_eq!(
            plan_from_wit(p).unwrap_err().to_string(),
            "status is not a JSON object"
        );
    }

    #[test]
    fn oversized_output_is_rejected() {
        let big = format!(
            r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"a"}},"data":{{"x":"{}"}}}}"#,
            "x".repeat(MAX_OUTPUT_BYTES)
        );
        assert!(matches!(
            plan_from_wit(plan_with_object(&big)).unwrap_err(),
            OutputProblem::TooLarge { .. }
        ));
    }
}
