//! Two changes explored from a run: spec mutations drawn from the CRD
//! schema, from the fixpoint (property 7, with [`crate::check::mutate`]),
//! and the primaries deleted after a few rounds, mid-rollout (property 8).
//!
//! # Guarantees
//! - A valid spec change must converge again, and an invalid one be
//!   refused or reported; otherwise the shortest trace is a finding.
//! - Deleting a primary mid-rollout must finish: the primary goes once its
//!   finalizers ran.

use std::collections::BTreeMap;

use serde_json::Value;

use super::{Ended, Explorer, ROUND_SECS, Rng, Seen, Trace};
use crate::check::cluster::{Cluster, Step};
use crate::check::controllers::Knobs;
use crate::check::mutate::{Mutation, mutations};
use crate::check::properties::{Property, honest};
use crate::check::world::{ObjKey, describe_key};
use crate::object;

impl<'a> Explorer<'a> {
    /// Property 7: spec mutations from the CRD schema, from the fixpoint.
    pub(super) fn mutations(
        &mut self,
        at: &Cluster,
        round: usize,
        knobs: &Knobs,
        seed: u64,
        trace: &Trace,
    ) {
        for k in self.primary_keys(&at.world) {
            let Some(schema) = self.opts.schemas.get(&k.1).cloned() else {
                continue;
            };
            let Some(primary) = at.world.get(&k).cloned() else {
                continue;
            };
            let list = mutations(&schema, &primary);
            let limit = if self.opts.deep { usize::MAX } else { 24 };
            let stride = list.len().div_ceil(limit.max(1)).max(1);
            for m in list.into_iter().step_by(stride) {
                if self.out_of_time() {
                    self.note(format!(
                        "{}: spec mutations left unexplored (time budget)",
                        self.example
                    ));
                    return;
                }
                self.one_mutation(at, round, &k, &m, knobs, seed, trace);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn one_mutation(
        &mut self,
        at: &Cluster,
        round: usize,
        k: &ObjKey,
        m: &Mutation,
        knobs: &Knobs,
        seed: u64,
        trace: &Trace,
    ) {
        if !m.admitted {
            // The CRD refuses it: the API server never stores it.
            return;
        }
        let mut c = at.clone();
        c.world.edit(k, |p| *p = m.object.clone());
        let generation = c.world.get(k).map(|p| p["metadata"]["generation"].clone());
        let mut t = Trace {
            steps: trace.steps.clone(),
        };
        let mut seen = Seen::default();
        let mut rng = Rng::new(seed ^ 0x7777);
        self.report.runs += 1;
        let what = format!("after {} of {}", m.describe, describe_key(k));
        match self.run_to_fixpoint(&mut c, round + 1, &mut rng, &mut t, &mut seen, None) {
            Ended::Failed(Property::Convergence, msg) => {
                self.found(
                    Property::SpecMutation,
                    seed,
                    knobs,
                    format!("{what}: {msg}"),
                    t.steps,
                );
            }
            Ended::Failed(p, msg) => self.found(p, seed, knobs, format!("{what}: {msg}"), t.steps),
            Ended::Fixpoint(_) => {
                let Some(p) = c.world.get(k) else { return };
                if let Err(why) = honest(&c.world, k) {
                    self.found(
                        Property::SpecMutation,
                        seed,
                        knobs,
                        format!("{what}: {why}"),
                        t.steps,
                    );
                    return;
                }
                // Reported, or taken: the status speaks of the new
                // generation (the host sets observedGeneration on a clean
                // pass), or a condition is False.
                let observed = p["status"]["observedGeneration"].clone();
                let any_false = p["status"]["conditions"]
                    .as_array()
                    .is_some_and(|l| l.iter().any(|x| x["status"] == "False"));
                if Some(&observed) != generation.as_ref() && !any_false {
                    self.found(
                        Property::SpecMutation,
                        seed,
                        knobs,
                        format!(
                            "{what}: a silent no-op: the fixpoint's status observed generation {observed}, not {}, and no condition is False",
                            generation.unwrap_or_default()
                        ),
                        t.steps,
                    );
                }
            }
        }
    }

    /// Property 8: the primaries deleted after a few rounds (mid-rollout).
    pub(super) fn deletion(&mut self, objects: &[Value], seed: u64, knobs: &Knobs) {
        let mut rng = Rng::new(seed ^ 0xde1e7e);
        let mut c = Self::cluster(objects, *knobs);
        let mut trace = Trace::default();
        let mut seen = Seen::default();
        let upto = 1 + rng.below(3);
        self.report.runs += 1;
        for round in 1..=upto {
            let mut work = self.work(&c.world);
            rng.shuffle(&mut work);
            for (ctl, key) in work {
                if let Err((p, m)) =
                    self.step(&mut c, ctl, &key, round, &mut trace, &mut seen, None)
                {
                    if p != Property::NoOscillation {
                        self.found(p, seed, knobs, m, trace.steps);
                    }
                    return;
                }
            }
            c.sim.step(&mut c.world);
            c.world.now += jiff::SignedDuration::from_secs(ROUND_SECS);
        }
        let primaries = self.primary_keys(&c.world);
        let uids: BTreeMap<String, ObjKey> = primaries
            .iter()
            .filter_map(|k| Some((object::uid(c.world.get(k)?).to_owned(), k.clone())))
            .collect();
        let kept_before: Vec<ObjKey> = c
            .world
            .objects()
            .filter(|(k, o)| {
                self.opts.kept.contains(&k.1)
                    && object::owner_uids(o).iter().any(|u| uids.contains_key(*u))
            })
            .map(|(k, _)| k.clone())
            .collect();
        for k in &primaries {
            let _ = c.world.delete(k, None, None);
        }
        trace.steps.push(Step {
            round: upto,
            primary: "(user)".into(),
            recording: Value::Null,
            summary: format!(
                "deleted {}",
                primaries
                    .iter()
                    .map(describe_key)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        });
        let mut seen = Seen::default();
        let ended = self.run_to_fixpoint(&mut c, upto + 1, &mut rng, &mut trace, &mut seen, None);
        if let Ended::Failed(p, m) = ended {
            let p = if p == Property::Convergence {
                Property::Deletion
            } else {
                p
            };
            self.found(
                p,
                seed,
                knobs,
                format!("after the primaries were deleted in round {upto}: {m}"),
                trace.steps,
            );
            return;
        }
        let mut problems = Vec::new();
        for k in &primaries {
            if let Some(p) = c.world.get(k) {
                problems.push(format!(
                    "{} is still there (finalizers {:?})",
                    describe_key(k),
                    object::finalizers(p)
                ));
            }
        }
        for (k, o) in c.world.objects() {
            if object::owner_uids(o).iter().any(|u| uids.contains_key(*u))
                && !self.opts.kept.contains(&k.1)
            {
                problems.push(format!("{} is left behind", describe_key(k)));
            }
        }
        for k in kept_before {
            if c.world.get(&k).is_none() {
                problems.push(format!(
                    "{} was deleted, though documented as kept",
                    describe_key(&k)
                ));
            }
        }
        if !problems.is_empty() {
            self.found(
                Property::Deletion,
                seed,
                knobs,
                format!("after deleting in round {upto}: {}", problems.join("; ")),
                trace.steps,
            );
        }
    }
}
