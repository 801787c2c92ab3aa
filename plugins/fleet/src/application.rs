//! Application observation: every member's private `GET /state` on the
//! peer port, read by the host (plan HTTP requests), summarised in
//! `status.application` and the `ApplicationConverged` condition. It never
//! gates Ready, scaling, maintenance or deletion.
//!
//! Limits: the host sends an unchanged GET at most every 15 s per fleet and
//! holds 8 requests in flight; each request here has a 10 s deadline, a
//! 1 MiB response cap and a 90 s maximum age; a response whose own
//! `sampledAt` is older than 90 s is stale.
//!
//! Membership: a request's id records the member as it was when the
//! request was planned (Pod UID, container incarnation, Pod IP) — the
//! opening inventory. A result counts only when the member, as the current
//! snapshot shows it (the closing inventory), has the same identity, is
//! ready and is controlled by the fleet's workload.
//!
//! The body a member answers (celld's `/state`, as this plugin reads it):
//! `{"sampledAt": RFC 3339 (optional), "deployment": {"version", "prefix"},
//! "cells": {"pending", "swapping"}}`; other fields are ignored.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};
use wasmop_sdk::k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use wasmop_sdk::{HttpRequest, Observation, ObservationOutcome, Plan, Snapshot};

use crate::names::{CONTAINER, PEER_PORT};

/// The http-target of member Pods.
pub const MEMBERS_TARGET: &str = "members";
/// Condition type.
pub const APPLICATION_CONVERGED: &str = "ApplicationConverged";
/// Per-request deadline.
pub const COLLECTION_DEADLINE: Duration = Duration::from_secs(10);
/// Largest response kept.
pub const MAX_RESPONSE_BYTES: u32 = 1024 * 1024;
/// Oldest usable response.
pub const MAX_AGE: Duration = Duration::from_secs(90);
/// How often a fleet asks for fresh observations.
pub const INTERVAL: Duration = Duration::from_secs(15);
/// Most Pod diagnostics in status.
pub const MAX_DIAGNOSTICS: usize = 100;

/// Reasons of `ApplicationConverged`.
pub mod reasons {
    /// Every member agrees and no cell is transitioning.
    pub const CONVERGED: &str = "Converged";
    /// Coverage is complete but versions or prefixes differ.
    pub const MIXED_VERSIONS: &str = "MixedVersions";
    /// Members agree but cells are still pending or swapping.
    pub const CONVERGING: &str = "Converging";
    /// Observations are stale, unsupported, malformed, incomplete or
    /// interrupted by membership changes (status Unknown).
    pub const INCOMPLETE: &str = "ObservationIncomplete";
}

/// The request id of a member as it is now: `state.<uid>.<incarnation>.<ip>`.
fn request_id(pod: &Value) -> Option<String> {
    let uid = pod["metadata"]["uid"].as_str().filter(|s| !s.is_empty())?;
    let ip = pod["status"]["podIP"].as_str().filter(|s| !s.is_empty())?;
    Some(format!("state.{uid}.{}.{ip}", incarnation(pod)))
}

/// The member container's incarnation: its restart count and container ID.
fn incarnation(pod: &Value) -> String {
    let status = pod["status"]["containerStatuses"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == CONTAINER));
    match status {
        Some(c) => {
            let id = c["containerID"].as_str().unwrap_or("");
            let short = id.rsplit('/').next().unwrap_or("");
            format!(
                "{}-{}",
                c["restartCount"].as_i64().unwrap_or(0),
                &short[..short.len().min(12)]
            )
        }
        None => "0-".to_owned(),
    }
}

fn terminating(pod: &Value) -> bool {
    !pod["metadata"]["deletionTimestamp"].is_null()
}

fn current(pod: &Value) -> bool {
    !terminating(pod)
        && !matches!(
            pod["status"]["phase"].as_str(),
            Some("Succeeded" | "Failed")
        )
}

fn ready(pod: &Value) -> bool {
    pod["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

fn workload_controlled(pod: &Value) -> bool {
    pod["metadata"]["ownerReferences"]
        .as_array()
        .is_some_and(|rs| {
            rs.iter().any(|r| {
                r["controller"] == true
                    && matches!(r["kind"].as_str(), Some("ReplicaSet" | "StatefulSet"))
            })
        })
}

/// The requests for every current member with an address.
pub fn requests(pods: &[&Value]) -> Vec<HttpRequest> {
    pods.iter()
        .filter(|p| current(p))
        .filter_map(|p| {
            let id = request_id(p)?;
            let name = p["metadata"]["name"].as_str()?;
            Some(
                HttpRequest::get(&id, MEMBERS_TARGET, name, PEER_PORT as u16, "/state")
                    .timeout(COLLECTION_DEADLINE)
                    .max_response_bytes(MAX_RESPONSE_BYTES)
                    .max_age(MAX_AGE),
            )
        })
        .collect()
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct State {
    #[serde(default)]
    sampled_at: Option<String>,
    #[serde(default)]
    deployment: Option<Deployment>,
    #[serde(default)]
    cells: Option<Cells>,
}

#[derive(Debug, Deserialize)]
struct Deployment {
    #[serde(default)]
    version: Option<String>,
    #[serde(default)]
    prefix: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Cells {
    pending: i64,
    swapping: i64,
}

/// One member's sample, or why there is none.
#[derive(Debug, PartialEq, Eq)]
enum Sample {
    Fresh {
        version: String,
        prefix: String,
        pending: i64,
        swapping: i64,
    },
    Unavailable(&'static str, String),
}

fn sample(obs: &Observation, now: &Time) -> Sample {
    // The host's typed outcome, never the words of its error text. A host
    // without outcomes (None) makes every failed request Unavailable.
    if obs.outcome == Some(ObservationOutcome::Oversized) {
        let why = obs
            .error
            .clone()
            .unwrap_or_else(|| "response over the cap".into());
        return Sample::Unavailable("Oversized", why);
    }
    if let Some(e) = &obs.error {
        return Sample::Unavailable("Unavailable", e.clone());
    }
    if !obs.is_success() {
        return Sample::Unavailable(
            "Unavailable",
            format!("/state answered {}", obs.status.unwrap_or(0)),
        );
    }
    if obs.age_ms > MAX_AGE.as_millis() as u64 {
        return Sample::Unavailable("Stale", format!("observed {} ms ago", obs.age_ms));
    }
    let state: State = match serde_json::from_str(&obs.body) {
        Ok(s) => s,
        Err(e) => return Sample::Unavailable("Malformed", format!("/state is not JSON: {e}")),
    };
    if let Some(at) = &state.sampled_at {
        match at.parse().map(Time) {
            Ok(t) => {
                let age = now.0.duration_since(t.0).as_secs();
                if age > MAX_AGE.as_secs() as i64 {
                    return Sample::Unavailable("Stale", format!("sampled {age} s ago"));
                }
            }
            Err(_) => {
                return Sample::Unavailable("Malformed", format!("sampledAt {at:?} is not a time"));
            }
        }
    }
    let Some(Deployment {
        version: Some(version),
        prefix: Some(prefix),
    }) = state.deployment
    else {
        return Sample::Unavailable(
            "Unsupported",
            "/state has no deployment version and prefix".to_owned(),
        );
    };
    let cells = state.cells.unwrap_or_default();
    Sample::Fresh {
        version,
        prefix,
        pending: cells.pending,
        swapping: cells.swapping,
    }
}

/// `status.application` and the condition (`status`, reason, message).
#[derive(Debug)]
pub struct Summary {
    /// `status.application`.
    pub status: Value,
    /// `True`, `False` or `Unknown`.
    pub condition: &'static str,
    /// Reason.
    pub reason: &'static str,
    /// Message.
    pub message: String,
}

/// Summarises the members' latest observations.
pub fn summarise(snapshot: &Snapshot, pods: &[&Value], now: &Time) -> Summary {
    let members: Vec<&Value> = pods.iter().copied().filter(|p| current(p)).collect();
    let mut versions: BTreeMap<(String, String), i64> = BTreeMap::new();
    let (mut pending, mut swapping, mut observed) = (0_i64, 0_i64, 0_i64);
    let mut diagnostics = Vec::new();
    let mut unavailable = Vec::new();
    for pod in &members {
        let name = pod["metadata"]["name"].as_str().unwrap_or("").to_owned();
        let uid = pod["metadata"]["uid"].as_str().unwrap_or("").to_owned();
        let verdict = if !ready(pod) {
            Sample::Unavailable("NotReady", "the member is not ready".to_owned())
        } else if !workload_controlled(pod) {
            Sample::Unavailable(
                "NotAMember",
                "the Pod is not controlled by the fleet's workload".to_owned(),
            )
        } else {
            match request_id(pod).and_then(|id| snapshot.observation(&id)) {
                Some(obs) => sample(obs, now),
                None => {
                    let earlier = snapshot
                        .observations
                        .iter()
                        .any(|o| o.id.starts_with(&format!("state.{uid}.")));
                    if earlier {
                        Sample::Unavailable(
                            "MembershipChanged",
                            "the member restarted or moved since it was observed".to_owned(),
                        )
                    } else {
                        Sample::Unavailable("NotObserved", "no fresh /state yet".to_owned())
                    }
                }
            }
        };
        let mut node = json!({"name": name, "uid": uid});
        match verdict {
            Sample::Fresh {
                version,
                prefix,
                pending: p,
                swapping: s,
            } => {
                observed += 1;
                pending += p;
                swapping += s;
                node["reason"] = json!("Observed");
                node["version"] = json!(version);
                *versions.entry((version, prefix)).or_default() += 1;
            }
            Sample::Unavailable(reason, message) => {
                node["reason"] = json!(reason);
                unavailable.push(format!("{name}: {reason} ({message})"));
            }
        }
        if diagnostics.len() < MAX_DIAGNOSTICS {
            diagnostics.push(node);
        }
    }
    let expected = members.len() as i64;
    let mut status = json!({
        "observedAt": now.0.to_string(),
        "expectedNodes": expected,
        "observedNodes": observed,
        "unavailableNodes": expected - observed,
        "pendingCells": pending,
        "swappingCells": swapping,
        "versions": versions.iter().map(|((v, p), n)| json!({"version": v, "prefix": p, "nodes": n})).collect::<Vec<_>>(),
        "nodes": diagnostics,
    });
    let complete = expected > 0 && observed == expected;
    if complete
        && versions.len() == 1
        && let Some(((v, p), _)) = versions.iter().next()
    {
        status["observedVersion"] = json!({"version": v, "prefix": p});
    }
    let (condition, reason, message) = if !complete {
        (
            "Unknown",
            reasons::INCOMPLETE,
            if expected == 0 {
                "no members to observe".to_owned()
            } else {
                format!(
                    "{observed} of {expected} members freshly observed; {}",
                    unavailable.join("; ")
                )
            },
        )
    } else if versions.len() > 1 {
        let list: Vec<String> = versions
            .iter()
            .map(|((v, p), n)| format!("{v} ({p}) on {n}"))
            .collect();
        (
            "False",
            reasons::MIXED_VERSIONS,
            format!("members load {}", list.join(", ")),
        )
    } else if pending + swapping > 0 {
        (
            "False",
            reasons::CONVERGING,
            format!("{pending} cells pending and {swapping} swapping"),
        )
    } else {
        (
            "True",
            reasons::CONVERGED,
            format!("all {expected} members load the same version and no cell is transitioning"),
        )
    };
    Summary {
        status,
        condition,
        reason,
        message,
    }
}

/// Adds the `/state` requests to the plan and asks to come back for the
/// next collection.
pub fn plan(plan: Plan, pods: &[&Value]) -> Plan {
    requests(pods).into_iter().fold(plan, Plan::http)
}
