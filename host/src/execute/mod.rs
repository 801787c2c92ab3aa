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
//!   ([`ApplyJudgement::unasked`](crate::judge::validate::ApplyJudgement::unasked): the cache would hold them were they
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
mod sequence;

use self::sequence::writes;
pub mod writer;

use std::sync::atomic::AtomicBool;

use kube::api::ApiResource;
use serde_json::Value;

use crate::contract::manifest::{Controller, KindRef};
use crate::judge::snapshot::ObjectSource;
use crate::judge::validate::{self as plan, Judgement, Plan, Violation};
use crate::object::{self};
use crate::plugin::LoadedPlugin;
use budget::DeletionBudgets;
use writer::{ApplyError, Writer};

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

#[cfg(test)]
mod tests {
    use super::sequence::observed_generation;
    use super::*;
    use serde_json::json;
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
