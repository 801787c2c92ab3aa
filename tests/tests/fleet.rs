//! The `fleet` plugin (CelldFleet) on the local control plane: the real
//! `fleet.wasm`, the real host, kube-apiserver with the CRDs from `crds/`,
//! controller-manager (Deployments, StatefulSets, the HPA, the PV binder)
//! and kwok (Pods become Ready, claims bind).
//!
//! Members are placed by zone, so the fake Node is labelled
//! `topology.kubernetes.io/zone=us-east-1a` (idempotent), and fleets use
//! `placement.mode: Relaxed` (one Node cannot satisfy required host
//! anti-affinity for several members). Nothing here talks to a Pod.
//!
//! Every test's operator logs go to one in-memory buffer (this test
//! binary's tracing subscriber), so the Secret canary test can grep them.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{
    Event, Node, PersistentVolume, PersistentVolumeClaim, Pod, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{
    Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams, VersionMatch,
};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use wasmop_tests::injector::{Injector, PROXY_CONTAINER};
use wasmop_tests::operator::{RunningOperator, load_plugin};
use wasmop_tests::{FIELD_MANAGER, TestNamespace, apply_project_crds, repo_root, wait_for};

/// Rollouts go through the scheduler, kwok and the controller-manager.
/// Generous: a PersistentFleet's members come up one at a time (each Pod
/// waits for its claim to bind), and CI runs on two loaded cores.
const DEADLINE: Duration = Duration::from_secs(240);
/// Poll interval of the samplers that watch a rollout.
const SAMPLE_EVERY: Duration = Duration::from_millis(50);
const UID_LABEL: &str = "celld.eric.dev/fleet-uid";
const IMAGE: &str = "ghcr.io/ewhauser/celld@sha256:1c0d854cd2af39fa439f163d5b88a19c7bccefd25fe35e2c0e1f43b3d886f424";
const ZONE: &str = "us-east-1a";

// ---- log capture -------------------------------------------------------------

#[derive(Clone)]
struct Tee(Arc<Mutex<Vec<u8>>>);

impl Write for Tee {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log lock").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The buffer every operator of this test binary logs into (debug level).
fn logs() -> Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let tee = Tee(buf.clone());
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("wasmop=debug"))
            .with_ansi(false)
            .with_writer(move || tee.clone())
            .try_init();
        buf
    })
    .clone()
}

fn log_text() -> String {
    String::from_utf8_lossy(&logs().lock().expect("log lock")).into_owned()
}

// ---- helpers -------------------------------------------------------------------

fn ar(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("celld.eric.dev", "v1alpha1", kind),
        plural,
    )
}

fn fleets(ns: &TestNamespace) -> Api<DynamicObject> {
    Api::namespaced_with(
        ns.client.clone(),
        &ns.name,
        &ar("CelldFleet", "celldfleets"),
    )
}

fn celld_previews(ns: &TestNamespace) -> Api<DynamicObject> {
    Api::namespaced_with(
        ns.client.clone(),
        &ns.name,
        &ar("CelldPreview", "celldpreviews"),
    )
}

fn reservations(client: &Client) -> Api<DynamicObject> {
    Api::all_with(
        client.clone(),
        &ar("CelldStorageReservation", "celldstoragereservations"),
    )
}

/// A fleet spec on one zone, Relaxed placement, bucket unique to the namespace.
fn spec(ns: &TestNamespace, profile: &str, replicas: i64, suffix: &str) -> Value {
    let mut spec = json!({
        "profile": profile,
        "replicas": replicas,
        "runtimeImage": IMAGE,
        "serviceAccountName": "celld-runtime",
        "storage": {"bucket": format!("{}-{suffix}", ns.name), "region": "us-east-1", "sizeGiB": 1},
        "placement": {"azCount": 1, "zones": [ZONE], "mode": "Relaxed"},
        "execution": {"cpuRequest": "10m", "memoryRequest": "16Mi", "memoryLimit": "64Mi"},
    });
    if profile == "PersistentFleet" {
        spec["storage"]["storageClassName"] = json!("kwok-volume");
    }
    spec
}

async fn create_fleet(ns: &TestNamespace, name: &str, spec: Value) -> Result<DynamicObject> {
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "celld.eric.dev/v1alpha1",
        "kind": "CelldFleet",
        "metadata": {"name": name},
        "spec": spec,
    }))?;
    Ok(fleets(ns).create(&PostParams::default(), &obj).await?)
}

async fn patch_spec(ns: &TestNamespace, name: &str, patch: Value) -> Result<DynamicObject> {
    Ok(fleets(ns)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": patch})),
        )
        .await?)
}

fn condition(obj: &DynamicObject, type_: &str) -> Value {
    obj.data["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_).cloned())
        .unwrap_or(Value::Null)
}

/// Waits until `type_` has `status`, for the fleet's current generation.
async fn wait_condition(
    ns: &TestNamespace,
    name: &str,
    type_: &str,
    status: &str,
) -> Result<DynamicObject> {
    let api = fleets(ns);
    wait_for(
        &format!("{name} {type_}={status} for its generation"),
        DEADLINE,
        || {
            let api = api.clone();
            async move {
                let f = api.get(name).await?;
                let c = condition(&f, type_);
                let current = c["observedGeneration"].as_i64() == f.metadata.generation;
                if c["status"] == status && current {
                    Ok(Some(f))
                } else {
                    bail!("{type_}: {c}; Blocked: {}", condition(&f, "Blocked"))
                }
            }
        },
    )
    .await
}

async fn wait_provisioned(ns: &TestNamespace, name: &str) -> Result<DynamicObject> {
    wait_condition(ns, name, "Provisioned", "True").await
}

async fn member_pods(ns: &TestNamespace, uid: &str) -> Result<Vec<Pod>> {
    Ok(ns
        .api::<Pod>()
        .list(&ListParams::default().labels(&format!("{UID_LABEL}={uid}")))
        .await?
        .items)
}

fn is_ready(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Deletes a fleet, waits until the operator let it go (its finalizer), and
/// deletes its reservation: reservations outlive fleets by design, so the
/// test removes its own.
async fn delete_fleet(ns: &TestNamespace, name: &str) -> Result<()> {
    let api = fleets(ns);
    let reservation = api.get(name).await?.data["status"]["reservation"]
        .as_str()
        .map(str::to_owned);
    api.delete(name, &DeleteParams::default()).await?;
    wait_for(&format!("fleet {name} to be gone"), DEADLINE, || {
        let api = api.clone();
        async move { Ok(api.get_opt(name).await?.is_none().then_some(())) }
    })
    .await?;
    if let Some(r) = reservation {
        reservations(&ns.client)
            .delete(&r, &DeleteParams::default())
            .await
            .ok();
    }
    Ok(())
}

/// Labels the fake Node with the test zone (idempotent) and creates the
/// runtime ServiceAccount; applies the CRDs; starts an operator with the
/// fleet plugin watching the namespace.
async fn start(ns: &TestNamespace, mut settings: Value) -> Result<RunningOperator> {
    let _ = logs();
    // Members run in kwok and have no /state: application observation
    // would send requests to Pod IPs. Only the test that points members at
    // loopback servers turns it on.
    if settings.get("observeApplications").is_none() {
        settings["observeApplications"] = json!(false);
    }
    apply_project_crds(&ns.client).await?;
    let nodes = Api::<Node>::all(ns.client.clone());
    for node in nodes
        .list(&ListParams::default().labels("type=kwok"))
        .await?
    {
        nodes
            .patch(
                &node.name_any(),
                &PatchParams::apply(FIELD_MANAGER),
                &Patch::Apply(json!({
                    "apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": node.name_any(), "labels": {"topology.kubernetes.io/zone": ZONE}},
                })),
            )
            .await?;
    }
    let sa: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "celld-runtime"}}))?;
    match ns
        .api::<ServiceAccount>()
        .create(&PostParams::default(), &sa)
        .await
    {
        Ok(_) => {}
        // A second operator in the same namespace.
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    let plugin = load_plugin("fleet", settings)?;
    RunningOperator::start(ns.client.clone(), vec![ns.name.clone()], vec![plugin]).await
}

/// Polls the fleet's member Pods until stopped; records the largest number
/// of members unavailable (desired minus ready) ever seen, and how many
/// samples it took at each desired size.
struct Sampler {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<BTreeMap<i64, usize>>>,
    task: JoinHandle<Result<i64>>,
}

impl Sampler {
    fn start(ns: &TestNamespace, name: &str, uid: &str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(BTreeMap::new()));
        let (fleets, pods, name, selector, flag, counts) = (
            fleets(ns),
            ns.api::<Pod>(),
            name.to_owned(),
            format!("{UID_LABEL}={uid}"),
            stop.clone(),
            seen.clone(),
        );
        let task = tokio::spawn(async move {
            let mut worst = 0_i64;
            while !flag.load(Ordering::SeqCst) {
                let desired = fleets.get(&name).await?.data["spec"]["replicas"]
                    .as_i64()
                    .unwrap_or(0);
                let list = pods.list(&ListParams::default().labels(&selector)).await?;
                let ready = list.items.iter().filter(|p| is_ready(p)).count() as i64;
                worst = worst.max(desired - ready);
                *counts
                    .lock()
                    .expect("sampler lock")
                    .entry(desired)
                    .or_insert(0) += 1;
                // Sampling period of a monitor, not synchronisation.
                tokio::time::sleep(SAMPLE_EVERY).await;
            }
            Ok(worst)
        });
        Sampler { stop, seen, task }
    }

    /// How many samples were taken with `desired` replicas in the spec.
    fn sampled(&self, desired: i64) -> usize {
        self.seen
            .lock()
            .expect("sampler lock")
            .get(&desired)
            .copied()
            .unwrap_or(0)
    }

    /// Waits until the sampler has taken more than `after` samples with
    /// `desired` replicas in the spec, so each phase of a test is sampled.
    async fn wait_sampled(&self, desired: i64, after: usize) -> Result<()> {
        wait_for(&format!("a sample at {desired} replicas"), DEADLINE, || {
            let seen = self.seen.clone();
            async move {
                let n = seen
                    .lock()
                    .expect("sampler lock")
                    .get(&desired)
                    .copied()
                    .unwrap_or(0);
                Ok((n > after).then_some(()))
            }
        })
        .await
    }

    async fn finish(self) -> Result<i64> {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await?
    }
}

// ---- admission ---------------------------------------------------------------

/// Every upstream sample's CelldFleet is accepted by the CRD under strict
/// field validation, except those with `spec.qualification` (a field of a
/// newer upstream schema this API does not have).
#[tokio::test]
async fn upstream_samples_are_accepted_except_those_with_qualification() -> Result<()> {
    let ns = TestNamespace::new("fleet-samples").await?;
    apply_project_crds(&ns.client).await?;
    let dir = repo_root().join("plugins/fleet/tests/samples");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    files.sort();
    let (mut accepted, mut refused, mut previews_accepted) = (0, 0, 0);
    for file in files {
        let text = std::fs::read_to_string(&file)?;
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let mut value = <Value as serde::Deserialize>::deserialize(doc)?;
            value["metadata"]["namespace"] = json!(ns.name);
            if value["kind"] == "CelldPreview" {
                let name = value["metadata"]["name"].as_str().unwrap_or_default();
                celld_previews(&ns)
                    .patch(
                        name,
                        &PatchParams::apply(FIELD_MANAGER)
                            .dry_run()
                            .validation_strict(),
                        &Patch::Apply(&value),
                    )
                    .await
                    .with_context(|| format!("CelldPreview sample {name}"))?;
                previews_accepted += 1;
                continue;
            }
            if value["kind"] != "CelldFleet" {
                continue;
            }
            let name = value["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let qualification = value["spec"].get("qualification").is_some();
            let result = fleets(&ns)
                .patch(
                    &name,
                    &PatchParams::apply(FIELD_MANAGER)
                        .dry_run()
                        .validation_strict(),
                    &Patch::Apply(&value),
                )
                .await;
            match (qualification, result) {
                (false, Ok(_)) => accepted += 1,
                (true, Err(e)) if e.to_string().contains("qualification") => refused += 1,
                (q, r) => bail!("{}: qualification={q}, result {r:?}", file.display()),
            }
        }
    }
    assert_eq!((accepted, refused), (10, 4), "samples accepted / refused");
    assert_eq!(previews_accepted, 2, "both CelldPreview samples accepted");
    Ok(())
}

/// The CRD refuses changes to fixed fields, reserved env names,
/// reserved or oversized Ingress annotations and a telemetry collector
/// CIDR wider than one address, and accepts changes to the mutable tuning
/// and a /32 or /128 collector.
#[tokio::test]
async fn admission_refuses_fixed_fields_and_reserved_env() -> Result<()> {
    fn ingress_annotations(annotations: Value) -> Value {
        json!({"routing": {
            "hostnames": ["app.example.com"],
            "ingress": {"className": "nginx", "annotations": annotations},
            "source": {"namespace": "edge", "podLabels": {"app": "gw"}},
        }})
    }
    fn collector(cidr: &str) -> Value {
        json!({"telemetry": {"collectorURL": "http://otel.example:4317", "egress": {"cidr": cidr}}})
    }
    let ns = TestNamespace::new("fleet-admission").await?;
    apply_project_crds(&ns.client).await?;
    create_fleet(&ns, "f", spec(&ns, "Bucket", 1, "a")).await?;
    for (patch, message) in [
        (
            json!({"storage": {"bucket": "another-bucket"}}),
            "fixed at creation",
        ),
        (
            json!({"placement": {"mode": "Strict"}}),
            "fixed at creation",
        ),
        (json!({"serviceAccountName": "other"}), "fixed at creation"),
        (json!({"bucketWorkload": "Ordered"}), "fixed at creation"),
        (
            json!({"env": [{"name": "CELLD_REEXEC_MODE", "value": "x"}]}),
            "reserved",
        ),
        (
            json!({"env": [{"name": "CELLD_STRICT_X", "value": "x"}]}),
            "reserved",
        ),
        (
            json!({"env": [{"name": "CELLD_BUCKET", "value": "x"}]}),
            "reserved",
        ),
        (
            ingress_annotations(json!({"celld.eric.dev/anything": "x"})),
            "reserved",
        ),
        (
            ingress_annotations(json!({"kubernetes.io/ingress.class": "nginx"})),
            "reserved",
        ),
        (
            ingress_annotations(json!({"example.com/big": "x".repeat(4097)})),
            "must not exceed 4096 bytes",
        ),
        (
            collector("10.0.0.0/8"),
            "telemetry.egress.cidr must be one IP address: /32 (IPv4) or /128 (IPv6)",
        ),
        (collector("fd00::/64"), "must be one IP address"),
        (collector("10.1.2.3"), "must be one IP address"),
    ] {
        let err = patch_spec(&ns, "f", patch.clone())
            .await
            .err()
            .with_context(|| format!("{patch} was accepted"))?;
        assert!(err.to_string().contains(message), "{patch}: {err}");
    }
    patch_spec(
        &ns,
        "f",
        json!({
            "env": [{"name": "CELLD_LOG", "value": "debug"}],
            "execution": {"memoryLimit": "128Mi"},
            "lifecycle": {"shutdownSeconds": 10, "terminationGraceSeconds": 20},
        }),
    )
    .await
    .context("mutable tuning is accepted")?;
    for one in ["10.1.2.3/32", "fd00::7/128"] {
        let f = patch_spec(&ns, "f", collector(one))
            .await
            .with_context(|| format!("collector cidr {one} refused"))?;
        assert_eq!(f.data["spec"]["telemetry"]["egress"]["cidr"], one);
    }
    Ok(())
}

// ---- Bucket ------------------------------------------------------------------

/// Bucket (Deployment) 2 -> 3 -> 2 with at most one member unavailable at
/// any sample; its Services, NetworkPolicy and PodDisruptionBudget; an
/// immutable change refused with the workload untouched.
#[tokio::test]
async fn bucket_scales_two_three_two_with_at_most_one_member_unavailable() -> Result<()> {
    let ns = TestNamespace::new("fleet-bucket").await?;
    let _op = start(&ns, json!({})).await?;
    let fleet = create_fleet(&ns, "f", spec(&ns, "Bucket", 2, "a")).await?;
    let uid = fleet.uid().context("uid")?;
    wait_provisioned(&ns, "f").await?;

    let svc = ns.api::<Service>().get("f").await?;
    assert_eq!(
        svc.spec
            .as_ref()
            .and_then(|s| s.ports.as_ref())
            .map(|p| p[0].port),
        Some(8080)
    );
    let peers = ns.api::<Service>().get("f-peers").await?;
    let peers_spec = peers.spec.clone().unwrap_or_default();
    assert_eq!(peers_spec.cluster_ip.as_deref(), Some("None"));
    assert_eq!(peers_spec.ports.as_ref().map(|p| p[0].port), Some(8081));
    let np = ns.api::<NetworkPolicy>().get("f").await?;
    let pdb = ns.api::<PodDisruptionBudget>().get("f").await?;
    let deployment = ns.api::<Deployment>().get("f").await?;
    for labels in [
        svc.labels(),
        peers.labels(),
        np.labels(),
        pdb.labels(),
        deployment.labels(),
    ] {
        assert_eq!(
            labels.get(UID_LABEL),
            Some(&uid),
            "every object carries the fleet UID"
        );
    }
    for refs in [svc.owner_references(), deployment.owner_references()] {
        assert!(refs.is_empty(), "no ownerReferences");
    }
    let reservation_name = fleets(&ns).get("f").await?.data["status"]["reservation"]
        .as_str()
        .context("status.reservation")?
        .to_owned();
    let reservation = reservations(&ns.client).get(&reservation_name).await?;
    assert_eq!(reservation.data["spec"]["fleetUID"], json!(uid));

    let sampler = Sampler::start(&ns, "f", &uid);
    for replicas in [3, 2] {
        let before = sampler.sampled(replicas);
        patch_spec(&ns, "f", json!({"replicas": replicas})).await?;
        wait_provisioned(&ns, "f").await?;
        sampler.wait_sampled(replicas, before).await?;
        let pods = member_pods(&ns, &uid).await?;
        let live = pods
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .count();
        assert_eq!(live as i64, replicas, "members after scaling to {replicas}");
    }
    let worst = sampler.finish().await?;
    assert!(worst <= 1, "at most one member unavailable; saw {worst}");

    let before = ns.api::<Deployment>().get("f").await?;
    let err = patch_spec(&ns, "f", json!({"placement": {"zones": ["us-east-1b"]}})).await;
    assert!(err.is_err_and(|e| e.to_string().contains("fixed at creation")));
    let after = ns.api::<Deployment>().get("f").await?;
    assert_eq!(
        before.metadata.generation, after.metadata.generation,
        "workload untouched"
    );
    assert_eq!(before.spec, after.spec);
    delete_fleet(&ns, "f").await?;
    Ok(())
}

/// A capacity policy the operator does not implement is refused with a
/// clear message, never silently ignored: a fleet created with
/// `capacity.mode: Shadow` is Blocked/InvalidConfiguration and gets no
/// workload; a running fleet that adds one keeps its workload untouched;
/// `External` (scaling through `/scale`) runs.
#[tokio::test]
async fn a_capacity_policy_other_than_external_is_refused_not_ignored() -> Result<()> {
    let ns = TestNamespace::new("fleet-capacity").await?;
    let _op = start(&ns, json!({})).await?;
    let mut s = spec(&ns, "Bucket", 1, "shadow");
    s["capacity"] = json!({"mode": "Shadow", "minReplicas": 1, "maxReplicas": 3});
    create_fleet(&ns, "shadow", s).await?;
    wait_blocked(
        &ns,
        "shadow",
        "InvalidConfiguration",
        "capacity.mode \"Shadow\" is not implemented by this operator",
    )
    .await?;
    assert!(
        ns.api::<Deployment>().get_opt("shadow").await?.is_none(),
        "a refused fleet gets no workload"
    );

    let mut s = spec(&ns, "Bucket", 1, "external");
    s["capacity"] = json!({"mode": "External", "minReplicas": 1});
    create_fleet(&ns, "external", s).await?;
    wait_provisioned(&ns, "external").await?;
    let before = ns.api::<Deployment>().get("external").await?;
    // The CRD defaults the mode of an empty capacity to Shadow.
    patch_spec(&ns, "external", json!({"capacity": {"mode": null}})).await?;
    wait_blocked(&ns, "external", "InvalidConfiguration", "capacity.mode").await?;
    let after = ns.api::<Deployment>().get("external").await?;
    assert_eq!(
        before.metadata.generation, after.metadata.generation,
        "the workload is untouched while refused"
    );
    delete_fleet(&ns, "shadow").await?;
    delete_fleet(&ns, "external").await
}

/// Ordered Bucket (a StatefulSet) contracts by removing the highest ordinal.
#[tokio::test]
async fn ordered_bucket_removes_the_highest_ordinal() -> Result<()> {
    let ns = TestNamespace::new("fleet-ordered").await?;
    let _op = start(&ns, json!({})).await?;
    let mut s = spec(&ns, "Bucket", 3, "a");
    s["bucketWorkload"] = json!("Ordered");
    let uid = create_fleet(&ns, "f", s).await?.uid().context("uid")?;
    wait_provisioned(&ns, "f").await?;
    ns.api::<StatefulSet>().get("f").await?;
    let before: Vec<(String, String)> = member_pods(&ns, &uid)
        .await?
        .iter()
        .map(|p| (p.name_any(), p.uid().unwrap_or_default()))
        .collect();
    assert_eq!(
        before.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        ["f-0", "f-1", "f-2"]
    );
    patch_spec(&ns, "f", json!({"replicas": 2})).await?;
    wait_provisioned(&ns, "f").await?;
    let after: Vec<(String, String)> = member_pods(&ns, &uid)
        .await?
        .iter()
        .map(|p| (p.name_any(), p.uid().unwrap_or_default()))
        .collect();
    assert_eq!(after, before[..2], "f-2 removed; f-0 and f-1 untouched");
    delete_fleet(&ns, "f").await?;
    Ok(())
}

/// A paused fleet holds a restart and a scale; un-pausing applies both,
/// and the restart replaces every member one at a time.
#[tokio::test]
async fn paused_holds_a_change_and_restart_token_rolls_one_member_at_a_time() -> Result<()> {
    let ns = TestNamespace::new("fleet-maint").await?;
    let _op = start(&ns, json!({})).await?;
    let uid = create_fleet(&ns, "f", spec(&ns, "Bucket", 2, "a"))
        .await?
        .uid()
        .context("uid")?;
    wait_provisioned(&ns, "f").await?;
    let old: BTreeSet<String> = member_pods(&ns, &uid)
        .await?
        .iter()
        .filter_map(|p| p.uid())
        .collect();

    patch_spec(
        &ns,
        "f",
        json!({"replicas": 3, "maintenance": {"paused": true, "restartToken": "t1"}}),
    )
    .await?;
    let paused = wait_condition(&ns, "f", "MaintenancePaused", "True").await?;
    assert_eq!(
        condition(&paused, "Provisioned")["reason"],
        "MaintenancePaused"
    );
    let d = ns.api::<Deployment>().get("f").await?;
    let d_spec = d.spec.clone().unwrap_or_default();
    assert_eq!(d_spec.replicas, Some(2), "scale held");
    assert!(
        d_spec
            .template
            .metadata
            .and_then(|m| m.annotations)
            .unwrap_or_default()
            .is_empty(),
        "restart held"
    );
    let now: BTreeSet<String> = member_pods(&ns, &uid)
        .await?
        .iter()
        .filter_map(|p| p.uid())
        .collect();
    assert_eq!(now, old, "no member replaced while paused");

    let sampler = Sampler::start(&ns, "f", &uid);
    sampler.wait_sampled(3, 0).await?;
    patch_spec(&ns, "f", json!({"maintenance": {"paused": false}})).await?;
    wait_provisioned(&ns, "f").await?;
    let worst = sampler.finish().await?;
    assert!(worst <= 1, "one member at a time; saw {worst} unavailable");
    let pods: Vec<Pod> = member_pods(&ns, &uid)
        .await?
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    assert_eq!(pods.len(), 3);
    for p in &pods {
        assert_eq!(
            p.annotations()
                .get("celld.eric.dev/restart-token")
                .map(String::as_str),
            Some("t1")
        );
        assert!(
            !old.contains(&p.uid().unwrap_or_default()),
            "{} was restarted",
            p.name_any()
        );
    }
    delete_fleet(&ns, "f").await?;
    Ok(())
}

/// A Secret referenced by spec.env reaches the Pod as a reference; its
/// value never appears in the fleet, its status, an Event, the workload or
/// an operator log line.
#[tokio::test]
async fn a_secret_value_never_leaves_the_secret() -> Result<()> {
    let ns = TestNamespace::new("fleet-secret").await?;
    let _op = start(&ns, json!({})).await?;
    let canary = format!("canary-{}-7f3a9c", ns.name);
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "runtime-auth"},
        "stringData": {"token": canary},
    }))?;
    ns.api::<Secret>()
        .create(&PostParams::default(), &secret)
        .await?;
    let mut s = spec(&ns, "Bucket", 1, "a");
    s["env"] = json!([
        {"name": "CELLD_LOG", "value": "debug"},
        {"name": "CELLD_API_TOKEN", "secretKeyRef": {"name": "runtime-auth", "key": "token"}},
    ]);
    let uid = create_fleet(&ns, "secretive", s)
        .await?
        .uid()
        .context("uid")?;
    wait_provisioned(&ns, "secretive").await?;
    // A change after creation goes through the reservation's tuning record.
    patch_spec(
        &ns,
        "secretive",
        json!({"env": [
            {"name": "CELLD_API_TOKEN", "secretKeyRef": {"name": "runtime-auth", "key": "token"}},
        ]}),
    )
    .await?;
    wait_provisioned(&ns, "secretive").await?;

    let pods = member_pods(&ns, &uid).await?;
    let env = pods[0].spec.as_ref().context("pod spec")?.containers[0]
        .env
        .clone()
        .unwrap_or_default();
    let token = env
        .iter()
        .find(|e| e.name == "CELLD_API_TOKEN")
        .context("CELLD_API_TOKEN")?;
    assert!(token.value.is_none());
    assert_eq!(
        token
            .value_from
            .as_ref()
            .and_then(|v| v.secret_key_ref.as_ref())
            .map(|r| r.name.as_str()),
        Some("runtime-auth")
    );

    let fleet = serde_json::to_string(&fleets(&ns).get("secretive").await?)?;
    let events = serde_json::to_string(&ns.api::<Event>().list(&ListParams::default()).await?)?;
    let deployment = serde_json::to_string(&ns.api::<Deployment>().get("secretive").await?)?;
    let logs = log_text();
    assert!(
        logs.contains("secretive"),
        "the operator's logs are captured"
    );
    assert!(
        events.contains("StorageReserved"),
        "the fleet's Events were read"
    );
    for (what, text) in [
        ("fleet", &fleet),
        ("events", &events),
        ("workload", &deployment),
        ("logs", &logs),
    ] {
        assert!(
            !text.contains(&canary),
            "the Secret value appears in the {what}"
        );
    }
    delete_fleet(&ns, "secretive").await?;
    Ok(())
}

/// A HorizontalPodAutoscaler targets the fleet through /scale: the
/// controller-manager raises spec.replicas to minReplicas, the fleet grows.
#[tokio::test]
async fn an_hpa_scales_the_fleet_through_scale() -> Result<()> {
    let ns = TestNamespace::new("fleet-hpa").await?;
    let _op = start(&ns, json!({})).await?;
    let mut s = spec(&ns, "Bucket", 1, "a");
    s["capacity"] = json!({"mode": "External", "minReplicas": 1});
    let uid = create_fleet(&ns, "f", s).await?.uid().context("uid")?;
    wait_provisioned(&ns, "f").await?;
    let scale = fleets(&ns).get_scale("f").await?;
    assert_eq!(scale.status.as_ref().map(|s| s.replicas), Some(1));
    assert_eq!(
        scale.status.as_ref().and_then(|s| s.selector.clone()),
        Some(format!("{UID_LABEL}={uid}"))
    );

    let hpa: k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler = serde_json::from_value(
        json!({
            "metadata": {"name": "f"},
            "spec": {
                "scaleTargetRef": {"apiVersion": "celld.eric.dev/v1alpha1", "kind": "CelldFleet", "name": "f"},
                "minReplicas": 3, "maxReplicas": 5,
                "metrics": [{"type": "Resource", "resource": {"name": "cpu",
                             "target": {"type": "Utilization", "averageUtilization": 60}}}],
            },
        }),
    )?;
    Api::<k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler>::namespaced(
        ns.client.clone(),
        &ns.name,
    )
    .create(&PostParams::default(), &hpa)
    .await?;
    let api = fleets(&ns);
    wait_for("the HPA to raise spec.replicas to 3", DEADLINE, || {
        let api = api.clone();
        async move {
            let f = api.get("f").await?;
            Ok((f.data["spec"]["replicas"] == 3).then_some(()))
        }
    })
    .await?;
    wait_provisioned(&ns, "f").await?;
    let live = member_pods(&ns, &uid)
        .await?
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .count();
    assert_eq!(live, 3);
    let scale = fleets(&ns).get_scale("f").await?;
    assert_eq!(scale.status.map(|s| s.replicas), Some(3));
    delete_fleet(&ns, "f").await?;
    Ok(())
}

// ---- PersistentFleet ---------------------------------------------------------

/// Deleting a PersistentFleet removes compute first, then claims, keeps the
/// reservation, then lets the fleet go; a fleet recreated under the same
/// name does not inherit the bucket: Blocked/StorageScopeConflict.
#[tokio::test]
async fn deletion_removes_compute_then_claims_and_a_recreated_fleet_conflicts() -> Result<()> {
    let ns = TestNamespace::new("fleet-delete").await?;
    let _op = start(&ns, json!({})).await?;
    let s = spec(&ns, "PersistentFleet", 2, "a");
    let uid = create_fleet(&ns, "f", s.clone())
        .await?
        .uid()
        .context("uid")?;
    let fleet = wait_provisioned(&ns, "f").await?;
    let reservation_name = fleet.data["status"]["reservation"]
        .as_str()
        .context("reservation")?
        .to_owned();
    let claims = ns.api::<PersistentVolumeClaim>();
    let selector = format!("{UID_LABEL}={uid}");
    let names: Vec<String> = claims
        .list(&ListParams::default().labels(&selector))
        .await?
        .items
        .iter()
        .map(|c| c.name_any())
        .collect();
    assert_eq!(names, ["data-f-0", "data-f-1"]);

    // Watch: no claim may be deleted while a member Pod exists. Claims are
    // listed before Pods: a claim seen going while a Pod is still there
    // afterwards is a real overlap, not two lists taken at different times.
    let stop = Arc::new(AtomicBool::new(false));
    let sampled = Arc::new(AtomicUsize::new(0));
    let watcher = {
        let (pods, claims, selector, stop, sampled) = (
            ns.api::<Pod>(),
            claims.clone(),
            selector.clone(),
            stop.clone(),
            sampled.clone(),
        );
        tokio::spawn(async move {
            let mut violations = Vec::new();
            let mut with_compute = 0;
            while !stop.load(Ordering::SeqCst) {
                let c = claims
                    .list(&ListParams::default().labels(&selector))
                    .await?
                    .items;
                let p = pods
                    .list(&ListParams::default().labels(&selector))
                    .await?
                    .items
                    .len();
                let going = c
                    .iter()
                    .filter(|c| c.metadata.deletion_timestamp.is_some())
                    .count();
                if p > 0 && (going > 0 || c.len() < 2) {
                    violations.push(format!(
                        "{p} pods while {} claims left, {going} terminating",
                        c.len()
                    ));
                }
                if p > 0 {
                    with_compute += 1;
                }
                sampled.fetch_add(1, Ordering::SeqCst);
                // Sampling period of a monitor, not synchronisation.
                tokio::time::sleep(SAMPLE_EVERY).await;
            }
            anyhow::Ok((violations, with_compute))
        })
    };
    wait_for("the watcher's first sample", DEADLINE, || {
        let sampled = sampled.clone();
        async move { Ok((sampled.load(Ordering::SeqCst) > 0).then_some(())) }
    })
    .await?;
    fleets(&ns).delete("f", &DeleteParams::default()).await?;
    let api = fleets(&ns);
    wait_for("the fleet to be gone", DEADLINE, || {
        let api = api.clone();
        async move { Ok(api.get_opt("f").await?.is_none().then_some(())) }
    })
    .await?;
    stop.store(true, Ordering::SeqCst);
    let (violations, with_compute) = watcher.await??;
    assert!(
        with_compute > 0,
        "the watcher saw the members before they went"
    );
    assert!(
        violations.is_empty(),
        "claims deleted before compute: {violations:?}"
    );
    assert!(
        claims
            .list(&ListParams::default().labels(&selector))
            .await?
            .items
            .is_empty()
    );
    assert!(ns.api::<StatefulSet>().get_opt("f").await?.is_none());
    let reservation = reservations(&ns.client).get(&reservation_name).await?;
    assert_eq!(
        reservation.data["spec"]["fleetUID"],
        json!(uid),
        "the reservation is kept"
    );

    create_fleet(&ns, "f", s).await?;
    let blocked = wait_condition(&ns, "f", "Blocked", "True").await?;
    assert_eq!(
        condition(&blocked, "Blocked")["reason"],
        "StorageScopeConflict"
    );
    assert!(
        ns.api::<StatefulSet>().get_opt("f").await?.is_none(),
        "nothing created"
    );
    fleets(&ns).delete("f", &DeleteParams::default()).await?;
    wait_for("the conflicting fleet to be gone", DEADLINE, || {
        let api = api.clone();
        async move { Ok(api.get_opt("f").await?.is_none().then_some(())) }
    })
    .await?;
    reservations(&ns.client)
        .delete(&reservation_name, &DeleteParams::default())
        .await?;
    Ok(())
}

/// A PersistentFleet member whose claim is Lost (its volume vanished) is
/// replaced on a fresh claim: the operator deletes the Lost claim and the
/// member's Pod (a dependent kind: the fleet's StatefulSet controls it);
/// the StatefulSet recreates the Pod with a fresh claim and the fleet
/// settles again. The other member is left alone.
#[tokio::test]
async fn a_member_whose_claim_is_lost_is_replaced() -> Result<()> {
    let ns = TestNamespace::new("fleet-lost").await?;
    let _op = start(&ns, json!({})).await?;
    create_fleet(&ns, "f", spec(&ns, "PersistentFleet", 2, "a")).await?;
    wait_provisioned(&ns, "f").await?;
    let claims = ns.api::<PersistentVolumeClaim>();
    let claim = claims.get("data-f-1").await?;
    let old_claim = claim.uid().context("claim uid")?;
    let volume = claim
        .spec
        .and_then(|s| s.volume_name)
        .context("bound volume")?;
    let old_pod = ns.api::<Pod>().get("f-1").await?.uid();
    let other_pod = ns.api::<Pod>().get("f-0").await?.uid();

    // Lose the volume, and mark the claim Lost as the PersistentVolume
    // binder would (the local control plane leaves volumes to kwok and does
    // not run the binder; see tests/cluster/up.sh).
    let pvs = Api::<PersistentVolume>::all(ns.client.clone());
    pvs.delete(&volume, &DeleteParams::default()).await?;
    pvs.patch(
        &volume,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .ok();
    claims
        .patch_status(
            "data-f-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Lost"}})),
        )
        .await?;

    // The Lost claim is deleted: seen terminating, or already gone (and
    // perhaps recreated by the StatefulSet) by the time it is looked at.
    wait_for("the operator to delete the Lost claim", DEADLINE, || {
        let claims = claims.clone();
        let old = old_claim.clone();
        async move {
            let c = claims.get_opt("data-f-1").await?;
            let deleted = c.is_none_or(|c| {
                c.metadata.deletion_timestamp.is_some() || c.uid().as_deref() != Some(old.as_str())
            });
            Ok(deleted.then_some(()))
        }
    })
    .await?;
    // Events are recorded after the plan's writes: wait for it.
    let events = ns.api::<Event>();
    wait_for("a MemberReplaced event", DEADLINE, || {
        let events = events.clone();
        async move {
            let list = events.list(&ListParams::default()).await?;
            Ok(list
                .items
                .iter()
                .any(|e| e.reason.as_deref() == Some("MemberReplaced"))
                .then_some(()))
        }
    })
    .await?;

    wait_for("a fresh claim data-f-1", DEADLINE, || {
        let claims = claims.clone();
        let old = old_claim.clone();
        async move {
            let c = claims.get_opt("data-f-1").await?;
            Ok(c.filter(|c| {
                c.uid().as_deref() != Some(old.as_str()) && c.metadata.deletion_timestamp.is_none()
            })
            .map(|_| ()))
        }
    })
    .await?;
    let pods = ns.api::<Pod>();
    wait_for(
        "member f-1 back and ready on the fresh claim",
        DEADLINE,
        || {
            let pods = pods.clone();
            let old = old_pod.clone();
            async move {
                let p = pods.get_opt("f-1").await?;
                Ok(p.filter(|p| p.uid() != old && is_ready(p)).map(|_| ()))
            }
        },
    )
    .await?;
    let fleet = wait_provisioned(&ns, "f").await?;
    assert_eq!(fleet.data["status"]["readyReplicas"], 2);
    assert_eq!(
        ns.api::<Pod>().get("f-0").await?.uid(),
        other_pod,
        "the healthy member was not touched"
    );
    delete_fleet(&ns, "f").await?;
    Ok(())
}

// ---- routing ---------------------------------------------------------------------

fn dynamic(
    ns: &TestNamespace,
    group: &str,
    version: &str,
    kind: &str,
    plural: &str,
) -> Api<DynamicObject> {
    Api::namespaced_with(
        ns.client.clone(),
        &ns.name,
        &ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural),
    )
}

fn ingresses(ns: &TestNamespace) -> Api<DynamicObject> {
    dynamic(ns, "networking.k8s.io", "v1", "Ingress", "ingresses")
}

fn http_routes(ns: &TestNamespace) -> Api<DynamicObject> {
    dynamic(
        ns,
        "gateway.networking.k8s.io",
        "v1",
        "HTTPRoute",
        "httproutes",
    )
}

/// Waits until `api` has (`true`) or lacks (`false`) an object `name`
/// that `check` accepts.
async fn wait_object(
    api: &Api<DynamicObject>,
    name: &str,
    present: bool,
    check: impl Fn(&DynamicObject) -> bool + Clone,
) -> Result<Option<DynamicObject>> {
    wait_for(
        &format!("{name} {}", if present { "present" } else { "gone" }),
        DEADLINE,
        || {
            let (api, check) = (api.clone(), check.clone());
            async move {
                let got = api.get_opt(name).await?;
                match (present, got) {
                    (true, Some(o)) if check(&o) => Ok(Some(Some(o))),
                    (false, None) => Ok(Some(None)),
                    (_, o) => bail!("not yet: {:?}", o.map(|o| o.data)),
                }
            }
        },
    )
    .await
}

async fn wait_routing(
    ns: &TestNamespace,
    name: &str,
    status: &str,
    reason: &str,
) -> Result<DynamicObject> {
    let api = fleets(ns);
    wait_for(
        &format!("{name} RoutingReady={status}/{reason}"),
        DEADLINE,
        || {
            let api = api.clone();
            async move {
                let f = api.get(name).await?;
                let c = condition(&f, "RoutingReady");
                if c["status"] == status
                    && c["reason"] == reason
                    && c["observedGeneration"].as_i64() == f.metadata.generation
                {
                    Ok(Some(f))
                } else {
                    bail!("RoutingReady: {c}")
                }
            }
        },
    )
    .await
}

/// Routing added as an Ingress, its annotations edited (a removed managed
/// annotation is pruned, another manager's kept), switched to an HTTPRoute
/// while the Gateway API CRDs are absent (GatewayAPIUnavailable: the
/// preflight fails and the Ingress and its policy are kept, the runtime
/// stays Provisioned), switched once they are installed (the Ingress is
/// gone before the HTTPRoute exists), back to an Ingress, and removed
/// (route, then policy) — with the workload's generation and the
/// reservation untouched throughout.
///
/// The Gateway API CRDs are cluster-wide: this is the only test that
/// installs or removes them, and it starts by removing them so the fleet
/// sees the API absent.
#[tokio::test]
async fn routing_is_added_switched_and_removed_without_touching_the_workload() -> Result<()> {
    let ns = TestNamespace::new("fleet-routing").await?;
    let gateway_crds = wasmop_tests::crd_names_in(&wasmop_tests::gateway_api_crd_dir()?)?;
    wasmop_tests::delete_crds(&ns.client, &gateway_crds).await?;
    let _op = start(&ns, json!({})).await?;
    let mut s = spec(&ns, "Bucket", 1, "routing");
    s["routing"] = json!({
        "hostnames": ["app.example.com"],
        "ingress": {"className": "nginx", "annotations": {"example.com/a": "1", "example.com/b": "2"}},
        "source": {"namespace": "edge", "podLabels": {"app": "public-gateway"}},
    });
    let fleet = create_fleet(&ns, "rf", s).await?;
    let uid = fleet.metadata.uid.clone().unwrap_or_default();
    wait_provisioned(&ns, "rf").await?;
    let deployments = ns.api::<Deployment>();
    let before = deployments.get("rf").await?;
    let reservation_name = fleets(&ns).get("rf").await?.data["status"]["reservation"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let reservation_before = reservations(&ns.client).get(&reservation_name).await?;

    // Added: the Ingress forwards / to rf:8080, the policy admits the data plane to 8080 only.
    let ing = wait_object(&ingresses(&ns), "rf-routing", true, |o| {
        o.metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key("example.com/b"))
    })
    .await?
    .context("ingress")?;
    assert_eq!(ing.labels().get(UID_LABEL), Some(&uid));
    let rule = &ing.data["spec"]["rules"][0];
    assert_eq!(rule["host"], "app.example.com");
    assert_eq!(rule["http"]["paths"][0]["path"], "/");
    assert_eq!(
        rule["http"]["paths"][0]["backend"]["service"],
        json!({"name": "rf", "port": {"number": 8080}})
    );
    assert_eq!(ing.data["spec"]["ingressClassName"], "nginx");
    let policy = ns.api::<NetworkPolicy>().get("rf-routing").await?;
    let pspec = serde_json::to_value(&policy.spec)?;
    assert_eq!(pspec["ingress"].as_array().map(Vec::len), Some(1));
    assert_eq!(
        pspec["ingress"][0]["ports"],
        json!([{"port": 8080, "protocol": "TCP"}])
    );
    assert_eq!(
        pspec["ingress"][0]["from"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
        "edge"
    );
    wait_routing(&ns, "rf", "Unknown", "AwaitingAddress").await?;

    // Another controller's annotation survives; a removed managed one is pruned.
    ingresses(&ns)
        .patch(
            "rf-routing",
            &PatchParams::apply("someone-else"),
            &Patch::Apply(json!({
                "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
                "metadata": {"name": "rf-routing", "annotations": {"other.example/keep": "yes"}},
            })),
        )
        .await?;
    patch_spec(
        &ns,
        "rf",
        json!({"routing": {"ingress": {"annotations": {"example.com/b": null}}}}),
    )
    .await?;
    let ing = wait_object(&ingresses(&ns), "rf-routing", true, |o| {
        o.metadata
            .annotations
            .as_ref()
            .is_some_and(|a| !a.contains_key("example.com/b"))
    })
    .await?
    .context("ingress")?;
    let annotations = ing.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations.get("example.com/a").map(String::as_str),
        Some("1")
    );
    assert_eq!(
        annotations.get("other.example/keep").map(String::as_str),
        Some("yes")
    );

    // An address makes the Ingress route ready.
    ingresses(&ns)
        .patch_status(
            "rf-routing",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.10"}]}}})),
        )
        .await?;
    wait_routing(&ns, "rf", "True", "AddressAssigned").await?;

    // Switch to an HTTPRoute while the Gateway API is absent: the preflight
    // fails, the Ingress and its policy stay, the runtime is not blocked.
    patch_spec(
        &ns,
        "rf",
        json!({"routing": {"ingress": null, "gateway": {"name": "public", "namespace": ns.name}}}),
    )
    .await?;
    wait_routing(&ns, "rf", "False", "GatewayAPIUnavailable").await?;
    wait_provisioned(&ns, "rf").await?;
    assert!(
        ingresses(&ns).get_opt("rf-routing").await?.is_some(),
        "the Ingress was kept"
    );
    assert!(
        ns.api::<NetworkPolicy>()
            .get_opt("rf-routing")
            .await?
            .is_some(),
        "the policy was kept"
    );

    // With the CRDs installed the switch completes: the Ingress goes first.
    let watcher = {
        let (ing, routes) = (ingresses(&ns), http_routes(&ns));
        tokio::spawn(async move {
            // Records whether both routes were ever seen at once.
            let mut overlap = false;
            loop {
                let i = ing.get_opt("rf-routing").await.ok().flatten();
                let r = routes.get_opt("rf-routing").await.ok().flatten();
                if i.is_some() && r.is_some() {
                    overlap = true;
                }
                if i.is_none() && r.is_some() {
                    return overlap;
                }
                // Sampling period of a monitor, not synchronisation.
                tokio::time::sleep(SAMPLE_EVERY).await;
            }
        })
    };
    wasmop_tests::apply_gateway_api_crds(&ns.client).await?;
    let route = wait_object(&http_routes(&ns), "rf-routing", true, |_| true)
        .await?
        .context("route")?;
    let overlap = tokio::time::timeout(DEADLINE, watcher).await??;
    assert!(
        !overlap,
        "the HTTPRoute existed while the Ingress was still there"
    );
    assert_eq!(route.data["spec"]["parentRefs"][0]["name"], "public");
    assert_eq!(route.data["spec"]["hostnames"], json!(["app.example.com"]));
    assert_eq!(
        route.data["spec"]["rules"][0]["backendRefs"][0]["port"],
        8080
    );
    wait_routing(&ns, "rf", "Unknown", "AwaitingAcceptance").await?;
    let generation = route.metadata.generation.unwrap_or(1);
    let now = "2026-01-01T00:00:00Z";
    let cond = |t: &str| {
        json!({"type": t, "status": "True", "reason": t, "message": "",
                               "observedGeneration": generation, "lastTransitionTime": now})
    };
    http_routes(&ns)
        .patch_status(
            "rf-routing",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"parents": [{
                "parentRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway",
                              "name": "public", "namespace": ns.name},
                "controllerName": "example.com/gateway",
                "conditions": [cond("Accepted"), cond("ResolvedRefs")],
            }]}})),
        )
        .await?;
    wait_routing(&ns, "rf", "True", "Accepted").await?;

    // Back to an Ingress, then removed: route first, then its policy.
    patch_spec(
        &ns,
        "rf",
        json!({"routing": {"gateway": null, "ingress": {"className": "nginx"}}}),
    )
    .await?;
    wait_object(&http_routes(&ns), "rf-routing", false, |_| true).await?;
    wait_object(&ingresses(&ns), "rf-routing", true, |_| true).await?;
    wait_routing(&ns, "rf", "Unknown", "AwaitingAddress").await?;
    patch_spec(&ns, "rf", json!({"routing": null})).await?;
    wait_object(&ingresses(&ns), "rf-routing", false, |_| true).await?;
    wait_for("the routing policy to go", DEADLINE, || {
        let api = ns.api::<NetworkPolicy>();
        async move { Ok(api.get_opt("rf-routing").await?.is_none().then_some(())) }
    })
    .await?;
    // The reconcile that deletes the policy drops RoutingReady in its status
    // write, which follows its deletes: wait for it, with the deadline.
    wait_provisioned(&ns, "rf").await?;
    let api = fleets(&ns);
    wait_for("RoutingReady to be dropped after removal", DEADLINE, || {
        let api = api.clone();
        async move {
            let f = api.get("rf").await?;
            let c = condition(&f, "RoutingReady");
            if c.is_null() {
                Ok(Some(()))
            } else {
                bail!("RoutingReady still set: {c}")
            }
        }
    })
    .await?;

    let after = deployments.get("rf").await?;
    assert_eq!(
        before.metadata.generation, after.metadata.generation,
        "routing changed the workload"
    );
    let reservation_after = reservations(&ns.client).get(&reservation_name).await?;
    assert_eq!(
        reservation_before.metadata.resource_version, reservation_after.metadata.resource_version,
        "routing changed the reservation"
    );
    delete_fleet(&ns, "rf").await
}

// ---- application observation ------------------------------------------------------

/// Loopback `/state` servers standing in for members, one per address on
/// the peer port; each answers the body currently set for its address.
struct StateServers {
    bodies: Arc<Mutex<std::collections::HashMap<String, String>>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for StateServers {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl StateServers {
    async fn start(addresses: &[String]) -> Result<Self> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let bodies: Arc<Mutex<std::collections::HashMap<String, String>>> = Arc::default();
        let mut tasks = Vec::new();
        for address in addresses {
            let listener = tokio::net::TcpListener::bind((address.as_str(), 8081))
                .await
                .with_context(|| format!("binding {address}:8081"))?;
            let (bodies, address) = (bodies.clone(), address.clone());
            tasks.push(tokio::spawn(async move {
                while let Ok((mut sock, _)) = listener.accept().await {
                    let body = bodies
                        .lock()
                        .expect("bodies lock")
                        .get(&address)
                        .cloned()
                        .unwrap_or_default();
                    tokio::spawn(async move {
                        let mut buf = vec![0u8; 8192];
                        let _ = sock.read(&mut buf).await;
                        let head = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                            body.len()
                        );
                        let _ = sock.write_all(head.as_bytes()).await;
                        let _ = sock.write_all(body.as_bytes()).await;
                    });
                }
            }));
        }
        Ok(StateServers { bodies, tasks })
    }

    fn set(&self, address: &str, body: String) {
        self.bodies
            .lock()
            .expect("bodies lock")
            .insert(address.to_owned(), body);
    }
}

fn state(version: &str, pending: i64) -> String {
    json!({"deployment": {"version": version, "prefix": format!("apps/{version}/")},
           "cells": {"pending": pending, "swapping": 0}})
    .to_string()
}

async fn wait_application(
    ns: &TestNamespace,
    name: &str,
    status: &str,
    reason: &str,
) -> Result<DynamicObject> {
    let api = fleets(ns);
    wait_for(
        &format!("{name} ApplicationConverged={status}/{reason}"),
        DEADLINE,
        || {
            let api = api.clone();
            async move {
                let f = api.get(name).await?;
                let c = condition(&f, "ApplicationConverged");
                if c["status"] == status && c["reason"] == reason {
                    Ok(Some(f))
                } else {
                    bail!(
                        "ApplicationConverged: {c}; application: {}",
                        f.data["status"]["application"]
                    )
                }
            }
        },
    )
    .await
}

/// Every ApplicationConverged outcome against loopback `/state` servers
/// standing in for the members: the members' Pod IPs are pointed at
/// loopback addresses before observation is turned on (nothing is sent to
/// a real Pod IP). Converged, MixedVersions, Converging, and Unknown for a
/// stale, an oversized and a malformed response; the fleet stays Ready and
/// Provisioned throughout.
#[tokio::test]
async fn application_observation_reports_every_outcome() -> Result<()> {
    let ns = TestNamespace::new("fleet-app").await?;
    let op = start(&ns, json!({})).await?;
    let fleet = create_fleet(&ns, "af", spec(&ns, "Bucket", 2, "app")).await?;
    let uid = fleet.metadata.uid.clone().unwrap_or_default();
    wait_provisioned(&ns, "af").await?;
    op.stop().await;

    let pods = member_pods(&ns, &uid).await?;
    assert_eq!(pods.len(), 2);
    let seed = std::process::id();
    let addresses: Vec<String> = (1..=2)
        .map(|i| format!("127.{}.{}.{i}", 100 + seed % 100, (seed / 100) % 250))
        .collect();
    let servers = StateServers::start(&addresses).await?;
    for a in &addresses {
        servers.set(a, state("v1", 0));
    }
    for (pod, address) in pods.iter().zip(&addresses) {
        ns.api::<Pod>()
            .patch_status(
                &pod.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"podIP": address, "podIPs": [{"ip": address}]}})),
            )
            .await?;
    }
    let _op = start(&ns, json!({"observeApplications": true})).await?;

    let f = wait_application(&ns, "af", "True", "Converged").await?;
    let app = &f.data["status"]["application"];
    assert_eq!(
        app["observedVersion"],
        json!({"version": "v1", "prefix": "apps/v1/"})
    );
    assert_eq!(app["expectedNodes"], 2);
    assert_eq!(app["observedNodes"], 2);

    servers.set(&addresses[1], state("v2", 0));
    let f = wait_application(&ns, "af", "False", "MixedVersions").await?;
    assert!(f.data["status"]["application"]["observedVersion"].is_null());
    assert_eq!(
        f.data["status"]["application"]["versions"]
            .as_array()
            .map(Vec::len),
        Some(2)
    );

    servers.set(&addresses[0], state("v2", 3));
    let f = wait_application(&ns, "af", "False", "Converging").await?;
    assert_eq!(f.data["status"]["application"]["pendingCells"], 3);

    let mut stale: Value = serde_json::from_str(&state("v2", 0))?;
    stale["sampledAt"] = json!("2020-01-01T00:00:00Z");
    servers.set(&addresses[0], stale.to_string());
    let f = wait_application(&ns, "af", "Unknown", "ObservationIncomplete").await?;
    let nodes = f.data["status"]["application"]["nodes"].to_string();
    assert!(nodes.contains("Stale"), "{nodes}");

    let mut big: Value = serde_json::from_str(&state("v2", 0))?;
    big["padding"] = json!("x".repeat(1100 * 1024));
    servers.set(&addresses[0], big.to_string());
    wait_for("an oversized response reported", DEADLINE, || {
        let api = fleets(&ns);
        async move {
            let f = api.get("af").await?;
            let nodes = f.data["status"]["application"]["nodes"].to_string();
            let c = condition(&f, "ApplicationConverged");
            if nodes.contains("Oversized") && c["status"] == "Unknown" {
                Ok(Some(()))
            } else {
                bail!("{c} {nodes}")
            }
        }
    })
    .await?;

    servers.set(&addresses[0], "not json".to_owned());
    wait_for("a malformed response reported", DEADLINE, || {
        let api = fleets(&ns);
        async move {
            let f = api.get("af").await?;
            let nodes = f.data["status"]["application"]["nodes"].to_string();
            let c = condition(&f, "ApplicationConverged");
            if nodes.contains("Malformed") && c["status"] == "Unknown" {
                Ok(Some(()))
            } else {
                bail!("{c} {nodes}")
            }
        }
    })
    .await?;

    // Observation never gates the fleet.
    let f = fleets(&ns).get("af").await?;
    assert_eq!(condition(&f, "Ready")["status"], "True");
    assert_eq!(condition(&f, "Provisioned")["status"], "True");
    delete_fleet(&ns, "af").await
}

// ---- mesh ------------------------------------------------------------------------

fn authorization_policies(ns: &TestNamespace) -> Api<DynamicObject> {
    dynamic(
        ns,
        "security.istio.io",
        "v1",
        "AuthorizationPolicy",
        "authorizationpolicies",
    )
}

/// The labels of Deployment `name`'s Pod template.
async fn template_labels(
    deployments: &Api<Deployment>,
    name: &str,
) -> Result<BTreeMap<String, String>> {
    Ok(deployments
        .get(name)
        .await?
        .spec
        .and_then(|s| s.template.metadata)
        .and_then(|m| m.labels)
        .unwrap_or_default())
}

fn peer_authentications(ns: &TestNamespace) -> Api<DynamicObject> {
    dynamic(
        ns,
        "security.istio.io",
        "v1",
        "PeerAuthentication",
        "peerauthentications",
    )
}

/// True when the Pod runs the injected proxy (a container or a native
/// sidecar).
fn proxied(p: &Pod) -> bool {
    let Some(spec) = p.spec.as_ref() else {
        return false;
    };
    spec.containers.iter().any(|c| c.name == PROXY_CONTAINER)
        || spec
            .init_containers
            .iter()
            .flatten()
            .any(|c| c.name == PROXY_CONTAINER && c.restart_policy.as_deref() == Some("Always"))
}

/// The AuthorizationPolicy's peer-port rule requires an identity (strict).
fn strict(policy: &DynamicObject) -> bool {
    !policy.data["spec"]["rules"][0]["from"].is_null()
}

/// The mesh objects of a fleet some of whose members run no proxy: the
/// peer rule requires no identity and PeerAuthentication makes 8081
/// PERMISSIVE.
fn permissive(ap: Option<&DynamicObject>, pa: Option<&DynamicObject>) -> bool {
    ap.is_some_and(|ap| {
        !strict(ap) && ap.data["spec"]["rules"][0]["to"][0]["operation"]["ports"] == json!(["8081"])
    }) && pa.is_some_and(|pa| {
        pa.data["spec"]["portLevelMtls"] == json!({"8081": {"mode": "PERMISSIVE"}})
    })
}

/// A finalizer the mesh test puts on a member Pod to keep it Terminating.
const HOLD_FINALIZER: &str = "test.wasmop.dev/hold";

/// The fleet NetworkPolicy has istiod egress.
async fn istiod_egress(ns: &TestNamespace, name: &str) -> Result<bool> {
    let np = ns.api::<NetworkPolicy>().get(name).await?;
    Ok(serde_json::to_value(&np.spec)?["egress"]
        .as_array()
        .is_some_and(|rules| {
            rules
                .iter()
                .any(|r| r["ports"] == json!([{"port": 15012, "protocol": "TCP"}]))
        }))
}

/// Waits until the fleet is Blocked with `reason` and a message holding `text`.
async fn wait_blocked(
    ns: &TestNamespace,
    name: &str,
    reason: &str,
    text: &str,
) -> Result<DynamicObject> {
    let api = fleets(ns);
    wait_for(&format!("{name} Blocked/{reason}"), DEADLINE, || {
        let api = api.clone();
        async move {
            let f = api.get(name).await?;
            let c = condition(&f, "Blocked");
            let current = c["observedGeneration"].as_i64() == f.metadata.generation;
            if c["status"] == "True"
                && c["reason"] == reason
                && current
                && c["message"].as_str().is_some_and(|m| m.contains(text))
            {
                Ok(Some(f))
            } else {
                bail!("Blocked: {c}")
            }
        }
    })
    .await
}

/// Samples the mesh objects, then the member Pods, until stopped; returns
/// the first sample that broke `ok(policy, peer_authentication, pods)`.
/// The objects are read before the Pods: while joining, unproxied members
/// only ever go away, and while departing proxied ones only go away, so a
/// strict policy (join) or a missing one (departure) read first must agree
/// with Pods read after it.
fn mesh_monitor(
    ns: &TestNamespace,
    uid: &str,
    ok: fn(Option<&DynamicObject>, Option<&DynamicObject>, &[Pod]) -> bool,
) -> (Arc<AtomicBool>, JoinHandle<Result<Option<String>>>) {
    let stop = Arc::new(AtomicBool::new(false));
    let (flag, aps, pas, pods, name, selector) = (
        stop.clone(),
        authorization_policies(ns),
        peer_authentications(ns),
        ns.api::<Pod>(),
        "mf-mesh".to_owned(),
        format!("{UID_LABEL}={uid}"),
    );
    let task = tokio::spawn(async move {
        while !flag.load(Ordering::SeqCst) {
            // One sample is the cluster at one revision: the members are
            // listed, then both mesh objects are listed at exactly the
            // members' resourceVersion. Three reads at three moments could
            // pair a policy from before a plan's writes with a Pod made
            // after them, and see a state that never was.
            let list = pods.list(&ListParams::default().labels(&selector)).await?;
            let revision = list.metadata.resource_version.clone().unwrap_or_default();
            let at = ListParams::default()
                .fields(&format!("metadata.name={name}"))
                .at(&revision)
                .matching(VersionMatch::Exact);
            let ap = aps.list(&at).await?.items.into_iter().next();
            let pa = pas.list(&at).await?.items.into_iter().next();
            let members = list.items;
            if !ok(ap.as_ref(), pa.as_ref(), &members) {
                let proxies: Vec<(String, bool)> =
                    members.iter().map(|p| (p.name_any(), proxied(p))).collect();
                return Ok(Some(format!(
                    "policy {:?}, peer authentication {:?}, members (name, proxied): {proxies:?}",
                    ap.map(|a| a.data["spec"].clone()),
                    pa.map(|p| p.data["spec"].clone())
                )));
            }
            // Sampling period of a monitor, not synchronisation.
            tokio::time::sleep(SAMPLE_EVERY).await;
        }
        Ok(None)
    });
    (stop, task)
}

/// Mesh join and departure with Istio's real CRDs and the test playing the
/// sidecar injector (a mutating webhook adding a native-sidecar proxy to
/// Pods labelled for injection). Without the CRDs a fleet asking for the
/// mesh is InfrastructureBlocked and nothing changes; once they exist it
/// keeps PeerAuthentication `F-mesh` (port 8081 PERMISSIVE) and an
/// identity-free peer rule until every member Pod runs a proxy, then makes
/// the rule strict and deletes the PeerAuthentication. On departure the
/// template disables injection; istiod egress, the PeerAuthentication and
/// the identity-free peer rule are back while any proxy runs (a member held
/// Terminating by the test keeps one), and both mesh objects go after the
/// last. A same-named policy
/// another owner holds is InfrastructureBlocked.
///
/// Istio's CRDs are cluster-wide: this is the only test that installs or
/// removes them, and it starts by removing them.
#[tokio::test]
async fn mesh_join_and_departure_follow_the_proxies() -> Result<()> {
    let ns = TestNamespace::new("fleet-mesh").await?;
    let istio_crds = wasmop_tests::crd_names_in(&wasmop_tests::istio_crd_dir()?)?;
    wasmop_tests::delete_crds(&ns.client, &istio_crds).await?;
    let injector = Injector::start(ns.client.clone(), &ns.name).await?;
    let _op = start(&ns, json!({})).await?;
    let fleet = create_fleet(&ns, "mf", spec(&ns, "Bucket", 2, "mesh")).await?;
    let uid = fleet.metadata.uid.clone().unwrap_or_default();
    wait_provisioned(&ns, "mf").await?;
    let deployments = ns.api::<Deployment>();
    let unmeshed = deployments.get("mf").await?;
    assert!(member_pods(&ns, &uid).await?.iter().all(|p| !proxied(p)));

    // Without security.istio.io/v1: blocked, nothing running changes.
    patch_spec(&ns, "mf", json!({"mesh": {"istio": {}}})).await?;
    wait_blocked(&ns, "mf", "InfrastructureBlocked", "security.istio.io/v1").await?;
    assert_eq!(
        deployments.get("mf").await?.metadata.generation,
        unmeshed.metadata.generation,
        "a blocked mesh changed the workload"
    );

    // The CRDs appear: the join starts, PERMISSIVE until every member has a proxy.
    // The PeerAuthentication lives only until then, which with the
    // injector and kwok can be a few hundred milliseconds, and a watch of
    // a kind whose CRD was just made can lose it (its first resourceVersion
    // may already be too old for the new watch cache, and the relist comes
    // after the policy is gone). So the injector holds the replacement
    // Pods in admission until the policy has been seen.
    injector.hold();
    wasmop_tests::apply_istio_crds(&ns.client).await?;
    let (stop, monitor) = mesh_monitor(&ns, &uid, |ap, _pa, pods| {
        ap.is_none_or(|ap| !strict(ap)) || pods.iter().all(proxied)
    });
    let pa = wait_object(&peer_authentications(&ns), "mf-mesh", true, |_| true).await;
    injector.release();
    let pa = pa?.context("no PeerAuthentication mf-mesh")?;
    assert_eq!(pa.labels().get(UID_LABEL), Some(&uid));
    assert_eq!(
        pa.data["spec"]["portLevelMtls"],
        json!({"8081": {"mode": "PERMISSIVE"}})
    );
    assert_eq!(
        pa.data["spec"]["selector"]["matchLabels"][UID_LABEL],
        json!(uid)
    );
    // The same plan creates the policy and updates the NetworkPolicy and
    // the Deployment; the host writes creates first, so the policy can be
    // there before the updates land.
    wait_for(
        "istiod egress on 15012 and the template's injection label",
        DEADLINE,
        || {
            let (ns, deployments) = (&ns, &deployments);
            async move {
                let labelled = template_labels(deployments, "mf")
                    .await?
                    .contains_key("sidecar.istio.io/inject");
                Ok((istiod_egress(ns, "mf").await? && labelled).then_some(()))
            }
        },
    )
    .await?;
    let template = deployments.get("mf").await?.spec.context("spec")?.template;
    let meta = template.metadata.context("template metadata")?;
    assert_eq!(
        meta.labels
            .unwrap_or_default()
            .get("sidecar.istio.io/inject"),
        Some(&"true".to_owned())
    );
    assert_eq!(
        meta.annotations
            .unwrap_or_default()
            .get("sidecar.istio.io/nativeSidecar"),
        Some(&"true".to_owned())
    );

    // Every member replaced with a proxy: strict rule, no PeerAuthentication.
    wait_object(&peer_authentications(&ns), "mf-mesh", false, |_| true).await?;
    let ap = wait_object(&authorization_policies(&ns), "mf-mesh", true, strict)
        .await?
        .context("authorization policy")?;
    stop.store(true, Ordering::SeqCst);
    if let Some(broken) = monitor.await?? {
        bail!("the peer rule went strict while a member had no proxy: {broken}");
    }
    assert_eq!(
        ap.data["spec"]["rules"][0]["from"][0]["source"]["principals"],
        json!([
            format!("*/ns/{}/sa/celld-runtime", ns.name),
            "*/ns/wasmop/sa/wasmop"
        ])
    );
    assert_eq!(
        ap.data["spec"]["rules"][0]["to"][0]["operation"]["ports"],
        json!(["8081"])
    );
    assert_eq!(
        ap.data["spec"]["rules"][1]["to"][0]["operation"]["ports"],
        json!(["8080"]),
        "applicationAccess AllowAll opens 8080"
    );
    let f = wait_provisioned(&ns, "mf").await?;
    assert_eq!(
        f.metadata
            .annotations
            .clone()
            .unwrap_or_default()
            .get("celld.eric.dev/istio-control-plane")
            .map(String::as_str),
        Some("istio-system")
    );
    let members = member_pods(&ns, &uid).await?;
    assert!(
        members.len() >= 2 && members.iter().all(proxied),
        "every member runs a proxy"
    );
    assert!(injector.injected() >= 2, "the injector gave the proxies");

    // Departure: injection off; while any member still runs a proxy, a
    // member without one talks plaintext peer RPC to it, so 8081 must be
    // PERMISSIVE and the peer rule identity-free whenever proxied and
    // unproxied members coexist (the monitor checks every sample); both
    // mesh objects go after the last proxy. One proxied member is held
    // Terminating by a finalizer of the test, so that mixed state lasts
    // until the test has looked at it.
    let (stop, monitor) = mesh_monitor(&ns, &uid, |ap, pa, pods| {
        let mixed = pods.iter().any(proxied) && !pods.iter().all(proxied);
        !mixed || permissive(ap, pa)
    });
    let held = member_pods(&ns, &uid)
        .await?
        .into_iter()
        .find(proxied)
        .context("a proxied member")?
        .name_any();
    let pods = ns.api::<Pod>();
    pods.patch(
        &held,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": [HOLD_FINALIZER]}})),
    )
    .await?;
    // First the permissive PeerAuthentication cannot be created (a
    // ValidatingAdmissionPolicy refuses it) while the policy's update and
    // the Deployment's would go through, as with a 5xx on one write: the
    // template keeps the proxy until a snapshot shows the permissive
    // objects, so no member starts without a proxy under the strict rule.
    let refusal = wasmop_tests::policy::Policy::apply(
        &ns.client,
        &format!("{}-no-pa", ns.name),
        json!({"spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": ["security.istio.io"], "apiVersions": ["*"],
                "operations": ["CREATE"], "resources": ["peerauthentications"],
            }]},
            "validations": [{"expression": "false", "message": "test: no PeerAuthentication yet"}],
        }}),
        json!({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns.name}}}),
    )
    .await?;
    let probe: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "security.istio.io/v1", "kind": "PeerAuthentication",
        "metadata": {"name": "probe"}, "spec": {},
    }))?;
    refusal
        .wait_enforced("no PeerAuthentication yet", || {
            let (ns, probe) = (&ns, &probe);
            async move {
                let pp = PostParams {
                    dry_run: true,
                    ..Default::default()
                };
                peer_authentications(ns)
                    .create(&pp, probe)
                    .await
                    .map(|_| ())
            }
        })
        .await?;
    patch_spec(&ns, "mf", json!({"mesh": null})).await?;
    // The departure's plan ran and its writes were attempted: refused at
    // the PeerAuthentication, the template unchanged, every member proxied.
    wait_for(
        "the departure refused at the PeerAuthentication",
        DEADLINE,
        || {
            let ns = &ns;
            async move {
                let c = condition(&fleets(ns).get("mf").await?, "Reconciled");
                let refused = c["status"] == "False"
                    && c["message"]
                        .as_str()
                        .is_some_and(|m| m.contains("no PeerAuthentication yet"));
                Ok(refused.then_some(()))
            }
        },
    )
    .await?;
    let labels = template_labels(&deployments, "mf").await?;
    let members = member_pods(&ns, &uid).await?;
    refusal.remove().await?;
    assert_eq!(
        labels.get("sidecar.istio.io/inject").map(String::as_str),
        Some("true"),
        "the template dropped the proxy before the permissive PeerAuthentication existed"
    );
    assert!(
        members.iter().all(proxied),
        "a member without a proxy started while the peer rule could be strict"
    );
    wait_for(
        "every running member without a proxy, the held one terminating",
        DEADLINE,
        || {
            let ns = &ns;
            let uid = uid.clone();
            let held = held.clone();
            async move {
                let pods = member_pods(ns, &uid).await?;
                let (old, new): (Vec<&Pod>, Vec<&Pod>) =
                    pods.iter().partition(|p| p.name_any() == held);
                let done = old
                    .first()
                    .is_some_and(|p| p.metadata.deletion_timestamp.is_some())
                    && new.len() >= 2
                    && new.iter().all(|p| !proxied(p) && is_ready(p));
                Ok(done.then_some(()))
            }
        },
    )
    .await?;
    // The last proxy is still there: the mesh objects say so. (Read, then
    // the held Pod let go, then asserted, so a failure leaves no finalizer.)
    let ap = authorization_policies(&ns).get_opt("mf-mesh").await?;
    let pa = peer_authentications(&ns).get_opt("mf-mesh").await?;
    let egress = istiod_egress(&ns, "mf").await?;
    pods.patch(
        &held,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await?;
    assert!(
        permissive(ap.as_ref(), pa.as_ref()),
        "a proxy still runs: 8081 PERMISSIVE and the peer rule identity-free; \
         policy {:?}, peer authentication {:?}",
        ap.map(|p| p.data["spec"].clone()),
        pa.map(|p| p.data["spec"].clone())
    );
    assert_eq!(
        ap.as_ref()
            .map(|ap| &ap.data["spec"]["rules"][1]["to"][0]["operation"]["ports"]),
        Some(&json!(["8080"])),
        "8080 keeps the access it had during departure"
    );
    assert!(egress, "istiod egress kept while a proxy runs");
    wait_object(&authorization_policies(&ns), "mf-mesh", false, |_| true).await?;
    stop.store(true, Ordering::SeqCst);
    if let Some(broken) = monitor.await?? {
        bail!("peer traffic could be refused while members left the mesh: {broken}");
    }
    assert!(
        peer_authentications(&ns)
            .get_opt("mf-mesh")
            .await?
            .is_none(),
        "no PeerAuthentication after departure"
    );
    wait_for("istiod egress closed", DEADLINE, || {
        let ns = &ns;
        async move { Ok((!istiod_egress(ns, "mf").await?).then_some(())) }
    })
    .await?;
    let f = wait_provisioned(&ns, "mf").await?;
    assert!(
        f.metadata
            .annotations
            .clone()
            .unwrap_or_default()
            .contains_key("celld.eric.dev/istio-control-plane"),
        "the opt-out record is kept"
    );
    assert_eq!(
        template_labels(&deployments, "mf")
            .await?
            .get("sidecar.istio.io/inject"),
        Some(&"false".to_owned()),
        "replacement Pods disable injection explicitly"
    );

    // A same-named policy the fleet does not own blocks the mesh, untouched.
    let foreign: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy",
        "metadata": {"name": "xf-mesh"},
        "spec": {"action": "ALLOW", "rules": [{}]},
    }))?;
    let foreign = authorization_policies(&ns)
        .create(&PostParams::default(), &foreign)
        .await?;
    let mut s = spec(&ns, "Bucket", 1, "mesh-foreign");
    s["mesh"] = json!({"istio": {}});
    create_fleet(&ns, "xf", s).await?;
    wait_blocked(
        &ns,
        "xf",
        "InfrastructureBlocked",
        "AuthorizationPolicy xf-mesh",
    )
    .await?;
    let after = authorization_policies(&ns).get("xf-mesh").await?;
    assert_eq!(
        after.metadata.resource_version, foreign.metadata.resource_version,
        "the foreign policy was not touched"
    );
    assert!(
        deployments.get_opt("xf").await?.is_none(),
        "a blocked fleet creates no workload"
    );
    delete_fleet(&ns, "xf").await?;
    injector.stop().await?;
    delete_fleet(&ns, "mf").await
}

// ---- telemetry and export ----------------------------------------------------------

/// The telemetry and export variables of the member container, in order.
async fn exported_env(ns: &TestNamespace, name: &str) -> Result<Vec<Value>> {
    let d = ns.api::<Deployment>().get(name).await?;
    let pod = serde_json::to_value(d.spec.context("spec")?.template.spec.context("pod spec")?)?;
    let container = pod["containers"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == "celld"))
        .cloned()
        .context("celld container")?;
    Ok(container["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| {
            let n = e["name"].as_str().unwrap_or("");
            n.starts_with("CELLD_OTEL")
                || n.starts_with("OTEL_")
                || n.starts_with("CELLD_EXPORT")
                || n == "POD_NAME"
        })
        .cloned()
        .collect())
}

/// Waits until the workload's telemetry and export variables are `want`.
async fn wait_env(ns: &TestNamespace, name: &str, want: &Value) -> Result<()> {
    wait_for(
        &format!("{name} telemetry and export env"),
        DEADLINE,
        || async move {
            let got = Value::Array(exported_env(ns, name).await?);
            if &got == want {
                Ok(Some(()))
            } else {
                bail!("env: {got}")
            }
        },
    )
    .await
}

/// Telemetry and export reach the member container exactly as the seed's
/// table says (every field set; then the Bucket sink; then export removed),
/// with the Kafka properties Secret mounted read-only at /etc/celld/export
/// and one egress rule each for the collector and the brokers.
#[tokio::test]
async fn telemetry_and_export_env_follow_the_table() -> Result<()> {
    let ns = TestNamespace::new("fleet-export").await?;
    let _op = start(&ns, json!({})).await?;
    let mut s = spec(&ns, "Bucket", 1, "export");
    s["telemetry"] = json!({
        "collectorURL": "http://otel-collector.fleets.svc:4318",
        "egress": {"podLabels": {"app": "otel-collector"}},
        "sampler": "parentbased_traceidratio",
        "samplerArg": "0.1",
        "flushMilliseconds": 5000,
        "flushBytes": 1_048_576,
        "headersSecretKeyRef": {"name": "otel-auth", "key": "headers"},
    });
    s["export"] = json!({
        "sink": "Kafka",
        "classes": ["Cart", "Order"],
        "excludeTables": ["Cart.audit_log", "Order.audit_log"],
        "maxTransactionBytes": 4_194_304,
        "maxRecordBytes": 1_048_576,
        "queueBytes": 268_435_456,
        "kafka": {
            "brokers": ["kafka-0.kafka.kafka.svc:9092", "kafka-1.kafka.kafka.svc:9093"],
            "topic": "celld-changes",
            "retryMilliseconds": 30000,
            "propertiesSecretKeyRef": {"name": "kafka-client", "key": "kafka.properties"},
            "egress": {"podLabels": {"app.kubernetes.io/name": "kafka"}, "namespace": "kafka"},
        },
    });
    create_fleet(&ns, "ef", s).await?;
    wait_provisioned(&ns, "ef").await?;
    let lit = |n: &str, v: &str| json!({"name": n, "value": v});
    let telemetry = vec![
        lit("CELLD_OTEL", "http://otel-collector.fleets.svc:4318"),
        json!({"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}}),
        lit(
            "OTEL_RESOURCE_ATTRIBUTES",
            &format!(
                "k8s.namespace.name={},k8s.pod.name=$(POD_NAME),celld.fleet.name=ef",
                ns.name
            ),
        ),
        lit("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
        lit("OTEL_TRACES_SAMPLER_ARG", "0.1"),
        lit("CELLD_OTEL_FLUSH_MS", "5000"),
        lit("CELLD_OTEL_FLUSH_BYTES", "1048576"),
        json!({"name": "OTEL_EXPORTER_OTLP_HEADERS",
               "valueFrom": {"secretKeyRef": {"name": "otel-auth", "key": "headers"}}}),
    ];
    let mut want = telemetry.clone();
    want.extend([
        lit("CELLD_EXPORT", "1"),
        lit("CELLD_EXPORT_SINK", "Kafka"),
        lit("CELLD_EXPORT_CLASSES", "Cart,Order"),
        lit("CELLD_EXPORT_TABLES", "Cart.audit_log,Order.audit_log"),
        lit("CELLD_EXPORT_MAX_TX_BYTES", "4194304"),
        lit("CELLD_EXPORT_MAX_RECORD_BYTES", "1048576"),
        lit("CELLD_EXPORT_QUEUE_BYTES", "268435456"),
        lit(
            "CELLD_EXPORT_KAFKA_BROKERS",
            "kafka-0.kafka.kafka.svc:9092,kafka-1.kafka.kafka.svc:9093",
        ),
        lit("CELLD_EXPORT_TOPIC", "celld-changes"),
        lit("CELLD_EXPORT_RETRY_MS", "30000"),
        lit(
            "CELLD_EXPORT_KAFKA_PROPERTIES",
            "/etc/celld/export/kafka.properties",
        ),
    ]);
    assert_eq!(Value::Array(exported_env(&ns, "ef").await?), json!(want));
    let d = ns.api::<Deployment>().get("ef").await?;
    let pod = serde_json::to_value(d.spec.context("spec")?.template.spec.context("pod spec")?)?;
    assert!(
        pod["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|v| v["name"] == "export" && v["secret"]["secretName"] == "kafka-client"),
        "the whole Secret is a volume: {}",
        pod["volumes"]
    );
    assert!(
        pod["containers"][0]["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|m| m["name"] == "export"
                && m["mountPath"] == "/etc/celld/export"
                && m["readOnly"] == true),
        "mounted read-only at /etc/celld/export"
    );
    let env_names: Vec<String> = pod["containers"][0]["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["name"].as_str().map(str::to_owned))
        .collect();
    assert!(
        !env_names.iter().any(|n| n == "CELLD_OTEL_SINK"),
        "CELLD_OTEL_SINK is never emitted"
    );
    let np = serde_json::to_value(ns.api::<NetworkPolicy>().get("ef").await?.spec)?;
    let egress = np["egress"].as_array().cloned().unwrap_or_default();
    assert!(
        egress.contains(&json!({
            "to": [{"podSelector": {"matchLabels": {"app": "otel-collector"}}}],
            "ports": [{"protocol": "TCP", "port": 4318}],
        })),
        "one collector rule: {np}"
    );
    let kafka: Vec<&Value> = egress
        .iter()
        .filter(|r| r["ports"].to_string().contains("9092"))
        .collect();
    assert_eq!(kafka.len(), 1, "{np}");
    assert_eq!(
        kafka[0]["ports"],
        json!([{"protocol": "TCP", "port": 9092}, {"protocol": "TCP", "port": 9093}])
    );
    assert_eq!(
        kafka[0]["to"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
        "kafka"
    );

    // The Bucket sink: its own fields; omitted ones are not emitted.
    patch_spec(
        &ns,
        "ef",
        json!({"export": {"sink": "Bucket", "kafka": null, "maxTransactionBytes": null,
                          "maxRecordBytes": null, "queueBytes": null, "excludeTables": null,
                          "bucket": {"name": format!("{}-exp", ns.name), "flushMilliseconds": 10000,
                                     "flushBytes": 8_388_608, "retentionDays": 30}}}),
    )
    .await?;
    let mut want = telemetry.clone();
    want.extend([
        lit("CELLD_EXPORT", "1"),
        lit("CELLD_EXPORT_SINK", "Bucket"),
        lit("CELLD_EXPORT_CLASSES", "Cart,Order"),
        lit("CELLD_EXPORT_BUCKET", &format!("{}-exp", ns.name)),
        lit("CELLD_EXPORT_FLUSH_MS", "10000"),
        lit("CELLD_EXPORT_FLUSH_BYTES", "8388608"),
        lit("CELLD_EXPORT_RETENTION", "30d"),
    ]);
    wait_env(&ns, "ef", &json!(want)).await?;
    wait_provisioned(&ns, "ef").await?;

    // Export removed: no CELLD_EXPORT variable, no export volume.
    patch_spec(&ns, "ef", json!({"export": null})).await?;
    wait_env(&ns, "ef", &json!(telemetry)).await?;
    let d = ns.api::<Deployment>().get("ef").await?;
    let pod = serde_json::to_value(d.spec.context("spec")?.template.spec.context("pod spec")?)?;
    assert!(
        !pod["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|v| v["name"] == "export"),
        "{}",
        pod["volumes"]
    );
    wait_provisioned(&ns, "ef").await?;
    delete_fleet(&ns, "ef").await
}

// ---- previews ----------------------------------------------------------------------

/// A pool's previews, the upstream sample's shape, in `bucket`.
fn previews(bucket: &str) -> Value {
    json!({
        "runtimeImage": IMAGE,
        "serviceAccountName": "celld-runtime",
        "zone": ZONE,
        "storage": {"bucket": bucket, "region": "us-east-1"},
        "routing": {"baseDomain": "previews.example.com", "scheme": "https",
                    "ingress": {"className": "nginx", "tlsSecretName": "previews-tls"},
                    "source": {"namespace": "ingress-nginx", "podLabels": {"app": "ingress"}}},
    })
}

/// `spec.previews` may be added once and is immutable after that (CEL);
/// it reserves the preview bucket to the pool's UID without touching the
/// pool's runtime; preview fleets run under disjoint prefixes of it (a
/// second one asking for a held prefix is StorageScopeConflict).
#[tokio::test]
async fn previews_reserve_a_bucket_and_children_get_disjoint_prefixes() -> Result<()> {
    let ns = TestNamespace::new("fleet-previews").await?;
    let _op = start(&ns, json!({})).await?;
    let pool = create_fleet(&ns, "pool", spec(&ns, "Bucket", 1, "pool")).await?;
    let pool_uid = pool.metadata.uid.clone().unwrap_or_default();
    wait_provisioned(&ns, "pool").await?;
    let runtime = ns.api::<Deployment>().get("pool").await?;
    let preview_bucket = format!("{}-previews", ns.name);

    // Added once.
    patch_spec(&ns, "pool", json!({"previews": previews(&preview_bucket)})).await?;
    let f = wait_condition(&ns, "pool", "PreviewsReady", "True").await?;
    assert_eq!(
        ns.api::<Deployment>()
            .get("pool")
            .await?
            .metadata
            .generation,
        runtime.metadata.generation,
        "previews changed the pool's runtime"
    );
    assert_eq!(condition(&f, "Provisioned")["status"], "True");
    let preview_reservation = reservations(&ns.client)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .find(|r| r.data["spec"]["bucket"] == preview_bucket.as_str())
        .context("the preview bucket's reservation")?;
    assert_eq!(
        preview_reservation.data["spec"]["fleetUID"],
        json!(pool_uid)
    );
    assert_eq!(
        preview_reservation
            .metadata
            .annotations
            .clone()
            .unwrap_or_default()
            .get("celld.eric.dev/preview-pool")
            .map(String::as_str),
        Some("true")
    );

    // Immutable after that: changed or removed, the API server refuses.
    let mut changed = previews(&preview_bucket);
    changed["zone"] = json!("us-east-1b");
    for patch in [json!({"previews": changed}), json!({"previews": null})] {
        let err = patch_spec(&ns, "pool", patch)
            .await
            .expect_err("previews are immutable");
        assert!(
            err.to_string()
                .contains("preview configuration cannot change once enabled"),
            "{err}"
        );
    }

    // A preview fleet under prefix pr-1 runs; a second one on pr-1 is refused.
    let child = |prefix: &str| {
        let mut s = spec(&ns, "Bucket", 1, "unused");
        s["storage"]["bucket"] = json!(preview_bucket);
        s["storage"]["prefix"] = json!(prefix);
        s["storage"]["previewFleetRef"] = json!({"name": "pool", "uid": pool_uid});
        s
    };
    create_fleet(&ns, "pr-1", child("pr-1")).await?;
    let f = wait_provisioned(&ns, "pr-1").await?;
    let own = f.data["status"]["reservation"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let r = reservations(&ns.client).get(&own).await?;
    assert_eq!(r.data["spec"]["prefix"], "pr-1");
    assert_eq!(r.data["spec"]["bucket"], json!(preview_bucket));
    assert_ne!(
        own,
        preview_reservation.name_any(),
        "the child reserves its prefix, not the bucket"
    );
    let d = ns.api::<Deployment>().get("pr-1").await?;
    assert!(
        serde_json::to_string(&d.spec)?.contains(&format!("s3://{preview_bucket}/pr-1")),
        "the child runs in its prefix"
    );
    create_fleet(&ns, "pr-1-again", child("pr-1")).await?;
    wait_blocked(
        &ns,
        "pr-1-again",
        "StorageScopeConflict",
        "prefix pr-1 of bucket",
    )
    .await?;
    assert!(
        ns.api::<Deployment>()
            .get_opt("pr-1-again")
            .await?
            .is_none(),
        "a refused preview fleet creates nothing"
    );
    create_fleet(&ns, "pr-2", child("pr-2")).await?;
    wait_provisioned(&ns, "pr-2").await?;

    for name in ["pr-1-again", "pr-2", "pr-1", "pool"] {
        delete_fleet(&ns, name).await?;
    }
    reservations(&ns.client)
        .delete(&preview_reservation.name_any(), &DeleteParams::default())
        .await?;
    Ok(())
}

// ---- CelldPreview ------------------------------------------------------------------

async fn create_preview(ns: &TestNamespace, name: &str, parent: &str, ttl: i64) -> Result<String> {
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "celld.eric.dev/v1alpha1",
        "kind": "CelldPreview",
        "metadata": {"name": name},
        "spec": {"fleetRef": {"name": parent}, "source": format!("feature/{name}"),
                 "revision": "0123abc", "ttlSeconds": ttl},
    }))?;
    let created = celld_previews(ns)
        .create(&PostParams::default(), &obj)
        .await
        .with_context(|| format!("creating CelldPreview {name}"))?;
    Ok(created.metadata.uid.unwrap_or_default())
}

/// Waits until the preview's status phase is `phase`.
async fn wait_preview_phase(ns: &TestNamespace, name: &str, phase: &str) -> Result<DynamicObject> {
    let api = celld_previews(ns);
    wait_for(&format!("preview {name} phase {phase}"), DEADLINE, || {
        let api = api.clone();
        async move {
            let p = api.get(name).await?;
            if p.data["status"]["phase"] == phase {
                Ok(Some(p))
            } else {
                bail!("status: {}", p.data["status"])
            }
        }
    })
    .await
}

/// A CelldPreview generates its preview fleet from the parent's
/// `spec.previews`: its own prefix of the preview bucket, previewFleetRef
/// to the parent, routed at `<preview>.<baseDomain>`; a second preview
/// gets a disjoint prefix; a preview whose TTL passes loses its fleet and
/// reports Expired; a preview under a fleet without previews is Blocked
/// and creates nothing.
#[tokio::test]
async fn celld_preview_generates_its_fleet_and_expires() -> Result<()> {
    let ns = TestNamespace::new("fleet-celldpreview").await?;
    let _op = start(&ns, json!({})).await?;
    let preview_bucket = format!("{}-previews", ns.name);
    let plain = create_fleet(&ns, "plain", spec(&ns, "Bucket", 1, "plain")).await?;
    let mut pool_spec = spec(&ns, "Bucket", 1, "pool");
    pool_spec["previews"] = previews(&preview_bucket);
    pool_spec["previews"]["seeding"] = json!({"executor": "celld-seed", "sources": [{
        "name": "production",
        "fleetRef": {"name": "plain", "namespace": ns.name, "uid": plain.metadata.uid},
    }]});
    let pool = create_fleet(&ns, "pool", pool_spec).await?;
    let pool_uid = pool.metadata.uid.clone().unwrap_or_default();
    wait_condition(&ns, "pool", "PreviewsReady", "True").await?;

    // Two previews: each its own fleet, prefix and host.
    let uid_a = create_preview(&ns, "pv-a", "pool", 86_400).await?;
    let uid_b = create_preview(&ns, "pv-b", "pool", 60).await?;
    let mut prefixes = Vec::new();
    for (name, uid) in [("pv-a", &uid_a), ("pv-b", &uid_b)] {
        let child = wait_object(&fleets(&ns), name, true, |_| true)
            .await?
            .context("child fleet")?;
        let storage = &child.data["spec"]["storage"];
        let short: String = uid.chars().filter(|c| *c != '-').take(8).collect();
        assert_eq!(storage["prefix"], json!(format!("{name}-{short}")));
        assert_eq!(storage["bucket"], json!(preview_bucket));
        assert_eq!(
            storage["previewFleetRef"],
            json!({"name": "pool", "uid": pool_uid})
        );
        assert_eq!(
            child.data["spec"]["routing"]["hostnames"],
            json!([format!("{name}.previews.example.com")])
        );
        assert_eq!(
            child.data["spec"]["routing"]["ingress"]["className"],
            "nginx"
        );
        let owner = child.metadata.owner_references.clone().unwrap_or_default();
        assert!(
            owner
                .iter()
                .any(|o| o.uid == *uid && o.controller == Some(true)),
            "{owner:?}"
        );
        prefixes.push(storage["prefix"].clone());
    }
    assert_ne!(prefixes[0], prefixes[1], "disjoint prefixes");

    let a = wait_preview_phase(&ns, "pv-a", "Ready").await?;
    assert_eq!(a.data["status"]["url"], "https://pv-a.previews.example.com");
    assert_eq!(a.data["status"]["fleetName"], "pv-a");
    assert_eq!(a.data["status"]["parentFleetUID"], json!(pool_uid));
    assert!(a.data["status"]["expiresAt"].is_string());
    let a_reservation = fleets(&ns).get("pv-a").await?.data["status"]["reservation"].clone();
    assert_eq!(
        reservations(&ns.client)
            .get(a_reservation.as_str().context("pv-a reservation")?)
            .await?
            .data["spec"]["prefix"],
        prefixes[0]
    );

    // pv-b's TTL (60 s, the CRD's minimum) passes: its fleet is deleted and
    // the preview reports Expired.
    let b = wait_preview_phase(&ns, "pv-b", "Expired").await?;
    let expired = b.data["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Expired").cloned())
        .unwrap_or_default();
    assert_eq!(expired["status"], "True", "{expired}");
    assert!(fleets(&ns).get_opt("pv-b").await?.is_none());
    assert!(
        fleets(&ns).get_opt("pv-a").await?.is_some(),
        "pv-a lives on"
    );

    // A preview under a fleet without previews: Blocked, nothing created.
    create_preview(&ns, "pv-c", "plain", 86_400).await?;
    let c = wait_preview_phase(&ns, "pv-c", "Blocked").await?;
    let blocked = c.data["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Blocked").cloned())
        .unwrap_or_default();
    assert_eq!(blocked["reason"], "PreviewsNotConfigured", "{blocked}");
    assert!(fleets(&ns).get_opt("pv-c").await?.is_none());

    // A seeded preview: its fleet carries the selection as
    // storage.initialization for the (external, not bundled) executor.
    let seeded: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "celld.eric.dev/v1alpha1",
        "kind": "CelldPreview",
        "metadata": {"name": "pv-s"},
        "spec": {"fleetRef": {"name": "pool"}, "source": "feature/seed",
                 "seed": {"source": "production", "objects": [{"class": "Cart", "id": "cart-1"}]}},
    }))?;
    celld_previews(&ns)
        .create(&PostParams::default(), &seeded)
        .await?;
    let child = wait_object(&fleets(&ns), "pv-s", true, |_| true)
        .await?
        .context("seeded child")?;
    let init = &child.data["spec"]["storage"]["initialization"];
    assert_eq!(init["executor"], "celld-seed", "{init}");
    assert_eq!(init["sourceFleet"]["uid"], json!(plain.metadata.uid));
    assert_eq!(init["selection"]["objects"][0]["id"], "cart-1");
    assert_eq!(init["target"]["previewName"], "pv-s");
    let s = wait_for("pv-s Seeded=Unknown/ExecutorRequired", DEADLINE, || {
        let api = celld_previews(&ns);
        async move {
            let p = api.get("pv-s").await?;
            let found = p.data["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Seeded" && c["reason"] == "ExecutorRequired");
            Ok(found.then_some(p))
        }
    })
    .await?;
    assert_eq!(s.data["status"]["seedPhase"], "Pending");

    // Deleting a preview collects its fleet (ownerReference, through the
    // fleet's lifecycle finalizer).
    for name in ["pv-a", "pv-b", "pv-c", "pv-s"] {
        celld_previews(&ns)
            .delete(name, &DeleteParams::default())
            .await?;
    }
    wait_object(&fleets(&ns), "pv-a", false, |_| true).await?;
    wait_object(&fleets(&ns), "pv-s", false, |_| true).await?;
    for name in ["plain", "pool"] {
        delete_fleet(&ns, name).await?;
    }
    // Reservations outlive fleets by design: remove the preview bucket's
    // and the children's.
    for r in reservations(&ns.client)
        .list(&ListParams::default())
        .await?
        .items
    {
        if r.data["spec"]["bucket"] == preview_bucket.as_str() {
            reservations(&ns.client)
                .delete(&r.name_any(), &DeleteParams::default())
                .await
                .ok();
        }
    }
    Ok(())
}
