//! FireboltEngine and FireboltEngineClass as the plugin reads them, and the
//! settings an engine resolves from itself, its class and the operator's
//! defaults (engine if set → class if set → default).
//!
//! Field names are upstream's (`compute.firebolt.io/v1alpha1`). Pod
//! templates and `customEngineConfig` stay JSON: they are merged, not
//! interpreted. Unknown fields are ignored: the CRD schema is the
//! authority on shape.

use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};
use wasmop_sdk::KindRef;

/// API group of the Firebolt kinds.
pub const GROUP: &str = "compute.firebolt.io";
/// Their API version.
pub const VERSION: &str = "v1alpha1";

/// Default drain-check poll interval (upstream's).
pub const DEFAULT_DRAIN_CHECK_INTERVAL: Duration = Duration::from_secs(5);

/// The FireboltEngine kind.
pub fn engine_kind() -> KindRef {
    KindRef::namespaced(GROUP, VERSION, "FireboltEngine", "fireboltengines")
}

/// The FireboltEngineClass kind.
pub fn class_kind() -> KindRef {
    KindRef::namespaced(
        GROUP,
        VERSION,
        "FireboltEngineClass",
        "fireboltengineclasses",
    )
}

/// The FireboltInstance kind.
pub fn instance_kind() -> KindRef {
    KindRef::namespaced(GROUP, VERSION, "FireboltInstance", "fireboltinstances")
}

/// A FireboltEngine.
#[derive(Clone, Debug, Deserialize)]
pub struct FireboltEngine {
    /// What the engine should run.
    pub spec: EngineSpec,
    /// What the plugin last wrote.
    #[serde(default)]
    pub status: EngineStatus,
}

/// `spec` of a FireboltEngine.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EngineSpec {
    /// The FireboltInstance (same namespace) the engine runs against.
    #[serde(default)]
    pub instance_ref: String,
    /// Number of engine nodes; 0 stops the engine.
    #[serde(default)]
    pub replicas: i64,
    /// The FireboltEngineClass (same namespace) whose defaults apply.
    #[serde(default)]
    pub engine_class_ref: Option<String>,
    /// Pod template, top of the merge.
    #[serde(default)]
    pub template: Option<Value>,
    /// Inject the `engine-web` UI sidecar.
    #[serde(default)]
    pub ui_sidecar: Option<bool>,
    /// Poll the old generation's query counters before deleting it.
    #[serde(default)]
    pub drain_check_enabled: Option<bool>,
    /// Interval of the drain check (Go duration, e.g. `5s`).
    #[serde(default)]
    pub drain_check_interval: Option<String>,
    /// `graceful` (drain first) or `recreate` (no drain check).
    #[serde(default)]
    pub rollout: Option<String>,
    /// Metadata endpoint used instead of the instance's.
    #[serde(default)]
    pub metadata_endpoint_override: Option<String>,
    /// Data volume: one of persistentVolumeClaim, emptyDir, hostPath.
    #[serde(default)]
    pub storage: Option<Value>,
    /// Fragment deep-merged into the rendered `config.yaml`.
    #[serde(default)]
    pub custom_engine_config: Option<Value>,
    /// Seconds a new generation may take to become ready before the engine
    /// reports `Degraded` (default 600).
    #[serde(default)]
    pub progress_deadline_seconds: Option<i64>,
}

/// `status` of a FireboltEngine, the fields the phase machine reads.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct EngineStatus {
    /// Phase; empty before the first reconcile.
    pub phase: String,
    /// Generation being built or served.
    pub current_generation: i64,
    /// Generation the cluster Service selects; -1 before the first switch.
    pub active_generation: i64,
    /// Old generation being drained and cleaned up.
    pub draining_generation: Option<i64>,
}

impl Default for EngineStatus {
    fn default() -> Self {
        EngineStatus {
            phase: String::new(),
            current_generation: 0,
            active_generation: -1,
            draining_generation: None,
        }
    }
}

/// A FireboltEngineClass.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct FireboltEngineClass {
    /// The class's defaults.
    #[serde(default)]
    pub spec: ClassSpec,
}

/// `spec` of a FireboltEngineClass.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClassSpec {
    /// Pod template, between the operator's defaults and the engine's.
    #[serde(default)]
    pub template: Option<Value>,
    /// Default of `uiSidecar`.
    #[serde(default)]
    pub ui_sidecar: Option<bool>,
    /// Default of `storage` (whole struct).
    #[serde(default)]
    pub storage: Option<Value>,
    /// Deep-merged beneath the engine's `customEngineConfig`.
    #[serde(default)]
    pub custom_engine_config: Option<Value>,
    /// Default of `rollout`.
    #[serde(default)]
    pub rollout: Option<String>,
    /// Default of `drainCheckEnabled`.
    #[serde(default)]
    pub drain_check_enabled: Option<bool>,
    /// Default of `drainCheckInterval`.
    #[serde(default)]
    pub drain_check_interval: Option<String>,
}

/// The settings an engine runs with after resolution.
#[derive(Clone, Debug, PartialEq)]
pub struct Resolved {
    /// Inject the UI sidecar.
    pub ui_sidecar: bool,
    /// True for `rollout: recreate`.
    pub recreate: bool,
    /// Whether draining polls the old generation.
    pub drain_check_enabled: bool,
    /// Drain-check interval.
    pub drain_check_interval: Duration,
    /// The data volume backend (`{}` is emptyDir).
    pub storage: Value,
    /// Class then engine `customEngineConfig`, deep-merged.
    pub custom_engine_config: Value,
}

/// Resolves engine → class → default for the non-template settings.
///
/// # Errors
///
/// A message when a drain-check interval is not a duration.
pub fn resolve(engine: &EngineSpec, class: Option<&ClassSpec>) -> Result<Resolved, String> {
    fn pick<T: Clone>(e: &Option<T>, c: Option<&Option<T>>) -> Option<T> {
        e.clone().or_else(|| c.and_then(Clone::clone))
    }
    let c = class;
    let interval = match pick(
        &engine.drain_check_interval,
        c.map(|c| &c.drain_check_interval),
    ) {
        Some(text) => parse_duration(&text)
            .ok_or_else(|| format!("drainCheckInterval {text:?} is not a duration"))?,
        None => DEFAULT_DRAIN_CHECK_INTERVAL,
    };
    let mut custom = json!({});
    for layer in [
        c.and_then(|c| c.custom_engine_config.as_ref()),
        engine.custom_engine_config.as_ref(),
    ]
    .into_iter()
    .flatten()
    {
        crate::merge::deep_merge(&mut custom, layer);
    }
    Ok(Resolved {
        ui_sidecar: pick(&engine.ui_sidecar, c.map(|c| &c.ui_sidecar)).unwrap_or(false),
        recreate: pick(&engine.rollout, c.map(|c| &c.rollout)).as_deref() == Some("recreate"),
        drain_check_enabled: pick(
            &engine.drain_check_enabled,
            c.map(|c| &c.drain_check_enabled),
        )
        .unwrap_or(true),
        drain_check_interval: interval,
        storage: pick(&engine.storage, c.map(|c| &c.storage)).unwrap_or_else(|| json!({})),
        custom_engine_config: custom,
    })
}

/// Parses a Go duration made of `<number><unit>` parts (`ms`, `s`, `m`,
/// `h`), e.g. `5s`, `1m30s`, `250ms`.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let mut total = Duration::ZERO;
    let mut rest = text.trim();
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit())?;
        if digits == 0 {
            return None;
        }
        let n: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let part = match &rest[..unit_len] {
            "ms" => Duration::from_millis(n),
            "s" => Duration::from_secs(n),
            "m" => Duration::from_secs(n.checked_mul(60)?),
            "h" => Duration::from_secs(n.checked_mul(3600)?),
            _ => return None,
        };
        total = total.checked_add(part)?;
        rest = &rest[unit_len..];
    }
    Some(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_like_go_for_the_units_used() {
        assert_eq!(parse_duration("5s"), Some(Duration::from_secs(5)));
        assert_eq!(parse_duration("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("2h"), Some(Duration::from_secs(7200)));
        for bad in ["", "s", "5", "5x", "-5s", "1.5s"] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
    }

    #[test]
    fn engine_settings_win_over_class_settings_which_win_over_defaults() {
        let class: ClassSpec = serde_json::from_value(json!({
            "rollout": "recreate", "drainCheckEnabled": false, "drainCheckInterval": "9s",
            "uiSidecar": true, "storage": {"hostPath": {"path": "/data"}},
            "customEngineConfig": {"logging": {"level": "info", "format": "text"}},
        }))
        .unwrap();
        let engine: EngineSpec = serde_json::from_value(json!({
            "instanceRef": "i", "replicas": 1, "rollout": "graceful",
            "customEngineConfig": {"logging": {"level": "debug"}},
        }))
        .unwrap();
        let r = resolve(&engine, Some(&class)).unwrap();
        assert!(!r.recreate, "engine's graceful wins");
        assert!(!r.drain_check_enabled, "class fills in");
        assert_eq!(r.drain_check_interval, Duration::from_secs(9));
        assert!(r.ui_sidecar);
        assert_eq!(r.storage, json!({"hostPath": {"path": "/data"}}));
        assert_eq!(
            r.custom_engine_config,
            json!({"logging": {"level": "debug", "format": "text"}})
        );
        let alone = resolve(&engine, None).unwrap();
        assert!(alone.drain_check_enabled && !alone.ui_sidecar);
        assert_eq!(alone.drain_check_interval, DEFAULT_DRAIN_CHECK_INTERVAL);
        assert_eq!(alone.storage, json!({}));
    }

    #[test]
    fn a_bad_interval_is_reported() {
        let engine: EngineSpec =
            serde_json::from_value(json!({"drainCheckInterval": "soon"})).unwrap();
        assert!(resolve(&engine, None).unwrap_err().contains("soon"));
    }
}
