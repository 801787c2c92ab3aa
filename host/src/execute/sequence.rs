//! The writes of one validated plan, in their order: the finalizer, the
//! fenced creates the cache could not judge, the primary's patch, applies
//! (with generated values filled in), deletes and the one status write.
//!
//! # Guarantees
//! - Every write is checked against the fences first (the leader's Lease,
//!   with sharding the shard's) and carries the preconditions it was
//!   judged by: a race is a conflict, never an adoption.
//! - A write already held by the object is not sent again; the status is
//!   written once, only when it changed, with `observedGeneration`.

use kube::api::ApiResource;
use serde_json::{Value, json};

use super::budget::Reservation;
use super::writer;
use super::writer::{ApplyError, Fence};
use super::{
    ExecuteError, Executed, RECONCILED_CONDITION, Target, api_resource, economy, generated,
    pending_write, prepare, reconciled_by, still_leader,
};
use crate::conditions;
use crate::contract::manifest::KindRef;
use crate::judge::validate::{self as plan, ApplyJudgement, Judgement, Plan, Precondition};
use crate::object::{self, describe};

/// The writes of a plan, up to its status: the finalizer, the primary
/// patch, applies, deletes and the status. With a dry-run writer nothing
/// is persisted, so the primary's resourceVersion is not followed.
/// Returns the primary as last written, and what was done.
pub(super) async fn writes(
    t: Target<'_>,
    primary: &Value,
    plan: &Plan,
    judgement: &Judgement,
    now: &str,
    mut reservation: Option<&mut Reservation<'_>>,
) -> Result<(Value, Executed), ExecuteError> {
    let mut primary = primary.clone();
    let mut done = Executed::default();
    let deleting = object::is_deleting(&primary);
    let w = t.writer;
    let dry = w.is_dry_run();
    // A delete of the primary itself (validated: the controller declares
    // `delete-primary`). Its resourceVersion precondition is the one the
    // plugin saw, so nothing here may move the primary's version before
    // it: no finalizer is added and no annotation written.
    let delete_self = plan
        .delete
        .iter()
        .find(|d| plan::is_primary(&d.target, t.spec, &primary))
        .cloned();
    if let Some(f) = &t.spec.finalizer
        && delete_self.is_none()
    {
        let mut list = object::finalizers(&primary);
        if !deleting && !list.iter().any(|x| x == f) {
            list.push(f.clone());
            still_leader(&t)?;
            let pending = pending_write(&t, &t.spec.primary, &primary);
            let updated = w
                .set_finalizers(t.primary_resource, &primary, &list)
                .await?;
            pending.answered(object::resource_version(&updated));
            if !dry {
                primary = updated;
                object::strip_bookkeeping(&mut primary);
            }
        }
    }
    // Objects judged absent without asking the API server (the cache would
    // hold them were they ours) are created first, in plan order: if one
    // exists after all, its fence makes the create a conflict, and the
    // reconcile stops there, before the plan's other writes — its retry
    // reads the object and judges the whole plan again (refusing it when
    // the object is someone else's). A create that fails otherwise (its
    // namespace is created later in the plan) is tried again in order.
    let mut created = vec![false; plan.apply.len()];
    for (i, (op, judged)) in plan
        .apply
        .iter()
        .zip(judgement.applies.iter())
        .enumerate()
        .filter(|(_, (_, j))| j.unasked)
    {
        match apply_one(&t, &primary, op, judged).await {
            Ok(_) => created[i] = true,
            Err(ExecuteError::Write(e @ ApplyError::Conflict { .. })) => {
                return Err(ExecuteError::Write(e));
            }
            Err(ExecuteError::Write(_)) => {}
            Err(other) => return Err(other),
        }
    }
    // Fields of the primary (validated to be declared `primary-fields`) in
    // one merge patch carrying the primary's resourceVersion, unless the
    // primary already holds them.
    if let Some(patch) = &plan.primary_patch
        && patch.as_object().is_some_and(|m| !m.is_empty())
        && !economy::patch_holds(patch, &primary)
    {
        still_leader(&t)?;
        let pending = pending_write(&t, &t.spec.primary, &primary);
        let updated = w.merge_patch(t.primary_resource, &primary, patch).await?;
        pending.answered(object::resource_version(&updated));
        if !dry {
            follow_version(&mut primary, &updated);
        }
    }
    let unjudged = ApplyJudgement::default();
    let mut failures: Vec<ApplyError> = Vec::new();
    for (i, (op, judged)) in plan
        .apply
        .iter()
        .zip(judgement.applies.iter().chain(std::iter::repeat(&unjudged)))
        .enumerate()
    {
        if created.get(i).copied().unwrap_or(false) {
            continue;
        }
        match apply_one(&t, &primary, op, judged).await {
            Ok(Some(adopted)) => done.adopted.push(adopted),
            Ok(None) => {}
            Err(ExecuteError::Write(e)) => failures.push(e),
            Err(other) => return Err(other),
        }
    }
    for d in plan
        .delete
        .iter()
        .filter(|d| Some(*d) != delete_self.as_ref())
    {
        if let Some(owned) = t.spec.owned_kind(&d.target.api_version, &d.target.kind) {
            let ns = (!d.target.namespace.is_empty()).then_some(d.target.namespace.as_str());
            still_leader(&t)?;
            match w
                .delete(
                    &api_resource(&owned.kind),
                    ns,
                    &d.target.name,
                    &d.uid,
                    &d.resource_version,
                )
                .await
            {
                Ok(()) => {
                    if let Some(r) = reservation.as_deref_mut() {
                        r.used();
                    }
                }
                Err(e) => failures.push(e),
            }
        }
    }
    // The primary goes last, and only after every other write held.
    if failures.is_empty()
        && let Some(d) = &delete_self
    {
        let ns = (!d.target.namespace.is_empty()).then_some(d.target.namespace.as_str());
        still_leader(&t)?;
        match w
            .delete(
                t.primary_resource,
                ns,
                &d.target.name,
                &d.uid,
                &d.resource_version,
            )
            .await
        {
            Ok(()) => {
                if let Some(r) = reservation {
                    r.used();
                }
            }
            Err(e) => failures.push(e),
        }
    }
    if let Some(first) = failures.first() {
        return Err(ExecuteError::Write(match failures.len() {
            1 => failures.remove(0),
            n => ApplyError::Api {
                target: format!("{n} objects"),
                message: failures
                    .iter()
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>()
                    .join("; "),
            }
            .with_reason_of(first),
        }));
    }
    let mut status = plan
        .status
        .clone()
        .unwrap_or_else(|| primary["status"].clone());
    if !status.is_object() {
        status = json!({});
    }
    observed_generation(&mut status, &primary, plan.hold_observed_generation);
    // A plugin that writes its own conditions list without ours must not
    // reset our condition's lastTransitionTime on every pass.
    conditions::carry_over(&mut status, &primary["status"], RECONCILED_CONDITION);
    conditions::set(
        &mut status,
        RECONCILED_CONDITION,
        "True",
        "Reconciled",
        &format!("reconciled by plugin {}", reconciled_by(t.plugin)),
        primary["metadata"]["generation"].as_i64(),
        now,
    );
    // A deleted primary gets no status: it is gone, or going. The status
    // compared with is the one on the server, which is ours when the cache
    // has not yet seen our last status write.
    let current = economy::current_status(
        object::uid(&primary),
        object::resource_version(&primary),
        &primary["status"],
    );
    economy::keep_transition_times(&mut status, &current);
    if delete_self.is_none() && status != current {
        still_leader(&t)?;
        let before = object::resource_version(&primary).to_owned();
        let updated = w
            .write_status(t.primary_resource, &primary, &status)
            .await?;
        if !dry {
            economy::remember_status(object::uid(&primary), &before, &status);
            primary["metadata"]["resourceVersion"] = json!(updated.resource_version);
        }
    }
    Ok((primary, done))
}

/// Writes one apply of the plan as judged (or nothing, when its object
/// already holds it); returns the object's description when the write
/// adopted it.
pub(super) async fn apply_one(
    t: &Target<'_>,
    primary: &Value,
    op: &plan::ApplyOp,
    judged: &ApplyJudgement,
) -> Result<Option<String>, ExecuteError> {
    let w = t.writer;
    // Validation guarantees every applied object is of an owned kind.
    let Some(owned) = t
        .spec
        .owned_kind(object::api_version(&op.object), object::kind(&op.object))
    else {
        return Err(ExecuteError::Write(ApplyError::Api {
            target: describe(&op.object),
            message: "not of a kind the controller owns".into(),
        }));
    };
    let mut obj = prepare::prepare_apply(&op.object, primary, t.plugin.name(), owned);
    generated::mark(&mut obj, &op.generate);
    economy::stamp(&mut obj);
    if let Some(shard) = &t.shard {
        prepare::stamp_shard(&mut obj, primary, &shard.sharding.identity, owned);
    }
    let resource = api_resource(&owned.kind);
    if let Some(current) = already_holds(t, &owned.kind, op, judged, &obj) {
        // Nothing to apply; a generated key the Secret lacks is still filled.
        fill_generated(
            t,
            owned,
            op,
            &resource,
            &obj,
            &writer::Written::of(&current),
        )
        .await?;
        return Ok(None);
    }
    still_leader(t)?;
    let pending = pending_write(t, &owned.kind, &obj);
    let written = match (&op.precondition, &judged.existing) {
        // `force` takes fields from other managers; a create has none.
        (Some(Precondition::Absent), _) => w
            .create(&resource, &obj)
            .await
            .map(|created| writer::Written::of(&created)),
        // Judged absent: a server-side apply that creates it, and
        // conflicts if it appeared meanwhile.
        (None, None) => w.apply(&resource, &obj, Fence::ABSENT, op.force).await,
        (Some(Precondition::ResourceVersion(rv)), judged) => {
            let fence = Fence {
                uid: judged.as_ref().map(|j| j.uid.as_str()),
                resource_version: Some(rv),
            };
            w.apply(&resource, &obj, fence, op.force).await
        }
        (None, Some(j)) => {
            // Our own object: it must still be the one judged (same
            // UID). An adopted orphan: exactly the version judged.
            let fence = Fence {
                uid: Some(&j.uid),
                resource_version: judged.adopts.then_some(j.resource_version.as_str()),
            };
            w.apply(&resource, &obj, fence, op.force).await
        }
    };
    let written = written?;
    pending.answered(&written.resource_version);
    fill_generated(t, owned, op, &resource, &obj, &written).await?;
    Ok(judged.adopts.then(|| describe(&obj)))
}

/// Fills the generated keys of `op` (see [`generated`]) that the Secret
/// lacks as `seen` shows it, fenced by `seen`'s resourceVersion. A dry run
/// fills nothing (a dry-run create leaves no object to fill).
pub(super) async fn fill_generated(
    t: &Target<'_>,
    owned: &crate::contract::manifest::OwnedKind,
    op: &plan::ApplyOp,
    resource: &ApiResource,
    obj: &Value,
    seen: &writer::Written,
) -> Result<(), ExecuteError> {
    let missing = generated::missing(&op.generate, &seen.data_keys);
    if missing.is_empty() || t.writer.is_dry_run() || seen.resource_version.is_empty() {
        return Ok(());
    }
    let values = generated::values(&missing).map_err(|e| {
        ExecuteError::Write(ApplyError::Api {
            target: describe(obj),
            message: format!("cannot read random bytes for its generated keys: {e}"),
        })
    })?;
    still_leader(t)?;
    let pending = pending_write(t, &owned.kind, obj);
    let filled = t
        .writer
        .fill_data(resource, obj, &seen.resource_version, &values)
        .await?;
    pending.answered(&filled.resource_version);
    Ok(())
}

/// The object `op` applies as the cache holds it, when it is, as judged
/// (same UID and resourceVersion, not being adopted), already what `obj`
/// would make it: the apply can be skipped.
pub(super) fn already_holds(
    t: &Target<'_>,
    kind: &KindRef,
    op: &plan::ApplyOp,
    judged: &ApplyJudgement,
    obj: &Value,
) -> Option<std::sync::Arc<Value>> {
    let (Some(source), Some(j)) = (t.current, &judged.existing) else {
        return None;
    };
    if judged.adopts
        || matches!(&op.precondition, Some(Precondition::ResourceVersion(rv)) if *rv != j.resource_version)
        || matches!(&op.precondition, Some(Precondition::Absent))
    {
        return None;
    }
    let ns = obj["metadata"]["namespace"]
        .as_str()
        .filter(|_| kind.namespaced);
    source.get(kind, ns, object::name(obj)).filter(|cur| {
        object::uid(cur) == j.uid
            && object::resource_version(cur) == j.resource_version
            && economy::holds(obj, cur)
    })
}

/// Takes the resourceVersion of our own write, so a later preconditioned
/// write in the same reconcile does not conflict with it.
pub(super) fn follow_version(primary: &mut Value, updated: &Value) {
    if let Some(rv) = updated["metadata"]["resourceVersion"].as_str() {
        primary["metadata"]["resourceVersion"] = json!(rv);
    }
}

/// Sets `status.observedGeneration` to the primary's generation; with
/// `hold` (the plan's `holdObservedGeneration`: not applied yet) to what the
/// primary's status has instead, absent when it has none, whatever the
/// plugin's status said.
pub(super) fn observed_generation(status: &mut Value, primary: &Value, hold: bool) {
    let Some(g) = primary["metadata"]["generation"].as_i64() else {
        return;
    };
    if !hold {
        status["observedGeneration"] = json!(g);
        return;
    }
    let Some(status) = status.as_object_mut() else {
        return;
    };
    match primary["status"].get("observedGeneration") {
        Some(kept) => status.insert("observedGeneration".into(), kept.clone()),
        None => status.remove("observedGeneration"),
    };
}
