//! Step `auth` (condition `AuthReady`, `status.auth`): what every engine
//! of the instance needs to authenticate connections, from one source.
//!
//! - **Admin-password preflight.** The user's Secret
//!   (`spec.auth.local.admin.password`) must exist and hold its key. The
//!   operator never generates an admin password. Failing it is reported as
//!   `AuthReady=False/AdminPasswordSecretPreflightFailed`; the other steps
//!   are not affected, and engines wait (no `authHash` is published).
//! - **Signing keys.** Each key is a cert-manager Certificate
//!   `<i>-auth-signing-<N>` (kid `signing-<N>`, `rotationPolicy: Never`)
//!   issued into a Secret of the same name, driven by the rotation state
//!   machine ([`crate::rotation`], one step per reconcile).
//! - **One render for every engine.** Engines render
//!   `instance.auth.admin.password_file` and
//!   `instance.auth.local.signing_keys[]` (file paths of the mounted
//!   Secrets, never their content) from `spec.auth` and
//!   `status.auth.signingKeys` by one rule: issued keys only, the Active
//!   key first, then the validate-only keys, Removing keys left out.
//!   `status.auth.authHash` is the hash of exactly those inputs; an engine
//!   reports it as `observedAuthHash` once it serves that render.
//! - **Parked rotations are reported**: `pendingRotationStep`,
//!   `pendingSince`, `laggingEngines` (at most
//!   [`fleet::MAX_LAGGING_REPORTED`]), `laggingEngineCount`, and
//!   `AuthReady=True/RotationWaitingForEngines`.
//!
//! `AuthReady` is not part of `Ready`.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Map, Value, json};
use wasmop_sdk::{EventType, Plan, stable_hash};

use crate::certs::{self, Usage};
use crate::duration;
use crate::fleet::{self, Engine};
use crate::names::Component;
use crate::rotation::{self, Anchor, Key, KeyPhase, Policy, Ring};
use crate::spec::{AuthSpec, CertManagerSpec};
use crate::step::{Context, Failure, Health, Outcome};

/// Id of the read bringing the admin password Secret.
pub const ADMIN_PASSWORD_READ: &str = "admin-password";
/// Field of the primary naming that Secret.
pub const ADMIN_PASSWORD_FIELD: &str = "spec.auth.local.admin.password.name";

/// How soon an instance whose rotation waits on cert-manager or on engines
/// is reconciled again, whatever events arrive meanwhile.
pub const ROTATION_RECHECK: Duration = Duration::from_secs(30);

/// What the auth step decided.
#[derive(Clone, Debug, PartialEq)]
pub struct AuthEval {
    /// The step's answer.
    pub result: Result<Outcome, Failure>,
    /// `status.auth` (None: auth is off).
    pub status: Option<Value>,
    /// Events to record.
    pub events: Vec<(EventType, String, String)>,
    /// When to look again: the next time-gated rotation step.
    pub requeue: Option<Duration>,
}

/// The hash engines report once they serve the render of `ring` under
/// `spec`.
pub fn auth_hash(spec: &AuthSpec, ring: &Ring) -> String {
    let keys: Vec<Value> = ring
        .rendered()
        .iter()
        .map(|k| json!([k.id, k.secret_name]))
        .collect();
    stable_hash(&json!({"auth": spec, "signingKeys": keys}))
}

/// Runs the step.
pub fn evaluate(ctx: &Context<'_>, engines: &[Engine], anchor: Anchor) -> AuthEval {
    let spec = &ctx.spec.auth;
    let problems = crate::validate::auth(spec);
    if !spec.enabled {
        if !problems.is_empty() {
            return AuthEval {
                result: Err(Failure::new(
                    "AuthSpecInvalid",
                    crate::validate::message(&problems),
                )),
                status: None,
                events: Vec::new(),
                requeue: None,
            };
        }
        return AuthEval {
            result: Ok(Outcome {
                objects: Vec::new(),
                health: Health::ready("Disabled", "authentication (spec.auth) is disabled"),
            }),
            status: None,
            events: Vec::new(),
            requeue: None,
        };
    }
    let previous = ctx.snapshot.primary.pointer("/status/auth");
    let failed = |failure: Failure| AuthEval {
        result: Err(failure),
        // Keep the keys (a rotation in flight must not forget them), but
        // withdraw the hash: engines wait until auth is healthy again.
        status: previous.cloned().map(|mut p| {
            if let Some(m) = p.as_object_mut() {
                m.remove("authHash");
            }
            p
        }),
        events: Vec::new(),
        requeue: None,
    };
    if !problems.is_empty() {
        return failed(Failure::new(
            "AuthSpecInvalid",
            crate::validate::message(&problems),
        ));
    }
    let policy = match policy(spec, anchor) {
        Ok(p) => p,
        Err(why) => return failed(Failure::new("AuthSpecInvalid", why)),
    };
    let Some(local) = spec.local.as_ref() else {
        return failed(Failure::new(
            "AuthSpecInvalid",
            "spec.auth.local is required",
        ));
    };
    if let Err(why) = preflight(ctx, &local.admin.password.name, &local.admin.password.key) {
        return failed(Failure::new("AdminPasswordSecretPreflightFailed", why));
    }
    let cm = local
        .signing_keys
        .as_ref()
        .map(|k| k.cert_manager.clone())
        .unwrap_or_default();

    let (mut ring, recorded) = ring_from_status(previous, ctx.now_seconds(), &cm);
    // Keys the status does not know but the instance owns (a restore
    // without status, a stale status): the ring is rebuilt from them, or
    // parked, and no key is deleted.
    let found = owned_keys(ctx);
    let mut rebuilt = false;
    if found.keys().any(|n| *n > ring.generation) {
        match rebuild(spec, &found, engines, ctx.now_seconds()) {
            Ok(r) => {
                ring = r;
                rebuilt = true;
            }
            Err(why) => return failed(Failure::new("SigningKeyRingLost", why)),
        }
    }
    ring.observe_issued(|k| {
        ctx.owned_secret_with(&k.secret_name, &certs::SERVING_KEYS)
            .is_some()
    });
    // The identity of each key's material: a kid whose public key changed
    // was re-keyed behind the operator's back (it only ever rotates by
    // minting a new kid), and tokens its old key signed no longer validate.
    let mut fingerprints: BTreeMap<String, String> = BTreeMap::new();
    let mut events = Vec::new();
    for k in &ring.keys {
        let seen = ctx
            .owned_secret_with(&k.secret_name, &certs::SERVING_KEYS)
            .and_then(|s| crate::pem::secret_bytes(s, "tls.crt"))
            .and_then(|crt| crate::pem::public_key_fingerprint(&crt));
        let was = recorded
            .get(&k.id)
            .and_then(|r| r.get("observedPublicKeyFingerprint"))
            .and_then(Value::as_str)
            .filter(|f| !f.is_empty());
        match (seen, was) {
            (Some(now), Some(was)) if now != was => {
                events.push((
                    EventType::Warning,
                    "SigningKeyReplaced".to_owned(),
                    format!(
                        "the key material of {} (Secret {}) changed under the same kid \
                         (public key {was} -> {now}); tokens signed with the old key no longer validate",
                        k.id, k.secret_name
                    ),
                ));
                fingerprints.insert(k.id.clone(), now);
            }
            (Some(now), _) => {
                fingerprints.insert(k.id.clone(), now);
            }
            (None, Some(was)) => {
                fingerprints.insert(k.id.clone(), was.to_owned());
            }
            (None, None) => {}
        }
    }
    let lagging = |r: &Ring| {
        let want = auth_hash(spec, r);
        fleet::lagging(engines, |e| e.auth_hash != want)
    };
    let names = ctx.names;
    let namer = |n: u64| (format!("signing-{n}"), names.auth_signing(n));
    let now = ctx.now_seconds();
    let advance = if rebuilt {
        // The pass that rebuilds only records the ring: no rotation step.
        events.push((
            EventType::Warning,
            "SigningKeyRingRebuilt".to_owned(),
            format!(
                "status.auth did not list the signing keys the instance owns; rebuilt the ring from them: {}",
                describe(&ring)
            ),
        ));
        rotation::Advance {
            ring: ring.clone(),
            step: None,
            pending: None,
            awaiting_issuer: false,
        }
    } else {
        rotation::step(&ring, &policy, now, &lagging, &namer)
    };
    let ring = advance.ring;

    if let Some(step) = advance.step {
        events.push((
            EventType::Normal,
            "SigningKeyRotation".to_owned(),
            format!("{step}; signing keys now {}", describe(&ring)),
        ));
    }

    let labels = names.labels(Component::AuthSigning);
    let mut objects = Vec::new();
    for k in &ring.keys {
        // Each key keeps the parameters it was minted with: cert-manager
        // does not re-key a `rotationPolicy: Never` Certificate, so asking
        // it to would wedge it; a change of parameters mints a new key.
        let (algorithm, size) = key_params(recorded.get(&k.id), &cm);
        let key_cm = CertManagerSpec {
            algorithm: Some(algorithm),
            size: Some(size),
            ..cm.clone()
        };
        objects.extend(certs::certificate(
            &k.secret_name,
            names.namespace(),
            &labels,
            &key_cm,
            &Usage::Signing {
                common_name: format!("{} {}", names.instance(), k.id),
            },
        ));
    }

    let mut status = Map::new();
    status.insert("signingKeyGeneration".into(), json!(ring.generation));
    let keys: Vec<Value> = ring
        .keys
        .iter()
        .map(|k| key_status(k, recorded.get(&k.id), &cm, fingerprints.get(&k.id)))
        .collect();
    status.insert("signingKeys".into(), json!(keys));
    let provisioned = ring.active().is_some_and(|k| k.issued);
    if provisioned {
        status.insert("authHash".into(), json!(auth_hash(spec, &ring)));
    }
    if let Some((pending, lagging)) = &advance.pending {
        let was = previous
            .and_then(|p| p.get("pendingRotationStep"))
            .and_then(Value::as_str);
        let since = previous
            .and_then(|p| p.get("pendingSince"))
            .filter(|_| was == Some(pending.as_str()))
            .cloned()
            .unwrap_or_else(|| json!(duration::rfc3339(now)));
        status.insert("pendingRotationStep".into(), json!(pending.as_str()));
        status.insert("pendingSince".into(), since);
        status.insert(
            "laggingEngines".into(),
            json!(
                lagging
                    .iter()
                    .take(fleet::MAX_LAGGING_REPORTED)
                    .collect::<Vec<_>>()
            ),
        );
        status.insert("laggingEngineCount".into(), json!(lagging.len()));
    }

    let health = if !provisioned {
        // The Certificates are written (the key needs one to be issued);
        // engines wait for authHash.
        Health::waiting(
            "SigningKeyPending",
            format!(
                "waiting for cert-manager to issue Secret {}",
                ring.active().map_or("", |k| k.secret_name.as_str())
            ),
        )
    } else if let Some((pending, lagging)) = &advance.pending {
        Health::ready(
            "RotationWaitingForEngines",
            format!(
                "{} waits for {} engine(s) to render the current signing keys: {}",
                pending.as_str(),
                lagging.len(),
                lagging
                    .iter()
                    .take(fleet::MAX_LAGGING_REPORTED)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )
    } else if advance.awaiting_issuer {
        Health::ready(
            "RotationWaitingForIssuer",
            "the new signing key waits for cert-manager to issue it; the Active key signs",
        )
    } else {
        Health::ready("Provisioned", format!("signing keys {}", describe(&ring)))
    };
    let due = rotation::next_due(&ring, &policy)
        .map(|due| Duration::from_secs(u64::try_from(due.saturating_sub(now)).unwrap_or(0).max(1)));
    // A key waiting for its issuer, or a step waiting for engines, moves on
    // an event (the Secret filled, an engine's status); a missed event must
    // not park the rotation for good, so the instance is looked at again.
    let waiting = ring.keys.iter().any(|k| !k.issued) || advance.pending.is_some();
    let requeue = match (due, waiting) {
        (Some(d), true) => Some(d.min(ROTATION_RECHECK)),
        (None, true) => Some(ROTATION_RECHECK),
        (due, false) => due,
    };
    AuthEval {
        result: Ok(Outcome { objects, health }),
        status: Some(Value::Object(status)),
        events,
        requeue,
    }
}

fn describe(ring: &Ring) -> String {
    ring.keys
        .iter()
        .map(|k| format!("{} ({})", k.id, k.phase.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The rotation policy of the spec.
///
/// # Errors
///
/// Why the spec cannot be used.
pub fn policy(spec: &AuthSpec, anchor: Anchor) -> Result<Policy, String> {
    let Some(local) = spec.local.as_ref() else {
        return Err("spec.auth.local is required when spec.auth.enabled is true".to_owned());
    };
    let Some(keys) = local.signing_keys.as_ref() else {
        return Err(
            "spec.auth.local.signingKeys is required: every engine must share one signing key"
                .to_owned(),
        );
    };
    if keys.cert_manager.issuer_ref.name.is_empty() {
        return Err("spec.auth.local.signingKeys.certManager.issuerRef.name is empty".to_owned());
    }
    let family = &local.signing_algorithm()[..2];
    let algorithm = keys.cert_manager.algorithm();
    if (family == "RS" && algorithm != "RSA") || (family == "ES" && algorithm != "ECDSA") {
        return Err(format!(
            "signingAlgorithm {} does not fit a {algorithm} key",
            local.signing_algorithm()
        ));
    }
    let parse = |field: &str, text: &Option<String>| match text.as_deref().filter(|t| !t.is_empty())
    {
        None => Ok(None),
        Some(t) => duration::seconds(t)
            .filter(|s| *s > 0)
            .map(Some)
            .ok_or_else(|| {
                format!("spec.auth.local.signingKeys.{field} {t:?} is not a positive duration")
            }),
    };
    let interval = parse("rotationInterval", &keys.rotation_interval)?;
    let retain = parse("retainDuration", &keys.retain_duration)?;
    if interval.is_some() != retain.is_some() {
        return Err(
            "rotationInterval and retainDuration are set together or not at all".to_owned(),
        );
    }
    // Without a rotation schedule a key is still replaced when its
    // parameters change; its predecessor is then kept as long as a token
    // it signed may be accepted.
    let max_token_age = local
        .max_token_age
        .as_deref()
        .and_then(duration::seconds)
        .unwrap_or(crate::validate::DEFAULT_MAX_TOKEN_AGE_SECONDS);
    Ok(Policy {
        interval,
        retain: retain.unwrap_or(max_token_age),
        anchor,
    })
}

fn preflight(ctx: &Context<'_>, name: &str, key: &str) -> Result<(), String> {
    if name.is_empty() || key.is_empty() {
        return Err("spec.auth.local.admin.password names no Secret key".to_owned());
    }
    let secret = ctx.snapshot.related(ADMIN_PASSWORD_READ).next();
    let Some(secret) = secret else {
        return Err(format!(
            "Secret {name:?} named by spec.auth.local.admin.password does not exist; \
             the operator never generates an admin password"
        ));
    };
    if crate::pem::secret_bytes(secret, key).is_none() {
        return Err(format!("Secret {name:?} has no non-empty key {key:?}"));
    }
    Ok(())
}

/// A signing key the instance owns (its Certificate or Secret
/// `<i>-auth-signing-<N>`), by `N`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct FoundKey {
    secret_name: String,
    issued: bool,
    created_at: Option<i64>,
}

/// The signing keys among the instance's owned objects.
fn owned_keys(ctx: &Context<'_>) -> BTreeMap<u64, FoundKey> {
    let prefix = format!("{}-auth-signing-", ctx.names.instance());
    let mut found: BTreeMap<u64, FoundKey> = BTreeMap::new();
    for o in &ctx.snapshot.owned {
        let kind = o["kind"].as_str().unwrap_or_default();
        if kind != "Secret" && kind != "Certificate" {
            continue;
        }
        if o.pointer("/metadata/labels")
            .and_then(|l| l.get(crate::names::COMPONENT_LABEL))
            .and_then(Value::as_str)
            != Some(Component::AuthSigning.label())
        {
            continue;
        }
        let name = o["metadata"]["name"].as_str().unwrap_or_default();
        let Some(n) = name
            .strip_prefix(&prefix)
            .and_then(|n| n.parse::<u64>().ok())
            .filter(|n| *n > 0)
        else {
            continue;
        };
        let created = o["metadata"]["creationTimestamp"]
            .as_str()
            .and_then(duration::parse_rfc3339);
        let entry = found.entry(n).or_insert_with(|| FoundKey {
            secret_name: name.to_owned(),
            issued: false,
            created_at: created,
        });
        entry.created_at = match (entry.created_at, created) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if kind == "Secret" {
            entry.issued = ctx.owned_secret_with(name, &certs::SERVING_KEYS).is_some();
        }
    }
    found
}

/// Most issued keys a rebuild considers (it tries every render of them).
const MAX_REBUILT_KEYS: usize = 8;

/// The ring rebuilt from the keys the instance owns, when the status lost
/// it. What each key did is not recorded anywhere else, so the render the
/// engines run decides: with no engine, nothing signs, and the newest
/// issued key becomes Active; otherwise the one render (Active key and
/// validate-only keys, among the issued ones) whose hash every engine
/// reports is taken, every other key kept (newer: validate-only, older:
/// Removing, gated as usual). Without such a render the rotation parks.
///
/// # Errors
///
/// Why it parks.
fn rebuild(
    spec: &AuthSpec,
    found: &BTreeMap<u64, FoundKey>,
    engines: &[Engine],
    now: i64,
) -> Result<Ring, String> {
    let key = |n: u64, f: &FoundKey, phase: KeyPhase, active: u64| Key {
        id: format!("signing-{n}"),
        secret_name: f.secret_name.clone(),
        created_at: f.created_at.unwrap_or(now),
        phase,
        demoted_at: (phase != KeyPhase::Active && n < active).then_some(now),
        retire_eligible_at: None,
        issued: f.issued,
        outdated: false,
    };
    let generation = found.keys().copied().max().unwrap_or(0);
    let issued: Vec<u64> = found
        .iter()
        .filter(|(_, f)| f.issued)
        .map(|(n, _)| *n)
        .collect();
    let ring_of = |active: u64, rendered: &[u64]| Ring {
        generation,
        keys: found
            .iter()
            .map(|(n, f)| {
                let phase = if *n == active {
                    KeyPhase::Active
                } else if rendered.contains(n) || *n > active {
                    KeyPhase::ValidationOnly
                } else {
                    KeyPhase::Removing
                };
                key(*n, f, phase, active)
            })
            .collect(),
    };
    if engines.is_empty() {
        let active = issued
            .last()
            .or_else(|| found.keys().last())
            .copied()
            .unwrap_or(generation);
        let all: Vec<u64> = found.keys().copied().collect();
        return Ok(ring_of(active, &all));
    }
    let names = found
        .values()
        .map(|f| f.secret_name.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    let hashes: std::collections::BTreeSet<&str> =
        engines.iter().map(|e| e.auth_hash.as_str()).collect();
    let reported = match hashes.iter().next() {
        Some(h) if hashes.len() == 1 && !h.is_empty() => *h,
        _ => {
            return Err(format!(
                "status.auth lost the signing-key ring and the engines do not all report one render                  (observedAuthHash); keeping every key ({names}) and waiting for them to agree"
            ));
        }
    };
    if issued.len() > MAX_REBUILT_KEYS {
        return Err(format!(
            "status.auth lost the signing-key ring and {} issued keys are too many to rebuild it from;              keeping every key ({names})",
            issued.len()
        ));
    }
    for &active in &issued {
        let others: Vec<u64> = issued.iter().copied().filter(|n| *n != active).collect();
        for mask in 0u32..(1 << others.len()) {
            let rendered: Vec<u64> = others
                .iter()
                .enumerate()
                .filter(|(i, _)| (mask >> *i) & 1 == 1)
                .map(|(_, n)| *n)
                .collect();
            let candidate = Ring {
                generation,
                keys: found
                    .iter()
                    .filter(|(n, _)| **n == active || rendered.contains(n))
                    .map(|(n, f)| {
                        let phase = if *n == active {
                            KeyPhase::Active
                        } else {
                            KeyPhase::ValidationOnly
                        };
                        key(*n, f, phase, active)
                    })
                    .collect(),
            };
            if auth_hash(spec, &candidate) == reported {
                return Ok(ring_of(active, &rendered));
            }
        }
    }
    Err(format!(
        "status.auth lost the signing-key ring and no render of the keys the instance owns          matches what the engines report; keeping every key ({names})"
    ))
}

/// The ring recorded in `status.auth`, and the recorded entries by kid.
fn ring_from_status(
    previous: Option<&Value>,
    now: i64,
    cm: &CertManagerSpec,
) -> (Ring, BTreeMap<String, Value>) {
    let mut ring = Ring {
        generation: previous
            .and_then(|p| p.get("signingKeyGeneration"))
            .and_then(Value::as_u64)
            .unwrap_or(0),
        keys: Vec::new(),
    };
    let mut recorded = BTreeMap::new();
    let entries = previous
        .and_then(|p| p.get("signingKeys"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for e in entries {
        let text = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or_default();
        let time = |k: &str| duration::parse_rfc3339(text(k));
        let id = text("id").to_owned();
        let Some(phase) = KeyPhase::parse(text("phase")) else {
            continue;
        };
        if id.is_empty() || text("secretName").is_empty() {
            continue;
        }
        ring.keys.push(Key {
            id: id.clone(),
            secret_name: text("secretName").to_owned(),
            created_at: time("createdAt").unwrap_or(now),
            phase,
            demoted_at: time("demotedAt"),
            retire_eligible_at: time("retireEligibleAt"),
            issued: e.get("issued").and_then(Value::as_bool).unwrap_or(false),
            outdated: key_params(Some(&e), cm) != (cm.algorithm().to_owned(), cm.size()),
        });
        recorded.insert(id, e);
    }
    (ring, recorded)
}

/// The algorithm and size key `recorded` was minted with; a key recorded
/// without them (or not recorded yet) takes the spec's.
fn key_params(recorded: Option<&Value>, cm: &CertManagerSpec) -> (String, i32) {
    let algorithm = recorded
        .and_then(|r| r.get("algorithm"))
        .and_then(Value::as_str)
        .filter(|a| !a.is_empty())
        .unwrap_or(cm.algorithm())
        .to_owned();
    let size = recorded
        .and_then(|r| r.get("size"))
        .and_then(Value::as_i64)
        .and_then(|s| i32::try_from(s).ok())
        .filter(|s| *s > 0)
        .unwrap_or(cm.size());
    (algorithm, size)
}

fn key_status(
    k: &Key,
    recorded: Option<&Value>,
    cm: &CertManagerSpec,
    fingerprint: Option<&String>,
) -> Value {
    let (algorithm, size) = key_params(recorded, cm);
    let mut v = json!({
        "id": k.id,
        "secretName": k.secret_name,
        "createdAt": duration::rfc3339(k.created_at),
        "phase": k.phase.as_str(),
        "issued": k.issued,
        "algorithm": algorithm,
        "size": size,
    });
    if let Some(f) = fingerprint {
        v["observedPublicKeyFingerprint"] = json!(f);
    }
    if let Some(t) = k.demoted_at {
        v["demotedAt"] = json!(duration::rfc3339(t));
    }
    if let Some(t) = k.retire_eligible_at {
        v["retireEligibleAt"] = json!(duration::rfc3339(t));
    }
    v
}

/// Prefix of the signing-key rotation gauges.
pub const ROTATION_METRIC: &str = "firebolt_instance_signing_key_rotation";

/// The signing-key rotation state of `status.auth` as gauges, the same
/// facts for alerting (see the plugin README's Monitoring section):
/// `_pending` (1 while a step waits on engines, labelled with the step),
/// `_pending_since_timestamp_seconds` (Unix time the step began waiting, 0
/// when none waits), `_lagging_engines`,
/// `_generation` and `_keys`. Nothing when auth has no status (disabled).
pub fn rotation_gauges(plan: Plan, auth: Option<&Value>, now_seconds: i64) -> Plan {
    let Some(auth) = auth.filter(|a| a.is_object()) else {
        return plan;
    };
    let metric = |suffix: &str| format!("{ROTATION_METRIC}_{suffix}");
    let step = auth["pendingRotationStep"].as_str();
    // A timestamp, not an age: the gauge is as fresh as the last plan, and
    // `time() - since` keeps counting between reconciles.
    let since = auth["pendingSince"]
        .as_str()
        .and_then(duration::parse_rfc3339)
        .filter(|_| step.is_some())
        .map_or(0, |since| since.min(now_seconds));
    let lagging = auth["laggingEngineCount"].as_u64().unwrap_or(0);
    let keys = auth["signingKeys"].as_array().map_or(0, Vec::len);
    let generation = auth["signingKeyGeneration"].as_u64().unwrap_or(0);
    let pending = match step {
        Some(step) => plan.gauge(&metric("pending"), &[("step", step)], 1.0),
        None => plan.gauge(&metric("pending"), &[], 0.0),
    };
    pending
        .gauge(
            &metric("pending_since_timestamp_seconds"),
            &[],
            since as f64,
        )
        .gauge(&metric("lagging_engines"), &[], lagging as f64)
        .gauge(&metric("generation"), &[], generation as f64)
        .gauge(&metric("keys"), &[], keys as f64)
}
