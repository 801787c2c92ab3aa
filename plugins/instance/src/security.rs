//! Steps `auth`, `engine-tls` and `gateway-tls` (conditions `AuthReady`,
//! `EngineTLSReady`, `GatewayTLSReady`), run first and in that order, as
//! the seed orders them: engines mount what `status.auth` names, the
//! gateway reads `status.engineTLS` (re-encrypt or not) and
//! `status.gatewayTLS` (what its client listener serves).
//!
//! [`evaluate`] decides all three once per reconcile ([`Security`]); the
//! step definitions hand out its parts, the gateway step renders from
//! [`Security::gateway`], and the status step writes the status fields.
//! Each is isolated: one that fails reports on its own condition, writes
//! and prunes none of its objects, and blocks nothing else. `AuthReady`
//! stays out of the `Ready` roll-up; both TLS conditions count, so the
//! instance never looks ready in a posture it has not reached.

use serde_json::Value;
use wasmop_sdk::EventType;

use crate::auth::{self, AuthEval};
use crate::engine_tls::{self, EngineTlsEval};
use crate::fleet;
use crate::gateway_tls::{self, GatewayTlsEval, Listener};
use crate::names::Component;
use crate::rotation::SHIPPED_ANCHOR;
use crate::step::{Context, Health, Outcome, StepDef};

/// Elliptic curves the gateway offers engines: every curve an engine key
/// may use (`certManager.size` 256, 384 — the default — or 521), plus
/// X25519. Envoy's default list lacks P-384 and P-521.
pub const UPSTREAM_CURVES: [&str; 4] = ["X25519", "P-256", "P-384", "P-521"];

/// What the gateway renders from the security steps.
#[derive(Clone, Debug, PartialEq)]
pub struct GatewaySecurity {
    /// What the client listener serves.
    pub listener: Listener,
    /// Roll with `maxUnavailable: 100%`, `maxSurge: 0` (tightening).
    pub drain_first: bool,
    /// Re-encrypt to engines, trusting the bundle Secret.
    pub reencrypt: bool,
    /// Fingerprints of the CAs in the bundle.
    pub trust_fingerprints: Vec<String>,
    /// Content of the bundle (rolls the gateway when it changes).
    pub trust_bundle: String,
    /// The engine revocation list, loaded while re-encrypting.
    pub upstream_crl: Option<crate::engine_tls::Crl>,
}

/// The three security steps' decisions.
#[derive(Clone, Debug, PartialEq)]
pub struct Security {
    /// Auth.
    pub auth: AuthEval,
    /// Engine TLS.
    pub engine_tls: EngineTlsEval,
    /// Gateway TLS.
    pub gateway_tls: GatewayTlsEval,
    /// `status.rolledEngineTrustCAs`.
    pub rolled_trust: Vec<String>,
    /// For the gateway step.
    pub gateway: GatewaySecurity,
}

impl Security {
    /// Stands in while the security steps are evaluated (they do not read
    /// it).
    pub fn placeholder() -> Self {
        let off = || {
            Ok(Outcome {
                objects: Vec::new(),
                health: Health::ready("Disabled", ""),
            })
        };
        Security {
            auth: AuthEval {
                result: off(),
                status: None,
                events: Vec::new(),
                requeue: None,
            },
            engine_tls: EngineTlsEval {
                result: off(),
                status: None,
                reencrypting: false,
                bundle: None,
                crl: None,
            },
            gateway_tls: GatewayTlsEval {
                result: off(),
                status: None,
                listener: Listener::Plaintext,
                drain_first: false,
            },
            rolled_trust: Vec::new(),
            gateway: GatewaySecurity {
                listener: Listener::Plaintext,
                drain_first: false,
                reencrypt: false,
                trust_fingerprints: Vec::new(),
                trust_bundle: String::new(),
                upstream_crl: None,
            },
        }
    }

    /// Events the security steps record.
    pub fn events(&self) -> &[(EventType, String, String)] {
        &self.auth.events
    }
}

/// Decides auth, engine TLS and gateway TLS for the reconcile in `ctx`.
pub fn evaluate(ctx: &Context<'_>) -> Security {
    let engines = fleet::engines(ctx);
    let auth = auth::evaluate(ctx, &engines, SHIPPED_ANCHOR);
    let engine_tls = engine_tls::evaluate(ctx, &engines);
    let observed = ctx.snapshot.owned_named("Deployment", &ctx.names.gateway());
    let gateway_tls = gateway_tls::evaluate(ctx, observed);
    let previous_rolled: Vec<String> = ctx
        .snapshot
        .primary
        .pointer("/status/rolledEngineTrustCAs")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    let rolled_trust =
        engine_tls::rolled_trust(observed, &previous_rolled, engine_tls.reencrypting);
    let (trust_bundle, trust_fingerprints) = engine_tls.bundle.clone().unwrap_or_default();
    let gateway = GatewaySecurity {
        listener: gateway_tls.listener.clone(),
        drain_first: gateway_tls.drain_first,
        reencrypt: engine_tls.reencrypting,
        trust_fingerprints,
        trust_bundle,
        upstream_crl: engine_tls.crl.clone().filter(|_| engine_tls.reencrypting),
    };
    Security {
        auth,
        engine_tls,
        gateway_tls,
        rolled_trust,
        gateway,
    }
}

/// Engine authentication (`spec.auth`).
pub const AUTH: StepDef = StepDef {
    name: "auth",
    condition: "AuthReady",
    components: &[Component::AuthSigning],
    in_ready_rollup: false,
    run: |ctx| ctx.security.auth.result.clone(),
};

/// TLS on engine query listeners (`spec.tls.engine`).
pub const ENGINE_TLS: StepDef = StepDef {
    name: "engine-tls",
    condition: "EngineTLSReady",
    components: &[Component::EngineTls, Component::EngineCaBundle],
    in_ready_rollup: true,
    run: |ctx| ctx.security.engine_tls.result.clone(),
};

/// TLS on the gateway's client listener (`spec.tls.gateway`).
pub const GATEWAY_TLS: StepDef = StepDef {
    name: "gateway-tls",
    condition: "GatewayTLSReady",
    components: &[Component::GatewayTls],
    in_ready_rollup: true,
    run: |ctx| ctx.security.gateway_tls.result.clone(),
};
