//! The drain check: an old generation may be deleted once none of its
//! running pods has queries in flight.
//!
//! The plugin never connects to a pod. It asks the host for
//! `GET /metrics` on each running pod of the draining generation (port
//! [`crate::names::METRICS_PORT`]) and reads the Prometheus text the next
//! snapshot carries: `firebolt_running_queries +
//! firebolt_suspended_queries` must be 0 on every running pod.
//!
//! Readings go stale: a pod idle once may take queries again. Each pass
//! judges every running pod on its youngest reading younger than the
//! [`window`] (the drain-check interval) and asks for a new one. The
//! request id names the window the pass falls in ([`request_id`]), so
//! every window sends a fresh GET: the host re-sends a GET with an
//! unchanged id at most every 15 s, whatever the interval.

use std::time::Duration;

use wasmop_sdk::Observation;

/// The host's default observation budget: requests per primary ...
pub const HOST_REQUESTS: u32 = 16;
/// ... per this interval.
pub const HOST_INTERVAL: Duration = Duration::from_secs(15);

/// How young a reading must be: the drain-check interval, at least 1 s,
/// stretched so that one request per running pod per window fits the
/// host's default budget ([`HOST_REQUESTS`] per [`HOST_INTERVAL`]) —
/// otherwise some pod's reading would never be fresh and draining would
/// never end.
pub fn window(interval: Duration, pods: usize) -> Duration {
    let pods = u32::try_from(pods).unwrap_or(u32::MAX);
    let budget = HOST_INTERVAL.saturating_mul(pods) / HOST_REQUESTS;
    interval.max(budget).max(Duration::from_secs(1))
}

/// Id of the drain request for `pod` in the window `now_ms` falls in.
pub fn request_id(pod: &str, now_ms: i64, window: Duration) -> String {
    let width = i64::try_from(window.as_millis()).unwrap_or(i64::MAX).max(1);
    format!("{}-{}", observation_id(pod), now_ms.div_euclid(width))
}

/// The youngest reading of `pod` younger than `window`, if any.
pub fn fresh<'a>(
    observations: &'a [Observation],
    pod: &str,
    window: Duration,
) -> Option<&'a Observation> {
    let prefix = format!("{}-", observation_id(pod));
    let limit = u64::try_from(window.as_millis()).unwrap_or(u64::MAX);
    observations
        .iter()
        .filter(|o| {
            o.id.strip_prefix(&prefix)
                .is_some_and(|k| !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()))
        })
        .filter(|o| o.age_ms < limit)
        .min_by_key(|o| o.age_ms)
}

/// Metrics whose sum must be zero.
pub const QUERY_METRICS: [&str; 2] = ["firebolt_running_queries", "firebolt_suspended_queries"];

/// Prefix of the ids of the drain observations of pod `pod`.
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

    fn aged(id: &str, body: &str, age_ms: u64) -> Observation {
        Observation {
            id: id.into(),
            age_ms,
            ..obs(Some(200), body, None)
        }
    }

    #[test]
    fn only_readings_younger_than_the_window_count() {
        let w = Duration::from_secs(5);
        let kept = [
            aged("drain-e-g0-1-7", "firebolt_running_queries 0", 6_000),
            aged("drain-e-g0-1-8", "firebolt_running_queries 3", 900),
            aged("drain-e-g0-1-9", "firebolt_running_queries 0", 100),
            aged("drain-e-g0-10-9", "firebolt_running_queries 0", 50),
            aged("drain-e-g0-1", "firebolt_running_queries 0", 10),
        ];
        // The youngest of its own readings, not pod 10's, not the old id.
        assert_eq!(fresh(&kept, "e-g0-1", w).unwrap().age_ms, 100);
        assert_eq!(judge(fresh(&kept[..2], "e-g0-1", w)), PodDrain::Busy(3.0));
        // A reading as old as the window is stale: nothing to judge on.
        assert_eq!(judge(fresh(&kept[..1], "e-g0-1", w)), PodDrain::Unknown);
        assert_eq!(fresh(&kept, "e-g0-2", w), None);
    }

    #[test]
    fn each_window_gets_its_own_request_id() {
        let w = Duration::from_secs(5);
        assert_eq!(request_id("p", 12_000, w), "drain-p-2");
        assert_eq!(request_id("p", 14_999, w), "drain-p-2");
        assert_eq!(request_id("p", 15_000, w), "drain-p-3");
    }

    #[test]
    fn the_window_fits_the_hosts_budget() {
        let five = Duration::from_secs(5);
        assert_eq!(window(five, 3), five);
        // 32 pods need 32 sends per window: 30 s at 16 per 15 s.
        assert_eq!(window(five, 32), Duration::from_secs(30));
        assert_eq!(window(Duration::ZERO, 0), Duration::from_secs(1));
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
