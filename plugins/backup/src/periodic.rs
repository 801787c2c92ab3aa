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

use k8s_openapi::api::batch::v1::CronJob;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::json;
use wasmop_sdk::conditions::{conditions_of, set_condition};
use wasmop_sdk::{Plan, ReconcileError, Snapshot, k8s_openapi};

use crate::api::{Backup, Retention, SCHEDULED};
use crate::settings::Settings;
use crate::workloads::{MAX_CRONJOB_NAME, backup_cronjob};

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
        Schedule::Unscheduled { .. } => None,
    };
    // CronJobs of this Backup that are not the desired one (no schedule any
    // more, or another target namespace) go.
    for seen in snapshot.owned_of_kind::<CronJob>()? {
        let id = Some((seen.metadata.namespace.clone(), seen.metadata.name.clone()));
        if id != keep {
            plan = plan.delete_owned(&seen)?;
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
            set_condition(
                &mut conditions,
                SCHEDULED,
                true,
                "CronJobApplied",
                &message,
                generation,
                &now,
            );
            plan = plan.apply(*cronjob);
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
