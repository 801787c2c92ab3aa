//! The two custom resources, as the plugin reads them, and the names of
//! things the API defines (kinds, labels, condition types).
//!
//! Both kinds are cluster-scoped; see `crds/` for their schemas.
//! Deserialization is lenient about what the CRDs make optional (every
//! missing field takes its empty value) and strict about types.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use wasmop_sdk::conditions::conditions_of;
use wasmop_sdk::{KindRef, k8s_openapi};

/// `operator.openshift.io/v1alpha1` EtcdBackup: one backup, run once.
pub fn etcd_backup_kind() -> KindRef {
    KindRef::cluster_scoped(
        "operator.openshift.io",
        "v1alpha1",
        "EtcdBackup",
        "etcdbackups",
    )
}

/// `config.openshift.io/v1alpha1` Backup: periodic backups.
pub fn backup_kind() -> KindRef {
    KindRef::cluster_scoped("config.openshift.io", "v1alpha1", "Backup", "backups")
}

/// Label key naming the kind of backup workload (values below).
pub const APP_LABEL: &str = "app";
/// `app` label of the Jobs that take one backup.
pub const BACKUP_JOB_APP: &str = "cluster-backup-job";
/// `app` label of the CronJobs of scheduled backups and of their Jobs.
pub const CRONJOB_APP: &str = "cluster-backup-cronjob";
/// Label naming the EtcdBackup (or Backup) a workload belongs to.
pub const BACKUP_NAME_LABEL: &str = "backup-name";

/// Condition: a Job saves the backup, or the backup waits for its turn.
pub const BACKUP_PENDING: &str = "BackupPending";
/// Condition: the Job finished and the backup is saved.
pub const BACKUP_COMPLETED: &str = "BackupCompleted";
/// Condition: the backup could not be taken (Job failed, PVC missing, …).
pub const BACKUP_FAILED: &str = "BackupFailed";
/// Condition: the backup was not taken and never will be (upstream skips
/// simultaneous requests this way; wasmop queues them instead and never
/// sets it, but a backup carrying it counts as finished).
pub const BACKUP_SKIPPED: &str = "BackupSkipped";
/// The condition types of a backup's progress; at most one is True.
pub const PROGRESS_CONDITIONS: [&str; 4] = [
    BACKUP_PENDING,
    BACKUP_COMPLETED,
    BACKUP_FAILED,
    BACKUP_SKIPPED,
];
/// Reason of `BackupPending` while the backup waits for its turn.
pub const REASON_QUEUED: &str = "BackupQueued";

/// Condition of a Backup: its CronJob is in place (True) or why not (False).
pub const SCHEDULED: &str = "Scheduled";

/// One EtcdBackup, as the controller needs to see it.
#[derive(Clone, Debug, PartialEq)]
pub struct EtcdBackup {
    /// Its metadata (name, uid, creationTimestamp, ownerReferences, …).
    pub metadata: ObjectMeta,
    /// `spec.pvcName`, empty when unset.
    pub pvc_name: String,
    /// `status.backupJob`, when a Job was started for it.
    pub backup_job: Option<JobRef>,
    /// `status.conditions` (entries that are not valid conditions skipped).
    pub conditions: Vec<Condition>,
}

/// `status.backupJob`: the Job that takes (or took) the backup.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRef {
    /// Namespace of the Job.
    pub namespace: String,
    /// Name of the Job.
    pub name: String,
}

#[derive(Deserialize)]
struct EtcdBackupJson {
    metadata: ObjectMeta,
    #[serde(default)]
    spec: EtcdBackupSpecJson,
    #[serde(default)]
    status: Option<EtcdBackupStatusJson>,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct EtcdBackupSpecJson {
    #[serde(default)]
    pvc_name: Option<String>,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct EtcdBackupStatusJson {
    #[serde(default)]
    backup_job: Option<JobRef>,
}

impl EtcdBackup {
    /// Reads an EtcdBackup object.
    ///
    /// # Errors
    ///
    /// The serde error when the object does not have the EtcdBackup shape.
    pub fn from_value(object: &Value) -> Result<EtcdBackup, serde_json::Error> {
        let raw = EtcdBackupJson::deserialize(object)?;
        Ok(EtcdBackup {
            metadata: raw.metadata,
            pvc_name: raw.spec.pvc_name.unwrap_or_default(),
            backup_job: raw.status.and_then(|s| s.backup_job),
            conditions: conditions_of(object),
        })
    }

    /// `metadata.name`.
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    /// `metadata.uid`.
    pub fn uid(&self) -> &str {
        self.metadata.uid.as_deref().unwrap_or_default()
    }

    /// True when the object is being deleted.
    pub fn deleting(&self) -> bool {
        self.metadata.deletion_timestamp.is_some()
    }

    /// The progress condition that is True, if any.
    pub fn progress(&self) -> Option<&Condition> {
        self.conditions
            .iter()
            .find(|c| PROGRESS_CONDITIONS.contains(&c.type_.as_str()) && c.status == "True")
    }

    /// True when the backup reached an end (completed, failed or skipped):
    /// it is never run (again).
    pub fn finished(&self) -> bool {
        self.progress().is_some_and(|c| c.type_ != BACKUP_PENDING)
    }

    /// The Jobs named in its ownerReferences (`batch/v1` or kind `Job`):
    /// `(name, uid)`. A scheduled run's Job requests its EtcdBackup this way.
    pub fn requesting_jobs(&self) -> Vec<(&str, &str)> {
        self.metadata
            .owner_references
            .iter()
            .flatten()
            .filter(|o| o.api_version == "batch/v1" || o.kind == "Job")
            .map(|o| (o.name.as_str(), o.uid.as_str()))
            .collect()
    }

    /// The queue order: creationTimestamp, then name.
    pub fn queue_key(&self) -> (Option<k8s_openapi::jiff::Timestamp>, &str) {
        (
            self.metadata.creation_timestamp.as_ref().map(|t| t.0),
            self.name(),
        )
    }
}

/// Backups kept when the spec gives no retention policy, or no number.
pub const DEFAULT_RETENTION_NUMBER: u32 = 15;
/// Size kept when the type is `RetentionSize` without `retentionSize` (GiB).
pub const DEFAULT_RETENTION_SIZE_GB: u32 = 10;

/// One Backup: the schedule of periodic backups.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct Backup {
    /// Its metadata.
    pub metadata: ObjectMeta,
    /// What to back up and when.
    pub spec: BackupSpec,
}

/// `spec` of a Backup.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct BackupSpec {
    /// Periodic backups of etcd.
    pub etcd: EtcdSchedule,
}

/// `spec.etcd` of a Backup.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EtcdSchedule {
    /// Cron schedule; empty: no periodic backups.
    #[serde(default)]
    pub schedule: String,
    /// Time zone of the schedule; empty: the controller manager's.
    #[serde(default)]
    pub time_zone: String,
    /// PVC in the target namespace the backups go to.
    #[serde(default)]
    pub pvc_name: String,
    /// What to prune before each backup.
    #[serde(default)]
    pub retention_policy: Option<RetentionPolicy>,
}

/// `spec.etcd.retentionPolicy`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RetentionPolicy {
    /// `RetentionNumber` or `RetentionSize`; empty means the default.
    #[serde(default)]
    pub retention_type: String,
    /// Settings of `RetentionNumber`.
    #[serde(default)]
    pub retention_number: Option<RetentionNumber>,
    /// Settings of `RetentionSize`.
    #[serde(default)]
    pub retention_size: Option<RetentionSize>,
}

/// `retentionPolicy.retentionNumber`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RetentionNumber {
    /// How many backups to keep.
    pub max_number_of_backups: i64,
}

/// `retentionPolicy.retentionSize`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RetentionSize {
    /// How many GiB of backups to keep.
    pub max_size_of_backups_gb: i64,
}

/// The retention a scheduled run applies before it requests a backup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retention {
    /// Keep the newest N backups.
    Number(i64),
    /// Keep the newest backups up to N GiB in total.
    Size(i64),
}

impl EtcdSchedule {
    /// The retention the spec asks for, defaults applied.
    ///
    /// # Errors
    ///
    /// A message when the type is unknown or a limit is below 1 (the CRD
    /// refuses both; this guards objects written around it).
    pub fn retention(&self) -> Result<Retention, String> {
        let policy = self.retention_policy.clone().unwrap_or_default();
        let retention = match policy.retention_type.as_str() {
            "" | "RetentionNumber" => Retention::Number(
                policy
                    .retention_number
                    .map_or(i64::from(DEFAULT_RETENTION_NUMBER), |n| {
                        n.max_number_of_backups
                    }),
            ),
            "RetentionSize" => Retention::Size(
                policy
                    .retention_size
                    .map_or(i64::from(DEFAULT_RETENTION_SIZE_GB), |s| {
                        s.max_size_of_backups_gb
                    }),
            ),
            other => {
                return Err(format!(
                    "spec.etcd.retentionPolicy.retentionType {other:?} is neither RetentionNumber nor RetentionSize"
                ));
            }
        };
        match retention {
            Retention::Number(n) | Retention::Size(n) if n < 1 => {
                Err(format!("the retention limit must be at least 1, got {n}"))
            }
            r => Ok(r),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn etcd_backup_reads_spec_status_and_owners() {
        let b = EtcdBackup::from_value(&json!({
            "apiVersion": "operator.openshift.io/v1alpha1", "kind": "EtcdBackup",
            "metadata": {"name": "b", "uid": "u", "creationTimestamp": "2025-01-01T00:00:00Z",
                         "ownerReferences": [
                             {"apiVersion": "batch/v1", "kind": "Job", "name": "run-1", "uid": "j1"},
                             {"apiVersion": "v1", "kind": "ConfigMap", "name": "c", "uid": "c1"}]},
            "spec": {"pvcName": "p"},
            "status": {"backupJob": {"namespace": "ns", "name": "job"},
                       "conditions": [{"type": "BackupCompleted", "status": "True", "reason": "BackupCompleted",
                                       "message": "", "lastTransitionTime": "2025-01-01T00:00:00Z"}]},
        }))
        .unwrap();
        assert_eq!(b.name(), "b");
        assert_eq!(b.pvc_name, "p");
        assert_eq!(
            b.backup_job,
            Some(JobRef {
                namespace: "ns".into(),
                name: "job".into()
            })
        );
        assert!(b.finished());
        assert_eq!(b.requesting_jobs(), [("run-1", "j1")]);
    }

    #[test]
    fn a_pending_backup_is_not_finished() {
        let b = EtcdBackup::from_value(&json!({
            "metadata": {"name": "b"}, "spec": {},
            "status": {"conditions": [{"type": "BackupPending", "status": "True", "reason": "BackupPending",
                                       "message": "", "lastTransitionTime": "2025-01-01T00:00:00Z"}]},
        }))
        .unwrap();
        assert_eq!(b.progress().unwrap().type_, BACKUP_PENDING);
        assert!(!b.finished());
        assert_eq!(b.pvc_name, "");
        assert!(b.requesting_jobs().is_empty());
    }

    fn schedule(policy: Value) -> EtcdSchedule {
        serde_json::from_value(json!({"schedule": "@daily", "retentionPolicy": policy})).unwrap()
    }

    #[test]
    fn retention_defaults_to_fifteen_backups() {
        let no_policy: EtcdSchedule = serde_json::from_value(json!({})).unwrap();
        assert_eq!(no_policy.retention(), Ok(Retention::Number(15)));
        assert_eq!(
            schedule(json!({"retentionType": ""})).retention(),
            Ok(Retention::Number(15))
        );
        assert_eq!(
            schedule(json!({"retentionType": "RetentionNumber", "retentionNumber": {"maxNumberOfBackups": 3}}))
                .retention(),
            Ok(Retention::Number(3))
        );
    }

    #[test]
    fn retention_by_size_defaults_to_ten_gib() {
        assert_eq!(
            schedule(json!({"retentionType": "RetentionSize"})).retention(),
            Ok(Retention::Size(10))
        );
        assert_eq!(
            schedule(json!({"retentionType": "RetentionSize", "retentionSize": {"maxSizeOfBackupsGb": 2}}))
                .retention(),
            Ok(Retention::Size(2))
        );
    }

    #[test]
    fn unknown_retention_types_and_zero_limits_are_refused() {
        assert!(
            schedule(json!({"retentionType": "None"}))
                .retention()
                .unwrap_err()
                .contains("\"None\"")
        );
        assert!(
            schedule(json!({"retentionType": "RetentionNumber", "retentionNumber": {"maxNumberOfBackups": 0}}))
                .retention()
                .is_err()
        );
    }
}
