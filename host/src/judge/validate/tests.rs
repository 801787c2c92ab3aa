//! Tests of [`super::validate`] and its rule families.

use std::collections::BTreeMap;

use serde_json::json;

use super::*;
use crate::contract::manifest::tests::controller;
use crate::contract::manifest::{HttpTarget, KindRef, OwnedKind};
use crate::execute::prepare::prepare_apply;

const PRIMARY_UID: &str = "uid-primary";

fn primary() -> Value {
    json!({"apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
           "metadata": {"name": "w", "namespace": "ns", "uid": PRIMARY_UID}})
}

/// Existing objects keyed by (kind, namespace, name).
#[derive(Default)]
struct World(BTreeMap<(String, String, String), ExistingObject>);

impl World {
    fn with(
        mut self,
        kind: &str,
        ns: &str,
        name: &str,
        uid: &str,
        controller: Option<&str>,
    ) -> Self {
        self.0.insert(
            (kind.into(), ns.into(), name.into()),
            ExistingObject {
                uid: uid.into(),
                controller_uid: controller.map(Into::into),
                owner_label: None,
                resource_version: "5".into(),
                protected: false,
            },
        );
        self
    }

    fn labelled(mut self, kind: &str, ns: &str, name: &str, uid: &str, owner: &str) -> Self {
        self.0.insert(
            (kind.into(), ns.into(), name.into()),
            ExistingObject {
                uid: uid.into(),
                controller_uid: None,
                owner_label: Some(owner.into()),
                resource_version: "5".into(),
                protected: false,
            },
        );
        self
    }
}

impl ExistingLookup for World {
    fn existing(&self, kind: &KindRef, ns: Option<&str>, name: &str) -> Option<ExistingObject> {
        self.0
            .get(&(
                kind.kind.clone(),
                ns.unwrap_or_default().into(),
                name.into(),
            ))
            .cloned()
    }
}

fn cm(ns: &str, name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns}})
}

fn apply(objects: Vec<Value>) -> Plan {
    Plan {
        apply: objects
            .into_iter()
            .map(|object| ApplyOp {
                object,
                precondition: None,
                force: false,
                generate: Vec::new(),
            })
            .collect(),
        ..Plan::default()
    }
}

fn delete_cm(ns: &str, name: &str, uid: &str) -> DeleteOp {
    DeleteOp {
        target: ObjectRef {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            namespace: ns.into(),
            name: name.into(),
        },
        uid: uid.into(),
        resource_version: "1".into(),
    }
}

/// The rules `plan` breaks, in order (none when it is valid).
fn rules(plan: &Plan, c: &Controller, world: &World) -> Vec<Rule> {
    validate(plan, c, &primary(), world)
        .err()
        .unwrap_or_default()
        .into_iter()
        .map(|v| v.rule)
        .collect()
}

fn violations(plan: &Plan, world: &World) -> Vec<String> {
    match validate(plan, &controller(), &primary(), world) {
        Ok(_) => vec![],
        Err(vs) => vs.iter().map(ToString::to_string).collect(),
    }
}

#[test]
fn a_plan_creating_owned_objects_in_the_primarys_namespace_is_valid() {
    assert_eq!(
        violations(&apply(vec![cm("ns", "w-cm")]), &World::default()),
        Vec::<String>::new()
    );
}

#[test]
fn applying_an_unowned_kind_is_a_violation_naming_the_kind() {
    let secret =
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": "ns"}});
    assert_eq!(
        violations(&apply(vec![secret]), &World::default()),
        vec!["Secret ns/s: kind Secret (v1) is not owned by controller widget"]
    );
}

#[test]
fn owned_kinds_match_on_api_version_too() {
    let wrong = json!({"apiVersion": "v2", "kind": "ConfigMap", "metadata": {"name": "s", "namespace": "ns"}});
    assert_eq!(violations(&apply(vec![wrong]), &World::default()).len(), 1);
}

#[test]
fn writing_outside_the_primarys_namespace_needs_write_namespaces() {
    let plan = apply(vec![cm("other", "w-cm")]);
    assert_eq!(
        violations(&plan, &World::default()),
        vec![
            "ConfigMap other/w-cm: namespace other is not the primary's (ns) nor in write-namespaces of controller widget"
        ]
    );
    let mut c = controller();
    c.owns[0] = OwnedKind::label(KindRef::namespaced("", "v1", "ConfigMap", "configmaps"));
    c.finalizer = Some("f".into());
    c.write_namespaces = vec!["*".into()];
    assert!(validate(&plan, &c, &primary(), &World::default()).is_ok());
}

#[test]
fn a_cluster_scoped_primary_writes_namespaced_objects_only_where_declared() {
    let mut c = controller();
    c.primary.namespaced = false;
    let primary = json!({"apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
                         "metadata": {"name": "w", "uid": PRIMARY_UID}});
    let plan = apply(vec![cm("target", "w-cm")]);
    assert!(validate(&plan, &c, &primary, &World::default()).is_err());
    c.write_namespaces = vec!["target".into()];
    assert!(validate(&plan, &c, &primary, &World::default()).is_ok());
}

#[test]
fn namespaced_objects_must_name_their_namespace() {
    let obj = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}});
    assert_eq!(
        violations(&apply(vec![obj]), &World::default()),
        vec!["ConfigMap x: ConfigMap is namespaced but the object names no namespace"]
    );
}

#[test]
fn applying_over_an_object_of_another_controller_is_a_violation() {
    let world = World::default().with("ConfigMap", "ns", "taken", "u1", Some("someone-else"));
    assert_eq!(
        violations(&apply(vec![cm("ns", "taken")]), &world),
        vec!["ConfigMap ns/taken: exists and is controlled by another owner (uid someone-else)"]
    );
}

#[test]
fn applying_over_an_uncontrolled_object_is_a_violation() {
    let world = World::default().with("ConfigMap", "ns", "loose", "u1", None);
    assert_eq!(violations(&apply(vec![cm("ns", "loose")]), &world).len(), 1);
}

#[test]
fn applying_over_our_own_object_is_valid() {
    let world = World::default().with("ConfigMap", "ns", "mine", "u1", Some(PRIMARY_UID));
    assert!(violations(&apply(vec![cm("ns", "mine")]), &world).is_empty());
}

#[test]
fn deleting_requires_our_control_and_the_right_uid() {
    let world = World::default()
        .with("ConfigMap", "ns", "mine", "u1", Some(PRIMARY_UID))
        .with("ConfigMap", "ns", "theirs", "u2", Some("other"));
    let plan = Plan {
        delete: vec![
            delete_cm("ns", "mine", "u1"),
            delete_cm("ns", "theirs", "u2"),
            delete_cm("ns", "gone", "u3"),
        ],
        ..Plan::default()
    };
    assert_eq!(
        violations(&plan, &world),
        vec![
            "ConfigMap ns/theirs: the object to delete is not controlled by this primary",
            "ConfigMap ns/gone: the object to delete does not exist",
        ]
    );
    let stale = Plan {
        delete: vec![delete_cm("ns", "mine", "old-uid")],
        ..Plan::default()
    };
    assert_eq!(
        violations(&stale, &world),
        vec!["ConfigMap ns/mine: the delete names uid \"old-uid\" but the object has uid \"u1\""]
    );
}

fn delete_self(uid: &str) -> Plan {
    Plan {
        delete: vec![DeleteOp {
            target: ObjectRef {
                api_version: "test.wasmop.dev/v1".into(),
                kind: "Widget".into(),
                namespace: "ns".into(),
                name: "w".into(),
            },
            uid: uid.into(),
            resource_version: "7".into(),
        }],
        ..Plan::default()
    }
}

#[test]
fn deleting_the_primary_is_refused_without_delete_primary() {
    let vs = validate(
        &delete_self(PRIMARY_UID),
        &controller(),
        &primary(),
        &World::default(),
    )
    .unwrap_err();
    assert_eq!(vs.len(), 1, "{vs:?}");
    assert_eq!(vs[0].rule, Rule::KindNotOwned);
    assert_eq!(
        vs[0].to_string(),
        "Widget ns/w: the delete names the primary itself, and controller widget does not declare delete-primary"
    );
}

#[test]
fn deleting_the_primary_is_valid_when_the_controller_declares_it() {
    let mut c = controller();
    c.delete_primary = true;
    // The primary is not in `existing` (it is not an owned kind): the
    // snapshot's primary is the evidence, its uid the check.
    assert!(validate(&delete_self(PRIMARY_UID), &c, &primary(), &World::default()).is_ok());
    assert_eq!(
        rules(&delete_self("old-uid"), &c, &World::default()),
        vec![Rule::UidMismatch]
    );
    let mut twice = delete_self(PRIMARY_UID);
    twice.delete.push(twice.delete[0].clone());
    twice.primary_patch = Some(json!({"spec": {"id": "x"}}));
    assert_eq!(
        rules(&twice, &c, &World::default()),
        vec![
            Rule::DuplicateTarget,
            Rule::DuplicateTarget,
            Rule::DuplicateTarget
        ]
    );
}

#[test]
fn delete_primary_covers_only_the_primary_itself() {
    let mut c = controller();
    c.delete_primary = true;
    // Another Widget (same kind, other name) is still not owned.
    let mut other = delete_self("u2");
    other.delete[0].target.name = "w2".into();
    let vs = validate(&other, &c, &primary(), &World::default()).unwrap_err();
    assert_eq!(vs[0].rule, Rule::KindNotOwned);
    // The primary's name in another namespace is another object.
    let mut elsewhere = delete_self(PRIMARY_UID);
    elsewhere.delete[0].target.namespace = "other".into();
    assert!(validate(&elsewhere, &c, &primary(), &World::default()).is_err());
}

#[test]
fn plans_without_force_still_parse_and_force_is_always_printed() {
    let plan: Plan = serde_json::from_value(json!({
        "apply": [{"object": cm("ns", "a"), "precondition": null}]
    }))
    .expect("parses");
    assert!(!plan.apply[0].force);
    let mut forced = plan.clone();
    forced.apply[0].force = true;
    let text = serde_json::to_value(&forced).expect("serializes");
    assert_eq!(text["apply"][0]["force"], json!(true));
}

#[test]
fn forged_owner_references_and_host_labels_are_rejected() {
    let obj = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": "x", "namespace": "ns",
        "ownerReferences": [{"uid": "u"}],
        "labels": {"app.kubernetes.io/managed-by": "me", "wasmop.dev/plugin": "other"}}});
    let rules = rules(&apply(vec![obj]), &controller(), &World::default());
    assert_eq!(
        rules,
        vec![
            Rule::OwnerReferencesForged,
            Rule::HostLabelForged,
            Rule::HostLabelForged
        ]
    );
}

#[test]
fn duplicate_targets_are_rejected_across_applies_and_deletes() {
    let world = World::default().with("ConfigMap", "ns", "a", "u1", Some(PRIMARY_UID));
    let mut plan = apply(vec![cm("ns", "a"), cm("ns", "a")]);
    plan.delete.push(delete_cm("ns", "a", "u1"));
    assert_eq!(
        rules(&plan, &controller(), &world),
        vec![Rule::DuplicateTarget, Rule::DuplicateTarget]
    );
}

#[test]
fn names_must_be_dns1123() {
    assert_eq!(
        violations(&apply(vec![cm("ns", "Bad_Name")]), &World::default()),
        vec![
            "ConfigMap ns/Bad_Name: name \"Bad_Name\" may contain only lowercase letters, digits, '-' and '.'"
        ]
    );
}

#[test]
fn primary_patch_may_only_touch_primary_fields() {
    let ok = Plan {
        primary_patch: Some(json!({"spec": {"id": "abc"}})),
        ..Plan::default()
    };
    assert!(violations(&ok, &World::default()).is_empty());
    let bad = Plan {
        primary_patch: Some(
            json!({"spec": {"id": "abc", "replicas": 3}, "metadata": {"labels": {"a": "b"}}}),
        ),
        ..Plan::default()
    };
    assert_eq!(
        violations(&bad, &World::default()),
        vec![
            "primary: primaryPatch sets metadata.labels.a, which is not in primary-fields of controller widget",
            "primary: primaryPatch sets spec.replicas, which is not in primary-fields of controller widget",
        ]
    );
}

#[test]
fn primary_fields_match_whole_segments_and_empty_objects_count() {
    let mut c = controller();
    c.primary_fields = vec!["metadata.labels.app".into(), "spec.id".into()];
    let v = |patch: Value| -> Vec<String> {
        let plan = Plan {
            primary_patch: Some(patch),
            ..Plan::default()
        };
        match validate(&plan, &c, &primary(), &World::default()) {
            Ok(_) => vec![],
            Err(vs) => vs.into_iter().map(|v| v.message).collect(),
        }
    };
    assert!(v(json!({"metadata": {"labels": {"app": "x"}}})).is_empty());
    assert_eq!(
        v(json!({"metadata": {"labels": {"app.kubernetes.io/name": "x"}}})),
        [
            "primaryPatch sets metadata.labels.app.kubernetes.io/name, which is not in primary-fields of controller widget"
        ]
    );
    assert_eq!(
        v(json!({"spec": {"idx": 1}})),
        ["primaryPatch sets spec.idx, which is not in primary-fields of controller widget"]
    );
    assert_eq!(
        v(json!({"spec": {"other": {}}})),
        ["primaryPatch sets spec.other, which is not in primary-fields of controller widget"]
    );
    assert!(v(json!({"spec": {"id": {}}})).is_empty());
}

/// A lookup that holds nothing and answers every object to create as
/// unasked, while `existing` (what a read would find) knows `world`.
struct Unasked(World);

impl ExistingLookup for Unasked {
    fn existing(&self, kind: &KindRef, ns: Option<&str>, name: &str) -> Option<ExistingObject> {
        self.0.existing(kind, ns, name)
    }

    fn existing_before_create(&self, _: &KindRef, _: Option<&str>, _: &str) -> BeforeCreate {
        BeforeCreate::Unasked
    }
}

#[test]
fn only_creates_fenced_as_absent_may_go_unasked() {
    let lookup = Unasked(World::default().with("ConfigMap", "ns", "a", "u-a", None));
    // No precondition (an apply fenced as absent) and `absent`: judged
    // absent without asking, and marked so.
    let mut plan = apply(vec![cm("ns", "a")]);
    let judged = validate(&plan, &controller(), &primary(), &lookup).unwrap();
    assert_eq!(judged.applies[0].existing, None);
    assert!(judged.applies[0].unasked);
    plan.apply[0].precondition = Some(Precondition::Absent);
    let judged = validate(&plan, &controller(), &primary(), &lookup).unwrap();
    assert!(judged.applies[0].unasked);
    // The plugin's resourceVersion would let the apply succeed on
    // whatever object is at that version: it is always looked up, and
    // someone else's object is refused before anything is written.
    plan.apply[0].precondition = Some(Precondition::ResourceVersion("5".into()));
    let vs = validate(&plan, &controller(), &primary(), &lookup).unwrap_err();
    assert_eq!(vs[0].rule, Rule::NotControlledByPrimary);
    // A lookup that asks (the default) never marks a judgement unasked.
    let world = World::default();
    let judged = validate(
        &apply(vec![cm("ns", "a")]),
        &controller(),
        &primary(),
        &world,
    )
    .unwrap();
    assert!(!judged.applies[0].unasked);
}

#[test]
fn an_existing_object_nothing_controls_is_refused_unless_adoption_is_declared() {
    let world = World::default().with("ConfigMap", "ns", "a", "u-a", None);
    let plan = apply(vec![cm("ns", "a")]);
    let vs = validate(&plan, &controller(), &primary(), &world).unwrap_err();
    assert_eq!(vs[0].rule, Rule::NotControlledByPrimary);
    assert!(
        vs[0].message.contains("does not declare adoption"),
        "{}",
        vs[0].message
    );

    let mut adopting = controller();
    adopting.owns[0].adopt = true;
    let judged = validate(&plan, &adopting, &primary(), &world).unwrap();
    assert!(judged.applies[0].adopts);
    assert_eq!(
        judged.applies[0]
            .existing
            .as_ref()
            .unwrap()
            .resource_version,
        "5"
    );

    // Adoption never takes what something else controls.
    let owned_elsewhere = World::default().with("ConfigMap", "ns", "a", "u-a", Some("other"));
    assert!(validate(&plan, &adopting, &primary(), &owned_elsewhere).is_err());
    let labelled_elsewhere = World::default().labelled("ConfigMap", "ns", "a", "u-a", "other");
    assert!(validate(&plan, &adopting, &primary(), &labelled_elsewhere).is_err());
}

#[test]
fn label_owned_objects_are_judged_by_the_owner_label() {
    let mut c = controller();
    c.owns[0] = OwnedKind::label(KindRef::namespaced("", "v1", "ConfigMap", "configmaps"))
        .extra_label("example.com/owner");
    c.finalizer = Some("example.com/f".into());
    c.write_namespaces = vec!["*".into()];
    let ours = World::default().labelled("ConfigMap", "other-ns", "a", "u-a", PRIMARY_UID);
    let plan = apply(vec![cm("other-ns", "a")]);
    let judged = validate(&plan, &c, &primary(), &ours).unwrap();
    assert!(!judged.applies[0].adopts);
    // Another primary's label, or a controller reference only, is not ours.
    let theirs = World::default().labelled("ConfigMap", "other-ns", "a", "u-a", "other");
    assert!(validate(&plan, &c, &primary(), &theirs).is_err());
    let by_ref = World::default().with("ConfigMap", "other-ns", "a", "u-a", Some(PRIMARY_UID));
    assert!(validate(&plan, &c, &primary(), &by_ref).is_err());
    // The plan may not set the owner labels itself.
    let mut forged = cm("other-ns", "b");
    forged["metadata"]["labels"] = json!({"example.com/owner": PRIMARY_UID});
    let vs = validate(&apply(vec![forged]), &c, &primary(), &World::default()).unwrap_err();
    assert_eq!(vs[0].rule, Rule::HostLabelForged);
    let mut forged = cm("other-ns", "b");
    forged["metadata"]["labels"] = json!({"wasmop.dev/owner-uid": "x"});
    let vs = validate(&apply(vec![forged]), &c, &primary(), &World::default()).unwrap_err();
    assert_eq!(vs[0].rule, Rule::HostLabelForged);
    // Deletes are judged the same way.
    let del = Plan {
        delete: vec![delete_cm("other-ns", "a", "u-a")],
        ..Plan::default()
    };
    assert!(validate(&del, &c, &primary(), &ours).is_ok());
    assert!(validate(&del, &c, &primary(), &theirs).is_err());
}

#[test]
fn an_owner_reference_never_crosses_namespaces() {
    let mut c = controller();
    c.write_namespaces = vec!["other-ns".into()];
    let vs = validate(
        &apply(vec![cm("other-ns", "a")]),
        &c,
        &primary(),
        &World::default(),
    )
    .unwrap_err();
    assert_eq!(vs[0].rule, Rule::NamespaceNotAllowed);
    assert!(vs[0].message.contains("owner-label"), "{}", vs[0].message);
}

#[test]
fn prepare_apply_marks_label_owned_objects_without_owner_references() {
    let owned = OwnedKind::label(KindRef::namespaced("", "v1", "ConfigMap", "configmaps"))
        .extra_label("example.com/owner");
    let out = prepare_apply(&cm("other-ns", "a"), &primary(), "widget", &owned);
    assert!(out["metadata"].get("ownerReferences").is_none());
    assert_eq!(
        out["metadata"]["labels"]["wasmop.dev/owner-uid"],
        PRIMARY_UID
    );
    assert_eq!(out["metadata"]["labels"]["example.com/owner"], PRIMARY_UID);
    assert_eq!(out["metadata"]["labels"]["wasmop.dev/plugin"], "widget");
}

#[test]
fn protected_objects_are_never_deleted_and_plugins_cannot_unprotect_them() {
    let mut world = World::default().with("ConfigMap", "ns", "keep", "u1", Some(PRIMARY_UID));
    if let Some(o) = world
        .0
        .get_mut(&("ConfigMap".into(), "ns".into(), "keep".into()))
    {
        o.protected = true;
    }
    let plan = Plan {
        delete: vec![delete_cm("ns", "keep", "u1")],
        ..Plan::default()
    };
    let vs = validate(&plan, &controller(), &primary(), &world).unwrap_err();
    assert_eq!(vs.len(), 1, "{vs:?}");
    assert_eq!(vs[0].rule, Rule::ProtectedObject);
    assert!(vs[0].object.contains("keep"), "{}", vs[0].object);
    // Read from a live object's labels.
    let live = json!({"metadata": {"uid": "u1", "labels": {PROTECTED_LABEL: "true"}}});
    assert!(ExistingObject::of(&live).protected);
    let other = json!({"metadata": {"uid": "u1", "labels": {PROTECTED_LABEL: "false"}}});
    assert!(!ExistingObject::of(&other).protected);
    // A plugin may not set (or clear) the label itself.
    let mut obj = cm("ns", "keep");
    obj["metadata"]["labels"] = json!({PROTECTED_LABEL: "false"});
    let forged = Plan {
        apply: vec![ApplyOp {
            object: obj,
            precondition: None,
            force: true,
            generate: Vec::new(),
        }],
        ..Plan::default()
    };
    let vs = validate(&forged, &controller(), &primary(), &world).unwrap_err();
    assert!(vs.iter().any(|v| v.rule == Rule::HostLabelForged), "{vs:?}");
    // The primary itself, under delete-primary.
    let mut c = controller();
    c.delete_primary = true;
    let mut p = primary();
    p["metadata"]["labels"] = json!({PROTECTED_LABEL: "true"});
    let vs = validate(&delete_self(PRIMARY_UID), &c, &p, &World::default()).unwrap_err();
    assert_eq!(vs[0].rule, Rule::ProtectedObject, "{vs:?}");
}

#[test]
fn collected_label_owned_objects_get_a_gc_reference_only_at_home() {
    let owned =
        OwnedKind::label(KindRef::namespaced("", "v1", "ConfigMap", "configmaps")).collected();
    let home = object::namespace(&primary())
        .expect("namespaced primary")
        .to_owned();
    let out = prepare_apply(&cm(&home, "a"), &primary(), "widget", &owned);
    assert_eq!(
        out["metadata"]["ownerReferences"],
        json!([{"apiVersion": "test.wasmop.dev/v1", "kind": "Widget", "name": "w",
                "uid": PRIMARY_UID, "controller": false, "blockOwnerDeletion": false}])
    );
    assert_eq!(
        out["metadata"]["labels"]["wasmop.dev/owner-uid"],
        PRIMARY_UID
    );
    // Still judged by the label: the reference is not a controller.
    let existing = ExistingObject::of(&out);
    assert!(existing.is_controlled_by(PRIMARY_UID, &owned.ownership));
    let away = prepare_apply(&cm("other-ns", "a"), &primary(), "widget", &owned);
    assert!(away["metadata"].get("ownerReferences").is_none());
    assert_eq!(
        away["metadata"]["labels"]["wasmop.dev/owner-uid"],
        PRIMARY_UID
    );
    // The manifest JSON names it only when set.
    let json = serde_json::to_value(&owned.ownership).expect("serializes");
    assert_eq!(json["ownerLabel"]["collected"], true);
    let plain = serde_json::to_value(
        &OwnedKind::label(KindRef::namespaced("", "v1", "ConfigMap", "configmaps")).ownership,
    )
    .expect("serializes");
    assert!(plain["ownerLabel"].get("collected").is_none(), "{plain}");
}

#[test]
fn http_requests_must_name_declared_targets_and_ports() {
    let mut c = controller();
    c.http_targets = vec![HttpTarget {
        id: "members".into(),
        kind: KindRef::namespaced("", "v1", "Pod", "pods"),
        ports: vec![8080],
    }];
    let req = |target: &str, port: u16| {
        let mut r = HttpRequest::get(
            &format!("{target}-{port}"),
            target,
            "pod-0",
            port,
            "/healthz",
        );
        r.method = HttpMethod::Get;
        r
    };
    let plan = Plan {
        http_requests: vec![
            req("members", 8080),
            req("members", 9090),
            req("nowhere", 80),
        ],
        ..Plan::default()
    };
    let vs = validate(&plan, &c, &primary(), &World::default()).unwrap_err();
    assert_eq!(vs.len(), 2, "{vs:?}");
    assert!(vs.iter().all(|v| v.rule == Rule::HttpTargetNotAllowed));
}

#[test]
fn prepare_apply_sets_the_controller_reference_and_host_labels() {
    let out = prepare_apply(
        &json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "x", "namespace": "ns", "labels": {"app": "w"}}}),
        &primary(),
        "widget",
        &OwnedKind::reference(KindRef::namespaced("", "v1", "ConfigMap", "configmaps")),
    );
    assert_eq!(
        out["metadata"]["ownerReferences"],
        json!([{"apiVersion": "test.wasmop.dev/v1", "kind": "Widget", "name": "w",
                "uid": PRIMARY_UID, "controller": true, "blockOwnerDeletion": true}])
    );
    assert_eq!(
        out["metadata"]["labels"],
        json!({"app": "w", "app.kubernetes.io/managed-by": "wasmop", "wasmop.dev/plugin": "widget"})
    );
}

#[test]
fn plan_json_uses_the_documented_shape() {
    let plan = Plan {
        apply: vec![ApplyOp {
            object: cm("ns", "a"),
            precondition: Some(Precondition::Absent),
            force: false,
            generate: Vec::new(),
        }],
        events: vec![Event {
            event_type: EventType::Warning,
            reason: "R".into(),
            message: "m".into(),
        }],
        requeue_after_ms: Some(1000),
        ..Plan::default()
    };
    let text = serde_json::to_value(&plan).expect("serializes");
    assert_eq!(
        text,
        json!({"apply": [{"object": cm("ns", "a"), "precondition": {"absent": true}, "force": false}],
               "delete": [], "status": null, "primaryPatch": null,
               "events": [{"type": "Warning", "reason": "R", "message": "m"}],
               "requeueAfterMs": 1000, "cleanupComplete": false, "httpRequests": []})
    );
    let back: Plan = serde_json::from_value(text).expect("round-trips");
    assert_eq!(back, plan);
    let rv: Precondition =
        serde_json::from_value(json!({"resourceVersion": "12"})).expect("parses");
    assert_eq!(rv, Precondition::ResourceVersion("12".into()));
}

#[test]
fn dependents_are_deleted_only_when_an_owned_object_controls_them() {
    // The Pods of a StatefulSet the primary owns.
    let mut c = controller();
    c.owns.push(OwnedKind::dependent(KindRef::namespaced(
        "", "v1", "Pod", "pods",
    )));
    let owned_set = Arc::new(json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "s", "namespace": "ns", "uid": "u-set"}}));
    let pod =
        |controller: Option<&str>| World::default().with("Pod", "ns", "s-0", "u-pod", controller);
    let delete_pod = |uid: &str| Plan {
        delete: vec![DeleteOp {
            target: ObjectRef {
                api_version: "v1".into(),
                kind: "Pod".into(),
                namespace: "ns".into(),
                name: "s-0".into(),
            },
            uid: uid.into(),
            resource_version: "1".into(),
        }],
        ..Plan::default()
    };
    let owned = [owned_set];
    let check = |plan: &Plan, world: &World| {
        validate_with_owned(plan, &c, &primary(), world, &owned)
            .err()
            .unwrap_or_default()
            .iter()
            .map(|v| v.rule.as_str())
            .collect::<Vec<_>>()
    };
    assert!(check(&delete_pod("u-pod"), &pod(Some("u-set"))).is_empty());
    // Controlled by something the primary does not own, by the primary
    // itself, or by nothing: refused.
    assert_eq!(
        check(&delete_pod("u-pod"), &pod(Some("u-other"))),
        ["NotControlledByPrimary"]
    );
    assert_eq!(
        check(&delete_pod("u-pod"), &pod(Some(PRIMARY_UID))),
        ["NotControlledByPrimary"]
    );
    assert_eq!(
        check(&delete_pod("u-pod"), &pod(None)),
        ["NotControlledByPrimary"]
    );
    // Without the owned object in the snapshot, nothing vouches for it.
    assert!(validate(&delete_pod("u-pod"), &c, &primary(), &pod(Some("u-set"))).is_err());
    // The uid precondition still holds; a missing Pod is reported.
    assert_eq!(
        check(&delete_pod("u-old"), &pod(Some("u-set"))),
        ["UidMismatch"]
    );
    assert_eq!(
        check(&delete_pod("u-pod"), &World::default()),
        ["DeleteTargetMissing"]
    );
    // A plan never applies a dependent.
    let apply_pod = apply(vec![json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "s-9", "namespace": "ns"}})]);
    assert_eq!(check(&apply_pod, &World::default()), ["KindNotOwned"]);
}

/// A controller that may write anywhere, as the team plugin's server does:
/// label-owned ConfigMaps narrowed to the primary's namespace, label-owned
/// Secrets anywhere.
fn narrowed() -> Controller {
    let mut c = controller();
    c.owns[0] = OwnedKind::label(KindRef::namespaced("", "v1", "ConfigMap", "configmaps"))
        .own_namespace_only();
    c.owns.push(
        OwnedKind::label(KindRef::namespaced("", "v1", "Secret", "secrets")).write_namespace("*"),
    );
    c.finalizer = Some("f".into());
    c.write_namespaces = vec!["*".into()];
    c
}

fn secret(ns: &str, name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": ns}})
}

#[test]
fn a_kind_narrowed_to_the_primarys_namespace_is_refused_elsewhere_and_the_plan_writes_nothing() {
    let c = narrowed();
    // The narrowed kind at home and the wide kind elsewhere are fine.
    let fine = apply(vec![cm("ns", "a"), secret("other-ns", "mirror")]);
    assert!(validate(&fine, &c, &primary(), &World::default()).is_ok());
    // The narrowed kind elsewhere refuses the whole plan, the Secret with it.
    let plan = apply(vec![secret("other-ns", "mirror"), cm("other-ns", "a")]);
    let vs = validate(&plan, &c, &primary(), &World::default()).unwrap_err();
    assert_eq!(
        vs.iter().map(ToString::to_string).collect::<Vec<_>>(),
        [
            "ConfigMap other-ns/a: controller widget may write ConfigMap only in the primary's namespace (ns), not in namespace other-ns"
        ]
    );
    assert_eq!(vs[0].rule, Rule::NamespaceNotAllowed);
    // Without the kind's own list, the controller's `*` applies, as before.
    let mut wide = c.clone();
    wide.owns[0].write_namespaces = None;
    assert!(validate(&plan, &wide, &primary(), &World::default()).is_ok());
}

#[test]
fn a_delete_of_a_narrowed_kind_elsewhere_is_refused_whoever_owns_it() {
    let c = narrowed();
    let del = |ns: &str| Plan {
        delete: vec![delete_cm(ns, "a", "u-a")],
        ..Plan::default()
    };
    // A foreign object named by a hostile plan, and even one labelled ours.
    for world in [
        World::default().with("ConfigMap", "other-ns", "a", "u-a", Some("someone")),
        World::default().labelled("ConfigMap", "other-ns", "a", "u-a", PRIMARY_UID),
        World::default(),
    ] {
        let vs = validate(&del("other-ns"), &c, &primary(), &world).unwrap_err();
        assert_eq!(vs.len(), 1, "{vs:?}");
        assert_eq!(vs[0].rule, Rule::NamespaceNotAllowed, "{vs:?}");
    }
    let ours = World::default().labelled("ConfigMap", "ns", "a", "u-a", PRIMARY_UID);
    assert!(validate(&del("ns"), &c, &primary(), &ours).is_ok());
}

#[test]
fn no_namespace_alias_reaches_past_a_narrowed_kind() {
    let c = narrowed();
    // An empty namespace is not the primary's: a namespaced kind needs one.
    let mut bare = cm("", "a");
    bare["metadata"]["namespace"] = json!("");
    for plan in [
        apply(vec![bare]),
        Plan {
            delete: vec![delete_cm("", "a", "u-a")],
            ..Plan::default()
        },
    ] {
        let vs = validate(&plan, &c, &primary(), &World::default()).unwrap_err();
        assert_eq!(vs[0].rule, Rule::NamespaceNotAllowed, "{vs:?}");
        assert!(vs[0].message.contains("names no namespace"), "{vs:?}");
    }
    // Another spelling of the primary's namespace is no namespace name.
    let vs = validate(
        &apply(vec![cm("NS", "a")]),
        &c,
        &primary(),
        &World::default(),
    )
    .unwrap_err();
    assert_eq!(vs[0].rule, Rule::InvalidName, "{vs:?}");
    // A cluster-scoped primary has no namespace of its own: nowhere.
    let mut cluster = c.clone();
    cluster.primary.namespaced = false;
    let primary = json!({"apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
                         "metadata": {"name": "w", "namespace": "ns", "uid": PRIMARY_UID}});
    let vs = validate(
        &apply(vec![cm("ns", "a")]),
        &cluster,
        &primary,
        &World::default(),
    )
    .unwrap_err();
    assert_eq!(
        vs[0].to_string(),
        "ConfigMap ns/a: the primary is cluster-scoped and controller widget may write ConfigMap in no namespace, not in namespace ns"
    );
}

#[test]
fn no_plan_sets_changes_or_removes_a_host_label_on_its_primary_or_an_object() {
    // Even a controller that declares every label of its primary.
    let mut c = controller();
    c.primary_fields = vec!["metadata.labels".into(), "metadata".into()];
    c.delete_primary = true;
    let judged = |patch: Value| -> Vec<(Rule, String)> {
        let plan = Plan {
            primary_patch: Some(patch),
            ..Plan::default()
        };
        match validate(&plan, &c, &primary(), &World::default()) {
            Ok(_) => vec![],
            Err(vs) => vs.into_iter().map(|v| (v.rule, v.message)).collect(),
        }
    };
    assert!(judged(json!({"metadata": {"labels": {"app": "x"}}})).is_empty());
    assert!(judged(json!({"metadata": {"labels": {}}})).is_empty());
    for key in [
        "shard.wasmop.dev/shard",
        "shard.wasmop.dev/drain",
        "shard.wasmop.dev/anything",
        MANAGED_BY_LABEL,
        PLUGIN_LABEL,
        OWNER_UID_LABEL,
        PROTECTED_LABEL,
    ] {
        // Set, changed and removed (null, in a merge patch) alike.
        for value in [json!("x"), Value::Null] {
            let vs = judged(json!({"metadata": {"labels": {key: value}}}));
            assert_eq!(vs.len(), 1, "{key}: {vs:?}");
            assert_eq!(vs[0].0, Rule::HostLabelForged, "{key}: {vs:?}");
            assert!(vs[0].1.contains(key), "{key}: {vs:?}");
        }
    }
    // Replacing the labels (or metadata) whole would remove them all.
    for patch in [
        json!({"metadata": {"labels": null}}),
        json!({"metadata": null}),
        json!({"metadata": {"labels": "x"}}),
    ] {
        let vs = judged(patch.clone());
        assert!(
            vs.iter()
                .any(|(r, m)| *r == Rule::HostLabelForged && m.contains("whole")),
            "{patch}: {vs:?}"
        );
    }
    // Applied objects: no shard label either (the host stamps it).
    for key in ["shard.wasmop.dev/shard", "shard.wasmop.dev/drain"] {
        let mut obj = cm("ns", "a");
        obj["metadata"]["labels"] = json!({key: "shard-b"});
        let vs = validate(
            &apply(vec![obj]),
            &controller(),
            &primary(),
            &World::default(),
        )
        .unwrap_err();
        assert_eq!(vs[0].rule, Rule::HostLabelForged, "{vs:?}");
        assert!(vs[0].message.contains(key), "{vs:?}");
    }
    assert!(is_host_label("shard.wasmop.dev/shard"));
    assert!(!is_host_label(PROTECTED_LABEL), "people's, judged apart");
    assert!(!is_host_label("app"));
}

#[test]
fn generated_keys_are_only_for_secret_keys_the_plugin_leaves_to_the_host() {
    let mut c = controller();
    c.owns.push(OwnedKind::reference(KindRef::namespaced(
        "", "v1", "Secret", "secrets",
    )));
    let secret = json!({"apiVersion": "v1", "kind": "Secret",
                        "metadata": {"name": "creds", "namespace": "ns"},
                        "data": {"username": "dQ=="}, "stringData": {"token": "t"}});
    let with = |object: Value, keys: Vec<GeneratedKey>| Plan {
        apply: vec![ApplyOp {
            object,
            precondition: None,
            force: false,
            generate: keys,
        }],
        ..Plan::default()
    };
    let world = World::default();
    let ok = with(secret.clone(), vec![GeneratedKey::hex("password", 32)]);
    assert_eq!(rules(&ok, &c, &world), []);
    let messages = |plan: &Plan| -> Vec<String> {
        validate(plan, &c, &primary(), &world)
            .err()
            .unwrap_or_default()
            .iter()
            .map(|v| format!("{} ({})", v, v.rule.as_str()))
            .collect()
    };
    assert_eq!(
        messages(&with(cm("ns", "c"), vec![GeneratedKey::hex("k", 32)])),
        ["ConfigMap ns/c: only the keys of a v1 Secret can be generated (GeneratedKeyInvalid)"]
    );
    let bad = with(
        secret,
        vec![
            GeneratedKey::hex("username", 32),
            GeneratedKey::hex("token", 32),
            GeneratedKey::hex("no/slash", 32),
            GeneratedKey::hex("short", 8),
            GeneratedKey::hex("password", 32),
            GeneratedKey::hex("password", 32),
        ],
    );
    let found = messages(&bad);
    assert_eq!(found.len(), 5, "{found:#?}");
    for needle in [
        "\"username\" is also set by the plugin",
        "\"token\" is also set by the plugin",
        "\"no/slash\" is not a valid Secret key",
        "\"short\" asks for 8 bytes; between 16 and 1024",
        "\"password\" is listed twice",
    ] {
        assert!(
            found.iter().any(|m| m.contains(needle)),
            "{needle}: {found:#?}"
        );
    }
}
