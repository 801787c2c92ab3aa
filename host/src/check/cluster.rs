//! One reconcile in the modelled cluster: the snapshot from a view of the
//! world, the plugin's decision through [`decide`] (the live path, with
//! the host's validation judging from the world's truth), and the plan's
//! writes in the order the host makes them (`execute`): the finalizer,
//! the primary patch, the applies, the deletes, the primary's own delete,
//! the status (with `observedGeneration` and the `Reconciled` condition),
//! the finalizer's release; then the plan's HTTP requests, answered from
//! the scripted table. A failed call or a rejected plan writes
//! `Reconciled=False` with its reason, as the host does.
//!
//! A write may be cut short after any prefix (a crash, property 4).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::check::controllers::Sim;
use crate::check::world::{ObjKey, View, World, key_of};
use crate::conditions;
use crate::contract::manifest::{Controller, split_api_version};
use crate::execute::report::failed_status;
use crate::execute::{RECONCILED_CONDITION, economy, prepare, reconciled_by};
use crate::judge::snapshot::Observation;
use crate::judge::validate::{ApplyJudgement, Judgement, Plan, Precondition, is_primary};
use crate::object;
use crate::plugin::LoadedPlugin;
use crate::reconcile::decide::{DecideInput, Decided, Decision, decide};
use crate::reconcile::kind::{KindDecided, KindOutcome, decide_kind};
use crate::report::record::{offline_kind_recording, offline_recording};
use wasmop_contract::Scope;

/// One scripted answer to the plan's HTTP requests: the first entry whose
/// `id` (a prefix when it ends in `*`) and `method` (any when absent)
/// match answers.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Scripted {
    /// The request id, or a prefix ending in `*`.
    pub id: String,
    /// GET, POST, …; any when absent.
    #[serde(default)]
    pub method: Option<String>,
    /// The status code.
    #[serde(default)]
    pub status: Option<u16>,
    /// The body.
    #[serde(default)]
    pub body: String,
    /// A transport error instead of an answer.
    #[serde(default)]
    pub error: Option<String>,
}

/// The world, the controllers' state and the HTTP results per primary.
#[derive(Clone, Debug)]
pub struct Cluster {
    /// The API server.
    pub world: World,
    /// The built-in controllers.
    pub sim: Sim,
    /// Observations per primary uid, by id.
    pub observations: BTreeMap<String, BTreeMap<String, Observation>>,
}

/// What one reconcile of one primary (or one kind call) did.
#[derive(Clone, Debug)]
pub struct Step {
    /// Round number, from 1.
    pub round: usize,
    /// What was reconciled.
    pub primary: String,
    /// The recording (snapshot and outcome), in `wasmop replay`'s format.
    pub recording: Value,
    /// A line saying what the plan did.
    pub summary: String,
}

/// The outcome of one reconcile.
#[derive(Debug)]
pub struct Reconciled {
    /// The step, for traces.
    pub step: Step,
    /// Decisions (one, or one per primary of a kind call).
    pub decisions: Vec<(ObjKey, Decision)>,
    /// Writes the plans asked for (before the cut).
    pub writes: usize,
    /// True when a write changed the world or a mutating request was sent.
    pub changed: bool,
    /// Why the plugin call failed or the plan was rejected (for the first
    /// primary), if it did.
    pub failure: Option<(String, String)>,
    /// True when the same snapshot gave another plan the second time
    /// (only looked at when asked).
    pub nondeterministic: Option<String>,
}

/// Everything a reconcile needs besides the cluster.
#[derive(Debug)]
pub struct Host<'a> {
    /// The plugin.
    pub plugin: &'a LoadedPlugin,
    /// Scripted HTTP answers.
    pub script: &'a [Scripted],
}

/// One write of a plan, in the host's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Write {
    Finalizer,
    PrimaryPatch,
    Apply(usize),
    Delete(usize),
    DeleteSelf(usize),
    Status,
    Release,
}

impl Host<'_> {
    #[allow(clippy::too_many_arguments)]
    /// Reconciles the primary at `key` (or, for a kind-scoped controller,
    /// every primary of its kind) once. `stale`: the view the snapshot is
    /// built from instead of the world's own. `cut`: stop after this many
    /// writes of the plan. `twice`: call the plugin a second time on the
    /// same snapshot and compare.
    pub fn reconcile(
        &self,
        c: &mut Cluster,
        controller: &Controller,
        key: &ObjKey,
        stale: Option<&View>,
        cut: Option<usize>,
        twice: bool,
        round: usize,
    ) -> Option<Reconciled> {
        if controller.scope == Scope::Kind {
            return self.reconcile_kind(c, controller, stale, cut, twice, round);
        }
        let primary = Arc::new(c.world.get(key)?.clone());
        let fresh = c.world.view();
        let source: &View = stale.unwrap_or(&fresh);
        let observations = self.observations_of(c, object::uid(&primary));
        let input = DecideInput {
            plugin: self.plugin,
            controller,
            source,
            existing: &fresh,
            now: c.world.now,
        };
        let decided = decide(input, Arc::clone(&primary), observations.clone());
        let nondeterministic = twice
            .then(|| {
                let again = decide(input, Arc::clone(&primary), observations);
                let (a, b) = (golden(&decided.decision), golden(&again.decision));
                (a != b).then(|| first_difference(&a, &b))
            })
            .flatten();
        let recording = match &decided.snapshot {
            Some(s) => offline_recording(self.plugin, s, &decided.decision),
            None => Value::Null,
        };
        let Decided { decision, .. } = decided;
        let mut out = Reconciled {
            step: Step {
                round,
                primary: object::describe(&primary),
                recording,
                summary: String::new(),
            },
            decisions: Vec::new(),
            writes: 0,
            changed: false,
            failure: None,
            nondeterministic,
        };
        self.carry_out(c, controller, key, &decision, cut, &mut out);
        out.step.summary = summary(&object::describe(&primary), &decision);
        out.decisions.push((key.clone(), decision));
        Some(out)
    }

    fn reconcile_kind(
        &self,
        c: &mut Cluster,
        controller: &Controller,
        stale: Option<&View>,
        cut: Option<usize>,
        twice: bool,
        round: usize,
    ) -> Option<Reconciled> {
        let fresh = c.world.view();
        let source: &View = stale.unwrap_or(&fresh);
        let all: Vec<Arc<Value>> = c
            .world
            .objects()
            .filter(|(_, o)| {
                controller
                    .primary
                    .matches(object::api_version(o), object::kind(o))
            })
            .map(|(_, o)| Arc::new(o.clone()))
            .collect();
        if all.is_empty() {
            return None;
        }
        let input = DecideInput {
            plugin: self.plugin,
            controller,
            source,
            existing: &fresh,
            now: c.world.now,
        };
        let decided = decide_kind(input, all.clone());
        let nondeterministic = twice
            .then(|| {
                let again = decide_kind(input, all);
                let (a, b) = (kind_golden(&decided), kind_golden(&again));
                (a != b).then(|| first_difference(&a, &b))
            })
            .flatten();
        let recording = offline_kind_recording(self.plugin, &decided).unwrap_or(Value::Null);
        let label = format!("{} (kind call)", controller.primary.kind);
        let mut out = Reconciled {
            step: Step {
                round,
                primary: label.clone(),
                recording,
                summary: String::new(),
            },
            decisions: Vec::new(),
            writes: 0,
            changed: false,
            failure: None,
            nondeterministic,
        };
        let mut lines = Vec::new();
        match decided.outcome {
            KindOutcome::Empty => return None,
            KindOutcome::Failed(e) => {
                out.failure = Some((e.reason().to_owned(), e.to_string()));
                for p in &decided.primaries {
                    out.changed |= self.report_failure(c, &key_of(p), e.reason(), &e.to_string());
                }
                lines.push(format!("failed ({}): {e}", e.reason()));
            }
            KindOutcome::Split { decisions, .. } => {
                let mut left = cut;
                for (p, decision) in decisions {
                    let k = key_of(&p);
                    let before = out.writes;
                    self.carry_out(c, controller, &k, &decision, left, &mut out);
                    if let Some(l) = left.as_mut() {
                        *l = l.saturating_sub(out.writes - before);
                    }
                    lines.push(summary(&object::describe(&p), &decision));
                    out.decisions.push((k, decision));
                }
            }
        }
        out.step.summary = format!("{label}: {}", lines.join("; "));
        Some(out)
    }

    fn observations_of(&self, c: &Cluster, uid: &str) -> Vec<Observation> {
        let now = c.world.now;
        c.observations
            .get(uid)
            .map(|m| {
                m.values()
                    .map(|o| {
                        let mut o = o.clone();
                        let at: Option<jiff::Timestamp> = o.observed_at.parse().ok();
                        o.age_ms = at.map_or(0, |t| {
                            u64::try_from(now.duration_since(t).as_millis()).unwrap_or(0)
                        });
                        o
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Carries out one decision for the primary at `key`.
    fn carry_out(
        &self,
        c: &mut Cluster,
        controller: &Controller,
        key: &ObjKey,
        decision: &Decision,
        cut: Option<usize>,
        out: &mut Reconciled,
    ) {
        match decision {
            Decision::Skipped(_) => {}
            Decision::Failed(e) => {
                if out.failure.is_none() {
                    out.failure = Some((e.reason().to_owned(), e.to_string()));
                }
                out.changed |= self.report_failure(c, key, e.reason(), &e.to_string());
            }
            Decision::Rejected { violations, .. } => {
                let text = violations
                    .iter()
                    .map(|v| format!("{}: {v}", v.rule.as_str()))
                    .collect::<Vec<_>>()
                    .join("; ");
                if out.failure.is_none() {
                    out.failure = Some(("PlanRejected".to_owned(), text.clone()));
                }
                out.changed |= self.report_failure(c, key, "PlanRejected", &text);
            }
            Decision::Planned { plan, judgement } => {
                self.execute(c, controller, key, plan, judgement, cut, out);
            }
        }
    }

    fn report_failure(&self, c: &mut Cluster, key: &ObjKey, reason: &str, message: &str) -> bool {
        let Some(primary) = c.world.get(key).cloned() else {
            return false;
        };
        let status = failed_status(&primary, reason, message, &c.world.now_text());
        c.world.write_status(key, status).unwrap_or(false)
    }

    #[allow(clippy::too_many_arguments)]
    fn execute(
        &self,
        c: &mut Cluster,
        controller: &Controller,
        key: &ObjKey,
        plan: &Plan,
        judgement: &Judgement,
        cut: Option<usize>,
        out: &mut Reconciled,
    ) {
        let Some(primary) = c.world.get(key).cloned() else {
            return;
        };
        let deleting = object::is_deleting(&primary);
        let delete_self = plan
            .delete
            .iter()
            .position(|d| is_primary(&d.target, controller, &primary));
        let mut writes = Vec::new();
        if let Some(f) = &controller.finalizer
            && delete_self.is_none()
            && !deleting
            && !object::finalizers(&primary).iter().any(|x| x == f)
        {
            writes.push(Write::Finalizer);
        }
        if plan
            .primary_patch
            .as_ref()
            .is_some_and(|p| p.as_object().is_some_and(|m| !m.is_empty()))
        {
            writes.push(Write::PrimaryPatch);
        }
        writes.extend((0..plan.apply.len()).map(Write::Apply));
        writes.extend(
            (0..plan.delete.len())
                .filter(|i| Some(*i) != delete_self)
                .map(Write::Delete),
        );
        match delete_self {
            Some(i) => writes.push(Write::DeleteSelf(i)),
            None => writes.push(Write::Status),
        }
        if deleting && plan.cleanup_complete && controller.finalizer.is_some() {
            writes.push(Write::Release);
        }
        let mut failures: Vec<String> = Vec::new();
        let unjudged = ApplyJudgement::default();
        let mut done = 0;
        for w in &writes {
            if cut.is_some_and(|n| done >= n) {
                out.writes += done;
                return;
            }
            done += 1;
            let now_primary = c.world.get(key).cloned();
            let Some(p) = now_primary else { break };
            let changed = match *w {
                Write::Finalizer => {
                    let mut list = object::finalizers(&p);
                    list.extend(controller.finalizer.clone());
                    c.world.set_finalizers(key, &list)
                }
                Write::PrimaryPatch => match &plan.primary_patch {
                    Some(patch) if !economy::patch_holds(patch, &p) => {
                        c.world.merge_patch(key, patch)
                    }
                    _ => Ok(false),
                },
                Write::Apply(i) => {
                    let op = &plan.apply[i];
                    let judged = judgement.applies.get(i).unwrap_or(&unjudged);
                    self.apply_one(c, controller, &p, op, judged)
                }
                Write::Delete(i) | Write::DeleteSelf(i) => {
                    if !failures.is_empty() && matches!(w, Write::DeleteSelf(_)) {
                        continue;
                    }
                    let d = &plan.delete[i];
                    let (group, _) = split_api_version(&d.target.api_version);
                    let k: ObjKey = (
                        group.to_owned(),
                        d.target.kind.clone(),
                        d.target.namespace.clone(),
                        d.target.name.clone(),
                    );
                    c.world.delete(&k, Some(&d.uid), Some(&d.resource_version))
                }
                Write::Status => {
                    if !failures.is_empty() {
                        break;
                    }
                    let status = self.status_of(c, &p, plan);
                    c.world.write_status(key, status)
                }
                Write::Release => {
                    if !failures.is_empty() {
                        break;
                    }
                    let list: Vec<String> = object::finalizers(&p)
                        .into_iter()
                        .filter(|x| Some(x) != controller.finalizer.as_ref())
                        .collect();
                    c.world.set_finalizers(key, &list)
                }
            };
            match changed {
                Ok(ch) => out.changed |= ch,
                Err(e) => failures.push(e.to_string()),
            }
        }
        out.writes += done;
        if !failures.is_empty() {
            let reason = if failures.iter().all(|f| f.starts_with("conflict")) {
                "WriteConflict"
            } else {
                "WriteFailed"
            };
            let text = failures.join("; ");
            if out.failure.is_none() {
                out.failure = Some((reason.to_owned(), text.clone()));
            }
            out.changed |= self.report_failure(c, key, reason, &text);
            return;
        }
        // The plan's HTTP requests, answered from the script.
        let uid = object::uid(&primary).to_owned();
        for r in &plan.http_requests {
            let method = format!("{:?}", r.method).to_uppercase();
            let found = self.script.iter().find(|s| {
                let id_ok = match s.id.strip_suffix('*') {
                    Some(prefix) => r.id.starts_with(prefix),
                    None => s.id == r.id,
                };
                id_ok
                    && s.method
                        .as_deref()
                        .is_none_or(|m| m.eq_ignore_ascii_case(&method))
            });
            let obs = match found {
                Some(s) => Observation {
                    id: r.id.clone(),
                    status: if s.error.is_some() {
                        None
                    } else {
                        s.status.or(Some(200))
                    },
                    body: s.body.clone(),
                    error: s.error.clone(),
                    observed_at: c.world.now_text(),
                    age_ms: 0,
                    outcome: Some(if s.error.is_some() {
                        wasmop_contract::ObservationOutcome::Failed
                    } else {
                        wasmop_contract::ObservationOutcome::Complete
                    }),
                },
                None => Observation {
                    id: r.id.clone(),
                    status: None,
                    body: String::new(),
                    error: Some("connection refused (no scripted answer in wasmop check)".into()),
                    observed_at: c.world.now_text(),
                    age_ms: 0,
                    outcome: Some(wasmop_contract::ObservationOutcome::Failed),
                },
            };
            let slot = c.observations.entry(uid.clone()).or_default();
            let same = slot.get(&r.id).is_some_and(|o| {
                o.status == obs.status && o.body == obs.body && o.error == obs.error
            });
            if method != "GET" || !same {
                out.changed = true;
            }
            slot.insert(r.id.clone(), obs);
        }
    }

    fn apply_one(
        &self,
        c: &mut Cluster,
        controller: &Controller,
        primary: &Value,
        op: &crate::judge::validate::ApplyOp,
        judged: &ApplyJudgement,
    ) -> Result<bool, crate::check::world::WriteError> {
        let Some(owned) =
            controller.owned_kind(object::api_version(&op.object), object::kind(&op.object))
        else {
            return Ok(false);
        };
        let mut obj = prepare::prepare_apply(&op.object, primary, self.plugin.name(), owned);
        economy::stamp(&mut obj);
        match (&op.precondition, &judged.existing) {
            (Some(Precondition::Absent), _) | (None, None) => c.world.apply(&obj, Some(""), None),
            (Some(Precondition::ResourceVersion(rv)), j) => {
                c.world
                    .apply(&obj, j.as_ref().map(|j| j.uid.as_str()), Some(rv))
            }
            (None, Some(j)) => c.world.apply(
                &obj,
                Some(&j.uid),
                judged.adopts.then_some(j.resource_version.as_str()),
            ),
        }
    }

    /// The status the host writes for `plan` on `primary`.
    fn status_of(&self, c: &Cluster, primary: &Value, plan: &Plan) -> Value {
        let mut status = plan
            .status
            .clone()
            .unwrap_or_else(|| primary["status"].clone());
        if !status.is_object() {
            status = json!({});
        }
        if let Some(g) = primary["metadata"]["generation"].as_i64() {
            if plan.hold_observed_generation {
                match primary["status"]["observedGeneration"].as_i64() {
                    Some(kept) => status["observedGeneration"] = json!(kept),
                    None => {
                        if let Some(m) = status.as_object_mut() {
                            m.remove("observedGeneration");
                        }
                    }
                }
            } else {
                status["observedGeneration"] = json!(g);
            }
        }
        conditions::carry_over(&mut status, &primary["status"], RECONCILED_CONDITION);
        conditions::set(
            &mut status,
            RECONCILED_CONDITION,
            "True",
            "Reconciled",
            &format!("reconciled by plugin {}", reconciled_by(self.plugin)),
            primary["metadata"]["generation"].as_i64(),
            &c.world.now_text(),
        );
        economy::keep_transition_times(&mut status, &primary["status"]);
        status
    }
}

fn golden(d: &Decision) -> String {
    crate::reconcile::offline::to_golden_text(d)
}

fn kind_golden(k: &KindDecided) -> String {
    crate::reconcile::offline::to_kind_golden_text(k)
}

/// The first line where two texts differ, for a message.
fn first_difference(a: &str, b: &str) -> String {
    for (i, (x, y)) in a.lines().zip(b.lines()).enumerate() {
        if x != y {
            return format!("line {}: {:?} then {:?}", i + 1, x.trim(), y.trim());
        }
    }
    "the plans differ in length".to_owned()
}

/// One line saying what a decision asks for.
pub fn summary(primary: &str, d: &Decision) -> String {
    match d {
        Decision::Skipped(r) => format!("{primary}: skipped ({})", r.as_str()),
        Decision::Failed(e) => format!("{primary}: failed ({}): {e}", e.reason()),
        Decision::Rejected { violations, .. } => format!(
            "{primary}: plan rejected ({})",
            violations
                .iter()
                .map(|v| v.rule.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Decision::Planned { plan, .. } => {
            let applies: Vec<String> = plan
                .apply
                .iter()
                .map(|a| format!("{} {}", object::kind(&a.object), object::name(&a.object)))
                .collect();
            let deletes: Vec<String> = plan
                .delete
                .iter()
                .map(|d| format!("{} {}", d.target.kind, d.target.name))
                .collect();
            let ready = plan
                .status
                .as_ref()
                .map(|s| {
                    s["conditions"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|c| {
                            format!(
                                "{}={}",
                                c["type"].as_str().unwrap_or("?"),
                                c["status"].as_str().unwrap_or("?")
                            )
                        })
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .unwrap_or_default();
            let mut s = format!("{primary}: apply [{}]", applies.join(", "));
            if !deletes.is_empty() {
                s.push_str(&format!(" delete [{}]", deletes.join(", ")));
            }
            if !ready.is_empty() {
                s.push_str(&format!(" status [{ready}]"));
            }
            if plan.cleanup_complete {
                s.push_str(" cleanupComplete");
            }
            if !plan.http_requests.is_empty() {
                s.push_str(&format!(" http {}", plan.http_requests.len()));
            }
            s
        }
    }
}
