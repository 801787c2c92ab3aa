//! Executing a validated plan against the API, and reporting on the primary
//! how a reconcile ended.
//!
//! [`execute`] runs only after [`crate::judge::validate`] accepted the
//! whole plan; [`writer`] makes the individual API calls.
//!
//! # Guarantees
//!
//! - Every write is fenced by what validation judged: an object judged
//!   absent is created by a server-side apply carrying a resourceVersion
//!   no object can have (so it conflicts if the object appeared
//!   meanwhile, and creates it otherwise, owned by the plugin's apply
//!   manager like every later apply), an
//!   object judged this primary's is applied only while it still has the
//!   judged UID, an adopted orphan only while it is still at the judged
//!   resourceVersion, a delete only while UID and resourceVersion hold. A
//!   race is a conflict, retried from a fresh snapshot, never an adoption.
//! - Every write is attempted even when an earlier one failed, so one
//!   conflict does not hold back the others; any failure fails the
//!   reconcile, and status, Events and the finalizer release wait for a
//!   clean pass. The exception: objects judged absent without a read
//!   ([`ApplyJudgement::unasked`]: the cache would hold them were they
//!   ours) are created right after the finalizer, before the plan's other
//!   writes, and a conflict of one of them ends the pass there, so a plan
//!   whose object turns out to be someone else's has written nothing of
//!   its own but the finalizer and the unasked creates before it; its
//!   retry reads the object and refuses the plan.
//! - One status write per reconcile, only when the status changed, with
//!   `observedGeneration` (the generation; kept as it was when the plan
//!   says `holdObservedGeneration`: not applied yet) and the host's
//!   `Reconciled` condition, whose
//!   message names the plugin version that reconciled (`reconciled by
//!   plugin <plugin> <version> <digest>`): a new version costs one status
//!   write, an unchanged one none.
//! - No write that would change nothing ([`economy`]): an apply whose
//!   object, as judged, already holds the body (and its digest) is skipped,
//!   and so is a `primaryPatch` the primary already holds. A reconcile of a
//!   converged primary makes no API write.
//! - Secret keys a plan marks as generated ([`generated`]) are filled with
//!   random bytes by the host once, when the Secret lacks them, in a
//!   separate write fenced by the resourceVersion at which they were seen
//!   missing and owned by another field manager than the plugin's: never
//!   overwritten, never removed by a later apply, never in a plan or log.
//! - Before each write the leadership fence is checked; a replica that
//!   lost the Lease stops mid-plan.
//! - Before the first write the plugin's per-minute deletion budget is
//!   checked ([`budget`]): a plan over it writes nothing.
//! - With the plugin's `dryRunFirst`, every write of the plan (finalizer,
//!   primary patch, applies, deletes, status) is first sent with
//!   `dryRun=All`, in the same order; when the API server refuses any of
//!   them (schema, CEL rules, admission webhooks, quota) nothing is
//!   written and the failure names the object and the server's message.
//!   Each write is dry-run on its own against the current state: a write
//!   that only works after an earlier one of the same plan (an object in a
//!   namespace the plan creates) is refused by the dry run, and two
//!   writes that are each within a quota are not summed.
//!
//! Test builds (cargo feature `failpoints`, enabled only by the
//! integration tests) can crash the process right before write N of a
//! plan, at that leadership check ([`failpoint`], `WASMOP_FAILPOINT`); other
//! builds have no failpoint.

pub mod budget;
pub mod economy;
pub mod failpoint;
pub mod generated;
pub mod prepare;
pub mod report;
pub mod writer;

use std::sync::atomic::AtomicBool;

use kube::api::ApiResource;
use serde_json::{Value, json};

use crate::conditions;
use crate::contract::manifest::{Controller, KindRef};
use crate::judge::snapshot::ObjectSource;
use crate::judge::validate::{
    self as plan, ApplyJudgement, Judgement, Plan, Precondition, Violation,
};
use crate::object::{self, describe};
use crate::plugin::LoadedPlugin;
use budget::{DeletionBudgets, Reservation};
use writer::{ApplyError, Fence, Writer};

pub use report::Reporter;

/// Condition type the host maintains on every primary.
pub const RECONCILED_CONDITION: &str = "Reconciled";

/// Annotation that named the plugin version that last reconciled a primary
/// (`<plugin> <version> <digest>`). No longer written: the `Reconciled`
/// condition's message says it, in the one status write. Primaries written
/// by older hosts may still carry it.
pub const RECONCILED_BY_ANNOTATION: &str = "wasmop.dev/reconciled-by";

pub use crate::key::api_resource;

/// `<plugin> <version> <digest prefix>`: which plugin version reconciled a
/// primary (in the `Reconciled` condition's message).
pub fn reconciled_by(plugin: &LoadedPlugin) -> String {
    let digest: String = plugin.digest().chars().take(19).collect();
    format!("{} {} {digest}", plugin.name(), plugin.version())
}

/// Who executes a plan: the controller, its plugin and its writer.
#[derive(Clone, Copy)]
pub struct Target<'a> {
    /// The controller of the effective manifest.
    pub spec: &'a Controller,
    /// The plugin (name, version and digest go on the primary).
    pub plugin: &'a LoadedPlugin,
    /// Writes under the plugin's field manager.
    pub writer: &'a Writer,
    /// The primary kind's API coordinates.
    pub primary_resource: &'a ApiResource,
    /// True while this replica may write (leader election); checked before
    /// every write, with `lease_until`.
    pub leader: &'a AtomicBool,
    /// The local-clock end of the Lease term (see
    /// [`crate::lease::leader::LeaseDeadline`]).
    pub lease_until: &'a std::sync::Mutex<Option<std::time::Instant>>,
    /// With sharding: this shard, and whether the primary is still
    /// assigned to it (no drain mark), as its watch shows it now; checked
    /// before every write with `leader` and `lease_until` (which are then
    /// the shard Lease's), and the deletion budget is this shard's share.
    pub shard: Option<ShardFence<'a>>,
    /// The operator's per-minute deletion budgets, by plugin.
    pub budgets: &'a DeletionBudgets,
    /// Where the objects as judged are read from, to skip applies that
    /// would change nothing ([`economy`]); `None` applies every object.
    pub current: Option<&'a (dyn ObjectSource + Sync)>,
    /// Told of every object the plan's writes changed (not the status),
    /// with the resourceVersion the API server answered; `None` tells no
    /// one. Dry runs tell no one either.
    pub written: Option<&'a dyn WriteLog>,
}

/// The shard a plan is executed by (see [`crate::lease::shard`]).
#[derive(Clone, Copy)]
pub struct ShardFence<'a> {
    /// This shard.
    pub sharding: &'a crate::lease::shard::Sharding,
    /// True while the primary is assigned to this shard and not draining.
    pub owns: &'a (dyn Fn() -> bool + Sync),
}

impl std::fmt::Debug for ShardFence<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardFence")
            .field("shard", &self.sharding.identity)
            .finish()
    }
}

/// Where [`execute`] reports the writes it makes: the object's kind,
/// namespace (empty when cluster-scoped), name, and, once answered, the
/// resourceVersion the API server answered (see `crate::controller::echo`).
pub trait WriteLog: Sync {
    /// A write of one object is about to be sent.
    fn writing(&self, kind: &KindRef, namespace: &str, name: &str);
    /// That write was answered with `resource_version`; empty when it
    /// failed or was abandoned.
    fn wrote(&self, kind: &KindRef, namespace: &str, name: &str, resource_version: &str);
}

/// A write about to be sent, reported to `t.written` unless `t` writes dry:
/// [`PendingWrite::answered`] with the version the API server answered.
/// Dropped unanswered (the write failed, or the reconcile was abandoned
/// during it), it reports the write as failed.
struct PendingWrite<'a> {
    log: Option<&'a dyn WriteLog>,
    kind: &'a KindRef,
    namespace: String,
    name: String,
}

/// Reports that the write of `obj` (of `kind`) is about to be sent.
fn pending_write<'a>(t: &Target<'a>, kind: &'a KindRef, obj: &Value) -> PendingWrite<'a> {
    let log = t.written.filter(|_| !t.writer.is_dry_run());
    let namespace = object::namespace(obj).unwrap_or_default().to_owned();
    let name = object::name(obj).to_owned();
    if let Some(log) = log {
        log.writing(kind, &namespace, &name);
    }
    PendingWrite {
        log,
        kind,
        namespace,
        name,
    }
}

impl PendingWrite<'_> {
    /// The API server answered the write with `resource_version`.
    fn answered(mut self, resource_version: &str) {
        if let Some(log) = self.log.take() {
            log.wrote(self.kind, &self.namespace, &self.name, resource_version);
        }
    }
}

impl Drop for PendingWrite<'_> {
    fn drop(&mut self) {
        if let Some(log) = self.log.take() {
            log.wrote(self.kind, &self.namespace, &self.name, "");
        }
    }
}

impl std::fmt::Debug for Target<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("controller", &self.spec.name)
            .finish()
    }
}

/// Why a plan was not (fully) executed.
#[derive(Debug, thiserror::Error)]
pub enum ExecuteError {
    /// A write failed.
    #[error(transparent)]
    Write(#[from] ApplyError),
    /// This replica lost leadership before the plan was done; the rest of
    /// it is left to the new leader.
    #[error("leadership lost mid-plan; the remaining writes were not made")]
    LostLeadership,
    /// The plan was rejected before its first write (the plugin's
    /// per-minute deletion budget); nothing was written.
    #[error("plan rejected, nothing written: {}", violations(.0))]
    Rejected(Vec<Violation>),
    /// The API server refused a write of the plan's dry run
    /// (`dryRunFirst`); nothing was written.
    #[error("dry run refused, nothing written: {0}")]
    DryRunRefused(ApplyError),
}

/// Violations as the worker reports a rejected plan: each with its rule.
fn violations(list: &[Violation]) -> String {
    list.iter()
        .map(|v| format!("{v} ({})", v.rule.as_str()))
        .collect::<Vec<_>>()
        .join("; ")
}

impl ExecuteError {
    /// Short CamelCase reason.
    pub fn reason(&self) -> &'static str {
        match self {
            ExecuteError::Write(e) => e.reason(),
            ExecuteError::LostLeadership => "LeadershipLost",
            ExecuteError::Rejected(_) => "PlanRejected",
            ExecuteError::DryRunRefused(_) => "DryRunRefused",
        }
    }

    /// True for a conflict: the world moved since the snapshot, and a
    /// fresh snapshot is the fix.
    pub fn is_conflict(&self) -> bool {
        matches!(self, ExecuteError::Write(ApplyError::Conflict { .. }))
    }
}

/// What an executed plan did.
#[derive(Debug, Default)]
pub struct Executed {
    /// Objects adopted (orphans of kinds the controller adopts).
    pub adopted: Vec<String>,
}

fn still_leader(t: &Target<'_>) -> Result<(), ExecuteError> {
    if crate::lease::leader::may_write(t.leader, t.lease_until)
        && t.shard.is_none_or(|s| (s.owns)())
    {
        // Right before each write of a plan: the chaos soak's crash point.
        failpoint::before_write(t.writer.is_dry_run());
        Ok(())
    } else {
        Err(ExecuteError::LostLeadership)
    }
}

/// Executes a validated plan for `primary`. See the module guarantees.
///
/// # Errors
///
/// [`ExecuteError`]: the first failed write (all failures named when there
/// are several), lost leadership, a plan over the per-minute deletion
/// budget, or a write the dry run was refused.
pub async fn execute(
    t: Target<'_>,
    primary: &Value,
    plan: &Plan,
    judgement: &Judgement,
    now: &str,
    reporter: &Reporter,
) -> Result<Executed, ExecuteError> {
    failpoint::plan(execute_plan(t, primary, plan, judgement, now, reporter)).await
}

async fn execute_plan(
    t: Target<'_>,
    primary: &Value,
    plan: &Plan,
    judgement: &Judgement,
    now: &str,
    reporter: &Reporter,
) -> Result<Executed, ExecuteError> {
    let limits = t.plugin.limits().plan;
    let deleting = object::is_deleting(primary);
    let mut reservation = t
        .budgets
        .reserve(
            t.plugin.name(),
            plan.delete.len(),
            match t.shard {
                Some(s) => s.sharding.deletion_share(limits.max_deletes_per_minute),
                None => limits.max_deletes_per_minute,
            },
        )
        .map_err(|v| ExecuteError::Rejected(vec![v]))?;
    if limits.dry_run_first {
        let dry = t.writer.dry_run();
        let dry_target = Target {
            writer: &dry,
            written: None,
            ..t
        };
        match writes(dry_target, primary, plan, judgement, now, None).await {
            Ok(_) => {}
            Err(ExecuteError::Write(e)) if !matches!(e, ApplyError::Conflict { .. }) => {
                return Err(ExecuteError::DryRunRefused(e));
            }
            Err(e) => return Err(e),
        }
    }
    let (primary, done) = writes(t, primary, plan, judgement, now, Some(&mut reservation)).await?;
    for name in &done.adopted {
        still_leader(&t)?;
        reporter
            .event(
                &primary,
                false,
                "Adopted",
                &format!("adopted {name}, which nothing controlled"),
            )
            .await;
    }
    for e in &plan.events {
        still_leader(&t)?;
        reporter
            .event(
                &primary,
                e.event_type == plan::EventType::Warning,
                &e.reason,
                &e.message,
            )
            .await;
    }
    if deleting
        && plan.cleanup_complete
        && let Some(f) = &t.spec.finalizer
    {
        let list: Vec<String> = object::finalizers(&primary)
            .into_iter()
            .filter(|x| x != f)
            .collect();
        still_leader(&t)?;
        let pending = pending_write(&t, &t.spec.primary, &primary);
        let updated = t
            .writer
            .set_finalizers(t.primary_resource, &primary, &list)
            .await?;
        pending.answered(object::resource_version(&updated));
    }
    Ok(done)
}

/// The writes of a plan, up to its status: the finalizer, the primary
/// patch, applies, deletes and the status. With a dry-run writer nothing
/// is persisted, so the primary's resourceVersion is not followed.
/// Returns the primary as last written, and what was done.
async fn writes(
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
async fn apply_one(
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
async fn fill_generated(
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
fn already_holds(
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
fn follow_version(primary: &mut Value, updated: &Value) {
    if let Some(rv) = updated["metadata"]["resourceVersion"].as_str() {
        primary["metadata"]["resourceVersion"] = json!(rv);
    }
}

/// Sets `status.observedGeneration` to the primary's generation; with
/// `hold` (the plan's `holdObservedGeneration`: not applied yet) to what the
/// primary's status has instead, absent when it has none, whatever the
/// plugin's status said.
fn observed_generation(status: &mut Value, primary: &Value, hold: bool) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn observed_generation_is_held_only_when_the_plan_says_so() {
        let primary = json!({"metadata": {"generation": 5}, "status": {"observedGeneration": 4}});
        // Without the field (every plugin before it): the generation.
        let mut status = json!({"phase": "Syncing"});
        observed_generation(&mut status, &primary, false);
        assert_eq!(status, json!({"phase": "Syncing", "observedGeneration": 5}));
        // Held: what the primary had, whatever the plugin wrote.
        let mut status = json!({"phase": "Syncing", "observedGeneration": 5});
        observed_generation(&mut status, &primary, true);
        assert_eq!(status, json!({"phase": "Syncing", "observedGeneration": 4}));
        // Held with nothing observed yet: absent.
        let fresh = json!({"metadata": {"generation": 1}});
        let mut status = json!({"observedGeneration": 1});
        observed_generation(&mut status, &fresh, true);
        assert_eq!(status, json!({}));
        // A plan read from JSON without the field holds nothing.
        let plan: Plan = serde_json::from_str(r#"{"status": {}}"#).unwrap();
        assert!(!plan.hold_observed_generation);
    }

    /// Every report, in order.
    #[derive(Default)]
    struct Reports(Mutex<Vec<String>>);

    impl WriteLog for Reports {
        fn writing(&self, _: &KindRef, namespace: &str, name: &str) {
            self.0
                .lock()
                .unwrap()
                .push(format!("writing {namespace}/{name}"));
        }

        fn wrote(&self, _: &KindRef, namespace: &str, name: &str, resource_version: &str) {
            self.0
                .lock()
                .unwrap()
                .push(format!("wrote {namespace}/{name} {resource_version:?}"));
        }
    }

    #[test]
    fn a_write_dropped_unanswered_is_reported_as_failed() {
        let reports = Reports::default();
        let kind = KindRef::namespaced("", "v1", "ConfigMap", "configmaps");
        let pending = |name: &str| PendingWrite {
            log: Some(&reports),
            kind: &kind,
            namespace: "ns".into(),
            name: name.into(),
        };
        // A write whose request failed (`?` returned before the answer).
        drop(pending("a"));
        pending("b").answered("7");
        assert_eq!(
            *reports.0.lock().unwrap(),
            ["wrote ns/a \"\"", "wrote ns/b \"7\""]
        );
    }
}
