//! Waiting on what an operator reports: conditions in a status and Events
//! about an object. Every wait polls the API server under a deadline
//! ([`crate::wait_for`]); none sleeps as synchronisation.

use std::time::Duration;

use anyhow::{Result, bail};
use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::api::{Api, DynamicObject, ListParams};
use serde_json::Value;

use crate::wait_for;

/// Condition `type_` of `obj`'s `status.conditions`, or `null`.
pub fn condition(obj: &DynamicObject, type_: &str) -> Value {
    obj.data["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_).cloned())
        .unwrap_or(Value::Null)
}

/// True when condition `type_` of `obj` has `status` and `reason`.
pub fn reason_is(obj: &DynamicObject, type_: &str, status: &str, reason: &str) -> bool {
    let c = condition(obj, type_);
    c["status"] == status && c["reason"] == reason
}

/// Waits until condition `type_` of `name` has `status` (and `reason`,
/// when given); returns the object.
pub async fn wait_condition(
    api: &Api<DynamicObject>,
    name: &str,
    type_: &str,
    status: &str,
    reason: Option<&str>,
    deadline: Duration,
) -> Result<DynamicObject> {
    wait_for(
        &format!("{name}: {type_}={status} {reason:?}"),
        deadline,
        || {
            let api = api.clone();
            async move {
                let obj = api.get(name).await?;
                let c = condition(&obj, type_);
                if c["status"] == status && reason.is_none_or(|r| c["reason"] == r) {
                    Ok(Some(obj))
                } else {
                    bail!("{type_} is {c}")
                }
            }
        },
    )
    .await
}

/// The Events (events.k8s.io/v1) about the object `name` in `namespace`:
/// `(type, reason, note)`.
pub async fn events(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<Vec<(String, String, String)>> {
    let api: Api<Event> = Api::namespaced(client.clone(), namespace);
    Ok(api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .map(|e| {
            (
                e.type_.unwrap_or_default(),
                e.reason.unwrap_or_default(),
                e.note.unwrap_or_default(),
            )
        })
        .collect())
}

/// Waits for an Event with `reason` (and of `type_`, when given) about
/// `name` in `namespace`; returns its `(type, note)`.
pub async fn wait_event(
    client: &Client,
    namespace: &str,
    name: &str,
    type_: Option<&str>,
    reason: &str,
    deadline: Duration,
) -> Result<(String, String)> {
    let what = match type_ {
        Some(t) => format!("a {t} Event {reason} about {name}"),
        None => format!("an Event {reason} about {name}"),
    };
    wait_for(&what, deadline, || async move {
        let all = events(client, namespace, name).await?;
        let found = all
            .iter()
            .find(|(t, r, _)| r == reason && type_.is_none_or(|want| t == want));
        match found {
            Some((t, _, note)) => Ok(Some((t.clone(), note.clone()))),
            None => bail!("events so far: {all:?}"),
        }
    })
    .await
}
