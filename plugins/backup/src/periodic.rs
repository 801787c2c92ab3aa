//! The Backup controller: `spec.etcd` of a Backup becomes a CronJob named
//! after it in the target namespace.
//!
//! Each run of the CronJob prunes old backups on the PVC (the retention
//! policy) and requests an EtcdBackup owned by the run's own Job; the
//! EtcdBackup controller queues and runs it like any other.
//!
//! # Guarantees
//!
//! - The CronJob is server-side applied on every reconcile, so an edit of
//!   the Backup reaches it and nothing else of it is touched.
//! - The CronJob carries the Backup as controller owner (set by the host):
//!   deleting the Backup garbage-collects it.
//! - Without a schedule or a PVC there is no CronJob (an existing one is
//!   deleted), and the `Scheduled` condition says why.
//! - A schedule the CronJob API would refuse ([`crate::cron`]) is not
//!   applied: `Scheduled=False` (reason `InvalidSchedule`) with a Warning
//!   Event, and the CronJob already there keeps its previous schedule;
//!   fixing the schedule applies it and sets `Scheduled=True` again.
//! - `Scheduled` is True only while the CronJob's last finished run (a Job
//!   of the `scheduled-runs` read controlled by the CronJob) did not fail:
//!   after a failed run (e.g. one whose ServiceAccount may not create
//!   EtcdBackups) it is False (reason `RunFailed`, naming the Job and why)
//!   with a Warning Event, until a later run succeeds.

use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::Deserialize;
use serde_json::json;
use wasmop_sdk::conditions::{conditions_of, set_condition};
use wasmop_sdk::{Plan, ReconcileError, Snapshot, k8s_openapi};

use crate::api::{Backup, Retention, SCHEDULED};
use crate::cron::check_schedule;
use crate::etcdbackup::{Finish, finish};
use crate::settings::Settings;
use crate::workloads::{MAX_CRONJOB_NAME, backup_cronjob};

/// Read id: Jobs labelled `app=cluster-backup-cronjob` (the CronJobs'
/// runs), the same read the EtcdBackup controller declares.
pub const READ_RUNS: &str = crate::etcdbackup::READ_RUNS;
/// Reason of `Scheduled=False` (and of its Warning Event) for a schedule
/// the CronJob API refuses.
pub const REASON_INVALID_SCHEDULE: &str = "InvalidSchedule";
/// Reason of `Scheduled=False` (and of its Warning Event) after a failed run.
pub const REASON_RUN_FAILED: &str = "RunFailed";

/// Why a Backup has no CronJob, or that it has one.
#[derive(Clone, Debug, PartialEq)]
pub enum Schedule {
    /// The CronJob to apply.
    Cron {
        /// The CronJob.
        cronjob: Box<CronJob>,
        /// The retention it applies.
        retention: Retention,
    },
    /// The schedule is one the CronJob API refuses: nothing is applied,
    /// the CronJob already there (if any) stays as it is.
    Invalid {
        /// For a person.
        message: String,
    },
    /// No CronJob: a reason (condition reason) and a message.
    Unscheduled {
        /// CamelCase reason.
        reason: &'static str,
        /// For a person.
        message: String,
    },
}

/// What the Backup asks for.
///
/// # Errors
///
/// [`ReconcileError::InvalidSpec`] for a retention policy the CRD would
/// refuse (unknown type, limit below 1).
pub fn schedule(settings: &Settings, backup: &Backup) -> Result<Schedule, ReconcileError> {
    let name = backup.metadata.name.as_deref().unwrap_or_default();
    let etcd = &backup.spec.etcd;
    let retention = etcd
        .retention()
        .map_err(|e| ReconcileError::invalid_spec(format!("Backup {name}: {e}")))?;
    if etcd.schedule.is_empty() {
        return Ok(Schedule::Unscheduled {
            reason: "NoSchedule",
            message: "spec.etcd.schedule is empty: no periodic backups".to_owned(),
        });
    }
    if etcd.pvc_name.is_empty() {
        return Ok(Schedule::Unscheduled {
            reason: "NoPVC",
            message: format!(
                "spec.etcd.pvcName is empty: name a PersistentVolumeClaim in namespace {} to save backups to",
                settings.target_namespace
            ),
        });
    }
    if let Err(why) = check_schedule(&etcd.schedule) {
        return Ok(Schedule::Invalid {
            message: format!(
                "spec.etcd.schedule {:?} would be refused by the CronJob API: {why}",
                etcd.schedule
            ),
        });
    }
    if etcd.time_zone.eq_ignore_ascii_case("local") {
        return Ok(Schedule::Invalid {
            message: format!(
                "spec.etcd.timeZone {:?} would be refused by the CronJob API: name an IANA time zone such as Etc/UTC",
                etcd.time_zone
            ),
        });
    }
    if name.len() > MAX_CRONJOB_NAME {
        return Ok(Schedule::Unscheduled {
            reason: "NameTooLong",
            message: format!(
                "the CronJob is named after the Backup, and a CronJob name has at most {MAX_CRONJOB_NAME} characters ({} here)",
                name.len()
            ),
        });
    }
    Ok(Schedule::Cron {
        cronjob: Box::new(backup_cronjob(settings, name, etcd, retention)),
        retention,
    })
}

/// The Backup controller's reconcile.
///
/// # Errors
///
/// [`ReconcileError::InvalidSpec`] when the primary is not a Backup or its
/// retention policy is invalid; [`ReconcileError::Internal`] for settings,
/// time or owned objects that are not what the manifest promises.
pub fn reconcile(snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
    if snapshot.deleting {
        return Ok(Plan::new());
    }
    let settings = Settings::of(&snapshot.settings)?;
    let backup: Backup = snapshot.primary_as()?;
    let now: Time = snapshot.now()?;
    let generation = snapshot.primary_generation();
    let desired = schedule(&settings, &backup)?;

    let mut plan = Plan::new();
    let keep = match &desired {
        Schedule::Cron { cronjob, .. } => Some((
            cronjob.metadata.namespace.clone(),
            cronjob.metadata.name.clone(),
        )),
        Schedule::Invalid { .. } | Schedule::Unscheduled { .. } => None,
    };
    // CronJobs of this Backup that are not the desired one (no schedule any
    // more, or another target namespace) go; with a schedule the CronJob
    // API refuses, the one in place stays as it is.
    let owned = snapshot.owned_of_kind::<CronJob>()?;
    let mut current = None;
    for seen in &owned {
        let id = Some((seen.metadata.namespace.clone(), seen.metadata.name.clone()));
        if id == keep {
            current = seen.metadata.uid.clone();
        } else if !matches!(desired, Schedule::Invalid { .. }) {
            plan = plan.delete_owned(seen)?;
        }
    }

    let mut conditions = conditions_of(&snapshot.primary);
    match desired {
        Schedule::Cron { cronjob, retention } => {
            let spec = cronjob.spec.as_ref();
            let zone = spec
                .and_then(|s| s.time_zone.as_deref())
                .map(|tz| format!(" (time zone {tz})"))
                .unwrap_or_default();
            let keeps = match retention {
                Retention::Number(n) => format!("keeping the newest {n} backups"),
                Retention::Size(gb) => format!("keeping at most {gb} GiB of backups"),
            };
            let message = format!(
                "CronJob {}/{} requests a backup on \"{}\"{zone}, {keeps}",
                cronjob.metadata.namespace.as_deref().unwrap_or_default(),
                cronjob.metadata.name.as_deref().unwrap_or_default(),
                spec.map(|s| s.schedule.as_str()).unwrap_or_default(),
            );
            let runs = runs_of(snapshot, &settings.target_namespace, current.as_deref())?;
            match last_failure(&runs) {
                Some((job, why)) => {
                    let failed = format!(
                        "the last run, Job {}/{job}, failed: {why}; {message}",
                        settings.target_namespace
                    );
                    set_condition(
                        &mut conditions,
                        SCHEDULED,
                        false,
                        REASON_RUN_FAILED,
                        &failed,
                        generation,
                        &now,
                    );
                    plan = plan.warning(REASON_RUN_FAILED, failed);
                }
                None => {
                    set_condition(
                        &mut conditions,
                        SCHEDULED,
                        true,
                        "CronJobApplied",
                        &message,
                        generation,
                        &now,
                    );
                }
            }
            plan = plan.apply(*cronjob);
        }
        Schedule::Invalid { message } => {
            let message = if owned.is_empty() {
                format!("{message}; no CronJob is made until it is fixed")
            } else {
                format!("{message}; the CronJob keeps its previous schedule until it is fixed")
            };
            set_condition(
                &mut conditions,
                SCHEDULED,
                false,
                REASON_INVALID_SCHEDULE,
                &message,
                generation,
                &now,
            );
            plan = plan.warning(REASON_INVALID_SCHEDULE, message);
        }
        Schedule::Unscheduled { reason, message } => {
            set_condition(
                &mut conditions,
                SCHEDULED,
                false,
                reason,
                &message,
                generation,
                &now,
            );
        }
    }
    Ok(plan.status(json!({"conditions": conditions})))
}

/// The runs of the CronJob with uid `cronjob` in `ns`: Jobs of the
/// `scheduled-runs` read it controls.
///
/// # Errors
///
/// [`ReconcileError::Internal`] for a related object that is not a Job.
fn runs_of(
    snapshot: &Snapshot,
    ns: &str,
    cronjob: Option<&str>,
) -> Result<Vec<Job>, ReconcileError> {
    let Some(uid) = cronjob else {
        return Ok(Vec::new());
    };
    let mut runs = Vec::new();
    for o in snapshot.related(READ_RUNS) {
        if o.pointer("/metadata/namespace").and_then(|n| n.as_str()) != Some(ns) {
            continue;
        }
        let job =
            Job::deserialize(o).map_err(|e| ReconcileError::internal(format!("run Job: {e}")))?;
        let controlled = job
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|r| r.controller == Some(true) && r.uid == uid);
        if controlled {
            runs.push(job);
        }
    }
    Ok(runs)
}

/// The last finished run, by creation time then name, when it failed: its
/// name and why.
fn last_failure(runs: &[Job]) -> Option<(String, String)> {
    let (job, end) = runs
        .iter()
        .filter_map(|j| finish(j).map(|end| (j, end)))
        .max_by(|(a, _), (b, _)| {
            let key = |j: &Job| {
                (
                    j.metadata.creation_timestamp.as_ref().map(|t| t.0),
                    j.metadata.name.clone(),
                )
            };
            key(a).cmp(&key(b))
        })?;
    match end {
        Finish::Completed => None,
        Finish::Failed(why) => Some((job.metadata.name.clone().unwrap_or_default(), why)),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};
    use wasmop_sdk::testing::{SnapshotBuilder, run};
    use wasmop_sdk::{Plan, ReconcileError};

    use crate::BackupPlugin;

    fn backup(name: &str, etcd: Value) -> Value {
        json!({"apiVersion": "config.openshift.io/v1alpha1", "kind": "Backup",
               "metadata": {"name": name, "uid": format!("uid-{name}"), "generation": 2},
               "spec": {"etcd": etcd}})
    }

    fn cronjob(name: &str, ns: &str) -> Value {
        json!({"apiVersion": "batch/v1", "kind": "CronJob",
               "metadata": {"name": name, "namespace": ns, "uid": format!("cj-{ns}-{name}"),
                            "resourceVersion": "4",
                            "ownerReferences": [{"apiVersion": "config.openshift.io/v1alpha1", "kind": "Backup",
                                                 "name": name, "uid": format!("uid-{name}"), "controller": true}]},
               "spec": {"schedule": "@daily", "jobTemplate": {"spec": {"template": {"spec": {"containers": []}}}}}})
    }

    fn reconcile(s: SnapshotBuilder) -> Result<Plan, ReconcileError> {
        run::<BackupPlugin>(&s.build())
    }

    fn scheduled(plan: &Plan) -> &Value {
        plan.status.as_ref().unwrap()["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Scheduled")
            .expect("Scheduled condition")
    }

    fn of(primary: Value) -> SnapshotBuilder {
        SnapshotBuilder::new(crate::BACKUP_CONTROLLER).primary(primary)
    }

    #[test]
    fn a_backup_becomes_a_cronjob_named_after_it_in_the_target_namespace() {
        let plan = reconcile(of(backup(
            "nightly",
            json!({"schedule": "0 2 * * *", "pvcName": "backup-pvc"}),
        )))
        .unwrap();
        assert_eq!(plan.apply.len(), 1);
        let cj = &plan.apply[0].object;
        assert_eq!(cj["kind"], "CronJob");
        assert_eq!(cj["metadata"]["name"], "nightly");
        assert_eq!(cj["metadata"]["namespace"], "openshift-etcd");
        assert_eq!(cj["spec"]["schedule"], "0 2 * * *");
        assert_eq!(plan.apply[0].precondition, None, "applied, so edits land");
        let c = scheduled(&plan);
        assert_eq!(c["status"], "True");
        assert_eq!(c["observedGeneration"], 2);
        assert_eq!(
            c["message"],
            "CronJob openshift-etcd/nightly requests a backup on \"0 2 * * *\", keeping the newest 15 backups"
        );
    }

    #[test]
    fn an_edited_schedule_and_retention_reach_the_cronjob() {
        let plan = reconcile(
            of(backup(
                "nightly",
                json!({"schedule": "@hourly", "timeZone": "Etc/UTC", "pvcName": "backup-pvc",
                       "retentionPolicy": {"retentionType": "RetentionSize",
                                           "retentionSize": {"maxSizeOfBackupsGb": 3}}}),
            ))
            .owned(cronjob("nightly", "openshift-etcd")),
        )
        .unwrap();
        assert!(plan.delete.is_empty());
        let cj = &plan.apply[0].object;
        assert_eq!(cj["spec"]["schedule"], "@hourly");
        assert_eq!(cj["spec"]["timeZone"], "Etc/UTC");
        assert_eq!(
            cj["spec"]["jobTemplate"]["spec"]["template"]["spec"]["initContainers"][0]["args"],
            json!([
                "prune-backups",
                "--type=RetentionSize",
                "--maxSizeOfBackupsGb=3"
            ])
        );
        assert!(
            scheduled(&plan)["message"]
                .as_str()
                .unwrap()
                .ends_with("(time zone Etc/UTC), keeping at most 3 GiB of backups")
        );
    }

    #[test]
    fn no_schedule_means_no_cronjob_and_removes_the_old_one() {
        let plan = reconcile(
            of(backup("nightly", json!({"pvcName": "backup-pvc"})))
                .owned(cronjob("nightly", "openshift-etcd")),
        )
        .unwrap();
        assert!(plan.apply.is_empty());
        assert_eq!(plan.delete.len(), 1);
        assert_eq!(plan.delete[0].target.name, "nightly");
        assert_eq!(plan.delete[0].uid, "cj-openshift-etcd-nightly");
        assert_eq!(plan.delete[0].resource_version, "4");
        let c = scheduled(&plan);
        assert_eq!(c["status"], "False");
        assert_eq!(c["reason"], "NoSchedule");
    }

    #[test]
    fn no_pvc_means_no_cronjob() {
        let plan = reconcile(of(backup("nightly", json!({"schedule": "@daily"})))).unwrap();
        assert!(plan.apply.is_empty());
        assert_eq!(scheduled(&plan)["reason"], "NoPVC");
    }

    #[test]
    fn a_cronjob_left_in_an_old_target_namespace_is_removed() {
        let plan = reconcile(
            of(backup(
                "nightly",
                json!({"schedule": "@daily", "pvcName": "p"}),
            ))
            .owned(cronjob("nightly", "old-target"))
            .settings(json!({"targetNamespace": "new-target"})),
        )
        .unwrap();
        assert_eq!(plan.apply[0].object["metadata"]["namespace"], "new-target");
        assert_eq!(plan.delete.len(), 1);
        assert_eq!(plan.delete[0].target.namespace, "old-target");
    }

    #[test]
    fn a_name_too_long_for_a_cronjob_is_reported() {
        let name = "n".repeat(53);
        let plan = reconcile(of(backup(
            &name,
            json!({"schedule": "@daily", "pvcName": "p"}),
        )))
        .unwrap();
        assert!(plan.apply.is_empty());
        assert_eq!(scheduled(&plan)["reason"], "NameTooLong");
    }

    /// A run of the CronJob `cj-openshift-etcd-<name>`, created at
    /// `created`, ended as `end` (`Complete`, `Failed`, `FailureTarget`)
    /// or running.
    fn run_job(name: &str, cronjob: &str, created: &str, end: Option<&str>) -> Value {
        let mut job = json!({"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": "openshift-etcd", "uid": format!("run-{name}"),
                         "creationTimestamp": created,
                         "labels": {"app": "cluster-backup-cronjob"},
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "CronJob", "name": cronjob,
                                              "uid": format!("cj-openshift-etcd-{cronjob}"), "controller": true}]},
            "spec": {"template": {"spec": {"containers": []}}}, "status": {}});
        if let Some(end) = end {
            job["status"]["conditions"] = json!([{"type": end, "status": "True",
                "reason": if end == "Complete" { "" } else { "BackoffLimitExceeded" },
                "message": if end == "Complete" { "" } else { "Job has reached the specified backoff limit" }}]);
        }
        job
    }

    fn nightly_with_runs(runs: &[Value]) -> Plan {
        let mut s = of(backup(
            "nightly",
            json!({"schedule": "0 2 * * *", "pvcName": "backup-pvc"}),
        ))
        .owned(cronjob("nightly", "openshift-etcd"));
        for r in runs {
            s = s.related(super::READ_RUNS, r);
        }
        reconcile(s).unwrap()
    }

    #[test]
    fn a_failed_last_run_makes_scheduled_false_until_a_later_run_succeeds() {
        let ok = run_job(
            "nightly-1",
            "nightly",
            "2025-01-01T02:00:00Z",
            Some("Complete"),
        );
        let failed = run_job(
            "nightly-2",
            "nightly",
            "2025-01-02T02:00:00Z",
            Some("Failed"),
        );
        let running = run_job("nightly-3", "nightly", "2025-01-03T02:00:00Z", None);

        let plan = nightly_with_runs(std::slice::from_ref(&ok));
        assert_eq!(scheduled(&plan)["status"], "True");
        assert!(plan.events.is_empty());

        // The last finished run failed (a run in progress does not count).
        let plan = nightly_with_runs(&[ok.clone(), failed.clone(), running.clone()]);
        let c = scheduled(&plan);
        assert_eq!(c["status"], "False");
        assert_eq!(c["reason"], super::REASON_RUN_FAILED);
        assert!(
            c["message"].as_str().unwrap().starts_with(
                "the last run, Job openshift-etcd/nightly-2, failed: BackoffLimitExceeded: Job has reached the specified backoff limit; CronJob openshift-etcd/nightly requests"
            ),
            "{c}"
        );
        assert_eq!(plan.events[0].reason, super::REASON_RUN_FAILED);
        assert_eq!(plan.apply.len(), 1, "the CronJob is still applied");

        // A FailureTarget (the Job controller's first word) counts too.
        let failing = run_job(
            "nightly-2",
            "nightly",
            "2025-01-02T02:00:00Z",
            Some("FailureTarget"),
        );
        assert_eq!(scheduled(&nightly_with_runs(&[failing]))["status"], "False");

        // A later run that succeeded: True again.
        let later = run_job(
            "nightly-4",
            "nightly",
            "2025-01-04T02:00:00Z",
            Some("Complete"),
        );
        assert_eq!(
            scheduled(&nightly_with_runs(&[ok, failed.clone(), later]))["status"],
            "True"
        );

        // Runs of another CronJob are not this Backup's.
        let other = run_job("weekly-1", "weekly", "2025-01-05T02:00:00Z", Some("Failed"));
        assert_eq!(scheduled(&nightly_with_runs(&[other]))["status"], "True");
    }

    #[test]
    fn a_schedule_the_cronjob_api_refuses_is_reported_and_the_cronjob_kept() {
        // Upstream's TestWrongScheduleDegradesOperator schedule.
        let wrong = backup(
            "nightly",
            json!({"schedule": "*/5 */0 * * *", "timeZone": "Etc/UTC", "pvcName": "backup-pvc"}),
        );
        let plan = reconcile(of(wrong.clone())).unwrap();
        assert!(plan.apply.is_empty() && plan.delete.is_empty());
        let c = scheduled(&plan);
        assert_eq!(c["status"], "False");
        assert_eq!(c["reason"], super::REASON_INVALID_SCHEDULE);
        assert_eq!(
            c["message"],
            "spec.etcd.schedule \"*/5 */0 * * *\" would be refused by the CronJob API: hour field \"*/0\": the step of \"*/0\" must be a positive number; no CronJob is made until it is fixed"
        );
        assert_eq!(plan.events[0].reason, super::REASON_INVALID_SCHEDULE);

        // With a CronJob in place: it is neither changed nor deleted.
        let plan = reconcile(of(wrong).owned(cronjob("nightly", "openshift-etcd"))).unwrap();
        assert!(plan.apply.is_empty() && plan.delete.is_empty());
        assert!(
            scheduled(&plan)["message"]
                .as_str()
                .unwrap()
                .ends_with("the CronJob keeps its previous schedule until it is fixed")
        );

        let local = backup(
            "nightly",
            json!({"schedule": "0 2 * * *", "timeZone": "Local", "pvcName": "backup-pvc"}),
        );
        let plan = reconcile(of(local)).unwrap();
        assert_eq!(scheduled(&plan)["reason"], super::REASON_INVALID_SCHEDULE);
    }

    #[test]
    fn an_unknown_retention_type_is_an_invalid_spec() {
        let err = reconcile(of(backup(
            "nightly",
            json!({"schedule": "@daily", "pvcName": "p", "retentionPolicy": {"retentionType": "Forever"}}),
        )))
        .unwrap_err();
        assert!(matches!(err, ReconcileError::InvalidSpec(_)), "{err}");
    }

    #[test]
    fn a_backup_without_spec_etcd_is_an_invalid_spec() {
        let err = reconcile(of(
            json!({"apiVersion": "config.openshift.io/v1alpha1", "kind": "Backup",
                                       "metadata": {"name": "b"}, "spec": {}}),
        ))
        .unwrap_err();
        assert!(matches!(err, ReconcileError::InvalidSpec(_)), "{err}");
    }
}
