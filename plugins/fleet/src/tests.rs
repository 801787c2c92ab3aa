//! Unit tests of the reconcile over hand-built snapshots.

use serde_json::{Value, json};
use wasmop_sdk::Plan;
use wasmop_sdk::hash::stable_hash;
use wasmop_sdk::testing::{SnapshotBuilder, objects_from_yaml, run};

use crate::api::{Fleet, fixed_config, tuning};
use crate::names::*;
use crate::reconcile::workload_settled;
use crate::render;
use crate::reservation::{self, Binding};
use crate::{
    CLAIMS_READ, FLEET_CONTROLLER, FleetPlugin, PODS_READ, RESERVATIONS_READ, SERVICE_ACCOUNT_READ,
    STORAGE_CLASS_READ,
};

const UID: &str = "00000000-0000-0000-0000-0000000000f1";
const NOW: &str = "2026-01-01T00:10:00Z";
const IMAGE: &str = "ghcr.io/ewhauser/celld@sha256:1c0d854cd2af39fa439f163d5b88a19c7bccefd25fe35e2c0e1f43b3d886f424";

fn bucket_fleet() -> Value {
    json!({
        "apiVersion": "celld.eric.dev/v1alpha1",
        "kind": "CelldFleet",
        "metadata": {"name": "f", "namespace": "ns", "uid": UID, "generation": 1,
                     "resourceVersion": "10"},
        "spec": {
            "profile": "Bucket",
            "bucketWorkload": "Deployment",
            "replicas": 3,
            "runtimeImage": IMAGE,
            "serviceAccountName": "runtime",
            "storage": {"bucket": "b1", "region": "us-east-1", "sizeGiB": 10},
            "placement": {"azCount": 1, "zones": ["us-east-1a"], "mode": "Relaxed"},
        }
    })
}

fn persistent_fleet() -> Value {
    let mut f = bucket_fleet();
    f["spec"]["profile"] = json!("PersistentFleet");
    f["spec"]["storage"]["storageClassName"] = json!("standard");
    f
}

fn typed(primary: &Value) -> Fleet {
    serde_json::from_value(primary.clone()).unwrap()
}

fn reservation_of(primary: &Value) -> Value {
    let mut r = reservation::reservation(&typed(primary), primary);
    r["metadata"]["uid"] = json!("r-uid");
    r["metadata"]["resourceVersion"] = json!("1");
    r
}

fn sa() -> Value {
    json!({"apiVersion": "v1", "kind": "ServiceAccount",
           "metadata": {"name": "runtime", "namespace": "ns"}})
}

fn with_identity(mut o: Value, uid: &str) -> Value {
    o["metadata"]["uid"] = json!(uid);
    o["metadata"]["resourceVersion"] = json!("5");
    o["metadata"]["generation"] = json!(1);
    o["metadata"]["labels"] = json!({ FLEET_UID_LABEL: UID });
    o
}

/// The workload as the API server would show it once settled at `replicas`.
fn settled_workload(primary: &Value, replicas: i32) -> Value {
    let fleet = typed(primary);
    let mut w = with_identity(
        render::workload(&fleet, &render::fixed_hash(primary), replicas),
        "w-uid",
    );
    w["status"] = json!({"observedGeneration": 1, "replicas": replicas,
                         "updatedReplicas": replicas, "readyReplicas": replicas});
    w
}

fn infrastructure(primary: &Value) -> Vec<Value> {
    let fleet = typed(primary);
    let settings = crate::settings::Settings::default();
    [
        render::application_service(&fleet),
        render::peers_service_object(&fleet),
        render::network_policy(&fleet, &settings),
        render::disruption_budget(&fleet),
    ]
    .into_iter()
    .enumerate()
    .map(|(i, o)| with_identity(o, &format!("infra-{i}")))
    .collect()
}

fn pod(name: &str, ready: bool) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": "ns", "uid": format!("pod-{name}"),
                        "resourceVersion": "7", "labels": { FLEET_UID_LABEL: UID },
                        "creationTimestamp": "2026-01-01T00:00:00Z"},
           "status": {"phase": "Running", "conditions": [
               {"type": "Ready", "status": if ready { "True" } else { "False" },
                "lastTransitionTime": "2026-01-01T00:01:00Z"}]}})
}

fn claim(name: &str, phase: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
           "metadata": {"name": name, "namespace": "ns", "uid": format!("pvc-{name}"),
                        "resourceVersion": "8", "labels": { FLEET_UID_LABEL: UID }},
           "status": {"phase": phase}})
}

struct World {
    primary: Value,
    owned: Vec<Value>,
    pods: Vec<Value>,
    claims: Vec<Value>,
    reservations: Vec<Value>,
    service_account: bool,
    storage_class: bool,
    deleting: bool,
    settings: Value,
    extra: Vec<(String, Value)>,
    /// Optional kinds the host names as not served.
    absent: Vec<wasmop_sdk::KindRef>,
    observations: Vec<wasmop_sdk::Observation>,
}

impl World {
    fn new(primary: Value) -> Self {
        World {
            primary,
            owned: Vec::new(),
            pods: Vec::new(),
            claims: Vec::new(),
            reservations: Vec::new(),
            service_account: true,
            storage_class: true,
            deleting: false,
            // Application observation has its own tests below.
            settings: json!({"observeApplications": false}),
            extra: Vec::new(),
            absent: Vec::new(),
            observations: Vec::new(),
        }
    }

    /// A fleet that reserved its bucket, has its infrastructure and a
    /// workload settled at `replicas` with that many ready Pods.
    fn running(primary: Value, replicas: i32) -> Self {
        let mut w = World::new(primary.clone());
        w.reservations.push(reservation_of(&primary));
        w.owned.extend(infrastructure(&primary));
        w.owned.push(settled_workload(&primary, replicas));
        let stateful = typed(&primary).spec.stateful();
        for i in 0..replicas {
            let name = if stateful {
                format!("f-{i}")
            } else {
                format!("f-abc-{i}")
            };
            w.pods.push(pod(&name, true));
        }
        w
    }

    fn plan(&self) -> Plan {
        let mut b = SnapshotBuilder::new(FLEET_CONTROLLER)
            .primary(&self.primary)
            .now(NOW)
            .deleting(self.deleting)
            .settings(&self.settings);
        for o in &self.owned {
            b = b.owned(o);
        }
        for p in &self.pods {
            b = b.related(PODS_READ, p);
        }
        for c in &self.claims {
            b = b.related(CLAIMS_READ, c);
        }
        for r in &self.reservations {
            b = b.related(RESERVATIONS_READ, r);
        }
        if self.service_account {
            b = b.related(SERVICE_ACCOUNT_READ, sa());
        }
        if self.storage_class {
            b = b.related(
                STORAGE_CLASS_READ,
                json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                       "metadata": {"name": "standard"}}),
            );
        }
        for e in &self.extra {
            b = b.related(&e.0, &e.1);
        }
        for k in &self.absent {
            b = b.absent_kind(k);
        }
        for o in &self.observations {
            b = b.observation(o.clone());
        }
        run::<FleetPlugin>(&b.build()).unwrap()
    }
}

fn condition<'p>(plan: &'p Plan, type_: &str) -> &'p Value {
    plan.status.as_ref().unwrap()["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == type_)
        .unwrap_or_else(|| panic!("no {type_} condition"))
}

fn applied<'p>(plan: &'p Plan, kind: &str) -> Vec<&'p Value> {
    plan.apply
        .iter()
        .map(|a| &a.object)
        .filter(|o| o["kind"] == kind)
        .collect()
}

fn workload_of(plan: &Plan) -> Option<&Value> {
    plan.apply
        .iter()
        .map(|a| &a.object)
        .find(|o| o["kind"] == "Deployment" || o["kind"] == "StatefulSet")
}

fn env_names(workload: &Value) -> Vec<String> {
    workload["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap().to_owned())
        .collect()
}

fn env_of<'w>(workload: &'w Value, name: &str) -> &'w Value {
    workload["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == name)
        .unwrap_or_else(|| panic!("no env {name}"))
}

#[test]
fn a_new_fleet_reserves_its_bucket_first_and_alone() {
    let plan = World::new(bucket_fleet()).plan();
    assert_eq!(plan.apply.len(), 1, "{:#?}", plan.apply);
    let r = &plan.apply[0];
    assert_eq!(r.object["kind"], "CelldStorageReservation");
    assert_eq!(r.precondition, Some(wasmop_sdk::Precondition::Absent));
    assert_eq!(r.object["metadata"]["name"], reservation_name("b1"));
    assert_eq!(r.object["spec"]["fleetUID"], UID);
    assert_eq!(r.object["spec"]["initialReplicas"], 3);
    assert!(r.object["metadata"].get("ownerReferences").is_none());
    assert_eq!(condition(&plan, "Provisioned")["status"], "False");
    assert_eq!(condition(&plan, "Blocked")["status"], "False");
}

#[test]
fn bucket_profile_objects() {
    let primary = bucket_fleet();
    let mut w = World::new(primary.clone());
    w.reservations.push(reservation_of(&primary));
    let plan = w.plan();
    let d = workload_of(&plan).unwrap();
    assert_eq!(d["kind"], "Deployment");
    assert_eq!(d["spec"]["replicas"], 3);
    assert_eq!(
        d["spec"]["strategy"],
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}})
    );
    assert_eq!(d["spec"]["selector"]["matchLabels"][FLEET_UID_LABEL], UID);
    assert_eq!(
        d["spec"]["template"]["metadata"]["labels"][FLEET_UID_LABEL],
        UID
    );
    let pod = &d["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "runtime");
    assert_eq!(pod["securityContext"]["runAsUser"], 10001);
    assert_eq!(pod["volumes"][0]["emptyDir"]["sizeLimit"], "10Gi");
    assert_eq!(env_of(d, "CELLD_DURABILITY")["value"], "bucket");
    assert_eq!(env_of(d, "CELLD_BUCKET")["value"], "s3://b1");
    assert_eq!(env_of(d, "CELLD_ADVERTISE")["value"], "$(POD_IP):8081");
    assert_eq!(
        env_of(d, "CELLD_NODE")["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.uid"
    );
    assert_eq!(env_of(d, "CELLD_SHUTDOWN_TOTAL_MS")["value"], "20000");
    assert_eq!(pod["terminationGracePeriodSeconds"], 30);

    let services = applied(&plan, "Service");
    assert_eq!(services.len(), 2);
    assert_eq!(services[0]["metadata"]["name"], "f");
    assert_eq!(services[0]["spec"]["ports"][0]["port"], 8080);
    assert_eq!(services[1]["metadata"]["name"], "f-peers");
    assert_eq!(services[1]["spec"]["clusterIP"], "None");
    assert_eq!(services[1]["spec"]["publishNotReadyAddresses"], true);
    assert_eq!(services[1]["spec"]["ports"][0]["port"], 8081);
    let np = applied(&plan, "NetworkPolicy")[0];
    assert_eq!(np["spec"]["ingress"][0]["ports"][0]["port"], 8081);
    assert_eq!(
        np["spec"]["ingress"][0]["from"][1]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
        "wasmop"
    );
    assert_eq!(
        np["spec"]["ingress"][1]["from"][0]["podSelector"]["matchLabels"][CLIENT_OF_LABEL],
        "f"
    );
    assert_eq!(
        np["spec"]["egress"][2],
        json!({"ports": [{"protocol": "TCP", "port": 443}]})
    );
    let pdb = applied(&plan, "PodDisruptionBudget")[0];
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    for a in &plan.apply {
        assert!(a.object["metadata"].get("ownerReferences").is_none());
    }
    assert_eq!(
        plan.status.as_ref().unwrap()["labelSelector"],
        format!("{FLEET_UID_LABEL}={UID}")
    );
}

#[test]
fn ordered_bucket_is_a_statefulset_without_claims() {
    let mut primary = bucket_fleet();
    primary["spec"]["bucketWorkload"] = json!("Ordered");
    let mut w = World::new(primary.clone());
    w.reservations.push(reservation_of(&primary));
    let s = workload_of(&w.plan()).unwrap().clone();
    assert_eq!(s["kind"], "StatefulSet");
    assert_eq!(s["spec"]["serviceName"], "f-peers");
    assert_eq!(s["spec"]["podManagementPolicy"], "Parallel");
    assert!(s["spec"].get("volumeClaimTemplates").is_none());
    assert_eq!(env_of(&s, "CELLD_DURABILITY")["value"], "bucket");
}

#[test]
fn persistent_fleet_profile() {
    let primary = persistent_fleet();
    let mut w = World::new(primary.clone());
    w.reservations.push(reservation_of(&primary));
    let s = workload_of(&w.plan()).unwrap().clone();
    assert_eq!(s["kind"], "StatefulSet");
    assert_eq!(
        s["spec"]["persistentVolumeClaimRetentionPolicy"],
        json!({"whenDeleted": "Retain", "whenScaled": "Retain"})
    );
    let t = &s["spec"]["volumeClaimTemplates"][0];
    assert_eq!(t["metadata"]["name"], "data");
    assert_eq!(
        t["metadata"]["annotations"][STORAGE_RESERVATION_ANNOTATION],
        reservation_name("b1")
    );
    assert_eq!(t["metadata"]["labels"][FLEET_UID_LABEL], UID);
    assert_eq!(
        t["metadata"]["labels"]["wasmop.dev/owner-uid"], UID,
        "claims are the fleet's"
    );
    assert_eq!(t["spec"]["storageClassName"], "standard");
    assert!(s["spec"]["template"]["spec"].get("volumes").is_none());
    assert_eq!(env_of(&s, "CELLD_DURABILITY")["value"], "fleet");
    assert_eq!(
        env_of(&s, "CELLD_NODE")["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.name"
    );
    assert_eq!(
        env_of(&s, "CELLD_ADVERTISE")["value"],
        "$(CELLD_NODE).f-peers.ns.svc:8081"
    );
}

#[test]
fn settled_fleet_is_provisioned_and_ready() {
    let plan = World::running(bucket_fleet(), 3).plan();
    assert_eq!(condition(&plan, "Provisioned")["status"], "True");
    assert_eq!(condition(&plan, "Provisioned")["observedGeneration"], 1);
    assert_eq!(condition(&plan, "Ready")["status"], "True");
    assert_eq!(condition(&plan, "Progressing")["status"], "False");
    assert_eq!(condition(&plan, "InfrastructureReady")["status"], "True");
    assert_eq!(condition(&plan, "MaintenancePaused")["status"], "False");
    assert_eq!(condition(&plan, "Deleting")["status"], "False");
    let status = plan.status.as_ref().unwrap();
    assert_eq!(status["replicas"], 3);
    assert_eq!(status["readyReplicas"], 3);
    assert!(plan.requeue_after_ms.is_none());
    assert!(plan.delete.is_empty());
}

#[test]
fn scale_out_is_immediate_and_scale_in_one_at_a_time() {
    let mut primary = bucket_fleet();
    primary["spec"]["replicas"] = json!(5);
    let w = World::running(primary.clone(), 3);
    assert_eq!(workload_of(&w.plan()).unwrap()["spec"]["replicas"], 5);

    primary["spec"]["replicas"] = json!(1);
    primary["spec"]["placement"]["azCount"] = json!(1);
    let w = World::running(primary.clone(), 3);
    let plan = w.plan();
    assert_eq!(
        workload_of(&plan).unwrap()["spec"]["replicas"],
        2,
        "one member at a time"
    );
    assert_eq!(condition(&plan, "Progressing")["reason"], "ScalingIn");
    assert_eq!(condition(&plan, "Provisioned")["status"], "False");

    // Not settled yet (a member still terminating): hold at the live count.
    let mut w = World::running(primary, 2);
    w.pods[0]["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:09:00Z");
    assert_eq!(workload_of(&w.plan()).unwrap()["spec"]["replicas"], 2);
}

#[test]
fn restart_token_and_env_roll_the_template() {
    let primary = bucket_fleet();
    let mut changed = primary.clone();
    changed["metadata"]["generation"] = json!(2);
    changed["spec"]["maintenance"] = json!({"restartToken": "r1"});
    let mut w = World::running(primary.clone(), 3);
    w.primary = changed.clone();
    let plan = w.plan();
    let d = workload_of(&plan).unwrap();
    assert_eq!(
        d["spec"]["template"]["metadata"]["annotations"][RESTART_TOKEN_ANNOTATION],
        "r1"
    );
    assert_eq!(d["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"], 1);
    assert_eq!(condition(&plan, "Progressing")["reason"], "RollingUpdate");
    assert_eq!(condition(&plan, "Provisioned")["status"], "False");
    assert_eq!(condition(&plan, "Provisioned")["observedGeneration"], 2);

    changed["spec"]["env"] = json!([{"name": "CELLD_LOG", "value": "debug"},
                                   {"name": "CELLD_API_TOKEN", "secretKeyRef": {"name": "auth", "key": "token"}}]);
    w.primary = changed;
    let plan = w.plan();
    let d = workload_of(&plan).unwrap();
    assert!(env_names(d).contains(&"CELLD_LOG".to_owned()));
    assert_eq!(
        env_of(d, "CELLD_API_TOKEN")["valueFrom"]["secretKeyRef"],
        json!({"name": "auth", "key": "token"})
    );
    assert!(env_of(d, "CELLD_API_TOKEN").get("value").is_none());
    // The env change still verifies against the reservation (tuning record).
    assert_eq!(condition(&plan, "Blocked")["status"], "False");
}

#[test]
fn paused_holds_workload_changes() {
    let primary = bucket_fleet();
    let mut changed = primary.clone();
    changed["spec"]["maintenance"] = json!({"paused": true, "restartToken": "r2"});
    changed["spec"]["replicas"] = json!(4);
    let mut w = World::running(primary, 3);
    w.primary = changed;
    let plan = w.plan();
    assert!(
        workload_of(&plan).is_none(),
        "no workload change while paused"
    );
    assert_eq!(
        applied(&plan, "Service").len(),
        2,
        "infrastructure is still kept"
    );
    assert_eq!(condition(&plan, "MaintenancePaused")["status"], "True");
    assert_eq!(
        condition(&plan, "Provisioned")["reason"],
        "MaintenancePaused"
    );
    assert_eq!(condition(&plan, "Progressing")["status"], "False");
}

#[test]
fn reserved_env_is_refused_and_nothing_changes() {
    for name in [
        "CELLD_REEXEC_MODE",
        "CELLD_STRICT_X",
        "CELLD_EXPORT_SINK",
        "CELLD_OTEL",
        "CELLD_BUCKET",
    ] {
        let mut primary = bucket_fleet();
        primary["spec"]["env"] = json!([{"name": name, "value": "x"}]);
        let plan = World::running(primary, 3).plan();
        assert!(plan.apply.is_empty(), "{name}: {:#?}", plan.apply);
        assert!(plan.delete.is_empty());
        let b = condition(&plan, "Blocked");
        assert_eq!(b["status"], "True");
        assert_eq!(b["reason"], "InvalidConfiguration");
        assert!(b["message"].as_str().unwrap().contains(name));
        assert_eq!(plan.events.len(), 1);
        assert!(plan.status.as_ref().unwrap()["blockedSince"].is_string());
    }
    let mut primary = bucket_fleet();
    primary["spec"]["env"] = json!(
        (0..33)
            .map(|i| json!({"name": format!("CELLD_X{i}"), "value": "v"}))
            .collect::<Vec<_>>()
    );
    let plan = World::running(primary, 3).plan();
    assert!(
        condition(&plan, "Blocked")["message"]
            .as_str()
            .unwrap()
            .contains("at most 32")
    );
}

#[test]
fn a_capacity_policy_other_than_external_is_refused_not_ignored() {
    // `capacity: {}` is Shadow by the CRD's default.
    for (capacity, mode) in [
        (json!({"mode": "Shadow", "minReplicas": 3}), "Shadow"),
        (json!({"mode": "ScaleOut"}), "ScaleOut"),
        (json!({"mode": "Automatic"}), "Automatic"),
        (json!({}), "Shadow"),
    ] {
        let mut primary = bucket_fleet();
        primary["spec"]["capacity"] = capacity;
        let plan = World::running(primary, 3).plan();
        assert!(plan.apply.is_empty(), "{mode}: {:#?}", plan.apply);
        assert!(plan.delete.is_empty());
        let b = condition(&plan, "Blocked");
        assert_eq!(b["reason"], "InvalidConfiguration");
        let message = b["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("capacity.mode \"{mode}\" is not implemented"))
                && message.contains("External"),
            "{message}"
        );
    }
    // External needs nothing from the operator (scaling goes through /scale).
    let mut primary = bucket_fleet();
    primary["spec"]["capacity"] = json!({"mode": "External"});
    let plan = World::running(primary, 3).plan();
    assert_eq!(condition(&plan, "Blocked")["status"], "False");
    assert!(workload_of(&plan).is_some());
}

#[test]
fn a_collector_cidr_wider_than_one_address_is_refused_past_admission() {
    let telemetry = |cidr: &str| {
        let mut primary = bucket_fleet();
        primary["spec"]["telemetry"] =
            json!({"collectorURL": "http://otel:4317", "egress": {"cidr": cidr}});
        World::running(primary, 3).plan()
    };
    let plan = telemetry("10.0.0.0/8");
    assert!(plan.apply.is_empty());
    let b = condition(&plan, "Blocked");
    assert_eq!(b["reason"], "InvalidConfiguration");
    assert!(
        b["message"]
            .as_str()
            .unwrap()
            .contains("telemetry.egress.cidr \"10.0.0.0/8\" must be one address"),
        "{b}"
    );
    for one in ["10.1.2.3/32", "fd00::7/128"] {
        let plan = telemetry(one);
        assert_eq!(condition(&plan, "Blocked")["status"], "False", "{one}");
        let np = applied_named(&plan, "NetworkPolicy", "f").unwrap();
        assert!(np.to_string().contains(one), "{one}: {np}");
    }
}

#[test]
fn a_fixed_field_changed_around_admission_is_refused() {
    let primary = bucket_fleet();
    let mut w = World::running(primary.clone(), 3);
    let mut changed = primary.clone();
    changed["spec"]["placement"]["zones"] = json!(["us-east-1b"]);
    w.primary = changed;
    let plan = w.plan();
    assert!(plan.apply.is_empty());
    assert_eq!(
        condition(&plan, "Blocked")["reason"],
        "InvalidConfiguration"
    );

    let mut changed = primary;
    changed["spec"]["bucketWorkload"] = json!("Ordered");
    w.primary = changed;
    let plan = w.plan();
    assert!(plan.apply.is_empty());
    assert!(
        condition(&plan, "Blocked")["message"]
            .as_str()
            .unwrap()
            .contains("never converted")
    );
}

#[test]
fn same_name_fleet_recreated_gets_storage_scope_conflict() {
    let old = bucket_fleet();
    let mut new = old.clone();
    new["metadata"]["uid"] = json!("00000000-0000-0000-0000-0000000000f2");
    let mut w = World::new(new);
    w.reservations.push(reservation_of(&old));
    let plan = w.plan();
    assert!(
        plan.apply.is_empty(),
        "nothing is created: {:#?}",
        plan.apply
    );
    let b = condition(&plan, "Blocked");
    assert_eq!(b["reason"], "StorageScopeConflict");
    assert!(b["message"].as_str().unwrap().contains(UID));
}

#[test]
fn tuning_record_is_trusted_only_when_it_reproduces_the_hash() {
    let primary = bucket_fleet();
    let fleet = typed(&primary);
    let mut r = reservation_of(&primary);
    assert_eq!(
        reservation::binding(&fleet, &primary, Some(&r)),
        Binding::Bound { record: None }
    );

    // A changed tuning verifies through the record.
    let mut tuned = primary.clone();
    tuned["spec"]["execution"] = json!({"memoryLimit": "2Gi"});
    assert_eq!(
        reservation::binding(&typed(&tuned), &tuned, Some(&r)),
        Binding::Bound { record: None }
    );

    // A forged record does not: the current tuning differs too -> conflict.
    r["metadata"]["annotations"][RESERVED_TUNING_ANNOTATION] =
        json!(serde_json::to_string(&tuning(&tuned)).unwrap());
    assert!(matches!(
        reservation::binding(&typed(&tuned), &tuned, Some(&r)),
        Binding::Conflict { .. }
    ));

    // No record, current tuning equal to creation: verified, and the record is written.
    r["metadata"]["annotations"] = json!({});
    match reservation::binding(&fleet, &primary, Some(&r)) {
        Binding::Bound { record: Some(o) } => {
            let text = o["metadata"]["annotations"][RESERVED_TUNING_ANNOTATION]
                .as_str()
                .unwrap();
            let parsed: Value = serde_json::from_str(text).unwrap();
            assert_eq!(parsed, tuning(&primary));
            assert_eq!(o["spec"], r["spec"]);
        }
        other => panic!("{other:?}"),
    }
    let _ = stable_hash(&fixed_config(&primary));
}

#[test]
fn blockers_for_missing_service_account_and_storage_class() {
    let mut w = World::new(bucket_fleet());
    w.service_account = false;
    let plan = w.plan();
    assert_eq!(
        condition(&plan, "Blocked")["reason"],
        "ServiceAccountMissing"
    );
    assert!(plan.apply.is_empty());
    let mut w = World::new(persistent_fleet());
    w.storage_class = false;
    assert_eq!(
        condition(&w.plan(), "Blocked")["reason"],
        "StorageClassMissing"
    );
    let mut primary = bucket_fleet();
    primary["spec"]
        .as_object_mut()
        .unwrap()
        .remove("runtimeImage");
    let plan = World::new(primary).plan();
    assert!(
        condition(&plan, "Blocked")["message"]
            .as_str()
            .unwrap()
            .contains("no default compatible pin")
    );
}

#[test]
fn a_blocker_already_reported_is_not_evented_again() {
    let mut w = World::new(bucket_fleet());
    w.service_account = false;
    let first = w.plan();
    assert_eq!(first.events.len(), 1);
    w.primary["status"] = first.status.clone().unwrap();
    let second = w.plan();
    assert!(second.events.is_empty());
    assert_eq!(
        second.status.as_ref().unwrap()["blockedSince"],
        first.status.as_ref().unwrap()["blockedSince"]
    );
}

#[test]
fn lost_claim_member_is_replaced() {
    let primary = persistent_fleet();
    let mut w = World::running(primary, 3);
    w.claims = vec![
        claim("data-f-0", "Bound"),
        claim("data-f-1", "Lost"),
        claim("data-f-2", "Bound"),
    ];
    let plan = w.plan();
    let deleted: Vec<&str> = plan.delete.iter().map(|d| d.target.name.as_str()).collect();
    assert_eq!(
        deleted,
        ["data-f-1", "f-1"],
        "the claim, then its member Pod (a dependent of the StatefulSet)"
    );
    assert_eq!(plan.delete[0].uid, "pvc-data-f-1");
    assert_eq!(plan.delete[1].target.kind, "Pod");
    assert_eq!(plan.events[0].reason, "MemberReplaced");
    assert_eq!(condition(&plan, "Progressing")["reason"], "ReplacingMember");
}

#[test]
fn the_one_member_down_is_replaced_after_the_delay() {
    let primary = persistent_fleet();
    let mut w = World::running(primary, 3);
    w.claims = vec![
        claim("data-f-0", "Bound"),
        claim("data-f-1", "Bound"),
        claim("data-f-2", "Bound"),
    ];
    w.pods[2] = pod("f-2", false); // not ready since 00:01, now 00:10
    w.settings = json!({"memberReplacementDelaySeconds": 600});
    let plan = w.plan();
    assert!(plan.delete.is_empty());
    assert_eq!(plan.requeue_after_ms, Some(5_000));
    w.settings = json!({"memberReplacementDelaySeconds": 300});
    let plan = w.plan();
    let deleted: Vec<&str> = plan.delete.iter().map(|d| d.target.name.as_str()).collect();
    assert_eq!(deleted, ["data-f-2", "f-2"]);
    // Two members down: nobody is replaced.
    w.pods[1] = pod("f-1", false);
    assert!(w.plan().delete.is_empty());
}

#[test]
fn deletion_removes_compute_then_claims_and_keeps_the_reservation() {
    let primary = persistent_fleet();
    let mut w = World::running(primary, 2);
    w.claims = vec![claim("data-f-0", "Bound"), claim("data-f-1", "Bound")];
    w.deleting = true;
    let plan = w.plan();
    let kinds: Vec<&str> = plan.delete.iter().map(|d| d.target.kind.as_str()).collect();
    assert_eq!(kinds, ["StatefulSet"]);
    assert!(!plan.cleanup_complete);
    assert_eq!(condition(&plan, "Deleting")["reason"], "RemovingCompute");

    w.owned.retain(|o| o["kind"] != "StatefulSet");
    let plan = w.plan();
    assert!(
        plan.delete.is_empty(),
        "claims wait for the members to stop"
    );

    w.pods.clear();
    let plan = w.plan();
    let kinds: Vec<&str> = plan.delete.iter().map(|d| d.target.kind.as_str()).collect();
    assert_eq!(
        kinds
            .iter()
            .filter(|k| **k == "PersistentVolumeClaim")
            .count(),
        2
    );
    assert!(!kinds.contains(&"CelldStorageReservation"));
    assert!(!plan.cleanup_complete);

    w.claims.clear();
    w.owned.clear();
    let plan = w.plan();
    assert!(plan.delete.is_empty());
    assert!(plan.cleanup_complete);
    assert!(plan.apply.is_empty());
}

#[test]
fn telemetry_and_export_environment() {
    let mut primary = bucket_fleet();
    primary["spec"]["telemetry"] = json!({
        "collectorURL": "http://otel-collector.fleets.svc:4318",
        "egress": {"podLabels": {"app": "otel-collector"}},
        "sampler": "parentbased_traceidratio", "samplerArg": "0.1",
        "headersSecretKeyRef": {"name": "otel-auth", "key": "headers"}});
    primary["spec"]["export"] = json!({
        "sink": "Kafka", "classes": ["Cart", "Order"],
        "kafka": {"brokers": ["k-0:9092", "k-1:9093"], "topic": "t",
                  "propertiesSecretKeyRef": {"name": "kc", "key": "kafka.properties"},
                  "egress": {"podLabels": {"app": "kafka"}, "namespace": "kafka"}}});
    let mut w = World::new(primary.clone());
    w.reservations.push(reservation_of(&primary));
    let plan = w.plan();
    let d = workload_of(&plan).unwrap();
    assert_eq!(
        env_of(d, "CELLD_OTEL")["value"],
        "http://otel-collector.fleets.svc:4318"
    );
    assert_eq!(
        env_of(d, "OTEL_RESOURCE_ATTRIBUTES")["value"],
        "k8s.namespace.name=ns,k8s.pod.name=$(POD_NAME),celld.fleet.name=f"
    );
    assert_eq!(
        env_of(d, "OTEL_EXPORTER_OTLP_HEADERS")["valueFrom"]["secretKeyRef"]["name"],
        "otel-auth"
    );
    assert_eq!(env_of(d, "CELLD_EXPORT")["value"], "1");
    assert_eq!(env_of(d, "CELLD_EXPORT_CLASSES")["value"], "Cart,Order");
    assert_eq!(
        env_of(d, "CELLD_EXPORT_KAFKA_PROPERTIES")["value"],
        "/etc/celld/export/kafka.properties"
    );
    assert!(!env_names(d).contains(&"CELLD_OTEL_SINK".to_owned()));
    let np = applied(&plan, "NetworkPolicy")[0];
    let egress = np["spec"]["egress"].as_array().unwrap();
    assert_eq!(egress[4]["ports"][0]["port"], 4318);
    assert_eq!(egress[5]["ports"].as_array().unwrap().len(), 2);
}

#[test]
fn workload_settled_needs_every_replica_updated_and_ready() {
    let primary = bucket_fleet();
    let mut w = settled_workload(&primary, 3);
    assert!(workload_settled(&w));
    w["status"]["updatedReplicas"] = json!(2);
    assert!(!workload_settled(&w));
}

#[test]
fn upstream_sample_shapes_parse() {
    let docs = objects_from_yaml(include_str!("../tests/golden/bucket-first-workload.yaml"));
    let fleet = docs.iter().find(|d| d["kind"] == "CelldFleet").unwrap();
    let _: Fleet = serde_json::from_value(fleet.clone()).unwrap();
}

// ---- routing -----------------------------------------------------------------

fn with_routing(routing: Value) -> Value {
    let mut f = bucket_fleet();
    f["spec"]["routing"] = routing;
    f
}

fn ingress_routing() -> Value {
    json!({"hostnames": ["app.example.com"],
           "ingress": {"className": "nginx", "annotations": {"a.example/x": "1"}},
           "source": {"namespace": "edge", "podLabels": {"app": "gw"}}})
}

fn gateway_routing() -> Value {
    json!({"hostnames": ["app.example.com"], "gateway": {"name": "public"},
           "source": {"namespace": "edge", "podLabels": {"app": "gw"}}})
}

fn applied_named<'p>(plan: &'p Plan, kind: &str, name: &str) -> Option<&'p Value> {
    plan.apply
        .iter()
        .map(|a| &a.object)
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
}

fn routing_owned(kind: &str, api: &str) -> Value {
    json!({"apiVersion": api, "kind": kind,
           "metadata": {"name": "f-routing", "namespace": "ns", "uid": format!("{kind}-uid"),
                        "resourceVersion": "9", "labels": { FLEET_UID_LABEL: UID }}})
}

#[test]
fn ingress_routing_adds_route_and_policy_without_touching_the_workload() {
    let w = World::running(with_routing(ingress_routing()), 3);
    let plain = World::running(bucket_fleet(), 3).plan();
    let plan = w.plan();
    let ing = applied_named(&plan, "Ingress", "f-routing").expect("ingress");
    assert_eq!(
        ing["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]["port"]["number"],
        8080
    );
    assert_eq!(ing["metadata"]["annotations"]["a.example/x"], "1");
    let policy = applied_named(&plan, "NetworkPolicy", "f-routing").expect("policy");
    assert_eq!(
        policy["spec"]["ingress"][0]["ports"],
        json!([{"protocol": "TCP", "port": 8080}])
    );
    assert_eq!(
        applied_named(&plan, "Deployment", "f"),
        applied_named(&plain, "Deployment", "f")
    );
    assert_eq!(condition(&plan, "RoutingReady")["status"], "Unknown");
    assert_eq!(
        condition(&plan, "RoutingReady")["reason"],
        "AwaitingAddress"
    );
    assert_eq!(condition(&plan, "Provisioned")["status"], "True");
}

#[test]
fn gateway_routing_without_the_api_reports_gateway_api_unavailable_and_keeps_the_ingress() {
    let mut w = World::running(with_routing(gateway_routing()), 3);
    w.owned
        .push(routing_owned("Ingress", "networking.k8s.io/v1"));
    w.absent.push(crate::routing::http_route_kind());
    let plan = w.plan();
    assert_eq!(
        condition(&plan, "RoutingReady")["reason"],
        "GatewayAPIUnavailable"
    );
    assert!(plan.delete.is_empty(), "{:?}", plan.delete);
    assert!(applied_named(&plan, "HTTPRoute", "f-routing").is_none());
    assert_eq!(condition(&plan, "Provisioned")["status"], "True");
}

#[test]
fn a_switch_deletes_the_old_route_first_with_preconditions() {
    let mut w = World::running(with_routing(gateway_routing()), 3);
    w.owned
        .push(routing_owned("Ingress", "networking.k8s.io/v1"));
    let plan = w.plan();
    assert_eq!(plan.delete.len(), 1);
    assert_eq!(plan.delete[0].target.kind, "Ingress");
    assert_eq!(plan.delete[0].uid, "Ingress-uid");
    assert_eq!(plan.delete[0].resource_version, "9");
    assert!(applied_named(&plan, "HTTPRoute", "f-routing").is_none());
    assert_eq!(condition(&plan, "RoutingReady")["reason"], "Reconciling");
}

#[test]
fn a_failed_preflight_keeps_the_route() {
    let mut w = World::running(bucket_fleet(), 3);
    let isolation = |o: &Value| o["kind"] == "NetworkPolicy" && o["metadata"]["name"] == "f";
    w.owned.retain(|o| !isolation(o));
    w.owned
        .push(routing_owned("Ingress", "networking.k8s.io/v1"));
    w.owned
        .push(routing_owned("NetworkPolicy", "networking.k8s.io/v1"));
    let plan = w.plan();
    assert!(plan.delete.is_empty(), "{:?}", plan.delete);
    assert_eq!(
        condition(&plan, "RoutingReady")["reason"],
        "PreflightFailed"
    );
}

#[test]
fn removal_deletes_the_route_then_the_policy() {
    let mut w = World::running(bucket_fleet(), 3);
    w.owned
        .push(routing_owned("Ingress", "networking.k8s.io/v1"));
    w.owned
        .push(routing_owned("NetworkPolicy", "networking.k8s.io/v1"));
    let plan = w.plan();
    let kinds: Vec<&str> = plan.delete.iter().map(|d| d.target.kind.as_str()).collect();
    assert_eq!(kinds, ["Ingress"]);
    w.owned.retain(|o| o["kind"] != "Ingress");
    let plan = w.plan();
    let kinds: Vec<&str> = plan.delete.iter().map(|d| d.target.kind.as_str()).collect();
    assert_eq!(kinds, ["NetworkPolicy"]);
    let conditions = plan.status.as_ref().unwrap()["conditions"].to_string();
    assert!(!conditions.contains("RoutingReady"), "{conditions}");
}

#[test]
fn an_accepted_http_route_is_routing_ready() {
    let mut w = World::running(with_routing(gateway_routing()), 3);
    let mut route = routing_owned("HTTPRoute", "gateway.networking.k8s.io/v1");
    route["metadata"]["generation"] = json!(2);
    let cond = |t: &str, g: i64| json!({"type": t, "status": "True", "observedGeneration": g});
    route["status"] = json!({"parents": [{"parentRef": {"name": "public"},
        "conditions": [cond("Accepted", 2), cond("ResolvedRefs", 1)]}]});
    w.owned.push(route.clone());
    assert_eq!(
        condition(&w.plan(), "RoutingReady")["reason"],
        "AwaitingAcceptance"
    );
    route["status"]["parents"][0]["conditions"] =
        json!([cond("Accepted", 2), cond("ResolvedRefs", 2)]);
    w.owned.retain(|o| o["kind"] != "HTTPRoute");
    w.owned.push(route);
    let plan = w.plan();
    assert_eq!(condition(&plan, "RoutingReady")["status"], "True");
    assert_eq!(condition(&plan, "RoutingReady")["reason"], "Accepted");
}

// ---- application observation -------------------------------------------------

fn member(name: &str, ip: &str) -> Value {
    let mut p = pod(name, true);
    p["status"]["podIP"] = json!(ip);
    p["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "f-abc", "uid": "rs", "controller": true}]);
    p
}

fn observed(id: &str, body: &str, error: Option<&str>) -> wasmop_sdk::Observation {
    wasmop_sdk::Observation {
        id: id.to_owned(),
        status: if error.is_some() { None } else { Some(200) },
        body: body.to_owned(),
        error: error.map(str::to_owned),
        observed_at: NOW.to_owned(),
        age_ms: 1000,
        outcome: Some(if error.is_some() {
            wasmop_sdk::ObservationOutcome::Failed
        } else {
            wasmop_sdk::ObservationOutcome::Complete
        }),
    }
}

fn observing(bodies: &[(&str, Option<&str>)]) -> Plan {
    let mut fleet = bucket_fleet();
    fleet["spec"]["replicas"] = json!(bodies.len());
    let mut w = World::running(fleet, bodies.len() as i32);
    w.settings = json!({});
    w.pods.clear();
    for (i, (body, error)) in bodies.iter().enumerate() {
        let name = format!("f-abc-{i}");
        let ip = format!("10.0.0.{i}");
        w.pods.push(member(&name, &ip));
        w.observations
            .push(observed(&format!("state.pod-{name}.0-.{ip}"), body, *error));
    }
    w.plan()
}

fn app(version: &str, pending: i64) -> String {
    json!({"deployment": {"version": version, "prefix": "p/"}, "cells": {"pending": pending, "swapping": 0}})
        .to_string()
}

#[test]
fn application_observation_outcomes() {
    let plan = observing(&[(&app("v1", 0), None), (&app("v1", 0), None)]);
    assert_eq!(plan.http_requests.len(), 2);
    assert_eq!(plan.http_requests[0].port, 8081);
    assert_eq!(plan.http_requests[0].path, "/state");
    assert_eq!(plan.http_requests[0].timeout_ms, 10_000);
    assert_eq!(plan.http_requests[0].max_response_bytes, 1024 * 1024);
    assert_eq!(plan.http_requests[0].max_age_ms, 90_000);
    assert_eq!(
        condition(&plan, "ApplicationConverged")["reason"],
        "Converged"
    );
    assert_eq!(
        plan.status.as_ref().unwrap()["application"]["observedVersion"]["version"],
        "v1"
    );
    assert_eq!(plan.requeue_after_ms, Some(15_000));

    let plan = observing(&[(&app("v1", 0), None), (&app("v2", 0), None)]);
    assert_eq!(
        condition(&plan, "ApplicationConverged")["reason"],
        "MixedVersions"
    );
    let plan = observing(&[(&app("v1", 4), None), (&app("v1", 0), None)]);
    assert_eq!(
        condition(&plan, "ApplicationConverged")["reason"],
        "Converging"
    );
    for (body, error) in [
        (
            "",
            Some("response body exceeds the cap of 1048576 bytes and was cut at 1048576 bytes"),
        ),
        ("nope", None),
        ("{}", None),
        (
            r#"{"sampledAt":"2020-01-01T00:00:00Z","deployment":{"version":"v1","prefix":"p/"}}"#,
            None,
        ),
    ] {
        let plan = observing(&[(body, error), (&app("v1", 0), None)]);
        let c = condition(&plan, "ApplicationConverged");
        assert_eq!(c["status"], "Unknown", "{body}");
        assert_eq!(condition(&plan, "Ready")["status"], "True");
    }
}

#[test]
fn oversized_comes_from_the_hosts_typed_outcome_not_its_words() {
    use wasmop_sdk::ObservationOutcome as O;
    let reason_of = |error: &str, outcome: Option<O>| {
        let mut fleet = bucket_fleet();
        fleet["spec"]["replicas"] = json!(1);
        let mut w = World::running(fleet, 1);
        w.settings = json!({});
        w.pods = vec![member("f-abc-0", "10.0.0.0")];
        let mut o = observed("state.pod-f-abc-0.0-.10.0.0.0", "", Some(error));
        o.outcome = outcome;
        w.observations.push(o);
        let plan = w.plan();
        assert_eq!(
            condition(&plan, "ApplicationConverged")["status"],
            "Unknown"
        );
        plan.status.as_ref().unwrap()["application"]["nodes"][0]["reason"].clone()
    };
    // Typed Oversized, whatever the text says.
    assert_eq!(reason_of("too much", Some(O::Oversized)), "Oversized");
    // Words that used to mean "oversized" do not, without the outcome.
    let wordy = "connection reset after 12 bytes; cut short, larger than expected";
    assert_eq!(reason_of(wordy, Some(O::Failed)), "Unavailable");
    assert_eq!(reason_of(wordy, Some(O::TimedOut)), "Unavailable");
    // A host before typed outcomes: Unavailable.
    assert_eq!(reason_of(wordy, None), "Unavailable");
}

#[test]
fn an_observation_of_an_earlier_incarnation_does_not_count() {
    let mut w = World::running(bucket_fleet(), 1);
    w.settings = json!({});
    w.pods = vec![member("f-abc-0", "10.0.0.9")];
    w.observations.push(observed(
        "state.pod-f-abc-0.0-.10.0.0.1",
        &app("v1", 0),
        None,
    ));
    let plan = w.plan();
    assert_eq!(
        condition(&plan, "ApplicationConverged")["status"],
        "Unknown"
    );
    let nodes = plan.status.as_ref().unwrap()["application"]["nodes"].to_string();
    assert!(nodes.contains("MembershipChanged"), "{nodes}");
}

// ---- mesh ---------------------------------------------------------------------

fn meshed() -> Value {
    let mut f = bucket_fleet();
    f["spec"]["mesh"] = json!({"istio": {}});
    f
}

fn with_proxy(mut p: Value, native: bool) -> Value {
    let proxy = json!({"name": "istio-proxy", "image": "proxy", "restartPolicy": "Always"});
    if native {
        p["spec"]["initContainers"] = json!([proxy]);
    } else {
        p["spec"]["containers"] = json!([{"name": "celld", "image": "x"}, proxy]);
    }
    p
}

#[test]
fn mesh_join_keeps_permissive_until_every_member_has_a_proxy() {
    let mut w = World::running(meshed(), 2);
    let plan = w.plan();
    let template =
        &applied_named(&plan, "Deployment", "f").unwrap()["spec"]["template"]["metadata"];
    assert_eq!(template["labels"]["sidecar.istio.io/inject"], "true");
    assert_eq!(template["labels"]["celld.eric.dev/fleet"], "f");
    assert_eq!(
        template["annotations"]["sidecar.istio.io/nativeSidecar"],
        "true"
    );
    let np = applied_named(&plan, "NetworkPolicy", "f")
        .unwrap()
        .to_string();
    assert!(np.contains("15012") && np.contains("istio-system"), "{np}");
    let ap = applied_named(&plan, "AuthorizationPolicy", "f-mesh").expect("authorization policy");
    assert!(
        ap["spec"]["rules"][0].get("from").is_none(),
        "peer rule has no identity while permissive"
    );
    assert_eq!(
        ap["spec"]["rules"][1]["to"][0]["operation"]["ports"],
        json!(["8080"])
    );
    assert!(applied_named(&plan, "PeerAuthentication", "f-mesh").is_some());
    assert_eq!(condition(&plan, "Provisioned")["status"], "False");
    assert_eq!(
        plan.primary_patch.as_ref().unwrap()["metadata"]["annotations"]["celld.eric.dev/istio-control-plane"],
        "istio-system"
    );

    // One member with a native sidecar, one with a proxy container.
    w.pods = vec![
        with_proxy(pod("f-abc-0", true), true),
        with_proxy(pod("f-abc-1", true), false),
    ];
    let mut pa = routing_owned("PeerAuthentication", "security.istio.io/v1");
    pa["metadata"]["name"] = json!("f-mesh");
    w.owned.push(pa);
    let plan = w.plan();
    let ap = applied_named(&plan, "AuthorizationPolicy", "f-mesh").unwrap();
    assert_eq!(
        ap["spec"]["rules"][0]["from"][0]["source"]["principals"],
        json!(["*/ns/ns/sa/runtime", "*/ns/wasmop/sa/wasmop"])
    );
    assert!(applied_named(&plan, "PeerAuthentication", "f-mesh").is_none());
    assert_eq!(plan.delete.len(), 1);
    assert_eq!(plan.delete[0].target.kind, "PeerAuthentication");
}

#[test]
fn mesh_departure_waits_for_the_last_proxy() {
    let mut f = bucket_fleet();
    f["metadata"]["annotations"] = json!({"celld.eric.dev/istio-control-plane": "mesh-system"});
    let mut w = World::running(f, 2);
    w.pods[0] = with_proxy(w.pods[0].clone(), true);
    // The policy as the joined fleet left it: strict, no PeerAuthentication.
    let strict = {
        let mut w = World::running(meshed(), 2);
        w.pods = vec![
            with_proxy(pod("f-abc-0", true), true),
            with_proxy(pod("f-abc-1", true), true),
        ];
        applied_named(&w.plan(), "AuthorizationPolicy", "f-mesh")
            .unwrap()
            .clone()
    };
    assert!(strict["spec"]["rules"][0].get("from").is_some());
    let mut ap = routing_owned("AuthorizationPolicy", "security.istio.io/v1");
    ap["metadata"]["name"] = json!("f-mesh");
    ap["spec"] = strict["spec"].clone();
    w.owned.push(ap.clone());
    let plan = w.plan();
    let np = applied_named(&plan, "NetworkPolicy", "f")
        .unwrap()
        .to_string();
    assert!(np.contains("15012") && np.contains("mesh-system"), "{np}");
    assert!(plan.delete.is_empty());
    let template =
        &applied_named(&plan, "Deployment", "f").unwrap()["spec"]["template"]["metadata"];
    assert_eq!(template["labels"]["sidecar.istio.io/inject"], "false");
    // A member out of the mesh talks plaintext to one still in it: 8081
    // PERMISSIVE and the peer rule without identities until the last proxy.
    let pa = applied_named(&plan, "PeerAuthentication", "f-mesh").expect("peer authentication");
    assert_eq!(pa["spec"]["portLevelMtls"]["8081"]["mode"], "PERMISSIVE");
    let departing = applied_named(&plan, "AuthorizationPolicy", "f-mesh").expect("policy");
    assert_eq!(
        departing["spec"]["rules"][0],
        json!({"to": [{"operation": {"ports": ["8081"]}}]})
    );
    assert_eq!(
        departing["spec"]["rules"][1]["to"][0]["operation"]["ports"],
        json!(["8080"]),
        "8080 keeps the access it had"
    );

    // With `applicationAccess: Policies` before departure, 8080 stays closed.
    let mut closed = ap.clone();
    closed["spec"]["rules"] = json!([strict["spec"]["rules"][0].clone()]);
    let mut w2 = World::running(w.primary.clone(), 2);
    w2.pods[0] = with_proxy(w2.pods[0].clone(), false);
    w2.owned.push(closed);
    let plan = w2.plan();
    let rules = &applied_named(&plan, "AuthorizationPolicy", "f-mesh").unwrap()["spec"]["rules"];
    assert_eq!(
        rules,
        &json!([{"to": [{"operation": {"ports": ["8081"]}}]}])
    );
    assert!(applied_named(&plan, "PeerAuthentication", "f-mesh").is_some());

    w.pods[0] = pod("f-abc-0", true);
    let mut pa = routing_owned("PeerAuthentication", "security.istio.io/v1");
    pa["metadata"]["name"] = json!("f-mesh");
    w.owned.push(pa);
    let plan = w.plan();
    let np = applied_named(&plan, "NetworkPolicy", "f")
        .unwrap()
        .to_string();
    assert!(!np.contains("15012"), "{np}");
    assert!(applied_named(&plan, "AuthorizationPolicy", "f-mesh").is_none());
    assert!(applied_named(&plan, "PeerAuthentication", "f-mesh").is_none());
    let mut deleted: Vec<_> = plan.delete.iter().map(|d| d.target.kind.clone()).collect();
    deleted.sort();
    assert_eq!(deleted, ["AuthorizationPolicy", "PeerAuthentication"]);
}

/// The `sidecar.istio.io/inject` label of the workload's template in `plan`.
fn injection(plan: &Plan) -> &Value {
    &applied_named(plan, "Deployment", "f").expect("workload")["spec"]["template"]["metadata"]["labels"]
        ["sidecar.istio.io/inject"]
}

#[test]
fn a_departing_template_keeps_the_proxy_until_the_permissive_policy_is_seen() {
    // The joined fleet: every member proxied, the policy strict, no
    // PeerAuthentication, the workload's template asking for the proxy.
    let mut joined = World::running(meshed(), 2);
    joined.pods = vec![
        with_proxy(pod("f-abc-0", true), true),
        with_proxy(pod("f-abc-1", true), true),
    ];
    let strict = applied_named(&joined.plan(), "AuthorizationPolicy", "f-mesh")
        .unwrap()
        .clone();
    assert!(strict["spec"]["rules"][0].get("from").is_some());
    let meshed_workload = settled_workload(&meshed(), 2);
    assert_eq!(
        meshed_workload["spec"]["template"]["metadata"]["labels"]["sidecar.istio.io/inject"],
        "true"
    );

    // The user removes spec.mesh.
    let mut f = bucket_fleet();
    f["metadata"]["annotations"] = json!({"celld.eric.dev/istio-control-plane": "istio-system"});
    let mut w = World::running(f, 2);
    w.pods = joined.pods.clone();
    w.owned.retain(|o| o["kind"] != "Deployment");
    w.owned.push(meshed_workload.clone());
    let mut ap = routing_owned("AuthorizationPolicy", "security.istio.io/v1");
    ap["metadata"]["name"] = json!("f-mesh");
    ap["spec"] = strict["spec"].clone();
    w.owned.push(ap.clone());

    // First pass: the permissive objects are applied, the template is not
    // changed in the same plan (its write could land while theirs fails).
    let plan = w.plan();
    assert!(applied_named(&plan, "PeerAuthentication", "f-mesh").is_some());
    let departing = applied_named(&plan, "AuthorizationPolicy", "f-mesh")
        .unwrap()
        .clone();
    assert!(departing["spec"]["rules"][0].get("from").is_none());
    let held = applied_named(&plan, "Deployment", "f").expect("workload");
    assert_eq!(
        held["spec"]["template"], meshed_workload["spec"]["template"],
        "the template keeps the proxy"
    );
    assert_eq!(
        held["metadata"]["annotations"], meshed_workload["metadata"]["annotations"],
        "the template hash is the meshed one"
    );
    let progressing = condition(&plan, "Progressing");
    assert_eq!(progressing["status"], "True");
    assert!(
        progressing["message"]
            .as_str()
            .unwrap()
            .contains("permissive peer policy"),
        "{progressing}"
    );

    // Only the PeerAuthentication seen: still held.
    let mut pa = routing_owned("PeerAuthentication", "security.istio.io/v1");
    pa["metadata"]["name"] = json!("f-mesh");
    pa["spec"] = applied_named(&plan, "PeerAuthentication", "f-mesh").unwrap()["spec"].clone();
    w.owned.push(pa.clone());
    let plan = w.plan();
    assert_eq!(injection(&plan), "true");
    // A PeerAuthentication being deleted does not count as in place.
    let mut w_deleting = World::running(w.primary.clone(), 2);
    w_deleting.pods = w.pods.clone();
    w_deleting.owned.retain(|o| o["kind"] != "Deployment");
    w_deleting.owned.push(meshed_workload.clone());
    let mut open = ap.clone();
    open["spec"] = departing["spec"].clone();
    w_deleting.owned.push(open.clone());
    let mut pa_deleting = pa.clone();
    pa_deleting["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    w_deleting.owned.push(pa_deleting);
    assert_eq!(injection(&w_deleting.plan()), "true");

    // Both in place: the template drops the proxy.
    w.owned.retain(|o| o["kind"] != "AuthorizationPolicy");
    w.owned.push(open);
    let plan = w.plan();
    assert_eq!(injection(&plan), "false");

    // Once the template has left the mesh it is never put back, even if a
    // hand edit makes the policy strict again (the policy is re-applied).
    let mut left = World::running(w.primary.clone(), 2);
    left.pods = w.pods.clone();
    left.owned.push(ap);
    let plan = left.plan();
    assert_eq!(injection(&plan), "false");
    assert!(
        applied_named(&plan, "AuthorizationPolicy", "f-mesh").unwrap()["spec"]["rules"][0]
            .get("from")
            .is_none()
    );
}

#[test]
fn mesh_without_istio_crds_is_infrastructure_blocked() {
    let mut w = World::running(meshed(), 2);
    w.absent.push(crate::mesh::authorization_policy_kind());
    let plan = w.plan();
    assert_eq!(
        condition(&plan, "Blocked")["reason"],
        "InfrastructureBlocked"
    );
    assert!(plan.apply.is_empty());
}

#[test]
fn a_same_named_mesh_policy_of_another_owner_is_infrastructure_blocked() {
    for (read, kind) in [
        (crate::AUTHORIZATION_POLICIES_READ, "AuthorizationPolicy"),
        (crate::PEER_AUTHENTICATIONS_READ, "PeerAuthentication"),
    ] {
        let mut w = World::running(meshed(), 2);
        w.extra.push((
            read.to_owned(),
            json!({"apiVersion": "security.istio.io/v1", "kind": kind,
                   "metadata": {"name": "f-mesh", "namespace": "ns", "uid": "someone"}}),
        ));
        let plan = w.plan();
        let blocked = condition(&plan, "Blocked");
        assert_eq!(blocked["reason"], "InfrastructureBlocked");
        assert!(
            blocked["message"]
                .as_str()
                .is_some_and(|m| m.contains(kind) && m.contains("f-mesh")),
            "{blocked}"
        );
        assert!(plan.apply.is_empty());
        assert!(plan.delete.is_empty());
    }
    // The fleet's own policy, seen through the read, does not block.
    let mut w = World::running(meshed(), 2);
    let mut own = routing_owned("AuthorizationPolicy", "security.istio.io/v1");
    own["metadata"]["name"] = json!("f-mesh");
    w.extra
        .push((crate::AUTHORIZATION_POLICIES_READ.to_owned(), own));
    let plan = w.plan();
    assert_ne!(
        condition(&plan, "Blocked")["reason"],
        "InfrastructureBlocked"
    );
}

// ---- previews ----------------------------------------------------------------------

const POOL_UID: &str = "00000000-0000-0000-0000-0000000000aa";

fn pool_fleet() -> Value {
    let mut f = bucket_fleet();
    f["spec"]["previews"] = json!({
        "runtimeImage": IMAGE,
        "serviceAccountName": "preview-runtime",
        "zone": "us-east-1a",
        "storage": {"bucket": "shared-previews", "region": "us-east-1"},
        "routing": {"baseDomain": "previews.example.com",
                    "ingress": {"className": "nginx"},
                    "source": {"namespace": "ingress-nginx", "podLabels": {"app": "ingress"}}},
    });
    f
}

fn child_fleet(prefix: &str) -> Value {
    let mut f = bucket_fleet();
    f["spec"]["storage"]["bucket"] = json!("shared-previews");
    f["spec"]["storage"]["prefix"] = json!(prefix);
    f["spec"]["storage"]["previewFleetRef"] = json!({"name": "development", "uid": POOL_UID});
    f
}

/// The preview bucket's reservation as the pool `uid` made it.
fn pool_reservation(uid: &str) -> Value {
    let mut pool = pool_fleet();
    pool["metadata"]["uid"] = json!(uid);
    pool["metadata"]["name"] = json!("development");
    match crate::previews::pool(&typed(&pool), None) {
        Some(crate::previews::Pool::Reserve { object }) => object,
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_pool_reserves_its_preview_bucket_without_touching_its_runtime() {
    let w = World::running(pool_fleet(), 3);
    let plan = w.plan();
    let name = crate::names::reservation_name("shared-previews");
    let r = applied_named(&plan, "CelldStorageReservation", &name).expect("preview reservation");
    assert_eq!(r["spec"]["bucket"], "shared-previews");
    assert_eq!(r["spec"]["fleetUID"], UID);
    assert_eq!(
        r["metadata"]["annotations"]["celld.eric.dev/preview-pool"],
        "true"
    );
    let op = plan
        .apply
        .iter()
        .find(|a| a.object["metadata"]["name"] == name.as_str())
        .unwrap();
    assert_eq!(op.precondition, Some(wasmop_sdk::Precondition::Absent));
    assert_eq!(condition(&plan, "PreviewsReady")["status"], "Unknown");
    // The runtime is as without previews: previews are not in its hash.
    let plain = World::running(bucket_fleet(), 3).plan();
    assert_eq!(workload_of(&plan), workload_of(&plain));
    assert_eq!(condition(&plan, "Blocked")["status"], "False");

    // Reserved: True, nothing more applied.
    let mut w = World::running(pool_fleet(), 3);
    w.reservations.push(pool_reservation(UID));
    let plan = w.plan();
    assert!(applied_named(&plan, "CelldStorageReservation", &name).is_none());
    assert_eq!(condition(&plan, "PreviewsReady")["reason"], "Reserved");

    // Held by another fleet: PreviewsReady False, the runtime still runs.
    let mut w = World::running(pool_fleet(), 3);
    w.reservations.push(pool_reservation("someone-else"));
    let plan = w.plan();
    let c = condition(&plan, "PreviewsReady");
    assert_eq!(c["status"], "False");
    assert_eq!(c["reason"], "StorageScopeConflict");
    assert_eq!(condition(&plan, "Blocked")["status"], "False");
    assert!(workload_of(&plan).is_some());
}

#[test]
fn a_preview_fleet_reserves_a_prefix_of_its_pools_bucket() {
    // First reconcile: the pool holds the bucket; the child reserves its prefix.
    let mut w = World::new(child_fleet("pr-1"));
    w.reservations.push(pool_reservation(POOL_UID));
    let plan = w.plan();
    let own = crate::names::reservation_name("shared-previews/pr-1");
    let r = applied_named(&plan, "CelldStorageReservation", &own).expect("prefix reservation");
    assert_eq!(r["spec"]["prefix"], "pr-1");
    assert_eq!(r["spec"]["bucket"], "shared-previews");
    assert_eq!(r["spec"]["fleetUID"], UID);
    assert!(
        r["metadata"]["annotations"].is_null(),
        "a preview fleet gets no tuning record: {r}"
    );
    assert!(workload_of(&plan).is_none(), "the reservation comes first");

    // Bound: the workload runs in s3://shared-previews/pr-1.
    let mut w = World::running(child_fleet("pr-1"), 3);
    w.reservations.push(pool_reservation(POOL_UID));
    let plan = w.plan();
    assert_eq!(condition(&plan, "Blocked")["status"], "False");
    let workload = workload_of(&plan).expect("workload").to_string();
    assert!(workload.contains("s3://shared-previews/pr-1"), "{workload}");
}

#[test]
fn a_preview_fleet_without_its_pool_or_with_a_held_prefix_is_blocked() {
    let blocked_with = |w: &World, text: &str| {
        let plan = w.plan();
        let c = condition(&plan, "Blocked");
        assert_eq!(c["reason"], "StorageScopeConflict", "{c}");
        assert!(
            c["message"].as_str().is_some_and(|m| m.contains(text)),
            "{c}"
        );
        assert!(plan.apply.is_empty(), "nothing is created");
    };
    // No pool reservation yet.
    let w = World::new(child_fleet("pr-1"));
    blocked_with(&w, "is not reserved by preview pool development");
    // The bucket is another fleet's runtime bucket.
    let mut w = World::new(child_fleet("pr-1"));
    let mut runtime = pool_reservation(POOL_UID);
    runtime["metadata"]["annotations"] = json!({});
    w.reservations.push(runtime);
    blocked_with(&w, "for its runtime");
    // Another pool holds it.
    let mut w = World::new(child_fleet("pr-1"));
    w.reservations.push(pool_reservation("another-pool"));
    blocked_with(&w, "that storage.previewFleetRef names");
    // Another child holds the prefix: prefixes are disjoint.
    let mut w = World::new(child_fleet("pr-1"));
    w.reservations.push(pool_reservation(POOL_UID));
    let mut other = child_fleet("pr-1");
    other["metadata"]["uid"] = json!("other-child");
    w.reservations.push(reservation_of(&other));
    blocked_with(&w, "prefix pr-1 of bucket shared-previews");
    // A different prefix is free.
    let mut w = World::new(child_fleet("pr-2"));
    w.reservations.push(pool_reservation(POOL_UID));
    w.reservations.push(reservation_of(&other));
    let plan = w.plan();
    assert_eq!(condition(&plan, "Blocked")["status"], "False");
}

#[test]
fn a_same_named_route_of_another_owner_is_a_route_conflict_and_left_alone() {
    for (routing, read, kind, api) in [
        (
            gateway_routing(),
            crate::HTTP_ROUTES_READ,
            "HTTPRoute",
            "gateway.networking.k8s.io/v1",
        ),
        (
            ingress_routing(),
            crate::INGRESSES_READ,
            "Ingress",
            "networking.k8s.io/v1",
        ),
    ] {
        let mut w = World::running(with_routing(routing), 3);
        w.extra.push((
            read.to_owned(),
            json!({"apiVersion": api, "kind": kind,
                   "metadata": {"name": "f-routing", "namespace": "ns", "uid": "theirs"}}),
        ));
        let plan = w.plan();
        let c = condition(&plan, "RoutingReady");
        assert_eq!(c["reason"], "RouteConflict", "{c}");
        assert!(
            c["message"].as_str().is_some_and(|m| m.contains(kind)),
            "{c}"
        );
        assert!(applied_named(&plan, kind, "f-routing").is_none());
        assert!(plan.delete.is_empty());
        assert!(workload_of(&plan).is_some(), "the runtime is not held");
    }
}

// ---- paths without a test before ---------------------------------------------------

fn env_value<'w>(workload: &'w Value, name: &str) -> &'w Value {
    &env_of(workload, name)["value"]
}

#[test]
fn a_preview_fleet_with_a_custom_endpoint_and_scratch_size() {
    let mut child = child_fleet("pr-1");
    child["spec"]["storage"]["endpoint"] = json!({
        "url": "http://minio.storage.svc:9000",
        "credentialsSecretName": "minio-creds",
        "egress": {"podLabels": {"app": "minio"}, "namespace": "storage"},
    });
    child["spec"]["storage"]["scratch"] = json!({"request": "2Gi", "limit": "3Gi"});
    let mut w = World::running(child, 2);
    w.reservations.push(pool_reservation(POOL_UID));
    let plan = w.plan();
    assert_eq!(condition(&plan, "Blocked")["status"], "False");
    let d = workload_of(&plan).expect("workload");
    assert_eq!(env_value(d, "S3_ENDPOINT"), "http://minio.storage.svc:9000");
    assert_eq!(env_value(d, "AWS_ALLOW_HTTP"), "true");
    // Credentials are references, never values.
    assert_eq!(
        env_of(d, "AWS_ACCESS_KEY_ID")["valueFrom"]["secretKeyRef"],
        json!({"name": "minio-creds", "key": "accessKeyId"})
    );
    assert_eq!(
        env_of(d, "AWS_SECRET_ACCESS_KEY")["valueFrom"]["secretKeyRef"],
        json!({"name": "minio-creds", "key": "secretAccessKey"})
    );
    // Scratch: the request and limit of ephemeral storage, the emptyDir's size.
    let pod = &d["spec"]["template"]["spec"];
    let resources = &pod["containers"][0]["resources"];
    assert_eq!(resources["requests"]["ephemeral-storage"], "2Gi");
    assert_eq!(resources["limits"]["ephemeral-storage"], "3Gi");
    let data = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "data")
        .unwrap();
    assert_eq!(data["emptyDir"]["sizeLimit"], "3Gi");
    // One scoped egress rule to the endpoint's Pods on its port.
    let np = applied_named(&plan, "NetworkPolicy", "f").unwrap();
    let rule = np["spec"]["egress"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["ports"] == json!([{"protocol": "TCP", "port": 9000}]))
        .expect("endpoint egress rule");
    assert_eq!(rule["to"][0]["podSelector"]["matchLabels"]["app"], "minio");
    assert_eq!(
        rule["to"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
        "storage"
    );
    // The prefix reservation records the endpoint.
    let mut first = World::new(w.primary.clone());
    first.reservations.push(pool_reservation(POOL_UID));
    let plan = first.plan();
    let own = crate::names::reservation_name("shared-previews/pr-1");
    let r = applied_named(&plan, "CelldStorageReservation", &own).unwrap();
    assert_eq!(r["spec"]["endpoint"], "http://minio.storage.svc:9000");

    // Without scratch, a Bucket member's scratch is sizeGiB (10 by default).
    let plan = World::running(bucket_fleet(), 1).plan();
    let d = workload_of(&plan).unwrap();
    let resources = &d["spec"]["template"]["spec"]["containers"][0]["resources"];
    assert_eq!(resources["requests"]["ephemeral-storage"], "10Gi");
    assert!(!env_names(d).contains(&"S3_ENDPOINT".to_owned()));
}

#[test]
fn ingress_tls_names_the_secret_for_every_hostname() {
    let mut routing = ingress_routing();
    routing["hostnames"] = json!(["a.example.com", "b.example.com"]);
    routing["ingress"]["tlsSecretName"] = json!("app-tls");
    let plan = World::running(with_routing(routing), 3).plan();
    let ingress = applied_named(&plan, "Ingress", "f-routing").expect("ingress");
    assert_eq!(
        ingress["spec"]["tls"],
        json!([{"hosts": ["a.example.com", "b.example.com"], "secretName": "app-tls"}])
    );
    // Without it, no tls section.
    let plan = World::running(with_routing(ingress_routing()), 3).plan();
    let ingress = applied_named(&plan, "Ingress", "f-routing").unwrap();
    assert!(ingress["spec"].get("tls").is_none(), "{ingress}");
}

#[test]
fn invalid_routing_stored_past_admission_is_routing_ready_false_and_runtime_goes_on() {
    let mut bad = ingress_routing();
    bad["ingress"]["annotations"] = json!({"celld.eric.dev/x": "y"});
    let mut w = World::running(with_routing(bad), 3);
    // The route an earlier, valid spec made.
    let mut existing = routing_owned("Ingress", "networking.k8s.io/v1");
    existing["spec"] = json!({"ingressClassName": "nginx"});
    w.owned.push(existing);
    let plan = w.plan();
    let c = condition(&plan, "RoutingReady");
    assert_eq!(c["status"], "False");
    assert_eq!(c["reason"], "InvalidConfiguration");
    let message = c["message"].as_str().unwrap();
    assert!(
        message.contains("celld.eric.dev/x is reserved") && message.contains("kept"),
        "{message}"
    );
    assert!(applied_named(&plan, "Ingress", "f-routing").is_none());
    assert!(plan.delete.is_empty(), "the existing route is kept");
    // Runtime operations are not blocked.
    assert_eq!(condition(&plan, "Blocked")["status"], "False");
    assert_eq!(condition(&plan, "Ready")["status"], "True");
    assert!(workload_of(&plan).is_some());

    // Neither gateway nor ingress, no hostnames.
    let plan = World::running(
        with_routing(
            json!({"hostnames": [], "source": {"namespace": "edge", "podLabels": {"app": "gw"}}}),
        ),
        3,
    )
    .plan();
    let message = condition(&plan, "RoutingReady")["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        message.contains("at least one host")
            && message.contains("exactly one of gateway or ingress"),
        "{message}"
    );
}

#[test]
fn routing_and_mesh_policies_close_when_deletion_starts() {
    let mut primary = with_routing(ingress_routing());
    primary["spec"]["mesh"] = json!({"istio": {}});
    let mut w = World::running(primary, 2);
    w.owned
        .push(routing_owned("Ingress", "networking.k8s.io/v1"));
    let mut policy = routing_owned("NetworkPolicy", "networking.k8s.io/v1");
    policy["metadata"]["uid"] = json!("routing-np-uid");
    w.owned.push(policy);
    let mut ap = routing_owned("AuthorizationPolicy", "security.istio.io/v1");
    ap["metadata"]["name"] = json!("f-mesh");
    w.owned.push(ap);
    w.deleting = true;
    let plan = w.plan();
    let deleted: Vec<(String, String)> = plan
        .delete
        .iter()
        .map(|d| (d.target.kind.clone(), d.target.name.clone()))
        .collect();
    for (kind, name) in [
        ("Deployment", "f"),
        ("Ingress", "f-routing"),
        ("NetworkPolicy", "f-routing"),
        ("AuthorizationPolicy", "f-mesh"),
    ] {
        assert!(
            deleted.contains(&(kind.to_owned(), name.to_owned())),
            "{kind} {name} not in the first deletion plan: {deleted:?}"
        );
    }
    // Runtime shutdown is not delayed: the workload goes in the same plan.
    assert!(!plan.cleanup_complete);
    assert!(
        plan.apply.is_empty(),
        "nothing is applied once deletion starts"
    );
}

#[test]
fn application_access_policies_leaves_8080_to_the_users_policies() {
    let mut primary = meshed();
    primary["spec"]["mesh"]["istio"] = json!({"applicationAccess": "Policies"});
    let plan = World::running(primary, 2).plan();
    let ap = applied_named(&plan, "AuthorizationPolicy", "f-mesh").unwrap();
    let rules = ap["spec"]["rules"].as_array().unwrap();
    assert_eq!(rules.len(), 1, "only the peer rule: {ap}");
    assert_eq!(rules[0]["to"][0]["operation"]["ports"], json!(["8081"]));
    // AllowAll (the default) adds 8080 from anyone.
    let plan = World::running(meshed(), 2).plan();
    let ap = applied_named(&plan, "AuthorizationPolicy", "f-mesh").unwrap();
    assert_eq!(
        ap["spec"]["rules"][1],
        json!({"to": [{"operation": {"ports": ["8080"]}}]})
    );
}

#[test]
fn the_eks_pod_identity_agent_bypasses_the_proxy_and_is_reachable() {
    let plan = World::running(meshed(), 2).plan();
    let d = workload_of(&plan).unwrap();
    assert_eq!(
        d["spec"]["template"]["metadata"]["annotations"]["traffic.sidecar.istio.io/excludeOutboundIPRanges"],
        "169.254.170.23/32"
    );
    let np = applied_named(&plan, "NetworkPolicy", "f").unwrap();
    assert!(
        np["spec"]["egress"]
            .as_array()
            .unwrap()
            .contains(&json!({"to": [{"ipBlock": {"cidr": "169.254.170.23/32"}}],
                    "ports": [{"protocol": "TCP", "port": 80}]})),
        "{np}"
    );
    // Without the mesh there is no proxy to bypass.
    let plan = World::running(bucket_fleet(), 2).plan();
    let d = workload_of(&plan).unwrap();
    assert!(
        d["spec"]["template"]["metadata"]["annotations"]
            .get("traffic.sidecar.istio.io/excludeOutboundIPRanges")
            .is_none()
    );
}

#[test]
fn persistent_fleet_and_runtime_image_changes_roll_one_member_at_a_time() {
    let image = "ghcr.io/ewhauser/celld@sha256:1111111111111111111111111111111111111111111111111111111111111111";
    for primary in [bucket_fleet(), persistent_fleet()] {
        let stateful = typed(&primary).spec.stateful();
        let mut w = World::running(primary.clone(), 3);
        if stateful {
            w.claims = (0..3)
                .map(|i| claim(&format!("data-f-{i}"), "Bound"))
                .collect();
        }
        let mut changed = primary.clone();
        changed["metadata"]["generation"] = json!(2);
        changed["spec"]["runtimeImage"] = json!(image);
        w.primary = changed;
        let plan = w.plan();
        let d = workload_of(&plan).unwrap();
        assert_eq!(
            d["spec"]["template"]["spec"]["containers"][0]["image"],
            image
        );
        if stateful {
            assert_eq!(d["kind"], "StatefulSet");
            assert_eq!(d["spec"]["updateStrategy"]["type"], "RollingUpdate");
            assert_eq!(d["spec"]["updateStrategy"]["rollingUpdate"]["partition"], 0);
            assert_eq!(d["spec"]["podManagementPolicy"], "Parallel");
        } else {
            assert_eq!(d["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"], 1);
            assert_eq!(d["spec"]["strategy"]["rollingUpdate"]["maxSurge"], 0);
        }
        assert_eq!(d["spec"]["replicas"], 3, "a roll does not change replicas");
        assert_eq!(condition(&plan, "Progressing")["reason"], "RollingUpdate");
        assert_eq!(condition(&plan, "Provisioned")["status"], "False");
        // The image is not a fixed field: no blocker, the reservation holds.
        assert_eq!(condition(&plan, "Blocked")["status"], "False");
        assert!(applied(&plan, "CelldStorageReservation").len() <= 1);
        // The PodDisruptionBudget keeps one member down at most.
        let pdb = applied_named(&plan, "PodDisruptionBudget", "f").unwrap();
        assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    }
}
