//! The `backup` plugin: etcd backups, after cluster-etcd-operator's
//! BackupController, PeriodicBackupController and BackupRemovalController.
//!
//! Two controllers, both over cluster-scoped primaries:
//!
//! - `etcdbackup` ([`etcdbackup`]) — `operator.openshift.io/v1alpha1`
//!   EtcdBackup, kind-scoped (one call over every EtcdBackup): one Job per backup in the target namespace, one Job at a
//!   time across the cluster, the others queued in creation order; status
//!   as upstream (`BackupPending`/`BackupCompleted`/`BackupFailed`/
//!   `BackupSkipped`, `backupJob`). EtcdBackups whose requesting Job is gone
//!   are deleted, as upstream does (the controller declares
//!   `delete-primary`).
//! - `backup` ([`periodic`]) — `config.openshift.io/v1alpha1` Backup: a
//!   CronJob named after it whose runs prune old backups and request an
//!   EtcdBackup.
//!
//! The logic is plain Rust over typed inputs ([`api`], [`settings`],
//! [`workloads`]); the WebAssembly glue is the one `export_plugin!` at the
//! bottom of this file.

pub mod api;
pub mod cron;
pub mod etcdbackup;
pub mod periodic;
pub mod settings;
pub mod workloads;

use serde_json::Value;
use wasmop_sdk::k8s_openapi::api::batch::v1::{CronJob, Job};
use wasmop_sdk::k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use wasmop_sdk::{
    Controller, KindRef, Manifest, Plan, Plugin, Read, ReconcileError, Selector, SettingsProblem,
    Snapshot,
};

use crate::api::{APP_LABEL, BACKUP_JOB_APP, CRONJOB_APP, backup_kind, etcd_backup_kind};
use crate::settings::{DEFAULT_TARGET_NAMESPACE, Settings};

/// Name of the EtcdBackup controller.
pub const ETCD_BACKUP_CONTROLLER: &str = "etcdbackup";
/// Name of the Backup controller.
pub const BACKUP_CONTROLLER: &str = "backup";

/// The `backup` plugin.
#[derive(Debug)]
pub struct BackupPlugin;

/// The setting naming the target namespace, the one namespace the
/// controllers write into (cluster-scoped primaries have none of their own).
const TARGET_NAMESPACE_SETTING: &str = "targetNamespace";

/// Declares the target namespace as the controller's write namespace: the
/// host resolves `setting:targetNamespace` from the settings at load, and
/// resolves an absent setting to nothing, so the setting's default is
/// declared too. With `targetNamespace` set to another namespace, the
/// controllers may write there and into the default one; the plugin only
/// ever writes into the configured one (see the unit tests).
fn write_namespaces(controller: Controller) -> Controller {
    controller
        .write_namespace_from_setting(TARGET_NAMESPACE_SETTING)
        .write_namespace(DEFAULT_TARGET_NAMESPACE)
}

impl Plugin for BackupPlugin {
    fn manifest() -> Manifest {
        let job = KindRef::of::<Job>();
        // Kind-scoped: one debounced call over every EtcdBackup computes the
        // serial queue once (the primaries are the snapshot's list, so no
        // read of EtcdBackups is needed).
        let etcd_backups = Controller::new(ETCD_BACKUP_CONTROLLER, etcd_backup_kind())
            .kind_scope()
            .owns(job.clone())
            // An EtcdBackup whose requesting Job (a scheduled run) is gone
            // deletes itself: a cluster-scoped object cannot be
            // garbage-collected through its namespaced owner.
            .delete_primary()
            .reads(Read::new(
                etcdbackup::READ_BACKUP_JOBS,
                job.clone(),
                Selector::Labels(format!("{APP_LABEL}={BACKUP_JOB_APP}")),
            ))
            .reads(Read::new(
                etcdbackup::READ_RUNS,
                job,
                Selector::Labels(format!("{APP_LABEL}={CRONJOB_APP}")),
            ))
            // The backup Jobs' Pods: a Pod that may still run holds the
            // slot whatever became of its Job, and an unschedulable one
            // fails its backup after `schedulingTimeoutSeconds`.
            .reads(Read::new(
                etcdbackup::READ_BACKUP_PODS,
                KindRef::of::<Pod>(),
                Selector::Labels(format!("{APP_LABEL}={BACKUP_JOB_APP}")),
            ))
            // A PVC named by spec.pvcName in a namespace that is a setting
            // cannot be selected by a field reference of a cluster-scoped
            // primary; the plugin picks it out of every PVC it sees.
            .reads(Read::new(
                etcdbackup::READ_PVCS,
                KindRef::of::<PersistentVolumeClaim>(),
                Selector::ClusterWide,
            ));
        // The scheduled runs' Jobs: a Backup whose last run failed is not
        // `Scheduled=True`.
        let backups = Controller::new(BACKUP_CONTROLLER, backup_kind())
            .owns(KindRef::of::<CronJob>())
            .reads(Read::new(
                periodic::READ_RUNS,
                KindRef::of::<Job>(),
                Selector::Labels(format!("{APP_LABEL}={CRONJOB_APP}")),
            ));
        Manifest::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION"))
            .controller(write_namespaces(etcd_backups))
            .controller(write_namespaces(backups))
    }

    fn validate_settings(settings: &Value) -> Result<(), Vec<SettingsProblem>> {
        Settings::parse(settings).map(|_| ())
    }

    fn reconcile(snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
        match snapshot.controller.as_str() {
            ETCD_BACKUP_CONTROLLER => etcdbackup::reconcile(snapshot),
            BACKUP_CONTROLLER => periodic::reconcile(snapshot),
            other => Err(ReconcileError::internal(format!(
                "unknown controller {other:?}"
            ))),
        }
    }
}

#[cfg(target_arch = "wasm32")]
wasmop_sdk::export_plugin!(BackupPlugin);

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use wasmop_sdk::OwnedKind;
    use wasmop_sdk::testing::{SnapshotBuilder, run};

    #[test]
    fn manifest_declares_both_cluster_scoped_controllers_and_their_reads() {
        let m = BackupPlugin::manifest();
        assert_eq!(m.name, "backup");
        let names: Vec<&str> = m.controllers.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, [ETCD_BACKUP_CONTROLLER, BACKUP_CONTROLLER]);
        let eb = &m.controllers[0];
        assert!(!eb.primary.namespaced);
        assert_eq!(eb.primary.api_version(), "operator.openshift.io/v1alpha1");
        assert_eq!(eb.owns, [OwnedKind::reference(KindRef::of::<Job>())]);
        let reads: Vec<(&str, &Selector)> = eb
            .reads
            .iter()
            .map(|r| (r.id.as_str(), &r.selector))
            .collect();
        assert_eq!(
            reads,
            [
                (
                    "backup-jobs",
                    &Selector::Labels("app=cluster-backup-job".into())
                ),
                (
                    "scheduled-runs",
                    &Selector::Labels("app=cluster-backup-cronjob".into())
                ),
                (
                    "backup-pods",
                    &Selector::Labels("app=cluster-backup-job".into())
                ),
                ("pvcs", &Selector::ClusterWide),
            ]
        );
        let b = &m.controllers[1];
        assert_eq!(b.primary.api_version(), "config.openshift.io/v1alpha1");
        assert!(!b.primary.namespaced);
        assert_eq!(b.owns, [OwnedKind::reference(KindRef::of::<CronJob>())]);
        let reads: Vec<(&str, &Selector)> = b
            .reads
            .iter()
            .map(|r| (r.id.as_str(), &r.selector))
            .collect();
        assert_eq!(
            reads,
            [(
                "scheduled-runs",
                &Selector::Labels("app=cluster-backup-cronjob".into())
            )]
        );
        for c in &m.controllers {
            assert_eq!(
                c.write_namespaces,
                ["setting:targetNamespace", "openshift-etcd"]
            );
            assert_eq!(c.finalizer, None);
        }
        assert!(eb.delete_primary, "orphaned EtcdBackups delete themselves");
        assert_eq!(
            eb.scope,
            wasmop_sdk::Scope::Kind,
            "one call over all EtcdBackups"
        );
        assert_eq!(b.scope, wasmop_sdk::Scope::Object);
        assert!(!b.delete_primary);
    }

    #[test]
    fn settings_are_validated_with_every_problem() {
        assert_eq!(BackupPlugin::validate_settings(&json!({})), Ok(()));
        let problems = BackupPlugin::validate_settings(&json!({"targetNamespace": "", "bogus": 1}))
            .unwrap_err();
        assert_eq!(problems[0].path, "bogus");
    }

    #[test]
    fn an_unknown_controller_is_an_internal_error() {
        let s = SnapshotBuilder::new("nope").build();
        assert!(matches!(
            run::<BackupPlugin>(&s),
            Err(ReconcileError::Internal(_))
        ));
    }
}
