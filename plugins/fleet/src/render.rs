//! The objects of fleet `F`: the workload (Deployment or StatefulSet), the
//! Services `F` and `F-peers`, the NetworkPolicy `F` and the
//! PodDisruptionBudget `F`. Pure functions of the fleet and the settings.
//!
//! No object carries an ownerReference (deletion must not cascade before the
//! lifecycle gate); the host stamps the owner labels, including
//! `celld.eric.dev/fleet-uid`, on every object a plan applies. The pod and
//! claim templates carry `celld.eric.dev/fleet-uid` themselves: it is the
//! workload selector.

use serde_json::{Map, Value, json};
use wasmop_sdk::hash::stable_hash;

use crate::api::{Egress, Fleet, FleetSpec, fixed_config};
use crate::names::*;
use crate::settings::Settings;
use wasmop_sdk::contract::OWNER_UID_LABEL;

/// Default CPU request of a member.
pub const DEFAULT_CPU_REQUEST: &str = "250m";
/// Default memory request of a member.
pub const DEFAULT_MEMORY_REQUEST: &str = "512Mi";
/// Default memory limit of a member.
pub const DEFAULT_MEMORY_LIMIT: &str = "1Gi";
/// Default celld shutdown budget.
pub const DEFAULT_SHUTDOWN_SECONDS: i64 = 20;
/// Default termination grace.
pub const DEFAULT_TERMINATION_GRACE_SECONDS: i64 = 30;
/// Where a Kafka properties Secret is mounted.
pub const EXPORT_MOUNT: &str = "/etc/celld/export";

/// The selector labels of fleet `uid`.
pub fn selector_labels(uid: &str) -> Value {
    json!({ FLEET_UID_LABEL: uid })
}

/// Labels of the claims the StatefulSet makes: the selector label and the
/// host's owner label with this fleet's UID, so the claims count as the
/// fleet's own (owner-label ownership) and its plans may delete them (member
/// replacement, deletion). The host refuses plans that set its labels on an
/// object they apply; a claim template is not such an object, and these
/// claims are created for this fleet alone.
pub fn claim_labels(uid: &str) -> Value {
    json!({ FLEET_UID_LABEL: uid, OWNER_UID_LABEL: uid })
}

fn meta(fleet: &Fleet, name: &str) -> Value {
    json!({"name": name, "namespace": fleet.metadata.namespace})
}

fn field_env(name: &str, path: &str) -> Value {
    json!({"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}})
}

fn literal(name: &str, value: impl ToString) -> Value {
    json!({"name": name, "value": value.to_string()})
}

fn secret_env(name: &str, secret: &str, key: &str) -> Value {
    json!({"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}})
}

/// The member environment, in a fixed order: operator-owned identity,
/// network, durability and storage settings; then `spec.env`; then
/// telemetry and export. Secret-backed entries are references: Kubernetes
/// resolves them when a Pod starts, and no value passes through the plugin.
pub fn environment(fleet: &Fleet) -> Vec<Value> {
    let s = &fleet.spec;
    let (node_field, durability, advertise) = if s.persistent() {
        (
            "metadata.name",
            "fleet",
            format!(
                "$(CELLD_NODE).{}.{}.svc:{PEER_PORT}",
                peers_service(&fleet.metadata.name),
                fleet.metadata.namespace
            ),
        )
    } else {
        ("metadata.uid", "bucket", format!("$(POD_IP):{PEER_PORT}"))
    };
    let execution = s.execution.clone().unwrap_or_default();
    let shutdown = s
        .lifecycle
        .as_ref()
        .and_then(|l| l.shutdown_seconds)
        .unwrap_or(DEFAULT_SHUTDOWN_SECONDS);
    let mut env = vec![
        field_env("POD_IP", "status.podIP"),
        field_env("CELLD_NODE", node_field),
        literal("CELLD_ADVERTISE", advertise),
        literal("CELLD_BUCKET", s.storage.url()),
        literal("AWS_REGION", &s.storage.region),
        literal("CELLD_DURABILITY", durability),
        literal("CELLD_ADDR", format!("0.0.0.0:{APPLICATION_PORT}")),
        literal("CELLD_INTERNAL_ADDR", format!("0.0.0.0:{PEER_PORT}")),
        literal("CELLD_WATCH", "/work"),
        literal("CELLD_TTL_MS", 10_000),
        literal("CELLD_SHUTDOWN_TOTAL_MS", shutdown * 1000),
        literal("CELLD_TOKIO_THREADS", 2),
    ];
    if let Some(n) = execution.max_resident_cells.filter(|n| *n > 0) {
        env.push(literal("CELLD_MAX_RESIDENT_CELLS", n));
    }
    if let Some(n) = execution.idle_evict_seconds.filter(|n| *n > 0) {
        env.push(literal("CELLD_IDLE_EVICT_S", n));
    }
    if let Some(endpoint) = &s.storage.endpoint {
        env.push(literal("S3_ENDPOINT", &endpoint.url));
        if endpoint.url.starts_with("http://") {
            env.push(literal("AWS_ALLOW_HTTP", "true"));
        }
        env.push(secret_env(
            "AWS_ACCESS_KEY_ID",
            &endpoint.credentials_secret_name,
            "accessKeyId",
        ));
        env.push(secret_env(
            "AWS_SECRET_ACCESS_KEY",
            &endpoint.credentials_secret_name,
            "secretAccessKey",
        ));
    }
    for e in s.env.iter().flatten() {
        match (&e.value, &e.secret_key_ref) {
            (Some(v), _) => env.push(literal(&e.name, v)),
            (None, Some(r)) => env.push(secret_env(&e.name, &r.name, &r.key)),
            (None, None) => {}
        }
    }
    if let Some(t) = &s.telemetry {
        env.push(literal("CELLD_OTEL", &t.collector_url));
        env.push(field_env("POD_NAME", "metadata.name"));
        env.push(literal(
            "OTEL_RESOURCE_ATTRIBUTES",
            format!(
                "k8s.namespace.name={},k8s.pod.name=$(POD_NAME),celld.fleet.name={}",
                fleet.metadata.namespace, fleet.metadata.name
            ),
        ));
        if let Some(v) = t.sampler.as_deref().filter(|v| !v.is_empty()) {
            env.push(literal("OTEL_TRACES_SAMPLER", v));
        }
        if let Some(v) = t.sampler_arg.as_deref().filter(|v| !v.is_empty()) {
            env.push(literal("OTEL_TRACES_SAMPLER_ARG", v));
        }
        if let Some(v) = t.flush_milliseconds.filter(|v| *v > 0) {
            env.push(literal("CELLD_OTEL_FLUSH_MS", v));
        }
        if let Some(v) = t.flush_bytes.filter(|v| *v > 0) {
            env.push(literal("CELLD_OTEL_FLUSH_BYTES", v));
        }
        if let Some(r) = &t.headers_secret_key_ref {
            env.push(secret_env("OTEL_EXPORTER_OTLP_HEADERS", &r.name, &r.key));
        }
    }
    if let Some(x) = &s.export {
        env.push(literal("CELLD_EXPORT", 1));
        env.push(literal(
            "CELLD_EXPORT_SINK",
            x.sink.as_deref().unwrap_or("Bucket"),
        ));
        let joined =
            |v: &Option<Vec<String>>| v.as_ref().filter(|v| !v.is_empty()).map(|v| v.join(","));
        if let Some(v) = joined(&x.classes) {
            env.push(literal("CELLD_EXPORT_CLASSES", v));
        }
        if let Some(v) = joined(&x.exclude_tables) {
            env.push(literal("CELLD_EXPORT_TABLES", v));
        }
        for (name, v) in [
            ("CELLD_EXPORT_MAX_TX_BYTES", x.max_transaction_bytes),
            ("CELLD_EXPORT_MAX_RECORD_BYTES", x.max_record_bytes),
            ("CELLD_EXPORT_QUEUE_BYTES", x.queue_bytes),
        ] {
            if let Some(v) = v {
                env.push(literal(name, v));
            }
        }
        if let Some(b) = &x.bucket {
            if let Some(v) = &b.name {
                env.push(literal("CELLD_EXPORT_BUCKET", v));
            }
            if let Some(v) = b.flush_milliseconds {
                env.push(literal("CELLD_EXPORT_FLUSH_MS", v));
            }
            if let Some(v) = b.flush_bytes {
                env.push(literal("CELLD_EXPORT_FLUSH_BYTES", v));
            }
            if let Some(v) = b.retention_days {
                env.push(literal("CELLD_EXPORT_RETENTION", format!("{v}d")));
            }
        }
        if let Some(k) = &x.kafka {
            if !k.brokers.is_empty() {
                env.push(literal("CELLD_EXPORT_KAFKA_BROKERS", k.brokers.join(",")));
            }
            if let Some(v) = &k.topic {
                env.push(literal("CELLD_EXPORT_TOPIC", v));
            }
            if let Some(v) = k.retry_milliseconds {
                env.push(literal("CELLD_EXPORT_RETRY_MS", v));
            }
            if let Some(r) = &k.properties_secret_key_ref {
                env.push(literal(
                    "CELLD_EXPORT_KAFKA_PROPERTIES",
                    format!("{EXPORT_MOUNT}/{}", r.key),
                ));
            }
        }
    }
    env
}

fn resources(spec: &FleetSpec) -> Value {
    let e = spec.execution.clone().unwrap_or_default();
    let mut requests = Map::new();
    requests.insert(
        "cpu".into(),
        json!(e.cpu_request.as_deref().unwrap_or(DEFAULT_CPU_REQUEST)),
    );
    requests.insert(
        "memory".into(),
        json!(
            e.memory_request
                .as_deref()
                .unwrap_or(DEFAULT_MEMORY_REQUEST)
        ),
    );
    let mut limits = Map::new();
    limits.insert(
        "memory".into(),
        json!(e.memory_limit.as_deref().unwrap_or(DEFAULT_MEMORY_LIMIT)),
    );
    if let Some(cpu) = e.cpu_limit.as_deref().filter(|c| !c.is_empty()) {
        limits.insert("cpu".into(), json!(cpu));
    }
    if !spec.persistent() {
        let (request, limit) = match &spec.storage.scratch {
            Some(s) => (s.request.clone(), s.limit.clone()),
            None => {
                let size = format!("{}Gi", spec.storage.size_gib());
                (size.clone(), size)
            }
        };
        requests.insert("ephemeral-storage".into(), json!(request));
        limits.insert("ephemeral-storage".into(), json!(limit));
    }
    json!({"requests": requests, "limits": limits})
}

/// The member Pod template.
pub fn pod_template(fleet: &Fleet) -> Value {
    let s = &fleet.spec;
    let uid = &fleet.metadata.uid;
    let selector = json!({"matchLabels": selector_labels(uid)});
    let grace = s
        .lifecycle
        .as_ref()
        .and_then(|l| l.termination_grace_seconds)
        .unwrap_or(DEFAULT_TERMINATION_GRACE_SECONDS);
    let mut spread = json!({
        "maxSkew": 1,
        "topologyKey": "topology.kubernetes.io/zone",
        "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": selector,
        "minDomains": s.placement.az_count,
        "nodeAffinityPolicy": "Honor",
        "nodeTaintsPolicy": "Honor",
    });
    let host_term = json!({"labelSelector": selector, "topologyKey": "kubernetes.io/hostname"});
    let anti_affinity = if s.relaxed() {
        if let Some(o) = spread.as_object_mut() {
            o.insert("whenUnsatisfiable".into(), json!("ScheduleAnyway"));
            o.remove("minDomains");
        }
        json!({"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 100, "podAffinityTerm": host_term}
        ]})
    } else {
        json!({"requiredDuringSchedulingIgnoredDuringExecution": [host_term]})
    };
    let mut mounts = vec![json!({"name": DATA_VOLUME, "mountPath": "/work"})];
    let mut volumes = Vec::new();
    if !s.persistent() {
        let limit = s
            .storage
            .scratch
            .as_ref()
            .map(|sc| sc.limit.clone())
            .unwrap_or_else(|| format!("{}Gi", s.storage.size_gib()));
        volumes.push(json!({"name": DATA_VOLUME, "emptyDir": {"sizeLimit": limit}}));
    }
    if let Some(r) = s
        .export
        .as_ref()
        .and_then(|x| x.kafka.as_ref())
        .and_then(|k| k.properties_secret_key_ref.as_ref())
    {
        mounts.push(json!({"name": "export", "mountPath": EXPORT_MOUNT, "readOnly": true}));
        volumes.push(json!({"name": "export", "secret": {"secretName": r.name}}));
    }
    let container = json!({
        "name": CONTAINER,
        "image": s.runtime_image.as_deref().unwrap_or(""),
        "imagePullPolicy": "IfNotPresent",
        "env": environment(fleet),
        "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}},
        "ports": [
            {"name": "application", "containerPort": APPLICATION_PORT, "protocol": "TCP"},
            {"name": "peer", "containerPort": PEER_PORT, "protocol": "TCP"},
        ],
        "readinessProbe": {
            "httpGet": {"path": "/.well-known/celld/health", "port": APPLICATION_PORT},
            "periodSeconds": 2, "timeoutSeconds": 1, "failureThreshold": 3, "successThreshold": 1,
        },
        "resources": resources(s),
        "volumeMounts": mounts,
    });
    let mut pod = json!({
        "serviceAccountName": s.service_account_name,
        "automountServiceAccountToken": false,
        "terminationGracePeriodSeconds": grace,
        "securityContext": {
            "runAsUser": 10001, "runAsGroup": 10001, "runAsNonRoot": true, "fsGroup": 10001,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "affinity": {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [
                    {"key": "topology.kubernetes.io/zone", "operator": "In", "values": s.placement.zones},
                    {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]},
                ]}
            ]}},
            "podAntiAffinity": anti_affinity,
        },
        "topologySpreadConstraints": [spread],
        "containers": [container],
    });
    if !volumes.is_empty()
        && let Some(o) = pod.as_object_mut()
    {
        o.insert("volumes".into(), json!(volumes));
    }
    let mut labels = Map::new();
    labels.insert(FLEET_UID_LABEL.into(), json!(uid));
    let mut annotations = Map::new();
    if !s.restart_token().is_empty() {
        annotations.insert(RESTART_TOKEN_ANNOTATION.into(), json!(s.restart_token()));
    }
    crate::mesh::template_metadata(fleet, &mut labels, &mut annotations);
    let mut metadata = json!({"labels": labels});
    if !annotations.is_empty() {
        metadata["annotations"] = json!(annotations);
    }
    json!({"metadata": metadata, "spec": pod})
}

/// The workload: a Deployment (Bucket, Deployment layout) or a StatefulSet
/// (Ordered Bucket, PersistentFleet) running `replicas` members. Its
/// annotations record the hash of the fixed configuration and of the pod
/// template, so a later reconcile can tell a forbidden change from a
/// rollout and a rollout from a settled workload.
pub fn workload(fleet: &Fleet, fixed_hash: &str, replicas: i32) -> Value {
    let template = pod_template(fleet);
    let annotations = json!({
        FIXED_CONFIG_ANNOTATION: fixed_hash,
        TEMPLATE_HASH_ANNOTATION: stable_hash(&template),
    });
    let mut metadata = meta(fleet, &fleet.metadata.name);
    metadata["annotations"] = annotations;
    let selector = json!({"matchLabels": selector_labels(&fleet.metadata.uid)});
    if !fleet.spec.stateful() {
        return json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": metadata,
            "spec": {
                "replicas": replicas,
                "selector": selector,
                "template": template,
                "strategy": {"type": "RollingUpdate",
                             "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}},
            },
        });
    }
    let mut spec = json!({
        "replicas": replicas,
        "selector": selector,
        "serviceName": peers_service(&fleet.metadata.name),
        "podManagementPolicy": "Parallel",
        "template": template,
        "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}},
        "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Retain", "whenScaled": "Retain"},
    });
    if fleet.spec.persistent() {
        let reservation = reservation_name(&fleet.spec.storage.bucket);
        spec["volumeClaimTemplates"] = json!([{
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {
                "name": DATA_VOLUME,
                "labels": claim_labels(&fleet.metadata.uid),
                "annotations": { STORAGE_RESERVATION_ANNOTATION: reservation },
            },
            "spec": {
                "accessModes": ["ReadWriteOncePod"],
                "storageClassName": fleet.spec.storage.storage_class_name,
                "resources": {"requests": {"storage": format!("{}Gi", fleet.spec.storage.size_gib())}},
            },
        }]);
    }
    json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": metadata, "spec": spec})
}

/// The hash of the fields fixed at creation.
pub fn fixed_hash(primary: &Value) -> String {
    stable_hash(&fixed_config(primary))
}

/// Service `F`: the application port.
pub fn application_service(fleet: &Fleet) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta(fleet, &fleet.metadata.name),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(&fleet.metadata.uid),
            "ports": [{"name": "application", "port": APPLICATION_PORT,
                       "targetPort": APPLICATION_PORT, "protocol": "TCP"}],
        },
    })
}

/// Service `F-peers`: headless, publishing not-ready members, the peer port.
pub fn peers_service_object(fleet: &Fleet) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta(fleet, &peers_service(&fleet.metadata.name)),
        "spec": {
            "type": "ClusterIP",
            "clusterIP": "None",
            "publishNotReadyAddresses": true,
            "selector": selector_labels(&fleet.metadata.uid),
            "ports": [{"name": "peer", "port": PEER_PORT, "targetPort": PEER_PORT,
                       "protocol": "TCP", "appProtocol": "tcp"}],
        },
    })
}

/// PodDisruptionBudget `F`: one member at a time.
pub fn disruption_budget(fleet: &Fleet) -> Value {
    json!({
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": meta(fleet, &fleet.metadata.name),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": selector_labels(&fleet.metadata.uid)},
        },
    })
}

fn tcp(port: i64) -> Value {
    json!({"protocol": "TCP", "port": port})
}

/// The port a URL names, or its scheme's default.
pub fn url_port(url: &str) -> i64 {
    let (scheme, rest) = url.split_once("://").unwrap_or(("http", url));
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host_port = authority.rsplit('@').next().unwrap_or("");
    let port = if host_port.starts_with('[') {
        host_port.rsplit_once("]:").map(|(_, p)| p)
    } else {
        host_port.rsplit_once(':').map(|(_, p)| p)
    };
    port.and_then(|p| p.parse().ok())
        .unwrap_or(if scheme == "https" { 443 } else { 80 })
}

fn peer_of(egress: &Egress) -> Value {
    if let Some(cidr) = &egress.cidr {
        return json!({"ipBlock": {"cidr": cidr}});
    }
    let mut peer =
        json!({"podSelector": {"matchLabels": egress.pod_labels.clone().unwrap_or_default()}});
    if let Some(ns) = egress.namespace.as_deref().filter(|n| !n.is_empty()) {
        peer["namespaceSelector"] = json!({"matchLabels": {"kubernetes.io/metadata.name": ns}});
    }
    peer
}

/// NetworkPolicy `F`. Ingress: the peer port from members and the operator;
/// the application port from Pods labelled `celld.eric.dev/client-of=F`.
/// Egress: members on the peer port, cluster DNS, HTTPS (S3 and STS), the
/// EKS Pod Identity agent, and one scoped rule per custom endpoint,
/// telemetry collector and Kafka broker port set.
pub fn network_policy(fleet: &Fleet, settings: &Settings) -> Value {
    network_policy_with(fleet, settings, None)
}

/// NetworkPolicy `F` with, when `istiod` names its namespace, egress to
/// istiod on 15012 (the mesh, and a departure until the last proxy exits).
pub fn network_policy_with(fleet: &Fleet, settings: &Settings, istiod: Option<&str>) -> Value {
    let s = &fleet.spec;
    let same = json!({"podSelector": {"matchLabels": selector_labels(&fleet.metadata.uid)}});
    let operator = json!({
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": settings.operator_namespace}},
        "podSelector": {"matchLabels": settings.operator_pod_labels},
    });
    let mut egress = vec![
        json!({"to": [same], "ports": [tcp(i64::from(PEER_PORT))]}),
        json!({"to": [{
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
            }],
            "ports": [tcp(53), {"protocol": "UDP", "port": 53}]}),
        json!({"ports": [tcp(443)]}),
        json!({"to": [{"ipBlock": {"cidr": "169.254.170.23/32"}}], "ports": [tcp(80)]}),
    ];
    if let Some(e) = &s.storage.endpoint {
        egress.push(json!({"to": [peer_of(&e.egress)], "ports": [tcp(url_port(&e.url))]}));
    }
    if let Some(t) = &s.telemetry {
        egress
            .push(json!({"to": [peer_of(&t.egress)], "ports": [tcp(url_port(&t.collector_url))]}));
    }
    if let Some(k) = s.export.as_ref().and_then(|x| x.kafka.as_ref()) {
        let mut ports: Vec<i64> = k
            .brokers
            .iter()
            .filter_map(|b| b.rsplit_once(':').and_then(|(_, p)| p.parse().ok()))
            .collect();
        ports.sort_unstable();
        ports.dedup();
        if !ports.is_empty() {
            let ports: Vec<Value> = ports.into_iter().map(tcp).collect();
            egress.push(json!({"to": [peer_of(&k.egress)], "ports": ports}));
        }
    }
    if let Some(ns) = istiod {
        egress.push(crate::mesh::istiod_egress(ns));
    }
    json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta(fleet, &fleet.metadata.name),
        "spec": {
            "podSelector": {"matchLabels": selector_labels(&fleet.metadata.uid)},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [
                {"from": [same, operator], "ports": [tcp(i64::from(PEER_PORT))]},
                {"from": [{"podSelector": {"matchLabels": { CLIENT_OF_LABEL: fleet.metadata.name }}}],
                 "ports": [tcp(i64::from(APPLICATION_PORT))]},
            ],
            "egress": egress,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_ports() {
        assert_eq!(url_port("http://otel-collector.fleets.svc:4318"), 4318);
        assert_eq!(url_port("https://collector.example.com/v1"), 443);
        assert_eq!(url_port("http://store"), 80);
        assert_eq!(url_port("http://[::1]:9000/"), 9000);
    }
}
