//! Test plugin `observer`: exercises HTTP observations, the one way a plugin
//! learns about something outside the Kubernetes API.
//!
//! For each `Observer` (`test.wasmop.dev/v1`) with `spec.url` (a base URL
//! such as `http://127.0.0.1:8080`, which must be on the operator's
//! allow-list) and `spec.path` (default `/`):
//! - plans a GET with id `probe` to the allow-listed base URL `spec.url`,
//!   the port of `spec.url` (80 when it names none) and `spec.path`;
//! - when the snapshot holds the `probe` observation, writes
//!   `status.observed = {status, body, error}` from it; otherwise leaves
//!   the status alone.
//!
//! It owns nothing and declares no `http-targets`. A missing or non-`http`
//! `spec.url` is an invalid spec.

use serde::Deserialize;
use serde_json::{Value, json};
use wasmop_sdk::{
    Controller, HttpMethod, HttpRequest, KindRef, Manifest, Plan, Plugin, ReconcileError,
    SettingsProblem, Snapshot, settings,
};

/// Id of the one request, and of its observation.
pub const PROBE: &str = "probe";

#[derive(Deserialize)]
struct Observed {
    #[serde(default)]
    spec: Spec,
}

#[derive(Default, Deserialize)]
struct Spec {
    #[serde(default)]
    url: String,
    #[serde(default)]
    path: String,
}

/// The port of an `http://` base URL: the one it names, else 80.
///
/// # Errors
///
/// [`ReconcileError::InvalidSpec`] when `url` is not `http://host[:port][/…]`.
pub fn http_port(url: &str) -> Result<u16, ReconcileError> {
    let invalid = |why: &str| ReconcileError::invalid_spec(format!("spec.url {url:?} {why}"));
    let rest = url
        .get(..7)
        .filter(|scheme| scheme.eq_ignore_ascii_case("http://"))
        .map(|_| &url[7..])
        .ok_or_else(|| invalid("must start with http://"))?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let (host, port) = match authority.strip_prefix('[') {
        Some(v6) => {
            let (host, after) = v6
                .split_once(']')
                .ok_or_else(|| invalid("has an unclosed IPv6 address"))?;
            match after {
                "" => (host, None),
                _ => (
                    host,
                    Some(
                        after
                            .strip_prefix(':')
                            .ok_or_else(|| invalid("is malformed"))?,
                    ),
                ),
            }
        }
        None => match authority.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        },
    };
    if host.is_empty() {
        return Err(invalid("names no host"));
    }
    match port {
        None => Ok(80),
        Some(port) => port
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| invalid("names an invalid port")),
    }
}

/// The `observer` plugin.
#[derive(Debug)]
pub struct ObserverPlugin;

impl Plugin for ObserverPlugin {
    fn manifest() -> Manifest {
        Manifest::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")).controller(
            Controller::new(
                "observer",
                KindRef::namespaced("test.wasmop.dev", "v1", "Observer", "observers"),
            ),
        )
    }

    fn validate_settings(settings: &Value) -> Result<(), Vec<SettingsProblem>> {
        settings::only_keys(settings, &[])
    }

    fn reconcile(snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
        if snapshot.deleting {
            return Ok(Plan::new().cleanup_complete());
        }
        let primary: Observed = snapshot.primary_as()?;
        let Spec { url, path } = primary.spec;
        if url.is_empty() {
            return Err(ReconcileError::invalid_spec("spec.url is required"));
        }
        let port = http_port(&url)?;
        let path = if path.is_empty() {
            "/".to_owned()
        } else {
            path
        };
        let mut request = HttpRequest::allow_listed(PROBE, HttpMethod::Get, &url, &path);
        request.port = port;
        let mut plan = Plan::new().http(request);
        if let Some(o) = snapshot.observation(PROBE) {
            plan = plan.status(json!({
                "observed": {"status": o.status, "body": o.body, "error": o.error},
            }));
        }
        Ok(plan)
    }
}

#[cfg(target_arch = "wasm32")]
wasmop_sdk::export_plugin!(ObserverPlugin);

#[cfg(test)]
mod tests {
    use super::*;
    use wasmop_sdk::testing::{SnapshotBuilder, run};
    use wasmop_sdk::{HttpMethod, HttpRequest, Observation};

    fn observer(spec: &str) -> SnapshotBuilder {
        SnapshotBuilder::from_yaml(
            "observer",
            &format!(
                "apiVersion: test.wasmop.dev/v1\nkind: Observer\n\
                 metadata: {{name: o, namespace: ns, uid: u-1}}\nspec: {spec}\n"
            ),
        )
    }

    fn observation(status: Option<u16>, body: &str, error: Option<&str>) -> Observation {
        Observation {
            id: PROBE.into(),
            status,
            body: body.into(),
            error: error.map(Into::into),
            observed_at: "2025-01-01T00:00:00Z".into(),
            age_ms: 250,
            outcome: None,
        }
    }

    #[test]
    fn the_manifest_declares_no_http_targets_and_owns_nothing() {
        let m = ObserverPlugin::manifest();
        assert_eq!((m.name.as_str(), m.version.as_str()), ("observer", "0.1.0"));
        let c = &m.controllers[0];
        assert_eq!(
            c.primary,
            KindRef::namespaced("test.wasmop.dev", "v1", "Observer", "observers")
        );
        assert!(c.http_targets.is_empty());
        assert!(c.owns.is_empty());
    }

    #[test]
    fn plans_a_get_through_the_allow_list_with_the_urls_port() {
        let snapshot = observer("{url: 'http://127.0.0.1:8080', path: /state}").build();
        let plan = run::<ObserverPlugin>(&snapshot).unwrap();
        assert_eq!(
            plan.http_requests,
            vec![{
                let mut r = HttpRequest::allow_listed(
                    PROBE,
                    HttpMethod::Get,
                    "http://127.0.0.1:8080",
                    "/state",
                );
                r.port = 8080;
                r
            }]
        );
        assert_eq!(plan.status, None, "nothing observed yet");
        assert!(plan.apply.is_empty());
    }

    #[test]
    fn the_port_defaults_to_80_and_the_path_to_slash() {
        let plan =
            run::<ObserverPlugin>(&observer("{url: 'http://probe.example'}").build()).unwrap();
        assert_eq!(plan.http_requests[0].port, 80);
        assert_eq!(plan.http_requests[0].path, "/");
    }

    #[test]
    fn writes_the_observation_to_status() {
        let snapshot = observer("{url: 'http://127.0.0.1:9000', path: /}")
            .observation(observation(Some(200), "up", None))
            .build();
        let plan = run::<ObserverPlugin>(&snapshot).unwrap();
        assert_eq!(
            plan.status,
            Some(json!({"observed": {"status": 200, "body": "up", "error": null}}))
        );
        assert_eq!(plan.http_requests.len(), 1, "keeps asking");

        let failed = observer("{url: 'http://127.0.0.1:9000'}")
            .observation(observation(None, "", Some("deadline of 200 ms exceeded")))
            .build();
        let plan = run::<ObserverPlugin>(&failed).unwrap();
        assert_eq!(
            plan.status,
            Some(json!({"observed": {"status": null, "body": "",
                                     "error": "deadline of 200 ms exceeded"}}))
        );
    }

    #[test]
    fn a_missing_or_non_http_url_is_an_invalid_spec() {
        for spec in [
            "{}",
            "{url: 'https://127.0.0.1:8443'}",
            "{url: 'http://127.0.0.1:notaport'}",
            "{url: 'http://:8080'}",
        ] {
            let err = run::<ObserverPlugin>(&observer(spec).build()).unwrap_err();
            assert!(
                matches!(err, ReconcileError::InvalidSpec(_)),
                "{spec}: {err:?}"
            );
        }
    }

    #[test]
    fn ports_are_read_from_names_ipv4_and_ipv6_urls() {
        assert_eq!(http_port("http://a.example:81/x").unwrap(), 81);
        assert_eq!(http_port("HTTP://10.0.0.1").unwrap(), 80);
        assert_eq!(http_port("http://[::1]:8080/").unwrap(), 8080);
        assert_eq!(http_port("http://[::1]").unwrap(), 80);
        assert_eq!(http_port("http://a.example?q=1").unwrap(), 80);
    }

    #[test]
    fn deleting_needs_no_cleanup_and_sends_nothing() {
        let plan = run::<ObserverPlugin>(
            &observer("{url: 'http://127.0.0.1:1'}")
                .deleting(true)
                .build(),
        )
        .unwrap();
        assert!(plan.cleanup_complete);
        assert!(plan.http_requests.is_empty());
    }
}
