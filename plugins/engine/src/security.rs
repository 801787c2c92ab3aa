//! What an engine takes from its instance's auth and engine TLS steps, and
//! how it renders them.
//!
//! # Auth
//!
//! When the instance's `spec.auth.enabled` is true, the engine waits for
//! `status.auth.authHash` (the instance publishes it once the Active key
//! is issued and the admin-password preflight passed). It then renders
//! `instance.auth` from the instance's `spec.auth` and
//! `status.auth.signingKeys` by the instance's rule — issued keys only,
//! the Active key first (engines sign with the first key), then the
//! validate-only keys, Removing keys left out — and mounts the Secrets:
//! the admin password as `password_file`, each key's `tls.key` as a
//! `signing_keys[].private_key_file`. No password or key is ever written
//! into the config. Every engine renders from the same instance object
//! with the same code, so every engine's `instance.auth` is byte-identical;
//! the generation carries `authHash` (annotation `firebolt.io/auth-hash`)
//! and the engine reports it as `status.observedAuthHash` once that
//! generation alone serves.
//!
//! # Engine TLS
//!
//! When `spec.tls.engine.enabled` is true the engine waits for
//! `status.engineTLS` (the instance's anchor is issued) and then rolls
//! onto TLS on the provisioned fact alone: each generation gets a
//! cert-manager Certificate `<e>-g<N>-engine-tls` from the instance's
//! issuer (SANs: the namespace wildcard and the generation's headless
//! wildcard), mounted at [`TLS_DIR`]; the query listener (3473) serves TLS
//! only. A generation is switched to only once its CA is in the
//! instance's `status.rolledEngineTrustCAs` — when the gateway
//! re-encrypts; before that the gateway speaks plaintext and the gate is
//! vacuous. The generation carries `status.engineTLS.tlsHash` (annotation
//! `firebolt.io/engine-tls-hash`), reported as
//! `status.observedEngineTLSHash` (empty: plaintext).
//!
//! While the instance's TLS is disabled but `status.engineTLS` is still
//! there (the instance is draining the fleet back to plaintext), engines
//! render plaintext.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

/// Where the admin password is mounted.
pub const ADMIN_DIR: &str = "/etc/firebolt/auth/admin";
/// Where signing keys are mounted (`<dir>/<kid>/tls.key`).
pub const KEYS_DIR: &str = "/etc/firebolt/auth/keys";
/// Where the generation's serving certificate is mounted.
pub const TLS_DIR: &str = "/etc/firebolt/tls";

/// One Secret volume of the engine pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretMount {
    /// Volume name.
    pub volume: String,
    /// Secret name.
    pub secret: String,
    /// (key, file name) pairs projected.
    pub items: Vec<(String, String)>,
    /// Mount directory.
    pub dir: String,
}

impl SecretMount {
    /// The pod volume.
    pub fn volume(&self) -> Value {
        let items: Vec<Value> = self
            .items
            .iter()
            .map(|(k, p)| json!({"key": k, "path": p}))
            .collect();
        json!({"name": self.volume, "secret": {"secretName": self.secret, "items": items}})
    }

    /// The container mount.
    pub fn mount(&self) -> Value {
        json!({"name": self.volume, "mountPath": self.dir, "readOnly": true})
    }
}

/// The auth an engine renders.
#[derive(Clone, Debug, PartialEq)]
pub struct AuthRender {
    /// `status.auth.authHash` of the instance.
    pub hash: String,
    /// The `instance.auth` fragment.
    pub config: Value,
    /// Secrets the fragment's files come from.
    pub mounts: Vec<SecretMount>,
}

/// Engine TLS as the instance provisions it.
#[derive(Clone, Debug, PartialEq)]
pub struct TlsRender {
    /// `status.engineTLS.tlsHash` of the instance.
    pub hash: String,
    /// `spec.tls.engine.certManager` of the instance (issuer, key).
    pub cert_manager: Value,
    /// The gateway re-encrypts (`status.engineTLS.reencrypting`).
    pub reencrypting: bool,
    /// `status.rolledEngineTrustCAs` of the instance.
    pub rolled_trust: Vec<String>,
    /// The instance's name (labels of the generation's TLS Secret).
    pub instance: String,
}

/// Why the engine must wait for its instance's security steps.
pub type Wait = String;

fn text<'a>(v: &'a Value, path: &str) -> &'a str {
    v.pointer(path).and_then(Value::as_str).unwrap_or_default()
}

/// The auth to render for `instance` (None: auth is off).
///
/// # Errors
///
/// Why the engine waits: auth is on but not provisioned yet.
pub fn auth(instance: &Value) -> Result<Option<AuthRender>, Wait> {
    let spec = &instance["spec"]["auth"];
    if spec["enabled"] != true {
        return Ok(None);
    }
    let hash = text(instance, "/status/auth/authHash");
    if hash.is_empty() {
        return Err(
            "authentication (spec.auth) is not provisioned yet (no status.auth.authHash)".into(),
        );
    }
    let local = &spec["local"];
    let password = &local["admin"]["password"];
    let mut mounts = vec![SecretMount {
        volume: "auth-admin".into(),
        secret: text(password, "/name").into(),
        items: vec![(text(password, "/key").into(), "password".into())],
        dir: ADMIN_DIR.into(),
    }];
    let keys = instance
        .pointer("/status/auth/signingKeys")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let issued = |k: &&Value| k["issued"] == true;
    let phase = |k: &Value| match text(k, "/phase") {
        "" => "Active".to_owned(),
        p => p.to_owned(),
    };
    let mut rendered: Vec<&Value> = keys
        .iter()
        .filter(issued)
        .filter(|k| phase(k) == "Active")
        .collect();
    rendered.extend(
        keys.iter()
            .filter(issued)
            .filter(|k| phase(k) == "ValidationOnly"),
    );
    let mut signing_keys = Vec::new();
    for k in rendered {
        let id = text(k, "/id");
        mounts.push(SecretMount {
            volume: format!("auth-{id}"),
            secret: text(k, "/secretName").into(),
            items: vec![("tls.key".into(), "tls.key".into())],
            dir: format!("{KEYS_DIR}/{id}"),
        });
        signing_keys
            .push(json!({"id": id, "private_key_file": format!("{KEYS_DIR}/{id}/tls.key")}));
    }
    let mut local_out = Map::new();
    local_out.insert(
        "password_login".into(),
        json!(non_empty(text(local, "/passwordLogin"), "admin_only")),
    );
    local_out.insert(
        "signing_algorithm".into(),
        json!(non_empty(text(local, "/signingAlgorithm"), "ES384")),
    );
    local_out.insert("signing_keys".into(), json!(signing_keys));
    for (from, to) in [
        ("tokenExpiry", "token_expiry"),
        ("maxTokenAge", "max_token_age"),
        ("clockSkewTolerance", "clock_skew_tolerance"),
    ] {
        if let Some(v) = local.get(from).filter(|v| !v.is_null()) {
            local_out.insert(to.into(), v.clone());
        }
    }
    let mut config = json!({
        "enabled": true,
        "admin": {
            "name": non_empty(text(local, "/admin/name"), "firebolt"),
            "password_file": format!("{ADMIN_DIR}/password"),
        },
        "local": local_out,
    });
    if let Some(oidc) = spec.get("oidc").filter(|v| !v.is_null()) {
        config["oidc"] = snake_keys(oidc);
    }
    if let Some(p) = spec
        .get("preferredAuthorizationServer")
        .and_then(Value::as_str)
        .filter(|p| !p.is_empty())
    {
        config["preferred_authorization_server"] = json!(p);
    }
    Ok(Some(AuthRender {
        hash: hash.to_owned(),
        config,
        mounts,
    }))
}

fn non_empty<'a>(v: &'a str, default: &'a str) -> &'a str {
    if v.is_empty() { default } else { v }
}

/// `camelCase` object keys to `snake_case`, recursively (values kept).
pub fn snake_keys(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| {
                    let mut out = String::new();
                    for c in k.chars() {
                        if c.is_ascii_uppercase() {
                            out.push('_');
                            out.push(c.to_ascii_lowercase());
                        } else {
                            out.push(c);
                        }
                    }
                    (out.replace("u_r_l", "url"), snake_keys(v))
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(snake_keys).collect()),
        other => other.clone(),
    }
}

/// Engine TLS for `instance` (None: render plaintext).
///
/// # Errors
///
/// Why the engine waits: TLS is on but the instance has not provisioned
/// it yet.
pub fn tls(instance: &Value) -> Result<Option<TlsRender>, Wait> {
    let enabled = instance.pointer("/spec/tls/engine/enabled") == Some(&json!(true));
    let status = instance
        .pointer("/status/engineTLS")
        .filter(|s| !s.is_null());
    match (enabled, status) {
        (false, _) => Ok(None),
        (true, None) => {
            Err("engine TLS (spec.tls.engine) is not provisioned yet (no status.engineTLS)".into())
        }
        (true, Some(s)) => Ok(Some(TlsRender {
            hash: text(s, "/tlsHash").into(),
            cert_manager: instance
                .pointer("/spec/tls/engine/certManager")
                .cloned()
                .unwrap_or(Value::Null),
            reencrypting: s["reencrypting"] == true,
            rolled_trust: instance
                .pointer("/status/rolledEngineTrustCAs")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default(),
            instance: String::new(),
        })),
    }
}

/// Whether a Secret holds non-empty values under `keys`.
pub fn issued(secret: &Value, keys: &[&str]) -> bool {
    keys.iter().all(|k| secret_bytes(secret, k).is_some())
}

fn secret_bytes(secret: &Value, key: &str) -> Option<Vec<u8>> {
    let t = secret.get("data")?.get(key)?.as_str()?;
    STANDARD.decode(t).ok().filter(|b| !b.is_empty())
}

/// SHA-256 fingerprint (hex, of the DER) of the first certificate in a
/// Secret's `key`.
pub fn cert_fingerprint(secret: &Value, key: &str) -> Option<String> {
    fingerprints(&secret_bytes(secret, key)?).into_iter().next()
}

/// SHA-256 fingerprints (hex, of the DER) of the certificates in a
/// Secret's `ca.crt`, as the instance lists them in
/// `status.rolledEngineTrustCAs`.
pub fn ca_fingerprints(secret: &Value) -> Vec<String> {
    let Some(pem) = secret_bytes(secret, "ca.crt") else {
        return Vec::new();
    };
    fingerprints(&pem)
}

/// SHA-256 fingerprints of the certificates in PEM text.
fn fingerprints(pem: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(pem);
    let mut out = Vec::new();
    for block in text.split("-----BEGIN CERTIFICATE-----").skip(1) {
        let Some(body) = block.split("-----END CERTIFICATE-----").next() else {
            continue;
        };
        let body: String = body.chars().filter(|c| !c.is_whitespace()).collect();
        if let Ok(der) = STANDARD.decode(body) {
            out.push(
                Sha256::digest(&der)
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect(),
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instance(status: Value) -> Value {
        json!({"spec": {"auth": {"enabled": true, "local": {
                  "admin": {"password": {"name": "admin", "key": "pw"}},
                  "tokenExpiry": "1h"},
                  "oidc": {"providers": [{"name": "okta", "discoveryURL": "https://x", "usernameMapping": "m"}]}}},
               "status": status})
    }

    #[test]
    fn auth_waits_for_the_hash_and_renders_files_only() {
        assert!(auth(&instance(json!({}))).unwrap_err().contains("authHash"));
        let r = auth(&instance(json!({"auth": {"authHash": "h", "signingKeys": [
            {"id": "signing-1", "secretName": "fb-auth-signing-1", "phase": "ValidationOnly",
             "demotedAt": "x", "issued": true},
            {"id": "signing-2", "secretName": "fb-auth-signing-2", "phase": "Active", "issued": true},
            {"id": "signing-3", "secretName": "fb-auth-signing-3", "phase": "ValidationOnly", "issued": false},
            {"id": "signing-0", "secretName": "fb-auth-signing-0", "phase": "Removing", "issued": true}]}})))
        .unwrap()
        .unwrap();
        assert_eq!(r.hash, "h");
        let ids: Vec<&str> = r.config["local"]["signing_keys"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k["id"].as_str().unwrap())
            .collect();
        assert_eq!(
            ids,
            ["signing-2", "signing-1"],
            "Active first; unissued and Removing left out"
        );
        assert_eq!(
            r.config["admin"]["password_file"],
            "/etc/firebolt/auth/admin/password"
        );
        assert_eq!(r.config["admin"]["name"], "firebolt");
        assert_eq!(r.config["local"]["token_expiry"], "1h");
        assert_eq!(
            r.config["oidc"]["providers"][0]["discovery_url"],
            "https://x"
        );
        assert_eq!(
            r.mounts[0].items,
            [("pw".to_owned(), "password".to_owned())]
        );
        assert_eq!(r.mounts[1].secret, "fb-auth-signing-2");
        assert_eq!(r.mounts.len(), 3);
        let off = json!({"spec": {"auth": {"enabled": false}}});
        assert_eq!(auth(&off).unwrap(), None);
    }

    #[test]
    fn tls_follows_the_provisioned_fact_and_disabling_renders_plaintext() {
        let on = json!({"spec": {"tls": {"engine": {"enabled": true}}}});
        assert!(tls(&on).is_err());
        let provisioned = json!({"spec": {"tls": {"engine": {"enabled": true,
                                  "certManager": {"issuerRef": {"name": "ca"}}}}},
                                 "status": {"engineTLS": {"tlsHash": "t", "reencrypting": true},
                                            "rolledEngineTrustCAs": ["ab"]}});
        let t = tls(&provisioned).unwrap().unwrap();
        assert_eq!((t.hash.as_str(), t.reencrypting), ("t", true));
        assert_eq!(t.rolled_trust, ["ab"]);
        let disabling = json!({"spec": {"tls": {"engine": {"enabled": false}}},
                               "status": {"engineTLS": {"tlsHash": "t", "reencrypting": true}}});
        assert_eq!(tls(&disabling).unwrap(), None);
    }

    #[test]
    fn ca_fingerprints_match_openssl() {
        let pem = include_str!("../../instance/src/testdata/ca-p384.crt");
        let s = json!({"data": {"ca.crt": STANDARD.encode(pem)}});
        assert_eq!(
            ca_fingerprints(&s),
            ["fad3cac8b473ff0c7974841c057f6102c25265e18638c58c3bf20f19e47c79f8"]
        );
        assert!(issued(&s, &["ca.crt"]) && !issued(&s, &["tls.key"]));
        assert_eq!(
            cert_fingerprint(&s, "ca.crt").as_deref(),
            Some("fad3cac8b473ff0c7974841c057f6102c25265e18638c58c3bf20f19e47c79f8")
        );
        assert_eq!(cert_fingerprint(&s, "tls.crt"), None);
    }
}
