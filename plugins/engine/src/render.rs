//! The objects of one engine generation and the engine's cluster Service,
//! rendered from the resolved inputs ([`Desired`]).
//!
//! Everything a generation is built from goes into one hash
//! ([`Desired::hash`], annotation [`SPEC_HASH_ANNOTATION`] on the
//! StatefulSet): the class and engine templates, replicas, storage, the UI
//! sidecar switch, the merged `customEngineConfig`, the instance data
//! rendered into `config.yaml` and the default image. The hash does not
//! depend on the generation number, so the StatefulSet of the current
//! generation matches the spec exactly when its hash equals it.

use serde_json::{Value, json};
use wasmop_sdk::hash::stable_hash;

use crate::merge::{ENGINE_CONTAINER, deep_merge, merge_templates};
use crate::names::{
    AUTH_HASH_ANNOTATION, CLASS_HASH_ANNOTATION, COMPONENT_LABEL, CUSTOM_CONFIG_HASH_ANNOTATION,
    ENGINE_TLS_HASH_ANNOTATION, GENERATION_LABEL, HEALTH_PORT, INSTANCE_LABEL,
    METADATA_OVERRIDE_ANNOTATION, METRICS_PORT, Names, QUERY_PORT, SPEC_HASH_ANNOTATION, UI_PORT,
};
use crate::security::{AuthRender, SecretMount, TLS_DIR, TlsRender};
use crate::settings::Settings;
use crate::spec::Resolved;

/// Key of the rendered engine config in the ConfigMap.
pub const CONFIG_KEY: &str = "config.yaml";
/// Where the config is mounted.
pub const CONFIG_DIR: &str = "/etc/firebolt";
/// Where the engine keeps its data.
pub const DATA_DIR: &str = "/var/lib/firebolt";
/// Name of the UI sidecar container (reserved).
pub const UI_CONTAINER: &str = "engine-web";
/// `terminationGracePeriodSeconds` of every engine Pod (upstream's).
pub const TERMINATION_GRACE_SECONDS: i64 = 60;
/// Label and annotation prefix owned by the operator.
pub const OPERATOR_PREFIX: &str = "firebolt.io/";
/// Env names of the engine container the operator sets.
pub const RESERVED_ENV: [&str; 1] = ["POD_INDEX"];

/// Instance data the engine's config is rendered from.
#[derive(Clone, Debug, PartialEq)]
pub struct InstanceData {
    /// `spec.id` of the instance.
    pub id: String,
    /// The metadata endpoint (the instance's, or the engine's override).
    pub metadata_endpoint: String,
    /// Auth to render, when the instance has it on.
    pub auth: Option<AuthRender>,
    /// Engine TLS, when the instance has it on and provisioned.
    pub tls: Option<TlsRender>,
}

/// Everything one generation is rendered from.
#[derive(Clone, Debug)]
pub struct Desired<'a> {
    /// Names of the engine's objects.
    pub names: &'a Names,
    /// The plugin settings.
    pub settings: &'a Settings,
    /// `spec.replicas`.
    pub replicas: i64,
    /// The class template, if the engine has a class.
    pub class_template: Option<&'a Value>,
    /// The engine template.
    pub engine_template: Option<&'a Value>,
    /// Resolved non-template settings.
    pub resolved: &'a Resolved,
    /// Instance data for `config.yaml`.
    pub instance: &'a InstanceData,
    /// `spec.metadataEndpointOverride`, when set.
    pub metadata_override: Option<&'a str>,
}

impl Desired<'_> {
    /// Hash of every input of a generation.
    pub fn hash(&self) -> String {
        let mut inputs = json!({
            "replicas": self.replicas,
            "classTemplate": self.class_template,
            "engineTemplate": self.engine_template,
            "uiSidecar": self.resolved.ui_sidecar,
            "storage": self.resolved.storage,
            "customEngineConfig": self.resolved.custom_engine_config,
            "instanceId": self.instance.id,
            "metadataEndpoint": self.instance.metadata_endpoint,
            "engineImage": self.settings.engine_image,
            "uiSidecarImage": self.settings.ui_sidecar_image,
        });
        // Only present with auth / TLS, so engines without them keep the
        // hash they had.
        if let Some(a) = &self.instance.auth {
            inputs["authHash"] = json!(a.hash);
        }
        if let Some(t) = &self.instance.tls {
            inputs["engineTLSHash"] = json!(t.hash);
            inputs["engineTLSCertManager"] = t.cert_manager.clone();
        }
        stable_hash(&inputs)
    }

    /// The Secret mounts of generation `g`: auth material, the serving
    /// certificate.
    pub fn secret_mounts(&self, g: i64) -> Vec<SecretMount> {
        let mut out = Vec::new();
        if let Some(a) = &self.instance.auth {
            out.extend(a.mounts.iter().cloned());
        }
        if self.instance.tls.is_some() {
            out.push(SecretMount {
                volume: "engine-tls".into(),
                secret: self.names.tls(g),
                items: vec![
                    ("tls.crt".into(), "tls.crt".into()),
                    ("tls.key".into(), "tls.key".into()),
                ],
                dir: TLS_DIR.into(),
            });
        }
        out
    }

    /// Generation `g`'s serving certificate: an empty `kubernetes.io/tls`
    /// Secret for cert-manager to fill (the engine's own object, so it is
    /// deleted with the generation) and the Certificate. Empty without
    /// engine TLS.
    pub fn tls_objects(&self, g: i64) -> Vec<Value> {
        let Some(t) = &self.instance.tls else {
            return Vec::new();
        };
        let mut labels = json!(self.names.generation_labels(g));
        labels[COMPONENT_LABEL] = json!("engine-tls");
        labels[INSTANCE_LABEL] = json!(t.instance);
        let meta = json!({"name": self.names.tls(g), "namespace": self.names.namespace(), "labels": labels});
        let cm = &t.cert_manager;
        let text = |p: &str, d: &str| -> Value {
            json!(
                cm.pointer(p)
                    .and_then(Value::as_str)
                    .filter(|v| !v.is_empty())
                    .unwrap_or(d)
            )
        };
        let mut spec = json!({
            "secretName": self.names.tls(g),
            "issuerRef": {"name": text("/issuerRef/name", ""), "kind": text("/issuerRef/kind", "ClusterIssuer"),
                          "group": "cert-manager.io"},
            "privateKey": {"algorithm": text("/algorithm", "ECDSA"),
                           "size": cm.pointer("/size").and_then(Value::as_i64).filter(|s| *s > 0).unwrap_or(384),
                           "encoding": "PKCS8", "rotationPolicy": "Always"},
            "dnsNames": self.names.tls_dns_names(g),
            "usages": ["server auth", "digital signature", "key encipherment"],
            "secretTemplate": {"labels": labels},
        });
        for (from, to) in [("/duration", "duration"), ("/renewBefore", "renewBefore")] {
            if let Some(v) = cm
                .pointer(from)
                .and_then(Value::as_str)
                .filter(|v| !v.is_empty())
            {
                spec[to] = json!(v);
            }
        }
        vec![
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": meta, "type": "kubernetes.io/tls",
                   "data": {"tls.crt": "", "tls.key": ""}}),
            json!({"apiVersion": "cert-manager.io/v1", "kind": "Certificate", "metadata": meta, "spec": spec}),
        ]
    }

    /// The rendered `config.yaml` of generation `g` (JSON, which YAML
    /// parsers read as YAML). `customEngineConfig` goes underneath; the
    /// operator-owned paths (`schema_version`, `instance`, `engine.id`,
    /// `engine.nodes`) always come from the operator.
    pub fn config_text(&self, g: i64) -> String {
        let mut config = self.resolved.custom_engine_config.clone();
        if let Some(map) = config.as_object_mut() {
            map.remove("schema_version");
            map.remove("instance");
        }
        if let Some(engine) = config.get_mut("engine").and_then(Value::as_object_mut) {
            engine.remove("tls");
        }
        let nodes: Vec<Value> = (0..self.replicas.max(0))
            .map(|i| json!({"host": self.names.node_host(g, i)}))
            .collect();
        let mut operator = json!({
            "schema_version": "1.0",
            "instance": {
                "id": self.instance.id,
                "type": "multi_engine",
                "multi_engine": {"metadata_endpoint": self.instance.metadata_endpoint},
            },
            "engine": {"id": self.names.engine(), "nodes": nodes},
        });
        if let Some(a) = &self.instance.auth {
            operator["instance"]["auth"] = a.config.clone();
        }
        if self.instance.tls.is_some() {
            // TLS replaces plaintext on the query port: one listener.
            operator["engine"]["tls"] = json!({
                "enabled": true,
                "port": QUERY_PORT,
                "certificate_file": format!("{TLS_DIR}/tls.crt"),
                "private_key_file": format!("{TLS_DIR}/tls.key"),
            });
        }
        if config.pointer("/logging/format").is_none() {
            deep_merge(&mut config, &json!({"logging": {"format": "json"}}));
        }
        deep_merge(&mut config, &operator);
        serde_json::to_string_pretty(&config).unwrap_or_default()
    }

    /// ConfigMap `<e>-g<N>-config`.
    pub fn config_map(&self, g: i64) -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": self.meta(&self.names.config(g), g),
            "data": {CONFIG_KEY: self.config_text(g)},
        })
    }

    /// Headless Service `<e>-g<N>-hl`: stable DNS for the nodes, ready or
    /// not.
    pub fn headless_service(&self, g: i64) -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": self.meta(&self.names.headless(g), g),
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": true,
                "selector": self.names.generation_labels(g),
                "ports": [
                    {"name": "http-query", "port": QUERY_PORT, "targetPort": QUERY_PORT},
                    {"name": "health", "port": HEALTH_PORT, "targetPort": HEALTH_PORT},
                    {"name": "metrics", "port": METRICS_PORT, "targetPort": METRICS_PORT},
                ],
            },
        })
    }

    /// The pod template of generation `g`: operator defaults < class <
    /// engine, then the operator-owned paths on top: the `firebolt.io/`
    /// labels and annotations are the operator's alone (its generation
    /// labels), `terminationGracePeriodSeconds` is
    /// [`TERMINATION_GRACE_SECONDS`], `hostname` and `subdomain` are the
    /// StatefulSet's, and the engine container's reserved env
    /// ([`RESERVED_ENV`]) is the operator's. The CRDs reject all but the
    /// env at admission; this also holds for objects stored before those
    /// rules.
    pub fn pod_template(&self, g: i64) -> Value {
        let defaults = self.default_template(g);
        let mut template =
            merge_templates([Some(&defaults), self.class_template, self.engine_template]);
        for key in ["labels", "annotations"] {
            if let Some(map) = template["metadata"]
                .get_mut(key)
                .and_then(Value::as_object_mut)
            {
                map.retain(|k, _| !k.starts_with(OPERATOR_PREFIX));
            }
        }
        let labels = &mut template["metadata"]["labels"];
        for (k, v) in self.names.generation_labels(g) {
            labels[k] = json!(v);
        }
        if let Some(spec) = template["spec"].as_object_mut() {
            spec.remove("hostname");
            spec.remove("subdomain");
            spec.insert(
                "terminationGracePeriodSeconds".into(),
                json!(TERMINATION_GRACE_SECONDS),
            );
        }
        if let Some(containers) = template["spec"]["containers"].as_array_mut() {
            for c in containers
                .iter_mut()
                .filter(|c| c["name"] == ENGINE_CONTAINER)
            {
                if let Some(env) = c["env"].as_array_mut() {
                    // The operator's own entries come first in the merge;
                    // a later entry of the same name would win in the Pod.
                    let mut seen = std::collections::BTreeSet::new();
                    env.retain(|e| {
                        let name = e["name"].as_str().unwrap_or_default();
                        !RESERVED_ENV.contains(&name) || seen.insert(name.to_owned())
                    });
                }
            }
        }
        if self.resolved.ui_sidecar {
            let containers = &mut template["spec"]["containers"];
            if let Some(list) = containers.as_array_mut() {
                list.retain(|c| c["name"] != UI_CONTAINER);
                list.push(json!({
                    "name": UI_CONTAINER,
                    "image": self.settings.ui_sidecar_image,
                    "ports": [{"name": "ui", "containerPort": UI_PORT}],
                }));
            }
        }
        template
    }

    fn default_template(&self, g: i64) -> Value {
        let storage = &self.resolved.storage;
        let data_volume = if let Some(host_path) = storage.get("hostPath") {
            Some(json!({"name": "data", "hostPath": host_path}))
        } else if storage.get("persistentVolumeClaim").is_some() {
            None // a volumeClaimTemplate named `data`
        } else {
            Some(
                json!({"name": "data", "emptyDir": storage.get("emptyDir").cloned().unwrap_or(json!({}))}),
            )
        };
        let mut volumes = vec![
            json!({"name": "config", "configMap": {"name": self.names.config(g)}}),
            json!({"name": "runtime", "emptyDir": {}}),
        ];
        volumes.extend(data_volume);
        let mut mounts = vec![
            json!({"name": "config", "mountPath": CONFIG_DIR}),
            json!({"name": "runtime", "mountPath": "/var/run/firebolt"}),
            json!({"name": "data", "mountPath": DATA_DIR}),
        ];
        for m in self.secret_mounts(g) {
            volumes.push(m.volume());
            mounts.push(m.mount());
        }
        json!({
            "metadata": {"labels": {}},
            "spec": {
                "containers": [{
                    "name": ENGINE_CONTAINER,
                    "image": self.settings.engine_image,
                    "command": ["/bin/bash", "-c",
                        format!("exec firebolt server --node \"$POD_INDEX\" --config {CONFIG_DIR}/{CONFIG_KEY} --data-dir {DATA_DIR}")],
                    "env": [{"name": "POD_INDEX", "valueFrom": {"fieldRef":
                        {"fieldPath": "metadata.labels['apps.kubernetes.io/pod-index']"}}}],
                    "ports": [
                        {"name": "http-query", "containerPort": QUERY_PORT},
                        {"name": "health", "containerPort": HEALTH_PORT},
                        {"name": "metrics", "containerPort": METRICS_PORT},
                    ],
                    "readinessProbe": {"httpGet": {"path": "/health/ready", "port": HEALTH_PORT}},
                    "livenessProbe": {"httpGet": {"path": "/health/live", "port": HEALTH_PORT}},
                    "volumeMounts": mounts,
                }],
                "volumes": volumes,
            },
        })
    }

    /// StatefulSet `<e>-g<N>`.
    pub fn statefulset(&self, g: i64) -> Value {
        let mut annotations = json!({SPEC_HASH_ANNOTATION: self.hash()});
        if let Some(class) = self.class_template {
            annotations[CLASS_HASH_ANNOTATION] = json!(stable_hash(class));
        }
        if self
            .resolved
            .custom_engine_config
            .as_object()
            .is_some_and(|m| !m.is_empty())
        {
            annotations[CUSTOM_CONFIG_HASH_ANNOTATION] =
                json!(stable_hash(&self.resolved.custom_engine_config));
        }
        if let Some(o) = self.metadata_override {
            annotations[METADATA_OVERRIDE_ANNOTATION] = json!(o);
        }
        if let Some(a) = &self.instance.auth {
            annotations[AUTH_HASH_ANNOTATION] = json!(a.hash);
        }
        if let Some(t) = &self.instance.tls {
            annotations[ENGINE_TLS_HASH_ANNOTATION] = json!(t.hash);
        }
        let mut meta = self.meta(&self.names.statefulset(g), g);
        meta["annotations"] = annotations;
        let mut spec = json!({
            "replicas": self.replicas,
            "serviceName": self.names.headless(g),
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": self.names.generation_labels(g)},
            "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Delete", "whenScaled": "Retain"},
            "template": self.pod_template(g),
        });
        if let Some(pvc) = self.resolved.storage.get("persistentVolumeClaim") {
            let mut claim = json!({
                "accessModes": pvc.get("accessModes").cloned().unwrap_or(json!(["ReadWriteOnce"])),
                "resources": {"requests": {"storage": pvc.get("size").cloned().unwrap_or(json!("10Gi"))}},
            });
            if let Some(class) = pvc.get("storageClassName") {
                claim["storageClassName"] = class.clone();
            }
            spec["volumeClaimTemplates"] = json!([{"metadata": {"name": "data"}, "spec": claim}]);
        }
        json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": meta, "spec": spec})
    }

    /// The cluster Service `<e>-service`, selecting generation `g`.
    pub fn cluster_service(&self, g: i64) -> Value {
        cluster_service(self.names, g)
    }

    fn meta(&self, name: &str, g: i64) -> Value {
        json!({
            "name": name,
            "namespace": self.names.namespace(),
            "labels": self.names.generation_labels(g),
        })
    }
}

/// The cluster Service `<e>-service`, selecting generation `g` (it needs
/// nothing but names, so the switching phase renders it whole).
pub fn cluster_service(names: &Names, g: i64) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": names.service(),
            "namespace": names.namespace(),
            "labels": names.engine_labels(),
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": false,
            "selector": names.generation_labels(g),
            "ports": [
                {"name": "http-query", "port": QUERY_PORT, "targetPort": QUERY_PORT},
                {"name": "health", "port": HEALTH_PORT, "targetPort": HEALTH_PORT},
            ],
        },
    })
}

/// The generation a per-generation object or Service selector names.
pub fn generation_of(labels: Option<&Value>) -> Option<i64> {
    labels?.get(GENERATION_LABEL)?.as_str()?.parse().ok()
}
