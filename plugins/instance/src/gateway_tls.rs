//! Step `gateway-tls` (condition `GatewayTLSReady`, `status.gatewayTLS`):
//! TLS, and with `clientCASecretRef` mutual TLS, on the gateway's client
//! listener — failing closed.
//!
//! Postures are ordered plaintext < TLS < mutual TLS. `status.gatewayTLS`
//! records the posture the gateway serves (`mode`, `clientCAFingerprint`).
//!
//! - **Tightening** (plaintext → TLS, TLS → mutual TLS, or a client-CA
//!   swap) is staged: `status.gatewayTLS` is cleared, the client listener
//!   is left out of the Envoy config, and the Deployment rolls with
//!   `maxUnavailable: 100%`, `maxSurge: 0`, so every looser pod is gone
//!   before the next pod starts. Only once the Deployment runs nothing but
//!   the closed configuration is the secure posture recorded and rendered.
//!   Probes use the plaintext metrics port, so closed pods stay Ready.
//! - **Loosening and steady state** render the wanted posture at once.
//! - **Material missing** (the serving Secret not issued, the client CA
//!   Secret missing or without `ca.crt`): closed, `SecretPending`.

use serde_json::{Value, json};

use crate::certs::{self, Usage};
use crate::duration;
use crate::engine_tls::{CRL_KEY, Crl, crl_of};
use crate::names::{CLIENT_LISTENER_ANNOTATION, Component};
use crate::pem;
use crate::step::{Context, Desired, Failure, Health, Outcome};
use crate::workload::rolled_out;

/// Id of the read bringing the client CA Secret.
pub const CLIENT_CA_READ: &str = "gateway-client-ca";
/// Field naming it.
pub const CLIENT_CA_FIELD: &str = "spec.tls.gateway.clientCASecretRef.name";
/// Id of the read bringing the user's serving Secret.
pub const USER_SECRET_READ: &str = "gateway-tls-secret";
/// Field naming it.
pub const USER_SECRET_FIELD: &str = "spec.tls.gateway.secretRef.name";
/// Id of the read bringing the client revocation list Secret.
pub const CRL_READ: &str = "gateway-tls-crl";
/// Field of the primary naming it.
pub const CRL_FIELD: &str = "spec.tls.gateway.crlSecretRef.name";

/// What the gateway's client listener serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Listener {
    /// Plaintext HTTP.
    Plaintext,
    /// No client listener at all (fail-closed).
    Closed,
    /// TLS with the certificate in Secret `secret`.
    Tls {
        /// The serving Secret.
        secret: String,
        /// Its resourceVersion (a renewal rolls the gateway).
        version: String,
    },
    /// Mutual TLS: TLS plus client certificates verified against the CA
    /// in Secret `client_ca`.
    Mutual {
        /// The serving Secret.
        secret: String,
        /// Its resourceVersion.
        version: String,
        /// The client CA Secret.
        client_ca: String,
        /// Fingerprint of its CA.
        fingerprint: String,
        /// The client revocation list (`spec.tls.gateway.crlSecretRef`).
        crl: Option<Crl>,
    },
}

impl Listener {
    /// The pod-template annotation value.
    pub fn label(&self) -> &'static str {
        match self {
            Listener::Plaintext => "plaintext",
            Listener::Closed => "closed",
            Listener::Tls { .. } => "tls",
            Listener::Mutual { .. } => "mtls",
        }
    }
}

/// What the gateway TLS step decided.
#[derive(Clone, Debug, PartialEq)]
pub struct GatewayTlsEval {
    /// The step's answer.
    pub result: Result<Outcome, Failure>,
    /// `status.gatewayTLS`.
    pub status: Option<Value>,
    /// What the client listener serves.
    pub listener: Listener,
    /// Roll with `maxUnavailable: 100%`, `maxSurge: 0`.
    pub drain_first: bool,
}

/// A posture's rank and client-CA fingerprint.
fn rank(mode: &str, fingerprint: &str) -> (u8, String) {
    match mode {
        "MutualTLS" => (2, fingerprint.to_owned()),
        "" | "TLS" => (1, String::new()),
        _ => (0, String::new()),
    }
}

/// Runs the step. `observed` is the gateway Deployment.
pub fn evaluate(ctx: &Context<'_>, observed: Option<&Value>) -> GatewayTlsEval {
    let spec = &ctx.spec.tls.gateway;
    let names = ctx.names;
    if !spec.enabled {
        return GatewayTlsEval {
            result: Ok(Outcome {
                objects: Vec::new(),
                health: Health::ready("Disabled", "gateway TLS (spec.tls.gateway) is disabled"),
            }),
            status: None,
            listener: Listener::Plaintext,
            drain_first: false,
        };
    }
    let closed = |result: Result<Outcome, Failure>| GatewayTlsEval {
        result,
        status: None,
        listener: Listener::Closed,
        drain_first: true,
    };
    let problems = crate::validate::tls(crate::validate::ListenerKind::Gateway, spec);
    if !problems.is_empty() {
        return closed(Err(Failure::new(
            "TLSSpecInvalid",
            format!(
                "{}; the client listener stays closed",
                crate::validate::message(&problems)
            ),
        )));
    }
    let (secret_name, objects, serving) = match spec.user_secret() {
        Some(name) => (
            name.to_owned(),
            Vec::new(),
            ctx.snapshot.related(USER_SECRET_READ).next().cloned(),
        ),
        None => {
            let Some(cm) = spec
                .cert_manager
                .as_ref()
                .filter(|cm| !cm.issuer_ref.name.is_empty())
            else {
                return closed(Err(Failure::new(
                    "TLSSpecInvalid",
                    "spec.tls.gateway needs certManager.issuerRef or secretRef; the client listener stays closed",
                )));
            };
            let mut dns = names.gateway_dns_names();
            dns.extend(spec.dns_names.iter().flatten().cloned());
            let objects: Vec<Desired> = certs::certificate(
                &names.gateway_tls(),
                names.namespace(),
                &names.labels(Component::GatewayTls),
                cm,
                &Usage::Server { dns_names: dns },
            )
            .into();
            (
                names.gateway_tls(),
                objects,
                ctx.snapshot
                    .owned_named("Secret", &names.gateway_tls())
                    .cloned(),
            )
        }
    };
    let pending_for = |reason: &'static str, why: String| {
        closed(Ok(Outcome {
            objects: objects.clone(),
            health: Health::waiting(reason, format!("{why}; the client listener stays closed")),
        }))
    };
    let pending = |why: String| pending_for("SecretPending", why);
    let Some(serving) = serving.filter(|s| pem::has_keys(s, &certs::SERVING_KEYS)) else {
        return pending(format!(
            "waiting for Secret {secret_name} to hold tls.crt and tls.key"
        ));
    };
    let version = serving
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let (wanted, mode, fingerprint) = match spec.client_ca() {
        None => (
            Listener::Tls {
                secret: secret_name.clone(),
                version,
            },
            "TLS",
            String::new(),
        ),
        Some(ca_name) => {
            let ca = ctx
                .snapshot
                .related(CLIENT_CA_READ)
                .next()
                .and_then(|s| pem::secret_bytes(s, "ca.crt"));
            let Some(ca) = ca else {
                return pending(format!(
                    "client CA Secret {ca_name} does not exist or has no ca.crt"
                ));
            };
            let fingerprint = pem::fingerprint(&ca);
            let crl = match spec.crl() {
                None => None,
                Some(name) => match crl_of(ctx, CRL_READ) {
                    Some(crl) => Some(crl),
                    // Serving mutual TLS without the revocation list asked
                    // for would accept revoked clients: stay closed.
                    None => {
                        return pending_for(
                            "CRLSecretPreflightFailed",
                            format!(
                                "Secret {name} named by spec.tls.gateway.crlSecretRef does not exist or has no {CRL_KEY}"
                            ),
                        );
                    }
                },
            };
            (
                Listener::Mutual {
                    secret: secret_name.clone(),
                    version,
                    client_ca: ca_name.to_owned(),
                    fingerprint: fingerprint.clone(),
                    crl,
                },
                "MutualTLS",
                fingerprint,
            )
        }
    };

    let previous = ctx.snapshot.primary.pointer("/status/gatewayTLS");
    let text = |k: &str| {
        previous
            .and_then(|p| p.get(k))
            .and_then(Value::as_str)
            .unwrap_or_default()
    };
    let serving_now = previous.map(|_| rank(text("mode"), text("clientCAFingerprint")));
    let want = rank(mode, &fingerprint);
    let tightening = match &serving_now {
        None => true,
        Some((r, fp)) => want.0 > *r || (want.0 == 2 && *r == 2 && *fp != want.1),
    };
    let status = json!({
        "secretName": secret_name,
        "createdAt": previous
            .and_then(|p| p.get("createdAt"))
            .cloned()
            .unwrap_or_else(|| json!(duration::rfc3339(ctx.now_seconds()))),
        "mode": mode,
        "clientCAFingerprint": fingerprint,
    });
    let secure = |drain_first: bool, objects: Vec<Desired>| GatewayTlsEval {
        result: Ok(Outcome {
            objects,
            health: Health::ready("Ready", format!("the client listener serves {mode}")),
        }),
        status: Some(status.clone()),
        listener: wanted.clone(),
        drain_first,
    };
    if !tightening {
        return secure(false, objects);
    }
    // Tightening: secure only once nothing but closed pods run.
    let closed_everywhere = observed.is_some_and(|d| {
        rolled_out(d)
            && d.pointer("/spec/template/metadata/annotations")
                .and_then(|a| a.get(CLIENT_LISTENER_ANNOTATION))
                .and_then(Value::as_str)
                == Some(Listener::Closed.label())
    }) || observed.is_none();
    if closed_everywhere {
        return secure(true, objects);
    }
    closed(Ok(Outcome {
        objects,
        health: Health::waiting(
            "FailClosedStaging",
            format!(
                "moving to {mode}: the client listener is closed until every looser gateway pod is gone"
            ),
        ),
    }))
}
