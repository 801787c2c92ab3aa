//! The one decision function: snapshot + plugin → [`Decision`]. The live
//! worker and `wasmop plan` (with every golden test) both go through
//! [`decide`], so a golden test tests the live path by construction.
//!
//! # Guarantees
//!
//! - A primary that is being deleted and does not hold this controller's
//!   finalizer is [`Decision::Skipped`] without calling the plugin: garbage
//!   collection removes what it owns, and a plan could only race it.
//! - "Now" is formatted in one place ([`format_now`]): RFC 3339 in UTC,
//!   rounded to whole seconds, so two replicas (or a replica and a golden
//!   test) within the same second hand the plugin the same snapshot.
//! - A plan is [`Decision::Planned`] only when its counts are within the
//!   plugin's [`crate::judge::validate::PlanLimits`] ([`check_counts`])
//!   and [`crate::judge::validate::validate`] accepted all of it; otherwise it is
//!   [`Decision::Rejected`] with the count violations, or every violation.
//!   Nothing here writes.

use std::sync::Arc;

use serde_json::Value;

use crate::contract::manifest::Controller;
use crate::judge::snapshot::{ObjectSource, Observation, Snapshot, build_snapshot};
use crate::judge::validate::{
    ExistingLookup, Judgement, Plan, Violation, check_counts, check_gauges, validate_with_owned,
};
use crate::object;
use crate::plugin::OutputProblem;
use crate::plugin::{CallError, LoadedPlugin};

/// Why a reconcile was skipped without calling the plugin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SkipReason {
    /// The primary is being deleted and carries no finalizer of this
    /// controller: garbage collection removes what it owns.
    DeletingWithoutFinalizer,
    /// The controller is kind-scoped: the primary is decided by the one
    /// call over its whole kind (see [`crate::reconcile::kind`]), not alone.
    KindScoped,
}

impl SkipReason {
    /// A CamelCase name, for logs and golden files.
    pub fn as_str(self) -> &'static str {
        match self {
            SkipReason::DeletingWithoutFinalizer => "DeletingWithoutFinalizer",
            SkipReason::KindScoped => "KindScoped",
        }
    }
}

/// How one reconcile of one primary was decided.
#[derive(Debug)]
pub enum Decision {
    /// Nothing to do; the plugin was not called.
    Skipped(SkipReason),
    /// The plugin call failed (trap, timeout, out of memory, malformed
    /// output, or the plugin's own error).
    Failed(CallError),
    /// The plugin's plan broke rules; none of it may be written.
    Rejected {
        /// The plan as the plugin returned it.
        plan: Plan,
        /// Every rule broken.
        violations: Vec<Violation>,
    },
    /// A plan that passed validation, with the facts its writes are fenced
    /// with.
    Planned {
        /// The plan.
        plan: Plan,
        /// What validation judged about its objects.
        judgement: Judgement,
    },
}

impl Decision {
    /// The plan, when the plugin returned one.
    pub fn plan(&self) -> Option<&Plan> {
        match self {
            Decision::Planned { plan, .. } | Decision::Rejected { plan, .. } => Some(plan),
            Decision::Skipped(_) | Decision::Failed(_) => None,
        }
    }
}

/// A decision with what it was made from.
#[derive(Debug)]
pub struct Decided {
    /// The snapshot handed to the plugin; `None` when skipped.
    pub snapshot: Option<Snapshot>,
    /// The decision.
    pub decision: Decision,
}

/// `now` as the plugin sees it: RFC 3339 in UTC, whole seconds.
pub fn format_now(now: jiff::Timestamp) -> String {
    now.round(jiff::Unit::Second).unwrap_or(now).to_string()
}

/// What [`decide`] works on.
#[derive(Clone, Copy)]
pub struct DecideInput<'a> {
    /// The plugin to call.
    pub plugin: &'a LoadedPlugin,
    /// The controller (of the plugin's effective manifest) the primary
    /// belongs to.
    pub controller: &'a Controller,
    /// Where the snapshot's owned and related objects come from.
    pub source: &'a dyn ObjectSource,
    /// Who answers "does it exist, and who controls it" for validation.
    pub existing: &'a dyn ExistingLookup,
    /// The time of the reconcile.
    pub now: jiff::Timestamp,
}

impl std::fmt::Debug for DecideInput<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecideInput")
            .field("controller", &self.controller.name)
            .field("now", &self.now)
            .finish()
    }
}

/// Decides one reconcile of `primary`: skip, or build its snapshot, call
/// the plugin and validate the plan.
pub fn decide(
    input: DecideInput<'_>,
    primary: Arc<Value>,
    observations: Vec<Observation>,
) -> Decided {
    let controller = input.controller;
    let holds_finalizer = controller
        .finalizer
        .as_deref()
        .is_some_and(|f| object::finalizers(&primary).iter().any(|x| x == f));
    if object::is_deleting(&primary) && !holds_finalizer {
        return Decided {
            snapshot: None,
            decision: Decision::Skipped(SkipReason::DeletingWithoutFinalizer),
        };
    }
    let snapshot = build_snapshot(
        controller,
        Arc::clone(&primary),
        input.source,
        &format_now(input.now),
        input.plugin.settings(),
        observations,
    );
    let decision = match input.plugin.reconcile(&snapshot) {
        Err(e) => Decision::Failed(e),
        Ok(plan) if !plan.objects.is_empty() => {
            Decision::Failed(CallError::MalformedOutput(OutputProblem::WrongScope(
                "a per-object plan holds no `objects` (those answer a kind-scoped controller)"
                    .into(),
            )))
        }
        Ok(plan) => {
            // Counts first: a plan with a million Events is rejected on its
            // lengths, without judging each entry.
            let mut too_many = check_counts(&plan, &input.plugin.limits().plan);
            too_many.extend(check_gauges(&plan));
            if !too_many.is_empty() {
                Decision::Rejected {
                    plan,
                    violations: too_many,
                }
            } else {
                match validate_with_owned(
                    &plan,
                    controller,
                    &primary,
                    input.existing,
                    &snapshot.owned,
                ) {
                    Ok(judgement) => Decision::Planned { plan, judgement },
                    Err(violations) => Decision::Rejected { plan, violations },
                }
            }
        }
    };
    Decided {
        snapshot: Some(snapshot),
        decision,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn now_is_rounded_to_whole_seconds_in_utc() {
        let ts: jiff::Timestamp = "2025-01-01T00:00:00.400Z".parse().unwrap();
        assert_eq!(format_now(ts), "2025-01-01T00:00:00Z");
        let ts: jiff::Timestamp = "2025-01-01T00:00:00.600+02:00".parse().unwrap();
        assert_eq!(format_now(ts), "2024-12-31T22:00:01Z");
    }
}
