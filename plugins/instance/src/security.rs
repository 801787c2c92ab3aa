//! Steps `auth`, `engine-tls` and `gateway-tls` (conditions `AuthReady`,
//! `EngineTLSReady`, `GatewayTLSReady`): the places where authentication,
//! TLS and signing-key rotation will be provisioned.
//!
//! This version provisions none of them. A step whose feature is off
//! reports `True`/`Disabled`, as upstream does; one whose feature the spec
//! asks for fails with `NotSupported`, so nobody mistakes the instance for
//! secured. `AuthReady` stays out of the `Ready` roll-up (auth has no
//! bearing on whether the metadata service or gateway work); the TLS
//! conditions count, so an instance never looks ready in a security
//! posture it has not reached. The gateway step fails closed on its own
//! when gateway TLS is requested (see [`crate::envoy`]).
//!
//! The real steps replace `run` here and may then write their own status
//! fields and objects; the orchestration does not change.

use crate::step::{Failure, Health, Outcome, StepDef};

/// Engine authentication (`spec.auth`).
pub const AUTH: StepDef = StepDef {
    name: "auth",
    condition: "AuthReady",
    component: None,
    in_ready_rollup: false,
    run: |ctx| unsupported(ctx.spec.auth.enabled, "authentication (spec.auth)"),
};

/// TLS on engine query listeners (`spec.tls.engine`).
pub const ENGINE_TLS: StepDef = StepDef {
    name: "engine-tls",
    condition: "EngineTLSReady",
    component: None,
    in_ready_rollup: true,
    run: |ctx| unsupported(ctx.spec.tls.engine.enabled, "engine TLS (spec.tls.engine)"),
};

/// TLS on the gateway's client listener (`spec.tls.gateway`).
pub const GATEWAY_TLS: StepDef = StepDef {
    name: "gateway-tls",
    condition: "GatewayTLSReady",
    component: None,
    in_ready_rollup: true,
    run: |ctx| {
        unsupported(
            ctx.spec.tls.gateway.enabled,
            "gateway TLS (spec.tls.gateway)",
        )
    },
};

fn unsupported(enabled: bool, what: &str) -> Result<Outcome, Failure> {
    if enabled {
        Err(Failure::new(
            "NotSupported",
            format!("{what} is enabled, but this version of the operator cannot provision it"),
        ))
    } else {
        Ok(Outcome {
            objects: Vec::new(),
            health: Health::ready("Disabled", format!("{what} is disabled")),
        })
    }
}
