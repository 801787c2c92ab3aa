//! Shadow calls of the worker: after the active plugin decided, its shadow
//! candidate is called on the same snapshot and the two plans compared
//! (see [`crate::report::shadow`]).
//!
//! # Guarantees
//! - A shadow call never writes and never delays the reconcile: it runs
//!   after the decision, in the background, and is skipped when as many
//!   shadow calls as workers are in flight ([`ShadowSlot`]).

use std::sync::Arc;

use serde_json::Value;

use crate::controller::{Active, Operator, PrimaryKey};
use crate::reconcile::decide::Decision;

/// One shadow call in flight (see `Operator::shadow_slot`).
pub(super) struct ShadowSlot(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for ShadowSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Operator {
    /// A place for one more shadow call in flight (at most as many as
    /// workers), given back when dropped; `None` when there is none,
    /// counted as skipped once for each of the call's `primaries`.
    pub(super) fn shadow_slot(&self, a: &Active, primaries: usize) -> Option<ShadowSlot> {
        use std::sync::atomic::Ordering;
        let inflight = Arc::clone(&self.shadow_inflight);
        if inflight.fetch_add(1, Ordering::SeqCst) >= self.config.workers.max(1) {
            inflight.fetch_sub(1, Ordering::SeqCst);
            crate::report::shadow::skipped(&a.id, primaries);
            return None;
        }
        Some(ShadowSlot(inflight))
    }

    /// Calls the shadow candidate on the snapshot the active plugin just
    /// decided, in the background (bounded by the worker count), and
    /// compares the plans. Nothing of the shadow's plan is written.
    pub(super) fn run_shadow(
        &self,
        a: &Active,
        key: &PrimaryKey,
        shadow: Arc<crate::plugin::LoadedPlugin>,
        snapshot: &crate::judge::snapshot::Snapshot,
        decision: &Decision,
    ) {
        let Some(slot) = self.shadow_slot(a, 1) else {
            return;
        };
        let active = crate::reconcile::diff::outcome_of(decision);
        let snapshot = snapshot.clone();
        let controller = a.id.to_string();
        let primary = crate::report::shadow::primary_key(&key.namespace, &key.name);
        let active_version = a.plugin.version().to_owned();
        let rollouts = Arc::clone(&self.rollouts);
        tokio::task::spawn_blocking(move || {
            let _slot = slot;
            let outcome = match shadow.reconcile(&snapshot) {
                Ok(plan) => serde_json::to_value(&plan).unwrap_or_default(),
                Err(e) => crate::report::shadow::failed(&e),
            };
            let differences = crate::report::shadow::account(
                &controller,
                &primary,
                (&active_version, shadow.version()),
                &active,
                &outcome,
            );
            rollouts.record_shadow(
                shadow.name(),
                shadow.digest(),
                &differences,
                outcome.pointer("/failed/reason").and_then(Value::as_str),
            );
            if !differences.is_empty() {
                tracing::info!(controller = %controller, primary = %primary, shadow_version = shadow.version(),
                    differences = differences.len(), "shadow plan differs from the active one");
            }
        });
    }

    /// Calls the shadow candidate on the snapshot of a kind call the active
    /// plugin just made, in the background (bounded like [`Self::run_shadow`]),
    /// and compares the two calls primary by primary. Nothing of the
    /// shadow's plan is written.
    pub(super) fn run_shadow_kind(
        &self,
        a: &Active,
        shadow: Arc<crate::plugin::LoadedPlugin>,
        decided: &crate::reconcile::kind::KindDecided,
    ) {
        let Some(snapshot) = &decided.snapshot else {
            return;
        };
        let Some(slot) = self.shadow_slot(a, decided.primaries.len()) else {
            return;
        };
        let active = crate::report::shadow::active_kind_outcomes(decided);
        let snapshot = snapshot.clone();
        let controller = a.id.to_string();
        let active_version = a.plugin.version().to_owned();
        let rollouts = Arc::clone(&self.rollouts);
        tokio::task::spawn_blocking(move || {
            let _slot = slot;
            let pairs = crate::report::shadow::kind_pairs(active, shadow.reconcile(&snapshot));
            let mut differing = 0usize;
            for (primary, active, outcome) in &pairs {
                let differences = crate::report::shadow::account(
                    &controller,
                    primary,
                    (&active_version, shadow.version()),
                    active,
                    outcome,
                );
                rollouts.record_shadow(
                    shadow.name(),
                    shadow.digest(),
                    &differences,
                    outcome.pointer("/failed/reason").and_then(Value::as_str),
                );
                differing += usize::from(!differences.is_empty());
            }
            if differing > 0 {
                tracing::info!(controller = %controller, shadow_version = shadow.version(),
                    primaries = pairs.len(), differing, "shadow kind plan differs from the active one");
            }
        });
    }
}
