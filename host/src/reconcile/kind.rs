//! Kind-scoped controllers (`"scope": "kind"` in the manifest): one call
//! over every primary of the kind, split into one [`Decision`] per primary.
//!
//! ```text
//! primaries ──kind snapshot──▶ plugin ──kind plan──▶ split ──▶ per primary: counts + validate
//! ```
//!
//! # Snapshot
//!
//! - `primary` is `{"apiVersion":"v1","kind":"List","items":[…]}` of every
//!   primary of the kind, sorted by namespace and name, without those that
//!   are being deleted and do not hold the controller's finalizer (a
//!   per-object controller skips them the same way, see
//!   [`crate::reconcile::decide()`]).
//! - `owned` is the union of what each listed primary owns, `related` the
//!   union of what the reads select for each of them, each object once per
//!   read, sorted as in a per-object snapshot. Reads that do not depend on
//!   the primary (cluster-wide, or by namespace or label for the same
//!   namespace) are selected once per namespace, not once per primary.
//! - `deleting` is false (each item carries its own deletionTimestamp);
//!   `observations` is empty (kind-scoped controllers declare no HTTP
//!   targets; the manifest check refuses them).
//!
//! # Guarantees of the split
//!
//! - A kind plan holds nothing but `objects`; anything else at its top
//!   level refuses the whole plan (as a malformed output, [`KindOutcome::Failed`]) and nothing
//!   is written.
//! - Each object plan is judged against its own primary only, found by
//!   uid (namespace and name must match too): the plan-count limits, the
//!   gauge rules and [`validate_with_owned`] with the owned objects that
//!   primary controls. So "a plan touches only what its primary owns" holds
//!   per primary exactly as for a per-object controller.
//! - An object plan naming no listed primary, naming one a second time, or
//!   holding `objects` of its own is [refused](Refusal); the other object
//!   plans are decided as if it were not there.
//! - A primary no object plan names gets no decision: nothing is written
//!   for it on this call.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use serde_json::Value;

use crate::contract::manifest::{Controller, Selector};
use crate::judge::existing::ExistingObject;
use crate::judge::snapshot::{ObjectSource, RelatedObject, Snapshot, absent_kinds, build_snapshot};
use crate::judge::validate::{
    ExistingLookup, Plan, PlanLimits, check_counts, check_gauges, validate_with_owned,
};
use crate::object;
use crate::plugin::CallError;
use crate::plugin::OutputProblem;
use crate::reconcile::decide::{DecideInput, Decision, format_now};

/// An object plan the host refused without judging it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// Index of the object plan in the kind plan's `objects`.
    pub index: usize,
    /// The primary it named: `namespace/name (uid …)`.
    pub named: String,
    /// Why it was refused.
    pub reason: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "objects[{}] ({}): {}",
            self.index, self.named, self.reason
        )
    }
}

/// How a kind call was decided.
#[derive(Debug)]
pub enum KindOutcome {
    /// No primary to reconcile: the plugin was not called.
    Empty,
    /// The call failed (as [`Decision::Failed`], for every primary).
    Failed(CallError),
    /// The plan, split: one decision per primary an object plan named.
    Split {
        /// Each named primary with its decision, in plan order.
        decisions: Vec<(Arc<Value>, Decision)>,
        /// Object plans refused without being judged.
        refused: Vec<Refusal>,
    },
}

/// A kind call with what it was made from.
#[derive(Debug)]
pub struct KindDecided {
    /// The primaries the call covered, sorted by namespace and name.
    pub primaries: Vec<Arc<Value>>,
    /// The snapshot handed to the plugin; `None` when it was not called.
    pub snapshot: Option<Snapshot>,
    /// The outcome.
    pub outcome: KindOutcome,
}

/// The primaries a kind call covers: all but those being deleted without
/// the controller's finalizer, sorted by namespace and name.
pub fn kind_primaries(controller: &Controller, all: Vec<Arc<Value>>) -> Vec<Arc<Value>> {
    let mut primaries: Vec<Arc<Value>> = all
        .into_iter()
        .filter(|p| {
            !object::is_deleting(p)
                || controller
                    .finalizer
                    .as_deref()
                    .is_some_and(|f| object::finalizers(p).iter().any(|x| x == f))
        })
        .collect();
    primaries.sort_by(|a, b| {
        (object::namespace(a).unwrap_or_default(), object::name(a))
            .cmp(&(object::namespace(b).unwrap_or_default(), object::name(b)))
    });
    primaries
}

/// The snapshot of a kind call over `primaries` (already filtered and
/// sorted, see [`kind_primaries`]).
pub fn build_kind_snapshot(
    controller: &Controller,
    primaries: &[Arc<Value>],
    source: &dyn ObjectSource,
    now: &str,
    settings: &Value,
) -> Snapshot {
    // Reads that select the same objects for every primary of a namespace
    // are resolved once per namespace through a stand-in primary (its
    // namespace only); reads that depend on the primary's own fields or
    // uid go through each primary.
    let per_primary = Controller {
        reads: controller
            .reads
            .iter()
            .filter(|r| depends_on_primary(&r.selector))
            .cloned()
            .collect(),
        ..controller.clone()
    };
    let shared = Controller {
        owns: Vec::new(),
        reads: controller
            .reads
            .iter()
            .filter(|r| !depends_on_primary(&r.selector))
            .cloned()
            .collect(),
        ..controller.clone()
    };
    let mut owned: BTreeMap<String, Arc<Value>> = BTreeMap::new();
    let mut related: Vec<RelatedObject> = Vec::new();
    let mut namespaces_done: HashSet<Option<String>> = HashSet::new();
    for primary in primaries {
        let one = build_snapshot(
            &per_primary,
            Arc::clone(primary),
            source,
            now,
            settings,
            vec![],
        );
        for o in one.owned {
            owned.entry(identity(&o)).or_insert(o);
        }
        related.extend(one.related.into_iter().filter(|r| !is_absent_entry(r)));
        let ns = if controller.primary.namespaced {
            object::namespace(primary).map(str::to_owned)
        } else {
            None
        };
        if !shared.reads.is_empty() && namespaces_done.insert(ns.clone()) {
            let stand_in = Arc::new(serde_json::json!({"metadata": {"namespace": ns}}));
            let one = build_snapshot(&shared, stand_in, source, now, settings, vec![]);
            related.extend(one.related.into_iter().filter(|r| !is_absent_entry(r)));
        }
    }
    // Optional kinds that are not listed, as a per-object snapshot names
    // them.
    related.extend(absent_kinds(controller, source));
    // Each object once per read, reads in manifest order (then the absent
    // kinds), objects sorted as in a per-object snapshot.
    let read_order: HashMap<&str, usize> = controller
        .reads
        .iter()
        .enumerate()
        .map(|(i, r)| (r.id.as_str(), i))
        .collect();
    let mut seen = HashSet::new();
    related.retain(|r| seen.insert((r.read.clone(), identity(&r.object))));
    related.sort_by(|a, b| {
        let order = |r: &RelatedObject| read_order.get(r.read.as_str()).copied();
        (order(a).is_none(), order(a), sort_key(&a.object)).cmp(&(
            order(b).is_none(),
            order(b),
            sort_key(&b.object),
        ))
    });
    let mut owned: Vec<Arc<Value>> = owned.into_values().collect();
    owned.sort_by(|a, b| sort_key(a).cmp(&sort_key(b)));
    Snapshot {
        controller: controller.name.clone(),
        primary: Arc::new(serde_json::json!({
            "apiVersion": wasmop_contract::KIND_SNAPSHOT_API_VERSION,
            "kind": wasmop_contract::KIND_SNAPSHOT_KIND,
            "items": primaries.iter().map(|p| p.as_ref().clone()).collect::<Vec<_>>(),
        })),
        owned,
        related,
        now: now.to_owned(),
        deleting: false,
        settings: settings.clone(),
        observations: Vec::new(),
    }
}

fn is_absent_entry(r: &RelatedObject) -> bool {
    r.read == wasmop_contract::ABSENT_KIND_READ
}

/// True for the selectors whose result depends on the primary's own
/// fields or uid (not only on its namespace).
fn depends_on_primary(selector: &Selector) -> bool {
    matches!(selector, Selector::OwnedByPrimary | Selector::Field(_))
}

/// Identity of an object across reads: its uid, or kind/namespace/name.
fn identity(o: &Value) -> String {
    let uid = object::uid(o);
    if uid.is_empty() {
        format!(
            "{}/{}/{}/{}",
            object::api_version(o),
            object::kind(o),
            object::namespace(o).unwrap_or_default(),
            object::name(o)
        )
    } else {
        uid.to_owned()
    }
}

fn sort_key(o: &Value) -> (&str, &str, &str, &str) {
    (
        object::kind(o),
        object::namespace(o).unwrap_or_default(),
        object::name(o),
        object::api_version(o),
    )
}

/// Decides one kind call over `all` (every primary of the kind): builds
/// the kind snapshot, calls the plugin once and splits its plan.
pub fn decide_kind(input: DecideInput<'_>, all: Vec<Arc<Value>>) -> KindDecided {
    let controller = input.controller;
    let primaries = kind_primaries(controller, all);
    if primaries.is_empty() {
        return KindDecided {
            primaries,
            snapshot: None,
            outcome: KindOutcome::Empty,
        };
    }
    let snapshot = build_kind_snapshot(
        controller,
        &primaries,
        input.source,
        &format_now(input.now),
        input.plugin.settings(),
    );
    let outcome = match input.plugin.reconcile(&snapshot) {
        Err(e) => KindOutcome::Failed(e),
        Ok(plan) => split(
            Judge {
                controller,
                existing: input.existing,
                limits: &input.plugin.limits().plan,
            },
            &primaries,
            &snapshot.owned,
            plan,
        ),
    };
    KindDecided {
        primaries,
        snapshot: Some(snapshot),
        outcome,
    }
}

/// What an object plan is judged with.
#[derive(Clone, Copy)]
pub struct Judge<'a> {
    /// The controller (of the effective manifest).
    pub controller: &'a Controller,
    /// Who answers "does it exist, and who controls it".
    pub existing: &'a dyn ExistingLookup,
    /// The plugin's plan limits.
    pub limits: &'a PlanLimits,
}

impl std::fmt::Debug for Judge<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Judge")
            .field("controller", &self.controller.name)
            .finish()
    }
}

/// Splits a kind plan into one decision per primary it names (see the
/// module's guarantees).
pub fn split(
    input: Judge<'_>,
    primaries: &[Arc<Value>],
    owned: &[Arc<Value>],
    mut plan: Plan,
) -> KindOutcome {
    let objects = std::mem::take(&mut plan.objects);
    if !plan.is_empty() {
        let mut fields = Vec::new();
        let top = serde_json::to_value(&plan).unwrap_or_default();
        let empty = serde_json::to_value(Plan::default()).unwrap_or_default();
        if let (Some(top), Some(empty)) = (top.as_object(), empty.as_object()) {
            for (k, v) in top {
                if empty.get(k) != Some(v) {
                    fields.push(k.clone());
                }
            }
        }
        return KindOutcome::Failed(CallError::MalformedOutput(OutputProblem::WrongScope(
            format!(
                "a kind plan holds only `objects` (one plan per primary); it also sets {}",
                fields.join(", ")
            ),
        )));
    }
    let by_uid: HashMap<&str, &Arc<Value>> =
        primaries.iter().map(|p| (object::uid(p), p)).collect();
    // Owned objects grouped by the primary that controls them.
    let mut owned_by: HashMap<&str, Vec<Arc<Value>>> = HashMap::new();
    for o in owned {
        let judged = ExistingObject::of(o);
        // The primaries it may belong to: its controller ownerReference's
        // and its owner label's uid, confirmed under each owned kind's
        // ownership.
        let candidates = [
            object::controller_uid(o),
            object::labels_get(o, wasmop_contract::OWNER_UID_LABEL),
        ];
        for uid in candidates.into_iter().flatten() {
            let Some((&uid, _)) = by_uid.get_key_value(uid) else {
                continue;
            };
            let owns = input
                .controller
                .owns
                .iter()
                .any(|k| judged.is_controlled_by(uid, &k.ownership));
            let list = owned_by.entry(uid).or_default();
            if owns && !list.iter().any(|x| Arc::ptr_eq(x, o)) {
                list.push(Arc::clone(o));
            }
        }
    }
    let mut decided: HashSet<&str> = HashSet::new();
    let mut decisions = Vec::new();
    let mut refused = Vec::new();
    for (index, object_plan) in objects.into_iter().enumerate() {
        let named = if object_plan.namespace.is_empty() {
            format!("{} (uid {})", object_plan.name, object_plan.uid)
        } else {
            format!(
                "{}/{} (uid {})",
                object_plan.namespace, object_plan.name, object_plan.uid
            )
        };
        let refuse = |reason: String| Refusal {
            index,
            named: named.clone(),
            reason,
        };
        let Some(primary) = by_uid.get(object_plan.uid.as_str()).copied() else {
            refused.push(refuse(
                "no primary of the snapshot has this uid (a plan may only answer for the primaries it was given)".into(),
            ));
            continue;
        };
        if object::name(primary) != object_plan.name
            || object::namespace(primary).unwrap_or_default() != object_plan.namespace
        {
            refused.push(refuse(format!(
                "uid {} is {}, not {}",
                object_plan.uid,
                object::describe(primary),
                named
            )));
            continue;
        }
        if !object_plan.plan.objects.is_empty() {
            refused.push(refuse("an object plan may not hold `objects`".into()));
            continue;
        }
        if !decided.insert(object::uid(primary)) {
            refused.push(refuse(
                "a second plan for the same primary (one per primary)".into(),
            ));
            continue;
        }
        let plan = object_plan.plan;
        let mut too_many = check_counts(&plan, input.limits);
        too_many.extend(check_gauges(&plan));
        let decision = if !too_many.is_empty() {
            Decision::Rejected {
                plan,
                violations: too_many,
            }
        } else {
            let own = owned_by
                .get(object::uid(primary))
                .map(Vec::as_slice)
                .unwrap_or_default();
            match validate_with_owned(&plan, input.controller, primary, input.existing, own) {
                Ok(judgement) => Decision::Planned { plan, judgement },
                Err(violations) => Decision::Rejected { plan, violations },
            }
        };
        decisions.push((Arc::clone(primary), decision));
    }
    KindOutcome::Split { decisions, refused }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use wasmop_contract::{DeleteOp, ObjectPlan, ObjectRef, Scope};

    use super::*;
    use crate::contract::manifest::tests::controller;
    use crate::contract::manifest::{KindRef, Read};
    use crate::judge::snapshot::MemorySource;
    use crate::judge::validate::Rule;

    fn kind_controller() -> Controller {
        Controller {
            scope: Scope::Kind,
            ..controller()
        }
    }

    fn widget(name: &str) -> Value {
        json!({"apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
               "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
                            "resourceVersion": "1"}})
    }

    fn cm_of(owner: &str, name: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
                            "resourceVersion": "2",
                            "ownerReferences": [{"apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
                                                 "name": owner, "uid": format!("uid-{owner}"),
                                                 "controller": true}]}})
    }

    fn desired_cm(name: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": name, "namespace": "ns"}, "data": {"k": "v"}})
    }

    /// Splits `plan` over widgets a and b, where b owns ConfigMap b-cm.
    fn split_over_a_and_b(plan: Plan) -> KindOutcome {
        let (a, b) = (widget("a"), widget("b"));
        let owned = cm_of("b", "b-cm");
        let source = MemorySource::new([a.clone(), b.clone(), owned.clone()]);
        let c = kind_controller();
        split(
            Judge {
                controller: &c,
                existing: &source,
                limits: &PlanLimits::default(),
            },
            &[Arc::new(a), Arc::new(b)],
            &[Arc::new(owned)],
            plan,
        )
    }

    fn decisions(outcome: KindOutcome) -> (Vec<(String, Decision)>, Vec<Refusal>) {
        match outcome {
            KindOutcome::Split { decisions, refused } => (
                decisions
                    .into_iter()
                    .map(|(p, d)| (object::name(&p).to_owned(), d))
                    .collect(),
                refused,
            ),
            other => panic!("expected a split, got {other:?}"),
        }
    }

    fn rules(d: &Decision) -> Vec<Rule> {
        match d {
            Decision::Rejected { violations, .. } => violations.iter().map(|v| v.rule).collect(),
            other => panic!("expected a rejection, got {other:?}"),
        }
    }

    #[test]
    fn each_object_plan_is_judged_against_its_own_primary() {
        let plan = Plan::new()
            .object(&widget("a"), Plan::new().apply(desired_cm("a-cm")))
            .object(&widget("b"), Plan::new().apply(desired_cm("b-cm")));
        let (decided, refused) = decisions(split_over_a_and_b(plan));
        assert!(refused.is_empty());
        assert_eq!(decided.len(), 2);
        for (name, d) in &decided {
            assert!(matches!(d, Decision::Planned { .. }), "{name}: {d:?}");
        }
        // b's apply is judged as b's: its ConfigMap exists, controlled by b.
        let Decision::Planned { judgement, .. } = &decided[1].1 else {
            unreachable!()
        };
        assert!(judgement.applies[0].existing.is_some());
    }

    #[test]
    fn an_object_plan_touching_another_primarys_object_is_rejected_and_the_others_run() {
        // a applies, then deletes, what b owns; b's own plan is fine.
        let delete = DeleteOp {
            target: ObjectRef {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
                namespace: "ns".into(),
                name: "b-cm".into(),
            },
            uid: "uid-b-cm".into(),
            resource_version: "2".into(),
        };
        let mut deletes = Plan::new();
        deletes.delete.push(delete);
        for a_plan in [Plan::new().apply(desired_cm("b-cm")), deletes] {
            let plan = Plan::new()
                .object(&widget("a"), a_plan)
                .object(&widget("b"), Plan::new().status(json!({"ok": true})));
            let (decided, refused) = decisions(split_over_a_and_b(plan));
            assert!(refused.is_empty());
            assert_eq!(decided[0].0, "a");
            assert_eq!(
                rules(&decided[0].1),
                [Rule::NotControlledByPrimary],
                "a may not write b's ConfigMap"
            );
            assert_eq!(decided[1].0, "b");
            assert!(matches!(decided[1].1, Decision::Planned { .. }));
        }
    }

    #[test]
    fn an_object_plan_for_a_primary_not_in_the_snapshot_is_refused_and_the_others_run() {
        let stranger = widget("z");
        let mut impostor = ObjectPlan::new(&widget("a"), Plan::new());
        impostor.name = "b".into(); // a's uid under b's name
        let mut plan = Plan::new()
            .object(&stranger, Plan::new().apply(desired_cm("z-cm")))
            .object(&widget("b"), Plan::new().status(json!({"ok": true})))
            .object(&widget("b"), Plan::new().status(json!({"twice": true})));
        plan.objects.push(impostor);
        let nested = Plan::new().object(&widget("a"), Plan::new());
        plan.objects.push(ObjectPlan::new(&widget("a"), nested));
        let (decided, refused) = decisions(split_over_a_and_b(plan));
        let names: Vec<&str> = decided.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["b"], "only the good plan for b is decided");
        assert!(matches!(decided[0].1, Decision::Planned { ref plan, .. }
            if plan.status == Some(json!({"ok": true}))));
        let reasons: Vec<String> = refused.iter().map(ToString::to_string).collect();
        assert_eq!(refused.len(), 4, "{reasons:#?}");
        assert!(
            reasons[0].starts_with("objects[0] (ns/z (uid uid-z)): no primary of the snapshot")
        );
        assert!(reasons[1].contains("second plan for the same primary"));
        assert!(reasons[2].contains("uid uid-a is Widget ns/a, not ns/b"));
        assert!(reasons[3].contains("may not hold `objects`"));
    }

    #[test]
    fn a_kind_plan_with_fields_outside_objects_is_refused_as_a_whole() {
        let plan = Plan::new()
            .object(&widget("a"), Plan::new())
            .status(json!({"oops": true}));
        match split_over_a_and_b(plan) {
            KindOutcome::Failed(CallError::MalformedOutput(OutputProblem::WrongScope(m))) => {
                assert!(m.contains("it also sets status"), "{m}");
            }
            other => panic!("expected a refusal of the whole plan, got {other:?}"),
        }
    }

    #[test]
    fn object_plans_over_the_count_limits_are_rejected_alone() {
        let limits = PlanLimits {
            max_applies: 1,
            ..PlanLimits::default()
        };
        let (a, b) = (widget("a"), widget("b"));
        let source = MemorySource::new([a.clone(), b.clone()]);
        let c = kind_controller();
        let plan = Plan::new()
            .object(
                &a,
                Plan::new()
                    .apply(desired_cm("a-1"))
                    .apply(desired_cm("a-2")),
            )
            .object(&b, Plan::new().apply(desired_cm("b-1")));
        let outcome = split(
            Judge {
                controller: &c,
                existing: &source,
                limits: &limits,
            },
            &[Arc::new(a), Arc::new(b)],
            &[],
            plan,
        );
        let (decided, _) = decisions(outcome);
        assert!(matches!(decided[0].1, Decision::Rejected { .. }));
        assert!(matches!(decided[1].1, Decision::Planned { .. }));
    }

    #[test]
    fn the_kind_snapshot_lists_every_primary_once_with_what_each_owns_and_reads() {
        let mut c = kind_controller();
        c.reads.push(Read::new(
            "maps",
            KindRef::namespaced("", "v1", "ConfigMap", "configmaps"),
            crate::contract::manifest::Selector::SameNamespace,
        ));
        let mut gone = widget("gone");
        gone["metadata"]["deletionTimestamp"] = json!("2025-01-01T00:00:00Z");
        let objects = [
            widget("b"),
            widget("a"),
            gone.clone(),
            cm_of("a", "a-cm"),
            cm_of("b", "b-cm"),
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "free", "namespace": "ns", "uid": "uid-free"}}),
        ];
        let source = MemorySource::new(objects.clone());
        let primaries = kind_primaries(
            &c,
            vec![Arc::new(widget("b")), Arc::new(widget("a")), Arc::new(gone)],
        );
        let names: Vec<&str> = primaries.iter().map(|p| object::name(p)).collect();
        assert_eq!(
            names,
            ["a", "b"],
            "sorted; deleting without the finalizer left out"
        );
        let s = build_kind_snapshot(&c, &primaries, &source, "2025-01-01T00:00:00Z", &json!({}));
        assert_eq!(s.primary["kind"], "List");
        assert_eq!(s.primary["items"].as_array().unwrap().len(), 2);
        let owned: Vec<&str> = s.owned.iter().map(|o| object::name(o)).collect();
        assert_eq!(owned, ["a-cm", "b-cm"]);
        let related: Vec<&str> = s.related.iter().map(|r| object::name(&r.object)).collect();
        assert_eq!(
            related,
            ["a-cm", "b-cm", "free"],
            "each object once per read"
        );
        assert!(!s.deleting);
    }
}
