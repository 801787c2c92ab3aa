//! What every controller of the plugin shares: the kinds, the names of the
//! generated objects, settings, consent, and the terdut-server calls.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};
use wasmop_sdk::conditions::{conditions_of, set_condition};
use wasmop_sdk::k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use wasmop_sdk::{
    CaBundle, HttpMethod, HttpRequest, KindRef, Observation, ReconcileError, SettingsProblem,
    Snapshot,
};

/// API group of every kind.
pub const GROUP: &str = "terdut.ryuvia.com";
/// API version of every kind.
pub const VERSION: &str = "v1alpha1";

/// Key of the API key in every credentials Secret.
pub const API_KEY: &str = "api-key";
/// Key of the server's API base URL in every credentials Secret.
pub const URL_KEY: &str = "url";
/// Label on Secrets the server controller writes into teams' namespaces:
/// `mirror` or `team-key`.
pub const CREDENTIALS_LABEL: &str = "terdut.ryuvia.com/credentials";
/// The capability of team-scoped service accounts (`GET /api/version`).
pub const TEAM_SCOPED_CAPABILITY: &str = "team-service-accounts";

/// `TerdutServer`.
pub fn server_kind() -> KindRef {
    KindRef::namespaced(GROUP, VERSION, "TerdutServer", "terdutservers")
}
/// `TerdutTeam`.
pub fn team_kind() -> KindRef {
    KindRef::namespaced(GROUP, VERSION, "TerdutTeam", "terdutteams")
}
/// `TerdutEscalationRule`.
pub fn escalation_kind() -> KindRef {
    KindRef::namespaced(
        GROUP,
        VERSION,
        "TerdutEscalationRule",
        "terdutescalationrules",
    )
}
/// `TerdutDeadmanSwitch`.
pub fn deadman_kind() -> KindRef {
    KindRef::namespaced(
        GROUP,
        VERSION,
        "TerdutDeadmanSwitch",
        "terdutdeadmanswitches",
    )
}
/// `TerdutAlertSource`.
pub fn alert_source_kind() -> KindRef {
    KindRef::namespaced(GROUP, VERSION, "TerdutAlertSource", "terdutalertsources")
}
/// Zalando's `postgresql.acid.zalan.do`.
pub fn postgresql_kind() -> KindRef {
    KindRef::namespaced("acid.zalan.do", "v1", "postgresql", "postgresqls")
}

/// `<server>-operator-credentials`: the operator's own key, next to the server.
pub fn operator_credentials_name(server: &str) -> String {
    format!("{server}-operator-credentials")
}

/// `<server>.<server namespace>-terdut-credentials`: the mirror of the
/// operator's key in a consenting team namespace (§6.4).
pub fn mirror_name(server: &str, server_namespace: &str) -> String {
    format!("{server}.{server_namespace}-terdut-credentials")
}

/// `<team>-terdut-team-credentials`: a team-scoped key, in the team's namespace.
pub fn team_key_name(team: &str) -> String {
    format!("{team}-terdut-team-credentials")
}

/// The plugin's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Periodic resync of everything synced with the server (§5: 5–10 min).
    pub resync: Duration,
    /// Retry delay while waiting on the server or a parent.
    pub retry: Duration,
    /// `serverEnv`: the name to give terdut-server's container instead of
    /// an assumed env name (a key of [`crate::server::ASSUMED_ENV`]).
    pub server_env: BTreeMap<String, String>,
    /// `healthPath`: the readiness probe's path (assumed `/healthz`).
    pub health_path: String,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            resync: Duration::from_secs(300),
            retry: Duration::from_secs(10),
            server_env: BTreeMap::new(),
            health_path: crate::server::ASSUMED_HEALTH_PATH.to_owned(),
        }
    }
}

/// An env var name Kubernetes accepts for a container and a shell can use:
/// a letter or `_`, then letters, digits and `_`, at most 256.
fn env_name_ok(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && name.len() <= 256
}

/// `serverEnv` and `healthPath` (see [`Settings`]).
fn parse_server_names(settings: &Value, out: &mut Settings, problems: &mut Vec<SettingsProblem>) {
    match &settings["serverEnv"] {
        Value::Null => {}
        Value::Object(map) => {
            for (assumed, actual) in map {
                if !crate::server::ASSUMED_ENV
                    .iter()
                    .any(|(n, _)| *n == assumed.as_str())
                {
                    problems.push(SettingsProblem::new(
                        format!("serverEnv.{assumed}"),
                        format!(
                            "{assumed} is not an env name the plugin gives terdut-server (see the README's table of assumed names)"
                        ),
                    ));
                    continue;
                }
                match actual.as_str() {
                    Some(a) if env_name_ok(a) => {
                        out.server_env.insert(assumed.clone(), a.to_owned());
                    }
                    _ => problems.push(SettingsProblem::new(
                        format!("serverEnv.{assumed}"),
                        format!(
                            "serverEnv.{assumed} must be an env var name (a letter or _, then letters, digits and _)"
                        ),
                    )),
                }
            }
            let mut taken = BTreeMap::new();
            for (assumed, _) in crate::server::ASSUMED_ENV {
                let actual = out
                    .server_env
                    .get(*assumed)
                    .map_or(*assumed, String::as_str);
                if let Some(other) = taken.insert(actual.to_owned(), *assumed) {
                    problems.push(SettingsProblem::new(
                        "serverEnv",
                        format!("{other} and {assumed} would both be named {actual}"),
                    ));
                }
            }
        }
        _ => problems.push(SettingsProblem::new(
            "serverEnv",
            "serverEnv must be a map from an assumed env name to the name to use",
        )),
    }
    match &settings["healthPath"] {
        Value::Null => {}
        Value::String(p)
            if p.starts_with('/') && p.len() <= 256 && p.chars().all(|c| c.is_ascii_graphic()) =>
        {
            out.health_path = p.clone();
        }
        _ => problems.push(SettingsProblem::new(
            "healthPath",
            "healthPath must be a path starting with / (printable ASCII, no spaces, at most 256)",
        )),
    }
}

impl Settings {
    /// Reads `{resyncSeconds, retrySeconds}` (both optional, at least 1).
    ///
    /// # Errors
    /// Every problem found.
    pub fn parse(settings: &Value) -> Result<Settings, Vec<SettingsProblem>> {
        wasmop_sdk::settings::only_keys(
            settings,
            &["resyncSeconds", "retrySeconds", "serverEnv", "healthPath"],
        )?;
        let mut problems = Vec::new();
        let mut out = Settings::default();
        parse_server_names(settings, &mut out, &mut problems);
        for (key, slot) in [
            ("resyncSeconds", &mut out.resync),
            ("retrySeconds", &mut out.retry),
        ] {
            match &settings[key] {
                Value::Null => {}
                v => match v.as_u64().filter(|n| (1..=86_400).contains(n)) {
                    Some(n) => *slot = Duration::from_secs(n),
                    None => problems.push(SettingsProblem::new(
                        key,
                        format!("{key} must be a whole number of seconds from 1 to 86400"),
                    )),
                },
            }
        }
        if problems.is_empty() {
            Ok(out)
        } else {
            Err(problems)
        }
    }

    /// The settings of a snapshot (validated at load, so defaults on error).
    pub fn of(snapshot: &Snapshot) -> Settings {
        Settings::parse(&snapshot.settings).unwrap_or_default()
    }
}

/// A `{name, namespace?}` reference.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct NamedRef {
    /// Name.
    #[serde(default)]
    pub name: String,
    /// Namespace (the referrer's when empty).
    #[serde(default)]
    pub namespace: Option<String>,
}

/// A label selector (`matchLabels`, `matchExpressions`).
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelector {
    /// Exact labels.
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
    /// Expressions.
    #[serde(default)]
    pub match_expressions: Vec<LabelExpression>,
}

/// One `matchExpressions` entry.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct LabelExpression {
    /// Label key.
    pub key: String,
    /// `In`, `NotIn`, `Exists`, `DoesNotExist`.
    pub operator: String,
    /// Values for `In`/`NotIn`.
    #[serde(default)]
    pub values: Vec<String>,
}

impl LabelSelector {
    /// True when `labels` match. An unknown operator matches nothing.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|e| {
                let value = labels.get(&e.key);
                match e.operator.as_str() {
                    "In" => value.is_some_and(|v| e.values.contains(v)),
                    "NotIn" => value.is_none_or(|v| !e.values.contains(v)),
                    "Exists" => value.is_some(),
                    "DoesNotExist" => value.is_none(),
                    _ => false,
                }
            })
    }
}

/// `TerdutServer.spec.allowedTeams.namespaces`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct AllowedNamespaces {
    /// `None` (default), `Same`, `All`, `Selector`.
    #[serde(default)]
    pub from: Option<String>,
    /// For `Selector`.
    #[serde(default)]
    pub selector: Option<LabelSelector>,
}

/// Whether a TerdutTeam in `team_namespace` (whose Namespace carries
/// `namespace_labels`) may reference `server` (§4.6). Same-namespace teams
/// always may; others only as `allowedTeams.namespaces` says.
pub fn permits(
    server: &Value,
    team_namespace: &str,
    namespace_labels: &BTreeMap<String, String>,
) -> bool {
    if server["metadata"]["namespace"].as_str() == Some(team_namespace) {
        return true;
    }
    let allowed: AllowedNamespaces =
        serde_json::from_value(server["spec"]["allowedTeams"]["namespaces"].clone())
            .unwrap_or_default();
    match allowed.from.as_deref().unwrap_or("None") {
        "All" => true,
        "Selector" => allowed
            .selector
            .is_some_and(|s| s.matches(namespace_labels)),
        _ => false,
    }
}

/// The labels of an object.
pub fn labels_of(object: &Value) -> BTreeMap<String, String> {
    serde_json::from_value(object["metadata"]["labels"].clone()).unwrap_or_default()
}

/// Where and as whom to call a terdut-server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// Base URL, e.g. `http://terdut.oncall.svc:8080`.
    pub base: String,
    /// Its port.
    pub port: u16,
    /// Secret (in the caller's namespace) and key holding the bearer key;
    /// `None` for the unauthenticated routes.
    pub secret: Option<SecretKey>,
    /// PEM certificates an `https` server is trusted by, besides the
    /// system's roots (`spec.networking.caBundle` of the TerdutServer).
    pub ca: Option<String>,
}

/// A key of a Secret in the caller's namespace.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct SecretKey {
    /// Secret name.
    #[serde(default)]
    pub name: String,
    /// Key in its data.
    #[serde(default)]
    pub key: String,
}

impl SecretKey {
    /// `name`/`key`.
    pub fn new(name: &str, key: &str) -> Self {
        SecretKey {
            name: name.to_owned(),
            key: key.to_owned(),
        }
    }
}

impl Endpoint {
    /// An endpoint at `base` authenticating with `secret`.
    ///
    /// # Errors
    /// When `base` is not an `http://` or `https://` URL with a host.
    pub fn new(base: &str, secret: Option<SecretKey>) -> Result<Endpoint, String> {
        Ok(Endpoint {
            base: base.trim_end_matches('/').to_owned(),
            port: url_port(base)?,
            secret,
            ca: None,
        })
    }

    /// The same endpoint trusting `ca` (PEM) besides the system's roots;
    /// `None` or empty: the system's roots only.
    pub fn with_ca(mut self, ca: Option<&str>) -> Endpoint {
        self.ca = ca.filter(|c| !c.trim().is_empty()).map(str::to_owned);
        self
    }

    /// The same endpoint with another Secret.
    pub fn with_secret(&self, secret: Option<SecretKey>) -> Endpoint {
        Endpoint {
            secret,
            ..self.clone()
        }
    }

    /// A request; a body makes it JSON.
    pub fn request(
        &self,
        id: &str,
        method: HttpMethod,
        path: &str,
        body: Option<Value>,
    ) -> HttpRequest {
        let mut r = HttpRequest::allow_listed(id, method, &self.base, path)
            .header("Accept", "application/json")
            .timeout(Duration::from_secs(10));
        if let Some(secret) = &self.secret {
            r = r.secret_header("Authorization", &secret.name, &secret.key, "Bearer ");
        }
        if let Some(ca) = self
            .ca
            .as_ref()
            .filter(|_| self.base.starts_with("https://"))
        {
            r.ca_bundle = Some(CaBundle::Pem(ca.clone()));
        }
        if let Some(body) = body {
            r = r
                .header("Content-Type", "application/json")
                .body(body.to_string());
        }
        r
    }

    /// A GET.
    pub fn get(&self, id: &str, path: &str) -> HttpRequest {
        self.request(id, HttpMethod::Get, path, None)
    }
}

/// The port of an `http(s)://host[:port][/...]` URL.
///
/// # Errors
/// A message naming what is wrong.
pub fn url_port(url: &str) -> Result<u16, String> {
    let lower = url.to_ascii_lowercase();
    let (rest, default) = if let Some(rest) = lower.strip_prefix("http://") {
        (rest, 80)
    } else if let Some(rest) = lower.strip_prefix("https://") {
        (rest, 443)
    } else {
        return Err(format!("{url:?} must start with http:// or https://"));
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let (host, port) = match authority.strip_prefix('[') {
        Some(v6) => match v6.split_once(']') {
            Some((h, after)) => (h, after.strip_prefix(':')),
            None => return Err(format!("{url:?} has an unclosed IPv6 address")),
        },
        None => match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        },
    };
    if host.is_empty() || authority.contains('@') {
        return Err(format!("{url:?} names no usable host"));
    }
    match port {
        None => Ok(default),
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("{url:?} names an invalid port")),
    }
}

/// The newest of the observations with these ids (the smallest age).
pub fn newest<'a>(snapshot: &'a Snapshot, ids: &[&str]) -> Option<&'a Observation> {
    ids.iter()
        .filter_map(|id| snapshot.observation(id))
        .min_by_key(|o| o.age_ms)
}

/// True when `a` is newer than `b` (or `b` is absent).
pub fn newer(a: &Observation, b: Option<&Observation>) -> bool {
    b.is_none_or(|b| a.age_ms < b.age_ms)
}

/// The body of a successful observation as JSON.
pub fn body_of(o: &Observation) -> Option<Value> {
    if o.is_success() {
        serde_json::from_str(&o.body).ok()
    } else {
        None
    }
}

/// What went wrong with a request, for a condition: the transport error or
/// the status with the server's `error` text. Never the body otherwise (a
/// body may hold a key).
pub fn describe(o: &Observation) -> String {
    if let Some(e) = &o.error {
        return e.clone();
    }
    let said = serde_json::from_str::<Value>(&o.body)
        .ok()
        .and_then(|v| v["error"].as_str().map(str::to_owned));
    match (o.status, said) {
        (Some(s), Some(m)) => format!("HTTP {s}: {m}"),
        (Some(s), None) => format!("HTTP {s}"),
        (None, _) => "no response".to_owned(),
    }
}

/// Standard base64 of `bytes` (for Secret `data`).
pub fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// A Secret of `data` (values as text, encoded here).
pub fn secret(name: &str, namespace: &str, labels: Value, data: &[(&str, &str)]) -> Value {
    let data: serde_json::Map<String, Value> = data
        .iter()
        .map(|(k, v)| ((*k).to_owned(), Value::String(base64(v.as_bytes()))))
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "type": "Opaque",
        "data": data,
    })
}

/// True when the Secret has a non-empty `data[key]`.
pub fn secret_has(secret: &Value, key: &str) -> bool {
    secret["data"][key].as_str().is_some_and(|v| !v.is_empty())
}

/// The Secret named `name` among the snapshot's related `read` objects or
/// its owned ones, in `namespace`.
pub fn find_secret<'a>(
    snapshot: &'a Snapshot,
    read: &'a str,
    namespace: &str,
    name: &str,
) -> Option<&'a Value> {
    snapshot
        .related(read)
        .chain(snapshot.owned.iter())
        .find(|o| {
            o["kind"] == "Secret"
                && o["metadata"]["name"] == name
                && o["metadata"]["namespace"] == namespace
        })
}

/// The primary's conditions being rewritten for one reconcile.
#[derive(Debug)]
pub struct Conditions {
    list: Vec<Condition>,
    generation: Option<i64>,
    now: Time,
}

impl Conditions {
    /// The primary's current conditions.
    ///
    /// # Errors
    /// When the snapshot's time does not parse.
    pub fn of(snapshot: &Snapshot) -> Result<Conditions, ReconcileError> {
        Ok(Conditions {
            list: conditions_of(&snapshot.primary),
            generation: snapshot.primary_generation(),
            now: snapshot.now()?,
        })
    }

    /// Sets one.
    pub fn set(&mut self, type_: &str, status: bool, reason: &str, message: &str) {
        set_condition(
            &mut self.list,
            type_,
            status,
            reason,
            message,
            self.generation,
            &self.now,
        );
    }

    /// Sets one to `Unknown`.
    pub fn unknown(&mut self, type_: &str, reason: &str, message: &str) {
        set_condition(
            &mut self.list,
            type_,
            wasmop_sdk::conditions::ConditionStatus::Unknown,
            reason,
            message,
            self.generation,
            &self.now,
        );
    }

    /// Removes one.
    pub fn remove(&mut self, type_: &str) {
        self.list.retain(|c| c.type_ != type_);
    }

    /// The reason of a condition as it was before this reconcile changed it
    /// (call before `set`).
    pub fn reason(&self, type_: &str) -> Option<&str> {
        self.list
            .iter()
            .find(|c| c.type_ == type_)
            .map(|c| c.reason.as_str())
    }

    /// The list as JSON.
    pub fn to_json(&self) -> Value {
        serde_json::to_value(&self.list).unwrap_or(Value::Array(Vec::new()))
    }
}

/// How long a POST counts as in flight after a plan listed it (the
/// requests' deadline is 10 s).
pub const IN_FLIGHT_SECONDS: i64 = 30;

fn parse_time(text: &str) -> Option<wasmop_sdk::k8s_openapi::jiff::Timestamp> {
    text.parse().ok()
}

/// Whether a plan may list the POST `id` now. The host sends a mutating
/// request every time a plan lists it, so a create listed again before
/// its answer arrived would be sent twice. A plan listing one records the
/// time in `status.pending.<id>` ([`mark_sent`]); until an answer newer
/// than that arrives, or [`IN_FLIGHT_SECONDS`] pass, it is not listed again.
pub fn may_send(snapshot: &Snapshot, id: &str) -> bool {
    let Some(sent) = snapshot.primary["status"]["pending"][id]
        .as_str()
        .and_then(parse_time)
    else {
        return true;
    };
    let Some(now) = parse_time(&snapshot.now) else {
        return true;
    };
    if now.as_second() - sent.as_second() >= IN_FLIGHT_SECONDS {
        return true;
    }
    snapshot
        .observation(id)
        .and_then(|o| parse_time(&o.observed_at))
        .is_some_and(|answered| answered >= sent)
}

/// A request id safe as an observation key: `prefix` plus the parts.
pub fn id(parts: &[&str]) -> String {
    parts.join(".")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_standard_alphabet() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64(&[0xff, 0xfe]), "//4=");
    }

    #[test]
    fn url_ports() {
        assert_eq!(url_port("http://127.0.0.1:4321"), Ok(4321));
        assert_eq!(url_port("http://terdut.oncall.svc"), Ok(80));
        assert_eq!(url_port("https://terdut.example.com/base"), Ok(443));
        assert_eq!(url_port("http://[::1]:81/"), Ok(81));
        assert!(url_port("ftp://x").is_err());
        assert!(url_port("http://:80").is_err());
        assert!(url_port("http://a:0").is_err());
        assert!(url_port("http://u@a:1").is_err());
    }

    #[test]
    fn settings_defaults_bounds_and_unknown_keys() {
        assert_eq!(Settings::parse(&json!({})), Ok(Settings::default()));
        let s = Settings::parse(&json!({"resyncSeconds": 2, "retrySeconds": 1})).unwrap();
        assert_eq!(s.resync, Duration::from_secs(2));
        let problems =
            Settings::parse(&json!({"resyncSeconds": 0, "retrySeconds": "x"})).unwrap_err();
        assert_eq!(problems.len(), 2);
        assert!(Settings::parse(&json!({"bogus": 1})).is_err());
    }

    fn server(allowed: Value) -> Value {
        json!({"metadata": {"name": "terdut", "namespace": "oncall"},
               "spec": {"allowedTeams": {"namespaces": allowed}}})
    }

    #[test]
    fn consent_matrix() {
        let labels: BTreeMap<String, String> =
            [("terdut.ryuvia.com/allowed".to_owned(), "true".to_owned())].into();
        let none = BTreeMap::new();
        let selector = json!({"from": "Selector", "selector": {"matchLabels": {"terdut.ryuvia.com/allowed": "true"}}});
        for (allowed, same, cross_labelled, cross_plain) in [
            (json!(null), true, false, false),
            (json!({"from": "None"}), true, false, false),
            (json!({"from": "Same"}), true, false, false),
            (json!({"from": "All"}), true, true, true),
            (selector, true, true, false),
            (json!({"from": "Selector"}), true, false, false),
        ] {
            let s = server(allowed.clone());
            assert_eq!(permits(&s, "oncall", &none), same, "{allowed}");
            assert_eq!(permits(&s, "team-a", &labels), cross_labelled, "{allowed}");
            assert_eq!(permits(&s, "team-a", &none), cross_plain, "{allowed}");
        }
    }

    #[test]
    fn selector_expressions() {
        let sel: LabelSelector = serde_json::from_value(json!({"matchExpressions": [
            {"key": "tier", "operator": "In", "values": ["a", "b"]},
            {"key": "legacy", "operator": "DoesNotExist"}]}))
        .unwrap();
        let l = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect()
        };
        assert!(sel.matches(&l(&[("tier", "a")])));
        assert!(!sel.matches(&l(&[("tier", "c")])));
        assert!(!sel.matches(&l(&[("tier", "a"), ("legacy", "")])));
        let bad: LabelSelector =
            serde_json::from_value(json!({"matchExpressions": [{"key": "x", "operator": "Gt"}]}))
                .unwrap();
        assert!(!bad.matches(&l(&[("x", "1")])));
    }

    #[test]
    fn describe_never_shows_a_body_beyond_its_error_text() {
        let o = Observation {
            id: "x".into(),
            status: Some(201),
            body: r#"{"key":"secret"}"#.into(),
            error: None,
            observed_at: "2025-01-01T00:00:00Z".into(),
            age_ms: 0,
            outcome: None,
        };
        assert_eq!(describe(&o), "HTTP 201");
        let o = Observation {
            status: Some(409),
            body: r#"{"error":"team exists"}"#.into(),
            ..o
        };
        assert_eq!(describe(&o), "HTTP 409: team exists");
    }
}
