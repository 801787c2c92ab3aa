//! CelldPreview: a developer's preview of an application, run as a preview
//! child CelldFleet generated from its parent's `spec.previews`.
//!
//! - The child is named after the preview (a DNS label of at most 40
//!   characters, as CelldFleet names are), owned by a controller
//!   ownerReference (same namespace), so deleting the preview collects the
//!   child through the child's own lifecycle finalizer.
//! - Its spec comes only from the parent's `spec.previews`: runtimeImage,
//!   serviceAccountName, one member in `zone`, the preview bucket and
//!   region, the Secret-backed `endpoint`, `scratch`, `execution`, and
//!   `storage.previewFleetRef` to the parent. Its `storage.prefix` is
//!   `<preview name>-<first 8 of the preview UID>`, unique to this preview
//!   (a recreated preview of the same name gets a new prefix, since a
//!   prefix reservation binds to one child UID forever).
//! - Routing: one hostname `<preview>.<baseDomain>` with the parent
//!   previews' ingress (class, TLS Secret, annotations) or gateway and
//!   data-plane source, as the child's `spec.routing`.
//! - `spec.seed` maps to the child's `storage.initialization` (executor and
//!   source fleet from the parent's `previews.seeding`); the executor is
//!   external and not bundled, so `Seeded` stays Unknown/`ExecutorRequired`.
//! - After `ttlSeconds` from creation the child is deleted (with UID and
//!   resourceVersion preconditions); the CelldPreview is kept with phase
//!   `Expired` and `Expired=True`, so the developer sees what happened
//!   (the CRD's phase enum has Expired; deleting it is the developer's).
//! - A parent recreated under the same name (another UID) than the one the
//!   child was made for gives `Blocked/ParentReplaced`.
//! - A missing parent, a parent without `spec.previews`, a prefix whose
//!   reservation another fleet holds, a same-named fleet the preview does
//!   not own, or a seed the parent cannot serve give `Blocked=True` with
//!   the reason, and nothing is created.

use std::time::Duration;

use serde_json::{Value, json};
use wasmop_sdk::conditions::{ConditionStatus, conditions_of, set_condition};
use wasmop_sdk::k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use wasmop_sdk::k8s_openapi::jiff::{SignedDuration, Timestamp};
use wasmop_sdk::{Controller, KindRef, Plan, Read, ReconcileError, Selector, Snapshot};

use crate::api::{self, API_VERSION};
use crate::names::reservation_name;

/// Name of the CelldPreview controller.
pub const PREVIEW_CONTROLLER: &str = "preview";
/// Read: the CelldFleets of the preview's namespace (the parent, and a
/// same-named fleet the preview does not own).
pub const FLEETS_READ: &str = "preview-fleets";
/// Read: every storage reservation (a prefix another fleet holds).
pub const RESERVATIONS_READ: &str = "preview-reservations";
/// `spec.ttlSeconds` when absent (the CRD default).
pub const DEFAULT_TTL_SECONDS: i64 = 86_400;
/// Longest wait before looking at a preview again.
const MAX_REQUEUE: Duration = Duration::from_secs(300);

/// Condition types.
pub mod types {
    /// The child fleet is Ready.
    pub const READY: &str = "Ready";
    /// Something stops the preview; the reason says what.
    pub const BLOCKED: &str = "Blocked";
    /// The TTL has passed.
    pub const EXPIRED: &str = "Expired";
    /// The seed selection was handed to the external executor.
    pub const SEEDED: &str = "Seeded";
}

/// The CelldPreview kind.
pub fn preview_kind() -> KindRef {
    KindRef::namespaced(api::GROUP, api::VERSION, "CelldPreview", "celldpreviews")
}

/// The controller as declared in the manifest.
pub fn controller() -> Controller {
    Controller::new(PREVIEW_CONTROLLER, preview_kind())
        .owns(api::fleet_kind())
        .reads(Read::new(
            FLEETS_READ,
            api::fleet_kind(),
            Selector::SameNamespace,
        ))
        .reads(Read::new(
            RESERVATIONS_READ,
            api::reservation_kind(),
            Selector::ClusterWide,
        ))
}

/// The child's `storage.prefix`: the preview name (dots as dashes) cut to
/// leave room for `-` and the first 8 characters of the preview UID.
pub fn prefix(name: &str, uid: &str) -> String {
    let short: String = uid.chars().filter(|c| *c != '-').take(8).collect();
    let mut base: String = name.replace('.', "-").chars().take(63 - 9).collect();
    while base.ends_with('-') {
        base.pop();
    }
    format!("{base}-{}", short.to_ascii_lowercase())
}

/// True for a DNS label of at most 40 characters (a CelldFleet name).
pub fn fleet_name_ok(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 40
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// When the preview expires: creation plus `ttlSeconds`.
pub fn expires_at(preview: &Value) -> Option<Timestamp> {
    let created: Timestamp = preview["metadata"]["creationTimestamp"]
        .as_str()?
        .parse()
        .ok()?;
    let ttl = preview["spec"]["ttlSeconds"]
        .as_i64()
        .unwrap_or(DEFAULT_TTL_SECONDS);
    created.checked_add(SignedDuration::from_secs(ttl)).ok()
}

/// The child's `storage.initialization` for `seed`, or why the parent
/// cannot serve it.
pub fn initialization(
    seed: &Value,
    parent: &Value,
    preview: &Value,
    target: &Value,
    deadline: &Timestamp,
) -> Result<Value, (&'static str, String)> {
    let seeding = &parent["spec"]["previews"]["seeding"];
    let parent_name = parent["metadata"]["name"].as_str().unwrap_or("");
    let Some(executor) = seeding["executor"].as_str() else {
        return Err((
            "SeedingUnavailable",
            format!(
                "spec.seed needs spec.previews.seeding (an executor and sources) on fleet \
                 {parent_name}, which has none; remove the seed or ask the pool's administrator"
            ),
        ));
    };
    let alias = seed["source"].as_str().unwrap_or("");
    let Some(source) = seeding["sources"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["name"].as_str() == Some(alias))
    else {
        return Err((
            "SeedSourceUnknown",
            format!(
                "seed source {alias} is not one of the sources in fleet {parent_name}'s \
                 spec.previews.seeding"
            ),
        ));
    };
    Ok(json!({
        "executor": executor,
        "deadline": deadline.to_string(),
        "selection": seed,
        "sourceFleet": source["fleetRef"],
        "target": {
            "fleetName": target["fleetName"],
            "previewFleetRef": target["previewFleetRef"],
            "previewName": preview["metadata"]["name"],
            "previewUID": preview["metadata"]["uid"],
            "storageURL": target["storageURL"],
        },
    }))
}

/// The child's `spec.routing` from the parent's `previews.routing`.
pub fn routing(previews: &Value, host: &str) -> Value {
    let r = &previews["routing"];
    let mut out = json!({"hostnames": [host], "source": r["source"]});
    for key in ["ingress", "gateway"] {
        if !r[key].is_null() {
            out[key] = r[key].clone();
        }
    }
    out
}

/// The child CelldFleet.
pub fn child(
    name: &str,
    namespace: &str,
    parent: &Value,
    prefix: &str,
    host: &str,
    init: Option<Value>,
) -> Value {
    let previews = &parent["spec"]["previews"];
    let storage = &previews["storage"];
    let mut child_storage = json!({
        "bucket": storage["bucket"],
        "region": storage["region"],
        "prefix": prefix,
        "previewFleetRef": {"name": parent["metadata"]["name"], "uid": parent["metadata"]["uid"]},
    });
    for key in ["endpoint"] {
        if !storage[key].is_null() {
            child_storage[key] = storage[key].clone();
        }
    }
    if !previews["scratch"].is_null() {
        child_storage["scratch"] = previews["scratch"].clone();
    }
    if let Some(init) = init {
        child_storage["initialization"] = init;
    }
    let mut spec = json!({
        "profile": "Bucket",
        "replicas": 1,
        "runtimeImage": previews["runtimeImage"],
        "serviceAccountName": previews["serviceAccountName"],
        "storage": child_storage,
        "placement": {"azCount": 1, "zones": [previews["zone"]], "mode": "Relaxed"},
        "routing": routing(previews, host),
    });
    if !previews["execution"].is_null() {
        spec["execution"] = previews["execution"].clone();
    }
    json!({
        "apiVersion": API_VERSION,
        "kind": "CelldFleet",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    })
}

struct Status {
    conditions: Vec<Condition>,
    generation: Option<i64>,
    now: Time,
    fields: Value,
}

impl Status {
    fn set(&mut self, type_: &str, status: impl Into<ConditionStatus>, reason: &str, msg: &str) {
        set_condition(
            &mut self.conditions,
            type_,
            status,
            reason,
            msg,
            self.generation,
            &self.now,
        );
    }

    fn into_value(mut self, phase: &str) -> Value {
        self.fields["phase"] = json!(phase);
        self.fields["observedGeneration"] = json!(self.generation);
        self.fields["conditions"] = json!(self.conditions);
        self.fields
    }

    fn blocked(mut self, reason: &str, message: String) -> Value {
        self.set(types::BLOCKED, true, reason, &message);
        self.set(types::READY, false, reason, &message);
        self.into_value("Blocked")
    }
}

fn condition<'a>(object: &'a Value, type_: &str) -> Option<&'a Value> {
    object["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

/// One reconcile of a CelldPreview.
pub fn reconcile(snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
    let preview = &snapshot.primary;
    let name = snapshot.primary_name().to_owned();
    let namespace = snapshot.primary_namespace().unwrap_or("default");
    let uid = preview["metadata"]["uid"].as_str().unwrap_or("").to_owned();
    let now_ts: Timestamp = snapshot
        .now
        .parse()
        .map_err(|e| ReconcileError::internal(format!("snapshot time: {e}")))?;
    let mut st = Status {
        conditions: conditions_of(preview),
        generation: snapshot.primary_generation(),
        now: snapshot.now()?,
        fields: json!({}),
    };
    let child = snapshot.owned_named("CelldFleet", &name);
    if snapshot.deleting {
        // The child goes with the preview (ownerReference); nothing to do.
        return Ok(Plan::new().status(st.into_value("Deleting")));
    }
    let expires = expires_at(preview)
        .ok_or_else(|| ReconcileError::internal("preview without creationTimestamp"))?;
    st.fields["expiresAt"] = json!(expires.to_string());

    if now_ts >= expires {
        let message = format!("ttlSeconds elapsed at {expires}");
        st.set(types::EXPIRED, true, "TTLExpired", &message);
        st.set(types::READY, false, "Expired", &message);
        st.set(types::BLOCKED, false, "Expired", "");
        return Ok(match child {
            Some(child) => {
                st.fields["fleetName"] = json!(name);
                let plan = if child["metadata"]["deletionTimestamp"].is_null() {
                    Plan::new()
                        .delete_owned(child)?
                        .event("PreviewExpired", format!("deleting preview fleet {name}"))
                } else {
                    Plan::new()
                };
                plan.status(st.into_value("Deleting"))
                    .requeue_after(Duration::from_secs(5))
            }
            None => Plan::new().status(st.into_value("Expired")),
        });
    }
    st.set(
        types::EXPIRED,
        false,
        "Active",
        &format!("expires at {expires}"),
    );
    let left = expires.duration_since(now_ts).as_secs().max(1) as u64;
    let requeue = Duration::from_secs(left).min(MAX_REQUEUE);

    if !fleet_name_ok(&name) {
        let message = format!(
            "the preview name {name} names its fleet, which must be a DNS label of at most 40 \
             characters"
        );
        return Ok(Plan::new()
            .status(st.blocked("InvalidConfiguration", message))
            .requeue_after(requeue));
    }
    let parent_name = preview["spec"]["fleetRef"]["name"].as_str().unwrap_or("");
    let fleets: Vec<&Value> = snapshot.related(FLEETS_READ).collect();
    let named = |n: &str| {
        fleets
            .iter()
            .copied()
            .find(|f| f["metadata"]["name"].as_str() == Some(n))
    };
    let Some(parent) = named(parent_name) else {
        let message = format!("fleet {parent_name} (spec.fleetRef) does not exist");
        return Ok(Plan::new()
            .status(st.blocked("ParentNotFound", message))
            .requeue_after(requeue));
    };
    let previews = &parent["spec"]["previews"];
    if previews.is_null() {
        let message = format!(
            "fleet {parent_name} has no spec.previews: it is not a preview pool, so previews \
             cannot run under it"
        );
        return Ok(Plan::new()
            .status(st.blocked("PreviewsNotConfigured", message))
            .requeue_after(requeue));
    }
    if parent_name == name || (child.is_none() && named(&name).is_some()) {
        let message = format!(
            "a CelldFleet named {name} exists that this preview does not own; rename the preview"
        );
        return Ok(Plan::new()
            .status(st.blocked("NameConflict", message))
            .requeue_after(requeue));
    }
    let parent_uid = parent["metadata"]["uid"].as_str().unwrap_or("");
    let bound = child.and_then(|c| c["spec"]["storage"]["previewFleetRef"]["uid"].as_str());
    if let Some(bound) = bound.filter(|b| *b != parent_uid) {
        let message = format!(
            "preview fleet {name} belongs to fleet {parent_name} with uid {bound}, which was \
             replaced (uid {parent_uid}); delete and recreate the preview"
        );
        return Ok(Plan::new()
            .status(st.blocked("ParentReplaced", message))
            .requeue_after(requeue));
    }
    st.fields["parentFleetName"] = json!(parent_name);
    st.fields["parentFleetUID"] = json!(parent_uid);

    let bucket = previews["storage"]["bucket"].as_str().unwrap_or("");
    // A child keeps the prefix it was created with.
    let prefix = child
        .and_then(|c| c["spec"]["storage"]["prefix"].as_str())
        .map(str::to_owned)
        .unwrap_or_else(|| prefix(&name, &uid));
    let child_uid = child.and_then(|c| c["metadata"]["uid"].as_str());
    let held = snapshot.related(RESERVATIONS_READ).find(|r| {
        r["metadata"]["name"].as_str() == Some(&reservation_name(&format!("{bucket}/{prefix}")))
    });
    if let Some(r) = held
        && r["spec"]["fleetUID"].as_str() != child_uid
    {
        let message = format!(
            "prefix {prefix} of bucket {bucket} is reserved by fleet {}/{} (uid {})",
            r["spec"]["fleetNamespace"].as_str().unwrap_or("?"),
            r["spec"]["fleetName"].as_str().unwrap_or("?"),
            r["spec"]["fleetUID"].as_str().unwrap_or("?"),
        );
        return Ok(Plan::new()
            .status(st.blocked("StorageScopeConflict", message))
            .requeue_after(requeue));
    }
    let storage_url = format!("s3://{bucket}/{prefix}");
    let domain = previews["routing"]["baseDomain"].as_str().unwrap_or("");
    let host = format!("{name}.{domain}");
    let scheme = previews["routing"]["scheme"].as_str().unwrap_or("https");
    st.fields["fleetName"] = json!(name);
    st.fields["url"] = json!(format!("{scheme}://{host}"));
    st.fields["storageURL"] = json!(storage_url);
    st.fields["endpoint"] = json!(format!("http://{name}.{namespace}.svc:8080"));

    let init = match preview["spec"].get("seed").filter(|s| !s.is_null()) {
        None => None,
        Some(seed) => {
            let target = json!({
                "fleetName": name,
                "previewFleetRef": {"name": parent_name, "uid": parent_uid},
                "storageURL": storage_url,
            });
            match initialization(seed, parent, preview, &target, &expires) {
                Ok(init) => Some(init),
                Err((reason, message)) => {
                    st.set(types::SEEDED, false, reason, &message);
                    st.fields["seedPhase"] = json!("Failed");
                    return Ok(Plan::new()
                        .status(st.blocked(reason, message))
                        .requeue_after(requeue));
                }
            }
        }
    };
    if let Some(init) = &init {
        let message = format!(
            "the seed selection is in the preview fleet's storage.initialization for executor \
             {}; wasmop bundles no snapshot/import executor, so the seed runs only where one is \
             installed",
            init["executor"].as_str().unwrap_or("?")
        );
        st.set(
            types::SEEDED,
            ConditionStatus::Unknown,
            "ExecutorRequired",
            &message,
        );
        st.fields["seedPhase"] = json!("Pending");
        st.fields["seedReservation"] = json!(reservation_name(&format!("{bucket}/{prefix}")));
    }
    st.set(types::BLOCKED, false, "NotBlocked", "");
    let seeding = init.is_some();
    let desired = child_fleet(&name, namespace, parent, &prefix, &host, init, child);

    let phase = match child {
        None => {
            st.set(
                types::READY,
                false,
                "Creating",
                &format!("creating preview fleet {name}"),
            );
            "Pending"
        }
        Some(c) => match (
            condition(c, "Blocked").filter(|b| b["status"] == "True"),
            condition(c, "Ready"),
        ) {
            (Some(b), _) => {
                let reason = b["reason"].as_str().unwrap_or("FleetBlocked");
                let message = format!(
                    "preview fleet {name} is blocked: {}",
                    b["message"].as_str().unwrap_or("")
                );
                st.set(types::READY, false, reason, &message);
                st.set(types::BLOCKED, true, reason, &message);
                "Blocked"
            }
            (None, Some(r)) if r["status"] == "True" => {
                st.set(
                    types::READY,
                    true,
                    "FleetReady",
                    "the preview fleet is ready",
                );
                "Ready"
            }
            _ => {
                st.set(
                    types::READY,
                    false,
                    "FleetNotReady",
                    &format!("waiting for preview fleet {name} to become ready"),
                );
                if seeding { "Initializing" } else { "Pending" }
            }
        },
    };
    Ok(Plan::new()
        .apply(desired)
        .status(st.into_value(phase))
        .requeue_after(requeue))
}

fn child_fleet(
    name: &str,
    namespace: &str,
    parent: &Value,
    prefix: &str,
    host: &str,
    init: Option<Value>,
    existing: Option<&Value>,
) -> Value {
    // An existing child's initialization is fixed; keep what it has.
    let init = match existing {
        Some(c) => Some(c["spec"]["storage"]["initialization"].clone()).filter(|v| !v.is_null()),
        None => init,
    };
    child(name, namespace, parent, prefix, host, init)
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmop_sdk::testing::SnapshotBuilder;

    const UID: &str = "7e5b0c1d-aaaa-bbbb-cccc-000000000042";

    fn preview(name: &str, ttl: i64) -> Value {
        json!({
            "apiVersion": API_VERSION, "kind": "CelldPreview",
            "metadata": {"name": name, "namespace": "ns", "uid": UID, "generation": 1,
                         "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"fleetRef": {"name": "pool"}, "source": "feature/x", "ttlSeconds": ttl},
        })
    }

    fn pool() -> Value {
        json!({
            "apiVersion": API_VERSION, "kind": "CelldFleet",
            "metadata": {"name": "pool", "namespace": "ns", "uid": "pool-uid"},
            "spec": {"previews": {
                "runtimeImage": "img", "serviceAccountName": "sa", "zone": "us-east-1a",
                "storage": {"bucket": "pb", "region": "us-east-1"},
                "routing": {"baseDomain": "p.example.com", "scheme": "http",
                            "gateway": {"name": "gw", "namespace": "edge"},
                            "source": {"namespace": "edge", "podLabels": {"a": "b"}}},
            }},
        })
    }

    fn run(b: SnapshotBuilder) -> Plan {
        reconcile(&b.build()).expect("reconcile")
    }

    fn cond<'a>(plan: &'a Plan, type_: &str) -> &'a Value {
        plan.status.as_ref().expect("status")["conditions"]
            .as_array()
            .expect("conditions")
            .iter()
            .find(|c| c["type"] == type_)
            .expect("condition")
    }

    #[test]
    fn prefix_is_a_label_unique_per_uid_and_bounded() {
        assert_eq!(prefix("pr-42", UID), "pr-42-7e5b0c1d");
        assert_ne!(prefix("pr-42", UID), prefix("pr-42", "00000000-1"));
        let long = prefix(&format!("{}.x", "a".repeat(80)), UID);
        assert!(long.len() <= 63, "{long}");
        assert!(long.ends_with("-7e5b0c1d"));
        assert_eq!(prefix("a.b", UID), "a-b-7e5b0c1d");
    }

    #[test]
    fn fleet_names_are_dns_labels_of_at_most_40() {
        assert!(fleet_name_ok("pr-42"));
        assert!(!fleet_name_ok("a.b"));
        assert!(!fleet_name_ok(&"a".repeat(41)));
        assert!(!fleet_name_ok("-a"));
        assert!(!fleet_name_ok(""));
    }

    #[test]
    fn expiry_defaults_to_a_day() {
        let mut p = preview("x", 0);
        p["spec"].as_object_mut().map(|s| s.remove("ttlSeconds"));
        assert_eq!(
            expires_at(&p).map(|t| t.to_string()).as_deref(),
            Some("2026-01-02T00:00:00Z")
        );
    }

    #[test]
    fn gateway_routing_and_http_scheme_carry_over() {
        let plan = run(SnapshotBuilder::new(PREVIEW_CONTROLLER)
            .primary(preview("pr-1", 3600))
            .related(FLEETS_READ, pool())
            .now("2026-01-01T00:10:00Z"));
        let child = &plan.apply[0].object;
        assert_eq!(child["metadata"]["namespace"], "ns");
        assert_eq!(
            child["spec"]["routing"],
            json!({"hostnames": ["pr-1.p.example.com"], "gateway": {"name": "gw", "namespace": "edge"},
                   "source": {"namespace": "edge", "podLabels": {"a": "b"}}})
        );
        assert!(child["spec"]["storage"].get("endpoint").is_none());
        assert!(child["spec"].get("execution").is_none());
        let status = plan.status.as_ref().expect("status");
        assert_eq!(status["url"], "http://pr-1.p.example.com");
        // Looked at again at expiry, at most every 5 minutes.
        assert_eq!(plan.requeue_after_ms, Some(300_000));
    }

    #[test]
    fn a_same_named_fleet_it_does_not_own_blocks() {
        let mut other = pool();
        other["metadata"]["name"] = json!("pr-1");
        let plan = run(SnapshotBuilder::new(PREVIEW_CONTROLLER)
            .primary(preview("pr-1", 3600))
            .related(FLEETS_READ, pool())
            .related(FLEETS_READ, other)
            .now("2026-01-01T00:10:00Z"));
        assert!(plan.apply.is_empty());
        assert_eq!(cond(&plan, "Blocked")["reason"], "NameConflict");
    }

    #[test]
    fn a_name_that_cannot_name_a_fleet_blocks() {
        let plan = run(SnapshotBuilder::new(PREVIEW_CONTROLLER)
            .primary(preview("a.b", 3600))
            .related(FLEETS_READ, pool())
            .now("2026-01-01T00:10:00Z"));
        assert!(plan.apply.is_empty());
        assert_eq!(cond(&plan, "Blocked")["reason"], "InvalidConfiguration");
    }

    #[test]
    fn an_unknown_seed_source_blocks_and_creates_nothing() {
        let mut p = preview("pr-1", 3600);
        p["spec"]["seed"] = json!({"source": "staging", "objects": [{"class": "C", "id": "1"}]});
        let mut parent = pool();
        parent["spec"]["previews"]["seeding"] = json!({"executor": "e", "sources": [
            {"name": "production", "fleetRef": {"name": "prod", "namespace": "a", "uid": "u"}}]});
        let plan = run(SnapshotBuilder::new(PREVIEW_CONTROLLER)
            .primary(p)
            .related(FLEETS_READ, parent)
            .now("2026-01-01T00:10:00Z"));
        assert!(plan.apply.is_empty());
        assert_eq!(cond(&plan, "Seeded")["reason"], "SeedSourceUnknown");
        assert_eq!(cond(&plan, "Blocked")["status"], "True");
    }

    #[test]
    fn an_existing_child_keeps_its_prefix_and_mirrors_ready() {
        let child = json!({
            "apiVersion": API_VERSION, "kind": "CelldFleet",
            "metadata": {"name": "pr-1", "namespace": "ns", "uid": "c", "resourceVersion": "1"},
            "spec": {"storage": {"prefix": "pr-1-older000"}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        });
        let plan = run(SnapshotBuilder::new(PREVIEW_CONTROLLER)
            .primary(preview("pr-1", 3600))
            .related(FLEETS_READ, pool())
            .owned(child)
            .now("2026-01-01T00:10:00Z"));
        assert_eq!(
            plan.apply[0].object["spec"]["storage"]["prefix"],
            "pr-1-older000"
        );
        let status = plan.status.as_ref().expect("status");
        assert_eq!(status["phase"], "Ready");
        assert_eq!(status["storageURL"], "s3://pb/pr-1-older000");
    }

    #[test]
    fn a_replaced_parent_blocks_instead_of_rebinding_the_child() {
        let child = json!({
            "apiVersion": API_VERSION, "kind": "CelldFleet",
            "metadata": {"name": "pr-1", "namespace": "ns", "uid": "c", "resourceVersion": "1"},
            "spec": {"storage": {"prefix": "pr-1-7e5b0c1d",
                                 "previewFleetRef": {"name": "pool", "uid": "old-pool-uid"}}},
        });
        let plan = run(SnapshotBuilder::new(PREVIEW_CONTROLLER)
            .primary(preview("pr-1", 3600))
            .related(FLEETS_READ, pool())
            .owned(child)
            .now("2026-01-01T00:10:00Z"));
        assert!(plan.apply.is_empty());
        assert_eq!(cond(&plan, "Blocked")["reason"], "ParentReplaced");
    }

    #[test]
    fn an_expired_child_already_deleting_is_not_deleted_again() {
        let child = json!({
            "apiVersion": API_VERSION, "kind": "CelldFleet",
            "metadata": {"name": "pr-1", "namespace": "ns", "uid": "c", "resourceVersion": "1",
                         "deletionTimestamp": "2026-01-01T01:00:01Z"},
        });
        let plan = run(SnapshotBuilder::new(PREVIEW_CONTROLLER)
            .primary(preview("pr-1", 3600))
            .related(FLEETS_READ, pool())
            .owned(child)
            .now("2026-01-01T01:00:05Z"));
        assert!(plan.delete.is_empty() && plan.apply.is_empty());
        assert_eq!(plan.status.as_ref().expect("status")["phase"], "Deleting");
        assert_eq!(cond(&plan, "Expired")["status"], "True");
    }
}
