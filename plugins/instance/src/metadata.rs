//! Step `metadata` (condition `MetadataReady`): the metadata service that
//! engines read their account and engine state from.
//!
//! Objects: ConfigMap `<i>-metadata-config` (key `config.xml`, see
//! [`render_config`]), Deployment `<i>-metadata` (container `metadata`,
//! gRPC on 7000, the `Recreate` strategy since the service is a single
//! writer) and ClusterIP Service `<i>-metadata`. The PostgreSQL credentials
//! are mounted from their Secret as files; no password appears in the
//! config. Ready when the Deployment has an available pod; only then does
//! the status publish `metadataEndpoint`.

use serde_json::json;
use std::collections::BTreeMap;
use wasmop_sdk::k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy};
use wasmop_sdk::k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, ConfigMapVolumeSource, Container, PodSecurityContext, SeccompProfile,
    SecretVolumeSource, SecurityContext, Service, ServiceSpec, Volume, VolumeMount,
};

use crate::names::{Component, METADATA_PORT};
use crate::podtemplate::{OperatorPod, merge};
use crate::postgres::{self, Target};
use crate::step::{Context, Desired, Failure, Outcome, StepDef};
use crate::workload::{
    container_port, deployment_health, meta, selector, service_port, set_config_hash, tcp_probe,
};

/// The step.
pub const STEP: StepDef = StepDef {
    name: "metadata",
    condition: "MetadataReady",
    components: &[Component::Metadata],
    in_ready_rollup: true,
    run,
};

/// Name of the operator's container.
pub const CONTAINER: &str = "metadata";
/// Key of the config in the ConfigMap.
pub const CONFIG_KEY: &str = "config.xml";
const CONFIG_DIR: &str = "/etc/firebolt/metadata";
const CREDENTIALS_DIR: &str = "/etc/firebolt/postgres";

/// Container fields of `metadata` the user's template may not set.
pub const RESERVED: &[&str] = &[
    "command",
    "args",
    "ports",
    "livenessProbe",
    "readinessProbe",
    "startupProbe",
    "securityContext",
];

fn run(ctx: &Context<'_>) -> Result<Outcome, Failure> {
    let names = ctx.names;
    let ns = names.namespace();
    let labels = names.labels(Component::Metadata);
    let name = names.metadata();
    let target = postgres::target(ctx);

    let config = BTreeMap::from([(CONFIG_KEY.to_owned(), render_config(ctx, &target))]);
    let config_map = ConfigMap {
        metadata: meta(names.metadata_config(), ns, &labels),
        data: Some(config.clone()),
        ..ConfigMap::default()
    };

    let operator = OperatorPod {
        path: "spec.metadata.template",
        container: container(ctx),
        reserved: RESERVED,
        volumes: vec![
            Volume {
                name: "config".to_owned(),
                config_map: Some(ConfigMapVolumeSource {
                    name: names.metadata_config(),
                    ..ConfigMapVolumeSource::default()
                }),
                ..Volume::default()
            },
            Volume {
                name: "postgres-credentials".to_owned(),
                secret: Some(SecretVolumeSource {
                    secret_name: Some(target.secret.clone()),
                    ..SecretVolumeSource::default()
                }),
                ..Volume::default()
            },
        ],
        labels: labels.clone(),
        security_context: Some(PodSecurityContext {
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".to_owned(),
                ..SeccompProfile::default()
            }),
            ..PodSecurityContext::default()
        }),
    };
    let mut template = merge(ctx.spec.metadata.template.as_ref(), operator)
        .map_err(|e| Failure::rejected("TemplateRejected", e.to_string()))?;
    set_config_hash(&mut template, &json!({"configMap": config}));

    let replicas = ctx.spec.metadata.replicas();
    let deployment = Deployment {
        metadata: meta(name.clone(), ns, &labels),
        spec: Some(DeploymentSpec {
            replicas: Some(replicas),
            selector: selector(&labels),
            strategy: Some(DeploymentStrategy {
                type_: Some("Recreate".to_owned()),
                ..DeploymentStrategy::default()
            }),
            template,
            ..DeploymentSpec::default()
        }),
        ..Deployment::default()
    };

    let service = Service {
        metadata: meta(name.clone(), ns, &labels),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".to_owned()),
            selector: Some(labels.clone()),
            ports: Some(vec![service_port("grpc", METADATA_PORT, "grpc")]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    };

    let observed: Option<Deployment> = ctx.observed("Deployment", &name)?;
    let health = deployment_health("metadata service", &name, replicas, observed.as_ref());

    Ok(Outcome {
        objects: vec![
            Desired::apply(config_map),
            Desired::apply(service),
            Desired::apply(deployment),
        ],
        health,
    })
}

fn container(ctx: &Context<'_>) -> Container {
    let mount = |name: &str, path: &str| VolumeMount {
        name: name.to_owned(),
        mount_path: path.to_owned(),
        read_only: Some(true),
        ..VolumeMount::default()
    };
    Container {
        name: CONTAINER.to_owned(),
        image: Some(ctx.settings.metadata_image.clone()),
        args: Some(vec![
            "--config".to_owned(),
            format!("{CONFIG_DIR}/{CONFIG_KEY}"),
        ]),
        ports: Some(vec![container_port("grpc", METADATA_PORT)]),
        readiness_probe: Some(tcp_probe("grpc", 5, 3)),
        liveness_probe: Some(tcp_probe("grpc", 10, 6)),
        volume_mounts: Some(vec![
            mount("config", CONFIG_DIR),
            mount("postgres-credentials", CREDENTIALS_DIR),
        ]),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".to_owned()]),
                ..Capabilities::default()
            }),
            ..SecurityContext::default()
        }),
        ..Container::default()
    }
}

/// The metadata service's configuration: the instance (account) ID, the
/// listen address, feature switches, and where PostgreSQL is, with the
/// credentials as files from the mounted Secret.
///
/// Every value is XML-escaped; the CRD's patterns already keep markup out
/// of the PostgreSQL fields, this keeps the file well-formed regardless.
pub fn render_config(ctx: &Context<'_>, target: &Target) -> String {
    let e = xml_escape;
    format!(
        r#"<?xml version="1.0" encoding="UTF-8"?>
<!-- Rendered by wasmop's instance plugin; edits are overwritten. -->
<metadata>
  <account_id>{id}</account_id>
  <listen_address>0.0.0.0:{METADATA_PORT}</listen_address>
  <engine_registration>{registration}</engine_registration>
  <next_generation>{ng}</next_generation>
  <postgres>
    <host>{host}</host>
    <port>{port}</port>
    <database>{database}</database>
    <schema>{schema}</schema>
    <username_file>{CREDENTIALS_DIR}/username</username_file>
    <password_file>{CREDENTIALS_DIR}/password</password_file>
  </postgres>
</metadata>
"#,
        id = e(ctx.id),
        registration = ctx.spec.metadata.engine_registration,
        ng = ctx.spec.metadata_ng,
        host = e(&target.host),
        port = target.port,
        database = e(&target.database),
        schema = e(&target.schema),
    )
}

/// Escapes the five XML special characters.
fn xml_escape(s: &str) -> String {
    s.chars()
        .fold(String::with_capacity(s.len()), |mut out, c| {
            match c {
                '&' => out.push_str("&amp;"),
                '<' => out.push_str("&lt;"),
                '>' => out.push_str("&gt;"),
                '"' => out.push_str("&quot;"),
                '\'' => out.push_str("&apos;"),
                c => out.push(c),
            }
            out
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xml_escape_neutralises_markup() {
        assert_eq!(xml_escape(r#"a<b>&"c'"#), "a&lt;b&gt;&amp;&quot;c&apos;");
        assert_eq!(xml_escape("plain-host.svc"), "plain-host.svc");
    }
}
