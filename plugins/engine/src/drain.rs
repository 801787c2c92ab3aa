//! The drain check: an old generation may be deleted once none of its
//! running pods has queries in flight.
//!
//! The plugin never connects to a pod. It asks the host for
//! `GET /metrics` on each running pod of the draining generation (port
//! [`crate::names::METRICS_PORT`], observation id [`observation_id`]) and
//! reads the Prometheus text the next snapshot carries:
//! `firebolt_running_queries + firebolt_suspended_queries` must be 0.

use wasmop_sdk::Observation;

/// Metrics whose sum must be zero.
pub const QUERY_METRICS: [&str; 2] = ["firebolt_running_queries", "firebolt_suspended_queries"];

/// Id of the drain observation of pod `pod`.
pub fn observation_id(pod: &str) -> String {
    format!("drain-{pod}")
}

/// What one pod's observation says.
#[derive(Clone, Debug, PartialEq)]
pub enum PodDrain {
    /// No result yet.
    Unknown,
    /// No queries in flight.
    Drained,
    /// This many queries in flight.
    Busy(f64),
    /// The scrape failed (transport error, status, or no counters).
    Failing(String),
}

/// Reads one pod's observation.
pub fn judge(observation: Option<&Observation>) -> PodDrain {
    let Some(o) = observation else {
        return PodDrain::Unknown;
    };
    if let Some(e) = &o.error {
        return PodDrain::Failing(e.clone());
    }
    if !o.is_success() {
        return PodDrain::Failing(format!("HTTP status {}", o.status.unwrap_or_default()));
    }
    match in_flight(&o.body) {
        Some(0.0) => PodDrain::Drained,
        Some(n) => PodDrain::Busy(n),
        None => PodDrain::Failing("no firebolt_running_queries in /metrics".to_owned()),
    }
}

/// Sum of the query metrics in Prometheus text, None when neither appears.
pub fn in_flight(text: &str) -> Option<f64> {
    let mut found = false;
    let mut sum = 0.0;
    for line in text.lines().map(str::trim) {
        if line.starts_with('#') {
            continue;
        }
        let name_end = line
            .find(|c: char| c == '{' || c.is_whitespace())
            .unwrap_or(line.len());
        if !QUERY_METRICS.contains(&&line[..name_end]) {
            continue;
        }
        let rest = match line[name_end..].strip_prefix('{') {
            Some(r) => r.split_once('}').map(|(_, v)| v).unwrap_or(""),
            None => &line[name_end..],
        };
        if let Some(v) = rest
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        {
            found = true;
            sum += v;
        }
    }
    found.then_some(sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(status: Option<u16>, body: &str, error: Option<&str>) -> Observation {
        Observation {
            id: "drain-e-g0-0".into(),
            status,
            body: body.into(),
            error: error.map(str::to_owned),
            observed_at: "2025-01-01T00:00:00Z".into(),
            age_ms: 0,
            outcome: None,
        }
    }

    #[test]
    fn counters_are_summed_with_and_without_labels() {
        let text = "# HELP firebolt_running_queries q\n# TYPE firebolt_running_queries gauge\n\
                    firebolt_running_queries{node=\"0\"} 2\nfirebolt_suspended_queries 1\n\
                    firebolt_running_queries_total 99\nother 5\n";
        assert_eq!(in_flight(text), Some(3.0));
        assert_eq!(in_flight("other 1\n"), None);
        assert_eq!(
            in_flight("firebolt_running_queries 0\nfirebolt_suspended_queries 0"),
            Some(0.0)
        );
    }

    #[test]
    fn observations_are_judged() {
        assert_eq!(judge(None), PodDrain::Unknown);
        assert_eq!(
            judge(Some(&obs(Some(200), "firebolt_running_queries 0", None))),
            PodDrain::Drained
        );
        assert_eq!(
            judge(Some(&obs(Some(200), "firebolt_running_queries 4", None))),
            PodDrain::Busy(4.0)
        );
        assert!(matches!(
            judge(Some(&obs(Some(500), "", None))),
            PodDrain::Failing(_)
        ));
        assert!(matches!(
            judge(Some(&obs(None, "", Some("refused")))),
            PodDrain::Failing(_)
        ));
        assert!(matches!(
            judge(Some(&obs(Some(200), "nothing", None))),
            PodDrain::Failing(_)
        ));
    }
}
