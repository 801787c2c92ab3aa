//! `TerdutServer`: the Deployment and Service of one terdut-server install,
//! its database wiring (§8), the operator's own credential (§6) and the
//! credentials handed to the teams that may attach to it (§6.4).
//!
//! One reconcile:
//! 1. Database: `dsn` + `passwordSecretRef` as given, or the DSN and the
//!    credentials Secret derived from a Zalando `postgresql` (§8).
//!    `DatabaseReady` says which is missing.
//! 2. Deployment (config from spec as `TERDUT_*` env, `PGPASSWORD` from the
//!    Secret) and Service.
//! 3. `GET /api/version`: capabilities, and whether anyone bootstrapped.
//! 4. Bootstrap, once: with `<name>-operator-credentials` present there is
//!    nothing to do. With `spec.bootstrap.adminKeySecretRef`, the operator
//!    creates (or re-keys) its own service account. Otherwise, on an empty
//!    install only, `POST /api/bootstrap`; a 403 means someone else
//!    bootstrapped, reported as `Bootstrapped=False/BootstrappedElsewhere`.
//!    The key goes into the owner-referenced credentials Secret, nowhere else.
//!    When the answer to the operator's own POST was lost
//!    (`status.bootstrapRequested`, written before the call went out, is
//!    set but no answer is kept: the operator restarted) and the install
//!    now says it is
//!    bootstrapped, the same POST is sent once more, with the same
//!    `Idempotency-Key`: a server that replays keys hands back the key it
//!    minted; one that does not answers 403, reported as above.
//! 5. Team credentials: for every TerdutTeam that names this server and is
//!    permitted, either a team-scoped key minted into its namespace (when
//!    the server offers team-scoped accounts) or a mirror of the operator's
//!    key into each consenting namespace holding such a team; stale ones
//!    are deleted. Both are label-owned (they live in other namespaces).

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;
use serde_json::{Value, json};
use wasmop_sdk::{HttpMethod, HttpRequest, Plan, ReconcileError, Snapshot};

use crate::api::{
    self, API_KEY, CREDENTIALS_LABEL, Conditions, Endpoint, NamedRef, SecretKey, Settings,
    TEAM_SCOPED_CAPABILITY, URL_KEY, body_of, describe, find_secret, labels_of,
    operator_credentials_name, permits, secret_has,
};

/// Read id: Secrets in the server's namespace.
pub const READ_SECRETS: &str = "secrets";
/// Read id: the Zalando `postgresql` named by `postgresClusterRef`.
pub const READ_POSTGRES: &str = "postgres";
/// Read id: every TerdutTeam (to find the ones naming this server).
pub const READ_TEAMS: &str = "teams";
/// Read id: every Namespace (labels, for `allowedTeams: Selector`).
pub const READ_NAMESPACES: &str = "namespaces";

/// Port terdut-server listens on.
pub const CONTAINER_PORT: u16 = 8080;

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Spec {
    #[serde(default)]
    image: Image,
    #[serde(default)]
    replicas: Option<i32>,
    #[serde(default)]
    networking: Networking,
    #[serde(default)]
    database: Database,
    #[serde(default)]
    sweeper: Value,
    #[serde(default)]
    deadman: Value,
    #[serde(default)]
    notify: Value,
    #[serde(default)]
    oidc: Value,
    #[serde(default)]
    bootstrap: Bootstrap,
}

#[derive(Clone, Debug, Default, Deserialize)]
struct Image {
    #[serde(default)]
    repository: String,
    #[serde(default)]
    tag: String,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Networking {
    #[serde(default)]
    service_port: Option<u16>,
    #[serde(default)]
    hostname: String,
    #[serde(default)]
    gateway_listener: String,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Database {
    #[serde(default)]
    dsn: Option<String>,
    #[serde(default)]
    password_secret_ref: Option<SecretKey>,
    #[serde(default)]
    postgres_cluster_ref: Option<NamedRef>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Bootstrap {
    #[serde(default)]
    admin_key_secret_ref: Option<SecretKey>,
}

/// The database wiring worked out from the spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DatabaseWiring {
    /// The DSN (without a password).
    pub dsn: String,
    /// Where PGPASSWORD comes from.
    pub password: SecretKey,
    /// True when everything it needs is there; else why not.
    pub ready: Result<String, (String, String)>,
}

/// The DSN and credentials Secret of a Zalando cluster (§8, the upstream
/// naming conventions): the first database (by name) and its owner, else
/// the first user and a database of its name.
///
/// # Errors
/// When the cluster declares neither databases nor users.
pub fn zalando_dsn(cluster: &Value) -> Result<(String, String), String> {
    let name = cluster["metadata"]["name"].as_str().unwrap_or_default();
    let namespace = cluster["metadata"]["namespace"]
        .as_str()
        .unwrap_or_default();
    let databases = cluster["spec"]["databases"].as_object();
    let users = cluster["spec"]["users"].as_object();
    let (db, user) = match databases.and_then(|d| d.iter().next()) {
        Some((db, owner)) => (db.clone(), owner.as_str().unwrap_or_default().to_owned()),
        None => match users.and_then(|u| u.keys().next()) {
            Some(user) => (user.clone(), user.clone()),
            None => {
                return Err(format!(
                    "postgresql {name} declares neither spec.databases nor spec.users"
                ));
            }
        },
    };
    if user.is_empty() {
        return Err(format!("postgresql {name}: database {db} has no owner"));
    }
    let dsn = format!("postgres://{user}@{name}.{namespace}.svc:5432/{db}?sslmode=require");
    let secret = format!(
        "{}.{name}.credentials.postgresql.acid.zalan.do",
        user.replace('_', "-")
    );
    Ok((dsn, secret))
}

fn database(
    snapshot: &Snapshot,
    spec: &Spec,
    namespace: &str,
) -> Result<DatabaseWiring, ReconcileError> {
    let db = &spec.database;
    let secret_ready = |password: &SecretKey, ok: String| -> Result<String, (String, String)> {
        match find_secret(snapshot, READ_SECRETS, namespace, &password.name) {
            Some(s) if secret_has(s, &password.key) => Ok(ok),
            Some(_) => Err((
                "PasswordKeyMissing".into(),
                format!("Secret {} has no key {}", password.name, password.key),
            )),
            None => Err((
                "PasswordSecretMissing".into(),
                format!("Secret {} does not exist", password.name),
            )),
        }
    };
    match (&db.dsn, &db.postgres_cluster_ref) {
        (Some(dsn), None) if !dsn.is_empty() => {
            let password = db
                .password_secret_ref
                .clone()
                .filter(|p| !p.name.is_empty())
                .ok_or_else(|| {
                    ReconcileError::invalid_spec(
                        "spec.database.dsn needs spec.database.passwordSecretRef",
                    )
                })?;
            let password = SecretKey {
                key: if password.key.is_empty() {
                    "password".into()
                } else {
                    password.key
                },
                ..password
            };
            let ready = secret_ready(&password, "the DSN and its password Secret are set".into());
            Ok(DatabaseWiring {
                dsn: dsn.clone(),
                password,
                ready,
            })
        }
        (None, Some(cluster_ref)) if !cluster_ref.name.is_empty() => {
            let Some(cluster) = snapshot.related(READ_POSTGRES).next() else {
                return Ok(DatabaseWiring {
                    dsn: String::new(),
                    password: SecretKey::default(),
                    ready: Err((
                        "PostgresClusterNotFound".into(),
                        format!(
                            "postgresql.acid.zalan.do {} not found in namespace {namespace} \
                             (this needs the Zalando postgres-operator's CRD installed, \
                             and the cluster; or use spec.database.dsn)",
                            cluster_ref.name
                        ),
                    )),
                });
            };
            let (dsn, secret_name) = match zalando_dsn(cluster) {
                Ok(x) => x,
                Err(why) => {
                    return Ok(DatabaseWiring {
                        dsn: String::new(),
                        password: SecretKey::default(),
                        ready: Err(("PostgresClusterUnusable".into(), why)),
                    });
                }
            };
            let password = SecretKey::new(&secret_name, "password");
            let phase = cluster["status"]["PostgresClusterStatus"]
                .as_str()
                .unwrap_or("");
            let ready = if phase == "Running" {
                secret_ready(
                    &password,
                    format!("postgresql {} is Running", cluster_ref.name),
                )
                .map_err(|(_, m)| ("CredentialsSecretMissing".to_owned(), m))
            } else {
                Err((
                    "PostgresClusterNotRunning".into(),
                    format!(
                        "postgresql {} is {}",
                        cluster_ref.name,
                        if phase.is_empty() {
                            "not reporting a status yet"
                        } else {
                            phase
                        }
                    ),
                ))
            };
            Ok(DatabaseWiring {
                dsn,
                password,
                ready,
            })
        }
        _ => Err(ReconcileError::invalid_spec(
            "spec.database needs exactly one of dsn (with passwordSecretRef) or postgresClusterRef",
        )),
    }
}

/// Every env name the plugin gives terdut-server's container, with what
/// sets it. All are assumed (terdut-server's configuration is not
/// published; `PGPASSWORD` follows the chart as §8 describes it); the
/// `serverEnv` setting renames any of them.
pub const ASSUMED_ENV: &[(&str, &str)] = &[
    (
        "TERDUT_DATABASE_DSN",
        "spec.database.dsn, or the DSN derived from postgresClusterRef",
    ),
    ("PGPASSWORD", "the database password Secret (secretKeyRef)"),
    ("TERDUT_LISTEN", "`:8080`, the container port"),
    ("TERDUT_SWEEPER_STALE_AFTER", "spec.sweeper.staleAfter"),
    ("TERDUT_SWEEPER_ARCHIVE_AFTER", "spec.sweeper.archiveAfter"),
    ("TERDUT_DEADMAN_MATCHERS", "spec.deadman.matchers"),
    ("TERDUT_DEADMAN_TIMEOUT", "spec.deadman.timeout"),
    ("TERDUT_DEADMAN_SEVERITY", "spec.deadman.severity"),
    ("TERDUT_NOTIFY_NTFY_URL", "spec.notify.ntfyURL"),
    ("TERDUT_NOTIFY_FALLBACK_TOPIC", "spec.notify.fallbackTopic"),
    ("TERDUT_NOTIFY_REPEAT_EVERY", "spec.notify.repeatEvery"),
    (
        "TERDUT_NOTIFY_TOKEN",
        "spec.notify.tokenSecretRef (secretKeyRef)",
    ),
    ("TERDUT_OIDC_ENABLED", "spec.oidc.enabled"),
    ("TERDUT_OIDC_ISSUER", "spec.oidc.issuer"),
    ("TERDUT_OIDC_CLIENT_ID", "spec.oidc.clientID"),
    (
        "TERDUT_OIDC_CLIENT",
        "spec.oidc.clientSecretRef (secretKeyRef; the SecretRef suffix dropped, as for the notify token)",
    ),
    ("TERDUT_OIDC_NAME", "spec.oidc.name"),
    ("TERDUT_OIDC_SCOPES", "spec.oidc.scopes"),
    (
        "TERDUT_OIDC_ALLOWED_GROUPS",
        "spec.oidc.allowedGroups (comma-joined)",
    ),
    ("TERDUT_OIDC_ADMIN_GROUP", "spec.oidc.adminGroup"),
    ("TERDUT_OIDC_SESSION_MAX_AGE", "spec.oidc.sessionMaxAge"),
    ("TERDUT_OIDC_PASSWORD_LOGIN", "spec.oidc.passwordLogin"),
];

/// The readiness probe's path, assumed (`healthPath` overrides it).
pub const ASSUMED_HEALTH_PATH: &str = "/healthz";

/// `TERDUT_<SECTION>_<FIELD>` env vars of a config section: scalars as
/// text, lists comma-joined, `<x>SecretRef` with a name as a secretKeyRef.
fn section_env(section: &str, config: &Value, env: &mut Vec<Value>) {
    let Some(fields) = config.as_object() else {
        return;
    };
    for (field, value) in fields {
        let (field, is_secret) = match field.strip_suffix("SecretRef") {
            Some(base) => (base, true),
            None => (field.as_str(), false),
        };
        let name = format!(
            "TERDUT_{}_{}",
            section.to_ascii_uppercase(),
            screaming(field)
        );
        if is_secret {
            if let Some(secret) = value["name"].as_str().filter(|n| !n.is_empty()) {
                let key = value["key"].as_str().unwrap_or(field);
                env.push(json!({"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}));
            }
            continue;
        }
        let text = match value {
            Value::Null => continue,
            Value::String(s) => s.clone(),
            Value::Array(items) => items
                .iter()
                .map(|i| i.as_str().map_or_else(|| i.to_string(), str::to_owned))
                .collect::<Vec<_>>()
                .join(","),
            other => other.to_string(),
        };
        env.push(json!({"name": name, "value": text}));
    }
}

/// `ntfyURL` → `NTFY_URL`, `staleAfter` → `STALE_AFTER`.
fn screaming(camel: &str) -> String {
    let mut out = String::new();
    let chars: Vec<char> = camel.chars().collect();
    for (i, c) in chars.iter().enumerate() {
        let next_lower = chars.get(i + 1).is_some_and(|n| n.is_lowercase());
        let prev_lower = i > 0 && chars[i - 1].is_lowercase();
        if c.is_uppercase() && i > 0 && (prev_lower || next_lower) {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

fn labels(name: &str) -> Value {
    json!({"app.kubernetes.io/name": "terdut-server", "app.kubernetes.io/instance": name})
}

fn deployment(
    name: &str,
    namespace: &str,
    spec: &Spec,
    db: &DatabaseWiring,
    settings: &Settings,
) -> Value {
    let mut env = vec![
        json!({"name": "TERDUT_DATABASE_DSN", "value": db.dsn}),
        json!({"name": "PGPASSWORD", "valueFrom": {"secretKeyRef": {"name": db.password.name, "key": db.password.key}}}),
        json!({"name": "TERDUT_LISTEN", "value": format!(":{CONTAINER_PORT}")}),
    ];
    section_env("sweeper", &spec.sweeper, &mut env);
    section_env("deadman", &spec.deadman, &mut env);
    section_env("notify", &spec.notify, &mut env);
    section_env("oidc", &spec.oidc, &mut env);
    for var in &mut env {
        let renamed = var["name"]
            .as_str()
            .and_then(|n| settings.server_env.get(n))
            .cloned();
        if let Some(actual) = renamed {
            var["name"] = json!(actual);
        }
    }
    let image = format!(
        "{}:{}",
        if spec.image.repository.is_empty() {
            "git.ryuvia.com/niklas/terdut-server"
        } else {
            &spec.image.repository
        },
        if spec.image.tag.is_empty() {
            "latest"
        } else {
            &spec.image.tag
        }
    );
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels(name)},
        "spec": {
            "replicas": spec.replicas.unwrap_or(1),
            "selector": {"matchLabels": labels(name)},
            "template": {
                "metadata": {"labels": labels(name)},
                "spec": {"containers": [{
                    "name": "terdut-server",
                    "image": image,
                    "ports": [{"name": "http", "containerPort": CONTAINER_PORT}],
                    "env": env,
                    "readinessProbe": {"httpGet": {"path": settings.health_path, "port": "http"}},
                }]},
            },
        },
    })
}

fn service(name: &str, namespace: &str, port: u16) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "labels": labels(name)},
        "spec": {
            "selector": labels(name),
            "ports": [{"name": "http", "port": port, "targetPort": "http"}],
        },
    })
}

/// What minting a key through the service-account endpoints got to.
#[derive(Debug, PartialEq)]
pub enum Mint {
    /// The new key.
    Key(String),
    /// Requests to send; the key comes in a later snapshot.
    Pending(Vec<HttpRequest>),
    /// A request failed; why.
    Failed(String),
}

/// Mints a key for the service account `account` (scope `instance` or
/// `team`) with `admin` credentials: create it, or on 409 look it up and
/// add a key. Observation ids start with `prefix`.
pub fn mint(
    snapshot: &Snapshot,
    admin: &Endpoint,
    prefix: &str,
    account: &str,
    scope: &str,
) -> Mint {
    let create_id = api::id(&[prefix, "create"]);
    let lookup_id = api::id(&[prefix, "lookup"]);
    let key_id = api::id(&[prefix, "key"]);
    let key_of =
        |o: &wasmop_sdk::Observation| body_of(o).and_then(|v| v["key"].as_str().map(str::to_owned));
    if let Some(k) = snapshot.observation(&key_id).and_then(key_of) {
        return Mint::Key(k);
    }
    let Some(created) = snapshot.observation(&create_id) else {
        return Mint::Pending(vec![admin.request(
            &create_id,
            HttpMethod::Post,
            "/api/service-accounts",
            Some(json!({"name": account, "scope": scope})),
        )]);
    };
    if let Some(k) = key_of(created) {
        return Mint::Key(k);
    }
    if created.error.is_none() && created.status == Some(404) {
        return Mint::Failed(format!(
            "POST /api/service-accounts answered 404: this terdut-server has no \
             service-account endpoint (a proposal of the design, §6.6 and §13), so the \
             operator cannot create service account {account}; without \
             spec.bootstrap.adminKeySecretRef it bootstraps an empty install itself"
        ));
    }
    if created.status != Some(409) {
        return Mint::Failed(format!(
            "creating service account {account}: {}",
            describe(created)
        ));
    }
    let lookup_path = format!("/api/service-accounts?name={}", encode(account));
    let Some(found) = snapshot.observation(&lookup_id) else {
        return Mint::Pending(vec![admin.get(&lookup_id, &lookup_path)]);
    };
    let id = body_of(found).and_then(|v| {
        v.as_array()?
            .iter()
            .find(|a| a["name"] == account)
            .and_then(|a| a["id"].as_u64())
    });
    match (id, snapshot.observation(&key_id)) {
        (Some(id), None) => Mint::Pending(vec![admin.request(
            &key_id,
            HttpMethod::Post,
            &format!("/api/service-accounts/{id}/keys"),
            None,
        )]),
        (Some(_), Some(o)) => Mint::Failed(format!("adding a key to {account}: {}", describe(o))),
        (None, _) if found.is_success() => {
            // Listed between the 409 and now: someone deleted it; start over.
            Mint::Pending(vec![admin.get(&lookup_id, &lookup_path)])
        }
        (None, _) => Mint::Failed(format!(
            "looking up service account {account}: {}",
            describe(found)
        )),
    }
}

/// Percent-encodes a query value.
pub fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The base URL the operator calls a server at.
pub fn api_url(server: &Value) -> String {
    let name = server["metadata"]["name"].as_str().unwrap_or_default();
    let namespace = server["metadata"]["namespace"].as_str().unwrap_or_default();
    match server["spec"]["networking"]["apiURL"].as_str() {
        Some(url) if !url.is_empty() => url.trim_end_matches('/').to_owned(),
        _ => {
            let port = server["spec"]["networking"]["servicePort"]
                .as_u64()
                .unwrap_or(u64::from(CONTAINER_PORT));
            format!("http://{name}.{namespace}.svc:{port}")
        }
    }
}

/// One team attached to this server, as the server sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Attached {
    namespace: String,
    name: String,
    permitted: bool,
}

fn attached_teams(snapshot: &Snapshot, name: &str, namespace: &str) -> Vec<Attached> {
    let ns_labels: BTreeMap<&str, BTreeMap<String, String>> = snapshot
        .related(READ_NAMESPACES)
        .filter_map(|n| Some((n["metadata"]["name"].as_str()?, labels_of(n))))
        .collect();
    let empty = BTreeMap::new();
    let mut out: Vec<Attached> = snapshot
        .related(READ_TEAMS)
        .filter_map(|t| {
            let team_ns = t["metadata"]["namespace"].as_str()?;
            let sref = &t["spec"]["serverRef"];
            let ref_ns = sref["namespace"]
                .as_str()
                .filter(|n| !n.is_empty())
                .unwrap_or(team_ns);
            (sref["name"] == name && ref_ns == namespace).then(|| Attached {
                namespace: team_ns.to_owned(),
                name: t["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                permitted: permits(
                    &snapshot.primary,
                    team_ns,
                    ns_labels.get(team_ns).unwrap_or(&empty),
                ),
            })
        })
        .collect();
    out.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    out
}

/// Reconciles one TerdutServer.
///
/// # Errors
/// `InvalidSpec` for a spec the CRD should have refused.
pub fn reconcile(snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
    let settings = Settings::of(snapshot);
    let name = snapshot.primary_name().to_owned();
    let namespace = snapshot.primary_namespace().unwrap_or_default().to_owned();
    let creds_name = operator_credentials_name(&name);
    let owned_creds = snapshot.owned.iter().find(|o| {
        o["kind"] == "Secret"
            && o["metadata"]["name"] == creds_name.as_str()
            && o["metadata"]["namespace"] == namespace.as_str()
    });
    let has_creds = owned_creds.is_some_and(|s| secret_has(s, API_KEY));
    let handed_out: Vec<&Value> = snapshot
        .owned
        .iter()
        .filter(|o| o["kind"] == "Secret" && o["metadata"]["labels"][CREDENTIALS_LABEL].is_string())
        .collect();

    if snapshot.deleting {
        // Every Secret is label-owned (the credentials, the mirrors, the
        // team keys): no garbage collector deletes them, so the finalizer
        // waits until they are gone.
        let secrets: Vec<&Value> = snapshot
            .owned
            .iter()
            .filter(|o| o["kind"] == "Secret")
            .collect();
        let mut plan = Plan::new();
        for s in &secrets {
            plan = plan.delete_owned(s)?;
        }
        return Ok(if secrets.is_empty() {
            plan.cleanup_complete()
        } else {
            plan
        });
    }

    let spec: Spec = serde_json::from_value(snapshot.primary["spec"].clone())
        .map_err(|e| ReconcileError::invalid_spec(format!("spec: {e}")))?;
    let mut conds = Conditions::of(snapshot)?;
    let mut plan = Plan::new();
    let mut status = json!({});

    // 1. Database.
    let db = database(snapshot, &spec, &namespace)?;
    match &db.ready {
        Ok(msg) => conds.set("DatabaseReady", true, "DatabaseConfigured", msg),
        Err((reason, msg)) => conds.set("DatabaseReady", false, reason, msg),
    }
    if let Some(s) = find_secret(snapshot, READ_SECRETS, &namespace, &db.password.name) {
        let version = s["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or_default();
        let before = snapshot.primary["status"]["databaseCredentialsVersion"].as_str();
        // The Deployment's `kubectl rollout restart` stamp: a restart after
        // a rotation picks the new password up (§8, §13: the operator
        // reports it and does not restart by itself).
        let restarted_at = snapshot
            .owned
            .iter()
            .find(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == name.as_str())
            .and_then(|d| {
                d["spec"]["template"]["metadata"]["annotations"]
                    ["kubectl.kubernetes.io/restartedAt"]
                    .as_str()
            })
            .unwrap_or_default()
            .to_owned();
        let old_rotation = &snapshot.primary["status"]["databaseCredentialsRotation"];
        let rotation = if spec.database.postgres_cluster_ref.is_some()
            && before.is_some_and(|b| !b.is_empty() && b != version)
        {
            plan = plan.warning(
                "DatabaseCredentialsRotated",
                format!("Secret {} changed; terdut-server picks the new password up on its next restart", db.password.name),
            );
            Some(json!({"secretVersion": version, "restartedAt": restarted_at}))
        } else if old_rotation.is_object()
            && old_rotation["restartedAt"].as_str().unwrap_or_default() == restarted_at
        {
            Some(old_rotation.clone())
        } else {
            None
        };
        if let Some(r) = rotation {
            conds.set(
                "DatabaseCredentialsRotated",
                true,
                "RestartNeeded",
                &format!(
                    "Secret {} changed after terdut-server started; it uses the new password only after a restart (kubectl rollout restart deployment/{name})",
                    db.password.name
                ),
            );
            status["databaseCredentialsRotation"] = r;
        } else if spec.database.postgres_cluster_ref.is_some() {
            conds.set(
                "DatabaseCredentialsRotated",
                false,
                "Current",
                "terdut-server started with the current password Secret",
            );
        }
        status["databaseCredentialsVersion"] = json!(version);
    }
    // spec.networking.hostname and gatewayListener (the chart's Ingress or
    // Gateway listener) are not built: said plainly, not ignored.
    let unexposed: Vec<&str> = [
        ("hostname", spec.networking.hostname.as_str()),
        ("gatewayListener", spec.networking.gateway_listener.as_str()),
    ]
    .into_iter()
    .filter(|(_, v)| !v.is_empty())
    .map(|(k, _)| k)
    .collect();
    if unexposed.is_empty() {
        conds.remove("Exposed");
    } else {
        let fields = unexposed
            .iter()
            .map(|f| format!("spec.networking.{f}"))
            .collect::<Vec<_>>()
            .join(" and ");
        let message = format!(
            "{fields} not applied: this operator creates no Ingress, HTTPRoute or Gateway listener; expose Service {name} yourself"
        );
        if conds.reason("Exposed") != Some("NotImplemented") {
            plan = plan.warning("NetworkingNotImplemented", message.clone());
        }
        conds.set("Exposed", false, "NotImplemented", &message);
    }

    // 2. Workloads.
    let port = spec.networking.service_port.unwrap_or(CONTAINER_PORT);
    if db.ready.is_ok() {
        plan = plan
            .apply(deployment(&name, &namespace, &spec, &db, &settings))
            .apply(service(&name, &namespace, port));
    }
    status["serviceName"] = json!(name);
    let deployment_available = snapshot
        .owned
        .iter()
        .find(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == name.as_str())
        .is_some_and(|d| {
            d["status"]["availableReplicas"].as_i64().unwrap_or(0) >= 1 || spec.replicas == Some(0)
        });

    // 3. Version and capabilities.
    let url = api_url(&snapshot.primary);
    status["apiURL"] = json!(url);
    let ca = snapshot.primary["spec"]["networking"]["caBundle"].as_str();
    let anonymous = match Endpoint::new(&url, None) {
        Ok(e) => e.with_ca(ca),
        Err(why) => {
            return Err(ReconcileError::invalid_spec(format!(
                "spec.networking.apiURL: {why}"
            )));
        }
    };
    plan = plan.http(anonymous.get("version", "/api/version"));
    let version = snapshot.observation("version");
    let version_body = version.and_then(body_of);
    // No version endpoint (it is a proposal, §13): the plain bootstrap
    // call decides, the way the chart's bootstrap Job does.
    let version_missing = version.is_some_and(|o| o.error.is_none() && o.status == Some(404));

    let capabilities: Vec<String> = version_body
        .as_ref()
        .and_then(|v| serde_json::from_value(v["capabilities"].clone()).ok())
        .or_else(|| serde_json::from_value(snapshot.primary["status"]["capabilities"].clone()).ok())
        .unwrap_or_default();
    status["capabilities"] = json!(capabilities);
    if let Some(v) = version_body.as_ref().and_then(|v| v["version"].as_str()) {
        status["serverVersion"] = json!(v);
    }

    // 4. Bootstrap.
    let before = conds.reason("Bootstrapped").map(str::to_owned);
    let boot_user = format!("wasmop.{namespace}.{name}");
    // Written with the status of the pass that plans the POST, so before
    // the call goes out; cleared once an answer to it is kept.
    let requested =
        snapshot.primary["status"]["bootstrapRequested"].as_str() == Some(boot_user.as_str());
    // The one bootstrap call: the same body every time, so the same
    // Idempotency-Key.
    let boot_request = || {
        anonymous.request(
            "bootstrap",
            HttpMethod::Post,
            "/api/bootstrap",
            Some(json!({"username": boot_user})),
        )
    };
    let mut boot_sent = false;
    let boot = snapshot.observation("bootstrap");
    let bootstrapped = if has_creds {
        conds.set(
            "Bootstrapped",
            true,
            "CredentialsPresent",
            &format!("the operator's key is in Secret {creds_name}"),
        );
        true
    } else {
        let write_key = |plan: Plan, key: &str| {
            plan.apply(api::secret(
                &creds_name,
                &namespace,
                labels(&name),
                &[(API_KEY, key), (URL_KEY, &url)],
            ))
        };
        let admin_ref = spec
            .bootstrap
            .admin_key_secret_ref
            .clone()
            .filter(|r| !r.name.is_empty());
        if let Some(key) = boot
            .and_then(body_of)
            .and_then(|v| v["key"].as_str().map(str::to_owned))
        {
            plan = write_key(plan, &key).event("Bootstrapped", "bootstrapped the empty install; the admin key is in the operator credentials Secret");
            conds.set(
                "Bootstrapped",
                true,
                "Bootstrapped",
                &format!("bootstrapped the install; the key is in Secret {creds_name}"),
            );
            true
        } else if let Some(admin_ref) = admin_ref {
            let admin_ref = SecretKey {
                key: if admin_ref.key.is_empty() {
                    API_KEY.into()
                } else {
                    admin_ref.key
                },
                ..admin_ref
            };
            if find_secret(snapshot, READ_SECRETS, &namespace, &admin_ref.name).is_none() {
                conds.set(
                    "Bootstrapped",
                    false,
                    "AdminKeySecretMissing",
                    &format!(
                        "Secret {} named by spec.bootstrap.adminKeySecretRef does not exist",
                        admin_ref.name
                    ),
                );
                false
            } else {
                let account = format!("wasmop.{namespace}.{name}");
                match mint(
                    snapshot,
                    &anonymous.with_secret(Some(admin_ref)),
                    "operator-sa",
                    &account,
                    "instance",
                ) {
                    Mint::Key(key) => {
                        plan = write_key(plan, &key).event(
                            "ServiceAccountKeyMinted",
                            format!("minted a key for service account {account}"),
                        );
                        conds.set(
                            "Bootstrapped",
                            true,
                            "ServiceAccountCreated",
                            &format!(
                                "the key of service account {account} is in Secret {creds_name}"
                            ),
                        );
                        true
                    }
                    Mint::Pending(requests) => {
                        for r in requests {
                            plan = plan.http(r);
                        }
                        conds.set(
                            "Bootstrapped",
                            false,
                            "Bootstrapping",
                            &format!("creating service account {account}"),
                        );
                        false
                    }
                    Mint::Failed(why) => {
                        conds.set("Bootstrapped", false, "ServiceAccountFailed", &why);
                        false
                    }
                }
            }
        } else if snapshot.primary["status"]["operatorCredentialsSecretRef"]["name"]
            == creds_name.as_str()
        {
            // Our own bootstrap succeeded (the status says so, written with
            // the Secret): a snapshot that does not show the Secret yet must
            // not send the single-shot POST again, whose 403 would read as
            // someone else's bootstrap.
            conds.set(
                "Bootstrapped",
                false,
                "CredentialsSecretMissing",
                &format!(
                    "the operator's key was written to Secret {creds_name}, which is not there (yet); POST /api/bootstrap is single-shot, so if it was deleted, name an admin key in spec.bootstrap.adminKeySecretRef"
                ),
            );
            false
        } else if boot.is_none()
            && requested
            && version_body
                .as_ref()
                .is_some_and(|v| v["bootstrapped"] == true)
        {
            // Our own POST went out (`bootstrapRequested` was written before
            // it) and its answer is gone with the replica that sent it; the
            // install says it is bootstrapped, maybe by that very call. The
            // same request carries the same Idempotency-Key: a server that
            // replays keys hands back the key it minted, any other answers
            // 403, and that answer is kept and reported as bootstrapped
            // elsewhere. Sent once per lost answer: a kept 403 ends it.
            plan = plan.http(boot_request());
            boot_sent = true;
            conds.set(
                "Bootstrapped",
                false,
                "Bootstrapping",
                "the answer to the operator's POST /api/bootstrap was lost (it restarted while the call was out) and the install says it is bootstrapped: asking again with the same Idempotency-Key; a server that replays it hands back the key, a 403 means bootstrapped elsewhere",
            );
            false
        } else if boot.is_some_and(|o| o.status == Some(403))
            || version_body
                .as_ref()
                .is_some_and(|v| v["bootstrapped"] == true)
        {
            let mut message = "the install was bootstrapped by someone else (POST /api/bootstrap is single-shot per install); put an admin key in a Secret and name it in spec.bootstrap.adminKeySecretRef so the operator can create its own service account".to_owned();
            if version_missing {
                message.push_str(" (this server has no GET /api/version: it answered 404, so the 403 of POST /api/bootstrap decided)");
            }
            conds.set("Bootstrapped", false, "BootstrappedElsewhere", &message);
            false
        } else if let Some(o) = boot {
            conds.set(
                "Bootstrapped",
                false,
                "BootstrapFailed",
                &format!("POST /api/bootstrap: {}", describe(o)),
            );
            plan = plan.http(boot_request());
            boot_sent = true;
            false
        } else if version_missing
            || version_body
                .as_ref()
                .is_some_and(|v| v["bootstrapped"] == false)
        {
            plan = plan.http(boot_request());
            boot_sent = true;
            let message = if version_missing {
                "GET /api/version answered 404 (this server has no version endpoint, a proposal of the design's §13): trying POST /api/bootstrap; a 403 would mean the install is bootstrapped already"
            } else {
                "the install is empty: bootstrapping it"
            };
            conds.set("Bootstrapped", false, "Bootstrapping", message);
            false
        } else {
            let why = version.map_or_else(
                || "asking the server for its version".to_owned(),
                |o| format!("GET /api/version: {}", describe(o)),
            );
            conds.unknown("Bootstrapped", "WaitingForServer", &why);
            false
        }
    };
    if !bootstrapped
        && conds.reason("Bootstrapped") == Some("BootstrappedElsewhere")
        && before.as_deref() != Some("BootstrappedElsewhere")
    {
        plan = plan.warning("BootstrappedElsewhere", "terdut-server answered that it is bootstrapped already; the operator needs spec.bootstrap.adminKeySecretRef");
    }
    // Until an answer to our POST is kept (or one is sent now).
    status["bootstrapRequested"] = if boot_sent || (requested && !bootstrapped && boot.is_none()) {
        json!(boot_user)
    } else {
        Value::Null
    };
    // Kept while the Secret is missing after our own bootstrap: it is what
    // keeps the single-shot POST from being sent again.
    status["operatorCredentialsSecretRef"] =
        if bootstrapped || conds.reason("Bootstrapped") == Some("CredentialsSecretMissing") {
            json!({"name": creds_name})
        } else {
            Value::Null
        };

    // 5. Team credentials.
    let team_scoped = capabilities.iter().any(|c| c == TEAM_SCOPED_CAPABILITY);
    let teams = attached_teams(snapshot, &name, &namespace);
    let mut wanted: BTreeSet<(String, String)> = BTreeSet::new();
    let mut handed = Vec::new();
    if has_creds && let Some(source) = owned_creds {
        let operator = anonymous.with_secret(Some(SecretKey::new(&creds_name, API_KEY)));
        for t in teams.iter().filter(|t| t.permitted) {
            if team_scoped {
                let secret_name = api::team_key_name(&t.name);
                wanted.insert((t.namespace.clone(), secret_name.clone()));
                let exists = handed_out.iter().any(|s| {
                    s["metadata"]["namespace"] == t.namespace.as_str()
                        && s["metadata"]["name"] == secret_name.as_str()
                });
                handed.push(json!({"namespace": t.namespace, "team": t.name, "secret": secret_name, "kind": "team-key"}));
                if exists {
                    continue;
                }
                let account = format!("team.{}.{}", t.namespace, t.name);
                match mint(
                    snapshot,
                    &operator,
                    &api::id(&["team-sa", &t.namespace, &t.name]),
                    &account,
                    "team",
                ) {
                    Mint::Key(key) => {
                        plan = plan.apply(api::secret(
                            &secret_name,
                            &t.namespace,
                            json!({CREDENTIALS_LABEL: "team-key"}),
                            &[(API_KEY, &key), (URL_KEY, &url)],
                        ));
                    }
                    Mint::Pending(requests) => {
                        for r in requests {
                            plan = plan.http(r);
                        }
                    }
                    Mint::Failed(why) => {
                        plan = plan.warning(
                            "TeamKeyFailed",
                            format!("team {}/{}: {why}", t.namespace, t.name),
                        );
                    }
                }
            } else if t.namespace != namespace {
                let mirror = api::mirror_name(&name, &namespace);
                if wanted.insert((t.namespace.clone(), mirror.clone())) {
                    handed.push(
                        json!({"namespace": t.namespace, "secret": mirror, "kind": "mirror"}),
                    );
                    plan = plan.apply(json!({
                        "apiVersion": "v1", "kind": "Secret",
                        "metadata": {"name": mirror, "namespace": t.namespace, "labels": {CREDENTIALS_LABEL: "mirror"}},
                        "type": "Opaque",
                        "data": {API_KEY: source["data"][API_KEY], URL_KEY: api::base64(url.as_bytes())},
                    }));
                }
            }
        }
    }
    for s in &handed_out {
        let key = (
            s["metadata"]["namespace"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            s["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        );
        if !wanted.contains(&key) {
            plan = plan.delete_owned(s)?;
        }
    }
    status["teamCredentials"] = Value::Array(handed);

    // Ready.
    let db_ok = db.ready.is_ok();
    let (ready, reason, message) = if !db_ok {
        (
            false,
            "DatabaseNotReady",
            "the database is not ready (see DatabaseReady)".to_owned(),
        )
    } else if !bootstrapped {
        (
            false,
            "NotBootstrapped",
            "the operator has no credentials for the server yet (see Bootstrapped)".to_owned(),
        )
    } else if !deployment_available {
        (
            false,
            "DeploymentNotAvailable",
            format!("Deployment {name} has no available replica yet"),
        )
    } else {
        (
            true,
            "Available",
            format!("terdut-server {name} is available at {url}"),
        )
    };
    conds.set("Ready", ready, reason, &message);
    status["conditions"] = conds.to_json();
    let requeue = if ready {
        settings.resync
    } else {
        settings.retry
    };
    Ok(plan.status(status).requeue_after(requeue))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn screaming_snake() {
        assert_eq!(screaming("staleAfter"), "STALE_AFTER");
        assert_eq!(screaming("ntfyURL"), "NTFY_URL");
        assert_eq!(screaming("clientID"), "CLIENT_ID");
        assert_eq!(screaming("enabled"), "ENABLED");
    }

    #[test]
    fn zalando_names() {
        let c = json!({"metadata": {"name": "acid-minimal-cluster", "namespace": "db"},
                       "spec": {"users": {"zalando": [], "foo_user": []}, "databases": {"foo": "zalando"}}});
        assert_eq!(
            zalando_dsn(&c).unwrap(),
            (
                "postgres://zalando@acid-minimal-cluster.db.svc:5432/foo?sslmode=require"
                    .to_owned(),
                "zalando.acid-minimal-cluster.credentials.postgresql.acid.zalan.do".to_owned()
            )
        );
        let users_only = json!({"metadata": {"name": "c", "namespace": "n"}, "spec": {"users": {"terdut_app": []}}});
        assert_eq!(
            zalando_dsn(&users_only).unwrap().1,
            "terdut-app.c.credentials.postgresql.acid.zalan.do"
        );
        assert!(zalando_dsn(&json!({"metadata": {"name": "c"}, "spec": {}})).is_err());
    }

    #[test]
    fn config_sections_become_env() {
        let mut env = Vec::new();
        section_env(
            "notify",
            &json!({"ntfyURL": "http://ntfy", "repeatEvery": "15m", "tokenSecretRef": {"name": "tok", "key": "token"},
                    "fallbackTopic": ""}),
            &mut env,
        );
        section_env(
            "oidc",
            &json!({"enabled": true, "allowedGroups": ["a", "b"], "clientSecretRef": {"name": ""}}),
            &mut env,
        );
        assert_eq!(
            env,
            vec![
                json!({"name": "TERDUT_NOTIFY_FALLBACK_TOPIC", "value": ""}),
                json!({"name": "TERDUT_NOTIFY_NTFY_URL", "value": "http://ntfy"}),
                json!({"name": "TERDUT_NOTIFY_REPEAT_EVERY", "value": "15m"}),
                json!({"name": "TERDUT_NOTIFY_TOKEN", "valueFrom": {"secretKeyRef": {"name": "tok", "key": "token"}}}),
                json!({"name": "TERDUT_OIDC_ALLOWED_GROUPS", "value": "a,b"}),
                json!({"name": "TERDUT_OIDC_ENABLED", "value": "true"}),
            ]
        );
    }

    #[test]
    fn api_url_defaults_to_the_service() {
        let s = json!({"metadata": {"name": "terdut", "namespace": "oncall"}, "spec": {"networking": {"servicePort": 80}}});
        assert_eq!(api_url(&s), "http://terdut.oncall.svc:80");
        let s = json!({"metadata": {"name": "terdut", "namespace": "oncall"}, "spec": {"networking": {"apiURL": "http://127.0.0.1:9/"}}});
        assert_eq!(api_url(&s), "http://127.0.0.1:9");
    }

    #[test]
    fn encode_query_values() {
        assert_eq!(encode("team.a b/c"), "team.a%20b%2Fc");
    }
}
