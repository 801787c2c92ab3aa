//! Reconcile tests: the plugin driven natively against a small simulated
//! namespace (plans applied, StatefulSets grown into Ready pods).

use std::collections::BTreeMap;

use serde_json::{Value, json};
use wasmop_sdk::testing::{SnapshotBuilder, run};
use wasmop_sdk::{Observation, Plan, RequestTarget, Snapshot};

use crate::engine::phase;
use crate::{CLASS_CONTROLLER, ENGINE_CONTROLLER, EnginePlugin};

const NS: &str = "fb";

fn instance(ready: bool) -> Value {
    json!({
        "apiVersion": "compute.firebolt.io/v1alpha1", "kind": "FireboltInstance",
        "metadata": {"name": "firebolt", "namespace": NS},
        "spec": {"id": "01JGFJJZ00KV6Z8Q2XN5R1M3TB", "metadata": {}, "gateway": {}},
        "status": if ready {
            json!({"phase": "Ready", "metadataEndpoint": "firebolt-metadata.fb.svc.cluster.local:7000"})
        } else {
            json!({"phase": "Provisioning"})
        },
    })
}

fn engine(spec: Value) -> Value {
    json!({
        "apiVersion": "compute.firebolt.io/v1alpha1", "kind": "FireboltEngine",
        "metadata": {"name": "e", "namespace": NS, "uid": "engine-uid", "generation": 1},
        "spec": spec,
    })
}

/// A namespace: the engine, its owned objects, pods, instance and class.
struct World {
    engine: Value,
    owned: BTreeMap<(String, String), Value>,
    pods: BTreeMap<String, Value>,
    instance: Option<Value>,
    class: Option<Value>,
    observations: Vec<Observation>,
    rv: u64,
    /// Generations the Service selected at any time, with their ready pods.
    selected_ready: Vec<(i64, usize)>,
    /// StatefulSet statuses stay as they are (the controller lags).
    sts_lag: bool,
    /// Plays cert-manager: fills empty TLS Secrets with this CA (PEM).
    issuer: Option<&'static str>,
    /// The snapshot time (RFC 3339).
    now: String,
    /// Pods that stay Pending (by name), with this status.
    stuck: BTreeMap<String, Value>,
    /// Plans of the passes so far.
    plans: Vec<Plan>,
}

impl World {
    fn new(engine: Value) -> Self {
        World {
            engine,
            owned: BTreeMap::new(),
            pods: BTreeMap::new(),
            instance: Some(instance(true)),
            class: None,
            observations: Vec::new(),
            rv: 0,
            selected_ready: Vec::new(),
            sts_lag: false,
            issuer: None,
            now: wasmop_sdk::testing::DEFAULT_NOW.to_owned(),
            stuck: BTreeMap::new(),
            plans: Vec::new(),
        }
    }

    /// Moves the clock `secs` seconds on.
    fn advance(&mut self, secs: i64) {
        let t: wasmop_sdk::k8s_openapi::jiff::Timestamp = self.now.parse().unwrap();
        self.now = (t + wasmop_sdk::k8s_openapi::jiff::SignedDuration::from_secs(secs)).to_string();
    }

    fn snapshot(&self) -> Snapshot {
        let mut b = SnapshotBuilder::new(ENGINE_CONTROLLER)
            .primary(&self.engine)
            .now(&self.now);
        for o in self.owned.values() {
            b = b.owned(o);
        }
        for p in self.pods.values() {
            b = b.related(crate::POD_READ, p);
        }
        if let Some(i) = &self.instance {
            b = b.related(crate::INSTANCE_READ, i);
        }
        if let Some(c) = &self.class {
            b = b.related(crate::CLASS_READ, c);
        }
        for o in &self.observations {
            b = b.observation(o.clone());
        }
        b.build()
    }

    fn reconcile(&mut self) -> Plan {
        let plan = run::<EnginePlugin>(&self.snapshot()).unwrap();
        // Deleting must use what was seen.
        for d in &plan.delete {
            let key = (d.target.kind.clone(), d.target.name.clone());
            let seen = self.owned.remove(&key).expect("deletes only what exists");
            assert_eq!(seen["metadata"]["uid"], d.uid);
            assert_eq!(seen["metadata"]["resourceVersion"], d.resource_version);
        }
        for op in &plan.apply {
            self.rv += 1;
            let o = &op.object;
            let key = (
                o["kind"].as_str().unwrap().to_owned(),
                o["metadata"]["name"].as_str().unwrap().to_owned(),
            );
            let before = self.owned.get(&key).cloned();
            let mut merged = before.clone().unwrap_or(json!({}));
            crate::merge::deep_merge(&mut merged, o);
            // The API server: the spec generation moves when the spec
            // does; the creation time is set once.
            let generation = before
                .as_ref()
                .and_then(|b| b["metadata"]["generation"].as_i64())
                .unwrap_or(0);
            let changed = before.as_ref().is_none_or(|b| b["spec"] != merged["spec"]);
            merged["metadata"]["generation"] = json!(generation + i64::from(changed));
            if before.is_none() {
                merged["metadata"]["creationTimestamp"] = json!(self.now);
            }
            merged["metadata"]["uid"] = json!(format!("uid-{}", key.1));
            merged["metadata"]["resourceVersion"] = json!(self.rv.to_string());
            self.owned.insert(key, merged);
        }
        if let Some(s) = &plan.status {
            self.engine["status"] = s.clone();
        }
        if let Some(ca) = self.issuer {
            use base64::Engine as _;
            let b64 = |t: &str| base64::engine::general_purpose::STANDARD.encode(t);
            for ((kind, _), o) in &mut self.owned {
                if kind == "Secret" && o["data"]["tls.crt"] == "" {
                    o["data"] =
                        json!({"tls.crt": b64(ca), "tls.key": b64("key"), "ca.crt": b64(ca)});
                }
            }
        }
        // Pods follow StatefulSets (ready at once), vanish with them; the
        // StatefulSet counts them unless `sts_lag` holds its status back.
        self.pods.clear();
        for ((kind, name), sts) in &mut self.owned {
            if kind != "StatefulSet" {
                continue;
            }
            let replicas = sts["spec"]["replicas"].as_i64().unwrap();
            let stuck = (0..replicas)
                .filter(|i| self.stuck.contains_key(&format!("{name}-{i}")))
                .count();
            if !self.sts_lag {
                let ready = replicas - i64::try_from(stuck).unwrap();
                sts["status"] = json!({"replicas": replicas, "readyReplicas": ready});
            }
            for i in 0..replicas {
                let pod = format!("{name}-{i}");
                if let Some(status) = self.stuck.get(&pod) {
                    self.pods.insert(
                        pod.clone(),
                        json!({
                            "apiVersion": "v1", "kind": "Pod",
                            "metadata": {"name": pod, "namespace": NS,
                                         "labels": sts["spec"]["template"]["metadata"]["labels"]},
                            "status": status,
                        }),
                    );
                    continue;
                }
                self.pods.insert(
                    pod.clone(),
                    json!({
                        "apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": pod, "namespace": NS,
                                     "labels": sts["spec"]["template"]["metadata"]["labels"]},
                        "status": {"phase": "Running", "podIP": "10.0.0.1",
                                   "conditions": [{"type": "Ready", "status": "True"}]},
                    }),
                );
            }
        }
        if let Some(g) = self.selected() {
            let label = g.to_string();
            let ready = self
                .pods
                .values()
                .filter(|p| p["metadata"]["labels"]["firebolt.io/generation"] == label.as_str())
                .count();
            self.selected_ready.push((g, ready));
        }
        self.plans.push(plan.clone());
        plan
    }

    fn selected(&self) -> Option<i64> {
        self.owned
            .get(&("Service".to_owned(), "e-service".to_owned()))
            .and_then(|s| s["spec"]["selector"]["firebolt.io/generation"].as_str())
            .and_then(|g| g.parse().ok())
    }

    fn phase(&self) -> &str {
        self.engine["status"]["phase"].as_str().unwrap_or_default()
    }

    /// Reconciles until the plan is empty (at most `max` passes).
    fn settle(&mut self, max: usize) -> usize {
        for pass in 0..max {
            if self.reconcile().is_empty() {
                return pass;
            }
        }
        panic!(
            "no steady state after {max} passes; status {}",
            self.engine["status"]
        );
    }

    fn names(&self, kind: &str) -> Vec<String> {
        self.owned
            .keys()
            .filter(|(k, _)| k == kind)
            .map(|(_, n)| n.clone())
            .collect()
    }
}

fn base_spec() -> Value {
    json!({"instanceRef": "firebolt", "replicas": 2, "drainCheckEnabled": false})
}

#[test]
fn a_new_engine_writes_its_intent_before_creating_anything() {
    let mut w = World::new(engine(base_spec()));
    let plan = w.reconcile();
    assert!(plan.apply.is_empty(), "{plan:?}");
    let s = plan.status.unwrap();
    assert_eq!(s["phase"], "creating");
    assert_eq!(s["currentGeneration"], 0);
    assert_eq!(s["activeGeneration"], -1);
    let plan = w.reconcile();
    let names: Vec<&str> = plan
        .apply
        .iter()
        .map(|a| a.object["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["e-g0-config", "e-g0-hl", "e-g0", "e-service"]);
}

#[test]
fn an_engine_comes_up_and_settles_on_an_empty_plan() {
    let mut w = World::new(engine(base_spec()));
    w.settle(20);
    assert_eq!(w.phase(), phase::STABLE);
    assert_eq!(w.selected(), Some(0));
    assert_eq!(w.engine["status"]["activeGeneration"], 0);
    let ready = crate::tests::condition(&w.engine, "Ready");
    assert_eq!(ready["status"], "True", "{ready}");
    assert_eq!(ready["reason"], "EngineReady");
    assert!(run::<EnginePlugin>(&w.snapshot()).unwrap().is_empty());
}

pub(crate) fn condition(obj: &Value, type_: &str) -> Value {
    obj["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_).cloned())
        .unwrap_or(Value::Null)
}

#[test]
fn scaling_rolls_a_new_generation_and_the_service_never_selects_unready_pods() {
    let mut w = World::new(engine(base_spec()));
    w.settle(20);
    w.engine["spec"]["replicas"] = json!(5);
    w.engine["metadata"]["generation"] = json!(2);
    w.settle(20);
    assert_eq!(w.phase(), phase::STABLE);
    assert_eq!(w.selected(), Some(1));
    assert_eq!(w.names("StatefulSet"), ["e-g1"]);
    assert_eq!(w.names("ConfigMap"), ["e-g1-config"]);
    assert_eq!(
        w.owned[&("StatefulSet".into(), "e-g1".into())]["spec"]["replicas"],
        5
    );
    for (g, ready) in &w.selected_ready {
        assert!(
            *ready > 0,
            "the Service selected generation {g} with no ready pod"
        );
    }
    assert!(w.engine["status"].get("drainingGeneration").is_none());
}

#[test]
fn the_service_waits_for_the_statefulset_to_count_the_ready_pods() {
    let mut w = World::new(engine(base_spec()));
    w.settle(20);
    w.engine["spec"]["replicas"] = json!(3);
    w.sts_lag = true;
    for _ in 0..6 {
        w.reconcile();
    }
    // Every pod of g1 is Ready, but its StatefulSet has not said so yet.
    assert_eq!(w.pods.keys().filter(|p| p.starts_with("e-g1-")).count(), 3);
    assert_eq!(w.phase(), phase::CREATING);
    assert_eq!(w.selected(), Some(0));
    let ready = condition(&w.engine, "Ready");
    assert_eq!(ready["reason"], "PodsNotReady");
    assert!(
        ready["message"]
            .as_str()
            .unwrap()
            .contains("StatefulSet reports 0"),
        "{ready}"
    );
    w.sts_lag = false;
    w.settle(20);
    assert_eq!(w.phase(), phase::STABLE);
    assert_eq!(w.selected(), Some(1));
}

#[test]
fn a_missing_instance_blocks_with_a_condition_and_creates_nothing() {
    let mut w = World::new(engine(base_spec()));
    w.instance = None;
    for _ in 0..3 {
        let plan = w.reconcile();
        assert!(plan.apply.is_empty() && plan.delete.is_empty());
    }
    let c = condition(&w.engine, "InstanceReady");
    assert_eq!(c["status"], "False");
    assert_eq!(c["reason"], "InstanceNotReady");
    assert!(c["message"].as_str().unwrap().contains("not found"));
    w.instance = Some(instance(false));
    w.reconcile();
    assert!(
        condition(&w.engine, "InstanceReady")["message"]
            .as_str()
            .unwrap()
            .contains("metadataEndpoint")
    );
    w.instance = Some(instance(true));
    w.settle(20);
    assert_eq!(w.phase(), phase::STABLE);
    assert_eq!(condition(&w.engine, "InstanceReady")["status"], "True");
}

#[test]
fn switching_draining_and_cleaning_proceed_without_the_instance() {
    let mut w = World::new(engine(base_spec()));
    w.settle(20);
    w.engine["spec"]["replicas"] = json!(3);
    // Run until switching, then lose the instance.
    for _ in 0..10 {
        w.reconcile();
        if w.phase() == phase::SWITCHING {
            break;
        }
    }
    assert_eq!(w.phase(), phase::SWITCHING);
    w.instance = None;
    for _ in 0..5 {
        w.reconcile();
    }
    assert_eq!(w.phase(), phase::STABLE);
    assert_eq!(w.names("StatefulSet"), ["e-g1"]);
}

#[test]
fn a_spec_change_while_creating_abandons_the_generation_and_the_sweep_deletes_it() {
    let mut w = World::new(engine(base_spec()));
    w.settle(20);
    w.engine["spec"]["replicas"] = json!(3);
    w.reconcile(); // intent g1
    w.reconcile(); // creates g1
    assert!(w.names("StatefulSet").contains(&"e-g1".to_owned()));
    w.engine["spec"]["replicas"] = json!(4);
    let plan = w.reconcile();
    assert_eq!(plan.status.unwrap()["currentGeneration"], 2);
    w.settle(20);
    assert_eq!(w.names("StatefulSet"), ["e-g2"]);
    assert_eq!(w.selected(), Some(2));
}

fn reading(id: &str, body: &str, status: u16, age_ms: u64) -> Observation {
    Observation {
        id: id.into(),
        status: Some(status),
        body: body.into(),
        error: None,
        observed_at: "2025-01-01T00:00:00Z".into(),
        age_ms,
        outcome: None,
    }
}

const IDLE: &str = "firebolt_running_queries 0\nfirebolt_suspended_queries 0";

/// An engine with the drain check on (3 s), run into draining generation 0.
fn draining_world() -> World {
    let mut spec = base_spec();
    spec["drainCheckEnabled"] = json!(true);
    spec["drainCheckInterval"] = json!("3s");
    let mut w = World::new(engine(spec));
    w.settle(20);
    w.engine["spec"]["replicas"] = json!(1);
    for _ in 0..10 {
        w.reconcile();
        if w.phase() == phase::DRAINING {
            break;
        }
    }
    assert_eq!(w.phase(), phase::DRAINING);
    w
}

#[test]
fn draining_polls_every_old_pod_each_pass_and_waits_for_zero_queries() {
    let mut w = draining_world();
    let plan = w.reconcile();
    // DEFAULT_NOW is 1735689600 s: window 578563200 of 3 s.
    let ids: Vec<&str> = plan.http_requests.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["drain-e-g0-0-578563200", "drain-e-g0-1-578563200"]);
    assert!(plan.http_requests.iter().all(|r| r.port == 9090
        && r.max_age_ms == 6000
        && matches!(&r.target, RequestTarget::Declared { id, .. } if id == "pods")));
    assert_eq!(plan.requeue_after_ms, Some(3000));
    w.observations = vec![
        reading("drain-e-g0-0-578563200", IDLE, 200, 10),
        reading("drain-e-g0-1-578563200", "", 503, 10),
    ];
    let plan = w.reconcile();
    assert_eq!(w.phase(), phase::DRAINING);
    assert_eq!(
        plan.http_requests.len(),
        2,
        "a pod read as drained is polled again"
    );
    assert_eq!(condition(&w.engine, "Ready")["reason"], "DrainCheckFailing");
    w.observations[1] = reading(
        "drain-e-g0-1-578563200",
        "firebolt_running_queries 2",
        200,
        10,
    );
    w.reconcile();
    assert_eq!(w.phase(), phase::DRAINING);
    w.observations[1] = reading("drain-e-g0-1-578563200", IDLE, 200, 10);
    w.settle(10);
    assert_eq!(w.names("StatefulSet"), ["e-g1"]);
}

#[test]
fn a_pod_idle_at_t0_and_busy_at_t1_holds_the_engine_in_draining() {
    let mut w = draining_world();
    // t0: pod 0 idle, pod 1 busy.
    w.observations = vec![
        reading("drain-e-g0-0-578563200", IDLE, 200, 10),
        reading(
            "drain-e-g0-1-578563200",
            "firebolt_running_queries 1",
            200,
            10,
        ),
    ];
    w.reconcile();
    assert_eq!(w.phase(), phase::DRAINING);
    // t1, the next window: pod 1 idle now, pod 0 took a query.
    w.advance(3);
    w.observations = vec![
        reading("drain-e-g0-0-578563200", IDLE, 200, 3010),
        reading(
            "drain-e-g0-0-578563201",
            "firebolt_suspended_queries 1",
            200,
            10,
        ),
        reading("drain-e-g0-1-578563201", IDLE, 200, 10),
    ];
    let plan = w.reconcile();
    assert_eq!(w.phase(), phase::DRAINING, "pod 0's idle reading is stale");
    let ids: Vec<&str> = plan.http_requests.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["drain-e-g0-0-578563201", "drain-e-g0-1-578563201"]);
    // A reading older than the interval does not count, even an idle one.
    w.observations = vec![
        reading("drain-e-g0-0-578563200", IDLE, 200, 3010),
        reading("drain-e-g0-1-578563201", IDLE, 200, 10),
    ];
    w.reconcile();
    assert_eq!(w.phase(), phase::DRAINING);
    w.observations = vec![
        reading("drain-e-g0-0-578563201", IDLE, 200, 10),
        reading("drain-e-g0-1-578563201", IDLE, 200, 10),
    ];
    w.reconcile();
    assert_eq!(w.phase(), phase::CLEANING);
}

#[test]
fn recreate_rollouts_skip_the_drain_check() {
    let mut spec = base_spec();
    spec["drainCheckEnabled"] = json!(true);
    spec["rollout"] = json!("recreate");
    let mut w = World::new(engine(spec));
    w.settle(20);
    w.engine["spec"]["replicas"] = json!(1);
    for _ in 0..12 {
        assert!(w.reconcile().http_requests.is_empty());
    }
    assert_eq!(w.phase(), phase::STABLE);
}

#[test]
fn a_class_edit_rolls_a_new_generation_and_a_missing_class_is_reported() {
    let mut spec = base_spec();
    spec["engineClassRef"] = json!("small");
    let mut w = World::new(engine(spec));
    for _ in 0..3 {
        let plan = w.reconcile();
        assert_eq!(plan.requeue_after_ms, Some(10_000));
    }
    assert_eq!(
        condition(&w.engine, "Ready")["reason"],
        "FireboltEngineClassUnready"
    );
    assert!(w.owned.is_empty());
    w.class = Some(
        json!({"apiVersion": "compute.firebolt.io/v1alpha1", "kind": "FireboltEngineClass",
        "metadata": {"name": "small", "namespace": NS},
        "spec": {"template": {"spec": {"containers": [{"name": "engine", "image": "engine:1"}]}}}}),
    );
    w.settle(20);
    assert_eq!(w.selected(), Some(0));
    let image = |w: &World, g: &str| {
        w.owned[&("StatefulSet".into(), g.into())]["spec"]["template"]["spec"]["containers"][0]["image"].clone()
    };
    assert_eq!(image(&w, "e-g0"), "engine:1");
    w.class.as_mut().unwrap()["spec"]["template"]["spec"]["containers"][0]["image"] =
        json!("engine:2");
    w.settle(20);
    assert_eq!(w.selected(), Some(1));
    assert_eq!(image(&w, "e-g1"), "engine:2");
}

#[test]
fn stopped_engines_rematerialise_a_missing_config_map() {
    let mut spec = base_spec();
    spec["replicas"] = json!(0);
    let mut w = World::new(engine(spec));
    w.settle(20);
    assert_eq!(w.phase(), phase::STOPPED);
    assert_eq!(condition(&w.engine, "Ready")["reason"], "Stopped");
    w.owned.remove(&("ConfigMap".into(), "e-g0-config".into()));
    let plan = w.reconcile();
    assert_eq!(plan.apply.len(), 1);
    assert_eq!(plan.apply[0].object["metadata"]["name"], "e-g0-config");
    assert_eq!(w.phase(), phase::STOPPED);
}

#[test]
fn the_sweep_is_bounded_and_spares_live_generations() {
    let mut w = World::new(engine(base_spec()));
    w.settle(20);
    for g in 10..40 {
        w.owned.insert(("ConfigMap".into(), format!("e-g{g}-config")), json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": format!("e-g{g}-config"), "namespace": NS, "uid": format!("u{g}"),
                         "resourceVersion": "1",
                         "labels": {"firebolt.io/engine": "e", "firebolt.io/generation": g.to_string()}}}));
    }
    let plan = w.reconcile();
    assert_eq!(plan.delete.len(), crate::engine::SWEEP_LIMIT);
    assert_eq!(plan.requeue_after_ms, Some(2000));
    w.settle(5);
    assert_eq!(w.names("ConfigMap"), ["e-g0-config"]);
}

#[test]
fn the_class_counts_the_engines_that_reference_it() {
    let class = json!({"apiVersion": "compute.firebolt.io/v1alpha1", "kind": "FireboltEngineClass",
        "metadata": {"name": "small", "namespace": NS, "generation": 1}, "spec": {"template": {}}});
    let mut b = SnapshotBuilder::new(CLASS_CONTROLLER).primary(&class);
    for (name, class_ref) in [
        ("a", Some("small")),
        ("b", Some("big")),
        ("c", Some("small")),
        ("d", None),
    ] {
        let mut e = engine(json!({"instanceRef": "firebolt", "replicas": 1}));
        e["metadata"]["name"] = json!(name);
        if let Some(c) = class_ref {
            e["spec"]["engineClassRef"] = json!(c);
        }
        b = b.related(crate::ENGINES_READ, e);
    }
    let plan = run::<EnginePlugin>(&b.build()).unwrap();
    let status = plan.status.unwrap();
    assert_eq!(status["boundEngines"], 2);
    let mut class = class;
    class["status"] = status;
    let again = SnapshotBuilder::new(CLASS_CONTROLLER)
        .primary(&class)
        .build();
    let plan = run::<EnginePlugin>(&again).unwrap();
    assert_eq!(plan.status.unwrap()["boundEngines"], 0);
}

// ---- failure paths ----

/// Runs passes until `phase` (at most `max`).
fn run_to(w: &mut World, phase: &str, max: usize) {
    for _ in 0..max {
        if w.phase() == phase {
            return;
        }
        w.reconcile();
    }
    assert_eq!(w.phase(), phase, "status {}", w.engine["status"]);
}

/// Sets the engine's spec at `path` and bumps `metadata.generation`, as
/// the API server does.
fn edit(w: &mut World, path: &str, value: Value) {
    let field = path.strip_prefix("/spec/").unwrap();
    w.engine["spec"][field] = value;
    let g = w.engine["metadata"]["generation"].as_i64().unwrap();
    w.engine["metadata"]["generation"] = json!(g + 1);
}

fn sts_replicas(w: &World, name: &str) -> i64 {
    w.owned[&("StatefulSet".to_owned(), name.to_owned())]["spec"]["replicas"]
        .as_i64()
        .unwrap()
}

/// True when some pass reported the engine's current spec generation as
/// observed (did not hold it) while reporting Ready=True, and the serving
/// StatefulSet does not have `replicas`.
fn check_never_ready_on_stale(w: &mut World, replicas: i64, passes: usize) {
    for _ in 0..passes {
        let plan = w.reconcile();
        let ready = condition(&w.engine, "Ready")["status"] == "True";
        let active = w.engine["status"]["activeGeneration"].as_i64().unwrap();
        let served = sts_replicas(w, &format!("e-g{active}"));
        if !plan.hold_observed_generation || ready && w.phase() == phase::STABLE {
            assert_eq!(
                served,
                replicas,
                "generation {active} ({served} replicas) reported as the rolled-out spec \
                 (hold {}, Ready {ready}, phase {})",
                plan.hold_observed_generation,
                w.phase()
            );
        }
    }
}

#[test]
fn a_spec_change_mid_switch_is_rolled_out_before_ready_or_observed() {
    let mut w = World::new(engine(base_spec()));
    w.settle(20);
    assert!(!w.plans.last().unwrap().hold_observed_generation);
    edit(&mut w, "/spec/replicas", json!(3));
    run_to(&mut w, phase::SWITCHING, 10);
    edit(&mut w, "/spec/replicas", json!(4));
    check_never_ready_on_stale(&mut w, 4, 30);
    assert_eq!(w.phase(), phase::STABLE);
    assert_eq!(w.names("StatefulSet"), ["e-g2"]);
    assert_eq!(sts_replicas(&w, "e-g2"), 4);
    assert_eq!(condition(&w.engine, "Ready")["status"], "True");
    let started = w.plans.iter().flat_map(|p| &p.events).any(|e| {
        e.reason == "GenerationStarted" && e.message.contains("while generation 1 was rolled out")
    });
    assert!(started, "cleaning went on to generation 2 directly");
}

#[test]
fn a_spec_change_mid_drain_is_rolled_out_before_ready_or_observed() {
    let mut spec = base_spec();
    spec["drainCheckEnabled"] = json!(true);
    let mut w = World::new(engine(spec));
    w.settle(20);
    edit(&mut w, "/spec/replicas", json!(3));
    run_to(&mut w, phase::DRAINING, 10);
    edit(
        &mut w,
        "/spec/template",
        json!({"spec": {"containers": [{"name": "engine", "image": "engine:2"}]}}),
    );
    // Draining waits for readings; every pass holds observedGeneration.
    for _ in 0..3 {
        assert!(w.reconcile().hold_observed_generation);
        assert_ne!(condition(&w.engine, "Ready")["status"], "True");
    }
    w.engine["spec"]["drainCheckEnabled"] = json!(false);
    check_never_ready_on_stale(&mut w, 3, 30);
    assert_eq!(w.phase(), phase::STABLE);
    let image = &w.owned[&("StatefulSet".to_owned(), "e-g2".to_owned())]["spec"]["template"]["spec"]
        ["containers"][0]["image"];
    assert_eq!(image, "engine:2");
    assert!(!w.plans.last().unwrap().hold_observed_generation);
}

#[test]
fn an_engine_blocked_or_creating_holds_its_observed_generation() {
    let mut w = World::new(engine(base_spec()));
    w.instance = None;
    assert!(w.reconcile().hold_observed_generation);
    w.instance = Some(instance(true));
    w.reconcile();
    assert_eq!(w.phase(), phase::CREATING);
    assert!(w.plans.last().unwrap().hold_observed_generation);
    w.settle(20);
    assert!(!w.plans.last().unwrap().hold_observed_generation);
}

fn image_pull_backoff() -> Value {
    json!({"phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "True"}],
        "containerStatuses": [{"name": "engine", "ready": false,
            "state": {"waiting": {"reason": "ImagePullBackOff",
                "message": "Back-off pulling image \"engine:nope\""}}}]})
}

#[test]
fn a_stuck_generation_says_why_keeps_the_service_and_degrades_past_its_deadline() {
    let mut spec = base_spec();
    spec["progressDeadlineSeconds"] = json!(120);
    let mut w = World::new(engine(spec));
    w.settle(20);
    for i in 0..2 {
        w.stuck.insert(format!("e-g1-{i}"), image_pull_backoff());
    }
    edit(
        &mut w,
        "/spec/template",
        json!({"spec": {"containers": [{"name": "engine", "image": "engine:nope"}]}}),
    );
    for _ in 0..6 {
        w.reconcile();
    }
    assert_eq!(w.phase(), phase::CREATING);
    assert_eq!(
        w.selected(),
        Some(0),
        "the Service keeps the serving generation"
    );
    let ready = condition(&w.engine, "Ready");
    assert_eq!(ready["reason"], "ImagePullBackOff");
    let message = ready["message"].as_str().unwrap();
    assert!(
        message.contains("generation 1 has 0 of 2 pod(s) ready; pod e-g1-0: container engine: ImagePullBackOff: Back-off pulling image"),
        "{message}"
    );
    let warnings = |w: &World, reason: &str| {
        w.plans
            .iter()
            .flat_map(|p| &p.events)
            .filter(|e| e.reason == reason && e.event_type == wasmop_sdk::EventType::Warning)
            .count()
    };
    assert_eq!(warnings(&w, "ImagePullBackOff"), 1, "once per cause");
    assert!(condition(&w.engine, "Degraded").is_null());
    w.advance(100);
    w.reconcile();
    assert!(
        condition(&w.engine, "Degraded").is_null(),
        "within the deadline"
    );
    w.advance(30);
    w.reconcile();
    w.reconcile();
    let degraded = condition(&w.engine, "Degraded");
    assert_eq!(degraded["status"], "True");
    assert_eq!(degraded["reason"], "ProgressDeadlineExceeded");
    assert!(
        degraded["message"]
            .as_str()
            .unwrap()
            .contains("ImagePullBackOff")
    );
    assert_eq!(warnings(&w, "ProgressDeadlineExceeded"), 1);
    assert_eq!(w.selected(), Some(0));
    // Fixing the spec abandons generation 1 and rolls generation 2.
    edit(
        &mut w,
        "/spec/template",
        json!({"spec": {"containers": [{"name": "engine", "image": "engine:2"}]}}),
    );
    w.settle(20);
    assert_eq!(w.names("StatefulSet"), ["e-g2"]);
    assert_eq!(w.selected(), Some(2));
    assert_eq!(condition(&w.engine, "Degraded")["status"], "False");
    assert_eq!(condition(&w.engine, "Ready")["status"], "True");
    assert!(
        w.plans
            .iter()
            .flat_map(|p| &p.events)
            .any(|e| e.reason == "GenerationAbandoned")
    );
}

#[test]
fn the_progress_deadline_defaults_to_ten_minutes() {
    let mut w = World::new(engine(base_spec()));
    w.settle(20);
    w.stuck.insert(
        "e-g1-0".into(),
        json!({"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": "0/1 nodes are available"}]}),
    );
    edit(&mut w, "/spec/replicas", json!(1));
    for _ in 0..4 {
        w.reconcile();
    }
    assert_eq!(condition(&w.engine, "Ready")["reason"], "Unschedulable");
    w.advance(590);
    w.reconcile();
    assert!(condition(&w.engine, "Degraded").is_null());
    w.advance(20);
    w.reconcile();
    assert_eq!(condition(&w.engine, "Degraded")["status"], "True");
}

/// Edits the live StatefulSet `name` as a person would: `f` changes it,
/// and the API server bumps its generation.
fn hand_edit(w: &mut World, name: &str, f: impl FnOnce(&mut Value)) {
    let sts = w
        .owned
        .get_mut(&("StatefulSet".to_owned(), name.to_owned()))
        .unwrap();
    f(sts);
    let g = sts["metadata"]["generation"].as_i64().unwrap();
    sts["metadata"]["generation"] = json!(g + 1);
}

#[test]
fn a_hand_scaled_statefulset_rolls_a_new_generation() {
    let mut w = World::new(engine(base_spec()));
    w.settle(20);
    assert_eq!(w.engine["status"]["statefulSetGeneration"], 1);
    hand_edit(&mut w, "e-g0", |s| s["spec"]["replicas"] = json!(1));
    let plan = w.reconcile();
    assert_eq!(plan.status.unwrap()["currentGeneration"], 1);
    let drifted = plan
        .events
        .iter()
        .find(|e| e.reason == "StatefulSetDrifted")
        .unwrap();
    assert!(
        drifted.message.contains("scaled to 1 replica(s)"),
        "{}",
        drifted.message
    );
    w.settle(20);
    assert_eq!(w.names("StatefulSet"), ["e-g1"]);
    assert_eq!(sts_replicas(&w, "e-g1"), 2);
}

#[test]
fn a_hand_edited_pod_template_rolls_a_new_generation() {
    let mut w = World::new(engine(base_spec()));
    w.settle(20);
    hand_edit(&mut w, "e-g0", |s| {
        s["spec"]["template"]["metadata"]["annotations"] = json!({"debug": "true"});
    });
    let plan = w.reconcile();
    let drifted = plan
        .events
        .iter()
        .find(|e| e.reason == "StatefulSetDrifted")
        .unwrap();
    assert!(
        drifted.message.contains("generation went from 1 to 2"),
        "{}",
        drifted.message
    );
    w.settle(20);
    assert_eq!(w.names("StatefulSet"), ["e-g1"]);
    let template = &w.owned[&("StatefulSet".to_owned(), "e-g1".to_owned())]["spec"]["template"];
    assert!(template["metadata"]["annotations"].get("debug").is_none());
    // The new generation is recorded: no further roll.
    assert_eq!(w.engine["status"]["activeGeneration"], 1);
    assert!(w.reconcile().is_empty());
}

#[test]
fn an_engine_from_before_the_recorded_generation_records_it_without_rolling() {
    let mut w = World::new(engine(base_spec()));
    w.settle(20);
    w.engine["status"]
        .as_object_mut()
        .unwrap()
        .remove("statefulSetGeneration");
    hand_edit(&mut w, "e-g0", |_| {});
    let plan = w.reconcile();
    assert_eq!(plan.status.unwrap()["statefulSetGeneration"], 2);
    assert_eq!(w.phase(), phase::STABLE);
    assert!(w.reconcile().is_empty());
}

#[test]
fn switching_recreates_a_service_deleted_by_hand_whole() {
    let mut w = World::new(engine(base_spec()));
    w.settle(20);
    edit(&mut w, "/spec/replicas", json!(3));
    run_to(&mut w, phase::SWITCHING, 10);
    w.owned
        .remove(&("Service".to_owned(), "e-service".to_owned()));
    let plan = w.reconcile();
    let service = plan
        .apply
        .iter()
        .map(|a| &a.object)
        .find(|o| o["metadata"]["name"] == "e-service")
        .unwrap();
    assert_eq!(service["spec"]["clusterIP"], "None");
    assert_eq!(service["spec"]["ports"].as_array().unwrap().len(), 2);
    assert_eq!(service["spec"]["selector"]["firebolt.io/generation"], "1");
    w.settle(20);
    assert_eq!(w.phase(), phase::STABLE);
    assert_eq!(w.selected(), Some(1));
}

#[test]
fn two_to_zero_to_two_replicas_stops_then_resumes_through_a_new_generation() {
    let mut w = World::new(engine(base_spec()));
    w.settle(20);
    edit(&mut w, "/spec/replicas", json!(0));
    w.settle(20);
    assert_eq!(w.phase(), phase::STOPPED);
    assert_eq!(condition(&w.engine, "Ready")["reason"], "Stopped");
    assert_eq!(w.names("StatefulSet"), ["e-g1"]);
    assert_eq!(sts_replicas(&w, "e-g1"), 0);
    assert!(!w.plans.last().unwrap().hold_observed_generation);
    edit(&mut w, "/spec/replicas", json!(2));
    w.settle(20);
    assert_eq!(w.phase(), phase::STABLE);
    assert_eq!(w.names("StatefulSet"), ["e-g2"]);
    assert_eq!(w.selected(), Some(2));
    assert_eq!(condition(&w.engine, "Ready")["status"], "True");
    // The Service never selected a generation with fewer ready pods than
    // the spec asked for at the time, other than the stopped one.
    assert!(
        w.selected_ready
            .iter()
            .all(|(g, ready)| *g == 1 || *ready == 2)
    );
}

#[test]
fn operator_owned_template_paths_are_stamped_whatever_the_templates_say() {
    let mut spec = base_spec();
    spec["template"] = json!({
        "metadata": {"labels": {"firebolt.io/generation": "7", "firebolt.io/x": "y", "team": "a"},
                     "annotations": {"firebolt.io/spec-hash": "forged", "note": "n"}},
        "spec": {"terminationGracePeriodSeconds": 5, "hostname": "h", "subdomain": "s",
                 "containers": [{"name": "engine", "env": [{"name": "POD_INDEX", "value": "9"},
                                                           {"name": "OTHER", "value": "1"}]}]},
    });
    let mut w = World::new(engine(spec));
    w.settle(20);
    let t = &w.owned[&("StatefulSet".to_owned(), "e-g0".to_owned())]["spec"]["template"];
    assert_eq!(t["spec"]["terminationGracePeriodSeconds"], 60);
    assert!(t["spec"].get("hostname").is_none() && t["spec"].get("subdomain").is_none());
    assert_eq!(
        t["metadata"]["labels"],
        json!({"firebolt.io/engine": "e", "firebolt.io/generation": "0", "team": "a"})
    );
    assert_eq!(t["metadata"]["annotations"], json!({"note": "n"}));
    let env: Vec<&str> = t["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(env, ["POD_INDEX", "OTHER"]);
    assert!(
        t["spec"]["containers"][0]["env"][0]
            .get("valueFrom")
            .is_some()
    );
}

fn class_object(deleting: bool) -> Value {
    let mut c = json!({"apiVersion": "compute.firebolt.io/v1alpha1", "kind": "FireboltEngineClass",
        "metadata": {"name": "small", "namespace": NS, "generation": 1,
                     "finalizers": [crate::class::DELETION_GUARD]}, "spec": {"template": {}}});
    if deleting {
        c["metadata"]["deletionTimestamp"] = json!("2025-01-01T00:00:00Z");
    }
    c
}

fn class_snapshot(class: &Value, engines: &[(&str, bool)]) -> Snapshot {
    let mut b = SnapshotBuilder::new(CLASS_CONTROLLER)
        .primary(class)
        .deleting(class["metadata"]["deletionTimestamp"].is_string());
    for (name, deleting) in engines {
        let mut e =
            engine(json!({"instanceRef": "firebolt", "replicas": 1, "engineClassRef": "small"}));
        e["metadata"]["name"] = json!(name);
        if *deleting {
            e["metadata"]["deletionTimestamp"] = json!("2025-01-01T00:00:00Z");
        }
        b = b.related(crate::ENGINES_READ, e);
    }
    b.build()
}

#[test]
fn the_class_declares_its_deletion_guard() {
    use wasmop_sdk::Plugin as _;
    let m = EnginePlugin::manifest();
    let c = m
        .controllers
        .iter()
        .find(|c| c.name == CLASS_CONTROLLER)
        .unwrap();
    assert_eq!(
        c.finalizer.as_deref(),
        Some("compute.firebolt.io/fireboltengineclass-deletion-guard")
    );
}

#[test]
fn a_class_in_use_is_not_let_go_and_names_its_engines() {
    let mut class = class_object(true);
    let plan = run::<EnginePlugin>(&class_snapshot(
        &class,
        &[("b", false), ("a", false), ("c", true)],
    ))
    .unwrap();
    assert!(!plan.cleanup_complete);
    let status = plan.status.clone().unwrap();
    let ready = status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .unwrap();
    assert_eq!(ready["status"], "False");
    assert_eq!(ready["reason"], "DeletionBlocked");
    assert!(
        ready["message"].as_str().unwrap().ends_with("2 do: a, b"),
        "{ready}"
    );
    assert_eq!(plan.events.len(), 1);
    assert_eq!(plan.events[0].event_type, wasmop_sdk::EventType::Warning);
    // The same blockers again: no new Event, no status write.
    class["status"] = status;
    let again =
        run::<EnginePlugin>(&class_snapshot(&class, &[("a", false), ("b", false)])).unwrap();
    assert!(again.is_empty(), "{again:?}");
    // Engines being deleted do not hold it.
    let plan = run::<EnginePlugin>(&class_snapshot(&class, &[("a", true), ("b", true)])).unwrap();
    assert!(plan.cleanup_complete);
    let plan = run::<EnginePlugin>(&class_snapshot(&class_object(true), &[])).unwrap();
    assert!(plan.cleanup_complete);
}

#[test]
fn a_class_not_being_deleted_is_admissible() {
    let plan = run::<EnginePlugin>(&class_snapshot(&class_object(false), &[("a", false)])).unwrap();
    assert!(!plan.cleanup_complete);
    let status = plan.status.unwrap();
    assert_eq!(status["boundEngines"], 1);
    assert_eq!(status["conditions"][0]["reason"], "Admissible");
}

/// Writes the snapshots behind the golden fixtures that need objects the
/// plugin rendered (with their hashes) to `$ENGINE_GOLDEN_DUMP/<name>.json`;
/// run with `--ignored` when the rendering changes, then re-bless.
#[test]
#[ignore = "regenerates golden fixture inputs"]
fn dump_golden_worlds() {
    let Some(dir) = std::env::var_os("ENGINE_GOLDEN_DUMP") else {
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    let dump = |w: &World, name: &str| {
        let mut docs = vec![w.engine.clone()];
        for o in w.owned.values() {
            let mut o = o.clone();
            o["metadata"]["ownerReferences"] = json!([{"apiVersion": "compute.firebolt.io/v1alpha1",
                "kind": "FireboltEngine", "name": "e", "uid": "00000000-0000-0000-0000-000000000001",
                "controller": true}]);
            docs.push(o);
        }
        docs.extend(w.pods.values().cloned());
        docs.extend(w.instance.clone());
        docs.extend(w.class.clone());
        std::fs::write(
            dir.join(format!("{name}.json")),
            serde_json::to_string(&docs).unwrap(),
        )
        .unwrap();
    };
    let mut spec = base_spec();
    spec["drainCheckEnabled"] = json!(true);
    let mut e = engine(spec);
    e["metadata"]["uid"] = json!("00000000-0000-0000-0000-000000000001");
    let mut w = World::new(e.clone());
    w.settle(20);
    dump(&w, "steady-state");
    w.engine["spec"]["replicas"] = json!(3);
    w.engine["metadata"]["generation"] = json!(2);
    while w.phase() != phase::SWITCHING {
        w.reconcile();
    }
    dump(&w, "replica-change-mid-switch");
    while w.phase() != phase::DRAINING {
        w.reconcile();
    }
    dump(&w, "draining");
    w.engine["status"]["phase"] = json!(phase::CLEANING);
    dump(&w, "cleaning");
    let mut stopped = e;
    stopped["spec"]["replicas"] = json!(0);
    let mut w = World::new(stopped);
    w.settle(20);
    w.owned.remove(&("ConfigMap".into(), "e-g0-config".into()));
    dump(&w, "stopped-missing-configmap");
}

// ---- auth and engine TLS ----

const CA: &str = include_str!("../../instance/src/testdata/ca-p384.crt");
const CA_FP: &str = "fad3cac8b473ff0c7974841c057f6102c25265e18638c58c3bf20f19e47c79f8";

fn with_auth(mut i: Value, hash: &str) -> Value {
    i["spec"]["auth"] = json!({"enabled": true, "local": {
        "admin": {"password": {"name": "admin-pw", "key": "password"}},
        "signingKeys": {"certManager": {"issuerRef": {"name": "ca"}}}}});
    i["status"]["auth"] = json!({"authHash": hash, "signingKeys": [
        {"id": "signing-1", "secretName": "firebolt-auth-signing-1", "phase": "Active", "issued": true}]});
    i
}

fn config_of(w: &World, g: i64) -> Value {
    let cm = &w.owned[&("ConfigMap".to_owned(), format!("e-g{g}-config"))];
    serde_json::from_str(cm["data"]["config.yaml"].as_str().unwrap()).unwrap()
}

#[test]
fn auth_is_rendered_as_files_and_the_served_hash_is_reported() {
    let mut w = World::new(engine(base_spec()));
    w.instance = Some(with_auth(instance(true), "h1"));
    w.settle(20);
    assert_eq!(w.phase(), phase::STABLE);
    let config = config_of(&w, 0);
    let auth = &config["instance"]["auth"];
    assert_eq!(
        auth["admin"]["password_file"],
        "/etc/firebolt/auth/admin/password"
    );
    assert_eq!(
        auth["local"]["signing_keys"],
        json!([{"id": "signing-1", "private_key_file": "/etc/firebolt/auth/keys/signing-1/tls.key"}])
    );
    let sts = &w.owned[&("StatefulSet".to_owned(), "e-g0".to_owned())];
    assert_eq!(
        sts["metadata"]["annotations"]["firebolt.io/auth-hash"],
        "h1"
    );
    let volumes = sts["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap();
    assert!(
        volumes
            .iter()
            .any(|v| v["secret"]["secretName"] == "admin-pw")
    );
    assert!(
        volumes
            .iter()
            .any(|v| v["secret"]["secretName"] == "firebolt-auth-signing-1")
    );
    assert_eq!(w.engine["status"]["observedAuthHash"], "h1");

    // A rotation step changes the render: a new generation, and the old
    // hash is reported until it alone serves.
    let mut i = with_auth(instance(true), "h2");
    i["status"]["auth"]["signingKeys"] = json!([
        {"id": "signing-2", "secretName": "firebolt-auth-signing-2", "phase": "Active", "issued": true},
        {"id": "signing-1", "secretName": "firebolt-auth-signing-1", "phase": "ValidationOnly",
         "issued": true, "demotedAt": "2025-01-01T00:00:00Z"}]);
    w.instance = Some(i);
    let mut seen = Vec::new();
    for _ in 0..20 {
        w.reconcile();
        seen.push(
            w.engine["status"]["observedAuthHash"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
        if w.phase() == phase::STABLE && seen.last().unwrap() == "h2" {
            break;
        }
    }
    assert_eq!(seen.last().unwrap(), "h2", "{seen:?}");
    assert!(seen.iter().rev().skip(1).all(|h| h == "h1"), "{seen:?}");
    assert_eq!(w.engine["status"]["currentGeneration"], 1);
    assert_eq!(
        w.names("StatefulSet"),
        ["e-g1"],
        "reported only once g0 is gone"
    );
    let keys = &config_of(&w, 1)["instance"]["auth"]["local"]["signing_keys"];
    assert_eq!(
        keys[0]["id"], "signing-2",
        "engines sign with the first key"
    );
}

#[test]
fn an_engine_waits_for_auth_to_be_provisioned() {
    let mut w = World::new(engine(base_spec()));
    let mut i = with_auth(instance(true), "h");
    i["status"]["auth"] = json!({});
    w.instance = Some(i);
    w.reconcile();
    let plan = w.reconcile();
    assert!(plan.apply.is_empty());
    let ready = w.engine["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "InstanceReady")
        .unwrap()
        .clone();
    assert_eq!(ready["status"], "False");
    assert!(ready["message"].as_str().unwrap().contains("authHash"));
}

fn with_tls(mut i: Value, reencrypting: bool, rolled: &[&str]) -> Value {
    i["spec"]["tls"] =
        json!({"engine": {"enabled": true, "certManager": {"issuerRef": {"name": "ca"}}}});
    i["status"]["engineTLS"] = json!({"secretName": "firebolt-engine-tls", "createdAt": "2025-01-01T00:00:00Z",
                                      "reencrypting": reencrypting, "tlsHash": "t1"});
    i["status"]["rolledEngineTrustCAs"] = json!(rolled);
    i
}

#[test]
fn a_tls_generation_starts_once_its_certificate_is_issued() {
    let mut w = World::new(engine(base_spec()));
    w.instance = Some(with_tls(instance(true), false, &[]));
    w.reconcile();
    let plan = w.reconcile();
    let names: Vec<String> = plan
        .apply
        .iter()
        .map(|a| {
            format!(
                "{}/{}",
                a.object["kind"].as_str().unwrap(),
                a.object["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect();
    assert!(
        names.contains(&"Certificate/e-g0-engine-tls".to_owned()),
        "{names:?}"
    );
    assert!(
        !names.contains(&"StatefulSet/e-g0".to_owned()),
        "no pods before the certificate"
    );
    let cert = plan
        .apply
        .iter()
        .find(|a| a.object["kind"] == "Certificate")
        .unwrap();
    assert_eq!(cert.object["spec"]["dnsNames"][0], "*.fb.svc.cluster.local");
    assert_eq!(
        cert.object["metadata"]["labels"]["firebolt.io/instance"],
        "firebolt"
    );
    let secret = plan
        .apply
        .iter()
        .find(|a| a.object["kind"] == "Secret")
        .unwrap();
    assert_eq!(secret.precondition, Some(wasmop_sdk::Precondition::Absent));
    assert_eq!(
        w.engine["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Ready")
            .unwrap()["reason"],
        "CertificatePending"
    );

    w.issuer = Some(CA);
    w.settle(20);
    assert_eq!(w.phase(), phase::STABLE);
    assert_eq!(w.engine["status"]["observedEngineTLSHash"], "t1");
    let tls = &config_of(&w, 0)["engine"]["tls"];
    assert_eq!(tls["port"], 3473);
    assert_eq!(tls["private_key_file"], "/etc/firebolt/tls/tls.key");
}

#[test]
fn while_the_gateway_re_encrypts_a_generation_switches_only_once_its_ca_is_trusted() {
    let mut w = World::new(engine(base_spec()));
    w.issuer = Some(CA);
    w.instance = Some(with_tls(instance(true), true, &[]));
    for _ in 0..10 {
        w.reconcile();
    }
    assert_eq!(w.phase(), phase::CREATING);
    assert!(w.selected().is_none_or(|g| g != 0) || w.engine["status"]["activeGeneration"] == -1);
    let ready = w.engine["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .unwrap()
        .clone();
    assert_eq!(ready["reason"], "TrustPending");
    w.instance = Some(with_tls(instance(true), true, &[CA_FP]));
    w.settle(20);
    assert_eq!(w.phase(), phase::STABLE);
    assert_eq!(w.selected(), Some(0));
}

#[test]
fn cleaning_deletes_the_old_generations_certificate() {
    let mut w = World::new(engine(base_spec()));
    w.issuer = Some(CA);
    w.instance = Some(with_tls(instance(true), false, &[]));
    w.settle(20);
    let mut spec = base_spec();
    spec["replicas"] = json!(3);
    w.engine["spec"] = spec;
    w.settle(30);
    assert_eq!(w.names("Certificate"), ["e-g1-engine-tls"]);
    assert_eq!(w.names("Secret"), ["e-g1-engine-tls"]);
    // Disabling TLS rolls back to plaintext: the hash report goes.
    let mut i = instance(true);
    i["status"]["engineTLS"] = json!({"secretName": "x", "createdAt": "2025-01-01T00:00:00Z",
                                      "reencrypting": true, "tlsHash": "t1"});
    w.instance = Some(i);
    w.settle(30);
    assert!(w.engine["status"].get("observedEngineTLSHash").is_none());
    assert!(w.names("Certificate").is_empty());
    assert!(config_of(&w, 2)["engine"].get("tls").is_none());
}

#[test]
fn a_serving_certificate_re_issued_in_place_rolls_a_new_generation() {
    let mut w = World::new(engine(base_spec()));
    w.issuer = Some(CA);
    w.instance = Some(with_tls(instance(true), false, &[]));
    w.settle(20);
    assert_eq!(w.phase(), phase::STABLE);
    assert_eq!(w.engine["status"]["observedEngineServingCertFP"], CA_FP);
    assert_eq!(w.engine["status"]["observedEngineServingCertGen"], 0);
    // Settled: nothing more happens.
    w.settle(5);
    assert_eq!(w.engine["status"]["currentGeneration"], 0);

    // cert-manager renews generation 0's certificate in place.
    use base64::Engine as _;
    let other = include_str!("../../instance/src/testdata/ca-p256.crt");
    let key = ("Secret".to_owned(), "e-g0-engine-tls".to_owned());
    w.owned.get_mut(&key).unwrap()["data"]["tls.crt"] =
        json!(base64::engine::general_purpose::STANDARD.encode(other));
    w.reconcile();
    assert_eq!(w.phase(), phase::CREATING, "a re-issued leaf rolls");
    assert_eq!(w.engine["status"]["currentGeneration"], 1);
    w.settle(30);
    assert_eq!(w.phase(), phase::STABLE);
    assert_eq!(w.names("StatefulSet"), ["e-g1"]);
    assert_eq!(w.engine["status"]["observedEngineServingCertGen"], 1);
    assert_eq!(
        w.engine["status"]["observedEngineServingCertFP"], CA_FP,
        "the new generation's own certificate, recorded without rolling again"
    );
}
