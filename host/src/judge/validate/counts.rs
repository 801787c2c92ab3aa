//! Counts and limits: how many applies, deletes, Events and HTTP requests
//! one plan may carry ([`PlanLimits`], [`check_counts`]) and which gauges it
//! may set ([`check_gauges`]). They look at the plan alone, so they run
//! before the per-object rules of [`super::validate`].

use super::{Plan, Rule, Violation};

/// Most gauges one plan may set.
pub const MAX_GAUGES: usize = 64;
/// Most labels one gauge may carry (besides the host's).
pub const MAX_GAUGE_LABELS: usize = 8;
/// Longest label value.
pub const MAX_GAUGE_LABEL_VALUE: usize = 256;
/// Metric name prefixes the host's own metrics use.
const HOST_METRIC_PREFIXES: &[&str] = &[
    "wasmop_",
    "controller_runtime_",
    "workqueue_",
    "rest_client_",
];
/// Labels the host sets on every plugin gauge.
pub const HOST_GAUGE_LABELS: &[&str] = &["controller", "namespace", "name"];

fn prometheus_name(text: &str) -> bool {
    let mut chars = text.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Checks the plan's gauges ([`Rule::GaugeInvalid`]): one violation per bad
/// gauge, or one for too many.
pub fn check_gauges(plan: &Plan) -> Vec<Violation> {
    let mut out = Vec::new();
    if plan.gauges.len() > MAX_GAUGES {
        out.push(Violation {
            rule: Rule::GaugeInvalid,
            object: "gauges".to_owned(),
            message: format!(
                "the plan has {} gauges, more than the {MAX_GAUGES} allowed",
                plan.gauges.len()
            ),
        });
        return out;
    }
    let mut seen = std::collections::BTreeSet::new();
    for (i, g) in plan.gauges.iter().enumerate() {
        let why = if !prometheus_name(&g.name) {
            Some(format!("{:?} is not a Prometheus metric name", g.name))
        } else if let Some(p) = HOST_METRIC_PREFIXES
            .iter()
            .find(|p| g.name.starts_with(**p))
        {
            Some(format!("{} uses the host's prefix {p}", g.name))
        } else if g.name.ends_with("_total") {
            Some(format!(
                "{} ends in _total, which names counters; gauges only",
                g.name
            ))
        } else if !g.value.is_finite() {
            Some(format!(
                "{} has the value {}, not a finite number",
                g.name, g.value
            ))
        } else if g.labels.len() > MAX_GAUGE_LABELS {
            Some(format!(
                "{} has {} labels, more than {MAX_GAUGE_LABELS}",
                g.name,
                g.labels.len()
            ))
        } else if let Some(k) = g.labels.keys().find(|k| {
            !prometheus_name(k) || k.starts_with("__") || HOST_GAUGE_LABELS.contains(&k.as_str())
        }) {
            Some(format!(
                "{}: label {k:?} is not a label name a plugin may set",
                g.name
            ))
        } else if let Some(v) = g.labels.values().find(|v| v.len() > MAX_GAUGE_LABEL_VALUE) {
            Some(format!(
                "{}: a label value is {} bytes, more than {MAX_GAUGE_LABEL_VALUE}",
                g.name,
                v.len()
            ))
        } else if !seen.insert((g.name.as_str(), &g.labels)) {
            Some(format!("{} is set twice with the same labels", g.name))
        } else {
            None
        };
        if let Some(message) = why {
            out.push(Violation {
                rule: Rule::GaugeInvalid,
                object: format!("gauges[{i}]"),
                message,
            });
        }
    }
    out
}

/// How much one plan may ask for, and how it is executed; configurable per
/// plugin (operator file keys `maxApplies`, `maxDeletes`,
/// `maxDeletesPerMinute`, `maxEvents`, `maxHttpRequests`, `minRequeueMs`,
/// `dryRunFirst`). Each apply, delete, Event and HTTP request is an API
/// call or a connection, so their number is bounded whatever their size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanLimits {
    /// Most applies in one plan. Default 500.
    pub max_applies: usize,
    /// The per-reconcile deletion budget: most deletes in one plan.
    /// Default 500. A plan over it is rejected whole
    /// ([`Rule::DeletionBudgetExceeded`]).
    pub max_deletes: usize,
    /// The per-minute deletion budget: most deletes the plugin's plans may
    /// execute in any 60 seconds, across all its primaries. Default 1000.
    /// A plan that would go over it is rejected whole, and so is every
    /// later plan of the plugin that deletes, until the budget is raised
    /// (see [`crate::execute::budget`]).
    pub max_deletes_per_minute: usize,
    /// Most Events in one plan. Default 50.
    pub max_events: usize,
    /// Most HTTP requests in one plan. Default 32.
    pub max_http_requests: usize,
    /// Shortest `requeueAfterMs` honoured; shorter ones (0 included) wait
    /// this long. Default 1000.
    pub min_requeue_ms: u64,
    /// Send every write of a plan with `dryRun=All` first, and write
    /// nothing when the API server refuses one (schema, CEL rules,
    /// admission webhooks, quota). Default false.
    pub dry_run_first: bool,
}

/// Default per-reconcile deletion budget ([`PlanLimits::max_deletes`]).
pub const DEFAULT_MAX_DELETES: usize = 500;
/// Default per-minute deletion budget ([`PlanLimits::max_deletes_per_minute`]).
pub const DEFAULT_MAX_DELETES_PER_MINUTE: usize = 1000;

impl Default for PlanLimits {
    fn default() -> Self {
        PlanLimits {
            max_applies: 500,
            max_deletes: DEFAULT_MAX_DELETES,
            max_deletes_per_minute: DEFAULT_MAX_DELETES_PER_MINUTE,
            max_events: 50,
            max_http_requests: 32,
            min_requeue_ms: 1000,
            dry_run_first: false,
        }
    }
}

impl PlanLimits {
    /// When the plan asks to be reconciled again: its `requeueAfterMs`,
    /// raised to [`PlanLimits::min_requeue_ms`].
    pub fn requeue_after(&self, plan: &Plan) -> Option<std::time::Duration> {
        plan.requeue_after_ms
            .map(|ms| std::time::Duration::from_millis(ms.max(self.min_requeue_ms)))
    }
}

/// Checks the counts of a plan against `limits`: one violation per list
/// that is too long ([`Rule::TooManyApplies`],
/// [`Rule::DeletionBudgetExceeded`] for the per-reconcile deletion budget,
/// [`Rule::TooManyEvents`], [`Rule::TooManyHttpRequests`]). Cheap: it looks
/// at lengths only, so it runs before the per-object rules of [`super::validate`].
pub fn check_counts(plan: &Plan, limits: &PlanLimits) -> Vec<Violation> {
    let mut out = Vec::new();
    if plan.delete.len() > limits.max_deletes {
        out.push(Violation {
            rule: Rule::DeletionBudgetExceeded,
            object: "delete".to_owned(),
            message: format!(
                "the plan deletes {} objects, more than the per-reconcile deletion budget of {}; \
                 nothing is written until a person raises maxDeletes of this plugin in the \
                 operator configuration",
                plan.delete.len(),
                limits.max_deletes
            ),
        });
    }
    let lists = [
        (
            plan.apply.len(),
            limits.max_applies,
            Rule::TooManyApplies,
            "apply",
            "applies",
        ),
        (
            plan.events.len(),
            limits.max_events,
            Rule::TooManyEvents,
            "events",
            "Events",
        ),
        (
            plan.http_requests.len(),
            limits.max_http_requests,
            Rule::TooManyHttpRequests,
            "httpRequests",
            "HTTP requests",
        ),
    ];
    out.extend(lists.into_iter().filter(|(len, max, ..)| len > max).map(
        |(len, max, rule, field, what)| Violation {
            rule,
            object: field.to_owned(),
            message: format!("the plan has {len} {what}, more than the {max} allowed"),
        },
    ));
    out
}

#[cfg(test)]
mod count_tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::judge::validate::{Event, EventType, HttpMethod, HttpRequest};

    #[test]
    fn a_million_empty_events_break_the_event_count_rule() {
        let event = Event {
            event_type: EventType::Normal,
            reason: String::new(),
            message: String::new(),
        };
        let plan = Plan {
            events: vec![event; 1_000_000],
            ..Plan::default()
        };
        let violations = check_counts(&plan, &PlanLimits::default());
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert_eq!(violations[0].rule.as_str(), "TooManyEvents");
        assert!(
            violations[0].message.contains("1000000"),
            "{}",
            violations[0]
        );
    }

    #[test]
    fn every_list_has_its_own_rule_and_limits_are_inclusive() {
        let limits = PlanLimits {
            max_applies: 1,
            max_deletes: 0,
            max_events: 2,
            max_http_requests: 0,
            ..PlanLimits::default()
        };
        let mut plan: Plan = serde_json::from_value(json!({
            "apply": [{"object": {}}],
            "delete": [{"target": {"apiVersion": "v1", "kind": "ConfigMap", "name": "a"}, "uid": "u", "resourceVersion": "1"}],
            "events": [{"type": "Normal", "reason": "R", "message": ""},
                       {"type": "Normal", "reason": "R", "message": ""}]
        }))
        .expect("plan");
        plan.http_requests.push(HttpRequest::allow_listed(
            "a",
            HttpMethod::Get,
            "http://127.0.0.1:1",
            "/",
        ));
        let rules: Vec<&str> = check_counts(&plan, &limits)
            .iter()
            .map(|v| v.rule.as_str())
            .collect();
        assert_eq!(rules, ["DeletionBudgetExceeded", "TooManyHttpRequests"]);
        plan.delete.clear();
        plan.http_requests.clear();
        assert!(check_counts(&plan, &limits).is_empty());
    }

    #[test]
    fn the_per_reconcile_deletion_budget_names_the_count_the_budget_and_the_setting() {
        let limits = PlanLimits {
            max_deletes: 10,
            ..PlanLimits::default()
        };
        let one: Value = json!({"target": {"apiVersion": "v1", "kind": "ConfigMap", "name": "a"},
                                "uid": "u", "resourceVersion": "1"});
        let mut plan: Plan =
            serde_json::from_value(json!({"delete": vec![one; 50]})).expect("plan");
        let violations = check_counts(&plan, &limits);
        assert_eq!(violations.len(), 1, "{violations:?}");
        let v = &violations[0];
        assert_eq!(v.rule.as_str(), "DeletionBudgetExceeded");
        for part in ["deletes 50 objects", "deletion budget of 10", "maxDeletes"] {
            assert!(v.message.contains(part), "{part}: {v}");
        }
        // The budget is inclusive, and the other lists' rules are untouched.
        plan.delete.truncate(10);
        assert!(check_counts(&plan, &limits).is_empty());
        assert_eq!(PlanLimits::default().max_deletes, DEFAULT_MAX_DELETES);
        const { assert!(DEFAULT_MAX_DELETES_PER_MINUTE >= DEFAULT_MAX_DELETES) };
    }

    #[test]
    fn requeue_delays_have_a_floor() {
        let limits = PlanLimits::default();
        let mut plan = Plan {
            requeue_after_ms: Some(0),
            ..Plan::default()
        };
        assert_eq!(
            limits.requeue_after(&plan),
            Some(std::time::Duration::from_secs(1))
        );
        plan.requeue_after_ms = Some(30_000);
        assert_eq!(
            limits.requeue_after(&plan),
            Some(std::time::Duration::from_secs(30))
        );
        plan.requeue_after_ms = None;
        assert_eq!(limits.requeue_after(&plan), None);
    }

    #[test]
    fn gauges_are_checked_for_names_labels_values_and_count() {
        use wasmop_contract::Gauge;
        let g = Gauge::new;
        let good = Plan {
            gauges: vec![
                g("firebolt_rotation_pending", &[("step", "promote")], 1.0),
                g("firebolt_rotation_pending", &[("step", "retain")], 0.0),
                g("firebolt_lagging_engines", &[], 2.0),
            ],
            ..Plan::default()
        };
        assert!(check_gauges(&good).is_empty());
        let long = "x".repeat(MAX_GAUGE_LABEL_VALUE + 1);
        let many: Vec<(String, String)> = (0..=MAX_GAUGE_LABELS)
            .map(|i| (format!("l{i}"), "v".to_owned()))
            .collect();
        let many_refs: Vec<(&str, &str)> =
            many.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let bad = [
            g("1starts_with_a_digit", &[], 1.0),
            g("has-dash", &[], 1.0),
            g("wasmop_reconcile_seconds", &[], 1.0),
            g("workqueue_depth", &[], 1.0),
            g("my_events_total", &[], 1.0),
            g("my_gauge", &[], f64::NAN),
            g("my_gauge", &[], f64::INFINITY),
            g("my_gauge", &[("namespace", "other")], 1.0),
            g("my_gauge", &[("__name__", "x")], 1.0),
            g("my_gauge", &[("bad-key", "x")], 1.0),
            g("my_gauge", &[("k", long.as_str())], 1.0),
            g("my_gauge", &many_refs, 1.0),
        ];
        for gauge in bad {
            let plan = Plan {
                gauges: vec![gauge.clone()],
                ..Plan::default()
            };
            let v = check_gauges(&plan);
            assert_eq!(v.len(), 1, "{gauge:?}");
            assert_eq!(v[0].rule, Rule::GaugeInvalid);
        }
        let twice = Plan {
            gauges: vec![g("a", &[("k", "v")], 1.0), g("a", &[("k", "v")], 2.0)],
            ..Plan::default()
        };
        assert_eq!(check_gauges(&twice).len(), 1);
        let flood = Plan {
            gauges: (0..=MAX_GAUGES)
                .map(|i| g("a", &[("i", &i.to_string())], 1.0))
                .collect(),
            ..Plan::default()
        };
        let v = check_gauges(&flood);
        assert_eq!(v.len(), 1);
        assert!(v[0].message.contains("gauges"), "{}", v[0].message);
    }
}
