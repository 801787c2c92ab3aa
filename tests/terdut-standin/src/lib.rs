//! A stand-in terdut-server for the `team` plugin's tests.
//!
//! terdut-server is not public, so the tests talk to this: a small HTTP/1
//! server of our own on loopback that keeps its state in memory and
//! implements the REST surface the terdut-operator design
//! (`seeds/terdut-operator-design.md`, §5, §6, §13) relies on, with the
//! semantics it states:
//!
//! | route | semantics |
//! | --- | --- |
//! | `GET /healthz` | `ok`, no auth |
//! | `GET /api/version` | `{version, capabilities, bootstrapped}`, no auth (§13's version-discovery endpoint; absent with [`Controls::without_proposed_routes`]) |
//! | `POST /api/bootstrap` | first admin user and its key, once per install: 403 once any user exists |
//! | `POST /api/service-accounts` (absent with [`Controls::without_proposed_routes`], as are the two below) | `{name, scope}` → `{id, name, scope, team_id, key}`; admin only; 409 on a taken name; scope `team` only with the `team-service-accounts` capability |
//! | `GET /api/service-accounts?name=` | accounts (never keys); admin only |
//! | `POST /api/service-accounts/{id}/keys` | a new key for the account; admin only |
//! | `GET /api/users` | `[{id, username}]` |
//! | `GET /api/teams?name=` | teams, optionally by name |
//! | `POST /api/teams` | `{name}` → the team; 409 on a taken name |
//! | `GET /api/teams/{id}` | the team |
//! | `PUT /api/teams/{id}` | rename: `{name}`; 409 on a taken name |
//! | `PUT /api/teams/{id}/oidc-groups` | `{member_group, owner_group}` |
//! | `DELETE /api/teams/{id}` | the team and everything of it |
//! | `GET`/`PUT /api/teams/{id}/escalation` | the whole policy `{repeat_count, fallback_topic, levels:[{timeout, targets:[{kind, user_id?}]}]}` |
//! | `GET /api/teams/{id}/deadman-switches?name=` | switches |
//! | `POST /api/teams/{id}/deadman-switches` | `{name, matcher, timeout, severity}`; 409 on a taken name; no update verb |
//! | `DELETE /api/teams/{id}/deadman-switches/{sid}` | |
//! | `GET /api/teams/{id}/integrations?name=` | integrations, never their keys |
//! | `POST /api/teams/{id}/integrations` | `{name, kind}` → with `url` and `key`, the only time the key is shown |
//! | `PATCH /api/teams/{id}/integrations/{iid}` | rename: `{name}` |
//! | `DELETE /api/teams/{id}/integrations/{iid}` | |
//!
//! Every other route needs `Authorization: Bearer <key>`: 401 without a
//! known key. A key is an admin's (the bootstrap user, or an instance-scoped
//! service account) or a team-scoped service account's, which may create
//! one team (and is bound to it) and then touch only that team. Errors are
//! `{"error": "..."}`. A mutating request with an `Idempotency-Key` that was
//! seen before for the same method and path is answered with the stored
//! response, not executed again.
//!
//! Tests reach the state directly ([`StandIn::with`]) to change things
//! behind the operator's back, and [`Controls`] make it fail requests, go
//! down, advertise team-scoped accounts, lose a bootstrap race, or hold
//! the answers to some requests (already carried out) until released.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use anyhow::Result;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;

/// The capability every install has.
pub const BASE_CAPABILITIES: &[&str] = &[
    "teams",
    "escalation",
    "deadman-switches",
    "integrations",
    "service-accounts",
];
/// The capability of team-scoped service accounts (off unless
/// [`Controls::team_scoped_accounts`]).
pub const TEAM_SCOPED_CAPABILITY: &str = "team-service-accounts";
/// Integration kinds the stand-in accepts.
pub const INTEGRATION_KINDS: &[&str] = &["alertmanager", "grafana", "webhook"];

/// One request as the stand-in saw it (never a key value).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Logged {
    /// `GET`, `POST`, ...
    pub method: String,
    /// Path and query.
    pub path: String,
    /// The status answered; 0 when the connection was dropped (down).
    pub status: u16,
    /// The `Idempotency-Key` header, when sent.
    pub idempotency_key: Option<String>,
    /// Who the bearer key belongs to: `admin:<user id>`, `sa:<id>`, or
    /// `None` without (or with an unknown) key.
    pub caller: Option<String>,
    /// True when the answer was replayed for a repeated idempotency key.
    pub replayed: bool,
}

/// A rule making matching requests fail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailRule {
    /// Method to match, any when `None`.
    pub method: Option<String>,
    /// Path prefix to match.
    pub path_prefix: String,
    /// Status to answer.
    pub status: u16,
    /// How many more requests to fail; `None`: every one.
    pub remaining: Option<u32>,
}

/// Knobs a test turns.
#[derive(Clone, Debug)]
pub struct Controls {
    /// Advertise and allow team-scoped service accounts.
    pub team_scoped_accounts: bool,
    /// Drop every connection without an answer (an unreachable server).
    pub down: bool,
    /// Failing rules, first match wins.
    pub fail: Vec<FailRule>,
    /// The next `POST /api/bootstrap` loses a race: someone else
    /// bootstraps just before it is handled, so it gets the 403.
    pub lose_next_bootstrap_race: bool,
    /// Prefix of every key minted (a canary for leak tests).
    pub key_prefix: String,
    /// Replay stored answers for repeated idempotency keys.
    pub honour_idempotency_keys: bool,
    /// Version string `/api/version` reports.
    pub version: String,
    /// Requests whose method and path start with one of these are carried
    /// out at once but answered only once the entry is removed: an answer
    /// slow to arrive, with the change already made on the server.
    pub hold_answers: Vec<(String, String)>,
    /// Serve only what terdut-server has today: no `GET /api/version` and no
    /// `/api/service-accounts` routes (both are proposals of the design,
    /// §6.6 and §13); they answer 404 like any unknown route.
    pub without_proposed_routes: bool,
}

impl Default for Controls {
    fn default() -> Self {
        Controls {
            team_scoped_accounts: false,
            down: false,
            fail: Vec::new(),
            lose_next_bootstrap_race: false,
            key_prefix: "tdk_".to_owned(),
            honour_idempotency_keys: true,
            version: "0.10.0-standin".to_owned(),
            without_proposed_routes: false,
            hold_answers: Vec::new(),
        }
    }
}

/// A user row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User {
    /// Id.
    pub id: u64,
    /// Name.
    pub username: String,
}

/// A service account.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceAccount {
    /// Id.
    pub id: u64,
    /// Unique name.
    pub name: String,
    /// `instance` or `team`.
    pub scope: String,
    /// For a team-scoped account, the team it created (and may touch).
    pub team_id: Option<u64>,
}

/// A team.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Team {
    /// Id.
    pub id: u64,
    /// Unique name.
    pub name: String,
    /// OIDC member group.
    pub member_group: String,
    /// OIDC owner group.
    pub owner_group: String,
}

/// A dead man's switch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Switch {
    /// Id.
    pub id: u64,
    /// Team.
    pub team_id: u64,
    /// Name, unique within the team.
    pub name: String,
    /// Alert matcher.
    pub matcher: String,
    /// Timeout (a duration string).
    pub timeout: String,
    /// Severity.
    pub severity: String,
}

/// An alert-source integration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Integration {
    /// Id.
    pub id: u64,
    /// Team.
    pub team_id: u64,
    /// Name, unique within the team.
    pub name: String,
    /// Kind (`alertmanager`, ...).
    pub kind: String,
    /// The webhook key (shown once, at creation).
    pub key: String,
}

/// Who a bearer key belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Principal {
    /// An admin user.
    User(u64),
    /// A service account.
    ServiceAccount(u64),
}

/// The whole in-memory install.
#[derive(Debug, Default)]
pub struct State {
    next_id: u64,
    next_key: u64,
    /// Base URL the server is reached at (for integration URLs).
    pub base_url: String,
    /// Users; the first is the bootstrap admin.
    pub users: Vec<User>,
    /// Key → principal.
    pub keys: BTreeMap<String, Principal>,
    /// Service accounts.
    pub service_accounts: Vec<ServiceAccount>,
    /// Teams by id.
    pub teams: BTreeMap<u64, Team>,
    /// Escalation policy of a team (absent: the empty policy).
    pub escalation: BTreeMap<u64, Value>,
    /// Dead man's switches by id.
    pub switches: BTreeMap<u64, Switch>,
    /// Integrations by id.
    pub integrations: BTreeMap<u64, Integration>,
    /// (idempotency key, method, path) → (status, body).
    idempotency: HashMap<(String, String, String), (u16, String)>,
    /// Every request handled, in order.
    pub log: Vec<Logged>,
    /// The knobs.
    pub controls: Controls,
}

/// A request as the handler sees it.
#[derive(Clone, Debug, Default)]
pub struct Request {
    /// Method, upper case.
    pub method: String,
    /// Path and query.
    pub path: String,
    /// `Authorization` header.
    pub authorization: Option<String>,
    /// `Idempotency-Key` header.
    pub idempotency_key: Option<String>,
    /// Body text.
    pub body: String,
}

impl Request {
    /// A request without headers or body.
    pub fn new(method: &str, path: &str) -> Self {
        Request {
            method: method.to_owned(),
            path: path.to_owned(),
            ..Request::default()
        }
    }

    /// With `Authorization: Bearer <key>`.
    pub fn bearer(mut self, key: &str) -> Self {
        self.authorization = Some(format!("Bearer {key}"));
        self
    }

    /// With a JSON body.
    pub fn json(mut self, body: Value) -> Self {
        self.body = body.to_string();
        self
    }

    /// With an idempotency key.
    pub fn idempotency(mut self, key: &str) -> Self {
        self.idempotency_key = Some(key.to_owned());
        self
    }
}

/// An answer; `None` status means the connection is dropped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    /// Status, `None` for a dropped connection.
    pub status: Option<u16>,
    /// Body (JSON text, or empty).
    pub body: String,
}

impl Response {
    fn json(status: u16, body: Value) -> Self {
        Response {
            status: Some(status),
            body: body.to_string(),
        }
    }

    fn empty(status: u16) -> Self {
        Response {
            status: Some(status),
            body: String::new(),
        }
    }

    fn error(status: u16, message: impl Into<String>) -> Self {
        Response::json(status, json!({"error": message.into()}))
    }

    /// The body as JSON (`Null` when empty or not JSON).
    pub fn value(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
}

/// Who is calling, once authenticated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Caller {
    Admin(Principal),
    /// A team-scoped account: its id and the team it is bound to.
    Team(u64, Option<u64>),
}

impl Caller {
    fn label(self) -> String {
        match self {
            Caller::Admin(Principal::User(id)) => format!("admin:{id}"),
            Caller::Admin(Principal::ServiceAccount(id)) | Caller::Team(id, _) => {
                format!("sa:{id}")
            }
        }
    }

    fn is_admin(self) -> bool {
        matches!(self, Caller::Admin(_))
    }

    fn may_touch(self, team: u64) -> bool {
        match self {
            Caller::Admin(_) => true,
            Caller::Team(_, bound) => bound == Some(team),
        }
    }
}

type Handled = std::result::Result<Response, Response>;

fn forbidden() -> Response {
    Response::error(403, "forbidden")
}

fn not_found(what: &str) -> Response {
    Response::error(404, format!("{what} not found"))
}

fn body_json(req: &Request) -> std::result::Result<Value, Response> {
    serde_json::from_str::<Value>(&req.body)
        .ok()
        .filter(Value::is_object)
        .ok_or_else(|| Response::error(400, "body must be a JSON object"))
}

fn string_field(
    body: &Value,
    field: &str,
    required: bool,
) -> std::result::Result<String, Response> {
    match &body[field] {
        Value::String(s) if !(required && s.is_empty()) => Ok(s.clone()),
        Value::Null if !required => Ok(String::new()),
        _ => Err(Response::error(
            400,
            format!("{field} must be a non-empty string"),
        )),
    }
}

fn query_param(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == name).then(|| percent_decode(v))
    })
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                match text.get(i + 1..i + 3).map(|h| u8::from_str_radix(h, 16)) {
                    Some(Ok(b)) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    _ => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn team_json(t: &Team) -> Value {
    json!({"id": t.id, "name": t.name, "member_group": t.member_group, "owner_group": t.owner_group})
}

fn switch_json(s: &Switch) -> Value {
    json!({"id": s.id, "team_id": s.team_id, "name": s.name, "matcher": s.matcher,
           "timeout": s.timeout, "severity": s.severity})
}

fn account_json(a: &ServiceAccount) -> Value {
    json!({"id": a.id, "name": a.name, "scope": a.scope, "team_id": a.team_id})
}

fn empty_policy() -> Value {
    json!({"repeat_count": 0, "fallback_topic": "", "levels": []})
}

impl State {
    /// A fresh, empty install reached at `base_url`.
    pub fn new(base_url: &str) -> Self {
        State {
            base_url: base_url.to_owned(),
            ..State::default()
        }
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn mint_key(&mut self, principal: Principal) -> String {
        self.next_key += 1;
        let digest = Sha256::digest(format!("{}:{}", self.base_url, self.next_key));
        let hex: String = digest.iter().take(12).map(|b| format!("{b:02x}")).collect();
        let key = format!("{}{hex}", self.controls.key_prefix);
        self.keys.insert(key.clone(), principal);
        key
    }

    /// Bootstraps the install as someone other than the operator would
    /// (the chart's Job, a person): the admin user and its key, or `None`
    /// when users exist already.
    pub fn bootstrap(&mut self, username: &str) -> Option<String> {
        if !self.users.is_empty() {
            return None;
        }
        let id = self.id();
        self.users.push(User {
            id,
            username: username.to_owned(),
        });
        Some(self.mint_key(Principal::User(id)))
    }

    /// Adds a (non-admin) user directly; its id.
    pub fn add_user(&mut self, username: &str) -> u64 {
        let id = self.id();
        self.users.push(User {
            id,
            username: username.to_owned(),
        });
        id
    }

    /// The team named `name`.
    pub fn team_named(&self, name: &str) -> Option<&Team> {
        self.teams.values().find(|t| t.name == name)
    }

    /// Requests with this method whose path starts with `prefix`.
    pub fn count(&self, method: &str, prefix: &str) -> usize {
        self.log
            .iter()
            .filter(|l| l.method == method && l.path.starts_with(prefix))
            .count()
    }

    fn caller(&self, req: &Request) -> Option<Caller> {
        let key = req.authorization.as_deref()?.strip_prefix("Bearer ")?;
        match *self.keys.get(key)? {
            p @ Principal::User(_) => Some(Caller::Admin(p)),
            Principal::ServiceAccount(id) => {
                let account = self.service_accounts.iter().find(|a| a.id == id)?;
                if account.scope == "team" {
                    Some(Caller::Team(id, account.team_id))
                } else {
                    Some(Caller::Admin(Principal::ServiceAccount(id)))
                }
            }
        }
    }

    fn capabilities(&self) -> Vec<&'static str> {
        let mut caps = BASE_CAPABILITIES.to_vec();
        if self.controls.team_scoped_accounts {
            caps.push(TEAM_SCOPED_CAPABILITY);
        }
        caps
    }

    /// Handles one request: controls, idempotency replay, routing; logs it.
    pub fn handle(&mut self, req: &Request) -> Response {
        let caller = self.caller(req);
        let mut replayed = false;
        let response = if self.controls.down {
            Response {
                status: None,
                body: String::new(),
            }
        } else if let Some(status) = self.failing(req) {
            Response::error(status, "injected failure")
        } else {
            let replay_key = req
                .idempotency_key
                .clone()
                .filter(|_| req.method != "GET" && self.controls.honour_idempotency_keys)
                .map(|k| (k, req.method.clone(), req.path.clone()));
            match replay_key.as_ref().and_then(|k| self.idempotency.get(k)) {
                Some((status, body)) => {
                    replayed = true;
                    Response {
                        status: Some(*status),
                        body: body.clone(),
                    }
                }
                None => {
                    let response = match self.route(req, caller) {
                        Ok(r) | Err(r) => r,
                    };
                    if let (Some(k), Some(status)) = (replay_key, response.status)
                        && status < 500
                    {
                        self.idempotency.insert(k, (status, response.body.clone()));
                    }
                    response
                }
            }
        };
        self.log.push(Logged {
            method: req.method.clone(),
            path: req.path.clone(),
            status: response.status.unwrap_or(0),
            idempotency_key: req.idempotency_key.clone(),
            caller: caller.map(Caller::label),
            replayed,
        });
        response
    }

    fn failing(&mut self, req: &Request) -> Option<u16> {
        let rule = self.controls.fail.iter_mut().find(|r| {
            r.method.as_ref().is_none_or(|m| *m == req.method)
                && req.path.starts_with(&r.path_prefix)
                && r.remaining != Some(0)
        })?;
        if let Some(n) = rule.remaining.as_mut() {
            *n -= 1;
        }
        Some(rule.status)
    }

    fn route(&mut self, req: &Request, caller: Option<Caller>) -> Handled {
        let (path, query) = req.path.split_once('?').unwrap_or((&req.path, ""));
        let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let method = req.method.as_str();
        if self.controls.without_proposed_routes
            && matches!(
                segments.as_slice(),
                ["api", "version"] | ["api", "service-accounts", ..]
            )
        {
            return Err(not_found("route"));
        }
        match (method, segments.as_slice()) {
            ("GET", ["healthz"]) => Ok(Response {
                status: Some(200),
                body: "ok".to_owned(),
            }),
            ("GET", ["api", "version"]) => Ok(Response::json(
                200,
                json!({"version": self.controls.version, "capabilities": self.capabilities(),
                       "bootstrapped": !self.users.is_empty()}),
            )),
            ("POST", ["api", "bootstrap"]) => Ok(self.post_bootstrap()),
            _ => {
                let caller =
                    caller.ok_or_else(|| Response::error(401, "missing or unknown API key"))?;
                self.route_authenticated(req, method, &segments, query, caller)
            }
        }
    }

    fn post_bootstrap(&mut self) -> Response {
        if std::mem::take(&mut self.controls.lose_next_bootstrap_race) {
            let _ = self.bootstrap("racer");
        }
        match self.bootstrap("admin") {
            Some(key) => {
                let user = &self.users[0];
                Response::json(
                    201,
                    json!({"user": {"id": user.id, "username": user.username}, "key": key}),
                )
            }
            None => Response::error(403, "already bootstrapped"),
        }
    }

    fn route_authenticated(
        &mut self,
        req: &Request,
        method: &str,
        segments: &[&str],
        query: &str,
        caller: Caller,
    ) -> Handled {
        let id_of = |s: &str| s.parse::<u64>().map_err(|_| not_found("route"));
        match (method, segments) {
            ("GET", ["api", "users"]) => Ok(Response::json(
                200,
                Value::Array(
                    self.users
                        .iter()
                        .map(|u| json!({"id": u.id, "username": u.username}))
                        .collect(),
                ),
            )),
            ("GET", ["api", "service-accounts"]) => {
                admin(caller)?;
                let name = query_param(query, "name");
                Ok(Response::json(
                    200,
                    Value::Array(
                        self.service_accounts
                            .iter()
                            .filter(|a| name.as_ref().is_none_or(|n| *n == a.name))
                            .map(account_json)
                            .collect(),
                    ),
                ))
            }
            ("POST", ["api", "service-accounts"]) => {
                admin(caller)?;
                self.create_service_account(req)
            }
            ("POST", ["api", "service-accounts", id, "keys"]) => {
                admin(caller)?;
                let id = id_of(id)?;
                if !self.service_accounts.iter().any(|a| a.id == id) {
                    return Err(not_found("service account"));
                }
                let key = self.mint_key(Principal::ServiceAccount(id));
                Ok(Response::json(201, json!({"key": key})))
            }
            ("GET", ["api", "teams"]) => {
                let name = query_param(query, "name");
                Ok(Response::json(
                    200,
                    Value::Array(
                        self.teams
                            .values()
                            .filter(|t| caller.may_touch(t.id))
                            .filter(|t| name.as_ref().is_none_or(|n| *n == t.name))
                            .map(team_json)
                            .collect(),
                    ),
                ))
            }
            ("POST", ["api", "teams"]) => self.create_team(req, caller),
            (_, ["api", "teams", id, rest @ ..]) => {
                let id = id_of(id)?;
                if !self.teams.contains_key(&id) {
                    return Err(not_found("team"));
                }
                if !caller.may_touch(id) {
                    return Err(forbidden());
                }
                self.route_team(req, method, id, rest, query)
            }
            _ => Err(not_found("route")),
        }
    }

    fn create_service_account(&mut self, req: &Request) -> Handled {
        let body = body_json(req)?;
        let name = string_field(&body, "name", true)?;
        let scope = match &body["scope"] {
            Value::Null => "instance".to_owned(),
            Value::String(s) if s == "instance" => s.clone(),
            Value::String(s) if s == "team" && self.controls.team_scoped_accounts => s.clone(),
            other => return Err(Response::error(400, format!("unknown scope {other}"))),
        };
        if self.service_accounts.iter().any(|a| a.name == name) {
            return Err(Response::error(
                409,
                format!("service account {name:?} exists"),
            ));
        }
        let id = self.id();
        let account = ServiceAccount {
            id,
            name,
            scope,
            team_id: None,
        };
        let mut out = account_json(&account);
        self.service_accounts.push(account);
        out["key"] = Value::String(self.mint_key(Principal::ServiceAccount(id)));
        Ok(Response::json(201, out))
    }

    fn create_team(&mut self, req: &Request, caller: Caller) -> Handled {
        let body = body_json(req)?;
        let name = string_field(&body, "name", true)?;
        if let Caller::Team(_, Some(_)) = caller {
            return Err(forbidden());
        }
        if self.team_named(&name).is_some() {
            return Err(Response::error(409, format!("team {name:?} exists")));
        }
        let id = self.id();
        let team = Team {
            id,
            name,
            member_group: string_field(&body, "member_group", false)?,
            owner_group: string_field(&body, "owner_group", false)?,
        };
        let out = team_json(&team);
        self.teams.insert(id, team);
        if let Caller::Team(account, None) = caller
            && let Some(a) = self.service_accounts.iter_mut().find(|a| a.id == account)
        {
            a.team_id = Some(id);
        }
        Ok(Response::json(201, out))
    }

    fn route_team(
        &mut self,
        req: &Request,
        method: &str,
        team: u64,
        rest: &[&str],
        query: &str,
    ) -> Handled {
        let id_of = |s: &str| s.parse::<u64>().map_err(|_| not_found("route"));
        match (method, rest) {
            ("GET", []) => Ok(Response::json(200, team_json(&self.teams[&team]))),
            ("PUT", []) => {
                let name = string_field(&body_json(req)?, "name", true)?;
                if self.team_named(&name).is_some_and(|t| t.id != team) {
                    return Err(Response::error(409, format!("team {name:?} exists")));
                }
                let t = self.teams.get_mut(&team).ok_or_else(|| not_found("team"))?;
                t.name = name;
                Ok(Response::json(200, team_json(t)))
            }
            ("PUT", ["oidc-groups"]) => {
                let body = body_json(req)?;
                let member = string_field(&body, "member_group", false)?;
                let owner = string_field(&body, "owner_group", false)?;
                let t = self.teams.get_mut(&team).ok_or_else(|| not_found("team"))?;
                t.member_group = member;
                t.owner_group = owner;
                Ok(Response::json(200, team_json(t)))
            }
            ("DELETE", []) => {
                self.teams.remove(&team);
                self.escalation.remove(&team);
                self.switches.retain(|_, s| s.team_id != team);
                self.integrations.retain(|_, i| i.team_id != team);
                Ok(Response::empty(204))
            }
            ("GET", ["escalation"]) => Ok(Response::json(
                200,
                self.escalation
                    .get(&team)
                    .cloned()
                    .unwrap_or_else(empty_policy),
            )),
            ("PUT", ["escalation"]) => {
                let policy = self.check_policy(&body_json(req)?)?;
                self.escalation.insert(team, policy.clone());
                Ok(Response::json(200, policy))
            }
            ("GET", ["deadman-switches"]) => {
                let name = query_param(query, "name");
                Ok(Response::json(
                    200,
                    Value::Array(
                        self.switches
                            .values()
                            .filter(|s| s.team_id == team)
                            .filter(|s| name.as_ref().is_none_or(|n| *n == s.name))
                            .map(switch_json)
                            .collect(),
                    ),
                ))
            }
            ("POST", ["deadman-switches"]) => {
                let body = body_json(req)?;
                let name = string_field(&body, "name", true)?;
                if self
                    .switches
                    .values()
                    .any(|s| s.team_id == team && s.name == name)
                {
                    return Err(Response::error(409, format!("switch {name:?} exists")));
                }
                let id = self.id();
                let switch = Switch {
                    id,
                    team_id: team,
                    name,
                    matcher: string_field(&body, "matcher", true)?,
                    timeout: string_field(&body, "timeout", true)?,
                    severity: string_field(&body, "severity", false)?,
                };
                let out = switch_json(&switch);
                self.switches.insert(id, switch);
                Ok(Response::json(201, out))
            }
            ("DELETE", ["deadman-switches", sid]) => {
                let sid = id_of(sid)?;
                match self.switches.get(&sid) {
                    Some(s) if s.team_id == team => {
                        self.switches.remove(&sid);
                        Ok(Response::empty(204))
                    }
                    _ => Err(not_found("switch")),
                }
            }
            ("GET", ["integrations"]) => {
                let name = query_param(query, "name");
                Ok(Response::json(
                    200,
                    Value::Array(
                        self.integrations
                            .values()
                            .filter(|i| i.team_id == team)
                            .filter(|i| name.as_ref().is_none_or(|n| *n == i.name))
                            .map(|i| self.integration_json(i, false))
                            .collect(),
                    ),
                ))
            }
            ("POST", ["integrations"]) => {
                let body = body_json(req)?;
                let name = string_field(&body, "name", true)?;
                let kind = string_field(&body, "kind", true)?;
                if !INTEGRATION_KINDS.contains(&kind.as_str()) {
                    return Err(Response::error(400, format!("unknown kind {kind:?}")));
                }
                if self
                    .integrations
                    .values()
                    .any(|i| i.team_id == team && i.name == name)
                {
                    return Err(Response::error(409, format!("integration {name:?} exists")));
                }
                let id = self.id();
                self.next_key += 1;
                let digest = Sha256::digest(format!("{}:ingest:{}", self.base_url, self.next_key));
                let hex: String = digest.iter().take(12).map(|b| format!("{b:02x}")).collect();
                let integration = Integration {
                    id,
                    team_id: team,
                    name,
                    kind,
                    key: format!("{}{hex}", self.controls.key_prefix),
                };
                let out = self.integration_json(&integration, true);
                self.integrations.insert(id, integration);
                Ok(Response::json(201, out))
            }
            ("PATCH", ["integrations", iid]) => {
                let name = string_field(&body_json(req)?, "name", true)?;
                let iid = id_of(iid)?;
                if self
                    .integrations
                    .values()
                    .any(|i| i.team_id == team && i.name == name && i.id != iid)
                {
                    return Err(Response::error(409, format!("integration {name:?} exists")));
                }
                match self.integrations.get_mut(&iid) {
                    Some(i) if i.team_id == team => {
                        i.name = name;
                        let i = i.clone();
                        Ok(Response::json(200, self.integration_json(&i, false)))
                    }
                    _ => Err(not_found("integration")),
                }
            }
            ("DELETE", ["integrations", iid]) => {
                let iid = id_of(iid)?;
                match self.integrations.get(&iid) {
                    Some(i) if i.team_id == team => {
                        self.integrations.remove(&iid);
                        Ok(Response::empty(204))
                    }
                    _ => Err(not_found("integration")),
                }
            }
            _ => Err(not_found("route")),
        }
    }

    fn integration_json(&self, i: &Integration, with_key: bool) -> Value {
        let mut out = json!({"id": i.id, "team_id": i.team_id, "name": i.name, "kind": i.kind,
                             "url": format!("{}/api/ingest/{}", self.base_url, i.id)});
        if with_key {
            out["key"] = Value::String(i.key.clone());
        }
        out
    }

    /// The policy as stored: only known fields, user targets naming users
    /// that exist.
    fn check_policy(&self, body: &Value) -> std::result::Result<Value, Response> {
        let bad = |m: &str| Response::error(400, m.to_owned());
        let repeat = body["repeat_count"].as_u64().unwrap_or(0);
        let fallback = body["fallback_topic"].as_str().unwrap_or_default();
        let mut levels = Vec::new();
        for level in body["levels"].as_array().cloned().unwrap_or_default() {
            let timeout = level["timeout"]
                .as_str()
                .filter(|t| !t.is_empty())
                .ok_or_else(|| bad("every level needs a timeout"))?;
            let mut targets = Vec::new();
            for t in level["targets"].as_array().cloned().unwrap_or_default() {
                match t["kind"].as_str() {
                    Some("oncall") => targets.push(json!({"kind": "oncall"})),
                    Some("user") => {
                        let uid = t["user_id"]
                            .as_u64()
                            .ok_or_else(|| bad("a user target needs user_id"))?;
                        if !self.users.iter().any(|u| u.id == uid) {
                            return Err(bad(&format!("no user {uid}")));
                        }
                        targets.push(json!({"kind": "user", "user_id": uid}));
                    }
                    _ => return Err(bad("a target kind is oncall or user")),
                }
            }
            levels.push(json!({"timeout": timeout, "targets": targets}));
        }
        Ok(json!({"repeat_count": repeat, "fallback_topic": fallback, "levels": levels}))
    }
}

fn admin(caller: Caller) -> std::result::Result<(), Response> {
    if caller.is_admin() {
        Ok(())
    } else {
        Err(forbidden())
    }
}

/// The stand-in running on a loopback port; stops when dropped.
#[derive(Debug)]
pub struct StandIn {
    url: String,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
    ca_pem: Option<String>,
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl StandIn {
    /// Starts an empty install on `127.0.0.1:<free port>`, plain HTTP.
    ///
    /// # Errors
    /// When no loopback port can be bound.
    pub async fn start() -> Result<StandIn> {
        StandIn::listen(None).await
    }

    /// Starts an empty install serving HTTPS on `127.0.0.1:<free port>`,
    /// with a certificate for `127.0.0.1` and `localhost` issued by a CA
    /// made for this run ([`StandIn::ca_pem`]); nothing else trusts it.
    ///
    /// # Errors
    /// When no loopback port can be bound or the certificates cannot be
    /// made.
    pub async fn start_tls() -> Result<StandIn> {
        let (config, ca_pem) = tls_config()?;
        let mut standin = StandIn::listen(Some(Arc::new(config))).await?;
        standin.ca_pem = Some(ca_pem);
        Ok(standin)
    }

    async fn listen(tls: Option<Arc<rustls::ServerConfig>>) -> Result<StandIn> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let scheme = if tls.is_some() { "https" } else { "http" };
        let url = format!("{scheme}://{}", listener.local_addr()?);
        let state = Arc::new(Mutex::new(State::new(&url)));
        let shared = state.clone();
        let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let state = shared.clone();
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| serve(state.clone(), req));
                    let http = hyper::server::conn::http1::Builder::new();
                    let _ = match acceptor {
                        None => http.serve_connection(TokioIo::new(stream), service).await,
                        // A client that does not trust the CA ends here.
                        Some(acceptor) => match acceptor.accept(stream).await {
                            Ok(stream) => {
                                http.serve_connection(TokioIo::new(stream), service).await
                            }
                            Err(_) => return,
                        },
                    };
                });
            }
        });
        Ok(StandIn {
            url,
            state,
            task,
            ca_pem: None,
        })
    }

    /// The PEM of the CA that issued the certificate of a
    /// [`StandIn::start_tls`] stand-in; `None` for plain HTTP.
    pub fn ca_pem(&self) -> Option<&str> {
        self.ca_pem.as_deref()
    }

    /// `http://127.0.0.1:<port>` (`https://` for [`StandIn::start_tls`]).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Runs `f` on the state (to look, to change it behind the operator's
    /// back, to turn a knob).
    pub fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        f(&mut lock(&self.state))
    }

    /// The request log so far.
    pub fn log(&self) -> Vec<Logged> {
        lock(&self.state).log.clone()
    }
}

/// A server configuration with a loopback certificate from a fresh CA,
/// and that CA's PEM.
fn tls_config() -> Result<(rustls::ServerConfig, String)> {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "terdut stand-in test CA");
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;
    let leaf_key = KeyPair::generate()?;
    let leaf = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])?
        .signed_by(&leaf_key, &*ca)?;
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(vec![leaf.der().clone()], key)?;
    Ok((config, ca.pem()))
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The error a dropped connection ends with.
#[derive(Debug)]
struct Dropped;

impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the stand-in is down")
    }
}

impl std::error::Error for Dropped {}

async fn serve(
    state: Arc<Mutex<State>>,
    req: hyper::Request<Incoming>,
) -> std::result::Result<hyper::Response<Full<Bytes>>, Dropped> {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let request = Request {
        method: req.method().as_str().to_owned(),
        path: req
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned(),
        authorization: header("authorization"),
        idempotency_key: header("idempotency-key"),
        body: String::new(),
    };
    let body = req
        .into_body()
        .collect()
        .await
        .map_err(|_| Dropped)?
        .to_bytes();
    let request = Request {
        body: String::from_utf8_lossy(&body).into_owned(),
        ..request
    };
    let response = lock(&state).handle(&request);
    let held = |s: &State| {
        s.controls
            .hold_answers
            .iter()
            .any(|(method, prefix)| *method == request.method && request.path.starts_with(prefix))
    };
    // A held answer waits for its release (the test removes the entry);
    // polled, as the state is behind a plain mutex.
    while held(&lock(&state)) {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let status = response.status.ok_or(Dropped)?;
    let mut builder = hyper::Response::builder().status(status);
    if !response.body.is_empty() && response.body.starts_with(['{', '[']) {
        builder = builder.header("content-type", "application/json");
    }
    builder
        .body(Full::new(Bytes::from(response.body)))
        .map_err(|_| Dropped)
}

#[cfg(test)]
mod tests;
