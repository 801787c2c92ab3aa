//! Model check of the signing-key rotation: an exhaustive breadth-first
//! exploration of every interleaving of the operator (calling the real
//! [`rotation::step`]), cert-manager issuing keys, the clock, and a fleet
//! of engines that roll independently, blue-green.
//!
//! Each engine runs one or two live configurations (two while a new
//! generation runs next to the old one); a configuration is a render of
//! the ring (key IDs, the first one signs). An engine reports the render
//! it serves (`observedAuthHash`) only once a single generation is left,
//! as the engine plugin does in its stable phase. Engines roll onto the
//! render the operator currently publishes, may abandon a generation for a
//! newer render, and may lag arbitrarily long.
//!
//! The property checked in every reachable state: no engine signs with a
//! key that another live configuration cannot validate.
//!
//! The tests assert it holds under [`rotation::SHIPPED_ANCHOR`] (and that
//! the exploration completed whole rotations), and that
//! [`Anchor::Demotion`] has a counterexample — so weakening the anchor or
//! a convergence gate fails the build.

use std::collections::{HashMap, VecDeque};

use crate::rotation::{self, Anchor, Policy, Ring};

/// A render: key IDs, the signing key first.
type Render = Vec<String>;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Engine {
    /// Live configurations, oldest first (one or two).
    live: Vec<Render>,
    /// The render reported through `observedAuthHash`.
    reported: Render,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    ring: Ring,
    now: i64,
    /// Key IDs cert-manager has issued.
    issued: Vec<String>,
    engines: Vec<Engine>,
}

/// Bounds of one exploration.
#[derive(Clone, Copy, Debug)]
struct Bounds {
    engines: usize,
    max_time: i64,
    policy: Policy,
    /// Tell the step function every engine has converged, whatever they
    /// report (the convergence gates removed).
    blind: bool,
}

fn names(n: u64) -> (String, String) {
    (format!("signing-{n}"), format!("fb-auth-signing-{n}"))
}

fn render(ring: &Ring) -> Render {
    ring.rendered().iter().map(|k| k.id.clone()).collect()
}

fn initial(b: &Bounds) -> State {
    let lagging = |_: &Ring| Vec::new();
    let mut ring = rotation::step(&Ring::default(), &b.policy, 0, &lagging, &names).ring;
    ring.observe_issued(|_| true);
    let r = render(&ring);
    let issued = ring.keys.iter().map(|k| k.id.clone()).collect();
    State {
        ring,
        now: 0,
        issued,
        engines: vec![
            Engine {
                live: vec![r.clone()],
                reported: r,
            };
            b.engines
        ],
    }
}

/// Every state one action away.
fn successors(s: &State, b: &Bounds) -> Vec<(String, State)> {
    let mut out = Vec::new();
    // The operator reconciles: observe issuance, then one step.
    {
        let mut ring = s.ring.clone();
        ring.observe_issued(|k| s.issued.contains(&k.id));
        let engines = &s.engines;
        let lagging = |r: &Ring| {
            if b.blind {
                return Vec::new();
            }
            let want = render(r);
            engines
                .iter()
                .enumerate()
                .filter(|(_, e)| e.reported != want)
                .map(|(i, _)| format!("engine-{i}"))
                .collect()
        };
        let a = rotation::step(&ring, &b.policy, s.now, &lagging, &names);
        let label = match a.step {
            Some(step) => format!("operator: {step}"),
            None => "operator: observes".to_owned(),
        };
        out.push((
            label,
            State {
                ring: a.ring,
                ..s.clone()
            },
        ));
    }
    // cert-manager issues a minted key.
    for k in &s.ring.keys {
        if !s.issued.contains(&k.id) {
            let mut n = s.clone();
            n.issued.push(k.id.clone());
            n.issued.sort();
            out.push((format!("cert-manager issues {}", k.id), n));
        }
    }
    // Time passes.
    if s.now < b.max_time {
        let mut n = s.clone();
        n.now += 1;
        out.push(("clock ticks".to_owned(), n));
    }
    // Engines roll.
    let published = render(&s.ring);
    for (i, e) in s.engines.iter().enumerate() {
        let mut act = |label: &str, f: &dyn Fn(&mut Engine)| {
            let mut n = s.clone();
            f(&mut n.engines[i]);
            out.push((format!("engine-{i} {label}"), n));
        };
        match e.live.as_slice() {
            [only] => {
                if *only != published {
                    act(&format!("starts a generation with {published:?}"), &|e| {
                        e.live.push(published.clone());
                    });
                }
                if e.reported != *only {
                    act(&format!("reports {only:?}"), &|e| {
                        e.reported = e.live[0].clone();
                    });
                }
            }
            [_, newer] => {
                act("finishes its roll (old generation deleted)", &|e| {
                    e.live.remove(0);
                });
                if *newer != published {
                    act(
                        &format!("abandons its new generation for {published:?}"),
                        &|e| {
                            e.live[1] = published.clone();
                        },
                    );
                }
            }
            _ => {}
        }
    }
    out
}

/// The violation in `s`, if any: an engine signing with a key some live
/// configuration cannot validate.
fn violation(s: &State) -> Option<String> {
    let live: Vec<(usize, &Render)> = s
        .engines
        .iter()
        .enumerate()
        .flat_map(|(i, e)| e.live.iter().map(move |r| (i, r)))
        .collect();
    for (i, signer) in &live {
        let Some(key) = signer.first() else { continue };
        for (j, other) in &live {
            if !other.contains(key) {
                return Some(format!(
                    "engine-{i} signs with {key} ({signer:?}) but engine-{j} validates only {other:?}"
                ));
            }
        }
    }
    None
}

/// What an exploration found.
#[derive(Debug)]
struct Report {
    states: usize,
    /// A trace to the first violation found (breadth-first: a shortest one).
    counterexample: Option<Vec<String>>,
    /// Whether some reachable state completed a rotation (the first key
    /// deleted, a later one Active alone).
    rotated: bool,
}

fn explore(b: &Bounds) -> Report {
    let start = initial(b);
    let mut parent: HashMap<State, Option<(State, String)>> = HashMap::new();
    parent.insert(start.clone(), None);
    let mut queue = VecDeque::from([start]);
    let mut rotated = false;
    while let Some(s) = queue.pop_front() {
        if let Some(why) = violation(&s) {
            let mut trace = vec![format!("VIOLATION: {why}")];
            let mut at = s.clone();
            while let Some(Some((prev, label))) = parent.get(&at) {
                trace.push(label.clone());
                at = prev.clone();
            }
            trace.reverse();
            return Report {
                states: parent.len(),
                counterexample: Some(trace),
                rotated,
            };
        }
        rotated |= s.ring.keys.len() == 1 && s.ring.generation >= 2;
        for (label, n) in successors(&s, b) {
            if !parent.contains_key(&n) {
                parent.insert(n.clone(), Some((s.clone(), label)));
                queue.push_back(n);
            }
        }
    }
    Report {
        states: parent.len(),
        counterexample: None,
        rotated,
    }
}

fn bounds(engines: usize, anchor: Anchor) -> Bounds {
    Bounds {
        engines,
        // Long enough for three rotations (interval and retain are one tick).
        max_time: 6,
        policy: Policy {
            interval: Some(1),
            retain: 1,
            anchor,
        },
        blind: false,
    }
}

#[test]
fn the_shipped_anchor_never_lets_an_engine_sign_with_a_key_another_cannot_validate() {
    for engines in [1, 2, 3] {
        let r = explore(&bounds(engines, rotation::SHIPPED_ANCHOR));
        assert!(
            r.counterexample.is_none(),
            "{engines} engine(s): {:#?}",
            r.counterexample
        );
        assert!(r.rotated, "{engines} engine(s): no rotation completed");
        assert!(
            r.states > 100,
            "{engines} engine(s): only {} states",
            r.states
        );
        println!("{engines} engine(s): {} states, no violation", r.states);
    }
}

#[test]
fn anchoring_the_retain_window_at_demotion_has_a_counterexample() {
    let r = explore(&bounds(2, Anchor::Demotion));
    let trace = r
        .counterexample
        .expect("the demotion anchor must let an engine sign with a dropped key");
    println!(
        "counterexample ({} states explored):\n  {}",
        r.states,
        trace.join("\n  ")
    );
    let last = trace.last().unwrap();
    assert!(last.starts_with("VIOLATION"), "{trace:#?}");
    // The trace demotes before every engine rolled onto the promotion.
    assert!(trace.iter().any(|t| t.contains("promoted")), "{trace:#?}");
    assert!(
        trace.iter().any(|t| t.contains("stopped rendering")),
        "{trace:#?}"
    );
}

#[test]
fn without_the_convergence_gates_the_shipped_anchor_fails_too() {
    let r = explore(&Bounds {
        blind: true,
        ..bounds(2, rotation::SHIPPED_ANCHOR)
    });
    assert!(
        r.counterexample.is_some(),
        "the gates are what makes the rotation safe"
    );
}

#[test]
fn one_engine_cannot_disagree_with_itself_except_mid_roll() {
    // With a single engine the only overlap is its two generations; the
    // demotion anchor is still unsafe there (old pods sign with the key the
    // new generation dropped), which the explorer must find too.
    let r = explore(&bounds(1, Anchor::Demotion));
    assert!(r.counterexample.is_some());
}
