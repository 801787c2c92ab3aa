//! The workloads the plugin writes: the Job that takes one backup and the
//! CronJob that requests backups on a schedule. Pure builders from the
//! settings and the primary; the controllers decide when to use them.
//!
//! The Pod shapes follow upstream's: the backup Job runs on etcd's nodes in
//! the host network with the etcd client certificate, the CA bundle and the
//! node's static-pod files mounted, and writes into the PVC; a scheduled run
//! first prunes old backups on the PVC (retention) and then creates an
//! EtcdBackup owned by its own Job, which the EtcdBackup controller queues
//! like any other.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::{CronJob, CronJobSpec, Job, JobSpec, JobTemplateSpec};
use k8s_openapi::api::core::v1::{
    ConfigMapVolumeSource, Container, EnvVar, EnvVarSource, HostPathVolumeSource,
    ObjectFieldSelector, PersistentVolumeClaimVolumeSource, PodSpec, PodTemplateSpec,
    ResourceRequirements, SecretVolumeSource, SecurityContext, Toleration, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::json;
use wasmop_sdk::{k8s_openapi, stable_hash};

use crate::api::{
    APP_LABEL, BACKUP_JOB_APP, BACKUP_NAME_LABEL, CRONJOB_APP, EtcdBackup, EtcdSchedule, Retention,
};
use crate::settings::Settings;

/// Where the PVC is mounted in every backup container.
pub const BACKUP_MOUNT: &str = "/etc/kubernetes/cluster-backup";
/// Environment variable holding the directory one backup is saved to.
pub const BACKUP_PATH_ENV: &str = "CLUSTER_BACKUP_PATH";
/// The command the backup image provides.
pub const TOOL: &str = "cluster-etcd-operator";
/// Longest name of a CronJob (its Jobs append an 11-character suffix).
pub const MAX_CRONJOB_NAME: usize = 52;

const CLIENT_CERT_DIR: &str = "/var/run/secrets/etcd-client";
const CA_DIR: &str = "/var/run/configmaps/etcd-ca";
const PVC_VOLUME: &str = "etc-kubernetes-cluster-backup";

/// Name of the Job that takes the backup of the EtcdBackup with this uid:
/// `cluster-backup-job-` and 10 hex characters of a hash of the uid, so the
/// same EtcdBackup always gets the same Job (a create that races another is
/// refused, never doubled) and a recreated one a new Job.
pub fn backup_job_name(uid: &str) -> String {
    let hash = stable_hash(&json!(uid));
    format!("{BACKUP_JOB_APP}-{}", &hash[..10])
}

/// A label value naming `name`: the name itself when it fits (63
/// characters), else its first 63 characters without trailing `-`/`.`.
pub fn label_value(name: &str) -> String {
    let cut: String = name.chars().take(63).collect();
    cut.trim_end_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_owned()
}

/// The directory the backup of `backup` started at `now` is saved to:
/// `<mount>/backup-<name>-<YYYY-MM-DD_HHMMSS>` (UTC).
pub fn backup_path(backup: &EtcdBackup, now: &k8s_openapi::jiff::Timestamp) -> String {
    format!(
        "{BACKUP_MOUNT}/backup-{}-{}",
        backup.name(),
        now.strftime("%Y-%m-%d_%H%M%S")
    )
}

/// The backup directory a Job was started with (its `CLUSTER_BACKUP_PATH`).
pub fn job_backup_path(job: &Job) -> Option<&str> {
    job.spec
        .as_ref()?
        .template
        .spec
        .as_ref()?
        .containers
        .iter()
        .flat_map(|c| c.env.iter().flatten())
        .find(|e| e.name == BACKUP_PATH_ENV)
        .and_then(|e| e.value.as_deref())
}

/// The Job that saves one backup of etcd into `backup`'s PVC, at `path`.
pub fn backup_job(settings: &Settings, backup: &EtcdBackup, path: &str) -> Job {
    let mut env = vec![
        env(BACKUP_PATH_ENV, path),
        env("ETCDCTL_CERT", &format!("{CLIENT_CERT_DIR}/tls.crt")),
        env("ETCDCTL_KEY", &format!("{CLIENT_CERT_DIR}/tls.key")),
        env("ETCDCTL_CACERT", &format!("{CA_DIR}/ca-bundle.crt")),
    ];
    if !settings.etcd_endpoints.is_empty() {
        env.push(self::env(
            "ETCDCTL_ENDPOINTS",
            &settings.etcd_endpoints.join(","),
        ));
    }
    let etcd_mounts = [
        mount(PVC_VOLUME, BACKUP_MOUNT),
        mount("etcd-client", CLIENT_CERT_DIR),
        mount("etcd-ca", CA_DIR),
    ];
    let verify = Container {
        name: "verify-storage".into(),
        command: Some(strings(&[TOOL, "verify", "backup-storage"])),
        resources: Some(requests("50Mi", "5m")),
        volume_mounts: Some(etcd_mounts.to_vec()),
        ..privileged(settings)
    };
    let mut backup_mounts = vec![
        mount("usr-local-bin", "/usr/local/bin"),
        mount("resources-dir", "/etc/kubernetes/static-pod-resources"),
        mount("cert-dir", "/etc/kubernetes/static-pod-certs"),
        mount("static-pod-dir", "/etc/kubernetes/manifests"),
    ];
    backup_mounts.extend(etcd_mounts);
    let take = Container {
        name: "cluster-backup".into(),
        command: Some(strings(&[
            TOOL,
            "cluster-backup",
            "--backup-dir",
            &format!("$({BACKUP_PATH_ENV})"),
        ])),
        env: Some(env),
        resources: Some(requests("80Mi", "10m")),
        volume_mounts: Some(backup_mounts),
        ..privileged(settings)
    };
    let volumes = vec![
        host_path("usr-local-bin", "/usr/local/bin"),
        host_path("static-pod-dir", "/etc/kubernetes/manifests"),
        host_path("resources-dir", "/etc/kubernetes/static-pod-resources"),
        host_path(
            "cert-dir",
            "/etc/kubernetes/static-pod-resources/etcd-certs",
        ),
        Volume {
            name: "etcd-client".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(settings.etcd_client_secret.clone()),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        },
        Volume {
            name: "etcd-ca".into(),
            config_map: Some(ConfigMapVolumeSource {
                name: settings.etcd_ca_config_map.clone(),
                ..ConfigMapVolumeSource::default()
            }),
            ..Volume::default()
        },
        pvc(&backup.pvc_name),
    ];
    let pod = PodSpec {
        init_containers: Some(vec![verify]),
        containers: vec![take],
        volumes: Some(volumes),
        host_network: Some(true),
        restart_policy: Some("Never".into()),
        // Upstream's bound, kept on the Pod (the kubelet enforces it)…
        active_deadline_seconds: Some(i64::from(settings.backup_deadline_seconds)),
        ..placement(settings)
    };
    Job {
        metadata: ObjectMeta {
            name: Some(backup_job_name(backup.uid())),
            namespace: Some(settings.target_namespace.clone()),
            labels: Some(labels(&[
                (APP_LABEL, BACKUP_JOB_APP),
                (BACKUP_NAME_LABEL, &label_value(backup.name())),
            ])),
            ..ObjectMeta::default()
        },
        spec: Some(JobSpec {
            // …and on the Job, which the Job controller enforces whatever
            // the Pod's state: a Pod that is never scheduled, or whose node
            // stopped answering, has no kubelet to end it.
            active_deadline_seconds: Some(i64::from(settings.backup_deadline_seconds)),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels(&[(APP_LABEL, BACKUP_JOB_APP)])),
                    ..ObjectMeta::default()
                }),
                spec: Some(pod),
            },
            ..JobSpec::default()
        }),
        status: None,
    }
}

/// The arguments of the retention step of a scheduled run.
pub fn retention_args(retention: Retention) -> Vec<String> {
    match retention {
        Retention::Number(n) => vec![
            "prune-backups".into(),
            "--type=RetentionNumber".into(),
            format!("--maxNumberOfBackups={n}"),
        ],
        Retention::Size(gb) => vec![
            "prune-backups".into(),
            "--type=RetentionSize".into(),
            format!("--maxSizeOfBackupsGb={gb}"),
        ],
    }
}

/// The CronJob of the Backup `name`: on `etcd.schedule` (in `etcd.timeZone`
/// when set), one run at a time, each run pruning old backups on the PVC
/// and then requesting an EtcdBackup owned by the run's Job.
pub fn backup_cronjob(
    settings: &Settings,
    name: &str,
    etcd: &EtcdSchedule,
    retention: Retention,
) -> CronJob {
    let backup_name = label_value(name);
    let pod_labels = labels(&[(APP_LABEL, CRONJOB_APP)]);
    let retain = Container {
        name: "retention".into(),
        command: Some(strings(&[TOOL])),
        args: Some(retention_args(retention)),
        volume_mounts: Some(vec![mount(PVC_VOLUME, BACKUP_MOUNT)]),
        ..privileged(settings)
    };
    let request = Container {
        name: "cluster-backup".into(),
        image: Some(settings.image.clone()),
        image_pull_policy: Some("IfNotPresent".into()),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        command: Some(strings(&[TOOL])),
        args: Some(vec![
            "request-backup".into(),
            format!("--pvc-name={}", etcd.pvc_name),
        ]),
        env: Some(vec![
            env_from_label("MY_JOB_NAME", "batch.kubernetes.io/job-name"),
            env_from_label("MY_JOB_UID", "batch.kubernetes.io/controller-uid"),
        ]),
        ..Container::default()
    };
    let pod = PodSpec {
        init_containers: Some(vec![retain]),
        containers: vec![request],
        volumes: Some(vec![pvc(&etcd.pvc_name)]),
        service_account_name: Some(settings.service_account_name.clone()),
        restart_policy: Some("OnFailure".into()),
        ..placement(settings)
    };
    CronJob {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(settings.target_namespace.clone()),
            labels: Some(labels(&[
                (APP_LABEL, CRONJOB_APP),
                (BACKUP_NAME_LABEL, &backup_name),
            ])),
            ..ObjectMeta::default()
        },
        spec: Some(CronJobSpec {
            schedule: etcd.schedule.clone(),
            time_zone: Some(etcd.time_zone.clone()).filter(|tz| !tz.is_empty()),
            concurrency_policy: Some("Forbid".into()),
            failed_jobs_history_limit: Some(10),
            successful_jobs_history_limit: Some(5),
            job_template: JobTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels(&[
                        (APP_LABEL, CRONJOB_APP),
                        (BACKUP_NAME_LABEL, &backup_name),
                    ])),
                    ..ObjectMeta::default()
                }),
                spec: Some(JobSpec {
                    template: PodTemplateSpec {
                        metadata: Some(ObjectMeta {
                            labels: Some(pod_labels),
                            ..ObjectMeta::default()
                        }),
                        spec: Some(pod),
                    },
                    ..JobSpec::default()
                }),
            },
            ..CronJobSpec::default()
        }),
        status: None,
    }
}

/// Node selector, tolerations and priority shared by every backup Pod.
fn placement(settings: &Settings) -> PodSpec {
    PodSpec {
        node_selector: Some(settings.node_selector.clone()),
        tolerations: Some(vec![Toleration {
            operator: Some("Exists".into()),
            ..Toleration::default()
        }]),
        priority_class_name: Some(settings.priority_class_name.clone())
            .filter(|class| !class.is_empty()),
        ..PodSpec::default()
    }
}

/// A container of the backup image that may read the node's files.
fn privileged(settings: &Settings) -> Container {
    Container {
        image: Some(settings.image.clone()),
        image_pull_policy: Some("IfNotPresent".into()),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        security_context: Some(SecurityContext {
            privileged: Some(true),
            ..SecurityContext::default()
        }),
        ..Container::default()
    }
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn env(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: Some(value.to_owned()),
        value_from: None,
    }
}

fn env_from_label(name: &str, label: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                api_version: None,
                field_path: format!("metadata.labels['{label}']"),
            }),
            ..EnvVarSource::default()
        }),
    }
}

fn mount(volume: &str, path: &str) -> VolumeMount {
    VolumeMount {
        name: volume.to_owned(),
        mount_path: path.to_owned(),
        ..VolumeMount::default()
    }
}

fn host_path(name: &str, path: &str) -> Volume {
    Volume {
        name: name.to_owned(),
        host_path: Some(HostPathVolumeSource {
            path: path.to_owned(),
            type_: None,
        }),
        ..Volume::default()
    }
}

fn pvc(claim: &str) -> Volume {
    Volume {
        name: PVC_VOLUME.to_owned(),
        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
            claim_name: claim.to_owned(),
            read_only: None,
        }),
        ..Volume::default()
    }
}

fn requests(memory: &str, cpu: &str) -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("memory".to_owned(), Quantity(memory.to_owned())),
            ("cpu".to_owned(), Quantity(cpu.to_owned())),
        ])),
        ..ResourceRequirements::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn etcd_backup() -> EtcdBackup {
        EtcdBackup::from_value(&json!({
            "metadata": {"name": "nightly", "uid": "3f0c-uid"},
            "spec": {"pvcName": "etcd-backup-pvc"},
        }))
        .unwrap()
    }

    fn now() -> k8s_openapi::jiff::Timestamp {
        "2025-03-04T05:06:07Z".parse().unwrap()
    }

    #[test]
    fn job_names_are_stable_per_uid_and_fit_a_label() {
        let a = backup_job_name("uid-a");
        assert_eq!(a, backup_job_name("uid-a"));
        assert_ne!(a, backup_job_name("uid-b"));
        assert!(a.starts_with("cluster-backup-job-") && a.len() <= 63, "{a}");
    }

    #[test]
    fn label_values_are_cut_to_63_characters_ending_alphanumeric() {
        assert_eq!(label_value("short"), "short");
        let long = format!("{}-.{}", "a".repeat(61), "b".repeat(10));
        assert_eq!(label_value(&long), "a".repeat(61));
    }

    #[test]
    fn backup_path_names_the_backup_and_the_start_time() {
        assert_eq!(
            backup_path(&etcd_backup(), &now()),
            "/etc/kubernetes/cluster-backup/backup-nightly-2025-03-04_050607"
        );
    }

    #[test]
    fn backup_job_runs_in_the_target_namespace_with_the_pvc_and_settings() {
        let settings = Settings {
            target_namespace: "backups".into(),
            image: "img:1".into(),
            etcd_endpoints: vec!["https://a:2379".into(), "https://b:2379".into()],
            ..Settings::default()
        };
        let job = backup_job(
            &settings,
            &etcd_backup(),
            "/etc/kubernetes/cluster-backup/x",
        );
        let v = serde_json::to_value(&job).unwrap();
        assert_eq!(v["metadata"]["namespace"], "backups");
        assert_eq!(
            v["metadata"]["labels"],
            json!({"app": "cluster-backup-job", "backup-name": "nightly"})
        );
        assert!(v["metadata"].get("ownerReferences").is_none());
        let pod = &v["spec"]["template"]["spec"];
        assert_eq!(pod["hostNetwork"], true);
        assert_eq!(pod["restartPolicy"], "Never");
        assert_eq!(pod["activeDeadlineSeconds"], 900);
        assert_eq!(
            v["spec"]["activeDeadlineSeconds"], 900,
            "the Job controller bounds the Job whatever its Pod's state"
        );
        let shorter = Settings {
            backup_deadline_seconds: 30,
            ..settings.clone()
        };
        let bounded = serde_json::to_value(backup_job(&shorter, &etcd_backup(), "/x")).unwrap();
        assert_eq!(bounded["spec"]["activeDeadlineSeconds"], 30);
        assert_eq!(
            bounded["spec"]["template"]["spec"]["activeDeadlineSeconds"],
            30
        );
        assert_eq!(pod["priorityClassName"], "system-node-critical");
        assert_eq!(
            pod["nodeSelector"],
            json!({"node-role.kubernetes.io/master": ""})
        );
        assert_eq!(pod["containers"][0]["image"], "img:1");
        assert_eq!(pod["initContainers"][0]["image"], "img:1");
        let claim = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == PVC_VOLUME)
            .unwrap();
        assert_eq!(
            claim["persistentVolumeClaim"]["claimName"],
            "etcd-backup-pvc"
        );
        let env = pod["containers"][0]["env"].as_array().unwrap();
        assert!(env.contains(
            &json!({"name": "ETCDCTL_ENDPOINTS", "value": "https://a:2379,https://b:2379"})
        ));
        assert_eq!(
            job_backup_path(&job),
            Some("/etc/kubernetes/cluster-backup/x")
        );
    }

    #[test]
    fn no_endpoint_setting_means_no_endpoint_variable_and_no_priority_means_none() {
        let settings = Settings {
            priority_class_name: String::new(),
            ..Settings::default()
        };
        let job = backup_job(&settings, &etcd_backup(), "/p");
        let v = serde_json::to_value(&job).unwrap();
        let pod = &v["spec"]["template"]["spec"];
        assert!(pod.get("priorityClassName").is_none());
        let env = pod["containers"][0]["env"].as_array().unwrap();
        assert!(env.iter().all(|e| e["name"] != "ETCDCTL_ENDPOINTS"));
    }

    #[test]
    fn cronjob_carries_schedule_zone_retention_and_the_request() {
        let etcd: EtcdSchedule = serde_json::from_value(json!({
            "schedule": "0 3 * * *", "timeZone": "Etc/UTC", "pvcName": "p",
        }))
        .unwrap();
        let cj = backup_cronjob(&Settings::default(), "daily", &etcd, Retention::Size(4));
        let v = serde_json::to_value(&cj).unwrap();
        assert_eq!(v["metadata"]["name"], "daily");
        assert_eq!(v["metadata"]["namespace"], "openshift-etcd");
        assert_eq!(v["spec"]["schedule"], "0 3 * * *");
        assert_eq!(v["spec"]["timeZone"], "Etc/UTC");
        assert_eq!(v["spec"]["concurrencyPolicy"], "Forbid");
        let pod = &v["spec"]["jobTemplate"]["spec"]["template"]["spec"];
        assert_eq!(
            pod["initContainers"][0]["args"],
            json!([
                "prune-backups",
                "--type=RetentionSize",
                "--maxSizeOfBackupsGb=4"
            ])
        );
        assert_eq!(
            pod["containers"][0]["args"],
            json!(["request-backup", "--pvc-name=p"])
        );
        assert_eq!(pod["serviceAccountName"], "etcd-backup-sa");
        assert_eq!(pod["restartPolicy"], "OnFailure");
        assert_eq!(
            v["spec"]["jobTemplate"]["metadata"]["labels"]["app"],
            "cluster-backup-cronjob"
        );
    }

    #[test]
    fn cronjob_without_time_zone_leaves_it_unset() {
        let etcd: EtcdSchedule =
            serde_json::from_value(json!({"schedule": "@hourly", "pvcName": "p"})).unwrap();
        let cj = backup_cronjob(&Settings::default(), "h", &etcd, Retention::Number(15));
        let v = serde_json::to_value(&cj).unwrap();
        assert!(v["spec"].get("timeZone").is_none());
        assert_eq!(
            retention_args(Retention::Number(15)),
            [
                "prune-backups",
                "--type=RetentionNumber",
                "--maxNumberOfBackups=15"
            ]
        );
    }
}
