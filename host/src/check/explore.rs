//! Exploring a plugin from each example: seeded runs through the modelled
//! cluster, each under one scenario of the controllers' knobs and one
//! order of reconciles, with every property checked on the way; the
//! shortest failing trace of each property is kept.
//!
//! Its cuts: the scenarios and the seeded order (`scenario`), crashes and
//! stale snapshots (`faults`), spec mutations and deletion (`mutations`).
//!
//! # Guarantees
//! - A run is a function of its seed: a finding is reproduced from the
//!   seed it names.
//! - Exploration stops at its time budget, and says so in the report
//!   rather than passing silently.

mod faults;
mod mutations;
mod scenario;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::check::cluster::{Cluster, Host, Reconciled, Step};
use crate::check::controllers::{Knobs, Sim};
use crate::check::properties::{Property, applied_digest, done_claims, honest};
use crate::check::world::{ObjKey, World, describe_key, key_of};
use crate::contract::manifest::{Controller, Manifest};
use crate::object;
use crate::reconcile::decide::Decision;
use wasmop_contract::Scope;

pub use self::scenario::{EPOCH, Rng, SCENARIOS, scenario};

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
