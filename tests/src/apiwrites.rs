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
    Ok(writes_of(&requests(client).await?, resources))
}

/// The writes of `resources` among `requests` (as [`requests`] keys them),
/// keyed `resource[/subresource]` as [`writes`] does.
pub fn writes_of(requests: &Writes, resources: &[&str]) -> Writes {
    let mut out = Writes::new();
    for (key, count) in requests {
        let Some((verb, target)) = key.split_once(' ') else {
            continue;
        };
        let resource = target.split('/').next().unwrap_or_default();
        if matches!(verb, "POST" | "PUT" | "PATCH" | "APPLY") && resources.contains(&resource) {
            *out.entry(target.to_owned()).or_default() += count;
        }
    }
    out
}

/// Every request the API server counted so far, keyed `VERB
/// resource[/subresource]`, all resources.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_are_the_write_verbs_of_the_named_resources() {
        let requests: Writes = [
            ("APPLY configmaps", 3.0),
            ("PATCH widgets/status", 2.0),
            ("POST widgets", 1.0),
            ("GET widgets", 9.0),
            ("DELETE configmaps", 4.0),
            ("APPLY secrets", 5.0),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let writes = writes_of(&requests, &["widgets", "configmaps"]);
        let expected: Writes = [
            ("configmaps", 3.0),
            ("widgets/status", 2.0),
            ("widgets", 1.0),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        assert_eq!(writes, expected);
    }
}
