//! Exploring a plugin from each example: seeded runs through the modelled
//! cluster, each under one scenario of the controllers' knobs and one
//! order of reconciles, with every property checked on the way; the
//! shortest failing trace of each property is kept.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::check::cluster::{Cluster, Host, Reconciled, Step};
use crate::check::controllers::{Knobs, Sim};
use crate::check::mutate::{Mutation, mutations};
use crate::check::properties::{Property, applied_digest, done_claims, honest, plan_claims_done};
use crate::check::world::{ObjKey, View, World, describe_key, key_of};
use crate::contract::manifest::{Controller, Manifest};
use crate::object;
use crate::reconcile::decide::Decision;
use wasmop_contract::Scope;

/// How far to explore.
#[derive(Clone, Debug)]
pub struct Options {
    /// Rounds a run may take to reach its fixpoint.
    pub rounds: usize,
    /// The first seed.
    pub seed: u64,
    /// Seeds to run per example (each seed a scenario and an order).
    pub seeds: u64,
    /// Explore every crash point and stale view, and keep going through
    /// seeds until the budget is spent.
    pub deep: bool,
    /// Stop starting new work after this long.
    pub budget: Duration,
    /// Kinds the plugin documents as outliving its primary.
    pub kept: Vec<String>,
    /// The properties to check.
    pub properties: BTreeSet<Property>,
    /// The primary's CRD schema (`openAPIV3Schema`), per primary kind, for
    /// spec mutations.
    pub schemas: BTreeMap<String, Value>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            rounds: 40,
            seed: 1,
            seeds: SCENARIOS as u64,
            deep: false,
            budget: Duration::from_secs(60),
            kept: Vec::new(),
            properties: Property::ALL.into_iter().collect(),
            schemas: BTreeMap::new(),
        }
    }
}

/// A property that does not hold, with the shortest trace found.
#[derive(Clone, Debug)]
pub struct Finding {
    /// Which property.
    pub property: Property,
    /// The example it started from.
    pub example: String,
    /// The seed of the run.
    pub seed: u64,
    /// The scenario (knobs) of the run.
    pub scenario: String,
    /// What went wrong.
    pub message: String,
    /// The reconciles from the example's objects to the failure.
    pub steps: Vec<Step>,
}

/// What a check found.
#[derive(Debug, Default)]
pub struct Report {
    /// Runs made.
    pub runs: usize,
    /// Reconciles made.
    pub reconciles: usize,
    /// The shortest finding per property and example.
    pub findings: Vec<Finding>,
    /// Remarks that are not failures (a done condition never reached in a
    /// healthy cluster, the budget spent).
    pub notes: Vec<String>,
}

/// The number of scenarios one seed cycles through.
pub const SCENARIOS: usize = 6;

/// The scenario of a seed.
pub fn scenario(seed: u64) -> Knobs {
    match seed % SCENARIOS as u64 {
        1 => Knobs::default(),
        2 => Knobs {
            slow: true,
            ..Knobs::default()
        },
        3 => Knobs {
            never_ready: true,
            ..Knobs::default()
        },
        4 => Knobs {
            image_pull: true,
            ..Knobs::default()
        },
        5 => Knobs {
            node_lost_at: Some(3 + (seed / SCENARIOS as u64 % 4) as u32),
            ..Knobs::default()
        },
        _ => Knobs {
            job_fails: true,
            ..Knobs::default()
        },
    }
}

/// A small deterministic generator (splitmix64).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// Seeded.
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }

    /// Shuffles in place.
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i + 1);
            v.swap(i, j);
        }
    }
}

/// The start of every world's clock.
pub const EPOCH: &str = "2026-01-01T00:00:00Z";

/// Seconds the clock moves per round.
pub const ROUND_SECS: i64 = 10;

/// A run's progress: the trace so far.
#[derive(Clone, Debug, Default)]
struct Trace {
    steps: Vec<Step>,
}

/// A cluster kept before a reconcile that wrote: the cluster, the round,
/// the controller, the primary, and the index of the step in the trace.
type Saved = (Cluster, usize, usize, ObjKey, usize);

/// The end of a run to a fixpoint.
enum Ended {
    /// Quiet at this round.
    Fixpoint(usize),
    /// A property failed.
    Failed(Property, String),
}

/// Explores one plugin.
#[derive(Debug)]
pub struct Explorer<'a> {
    host: Host<'a>,
    manifest: &'a Manifest,
    opts: &'a Options,
    started: Instant,
    report: Report,
    example: String,
    /// The clock stands still (to tell writes that follow the time from
    /// writes that never end).
    frozen: bool,
}

/// Per-run state of the oscillation check.
#[derive(Default)]
struct Seen {
    digests: BTreeMap<ObjKey, Vec<String>>,
    worlds: BTreeSet<String>,
    /// Objects the plans deleted.
    deleted: BTreeSet<ObjKey>,
}

impl<'a> Explorer<'a> {
    /// An explorer of `host`'s plugin with its effective `manifest`.
    pub fn new(host: Host<'a>, manifest: &'a Manifest, opts: &'a Options) -> Self {
        Explorer {
            host,
            manifest,
            opts,
            started: Instant::now(),
            report: Report::default(),
            example: String::new(),
            frozen: false,
        }
    }

    /// The report so far.
    pub fn finish(self) -> Report {
        self.report
    }

    fn on(&self, p: Property) -> bool {
        self.opts.properties.contains(&p)
    }

    fn out_of_time(&self) -> bool {
        self.started.elapsed() > self.opts.budget
    }

    fn found(
        &mut self,
        property: Property,
        seed: u64,
        knobs: &Knobs,
        message: String,
        steps: Vec<Step>,
    ) {
        let f = Finding {
            property,
            example: self.example.clone(),
            seed,
            scenario: knobs.name(),
            message,
            steps,
        };
        match self
            .report
            .findings
            .iter_mut()
            .find(|x| x.property == property && x.example == f.example)
        {
            Some(old) if old.steps.len() > f.steps.len() => *old = f,
            Some(_) => {}
            None => self.report.findings.push(f),
        }
    }

    /// The primaries to reconcile in a round: one entry per primary of a
    /// per-object controller, one per kind-scoped controller.
    fn work(&self, w: &World) -> Vec<(usize, ObjKey)> {
        let mut out = Vec::new();
        for (i, c) in self.manifest.controllers.iter().enumerate() {
            let keys: Vec<ObjKey> = w
                .objects()
                .filter(|(_, o)| c.primary.matches(object::api_version(o), object::kind(o)))
                .map(|(k, _)| k.clone())
                .collect();
            if c.scope == Scope::Kind {
                if let Some(k) = keys.into_iter().next() {
                    out.push((i, k));
                }
            } else {
                out.extend(keys.into_iter().map(|k| (i, k)));
            }
        }
        out
    }

    fn primary_keys(&self, w: &World) -> Vec<ObjKey> {
        w.objects()
            .filter(|(_, o)| {
                self.manifest
                    .controller_for(object::api_version(o), object::kind(o))
                    .is_some()
            })
            .map(|(k, _)| k.clone())
            .collect()
    }

    fn controller(&self, i: usize) -> &'a Controller {
        &self.manifest.controllers[i]
    }

    /// The cluster of an example under `knobs`.
    pub fn cluster(objects: &[Value], knobs: Knobs) -> Cluster {
        let now: jiff::Timestamp = EPOCH.parse().unwrap_or(jiff::Timestamp::UNIX_EPOCH);
        Cluster {
            world: World::new(objects.iter().cloned(), now),
            sim: Sim::new(knobs),
            observations: BTreeMap::new(),
        }
    }

    #[allow(clippy::too_many_arguments)]
    /// Runs one reconcile with the per-step checks (determinism, honesty,
    /// oscillation). `Err` names a failed property.
    fn step(
        &mut self,
        c: &mut Cluster,
        ctl: usize,
        key: &ObjKey,
        round: usize,
        trace: &mut Trace,
        seen: &mut Seen,
        cut: Option<usize>,
    ) -> Result<Option<Reconciled>, (Property, String)> {
        let twice = self.on(Property::Determinism);
        let controller = self.controller(ctl);
        let Some(r) = self
            .host
            .reconcile(c, controller, key, None, cut, twice, round)
        else {
            return Ok(None);
        };
        self.report.reconciles += 1;
        let mut step = r.step.clone();
        if let Some(n) = cut {
            step.summary
                .push_str(&format!(" — crashed after {n} write(s)"));
        }
        trace.steps.push(step);
        if let Some(d) = &r.nondeterministic {
            return Err((
                Property::Determinism,
                format!("the same snapshot gave two different plans: {d}"),
            ));
        }
        if let Some((reason, message)) = &r.failure
            && matches!(
                reason.as_str(),
                "PluginTrapped" | "PluginTimedOut" | "PluginOutOfMemory" | "PluginOutputMalformed"
            )
        {
            return Err((
                Property::Convergence,
                format!("the plugin failed ({reason}): {message}"),
            ));
        }
        for (k, d) in &r.decisions {
            if !matches!(d, Decision::Planned { .. }) {
                continue;
            }
            if let Decision::Planned { plan, .. } = d {
                for del in &plan.delete {
                    let (group, _) =
                        crate::contract::manifest::split_api_version(&del.target.api_version);
                    seen.deleted.insert((
                        group.to_owned(),
                        del.target.kind.clone(),
                        del.target.namespace.clone(),
                        del.target.name.clone(),
                    ));
                }
            }
            if self.on(Property::ReadyHonesty)
                && let Err(why) = honest(&c.world, k)
            {
                return Err((Property::ReadyHonesty, why));
            }
            if self.on(Property::NoOscillation)
                && let Decision::Planned { plan, .. } = d
            {
                for a in &plan.apply {
                    let ok = key_of(&a.object);
                    let Some(dg) = c.world.get(&ok).and_then(applied_digest) else {
                        continue;
                    };
                    let list = seen.digests.entry(ok.clone()).or_default();
                    if list.last().map(String::as_str) == Some(dg) {
                        continue;
                    }
                    if list.iter().any(|x| x == dg) && c.sim.knobs.node_lost_at.is_none() {
                        return Err((
                            Property::NoOscillation,
                            format!(
                                "{} is written back to a body it had before ({} writes of it so far, no spec change between)",
                                describe_key(&ok),
                                list.len() + 1
                            ),
                        ));
                    }
                    list.push(dg.to_owned());
                }
            }
        }
        Ok(Some(r))
    }

    /// Rounds from `first` until a round changes nothing.
    fn run_to_fixpoint(
        &mut self,
        c: &mut Cluster,
        first: usize,
        rng: &mut Rng,
        trace: &mut Trace,
        seen: &mut Seen,
        mut keep: Option<&mut Vec<Saved>>,
    ) -> Ended {
        for round in first..first + self.opts.rounds {
            let mut work = self.work(&c.world);
            rng.shuffle(&mut work);
            let mut changed = false;
            let mut plugin_changed = false;
            for (ctl, key) in work {
                let before = keep.as_ref().map(|_| c.clone());
                match self.step(c, ctl, &key, round, trace, seen, None) {
                    Err((p, m)) => return Ended::Failed(p, m),
                    Ok(Some(r)) => {
                        changed |= r.changed;
                        plugin_changed |= r.changed;
                        if let (Some(k), Some(b)) = (keep.as_mut(), before)
                            && r.writes > 0
                        {
                            k.push((b, round, ctl, key.clone(), trace.steps.len() - 1));
                        }
                    }
                    Ok(None) => {}
                }
            }
            changed |= c.sim.step(&mut c.world);
            if !self.frozen {
                c.world.now += jiff::SignedDuration::from_secs(ROUND_SECS);
            }
            if !changed {
                return Ended::Fixpoint(round);
            }
            if self.on(Property::NoOscillation) && plugin_changed {
                let pairs: Vec<(ObjKey, Value)> = c.world.cycle_content();
                let text = serde_json::to_string(&pairs).unwrap_or_default();
                let digest = crate::plugin::digest(text.as_bytes());
                if !seen.worlds.insert(digest) {
                    return Ended::Failed(
                        Property::NoOscillation,
                        format!(
                            "round {round}: the world is back in a state it was in before, and the plugin keeps writing"
                        ),
                    );
                }
            }
        }
        // With the clock standing still, is it quiet? Then its writes
        // follow the time: a plan that is not idempotent.
        if !self.frozen {
            let mut frozen = c.clone();
            let mut t = Trace::default();
            let mut s = Seen::default();
            self.frozen = true;
            let rounds = self.opts.rounds;
            let ended = self.run_to_fixpoint(&mut frozen, 0, rng, &mut t, &mut s, None);
            self.frozen = false;
            let _ = rounds;
            if matches!(ended, Ended::Fixpoint(_)) {
                return Ended::Failed(
                    Property::Determinism,
                    format!(
                        "no fixpoint within {} rounds, yet quiet when the clock stands still: the plans write what follows the time on every pass (not idempotent)",
                        self.opts.rounds
                    ),
                );
            }
        }
        Ended::Failed(
            Property::Convergence,
            format!(
                "no fixpoint within {} rounds: the plans keep writing",
                self.opts.rounds
            ),
        )
    }

    /// Property 2 at a fixpoint: an hour later, with nothing changed, no
    /// plan writes.
    fn later_is_quiet(
        &mut self,
        c: &Cluster,
        trace: &Trace,
        round: usize,
    ) -> Result<(), (Vec<Step>, String)> {
        let mut later = c.clone();
        later.world.now += jiff::SignedDuration::from_hours(1);
        let mut t = Trace {
            steps: trace.steps.clone(),
        };
        for (ctl, key) in self.work(&later.world) {
            let Some(r) = self.host.reconcile(
                &mut later,
                self.controller(ctl),
                &key,
                None,
                None,
                false,
                round + 1,
            ) else {
                continue;
            };
            t.steps.push(r.step.clone());
            if r.changed {
                return Err((
                    t.steps,
                    format!(
                        "at the fixpoint, an hour later with nothing changed, the plan of {} writes again (not idempotent)",
                        describe_key(&key)
                    ),
                ));
            }
        }
        Ok(())
    }

    /// At a fixpoint: every done claim honest.
    fn check_fixpoint(&self, c: &Cluster) -> Result<(), String> {
        for k in self.primary_keys(&c.world) {
            honest(&c.world, &k)?;
        }
        Ok(())
    }

    /// Explores one example.
    pub fn explore(&mut self, example: &str, objects: &[Value]) {
        self.example = example.to_owned();
        let mut seed = self.opts.seed;
        let last = self.opts.seed + self.opts.seeds;
        loop {
            if seed >= last && (!self.opts.deep || self.out_of_time()) {
                break;
            }
            if self.out_of_time() {
                self.report
                    .notes
                    .push(format!("{example}: the time budget ran out at seed {seed}"));
                break;
            }
            self.run_seed(objects, seed);
            seed += 1;
        }
    }

    fn run_seed(&mut self, objects: &[Value], seed: u64) {
        let knobs = scenario(seed);
        let mut rng = Rng::new(seed);
        let mut c = Self::cluster(objects, knobs);
        let mut trace = Trace::default();
        let mut seen = Seen::default();
        let exhaustive = knobs == Knobs::default()
            && (self.opts.deep || seed < self.opts.seed + SCENARIOS as u64);
        let mut saved = Vec::new();
        let keep = (exhaustive && (self.on(Property::Crash) || self.on(Property::Stale)))
            .then_some(&mut saved);
        self.report.runs += 1;
        let ended = self.run_to_fixpoint(&mut c, 1, &mut rng, &mut trace, &mut seen, keep);
        let fixround = match ended {
            Ended::Failed(p, m) => {
                self.found(p, seed, &knobs, m, trace.steps.clone());
                None
            }
            Ended::Fixpoint(r) => {
                if self.on(Property::Determinism)
                    && let Err((steps, why)) = self.later_is_quiet(&c, &trace, r)
                {
                    self.found(Property::Determinism, seed, &knobs, why, steps);
                }
                if self.on(Property::Convergence)
                    && let Err(why) = self.check_fixpoint(&c)
                {
                    self.found(
                        Property::Convergence,
                        seed,
                        &knobs,
                        format!("at the fixpoint (round {r}): {why}"),
                        trace.steps.clone(),
                    );
                }
                if knobs == Knobs::default() {
                    for k in self.primary_keys(&c.world) {
                        let p = c.world.get(&k).cloned().unwrap_or_default();
                        if done_claims(&p).is_empty()
                            && p["status"]["conditions"]
                                .as_array()
                                .is_some_and(|l| l.iter().any(|x| x["type"] == "Ready"))
                        {
                            self.note(format!(
                                "{}: {} is not Ready at the fixpoint of a healthy cluster",
                                self.example,
                                describe_key(&k)
                            ));
                        }
                    }
                }
                Some(r)
            }
        };
        if let Some(r) = fixround {
            if self.on(Property::Crash) && exhaustive {
                self.crashes(&c, &saved, &knobs, seed, &trace, &seen.deleted);
            }
            if self.on(Property::Stale) && exhaustive {
                self.stale(&c, &saved, &knobs, seed, &trace);
            }
            if self.on(Property::SpecMutation) && knobs == Knobs::default() {
                self.mutations(&c, r, &knobs, seed, &trace);
            }
        }
        if self.on(Property::Deletion) {
            self.deletion(objects, seed, &knobs);
        }
    }

    fn note(&mut self, text: String) {
        if !self.report.notes.contains(&text) {
            self.report.notes.push(text);
        }
    }

    /// Property 4: a crash after every prefix of every plan's writes.
    fn crashes(
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
    fn stale(
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
    fn one_stale(
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

    /// Property 7: spec mutations from the CRD schema, from the fixpoint.
    fn mutations(&mut self, at: &Cluster, round: usize, knobs: &Knobs, seed: u64, trace: &Trace) {
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
    fn one_mutation(
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
    fn deletion(&mut self, objects: &[Value], seed: u64, knobs: &Knobs) {
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

/// Where two values first differ: `path: before -> after`.
pub fn first_diff(a: &Value, b: &Value, at: &str) -> String {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let (va, vb) = (
                    x.get(k).unwrap_or(&Value::Null),
                    y.get(k).unwrap_or(&Value::Null),
                );
                if va != vb {
                    return first_diff(va, vb, &format!("{at}.{k}"));
                }
            }
            String::new()
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (va, vb)) in x.iter().zip(y).enumerate() {
                if va != vb {
                    return first_diff(va, vb, &format!("{at}[{i}]"));
                }
            }
            String::new()
        }
        _ => {
            let cut = |v: &Value| {
                let t = v.to_string();
                if t.len() > 80 {
                    format!("{}…", &t[..t.floor_char_boundary(80)])
                } else {
                    t
                }
            };
            format!("{}: {} then {}", at.trim_start_matches('.'), cut(a), cut(b))
        }
    }
}
