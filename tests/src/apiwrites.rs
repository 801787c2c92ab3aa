//! Writes as the API server counts them: `apiserver_request_total` from its
//! /metrics, for the benchmark and the write-economy test.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use kube::Client;

/// Writes by `resource[/subresource]`.
pub type Writes = BTreeMap<String, f64>;

/// The writes (verbs POST, PUT, PATCH and APPLY) the API server counted so
/// far for each of `resources`, keyed `resource[/subresource]`.
///
/// Deletes are not counted: the counter is cluster-wide, and the namespace
/// controller and the garbage collector keep deleting the objects of
/// earlier tests' namespaces in the background. What is measured with it
/// (applies, patches and status writes that change nothing) never deletes.
///
/// # Errors
/// When /metrics cannot be read.
pub async fn writes(client: &Client, resources: &[&str]) -> Result<Writes> {
    let req = http::Request::get("/metrics").body(Vec::new())?;
    let text = client.request_text(req).await.context("GET /metrics")?;
    let mut out = Writes::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let label = |key: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{key}=\"")))
                .map(|v| v.trim_end_matches('"').to_owned())
                .unwrap_or_default()
        };
        let verb = label("verb");
        let resource = label("resource");
        if !matches!(verb.as_str(), "POST" | "PUT" | "PATCH" | "APPLY")
            || !resources.contains(&resource.as_str())
        {
            continue;
        }
        let sub = label("subresource");
        let key = if sub.is_empty() {
            resource
        } else {
            format!("{resource}/{sub}")
        };
        *out.entry(key).or_default() += value.trim().parse::<f64>().unwrap_or(0.0);
    }
    Ok(out)
}

/// Every request the API server counted so far, keyed `VERB
/// resource[/subresource]`, all resources (for a benchmark's breakdown).
///
/// # Errors
/// When /metrics cannot be read.
pub async fn requests(client: &Client) -> Result<Writes> {
    let req = http::Request::get("/metrics").body(Vec::new())?;
    let text = client.request_text(req).await.context("GET /metrics")?;
    let mut out = Writes::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let label = |key: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{key}=\"")))
                .map(|v| v.trim_end_matches('"').to_owned())
                .unwrap_or_default()
        };
        let sub = label("subresource");
        let mut key = format!("{} {}", label("verb"), label("resource"));
        if !sub.is_empty() {
            key = format!("{key}/{sub}");
        }
        *out.entry(key).or_default() += value.trim().parse::<f64>().unwrap_or(0.0);
    }
    Ok(out)
}

/// `after - before`, without the entries that did not change.
pub fn delta(after: &Writes, before: &Writes) -> Writes {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v != 0.0)
        .collect()
}
