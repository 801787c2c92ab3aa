//! The whole reconcile path without a cluster: objects from YAML, the
//! snapshot from a [`MemorySource`], the plugin call, plan validation.
//! `wasmop plan` and the [`crate::reconcile::golden`] harness are built on it.
//!
//! # Input
//!
//! Multi-document YAML (or JSON) of Kubernetes objects; a `kind: List`
//! contributes its `items`. Two documents of `apiVersion: wasmop.dev/v1`
//! are not objects but inputs for the run:
//!
//! - `kind: Observations` with `items: [{id, status, body, error,
//!   observedAt, ageMs}]` — the snapshot's observations;
//! - `kind: PlanOptions` with optional `now`, `controller` and `settings`
//!   — defaults for the command-line options, so a fixture file is
//!   self-contained.
//!
//! They may also be items of a `kind: List`, which is how a recording of a
//! live reconcile (see [`crate::report::record`]) holds them, next to a `kind:
//! Recorded` document that `wasmop plan` ignores and `wasmop replay`
//! compares against.
//!
//! An `admission.k8s.io/v1` `AdmissionReview` document turns the run into
//! an admission decision: the plugin's `admit` decides the review, with
//! the other objects as what its rule's reads can select (see
//! [`crate::reconcile::admission::offline`]).
//!
//! A `kind: AbsentKind` document of the same apiVersion, named
//! `<plural>.<group>`, says an optional kind's API is not served (an
//! optional read's or owned kind's; see `Controller::required_kinds`); it
//! is kept as an object of the source.
//!
//! The first object whose kind is a controller's primary is the primary.
//! Missing `metadata.uid`s are filled deterministically (the primary gets
//! [`PRIMARY_UID`], so fixtures can name it in ownerReferences), as are
//! missing `resourceVersion`s (`"1"`) and missing namespaces of namespaced
//! kinds the manifest knows (`default`).

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use thiserror::Error;

use crate::contract::manifest::{Controller, Manifest, split_api_version};
use crate::judge::snapshot::{MemorySource, Observation, Snapshot};
use crate::judge::validate::{Plan, Violation};
use crate::object;
use crate::plugin::LoadedPlugin;
use crate::reconcile::decide::{DecideInput, Decision, SkipReason, decide};
use crate::reconcile::kind::{KindDecided, KindOutcome, decide_kind};
use wasmop_contract::Scope;

/// The uid given to a primary that has none.
pub const PRIMARY_UID: &str = "00000000-0000-0000-0000-000000000001";

/// The `apiVersion` of wasmop's own input documents.
pub const INPUT_API_VERSION: &str = "wasmop.dev/v1";

/// The kind of the input document holding what a recording decided
/// ([`crate::report::record`] writes it; this module reads it, and imports nothing
/// of `record`).
pub const RECORDED_KIND: &str = "Recorded";

/// Options a fixture can carry (`kind: PlanOptions`).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanOptions {
    /// Snapshot time, RFC 3339.
    #[serde(default)]
    pub now: Option<String>,
    /// Controller to run, when the plugin has several.
    #[serde(default)]
    pub controller: Option<String>,
    /// The plugin's settings.
    #[serde(default)]
    pub settings: Option<Value>,
}

impl PlanOptions {
    /// The plugin's settings the fixture gives, `{}` when it gives none.
    pub fn settings_or_empty(&self) -> Value {
        self.settings
            .clone()
            .unwrap_or_else(|| Value::Object(serde_json::Map::new()))
    }
}

/// Parsed input of an offline run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OfflineInput {
    /// Kubernetes objects, in file order.
    pub objects: Vec<Value>,
    /// Observations for the snapshot.
    pub observations: Vec<Observation>,
    /// Options from a `PlanOptions` document.
    pub options: PlanOptions,
    /// An `admission.k8s.io/v1` AdmissionReview document: the run decides
    /// it (see [`crate::reconcile::admission::offline`]) instead of reconciling.
    pub review: Option<Value>,
    /// A `Recorded` document (a recording of a live reconcile, see
    /// [`crate::report::record`]): what the live plugin decided. `wasmop plan`
    /// ignores it; `wasmop replay` compares against it.
    pub recorded: Option<Value>,
}

/// Why the input could not be used.
#[derive(Debug, Error)]
pub enum InputError {
    /// A document is not valid YAML.
    #[error("{origin}: document {index} is not valid YAML: {reason}")]
    Yaml {
        /// File name.
        origin: String,
        /// 1-based document number.
        index: usize,
        /// The parser's complaint (with line and column).
        reason: String,
    },
    /// A document is not a mapping.
    #[error("{origin}: document {index} is not an object")]
    NotAnObject {
        /// File name.
        origin: String,
        /// 1-based document number.
        index: usize,
    },
    /// A document lacks apiVersion, kind or metadata.name.
    #[error("{origin}: document {index} ({what}) needs apiVersion, kind and metadata.name")]
    MissingIdentity {
        /// File name.
        origin: String,
        /// 1-based document number.
        index: usize,
        /// What the document looks like.
        what: String,
    },
    /// An `Observations` or `PlanOptions` document does not have its shape.
    #[error("{origin}: document {index} is not a valid {kind}: {reason}")]
    BadInputDocument {
        /// File name.
        origin: String,
        /// 1-based document number.
        index: usize,
        /// `Observations` or `PlanOptions`.
        kind: String,
        /// What is wrong.
        reason: String,
    },
}

/// Why an offline run could not reach the plugin.
#[derive(Debug, Error)]
pub enum OfflineError {
    /// No object is of a kind the plugin reconciles.
    #[error("no object is of a kind plugin {plugin} reconciles ({kinds})")]
    NoPrimary {
        /// The plugin.
        plugin: String,
        /// The primary kinds it reconciles.
        kinds: String,
    },
    /// `--controller` names a controller the plugin does not have.
    #[error("plugin {plugin} has no controller {controller:?} (it has: {known})")]
    UnknownController {
        /// The plugin.
        plugin: String,
        /// The name asked for.
        controller: String,
        /// The controllers it has.
        known: String,
    },
    /// `now` is not an RFC 3339 time.
    #[error("--now {now:?} is not an RFC 3339 time such as 2025-01-01T00:00:00Z")]
    BadNow {
        /// The text given.
        now: String,
    },
}

/// The golden-file form of a kind call, pretty-printed JSON ending in a
/// newline: `{"objects":[{"namespace","name", <the golden form of its
/// decision's fields>}],"refused":["…"]}` (each object's plan fields
/// inline when planned, or its `rejected`), or `{"failed":{…}}` for the
/// call, or `{"skipped":{"reason":"NoPrimaries"}}` when there was none.
pub fn to_kind_golden_text(kind: &KindDecided) -> String {
    let value = match &kind.outcome {
        KindOutcome::Empty => serde_json::json!({"skipped": {"reason": "NoPrimaries"}}),
        KindOutcome::Failed(e) => serde_json::json!({"failed": {
            "reason": e.reason(), "message": e.to_string()}}),
        KindOutcome::Split { decisions, refused } => {
            let objects: Vec<Value> = decisions
                .iter()
                .map(|(primary, decision)| {
                    let mut entry = serde_json::Map::new();
                    entry.insert(
                        "namespace".into(),
                        object::namespace(primary).unwrap_or_default().into(),
                    );
                    entry.insert("name".into(), object::name(primary).into());
                    let outcome: Value =
                        serde_json::from_str(&to_golden_text(decision)).unwrap_or_default();
                    if let Value::Object(fields) = outcome {
                        entry.extend(fields);
                    }
                    Value::Object(entry)
                })
                .collect();
            let refused: Vec<String> = refused.iter().map(ToString::to_string).collect();
            serde_json::json!({"objects": objects, "refused": refused})
        }
    };
    let mut text = serde_json::to_string_pretty(&value).unwrap_or_default();
    text.push('\n');
    text
}

/// The golden-file form of a decision, pretty-printed JSON ending in a
/// newline: the plan itself when valid (exactly as `wasmop plan -o json`
/// prints it), otherwise `{"rejected":{"violations":[…],"plan":{…}}}`,
/// `{"failed":{"reason":"…","message":"…"}}` or
/// `{"skipped":{"reason":"…"}}`.
pub fn to_golden_text(decision: &Decision) -> String {
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    enum Golden<'a> {
        Rejected {
            violations: &'a [Violation],
            plan: &'a Plan,
        },
        Failed {
            reason: &'static str,
            message: String,
        },
        Skipped {
            reason: &'static str,
        },
    }
    let text = match decision {
        Decision::Planned { plan, .. } => serde_json::to_string_pretty(plan),
        Decision::Rejected { plan, violations } => {
            serde_json::to_string_pretty(&Golden::Rejected { violations, plan })
        }
        Decision::Failed(e) => serde_json::to_string_pretty(&Golden::Failed {
            reason: e.reason(),
            message: e.to_string(),
        }),
        Decision::Skipped(reason) => serde_json::to_string_pretty(&Golden::Skipped {
            reason: reason.as_str(),
        }),
    };
    // Serializing these types cannot fail: every map key is a string.
    let mut text = text.unwrap_or_default();
    text.push('\n');
    text
}

/// Parses the objects file.
///
/// # Errors
///
/// [`InputError`] naming the file and document that is wrong.
pub fn parse_input(text: &str, origin: &str) -> Result<OfflineInput, InputError> {
    let mut input = OfflineInput::default();
    for (i, document) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let index = i + 1;
        let doc = Value::deserialize(document).map_err(|e| InputError::Yaml {
            origin: origin.to_owned(),
            index,
            reason: e.to_string(),
        })?;
        if doc.is_null() {
            continue;
        }
        if !doc.is_object() {
            return Err(InputError::NotAnObject {
                origin: origin.to_owned(),
                index,
            });
        }
        if object::kind(&doc) == "List" {
            let items = doc
                .get("items")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            for item in items {
                push_document(&mut input, item, origin, index)?;
            }
        } else {
            push_document(&mut input, doc, origin, index)?;
        }
    }
    Ok(input)
}

/// One document (top level or a List item): an input document of
/// wasmop's own, an AdmissionReview, or an object.
fn push_document(
    input: &mut OfflineInput,
    doc: Value,
    origin: &str,
    index: usize,
) -> Result<(), InputError> {
    let bad = |kind: &str, reason: String| InputError::BadInputDocument {
        origin: origin.to_owned(),
        index,
        kind: kind.to_owned(),
        reason,
    };
    match (object::api_version(&doc), object::kind(&doc)) {
        (INPUT_API_VERSION, "Observations") => {
            let items = doc.get("items").cloned().unwrap_or(Value::Array(vec![]));
            let items: Vec<Observation> =
                serde_json::from_value(items).map_err(|e| bad("Observations", e.to_string()))?;
            input.observations.extend(items);
        }
        (crate::reconcile::admission::offline::REVIEW_API_VERSION, "AdmissionReview") => {
            input.review = Some(doc);
        }
        (INPUT_API_VERSION, "PlanOptions") => {
            input.options =
                serde_json::from_value(doc).map_err(|e| bad("PlanOptions", e.to_string()))?;
        }
        (INPUT_API_VERSION, RECORDED_KIND) => {
            input.recorded = Some(doc);
        }
        _ => push_object(input, doc, origin, index)?,
    }
    Ok(())
}

fn push_object(
    input: &mut OfflineInput,
    obj: Value,
    origin: &str,
    index: usize,
) -> Result<(), InputError> {
    if !obj.is_object() {
        return Err(InputError::NotAnObject {
            origin: origin.to_owned(),
            index,
        });
    }
    if object::api_version(&obj).is_empty()
        || object::kind(&obj).is_empty()
        || object::name(&obj).is_empty()
    {
        return Err(InputError::MissingIdentity {
            origin: origin.to_owned(),
            index,
            what: object::describe(&obj),
        });
    }
    // As the operator's caches hold objects, so a `kubectl get -o yaml`
    // of a live object decides here as it does there.
    let mut obj = obj;
    object::strip_bookkeeping(&mut obj);
    input.objects.push(obj);
    Ok(())
}

/// What an offline run saw and produced.
#[derive(Debug)]
pub struct OfflineRun {
    /// The controller that ran.
    pub controller: String,
    /// The primary, with defaults filled.
    pub primary: Arc<Value>,
    /// How the run was decided, exactly as the live operator decides
    /// ([`SkipReason::KindScoped`] for a kind-scoped controller: see
    /// [`OfflineRun::kind`]).
    pub decision: Decision,
    /// For a kind-scoped controller: the one call over every object of
    /// the primary kind in the input, split per primary.
    pub kind: Option<KindDecided>,
    /// The snapshot the plugin was called with (for a kind-scoped
    /// controller, the one over every primary); `None` when the plugin was
    /// not called. The benchmarks call the plugin with it again.
    pub snapshot: Option<Snapshot>,
}

impl OfflineRun {
    /// The golden-file form of the run: [`to_golden_text`] of the
    /// decision, or [`to_kind_golden_text`] for a kind-scoped controller.
    pub fn golden_text(&self) -> String {
        match &self.kind {
            Some(kind) => to_kind_golden_text(kind),
            None => to_golden_text(&self.decision),
        }
    }
}

/// Runs `plugin` over `input`: picks the primary and decides it with
/// [`decide`], the function the live operator uses — the same skip rule,
/// snapshot selection, `now` rounding and validation.
///
/// `now` and `controller` override the input's `PlanOptions`; `now`
/// defaults to the current time. The plugin's settings are the ones it was
/// loaded with.
///
/// # Errors
///
/// [`OfflineError`] when there is no primary, the controller is unknown
/// or `now` is not RFC 3339. A failing plugin is a [`Decision::Failed`].
pub fn run(
    plugin: &LoadedPlugin,
    input: &OfflineInput,
    now: Option<&str>,
    controller: Option<&str>,
) -> Result<OfflineRun, OfflineError> {
    // The enforced manifest: `setting:` write namespaces resolved.
    let manifest = plugin.effective_manifest();
    let now = match now.or(input.options.now.as_deref()) {
        Some(text) => text.parse().map_err(|_| OfflineError::BadNow {
            now: text.to_owned(),
        })?,
        None => jiff::Timestamp::now(),
    };
    let wanted = controller.or(input.options.controller.as_deref());
    if let Some(name) = wanted
        && manifest.controller_named(name).is_none()
    {
        return Err(OfflineError::UnknownController {
            plugin: manifest.name.clone(),
            controller: name.to_owned(),
            known: controller_names(manifest),
        });
    }

    let objects = with_defaults(manifest, &input.objects);
    let found = objects.iter().enumerate().find_map(|(i, o)| {
        let c = manifest.controller_for(object::api_version(o), object::kind(o))?;
        wanted.is_none_or(|w| w == c.name).then_some((i, c))
    });
    let Some((index, controller)) = found else {
        return Err(OfflineError::NoPrimary {
            plugin: manifest.name.clone(),
            kinds: manifest
                .controllers
                .iter()
                .filter(|c| wanted.is_none_or(|w| w == c.name))
                .map(|c| c.primary.to_string())
                .collect::<Vec<_>>()
                .join(", "),
        });
    };
    let primary = Arc::new(objects[index].clone());
    if controller.scope == Scope::Kind {
        // Every object of the primary kind, decided by one call.
        let all: Vec<Arc<Value>> = objects
            .iter()
            .filter(|o| {
                controller
                    .primary
                    .matches(object::api_version(o), object::kind(o))
            })
            .map(|o| Arc::new(o.clone()))
            .collect();
        let source = MemorySource::new(objects);
        let decided = decide_kind(
            DecideInput {
                plugin,
                controller,
                source: &source,
                existing: &source,
                now,
            },
            all,
        );
        return Ok(OfflineRun {
            controller: controller.name.clone(),
            primary,
            decision: Decision::Skipped(SkipReason::KindScoped),
            snapshot: decided.snapshot.clone(),
            kind: Some(decided),
        });
    }
    let source = MemorySource::new(objects);
    let decided = decide(
        DecideInput {
            plugin,
            controller,
            source: &source,
            existing: &source,
            now,
        },
        Arc::clone(&primary),
        input.observations.clone(),
    );
    Ok(OfflineRun {
        controller: controller.name.clone(),
        primary,
        decision: decided.decision,
        kind: None,
        snapshot: decided.snapshot,
    })
}

fn controller_names(manifest: &Manifest) -> String {
    manifest
        .controllers
        .iter()
        .map(|c| c.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Fills uid, resourceVersion and (for namespaced kinds the manifest
/// knows) namespace where they are missing.
fn with_defaults(manifest: &Manifest, objects: &[Value]) -> Vec<Value> {
    let primary_index = objects.iter().position(|o| {
        manifest
            .controller_for(object::api_version(o), object::kind(o))
            .is_some()
    });
    let mut next_uid = 2u64;
    objects
        .iter()
        .enumerate()
        .map(|(i, o)| {
            let mut o = o.clone();
            let namespaced = known_namespaced(manifest, &o);
            let Some(meta) = o.as_object_mut().and_then(|m| {
                m.entry("metadata")
                    .or_insert_with(|| serde_json::json!({}))
                    .as_object_mut()
            }) else {
                return o;
            };
            if meta
                .get("uid")
                .and_then(Value::as_str)
                .is_none_or(str::is_empty)
            {
                let uid = if Some(i) == primary_index {
                    PRIMARY_UID.to_owned()
                } else {
                    next_uid += 1;
                    format!("00000000-0000-0000-0000-{:012x}", next_uid - 1)
                };
                meta.insert("uid".into(), Value::String(uid));
            }
            if meta.get("resourceVersion").is_none() {
                meta.insert("resourceVersion".into(), Value::String("1".into()));
            }
            if namespaced == Some(true)
                && meta
                    .get("namespace")
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
            {
                meta.insert("namespace".into(), Value::String("default".into()));
            }
            o
        })
        .collect()
}

/// Whether the manifest knows the object's kind as namespaced.
fn known_namespaced(manifest: &Manifest, obj: &Value) -> Option<bool> {
    let (group, _) = split_api_version(object::api_version(obj));
    let kind = object::kind(obj);
    manifest
        .controllers
        .iter()
        .flat_map(Controller::kinds)
        .find(|k| k.group == group && k.kind == kind)
        .map(|k| k.namespaced)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::contract::manifest::tests::manifest;

    #[test]
    fn documents_lists_observations_and_options_are_read() {
        let text = r#"
apiVersion: test.wasmop.dev/v1
kind: Widget
metadata: {name: w}
---
apiVersion: v1
kind: List
items:
- {apiVersion: v1, kind: ConfigMap, metadata: {name: a}}
---
apiVersion: wasmop.dev/v1
kind: Observations
items:
- {id: health, status: 200, body: ok, observedAt: "2025-01-01T00:00:00Z", ageMs: 5}
---
apiVersion: wasmop.dev/v1
kind: PlanOptions
now: "2025-01-01T00:00:00Z"
settings: {replicas: 2}
---
"#;
        let input = parse_input(text, "f.yaml").expect("parses");
        assert_eq!(input.objects.len(), 2);
        assert_eq!(input.observations[0].status, Some(200));
        assert_eq!(input.options.now.as_deref(), Some("2025-01-01T00:00:00Z"));
        assert_eq!(input.options.settings, Some(json!({"replicas": 2})));
    }

    /// A live object as `kubectl get -o yaml --show-managed-fields` prints
    /// it is read as the operator's caches hold it.
    #[test]
    fn input_objects_leave_out_bookkeeping_as_the_caches_do() {
        let text = r#"
apiVersion: test.wasmop.dev/v1
kind: Widget
metadata:
  name: w
  annotations:
    kubectl.kubernetes.io/last-applied-configuration: '{"spec":{"value":"x"}}'
    team: a
  managedFields: [{manager: kubectl-client-side-apply, operation: Update}]
spec: {value: x}
"#;
        let input = parse_input(text, "f.yaml").expect("parses");
        assert_eq!(
            input.objects[0]["metadata"],
            json!({"name": "w", "annotations": {"team": "a"}})
        );
        assert_eq!(input.objects[0]["spec"], json!({"value": "x"}));
    }

    #[test]
    fn bad_yaml_is_one_line_naming_the_document() {
        let err = parse_input(
            "{apiVersion: v1, kind: ConfigMap, metadata: {name: a}}\n---\nb: [\n",
            "f.yaml",
        )
        .unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with("f.yaml: document 2 is not valid YAML"),
            "{text}"
        );
        assert!(!text.contains('\n'), "{text}");
    }

    #[test]
    fn objects_need_an_identity() {
        let err = parse_input("apiVersion: v1\nkind: ConfigMap\n", "f.yaml").unwrap_err();
        assert_eq!(
            err.to_string(),
            "f.yaml: document 1 (ConfigMap (unnamed)) needs apiVersion, kind and metadata.name"
        );
    }

    #[test]
    fn defaults_give_the_primary_a_fixed_uid_and_namespaces() {
        let objects = vec![
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}}),
            json!({"apiVersion": "test.wasmop.dev/v1", "kind": "Widget", "metadata": {"name": "w"}}),
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}}),
        ];
        let out = with_defaults(&manifest(), &objects);
        assert_eq!(object::uid(&out[1]), PRIMARY_UID);
        assert_eq!(object::namespace(&out[1]), Some("default"));
        assert_eq!(object::uid(&out[0]), "00000000-0000-0000-0000-000000000002");
        assert_eq!(object::namespace(&out[0]), Some("default"));
        // Secret is unknown to the manifest: its scope is not guessed.
        assert_eq!(object::namespace(&out[2]), None);
        assert_eq!(object::resource_version(&out[2]), "1");
    }
}
