//! Two faults explored along a run: the operator crashes after any prefix
//! of a plan's writes and starts again (property 4), and a reconcile sees a
//! stale or unobserved snapshot (property 5).
//!
//! # Guarantees
//! - A crash after any prefix of a plan's writes must converge to the same
//!   fixpoint as the run without it; otherwise the shortest trace that
//!   shows it is a finding.
//! - A stale or unobserved snapshot must never delete or downgrade what
//!   the fresh state keeps, nor report Ready.

use std::collections::BTreeSet;

use super::{Ended, Explorer, ROUND_SECS, Rng, Saved, Seen, Trace, first_diff};
use crate::check::cluster::{Cluster, Reconciled, Step};
use crate::check::controllers::Knobs;
use crate::check::properties::{Property, applied_digest, plan_claims_done};
use crate::check::world::{ObjKey, View, describe_key, key_of};
use crate::object;

impl<'a> Explorer<'a> {
    /// Property 4: a crash after every prefix of every plan's writes.
    pub(super) fn crashes(
        &mut self,
        baseline: &Cluster,
        saved: &[Saved],
        knobs: &Knobs,
        seed: u64,
        trace: &Trace,
        deleted_anyway: &BTreeSet<ObjKey>,
    ) {
        let uids: BTreeSet<String> = self
            .primary_keys(&baseline.world)
            .iter()
            .filter_map(|k| baseline.world.get(k).map(|o| object::uid(o).to_owned()))
            .collect();
        let want = baseline.world.content_of(&uids);
        let mut points: Vec<(usize, usize)> = Vec::new();
        for (i, (before, _, ctl, key, _)) in saved.iter().enumerate() {
            // The writes the plan has: reconcile a copy without a cut.
            let mut probe = before.clone();
            let Some(r) =
                self.host
                    .reconcile(&mut probe, self.controller(*ctl), key, None, None, false, 0)
            else {
                continue;
            };
            // A crash before the first write is a reconcile that did not
            // happen: nothing to check.
            points.extend((1..r.writes).map(|n| (i, n)));
        }
        let limit = if self.opts.deep { usize::MAX } else { 24 };
        if points.len() > limit {
            let stride = points.len().div_ceil(limit);
            points = points.into_iter().step_by(stride).collect();
        }
        for (i, n) in points {
            if self.out_of_time() {
                self.note(format!(
                    "{}: crash points left unexplored (time budget)",
                    self.example
                ));
                return;
            }
            let (before, round, ctl, key, at) = &saved[i];
            let mut c = before.clone();
            let mut t = Trace {
                steps: trace.steps[..*at].to_vec(),
            };
            let mut seen = Seen::default();
            let mut rng = Rng::new(seed ^ (i as u64) << 8 ^ n as u64);
            self.report.runs += 1;
            if let Err((p, m)) = self.step(&mut c, *ctl, key, *round, &mut t, &mut seen, Some(n)) {
                self.found(p, seed, knobs, m, t.steps);
                continue;
            }
            c.sim.step(&mut c.world);
            c.world.now += jiff::SignedDuration::from_secs(ROUND_SECS);
            let ended = self.run_to_fixpoint(&mut c, round + 1, &mut rng, &mut t, &mut seen, None);
            let crash = format!(
                "after a crash following write {n} of the plan of {} in round {round}",
                describe_key(key)
            );
            match ended {
                Ended::Failed(Property::Convergence, m) => {
                    self.found(
                        Property::Crash,
                        seed,
                        knobs,
                        format!("{crash}: {m}"),
                        t.steps,
                    );
                }
                Ended::Failed(p, m) => self.found(p, seed, knobs, format!("{crash}: {m}"), t.steps),
                Ended::Fixpoint(_) => {
                    let got = c.world.content_of(&uids);
                    let removed: Vec<String> = seen
                        .deleted
                        .iter()
                        .filter(|k| want.contains_key(*k) && !deleted_anyway.contains(*k))
                        .map(describe_key)
                        .collect();
                    if !removed.is_empty() {
                        self.found(
                            Property::Crash,
                            seed,
                            knobs,
                            format!(
                                "{crash}: a plan deleted what the uninterrupted run keeps: {}",
                                removed.join(", ")
                            ),
                            t.steps,
                        );
                        continue;
                    }
                    let lost: Vec<String> = want
                        .keys()
                        .filter(|k| !got.contains_key(*k))
                        .map(describe_key)
                        .collect();
                    let differ: Vec<String> = want
                        .iter()
                        .filter_map(|(k, v)| {
                            let g = got.get(k)?;
                            (g != v)
                                .then(|| format!("{} ({})", describe_key(k), first_diff(v, g, "")))
                        })
                        .chain(
                            got.keys()
                                .filter(|k| !want.contains_key(*k))
                                .map(describe_key),
                        )
                        .collect();
                    if !lost.is_empty() {
                        self.found(
                            Property::Crash,
                            seed,
                            knobs,
                            format!(
                                "{crash}: the fixpoint lacks what the uninterrupted run keeps: {}",
                                lost.join(", ")
                            ),
                            t.steps,
                        );
                    } else if !differ.is_empty() {
                        self.found(
                            Property::Crash,
                            seed,
                            knobs,
                            format!(
                                "{crash}: another fixpoint than the uninterrupted run's: {} differ",
                                differ.join(", ")
                            ),
                            t.steps,
                        );
                    }
                }
            }
        }
    }

    /// Property 5: stale and unobserved snapshots.
    pub(super) fn stale(
        &mut self,
        _baseline: &Cluster,
        saved: &[Saved],
        knobs: &Knobs,
        seed: u64,
        trace: &Trace,
    ) {
        let limit = if self.opts.deep { usize::MAX } else { 24 };
        let mut tried = 0;
        for (before, round, ctl, key, at) in saved {
            let Some(primary) = before.world.get(key) else {
                continue;
            };
            let uid = object::uid(primary).to_owned();
            let owned: Vec<ObjKey> = before
                .world
                .controlled_by(&uid)
                .into_iter()
                .map(|(k, _)| k.clone())
                .collect();
            for ok in owned {
                for variant in ["missing", "older"] {
                    if tried >= limit || self.out_of_time() {
                        return;
                    }
                    let mut view: View = before.world.view();
                    match variant {
                        "missing" => {
                            view.objects.remove(&ok);
                        }
                        _ => {
                            let cur = before.world.get(&ok);
                            let older = before.world.history(&ok).iter().rev().find(|o| {
                                Some(*o) != cur
                                    && object::uid(o) == cur.map(object::uid).unwrap_or_default()
                            });
                            let Some(older) = older else { continue };
                            view.objects
                                .insert(ok.clone(), std::sync::Arc::new(older.clone()));
                        }
                    }
                    tried += 1;
                    self.one_stale(
                        before,
                        *round,
                        *ctl,
                        key,
                        &ok,
                        variant,
                        &view,
                        knobs,
                        seed,
                        &trace.steps[..*at],
                    );
                }
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn one_stale(
        &mut self,
        before: &Cluster,
        round: usize,
        ctl: usize,
        key: &ObjKey,
        ok: &ObjKey,
        variant: &str,
        view: &View,
        knobs: &Knobs,
        seed: u64,
        prefix: &[Step],
    ) {
        let controller = self.controller(ctl);
        let mut fresh = before.clone();
        let mut stale = before.clone();
        let Some(f) = self
            .host
            .reconcile(&mut fresh, controller, key, None, None, false, round)
        else {
            return;
        };
        let Some(s) =
            self.host
                .reconcile(&mut stale, controller, key, Some(view), None, false, round)
        else {
            return;
        };
        self.report.reconciles += 2;
        self.report.runs += 1;
        let mut steps = prefix.to_vec();
        let mut step = s.step.clone();
        step.summary = format!(
            "{} — from a snapshot where {} is {variant}",
            step.summary,
            describe_key(ok)
        );
        steps.push(step);
        let what = format!(
            "{} {variant} from the snapshot of {}",
            describe_key(ok),
            describe_key(key)
        );
        let plans = |r: &Reconciled| -> Vec<crate::judge::validate::Plan> {
            r.decisions
                .iter()
                .filter_map(|(_, d)| d.plan().cloned())
                .collect()
        };
        let (fp, sp) = (plans(&f), plans(&s));
        let fresh_deletes: BTreeSet<String> = fp
            .iter()
            .flat_map(|p| p.delete.iter().map(|d| d.target.to_string()))
            .collect();
        for p in &sp {
            for d in &p.delete {
                let t = d.target.to_string();
                if !fresh_deletes.contains(&t) {
                    self.found(
                        Property::Stale,
                        seed,
                        knobs,
                        format!("with {what}, the plan deletes {t}, which the fresh state keeps"),
                        steps.clone(),
                    );
                    return;
                }
            }
            if let Some(cond) = plan_claims_done(p) {
                let fresh_claims = fp.iter().any(|x| plan_claims_done(x).is_some());
                let workload = matches!(
                    ok.1.as_str(),
                    "StatefulSet" | "Deployment" | "Job" | "Certificate"
                );
                // A terminal condition (BackupCompleted) may outlive its
                // Job; Ready and Available speak of what runs now.
                let continuous = cond == "Ready" || cond == "Available";
                if !fresh_claims || (variant == "missing" && workload && continuous) {
                    self.found(
                        Property::Stale,
                        seed,
                        knobs,
                        format!("with {what}, the plan reports {cond}=True"),
                        steps.clone(),
                    );
                    return;
                }
            }
            for a in &p.apply {
                let ak = key_of(&a.object);
                let (Some(sd), fd) = (
                    stale.world.get(&ak).and_then(applied_digest),
                    fresh.world.get(&ak).and_then(applied_digest),
                ) else {
                    continue;
                };
                let current = before.world.get(&ak).and_then(applied_digest);
                let older = before
                    .world
                    .history(&ak)
                    .iter()
                    .filter_map(applied_digest)
                    .any(|d| d == sd);
                if Some(sd) != fd && Some(sd) != current && older {
                    self.found(
                        Property::Stale,
                        seed,
                        knobs,
                        format!(
                            "with {what}, the plan writes {} back to an older body",
                            describe_key(&ak)
                        ),
                        steps.clone(),
                    );
                    return;
                }
            }
        }
        // Once fresh, it converges.
        let mut rng = Rng::new(seed ^ 0x5a5a);
        let mut t = Trace { steps };
        let mut seen = Seen::default();
        stale.sim.step(&mut stale.world);
        stale.world.now += jiff::SignedDuration::from_secs(ROUND_SECS);
        if let Ended::Failed(p, m) =
            self.run_to_fixpoint(&mut stale, round + 1, &mut rng, &mut t, &mut seen, None)
        {
            let p = if p == Property::Convergence {
                Property::Stale
            } else {
                p
            };
            self.found(
                p,
                seed,
                knobs,
                format!("after a plan made with {what}: {m}"),
                t.steps,
            );
        }
    }
}
