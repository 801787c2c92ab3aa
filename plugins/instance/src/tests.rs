//! Whole-plugin behaviour, run natively through the SDK's
//! `testing::run` (the same conversions the component applies).

use serde_json::{Value, json};
use wasmop_sdk::testing::{SnapshotBuilder, run};
use wasmop_sdk::{EventType, Plan, ReconcileError, Snapshot};

use crate::InstancePlugin;
use crate::names::CONFIG_HASH_ANNOTATION;

const UID: &str = "4b1d5c0e-0000-4000-8000-000000000001";
const ID: &str = "01JGFJJZ00ABCDEFGHJKMNPQRS";

fn instance(spec: Value) -> Value {
    json!({
        "apiVersion": "compute.firebolt.io/v1alpha1",
        "kind": "FireboltInstance",
        "metadata": {"name": "fb", "namespace": "ns", "uid": UID, "generation": 1},
        "spec": spec,
    })
}

fn with_status(mut primary: Value, status: Value) -> Value {
    primary["status"] = status;
    primary
}

fn basic() -> Value {
    instance(json!({"id": ID, "metadata": {}, "gateway": {}}))
}

fn snapshot(primary: Value, owned: Vec<Value>) -> Snapshot {
    owned
        .into_iter()
        .fold(SnapshotBuilder::new("instance").primary(primary), |b, o| {
            b.owned(o)
        })
        .now("2025-01-01T00:00:00Z")
        .build()
}

fn plan(primary: Value, owned: Vec<Value>) -> Plan {
    run::<InstancePlugin>(&snapshot(primary, owned)).expect("a plan")
}

/// An object as the snapshot would show it: identity, labels, and `rest`
/// merged in.
fn observed(api_version: &str, kind: &str, name: &str, component: &str, rest: Value) -> Value {
    let mut o = json!({
        "apiVersion": api_version, "kind": kind,
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{kind}-{name}"),
                     "resourceVersion": "7",
                     "labels": {"firebolt.io/instance": "fb", "firebolt.io/component": component}},
    });
    if let (Some(o), Some(rest)) = (o.as_object_mut(), rest.as_object()) {
        for (k, v) in rest {
            o.insert(k.clone(), v.clone());
        }
    }
    o
}

fn postgres_sts(ready: i32) -> Value {
    observed(
        "apps/v1",
        "StatefulSet",
        "fb-metadata-pg",
        "postgres",
        json!({"spec": {"selector": {}, "template": {},
                        "volumeClaimTemplates": [{"metadata": {"name": "data"},
                            "spec": {"accessModes": ["ReadWriteOnce"],
                                     "resources": {"requests": {"storage": "3Gi"}}}}]},
               "status": {"replicas": 1, "readyReplicas": ready}}),
    )
}

fn deployment(name: &str, component: &str, available: i32) -> Value {
    observed(
        "apps/v1",
        "Deployment",
        name,
        component,
        json!({"spec": {"selector": {}, "template": {}},
               "status": {"availableReplicas": available}}),
    )
}

fn credentials() -> Value {
    observed(
        "v1",
        "Secret",
        "fb-metadata-postgres-creds",
        "postgres",
        json!({"data": {"username": "Zmlp", "password": "c2VjcmV0"}}),
    )
}

fn everything_ready() -> Vec<Value> {
    vec![
        credentials(),
        postgres_sts(1),
        deployment("fb-metadata", "metadata", 1),
        deployment("fb-gateway", "gateway", 2),
    ]
}

fn applied<'a>(plan: &'a Plan, kind: &str, name: &str) -> Option<&'a Value> {
    plan.apply
        .iter()
        .map(|op| &op.object)
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
}

fn applied_names(plan: &Plan) -> Vec<String> {
    plan.apply
        .iter()
        .map(|op| {
            format!(
                "{}/{}",
                op.object["kind"].as_str().unwrap(),
                op.object["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect()
}

fn condition<'a>(plan: &'a Plan, type_: &str) -> &'a Value {
    plan.status.as_ref().unwrap()["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == type_)
        .unwrap_or_else(|| panic!("no {type_} condition in {:?}", plan.status))
}

fn template_hash(plan: &Plan, kind: &str, name: &str) -> String {
    applied(plan, kind, name).unwrap()["spec"]["template"]["metadata"]["annotations"]
        [CONFIG_HASH_ANNOTATION]
        .as_str()
        .unwrap()
        .to_owned()
}

fn warnings(plan: &Plan) -> Vec<&str> {
    plan.events
        .iter()
        .filter(|e| e.event_type == EventType::Warning)
        .map(|e| e.reason.as_str())
        .collect()
}

#[test]
fn fresh_instance_gets_an_id_and_every_component() {
    let p = plan(instance(json!({"metadata": {}, "gateway": {}})), vec![]);
    let id = p.primary_patch.as_ref().unwrap()["spec"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(id.len(), 26);
    assert!(
        id.starts_with("01JGFJJZ00"),
        "timestamp part is the snapshot time: {id}"
    );
    assert_eq!(p.events[0].reason, "IdGenerated");
    assert_eq!(
        applied_names(&p),
        [
            "Secret/fb-metadata-postgres-creds",
            "Service/fb-metadata-pg",
            "StatefulSet/fb-metadata-pg",
            "ConfigMap/fb-metadata-config",
            "Service/fb-metadata",
            "Deployment/fb-metadata",
            "ConfigMap/fb-gateway-config",
            "Service/fb-gateway",
            "Deployment/fb-gateway",
            "PodDisruptionBudget/fb-gateway",
        ]
    );
    assert!(p.apply.iter().all(|op| op.precondition.is_none()));
    // The config written in the same plan already uses the new ID.
    let config = applied(&p, "ConfigMap", "fb-metadata-config").unwrap()["data"]["config.xml"]
        .as_str()
        .unwrap();
    assert!(
        config.contains(&format!("<account_id>{id}</account_id>")),
        "{config}"
    );

    let status = p.status.as_ref().unwrap();
    assert_eq!(status["phase"], "Provisioning");
    assert_eq!(status["metadataReady"], false);
    assert!(status.get("metadataEndpoint").is_none());
    assert!(status.get("gatewayEndpoint").is_none());
    assert_eq!(condition(&p, "PostgresReady")["reason"], "Provisioning");
    assert_eq!(condition(&p, "Ready")["status"], "False");
    assert_eq!(condition(&p, "AuthReady")["reason"], "Disabled");
    assert_eq!(condition(&p, "AuthReady")["status"], "True");
    assert!(p.delete.is_empty());
}

#[test]
fn the_same_snapshot_gives_the_same_plan() {
    let fresh = instance(json!({"metadata": {}, "gateway": {}}));
    assert_eq!(plan(fresh.clone(), vec![]), plan(fresh, vec![]));
    assert_eq!(
        plan(basic(), everything_ready()),
        plan(basic(), everything_ready())
    );
}

#[test]
fn an_id_once_set_is_never_patched_again() {
    let p = plan(basic(), vec![]);
    assert_eq!(p.primary_patch, None);
    assert!(p.events.iter().all(|e| e.reason != "IdGenerated"));
    let config = applied(&p, "ConfigMap", "fb-metadata-config").unwrap()["data"]["config.xml"]
        .as_str()
        .unwrap();
    assert!(config.contains(&format!("<account_id>{ID}</account_id>")));
}

#[test]
fn the_postgres_password_is_generated_by_the_host_and_never_in_the_plan() {
    for owned in [vec![], vec![credentials()]] {
        let p = plan(basic(), owned);
        let op = p
            .apply
            .iter()
            .find(|op| op.object["metadata"]["name"] == "fb-metadata-postgres-creds")
            .expect("the Secret is applied on every pass");
        // Only the key's name: the host makes the value once.
        assert_eq!(
            serde_json::to_value(&op.generate).unwrap(),
            json!([{"key": "password", "bytes": 24, "encoding": "hex"}])
        );
        assert_eq!(op.object["data"], json!({"username": "ZmlyZWJvbHQ="}));
        assert!(op.object.get("stringData").is_none());
        let text = serde_json::to_string(&p).unwrap();
        assert!(
            !text.contains("c2VjcmV0"),
            "no value of the Secret in the plan"
        );
        assert!(
            p.delete.is_empty(),
            "an existing Secret is wanted, not pruned"
        );
    }
    // Plugins have no randomness: two instances' plans differ only by name.
    let other = {
        let mut i = basic();
        i["metadata"]["uid"] = json!("another-uid");
        plan(i, vec![])
    };
    let secret = |p: &Plan| {
        p.apply
            .iter()
            .find(|op| op.object["kind"] == "Secret")
            .unwrap()
            .clone()
    };
    assert_eq!(secret(&plan(basic(), vec![])), secret(&other));
}

#[test]
fn postgres_ready_but_metadata_not_publishes_no_endpoint() {
    let p = plan(
        basic(),
        vec![
            credentials(),
            postgres_sts(1),
            deployment("fb-metadata", "metadata", 0),
        ],
    );
    assert_eq!(condition(&p, "PostgresReady")["status"], "True");
    assert_eq!(condition(&p, "MetadataReady")["status"], "False");
    assert_eq!(condition(&p, "MetadataReady")["reason"], "Provisioning");
    let ready = condition(&p, "Ready");
    assert_eq!(ready["status"], "False");
    assert_eq!(ready["reason"], "Provisioning");
    assert!(
        ready["message"]
            .as_str()
            .unwrap()
            .starts_with("MetadataReady: ")
    );
    let status = p.status.as_ref().unwrap();
    assert_eq!(status["metadataReady"], false);
    assert!(status.get("metadataEndpoint").is_none());
}

#[test]
fn everything_ready_publishes_the_endpoints() {
    let p = plan(basic(), everything_ready());
    let status = p.status.as_ref().unwrap();
    assert_eq!(status["phase"], "Ready");
    assert_eq!(
        status["metadataEndpoint"],
        "fb-metadata.ns.svc.cluster.local:7000"
    );
    assert_eq!(status["gatewayEndpoint"], "fb-gateway.ns.svc.cluster.local");
    assert_eq!(condition(&p, "Ready")["reason"], "AllComponentsReady");
    for c in [
        "PostgresReady",
        "MetadataReady",
        "GatewayReady",
        "EngineTLSReady",
    ] {
        assert_eq!(condition(&p, c)["status"], "True", "{c}");
    }
    assert!(p.events.iter().any(|e| e.reason == "InstanceReady"));
    assert_eq!(
        p.requeue_after_ms, None,
        "owned-object changes trigger reconciles"
    );
}

#[test]
fn losing_the_metadata_service_degrades_and_withdraws_the_endpoint() {
    let ready_plan = plan(basic(), everything_ready());
    let was_ready = with_status(basic(), ready_plan.status.unwrap());
    let mut owned = everything_ready();
    owned[2] = deployment("fb-metadata", "metadata", 0);
    let p = plan(was_ready, owned);
    let status = p.status.as_ref().unwrap();
    assert_eq!(status["phase"], "Degraded");
    assert!(status.get("metadataEndpoint").is_none());
    assert_eq!(status["gatewayEndpoint"], "fb-gateway.ns.svc.cluster.local");
    assert_eq!(warnings(&p), ["InstanceNotReady"]);
}

#[test]
fn condition_transition_times_move_only_on_status_changes() {
    let earlier = with_status(
        basic(),
        json!({"conditions": [
            {"type": "PostgresReady", "status": "True", "reason": "Ready", "message": "old",
             "lastTransitionTime": "2024-06-01T00:00:00Z"},
            {"type": "MetadataReady", "status": "True", "reason": "Ready", "message": "old",
             "lastTransitionTime": "2024-06-01T00:00:00Z"},
            {"type": "Reconciled", "status": "True", "reason": "Reconciled", "message": "host",
             "lastTransitionTime": "2024-06-01T00:00:00Z"},
        ]}),
    );
    let mut owned = everything_ready();
    owned[2] = deployment("fb-metadata", "metadata", 0);
    let p = plan(earlier, owned);
    assert_eq!(
        condition(&p, "PostgresReady")["lastTransitionTime"],
        "2024-06-01T00:00:00Z"
    );
    assert_eq!(
        condition(&p, "MetadataReady")["lastTransitionTime"],
        "2025-01-01T00:00:00Z"
    );
    assert_eq!(
        condition(&p, "Reconciled")["message"],
        "host",
        "others' conditions are kept"
    );
    assert_eq!(condition(&p, "PostgresReady")["observedGeneration"], 1);
}

#[test]
fn external_postgres_with_a_missing_secret_is_reported_and_nothing_else_stops() {
    let external = instance(json!({
        "id": ID, "gateway": {},
        "metadata": {"postgres": {"host": "pg.example", "database": "meta",
                                  "credentialsSecretRef": {"name": "pg-creds"}}},
    }));
    let p = plan(external.clone(), vec![]);
    let c = condition(&p, "PostgresReady");
    assert_eq!(
        (c["status"].as_str(), c["reason"].as_str()),
        (Some("False"), Some("PostgresSecretPreflightFailed"))
    );
    assert!(c["message"].as_str().unwrap().contains(
        "\"pg-creds\" named by spec.metadata.postgres.credentialsSecretRef does not exist"
    ));
    assert_eq!(warnings(&p), ["PostgresSecretPreflightFailed"]);
    // Nothing is invented for the external database ...
    assert!(applied(&p, "Secret", "pg-creds").is_none());
    assert!(applied(&p, "Secret", "fb-metadata-postgres-creds").is_none());
    assert!(applied(&p, "StatefulSet", "fb-metadata-pg").is_none());
    // ... and the other components go ahead, pointed at it.
    let config = applied(&p, "ConfigMap", "fb-metadata-config").unwrap()["data"]["config.xml"]
        .as_str()
        .unwrap();
    assert!(
        config.contains("<host>pg.example</host>") && config.contains("<database>meta</database>")
    );
    let deploy = applied(&p, "Deployment", "fb-metadata").unwrap();
    assert_eq!(
        deploy["spec"]["template"]["spec"]["volumes"][1]["secret"]["secretName"],
        "pg-creds"
    );
    assert!(applied(&p, "Deployment", "fb-gateway").is_some());

    // Already reported: no second Warning.
    let again = plan(with_status(external, p.status.clone().unwrap()), vec![]);
    assert!(warnings(&again).is_empty(), "{:?}", again.events);
}

fn secret_read(data: Value) -> Snapshot {
    SnapshotBuilder::new("instance")
        .primary(instance(json!({
            "id": ID, "gateway": {},
            "metadata": {"postgres": {"host": "pg", "database": "meta",
                                      "credentialsSecretRef": {"name": "pg-creds"}}},
        })))
        .related(
            "postgres-credentials",
            json!({"apiVersion": "v1", "kind": "Secret",
                   "metadata": {"name": "pg-creds", "namespace": "ns"}, "data": data}),
        )
        .build()
}

#[test]
fn external_postgres_secret_needs_both_keys() {
    let p = run::<InstancePlugin>(&secret_read(json!({"username": "dQ=="}))).unwrap();
    let c = condition(&p, "PostgresReady");
    assert_eq!(c["reason"], "PostgresSecretPreflightFailed");
    assert!(
        c["message"]
            .as_str()
            .unwrap()
            .contains("no non-empty key \"password\"")
    );

    let p = run::<InstancePlugin>(&secret_read(
        json!({"username": "dQ==", "password": "cA=="}),
    ))
    .unwrap();
    let c = condition(&p, "PostgresReady");
    assert_eq!(
        (c["status"].as_str(), c["reason"].as_str()),
        (Some("True"), Some("Ready"))
    );
    assert!(c["message"].as_str().unwrap().contains("pg:5432/meta"));
}

#[test]
fn a_rejected_gateway_template_fails_only_the_gateway() {
    let bad = instance(json!({
        "id": ID, "metadata": {},
        "gateway": {"template": {"spec": {"containers": [{"name": "envoy", "command": ["sh"]}]}}},
    }));
    let mut owned = everything_ready();
    owned.push(observed(
        "v1",
        "ConfigMap",
        "fb-gateway-config",
        "gateway",
        json!({}),
    ));
    let p = plan(bad, owned);
    let c = condition(&p, "GatewayReady");
    assert_eq!(
        (c["status"].as_str(), c["reason"].as_str()),
        (Some("False"), Some("TemplateRejected"))
    );
    assert!(c["message"].as_str().unwrap().contains("sets command"));
    assert_eq!(p.status.as_ref().unwrap()["phase"], "Failed");
    assert!(p.status.as_ref().unwrap().get("gatewayEndpoint").is_none());
    // The gateway's objects are neither written nor pruned ...
    assert!(
        applied_names(&p).iter().all(|n| !n.contains("gateway")),
        "{:?}",
        applied_names(&p)
    );
    assert!(p.delete.is_empty());
    // ... while the other components are reconciled and stay ready.
    assert!(applied(&p, "Deployment", "fb-metadata").is_some());
    assert_eq!(condition(&p, "MetadataReady")["status"], "True");
    assert_eq!(
        p.status.as_ref().unwrap()["metadataEndpoint"],
        "fb-metadata.ns.svc.cluster.local:7000"
    );
    assert_eq!(warnings(&p), ["TemplateRejected"]);
}

#[test]
fn a_gateway_change_rolls_only_the_gateway() {
    let before = plan(basic(), everything_ready());
    let changed = instance(
        json!({"id": ID, "metadata": {}, "gateway": {"metricsPort": 9191, "replicas": 3}}),
    );
    let after = plan(changed, everything_ready());
    assert_ne!(
        template_hash(&before, "Deployment", "fb-gateway"),
        template_hash(&after, "Deployment", "fb-gateway")
    );
    for (kind, name) in [
        ("Deployment", "fb-metadata"),
        ("StatefulSet", "fb-metadata-pg"),
    ] {
        assert_eq!(
            applied(&before, kind, name),
            applied(&after, kind, name),
            "{kind} {name}"
        );
    }
    assert_eq!(
        applied(&before, "ConfigMap", "fb-metadata-config"),
        applied(&after, "ConfigMap", "fb-metadata-config")
    );
    let gw = applied(&after, "Deployment", "fb-gateway").unwrap();
    assert_eq!(gw["spec"]["replicas"], 3);
    assert_eq!(
        gw["spec"]["template"]["spec"]["containers"][0]["ports"][1]["containerPort"],
        9191
    );
}

#[test]
fn scaling_the_gateway_does_not_roll_it() {
    let before = plan(basic(), everything_ready());
    let after = plan(
        instance(json!({"id": ID, "metadata": {}, "gateway": {"replicas": 5}})),
        everything_ready(),
    );
    assert_eq!(
        template_hash(&before, "Deployment", "fb-gateway"),
        template_hash(&after, "Deployment", "fb-gateway")
    );
}

#[test]
fn a_metadata_change_rolls_only_the_metadata_service() {
    let before = plan(basic(), everything_ready());
    let after = plan(
        instance(json!({"id": ID, "metadata": {"engineRegistration": true}, "gateway": {}})),
        everything_ready(),
    );
    assert_ne!(
        template_hash(&before, "Deployment", "fb-metadata"),
        template_hash(&after, "Deployment", "fb-metadata")
    );
    assert_eq!(
        applied(&before, "Deployment", "fb-gateway"),
        applied(&after, "Deployment", "fb-gateway")
    );
    assert_eq!(
        applied(&before, "StatefulSet", "fb-metadata-pg"),
        applied(&after, "StatefulSet", "fb-metadata-pg")
    );
}

#[test]
fn user_templates_set_images_and_scheduling() {
    let p = plan(
        instance(json!({
            "id": ID,
            "metadata": {"template": {"spec": {"serviceAccountName": "metadata",
                "nodeSelector": {"pool": "system"},
                "containers": [{"name": "metadata", "image": "registry/metadata:1"}]}}},
            "gateway": {"template": {"spec": {"containers": [{"name": "envoy",
                "resources": {"requests": {"cpu": "100m"}}}]}}},
        })),
        vec![],
    );
    let md = &applied(&p, "Deployment", "fb-metadata").unwrap()["spec"]["template"]["spec"];
    assert_eq!(md["serviceAccountName"], "metadata");
    assert_eq!(md["nodeSelector"]["pool"], "system");
    assert_eq!(md["containers"][0]["image"], "registry/metadata:1");
    assert_eq!(md["containers"][0]["ports"][0]["containerPort"], 7000);
    let gw = &applied(&p, "Deployment", "fb-gateway").unwrap()["spec"]["template"]["spec"];
    assert_eq!(gw["containers"][0]["image"], "envoyproxy/envoy:v1.36.4");
    assert_eq!(gw["containers"][0]["resources"]["requests"]["cpu"], "100m");
}

#[test]
fn the_gateway_drains_before_it_stops_within_its_grace_period() {
    let p = plan(basic(), vec![]);
    let pod = &applied(&p, "Deployment", "fb-gateway").unwrap()["spec"]["template"]["spec"];
    let envoy = &pod["containers"][0];
    let args: Vec<&str> = envoy["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(
        args.windows(2).any(|w| w == ["--drain-time-s", "0"])
            && args
                .windows(2)
                .any(|w| w == ["--drain-strategy", "immediate"]),
        "{args:?}"
    );
    let command = &envoy["lifecycle"]["preStop"]["exec"]["command"];
    assert_eq!(command[0], "/bin/bash");
    assert_eq!(command[1], "-c");
    let script = command[2].as_str().unwrap();
    // Fail readiness, hold, drain the client listener, wait for its
    // connections: in that order.
    let at = |needle: &str| {
        script
            .find(needle)
            .unwrap_or_else(|| panic!("{needle} in {script}"))
    };
    assert!(at("/healthcheck/fail") < at("sleep 5"));
    assert!(at("sleep 5") < at("/drain_listeners?inboundonly&graceful"));
    assert!(at("/drain_listeners?inboundonly&graceful") < at("http.queries.downstream_rq_active"));
    assert!(script.contains("admin_port=9901"));
    // The grace period covers the hold and the drain; a template's wins.
    assert_eq!(pod["terminationGracePeriodSeconds"], 300);
    let custom = plan(
        instance(
            json!({"id": ID, "metadata": {}, "gateway": {"template": {"spec": {
            "terminationGracePeriodSeconds": 3600}}}}),
        ),
        vec![],
    );
    assert_eq!(
        applied(&custom, "Deployment", "fb-gateway").unwrap()["spec"]["template"]["spec"]["terminationGracePeriodSeconds"],
        3600
    );
}

#[test]
fn an_apiserver_proxy_scrape_mode_is_reported_as_unsupported() {
    let mut i = basic();
    i["spec"]["metricScrapeMode"] = json!("ApiserverProxy");
    let p = plan(i, vec![]);
    assert!(
        p.events.iter().any(
            |e| e.event_type == EventType::Warning && e.reason == "MetricScrapeModeUnsupported"
        )
    );
    let mut i = basic();
    i["spec"]["metricScrapeMode"] = json!("PodIP");
    assert!(
        plan(i, vec![])
            .events
            .iter()
            .all(|e| e.reason != "MetricScrapeModeUnsupported")
    );
}

#[test]
fn settings_choose_the_default_images_and_domain() {
    let s = SnapshotBuilder::new("instance")
        .primary(basic())
        .settings(
            json!({"envoyImage": "mirror/envoy:1", "postgresImage": "mirror/pg:16",
                         "clusterDomain": "corp.internal", "postgresStorageSize": "1Gi"}),
        )
        .build();
    let p = run::<InstancePlugin>(&s).unwrap();
    let image = |kind: &str, name: &str| {
        applied(&p, kind, name).unwrap()["spec"]["template"]["spec"]["containers"][0]["image"]
            .clone()
    };
    assert_eq!(image("Deployment", "fb-gateway"), "mirror/envoy:1");
    assert_eq!(image("StatefulSet", "fb-metadata-pg"), "mirror/pg:16");
    let sts = applied(&p, "StatefulSet", "fb-metadata-pg").unwrap();
    assert_eq!(
        sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"],
        "1Gi"
    );
    let envoy = applied(&p, "ConfigMap", "fb-gateway-config").unwrap()["data"]["envoy.json"]
        .as_str()
        .unwrap();
    assert!(envoy.contains("-service.ns.svc.corp.internal:3473"));
}

#[test]
fn existing_volume_claims_are_kept_over_the_setting() {
    let p = plan(basic(), vec![postgres_sts(1)]);
    let sts = applied(&p, "StatefulSet", "fb-metadata-pg").unwrap();
    assert_eq!(
        sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"],
        "3Gi"
    );
}

#[test]
fn requested_gateway_tls_fails_closed() {
    let p = plan(
        instance(json!({"id": ID, "metadata": {}, "gateway": {},
                        "tls": {"gateway": {"enabled": true,
                                            "certManager": {"issuerRef": {"name": "ca"}}}}})),
        everything_ready(),
    );
    // The serving Secret is not issued yet: closed.
    assert_eq!(condition(&p, "GatewayTLSReady")["reason"], "SecretPending");
    assert!(applied(&p, "Certificate", "fb-gateway-tls").is_some());
    let c = condition(&p, "GatewayReady");
    assert_eq!(
        (c["status"].as_str(), c["reason"].as_str()),
        (Some("False"), Some("FailedClosed"))
    );
    let envoy: Value = serde_json::from_str(
        applied(&p, "ConfigMap", "fb-gateway-config").unwrap()["data"]["envoy.json"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    let listeners: Vec<&str> = envoy["static_resources"]["listeners"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["name"].as_str().unwrap())
        .collect();
    assert_eq!(listeners, ["metrics"]);
    assert!(p.status.as_ref().unwrap().get("gatewayEndpoint").is_none());
    // The metadata service is unaffected.
    assert_eq!(
        p.status.as_ref().unwrap()["metadataEndpoint"],
        "fb-metadata.ns.svc.cluster.local:7000"
    );
}

#[test]
fn requested_auth_is_reported_but_not_rolled_up() {
    let p = plan(
        instance(
            json!({"id": ID, "metadata": {}, "gateway": {}, "auth": {"enabled": true,
            "local": {"admin": {"password": {"name": "admin", "key": "password"}},
                      "signingKeys": {"certManager": {"issuerRef": {"name": "ca"}}}}}}),
        ),
        everything_ready(),
    );
    // The admin password Secret is missing: reported, not rolled up.
    let auth = condition(&p, "AuthReady");
    assert_eq!(auth["status"], "False");
    assert_eq!(auth["reason"], "AdminPasswordSecretPreflightFailed");
    assert_eq!(condition(&p, "Ready")["status"], "True");
}

#[test]
fn objects_a_component_no_longer_wants_are_pruned() {
    let mut owned = everything_ready();
    owned.push(observed(
        "v1",
        "ConfigMap",
        "fb-gateway-old",
        "gateway",
        json!({}),
    ));
    owned.push(observed("v1", "ConfigMap", "someone-elses", "", json!({})));
    let p = plan(basic(), owned);
    let deleted: Vec<&str> = p.delete.iter().map(|d| d.target.name.as_str()).collect();
    assert_eq!(deleted, ["fb-gateway-old"]);
    assert_eq!(p.delete[0].uid, "uid-ConfigMap-fb-gateway-old");
    assert_eq!(p.delete[0].resource_version, "7");
}

#[test]
fn a_deleting_instance_gets_an_empty_plan() {
    let s = SnapshotBuilder::new("instance")
        .primary(basic())
        .deleting(true)
        .build();
    assert!(run::<InstancePlugin>(&s).unwrap().is_empty());
}

#[test]
fn an_overlong_name_is_an_invalid_spec() {
    let mut primary = basic();
    primary["metadata"]["name"] = json!("x".repeat(41));
    let err = run::<InstancePlugin>(&snapshot(primary, vec![])).unwrap_err();
    assert!(matches!(err, ReconcileError::InvalidSpec(_)), "{err:?}");
}

#[test]
fn the_manifest_declares_what_the_plan_uses() {
    use wasmop_sdk::{Plugin, Selector};
    let m = InstancePlugin::manifest();
    let c = &m.controllers[0];
    assert_eq!(c.primary.api_version(), "compute.firebolt.io/v1alpha1");
    let owned: Vec<&str> = c.owns.iter().map(|k| k.kind.kind.as_str()).collect();
    assert_eq!(
        owned,
        [
            "StatefulSet",
            "Deployment",
            "Service",
            "ConfigMap",
            "Secret",
            "PodDisruptionBudget",
            "Certificate"
        ]
    );
    assert_eq!(c.primary_fields, ["spec.id"]);
    assert_eq!(c.finalizer, None);
    assert_eq!(
        c.reads[0].selector,
        Selector::field("spec.metadata.postgres.credentialsSecretRef.name")
    );
}
