//! The `engine` plugin (FireboltEngine, FireboltEngineClass) on the local
//! control plane, together with the `instance` plugin in the same
//! operator: the real `.wasm` components, the real host, kube-apiserver
//! with the CRDs from `crds/`, controller-manager (StatefulSets) and kwok
//! (Pods become Ready).
//!
//! Every engine sets `drainCheckEnabled: false`: the drain check would
//! scrape kwok Pod IPs, and nothing here talks to a Pod.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, Resource};
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use wasmop_tests::operator::{RunningOperator, load_plugin};
use wasmop_tests::{TestNamespace, apply_project_crds, wait_for};

/// Rollouts go through the scheduler, kwok and the controller-manager.
const DEADLINE: Duration = Duration::from_secs(120);
/// Poll interval of the samplers that watch a rollout.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);
/// The engine plugin's retry while the instance gate blocks an engine.
const BLOCKED_RETRY: Duration = Duration::from_secs(10);

const GROUP: &str = "compute.firebolt.io";
const VERSION: &str = "v1alpha1";

fn firebolt_api(ns: &TestNamespace, kind: &str, plural: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk(GROUP, VERSION, kind);
    let ar = ApiResource::from_gvk_with_plural(&gvk, plural);
    Api::namespaced_with(ns.client.clone(), &ns.name, &ar)
}

fn instances(ns: &TestNamespace) -> Api<DynamicObject> {
    firebolt_api(ns, "FireboltInstance", "fireboltinstances")
}

fn engines(ns: &TestNamespace) -> Api<DynamicObject> {
    firebolt_api(ns, "FireboltEngine", "fireboltengines")
}

fn classes(ns: &TestNamespace) -> Api<DynamicObject> {
    firebolt_api(ns, "FireboltEngineClass", "fireboltengineclasses")
}

fn object(kind: &str, name: &str, spec: Value) -> Result<DynamicObject> {
    Ok(serde_json::from_value(json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": kind,
        "metadata": {"name": name},
        "spec": spec,
    }))?)
}

/// An engine of instance `fb` with `replicas` nodes, class `class` if
/// given, and the drain check off.
fn engine_spec(replicas: i64, class: Option<&str>) -> Value {
    let mut spec = json!({
        "instanceRef": "fb",
        "replicas": replicas,
        "drainCheckEnabled": false,
        "template": {"spec": {"containers": [
            {"name": "engine", "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}},
        ]}},
    });
    if let Some(c) = class {
        spec["engineClassRef"] = json!(c);
    }
    spec
}

fn class_spec(image: &str) -> Value {
    json!({
        "template": {
            "metadata": {"labels": {"team": "data"}},
            "spec": {"containers": [{"name": "engine", "image": image}]},
        },
    })
}

/// Applies the CRDs and starts one operator running both plugins.
async fn start(ns: &TestNamespace) -> Result<RunningOperator> {
    apply_project_crds(&ns.client).await?;
    let instance = load_plugin("instance", json!({}))?;
    let engine = load_plugin("engine", json!({}))?;
    RunningOperator::start(
        ns.client.clone(),
        vec![ns.name.clone()],
        vec![instance, engine],
    )
    .await
}

async fn create_instance(ns: &TestNamespace) -> Result<()> {
    instances(ns)
        .create(
            &PostParams::default(),
            &object(
                "FireboltInstance",
                "fb",
                json!({"metadata": {}, "gateway": {"replicas": 1}}),
            )?,
        )
        .await?;
    Ok(())
}

fn condition(obj: &DynamicObject, type_: &str) -> Value {
    obj.data["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_).cloned())
        .unwrap_or(Value::Null)
}

fn generation_label(labels: Option<&std::collections::BTreeMap<String, String>>) -> Option<i64> {
    labels?.get("firebolt.io/generation")?.parse().ok()
}

/// The generation `<e>-service` selects, if the Service exists.
async fn selected_generation(ns: &TestNamespace, engine: &str) -> Result<Option<i64>> {
    let services: Api<Service> = ns.api();
    Ok(services
        .get_opt(&format!("{engine}-service"))
        .await?
        .and_then(|s| s.spec)
        .and_then(|s| generation_label(s.selector.as_ref())))
}

/// `status.readyReplicas` of StatefulSet `<e>-g<g>` (None: no such set).
async fn sts_ready(ns: &TestNamespace, engine: &str, g: i64) -> Result<Option<i32>> {
    let sets: Api<StatefulSet> = ns.api();
    Ok(sets
        .get_opt(&format!("{engine}-g{g}"))
        .await?
        .map(|s| s.status.and_then(|s| s.ready_replicas).unwrap_or(0)))
}

/// Names of the engine's StatefulSets.
async fn statefulsets_of(ns: &TestNamespace, engine: &str) -> Result<Vec<String>> {
    let sets: Api<StatefulSet> = ns.api();
    let lp = ListParams::default().labels(&format!("firebolt.io/engine={engine}"));
    let mut names: Vec<String> = sets
        .list(&lp)
        .await?
        .items
        .into_iter()
        .filter_map(|s| s.metadata.name)
        .collect();
    names.sort();
    Ok(names)
}

/// Waits until `engine` serves on one generation of at least `min_gen`:
/// phase stable and Ready, no generation draining, the StatefulSet of
/// that generation the only one and all `replicas` ready, the Service
/// selecting it. Returns the generation.
async fn wait_stable(ns: &TestNamespace, engine: &str, min_gen: i64, replicas: i32) -> Result<i64> {
    let api = engines(ns);
    wait_for(
        &format!("{engine} stable on generation >= {min_gen} with {replicas} ready"),
        DEADLINE,
        || {
            let api = api.clone();
            async move {
                let e = api.get(engine).await?;
                let status = &e.data["status"];
                let current = status["currentGeneration"].as_i64().unwrap_or(-1);
                let active = status["activeGeneration"].as_i64().unwrap_or(-1);
                let steady = status["phase"] == "stable"
                    && current == active
                    && active >= min_gen
                    && status["drainingGeneration"].is_null()
                    && condition(&e, "Ready")["status"] == "True";
                if !steady {
                    bail!("status: {status}");
                }
                let sets = statefulsets_of(ns, engine).await?;
                let selected = selected_generation(ns, engine).await?;
                let ready = sts_ready(ns, engine, active).await?;
                if sets != [format!("{engine}-g{active}")]
                    || selected != Some(active)
                    || ready != Some(replicas)
                {
                    bail!(
                        "generation {active}: StatefulSets {sets:?}, Service selects {selected:?}, \
                         {ready:?} ready"
                    );
                }
                Ok(Some(active))
            }
        },
    )
    .await
}

/// One look at an engine's Service while a rollout runs.
#[derive(Clone, Debug)]
struct Sample {
    engine: String,
    selected: Option<i64>,
    /// Ready Pods of the selected generation.
    ready_pods: i32,
    /// `readyReplicas` of the selected generation's StatefulSet.
    sts_ready: Option<i32>,
}

/// Samples the Service selector of each engine, and how ready the selected
/// generation is, until stopped.
struct Sampler {
    stop: Arc<AtomicBool>,
    task: JoinHandle<Result<Vec<Sample>>>,
}

impl Sampler {
    fn start(client: Client, namespace: &str, engines: &[&str]) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let namespace = namespace.to_owned();
        let engines: Vec<String> = engines.iter().map(|e| (*e).to_owned()).collect();
        let task = tokio::spawn(async move {
            let ns = Probe { client, namespace };
            let mut samples = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                for engine in &engines {
                    samples.push(ns.sample(engine).await?);
                }
                // The sampling rate, not a synchronisation: the test waits
                // on conditions with deadlines while this runs.
                tokio::time::sleep(SAMPLE_EVERY).await;
            }
            Ok(samples)
        });
        Self { stop, task }
    }

    async fn finish(self) -> Result<Vec<Sample>> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await?
    }
}

/// The part of a [`TestNamespace`] a sampler needs (without its cleanup).
struct Probe {
    client: Client,
    namespace: String,
}

impl Probe {
    async fn sample(&self, engine: &str) -> Result<Sample> {
        let services: Api<Service> = Api::namespaced(self.client.clone(), &self.namespace);
        let selected = services
            .get_opt(&format!("{engine}-service"))
            .await?
            .and_then(|s| s.spec)
            .and_then(|s| generation_label(s.selector.as_ref()));
        let (mut ready_pods, mut sts_ready) = (0, None);
        if let Some(g) = selected {
            // StatefulSet first, Pods second: a Pod seen Ready after the
            // StatefulSet counted it can only add readiness.
            let sets: Api<StatefulSet> = Api::namespaced(self.client.clone(), &self.namespace);
            sts_ready = sets
                .get_opt(&format!("{engine}-g{g}"))
                .await?
                .map(|s| s.status.and_then(|s| s.ready_replicas).unwrap_or(0));
            let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
            let lp = ListParams::default().labels(&format!(
                "firebolt.io/engine={engine},firebolt.io/generation={g}"
            ));
            ready_pods = i32::try_from(
                pods.list(&lp)
                    .await?
                    .items
                    .iter()
                    .filter(|p| p.metadata.deletion_timestamp.is_none())
                    .filter(|p| {
                        p.status
                            .as_ref()
                            .and_then(|s| s.conditions.as_ref())
                            .is_some_and(|cs| {
                                cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                            })
                    })
                    .count(),
            )?;
        }
        Ok(Sample {
            engine: engine.to_owned(),
            selected,
            ready_pods,
            sts_ready,
        })
    }
}

/// The samples of `engine` where its Service selector changed (the first
/// sample counts as a change).
fn switches<'a>(samples: &'a [Sample], engine: &str) -> Vec<&'a Sample> {
    let mut last = None;
    let mut out = Vec::new();
    for s in samples.iter().filter(|s| s.engine == engine) {
        if s.selected != last {
            out.push(s);
            last = s.selected;
        }
    }
    out
}

async fn patch_merge(api: &Api<DynamicObject>, name: &str, patch: Value) -> Result<DynamicObject> {
    Ok(api
        .patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await?)
}

fn engine_image(sts: &StatefulSet) -> Option<String> {
    sts.spec
        .as_ref()?
        .template
        .spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == "engine")?
        .image
        .clone()
}

#[tokio::test]
async fn instance_class_and_engine_come_up() -> Result<()> {
    let ns = TestNamespace::new("engine-up").await?;
    let _op = start(&ns).await?;
    create_instance(&ns).await?;
    classes(&ns)
        .create(
            &PostParams::default(),
            &object(
                "FireboltEngineClass",
                "standard",
                class_spec("ghcr.io/firebolt-db/engine:v1"),
            )?,
        )
        .await?;
    let api = engines(&ns);
    api.create(
        &PostParams::default(),
        &object("FireboltEngine", "e1", engine_spec(2, Some("standard")))?,
    )
    .await?;

    let g = wait_stable(&ns, "e1", 0, 2).await?;
    assert_eq!(g, 0, "the first generation is 0");
    let e1 = api.get("e1").await?;
    let uid = e1.meta().uid.clone().context("uid")?;
    assert_eq!(condition(&e1, "InstanceReady")["status"], "True");
    assert_eq!(condition(&e1, "Ready")["reason"], "EngineReady");

    // The generation's objects, owned by the engine.
    let sets: Api<StatefulSet> = ns.api();
    let services: Api<Service> = ns.api();
    let configmaps: Api<ConfigMap> = ns.api();
    let sts = sets.get("e1-g0").await?;
    let headless = services.get("e1-g0-hl").await?;
    let service = services.get("e1-service").await?;
    let config = configmaps.get("e1-g0-config").await?;
    for meta in [
        &sts.metadata,
        &headless.metadata,
        &service.metadata,
        &config.metadata,
    ] {
        let owner = meta
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true))
            .with_context(|| format!("{:?} has no controller", meta.name))?;
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("FireboltEngine", uid.as_str())
        );
    }
    assert_eq!(
        engine_image(&sts).as_deref(),
        Some("ghcr.io/firebolt-db/engine:v1"),
        "the class template's image"
    );
    let pod_labels = sts
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    assert_eq!(pod_labels.get("team").map(String::as_str), Some("data"));
    assert_eq!(
        pod_labels.get("firebolt.io/generation").map(String::as_str),
        Some("0")
    );
    let service_spec = service.spec.context("service spec")?;
    assert_eq!(service_spec.cluster_ip.as_deref(), Some("None"));
    assert_ne!(
        service_spec.publish_not_ready_addresses,
        Some(true),
        "only Ready Pods are published"
    );

    // config.yaml carries the instance's id and metadata endpoint.
    let instance = instances(&ns).get("fb").await?;
    let id = instance.data["spec"]["id"].as_str().context("spec.id")?;
    let text = config
        .data
        .unwrap_or_default()
        .remove("config.yaml")
        .unwrap_or_default();
    assert!(text.contains(id), "{text}");
    assert!(
        text.contains(&format!("fb-metadata.{}.svc.cluster.local:7000", ns.name)),
        "{text}"
    );
    assert!(
        text.contains(&format!("e1-g0-1.e1-g0-hl.{}.svc.cluster.local", ns.name)),
        "{text}"
    );

    // The class counts its engine.
    wait_for("the class to count its engine", DEADLINE, || {
        let classes = classes(&ns);
        async move {
            let c = classes.get("standard").await?;
            if c.data["status"]["boundEngines"] == 1 {
                Ok(Some(()))
            } else {
                bail!("class status: {}", c.data["status"])
            }
        }
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn class_edit_rolls_every_consumer_and_switches_after_pods_are_ready() -> Result<()> {
    let ns = TestNamespace::new("engine-class").await?;
    let _op = start(&ns).await?;
    create_instance(&ns).await?;
    let classes = classes(&ns);
    classes
        .create(
            &PostParams::default(),
            &object(
                "FireboltEngineClass",
                "shared",
                class_spec("ghcr.io/firebolt-db/engine:v1"),
            )?,
        )
        .await?;
    let api = engines(&ns);
    for (name, replicas) in [("analytics", 2), ("ingest", 1)] {
        api.create(
            &PostParams::default(),
            &object(
                "FireboltEngine",
                name,
                engine_spec(replicas, Some("shared")),
            )?,
        )
        .await?;
    }
    assert_eq!(wait_stable(&ns, "analytics", 0, 2).await?, 0);
    assert_eq!(wait_stable(&ns, "ingest", 0, 1).await?, 0);

    let sampler = Sampler::start(ns.client.clone(), &ns.name, &["analytics", "ingest"]);
    patch_merge(
        &classes,
        "shared",
        json!({"spec": {"template": {"spec": {"containers": [
            {"name": "engine", "image": "ghcr.io/firebolt-db/engine:v2"},
        ]}}}}),
    )
    .await?;
    let analytics = wait_stable(&ns, "analytics", 1, 2).await;
    let ingest = wait_stable(&ns, "ingest", 1, 1).await;
    let samples = sampler.finish().await?;
    let (analytics, ingest) = (analytics?, ingest?);
    assert_eq!((analytics, ingest), (1, 1), "one new generation each");

    let sets: Api<StatefulSet> = ns.api();
    for (engine, replicas) in [("analytics", 2), ("ingest", 1)] {
        let sts = sets.get(&format!("{engine}-g1")).await?;
        assert_eq!(
            engine_image(&sts).as_deref(),
            Some("ghcr.io/firebolt-db/engine:v2"),
            "{engine}"
        );
        let seen = switches(&samples, engine);
        let gens: Vec<Option<i64>> = seen.iter().map(|s| s.selected).collect();
        assert_eq!(gens, [Some(0), Some(1)], "{engine}: {seen:?}");
        for s in seen {
            assert_eq!(
                s.ready_pods, replicas,
                "{engine}: the Service selected generation {:?} before all its Pods were Ready: {s:?}",
                s.selected
            );
            assert_eq!(
                s.sts_ready,
                Some(replicas),
                "{engine}: StatefulSet of generation {:?} not all ready at the switch: {s:?}",
                s.selected
            );
        }
    }
    Ok(())
}

#[tokio::test]
async fn scaling_goes_blue_green_without_an_unready_service() -> Result<()> {
    let ns = TestNamespace::new("engine-scale").await?;
    let _op = start(&ns).await?;
    create_instance(&ns).await?;
    let api = engines(&ns);
    api.create(
        &PostParams::default(),
        &object("FireboltEngine", "e", engine_spec(3, None))?,
    )
    .await?;
    assert_eq!(wait_stable(&ns, "e", 0, 3).await?, 0);

    let sampler = Sampler::start(ns.client.clone(), &ns.name, &["e"]);
    patch_merge(&api, "e", json!({"spec": {"replicas": 5}})).await?;
    let converged = wait_stable(&ns, "e", 1, 5).await;
    let samples = sampler.finish().await?;
    assert_eq!(converged?, 1, "scaling rolled exactly one new generation");

    // The scale went through a new StatefulSet, not a resize of the old.
    let sts = ns.api::<StatefulSet>().get("e-g1").await?;
    assert_eq!(sts.spec.and_then(|s| s.replicas), Some(5));

    assert!(!samples.is_empty());
    for s in &samples {
        assert!(
            s.selected.is_some() && s.ready_pods > 0 && s.sts_ready.unwrap_or(0) > 0,
            "the Service pointed at no ready Pod: {s:?}"
        );
    }
    let seen = switches(&samples, "e");
    let gens: Vec<Option<i64>> = seen.iter().map(|s| s.selected).collect();
    assert_eq!(gens, [Some(0), Some(1)], "{seen:?}");
    assert_eq!(seen[1].ready_pods, 5, "switched before all 5 were Ready");
    Ok(())
}

#[tokio::test]
async fn engine_waits_for_its_instance_then_proceeds_at_once() -> Result<()> {
    let ns = TestNamespace::new("engine-gate").await?;
    let _op = start(&ns).await?;
    let api = engines(&ns);
    api.create(
        &PostParams::default(),
        &object("FireboltEngine", "early", engine_spec(1, None))?,
    )
    .await?;

    // Blocked: the condition says why, nothing is created.
    let blocked = wait_for("early: InstanceReady=False", DEADLINE, || {
        let api = api.clone();
        async move {
            let e = api.get("early").await?;
            let c = condition(&e, "InstanceReady");
            if c["status"] == "False" {
                Ok(Some(e))
            } else {
                bail!("InstanceReady: {c}")
            }
        }
    })
    .await?;
    let c = condition(&blocked, "InstanceReady");
    assert_eq!(c["reason"], "InstanceNotReady");
    assert!(
        c["message"].as_str().unwrap_or_default().contains("fb"),
        "{c}"
    );
    assert_eq!(condition(&blocked, "Ready")["status"], "False");
    assert!(statefulsets_of(&ns, "early").await?.is_empty());
    let services: Api<Service> = ns.api();
    assert!(services.get_opt("early-service").await?.is_none());
    assert!(services.get_opt("early-g0-hl").await?.is_none());
    assert!(
        ns.api::<ConfigMap>()
            .get_opt("early-g0-config")
            .await?
            .is_none()
    );

    // The instance comes up; the moment it passes the gate is when it has
    // an id and a metadata endpoint (never its phase or Ready: under
    // engine TLS those wait for the engines).
    create_instance(&ns).await?;
    let instances = instances(&ns);
    let ready_at = wait_for("the instance to pass the engine's gate", DEADLINE, || {
        let instances = instances.clone();
        async move {
            let i = instances.get("fb").await?;
            let passes = i.data["spec"]["id"].as_str().is_some_and(|s| !s.is_empty())
                && i.data["status"]["metadataEndpoint"]
                    .as_str()
                    .is_some_and(|s| !s.is_empty());
            Ok(passes.then(Instant::now))
        }
    })
    .await?;
    let sets: Api<StatefulSet> = ns.api();
    wait_for("early-g0 to be created", DEADLINE, || {
        let sets = sets.clone();
        async move { Ok(sets.get_opt("early-g0").await?.map(|_| ())) }
    })
    .await?;
    let took = ready_at.elapsed();
    eprintln!("early-g0 created {took:?} after the instance passed the gate");
    // Measured from when this test saw the instance pass (it polls, so
    // later than the change itself) to when it saw the StatefulSet: an
    // upper bound of the reaction time plus up to two poll intervals.
    assert!(
        took < BLOCKED_RETRY / 2,
        "the engine proceeded {took:?} after its instance became ready: the instance's \
         status change should re-trigger it, not the {BLOCKED_RETRY:?} retry"
    );
    assert_eq!(wait_stable(&ns, "early", 0, 1).await?, 0);
    assert_eq!(
        condition(&api.get("early").await?, "InstanceReady")["status"],
        "True"
    );
    Ok(())
}

/// The FireboltEngineClass and FireboltEngine objects of upstream's samples
/// (`examples/engine-*.yaml`, `examples/firebolt-engine-class.yaml`,
/// `examples/instance-with-engines.yaml`,
/// `examples/quickstart-website/quickstart.yaml`), comments and the
/// `firebolt` namespace removed: the CRDs must take them unchanged.
const UPSTREAM_SAMPLES: &str = r#"
---
# examples/engine-basic.yaml
apiVersion: compute.firebolt.io/v1alpha1
kind: FireboltEngine
metadata: {name: engine}
spec:
  instanceRef: firebolt
  replicas: 1
  customEngineConfig:
    storage:
      managed_table_storage: s3
      managed_table_bucket_name: my-engine-bucket
      aws: {endpoint: 'http://floci:4566', path_style_addressing: true}
  template:
    spec:
      containers:
      - name: engine
        env:
        - {name: AWS_ACCESS_KEY_ID, value: firebolt}
        - {name: AWS_SECRET_ACCESS_KEY, value: firebolt}
        resources:
          requests: {cpu: '1', memory: 4Gi}
          limits: {memory: 4Gi}
---
# examples/engine-custom-config.yaml
apiVersion: compute.firebolt.io/v1alpha1
kind: FireboltEngine
metadata: {name: engine}
spec:
  instanceRef: firebolt
  replicas: 1
  template:
    spec:
      containers:
      - name: engine
        resources:
          requests: {cpu: '1', memory: 4Gi}
          limits: {memory: 4Gi}
  customEngineConfig:
    logging: {level: debug, format: text}
---
# examples/engine-full.yaml
apiVersion: compute.firebolt.io/v1alpha1
kind: FireboltEngine
metadata: {name: engine}
spec:
  instanceRef: firebolt
  replicas: 2
  storage:
    persistentVolumeClaim:
      size: 50Gi
      accessModes: [ReadWriteOnce]
  rollout: graceful
  drainCheckEnabled: true
  drainCheckInterval: 10s
  template:
    metadata:
      annotations: {prometheus.io/scrape: 'true', prometheus.io/port: '9090', karpenter.sh/do-not-disrupt: 'true'}
    spec:
      serviceAccountName: firebolt-engine
      containers:
      - name: engine
        resources:
          requests: {cpu: '2', memory: 4Gi}
          limits: {memory: 4Gi}
      nodeSelector: {firebolt.dev/pool: engine, topology.kubernetes.io/zone: us-east-1a}
      tolerations:
      - {key: firebolt.dev/pool, operator: Equal, value: engine, effect: NoSchedule}
      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms:
            - matchExpressions:
              - key: firebolt.dev/pool
                operator: In
                values: [engine]
        podAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
          - weight: 100
            podAffinityTerm:
              topologyKey: topology.kubernetes.io/zone
              labelSelector:
                matchLabels: {firebolt.io/engine: engine}
        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
          - topologyKey: kubernetes.io/hostname
            labelSelector:
              matchLabels: {firebolt.io/engine: engine}
---
# examples/engine-image-override.yaml
apiVersion: compute.firebolt.io/v1alpha1
kind: FireboltEngine
metadata: {name: engine}
spec:
  instanceRef: firebolt
  replicas: 1
  customEngineConfig:
    storage:
      managed_table_storage: s3
      managed_table_bucket_name: my-engine-bucket
      aws: {endpoint: 'http://floci:4566', path_style_addressing: true}
  template:
    spec:
      containers:
      - name: engine
        image: ghcr.io/firebolt-db/firebolt:dev-feature-x
        imagePullPolicy: Always
        env:
        - {name: AWS_ACCESS_KEY_ID, value: firebolt}
        - {name: AWS_SECRET_ACCESS_KEY, value: firebolt}
        resources:
          requests: {cpu: '1', memory: 4Gi}
          limits: {memory: 4Gi}
---
# examples/firebolt-engine-class.yaml
apiVersion: compute.firebolt.io/v1alpha1
kind: FireboltEngineClass
metadata: {name: compute-optimized}
spec:
  template:
    metadata:
      annotations: {iam.amazonaws.com/role: 'arn:aws:iam::123456789012:role/firebolt-engine', prometheus.io/scrape: 'true'}
      labels: {team: data}
    spec:
      serviceAccountName: firebolt-engine
      nodeSelector: {firebolt.dev/pool: engine-compute}
      tolerations:
      - {key: firebolt.dev/pool, operator: Equal, value: engine-compute, effect: NoSchedule}
      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms:
            - matchExpressions:
              - key: firebolt.dev/pool
                operator: In
                values: [engine-compute]
      containers:
      - {name: engine, image: 'ghcr.io/firebolt-db/engine:latest', imagePullPolicy: IfNotPresent}
      - {name: log-shipper, image: 'fluent/fluent-bit:latest'}
      initContainers:
      - name: cache-warmer
        image: busybox:1.36
        command: [sh, -c, echo warming cache]
  uiSidecar: true
  storage:
    persistentVolumeClaim:
      size: 100Gi
      accessModes: [ReadWriteOnce]
  customEngineConfig:
    logging: {level: info}
  rollout: graceful
  drainCheckEnabled: true
  drainCheckInterval: 5s
  autoStop: {enabled: true, activeReplicas: 5, idleReplicas: 0, idleTimeout: 30m}
---
# examples/firebolt-engine-class.yaml
apiVersion: compute.firebolt.io/v1alpha1
kind: FireboltEngine
metadata: {name: analytics}
spec:
  instanceRef: firebolt
  engineClassRef: compute-optimized
  replicas: 3
  template:
    spec:
      containers:
      - name: engine
        resources:
          requests: {cpu: '4', memory: 16Gi}
          limits: {memory: 16Gi}
---
# examples/instance-with-engines.yaml
apiVersion: compute.firebolt.io/v1alpha1
kind: FireboltEngineClass
metadata: {name: shared-compute}
spec:
  template:
    spec:
      serviceAccountName: firebolt-engine
      containers:
      - {name: engine, image: 'ghcr.io/firebolt-db/engine:latest'}
---
# examples/instance-with-engines.yaml
apiVersion: compute.firebolt.io/v1alpha1
kind: FireboltEngine
metadata: {name: analytics}
spec:
  instanceRef: firebolt
  engineClassRef: shared-compute
  replicas: 2
  template:
    spec:
      containers:
      - name: engine
        resources:
          requests: {cpu: '2', memory: 3Gi}
          limits: {cpu: '2', memory: 3Gi}
---
# examples/instance-with-engines.yaml
apiVersion: compute.firebolt.io/v1alpha1
kind: FireboltEngine
metadata: {name: ingest}
spec:
  instanceRef: firebolt
  engineClassRef: shared-compute
  replicas: 1
  template:
    spec:
      containers:
      - name: engine
        resources:
          requests: {cpu: '1', memory: 4Gi}
          limits: {memory: 4Gi}
---
# examples/quickstart-website/quickstart.yaml
apiVersion: compute.firebolt.io/v1alpha1
kind: FireboltEngine
metadata: {name: my-engine}
spec:
  instanceRef: quickstart
  replicas: 1
  customEngineConfig:
    storage:
      managed_table_storage: s3
      managed_table_bucket_name: my-engine-bucket
      aws: {endpoint: 'http://floci.firebolt.svc.cluster.local:4566', path_style_addressing: true}
  template:
    spec:
      containers:
      - name: engine
        env:
        - {name: AWS_ACCESS_KEY_ID, value: firebolt}
        - {name: AWS_SECRET_ACCESS_KEY, value: firebolt}
        resources:
          requests: {cpu: '2', memory: 3Gi}
          limits: {memory: 3Gi}
"#;

/// Upstream's `config/samples/firebolt-engine-test.yaml` (its FireboltEngine,
/// comments and namespace removed): no `spec.instanceRef` (required) and a
/// `spec.resources` field upstream's schema no longer has.
const REJECTED_SAMPLE: &str = r#"
apiVersion: compute.firebolt.io/v1alpha1
kind: FireboltEngine
metadata:
  name: engine-test
spec:
  replicas: 1
  resources:
    requests:
      cpu: "1"
      memory: "2Gi"
    limits:
      cpu: "1"
      memory: "2Gi"
"#;

/// Creates `body` in the test namespace as `kubectl create` does: a POST
/// with strict field validation (unknown or duplicate fields are errors,
/// not silently pruned). `dry_run` stores nothing.
async fn create_strict(
    ns: &TestNamespace,
    plural: &str,
    body: &Value,
    dry_run: bool,
) -> Result<kube::Result<Value>> {
    let url = format!("/apis/{GROUP}/{VERSION}/namespaces/{}/{plural}", ns.name);
    let pp = PostParams {
        dry_run,
        ..PostParams::default()
    };
    let mut request = kube::core::Request::new(url).create(&pp, serde_json::to_vec(body)?)?;
    let separator = if request.uri().query().is_some() {
        '&'
    } else {
        '?'
    };
    let uri = format!("{}{separator}fieldValidation=Strict", request.uri());
    *request.uri_mut() = uri.parse()?;
    Ok(ns.client.request::<Value>(request).await)
}

/// True when every field of `want` is in `have` with the same value
/// (`have` may hold more, such as defaults).
fn contains(have: &Value, want: &Value) -> bool {
    match (have, want) {
        (Value::Object(h), Value::Object(w)) => w
            .iter()
            .all(|(k, v)| h.get(k).is_some_and(|hv| contains(hv, v))),
        (Value::Array(h), Value::Array(w)) => {
            h.len() == w.len() && h.iter().zip(w).all(|(a, b)| contains(a, b))
        }
        (h, w) => h == w,
    }
}

#[tokio::test]
async fn crds_accept_upstream_samples_and_reject_the_stale_test_sample() -> Result<()> {
    let ns = TestNamespace::new("engine-crd").await?;
    apply_project_crds(&ns.client).await?;

    // Every sample is accepted under strict validation, stored as sent.
    // Dry runs: several samples share a name.
    let mut accepted = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(UPSTREAM_SAMPLES) {
        let sample = <Value as serde::Deserialize>::deserialize(doc)?;
        let kind = sample["kind"].as_str().unwrap_or_default().to_owned();
        let name = sample["metadata"]["name"].as_str().unwrap_or_default();
        let plural = match kind.as_str() {
            "FireboltEngine" => "fireboltengines",
            "FireboltEngineClass" => "fireboltengineclasses",
            other => bail!("unexpected kind {other} in the samples"),
        };
        let created = create_strict(&ns, plural, &sample, true)
            .await?
            .with_context(|| format!("upstream sample {kind} {name} refused"))?;
        assert!(
            contains(&created["spec"], &sample["spec"]),
            "{kind} {name}: stored {} for {}",
            created["spec"],
            sample["spec"]
        );
        accepted.push(format!("{kind}/{name}"));
    }
    assert_eq!(accepted.len(), 10, "{accepted:?}");
    assert_eq!(
        accepted
            .iter()
            .filter(|a| a.starts_with("FireboltEngineClass/"))
            .count(),
        2
    );

    // The stale sample is refused, as upstream's schema refuses it: with
    // strict validation (kubectl's default) and also without it.
    let stale: Value = serde_yaml::from_str(REJECTED_SAMPLE)?;
    match create_strict(&ns, "fireboltengines", &stale, false).await? {
        Err(kube::Error::Api(s)) => {
            // Strict decoding fails before the schema is checked.
            assert_eq!(s.code, 400, "{s:?}");
            assert!(
                s.message.contains(r#"unknown field "spec.resources""#),
                "{}",
                s.message
            );
        }
        other => bail!("the stale sample was not refused: {other:?}"),
    }
    let obj: DynamicObject = serde_json::from_value(stale)?;
    match engines(&ns).create(&PostParams::default(), &obj).await {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 422, "{s:?}");
            assert!(s.message.contains("spec.instanceRef"), "{}", s.message);
            assert!(s.message.contains("Required value"), "{}", s.message);
        }
        other => bail!("the stale sample was not refused without strict validation: {other:?}"),
    }
    assert!(
        engines(&ns).get_opt("engine-test").await?.is_none(),
        "nothing stored"
    );

    // The operator-owned template paths the CRD headers name are refused,
    // on engines and classes alike.
    for (template, says) in [
        (
            json!({"spec": {"terminationGracePeriodSeconds": 5}}),
            "terminationGracePeriodSeconds (60 s), hostname and subdomain are set by the operator",
        ),
        (
            json!({"spec": {"hostname": "h"}}),
            "terminationGracePeriodSeconds (60 s), hostname and subdomain are set by the operator",
        ),
        (
            json!({"metadata": {"labels": {"firebolt.io/generation": "3"}}}),
            "labels and annotations under firebolt.io/ are set by the operator",
        ),
        (
            json!({"metadata": {"annotations": {"firebolt.io/spec-hash": "x"}}}),
            "labels and annotations under firebolt.io/ are set by the operator",
        ),
    ] {
        let mut engine = object("FireboltEngine", "owned-paths", engine_spec(1, None))?;
        engine.data["spec"]["template"] = template.clone();
        let class = object(
            "FireboltEngineClass",
            "owned-paths",
            json!({"template": template}),
        )?;
        let dry = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        for (kind, result) in [
            (
                "engine",
                engines(&ns).create(&dry, &engine).await.map(|_| ()),
            ),
            ("class", classes(&ns).create(&dry, &class).await.map(|_| ())),
        ] {
            match result {
                Err(kube::Error::Api(s)) => {
                    assert_eq!(s.code, 422, "{kind} {template}: {s:?}");
                    assert!(s.message.contains(says), "{kind} {template}: {}", s.message);
                }
                other => bail!("{kind} with template {template} was not refused: {other:?}"),
            }
        }
    }
    Ok(())
}

// ---- failure paths of the blue-green machine ----

/// Waits until `engine`'s status satisfies `check` (given the object),
/// returning it.
async fn wait_engine(
    ns: &TestNamespace,
    engine: &str,
    what: &str,
    check: impl Fn(&DynamicObject) -> bool,
) -> Result<DynamicObject> {
    let api = engines(ns);
    let check = &check;
    wait_for(&format!("{engine}: {what}"), DEADLINE, || {
        let api = api.clone();
        async move {
            let e = api.get(engine).await?;
            if check(&e) {
                Ok(Some(e))
            } else {
                bail!("status: {}", e.data["status"])
            }
        }
    })
    .await
}

/// A class deleted while an engine references it, with no admission
/// webhook: the deletion-guard finalizer holds it (Ready=False,
/// DeletionBlocked, naming the engine) and the engine goes on rolling and
/// scaling, through 0 replicas and back; the class goes once the engine
/// does.
#[tokio::test]
async fn a_class_in_use_outlives_its_delete_and_the_engine_stops_and_resumes() -> Result<()> {
    let ns = TestNamespace::new("engine-guard").await?;
    let _op = start(&ns).await?;
    create_instance(&ns).await?;
    let classes = classes(&ns);
    classes
        .create(
            &PostParams::default(),
            &object("FireboltEngineClass", "small", class_spec("engine:v1"))?,
        )
        .await?;
    let api = engines(&ns);
    api.create(
        &PostParams::default(),
        &object("FireboltEngine", "e", engine_spec(2, Some("small")))?,
    )
    .await?;
    assert_eq!(wait_stable(&ns, "e", 0, 2).await?, 0);
    wait_for("the class's deletion guard", DEADLINE, || {
        let classes = classes.clone();
        async move {
            let c = classes.get("small").await?;
            let finalizers = c.metadata.finalizers.clone().unwrap_or_default();
            if finalizers
                .iter()
                .any(|f| f == "compute.firebolt.io/fireboltengineclass-deletion-guard")
            {
                Ok(Some(()))
            } else {
                bail!("finalizers {finalizers:?}")
            }
        }
    })
    .await?;

    classes.delete("small", &Default::default()).await?;
    wait_for("the class to report DeletionBlocked", DEADLINE, || {
        let classes = classes.clone();
        async move {
            let c = classes.get("small").await?;
            let ready = condition(&c, "Ready");
            if c.metadata.deletion_timestamp.is_some()
                && ready["status"] == "False"
                && ready["reason"] == "DeletionBlocked"
                && ready["message"]
                    .as_str()
                    .is_some_and(|m| m.ends_with("1 do: e"))
            {
                Ok(Some(()))
            } else {
                bail!(
                    "class: {:?} {}",
                    c.metadata.deletion_timestamp,
                    c.data["status"]
                )
            }
        }
    })
    .await?;
    let (_, note) = wasmop_tests::status::wait_event(
        &ns.client,
        &ns.name,
        "small",
        Some("Warning"),
        "DeletionBlocked",
        DEADLINE,
    )
    .await?;
    assert!(note.contains(": e"), "{note}");

    // The engine does not freeze: it stops (2 -> 0) and resumes (0 -> 2),
    // each through a new generation, with its class still there.
    patch_merge(&api, "e", json!({"spec": {"replicas": 0}})).await?;
    let stopped = wait_engine(&ns, "e", "stopped on generation 1", |e| {
        let s = &e.data["status"];
        s["phase"] == "stopped"
            && s["activeGeneration"] == 1
            && s["drainingGeneration"].is_null()
            && condition(e, "Ready")["reason"] == "Stopped"
            && s["observedGeneration"] == e.metadata.generation.unwrap_or(0)
    })
    .await?;
    assert_eq!(condition(&stopped, "Ready")["status"], "False");
    assert_eq!(statefulsets_of(&ns, "e").await?, ["e-g1"]);
    assert_eq!(
        ns.api::<StatefulSet>()
            .get("e-g1")
            .await?
            .spec
            .and_then(|s| s.replicas),
        Some(0)
    );
    assert_eq!(selected_generation(&ns, "e").await?, Some(1));
    patch_merge(&api, "e", json!({"spec": {"replicas": 2}})).await?;
    assert_eq!(wait_stable(&ns, "e", 2, 2).await?, 2);
    let sts = ns.api::<StatefulSet>().get("e-g2").await?;
    assert_eq!(engine_image(&sts).as_deref(), Some("engine:v1"));
    assert!(classes.get_opt("small").await?.is_some(), "still guarded");

    // Once no engine references it, the class goes.
    api.delete("e", &Default::default()).await?;
    wait_for("the class to go", DEADLINE, || {
        let classes = classes.clone();
        async move {
            match classes.get_opt("small").await? {
                None => Ok(Some(())),
                Some(c) => bail!("class still there: {}", c.data["status"]),
            }
        }
    })
    .await?;
    Ok(())
}

/// Pods of a new generation that stay Pending (no node matches their
/// nodeSelector, so the scheduler leaves them unscheduled): the Service
/// keeps the serving generation, Ready=False names the scheduler's
/// reason, a Warning Event carries it, the progress deadline marks the
/// engine Degraded, and fixing the spec abandons the stuck generation.
#[tokio::test]
async fn a_stuck_generation_says_why_and_fixing_the_spec_rolls_the_next() -> Result<()> {
    let ns = TestNamespace::new("engine-stuck").await?;
    let _op = start(&ns).await?;
    create_instance(&ns).await?;
    let api = engines(&ns);
    let mut spec = engine_spec(2, None);
    spec["progressDeadlineSeconds"] = json!(5);
    api.create(
        &PostParams::default(),
        &object("FireboltEngine", "e", spec)?,
    )
    .await?;
    assert_eq!(wait_stable(&ns, "e", 0, 2).await?, 0);

    patch_merge(
        &api,
        "e",
        json!({"spec": {"template": {"spec": {"nodeSelector": {"wasmop.dev/no-such-node": "true"}}}}}),
    )
    .await?;
    let stuck = wait_engine(&ns, "e", "Degraded on generation 1", |e| {
        let s = &e.data["status"];
        s["phase"] == "creating"
            && s["currentGeneration"] == 1
            && condition(e, "Ready")["reason"] == "Unschedulable"
            && condition(e, "Degraded")["status"] == "True"
    })
    .await?;
    let ready = condition(&stuck, "Ready");
    let message = ready["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("generation 1 has 0 of 2 pod(s) ready; pod e-g1-0: Unschedulable:"),
        "{message}"
    );
    let degraded = condition(&stuck, "Degraded");
    assert_eq!(degraded["reason"], "ProgressDeadlineExceeded");
    assert!(
        degraded["message"]
            .as_str()
            .is_some_and(|m| m.contains("Unschedulable")),
        "{degraded}"
    );
    assert_eq!(selected_generation(&ns, "e").await?, Some(0));
    assert_eq!(
        sts_ready(&ns, "e", 0).await?,
        Some(2),
        "generation 0 serves on"
    );
    assert_ne!(
        stuck.data["status"]["observedGeneration"],
        json!(stuck.metadata.generation),
        "the stuck spec is not reported as observed"
    );
    let (_, note) = wasmop_tests::status::wait_event(
        &ns.client,
        &ns.name,
        "e",
        Some("Warning"),
        "Unschedulable",
        DEADLINE,
    )
    .await?;
    assert!(note.contains("pod e-g1-"), "{note}");
    wasmop_tests::status::wait_event(
        &ns.client,
        &ns.name,
        "e",
        Some("Warning"),
        "ProgressDeadlineExceeded",
        DEADLINE,
    )
    .await?;

    // Fixing the spec abandons generation 1 and rolls generation 2.
    patch_merge(
        &api,
        "e",
        json!({"spec": {"template": {"spec": {"nodeSelector": null}}}}),
    )
    .await?;
    assert_eq!(wait_stable(&ns, "e", 2, 2).await?, 2);
    let e = api.get("e").await?;
    assert_eq!(condition(&e, "Degraded")["status"], "False");
    assert_eq!(
        e.data["status"]["observedGeneration"],
        json!(e.metadata.generation)
    );
    wasmop_tests::status::wait_event(
        &ns.client,
        &ns.name,
        "e",
        None,
        "GenerationAbandoned",
        DEADLINE,
    )
    .await?;
    Ok(())
}

/// A spec change while the engine switches, drains or cleans is rolled
/// out before the engine says Ready or observed on that spec; a hand scale
/// and a hand edit of the live StatefulSet's Pod template each roll a new
/// generation.
#[tokio::test]
async fn a_spec_change_mid_rollout_and_hand_edits_end_on_the_spec() -> Result<()> {
    let ns = TestNamespace::new("engine-drift").await?;
    let _op = start(&ns).await?;
    create_instance(&ns).await?;
    let api = engines(&ns);
    api.create(
        &PostParams::default(),
        &object("FireboltEngine", "e", engine_spec(2, None))?,
    )
    .await?;
    assert_eq!(wait_stable(&ns, "e", 0, 2).await?, 0);

    // Every status the engine goes through from here, as a watch sees it.
    let statuses = Arc::new(std::sync::Mutex::new(Vec::<DynamicObject>::new()));
    let recorder = {
        let statuses = statuses.clone();
        let api = api.clone();
        tokio::spawn(async move {
            use futures::StreamExt as _;
            let mut stream = std::pin::pin!(kube::runtime::watcher::watch_object(api, "e"));
            while let Some(Ok(Some(e))) = stream.next().await {
                statuses.lock().expect("statuses").push(e);
            }
        })
    };
    patch_merge(&api, "e", json!({"spec": {"replicas": 3}})).await?;
    // Past creating: the rollout to 3 replicas has switched.
    let mid = wait_engine(&ns, "e", "past creating generation 1", |e| {
        let s = &e.data["status"];
        s["currentGeneration"] == 1
            && ["switching", "draining", "cleaning"].contains(&s["phase"].as_str().unwrap_or(""))
    })
    .await?;
    let changed = patch_merge(&api, "e", json!({"spec": {"replicas": 4}})).await?;
    let new_gen = changed.metadata.generation.context("generation")?;
    let phase_at_change = mid.data["status"]["phase"].clone();
    let g = wait_stable(&ns, "e", 2, 4).await?;
    recorder.abort();
    let seen = statuses.lock().expect("statuses").clone();
    for e in seen
        .iter()
        .filter(|e| e.metadata.generation == Some(new_gen))
    {
        let s = &e.data["status"];
        let active = s["activeGeneration"].as_i64().unwrap_or(-1);
        let claims = s["observedGeneration"] == new_gen
            || (s["phase"] == "stable" && condition(e, "Ready")["status"] == "True");
        assert!(
            !claims || active >= 2,
            "generation {active} (3 replicas) reported for the 4-replica spec \
             (changed in {phase_at_change}): {s}"
        );
    }
    let e = api.get("e").await?;
    assert_eq!(e.data["status"]["observedGeneration"], json!(new_gen));

    // kubectl scale sts e-g<N> --replicas=1: a new generation of 4.
    let sets: Api<StatefulSet> = ns.api();
    sets.patch(
        &format!("e-g{g}"),
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 1}})),
    )
    .await?;
    let (_, note) = wasmop_tests::status::wait_event(
        &ns.client,
        &ns.name,
        "e",
        Some("Warning"),
        "StatefulSetDrifted",
        DEADLINE,
    )
    .await?;
    assert!(note.contains("scaled to 1 replica(s)"), "{note}");
    let g2 = wait_stable(&ns, "e", g + 1, 4).await?;

    // A patch of the live Pod template: a new generation without it.
    sets.patch(
        &format!("e-g{g2}"),
        &PatchParams::default(),
        &Patch::Merge(
            json!({"spec": {"template": {"metadata": {"annotations": {"debug": "on"}}}}}),
        ),
    )
    .await?;
    let g3 = wait_stable(&ns, "e", g2 + 1, 4).await?;
    let sts = sets.get(&format!("e-g{g3}")).await?;
    let annotations = sts
        .spec
        .and_then(|s| s.template.metadata)
        .and_then(|m| m.annotations)
        .unwrap_or_default();
    assert!(!annotations.contains_key("debug"), "{annotations:?}");
    let notes = wasmop_tests::status::events(&ns.client, &ns.name, "e").await?;
    assert!(
        notes.iter().any(
            |(_, r, n)| r == "StatefulSetDrifted" && n.contains("changed outside the operator")
        ),
        "{notes:?}"
    );
    Ok(())
}
