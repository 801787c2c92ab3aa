//! Step `gateway` (condition `GatewayReady`): the Envoy gateway, the entry
//! point for client queries.
//!
//! Objects: ConfigMap `<i>-gateway-config` (key `envoy.json`, see
//! [`crate::envoy`]), Deployment `<i>-gateway` (default 2 replicas,
//! container `envoy`, client listener 8080, metrics and probes on
//! `spec.gateway.metricsPort`), ClusterIP Service `<i>-gateway` (`http` 80 →
//! 8080) and PodDisruptionBudget `<i>-gateway` (`maxUnavailable: 1`).
//!
//! # Shutdown without cutting queries
//!
//! A gateway pod that stops (a roll on a config, certificate or CRL
//! change, a scale-down, an eviction) drains first: its `preStop`
//! ([`pre_stop_script`], bash over `/dev/tcp` to Envoy's loopback admin
//! port; the image has no curl) fails readiness (`POST
//! /healthcheck/fail`), keeps serving for [`DRAIN_HOLD_SECONDS`] while
//! the Service and clients stop sending it new connections, stops the
//! client listener (`POST /drain_listeners?inboundonly&graceful`; Envoy
//! runs with `--drain-time-s 0 --drain-strategy immediate`, so a
//! connection closes once its request is answered) and returns when
//! Envoy reports no client request in flight. Only then does the kubelet
//! send SIGTERM (which closes idle keep-alive connections: no query is
//! on them). `terminationGracePeriodSeconds` defaults to
//! [`DEFAULT_GRACE_SECONDS`] (the template may set its own): a query
//! still running after it is cut.
//! Ready when the Deployment has an available pod and the gateway serves
//! clients; only then does the status publish `gatewayEndpoint`.

use std::collections::BTreeMap;

use serde_json::json;
use wasmop_sdk::k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment,
};
use wasmop_sdk::k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, ConfigMapVolumeSource, Container, ExecAction, Lifecycle,
    LifecycleHandler, PodSecurityContext, SeccompProfile, SecretVolumeSource, SecurityContext,
    Service, ServiceSpec, Volume, VolumeMount,
};
use wasmop_sdk::k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use wasmop_sdk::k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::envoy::{
    CLIENT_CA_DIR, CLIENT_CRL_DIR, ClientListener, ENGINE_CA_DIR, ENGINE_CRL_DIR, EnvoyInputs,
    SERVING_DIR, bootstrap,
};
use crate::gateway_tls::Listener;
use crate::names::{
    CLIENT_LISTENER_ANNOTATION, Component, ENGINE_TRUST_CAS_ANNOTATION, GATEWAY_LISTEN_PORT,
    GATEWAY_SERVICE_PORT,
};
use crate::podtemplate::{OperatorPod, merge};
use crate::step::{Context, Desired, Failure, Health, Outcome, StepDef};
use crate::workload::{
    container_port, deployment_health, http_probe, meta, selector, service_port, set_config_hash,
    tcp_probe,
};

/// The step.
pub const STEP: StepDef = StepDef {
    name: "gateway",
    condition: "GatewayReady",
    components: &[Component::Gateway],
    in_ready_rollup: true,
    run,
};

/// How long a stopping gateway pod keeps accepting connections after it
/// failed readiness, so endpoints and clients catch up.
pub const DRAIN_HOLD_SECONDS: u32 = 5;
/// The gateway pods' `terminationGracePeriodSeconds` unless the template
/// sets one: the hold plus the longest query a roll waits for.
pub const DEFAULT_GRACE_SECONDS: i64 = 300;

/// The gateway container's `preStop` script (run with `bash -c`): fail
/// readiness, hold, drain the client listener, wait until no client
/// request is in flight (twice in a row, a second apart: an idle
/// keep-alive connection holds no query, and Envoy's exit closes it).
/// Admin calls that fail are retried; the grace period bounds the whole.
pub fn pre_stop_script() -> String {
    format!(
        r#"# Drains the gateway before Envoy stops (the gateway plugin's preStop).
admin_port={admin}
admin() {{
  exec 3<>"/dev/tcp/127.0.0.1/$admin_port" || return 1
  printf '%s %s HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\nConnection: close\r\n\r\n' "$1" "$2" >&3
  reply=$(cat <&3)
  exec 3<&-
  case "$reply" in "HTTP/1.1 200 "*) return 0 ;; *) return 1 ;; esac
}}
until admin POST /healthcheck/fail; do sleep 0.2; done
sleep {hold}
until admin POST '/drain_listeners?inboundonly&graceful'; do sleep 0.2; done
idle=0
while [ "$idle" -lt 2 ]; do
  sleep 0.5
  admin GET '/stats?filter=^{stat}$' || continue
  active=${{reply##*{stat}: }}
  active=${{active%%[!0-9]*}}
  if [ "${{active:-0}}" = 0 ]; then idle=$((idle + 1)); else idle=0; fi
done
"#,
        admin = crate::envoy::ADMIN_PORT,
        hold = DRAIN_HOLD_SECONDS,
        stat = crate::envoy::ACTIVE_REQUESTS_STAT,
    )
}

/// Name of the volume of the engine revocation list.
pub const ENGINE_CRL_VOLUME: &str = "engine-crl";

/// Name of the operator's container.
pub const CONTAINER: &str = "envoy";
/// Key of the bootstrap in the ConfigMap.
pub const CONFIG_KEY: &str = "envoy.json";
const CONFIG_DIR: &str = "/etc/envoy";
/// uid of the `envoy` user in the official image.
const ENVOY_UID: i64 = 101;

/// Container fields of `envoy` the user's template may not set.
pub const RESERVED: &[&str] = &[
    "command",
    "args",
    "ports",
    "livenessProbe",
    "readinessProbe",
    "startupProbe",
    "lifecycle",
];

fn run(ctx: &Context<'_>) -> Result<Outcome, Failure> {
    let names = ctx.names;
    let ns = names.namespace();
    let labels = names.labels(Component::Gateway);
    let name = names.gateway();
    let gateway = &ctx.spec.gateway;
    let metrics_port = gateway.metrics_port();
    let security = &ctx.security.gateway;
    let serve_clients = security.listener != Listener::Closed;
    let client = match &security.listener {
        Listener::Plaintext => ClientListener::Plaintext,
        Listener::Closed => ClientListener::Closed,
        Listener::Tls { .. } => ClientListener::Tls,
        Listener::Mutual { .. } => ClientListener::Mutual,
    };
    let mut secrets: Vec<(&str, String, &str)> = Vec::new();
    let mut versions = Vec::new();
    match &security.listener {
        Listener::Tls { secret, version } => {
            secrets.push(("tls", secret.clone(), SERVING_DIR));
            versions.push(version.clone());
        }
        Listener::Mutual {
            secret,
            version,
            client_ca,
            fingerprint,
            crl,
        } => {
            secrets.push(("tls", secret.clone(), SERVING_DIR));
            secrets.push(("client-ca", client_ca.clone(), CLIENT_CA_DIR));
            versions.push(version.clone());
            versions.push(fingerprint.clone());
            if let Some(crl) = crl {
                secrets.push(("client-crl", crl.secret.clone(), CLIENT_CRL_DIR));
                versions.push(crl.version.clone());
            }
        }
        Listener::Plaintext | Listener::Closed => {}
    }
    if security.reencrypt {
        secrets.push(("engine-ca", names.engine_ca_bundle(), ENGINE_CA_DIR));
    }
    let upstream_crl = security
        .upstream_crl
        .as_ref()
        .filter(|_| security.reencrypt);
    if let Some(crl) = upstream_crl {
        secrets.push((ENGINE_CRL_VOLUME, crl.secret.clone(), ENGINE_CRL_DIR));
        versions.push(crl.version.clone());
    }
    let client_crl = matches!(&security.listener, Listener::Mutual { crl: Some(_), .. });

    let config = bootstrap(&EnvoyInputs {
        engine_authority_suffix: names.engine_authority_suffix(),
        metrics_port,
        client,
        upstream_tls: security.reencrypt,
        client_crl,
        upstream_crl: upstream_crl.is_some(),
    });
    let rendered = serde_json::to_string_pretty(&config)
        .map_err(|e| Failure::new("EnsureFailed", format!("cannot render envoy config: {e}")))?;
    let data = BTreeMap::from([(CONFIG_KEY.to_owned(), rendered)]);
    let config_map = ConfigMap {
        metadata: meta(names.gateway_config(), ns, &labels),
        data: Some(data.clone()),
        ..ConfigMap::default()
    };

    let mut volumes = vec![Volume {
        name: "config".to_owned(),
        config_map: Some(ConfigMapVolumeSource {
            name: names.gateway_config(),
            ..ConfigMapVolumeSource::default()
        }),
        ..Volume::default()
    }];
    for (volume, secret, _) in &secrets {
        volumes.push(Volume {
            name: (*volume).to_owned(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(secret.clone()),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        });
    }
    let operator = OperatorPod {
        path: "spec.gateway.template",
        container: container(ctx, metrics_port, &secrets),
        reserved: RESERVED,
        volumes,
        labels: labels.clone(),
        security_context: Some(PodSecurityContext {
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".to_owned(),
                ..SeccompProfile::default()
            }),
            ..PodSecurityContext::default()
        }),
    };
    let mut template = merge(gateway.template.as_ref(), operator)
        .map_err(|e| Failure::rejected("TemplateRejected", e.to_string()))?;
    if let Some(pod) = template.spec.as_mut() {
        // Long enough for the preStop drain (see the module docs).
        pod.termination_grace_period_seconds
            .get_or_insert(DEFAULT_GRACE_SECONDS);
    }
    let annotations = template
        .metadata
        .get_or_insert_with(Default::default)
        .annotations
        .get_or_insert_with(BTreeMap::new);
    // Plaintext pods carry no mark, so a plaintext gateway keeps the hash
    // it had before TLS existed (no roll on upgrade).
    if security.listener != Listener::Plaintext {
        annotations.insert(
            CLIENT_LISTENER_ANNOTATION.to_owned(),
            security.listener.label().to_owned(),
        );
    }
    if security.reencrypt {
        annotations.insert(
            ENGINE_TRUST_CAS_ANNOTATION.to_owned(),
            security.trust_fingerprints.join(","),
        );
    }
    let mut inputs = json!({"configMap": data});
    if !versions.is_empty() {
        inputs["secretVersions"] = json!(versions);
    }
    if security.reencrypt {
        inputs["trustBundle"] = json!(security.trust_bundle);
    }
    set_config_hash(&mut template, &inputs);

    let replicas = gateway.replicas();
    let deployment = Deployment {
        metadata: meta(name.clone(), ns, &labels),
        spec: Some(DeploymentSpec {
            replicas: Some(replicas),
            selector: selector(&labels),
            template,
            // Tightening TLS: every looser pod goes before any new one
            // starts.
            strategy: security.drain_first.then(|| DeploymentStrategy {
                type_: Some("RollingUpdate".to_owned()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_unavailable: Some(IntOrString::String("100%".to_owned())),
                    max_surge: Some(IntOrString::Int(0)),
                }),
            }),
            ..DeploymentSpec::default()
        }),
        ..Deployment::default()
    };
    let service = Service {
        metadata: meta(name.clone(), ns, &labels),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".to_owned()),
            selector: Some(labels.clone()),
            ports: Some(vec![service_port("http", GATEWAY_SERVICE_PORT, "http")]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    };
    let budget = PodDisruptionBudget {
        metadata: meta(name.clone(), ns, &labels),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(selector(&labels)),
            ..PodDisruptionBudgetSpec::default()
        }),
        ..PodDisruptionBudget::default()
    };

    let observed: Option<Deployment> = ctx.observed("Deployment", &name)?;
    let health = if !serve_clients {
        Health::waiting(
            "FailedClosed",
            "gateway TLS is not in place yet (see GatewayTLSReady); \
             the gateway serves no client listener",
        )
    } else if replicas == 0 {
        Health::waiting("ScaledToZero", "spec.gateway.replicas is 0")
    } else {
        deployment_health("gateway", &name, replicas, observed.as_ref())
    };

    Ok(Outcome {
        objects: vec![
            Desired::apply(config_map),
            Desired::apply(service),
            Desired::apply(deployment),
            Desired::apply(budget),
        ],
        health,
    })
}

fn container(ctx: &Context<'_>, metrics_port: i32, secrets: &[(&str, String, &str)]) -> Container {
    let mut mounts = vec![VolumeMount {
        name: "config".to_owned(),
        mount_path: CONFIG_DIR.to_owned(),
        read_only: Some(true),
        ..VolumeMount::default()
    }];
    for (volume, _, dir) in secrets {
        mounts.push(VolumeMount {
            name: (*volume).to_owned(),
            mount_path: (*dir).to_owned(),
            read_only: Some(true),
            ..VolumeMount::default()
        });
    }
    Container {
        name: CONTAINER.to_owned(),
        image: Some(ctx.settings.envoy_image.clone()),
        command: Some(vec!["envoy".to_owned()]),
        args: Some(vec![
            "--config-path".to_owned(),
            format!("{CONFIG_DIR}/{CONFIG_KEY}"),
            "--log-level".to_owned(),
            "info".to_owned(),
            // A drained connection closes once its request is answered.
            "--drain-time-s".to_owned(),
            "0".to_owned(),
            "--drain-strategy".to_owned(),
            "immediate".to_owned(),
        ]),
        ports: Some(vec![
            container_port("http", GATEWAY_LISTEN_PORT),
            container_port("metrics", metrics_port),
        ]),
        readiness_probe: Some(http_probe("/ready", "metrics", 5, 3)),
        liveness_probe: Some(tcp_probe("metrics", 10, 6)),
        lifecycle: Some(Lifecycle {
            pre_stop: Some(LifecycleHandler {
                exec: Some(ExecAction {
                    command: Some(vec![
                        "/bin/bash".to_owned(),
                        "-c".to_owned(),
                        pre_stop_script(),
                    ]),
                }),
                ..LifecycleHandler::default()
            }),
            ..Lifecycle::default()
        }),
        volume_mounts: Some(mounts),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            run_as_user: Some(ENVOY_UID),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".to_owned()]),
                ..Capabilities::default()
            }),
            ..SecurityContext::default()
        }),
        ..Container::default()
    }
}
