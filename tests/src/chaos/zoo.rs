//! The soak's zoo: the primaries of every shipped plugin, as
//! `deploy/examples/` gives them (each after its upstream sample), in a
//! namespace of their own, deleted and re-created under the same names
//! while the faults come.
//!
//! The examples are applied as they are, but for what a soak needs to run
//! beside others on one cluster: Namespace and RBAC objects are dropped and every
//! namespaced object goes to the zoo's namespace (the `etcd-backup.yaml`
//! ones to the `backup` plugin's target namespace, where its Jobs run);
//! the cluster-scoped EtcdBackup and Backup get the zoo's name as a prefix
//! and the soak's label; the team example calls the soak's in-process
//! stand-in terdut-server; the fleet's bucket is named after the zoo, so
//! its storage reservation is the soak's own (and each re-created fleet
//! gets a bucket of its own: a reservation binds a bucket to one fleet for
//! good).
//!
//! A FireboltEngineClass and a TerdutServer are what other zoo primaries
//! refer to; they stay. Every other zoo primary is churned: deleted, and
//! created again under its name at once or by a later step.
//!
//! At each quiet point every zoo primary is created if it is missing, then
//! must reach its done condition (`Ready`; `BackupCompleted` for an
//! EtcdBackup, `Scheduled` for a Backup, as `deploy/run-local.sh --check`
//! waits) with the host's `Reconciled` True for its generation. At the end
//! every zoo primary is deleted with the replicas running and must be
//! gone, and then so must every object the plugins wrote for them.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use kube::core::GroupVersionKind;
use kube::discovery::{Scope, pinned_kind};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use wasmop::controller::shard::{DRAIN_LABEL, SHARD_LABEL};

use super::{CHAOS_LABEL, MANAGED_BY, Shared, delete_owner, reconciled_for_generation, retrying};
use crate::{TestNamespace, repo_root};

/// The example files of the shipped plugins (`widgets.yaml` is the
/// `good` test plugin's, which the soak's own load covers).
const EXAMPLES: [&str; 5] = [
    "firebolt-instance.yaml",
    "firebolt-engine.yaml",
    "etcd-backup.yaml",
    "celld-fleet.yaml",
    "terdut-team.yaml",
];
/// The address the team example names for its server.
const TERDUT_PLACEHOLDER: &str = "http://127.0.0.1:18091";
/// The bucket the fleet example names.
const EXAMPLE_BUCKET: &str = "wasmop-demo-celld";
/// Kinds other zoo primaries refer to: never churned.
const KEPT: [&str; 2] = ["FireboltEngineClass", "TerdutServer"];
/// Kinds of objects the shipped plugins write, listed at the end to find
/// what a gone primary left behind: (group, version, kind, plural).
const WRITTEN: [(&str, &str, &str, &str); 11] = [
    ("", "v1", "ConfigMap", "configmaps"),
    ("", "v1", "Secret", "secrets"),
    ("", "v1", "Service", "services"),
    ("", "v1", "ServiceAccount", "serviceaccounts"),
    ("", "v1", "Pod", "pods"),
    ("apps", "v1", "Deployment", "deployments"),
    ("apps", "v1", "StatefulSet", "statefulsets"),
    ("batch", "v1", "Job", "jobs"),
    ("batch", "v1", "CronJob", "cronjobs"),
    (
        "policy",
        "v1",
        "PodDisruptionBudget",
        "poddisruptionbudgets",
    ),
    ("cert-manager.io", "v1", "Certificate", "certificates"),
];

/// One zoo primary: its API and the object the example makes.
struct Item {
    api: Api<DynamicObject>,
    kind: String,
    name: String,
    template: Value,
    done: &'static str,
    churn: bool,
    /// Times it was created (a CelldFleet's bucket is named after it).
    incarnation: AtomicUsize,
}

impl Item {
    fn key(&self) -> String {
        format!("{}/{}", self.kind, self.name)
    }

    async fn create(&self) -> Result<()> {
        let mut obj = self.template.clone();
        let n = self.incarnation.fetch_add(1, Ordering::Relaxed);
        if self.kind == "CelldFleet" {
            // A storage reservation binds its bucket to one fleet (by UID)
            // for good: a fleet created again under its name needs a
            // bucket of its own, as a user's would.
            let bucket = format!(
                "{}-{n}",
                obj["spec"]["storage"]["bucket"]
                    .as_str()
                    .unwrap_or_default()
            );
            obj["spec"]["storage"]["bucket"] = json!(bucket);
        }
        let obj: DynamicObject = serde_json::from_value(obj)?;
        self.api.create(&PostParams::default(), &obj).await?;
        Ok(())
    }
}

/// One zoo primary's times at a quiet point.
#[derive(Debug, Clone, Default)]
pub(super) struct ZooTimes {
    /// `Kind/name`.
    pub(super) primary: String,
    /// To `Reconciled` True for its generation (the host applied a plan
    /// for it).
    pub(super) reconciled: Option<Duration>,
    /// To its done condition too (its workloads ran: Pods, Jobs, calls).
    pub(super) done: Option<Duration>,
    /// Its last state while not done.
    pub(super) state: String,
}

/// Whether `obj` is placed on a running shard: labelled for one that
/// `running` accepts and not draining.
pub(super) fn placed(obj: &DynamicObject, running: &dyn Fn(&str) -> bool) -> bool {
    let labels = obj.labels();
    !labels.contains_key(DRAIN_LABEL) && labels.get(SHARD_LABEL).is_some_and(|s| running(s))
}

/// The zoo of a soak.
pub(super) struct Zoo {
    /// Its namespace (watched by the replicas).
    pub(super) namespace: TestNamespace,
    /// The stand-in terdut-server the team example calls.
    pub(super) standin: terdut_standin::StandIn,
    items: Vec<Item>,
    bucket: String,
}

/// The condition `deploy/run-local.sh --check` waits for on `kind`.
fn done_condition(kind: &str) -> &'static str {
    match kind {
        "EtcdBackup" => "BackupCompleted",
        "Backup" => "Scheduled",
        _ => "Ready",
    }
}

impl Zoo {
    /// With sharding: the zoo primaries that exist and are not placed on
    /// a running shard ([`placed`]). EtcdBackups are reconciled by kind,
    /// by the leader, and never carry a shard label.
    pub(super) async fn unplaced(&self, running: &dyn Fn(&str) -> bool) -> Vec<String> {
        let mut out = Vec::new();
        for item in self.items.iter().filter(|i| i.kind != "EtcdBackup") {
            match item.api.get_opt(&item.name).await {
                Ok(None) => {}
                Ok(Some(obj)) if placed(&obj, running) => {}
                Ok(Some(_)) | Err(_) => out.push(item.key()),
            }
        }
        out
    }

    /// Creates the zoo's namespace, starts the stand-in, and applies the
    /// examples' supporting objects (ServiceAccounts, the db Secret). The
    /// primaries are created by [`Zoo::create_missing`].
    ///
    /// # Errors
    /// When an example cannot be read or an object cannot be created.
    pub(super) async fn setup(client: &Client, target_namespace: &str) -> Result<Zoo> {
        let namespace = TestNamespace::new("chaos-zoo").await?;
        let standin = terdut_standin::StandIn::start().await?;
        let bucket = namespace.name.clone();
        // The fleet example places its member in zone us-east-1a.
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
        for node in nodes
            .list(&ListParams::default().labels("type=kwok"))
            .await?
            .items
        {
            nodes
                .patch(
                    &node.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(
                        json!({"metadata": {"labels": {"topology.kubernetes.io/zone": "us-east-1a"}}}),
                    ),
                )
                .await?;
        }
        let mut items = Vec::new();
        for file in EXAMPLES {
            let path = repo_root().join("deploy/examples").join(file);
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?
                .replace(TERDUT_PLACEHOLDER, standin.url())
                .replace(EXAMPLE_BUCKET, &bucket);
            for doc in serde_yaml::Deserializer::from_str(&text) {
                let mut obj: Value = serde::Deserialize::deserialize(doc)?;
                // RBAC (the scheduled runs' grants in etcd-backup.yaml) is
                // left out: the zoo's Backup runs nightly, never within a
                // soak, and cluster-wide grants would outlive the soak.
                if obj.is_null()
                    || obj["kind"] == "Namespace"
                    || obj["apiVersion"]
                        .as_str()
                        .is_some_and(|v| v.starts_with("rbac.authorization.k8s.io/"))
                {
                    continue;
                }
                let kind = obj["kind"].as_str().unwrap_or_default().to_owned();
                let api_version = obj["apiVersion"].as_str().unwrap_or_default().to_owned();
                let (group, version) = api_version
                    .split_once('/')
                    .unwrap_or(("", api_version.as_str()));
                let gvk = GroupVersionKind::gvk(group, version, &kind);
                let (resource, caps) = pinned_kind(client, &gvk)
                    .await
                    .with_context(|| format!("{api_version} {kind} of {file}"))?;
                let name = obj["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                let api = if caps.scope == Scope::Namespaced {
                    let ns = if file == "etcd-backup.yaml" {
                        target_namespace
                    } else {
                        namespace.name.as_str()
                    };
                    obj["metadata"]["namespace"] = json!(ns);
                    Api::namespaced_with(client.clone(), ns, &resource)
                } else {
                    obj["metadata"]["name"] = json!(format!("{}-{name}", namespace.name));
                    obj["metadata"]["labels"][CHAOS_LABEL] = json!(namespace.name);
                    Api::all_with(client.clone(), &resource)
                };
                if resource.group.is_empty() {
                    // Supporting objects: made once (the PVC may exist).
                    let made: DynamicObject = serde_json::from_value(obj)?;
                    match api.create(&PostParams::default(), &made).await {
                        Err(kube::Error::Api(e)) if e.code == 409 => {}
                        r => {
                            r.with_context(|| format!("creating {kind} {name} of {file}"))?;
                        }
                    }
                    continue;
                }
                let name = obj["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                items.push(Item {
                    api,
                    churn: !KEPT.contains(&kind.as_str()),
                    done: done_condition(&kind),
                    kind,
                    name,
                    template: obj,
                    incarnation: AtomicUsize::new(0),
                });
            }
        }
        Ok(Zoo {
            namespace,
            standin,
            items,
            bucket,
        })
    }

    /// The zoo's primaries as `Kind/name`.
    pub(super) fn primaries(&self) -> Vec<String> {
        self.items.iter().map(Item::key).collect()
    }

    /// Creates every zoo primary that does not exist (one being deleted is
    /// waited for, up to `deadline`); returns how many it created.
    ///
    /// # Errors
    /// When one cannot be created within `deadline`.
    pub(super) async fn create_missing(
        &self,
        shared: &Shared,
        deadline: Duration,
    ) -> Result<usize> {
        let until = Instant::now() + deadline;
        let mut created = 0;
        for item in &self.items {
            loop {
                let found = retrying(&format!("reading {}", item.key()), shared, || {
                    item.api.get_opt(&item.name)
                })
                .await?;
                match found {
                    Some(o) if o.metadata.deletion_timestamp.is_none() => break,
                    Some(_) => {}
                    None => match item.create().await {
                        Ok(()) => {
                            created += 1;
                            shared.ops.lock().unwrap().created += 1;
                            break;
                        }
                        Err(e) if Instant::now() >= until => {
                            return Err(e).context(format!("creating {}", item.key()));
                        }
                        Err(_) => {}
                    },
                }
                if Instant::now() >= until {
                    let conditions = item
                        .api
                        .get_opt(&item.name)
                        .await
                        .ok()
                        .flatten()
                        .map(|o| o.data["status"]["conditions"].to_string())
                        .unwrap_or_default();
                    bail!(
                        "{} is still being deleted after {deadline:?}; its conditions: {conditions}",
                        item.key()
                    );
                }
                // Until its finalizer is done: a poll, bounded by `until`.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        Ok(created)
    }

    /// One load operation on a random churned primary: created when
    /// missing; else, for two rolls in five, its spec edited (when its
    /// kind has an edit, [`edit_patch`]); else deleted (with a UID
    /// precondition), and in half the cases created again at once (refused
    /// while a finalizer holds the old one: a later step creates it).
    /// Returns what it did.
    ///
    /// # Errors
    /// When the API server refused or could not be reached.
    pub(super) async fn step(&self, pick: u64, roll: u64, shared: &Shared) -> Result<String> {
        let churned: Vec<&Item> = self.items.iter().filter(|i| i.churn).collect();
        let item = churned[usize::try_from(pick).unwrap_or(0) % churned.len()];
        match item.api.get_opt(&item.name).await? {
            None => {
                item.create().await?;
                shared.ops.lock().unwrap().created += 1;
                Ok(format!("created {}", item.key()))
            }
            Some(o) if o.metadata.deletion_timestamp.is_some() => {
                Ok(format!("{} is being deleted", item.key()))
            }
            Some(_)
                if roll % 5 < 2
                    && let Some(patch) =
                        edit_patch(&item.kind, roll % 10 < 2, &format!("{roll:x}")) =>
            {
                item.api
                    .patch(&item.name, &PatchParams::default(), &Patch::Merge(patch))
                    .await?;
                shared.ops.lock().unwrap().edited += 1;
                Ok(format!("edited {}", item.key()))
            }
            Some(o) => {
                let uid = o.metadata.uid.clone().unwrap_or_default();
                delete_owner(&item.api, &item.name, &uid, shared).await?;
                if (roll / 5).is_multiple_of(2) && item.create().await.is_ok() {
                    shared.ops.lock().unwrap().recreated += 1;
                    return Ok(format!("deleted and re-created {}", item.key()));
                }
                Ok(format!("deleted {}", item.key()))
            }
        }
    }

    /// Edits every zoo primary whose kind has an edit ([`edit_patch`]), so
    /// that each time measured after it includes a reconcile made after
    /// it; returns how many.
    ///
    /// # Errors
    /// When an edit fails past the retries of transient errors.
    pub(super) async fn edit_all(&self, pick: u64, shared: &Shared) -> Result<usize> {
        let mut edited = 0;
        for (i, item) in self.items.iter().enumerate() {
            let Some(patch) = edit_patch(
                &item.kind,
                (pick >> (i % 64)) & 1 == 1,
                &format!("{pick:x}"),
            ) else {
                continue;
            };
            let (pp, patch) = (PatchParams::default(), Patch::Merge(patch));
            retrying(&format!("editing {}", item.key()), shared, || {
                item.api.patch(&item.name, &pp, &patch)
            })
            .await?;
            edited += 1;
        }
        shared.ops.lock().unwrap().edited += edited;
        Ok(edited)
    }

    /// Each zoo primary's times from `since`: to the host's `Reconciled`
    /// for its generation, and to its done condition as well (None: not
    /// within `deadline`), with its last state.
    pub(super) async fn measure(&self, since: Instant, deadline: Duration) -> Vec<ZooTimes> {
        let mut out: BTreeMap<String, ZooTimes> = self
            .items
            .iter()
            .map(|i| {
                (
                    i.key(),
                    ZooTimes {
                        primary: i.key(),
                        ..ZooTimes::default()
                    },
                )
            })
            .collect();
        loop {
            let at = since.elapsed();
            for item in &self.items {
                let times = out.get_mut(&item.key()).expect("every item");
                if times.done.is_some() {
                    continue;
                }
                match item.api.get_opt(&item.name).await {
                    Ok(Some(o)) => {
                        let value = serde_json::to_value(&o).unwrap_or_default();
                        let reconciled = reconciled_for_generation(&value);
                        if reconciled.is_ok() && times.reconciled.is_none() {
                            times.reconciled = Some(at);
                        }
                        let done = condition(&value, item.done);
                        if reconciled.is_ok()
                            && done.as_ref().is_some_and(|c| c["status"] == "True")
                        {
                            times.done = Some(at);
                        } else {
                            // Every condition, so that a failure says what
                            // the primary waits for (the done condition may
                            // not exist yet).
                            let all: Vec<String> = value["status"]["conditions"]
                                .as_array()
                                .into_iter()
                                .flatten()
                                .map(|c| {
                                    format!(
                                        "{}={} {}: {}",
                                        c["type"].as_str().unwrap_or_default(),
                                        c["status"].as_str().unwrap_or_default(),
                                        c["reason"].as_str().unwrap_or_default(),
                                        c["message"].as_str().unwrap_or_default()
                                    )
                                })
                                .collect();
                            times.state = format!(
                                "{}={}; {}; conditions: [{}]",
                                item.done,
                                done.map_or_else(|| "absent".to_owned(), |c| c.to_string()),
                                reconciled.err().unwrap_or_default(),
                                all.join("; ")
                            );
                        }
                    }
                    Ok(None) => times.state = "missing".to_owned(),
                    Err(e) => times.state = format!("unreadable: {e}"),
                }
            }
            if out.values().all(|t| t.done.is_some()) || at > deadline {
                break;
            }
            // A poll of the API server, bounded by `deadline`.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        out.into_values().collect()
    }

    /// A churned zoo primary deleted and created again, so that its next
    /// plan makes all its writes (the crash-before-write fault at indices
    /// past the `good` plugin's two). Returns which.
    pub(super) async fn recreate_one(&self, pick: u64, shared: &Shared) -> Option<String> {
        // The longest plans: several objects each.
        let churned: Vec<&Item> = self
            .items
            .iter()
            .filter(|i| {
                ["FireboltInstance", "FireboltEngine", "CelldFleet"].contains(&i.kind.as_str())
            })
            .collect();
        let item = churned[usize::try_from(pick).unwrap_or(0) % churned.len()];
        if let Ok(Some(o)) = item.api.get_opt(&item.name).await
            && o.metadata.deletion_timestamp.is_none()
        {
            let uid = o.metadata.uid.clone().unwrap_or_default();
            shared.deleted_owners.lock().unwrap().insert(uid);
            let _ = item
                .api
                .delete(&item.name, &DeleteParams::background())
                .await;
        }
        // Created again once its finalizer (if any) let it go: a poll,
        // bounded.
        let until = Instant::now() + Duration::from_secs(15);
        while Instant::now() < until {
            if item.create().await.is_ok() {
                shared.ops.lock().unwrap().recreated += 1;
                return Some(item.key());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        None
    }

    /// StatefulSets of the zoo's namespace that Kubernetes' garbage
    /// collector blocks, by the `Kind/name` of the zoo primary controlling
    /// each: Pod `<statefulset>-<n>` exists, controlled by a StatefulSet
    /// UID that is not the current `<statefulset>`'s. The old StatefulSet
    /// is gone and the collector lost track of its Pod (its watches
    /// re-listed across the deletion and a re-creation under the same
    /// name, which it takes for an update), so the new StatefulSet cannot
    /// create that Pod ("already exists") until kube-controller-manager
    /// restarts. No operator's doing: the Pod is not the operator's to
    /// delete.
    /// Creates a Pod for the simulated kubelet (kwok) in the zoo's
    /// namespace and waits until kwok reports it Running, then deletes it;
    /// returns that moment. Neither the operator nor its plugins touch the
    /// Pod: this measures the environment only.
    ///
    /// # Errors
    /// When the Pod is not Running within `deadline`, or the API server
    /// refuses it.
    pub(super) async fn kubelet_runs_pods(
        &self,
        client: &Client,
        shared: &Shared,
        deadline: Duration,
    ) -> Result<Instant> {
        use k8s_openapi::api::core::v1::Pod;
        static PROBES: AtomicUsize = AtomicUsize::new(0);
        let pods = Api::<Pod>::namespaced(client.clone(), &self.namespace.name);
        let name = format!(
            "chaos-kubelet-probe-{}",
            PROBES.fetch_add(1, Ordering::SeqCst)
        );
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {CHAOS_LABEL: "kubelet-probe"}},
            "spec": {
                "nodeSelector": {"type": "kwok"},
                "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "probe", "image": "registry.invalid/kubelet-probe:chaos"}],
            },
        }))?;
        retrying("create the kubelet probe Pod", shared, || {
            let (pods, pod) = (pods.clone(), pod.clone());
            async move {
                match pods.create(&PostParams::default(), &pod).await {
                    Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
                    other => other.map(|_| ()),
                }
            }
        })
        .await?;
        let running = crate::wait_for("the simulated kubelet to run a new Pod", deadline, || {
            let (pods, name) = (pods.clone(), name.clone());
            async move {
                let phase = pods
                    .get_opt(&name)
                    .await?
                    .and_then(|p| p.status.and_then(|s| s.phase));
                Ok((phase.as_deref() == Some("Running")).then(Instant::now))
            }
        })
        .await;
        // Best effort: the zoo's namespace is deleted at the end anyway.
        let _ = pods.delete(&name, &DeleteParams::default()).await;
        running
    }

    /// Writes what a person would read to see why a zoo primary was not
    /// done: the Pods, PersistentVolumeClaims, StatefulSets, Jobs and
    /// Events of the zoo's namespace and of `target_namespace` (where the
    /// backups' Jobs run), without managed fields, as JSON to `path`. Best
    /// effort: a list that fails is left out.
    pub(super) async fn dump(
        &self,
        client: &Client,
        target_namespace: &str,
        path: &std::path::Path,
    ) {
        let kinds = [
            ("", "v1", "Pod", "pods"),
            ("", "v1", "PersistentVolumeClaim", "persistentvolumeclaims"),
            ("apps", "v1", "StatefulSet", "statefulsets"),
            ("batch", "v1", "Job", "jobs"),
            ("", "v1", "Event", "events"),
        ];
        let mut out = serde_json::Map::new();
        for ns in [self.namespace.name.as_str(), target_namespace] {
            for (group, version, kind, plural) in kinds {
                let ar = ApiResource::from_gvk_with_plural(
                    &GroupVersionKind::gvk(group, version, kind),
                    plural,
                );
                let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ar);
                let Ok(list) = api.list(&ListParams::default()).await else {
                    continue;
                };
                let items: Vec<Value> = list
                    .items
                    .into_iter()
                    .map(|mut o| {
                        o.metadata.managed_fields = None;
                        serde_json::to_value(o).unwrap_or_default()
                    })
                    .collect();
                out.insert(format!("{ns}/{plural}"), Value::Array(items));
            }
        }
        let text = serde_json::to_string_pretty(&Value::Object(out)).unwrap_or_default();
        let _ = std::fs::write(path, text);
    }

    /// Zoo primaries (`Kind/name`) whose new objects wait for Kubernetes'
    /// garbage collector to remove a Pod of their predecessor, with the
    /// Pods: a Pod whose controller is a StatefulSet or the primary itself
    /// under the same name but an older UID. Empty when the API server
    /// cannot be read.
    pub(super) async fn gc_blocked(&self, client: &Client) -> BTreeMap<String, Vec<String>> {
        use k8s_openapi::api::apps::v1::StatefulSet;
        use k8s_openapi::api::core::v1::Pod;
        let ns = &self.namespace.name;
        let controller =
            |refs: Option<&Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>>| {
                refs.and_then(|rs| rs.iter().find(|r| r.controller == Some(true)).cloned())
            };
        let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let (Ok(sets), Ok(pods)) = (
            Api::<StatefulSet>::namespaced(client.clone(), ns)
                .list(&ListParams::default())
                .await,
            Api::<Pod>::namespaced(client.clone(), ns)
                .list(&ListParams::default())
                .await,
        ) else {
            return out;
        };
        // A Pod a zoo primary controls itself (a fleet's member), left by
        // the primary's previous incarnation: the new one's Pod of that
        // name waits for the collector.
        for item in &self.items {
            let Ok(Some(current)) = item.api.get_opt(&item.name).await else {
                continue;
            };
            let uid = current.metadata.uid.unwrap_or_default();
            for pod in &pods.items {
                if let Some(r) = controller(pod.metadata.owner_references.as_ref())
                    && r.kind == item.kind
                    && r.name == item.name
                    && r.uid != uid
                {
                    out.entry(item.key()).or_default().push(format!(
                        "Pod {} is controlled by {} {} uid {} (gone; {} is now uid {uid})",
                        pod.metadata.name.as_deref().unwrap_or_default(),
                        item.kind,
                        item.name,
                        r.uid,
                        item.name,
                    ));
                }
            }
        }
        for set in &sets.items {
            let (Some(name), Some(uid)) = (&set.metadata.name, &set.metadata.uid) else {
                continue;
            };
            let Some(owner) = controller(set.metadata.owner_references.as_ref()) else {
                continue;
            };
            for pod in &pods.items {
                let pod_name = pod.metadata.name.clone().unwrap_or_default();
                let ordinal = pod_name
                    .strip_prefix(name.as_str())
                    .and_then(|rest| rest.strip_prefix('-'));
                if !ordinal.is_some_and(|o| !o.is_empty() && o.chars().all(|c| c.is_ascii_digit()))
                {
                    continue;
                }
                if let Some(r) = controller(pod.metadata.owner_references.as_ref())
                    && r.kind == "StatefulSet"
                    && r.name == *name
                    && r.uid != *uid
                {
                    out.entry(format!("{}/{}", owner.kind, owner.name))
                        .or_default()
                        .push(format!(
                            "Pod {pod_name} is controlled by StatefulSet {name} uid {} (gone; {name} is now uid {uid})",
                            r.uid
                        ));
                }
            }
        }
        out
    }

    /// The end: every zoo primary deleted with the replicas running; each
    /// must be gone within `deadline`, and then every object labelled
    /// `managed-by: wasmop` in the zoo's namespaces controlled by one of
    /// them. Returns what was left.
    ///
    /// # Errors
    /// When the API server cannot be reached.
    pub(super) async fn delete_all(
        &self,
        client: &Client,
        target_namespace: &str,
        shared: &Shared,
        deadline: Duration,
    ) -> Result<Vec<String>> {
        let mut uids = HashSet::new();
        for item in self.items.iter().rev() {
            if let Some(o) = item.api.get_opt(&item.name).await? {
                if let Some(uid) = o.metadata.uid.clone() {
                    shared.deleted_owners.lock().unwrap().insert(uid.clone());
                    uids.insert(uid);
                }
                let _ = item
                    .api
                    .delete(&item.name, &DeleteParams::background())
                    .await;
            }
        }
        let until = Instant::now() + deadline;
        let mut left = Vec::new();
        while Instant::now() < until {
            left.clear();
            for item in &self.items {
                if item.api.get_opt(&item.name).await?.is_some() {
                    left.push(format!("{} (not deleted)", item.key()));
                }
            }
            for ns in [self.namespace.name.as_str(), target_namespace] {
                for (group, version, kind, plural) in WRITTEN {
                    let gvk = GroupVersionKind::gvk(group, version, kind);
                    let api: Api<DynamicObject> = Api::namespaced_with(
                        client.clone(),
                        ns,
                        &ApiResource::from_gvk_with_plural(&gvk, plural),
                    );
                    let lp = ListParams::default().labels(&format!("{MANAGED_BY}=wasmop"));
                    for o in api.list(&lp).await?.items {
                        let owned = o
                            .metadata
                            .owner_references
                            .iter()
                            .flatten()
                            .any(|r| uids.contains(&r.uid));
                        if owned {
                            left.push(format!("{kind} {ns}/{}", o.name_any()));
                        }
                    }
                }
            }
            if left.is_empty() {
                break;
            }
            // A poll until the garbage collector and finalizers are done.
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        // The fleet's reservation outlives its fleet by design: the soak's
        // own is deleted (by its bucket, which names the zoo).
        let gvk = GroupVersionKind::gvk("celld.eric.dev", "v1alpha1", "CelldStorageReservation");
        let reservations: Api<DynamicObject> = Api::all_with(
            client.clone(),
            &ApiResource::from_gvk_with_plural(&gvk, "celldstoragereservations"),
        );
        if let Ok(list) = reservations.list(&ListParams::default()).await {
            for r in list.items {
                if r.data["spec"]["bucket"]
                    .as_str()
                    .is_some_and(|b| b.starts_with(&format!("{}-", self.bucket)))
                {
                    let _ = reservations
                        .delete(&r.name_any(), &DeleteParams::background())
                        .await;
                }
            }
        }
        Ok(left)
    }

    /// Removes the finalizers of what is left of the zoo's cluster-scoped
    /// primaries (after the replicas are gone) and deletes them: nothing
    /// deletes them with the namespace.
    pub(super) async fn forget_cluster_scoped(&self) {
        for item in &self.items {
            if item.template["metadata"]["namespace"].is_null() {
                let _ = item
                    .api
                    .patch(
                        &item.name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
                    )
                    .await;
                let _ = item
                    .api
                    .delete(&item.name, &DeleteParams::background())
                    .await;
            }
        }
    }
}

/// A spec edit of a zoo primary of `kind` (`flip` picks one of two
/// values), None for a kind whose spec the soak does not edit (an
/// EtcdBackup's `pvcName` is immutable).
fn edit_patch(kind: &str, flip: bool, token: &str) -> Option<Value> {
    Some(match kind {
        "FireboltInstance" => json!({"spec": {"gateway": {"replicas": if flip { 3 } else { 2 }}}}),
        "FireboltEngine" => json!({"spec": {"replicas": if flip { 2 } else { 1 }}}),
        "CelldFleet" => {
            json!({"spec": {"execution": {"cpuRequest": if flip { "20m" } else { "10m" }}}})
        }
        "TerdutTeam" => json!({"spec": {"displayName": format!("Platform {token}")}}),
        "Backup" => {
            json!({"spec": {"etcd": {"schedule": if flip { "0 3 * * *" } else { "0 2 * * *" }}}})
        }
        _ => return None,
    })
}

/// The condition `kind` of `obj`, if set.
fn condition(obj: &Value, kind: &str) -> Option<Value> {
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
        .cloned()
}
