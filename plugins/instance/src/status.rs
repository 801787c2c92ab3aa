//! Step `status`: turns what the other steps reported into the instance's
//! status, as upstream shapes it.
//!
//! - One condition per step (`AuthReady`, `EngineTLSReady`,
//!   `GatewayTLSReady`, `PostgresReady`, `MetadataReady`, `GatewayReady`)
//!   and the `Ready` roll-up over the steps that count towards it: `True`
//!   with reason `AllComponentsReady`, else `False` with the reason of the
//!   first step that is not ready. `lastTransitionTime` moves only when a
//!   condition's status changes; conditions written by others (the host's
//!   `Reconciled`) are kept.
//! - `metadataReady`/`gatewayReady` mirror their conditions;
//!   `metadataEndpoint` and `gatewayEndpoint` are published only while the
//!   component is ready, and withdrawn when it stops being ready.
//! - `phase`: `Failed` while a step rejects the spec, `Ready` while `Ready`
//!   is true, `Degraded` when it stops being true after having been
//!   `Ready` (or while it stays false after that), `Provisioning`
//!   otherwise.
//! - `observedGeneration` is written by the host.
//!
//! Events are recorded on transitions only: a step that starts failing (or
//! fails for a new reason) gives a Warning with its reason, `Ready`
//! turning true a Normal `InstanceReady`, `Ready` turning false after
//! having been true a Warning `InstanceNotReady`.

use serde_json::{Map, Value, json};
use wasmop_sdk::EventType;
use wasmop_sdk::conditions::{conditions_of, find_condition, set_condition};
use wasmop_sdk::k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use crate::step::{Context, Ran};

/// The roll-up condition.
pub const READY: &str = "Ready";

/// Phases, as upstream names them.
pub mod phase {
    /// Not ready yet for the first time.
    pub const PROVISIONING: &str = "Provisioning";
    /// Every component counted by `Ready` is ready.
    pub const READY: &str = "Ready";
    /// Was ready, is not any more.
    pub const DEGRADED: &str = "Degraded";
    /// The spec is rejected.
    pub const FAILED: &str = "Failed";
}

/// The new status and the events that go with it.
#[derive(Clone, Debug, PartialEq)]
pub struct StatusUpdate {
    /// The instance's new `.status`.
    pub status: Value,
    /// Events to record: type, reason, message.
    pub events: Vec<(EventType, String, String)>,
}

/// Computes the status from the steps' results.
pub fn compute(ctx: &Context<'_>, ran: &[Ran]) -> StatusUpdate {
    let primary = &ctx.snapshot.primary;
    let generation = ctx.snapshot.primary_generation();
    let before = conditions_of(primary);
    let mut conditions = before.clone();
    let mut events = Vec::new();

    for r in ran {
        let health = r.health();
        set_condition(
            &mut conditions,
            r.step.condition,
            health.ready,
            health.reason,
            &health.message,
            generation,
            ctx.now,
        );
        if let Err(failure) = &r.result {
            let was = find_condition(&before, r.step.condition);
            if was.is_none_or(|c| c.status != "False" || c.reason != failure.reason) {
                events.push((
                    EventType::Warning,
                    failure.reason.to_owned(),
                    format!("{}: {}", r.step.condition, failure.message),
                ));
            }
        }
    }

    let blocker = ran
        .iter()
        .filter(|r| r.step.in_ready_rollup)
        .map(|r| (r.step.condition, r.health()))
        .find(|(_, h)| !h.ready);
    let ready = blocker.is_none();
    let (reason, message) = match &blocker {
        None => (
            "AllComponentsReady",
            "PostgreSQL, the metadata service and the gateway are ready".to_owned(),
        ),
        Some((condition, health)) => (health.reason, format!("{condition}: {}", health.message)),
    };
    set_condition(
        &mut conditions,
        READY,
        ready,
        reason,
        &message,
        generation,
        ctx.now,
    );
    let was_ready = find_condition(&before, READY).is_some_and(|c| c.status == "True");
    match (was_ready, ready) {
        (false, true) => events.push((
            EventType::Normal,
            "InstanceReady".to_owned(),
            format!("metadata service at {}", ctx.names.metadata_endpoint()),
        )),
        (true, false) => events.push((EventType::Warning, "InstanceNotReady".to_owned(), message)),
        _ => {}
    }

    let previous_phase = primary
        .pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let phase = if ran
        .iter()
        .any(|r| r.result.as_ref().is_err_and(|f| f.rejects_spec))
    {
        phase::FAILED
    } else if ready {
        phase::READY
    } else if matches!(previous_phase, phase::READY | phase::DEGRADED) {
        phase::DEGRADED
    } else {
        phase::PROVISIONING
    };

    let is_true = |condition: &str| {
        find_condition(&conditions, condition).is_some_and(|c: &Condition| c.status == "True")
    };
    let metadata_ready = is_true("MetadataReady");
    let gateway_ready = is_true("GatewayReady");
    let mut status = Map::new();
    status.insert("phase".into(), json!(phase));
    status.insert("metadataReady".into(), json!(metadata_ready));
    status.insert("gatewayReady".into(), json!(gateway_ready));
    if metadata_ready {
        status.insert(
            "metadataEndpoint".into(),
            json!(ctx.names.metadata_endpoint()),
        );
    }
    if gateway_ready {
        status.insert(
            "gatewayEndpoint".into(),
            json!(ctx.names.gateway_endpoint()),
        );
    }
    let security = ctx.security;
    for (key, value) in [
        ("auth", &security.auth.status),
        ("engineTLS", &security.engine_tls.status),
        ("gatewayTLS", &security.gateway_tls.status),
    ] {
        if let Some(v) = value {
            status.insert(key.into(), v.clone());
        }
    }
    if !security.rolled_trust.is_empty() {
        status.insert("rolledEngineTrustCAs".into(), json!(security.rolled_trust));
    }
    events.extend(security.events().iter().cloned());
    status.insert("conditions".into(), json!(conditions));
    StatusUpdate {
        status: Value::Object(status),
        events,
    }
}
