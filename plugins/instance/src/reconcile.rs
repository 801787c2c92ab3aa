//! One reconcile of a FireboltInstance, start to end: read the spec and
//! settings, settle `spec.id`, run every step in [`STEPS`], turn their
//! answers into one plan (writes, prunes, status, events).
//!
//! # Guarantees
//!
//! - The same snapshot gives the same plan.
//! - A step that fails changes nothing of its own objects: they are
//!   neither written nor deleted; the other steps' objects are written as
//!   usual.
//! - Create-only objects are in the plan only while the snapshot does not
//!   have them. Generated credentials are applied on every pass with the
//!   names of their generated keys; the host makes the values once.
//! - An owned object is deleted only when the step of its component ran
//!   successfully and no longer wants it; objects without a known
//!   component label are never touched.

use std::collections::BTreeSet;

use serde_json::json;
use wasmop_sdk::{EventType, Plan, ReconcileError, Snapshot};

use crate::ids::ulid;
use crate::names::{COMPONENT_LABEL, Names};
use crate::settings::Settings;
use crate::spec::FireboltInstance;
use crate::step::{Context, Ran, StepDef};
use crate::{gateway, metadata, postgres, security, status};

/// Every step, in the order it runs. Security steps come first, as in the
/// seed, because the components will read what they provision.
pub const STEPS: [StepDef; 6] = [
    security::AUTH,
    security::ENGINE_TLS,
    security::GATEWAY_TLS,
    postgres::STEP,
    metadata::STEP,
    gateway::STEP,
];

/// Reconciles the instance in `snapshot`.
///
/// # Errors
///
/// [`ReconcileError::InvalidSpec`] when the primary is not a
/// FireboltInstance or its name is too long; [`ReconcileError::Internal`]
/// when the snapshot lacks what the host always provides (UID, namespace,
/// a valid `now`) or the settings do not fit. Step failures are not
/// errors: they are reported on the steps' conditions.
pub fn reconcile(snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
    if snapshot.deleting {
        // No finalizer: ownerReferences let the garbage collector remove
        // everything the instance owns.
        return Ok(Plan::new());
    }
    let settings: Settings = snapshot.settings_as()?;
    let instance: FireboltInstance = snapshot.primary_as()?;
    let uid = instance.metadata.uid.clone().unwrap_or_default();
    if uid.is_empty() {
        return Err(ReconcileError::internal("the primary has no metadata.uid"));
    }
    let namespace = snapshot
        .primary_namespace()
        .ok_or_else(|| ReconcileError::internal("the primary has no namespace"))?;
    let names = Names::new(snapshot.primary_name(), namespace, &settings.cluster_domain)
        .map_err(ReconcileError::invalid_spec)?;
    let now = snapshot.now()?;

    let mut plan = Plan::new();
    let generated;
    let id = if instance.spec.id.is_empty() {
        generated = ulid(now.0.as_millisecond(), &uid);
        plan = plan
            .primary_patch(json!({"spec": {"id": generated}}))
            .event("IdGenerated", format!("generated spec.id {generated}"));
        generated.as_str()
    } else {
        instance.spec.id.as_str()
    };

    let placeholder = security::Security::placeholder();
    let base = Context {
        snapshot,
        instance: &instance,
        spec: &instance.spec,
        settings: &settings,
        names: &names,
        id,
        uid: &uid,
        now: &now,
        security: &placeholder,
    };
    let evaluated = security::evaluate(&base);
    let ctx = Context {
        security: &evaluated,
        ..base
    };
    let ran: Vec<Ran> = STEPS
        .iter()
        .map(|step| Ran {
            step: *step,
            result: (step.run)(&ctx),
        })
        .collect();

    plan = write(plan, snapshot, &ran);
    plan = prune(plan, snapshot, &ran)?;

    if let Some(after) = ctx.security.auth.requeue {
        // A rotation step waits for time, not for an object to change.
        plan = plan.requeue_after(after);
    }
    let update = status::compute(&ctx, &ran);
    plan = crate::auth::rotation_gauges(plan, update.status.get("auth"), ctx.now_seconds());
    plan = plan.status(update.status);
    if instance.spec.metric_scrape_mode.as_deref() == Some("ApiserverProxy") {
        // The CRD refuses it; an instance stored before that is told why
        // it has no effect.
        plan = plan.warning(
            "MetricScrapeModeUnsupported",
            "spec.metricScrapeMode ApiserverProxy is not supported: engine metrics are scraped by Pod IP",
        );
    }
    for (kind, reason, message) in update.events {
        plan = match kind {
            EventType::Normal => plan.event(&reason, message),
            EventType::Warning => plan.warning(&reason, message),
        };
    }
    Ok(plan)
}

/// Adds the objects of every step that ran successfully.
fn write(mut plan: Plan, snapshot: &Snapshot, ran: &[Ran]) -> Plan {
    for outcome in ran.iter().filter_map(|r| r.result.as_ref().ok()) {
        for desired in &outcome.objects {
            if !desired.generate.is_empty() {
                // Its generated keys are the host's (another field manager);
                // forcing takes back only the fields the plugin renders.
                plan = plan.apply_generating(&desired.object, desired.generate.clone());
                if let Some(op) = plan.apply.last_mut() {
                    op.force = true;
                }
            } else if !desired.create_only {
                // As upstream: the operator owns what it renders, so a field
                // another manager took over (say `kubectl scale`) is taken back.
                plan = plan.apply_forced(&desired.object);
            } else if snapshot
                .owned_named(desired.kind(), desired.name())
                .is_none()
            {
                plan = plan.apply_if_absent(&desired.object);
            }
        }
    }
    plan
}

/// Deletes owned objects of successful steps' components that those steps
/// no longer want.
fn prune(mut plan: Plan, snapshot: &Snapshot, ran: &[Ran]) -> Result<Plan, ReconcileError> {
    let mut settled = BTreeSet::new();
    let mut wanted = BTreeSet::new();
    for r in ran {
        if let Ok(outcome) = &r.result {
            settled.extend(r.step.components.iter().map(|c| c.label()));
            for d in &outcome.objects {
                wanted.insert((d.kind().to_owned(), d.name().to_owned()));
            }
        }
    }
    for owned in &snapshot.owned {
        let component = owned
            .pointer("/metadata/labels")
            .and_then(|l| l.get(COMPONENT_LABEL))
            .and_then(|v| v.as_str())
            .unwrap_or_default();
        let kind = owned["kind"].as_str().unwrap_or_default().to_owned();
        let name = owned
            .pointer("/metadata/name")
            .and_then(|n| n.as_str())
            .unwrap_or_default()
            .to_owned();
        if settled.contains(component) && !wanted.contains(&(kind, name)) {
            plan = plan.delete_owned(owned)?;
        }
    }
    Ok(plan)
}
