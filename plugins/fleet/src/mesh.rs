//! `spec.mesh.istio`: members in an Istio sidecar mesh.
//!
//! - The Pod template gains `sidecar.istio.io/inject: "true"` and
//!   `celld.eric.dev/fleet: F`, the native sidecar annotation and the EKS
//!   Pod Identity agent address excluded from the proxy. A fleet that left
//!   the mesh (the retained fleet annotation
//!   `celld.eric.dev/istio-control-plane`) gets `inject: "false"`.
//! - NetworkPolicy `F` gains egress to istiod (`app: istiod`) in the
//!   control-plane namespace on TCP 15012, kept on departure until the last
//!   proxy exits. On departure the PeerAuthentication (8081 PERMISSIVE)
//!   and the identity-free peer rule are applied again until then too: a
//!   member already out of the mesh talks plaintext to those still in it.
//!   The template drops the proxy only once a snapshot shows both in place
//!   ([`departure_in_place`]), a pass after the one that applies them.
//! - AuthorizationPolicy `F-mesh` (ALLOW): 8081 from the fleet's and the
//!   operator's ServiceAccounts in any trust domain; 8080 from anyone with
//!   `applicationAccess: AllowAll`. PeerAuthentication `F-mesh` keeps 8081
//!   PERMISSIVE (and the peer rule drops its identity requirement) until
//!   every member Pod — terminating ones included — runs a proxy.
//! - Both are optional owned kinds: without `security.istio.io/v1` a fleet
//!   asking for the mesh is `Blocked/InfrastructureBlocked`.

use serde_json::{Map, Value, json};
use wasmop_sdk::KindRef;

use crate::api::{Fleet, Istio};
use crate::names::*;
use crate::settings::Settings;

/// Retained fleet annotation: the istiod namespace of a fleet that opted in.
pub const ISTIO_CONTROL_PLANE_ANNOTATION: &str = "celld.eric.dev/istio-control-plane";
/// Pod label naming the fleet (for users' AuthorizationPolicies).
pub const FLEET_LABEL: &str = "celld.eric.dev/fleet";
/// Name of Istio's proxy container.
pub const PROXY_CONTAINER: &str = "istio-proxy";
/// istiod's xDS port.
pub const ISTIOD_PORT: i64 = 15012;

/// Istio's AuthorizationPolicy kind (optional).
pub fn authorization_policy_kind() -> KindRef {
    KindRef::namespaced(
        "security.istio.io",
        "v1",
        "AuthorizationPolicy",
        "authorizationpolicies",
    )
}

/// Istio's PeerAuthentication kind (optional).
pub fn peer_authentication_kind() -> KindRef {
    KindRef::namespaced(
        "security.istio.io",
        "v1",
        "PeerAuthentication",
        "peerauthentications",
    )
}

/// `F-mesh`.
pub fn mesh_name(fleet: &str) -> String {
    format!("{fleet}-mesh")
}

/// True when the Pod runs an Istio proxy: a container, or a native sidecar
/// (an init container with `restartPolicy: Always`).
pub fn has_proxy(pod: &Value) -> bool {
    let named = |c: &Value| c["name"] == PROXY_CONTAINER;
    pod["spec"]["containers"]
        .as_array()
        .is_some_and(|cs| cs.iter().any(named))
        || pod["spec"]["initContainers"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| named(c) && c["restartPolicy"] == "Always")
        })
}

/// The mesh settings of a fleet leaving the mesh: the spec no longer has
/// them, so port 8080 keeps what the fleet's current AuthorizationPolicy
/// allows (any caller when it has an 8080 rule or there is no policy).
pub fn departing(policy: Option<&Value>, control_plane: Option<&str>) -> Istio {
    let allow_all = policy.is_none_or(|p| {
        p["spec"]["rules"].as_array().is_some_and(|rules| {
            rules
                .iter()
                .any(|r| r["to"][0]["operation"]["ports"] == json!([APPLICATION_PORT.to_string()]))
        })
    });
    Istio {
        application_access: Some(if allow_all { "AllowAll" } else { "Policies" }.to_owned()),
        control_plane_namespace: control_plane.map(str::to_owned),
    }
}

/// The Pod-template labels and annotations of the mesh.
pub fn template_metadata(
    fleet: &Fleet,
    labels: &mut Map<String, Value>,
    annotations: &mut Map<String, Value>,
) {
    if fleet.spec.istio().is_some() {
        labels.insert("sidecar.istio.io/inject".into(), json!("true"));
        labels.insert(FLEET_LABEL.into(), json!(fleet.metadata.name));
        annotations.insert("sidecar.istio.io/nativeSidecar".into(), json!("true"));
        annotations.insert(
            "traffic.sidecar.istio.io/excludeOutboundIPRanges".into(),
            json!("169.254.170.23/32"),
        );
    } else if fleet
        .metadata
        .annotations
        .contains_key(ISTIO_CONTROL_PLANE_ANNOTATION)
    {
        labels.insert("sidecar.istio.io/inject".into(), json!("false"));
    }
}

/// True when the workload's Pod template still asks for the proxy.
pub fn template_in_mesh(workload: &Value) -> bool {
    workload["spec"]["template"]["metadata"]["labels"]["sidecar.istio.io/inject"] == "true"
}

/// True when the snapshot shows a departing fleet's mesh objects in place:
/// PeerAuthentication `F-mesh` keeps 8081 PERMISSIVE and the
/// AuthorizationPolicy has a peer rule that asks for no identity. Until
/// then the Pod template keeps the proxy: a member started without one
/// would talk plaintext to peers whose policy still demands an identity
/// (a plan's writes are attempted independently, so the workload's update
/// can land while the policy's fails).
pub fn departure_in_place(policy: Option<&Value>, peer: Option<&Value>) -> bool {
    let live = |o: &&Value| o["metadata"]["deletionTimestamp"].is_null();
    let permissive = peer
        .filter(live)
        .is_some_and(|p| p["spec"]["portLevelMtls"][PEER_PORT.to_string()]["mode"] == "PERMISSIVE");
    let open_peer_rule = policy.filter(live).is_some_and(|p| {
        p["spec"]["rules"].as_array().is_some_and(|rules| {
            rules.iter().any(|r| {
                r["to"][0]["operation"]["ports"] == json!([PEER_PORT.to_string()])
                    && r.get("from").is_none()
            })
        })
    });
    permissive && open_peer_rule
}

/// The fleet as the Pod template sees it while its members keep the proxy
/// during a departure (`template_metadata` of a fleet still in the mesh).
pub fn keeping_proxy(fleet: &Fleet) -> Fleet {
    let mut kept = fleet.clone();
    kept.spec.mesh = Some(crate::api::Mesh {
        istio: Some(Istio::default()),
    });
    kept
}

/// The istiod egress rule of NetworkPolicy `F`.
pub fn istiod_egress(namespace: &str) -> Value {
    json!({
        "to": [{
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "podSelector": {"matchLabels": {"app": "istiod"}},
        }],
        "ports": [{"protocol": "TCP", "port": ISTIOD_PORT}],
    })
}

fn meta(fleet: &Fleet) -> Value {
    json!({"name": mesh_name(&fleet.metadata.name), "namespace": fleet.metadata.namespace})
}

/// AuthorizationPolicy `F-mesh`. `strict`: every member has a proxy, so the
/// peer rule requires the fleet's or the operator's identity.
pub fn authorization_policy(
    fleet: &Fleet,
    istio: &Istio,
    settings: &Settings,
    strict: bool,
) -> Value {
    let mut peer = json!({"to": [{"operation": {"ports": [PEER_PORT.to_string()]}}]});
    if strict {
        peer["from"] = json!([{"source": {"principals": [
            format!("*/ns/{}/sa/{}", fleet.metadata.namespace, fleet.spec.service_account_name),
            format!("*/ns/{}/sa/{}", settings.operator_namespace, settings.operator_service_account),
        ]}}]);
    }
    let mut rules = vec![peer];
    if istio.allow_all() {
        rules.push(json!({"to": [{"operation": {"ports": [APPLICATION_PORT.to_string()]}}]}));
    }
    json!({
        "apiVersion": "security.istio.io/v1",
        "kind": "AuthorizationPolicy",
        "metadata": meta(fleet),
        "spec": {
            "selector": {"matchLabels": {FLEET_UID_LABEL: fleet.metadata.uid}},
            "action": "ALLOW",
            "rules": rules,
        },
    })
}

/// PeerAuthentication `F-mesh`: 8081 PERMISSIVE while a member has no proxy.
pub fn peer_authentication(fleet: &Fleet) -> Value {
    json!({
        "apiVersion": "security.istio.io/v1",
        "kind": "PeerAuthentication",
        "metadata": meta(fleet),
        "spec": {
            "selector": {"matchLabels": {FLEET_UID_LABEL: fleet.metadata.uid}},
            "portLevelMtls": {(PEER_PORT.to_string()): {"mode": "PERMISSIVE"}},
        },
    })
}
