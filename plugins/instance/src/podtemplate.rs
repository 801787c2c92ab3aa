//! Merging the user's pod template (`spec.metadata.template`,
//! `spec.gateway.template`) with the container the operator renders.
//!
//! The user owns the pod: scheduling, service account, extra containers
//! and volumes, labels and annotations. On the operator's container the
//! user may set the image, pull policy, resources, env, envFrom and extra
//! volume mounts (and, where a component allows it, securityContext and
//! lifecycle). Everything else on that container (command, args, ports,
//! probes) is the operator's; a template that sets one of the component's
//! reserved fields is rejected ([`TemplateError`]), as are volumes and
//! mount paths that collide with the operator's. The component's labels
//! always win over the user's, since the workload selects pods by them.

use std::collections::BTreeMap;

use wasmop_sdk::k8s_openapi::api::core::v1::{
    Container, PodSecurityContext, PodTemplateSpec, Volume,
};
use wasmop_sdk::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// Why a user template was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// The operator's container sets a field the operator owns.
    #[error("{path}: container {container:?} sets {field}, which the operator sets")]
    ReservedField {
        /// Path of the template in the spec.
        path: &'static str,
        /// The operator container's name.
        container: String,
        /// The offending field.
        field: &'static str,
    },
    /// A user volume has the name of one of the operator's.
    #[error("{path}: volume {name:?} is reserved for the operator")]
    ReservedVolume {
        /// Path of the template in the spec.
        path: &'static str,
        /// The volume's name.
        name: String,
    },
    /// A user volume mount on the operator's container uses a path the
    /// operator mounts.
    #[error("{path}: container {container:?} mounts {mount_path:?}, which the operator mounts")]
    ReservedMountPath {
        /// Path of the template in the spec.
        path: &'static str,
        /// The operator container's name.
        container: String,
        /// The mount path.
        mount_path: String,
    },
}

/// What the operator contributes to a pod.
#[derive(Clone, Debug, Default)]
pub struct OperatorPod {
    /// Path of the user template in the spec, for messages.
    pub path: &'static str,
    /// The operator's container, complete with the default image.
    pub container: Container,
    /// Container fields the user may not set (Kubernetes field names).
    pub reserved: &'static [&'static str],
    /// Volumes the container needs.
    pub volumes: Vec<Volume>,
    /// Labels the pods must carry (they win over the user's).
    pub labels: BTreeMap<String, String>,
    /// Pod securityContext when the user sets none.
    pub security_context: Option<PodSecurityContext>,
}

/// The pod template: the user's `template` with the operator's container,
/// volumes and labels merged in.
///
/// # Errors
///
/// [`TemplateError`] when the user's template sets a reserved field or
/// collides with the operator's volumes or mount paths.
pub fn merge(
    user: Option<&PodTemplateSpec>,
    operator: OperatorPod,
) -> Result<PodTemplateSpec, TemplateError> {
    let user = user.cloned().unwrap_or_default();
    let mut meta = user.metadata.unwrap_or_default();
    let mut spec = user.spec.unwrap_or_default();
    let path = operator.path;

    let mut containers = std::mem::take(&mut spec.containers);
    let position = containers
        .iter()
        .position(|c| c.name == operator.container.name);
    let mut container = operator.container;
    if let Some(i) = position {
        let mine = containers.remove(i);
        if let Some(field) = set_fields(&mine)
            .into_iter()
            .find(|f| operator.reserved.contains(f))
        {
            return Err(TemplateError::ReservedField {
                path,
                container: container.name,
                field,
            });
        }
        overlay(&mut container, mine, path)?;
    }

    let mut volumes = operator.volumes;
    for volume in spec.volumes.take().unwrap_or_default() {
        if volumes.iter().any(|v| v.name == volume.name) {
            return Err(TemplateError::ReservedVolume {
                path,
                name: volume.name,
            });
        }
        volumes.push(volume);
    }

    let mut labels = meta.labels.take().unwrap_or_default();
    labels.extend(operator.labels);
    meta.labels = Some(labels);

    containers.insert(0, container);
    spec.containers = containers;
    spec.volumes = (!volumes.is_empty()).then_some(volumes);
    if spec.security_context.is_none() {
        spec.security_context = operator.security_context;
    }
    Ok(PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: meta.labels,
            annotations: meta.annotations,
            ..ObjectMeta::default()
        }),
        spec: Some(spec),
    })
}

/// Copies what the user may set from `mine` onto the operator's container.
fn overlay(
    container: &mut Container,
    mine: Container,
    path: &'static str,
) -> Result<(), TemplateError> {
    if let Some(image) = mine.image.filter(|i| !i.is_empty()) {
        container.image = Some(image);
    }
    container.image_pull_policy = mine
        .image_pull_policy
        .or(container.image_pull_policy.take());
    container.resources = mine.resources.or(container.resources.take());
    container.security_context = mine.security_context.or(container.security_context.take());
    container.lifecycle = mine.lifecycle.or(container.lifecycle.take());
    append(&mut container.env, mine.env);
    append(&mut container.env_from, mine.env_from);
    let reserved_paths: Vec<String> = container
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| m.mount_path.clone())
        .collect();
    if let Some(mount) = mine
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| reserved_paths.contains(&m.mount_path))
    {
        return Err(TemplateError::ReservedMountPath {
            path,
            container: container.name.clone(),
            mount_path: mount.mount_path.clone(),
        });
    }
    append(&mut container.volume_mounts, mine.volume_mounts);
    Ok(())
}

fn append<T>(into: &mut Option<Vec<T>>, more: Option<Vec<T>>) {
    if let Some(more) = more.filter(|m| !m.is_empty()) {
        into.get_or_insert_with(Vec::new).extend(more);
    }
}

/// The names of the fields a container sets, among those a component may
/// reserve.
fn set_fields(c: &Container) -> Vec<&'static str> {
    [
        ("command", c.command.is_some()),
        ("args", c.args.is_some()),
        ("ports", c.ports.is_some()),
        ("livenessProbe", c.liveness_probe.is_some()),
        ("readinessProbe", c.readiness_probe.is_some()),
        ("startupProbe", c.startup_probe.is_some()),
        ("securityContext", c.security_context.is_some()),
        ("lifecycle", c.lifecycle.is_some()),
    ]
    .into_iter()
    .filter_map(|(name, set)| set.then_some(name))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use wasmop_sdk::k8s_openapi::api::core::v1::VolumeMount;

    fn operator() -> OperatorPod {
        OperatorPod {
            path: "spec.gateway.template",
            container: Container {
                name: "envoy".into(),
                image: Some("envoy:default".into()),
                args: Some(vec!["-c".into()]),
                volume_mounts: Some(vec![VolumeMount {
                    name: "config".into(),
                    mount_path: "/etc/envoy".into(),
                    ..VolumeMount::default()
                }]),
                ..Container::default()
            },
            reserved: &["command", "args", "ports", "lifecycle"],
            volumes: vec![Volume {
                name: "config".into(),
                ..Volume::default()
            }],
            labels: BTreeMap::from([("firebolt.io/component".into(), "gateway".into())]),
            security_context: Some(PodSecurityContext {
                run_as_non_root: Some(true),
                ..PodSecurityContext::default()
            }),
        }
    }

    fn template(v: serde_json::Value) -> PodTemplateSpec {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn no_user_template_gives_the_operator_pod() {
        let t = merge(None, operator()).unwrap();
        let spec = t.spec.unwrap();
        assert_eq!(spec.containers.len(), 1);
        assert_eq!(spec.containers[0].image.as_deref(), Some("envoy:default"));
        assert_eq!(spec.volumes.unwrap()[0].name, "config");
        assert_eq!(spec.security_context.unwrap().run_as_non_root, Some(true));
        assert_eq!(
            t.metadata.unwrap().labels.unwrap()["firebolt.io/component"],
            "gateway"
        );
    }

    #[test]
    fn user_image_resources_scheduling_and_sidecars_are_kept() {
        let user = template(json!({
            "metadata": {"labels": {"team": "a", "firebolt.io/component": "mine"},
                         "annotations": {"note": "x"}},
            "spec": {
                "nodeSelector": {"pool": "system"},
                "serviceAccountName": "sa",
                "containers": [
                    {"name": "sidecar", "image": "side:1"},
                    {"name": "envoy", "image": "envoy:mine",
                     "resources": {"requests": {"cpu": "100m"}},
                     "env": [{"name": "A", "value": "1"}],
                     "volumeMounts": [{"name": "extra", "mountPath": "/extra"}]},
                ],
                "volumes": [{"name": "extra", "emptyDir": {}}],
            },
        }));
        let t = merge(Some(&user), operator()).unwrap();
        let meta = t.metadata.unwrap();
        let labels = meta.labels.unwrap();
        assert_eq!(labels["team"], "a");
        assert_eq!(
            labels["firebolt.io/component"], "gateway",
            "operator labels win"
        );
        assert_eq!(meta.annotations.unwrap()["note"], "x");
        let spec = t.spec.unwrap();
        assert_eq!(spec.node_selector.unwrap()["pool"], "system");
        assert_eq!(spec.service_account_name.as_deref(), Some("sa"));
        let names: Vec<&str> = spec.containers.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["envoy", "sidecar"]);
        let envoy = &spec.containers[0];
        assert_eq!(envoy.image.as_deref(), Some("envoy:mine"));
        assert_eq!(envoy.args.as_deref(), Some(&["-c".to_owned()][..]));
        assert!(envoy.resources.is_some());
        assert_eq!(envoy.env.as_ref().unwrap()[0].name, "A");
        assert_eq!(envoy.volume_mounts.as_ref().unwrap().len(), 2);
        let volumes: Vec<String> = spec.volumes.unwrap().into_iter().map(|v| v.name).collect();
        assert_eq!(volumes, ["config", "extra"]);
    }

    #[test]
    fn reserved_fields_volumes_and_mount_paths_are_rejected() {
        let args = template(json!({"spec": {"containers": [{"name": "envoy", "args": ["x"]}]}}));
        assert_eq!(
            merge(Some(&args), operator()).unwrap_err().to_string(),
            "spec.gateway.template: container \"envoy\" sets args, which the operator sets"
        );
        let volume = template(json!({"spec": {"containers": [],
            "volumes": [{"name": "config", "emptyDir": {}}]}}));
        assert!(matches!(
            merge(Some(&volume), operator()),
            Err(TemplateError::ReservedVolume { .. })
        ));
        let mount = template(json!({"spec": {"containers": [{"name": "envoy",
            "volumeMounts": [{"name": "x", "mountPath": "/etc/envoy"}]}]}}));
        assert!(matches!(
            merge(Some(&mount), operator()),
            Err(TemplateError::ReservedMountPath { .. })
        ));
        // The same fields on another container are the user's business.
        let sidecar = template(json!({"spec": {"containers": [{"name": "other", "args": ["x"]}]}}));
        assert!(merge(Some(&sidecar), operator()).is_ok());
    }

    #[test]
    fn the_user_pod_security_context_wins() {
        let user = template(json!({"spec": {"containers": [],
            "securityContext": {"runAsUser": 1234}}}));
        let spec = merge(Some(&user), operator()).unwrap().spec.unwrap();
        let sc = spec.security_context.unwrap();
        assert_eq!(sc.run_as_user, Some(1234));
        assert_eq!(sc.run_as_non_root, None);
    }
}
