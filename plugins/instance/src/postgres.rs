//! Step `postgres` (condition `PostgresReady`): the database behind the
//! metadata service.
//!
//! - **Provisioned** (no `spec.metadata.postgres`): a credentials Secret
//!   `<i>-metadata-postgres-creds` (`username`, and a `password` the host
//!   generates: [`PASSWORD_BYTES`] random bytes as hex, made once when the
//!   Secret lacks it and never rewritten, so no reader of the instance can
//!   derive it), a one-replica StatefulSet
//!   `<i>-metadata-pg` (container `postgresql`, uid 70, a `data` volume
//!   claim removed with the StatefulSet) and its headless Service. Ready
//!   when the StatefulSet reports a ready replica.
//! - **External**: nothing is created. The Secret named by
//!   `credentialsSecretRef` must exist and hold non-empty `username` and
//!   `password`; otherwise the condition says which is missing
//!   (`PostgresSecretPreflightFailed`). The operator never invents it.
//!
//! Either way [`target`] tells the metadata step where the database is and
//! which Secret holds its credentials; that needs only the spec, so the
//! metadata step does not depend on this step succeeding.

use std::collections::BTreeMap;

use serde_json::json;
use wasmop_sdk::GeneratedKey;
use wasmop_sdk::k8s_openapi::ByteString;
use wasmop_sdk::k8s_openapi::api::apps::v1::{
    StatefulSet, StatefulSetPersistentVolumeClaimRetentionPolicy, StatefulSetSpec,
};
use wasmop_sdk::k8s_openapi::api::core::v1::{
    Container, PersistentVolumeClaim, PersistentVolumeClaimSpec, PodSecurityContext, PodSpec,
    PodTemplateSpec, Secret, SecurityContext, Service, ServiceSpec, VolumeMount,
    VolumeResourceRequirements,
};
use wasmop_sdk::k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use wasmop_sdk::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::names::{Component, POSTGRES_PORT};
use crate::spec::ExternalPostgres;
use crate::step::{Context, Desired, Failure, Health, Outcome, StepDef};
use crate::workload::{
    container_port, env, env_from_secret, exec_probe, meta, ready_replicas, selector, service_port,
    set_config_hash,
};

/// The step.
pub const STEP: StepDef = StepDef {
    name: "postgres",
    condition: "PostgresReady",
    components: &[Component::Postgres],
    in_ready_rollup: true,
    run,
};

/// Id of the read that brings the external credentials Secret.
pub const CREDENTIALS_READ: &str = "postgres-credentials";
/// Field of the primary naming that Secret.
pub const CREDENTIALS_FIELD: &str = "spec.metadata.postgres.credentialsSecretRef.name";

/// Database of the provisioned PostgreSQL.
pub const DATABASE: &str = "firebolt_metadata";
/// User of the provisioned PostgreSQL.
pub const USER: &str = "firebolt";
/// Keys the credentials Secret holds (provisioned or external).
pub const CREDENTIAL_KEYS: [&str; 2] = ["username", "password"];

/// Random bytes of the generated PostgreSQL password (written as
/// 2 × this many hex characters).
pub const PASSWORD_BYTES: u16 = 24;

/// uid and gid of the `postgres` user in the alpine image.
const POSTGRES_UID: i64 = 70;
const DATA_DIR: &str = "/var/lib/postgresql/data";

/// Where the metadata service finds its database.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// Host name.
    pub host: String,
    /// Port.
    pub port: i32,
    /// Database.
    pub database: String,
    /// Schema.
    pub schema: String,
    /// Secret with `username` and `password`.
    pub secret: String,
}

/// Where the instance's database is, from the spec alone.
pub fn target(ctx: &Context<'_>) -> Target {
    match &ctx.spec.metadata.postgres {
        Some(ext) => Target {
            host: ext.host.clone(),
            port: ext.port,
            database: ext.database.clone(),
            schema: ext.schema.clone(),
            secret: ext.credentials_secret_ref.name.clone(),
        },
        None => Target {
            host: ctx.names.service_host(&ctx.names.postgres()),
            port: POSTGRES_PORT,
            database: DATABASE.to_owned(),
            schema: "public".to_owned(),
            secret: ctx.names.postgres_secret(),
        },
    }
}

/// Why the external database cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PostgresError {
    /// The credentials Secret does not exist.
    #[error("Secret {name:?} named by spec.metadata.postgres.credentialsSecretRef does not exist")]
    SecretMissing {
        /// The Secret's name.
        name: String,
    },
    /// The credentials Secret lacks a key, or its value is empty.
    #[error("Secret {name:?} has no non-empty key {key:?} (it needs `username` and `password`)")]
    KeyMissing {
        /// The Secret's name.
        name: String,
        /// The missing key.
        key: &'static str,
    },
}

impl From<PostgresError> for Failure {
    fn from(e: PostgresError) -> Self {
        Failure::new("PostgresSecretPreflightFailed", e.to_string())
    }
}

fn run(ctx: &Context<'_>) -> Result<Outcome, Failure> {
    match &ctx.spec.metadata.postgres {
        Some(external) => preflight(ctx, external),
        None => provision(ctx),
    }
}

/// Checks the external database's credentials Secret.
fn preflight(ctx: &Context<'_>, external: &ExternalPostgres) -> Result<Outcome, Failure> {
    let name = &external.credentials_secret_ref.name;
    let secret: Option<Secret> = ctx.snapshot.related_one(CREDENTIALS_READ)?;
    let Some(secret) = secret.filter(|s| s.metadata.name.as_deref() == Some(name)) else {
        return Err(PostgresError::SecretMissing { name: name.clone() }.into());
    };
    for key in CREDENTIAL_KEYS {
        let in_data = secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .is_some_and(|v| !v.0.is_empty());
        let in_string_data = secret
            .string_data
            .as_ref()
            .and_then(|d| d.get(key))
            .is_some_and(|v| !v.is_empty());
        if !in_data && !in_string_data {
            return Err(PostgresError::KeyMissing {
                name: name.clone(),
                key,
            }
            .into());
        }
    }
    Ok(Outcome {
        objects: Vec::new(),
        health: Health::ready(
            "Ready",
            format!(
                "using external PostgreSQL {}:{}/{} with credentials from Secret {name}",
                external.host, external.port, external.database
            ),
        ),
    })
}

/// Renders the provisioned database and reports whether it is ready.
fn provision(ctx: &Context<'_>) -> Result<Outcome, Failure> {
    let names = ctx.names;
    let ns = names.namespace();
    let labels = names.labels(Component::Postgres);
    let name = names.postgres();

    // The password is the host's to make (see PASSWORD_BYTES): only its
    // name is in the plan.
    let secret = Secret {
        metadata: meta(names.postgres_secret(), ns, &labels),
        type_: Some("Opaque".to_owned()),
        data: Some(BTreeMap::from([(
            "username".to_owned(),
            ByteString(USER.as_bytes().to_vec()),
        )])),
        ..Secret::default()
    };

    let service = Service {
        metadata: meta(name.clone(), ns, &labels),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".to_owned()),
            selector: Some(labels.clone()),
            ports: Some(vec![service_port(
                "tcp-postgresql",
                POSTGRES_PORT,
                "tcp-postgresql",
            )]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    };

    let observed: Option<StatefulSet> = ctx.observed("StatefulSet", &name)?;
    let statefulset = statefulset(ctx, &labels, observed.as_ref());

    let health = match &observed {
        Some(sts) if ready_replicas(sts) >= 1 => {
            Health::ready("Ready", format!("PostgreSQL StatefulSet {name} is ready"))
        }
        Some(_) => Health::waiting(
            "Provisioning",
            format!("waiting for PostgreSQL StatefulSet {name} to have a ready pod"),
        ),
        None => Health::waiting(
            "Provisioning",
            format!("creating PostgreSQL StatefulSet {name}"),
        ),
    };

    Ok(Outcome {
        objects: vec![
            Desired::generating(secret, vec![GeneratedKey::hex("password", PASSWORD_BYTES)]),
            Desired::apply(service),
            Desired::apply(statefulset),
        ],
        health,
    })
}

fn statefulset(
    ctx: &Context<'_>,
    labels: &BTreeMap<String, String>,
    observed: Option<&StatefulSet>,
) -> StatefulSet {
    let names = ctx.names;
    let secret = names.postgres_secret();
    let ready = ["pg_isready", "-U", USER, "-d", DATABASE, "-h", "127.0.0.1"];
    let container = Container {
        name: "postgresql".to_owned(),
        image: Some(ctx.settings.postgres_image.clone()),
        ports: Some(vec![container_port("tcp-postgresql", POSTGRES_PORT)]),
        env: Some(vec![
            env("POSTGRES_DB", DATABASE),
            env_from_secret("POSTGRES_USER", &secret, "username"),
            env_from_secret("POSTGRES_PASSWORD", &secret, "password"),
            env("PGDATA", &format!("{DATA_DIR}/pgdata")),
        ]),
        volume_mounts: Some(vec![VolumeMount {
            name: "data".to_owned(),
            mount_path: DATA_DIR.to_owned(),
            ..VolumeMount::default()
        }]),
        readiness_probe: Some(exec_probe(&ready, 5, 3)),
        liveness_probe: Some(exec_probe(&ready, 10, 6)),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            ..SecurityContext::default()
        }),
        ..Container::default()
    };
    let mut template = PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(labels.clone()),
            ..ObjectMeta::default()
        }),
        spec: Some(PodSpec {
            containers: vec![container],
            security_context: Some(PodSecurityContext {
                run_as_user: Some(POSTGRES_UID),
                run_as_group: Some(POSTGRES_UID),
                fs_group: Some(POSTGRES_UID),
                run_as_non_root: Some(true),
                ..PodSecurityContext::default()
            }),
            ..PodSpec::default()
        }),
    };
    // The password is fixed once the Secret exists; the Secret's name and
    // the template are all that can change the pods.
    set_config_hash(&mut template, &json!({"credentialsSecret": secret}));

    // Volume claim templates cannot change after creation: keep the ones
    // the StatefulSet was created with, so a new size setting does not
    // make every later apply fail.
    let claims = observed
        .and_then(|sts| sts.spec.as_ref())
        .and_then(|spec| spec.volume_claim_templates.clone())
        .unwrap_or_else(|| vec![data_claim(&ctx.settings.postgres_storage_size)]);

    StatefulSet {
        metadata: meta(names.postgres(), names.namespace(), labels),
        spec: Some(StatefulSetSpec {
            replicas: Some(1),
            service_name: Some(names.postgres()),
            selector: selector(labels),
            template,
            volume_claim_templates: Some(claims),
            persistent_volume_claim_retention_policy: Some(
                StatefulSetPersistentVolumeClaimRetentionPolicy {
                    when_deleted: Some("Delete".to_owned()),
                    when_scaled: Some("Retain".to_owned()),
                },
            ),
            ..StatefulSetSpec::default()
        }),
        ..StatefulSet::default()
    }
}

fn data_claim(size: &str) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some("data".to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".to_owned()]),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_owned(),
                    Quantity(size.to_owned()),
                )])),
                ..VolumeResourceRequirements::default()
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        ..PersistentVolumeClaim::default()
    }
}
