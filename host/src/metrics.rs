//! Operator metrics in the Prometheus text format, served on
//! `--metrics-addr` at `/metrics` (next to `/healthz` and `/readyz`, see
//! [`crate::report::health`], whose [`serve`](crate::report::health::serve) answers them all).
//!
//! | metric | labels | meaning |
//! | --- | --- | --- |
//! | `wasmop_plugin_info` | plugin, version, digest | 1 for each active plugin version |
//! | `wasmop_plugin_loads_total` | plugin | versions activated (start-up and hot swaps) |
//! | `wasmop_plugin_load_failures_total` | file, reason | plugin files rejected |
//! | `wasmop_reconcile_total` | controller, result | reconciles by outcome reason |
//! | `wasmop_reconcile_seconds_total` | controller | time spent in plugin calls |
//! | `wasmop_reconcile_echoes_total` | controller | reconciles queued behind other work because their cause was the watch event of the primary's own write (see `controller::echo`) |
//! | `wasmop_kind_calls_total` | controller | calls of a kind-scoped controller (one per debounced batch of changes) |
//! | `wasmop_kind_call_primaries_total` | controller | primaries those calls covered, summed |
//! | `wasmop_kind_plans_refused_total` | controller | object plans of kind plans refused unjudged (unknown, duplicate or mismatched primary) |
//! | `wasmop_http_requests_total` | controller, outcome | plan HTTP requests: sent, refused, rate_limited, superseded (a mutating call not repeated: its answer came after the plan's snapshot) |
//! | `wasmop_leader` | | 1 while this replica holds the leader Lease (with `--leader-elect`) |
//! | `wasmop_watch_streams` | kind, state | watch streams of a kind (one per watched namespace) that are `synced`, `relisting` or `backing_off` |
//! | `wasmop_watch_lists_total` | kind, reason | lists started: `initial`, or a relist after the watch `expired` (410) or an `error` (client-go: `reflector_lists_total`) |
//! | `wasmop_watch_errors_total` | kind, reason | watch and list failures: `expired` (410), `unavailable` (unreachable, 429, 5xx), `rejected` (other 4xx), `stalled` (an attempt unanswered while recovering, abandoned) |
//! | `wasmop_watch_recovery_seconds` | kind | how long the kind's last watch failure lasted, from the first error to objects flowing again |
//!
//! The per-plugin budgets (`wasmop_plugin_call_*`, per plugin and version)
//! are kept in atomics by [`crate::plugin::budget`] and appended at scrape.
//!
//! Plugins add gauges of their own through a plan's `gauges`
//! ([`Metrics::set_primary_gauges`]), labelled `controller`, `namespace`,
//! `name` of the primary; each executed plan replaces the primary's set and
//! they go with the primary.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Mutex, OnceLock};

type Labels = Vec<(String, String)>;
/// A primary as (controller, namespace, name).
type PrimaryId = (String, String, String);

/// Upper bounds (seconds) of every histogram's buckets: from 5 ms to a
/// minute, as controller-runtime's reconcile-time buckets.
pub const BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

#[derive(Debug, Clone, Default)]
struct Histogram {
    /// Count per bucket of [`BUCKETS`] (not cumulative).
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

/// A set of counters, gauges and histograms keyed by name and labels.
#[derive(Debug, Default)]
pub struct Metrics {
    series: Mutex<BTreeMap<String, BTreeMap<Labels, f64>>>,
    histograms: Mutex<BTreeMap<String, BTreeMap<Labels, Histogram>>>,
    /// The series each primary's plans set (plugin gauges), by
    /// (controller, namespace, name), so the next plan replaces them.
    plugin_series: Mutex<BTreeMap<PrimaryId, Vec<(String, Labels)>>>,
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

impl Metrics {
    /// Adds `by` to a counter.
    pub fn add(&self, name: &str, pairs: &[(&str, &str)], by: f64) {
        let mut s = self.series.lock().expect("metrics lock");
        *s.entry(name.to_string())
            .or_default()
            .entry(labels(pairs))
            .or_insert(0.0) += by;
    }

    /// Adds one to a counter.
    pub fn inc(&self, name: &str, pairs: &[(&str, &str)]) {
        self.add(name, pairs, 1.0);
    }

    /// Sets a gauge.
    pub fn set(&self, name: &str, pairs: &[(&str, &str)], value: f64) {
        let mut s = self.series.lock().expect("metrics lock");
        s.entry(name.to_string())
            .or_default()
            .insert(labels(pairs), value);
    }

    /// Records one observation (in seconds) in a histogram.
    pub fn observe(&self, name: &str, pairs: &[(&str, &str)], value: f64) {
        let mut h = self.histograms.lock().expect("metrics lock");
        let entry = h
            .entry(name.to_string())
            .or_default()
            .entry(labels(pairs))
            .or_default();
        if let Some(i) = BUCKETS.iter().position(|&le| value <= le) {
            entry.counts[i] += 1;
        }
        entry.count += 1;
        entry.sum += value;
    }

    /// How many observations a histogram series holds.
    pub fn observed(&self, name: &str, pairs: &[(&str, &str)]) -> u64 {
        let h = self.histograms.lock().expect("metrics lock");
        h.get(name)
            .and_then(|s| s.get(&labels(pairs)))
            .map_or(0, |x| x.count)
    }

    /// Removes every series of `name` whose label `key` equals `value`.
    pub fn remove_where(&self, name: &str, key: &str, value: &str) {
        let mut s = self.series.lock().expect("metrics lock");
        if let Some(series) = s.get_mut(name) {
            series.retain(|l, _| !l.iter().any(|(k, v)| k == key && v == value));
        }
    }

    /// Replaces the gauges one primary's plans expose with `gauges`
    /// (validated by the plan rules), each labelled with the controller and
    /// the primary's namespace and name.
    pub fn set_primary_gauges(
        &self,
        controller: &str,
        namespace: &str,
        name: &str,
        gauges: &[wasmop_contract::Gauge],
    ) {
        let key = (controller.to_owned(), namespace.to_owned(), name.to_owned());
        let mut owned = self.plugin_series.lock().expect("metrics lock");
        let mut s = self.series.lock().expect("metrics lock");
        for (metric, l) in owned.remove(&key).unwrap_or_default() {
            if let Some(series) = s.get_mut(&metric) {
                series.remove(&l);
                if series.is_empty() {
                    s.remove(&metric);
                }
            }
        }
        let mut now = Vec::new();
        for g in gauges {
            let mut l: Labels = vec![
                ("controller".to_owned(), controller.to_owned()),
                ("namespace".to_owned(), namespace.to_owned()),
                ("name".to_owned(), name.to_owned()),
            ];
            l.extend(g.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
            s.entry(g.name.clone())
                .or_default()
                .insert(l.clone(), g.value);
            now.push((g.name.clone(), l));
        }
        if !now.is_empty() {
            owned.insert(key, now);
        }
    }

    /// The current value of one series.
    pub fn get(&self, name: &str, pairs: &[(&str, &str)]) -> Option<f64> {
        let s = self.series.lock().expect("metrics lock");
        s.get(name)?.get(&labels(pairs)).copied()
    }

    /// Everything in the Prometheus text exposition format.
    pub fn render(&self) -> String {
        let mut out = self.render_series();
        let h = self.histograms.lock().expect("metrics lock");
        for (name, series) in h.iter() {
            let _ = writeln!(out, "# TYPE {name} histogram");
            for (l, hist) in series {
                let body = label_text(l);
                let sep = if body.is_empty() { "" } else { "," };
                let mut cumulative = 0;
                for (le, n) in BUCKETS.iter().zip(hist.counts) {
                    cumulative += n;
                    let _ = writeln!(out, "{name}_bucket{{{body}{sep}le=\"{le}\"}} {cumulative}");
                }
                let _ = writeln!(
                    out,
                    "{name}_bucket{{{body}{sep}le=\"+Inf\"}} {}",
                    hist.count
                );
                let wrap = |t: String| if t.is_empty() { t } else { format!("{{{t}}}") };
                let _ = writeln!(out, "{name}_sum{} {}", wrap(body.clone()), hist.sum);
                let _ = writeln!(out, "{name}_count{} {}", wrap(body), hist.count);
            }
        }
        out
    }

    fn render_series(&self) -> String {
        let s = self.series.lock().expect("metrics lock");
        let mut out = String::new();
        for (name, series) in s.iter() {
            let kind = if name.ends_with("_total") {
                "counter"
            } else {
                "gauge"
            };
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for (l, v) in series {
                let body = label_text(l);
                if body.is_empty() {
                    let _ = writeln!(out, "{name} {v}");
                } else {
                    let _ = writeln!(out, "{name}{{{body}}} {v}");
                }
            }
        }
        out
    }
}

/// Records a failed reconcile that is retried with backoff:
/// `controller_runtime_reconcile_errors_total{controller, reason}` and
/// `workqueue_retries_total{name}`.
pub fn reconcile_error(controller: &str, reason: &str) {
    let m = global();
    m.inc(
        "controller_runtime_reconcile_errors_total",
        &[("controller", controller), ("reason", reason)],
    );
    m.inc("workqueue_retries_total", &[("name", controller)]);
}

/// A tower layer for the Kubernetes client that counts every request as
/// client-go does: `rest_client_requests_total{code, method}` (`code` is
/// the HTTP status, `<error>` when no response came) and
/// `rest_client_request_duration_seconds{verb}` (time to the response
/// headers).
#[derive(Debug, Clone, Copy, Default)]
pub struct RestClientMetrics;

impl<S> tower::Layer<S> for RestClientMetrics {
    type Service = RestClientMetricsService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        RestClientMetricsService(inner)
    }
}

/// The service [`RestClientMetrics`] wraps around the client's stack.
#[derive(Debug, Clone)]
pub struct RestClientMetricsService<S>(S);

impl<S, B, R> tower::Service<http::Request<B>> for RestClientMetricsService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    R: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let method = req.method().as_str().to_owned();
        let started = std::time::Instant::now();
        let response = self.0.call(req);
        Box::pin(async move {
            let out = response.await;
            let code = match &out {
                Ok(r) => r.status().as_u16().to_string(),
                Err(_) => "<error>".to_owned(),
            };
            let m = global();
            m.inc(
                "rest_client_requests_total",
                &[("code", &code), ("method", &method)],
            );
            m.observe(
                "rest_client_request_duration_seconds",
                &[("verb", &method)],
                started.elapsed().as_secs_f64(),
            );
            out
        })
    }
}

/// `k="v",...` with values escaped.
fn label_text(l: &Labels) -> String {
    l.iter()
        .map(|(k, v)| {
            let v = v
                .replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('\n', "\\n");
            format!("{k}=\"{v}\"")
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The process-wide metrics.
pub fn global() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::default)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_and_gauges_with_escaped_labels() {
        let m = Metrics::default();
        m.inc(
            "wasmop_reconcile_total",
            &[("controller", "a/b"), ("result", "ok")],
        );
        m.inc(
            "wasmop_reconcile_total",
            &[("controller", "a/b"), ("result", "ok")],
        );
        m.set("wasmop_plugin_info", &[("plugin", "p\"q")], 1.0);
        let text = m.render();
        assert!(text.contains("# TYPE wasmop_reconcile_total counter"));
        assert!(text.contains("wasmop_reconcile_total{controller=\"a/b\",result=\"ok\"} 2"));
        assert!(text.contains("wasmop_plugin_info{plugin=\"p\\\"q\"} 1"));
        m.remove_where("wasmop_plugin_info", "plugin", "p\"q");
        assert!(!m.render().contains("plugin=\"p"));
    }

    #[test]
    fn a_primarys_gauges_are_replaced_by_its_next_plan_and_cleared_with_it() {
        let m = Metrics::default();
        let g = |name: &str, k: &str, v: &str, value: f64| {
            wasmop_contract::Gauge::new(name, &[(k, v)], value)
        };
        m.set_primary_gauges(
            "p/c",
            "ns",
            "a",
            &[
                g("x_pending", "step", "promote", 1.0),
                g("x_lagging", "k", "v", 2.0),
            ],
        );
        m.set_primary_gauges("p/c", "ns", "b", &[g("x_pending", "step", "mint", 1.0)]);
        let text = m.render();
        assert!(text.contains("# TYPE x_pending gauge"), "{text}");
        assert!(
            text.contains(
                "x_pending{controller=\"p/c\",namespace=\"ns\",name=\"a\",step=\"promote\"} 1"
            ),
            "{text}"
        );
        // The next plan replaces a's set; b's stays.
        m.set_primary_gauges("p/c", "ns", "a", &[g("x_pending", "step", "retain", 1.0)]);
        let text = m.render();
        assert!(!text.contains("step=\"promote\""), "{text}");
        assert!(!text.contains("x_lagging"), "{text}");
        assert!(text.contains("step=\"retain\""), "{text}");
        assert!(text.contains("name=\"b\",step=\"mint\""), "{text}");
        // Gone with the primary.
        m.set_primary_gauges("p/c", "ns", "a", &[]);
        m.set_primary_gauges("p/c", "ns", "b", &[]);
        assert!(!m.render().contains("x_pending"), "{}", m.render());
    }

    #[test]
    fn a_label_value_cannot_inject_lines_into_the_exposition() {
        let m = Metrics::default();
        let evil = wasmop_contract::Gauge {
            name: "x_gauge".to_owned(),
            labels: [("k".to_owned(), "v\"} 1\nwasmop_leader 1\n#".to_owned())].into(),
            value: 3.0,
        };
        m.set_primary_gauges("p/c", "ns", "a", &[evil]);
        let text = m.render();
        assert!(
            !text.lines().any(|l| l.starts_with("wasmop_leader")),
            "{text}"
        );
        assert_eq!(
            text.lines().filter(|l| l.starts_with("x_gauge")).count(),
            1,
            "{text}"
        );
    }
}
