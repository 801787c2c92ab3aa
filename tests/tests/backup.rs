//! The `backup` plugin (plugins/backup) in the real operator on the local
//! control plane: serial on-demand backups, a missing PVC, backups requested
//! by a scheduled run that went away, a Backup's CronJob, and upstream's API
//! validation cases against the CRDs.
//!
//! EtcdBackup and Backup are cluster-scoped, so every operator sees every
//! one of them, and a backup queue is cluster-wide: the tests in this file
//! run one at a time (`SERIAL`), give every object a unique name, use their
//! own TestNamespace as the plugin's target namespace (with a PVC named
//! after it), label what they create `wasmop.dev/test=backup`, and delete
//! their cluster-scoped objects when they end.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{Event, Node, PersistentVolumeClaim, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use wasmop::controller::OperatorConfig;
use wasmop_tests::operator::{RunningOperator, load_plugin, plugin_path, test_config};
use wasmop_tests::widgets::TempDir;
use wasmop_tests::{DEFAULT_DEADLINE, TestNamespace, apply_crd_files, repo_root, wait_for};

/// One test of this file at a time: they share the cluster-wide queue.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const TEST_LABEL: &str = "wasmop.dev/test";
const TEST_LABEL_VALUE: &str = "backup";

/// Long enough for three backups one after the other on kwok.
const SERIAL_DEADLINE: Duration = Duration::from_secs(180);

fn etcd_backup_resource() -> ApiResource {
    let gvk = GroupVersionKind::gvk("operator.openshift.io", "v1alpha1", "EtcdBackup");
    ApiResource::from_gvk_with_plural(&gvk, "etcdbackups")
}

fn backup_resource() -> ApiResource {
    let gvk = GroupVersionKind::gvk("config.openshift.io", "v1alpha1", "Backup");
    ApiResource::from_gvk_with_plural(&gvk, "backups")
}

fn etcd_backups(client: &Client) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &etcd_backup_resource())
}

fn backups(client: &Client) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &backup_resource())
}

/// Applies the plugin's two CRDs (not every CRD of `crds/`: other plugins'
/// CRDs are not this file's concern).
async fn apply_backup_crds(client: &Client) -> Result<()> {
    let dir = repo_root().join("crds");
    let files: Vec<PathBuf> = [
        "operator.openshift.io_etcdbackups.yaml",
        "config.openshift.io_backups.yaml",
    ]
    .iter()
    .map(|f| dir.join(f))
    .collect();
    apply_crd_files(client, &files).await?;
    Ok(())
}

/// Deletes the cluster-scoped objects a test made when dropped (also when
/// the test fails), and before that, leftovers of earlier runs that died.
struct ClusterObjects {
    created: Arc<Mutex<Vec<(ApiResource, String)>>>,
}

impl ClusterObjects {
    /// Deletes test objects older than ten minutes (no test of this file
    /// runs that long), then starts recording.
    async fn new(client: &Client) -> Result<Self> {
        let stale_before = Timestamp::now() - Duration::from_secs(600);
        let selector = ListParams::default().labels(&format!("{TEST_LABEL}={TEST_LABEL_VALUE}"));
        for api in [etcd_backups(client), backups(client)] {
            for obj in api.list(&selector).await?.items {
                if obj.creation_timestamp().is_some_and(|t| t.0 < stale_before) {
                    let _ = api
                        .delete(&obj.name_any(), &DeleteParams::background())
                        .await;
                }
            }
        }
        Ok(Self {
            created: Arc::default(),
        })
    }

    fn record(&self, resource: ApiResource, name: &str) {
        self.created
            .lock()
            .expect("cleanup list")
            .push((resource, name.to_owned()));
    }
}

impl Drop for ClusterObjects {
    fn drop(&mut self) {
        let created = std::mem::take(&mut *self.created.lock().expect("cleanup list"));
        if created.is_empty() {
            return;
        }
        // As TestNamespace does: a runtime and a client of our own, since the
        // test's runtime is blocked in this drop.
        let done = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                let Ok(client) = wasmop_tests::client().await else {
                    return;
                };
                for (resource, name) in created {
                    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
                    let _ = api.delete(&name, &DeleteParams::background()).await;
                }
            });
        });
        let _ = done.join();
    }
}

fn test_labels() -> Value {
    json!({TEST_LABEL: TEST_LABEL_VALUE})
}

async fn create_etcd_backup(
    client: &Client,
    objects: &ClusterObjects,
    name: &str,
    pvc: &str,
) -> Result<DynamicObject> {
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "operator.openshift.io/v1alpha1", "kind": "EtcdBackup",
        "metadata": {"name": name, "labels": test_labels()},
        "spec": {"pvcName": pvc},
    }))?;
    let created = etcd_backups(client)
        .create(&PostParams::default(), &obj)
        .await
        .with_context(|| format!("creating EtcdBackup {name}"))?;
    objects.record(etcd_backup_resource(), name);
    Ok(created)
}

/// A PVC of the cluster's default StorageClass (kwok binds it), bound.
async fn create_bound_pvc(ns: &TestNamespace, name: &str) -> Result<()> {
    let pvcs: Api<PersistentVolumeClaim> = ns.api();
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }))?;
    pvcs.create(&PostParams::default(), &pvc).await?;
    wait_for(&format!("PVC {name} Bound"), DEFAULT_DEADLINE, || {
        let pvcs = pvcs.clone();
        async move {
            let pvc = pvcs.get(name).await?;
            let phase = pvc.status.and_then(|s| s.phase).unwrap_or_default();
            Ok((phase == "Bound").then_some(()))
        }
    })
    .await
}

/// The backup plugin's settings for a test: its target namespace the
/// test's.
fn backup_settings(ns: &TestNamespace) -> Value {
    json!({
        "targetNamespace": ns.name,
        "image": "registry.invalid/etcd-backup-tools:test",
        // kwok's node; backups normally run on etcd's (master) nodes.
        "nodeSelector": {"type": "kwok"},
        // A request whose run is gone is deleted 5 s after it was made
        // (a minute by default).
        "orphanGraceSeconds": 5,
    })
}

/// [`backup_settings`] with the keys of `extra` set.
fn backup_settings_with(ns: &TestNamespace, extra: Value) -> Value {
    let mut settings = backup_settings(ns);
    for (k, v) in extra.as_object().into_iter().flatten() {
        settings[k] = v.clone();
    }
    settings
}

/// The operator with the backup plugin under `settings`.
async fn start_operator_settings(ns: &TestNamespace, settings: Value) -> Result<RunningOperator> {
    let plugin = load_plugin("backup", settings)?;
    RunningOperator::start_with(
        ns.client.clone(),
        vec![ns.name.clone()],
        vec![plugin],
        test_config(),
    )
    .await
}

/// The operator with the backup plugin, its target namespace the test's.
async fn start_operator(ns: &TestNamespace) -> Result<RunningOperator> {
    start_operator_with(ns, test_config()).await
}

async fn start_operator_with(
    ns: &TestNamespace,
    config: OperatorConfig,
) -> Result<RunningOperator> {
    let plugin = load_plugin("backup", backup_settings(ns))?;
    // Namespaced kinds are watched in the target namespace only; the
    // cluster-scoped EtcdBackup and Backup are watched cluster-wide anyway.
    RunningOperator::start_with(
        ns.client.clone(),
        vec![ns.name.clone()],
        vec![plugin],
        config,
    )
    .await
}

fn condition<'a>(obj: &'a DynamicObject, type_: &str) -> Option<&'a Value> {
    obj.data["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

fn is_true(obj: &DynamicObject, type_: &str) -> bool {
    condition(obj, type_).is_some_and(|c| c["status"] == "True")
}

fn job_finished(job: &Job) -> bool {
    job.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
        })
}

fn controller_name(job: &Job) -> Option<String> {
    job.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .map(|o| o.name.clone())
}

#[tokio::test]
async fn three_etcd_backups_run_one_job_at_a_time_to_completion() -> Result<()> {
    let _serial = SERIAL.lock().await;
    let ns = TestNamespace::new("backup-serial").await?;
    apply_backup_crds(&ns.client).await?;
    let objects = ClusterObjects::new(&ns.client).await?;
    let pvc = format!("{}-pvc", ns.name);
    create_bound_pvc(&ns, &pvc).await?;
    let _op = start_operator(&ns).await?;

    let names: Vec<String> = ["a", "b", "c"]
        .iter()
        .map(|s| format!("{}-{s}", ns.name))
        .collect();
    for name in &names {
        create_etcd_backup(&ns.client, &objects, name, &pvc).await?;
    }

    // Until all three completed, every look at the namespace must show at
    // most one unfinished backup Job.
    let jobs: Api<Job> = ns.api();
    let overlaps: Arc<Mutex<Vec<String>>> = Arc::default();
    let api = etcd_backups(&ns.client);
    wait_for(
        "the three EtcdBackups BackupCompleted",
        SERIAL_DEADLINE,
        || {
            let (jobs, api, overlaps, names) =
                (jobs.clone(), api.clone(), overlaps.clone(), names.clone());
            async move {
                let listed = jobs
                    .list(&ListParams::default().labels("app=cluster-backup-job"))
                    .await?;
                let running: Vec<String> = listed
                    .items
                    .iter()
                    .filter(|j| !job_finished(j))
                    .map(|j| j.name_any())
                    .collect();
                if running.len() > 1 {
                    overlaps.lock().expect("overlaps").push(running.join(", "));
                }
                let mut states = Vec::new();
                for name in &names {
                    let b = api.get(name).await?;
                    if condition(&b, "BackupFailed").is_some_and(|c| c["status"] == "True") {
                        bail!("{name} failed: {}", b.data["status"]);
                    }
                    states.push(is_true(&b, "BackupCompleted"));
                }
                if states.iter().all(|done| *done) {
                    return Ok(Some(()));
                }
                bail!("completed: {states:?}; unfinished Jobs: {running:?}")
            }
        },
    )
    .await?;
    let overlaps = overlaps.lock().expect("overlaps").clone();
    assert!(
        overlaps.is_empty(),
        "backup Jobs ran at the same time: {overlaps:?}"
    );

    // One Job per backup, started in creation order, each after the one
    // before had completed.
    let mut ours: Vec<Job> = jobs
        .list(&ListParams::default().labels("app=cluster-backup-job"))
        .await?
        .items
        .into_iter()
        .filter(|j| controller_name(j).is_some_and(|n| names.contains(&n)))
        .collect();
    ours.sort_by_key(|j| {
        (
            j.metadata.creation_timestamp.clone().map(|t| t.0),
            j.name_any(),
        )
    });
    let order: Vec<String> = ours.iter().filter_map(controller_name).collect();
    assert_eq!(order, names, "one Job per backup, in creation order");
    for pair in ours.windows(2) {
        let done = pair[0]
            .status
            .as_ref()
            .and_then(|s| s.completion_time.clone())
            .context("a completed Job has a completionTime")?;
        let started = pair[1]
            .metadata
            .creation_timestamp
            .clone()
            .context("creationTimestamp")?;
        assert!(
            started.0 >= done.0,
            "{} was created at {} before {} completed at {}",
            pair[1].name_any(),
            started.0,
            pair[0].name_any(),
            done.0
        );
    }
    for job in &ours {
        let labels = job.metadata.labels.clone().unwrap_or_default();
        assert_eq!(
            labels.get("app").map(String::as_str),
            Some("cluster-backup-job")
        );
        assert_eq!(labels.get("backup-name"), controller_name(job).as_ref());
    }

    // Final statuses as upstream: BackupCompleted, BackupPending flipped to
    // False, backupJob naming the Job in the target namespace.
    for (name, job) in names.iter().zip(&ours) {
        let b = api.get(name).await?;
        assert!(
            is_true(&b, "BackupCompleted"),
            "{name}: {}",
            b.data["status"]
        );
        assert_eq!(
            condition(&b, "BackupPending").map(|c| c["status"].clone()),
            Some(json!("False")),
            "{name}: {}",
            b.data["status"]
        );
        assert_eq!(
            b.data["status"]["backupJob"],
            json!({"namespace": ns.name, "name": job.name_any()})
        );
    }
    Ok(())
}

#[tokio::test]
async fn a_backup_of_a_missing_pvc_fails_naming_it() -> Result<()> {
    let _serial = SERIAL.lock().await;
    let ns = TestNamespace::new("backup-nopvc").await?;
    apply_backup_crds(&ns.client).await?;
    let objects = ClusterObjects::new(&ns.client).await?;
    let _op = start_operator(&ns).await?;
    let name = format!("{}-lost", ns.name);
    let missing = format!("{}-nowhere", ns.name);
    create_etcd_backup(&ns.client, &objects, &name, &missing).await?;

    let api = etcd_backups(&ns.client);
    let failed = wait_for(&format!("{name} BackupFailed"), DEFAULT_DEADLINE, || {
        let (api, name) = (api.clone(), name.clone());
        async move {
            let b = api.get(&name).await?;
            match condition(&b, "BackupFailed") {
                Some(c) if c["status"] == "True" => Ok(Some(c.clone())),
                _ => bail!("status: {}", b.data["status"]),
            }
        }
    })
    .await?;
    let message = failed["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!("unable to find PVC [{missing}]")),
        "{message}"
    );
    let jobs: Api<Job> = ns.api();
    assert!(
        jobs.list(&ListParams::default()).await?.items.is_empty(),
        "no Job for a backup without its PVC"
    );
    Ok(())
}

/// Creates an EtcdBackup as a scheduled run's `request-backup` does: owned
/// (not controlled) by the run's Job.
async fn create_requested_backup(
    client: &Client,
    objects: &ClusterObjects,
    name: &str,
    pvc: &str,
    run: &Job,
) -> Result<()> {
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "operator.openshift.io/v1alpha1", "kind": "EtcdBackup",
        "metadata": {"name": name, "labels": test_labels(),
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                                          "name": run.name_any(), "uid": run.uid()}]},
        "spec": {"pvcName": pvc},
    }))?;
    etcd_backups(client)
        .create(&PostParams::default(), &obj)
        .await
        .with_context(|| format!("creating EtcdBackup {name}"))?;
    objects.record(etcd_backup_resource(), name);
    Ok(())
}

/// Waits until `name` has condition `type_` True and returns the object.
async fn wait_true(api: &Api<DynamicObject>, name: &str, type_: &str) -> Result<DynamicObject> {
    wait_for(&format!("{name}: {type_}=True"), DEFAULT_DEADLINE, || {
        let api = api.clone();
        async move {
            let b = api.get(name).await?;
            if is_true(&b, type_) {
                Ok(Some(b))
            } else {
                bail!("status: {}", b.data["status"])
            }
        }
    })
    .await
}

#[tokio::test]
async fn a_backup_whose_requesting_run_is_gone_is_deleted() -> Result<()> {
    let _serial = SERIAL.lock().await;
    let ns = TestNamespace::new("backup-orphan").await?;
    apply_backup_crds(&ns.client).await?;
    let objects = ClusterObjects::new(&ns.client).await?;
    let pvc = format!("{}-pvc", ns.name);
    create_bound_pvc(&ns, &pvc).await?;
    let _op = start_operator(&ns).await?;

    // A stand-in for a scheduled run: a Job labelled like the CronJob's.
    let jobs: Api<Job> = ns.api();
    let run: Job = serde_json::from_value(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "nightly-run", "labels": {"app": "cluster-backup-cronjob"}},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "nodeSelector": {"type": "kwok"},
            "containers": [{"name": "request", "image": "registry.invalid/etcd-backup-tools:test"}]}}},
    }))?;
    let run = jobs.create(&PostParams::default(), &run).await?;
    let api = etcd_backups(&ns.client);

    // Requested by a living run: it is taken like any other backup (its Job
    // goes to the target namespace, a write namespace the host resolved
    // from the `targetNamespace` setting), and stays.
    let requested = format!("{}-requested", ns.name);
    create_requested_backup(&ns.client, &objects, &requested, &pvc, &run).await?;
    wait_true(&api, &requested, "BackupCompleted").await?;
    assert!(api.get_opt(&requested).await?.is_some());

    // The run goes: the operator deletes the backup (the controller
    // declares delete-primary; the delete carries its uid and
    // resourceVersion).
    jobs.delete("nightly-run", &DeleteParams::background())
        .await?;
    wait_gone(&api, &requested).await?;

    // Requested by a run that is already gone: deleted before it starts.
    let late = format!("{}-late", ns.name);
    create_requested_backup(&ns.client, &objects, &late, &pvc, &run).await?;
    wait_gone(&api, &late).await?;
    let started_for_late = jobs
        .list(&ListParams::default().labels("app=cluster-backup-job"))
        .await?
        .items
        .into_iter()
        .filter(|j| controller_name(j).as_deref() == Some(late.as_str()))
        .count();
    assert_eq!(started_for_late, 0, "no Job for a backup nobody waits for");
    Ok(())
}

/// Waits until the EtcdBackup `name` no longer exists.
async fn wait_gone(api: &Api<DynamicObject>, name: &str) -> Result<()> {
    wait_for(
        &format!("EtcdBackup {name} deleted"),
        DEFAULT_DEADLINE,
        || {
            let api = api.clone();
            let name = name.to_owned();
            async move {
                match api.get_opt(&name).await? {
                    None => Ok(Some(())),
                    Some(b) => bail!("still there; status: {}", b.data["status"]),
                }
            }
        },
    )
    .await
}

async fn wait_cronjob(
    cronjobs: &Api<CronJob>,
    name: &str,
    what: &str,
    check: impl Fn(&Value) -> bool + Clone,
) -> Result<Value> {
    wait_for(what, DEFAULT_DEADLINE, || {
        let (cronjobs, check) = (cronjobs.clone(), check.clone());
        async move {
            let Some(cj) = cronjobs.get_opt(name).await? else {
                bail!("no CronJob {name} yet");
            };
            let v = serde_json::to_value(&cj)?;
            if check(&v) {
                Ok(Some(v))
            } else {
                bail!("CronJob spec: {}", v["spec"])
            }
        }
    })
    .await
}

fn retention_args(cronjob: &Value) -> Value {
    cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["initContainers"][0]["args"].clone()
}

#[tokio::test]
async fn a_backup_keeps_a_cronjob_that_follows_its_edits_and_goes_with_it() -> Result<()> {
    let _serial = SERIAL.lock().await;
    let ns = TestNamespace::new("backup-cron").await?;
    apply_backup_crds(&ns.client).await?;
    let objects = ClusterObjects::new(&ns.client).await?;
    let _op = start_operator(&ns).await?;

    let name = format!("{}-nightly", ns.name);
    ensure!(name.len() <= 52, "test name {name} too long for a CronJob");
    let backup: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "config.openshift.io/v1alpha1", "kind": "Backup",
        "metadata": {"name": name, "labels": test_labels()},
        "spec": {"etcd": {"schedule": "0 2 * * *", "pvcName": "etcd-backup-pvc",
                          "retentionPolicy": {"retentionType": "RetentionNumber",
                                              "retentionNumber": {"maxNumberOfBackups": 3}}}},
    }))?;
    let api = backups(&ns.client);
    let created = api.create(&PostParams::default(), &backup).await?;
    objects.record(backup_resource(), &name);

    let cronjobs: Api<CronJob> = ns.api();
    let cj = wait_cronjob(&cronjobs, &name, "the Backup's CronJob", |v| {
        v["spec"]["schedule"] == "0 2 * * *"
    })
    .await?;
    assert_eq!(cj["spec"]["concurrencyPolicy"], "Forbid");
    assert!(cj["spec"].get("timeZone").is_none());
    assert_eq!(
        retention_args(&cj),
        json!([
            "prune-backups",
            "--type=RetentionNumber",
            "--maxNumberOfBackups=3"
        ])
    );
    assert_eq!(
        cj["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["args"],
        json!(["request-backup", "--pvc-name=etcd-backup-pvc"])
    );
    assert_eq!(cj["metadata"]["labels"]["app"], "cluster-backup-cronjob");
    let owner = &cj["metadata"]["ownerReferences"][0];
    assert_eq!(owner["kind"], "Backup");
    assert_eq!(owner["uid"], json!(created.uid()));
    assert_eq!(owner["controller"], true);
    let first_uid = cj["metadata"]["uid"].clone();
    wait_for("the Backup Scheduled", DEFAULT_DEADLINE, || {
        let (api, name) = (api.clone(), name.clone());
        async move {
            let b = api.get(&name).await?;
            Ok(is_true(&b, "Scheduled").then_some(()))
        }
    })
    .await?;

    // An edit of schedule, time zone and retention reaches the CronJob.
    api.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"etcd": {
            "schedule": "30 3 * * 1-5", "timeZone": "Etc/UTC",
            "retentionPolicy": {"retentionType": "RetentionSize", "retentionNumber": null,
                                "retentionSize": {"maxSizeOfBackupsGb": 7}}}}})),
    )
    .await?;
    let cj = wait_cronjob(&cronjobs, &name, "the CronJob to follow the edit", |v| {
        v["spec"]["schedule"] == "30 3 * * 1-5"
            && v["spec"]["timeZone"] == "Etc/UTC"
            && retention_args(v)
                == json!([
                    "prune-backups",
                    "--type=RetentionSize",
                    "--maxSizeOfBackupsGb=7"
                ])
    })
    .await?;
    assert_eq!(
        cj["metadata"]["uid"], first_uid,
        "the CronJob is updated in place, not replaced"
    );

    // Another edit: back to a predefined schedule without a time zone.
    api.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"etcd": {"schedule": "@weekly", "timeZone": null}}})),
    )
    .await?;
    wait_cronjob(
        &cronjobs,
        &name,
        "the CronJob to follow the second edit",
        |v| v["spec"]["schedule"] == "@weekly" && v["spec"].get("timeZone").is_none(),
    )
    .await?;

    // Deleting the Backup garbage-collects its CronJob.
    api.delete(&name, &DeleteParams::background()).await?;
    wait_for("the CronJob garbage-collected", DEFAULT_DEADLINE, || {
        let cronjobs = cronjobs.clone();
        let name = name.clone();
        async move { Ok(cronjobs.get_opt(&name).await?.is_none().then_some(())) }
    })
    .await?;
    Ok(())
}

/// One case of upstream's API validation suites (openshift/api
/// `tests/<crd>/AutomatedEtcdBackup.yaml`), transcribed: the spec sent, and
/// the error expected (a substring), if any.
struct Case {
    name: &'static str,
    spec: Value,
    error: Option<&'static str>,
}

fn case(name: &'static str, spec: Value, error: Option<&'static str>) -> Case {
    Case { name, spec, error }
}

fn etcd_backup_cases() -> Vec<Case> {
    vec![
        case("a valid spec", json!({"pvcName": "etcdbackup-pvc"}), None),
        case("no pvcName", json!({}), None),
    ]
}

fn backup_cases() -> Vec<Case> {
    const SCHEDULE: Option<&str> = Some("spec.etcd.schedule in body should match");
    const ZONE: Option<&str> = Some("spec.etcd.timeZone in body should match");
    let with_pvc = |extra: Value| {
        let mut etcd = json!({"pvcName": "etcdbackup-pvc"});
        for (k, v) in extra.as_object().into_iter().flatten() {
            etcd[k] = v.clone();
        }
        json!({"etcd": etcd})
    };
    vec![
        case(
            "a valid spec",
            with_pvc(json!({"schedule": "* 2 * * *"})),
            None,
        ),
        case(
            "no pvcName",
            json!({"etcd": {"schedule": "* 2 * * *"}}),
            None,
        ),
        case(
            "weekdays at 22:00",
            with_pvc(json!({"schedule": "0 22 * * 1-5"})),
            None,
        ),
        case(
            "Sundays at 04:05",
            with_pvc(json!({"schedule": "5 4 * * SUN"})),
            None,
        ),
        case(
            "predefined @hourly",
            with_pvc(json!({"schedule": "@hourly"})),
            None,
        ),
        case(
            "unknown day FOO",
            with_pvc(json!({"schedule": "5 4 * * FOO"})),
            SCHEDULE,
        ),
        case(
            "misspelt @hourli",
            with_pvc(json!({"schedule": "@hourli"})),
            SCHEDULE,
        ),
        case(
            "non-standard 5L",
            with_pvc(json!({"schedule": "* * * * 5L"})),
            SCHEDULE,
        ),
        case(
            "non-standard L-5",
            with_pvc(json!({"schedule": "* * L-5 * *"})),
            SCHEDULE,
        ),
        case(
            "non-standard 15W",
            with_pvc(json!({"schedule": "* * 15W * *"})),
            SCHEDULE,
        ),
        case(
            "zone Africa/Banjul",
            with_pvc(json!({"timeZone": "Africa/Banjul"})),
            None,
        ),
        case(
            "zone Etc/GMT-8",
            with_pvc(json!({"timeZone": "Etc/GMT-8"})),
            None,
        ),
        case(
            "zone Etc/UTC",
            with_pvc(json!({"timeZone": "Etc/UTC"})),
            None,
        ),
        case(
            "zone America/Argentina/Catamarca",
            with_pvc(json!({"timeZone": "America/Argentina/Catamarca"})),
            None,
        ),
        case("zone GMT2", with_pvc(json!({"timeZone": "GMT2"})), ZONE),
        case("zone GMT+3", with_pvc(json!({"timeZone": "GMT+3"})), ZONE),
    ]
}

/// Creates an object of `resource` with `spec`; returns what the API
/// server stored or the text of its refusal.
async fn try_create(
    client: &Client,
    objects: &ClusterObjects,
    resource: &ApiResource,
    spec: &Value,
) -> Result<std::result::Result<DynamicObject, String>> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), resource);
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": resource.api_version, "kind": resource.kind,
        "metadata": {"generateName": "wasmop-validation-", "labels": test_labels()},
        "spec": spec,
    }))?;
    match api.create(&PostParams::default(), &obj).await {
        Ok(created) => {
            objects.record(resource.clone(), &created.name_any());
            Ok(Ok(created))
        }
        Err(kube::Error::Api(status)) => Ok(Err(status.message)),
        Err(e) => Err(e.into()),
    }
}

#[tokio::test]
async fn upstream_api_validation_cases_pass_or_fail_as_upstream_expects() -> Result<()> {
    let _serial = SERIAL.lock().await;
    let client = wasmop_tests::client().await?;
    apply_backup_crds(&client).await?;
    let objects = ClusterObjects::new(&client).await?;

    let suites = [
        ("EtcdBackup", etcd_backup_resource(), etcd_backup_cases()),
        ("Backup", backup_resource(), backup_cases()),
    ];
    assert_eq!(
        suites
            .iter()
            .map(|(_, _, cases)| cases.len())
            .sum::<usize>(),
        18,
        "upstream has 2 + 16 onCreate cases"
    );
    let mut wrong = BTreeMap::new();
    for (kind, resource, cases) in &suites {
        for case in cases {
            let label = format!("{kind}: {}", case.name);
            match (
                try_create(&client, &objects, resource, &case.spec).await?,
                case.error,
            ) {
                (Ok(created), None) => {
                    if created.data["spec"] != case.spec {
                        wrong.insert(
                            label,
                            format!(
                                "stored spec {} differs from {}",
                                created.data["spec"], case.spec
                            ),
                        );
                    }
                }
                (Ok(_), Some(expected)) => {
                    wrong.insert(
                        label,
                        format!("accepted, expected an error with {expected:?}"),
                    );
                }
                (Err(message), None) => {
                    wrong.insert(label, format!("refused: {message}"));
                }
                (Err(message), Some(expected)) => {
                    if !message.contains(expected) {
                        wrong.insert(
                            label,
                            format!("refused with {message:?}, expected {expected:?}"),
                        );
                    }
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "cases not as upstream expects: {wrong:#?}"
    );

    // Upstream's one onUpdate case: pvcName cannot change once set.
    let created = try_create(
        &client,
        &objects,
        &etcd_backup_resource(),
        &json!({"pvcName": "etcdbackup-pvc"}),
    )
    .await?
    .map_err(anyhow::Error::msg)?;
    let refused = etcd_backups(&client)
        .patch(
            &created.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"pvcName": "updated-etcdbackup-pvc"}})),
        )
        .await;
    match refused {
        Err(kube::Error::Api(status)) => assert!(
            status
                .message
                .contains("spec.pvcName: Invalid value: \"string\": pvcName is immutable once set"),
            "{}",
            status.message
        ),
        other => panic!("changing pvcName must be refused, got {other:?}"),
    }
    Ok(())
}

/// The EtcdBackup controller is kind-scoped: EtcdBackups that exist when
/// the operator starts are all planned by one call, and the debounced
/// changes that follow (statuses, the first Job) make a few more calls
/// over all of them, not one per backup; the serial queue holds throughout.
/// Each call is recorded (`--record`) and replays equal with the plugin
/// that made it, and a shadow of the same plugin is compared primary by
/// primary and found equal.
#[tokio::test]
async fn etcd_backups_are_reconciled_together_by_kind_calls() -> Result<()> {
    const BACKUPS: usize = 6;
    const CONTROLLER: &str = "backup/etcdbackup";
    let _serial = SERIAL.lock().await;
    let ns = TestNamespace::new("backup-kind").await?;
    apply_backup_crds(&ns.client).await?;
    let objects = ClusterObjects::new(&ns.client).await?;
    let pvc = format!("{}-pvc", ns.name);
    create_bound_pvc(&ns, &pvc).await?;
    let names: Vec<String> = (0..BACKUPS).map(|i| format!("{}-{i}", ns.name)).collect();
    for name in &names {
        create_etcd_backup(&ns.client, &objects, name, &pvc).await?;
    }
    let metric = |name: &str| {
        wasmop::metrics::global()
            .get(name, &[("controller", CONTROLLER)])
            .unwrap_or(0.0)
    };
    let calls_before = metric("wasmop_kind_calls_total");
    let covered_before = metric("wasmop_kind_call_primaries_total");
    let shadow_count = |result: &str| {
        wasmop::metrics::global()
            .get(
                "wasmop_shadow_plans_total",
                &[("controller", CONTROLLER), ("result", result)],
            )
            .unwrap_or(0.0)
    };
    let (equal_before, different_before) = (shadow_count("equal"), shadow_count("different"));
    let dir = TempDir::new("wasmop-record-kind");
    let recorder = Arc::new(wasmop::record::Recorder::new(dir.0.clone(), 64 << 20)?);
    let config = OperatorConfig {
        recorder: Some(recorder),
        ..test_config()
    };
    let op = start_operator_with(&ns, config).await?;
    op.operator
        .set_shadow(load_plugin("backup", backup_settings(&ns))?)
        .map_err(anyhow::Error::msg)?;

    // Every backup gets a status: one starts, the others queue behind it.
    let api = etcd_backups(&ns.client);
    let jobs: Api<Job> = ns.api();
    let overlaps: Arc<Mutex<Vec<String>>> = Arc::default();
    wait_for("every EtcdBackup has a status", SERIAL_DEADLINE, || {
        let (api, jobs, names, overlaps) =
            (api.clone(), jobs.clone(), names.clone(), overlaps.clone());
        async move {
            let listed = jobs
                .list(&ListParams::default().labels("app=cluster-backup-job"))
                .await?;
            let running: Vec<String> = listed
                .items
                .iter()
                .filter(|j| !job_finished(j))
                .map(|j| j.name_any())
                .collect();
            if running.len() > 1 {
                overlaps.lock().expect("overlaps").push(running.join(", "));
            }
            let mut missing = Vec::new();
            for name in &names {
                let b = api.get(name).await?;
                if b.data["status"]["conditions"]
                    .as_array()
                    .is_none_or(Vec::is_empty)
                {
                    missing.push(name.clone());
                }
            }
            if missing.is_empty() {
                Ok(Some(()))
            } else {
                bail!("no status yet: {missing:?}")
            }
        }
    })
    .await?;
    let calls = metric("wasmop_kind_calls_total") - calls_before;
    let covered = metric("wasmop_kind_call_primaries_total") - covered_before;
    ensure!(calls >= 1.0, "no kind call was made");
    // One call per debounced batch of changes, each over every backup:
    // far fewer calls than backups, and no call over fewer than all six.
    ensure!(
        calls < BACKUPS as f64,
        "{calls} kind calls for {BACKUPS} backups: changes were not batched"
    );
    ensure!(
        covered >= calls * BACKUPS as f64,
        "{calls} kind calls covered only {covered} EtcdBackups in all"
    );

    // The queue as one call computed it: the oldest runs (or ran), each
    // other waits with the number of backups ahead of it in its message,
    // and never two Jobs at once.
    // (Read again until one consistent view: a later call may move the
    // queue between two reads.)
    wait_for(
        "the queued backups hold distinct places",
        DEFAULT_DEADLINE,
        || {
            let (api, names) = (api.clone(), names.clone());
            async move {
                let mut ahead_counts = Vec::new();
                for name in &names {
                    let b = api.get(name).await?;
                    if let Some(message) = condition(&b, "BackupPending")
                        .filter(|c| c["reason"] == "BackupQueued" && c["status"] == "True")
                        .and_then(|c| c["message"].as_str())
                    {
                        let ahead: usize = message
                            .rsplit("; ")
                            .next()
                            .and_then(|tail| tail.split(' ').next())
                            .and_then(|n| n.parse().ok())
                            .with_context(|| format!("{name}: queue message {message:?}"))?;
                        ahead_counts.push(ahead);
                    }
                }
                let mut sorted = ahead_counts.clone();
                sorted.sort_unstable();
                sorted.dedup();
                if sorted.len() == ahead_counts.len() && ahead_counts.len() >= BACKUPS - 2 {
                    Ok(Some(()))
                } else {
                    bail!("places in the queue: {ahead_counts:?}")
                }
            }
        },
    )
    .await?;
    let overlaps = overlaps.lock().expect("overlaps").clone();
    assert!(
        overlaps.is_empty(),
        "backup Jobs ran at the same time: {overlaps:?}"
    );
    let ours = jobs
        .list(&ListParams::default().labels("app=cluster-backup-job"))
        .await?
        .items
        .into_iter()
        .filter(|j| controller_name(j).is_some_and(|n| names.contains(&n)))
        .filter(|j| !job_finished(j))
        .count();
    ensure!(ours <= 1, "{ours} unfinished backup Jobs at once");

    // Every kind call was recorded, each recording holding every backup it
    // covered, and every recording replays equal with the same plugin.
    let recorded: Vec<PathBuf> = std::fs::read_dir(&dir.0)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.ends_with("-etcdbackup-kind-EtcdBackup.json"))
        })
        .collect();
    ensure!(
        !recorded.is_empty(),
        "no recording of a kind call among {:?}",
        std::fs::read_dir(&dir.0)?
            .filter_map(Result::ok)
            .map(|e| e.file_name())
            .collect::<Vec<_>>()
    );
    for file in &recorded {
        let doc: Value = serde_json::from_str(&std::fs::read_to_string(file)?)?;
        let items = doc["items"].as_array().context("a List")?;
        let backups: Vec<&str> = items
            .iter()
            .filter(|o| o["kind"] == "EtcdBackup")
            .filter_map(|o| o["metadata"]["name"].as_str())
            .collect();
        let declared = items
            .iter()
            .find(|o| o["kind"] == wasmop::record::RECORDED_KIND)
            .and_then(|r| r["primary"]["primaries"].as_u64())
            .context("a Recorded document counting the primaries")?;
        ensure!(
            backups.len() as u64 == declared,
            "{}: {} EtcdBackups recorded, {declared} covered",
            file.display(),
            backups.len()
        );
    }
    let last = recorded.iter().max().context("a recording")?;
    let doc = std::fs::read_to_string(last)?;
    ensure!(
        names
            .iter()
            .all(|n| doc.contains(&format!("\"name\": \"{n}\""))),
        "the last kind call's recording misses one of {names:?}"
    );
    let candidate = plugin_path("backup")?;
    let record_dir = dir.0.clone();
    let report = tokio::task::spawn_blocking(move || {
        let load = wasmop::cli::PluginArgs {
            compile_cache: None,
            no_compile_cache: true,
            deadline_ms: 2000,
            memory_mib: 64,
        };
        wasmop::cli::replay::replay(&record_dir, &candidate, &[], &load)
    })
    .await?
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    ensure!(
        report.recordings >= recorded.len() && report.different == 0,
        "replay of {} recordings: {} different: {:?}",
        report.recordings,
        report.different,
        report.replays
    );

    // The shadow (the same plugin) was called on the kind calls and
    // compared per primary: equal for every backup, never different.
    wait_for(
        "the shadow compared every backup",
        DEFAULT_DEADLINE,
        || async {
            let equal = shadow_count("equal") - equal_before;
            if equal >= BACKUPS as f64 {
                Ok(Some(()))
            } else {
                bail!("{equal} equal shadow comparisons so far")
            }
        },
    )
    .await?;
    let different = shadow_count("different") - different_before;
    ensure!(different == 0.0, "{different} shadow comparisons differ");
    Ok(())
}

/// A PVC no one binds (a StorageClass with no provisioner; kwok binds
/// only `kwok-volume` claims): a Pod that mounts it is never scheduled.
async fn create_unbound_pvc(ns: &TestNamespace, name: &str) -> Result<()> {
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "wasmop-test-unbound",
                 "resources": {"requests": {"storage": "1Gi"}}},
    }))?;
    ns.api::<PersistentVolumeClaim>()
        .create(&PostParams::default(), &pvc)
        .await?;
    Ok(())
}

/// The backup Job the EtcdBackup `name` controls, once there is one.
async fn job_of_backup(jobs: &Api<Job>, name: &str) -> Result<Job> {
    wait_for(&format!("the Job of {name}"), DEFAULT_DEADLINE, || {
        let jobs = jobs.clone();
        async move {
            let found = jobs
                .list(&ListParams::default().labels("app=cluster-backup-job"))
                .await?
                .items
                .into_iter()
                .find(|j| controller_name(j).as_deref() == Some(name));
            Ok(found)
        }
    })
    .await
}

/// The Jobs of backup Jobs controlled by `name` (none, once it is gone).
async fn jobs_of_backup(jobs: &Api<Job>, name: &str) -> Result<Vec<Job>> {
    Ok(jobs
        .list(&ListParams::default().labels("app=cluster-backup-job"))
        .await?
        .items
        .into_iter()
        .filter(|j| controller_name(j).as_deref() == Some(name))
        .collect())
}

/// Waits until `name`'s condition `type_` is True and returns it.
async fn wait_condition(
    api: &Api<DynamicObject>,
    name: &str,
    type_: &str,
    deadline: Duration,
) -> Result<Value> {
    wait_for(&format!("{name}: {type_}=True"), deadline, || {
        let api = api.clone();
        async move {
            let b = api.get(name).await?;
            match condition(&b, type_) {
                Some(c) if c["status"] == "True" => Ok(Some(c.clone())),
                _ => bail!("status: {}", b.data["status"]),
            }
        }
    })
    .await
}

/// The Events recorded about the cluster-scoped object `name` (they go to
/// namespace `default`): (type, reason, note).
async fn events_about(client: &Client, name: &str) -> Result<Vec<(String, String, String)>> {
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let lp = ListParams::default().fields(&format!("involvedObject.name={name}"));
    Ok(events
        .list(&lp)
        .await?
        .items
        .into_iter()
        .map(|e| {
            (
                e.type_.unwrap_or_default(),
                e.reason.unwrap_or_default(),
                e.message.unwrap_or_default(),
            )
        })
        .collect())
}

/// Waits for an Event about `name` with this type and reason whose note
/// contains `part`.
async fn wait_event(
    client: &Client,
    name: &str,
    type_: &str,
    reason: &str,
    part: &str,
) -> Result<()> {
    wait_for(
        &format!("a {type_} Event {reason} about {name}"),
        DEFAULT_DEADLINE,
        || async move {
            let events = events_about(client, name).await?;
            if events
                .iter()
                .any(|(t, r, note)| t == type_ && r == reason && note.contains(part))
            {
                Ok(Some(()))
            } else {
                bail!("events: {events:?}")
            }
        },
    )
    .await
}

/// Item 7: a backup whose Pod is never scheduled fails after
/// `schedulingTimeoutSeconds`, its Job is deleted, and the next backup in
/// the queue runs. (Before: it stayed BackupPending and every later backup
/// waited behind it for good.)
#[tokio::test]
async fn a_backup_whose_pod_is_never_scheduled_fails_and_the_next_one_runs() -> Result<()> {
    let _serial = SERIAL.lock().await;
    let ns = TestNamespace::new("backup-unsched").await?;
    apply_backup_crds(&ns.client).await?;
    let objects = ClusterObjects::new(&ns.client).await?;
    let pvc = format!("{}-pvc", ns.name);
    create_bound_pvc(&ns, &pvc).await?;
    let unbound = format!("{}-unbound", ns.name);
    create_unbound_pvc(&ns, &unbound).await?;
    let _op = start_operator_settings(
        &ns,
        backup_settings_with(&ns, json!({"schedulingTimeoutSeconds": 5})),
    )
    .await?;

    let stuck = format!("{}-a", ns.name);
    let next = format!("{}-b", ns.name);
    create_etcd_backup(&ns.client, &objects, &stuck, &unbound).await?;
    let jobs: Api<Job> = ns.api();
    let job = job_of_backup(&jobs, &stuck).await?;
    create_etcd_backup(&ns.client, &objects, &next, &pvc).await?;

    let api = etcd_backups(&ns.client);
    let failed = wait_condition(&api, &stuck, "BackupFailed", DEFAULT_DEADLINE).await?;
    assert_eq!(failed["reason"], "PodUnschedulable", "{failed}");
    let message = failed["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!(
            "of Job {}/{} could not be scheduled for",
            ns.name,
            job.name_any()
        )) && message.contains("(schedulingTimeoutSeconds: 5)")
            && message.ends_with("; the Job is deleted"),
        "{message}"
    );
    // Failed within the bound: the timeout plus a few seconds of work.
    let created = job
        .metadata
        .creation_timestamp
        .clone()
        .context("creationTimestamp")?;
    let at: Timestamp = failed["lastTransitionTime"]
        .as_str()
        .context("lastTransitionTime")?
        .parse()?;
    let took = at.duration_since(created.0);
    assert!(
        took.as_secs() >= 5 && took.as_secs() <= 30,
        "failed {took:?} after its Job was created"
    );
    wait_for(
        "the unschedulable backup's Job deleted",
        DEFAULT_DEADLINE,
        || {
            let (jobs, stuck) = (jobs.clone(), stuck.clone());
            async move {
                Ok(jobs_of_backup(&jobs, &stuck)
                    .await?
                    .is_empty()
                    .then_some(()))
            }
        },
    )
    .await?;
    wait_event(
        &ns.client,
        &stuck,
        "Warning",
        "BackupFailed",
        "could not be scheduled",
    )
    .await?;

    // The queue moved on: the next backup ran to completion.
    wait_condition(&api, &next, "BackupCompleted", SERIAL_DEADLINE).await?;
    Ok(())
}

/// Deletes the test's Nodes when dropped.
struct Nodes(Vec<String>);

impl Drop for Nodes {
    fn drop(&mut self) {
        let names = std::mem::take(&mut self.0);
        wasmop_tests::cleanup_from_drop(move |client| async move {
            let nodes: Api<Node> = Api::all(client);
            for name in names {
                let _ = nodes.delete(&name, &DeleteParams::background()).await;
            }
            Ok(())
        });
    }
}

/// Item 7: a backup whose Pod's node goes NotReady fails at the Job's
/// deadline (`backupDeadlineSeconds`, enforced by the Job controller, which
/// needs no kubelet), and the next backup runs once that Pod counts as
/// lost. (Before: only the Pod had a deadline, which the node's kubelet
/// enforces; the backup stayed BackupPending for good.)
#[tokio::test]
async fn a_backup_whose_node_goes_not_ready_fails_at_its_deadline_and_the_next_one_runs()
-> Result<()> {
    let _serial = SERIAL.lock().await;
    let ns = TestNamespace::new("backup-lostnode").await?;
    apply_backup_crds(&ns.client).await?;
    let objects = ClusterObjects::new(&ns.client).await?;
    let pvc = format!("{}-pvc", ns.name);
    create_bound_pvc(&ns, &pvc).await?;
    // Backups go to the nodes carrying this test's label only.
    let label = "wasmop.dev/backup-test";
    let nodes: Api<Node> = Api::all(ns.client.clone());
    let lost = format!("{}-lost", ns.name);
    let good = format!("{}-good", ns.name);
    let _nodes = Nodes(vec![lost.clone(), good.clone()]);
    let capacity = json!({"cpu": "8", "memory": "32Gi", "pods": "110"});
    // A Node no kwok manages, reported Ready as a kubelet would.
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": lost, "labels": {label: ns.name, "type": "lost"}},
        "status": {"capacity": capacity, "allocatable": capacity,
                   "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                   "message": "the test stands in for the kubelet",
                                   "lastHeartbeatTime": Timestamp::now().to_string(),
                                   "lastTransitionTime": Timestamp::now().to_string()}]},
    }))?;
    nodes.create(&PostParams::default(), &node).await?;
    let _op = start_operator_settings(
        &ns,
        backup_settings_with(
            &ns,
            json!({"nodeSelector": {label: ns.name}, "backupDeadlineSeconds": 15}),
        ),
    )
    .await?;

    let first = format!("{}-a", ns.name);
    let next = format!("{}-b", ns.name);
    create_etcd_backup(&ns.client, &objects, &first, &pvc).await?;
    let jobs: Api<Job> = ns.api();
    let job = job_of_backup(&jobs, &first).await?;
    assert_eq!(
        job.spec.as_ref().and_then(|s| s.active_deadline_seconds),
        Some(15),
        "the Job carries the deadline"
    );
    create_etcd_backup(&ns.client, &objects, &next, &pvc).await?;

    // Its Pod lands on the node; then the node goes NotReady and leaves the
    // backup nodes, and a kwok node takes its place.
    let pods: Api<Pod> = ns.api();
    let pod = wait_for(
        "the first backup's Pod on the node",
        DEFAULT_DEADLINE,
        || {
            let (pods, uid, lost) = (pods.clone(), job.uid().unwrap_or_default(), lost.clone());
            async move {
                let found = pods
                    .list(
                        &ListParams::default()
                            .labels(&format!("batch.kubernetes.io/controller-uid={uid}")),
                    )
                    .await?
                    .items
                    .into_iter()
                    .find(|p| {
                        p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(lost.as_str())
                    });
                Ok(found)
            }
        },
    )
    .await?;
    nodes
        .patch_status(
            &lost,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"conditions": [{"type": "Ready", "status": "False",
                "reason": "KubeletNotReady", "message": "the test took the node away",
                "lastHeartbeatTime": Timestamp::now().to_string(),
                "lastTransitionTime": Timestamp::now().to_string()}]}}),
            ),
        )
        .await?;
    nodes
        .patch(
            &lost,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {label: null}}})),
        )
        .await?;
    let kwok: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": good, "annotations": {"kwok.x-k8s.io/node": "fake"},
                     "labels": {label: ns.name, "type": "kwok-test"}},
        "status": {"capacity": capacity, "allocatable": capacity},
    }))?;
    nodes.create(&PostParams::default(), &kwok).await?;

    // The deadline fails the first backup.
    let api = etcd_backups(&ns.client);
    let failed = wait_condition(&api, &first, "BackupFailed", DEFAULT_DEADLINE).await?;
    let message = failed["message"].as_str().unwrap_or_default();
    assert!(message.contains("DeadlineExceeded"), "{message}");
    let phase = pods
        .get_opt(&pod.name_any())
        .await?
        .and_then(|p| p.status.and_then(|s| s.phase))
        .unwrap_or_default();
    assert_ne!(phase, "Succeeded", "the Pod on the lost node never ran");

    // The next one runs once that Pod counts as lost (its deletion a minute
    // overdue), on the kwok node.
    wait_condition(&api, &next, "BackupCompleted", SERIAL_DEADLINE).await?;
    let next_job = job_of_backup(&jobs, &next).await?;
    let next_pods = pods
        .list(&ListParams::default().labels(&format!(
            "batch.kubernetes.io/controller-uid={}",
            next_job.uid().unwrap_or_default()
        )))
        .await?
        .items;
    assert!(
        next_pods
            .iter()
            .all(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(good.as_str())),
        "the next backup ran on the Ready node"
    );
    // The Pod stuck on the lost node goes with the namespace.
    let _ = pods
        .delete(
            &pod.name_any(),
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..DeleteParams::default()
            },
        )
        .await;
    Ok(())
}

/// Item 8: a backup Job being deleted holds the slot until it is gone, and
/// then until its Pods are gone. (Before: a Job with a deletionTimestamp no
/// longer counted, and the next backup started beside its Pods.)
#[tokio::test]
async fn a_backup_job_being_deleted_holds_the_slot_until_its_pods_are_gone() -> Result<()> {
    const HOLD: &str = "wasmop.dev/test-hold";
    let _serial = SERIAL.lock().await;
    let ns = TestNamespace::new("backup-deleting").await?;
    apply_backup_crds(&ns.client).await?;
    let objects = ClusterObjects::new(&ns.client).await?;
    let pvc = format!("{}-pvc", ns.name);
    create_bound_pvc(&ns, &pvc).await?;
    let unbound = format!("{}-unbound", ns.name);
    create_unbound_pvc(&ns, &unbound).await?;
    let _op = start_operator(&ns).await?;

    // a's Pod is never scheduled (its PVC is never bound): its Job runs on.
    let first = format!("{}-a", ns.name);
    let next = format!("{}-b", ns.name);
    create_etcd_backup(&ns.client, &objects, &first, &unbound).await?;
    let jobs: Api<Job> = ns.api();
    let job = job_of_backup(&jobs, &first).await?;
    let pods: Api<Pod> = ns.api();
    let selector = format!(
        "batch.kubernetes.io/controller-uid={}",
        job.uid().unwrap_or_default()
    );
    let pod = wait_for("a's Pod", DEFAULT_DEADLINE, || {
        let (pods, selector) = (pods.clone(), selector.clone());
        async move {
            Ok(pods
                .list(&ListParams::default().labels(&selector))
                .await?
                .items
                .into_iter()
                .next())
        }
    })
    .await?;
    // Finalizers of the test's own keep the Job and then the Pod around
    // while they are being deleted.
    let hold = Patch::Merge(json!({"metadata": {"finalizers": [HOLD]}}));
    jobs.patch(&job.name_any(), &PatchParams::default(), &hold)
        .await?;
    let pod_finalizers: Vec<String> = pod
        .metadata
        .finalizers
        .clone()
        .unwrap_or_default()
        .into_iter()
        .chain([HOLD.to_owned()])
        .collect();
    pods.patch(
        &pod.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": pod_finalizers}})),
    )
    .await?;
    create_etcd_backup(&ns.client, &objects, &next, &pvc).await?;
    let api = etcd_backups(&ns.client);
    wait_condition(&api, &next, "BackupPending", DEFAULT_DEADLINE).await?;

    jobs.delete(&job.name_any(), &DeleteParams::background())
        .await?;
    // b waits, naming a's Job as being deleted, and has no Job.
    let waiting_for = |part: String| {
        let (api, jobs, next) = (api.clone(), jobs.clone(), next.clone());
        async move {
            wait_for(&format!("{next} waiting: {part}"), DEFAULT_DEADLINE, || {
                let (api, jobs, next, part) =
                    (api.clone(), jobs.clone(), next.clone(), part.clone());
                async move {
                    ensure!(
                        jobs_of_backup(&jobs, &next).await?.is_empty(),
                        "{next} started next to a's Job or Pod"
                    );
                    let b = api.get(&next).await?;
                    let message = condition(&b, "BackupPending")
                        .and_then(|c| c["message"].as_str())
                        .unwrap_or_default()
                        .to_owned();
                    if message.contains(&part) {
                        Ok(Some(()))
                    } else {
                        bail!("status: {}", b.data["status"])
                    }
                }
            })
            .await
        }
    };
    waiting_for(format!(
        "(Job {}/{}, being deleted) to finish",
        ns.name,
        job.name_any()
    ))
    .await?;
    ensure!(
        jobs_of_backup(&jobs, &next).await?.is_empty(),
        "b started while a's Job was being deleted"
    );

    // The Job goes; its Pod, being deleted, stays (our finalizer).
    jobs.patch(
        &job.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await?;
    wait_for(
        "a's Job gone and its Pod being deleted",
        DEFAULT_DEADLINE,
        || {
            let (jobs, pods, job_name, pod_name) =
                (jobs.clone(), pods.clone(), job.name_any(), pod.name_any());
            async move {
                let job_gone = jobs.get_opt(&job_name).await?.is_none();
                let pod_deleting = pods
                    .get_opt(&pod_name)
                    .await?
                    .is_some_and(|p| p.metadata.deletion_timestamp.is_some());
                if !pod_deleting {
                    // Nothing deleted the Pod of the gone Job yet: do as the
                    // garbage collector will.
                    let _ = pods.delete(&pod_name, &DeleteParams::background()).await;
                }
                Ok((job_gone && pod_deleting).then_some(()))
            }
        },
    )
    .await?;
    waiting_for(format!(
        "its Pod {}/{} has not stopped",
        ns.name,
        pod.name_any()
    ))
    .await?;

    // The Pod goes: b runs.
    let remaining: Vec<String> = pods
        .get(&pod.name_any())
        .await?
        .metadata
        .finalizers
        .unwrap_or_default()
        .into_iter()
        .filter(|f| f != HOLD)
        .collect();
    pods.patch(
        &pod.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": remaining}})),
    )
    .await?;
    wait_condition(&api, &next, "BackupCompleted", SERIAL_DEADLINE).await?;
    Ok(())
}

/// A client acting as `user` (impersonated by the test's admin).
async fn client_as(user: &str) -> Result<Client> {
    let kubeconfig = kube::config::Kubeconfig::read_from(wasmop_tests::kubeconfig_path())?;
    let mut config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await?;
    config.auth_info.impersonate = Some(user.to_owned());
    Ok(Client::try_from(config)?)
}

/// Item 10: the shipped example's ServiceAccount may do what a scheduled
/// run does (create an EtcdBackup owned by its Job), and a Backup whose
/// last run failed is not `Scheduled=True` until a later run succeeds.
#[tokio::test]
async fn the_example_lets_runs_request_backups_and_a_failed_run_shows_on_the_backup() -> Result<()>
{
    let _serial = SERIAL.lock().await;
    let ns = TestNamespace::new("backup-example").await?;
    apply_backup_crds(&ns.client).await?;
    let objects = ClusterObjects::new(&ns.client).await?;

    // The example's ServiceAccount and RBAC, in the test's namespace, the
    // cluster-wide ones named after it.
    let text = std::fs::read_to_string(repo_root().join("deploy/examples/etcd-backup.yaml"))?;
    let mut rbac = 0;
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let mut obj: Value = serde::Deserialize::deserialize(doc)?;
        let kind = obj["kind"].as_str().unwrap_or_default().to_owned();
        let api_version = obj["apiVersion"].as_str().unwrap_or_default().to_owned();
        let cluster_wide = kind.starts_with("Cluster");
        if kind != "ServiceAccount" && !api_version.starts_with("rbac.authorization.k8s.io/") {
            continue;
        }
        if cluster_wide {
            let name = format!(
                "{}-{}",
                ns.name,
                obj["metadata"]["name"].as_str().unwrap_or_default()
            );
            obj["metadata"]["name"] = json!(name);
            obj["metadata"]["labels"] = test_labels();
        } else {
            obj["metadata"]["namespace"] = json!(ns.name);
        }
        if kind == "ClusterRoleBinding" {
            let role = format!(
                "{}-{}",
                ns.name,
                obj["roleRef"]["name"].as_str().unwrap_or_default()
            );
            obj["roleRef"]["name"] = json!(role);
        }
        for subject in obj["subjects"].as_array_mut().into_iter().flatten() {
            subject["namespace"] = json!(ns.name);
        }
        let (group, version) = api_version
            .split_once('/')
            .unwrap_or(("", api_version.as_str()));
        let plural = format!("{}s", kind.to_lowercase());
        let resource = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(group, version, &kind),
            &plural,
        );
        let api: Api<DynamicObject> = if cluster_wide {
            Api::all_with(ns.client.clone(), &resource)
        } else {
            Api::namespaced_with(ns.client.clone(), &ns.name, &resource)
        };
        let made: DynamicObject = serde_json::from_value(obj)?;
        api.create(&PostParams::default(), &made)
            .await
            .with_context(|| format!("creating the example's {kind}"))?;
        if cluster_wide {
            objects.record(resource, &made.name_any());
        }
        if kind != "ServiceAccount" {
            rbac += 1;
        }
    }
    ensure!(
        rbac > 0,
        "the example grants its runs' ServiceAccount nothing"
    );

    // As the runs' ServiceAccount: create an EtcdBackup owned by a run's
    // Job, as `request-backup` does (RBAC caches may take a moment).
    let jobs: Api<Job> = ns.api();
    let stand_in: Job = serde_json::from_value(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "nightly-run", "labels": {"app": "cluster-backup-cronjob"}},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "nodeSelector": {"type": "kwok"},
            "containers": [{"name": "request", "image": "registry.invalid/etcd-backup-tools:test"}]}}},
    }))?;
    let run = jobs.create(&PostParams::default(), &stand_in).await?;
    let runner = client_as(&format!("system:serviceaccount:{}:etcd-backup-sa", ns.name)).await?;
    let requested = format!("{}-requested", ns.name);
    wait_for("the runs' ServiceAccount may create an EtcdBackup", DEFAULT_DEADLINE, || {
        let (runner, requested, run) = (runner.clone(), requested.clone(), run.clone());
        async move {
            let obj: DynamicObject = serde_json::from_value(json!({
                "apiVersion": "operator.openshift.io/v1alpha1", "kind": "EtcdBackup",
                "metadata": {"name": requested, "labels": test_labels(),
                             "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": run.name_any(),
                                                  "uid": run.uid(), "blockOwnerDeletion": true}]},
                "spec": {"pvcName": "etcd-backup-pvc"},
            }))?;
            match etcd_backups(&runner).create(&PostParams::default(), &obj).await {
                Ok(_) => Ok(Some(())),
                Err(e) => bail!("refused: {e}"),
            }
        }
    })
    .await?;
    objects.record(etcd_backup_resource(), &requested);

    // A Backup whose run fails: Scheduled False, with a Warning Event, until
    // a later run succeeds (its Pod mounts the PVC).
    create_bound_pvc(&ns, "etcd-backup-pvc").await?;
    let _op = start_operator(&ns).await?;
    let name = format!("{}-nightly", ns.name);
    let backup: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "config.openshift.io/v1alpha1", "kind": "Backup",
        "metadata": {"name": name, "labels": test_labels()},
        "spec": {"etcd": {"schedule": "0 2 * * *", "pvcName": "etcd-backup-pvc"}},
    }))?;
    let api = backups(&ns.client);
    api.create(&PostParams::default(), &backup).await?;
    objects.record(backup_resource(), &name);
    wait_condition(&api, &name, "Scheduled", DEFAULT_DEADLINE).await?;
    let cronjobs: Api<CronJob> = ns.api();
    let cj = cronjobs.get(&name).await?;
    // A run as the CronJob controller makes it: its job template, owned by
    // the CronJob.
    let run_of = |suffix: &str, fail: bool| -> Result<Job> {
        let template = cj
            .spec
            .as_ref()
            .map(|s| s.job_template.clone())
            .context("a job template")?;
        let mut spec = serde_json::to_value(template.spec.context("a job spec")?)?;
        if fail {
            // Never scheduled, and a deadline: the Job fails at once, as a
            // run whose every attempt is refused fails at its backoff limit.
            spec["activeDeadlineSeconds"] = json!(1);
            spec["template"]["spec"]["nodeSelector"] = json!({"wasmop.dev/no-such-node": "x"});
        }
        Ok(serde_json::from_value(json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": format!("{name}-{suffix}"),
                         "labels": template.metadata.and_then(|m| m.labels),
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "CronJob", "name": name,
                                              "uid": cj.uid(), "controller": true, "blockOwnerDeletion": true}]},
            "spec": spec,
        }))?)
    };
    jobs.create(&PostParams::default(), &run_of("1-refused", true)?)
        .await?;
    let not_scheduled = wait_for(
        "Scheduled False after the failed run",
        DEFAULT_DEADLINE,
        || {
            let (api, name) = (api.clone(), name.clone());
            async move {
                let b = api.get(&name).await?;
                match condition(&b, "Scheduled") {
                    Some(c) if c["status"] == "False" => Ok(Some(c.clone())),
                    _ => bail!("status: {}", b.data["status"]),
                }
            }
        },
    )
    .await?;
    assert_eq!(not_scheduled["reason"], "RunFailed", "{not_scheduled}");
    let message = not_scheduled["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with(&format!(
            "the last run, Job {}/{name}-1-refused, failed: DeadlineExceeded",
            ns.name
        )),
        "{message}"
    );
    wait_event(
        &ns.client,
        &name,
        "Warning",
        "RunFailed",
        &format!("{name}-1-refused"),
    )
    .await?;

    jobs.create(&PostParams::default(), &run_of("2-ok", false)?)
        .await?;
    wait_condition(&api, &name, "Scheduled", DEFAULT_DEADLINE).await?;
    Ok(())
}

/// Item 11, upstream's TestWrongScheduleDegradesOperator: a schedule the
/// CRD accepts but the CronJob API refuses is reported on the Backup
/// (`Scheduled=False`, reason `InvalidSchedule`, and a Warning Event), and
/// fixing it schedules the backups.
#[tokio::test]
async fn a_schedule_the_cronjob_api_refuses_is_reported_and_recovers_when_fixed() -> Result<()> {
    const WRONG: &str = "*/5 */0 * * *";
    let _serial = SERIAL.lock().await;
    let ns = TestNamespace::new("backup-wrongcron").await?;
    apply_backup_crds(&ns.client).await?;
    let objects = ClusterObjects::new(&ns.client).await?;

    // The API server does refuse it in a CronJob.
    let cronjobs: Api<CronJob> = ns.api();
    let probe: CronJob = serde_json::from_value(json!({
        "apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "probe"},
        "spec": {"schedule": WRONG, "jobTemplate": {"spec": {"template": {"spec": {
            "restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}}}}},
    }))?;
    match cronjobs.create(&PostParams::default(), &probe).await {
        Err(kube::Error::Api(status)) => assert!(
            status.message.contains("spec.schedule"),
            "{}",
            status.message
        ),
        other => panic!("the CronJob API must refuse {WRONG:?}, got {other:?}"),
    }

    let _op = start_operator(&ns).await?;
    let name = format!("{}-wrong", ns.name);
    let backup: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "config.openshift.io/v1alpha1", "kind": "Backup",
        "metadata": {"name": name, "labels": test_labels()},
        "spec": {"etcd": {"schedule": WRONG, "timeZone": "Etc/UTC", "pvcName": "etcd-backup-pvc"}},
    }))?;
    let api = backups(&ns.client);
    api.create(&PostParams::default(), &backup).await?;
    objects.record(backup_resource(), &name);

    let reported = wait_for(
        "Scheduled False for the wrong schedule",
        DEFAULT_DEADLINE,
        || {
            let (api, name) = (api.clone(), name.clone());
            async move {
                let b = api.get(&name).await?;
                match condition(&b, "Scheduled") {
                    Some(c) if c["status"] == "False" => Ok(Some(c.clone())),
                    _ => bail!("status: {}", b.data["status"]),
                }
            }
        },
    )
    .await?;
    assert_eq!(reported["reason"], "InvalidSchedule", "{reported}");
    let message = reported["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with(&format!(
            "spec.etcd.schedule \"{WRONG}\" would be refused by the CronJob API: hour field"
        )) && message.ends_with("no CronJob is made until it is fixed"),
        "{message}"
    );
    wait_event(
        &ns.client,
        &name,
        "Warning",
        "InvalidSchedule",
        "would be refused",
    )
    .await?;
    assert!(
        cronjobs.get_opt(&name).await?.is_none(),
        "no CronJob for a wrong schedule"
    );

    // Fixed: the CronJob is made and the Backup is Scheduled.
    api.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"etcd": {"schedule": "0 3 * * *"}}})),
    )
    .await?;
    wait_condition(&api, &name, "Scheduled", DEFAULT_DEADLINE).await?;
    let cj = cronjobs.get(&name).await?;
    assert_eq!(cj.spec.map(|s| s.schedule).as_deref(), Some("0 3 * * *"));

    // Wrong again: reported, and the CronJob keeps the schedule it had.
    api.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"etcd": {"schedule": WRONG}}})),
    )
    .await?;
    let again = wait_for("Scheduled False again", DEFAULT_DEADLINE, || {
        let (api, name) = (api.clone(), name.clone());
        async move {
            let b = api.get(&name).await?;
            match condition(&b, "Scheduled") {
                Some(c) if c["status"] == "False" => Ok(Some(c.clone())),
                _ => bail!("status: {}", b.data["status"]),
            }
        }
    })
    .await?;
    assert!(
        again["message"]
            .as_str()
            .unwrap_or_default()
            .ends_with("the CronJob keeps its previous schedule until it is fixed"),
        "{again}"
    );
    let cj = cronjobs.get(&name).await?;
    assert_eq!(cj.spec.map(|s| s.schedule).as_deref(), Some("0 3 * * *"));
    Ok(())
}

/// Item 8, the chaos soak's `SerialBackups` check
/// (`wasmop_tests::chaos::backup_slot_holders`) against the API server: two
/// unfinished backup Jobs are two holders; a Job being deleted still holds
/// the slot, and so does its Pod once the Job is gone; a Job that ended
/// holds nothing.
#[tokio::test]
async fn the_soak_sees_two_backups_holding_the_slot() -> Result<()> {
    const HOLD: &str = "wasmop.dev/test-hold";
    let _serial = SERIAL.lock().await;
    let ns = TestNamespace::new("backup-slotcheck").await?;
    let jobs: Api<Job> = ns.api();
    // Jobs whose Pods are never scheduled: they run on.
    let job = |name: &str| -> Result<Job> {
        Ok(serde_json::from_value(json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "labels": {"app": "cluster-backup-job"}, "finalizers": [HOLD]},
            "spec": {"template": {"metadata": {"labels": {"app": "cluster-backup-job"}},
                "spec": {"restartPolicy": "Never", "nodeSelector": {"wasmop.dev/no-such-node": "x"},
                    "containers": [{"name": "c", "image": "registry.invalid/etcd-backup-tools:test"}]}}},
        }))?)
    };
    jobs.create(&PostParams::default(), &job("first")?).await?;
    let holders = || async { wasmop_tests::chaos::backup_slot_holders(&ns.client, &ns.name).await };
    ensure!(holders().await?.len() == 1, "one Job, one holder");
    jobs.create(&PostParams::default(), &job("second")?).await?;
    ensure!(
        holders().await?.len() == 2,
        "two unfinished Jobs are two holders"
    );

    // The second goes: while it is being deleted (our finalizer) it holds.
    jobs.delete("second", &DeleteParams::background()).await?;
    ensure!(
        holders().await?.len() == 2,
        "a Job being deleted still holds the slot"
    );
    // Its Pod, kept by a finalizer of ours, holds it once the Job is gone.
    let pods: Api<Pod> = ns.api();
    let pod = wait_for("the second Job's Pod", DEFAULT_DEADLINE, || {
        let pods = pods.clone();
        async move {
            Ok(pods
                .list(&ListParams::default().labels("job-name=second"))
                .await?
                .items
                .into_iter()
                .next())
        }
    })
    .await?;
    let finalizers: Vec<String> = pod
        .metadata
        .finalizers
        .clone()
        .unwrap_or_default()
        .into_iter()
        .chain([HOLD.to_owned()])
        .collect();
    pods.patch(
        &pod.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": finalizers}})),
    )
    .await?;
    jobs.patch(
        "second",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await?;
    wait_for("the second Job gone", DEFAULT_DEADLINE, || {
        let jobs = jobs.clone();
        async move { Ok(jobs.get_opt("second").await?.is_none().then_some(())) }
    })
    .await?;
    let seen = holders().await?;
    ensure!(
        seen.len() == 2 && seen.values().any(|h| h.contains(&pod.name_any())),
        "the gone Job's Pod still holds the slot: {seen:?}"
    );
    // Released, the Pod goes (deleted by the garbage collector or by us).
    let _ = pods
        .delete(&pod.name_any(), &DeleteParams::background())
        .await;
    pods.patch(
        &pod.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await?;
    wait_for("one holder again", DEFAULT_DEADLINE, || async {
        let seen = holders().await?;
        if seen.len() == 1 {
            Ok(Some(()))
        } else {
            bail!("holders: {seen:?}")
        }
    })
    .await?;
    jobs.patch(
        "first",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await?;
    Ok(())
}
