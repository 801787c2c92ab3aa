//! Step `engine-tls` (condition `EngineTLSReady`, `status.engineTLS`,
//! `status.rolledEngineTrustCAs`): TLS on every engine's query listener
//! (3473, TLS instead of plaintext, one listener) and the gateway's
//! re-encryption to engines.
//!
//! - **Provisioning.** The trust anchor is a cert-manager Certificate
//!   `<i>-engine-tls` (or the user's `secretRef`); once its Secret holds
//!   `tls.crt`, `tls.key` and `ca.crt`, `status.engineTLS` is populated.
//!   That fact alone lets engines roll onto TLS (each generation gets its
//!   own Certificate from the same issuer, made by the engine plugin).
//! - **Re-encryption is fleet-wide** (the gateway has one upstream
//!   cluster): `status.engineTLS.reencrypting` turns true only once every
//!   engine reports `observedEngineTLSHash == status.engineTLS.tlsHash`
//!   (it serves TLS on every pod), and stays true while TLS is enabled.
//! - **Disable is symmetric**: `status.engineTLS` (and the anchor, the
//!   bundle and re-encryption) stay until every engine reports an empty
//!   `observedEngineTLSHash` (plaintext again); then they go.
//! - **Trust bundle**: Secret `<i>-engine-ca-bundle` (`ca.crt`) is the
//!   union of the anchor's CA and the CA of every live engine generation's
//!   TLS Secret, reassembled every reconcile, so a CA leaves the bundle
//!   when its last generation is deleted.
//! - **Rolled trust**: `status.rolledEngineTrustCAs` lists the CA
//!   fingerprints every gateway pod trusts: those of the gateway pod
//!   template once the Deployment has fully rolled out, else only those
//!   also in the previous list. Empty while the gateway does not
//!   re-encrypt (engines then need no trust to switch).
//!
//! - **A failure keeps the posture**: once provisioned, an invalid
//!   `spec.tls.engine` or an anchor Secret that lost its keys is reported
//!   on `EngineTLSReady` (`TLSSpecInvalid`, `SecretPending`) while
//!   `status.engineTLS` and the gateway's upstream side (re-encryption, the
//!   trust bundle as written, the revocation list it mounts) stay as they
//!   were: the gateway neither stops re-encrypting to engines that serve
//!   TLS nor rolls with an empty trust list.
//!
//! `EngineTLSReady` is `True` only when the whole fleet is re-encrypted
//! (or TLS is off and every engine is plaintext).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};
use wasmop_sdk::stable_hash;

use crate::certs::{self, Usage};
use crate::duration;
use crate::fleet::{self, Engine};
use crate::names::{
    COMPONENT_LABEL, Component, ENGINE_LABEL, ENGINE_TRUST_CAS_ANNOTATION, INSTANCE_LABEL,
};
use crate::pem;
use crate::step::{Context, Desired, Failure, Health, Outcome};

/// Id of the read bringing the engines' per-generation TLS Secrets.
pub const ENGINE_SECRETS_READ: &str = "engine-tls-secrets";
/// Label selector of that read.
pub const ENGINE_SECRETS_SELECTOR: &str = "firebolt.io/engine,firebolt.io/component=engine-tls";
/// Id of the read bringing the user's engine TLS Secret.
pub const USER_SECRET_READ: &str = "engine-tls-secret";
/// Field naming it.
pub const USER_SECRET_FIELD: &str = "spec.tls.engine.secretRef.name";
/// Keys the anchor Secret must hold.
pub const ANCHOR_KEYS: [&str; 3] = ["tls.crt", "tls.key", "ca.crt"];

/// What the engine TLS step decided.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineTlsEval {
    /// The step's answer.
    pub result: Result<Outcome, Failure>,
    /// `status.engineTLS`.
    pub status: Option<Value>,
    /// Whether the gateway re-encrypts to engines.
    pub reencrypting: bool,
    /// The trust bundle (PEM) and its fingerprints, while there is one.
    pub bundle: Option<(String, Vec<String>)>,
    /// The engine revocation list the gateway loads while re-encrypting:
    /// the user's Secret (`spec.tls.engine.crlSecretRef`) and its
    /// resourceVersion, once it holds `crl.pem`.
    pub crl: Option<Crl>,
}

/// A revocation list Secret the gateway mounts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Crl {
    /// The Secret's name.
    pub secret: String,
    /// Its resourceVersion (a new list rolls the gateway).
    pub version: String,
}

/// Key of a revocation list Secret.
pub const CRL_KEY: &str = "crl.pem";
/// Id of the read bringing the engine revocation list Secret.
pub const CRL_READ: &str = "engine-tls-crl";
/// Field of the primary naming it.
pub const CRL_FIELD: &str = "spec.tls.engine.crlSecretRef.name";

/// The revocation list of read `read`, when the Secret exists and holds
/// a non-empty `crl.pem`.
pub fn crl_of(ctx: &Context<'_>, read: &str) -> Option<Crl> {
    let s = ctx
        .snapshot
        .related(read)
        .next()
        .filter(|s| pem::has_keys(s, &[CRL_KEY]))?;
    Some(Crl {
        secret: s
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        version: s
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
    })
}

/// The hash engines report once every pod serves TLS under this spec.
pub fn tls_hash(ctx: &Context<'_>, secret_name: &str) -> String {
    let spec = &ctx.spec.tls.engine;
    stable_hash(&json!({
        "secretName": secret_name,
        "certManager": spec.cert_manager.as_ref().map(|cm| json!({
            "algorithm": cm.algorithm(), "size": cm.size(),
            "duration": cm.duration, "renewBefore": cm.renew_before,
        })),
    }))
}

/// Runs the step.
pub fn evaluate(ctx: &Context<'_>, engines: &[Engine]) -> EngineTlsEval {
    let spec = &ctx.spec.tls.engine;
    let names = ctx.names;
    let previous = ctx.snapshot.primary.pointer("/status/engineTLS");
    let was_reencrypting = previous
        .and_then(|p| p.get("reencrypting"))
        .and_then(Value::as_bool)
        .unwrap_or(false);

    let crl = spec.crl().and_then(|_| crl_of(ctx, CRL_READ));
    if !spec.enabled {
        let plaintext = fleet::lagging(engines, |e| !e.tls_hash.is_empty());
        if was_reencrypting && !plaintext.is_empty() {
            // Disabling: keep the anchor, the bundle and re-encryption
            // until every engine serves plaintext again.
            // The spec no longer describes the anchor: keep what exists.
            let mut objects: Vec<Desired> = keep_observed(ctx, "Certificate", &names.engine_tls())
                .into_iter()
                .collect();
            if ctx
                .snapshot
                .owned_named("Secret", &names.engine_tls())
                .is_some()
            {
                objects.push(Desired::create_only(certs::empty_tls_secret(
                    &names.engine_tls(),
                    names.namespace(),
                    &names.labels(Component::EngineTls),
                )));
            }
            let bundle = bundle(ctx, previous_secret(previous).as_deref());
            objects.extend(bundle_object(ctx, &bundle));
            return EngineTlsEval {
                result: Ok(Outcome {
                    objects,
                    health: Health::waiting(
                        "Converging",
                        format!(
                            "engine TLS is being disabled; the gateway re-encrypts until {} engine(s) serve plaintext: {}",
                            plaintext.len(),
                            plaintext.join(", ")
                        ),
                    ),
                }),
                status: previous.cloned(),
                reencrypting: true,
                bundle: Some(bundle),
                crl,
            };
        }
        return EngineTlsEval {
            result: Ok(Outcome {
                objects: Vec::new(),
                health: Health::ready("Disabled", "engine TLS (spec.tls.engine) is disabled"),
            }),
            status: None,
            reencrypting: false,
            bundle: None,
            crl: None,
        };
    }

    let problems = crate::validate::tls(crate::validate::ListenerKind::Engine, spec);
    if !problems.is_empty() {
        return failed(
            ctx,
            previous,
            Failure::new("TLSSpecInvalid", crate::validate::message(&problems)),
        );
    }
    let (secret_name, objects) = match spec.user_secret() {
        Some(name) => (name.to_owned(), Vec::new()),
        None => (names.engine_tls(), anchor_objects(ctx)),
    };
    let anchor = match spec.user_secret() {
        Some(_) => ctx
            .snapshot
            .related(USER_SECRET_READ)
            .next()
            .filter(|s| pem::has_keys(s, &ANCHOR_KEYS)),
        None => ctx.owned_secret_with(&secret_name, &ANCHOR_KEYS),
    };
    if anchor.is_none() && previous.is_some() {
        // Provisioned before: engines serve TLS under it and the gateway
        // may re-encrypt. A Secret that lost its keys must not turn
        // re-encryption off or empty the gateway's trust.
        return failed(
            ctx,
            previous,
            Failure::new(
                "SecretPending",
                format!(
                    "Secret {secret_name} no longer holds tls.crt, tls.key and ca.crt; \
                     engines and the gateway keep their TLS posture until it does"
                ),
            ),
        );
    }
    if anchor.is_none() {
        return EngineTlsEval {
            result: Ok(Outcome {
                objects,
                health: Health::waiting(
                    "SecretPending",
                    format!("waiting for Secret {secret_name} to hold tls.crt, tls.key and ca.crt"),
                ),
            }),
            status: None,
            reencrypting: false,
            bundle: None,
            crl: None,
        };
    }
    let hash = tls_hash(ctx, &secret_name);
    let behind = fleet::lagging(engines, |e| e.tls_hash != hash);
    let reencrypting = was_reencrypting || behind.is_empty();
    let created_at = previous
        .and_then(|p| p.get("createdAt"))
        .cloned()
        .unwrap_or_else(|| json!(duration::rfc3339(ctx.now_seconds())));
    let status = json!({
        "secretName": secret_name,
        "createdAt": created_at,
        "reencrypting": reencrypting,
        "tlsHash": hash,
    });
    let bundle = bundle(ctx, Some(&secret_name));
    let mut objects = objects;
    objects.extend(bundle_object(ctx, &bundle));
    let health = if let Some(name) = spec.crl().filter(|_| crl.is_none()) {
        // Re-encryption goes on (engines stay reachable); the gateway
        // cannot revoke until the list is there.
        Health::waiting(
            "CRLSecretPreflightFailed",
            format!(
                "Secret {name} named by spec.tls.engine.crlSecretRef does not exist or has no {CRL_KEY}"
            ),
        )
    } else if reencrypting {
        Health::ready(
            "Ready",
            format!(
                "every engine serves TLS; the gateway re-encrypts against {} CA(s)",
                bundle.1.len()
            ),
        )
    } else {
        Health::waiting(
            "Converging",
            format!(
                "the gateway re-encrypts once every engine serves TLS; waiting for {}: {}",
                behind.len(),
                behind.join(", ")
            ),
        )
    };
    EngineTlsEval {
        result: Ok(Outcome { objects, health }),
        status: Some(status),
        reencrypting,
        bundle: Some(bundle),
        crl,
    }
}

/// The step failed after engine TLS was provisioned: it reports
/// `failure`, keeps `status.engineTLS` as it was, and hands the gateway
/// the upstream posture it has now — re-encrypting as the status says,
/// trusting the bundle Secret as last written, loading the revocation list
/// it mounts — so the gateway's config hash, trust annotation and CRL
/// mount stay as they were.
fn failed(ctx: &Context<'_>, previous: Option<&Value>, failure: Failure) -> EngineTlsEval {
    let reencrypting = previous
        .and_then(|p| p.get("reencrypting"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    EngineTlsEval {
        result: Err(failure),
        status: previous.cloned(),
        reencrypting,
        bundle: reencrypting.then(|| written_bundle(ctx)),
        crl: reencrypting.then(|| mounted_crl(ctx)).flatten(),
    }
}

/// The trust bundle as the bundle Secret holds it (what the gateway pods
/// mount), in the form [`bundle`] makes it.
fn written_bundle(ctx: &Context<'_>) -> (String, Vec<String>) {
    let mut cas: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    if let Some(ca) = ctx
        .snapshot
        .owned_named("Secret", &ctx.names.engine_ca_bundle())
        .and_then(|s| pem::secret_bytes(s, "ca.crt"))
    {
        for der in pem::certificates(&ca) {
            cas.insert(pem::fingerprint(&der), der);
        }
    }
    let text: String = cas.values().map(|der| pem::to_pem(der)).collect();
    (text, cas.into_keys().collect())
}

/// The engine revocation list the gateway Deployment mounts now, if any
/// (its version as the read shows that Secret).
fn mounted_crl(ctx: &Context<'_>) -> Option<Crl> {
    let gateway = ctx
        .snapshot
        .owned_named("Deployment", &ctx.names.gateway())?;
    let secret = gateway
        .pointer("/spec/template/spec/volumes")
        .and_then(Value::as_array)?
        .iter()
        .find(|v| v["name"] == crate::gateway::ENGINE_CRL_VOLUME)?
        .pointer("/secret/secretName")
        .and_then(Value::as_str)?
        .to_owned();
    let version = crl_of(ctx, CRL_READ)
        .filter(|c| c.secret == secret)
        .map(|c| c.version)
        .unwrap_or_default();
    Some(Crl { secret, version })
}

fn previous_secret(previous: Option<&Value>) -> Option<String> {
    previous
        .and_then(|p| p.get("secretName"))
        .and_then(Value::as_str)
        .map(str::to_owned)
}

/// The owned object `kind`/`name` re-applied as it is (identity, labels
/// and spec), so that pruning keeps it.
fn keep_observed(ctx: &Context<'_>, kind: &str, name: &str) -> Option<Desired> {
    let o = ctx.snapshot.owned_named(kind, name)?;
    Some(Desired::apply(json!({
        "apiVersion": o["apiVersion"],
        "kind": kind,
        "metadata": {"name": name, "namespace": ctx.names.namespace(),
                     "labels": o["metadata"]["labels"]},
        "spec": o["spec"],
    })))
}

fn anchor_objects(ctx: &Context<'_>) -> Vec<Desired> {
    let Some(cm) = ctx.spec.tls.engine.cert_manager.as_ref() else {
        return Vec::new();
    };
    if ctx.spec.tls.engine.user_secret().is_some() {
        return Vec::new();
    }
    let names = ctx.names;
    certs::certificate(
        &names.engine_tls(),
        names.namespace(),
        &names.labels(Component::EngineTls),
        cm,
        &Usage::Server {
            dns_names: vec![format!(
                "*.{}.svc.{}",
                names.namespace(),
                ctx.settings.cluster_domain
            )],
        },
    )
    .into()
}

/// The trust bundle: the anchor's CA (Secret `anchor`, owned or the
/// user's) and the CA of every engine generation's TLS Secret of this
/// instance; deduplicated, ordered by fingerprint.
fn bundle(ctx: &Context<'_>, anchor: Option<&str>) -> (String, Vec<String>) {
    let mut cas: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut add = |secret: &Value| {
        if let Some(ca) = pem::secret_bytes(secret, "ca.crt") {
            for der in pem::certificates(&ca) {
                cas.insert(pem::fingerprint(&der), der);
            }
        }
    };
    if let Some(name) = anchor {
        if let Some(s) = ctx.snapshot.owned_named("Secret", name) {
            add(s);
        }
        for s in ctx.snapshot.related(USER_SECRET_READ) {
            add(s);
        }
    }
    let instance = ctx.names.instance();
    for s in ctx.snapshot.related(ENGINE_SECRETS_READ) {
        let labels = &s["metadata"]["labels"];
        if labels[INSTANCE_LABEL] == instance
            && labels[COMPONENT_LABEL] == "engine-tls"
            && labels.get(ENGINE_LABEL).is_some()
        {
            add(s);
        }
    }
    let text: String = cas.values().map(|der| pem::to_pem(der)).collect();
    (text, cas.into_keys().collect())
}

fn bundle_object(ctx: &Context<'_>, bundle: &(String, Vec<String>)) -> Option<Desired> {
    let names = ctx.names;
    Some(Desired::apply(json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": names.engine_ca_bundle(),
            "namespace": names.namespace(),
            "labels": names.labels(Component::EngineCaBundle),
            "annotations": {ENGINE_TRUST_CAS_ANNOTATION: bundle.1.join(",")},
        },
        "type": "Opaque",
        "data": {"ca.crt": pem::encode(bundle.0.as_bytes())},
    })))
}

/// `status.rolledEngineTrustCAs`: the CA fingerprints every gateway pod
/// trusts. `observed` is the gateway Deployment, `previous` the list
/// recorded last time; empty unless `reencrypting`.
pub fn rolled_trust(
    observed: Option<&Value>,
    previous: &[String],
    reencrypting: bool,
) -> Vec<String> {
    if !reencrypting {
        return Vec::new();
    }
    let Some(d) = observed else {
        return Vec::new();
    };
    let template: BTreeSet<String> = d
        .pointer("/spec/template/metadata/annotations")
        .and_then(|a| a.get(ENGINE_TRUST_CAS_ANNOTATION))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .split(',')
        .filter(|f| !f.is_empty())
        .map(str::to_owned)
        .collect();
    if crate::workload::rolled_out(d) {
        template.into_iter().collect()
    } else {
        previous
            .iter()
            .filter(|f| template.contains(*f))
            .cloned()
            .collect()
    }
}
