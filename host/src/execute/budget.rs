//! The per-minute deletion budget of each plugin: how many deletes its
//! plans executed in the last minute, across all its primaries.
//!
//! The per-reconcile budget (`maxDeletes`) is a count of one plan and is
//! checked with the plan's other counts
//! ([`crate::judge::validate::check_counts`]); this one needs the
//! history of the plugin and is checked by the executor, before the first
//! write of a plan.
//!
//! # Guarantees
//! - A plan whose deletes would take the plugin's deletes of the last 60
//!   seconds (rolling) over `maxDeletesPerMinute` is rejected whole: not one
//!   of its writes is made ([`Rule::DeletionBudgetExceeded`]).
//! - Once that happened the plugin's budget is *exceeded*: every later plan
//!   of the plugin that deletes anything is rejected too, however quiet the
//!   last minute was, until a person raises `maxDeletesPerMinute` above the
//!   value that was exceeded (the operator configuration is re-read when it
//!   changes, and the plugin reloaded with the new value). A runaway plugin
//!   therefore stops deleting instead of deleting at the budget's pace.
//!   Plans without deletes are not held.
//! - The deletes of a plan are reserved before it runs, so plans of the
//!   same plugin running at once cannot together go over the budget; the
//!   deletes that were not made (a failed or skipped write) are given back
//!   when the plan ends. What counts is deletes actually executed.
//! - The host's own collection of objects whose owner is gone
//!   (`controller/orphans.rs`) counts against the same budget, one delete
//!   at a time ([`DeletionBudgets::reserve_collection`]): a collection that
//!   would go over it is deferred to a later sweep or refusal, and never
//!   marks the plugin's budget exceeded (no plan of the plugin asked for
//!   it). While the budget is exceeded, nothing is collected either.
//! - The history lives in the operator process: a restart starts with an
//!   empty minute and no exceeded budget.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::judge::validate::{Rule, Violation};

/// The window of the per-minute budget.
pub const WINDOW: Duration = Duration::from_secs(60);

/// Deletes of one plugin in the last [`WINDOW`], and whether its budget was
/// exceeded.
#[derive(Debug, Default)]
pub struct Window {
    /// `(reservation id, when, how many)`, oldest first.
    deletes: VecDeque<(u64, Instant, usize)>,
    /// The per-minute budget that was exceeded, while it holds.
    exceeded: Option<Exceeded>,
    next_id: u64,
}

/// A budget that was exceeded, and by how much.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Exceeded {
    budget: usize,
    asked: usize,
}

impl Window {
    /// Deletes counted in the window ending at `now`.
    pub fn recent(&mut self, now: Instant) -> usize {
        while let Some((_, at, _)) = self.deletes.front() {
            if now.saturating_duration_since(*at) >= WINDOW {
                self.deletes.pop_front();
            } else {
                break;
            }
        }
        self.deletes.iter().map(|(_, _, n)| n).sum()
    }

    /// Reserves `wanted` deletes at `now` against `budget`; returns the
    /// reservation's id, or why the plan must be rejected (a sentence).
    pub fn reserve(
        &mut self,
        plugin: &str,
        wanted: usize,
        budget: usize,
        now: Instant,
    ) -> Result<u64, String> {
        if wanted == 0 {
            return Ok(0);
        }
        let raise = format!(
            "nothing is written until a person raises maxDeletesPerMinute of plugin {plugin} \
             in the operator configuration"
        );
        match self.exceeded {
            Some(e) if budget <= e.budget => {
                return Err(format!(
                    "the plan deletes {wanted} objects, but plugin {plugin} exceeded its \
                     per-minute deletion budget of {} (a plan asked for {} deletes in one minute); \
                     {raise}",
                    e.budget, e.asked
                ));
            }
            // Raised since: the plugin may delete again.
            Some(_) => self.exceeded = None,
            None => {}
        }
        let recent = self.recent(now);
        let asked = recent.saturating_add(wanted);
        if asked > budget {
            self.exceeded = Some(Exceeded { budget, asked });
            return Err(format!(
                "the plan deletes {wanted} objects and plugin {plugin} deleted {recent} in the \
                 last minute: {asked}, more than its per-minute deletion budget of {budget}; \
                 {raise}"
            ));
        }
        self.next_id += 1;
        self.deletes.push_back((self.next_id, now, wanted));
        Ok(self.next_id)
    }

    /// Reserves one delete at `now` for the host's collection of an
    /// object whose owner is gone, when it fits in `budget` and the budget
    /// is not exceeded; never marks it exceeded.
    pub fn reserve_one_quietly(&mut self, budget: usize, now: Instant) -> Option<u64> {
        if self.exceeded.is_some_and(|e| budget <= e.budget) {
            return None;
        }
        if self.recent(now).saturating_add(1) > budget {
            return None;
        }
        self.next_id += 1;
        self.deletes.push_back((self.next_id, now, 1));
        Some(self.next_id)
    }

    /// Gives back `unused` deletes of reservation `id`.
    pub fn release(&mut self, id: u64, unused: usize) {
        if let Some(i) = self.deletes.iter().position(|(x, _, _)| *x == id) {
            let n = &mut self.deletes[i].2;
            *n = n.saturating_sub(unused);
            if *n == 0 {
                self.deletes.remove(i);
            }
        }
    }
}

/// The per-minute deletion budgets of an operator's plugins, by plugin name
/// (so the history outlives a hot swap or reload of the plugin).
#[derive(Debug, Default)]
pub struct DeletionBudgets {
    windows: Mutex<BTreeMap<String, Window>>,
}

impl DeletionBudgets {
    /// Reserves `wanted` deletes of `plugin` against its per-minute
    /// `budget`.
    ///
    /// # Errors
    /// A [`Rule::DeletionBudgetExceeded`] violation when the plan must be
    /// rejected.
    pub fn reserve(
        &self,
        plugin: &str,
        wanted: usize,
        budget: usize,
    ) -> Result<Reservation<'_>, Violation> {
        let mut windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        let id = windows
            .entry(plugin.to_owned())
            .or_default()
            .reserve(plugin, wanted, budget, Instant::now())
            .map_err(|message| Violation {
                rule: Rule::DeletionBudgetExceeded,
                object: "delete".to_owned(),
                message,
            })?;
        Ok(Reservation {
            budgets: self,
            plugin: plugin.to_owned(),
            id,
            reserved: wanted,
            used: 0,
        })
    }

    /// Reserves one delete of `plugin` for the host's collection of an
    /// object whose owner is gone; None when it would take the plugin over
    /// its per-minute `budget` or the budget is exceeded (the collection
    /// waits; the budget is not marked exceeded).
    pub fn reserve_collection(&self, plugin: &str, budget: usize) -> Option<Reservation<'_>> {
        let mut windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        let id = windows
            .entry(plugin.to_owned())
            .or_default()
            .reserve_one_quietly(budget, Instant::now())?;
        Some(Reservation {
            budgets: self,
            plugin: plugin.to_owned(),
            id,
            reserved: 1,
            used: 0,
        })
    }

    /// Deletes `plugin` executed in the last minute.
    pub fn recent(&self, plugin: &str) -> usize {
        let mut windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        windows
            .get_mut(plugin)
            .map_or(0, |w| w.recent(Instant::now()))
    }
}

/// Deletes reserved for one plan; those not [`Reservation::used`] are
/// given back when it is dropped.
#[derive(Debug)]
pub struct Reservation<'a> {
    budgets: &'a DeletionBudgets,
    plugin: String,
    id: u64,
    reserved: usize,
    used: usize,
}

impl Reservation<'_> {
    /// One reserved delete was executed (counted in
    /// `wasmop_deletes_total{plugin}` too, to size the budget by).
    pub fn used(&mut self) {
        self.used = (self.used + 1).min(self.reserved);
        crate::metrics::global().inc("wasmop_deletes_total", &[("plugin", &self.plugin)]);
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        let unused = self.reserved - self.used;
        if unused == 0 || self.id == 0 {
            return;
        }
        let mut windows = self
            .budgets
            .windows
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(w) = windows.get_mut(&self.plugin) {
            w.release(self.id, unused);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deletes_within_the_budget_pass_and_the_window_rolls() {
        let t0 = Instant::now();
        let mut w = Window::default();
        w.reserve("p", 6, 10, t0).expect("6 of 10");
        w.reserve("p", 4, 10, t0 + Duration::from_secs(10))
            .expect("10 of 10: inclusive");
        assert_eq!(w.recent(t0 + Duration::from_secs(59)), 10);
        // The first six leave the window a minute after they were made.
        assert_eq!(w.recent(t0 + WINDOW), 4);
        w.reserve("p", 6, 10, t0 + WINDOW).expect("4 + 6 of 10");
        // A plan without deletes is never counted nor held.
        assert_eq!(w.reserve("p", 0, 0, t0 + WINDOW), Ok(0));
    }

    #[test]
    fn two_plans_over_the_budget_reject_the_second_and_hold_until_it_is_raised() {
        let t0 = Instant::now();
        let mut w = Window::default();
        w.reserve("fanout", 6, 10, t0).expect("first plan");
        let err = w.reserve("fanout", 6, 10, t0).expect_err("12 > 10");
        for part in [
            "deletes 6 objects",
            "deleted 6 in the last minute",
            "12",
            "per-minute deletion budget of 10",
            "maxDeletesPerMinute of plugin fanout",
        ] {
            assert!(err.contains(part), "{part}: {err}");
        }
        // The rejected plan reserved nothing.
        assert_eq!(w.recent(t0), 6);
        // Long after, a small plan is still held: a person must act.
        let later = t0 + 10 * WINDOW;
        assert_eq!(w.recent(later), 0);
        let held = w.reserve("fanout", 1, 10, later).expect_err("held");
        assert!(held.contains("exceeded its per-minute deletion budget of 10"));
        // Lowering or keeping the budget does not release it either.
        assert!(w.reserve("fanout", 1, 5, later).is_err());
        // Plans that delete nothing still run.
        assert!(w.reserve("fanout", 0, 10, later).is_ok());
        // Raising it does.
        w.reserve("fanout", 6, 20, later).expect("raised to 20");
        w.reserve("fanout", 6, 20, later).expect("12 of 20");
    }

    #[test]
    fn one_plan_over_the_per_minute_budget_is_rejected() {
        let mut w = Window::default();
        let err = w.reserve("p", 50, 10, Instant::now()).expect_err("50 > 10");
        assert!(err.contains("deletes 50 objects"), "{err}");
    }

    #[test]
    fn collections_count_against_the_budget_and_never_mark_it_exceeded() {
        let budgets = DeletionBudgets::default();
        let mut one = budgets.reserve_collection("p", 2).expect("room for one");
        one.used();
        let mut two = budgets.reserve_collection("p", 2).expect("room for two");
        two.used();
        assert!(
            budgets.reserve_collection("p", 2).is_none(),
            "a third in the minute waits"
        );
        assert_eq!(budgets.recent("p"), 2);
        // Not exceeded: a plan without deletes, or once the minute passed,
        // is not held; a plan's delete now is over the budget as counted.
        assert!(budgets.reserve("p", 0, 2).is_ok());
        let refused = budgets.reserve("p", 1, 2).expect_err("over the budget");
        assert_eq!(refused.rule, Rule::DeletionBudgetExceeded);
        // A plan that tripped the budget: no collection while it stays
        // exceeded, also after the minute; raised, collections go on.
        let mut w = Window::default();
        let t0 = Instant::now();
        assert!(w.reserve("p", 3, 2, t0).is_err());
        assert!(w.reserve_one_quietly(2, t0).is_none());
        assert!(
            w.reserve_one_quietly(2, t0 + WINDOW).is_none(),
            "exceeded holds after the minute too"
        );
        assert!(w.reserve_one_quietly(3, t0 + WINDOW).is_some(), "raised");
        // A reservation not used is given back.
        drop(budgets.reserve_collection("q", 1).expect("room"));
        assert_eq!(budgets.recent("q"), 0);
    }

    #[test]
    fn unused_reservations_are_given_back() {
        let budgets = DeletionBudgets::default();
        {
            let mut r = budgets.reserve("p", 5, 10).expect("5 of 10");
            r.used();
            r.used();
            // Two deletes made, three failed or were skipped.
        }
        assert_eq!(budgets.recent("p"), 2);
        {
            let _held = budgets.reserve("p", 8, 10).expect("2 + 8 of 10");
            let v = budgets.reserve("p", 1, 10).expect_err("reserved: 11 > 10");
            assert_eq!(v.rule, Rule::DeletionBudgetExceeded);
            assert_eq!(v.object, "delete");
        }
        // Plugins have separate budgets.
        budgets.reserve("q", 10, 10).expect("q's own budget");
    }
}
