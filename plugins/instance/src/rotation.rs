//! The signing-key rotation state machine, as a pure function
//! ([`step`]) over the instance's key ring.
//!
//! Keys pass through `ValidationOnly` (fresh: rendered so engines can
//! validate with it, never signed with) → `Active` (the one engines sign
//! with: rendered first) → `ValidationOnly` again once demoted (still
//! validates tokens it signed) → `Removing` (no longer rendered; its
//! Certificate and Secret stay until every engine has dropped it) → gone.
//!
//! [`step`] advances **at most one step per call** (one reconcile):
//!
//! | step | due when | gate |
//! | --- | --- | --- |
//! | bootstrap | the ring is empty | none: nothing renders a key yet |
//! | mint | one key, `rotationInterval` elapsed since it was created, or its algorithm or size is not the spec's any more | none: the new key is validate-only |
//! | promote | a fresh key exists | it is issued and every engine renders it |
//! | stamp `retireEligibleAt` | a demoted key has no anchor yet | every engine renders the promotion |
//! | retire (→ `Removing`) | `retireEligibleAt + retainDuration` elapsed | time only |
//! | delete | a `Removing` key exists | every engine renders the removal |
//!
//! "Every engine renders X" means every engine of the instance reports an
//! `observedAuthHash` equal to the hash of the ring's current render; the
//! caller answers that through the `lagging` function, which [`step`]
//! calls on the ring it was given, so convergence is always measured
//! against the render the gate protects.
//!
//! [`Anchor`] chooses where the retain window starts. The plugin ships
//! [`SHIPPED_ANCHOR`] (confirmed post-promotion convergence); the model
//! check in `rotation_model` shows that [`Anchor::Demotion`] lets an
//! engine sign with a key another engine has already dropped.

use std::fmt;

/// Role of a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KeyPhase {
    /// Engines sign with it (exactly one key is Active).
    Active,
    /// Rendered for validation only: fresh (not yet promoted) or demoted.
    ValidationOnly,
    /// Dropped from the render; waiting for every engine to drop it.
    Removing,
}

impl KeyPhase {
    /// The status spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            KeyPhase::Active => "Active",
            KeyPhase::ValidationOnly => "ValidationOnly",
            KeyPhase::Removing => "Removing",
        }
    }

    /// Parses the status spelling; empty is Active (upstream's rule for
    /// keys written before phases existed).
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "" | "Active" => Some(KeyPhase::Active),
            "ValidationOnly" => Some(KeyPhase::ValidationOnly),
            "Removing" => Some(KeyPhase::Removing),
            _ => None,
        }
    }
}

/// One signing key. Times are Unix seconds.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    /// Key ID (`kid`), `signing-<N>`.
    pub id: String,
    /// Secret (and Certificate) holding the keypair.
    pub secret_name: String,
    /// When the key was minted.
    pub created_at: i64,
    /// Its role.
    pub phase: KeyPhase,
    /// When it was demoted from Active.
    pub demoted_at: Option<i64>,
    /// When the retain window started.
    pub retire_eligible_at: Option<i64>,
    /// Whether its Secret has been seen holding the keypair (never
    /// reverts). Only issued keys are rendered.
    pub issued: bool,
    /// Minted with another key algorithm or size than the spec asks for
    /// now (not recorded: the caller compares). An outdated single key is
    /// replaced by a freshly minted one at once, through the usual gated
    /// steps: under `rotationPolicy: Never` cert-manager would never
    /// re-key it in place.
    pub outdated: bool,
}

impl Key {
    fn fresh(&self) -> bool {
        self.phase == KeyPhase::ValidationOnly && self.demoted_at.is_none()
    }
}

/// The instance's keys and the counter their IDs come from.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ring {
    /// Highest `<N>` ever minted (never decreases).
    pub generation: u64,
    /// The keys, in minting order.
    pub keys: Vec<Key>,
}

impl Ring {
    /// The keys every engine renders, in order: the Active key first (the
    /// one engines sign with), then the validate-only keys in minting
    /// order. Keys not issued yet and Removing keys are left out.
    pub fn rendered(&self) -> Vec<&Key> {
        let mut out: Vec<&Key> = self
            .keys
            .iter()
            .filter(|k| k.issued && k.phase == KeyPhase::Active)
            .collect();
        out.extend(
            self.keys
                .iter()
                .filter(|k| k.issued && k.phase == KeyPhase::ValidationOnly),
        );
        out
    }

    /// The Active key.
    pub fn active(&self) -> Option<&Key> {
        self.keys.iter().find(|k| k.phase == KeyPhase::Active)
    }

    /// Marks the keys `issued` says are issued (it is asked only about
    /// keys not marked yet).
    pub fn observe_issued(&mut self, issued: impl Fn(&Key) -> bool) {
        for k in self.keys.iter_mut().filter(|k| !k.issued) {
            k.issued = issued(k);
        }
    }
}

/// Where the retain window of a demoted key starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Anchor {
    /// When every engine was confirmed to render the promotion (no engine
    /// can still sign with the demoted key). What the plugin ships.
    ConfirmedConvergence,
    /// At demotion. Wrong: engines that have not rolled yet still sign with
    /// the demoted key. Kept so the model check can show why.
    Demotion,
}

/// The anchor the plugin uses.
pub const SHIPPED_ANCHOR: Anchor = Anchor::ConfirmedConvergence;

/// The rotation settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// `rotationInterval` in seconds; `None`: one permanent key.
    pub interval: Option<i64>,
    /// `retainDuration` in seconds.
    pub retain: i64,
    /// Where the retain window starts.
    pub anchor: Anchor,
}

/// A step taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    /// The first key was minted, Active.
    Bootstrap,
    /// A new validate-only key was minted.
    Mint,
    /// The fresh key became Active; the old one was demoted.
    Promote,
    /// A demoted key's retain window started.
    StampRetireEligible,
    /// A demoted key's retain window ended; it is no longer rendered.
    Retire,
    /// A Removing key was dropped (its Certificate goes with it).
    Delete,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            Step::Bootstrap => "minted the first signing key",
            Step::Mint => "minted a validate-only signing key",
            Step::Promote => "promoted the new signing key",
            Step::StampRetireEligible => "started the retain window of the demoted key",
            Step::Retire => "stopped rendering the demoted key",
            Step::Delete => "deleted the removed key",
        };
        f.write_str(text)
    }
}

/// A gated step that is due but waits for engines.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pending {
    /// Promotion waits for every engine to render the fresh key.
    AwaitingPromotion,
    /// The retain anchor waits for every engine to render the promotion.
    AwaitingRetireAnchor,
    /// Deletion waits for every engine to render the removal.
    AwaitingRemoval,
}

impl Pending {
    /// The status spelling (`status.auth.pendingRotationStep`).
    pub fn as_str(self) -> &'static str {
        match self {
            Pending::AwaitingPromotion => "AwaitingPromotion",
            Pending::AwaitingRetireAnchor => "AwaitingRetireAnchor",
            Pending::AwaitingRemoval => "AwaitingRemoval",
        }
    }
}

/// What one call of [`step`] decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Advance {
    /// The ring after the step.
    pub ring: Ring,
    /// The step taken, if any.
    pub step: Option<Step>,
    /// The gated step that is due but waits, with the lagging engines.
    pub pending: Option<(Pending, Vec<String>)>,
    /// Promotion is due but the fresh key is not issued yet.
    pub awaiting_issuer: bool,
}

/// Names of the key minted as number `n`: (`kid`, Secret name).
pub type Namer<'a> = &'a dyn Fn(u64) -> (String, String);

/// Advances `ring` by at most one step at time `now`.
///
/// `lagging(r)` names the engines that do not render `r` yet (empty: the
/// fleet has converged on it). `names(n)` names key number `n`.
pub fn step(
    ring: &Ring,
    policy: &Policy,
    now: i64,
    lagging: &dyn Fn(&Ring) -> Vec<String>,
    names: Namer<'_>,
) -> Advance {
    let mut next = ring.clone();
    let advance = |step: Option<Step>, next: Ring| Advance {
        ring: next,
        step,
        pending: None,
        awaiting_issuer: false,
    };
    let wait = |pending: Pending, lagging: Vec<String>| Advance {
        ring: ring.clone(),
        step: None,
        pending: Some((pending, lagging)),
        awaiting_issuer: false,
    };

    if ring.active().is_none() {
        if ring.keys.is_empty() {
            let key = mint(&mut next, now, KeyPhase::Active, names);
            next.keys.push(key);
            return advance(Some(Step::Bootstrap), next);
        }
        // A ring without an Active key is not one this function produces;
        // recover by promoting the newest key (nothing signs otherwise).
        if let Some(k) = next.keys.last_mut() {
            k.phase = KeyPhase::Active;
            k.demoted_at = None;
            k.retire_eligible_at = None;
        }
        return advance(Some(Step::Promote), next);
    }

    // delete: a Removing key goes once every engine renders its removal.
    if let Some(i) = ring.keys.iter().position(|k| k.phase == KeyPhase::Removing) {
        let behind = lagging(ring);
        if !behind.is_empty() {
            return wait(Pending::AwaitingRemoval, behind);
        }
        next.keys.remove(i);
        return advance(Some(Step::Delete), next);
    }

    // stamp: the retain window of a demoted key starts once every engine
    // renders the promotion (no engine can still sign with it).
    if let Some(i) = ring
        .keys
        .iter()
        .position(|k| k.demoted_at.is_some() && k.retire_eligible_at.is_none())
    {
        let behind = lagging(ring);
        if !behind.is_empty() {
            return wait(Pending::AwaitingRetireAnchor, behind);
        }
        next.keys[i].retire_eligible_at = Some(now);
        return advance(Some(Step::StampRetireEligible), next);
    }

    // retire: time only.
    if let Some(i) = ring.keys.iter().position(|k| {
        k.phase == KeyPhase::ValidationOnly
            && k.retire_eligible_at
                .is_some_and(|at| now >= at.saturating_add(policy.retain))
    }) {
        next.keys[i].phase = KeyPhase::Removing;
        return advance(Some(Step::Retire), next);
    }

    // promote: the fresh key must be issued and rendered by every engine.
    if let Some(i) = ring.keys.iter().position(Key::fresh) {
        if !ring.keys[i].issued {
            return Advance {
                ring: ring.clone(),
                step: None,
                pending: None,
                awaiting_issuer: true,
            };
        }
        let behind = lagging(ring);
        if !behind.is_empty() {
            return wait(Pending::AwaitingPromotion, behind);
        }
        for k in &mut next.keys {
            if k.phase == KeyPhase::Active {
                k.phase = KeyPhase::ValidationOnly;
                k.demoted_at = Some(now);
                if policy.anchor == Anchor::Demotion {
                    k.retire_eligible_at = Some(now);
                }
            }
        }
        next.keys[i].phase = KeyPhase::Active;
        return advance(Some(Step::Promote), next);
    }

    // mint: one key, interval elapsed (or its key parameters outdated).
    if let [only] = ring.keys.as_slice()
        && (only.outdated
            || policy
                .interval
                .is_some_and(|interval| now >= only.created_at.saturating_add(interval)))
    {
        let key = mint(&mut next, now, KeyPhase::ValidationOnly, names);
        next.keys.push(key);
        return advance(Some(Step::Mint), next);
    }

    advance(None, next)
}

/// When the next time-gated step of `ring` becomes due (Unix seconds):
/// minting once the single key is `interval` old, retiring once a retain
/// window ends. `None` when no step waits for time.
pub fn next_due(ring: &Ring, policy: &Policy) -> Option<i64> {
    let retire = ring
        .keys
        .iter()
        .filter(|k| k.phase == KeyPhase::ValidationOnly)
        .filter_map(|k| k.retire_eligible_at)
        .map(|at| at.saturating_add(policy.retain))
        .min();
    let mint = match (policy.interval, ring.keys.as_slice()) {
        (Some(interval), [only]) => Some(only.created_at.saturating_add(interval)),
        _ => None,
    };
    retire.into_iter().chain(mint).min()
}

fn mint(ring: &mut Ring, now: i64, phase: KeyPhase, names: Namer<'_>) -> Key {
    ring.generation += 1;
    let (id, secret_name) = names(ring.generation);
    Key {
        id,
        secret_name,
        created_at: now,
        phase,
        demoted_at: None,
        retire_eligible_at: None,
        issued: false,
        outdated: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: u64) -> (String, String) {
        (format!("signing-{n}"), format!("fb-auth-signing-{n}"))
    }

    const POLICY: Policy = Policy {
        interval: Some(100),
        retain: 50,
        anchor: SHIPPED_ANCHOR,
    };

    fn converged(_: &Ring) -> Vec<String> {
        Vec::new()
    }

    fn run(ring: &Ring, now: i64, lagging: &dyn Fn(&Ring) -> Vec<String>) -> Advance {
        step(ring, &POLICY, now, lagging, &names)
    }

    fn ids(ring: &Ring) -> Vec<(String, KeyPhase)> {
        ring.keys.iter().map(|k| (k.id.clone(), k.phase)).collect()
    }

    #[test]
    fn a_full_rotation_takes_one_step_per_call() {
        let mut ring = run(&Ring::default(), 0, &converged).ring;
        assert_eq!(ids(&ring), [("signing-1".into(), KeyPhase::Active)]);
        assert!(ring.rendered().is_empty(), "not issued yet");
        ring.observe_issued(|_| true);
        assert_eq!(run(&ring, 99, &converged).step, None, "interval not over");

        let mut steps = Vec::new();
        let mut now = 100;
        while !steps.contains(&Step::Delete) {
            assert!(now < 1000, "no full rotation: {steps:?}");
            let a = run(&ring, now, &converged);
            if let Some(s) = a.step {
                steps.push(s);
            }
            ring = a.ring;
            ring.observe_issued(|_| true);
            now += 10;
        }
        assert_eq!(
            steps,
            [
                Step::Mint,
                Step::Promote,
                Step::StampRetireEligible,
                Step::Retire,
                Step::Delete
            ]
        );
        assert_eq!(ids(&ring), [("signing-2".into(), KeyPhase::Active)]);
        assert_eq!(ring.generation, 2);
    }

    #[test]
    fn the_render_signs_with_the_active_key_and_skips_removing_and_unissued_keys() {
        let mut ring = run(&Ring::default(), 0, &converged).ring;
        ring.observe_issued(|_| true);
        ring = run(&ring, 100, &converged).ring; // mint signing-2
        let ids_of = |r: &Ring| {
            r.rendered()
                .iter()
                .map(|k| k.id.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(ids_of(&ring), ["signing-1"], "signing-2 not issued");
        ring.observe_issued(|_| true);
        assert_eq!(ids_of(&ring), ["signing-1", "signing-2"]);
        ring = run(&ring, 101, &converged).ring; // promote
        assert_eq!(ids_of(&ring), ["signing-2", "signing-1"]);
        ring = run(&ring, 102, &converged).ring; // stamp
        ring = run(&ring, 152, &converged).ring; // retire
        assert_eq!(ids_of(&ring), ["signing-2"]);
        assert_eq!(ring.keys.len(), 2, "the Removing key is kept until delete");
    }

    #[test]
    fn every_gate_waits_for_lagging_engines_and_names_them() {
        let lagging = |_: &Ring| vec!["slow".to_owned()];
        let mut ring = run(&Ring::default(), 0, &converged).ring;
        ring.observe_issued(|_| true);
        // Mint has no gate.
        ring = run(&ring, 100, &lagging).ring;
        assert_eq!(ring.keys.len(), 2);
        let a = run(&ring, 101, &lagging);
        assert!(a.awaiting_issuer, "promotion first needs the key issued");
        ring.observe_issued(|_| true);
        let a = run(&ring, 101, &lagging);
        assert_eq!(
            a.pending,
            Some((Pending::AwaitingPromotion, vec!["slow".to_owned()]))
        );
        assert_eq!(a.ring, ring, "a parked step changes nothing");
        ring = run(&ring, 101, &converged).ring;
        let a = run(&ring, 102, &lagging);
        assert_eq!(a.pending.unwrap().0, Pending::AwaitingRetireAnchor);
        ring = run(&ring, 500, &converged).ring; // stamped at 500
        assert_eq!(ring.keys[0].retire_eligible_at, Some(500));
        assert_eq!(ring.keys[0].demoted_at, Some(101));
        // Retire is time-only: lagging engines do not hold it.
        assert_eq!(run(&ring, 549, &lagging).step, None);
        ring = run(&ring, 550, &lagging).ring;
        assert_eq!(ring.keys[0].phase, KeyPhase::Removing);
        let a = run(&ring, 551, &lagging);
        assert_eq!(a.pending.unwrap().0, Pending::AwaitingRemoval);
        assert_eq!(run(&ring, 551, &converged).step, Some(Step::Delete));
    }

    #[test]
    fn the_next_time_gated_step_is_known() {
        let mut ring = run(&Ring::default(), 10, &converged).ring;
        assert_eq!(next_due(&ring, &POLICY), Some(110), "mint");
        ring.observe_issued(|_| true);
        ring = run(&ring, 110, &converged).ring;
        assert_eq!(
            next_due(&ring, &POLICY),
            None,
            "promotion waits for engines, not time"
        );
        ring.observe_issued(|_| true);
        ring = run(&ring, 111, &converged).ring;
        ring = run(&ring, 112, &converged).ring;
        assert_eq!(next_due(&ring, &POLICY), Some(162), "retire");
    }

    #[test]
    fn without_an_interval_the_first_key_is_permanent() {
        let policy = Policy {
            interval: None,
            ..POLICY
        };
        let mut ring = step(&Ring::default(), &policy, 0, &converged, &names).ring;
        ring.observe_issued(|_| true);
        let a = step(&ring, &policy, 1_000_000, &converged, &names);
        assert_eq!((a.step, a.ring), (None, ring));
    }

    #[test]
    fn the_demotion_anchor_starts_the_window_at_promotion() {
        let policy = Policy {
            anchor: Anchor::Demotion,
            ..POLICY
        };
        let mut ring = step(&Ring::default(), &policy, 0, &converged, &names).ring;
        ring.observe_issued(|_| true);
        ring = step(&ring, &policy, 100, &converged, &names).ring;
        ring.observe_issued(|_| true);
        ring = step(&ring, &policy, 110, &converged, &names).ring;
        assert_eq!(ring.keys[0].retire_eligible_at, Some(110));
        assert_eq!(
            step(&ring, &policy, 160, &|_: &Ring| vec!["x".into()], &names).step,
            Some(Step::Retire)
        );
    }

    #[test]
    fn an_outdated_key_is_replaced_without_an_interval() {
        let policy = Policy {
            interval: None,
            ..POLICY
        };
        let mut ring = step(&Ring::default(), &policy, 0, &converged, &names).ring;
        ring.observe_issued(|_| true);
        ring.keys[0].outdated = true;
        let a = step(&ring, &policy, 5, &converged, &names);
        assert_eq!(a.step, Some(Step::Mint));
        assert_eq!(a.ring.keys[1].id, "signing-2");
        assert!(!a.ring.keys[1].outdated);
        // The replacement goes through the gated steps like any rotation.
        let mut ring = a.ring;
        ring.observe_issued(|_| true);
        let lagging = |_: &Ring| vec!["e".to_owned()];
        let parked = step(&ring, &policy, 6, &lagging, &names);
        assert_eq!(parked.pending.unwrap().0, Pending::AwaitingPromotion);
        assert_eq!(
            step(&ring, &policy, 6, &converged, &names).step,
            Some(Step::Promote)
        );
    }

    #[test]
    fn key_phases_round_trip_and_empty_means_active() {
        for p in [
            KeyPhase::Active,
            KeyPhase::ValidationOnly,
            KeyPhase::Removing,
        ] {
            assert_eq!(KeyPhase::parse(p.as_str()), Some(p));
        }
        assert_eq!(KeyPhase::parse(""), Some(KeyPhase::Active));
        assert_eq!(KeyPhase::parse("Retired"), None);
    }
}
