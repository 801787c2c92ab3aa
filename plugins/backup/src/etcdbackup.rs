//! The EtcdBackup controller: one Job per EtcdBackup, one Job at a time
//! across the cluster, in creation order.
//!
//! The controller is kind-scoped: one call sees every EtcdBackup (the
//! snapshot's primary list), the Jobs they own, the backup Jobs and the
//! scheduled runs' Jobs, and the PVCs. It computes the queue and the slot
//! once ([`Cluster`]) and from those decides each backup's next [`Step`],
//! answering one object plan per backup ([`reconcile_kind`]). So N changes
//! cost one call over N backups, where a per-object controller made N
//! calls that each recomputed the queue over all N (see BENCHMARKS.md).
//! The steps, per backup:
//!
//! 0. A backup requested by Jobs (a scheduled run) none of which exists any
//!    more is deleted, whatever its state, as upstream's
//!    BackupRemovalController does: nothing else can garbage-collect a
//!    cluster-scoped object through a namespaced owner. The delete carries
//!    the uid and resourceVersion the snapshot showed. "None exists" is
//!    judged only once the backup is `orphanGraceSeconds` old: before, a
//!    requesting Job the snapshot does not show may be late through the
//!    watch, and the backup waits (`BackupPending`, reason
//!    `AwaitingRequestingJob`), neither queued nor deleted.
//! 1. A finished backup (`BackupCompleted`, `BackupFailed` or
//!    `BackupSkipped` True) is never run again.
//! 2. A backup with a Job follows it: `BackupPending` with `backupJob`
//!    while it runs, `BackupCompleted`/`BackupFailed` when it ends
//!    (`FailureTarget`, the Job controller's first word of a failure,
//!    counts). A Job's Pod unschedulable for `schedulingTimeoutSeconds`
//!    fails the backup (reason `PodUnschedulable`) and deletes the Job; the
//!    Job's own `activeDeadlineSeconds` (`backupDeadlineSeconds`) bounds
//!    every other way a Pod can fail to run, a lost node included.
//! 3. A backup waiting for its turn is queued: `BackupPending` (reason
//!    `BackupQueued`) naming the running backup. The queue holds every
//!    unstarted, unfinished backup, ordered by creationTimestamp then name.
//! 4. When the slot is free ([`Cluster::running`]), the head of the queue
//!    starts:
//!    its PVC is checked (missing → `BackupFailed` naming it) and its Job
//!    created.
//!
//! # Guarantees
//!
//! - At most one backup Job is unfinished at any time, as long as only
//!   this plugin creates them: a backup starts only when the slot is free:
//!   every backup Job in the target namespace has finished (one being
//!   deleted has not), no Pod of a backup Job may still run (not ended;
//!   being deleted and not yet [`LOST_POD_GRACE`] past its due time), and
//!   no started backup's Job is still missing from the snapshot (a Job not
//!   yet seen through the watch still blocks through its owner's
//!   `status.backupJob`).
//! - A backup's Job name is a function of its uid and is created with an
//!   "absent" precondition: a duplicate start is refused by the API server.
//! - Calling reconcile twice on the same snapshot yields the same plan.
//!
//! # Caveats
//!
//! Deleting an orphan whose Job still runs garbage-collects that Job (the
//! EtcdBackup controls it), which frees the slot once its Pods are gone.
//! A Pod whose deletion its node never confirms (a node that stopped
//! answering) is taken for lost [`LOST_POD_GRACE`] after its deletion was
//! due: if that node still runs it, two backups may run for a while.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::json;
use wasmop_sdk::conditions::{find_condition, is_true, set_condition};
use wasmop_sdk::{DeleteOp, ObjectRef, Plan, ReconcileError, Snapshot, k8s_openapi};

use crate::api::{
    BACKUP_COMPLETED, BACKUP_FAILED, BACKUP_PENDING, EtcdBackup, JobRef, PROGRESS_CONDITIONS,
    REASON_QUEUED, etcd_backup_kind,
};
use crate::settings::Settings;
use crate::workloads::{backup_job, backup_job_name, backup_path, job_backup_path};

/// Read id of every EtcdBackup in a per-object snapshot (see
/// [`reconcile`]); the kind-scoped manifest declares no such read.
pub const READ_ETCD_BACKUPS: &str = "etcdbackups";
/// Read id: Jobs labelled `app=cluster-backup-job` (backup Jobs).
pub const READ_BACKUP_JOBS: &str = "backup-jobs";
/// Read id: Jobs labelled `app=cluster-backup-cronjob` (scheduled runs).
pub const READ_RUNS: &str = "scheduled-runs";
/// Read id: PersistentVolumeClaims (filtered to the target namespace).
pub const READ_PVCS: &str = "pvcs";
/// Read id: Pods labelled `app=cluster-backup-job` (the backup Jobs' Pods).
pub const READ_BACKUP_PODS: &str = "backup-pods";

/// How long a started backup whose Job is not in the snapshot is given
/// before it counts as lost (the Job may only be late through the watch).
pub const MISSING_JOB_GRACE: Duration = Duration::from_secs(60);
/// How long after its deletion was due a backup Pod still shown stops
/// holding the slot: its node did not confirm the deletion (a node that
/// stopped answering), so it is taken for lost.
pub const LOST_POD_GRACE: Duration = Duration::from_secs(60);

/// Everything a reconcile sees that is the same for every EtcdBackup:
/// typed, filtered to the target namespace, with the queue and the slot
/// computed once.
#[derive(Clone, Debug)]
pub struct Cluster {
    /// The settings.
    pub settings: Settings,
    /// The snapshot's time.
    pub now: Timestamp,
    /// Every EtcdBackup.
    pub backups: Vec<EtcdBackup>,
    /// Backup Jobs in the target namespace (any owner).
    pub backup_jobs: Vec<Job>,
    /// Jobs of scheduled runs in the target namespace.
    pub runs: Vec<Job>,
    /// PVCs in the target namespace.
    pub pvcs: Vec<PersistentVolumeClaim>,
    /// Pods of backup Jobs in the target namespace.
    pub pods: Vec<Pod>,
    /// Place in the queue by uid (see [`Cluster::queue`]).
    queue_pos: HashMap<String, usize>,
    /// Name of the backup at the head of the queue.
    queue_head: Option<String>,
    /// What occupies the slot (see [`Cluster::running`]).
    running: Option<Running>,
}

impl Cluster {
    /// The cluster view over these objects; computes the queue and the
    /// slot once (O(n log n) in the number of backups).
    pub fn new(
        settings: Settings,
        now: Timestamp,
        backups: Vec<EtcdBackup>,
        backup_jobs: Vec<Job>,
        runs: Vec<Job>,
        pvcs: Vec<PersistentVolumeClaim>,
        pods: Vec<Pod>,
    ) -> Cluster {
        let mut cluster = Cluster {
            settings,
            now,
            backups,
            backup_jobs,
            runs,
            pvcs,
            pods,
            queue_pos: HashMap::new(),
            queue_head: None,
            running: None,
        };
        let queue: Vec<(String, String)> = cluster
            .queue()
            .iter()
            .map(|b| (b.uid().to_owned(), b.name().to_owned()))
            .collect();
        cluster.queue_head = queue.first().map(|(_, name)| name.clone());
        cluster.queue_pos = queue
            .into_iter()
            .enumerate()
            .map(|(i, (uid, _))| (uid, i))
            .collect();
        cluster.running = cluster.compute_running();
        cluster
    }

    /// Whether the Jobs that requested `b` (a scheduled run) are seen.
    ///
    /// A backup requested by Jobs none of which the snapshot shows is
    /// [`Requester::Unconfirmed`] until it is `orphanGraceSeconds` old, and
    /// [`Requester::Gone`] after: a run's Job exists before the run creates
    /// its EtcdBackup, so a Job not shown that long after is gone, not late
    /// through the watch.
    fn requester<'b>(&self, b: &'b EtcdBackup) -> Requester<'b> {
        let requesters = b.requesting_jobs();
        let alive = |uid: &str| {
            self.runs
                .iter()
                .any(|j| j.metadata.uid.as_deref() == Some(uid))
        };
        if requesters.iter().any(|(_, uid)| alive(uid)) {
            return Requester::Seen;
        }
        let Some(&(name, uid)) = requesters.first() else {
            return Requester::Seen;
        };
        let grace = Duration::from_secs(u64::from(self.settings.orphan_grace_seconds));
        let created = b
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(self.now, |t| t.0);
        let age = Duration::try_from(self.now.duration_since(created)).unwrap_or_default();
        match grace.checked_sub(age) {
            Some(wait) if !wait.is_zero() => Requester::Unconfirmed { name, wait },
            _ => Requester::Gone { name, uid },
        }
    }

    /// Whether `pod` no longer runs: it ended, or its deletion is overdue
    /// by [`LOST_POD_GRACE`] (its node does not answer). `None` while it
    /// may run, with when it will count as lost if it is being deleted.
    fn pod_stopped(&self, pod: &Pod) -> Result<(), Option<Timestamp>> {
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) {
            return Ok(());
        }
        let Some(deleted) = &pod.metadata.deletion_timestamp else {
            return Err(None);
        };
        let lost_at = deleted.0.checked_add(LOST_POD_GRACE).unwrap_or(deleted.0);
        if self.now >= lost_at {
            Ok(())
        } else {
            Err(Some(lost_at))
        }
    }

    /// The name of the backup a Job belongs to: its controller's, else its
    /// `backup-name` label, else the backup whose status names it.
    fn backup_of_job(&self, job_name: &str, job: Option<&Job>) -> String {
        job.and_then(|job| {
            controller_of(&job.metadata)
                .map(|o| o.name.clone())
                .or_else(|| {
                    job.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(crate::api::BACKUP_NAME_LABEL).cloned())
                })
        })
        .or_else(|| {
            self.backups
                .iter()
                .find(|b| {
                    b.backup_job.as_ref().is_some_and(|r| {
                        r.name == job_name && r.namespace == self.settings.target_namespace
                    })
                })
                .map(|b| b.name().to_owned())
        })
        .unwrap_or_else(|| job_name.to_owned())
    }

    /// What occupies the single backup slot, if anything: a backup Job in
    /// the target namespace that has not finished (also one being deleted),
    /// a Pod of a backup Job that may still run (whatever became of its
    /// Job), or a started, unfinished backup whose Job the snapshot does
    /// not show yet.
    pub fn running(&self) -> Option<&Running> {
        self.running.as_ref()
    }

    fn compute_running(&self) -> Option<Running> {
        // An unfinished backup Job, also one being deleted: its Pods may
        // still run.
        if let Some(job) = self.backup_jobs.iter().find(|j| finish(j).is_none()) {
            let job_name = job.metadata.name.clone().unwrap_or_default();
            return Some(Running {
                backup: self.backup_of_job(&job_name, Some(job)),
                job: job_name,
                deleting: job.metadata.deletion_timestamp.is_some(),
                pod: None,
                until: None,
            });
        }
        // A Pod of a backup Job that may still run, whatever became of its
        // Job (finished, being deleted, gone): until it stops, or until its
        // deletion is overdue.
        if let Some((pod, until)) = self
            .pods
            .iter()
            .filter_map(|p| self.pod_stopped(p).err().map(|until| (p, until)))
            .min_by_key(|(p, _)| p.metadata.name.clone())
        {
            let job_ref = controller_of(&pod.metadata);
            let job_name = job_ref.map(|o| o.name.clone()).unwrap_or_default();
            let job = job_ref.and_then(|o| {
                self.backup_jobs
                    .iter()
                    .find(|j| j.metadata.uid.as_deref() == Some(o.uid.as_str()))
            });
            return Some(Running {
                backup: self.backup_of_job(&job_name, job),
                deleting: job.is_none_or(|j| j.metadata.deletion_timestamp.is_some()),
                job: job_name,
                pod: pod.metadata.name.clone(),
                until,
            });
        }
        let seen: HashSet<(&str, &str)> = self
            .backup_jobs
            .iter()
            .filter_map(|j| {
                Some((
                    j.metadata.namespace.as_deref()?,
                    j.metadata.name.as_deref()?,
                ))
            })
            .collect();
        self.backups
            .iter()
            .filter(|b| !b.finished() && !b.deleting())
            .find_map(|b| {
                let r = b.backup_job.as_ref()?;
                let shown = seen.contains(&(r.namespace.as_str(), r.name.as_str()));
                // Its own reconcile declares the Job lost when the grace is
                // up; nothing else may wake the queue then (a status write
                // does not), so the waiting backups look again at that time.
                let lost_at = self
                    .pending_since(b)
                    .checked_add(MISSING_JOB_GRACE)
                    .unwrap_or(self.now);
                (r.namespace == self.settings.target_namespace && !shown).then(|| Running {
                    backup: b.name().to_owned(),
                    job: r.name.clone(),
                    deleting: false,
                    pod: None,
                    until: Some(lost_at),
                })
            })
    }

    /// When `b`'s `BackupPending` last turned True (its start, for a started
    /// backup), else now.
    fn pending_since(&self, b: &EtcdBackup) -> Timestamp {
        find_condition(&b.conditions, BACKUP_PENDING)
            .filter(|c| c.status == "True")
            .map_or(self.now, |c| c.last_transition_time.0)
    }

    /// The queue of backups waiting to start, in order: unfinished, not
    /// deleted, not started, their requesting Jobs (if any) seen; by
    /// creationTimestamp, then name.
    pub fn queue(&self) -> Vec<&EtcdBackup> {
        // The uids of the backups a backup Job in the snapshot belongs to.
        let with_job: HashSet<&str> = self
            .backup_jobs
            .iter()
            .flat_map(|j| j.metadata.owner_references.iter().flatten())
            .filter(|o| o.controller == Some(true))
            .map(|o| o.uid.as_str())
            .collect();
        let mut waiting: Vec<&EtcdBackup> = self
            .backups
            .iter()
            .filter(|b| {
                !b.finished()
                    && !b.deleting()
                    && b.backup_job.is_none()
                    && !with_job.contains(b.uid())
                    && matches!(self.requester(b), Requester::Seen)
            })
            .collect();
        waiting.sort_by(|a, b| a.queue_key().cmp(&b.queue_key()));
        waiting
    }
}

/// What one EtcdBackup's reconcile sees: the shared [`Cluster`], the
/// backup and the Jobs it controls.
#[derive(Clone, Debug)]
pub struct World<'c> {
    /// What every backup sees.
    pub cluster: &'c Cluster,
    /// The primary.
    pub backup: &'c EtcdBackup,
    /// The primary's own Jobs (controlled by it).
    pub own_jobs: Vec<Job>,
}

impl World<'_> {
    /// The primary's Job: the one `status.backupJob` names, else the first
    /// it controls.
    fn own_job(&self) -> Option<&Job> {
        let named = self.backup.backup_job.as_ref().and_then(|r| {
            self.own_jobs.iter().find(|j| {
                j.metadata.name.as_deref() == Some(r.name.as_str())
                    && j.metadata.namespace.as_deref() == Some(r.namespace.as_str())
            })
        });
        named.or_else(|| self.own_jobs.first())
    }
}

/// Reads the parts of a snapshot every backup shares (everything but the
/// EtcdBackups) and builds the [`Cluster`] over `backups`.
///
/// # Errors
///
/// [`ReconcileError::Internal`] when the settings, time or a related
/// object are not what the manifest promises.
fn cluster_of(snapshot: &Snapshot, backups: Vec<EtcdBackup>) -> Result<Cluster, ReconcileError> {
    let settings = Settings::of(&snapshot.settings)?;
    let ns = settings.target_namespace.clone();
    Ok(Cluster::new(
        settings,
        snapshot.now()?.0,
        backups,
        related_in(snapshot, READ_BACKUP_JOBS, &ns)?,
        related_in(snapshot, READ_RUNS, &ns)?,
        related_in(snapshot, READ_PVCS, &ns)?,
        related_in(snapshot, READ_BACKUP_PODS, &ns)?,
    ))
}

/// The objects of read `read` in namespace `ns`, deserialized (objects of
/// other namespaces are skipped before they are parsed).
fn related_in<T: DeserializeOwned>(
    snapshot: &Snapshot,
    read: &str,
    ns: &str,
) -> Result<Vec<T>, ReconcileError> {
    snapshot
        .related(read)
        .filter(|o| o.pointer("/metadata/namespace").and_then(|n| n.as_str()) == Some(ns))
        .map(|o| {
            T::deserialize(o)
                .map_err(|e| ReconcileError::internal(format!("related `{read}` object: {e}")))
        })
        .collect()
}

/// The backup holding the slot and its Job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Running {
    /// Name of the EtcdBackup (or of the Job when its owner is unknown).
    pub backup: String,
    /// Name of the Job.
    pub job: String,
    /// The Job is being deleted, or is gone.
    pub deleting: bool,
    /// The Pod that holds the slot when its Job no longer does.
    pub pod: Option<String>,
    /// When the holder stops holding if nothing else changes: a Pod being
    /// deleted counts as lost, a started backup's missing Job is declared
    /// lost.
    pub until: Option<Timestamp>,
}

/// Whether the Jobs that requested a backup are seen (see
/// [`Cluster::requester`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Requester<'b> {
    /// Not requested by a Job, or one of its requesting Jobs is seen.
    Seen,
    /// None is seen, and the backup is younger than the grace.
    Unconfirmed { name: &'b str, wait: Duration },
    /// None is seen, and the backup is older than the grace.
    Gone { name: &'b str, uid: &'b str },
}

/// The controller ownerReference of an object.
fn controller_of(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
}

/// How a Job ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finish {
    /// `Complete=True`.
    Completed,
    /// `Failed=True`, with the condition's reason and message.
    Failed(String),
}

/// How `job` ended, or `None` while it runs.
///
/// `FailureTarget` counts as failed: since Kubernetes 1.31 the Job
/// controller sets it at once (deadline exceeded, backoff limit reached)
/// and adds `Failed` only once every Pod has terminated, which a Pod on a
/// node that stopped answering never does.
pub fn finish(job: &Job) -> Option<Finish> {
    let conditions = job.status.as_ref()?.conditions.as_ref()?;
    let true_condition = |type_: &str| {
        conditions
            .iter()
            .find(|c| c.type_ == type_ && c.status == "True")
    };
    if true_condition("Complete").is_some() {
        return Some(Finish::Completed);
    }
    true_condition("Failed")
        .or_else(|| true_condition("FailureTarget"))
        .map(|c| {
            let reason = c.reason.clone().unwrap_or_default();
            let message = c.message.clone().unwrap_or_default();
            Finish::Failed(match (reason.is_empty(), message.is_empty()) {
                (true, true) => "Failed".to_owned(),
                (false, true) => reason,
                (true, false) => message,
                (false, false) => format!("{reason}: {message}"),
            })
        })
}

/// What the primary does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Finished earlier: nothing to run.
    Finished,
    /// Its Job runs.
    Running {
        /// The Job.
        job: JobRef,
        /// Where the backup goes.
        path: String,
        /// Its Pod is unschedulable: the time left before the scheduling
        /// timeout.
        recheck: Option<Duration>,
    },
    /// Its Job's Pod stayed unschedulable past `schedulingTimeoutSeconds`:
    /// fail the backup and delete the Job.
    Unschedulable {
        /// The Job.
        job: JobRef,
        /// Its delete (uid and resourceVersion as seen).
        delete: DeleteOp,
        /// The Pod.
        pod: String,
        /// How long it has been unschedulable, in seconds.
        waited: u64,
        /// The scheduler's message.
        why: String,
    },
    /// Requested by Jobs the snapshot does not show (yet): not queued
    /// until they are seen, deleted if they are not within the grace.
    AwaitRequester {
        /// Name of the requesting Job.
        requester: String,
        /// Time left.
        wait: Duration,
    },
    /// Its Job ended.
    Ended {
        /// The Job.
        job: JobRef,
        /// How.
        finish: Finish,
        /// Where the backup went.
        path: String,
    },
    /// Started, but its Job is not in the snapshot: wait this long for it.
    AwaitJob {
        /// The Job the status names.
        job: JobRef,
        /// Remaining grace.
        wait: Duration,
    },
    /// Started, and its Job has been missing for longer than the grace.
    JobLost {
        /// The Job the status names.
        job: JobRef,
    },
    /// The Job that requested it is gone: delete it.
    DeleteOrphan {
        /// Name of the requesting Job.
        requester: String,
        /// Its uid.
        requester_uid: String,
    },
    /// Waits for its turn.
    Queued {
        /// The backup holding the slot, if one does.
        running: Option<Running>,
        /// The backup that starts next, when the slot is free.
        next: Option<String>,
        /// Backups ahead of it in the queue.
        ahead: usize,
    },
    /// Its turn, but `spec.pvcName` is empty.
    NoPvcName,
    /// Its turn, but the PVC does not exist.
    PvcMissing,
    /// Its turn: create the Job.
    Start,
}

/// Decides the primary's next step.
pub fn next_step(world: &World) -> Step {
    let backup = world.backup;
    let cluster = world.cluster;
    match cluster.requester(backup) {
        Requester::Seen => {}
        Requester::Gone { name, uid } => {
            return Step::DeleteOrphan {
                requester: name.to_owned(),
                requester_uid: uid.to_owned(),
            };
        }
        // Not started yet: it waits for its run to show up. Started or
        // finished: it goes on as usual, and is looked at again when the
        // grace is up ([`planned`]).
        Requester::Unconfirmed { name, wait }
            if !backup.finished() && backup.backup_job.is_none() && world.own_jobs.is_empty() =>
        {
            return Step::AwaitRequester {
                requester: name.to_owned(),
                wait,
            };
        }
        Requester::Unconfirmed { .. } => {}
    }
    if backup.finished() {
        return Step::Finished;
    }
    if let Some(job) = world.own_job() {
        let job_ref = JobRef {
            namespace: job.metadata.namespace.clone().unwrap_or_default(),
            name: job.metadata.name.clone().unwrap_or_default(),
        };
        let path = job_backup_path(job).unwrap_or_default().to_owned();
        return match finish(job) {
            None => match unschedulable(cluster, job) {
                Some((pod, waited, why)) => {
                    let timeout = u64::from(cluster.settings.scheduling_timeout_seconds);
                    if waited >= timeout {
                        Step::Unschedulable {
                            delete: DeleteOp {
                                target: ObjectRef {
                                    api_version: "batch/v1".to_owned(),
                                    kind: "Job".to_owned(),
                                    namespace: job_ref.namespace.clone(),
                                    name: job_ref.name.clone(),
                                },
                                uid: job.metadata.uid.clone().unwrap_or_default(),
                                resource_version: job
                                    .metadata
                                    .resource_version
                                    .clone()
                                    .unwrap_or_default(),
                            },
                            job: job_ref,
                            pod,
                            waited,
                            why,
                        }
                    } else {
                        Step::Running {
                            job: job_ref,
                            path,
                            recheck: Some(Duration::from_secs(timeout - waited)),
                        }
                    }
                }
                None => Step::Running {
                    job: job_ref,
                    path,
                    recheck: None,
                },
            },
            Some(finish) => Step::Ended {
                job: job_ref,
                finish,
                path,
            },
        };
    }
    if let Some(job) = &backup.backup_job {
        let since = cluster.pending_since(backup);
        let waited = cluster.now.duration_since(since);
        let waited = Duration::try_from(waited).unwrap_or_default();
        return match MISSING_JOB_GRACE.checked_sub(waited) {
            Some(wait) if !wait.is_zero() => Step::AwaitJob {
                job: job.clone(),
                wait,
            },
            _ => Step::JobLost { job: job.clone() },
        };
    }
    let ahead = cluster
        .queue_pos
        .get(backup.uid())
        .copied()
        .unwrap_or(cluster.queue_pos.len());
    let running = cluster.running().cloned();
    if running.is_some() || ahead > 0 {
        let next = cluster.queue_head.clone();
        return Step::Queued {
            next: if running.is_none() { next } else { None },
            running,
            ahead,
        };
    }
    if backup.pvc_name.is_empty() {
        return Step::NoPvcName;
    }
    let pvc_exists = cluster
        .pvcs
        .iter()
        .any(|p| p.metadata.name.as_deref() == Some(backup.pvc_name.as_str()));
    if !pvc_exists {
        return Step::PvcMissing;
    }
    Step::Start
}

/// The longest-unschedulable Pod of `job` (PodScheduled False, not being
/// deleted): its name, for how many whole seconds, and the scheduler's
/// message.
fn unschedulable(cluster: &Cluster, job: &Job) -> Option<(String, u64, String)> {
    let uid = job.metadata.uid.as_deref()?;
    cluster
        .pods
        .iter()
        .filter(|p| controller_of(&p.metadata).is_some_and(|o| o.uid == uid))
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| {
            let c = p
                .status
                .as_ref()?
                .conditions
                .as_ref()?
                .iter()
                .find(|c| c.type_ == "PodScheduled" && c.status == "False")?;
            let since = c
                .last_transition_time
                .as_ref()
                .or(p.metadata.creation_timestamp.as_ref())
                .map_or(cluster.now, |t| t.0);
            let waited = Duration::try_from(cluster.now.duration_since(since))
                .unwrap_or_default()
                .as_secs();
            let why = c
                .message
                .clone()
                .or_else(|| c.reason.clone())
                .unwrap_or_default();
            Some((p.metadata.name.clone().unwrap_or_default(), waited, why))
        })
        .max_by(|a, b| a.1.cmp(&b.1).then_with(|| b.0.cmp(&a.0)))
}

/// The EtcdBackup controller's reconcile.
///
/// The controller is kind-scoped: the host hands it every EtcdBackup at
/// once ([`reconcile_kind`]). A per-object snapshot (one EtcdBackup as the
/// primary, every EtcdBackup under the `etcdbackups` read) is still
/// answered the same way for that one backup ([`reconcile_one`]): it is
/// the shape this controller had before, kept for the unit tests and as
/// the baseline of the kind benchmark.
///
/// # Errors
///
/// As [`reconcile_kind`] and [`reconcile_one`].
pub fn reconcile(snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
    if snapshot.is_kind() {
        reconcile_kind(snapshot)
    } else {
        reconcile_one(snapshot)
    }
}

/// One call over every EtcdBackup: the queue and the slot are computed
/// once, then each backup's step; one object plan per backup.
///
/// An EtcdBackup that does not parse gets an object plan with only a
/// Warning Event (`InvalidSpec`) and is left out of the queue; the others
/// are planned as usual.
///
/// # Errors
///
/// [`ReconcileError::Internal`] when the settings, time or a related object
/// are not what the manifest promises.
pub fn reconcile_kind(snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
    let mut plan = Plan::new();
    let mut parsed: Vec<&serde_json::Value> = Vec::new();
    let mut backups = Vec::new();
    for item in snapshot.primaries() {
        match EtcdBackup::from_value(item) {
            Ok(b) => {
                parsed.push(item);
                backups.push(b);
            }
            Err(e) => {
                let name = item
                    .pointer("/metadata/name")
                    .and_then(serde_json::Value::as_str)
                    .unwrap_or_default();
                plan = plan.object(
                    item,
                    Plan::new().warning("InvalidSpec", format!("EtcdBackup {name}: {e}")),
                );
            }
        }
    }
    let cluster = cluster_of(snapshot, backups)?;
    // Each backup's own Jobs, grouped once by their controller's uid.
    let mut own_jobs: HashMap<&str, Vec<Job>> = HashMap::new();
    for o in snapshot.owned.iter().filter(|o| {
        o.get("apiVersion").and_then(serde_json::Value::as_str) == Some("batch/v1")
            && o.get("kind").and_then(serde_json::Value::as_str) == Some("Job")
    }) {
        let job =
            Job::deserialize(o).map_err(|e| ReconcileError::internal(format!("owned Job: {e}")))?;
        let owner = o
            .pointer("/metadata/ownerReferences")
            .and_then(serde_json::Value::as_array)
            .and_then(|refs| {
                refs.iter().find(|r| {
                    r.get("controller").and_then(serde_json::Value::as_bool) == Some(true)
                })
            })
            .and_then(|r| r.get("uid"))
            .and_then(serde_json::Value::as_str);
        if let Some(uid) = owner {
            own_jobs.entry(uid).or_default().push(job);
        }
    }
    for (item, backup) in parsed.into_iter().zip(cluster.backups.iter()) {
        if backup.deleting() {
            plan = plan.object(item, Plan::new());
            continue;
        }
        let world = World {
            cluster: &cluster,
            backup,
            own_jobs: own_jobs.remove(backup.uid()).unwrap_or_default(),
        };
        plan = plan.object(item, planned(&world));
    }
    Ok(plan)
}

/// The reconcile of one EtcdBackup from a per-object snapshot (see
/// [`reconcile`]).
///
/// # Errors
///
/// [`ReconcileError::InvalidSpec`] when the primary is not an
/// EtcdBackup; [`ReconcileError::Internal`] when the settings, time or
/// a related object are not what the manifest promises.
pub fn reconcile_one(snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
    if snapshot.deleting {
        return Ok(Plan::new());
    }
    let backup = EtcdBackup::from_value(&snapshot.primary).map_err(|e| {
        ReconcileError::invalid_spec(format!("EtcdBackup {}: {e}", snapshot.primary_name()))
    })?;
    let mut backups = vec![backup];
    for o in snapshot.related(READ_ETCD_BACKUPS) {
        let b = EtcdBackup::from_value(o)
            .map_err(|e| ReconcileError::internal(format!("related EtcdBackup: {e}")))?;
        if b.uid() != backups[0].uid() {
            backups.push(b);
        }
    }
    let cluster = cluster_of(snapshot, backups)?;
    let world = World {
        cluster: &cluster,
        backup: &cluster.backups[0],
        own_jobs: snapshot.owned_of_kind::<Job>()?,
    };
    Ok(planned(&world))
}

/// The plan of the backup of `world`: the plan of its next step, looked
/// at again when the grace for its requesting Job is up, if it is running.
fn planned(world: &World) -> Plan {
    let mut plan = plan(world, &next_step(world));
    if let Requester::Unconfirmed { wait, .. } = world.cluster.requester(world.backup)
        && plan
            .delete
            .iter()
            .all(|d| d.target.kind != etcd_backup_kind().kind)
    {
        let wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
        let sooner = plan.requeue_after_ms.map_or(wait_ms, |ms| ms.min(wait_ms));
        plan.requeue_after_ms = Some(sooner);
    }
    plan
}

/// The plan that carries out `step`.
pub fn plan(world: &World, step: &Step) -> Plan {
    let backup = world.backup;
    let cluster = world.cluster;
    let ns = &cluster.settings.target_namespace;
    let now = Time(cluster.now);
    let generation = backup.metadata.generation;
    let mut status = Status {
        conditions: backup.conditions.clone(),
        backup_job: backup.backup_job.clone(),
        generation,
        now: now.clone(),
    };
    let mut plan = Plan::new();
    match step {
        Step::Finished => {}
        Step::Running { job, path, recheck } => {
            status.backup_job = Some(job.clone());
            status.progress(
                BACKUP_PENDING,
                BACKUP_PENDING,
                &format!(
                    "Job {}/{} is saving the backup to {path} on PVC {}",
                    job.namespace, job.name, backup.pvc_name
                ),
            );
            if let Some(after) = recheck {
                plan = plan.requeue_after(*after);
            }
        }
        Step::Unschedulable {
            job,
            delete,
            pod,
            waited,
            why,
        } => {
            status.backup_job = Some(job.clone());
            let message = format!(
                "Pod {ns}/{pod} of Job {}/{} could not be scheduled for {waited}s (schedulingTimeoutSeconds: {}): {why}; the Job is deleted",
                job.namespace, job.name, cluster.settings.scheduling_timeout_seconds
            );
            status.progress(BACKUP_FAILED, REASON_UNSCHEDULABLE, &message);
            plan = plan.delete(delete.clone()).warning(BACKUP_FAILED, message);
        }
        Step::AwaitRequester { requester, wait } => {
            let message = format!(
                "Job {ns}/{requester}, which requested this backup, is not seen yet: the backup waits for it to show up before it is queued, and is deleted if it does not within orphanGraceSeconds ({})",
                cluster.settings.orphan_grace_seconds
            );
            status.progress(BACKUP_PENDING, REASON_AWAIT_REQUESTER, &message);
            plan = plan.requeue_after(*wait);
        }
        Step::Ended { job, finish, path } => {
            status.backup_job = Some(job.clone());
            let (type_, message) = match finish {
                Finish::Completed => (
                    BACKUP_COMPLETED,
                    format!(
                        "Job {}/{} completed: the backup is saved to {path} on PVC {}",
                        job.namespace, job.name, backup.pvc_name
                    ),
                ),
                Finish::Failed(why) => (
                    BACKUP_FAILED,
                    format!("Job {}/{} failed: {why}", job.namespace, job.name),
                ),
            };
            status.progress(type_, type_, &message);
            plan = if type_ == BACKUP_COMPLETED {
                plan.event(BACKUP_COMPLETED, message)
            } else {
                plan.warning(BACKUP_FAILED, message)
            };
        }
        Step::AwaitJob { job, wait } => {
            // The grace runs from BackupPending's transition; make sure
            // there is one to measure from.
            if !is_true(&status.conditions, BACKUP_PENDING) {
                status.progress(
                    BACKUP_PENDING,
                    BACKUP_PENDING,
                    &format!("waiting for Job {}/{} to show up", job.namespace, job.name),
                );
            }
            plan = plan.requeue_after(*wait);
        }
        Step::JobLost { job } => {
            let message = format!(
                "Job {}/{} no longer exists and never reported an end; the backup may be incomplete",
                job.namespace, job.name
            );
            status.progress(BACKUP_FAILED, BACKUP_FAILED, &message);
            plan = plan.warning(BACKUP_FAILED, message);
        }
        Step::DeleteOrphan {
            requester,
            requester_uid,
        } => {
            // No status: the host writes none for a primary it deletes.
            return Plan::new().delete(delete_of(backup)).event(
                REASON_ORPHAN_DELETED,
                format!(
                    "deleting EtcdBackup {}: Job {ns}/{requester} (uid {requester_uid}), which requested it, no longer exists",
                    backup.name()
                ),
            );
        }
        Step::Queued {
            running,
            next,
            ahead,
        } => {
            let head = match (running, next) {
                (Some(r), _) => match &r.pod {
                    Some(pod) => format!(
                        "waiting for backup {} (Job {ns}/{}{}): its Pod {ns}/{pod} has not stopped",
                        r.backup,
                        r.job,
                        if r.deleting { ", being deleted" } else { "" }
                    ),
                    None => format!(
                        "waiting for backup {} (Job {ns}/{}{}) to finish",
                        r.backup,
                        r.job,
                        if r.deleting { ", being deleted" } else { "" }
                    ),
                },
                (None, Some(next)) => format!("waiting for backup {next} to start first"),
                (None, None) => "waiting for its turn".to_owned(),
            };
            let message = format!("{head}; {ahead} queued ahead of this one");
            status.progress(BACKUP_PENDING, REASON_QUEUED, &message);
            if let Some(until) = running.as_ref().and_then(|r| r.until) {
                let wait =
                    Duration::try_from(until.duration_since(cluster.now)).unwrap_or_default();
                plan = plan.requeue_after(wait.max(Duration::from_secs(1)));
            }
        }
        Step::NoPvcName => {
            let message = format!(
                "spec.pvcName is empty: name a PersistentVolumeClaim in namespace {ns} to save the backup to"
            );
            status.progress(BACKUP_FAILED, BACKUP_FAILED, &message);
            plan = plan.warning(BACKUP_FAILED, message);
        }
        Step::PvcMissing => {
            let message = format!("unable to find PVC [{}] in namespace {ns}", backup.pvc_name);
            status.progress(BACKUP_FAILED, BACKUP_FAILED, &message);
            plan = plan.warning(BACKUP_FAILED, message);
        }
        Step::Start => {
            let path = backup_path(backup, &cluster.now);
            let job = backup_job(&cluster.settings, backup, &path);
            let name = backup_job_name(backup.uid());
            let message = format!(
                "Job {ns}/{name} is saving the backup to {path} on PVC {}",
                backup.pvc_name
            );
            status.backup_job = Some(JobRef {
                namespace: ns.clone(),
                name: name.clone(),
            });
            // The time the Job started is when BackupPending last moved, even
            // after queueing: the grace for a Job missing from the snapshot
            // is measured from it.
            status.conditions.retain(|c| c.type_ != BACKUP_PENDING);
            status.progress(BACKUP_PENDING, BACKUP_PENDING, &message);
            plan = plan.apply_if_absent(job).event("BackupStarted", message);
        }
    }
    plan.status(status.to_json())
}

/// Reason of the Event recorded when an orphaned EtcdBackup is deleted.
pub const REASON_ORPHAN_DELETED: &str = "RequestingJobDeleted";
/// Reason of `BackupFailed` when the backup's Pod could not be scheduled
/// within `schedulingTimeoutSeconds`.
pub const REASON_UNSCHEDULABLE: &str = "PodUnschedulable";
/// Reason of `BackupPending` while the Job that requested the backup is
/// not seen yet.
pub const REASON_AWAIT_REQUESTER: &str = "AwaitingRequestingJob";

/// The delete of `backup` itself, preconditioned on the uid and
/// resourceVersion the snapshot showed.
fn delete_of(backup: &EtcdBackup) -> DeleteOp {
    DeleteOp {
        target: ObjectRef {
            api_version: etcd_backup_kind().api_version(),
            kind: etcd_backup_kind().kind,
            namespace: String::new(),
            name: backup.name().to_owned(),
        },
        uid: backup.uid().to_owned(),
        resource_version: backup.metadata.resource_version.clone().unwrap_or_default(),
    }
}

/// The status being written.
struct Status {
    conditions: Vec<Condition>,
    backup_job: Option<JobRef>,
    generation: Option<i64>,
    now: Time,
}

impl Status {
    /// Sets progress condition `type_` True and every other progress
    /// condition present False (upstream keeps one True at a time).
    fn progress(&mut self, type_: &str, reason: &str, message: &str) {
        for other in PROGRESS_CONDITIONS.iter().filter(|t| **t != type_) {
            if let Some(c) = find_condition(&self.conditions, other).cloned() {
                set_condition(
                    &mut self.conditions,
                    other,
                    false,
                    &c.reason,
                    &c.message,
                    c.observed_generation,
                    &self.now,
                );
            }
        }
        set_condition(
            &mut self.conditions,
            type_,
            true,
            reason,
            message,
            self.generation,
            &self.now,
        );
    }

    fn to_json(&self) -> serde_json::Value {
        let mut status = json!({"conditions": self.conditions});
        if let Some(job) = &self.backup_job {
            status["backupJob"] = json!(job);
        }
        status
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};
    use wasmop_sdk::testing::{SnapshotBuilder, run};
    use wasmop_sdk::{Plan, Precondition};

    use super::*;
    use crate::BackupPlugin;
    use crate::api::BACKUP_SKIPPED;

    const NS: &str = "openshift-etcd";
    const NOW: &str = "2025-01-01T00:10:00Z";

    fn eb(name: &str, created: &str) -> Value {
        json!({"apiVersion": "operator.openshift.io/v1alpha1", "kind": "EtcdBackup",
               "metadata": {"name": name, "uid": format!("uid-{name}"), "generation": 1,
                            "resourceVersion": "1", "creationTimestamp": created},
               "spec": {"pvcName": "backup-pvc"}})
    }

    fn with_condition(mut b: Value, type_: &str, reason: &str, at: &str) -> Value {
        b["status"]["conditions"] = json!([{"type": type_, "status": "True", "reason": reason,
                                             "message": "earlier", "lastTransitionTime": at}]);
        b
    }

    fn started(b: Value, at: &str) -> Value {
        let uid = b["metadata"]["uid"].as_str().unwrap().to_owned();
        let mut b = with_condition(b, BACKUP_PENDING, BACKUP_PENDING, at);
        b["status"]["backupJob"] = json!({"namespace": NS, "name": backup_job_name(&uid)});
        b
    }

    fn job_of(b: &Value, ns: &str, end: Option<&str>) -> Value {
        let uid = b["metadata"]["uid"].as_str().unwrap();
        let name = b["metadata"]["name"].as_str().unwrap();
        let mut job = json!({"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": backup_job_name(uid), "namespace": ns, "uid": format!("job-{uid}"),
                         "resourceVersion": "3",
                         "labels": {"app": "cluster-backup-job", "backup-name": name},
                         "ownerReferences": [{"apiVersion": "operator.openshift.io/v1alpha1", "kind": "EtcdBackup",
                                              "name": name, "uid": uid, "controller": true}]},
            "spec": {"template": {"spec": {"containers": [{"name": "cluster-backup",
                "env": [{"name": "CLUSTER_BACKUP_PATH", "value": format!("/etc/kubernetes/cluster-backup/backup-{name}-x")}]}]}}},
            "status": {}});
        if let Some(end) = end {
            job["status"]["conditions"] = json!([{"type": end, "status": "True",
                "reason": if end == "Failed" { "BackoffLimitExceeded" } else { "" },
                "message": if end == "Failed" { "Job has reached the specified backoff limit" } else { "" }}]);
        }
        job
    }

    fn pvc(name: &str, ns: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
               "metadata": {"name": name, "namespace": ns, "uid": format!("pvc-{name}")}})
    }

    /// A snapshot of `primary` among `all` EtcdBackups (the primary among
    /// them, as the host's cluster-wide read returns it), with `jobs` (the
    /// primary's own go to `owned` too) and the PVC `backup-pvc`.
    fn snapshot(primary: &Value, all: &[&Value], jobs: &[Value]) -> SnapshotBuilder {
        let uid = primary["metadata"]["uid"].as_str().unwrap();
        let mut s = SnapshotBuilder::new(ETCD_BACKUP_CONTROLLER_NAME)
            .primary(primary)
            .now(NOW)
            .related(READ_PVCS, pvc("backup-pvc", NS));
        for b in all {
            s = s.related(READ_ETCD_BACKUPS, b);
        }
        for j in jobs {
            if j["metadata"]["ownerReferences"][0]["uid"] == uid {
                s = s.owned(j);
            }
            s = s.related(READ_BACKUP_JOBS, j);
        }
        s
    }

    const ETCD_BACKUP_CONTROLLER_NAME: &str = crate::ETCD_BACKUP_CONTROLLER;

    fn plan_of(s: SnapshotBuilder) -> Plan {
        run::<BackupPlugin>(&s.build()).expect("reconcile")
    }

    fn condition<'a>(plan: &'a Plan, type_: &str) -> &'a Value {
        plan.status.as_ref().expect("status")["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == type_)
            .unwrap_or_else(|| panic!("no {type_} condition in {:?}", plan.status))
    }

    #[test]
    fn oldest_of_three_new_backups_starts_and_the_others_queue_in_creation_order() {
        let a = eb("a", "2025-01-01T00:00:01Z");
        let b = eb("b", "2025-01-01T00:00:02Z");
        let c = eb("c", "2025-01-01T00:00:03Z");
        let all = [&c, &a, &b];

        let plan = plan_of(snapshot(&a, &all, &[]));
        assert_eq!(plan.apply.len(), 1);
        assert_eq!(plan.apply[0].precondition, Some(Precondition::Absent));
        let job = &plan.apply[0].object;
        assert_eq!(job["kind"], "Job");
        assert_eq!(job["metadata"]["namespace"], NS);
        assert_eq!(job["metadata"]["name"], backup_job_name("uid-a"));
        let status = plan.status.as_ref().unwrap();
        assert_eq!(
            status["backupJob"],
            json!({"namespace": NS, "name": backup_job_name("uid-a")})
        );
        let pending = condition(&plan, BACKUP_PENDING);
        assert_eq!(pending["status"], "True");
        assert_eq!(pending["reason"], BACKUP_PENDING);
        assert_eq!(pending["lastTransitionTime"], NOW);

        for (who, ahead) in [(&b, 1), (&c, 2)] {
            let plan = plan_of(snapshot(who, &all, &[]));
            assert!(plan.apply.is_empty(), "{who} must wait");
            assert!(plan.status.as_ref().unwrap().get("backupJob").is_none());
            let pending = condition(&plan, BACKUP_PENDING);
            assert_eq!(pending["status"], "True");
            assert_eq!(pending["reason"], REASON_QUEUED);
            assert_eq!(
                pending["message"],
                format!("waiting for backup a to start first; {ahead} queued ahead of this one")
            );
        }
    }

    #[test]
    fn equal_creation_times_queue_by_name() {
        let x = eb("x", "2025-01-01T00:00:00Z");
        let y = eb("y", "2025-01-01T00:00:00Z");
        assert_eq!(plan_of(snapshot(&x, &[&y, &x], &[])).apply.len(), 1);
        assert!(plan_of(snapshot(&y, &[&y, &x], &[])).apply.is_empty());
    }

    #[test]
    fn an_unfinished_backup_job_blocks_every_other_backup_and_is_named() {
        let a = started(eb("a", "2025-01-01T00:00:01Z"), "2025-01-01T00:05:00Z");
        let b = eb("b", "2025-01-01T00:00:02Z");
        let jobs = [job_of(&a, NS, None)];

        let plan = plan_of(snapshot(&b, &[&a, &b], &jobs));
        assert!(plan.apply.is_empty());
        assert_eq!(
            condition(&plan, BACKUP_PENDING)["message"],
            format!(
                "waiting for backup a (Job {NS}/{}) to finish; 0 queued ahead of this one",
                backup_job_name("uid-a")
            )
        );

        // The running one keeps BackupPending with its Job.
        let plan = plan_of(snapshot(&a, &[&a, &b], &jobs));
        assert!(plan.apply.is_empty());
        let pending = condition(&plan, BACKUP_PENDING);
        assert_eq!(pending["reason"], BACKUP_PENDING);
        assert_eq!(pending["lastTransitionTime"], "2025-01-01T00:05:00Z");
        assert!(
            pending["message"]
                .as_str()
                .unwrap()
                .contains("/etc/kubernetes/cluster-backup/backup-a-x")
        );
    }

    #[test]
    fn a_job_of_another_tool_in_the_target_namespace_also_blocks() {
        let b = eb("b", "2025-01-01T00:00:02Z");
        let foreign = json!({"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "manual-backup", "namespace": NS, "uid": "j",
                         "labels": {"app": "cluster-backup-job", "backup-name": "by-hand"}},
            "spec": {"template": {"spec": {"containers": []}}}});
        let plan = plan_of(snapshot(&b, &[&b], &[foreign]));
        assert!(plan.apply.is_empty());
        assert!(
            condition(&plan, BACKUP_PENDING)["message"]
                .as_str()
                .unwrap()
                .starts_with("waiting for backup by-hand (Job openshift-etcd/manual-backup)")
        );
    }

    #[test]
    fn a_started_backup_whose_job_the_snapshot_lacks_still_blocks() {
        // a's status names its Job but the Job has not come through the watch.
        let a = started(eb("a", "2025-01-01T00:00:01Z"), "2025-01-01T00:09:59Z");
        let b = eb("b", "2025-01-01T00:00:02Z");
        let plan = plan_of(snapshot(&b, &[&a, &b], &[]));
        assert!(plan.apply.is_empty(), "b must not start next to a");
        assert!(
            condition(&plan, BACKUP_PENDING)["message"]
                .as_str()
                .unwrap()
                .starts_with("waiting for backup a ")
        );
        // b looks again when a's Job is declared lost (a minute after a
        // started): a's status write alone would not wake the queue.
        assert_eq!(plan.requeue_after_ms, Some(59_000));
    }

    #[test]
    fn a_completed_job_completes_its_backup_and_flips_pending_false() {
        let a = started(eb("a", "2025-01-01T00:00:01Z"), "2025-01-01T00:05:00Z");
        let plan = plan_of(snapshot(&a, &[&a], &[job_of(&a, NS, Some("Complete"))]));
        assert!(plan.apply.is_empty() && plan.delete.is_empty());
        let done = condition(&plan, BACKUP_COMPLETED);
        assert_eq!(done["status"], "True");
        assert_eq!(done["reason"], BACKUP_COMPLETED);
        assert!(
            done["message"]
                .as_str()
                .unwrap()
                .contains("saved to /etc/kubernetes/cluster-backup/backup-a-x on PVC backup-pvc")
        );
        let pending = condition(&plan, BACKUP_PENDING);
        assert_eq!(pending["status"], "False");
        assert_eq!(pending["lastTransitionTime"], NOW);
        assert_eq!(
            plan.status.as_ref().unwrap()["backupJob"]["name"],
            backup_job_name("uid-a")
        );
        assert_eq!(plan.events[0].reason, BACKUP_COMPLETED);
    }

    #[test]
    fn the_next_backup_starts_once_the_running_job_completed() {
        let a = started(eb("a", "2025-01-01T00:00:01Z"), "2025-01-01T00:05:00Z");
        let b = eb("b", "2025-01-01T00:00:02Z");
        let c = eb("c", "2025-01-01T00:00:03Z");
        let jobs = [job_of(&a, NS, Some("Complete"))];
        let plan = plan_of(snapshot(&b, &[&a, &b, &c], &jobs));
        assert_eq!(plan.apply.len(), 1);
        assert_eq!(
            plan.apply[0].object["metadata"]["name"],
            backup_job_name("uid-b")
        );
        assert!(plan_of(snapshot(&c, &[&a, &b, &c], &jobs)).apply.is_empty());
    }

    #[test]
    fn a_failed_job_fails_its_backup_with_the_jobs_reason() {
        let a = started(eb("a", "2025-01-01T00:00:01Z"), "2025-01-01T00:05:00Z");
        let plan = plan_of(snapshot(&a, &[&a], &[job_of(&a, NS, Some("Failed"))]));
        let failed = condition(&plan, BACKUP_FAILED);
        assert_eq!(failed["status"], "True");
        assert_eq!(
            failed["message"],
            format!(
                "Job {NS}/{} failed: BackoffLimitExceeded: Job has reached the specified backoff limit",
                backup_job_name("uid-a")
            )
        );
        assert_eq!(condition(&plan, BACKUP_PENDING)["status"], "False");
        assert_eq!(plan.events[0].reason, BACKUP_FAILED);
    }

    #[test]
    fn a_missing_pvc_fails_the_backup_naming_it() {
        let mut a = eb("a", "2025-01-01T00:00:01Z");
        a["spec"]["pvcName"] = json!("nowhere");
        let plan = plan_of(snapshot(&a, &[&a], &[]));
        assert!(plan.apply.is_empty());
        let failed = condition(&plan, BACKUP_FAILED);
        assert_eq!(failed["status"], "True");
        assert_eq!(
            failed["message"],
            "unable to find PVC [nowhere] in namespace openshift-etcd"
        );
        assert!(plan.status.as_ref().unwrap().get("backupJob").is_none());
    }

    #[test]
    fn a_pvc_of_the_same_name_in_another_namespace_does_not_count() {
        let a = eb("a", "2025-01-01T00:00:01Z");
        let s = SnapshotBuilder::new(crate::ETCD_BACKUP_CONTROLLER)
            .primary(&a)
            .related(READ_ETCD_BACKUPS, &a)
            .related(READ_PVCS, pvc("backup-pvc", "elsewhere"))
            .now(NOW);
        let plan = plan_of(s);
        assert_eq!(condition(&plan, BACKUP_FAILED)["status"], "True");
    }

    #[test]
    fn an_empty_pvc_name_fails_the_backup() {
        let mut a = eb("a", "2025-01-01T00:00:01Z");
        a["spec"] = json!({});
        let plan = plan_of(snapshot(&a, &[&a], &[]));
        assert!(plan.apply.is_empty());
        assert!(
            condition(&plan, BACKUP_FAILED)["message"]
                .as_str()
                .unwrap()
                .starts_with("spec.pvcName is empty")
        );
    }

    #[test]
    fn a_finished_backup_is_never_run_again() {
        for (type_, reason) in [
            (BACKUP_COMPLETED, BACKUP_COMPLETED),
            (BACKUP_FAILED, BACKUP_FAILED),
            (BACKUP_SKIPPED, BACKUP_SKIPPED),
        ] {
            let a = with_condition(eb("a", "2025-01-01T00:00:01Z"), type_, reason, NOW);
            let plan = plan_of(snapshot(&a, &[&a], &[]));
            assert!(plan.apply.is_empty(), "{type_}: must not run again");
            assert_eq!(
                plan.status.as_ref().unwrap()["conditions"],
                a["status"]["conditions"],
                "{type_}: status unchanged"
            );
            assert!(plan.events.is_empty());
        }
    }

    #[test]
    fn finished_backups_do_not_hold_up_the_queue() {
        let a = with_condition(
            eb("a", "2025-01-01T00:00:01Z"),
            BACKUP_FAILED,
            BACKUP_FAILED,
            NOW,
        );
        let b = eb("b", "2025-01-01T00:00:02Z");
        assert_eq!(plan_of(snapshot(&b, &[&a, &b], &[])).apply.len(), 1);
    }

    #[test]
    fn a_job_missing_from_the_snapshot_is_awaited_then_declared_lost() {
        // Started 30 s ago, Job not seen: wait the rest of the grace.
        let a = started(eb("a", "2025-01-01T00:00:01Z"), "2025-01-01T00:09:30Z");
        let plan = plan_of(snapshot(&a, &[&a], &[]));
        assert!(plan.apply.is_empty());
        assert_eq!(plan.requeue_after_ms, Some(30_000));
        assert_eq!(condition(&plan, BACKUP_PENDING)["status"], "True");

        // Started 5 minutes ago, still not seen: the Job is gone.
        let a = started(eb("a", "2025-01-01T00:00:01Z"), "2025-01-01T00:05:00Z");
        let plan = plan_of(snapshot(&a, &[&a], &[]));
        assert!(plan.apply.is_empty());
        assert_eq!(condition(&plan, BACKUP_FAILED)["status"], "True");
        assert!(
            condition(&plan, BACKUP_FAILED)["message"]
                .as_str()
                .unwrap()
                .contains("no longer exists")
        );
    }

    fn requested_by(mut b: Value, job: &str, job_uid: &str) -> Value {
        b["metadata"]["ownerReferences"] =
            json!([{"apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": job_uid}]);
        b
    }

    fn run_job(name: &str, uid: &str) -> Value {
        json!({"apiVersion": "batch/v1", "kind": "Job",
               "metadata": {"name": name, "namespace": NS, "uid": uid,
                            "labels": {"app": "cluster-backup-cronjob"}},
               "spec": {"template": {"spec": {"containers": []}}}})
    }

    #[test]
    fn a_backup_whose_requesting_run_exists_is_queued_like_any_other() {
        let a = requested_by(eb("a", "2025-01-01T00:00:01Z"), "daily-1", "run-uid");
        let s = snapshot(&a, &[&a], &[]).related(READ_RUNS, run_job("daily-1", "run-uid"));
        let plan = plan_of(s);
        assert_eq!(plan.apply.len(), 1);
        assert!(plan.delete.is_empty());
    }

    /// The delete an orphan's plan must hold: the primary with the uid and
    /// resourceVersion the snapshot showed.
    fn delete_of_eb(b: &Value) -> Value {
        json!({"target": {"apiVersion": "operator.openshift.io/v1alpha1", "kind": "EtcdBackup",
                          "namespace": "", "name": b["metadata"]["name"]},
               "uid": b["metadata"]["uid"], "resourceVersion": b["metadata"]["resourceVersion"]})
    }

    #[test]
    fn an_orphan_that_has_not_started_is_deleted_with_preconditions() {
        let a = requested_by(eb("a", "2025-01-01T00:00:01Z"), "daily-1", "gone-uid");
        let s = snapshot(&a, &[&a], &[]).build();
        let plan = run::<BackupPlugin>(&s).expect("reconcile");
        assert!(plan.apply.is_empty());
        assert_eq!(plan.delete.len(), 1);
        assert_eq!(
            serde_json::to_value(&plan.delete[0]).unwrap(),
            delete_of_eb(&a)
        );
        // The same delete the SDK builds for the snapshot's primary.
        assert_eq!(
            plan.delete,
            Plan::new().delete_self(&s).unwrap().delete,
            "delete_of matches Plan::delete_self"
        );
        assert_eq!(plan.status, None, "a deleted primary gets no status");
        assert_eq!(plan.events.len(), 1);
        assert_eq!(plan.events[0].reason, REASON_ORPHAN_DELETED);
        assert_eq!(
            plan.events[0].message,
            "deleting EtcdBackup a: Job openshift-etcd/daily-1 (uid gone-uid), which requested it, no longer exists"
        );
    }

    #[test]
    fn an_orphan_does_not_hold_a_place_in_the_queue() {
        let a = requested_by(eb("a", "2025-01-01T00:00:01Z"), "daily-1", "gone-uid");
        let b = eb("b", "2025-01-01T00:00:02Z");
        assert_eq!(plan_of(snapshot(&b, &[&a, &b], &[])).apply.len(), 1);
    }

    #[test]
    fn finished_and_running_orphans_are_deleted_too() {
        let done = with_condition(
            requested_by(eb("a", "2025-01-01T00:00:01Z"), "daily-1", "gone-uid"),
            BACKUP_COMPLETED,
            BACKUP_COMPLETED,
            "2025-01-01T00:05:00Z",
        );
        let plan = plan_of(snapshot(&done, &[&done], &[]));
        assert!(plan.apply.is_empty());
        assert_eq!(
            serde_json::to_value(&plan.delete).unwrap(),
            json!([delete_of_eb(&done)])
        );

        // Running: the delete garbage-collects its Job, as upstream.
        let running = started(
            requested_by(eb("r", "2025-01-01T00:00:01Z"), "daily-2", "gone-uid"),
            "2025-01-01T00:05:00Z",
        );
        let jobs = [job_of(&running, NS, None)];
        let plan = plan_of(snapshot(&running, &[&running], &jobs));
        assert!(plan.apply.is_empty());
        assert_eq!(
            serde_json::to_value(&plan.delete).unwrap(),
            json!([delete_of_eb(&running)])
        );
    }

    #[test]
    fn an_orphan_being_deleted_plans_nothing() {
        let mut a = requested_by(eb("a", "2025-01-01T00:00:01Z"), "daily-1", "gone-uid");
        a["metadata"]["deletionTimestamp"] = json!("2025-01-01T00:09:00Z");
        assert!(plan_of(snapshot(&a, &[&a], &[]).deleting(true)).is_empty());
    }

    #[test]
    fn objects_outside_the_target_namespace_are_ignored() {
        let a = started(eb("a", "2025-01-01T00:00:01Z"), "2025-01-01T00:05:00Z");
        let b = eb("b", "2025-01-01T00:00:02Z");
        // a's Job in another namespace is not a backup Job of this operator…
        let mut stray = job_of(&a, "other", None);
        stray["metadata"]["ownerReferences"][0]["uid"] = json!("someone-else");
        let s = snapshot(&b, &[&b], &[stray]);
        assert_eq!(plan_of(s).apply.len(), 1);
        // …and a started backup of another target namespace does not block.
        let mut elsewhere = a.clone();
        elsewhere["status"]["backupJob"]["namespace"] = json!("old-target");
        assert_eq!(plan_of(snapshot(&b, &[&elsewhere, &b], &[])).apply.len(), 1);
    }

    #[test]
    fn every_write_goes_to_the_configured_target_namespace() {
        let a = eb("a", "2025-01-01T00:00:01Z");
        let s = SnapshotBuilder::new(crate::ETCD_BACKUP_CONTROLLER)
            .primary(&a)
            .related(READ_ETCD_BACKUPS, &a)
            .related(READ_PVCS, pvc("backup-pvc", "backups"))
            .settings(json!({"targetNamespace": "backups", "image": "tools:1",
                             "nodeSelector": {"type": "kwok"}}))
            .now(NOW);
        let plan = plan_of(s);
        assert_eq!(plan.apply.len(), 1);
        let job = &plan.apply[0].object;
        assert_eq!(job["metadata"]["namespace"], "backups");
        assert_eq!(
            job["spec"]["template"]["spec"]["nodeSelector"],
            json!({"type": "kwok"})
        );
        assert_eq!(
            job["spec"]["template"]["spec"]["containers"][0]["image"],
            "tools:1"
        );
        assert_eq!(
            plan.status.as_ref().unwrap()["backupJob"]["namespace"],
            "backups"
        );
    }

    #[test]
    fn a_backup_being_deleted_leaves_the_queue() {
        let mut a = eb("a", "2025-01-01T00:00:01Z");
        a["metadata"]["deletionTimestamp"] = json!("2025-01-01T00:09:00Z");
        let b = eb("b", "2025-01-01T00:00:02Z");
        assert_eq!(plan_of(snapshot(&b, &[&a, &b], &[])).apply.len(), 1);
        let deleting = snapshot(&a, &[&a, &b], &[]).deleting(true);
        assert!(plan_of(deleting).is_empty());
    }

    #[test]
    fn the_same_snapshot_gives_the_same_plan() {
        let a = eb("a", "2025-01-01T00:00:01Z");
        let b = eb("b", "2025-01-01T00:00:02Z");
        let s = snapshot(&a, &[&a, &b], &[]).build();
        assert_eq!(run::<BackupPlugin>(&s), run::<BackupPlugin>(&s));
    }

    #[test]
    fn queued_backups_keep_their_transition_time_when_the_job_starts_it_resets() {
        let mut b = eb("b", "2025-01-01T00:00:02Z");
        b["status"]["conditions"] = json!([{"type": BACKUP_PENDING, "status": "True",
            "reason": REASON_QUEUED, "message": "waiting", "lastTransitionTime": "2025-01-01T00:01:00Z"},
            {"type": "Reconciled", "status": "True", "reason": "Reconciled", "message": "host",
             "lastTransitionTime": "2025-01-01T00:00:02Z"}]);
        let plan = plan_of(snapshot(&b, &[&b], &[]));
        assert_eq!(plan.apply.len(), 1);
        assert_eq!(condition(&plan, BACKUP_PENDING)["lastTransitionTime"], NOW);
        // The host's own condition is carried along untouched.
        assert_eq!(condition(&plan, "Reconciled")["message"], "host");
    }

    /// The kind snapshot of `all` with `jobs` (owned by their backups, and
    /// as backup Jobs) and the PVC `backup-pvc`.
    fn kind_snapshot(all: &[&Value], jobs: &[Value]) -> SnapshotBuilder {
        let mut s = SnapshotBuilder::new(ETCD_BACKUP_CONTROLLER_NAME)
            .primaries(all.iter().copied())
            .now(NOW)
            .related(READ_PVCS, pvc("backup-pvc", NS));
        for j in jobs {
            s = s.owned(j).related(READ_BACKUP_JOBS, j);
        }
        s
    }

    /// Every backup's plan from one kind call, by name.
    fn kind_plans(s: SnapshotBuilder) -> Vec<(String, Plan)> {
        let plan = run::<BackupPlugin>(&s.build()).expect("kind reconcile");
        assert!(
            Plan {
                objects: vec![],
                ..plan.clone()
            }
            .is_empty(),
            "a kind plan holds only objects"
        );
        plan.objects
            .into_iter()
            .map(|o| (o.name.clone(), o.plan))
            .collect()
    }

    #[test]
    fn one_kind_call_plans_every_backup_as_its_own_reconcile_would() {
        let done = with_condition(
            eb("done", "2025-01-01T00:00:00Z"),
            BACKUP_COMPLETED,
            BACKUP_COMPLETED,
            NOW,
        );
        let a = started(eb("a", "2025-01-01T00:00:01Z"), "2025-01-01T00:05:00Z");
        let b = eb("b", "2025-01-01T00:00:02Z");
        let c = eb("c", "2025-01-01T00:00:03Z");
        let orphan = requested_by(eb("o", "2025-01-01T00:00:04Z"), "daily-1", "gone-uid");
        let all = [&done, &a, &b, &c, &orphan];
        for jobs in [
            vec![job_of(&a, NS, None)],
            vec![job_of(&a, NS, Some("Complete"))],
            vec![],
        ] {
            let plans = kind_plans(kind_snapshot(&all, &jobs));
            let names: Vec<&str> = plans.iter().map(|(n, _)| n.as_str()).collect();
            assert_eq!(names, ["done", "a", "b", "c", "o"]);
            for (primary, (_, kind_plan)) in all.iter().zip(&plans) {
                let alone = plan_of(snapshot(primary, &all, &jobs));
                assert_eq!(
                    kind_plan, &alone,
                    "{}: the kind call plans what its own reconcile plans",
                    primary["metadata"]["name"]
                );
            }
        }
    }

    #[test]
    fn a_kind_call_starts_only_the_head_of_the_queue() {
        let backups: Vec<Value> = (0..50)
            .map(|i| eb(&format!("b{i:02}"), &format!("2025-01-01T00:00:{i:02}Z")))
            .collect();
        let all: Vec<&Value> = backups.iter().collect();
        let plans = kind_plans(kind_snapshot(&all, &[]));
        assert_eq!(plans.len(), 50);
        let started: Vec<&str> = plans
            .iter()
            .filter(|(_, p)| !p.apply.is_empty())
            .map(|(n, _)| n.as_str())
            .collect();
        assert_eq!(started, ["b00"], "one Job at a time, the oldest first");
        let (_, last) = &plans[49];
        assert!(
            condition(last, BACKUP_PENDING)["message"]
                .as_str()
                .unwrap()
                .ends_with("49 queued ahead of this one")
        );
    }

    #[test]
    fn in_a_kind_call_an_unparsable_backup_gets_a_warning_and_the_others_go_on() {
        let mut bad = eb("bad", "2025-01-01T00:00:00Z");
        bad["spec"]["pvcName"] = json!(3);
        let b = eb("b", "2025-01-01T00:00:02Z");
        let plans = kind_plans(kind_snapshot(&[&bad, &b], &[]));
        let (name, bad_plan) = &plans[0];
        assert_eq!(name, "bad");
        assert!(bad_plan.apply.is_empty() && bad_plan.status.is_none());
        assert_eq!(bad_plan.events[0].reason, "InvalidSpec");
        let (name, b_plan) = &plans[1];
        assert_eq!(name, "b");
        assert_eq!(b_plan.apply.len(), 1, "b starts: the bad one is not queued");
    }

    #[test]
    fn in_a_kind_call_a_backup_being_deleted_gets_an_empty_plan() {
        let mut a = eb("a", "2025-01-01T00:00:01Z");
        a["metadata"]["deletionTimestamp"] = json!("2025-01-01T00:09:00Z");
        let b = eb("b", "2025-01-01T00:00:02Z");
        let plans = kind_plans(kind_snapshot(&[&a, &b], &[]));
        assert!(plans[0].1.is_empty());
        assert_eq!(plans[1].1.apply.len(), 1);
    }

    /// A Pod of `job` (a Job value), in `phase`, with `extra` merged into
    /// its metadata and status.
    fn pod_of(job: &Value, name: &str, phase: &str, extra: Value) -> Value {
        let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": job["metadata"]["namespace"], "uid": format!("pod-{name}"),
                         "creationTimestamp": "2025-01-01T00:05:00Z",
                         "labels": {"app": "cluster-backup-job"},
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                                              "name": job["metadata"]["name"], "uid": job["metadata"]["uid"],
                                              "controller": true}]},
            "spec": {"containers": []},
            "status": {"phase": phase}});
        for part in ["metadata", "status"] {
            if let Some(fields) = extra.get(part).and_then(Value::as_object) {
                for (k, v) in fields {
                    pod[part][k] = v.clone();
                }
            }
        }
        pod
    }

    fn with_pods(mut s: SnapshotBuilder, pods: &[Value]) -> SnapshotBuilder {
        for p in pods {
            s = s.related(READ_BACKUP_PODS, p);
        }
        s
    }

    fn pending_message(plan: &Plan) -> String {
        condition(plan, BACKUP_PENDING)["message"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    #[test]
    fn a_job_the_job_controller_marks_failure_target_fails_its_backup_and_frees_the_slot() {
        // Kubernetes 1.31+: FailureTarget at the deadline; Failed only once
        // the Pods terminated, which a Pod on a lost node never does.
        let a = started(eb("a", "2025-01-01T00:00:01Z"), "2025-01-01T00:05:00Z");
        let b = eb("b", "2025-01-01T00:00:02Z");
        let mut job = job_of(&a, NS, None);
        job["status"]["conditions"] = json!([{"type": "FailureTarget", "status": "True",
            "reason": "DeadlineExceeded", "message": "Job was active longer than specified deadline"}]);
        let plan = plan_of(snapshot(&a, &[&a, &b], std::slice::from_ref(&job)));
        let failed = condition(&plan, BACKUP_FAILED);
        assert_eq!(failed["status"], "True");
        assert!(
            failed["message"].as_str().unwrap().ends_with(
                "failed: DeadlineExceeded: Job was active longer than specified deadline"
            )
        );
        // Its Pod, on a node that stopped answering, was deleted at the
        // deadline and never confirmed: it holds the slot until its
        // deletion is overdue by LOST_POD_GRACE, then the next starts.
        let stuck = |deleted: &str| {
            pod_of(
                &job,
                "a-pod",
                "Running",
                json!({"metadata": {"deletionTimestamp": deleted}}),
            )
        };
        let plan = plan_of(with_pods(
            snapshot(&b, &[&a, &b], std::slice::from_ref(&job)),
            &[stuck("2025-01-01T00:09:30Z")],
        ));
        assert!(plan.apply.is_empty(), "the Pod may still run");
        assert!(
            pending_message(&plan).starts_with(&format!(
                "waiting for backup a (Job {NS}/{}): its Pod {NS}/a-pod has not stopped",
                backup_job_name("uid-a")
            )),
            "{}",
            pending_message(&plan)
        );
        assert_eq!(
            plan.requeue_after_ms,
            Some(30_000),
            "until it counts as lost"
        );
        let plan = plan_of(with_pods(
            snapshot(&b, &[&a, &b], std::slice::from_ref(&job)),
            &[stuck("2025-01-01T00:09:00Z")],
        ));
        assert_eq!(plan.apply.len(), 1, "lost for a minute: b starts");
    }

    #[test]
    fn a_job_being_deleted_holds_the_slot_until_its_pods_are_gone() {
        let a = started(eb("a", "2025-01-01T00:00:01Z"), "2025-01-01T00:05:00Z");
        let b = eb("b", "2025-01-01T00:00:02Z");
        let mut job = job_of(&a, NS, None);
        job["metadata"]["deletionTimestamp"] = json!("2025-01-01T00:09:59Z");
        let plan = plan_of(snapshot(&b, &[&a, &b], std::slice::from_ref(&job)));
        assert!(plan.apply.is_empty(), "b must not start next to a's Pods");
        assert!(pending_message(&plan).starts_with(&format!(
            "waiting for backup a (Job {NS}/{}, being deleted) to finish",
            backup_job_name("uid-a")
        )));

        // The Job is gone, its Pod is not yet: still held.
        let pod = pod_of(&job, "a-pod", "Running", json!({}));
        let plan = plan_of(with_pods(
            snapshot(&b, &[&a, &b], &[]),
            std::slice::from_ref(&pod),
        ));
        assert!(plan.apply.is_empty());
        assert!(pending_message(&plan).contains("being deleted): its Pod"));
        assert_eq!(plan.requeue_after_ms, None, "nothing to wait out");

        // The Pod ended (and a was failed as its Job went missing): b starts.
        let done = pod_of(&job, "a-pod", "Succeeded", json!({}));
        let a_failed = with_condition(a.clone(), BACKUP_FAILED, BACKUP_FAILED, NOW);
        let plan = plan_of(with_pods(snapshot(&b, &[&a_failed, &b], &[]), &[done]));
        assert_eq!(plan.apply.len(), 1);
    }

    #[test]
    fn pods_of_other_namespaces_and_finished_pods_do_not_hold_the_slot() {
        let a = with_condition(
            eb("a", "2025-01-01T00:00:01Z"),
            BACKUP_COMPLETED,
            BACKUP_COMPLETED,
            "2025-01-01T00:05:00Z",
        );
        let b = eb("b", "2025-01-01T00:00:02Z");
        let job = job_of(&a, NS, Some("Complete"));
        let elsewhere = pod_of(&job_of(&a, "other", None), "p", "Running", json!({}));
        let failed = pod_of(&job, "q", "Failed", json!({}));
        let plan = plan_of(with_pods(
            snapshot(&b, &[&a, &b], &[job]),
            &[elsewhere, failed],
        ));
        assert_eq!(plan.apply.len(), 1);
    }

    #[test]
    fn an_unschedulable_pod_fails_its_backup_after_the_timeout_and_its_job_is_deleted() {
        let a = started(eb("a", "2025-01-01T00:00:01Z"), "2025-01-01T00:05:00Z");
        let job = job_of(&a, NS, None);
        let pending = |since: &str| {
            pod_of(
                &job,
                "a-pod",
                "Pending",
                json!({"status": {"conditions": [{"type": "PodScheduled", "status": "False",
                    "reason": "Unschedulable", "lastTransitionTime": since,
                    "message": "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector."}]}}),
            )
        };
        let settings = json!({"schedulingTimeoutSeconds": 120});
        // Unschedulable for 60 s of 120: still running, looked at again
        // when the timeout is up.
        let plan = plan_of(with_pods(
            snapshot(&a, &[&a], std::slice::from_ref(&job)).settings(settings.clone()),
            &[pending("2025-01-01T00:09:00Z")],
        ));
        assert!(plan.delete.is_empty());
        assert_eq!(condition(&plan, BACKUP_PENDING)["status"], "True");
        assert_eq!(plan.requeue_after_ms, Some(60_000));

        // For 300 s: failed, with the scheduler's message, and the Job
        // deleted with the uid and resourceVersion seen.
        let plan = plan_of(with_pods(
            snapshot(&a, &[&a], std::slice::from_ref(&job)).settings(settings),
            &[pending("2025-01-01T00:05:00Z")],
        ));
        let failed = condition(&plan, BACKUP_FAILED);
        assert_eq!(failed["status"], "True");
        assert_eq!(failed["reason"], REASON_UNSCHEDULABLE);
        assert_eq!(
            failed["message"],
            format!(
                "Pod {NS}/a-pod of Job {NS}/{} could not be scheduled for 300s (schedulingTimeoutSeconds: 120): 0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector.; the Job is deleted",
                backup_job_name("uid-a")
            )
        );
        assert_eq!(condition(&plan, BACKUP_PENDING)["status"], "False");
        assert_eq!(
            serde_json::to_value(&plan.delete).unwrap(),
            json!([{"target": {"apiVersion": "batch/v1", "kind": "Job", "namespace": NS,
                               "name": backup_job_name("uid-a")},
                    "uid": "job-uid-a", "resourceVersion": "3"}])
        );
        assert_eq!(plan.events[0].reason, BACKUP_FAILED);

        // A scheduled Pod is not timed out, whatever its age.
        let scheduled = pod_of(
            &job,
            "a-pod",
            "Pending",
            json!({"status": {"conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2025-01-01T00:05:00Z"}]}}),
        );
        let plan = plan_of(with_pods(
            snapshot(&a, &[&a], std::slice::from_ref(&job)),
            &[scheduled],
        ));
        assert!(plan.delete.is_empty());
        assert_eq!(plan.requeue_after_ms, None);
    }

    #[test]
    fn a_fresh_request_whose_requesting_job_is_not_seen_waits_before_it_is_deleted() {
        // Created 20 s ago by a run the snapshot does not show (yet).
        let fresh = requested_by(eb("a", "2025-01-01T00:09:40Z"), "daily-1", "late-uid");
        let b = eb("b", "2025-01-01T00:09:50Z");
        let plan = plan_of(snapshot(&fresh, &[&fresh, &b], &[]));
        assert!(plan.delete.is_empty(), "not deleted while it may be late");
        assert!(plan.apply.is_empty(), "nor started before its run is seen");
        let pending = condition(&plan, BACKUP_PENDING);
        assert_eq!(pending["reason"], REASON_AWAIT_REQUESTER);
        assert!(pending["message"].as_str().unwrap().starts_with(
            "Job openshift-etcd/daily-1, which requested this backup, is not seen yet"
        ));
        assert_eq!(plan.requeue_after_ms, Some(40_000), "the rest of the grace");
        // It does not hold up the queue meanwhile.
        assert_eq!(plan_of(snapshot(&b, &[&fresh, &b], &[])).apply.len(), 1);

        // Its run shows up: queued like any other.
        let s = snapshot(&fresh, &[&fresh], &[]).related(READ_RUNS, run_job("daily-1", "late-uid"));
        assert_eq!(plan_of(s).apply.len(), 1);

        // Finished, its run gone a moment ago: kept until the grace is up,
        // and looked at again then.
        let done = with_condition(fresh.clone(), BACKUP_COMPLETED, BACKUP_COMPLETED, NOW);
        let plan = plan_of(snapshot(&done, &[&done], &[]));
        assert!(plan.delete.is_empty());
        assert_eq!(plan.requeue_after_ms, Some(40_000));

        // A shorter grace, passed: deleted.
        let s = snapshot(&fresh, &[&fresh], &[]).settings(json!({"orphanGraceSeconds": 10}));
        let plan = plan_of(s);
        assert_eq!(plan.delete.len(), 1);
        assert_eq!(plan.events[0].reason, REASON_ORPHAN_DELETED);
    }

    #[test]
    fn a_primary_that_is_not_an_etcd_backup_is_an_invalid_spec() {
        let s = SnapshotBuilder::new(crate::ETCD_BACKUP_CONTROLLER)
            .primary(json!({"metadata": {"name": "x"}, "spec": {"pvcName": 3}}))
            .build();
        assert!(matches!(
            run::<BackupPlugin>(&s),
            Err(ReconcileError::InvalidSpec(_))
        ));
    }
}
