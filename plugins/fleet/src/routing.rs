//! `spec.routing`: one Gateway API v1 HTTPRoute or one Ingress named
//! `F-routing` forwarding `/` for the explicit hostnames to `F:8080`, and
//! the NetworkPolicy `F-routing` admitting only the selected data-plane
//! Pods to port 8080. Routing never exposes the peer port, never touches
//! the workload or the reservation, and never blocks runtime operations:
//! every problem lands in its own condition, `RoutingReady`.
//!
//! Order of changes: an obsolete route (the other kind, after a switch, or
//! every route when routing is removed) is deleted with uid/resourceVersion
//! preconditions, after a preflight (the API of the new route, the Service
//! `F`, the fleet's isolation policy `F`, and that the route is the fleet's
//! own); a failed preflight keeps the route and its policy. The replacement
//! is created only once the obsolete route is gone. On removal the policy
//! goes after the route.

use serde::Deserialize;
use serde_json::{Map, Value, json};
use wasmop_sdk::{KindRef, Plan, ReconcileError, Snapshot};

use crate::api::Fleet;
use crate::names::*;

/// The Gateway API HTTPRoute kind (optional: its CRD may be absent).
pub fn http_route_kind() -> KindRef {
    KindRef::namespaced("gateway.networking.k8s.io", "v1", "HTTPRoute", "httproutes")
}

/// The Ingress kind.
pub fn ingress_kind() -> KindRef {
    KindRef::namespaced("networking.k8s.io", "v1", "Ingress", "ingresses")
}

/// Condition type of routing, separate from fleet readiness.
pub const ROUTING_READY: &str = "RoutingReady";

/// Reasons of `RoutingReady`.
pub mod reasons {
    /// The Gateway API CRDs are not installed.
    pub const GATEWAY_API_UNAVAILABLE: &str = "GatewayAPIUnavailable";
    /// The Ingress has no address yet (status Unknown).
    pub const AWAITING_ADDRESS: &str = "AwaitingAddress";
    /// The Ingress has an address.
    pub const ADDRESS_ASSIGNED: &str = "AddressAssigned";
    /// The HTTPRoute is Accepted with ResolvedRefs by the configured parent.
    pub const ACCEPTED: &str = "Accepted";
    /// The configured parent has not reported on the current generation yet (Unknown).
    pub const AWAITING_ACCEPTANCE: &str = "AwaitingAcceptance";
    /// The configured parent refused the route or its references.
    pub const NOT_ACCEPTED: &str = "NotAccepted";
    /// A route is being created, replaced or removed.
    pub const RECONCILING: &str = "Reconciling";
    /// The preflight before removing a route failed; the route is kept.
    pub const PREFLIGHT_FAILED: &str = "PreflightFailed";
    /// `F-routing` exists and is not this fleet's.
    pub const ROUTE_CONFLICT: &str = "RouteConflict";
    /// Routing stored past admission is invalid.
    pub const INVALID_CONFIGURATION: &str = "InvalidConfiguration";
}

/// `spec.routing`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Routing {
    /// Explicit hostnames.
    pub hostnames: Vec<String>,
    /// Gateway API mode: the existing Gateway.
    pub gateway: Option<GatewayRef>,
    /// Ingress mode.
    pub ingress: Option<IngressSpec>,
    /// The data-plane Pods admitted to port 8080.
    pub source: Option<Source>,
}

/// `spec.routing.gateway`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct GatewayRef {
    /// Gateway name.
    pub name: String,
    /// Gateway namespace (the fleet's when absent).
    pub namespace: Option<String>,
    /// Listener.
    pub section_name: Option<String>,
}

/// `spec.routing.ingress`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct IngressSpec {
    /// IngressClass.
    pub class_name: String,
    /// Same-namespace TLS Secret.
    pub tls_secret_name: Option<String>,
    /// Extra annotations.
    pub annotations: Option<Map<String, Value>>,
}

/// `spec.routing.source`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Source {
    /// Namespace of the data-plane Pods.
    pub namespace: String,
    /// Their labels.
    pub pod_labels: Map<String, Value>,
}

/// Annotation keys reserved from `ingress.annotations`.
pub fn reserved_annotation(key: &str) -> bool {
    key.starts_with("celld.eric.dev/") || key == "kubernetes.io/ingress.class"
}

/// The most annotations and the largest annotation value.
pub const MAX_ANNOTATIONS: usize = 16;
/// The largest annotation value in bytes.
pub const MAX_ANNOTATION_BYTES: usize = 4096;

/// Problems of routing that admission should have refused (stored by an
/// older schema or past admission).
pub fn problems(r: &Routing) -> Vec<String> {
    let mut out = Vec::new();
    if r.hostnames.is_empty() {
        out.push("routing.hostnames must name at least one host".to_owned());
    }
    if r.gateway.is_some() == r.ingress.is_some() {
        out.push("routing must choose exactly one of gateway or ingress".to_owned());
    }
    match &r.source {
        Some(s) if !s.namespace.is_empty() && !s.pod_labels.is_empty() => {}
        _ => out.push("routing.source needs a namespace and podLabels".to_owned()),
    }
    if let Some(a) = r.ingress.as_ref().and_then(|i| i.annotations.as_ref()) {
        if a.len() > MAX_ANNOTATIONS {
            out.push(format!(
                "routing.ingress.annotations holds more than {MAX_ANNOTATIONS} entries"
            ));
        }
        for (k, v) in a {
            if reserved_annotation(k) {
                out.push(format!("routing.ingress.annotations: {k} is reserved"));
            }
            if v.as_str().map_or(0, str::len) > MAX_ANNOTATION_BYTES {
                out.push(format!(
                    "routing.ingress.annotations: {k} exceeds {MAX_ANNOTATION_BYTES} bytes"
                ));
            }
        }
    }
    out
}

/// The name of the route and of its policy.
pub fn routing_name(fleet: &str) -> String {
    format!("{fleet}-routing")
}

fn meta(fleet: &Fleet) -> Value {
    json!({"name": routing_name(&fleet.metadata.name), "namespace": fleet.metadata.namespace})
}

/// HTTPRoute `F-routing`.
pub fn http_route(fleet: &Fleet, r: &Routing, g: &GatewayRef) -> Value {
    let mut parent =
        json!({"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": g.name});
    if let Some(ns) = g.namespace.as_deref().filter(|n| !n.is_empty()) {
        parent["namespace"] = json!(ns);
    }
    if let Some(s) = g.section_name.as_deref().filter(|n| !n.is_empty()) {
        parent["sectionName"] = json!(s);
    }
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": meta(fleet),
        "spec": {
            "parentRefs": [parent],
            "hostnames": r.hostnames,
            "rules": [{
                "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                "backendRefs": [{"group": "", "kind": "Service", "name": fleet.metadata.name,
                                 "port": APPLICATION_PORT, "weight": 1}],
            }],
        },
    })
}

/// Ingress `F-routing`. Its annotations are exactly the configured ones:
/// the host applies server-side, so an annotation dropped from the spec is
/// pruned and other managers' annotations stay.
pub fn ingress(fleet: &Fleet, r: &Routing, i: &IngressSpec) -> Value {
    let backend = json!({"service": {"name": fleet.metadata.name,
                                     "port": {"number": APPLICATION_PORT}}});
    let rules: Vec<Value> = r
        .hostnames
        .iter()
        .map(|h| {
            json!({"host": h, "http": {"paths": [
                {"path": "/", "pathType": "Prefix", "backend": backend}
            ]}})
        })
        .collect();
    let mut metadata = meta(fleet);
    if let Some(a) = i.annotations.as_ref().filter(|a| !a.is_empty()) {
        metadata["annotations"] = json!(a);
    }
    let mut spec = json!({"ingressClassName": i.class_name, "rules": rules});
    if let Some(secret) = i.tls_secret_name.as_deref().filter(|s| !s.is_empty()) {
        spec["tls"] = json!([{"hosts": r.hostnames, "secretName": secret}]);
    }
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": metadata, "spec": spec})
}

/// NetworkPolicy `F-routing`: port 8080 from the selected data-plane Pods only.
pub fn policy(fleet: &Fleet, s: &Source) -> Value {
    json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta(fleet),
        "spec": {
            "podSelector": {"matchLabels": {FLEET_UID_LABEL: fleet.metadata.uid}},
            "policyTypes": ["Ingress"],
            "ingress": [{
                "from": [{
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": s.namespace}},
                    "podSelector": {"matchLabels": s.pod_labels},
                }],
                "ports": [{"protocol": "TCP", "port": APPLICATION_PORT}],
            }],
        },
    })
}

/// The routing objects this fleet owns in a snapshot.
#[derive(Debug, Default)]
pub struct Owned<'a> {
    /// HTTPRoute `F-routing`.
    pub http_route: Option<&'a Value>,
    /// Ingress `F-routing`.
    pub ingress: Option<&'a Value>,
    /// NetworkPolicy `F-routing`.
    pub policy: Option<&'a Value>,
}

impl<'a> Owned<'a> {
    /// Collects them.
    pub fn of(snapshot: &'a Snapshot, fleet: &Fleet) -> Self {
        let name = routing_name(&fleet.metadata.name);
        Owned {
            http_route: snapshot.owned_named("HTTPRoute", &name),
            ingress: snapshot.owned_named("Ingress", &name),
            policy: snapshot.owned_named("NetworkPolicy", &name),
        }
    }

    /// Every owned routing object.
    pub fn all(&self) -> Vec<&'a Value> {
        [self.http_route, self.ingress, self.policy]
            .into_iter()
            .flatten()
            .collect()
    }
}

/// The `RoutingReady` condition to set, or `None` to drop it (no routing).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// `True`, `False` or `Unknown`.
    pub status: &'static str,
    /// Reason.
    pub reason: &'static str,
    /// Message.
    pub message: String,
}

fn verdict(status: &'static str, reason: &'static str, message: impl Into<String>) -> Verdict {
    Verdict {
        status,
        reason,
        message: message.into(),
    }
}

fn terminating(o: &Value) -> bool {
    !o["metadata"]["deletionTimestamp"].is_null()
}

/// What the snapshot says about the world routing depends on.
#[derive(Debug)]
pub struct World<'a> {
    /// The fleet's routing objects.
    pub owned: Owned<'a>,
    /// The Gateway API is served.
    pub gateway_api: bool,
    /// Service `F` exists.
    pub service: bool,
    /// NetworkPolicy `F` exists.
    pub isolation: bool,
    /// A same-named Ingress that is not this fleet's.
    pub foreign_ingress: bool,
    /// A same-named HTTPRoute that is not this fleet's.
    pub foreign_route: bool,
}

/// Routing's part of the plan, and its condition. Never fails the
/// reconcile: every problem is a condition.
///
/// # Errors
///
/// Only when a seen object lacks the identity a delete needs (internal).
pub fn reconcile(
    mut plan: Plan,
    fleet: &Fleet,
    routing: Option<&Value>,
    w: &World,
) -> Result<(Plan, Option<Verdict>), ReconcileError> {
    let owned = &w.owned;
    let routing: Option<Routing> = match routing {
        None => None,
        Some(v) => match serde_json::from_value::<Routing>(v.clone()) {
            Ok(r) => Some(r),
            Err(e) => {
                return Ok((
                    plan,
                    Some(verdict(
                        "False",
                        reasons::INVALID_CONFIGURATION,
                        format!("spec.routing cannot be read: {e}; the existing route is kept"),
                    )),
                ));
            }
        },
    };
    let Some(r) = routing else {
        // Removal: the route first (after the preflight), then its policy.
        let routes: Vec<&Value> = [owned.http_route, owned.ingress]
            .into_iter()
            .flatten()
            .collect();
        if routes.is_empty() {
            if let Some(p) = owned.policy.filter(|p| !terminating(p)) {
                plan = plan.delete_owned(p)?;
            }
            return Ok((plan, None));
        }
        if let Some(why) = preflight(w, None) {
            return Ok((plan, Some(verdict("False", reasons::PREFLIGHT_FAILED, why))));
        }
        for route in routes.into_iter().filter(|o| !terminating(o)) {
            plan = plan.delete_owned(route)?;
        }
        return Ok((
            plan,
            Some(verdict(
                "False",
                reasons::RECONCILING,
                "removing the route; its policy goes once it is gone",
            )),
        ));
    };
    let problems = problems(&r);
    if !problems.is_empty() {
        return Ok((
            plan,
            Some(verdict(
                "False",
                reasons::INVALID_CONFIGURATION,
                format!("{}; the existing route is kept", problems.join("; ")),
            )),
        ));
    }
    let want_gateway = r.gateway.is_some();
    let obsolete = if want_gateway {
        owned.ingress
    } else {
        owned.http_route
    };
    if want_gateway && !w.gateway_api {
        // Nothing is removed: the preflight needs the new route's API.
        return Ok((
            plan,
            Some(verdict(
                "False",
                reasons::GATEWAY_API_UNAVAILABLE,
                if obsolete.is_some() {
                    "the Gateway API (gateway.networking.k8s.io/v1 HTTPRoute) is not installed; \
                     the existing Ingress and its policy are kept"
                } else {
                    "the Gateway API (gateway.networking.k8s.io/v1 HTTPRoute) is not installed"
                },
            )),
        ));
    }
    if (!want_gateway && w.foreign_ingress) || (want_gateway && w.foreign_route) {
        return Ok((
            plan,
            Some(verdict(
                "False",
                reasons::ROUTE_CONFLICT,
                format!(
                    "{} {} exists and is not this fleet's; it is left alone",
                    if want_gateway { "HTTPRoute" } else { "Ingress" },
                    routing_name(&fleet.metadata.name)
                ),
            )),
        ));
    }
    if let Some(old) = obsolete {
        if let Some(why) = preflight(w, Some(want_gateway)) {
            return Ok((plan, Some(verdict("False", reasons::PREFLIGHT_FAILED, why))));
        }
        if !terminating(old) {
            plan = plan.delete_owned(old)?;
        }
        let kind = old["kind"].as_str().unwrap_or("route");
        return Ok((
            plan,
            Some(verdict(
                "False",
                reasons::RECONCILING,
                format!("replacing the {kind}; the new route is created once it is gone"),
            )),
        ));
    }
    let source = r.source.clone().unwrap_or_default();
    plan = plan.apply(policy(fleet, &source));
    let state = if let Some(g) = &r.gateway {
        plan = plan.apply(http_route(fleet, &r, g));
        route_verdict(fleet, owned.http_route, g)
    } else if let Some(i) = &r.ingress {
        plan = plan.apply(ingress(fleet, &r, i));
        ingress_verdict(owned.ingress)
    } else {
        verdict("False", reasons::INVALID_CONFIGURATION, "no route kind")
    };
    Ok((plan, Some(state)))
}

/// The checks before an existing route is removed: the API of the route
/// that replaces it (`Some(true)`: HTTPRoute), the Service `F`, the fleet's
/// isolation policy `F`, and ownership (only the fleet's own objects are
/// in `owned`). `None` when they pass.
fn preflight(w: &World, replacement_gateway: Option<bool>) -> Option<String> {
    let mut failed = Vec::new();
    if replacement_gateway == Some(true) && !w.gateway_api {
        failed.push("the Gateway API is not installed");
    }
    if !w.service {
        failed.push("the application Service is missing");
    }
    if !w.isolation {
        failed.push("the fleet's NetworkPolicy (isolation) is missing");
    }
    if failed.is_empty() {
        None
    } else {
        Some(format!(
            "preflight failed, the existing route and its policy are kept: {}",
            failed.join("; ")
        ))
    }
}

fn condition<'v>(conditions: &'v Value, type_: &str) -> Option<&'v Value> {
    conditions.as_array()?.iter().find(|c| c["type"] == type_)
}

/// HTTPRoute: Accepted and ResolvedRefs True for the current generation on
/// the configured parent.
pub fn route_verdict(fleet: &Fleet, route: Option<&Value>, g: &GatewayRef) -> Verdict {
    let Some(route) = route else {
        return verdict("Unknown", reasons::RECONCILING, "creating the HTTPRoute");
    };
    let generation = route["metadata"]["generation"].as_i64().unwrap_or(0);
    let want_ns = g
        .namespace
        .as_deref()
        .filter(|n| !n.is_empty())
        .unwrap_or(&fleet.metadata.namespace);
    let parent = route["status"]["parents"].as_array().and_then(|ps| {
        ps.iter().find(|p| {
            let r = &p["parentRef"];
            r["name"] == g.name.as_str()
                && r["namespace"].as_str().unwrap_or(&fleet.metadata.namespace) == want_ns
                && r["sectionName"].as_str() == g.section_name.as_deref()
        })
    });
    let Some(parent) = parent else {
        return verdict(
            "Unknown",
            reasons::AWAITING_ACCEPTANCE,
            format!("Gateway {want_ns}/{} has not reported on the route", g.name),
        );
    };
    let mut missing = Vec::new();
    for type_ in ["Accepted", "ResolvedRefs"] {
        match condition(&parent["conditions"], type_) {
            Some(c) if c["observedGeneration"].as_i64().unwrap_or(0) < generation => {
                return verdict(
                    "Unknown",
                    reasons::AWAITING_ACCEPTANCE,
                    format!(
                        "Gateway {want_ns}/{} has not reported on generation {generation}",
                        g.name
                    ),
                );
            }
            Some(c) if c["status"] == "True" => {}
            Some(c) => missing.push(format!(
                "{type_}={} ({})",
                c["status"].as_str().unwrap_or(""),
                c["reason"].as_str().unwrap_or("")
            )),
            None => {
                return verdict(
                    "Unknown",
                    reasons::AWAITING_ACCEPTANCE,
                    format!("Gateway {want_ns}/{} has not reported {type_}", g.name),
                );
            }
        }
    }
    if missing.is_empty() {
        verdict(
            "True",
            reasons::ACCEPTED,
            format!(
                "Gateway {want_ns}/{} accepted the route and resolved its references",
                g.name
            ),
        )
    } else {
        verdict(
            "False",
            reasons::NOT_ACCEPTED,
            format!("Gateway {want_ns}/{}: {}", g.name, missing.join(", ")),
        )
    }
}

/// Ingress: an assigned address, or `AwaitingAddress` (Unknown).
pub fn ingress_verdict(ingress: Option<&Value>) -> Verdict {
    let address = ingress.and_then(|i| {
        i["status"]["loadBalancer"]["ingress"]
            .as_array()?
            .iter()
            .find_map(|a| a["ip"].as_str().or_else(|| a["hostname"].as_str()))
            .map(str::to_owned)
    });
    match address {
        Some(a) => verdict(
            "True",
            reasons::ADDRESS_ASSIGNED,
            format!("the Ingress has address {a}"),
        ),
        None => verdict(
            "Unknown",
            reasons::AWAITING_ADDRESS,
            "the Ingress has no address yet",
        ),
    }
}
