//! Small builders shared by the component steps: object metadata,
//! selectors, ports, probes, the config-hash annotation, and readiness of
//! observed workloads.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use wasmop_sdk::k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use wasmop_sdk::k8s_openapi::api::core::v1::{
    ContainerPort, EnvVar, EnvVarSource, ExecAction, HTTPGetAction, PodTemplateSpec, Probe,
    SecretKeySelector, ServicePort, TCPSocketAction,
};
use wasmop_sdk::k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use wasmop_sdk::k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use wasmop_sdk::stable_hash;

use crate::names::CONFIG_HASH_ANNOTATION;

/// Metadata of a generated object.
pub fn meta(name: String, namespace: &str, labels: &BTreeMap<String, String>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: Some(namespace.to_owned()),
        labels: Some(labels.clone()),
        ..ObjectMeta::default()
    }
}

/// A selector matching exactly these labels.
pub fn selector(labels: &BTreeMap<String, String>) -> LabelSelector {
    LabelSelector {
        match_labels: Some(labels.clone()),
        ..LabelSelector::default()
    }
}

/// A named TCP container port.
pub fn container_port(name: &str, port: i32) -> ContainerPort {
    ContainerPort {
        name: Some(name.to_owned()),
        container_port: port,
        protocol: Some("TCP".to_owned()),
        ..ContainerPort::default()
    }
}

/// A named TCP Service port forwarding to the container port of the same name.
pub fn service_port(name: &str, port: i32, target: &str) -> ServicePort {
    ServicePort {
        name: Some(name.to_owned()),
        port,
        target_port: Some(IntOrString::String(target.to_owned())),
        protocol: Some("TCP".to_owned()),
        ..ServicePort::default()
    }
}

/// A probe connecting to a named port.
pub fn tcp_probe(port: &str, period: i32, failures: i32) -> Probe {
    Probe {
        tcp_socket: Some(TCPSocketAction {
            port: IntOrString::String(port.to_owned()),
            ..TCPSocketAction::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        ..Probe::default()
    }
}

/// A probe GETting `path` on a named port.
pub fn http_probe(path: &str, port: &str, period: i32, failures: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.to_owned()),
            port: IntOrString::String(port.to_owned()),
            scheme: Some("HTTP".to_owned()),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        ..Probe::default()
    }
}

/// A probe running a command in the container.
pub fn exec_probe(command: &[&str], period: i32, failures: i32) -> Probe {
    Probe {
        exec: Some(ExecAction {
            command: Some(command.iter().map(|s| (*s).to_owned()).collect()),
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        ..Probe::default()
    }
}

/// An environment variable with a literal value.
pub fn env(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: Some(value.to_owned()),
        ..EnvVar::default()
    }
}

/// An environment variable read from a key of a Secret.
pub fn env_from_secret(name: &str, secret: &str, key: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret.to_owned(),
                key: key.to_owned(),
                optional: Some(false),
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }
}

/// Sets [`CONFIG_HASH_ANNOTATION`] on the pod template to the hash of the
/// component's inputs: `config` (what the pods read but the template does
/// not show, such as a ConfigMap's data) and the template itself.
///
/// # Guarantees
///
/// The hash depends on nothing but `config` and the template, so a change
/// to another component never changes it; the annotation itself is left
/// out of the hashed template, so setting it is idempotent.
pub fn set_config_hash(template: &mut PodTemplateSpec, config: &Value) {
    let meta = template.metadata.get_or_insert_with(ObjectMeta::default);
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(CONFIG_HASH_ANNOTATION);
        if annotations.is_empty() {
            meta.annotations = None;
        }
    }
    let hash = stable_hash(&json!({"config": config, "template": &*template}));
    let meta = template.metadata.get_or_insert_with(ObjectMeta::default);
    meta.annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(CONFIG_HASH_ANNOTATION.to_owned(), hash);
}

/// Pods of a Deployment that are available (0 when it has no status yet).
pub fn available_replicas(deployment: &Deployment) -> i32 {
    deployment
        .status
        .as_ref()
        .and_then(|s| s.available_replicas)
        .unwrap_or(0)
}

/// Health of a component served by one Deployment: ready once it has an
/// available pod. `what` names the component in messages (`gateway`,
/// `metadata service`).
pub fn deployment_health(
    what: &str,
    name: &str,
    replicas: i32,
    observed: Option<&Deployment>,
) -> crate::step::Health {
    use crate::step::Health;
    match observed.map(available_replicas) {
        Some(n) if n >= 1 => Health::ready(
            "Ready",
            format!("{what} {name} has {n}/{replicas} pod(s) available"),
        ),
        Some(_) => Health::waiting(
            "Provisioning",
            format!("waiting for an available pod of Deployment {name}"),
        ),
        None => Health::waiting("Provisioning", format!("creating Deployment {name}")),
    }
}

/// Whether a Deployment (as JSON) runs only pods of its current template:
/// the controller has seen the current spec and every pod it counts is
/// updated. No old pod is left, whatever their readiness.
pub fn rolled_out(deployment: &Value) -> bool {
    let int = |p: &str| deployment.pointer(p).and_then(Value::as_i64);
    let generation = int("/metadata/generation").unwrap_or(0);
    let observed = int("/status/observedGeneration").unwrap_or(-1);
    let want = int("/spec/replicas").unwrap_or(1);
    let replicas = int("/status/replicas").unwrap_or(0);
    let updated = int("/status/updatedReplicas").unwrap_or(0);
    // Reported where the API server has the field (pods still stopping).
    let terminating = int("/status/terminatingReplicas").unwrap_or(0);
    observed >= generation && updated == want && replicas == updated && terminating == 0
}

/// Pods of a StatefulSet that are ready (0 when it has no status yet).
pub fn ready_replicas(statefulset: &StatefulSet) -> i32 {
    statefulset
        .status
        .as_ref()
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deployment_is_rolled_out_when_only_updated_pods_are_left() {
        let d = |generation: i64, observed: i64, replicas: i64, updated: i64| {
            json!({"metadata": {"generation": generation}, "spec": {"replicas": 2},
                   "status": {"observedGeneration": observed, "replicas": replicas,
                              "updatedReplicas": updated}})
        };
        assert!(rolled_out(&d(3, 3, 2, 2)));
        assert!(!rolled_out(&d(3, 2, 2, 2)), "status of an older spec");
        assert!(!rolled_out(&d(3, 3, 3, 2)), "an old pod is left");
        assert!(!rolled_out(&d(3, 3, 1, 1)), "not every pod is updated");
    }

    #[test]
    fn config_hash_follows_config_and_template_and_is_idempotent() {
        let mut t = PodTemplateSpec::default();
        set_config_hash(&mut t, &json!({"a": 1}));
        let first = t.metadata.as_ref().unwrap().annotations.as_ref().unwrap()
            [CONFIG_HASH_ANNOTATION]
            .clone();
        set_config_hash(&mut t, &json!({"a": 1}));
        let again =
            &t.metadata.as_ref().unwrap().annotations.as_ref().unwrap()[CONFIG_HASH_ANNOTATION];
        assert_eq!(
            &first, again,
            "re-hashing an annotated template changes nothing"
        );

        let mut other = PodTemplateSpec::default();
        set_config_hash(&mut other, &json!({"a": 2}));
        assert_ne!(
            first,
            other.metadata.unwrap().annotations.unwrap()[CONFIG_HASH_ANNOTATION]
        );
    }
}
