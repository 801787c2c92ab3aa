//! The controller-side re-check of every rule upstream's admission webhook
//! enforces on `spec.auth` (`ValidateAuth`) and `spec.tls`
//! (`ValidateTLS`). The webhook is off by default upstream and wasmop has
//! none for this kind, so the plugin never leans on admission: a spec that
//! breaks a rule is reported on the step's own condition
//! (`AuthReady=False/AuthSpecInvalid`, `EngineTLSReady=False/TLSSpecInvalid`,
//! `GatewayTLSReady=False/TLSSpecInvalid`) with every problem named, and
//! the step writes nothing.
//!
//! The transition rules (a frozen signing algorithm and key size, a frozen
//! engine issuer while TLS stays enabled) are CEL rules of the CRD and hold
//! at the API server; they need the old object, which a level-triggered
//! reconcile does not have.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::duration;
use crate::spec::{AuthSpec, CertManagerSpec, TlsListener};

/// What packdb uses when `maxTokenAge` is unset (one day).
pub const DEFAULT_MAX_TOKEN_AGE_SECONDS: i64 = 24 * 3600;

/// JWT algorithms packdb signs with.
const SIGNING_ALGORITHMS: [&str; 6] = ["RS256", "RS384", "RS512", "ES256", "ES384", "ES512"];

/// The rules of `spec.auth`; every problem, one sentence each.
pub fn auth(spec: &AuthSpec) -> Vec<String> {
    let mut out = Vec::new();
    if !spec.enabled {
        if spec.local.is_some() || spec.oidc.as_ref().is_some_and(|o| !o.is_null()) {
            out.push(
                "spec.auth.local and spec.auth.oidc are set only while spec.auth.enabled is true"
                    .to_owned(),
            );
        }
        if spec
            .preferred_authorization_server
            .as_deref()
            .is_some_and(|p| !p.is_empty())
        {
            out.push(
                "spec.auth.preferredAuthorizationServer is set only while spec.auth.enabled is true"
                    .to_owned(),
            );
        }
        return out;
    }
    let Some(local) = spec.local.as_ref() else {
        out.push("spec.auth.local is required when spec.auth.enabled is true".to_owned());
        return out;
    };
    if local.admin.password.name.is_empty() || local.admin.password.key.is_empty() {
        out.push("spec.auth.local.admin.password must name a Secret and a key".to_owned());
    }
    if let Some(p) = local.password_login.as_deref().filter(|p| !p.is_empty())
        && !["admin_only", "any_user"].contains(&p)
    {
        out.push(format!(
            "spec.auth.local.passwordLogin {p:?} is neither admin_only nor any_user"
        ));
    }
    let algorithm = local.signing_algorithm();
    if !SIGNING_ALGORITHMS.contains(&algorithm) {
        out.push(format!(
            "spec.auth.local.signingAlgorithm {algorithm:?} is not one of {}",
            SIGNING_ALGORITHMS.join(", ")
        ));
    }
    for (field, value) in [
        ("tokenExpiry", &local.token_expiry),
        ("maxTokenAge", &local.max_token_age),
        ("clockSkewTolerance", &local.clock_skew_tolerance),
    ] {
        if let Some(v) = value.as_deref().filter(|v| !v.is_empty())
            && duration::seconds(v).is_none()
        {
            out.push(format!("spec.auth.local.{field} {v:?} is not a duration"));
        }
    }
    match local.signing_keys.as_ref() {
        None => out.push(
            "spec.auth.local.signingKeys is required: every engine must share one signing key"
                .to_owned(),
        ),
        Some(keys) => {
            let cm = &keys.cert_manager;
            cert_manager("spec.auth.local.signingKeys.certManager", cm, &mut out);
            let family = algorithm.get(..2).unwrap_or_default();
            let key = cm.algorithm();
            if (family == "RS" && key != "RSA") || (family == "ES" && key != "ECDSA") {
                out.push(format!(
                    "signingAlgorithm {algorithm} needs {} keys, not {key}",
                    if family == "RS" { "RSA" } else { "ECDSA" }
                ));
            } else if family == "ES" {
                // packdb derives the curve from the algorithm.
                let curve = match algorithm {
                    "ES256" => 256,
                    "ES384" => 384,
                    _ => 521,
                };
                if cm.size() != curve {
                    out.push(format!(
                        "signingAlgorithm {algorithm} signs with P-{curve} keys; \
                         spec.auth.local.signingKeys.certManager.size is {}",
                        cm.size()
                    ));
                }
            }
            let parse = |field: &str, text: &Option<String>, out: &mut Vec<String>| {
                let t = text.as_deref().filter(|t| !t.is_empty())?;
                let s = duration::seconds(t).filter(|s| *s > 0);
                if s.is_none() {
                    out.push(format!(
                        "spec.auth.local.signingKeys.{field} {t:?} is not a positive duration"
                    ));
                }
                s
            };
            let interval = parse("rotationInterval", &keys.rotation_interval, &mut out);
            let retain = parse("retainDuration", &keys.retain_duration, &mut out);
            let set = |t: &Option<String>| t.as_deref().is_some_and(|t| !t.is_empty());
            if set(&keys.rotation_interval) != set(&keys.retain_duration) {
                out.push(
                    "rotationInterval and retainDuration are set together or not at all".to_owned(),
                );
            }
            let max_token_age = local
                .max_token_age
                .as_deref()
                .and_then(duration::seconds)
                .unwrap_or(DEFAULT_MAX_TOKEN_AGE_SECONDS);
            if let (Some(_), Some(retain)) = (interval, retain)
                && retain < max_token_age
            {
                out.push(format!(
                    "retainDuration ({retain}s) is shorter than maxTokenAge ({max_token_age}s): \
                     a token signed just before demotion would outlive the key that validates it"
                ));
            }
        }
    }
    let providers = oidc_providers(spec.oidc.as_ref(), &mut out);
    if let Some(p) = spec
        .preferred_authorization_server
        .as_deref()
        .filter(|p| !p.is_empty())
        && p != "_local"
        && !providers.contains(p)
    {
        out.push(format!(
            "spec.auth.preferredAuthorizationServer {p:?} is neither _local nor an OIDC provider"
        ));
    }
    out
}

/// Checks `spec.auth.oidc`; returns the provider names.
fn oidc_providers(oidc: Option<&Value>, out: &mut Vec<String>) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let Some(oidc) = oidc.filter(|o| !o.is_null()) else {
        return names;
    };
    let providers = oidc
        .get("providers")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if providers.is_empty() {
        out.push("spec.auth.oidc.providers must list at least one provider".to_owned());
    }
    for (i, p) in providers.iter().enumerate() {
        let text = |k: &str| p.get(k).and_then(Value::as_str).unwrap_or_default();
        let name = text("name");
        if name.is_empty() || name.starts_with('_') {
            out.push(format!(
                "spec.auth.oidc.providers[{i}].name {name:?} is empty or starts with \"_\" (reserved)"
            ));
        } else if !names.insert(name.to_owned()) {
            out.push(format!(
                "spec.auth.oidc.providers[{i}].name {name:?} is used twice"
            ));
        }
        let url = text("discoveryURL");
        if !secure_url(url) {
            out.push(format!(
                "spec.auth.oidc.providers[{i}].discoveryURL {url:?} must be an https:// URL"
            ));
        }
    }
    names
}

/// `https://…`, or plain HTTP to loopback (packdb's own exception).
fn secure_url(url: &str) -> bool {
    if url.strip_prefix("https://").is_some_and(|r| !r.is_empty()) {
        return true;
    }
    let Some(rest) = url.strip_prefix("http://") else {
        return false;
    };
    let host = rest.split(['/', '?']).next().unwrap_or_default();
    let host = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => host.split(':').next().unwrap_or_default(),
    };
    matches!(host, "localhost" | "127.0.0.1" | "::1")
}

fn cert_manager(path: &str, cm: &CertManagerSpec, out: &mut Vec<String>) {
    if cm.issuer_ref.name.is_empty() {
        out.push(format!("{path}.issuerRef.name is empty"));
    }
    if !["Issuer", "ClusterIssuer"].contains(&cm.issuer_ref.kind()) {
        out.push(format!(
            "{path}.issuerRef.kind {:?} is neither Issuer nor ClusterIssuer",
            cm.issuer_ref.kind()
        ));
    }
    let sizes: &[i32] = match cm.algorithm() {
        "RSA" => &[2048, 4096, 8192],
        "ECDSA" => &[256, 384, 521],
        other => {
            out.push(format!(
                "{path}.algorithm {other:?} is neither RSA nor ECDSA"
            ));
            &[]
        }
    };
    if !sizes.is_empty() && !sizes.contains(&cm.size()) {
        out.push(format!(
            "{path}.size {} is not a {} key size ({})",
            cm.size(),
            cm.algorithm(),
            sizes
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let d = |field: &str, text: &Option<String>, out: &mut Vec<String>| {
        let t = text.as_deref().filter(|t| !t.is_empty())?;
        let s = duration::seconds(t).filter(|s| *s > 0);
        if s.is_none() {
            out.push(format!("{path}.{field} {t:?} is not a positive duration"));
        }
        s
    };
    let lifetime = d("duration", &cm.duration, out);
    let renew = d("renewBefore", &cm.renew_before, out);
    if let (Some(lifetime), Some(renew)) = (lifetime, renew)
        && renew >= lifetime
    {
        out.push(format!("{path}.renewBefore must be shorter than duration"));
    }
}

/// Which listener a [`TlsListener`] configures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListenerKind {
    /// `spec.tls.engine`.
    Engine,
    /// `spec.tls.gateway`.
    Gateway,
}

/// The rules of one `spec.tls` listener; every problem.
pub fn tls(kind: ListenerKind, spec: &TlsListener) -> Vec<String> {
    let path = match kind {
        ListenerKind::Engine => "spec.tls.engine",
        ListenerKind::Gateway => "spec.tls.gateway",
    };
    let mut out = Vec::new();
    if kind == ListenerKind::Engine && spec.client_ca().is_some() {
        out.push(format!(
            "{path}.clientCASecretRef is not supported: engines do not verify client certificates"
        ));
    }
    if !spec.enabled {
        return out;
    }
    let cm = spec.cert_manager.as_ref();
    match (cm, spec.user_secret()) {
        (Some(_), Some(_)) => out.push(format!(
            "{path}: set exactly one of certManager and secretRef, not both"
        )),
        (None, None) => out.push(format!(
            "{path}: set exactly one of certManager (issuerRef) and secretRef"
        )),
        (Some(cm), None) => cert_manager(&format!("{path}.certManager"), cm, &mut out),
        (None, Some(_)) => {}
    }
    if kind == ListenerKind::Gateway && spec.crl().is_some() && spec.client_ca().is_none() {
        out.push(format!(
            "{path}.crlSecretRef revokes client certificates and needs clientCASecretRef"
        ));
    }
    out
}

/// The problems as one message.
pub fn message(problems: &[String]) -> String {
    problems.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn auth_of(v: Value) -> Vec<String> {
        auth(&serde_json::from_value(v).unwrap())
    }

    fn good() -> Value {
        json!({"enabled": true, "local": {
            "admin": {"password": {"name": "a", "key": "p"}},
            "signingKeys": {"certManager": {"issuerRef": {"name": "ca"}}}}})
    }

    #[test]
    fn a_minimal_auth_spec_passes_and_each_rule_names_its_field() {
        assert_eq!(auth_of(good()), Vec::<String>::new());
        let mut v = good();
        v["local"]["signingAlgorithm"] = json!("RS256");
        assert!(auth_of(v.clone())[0].contains("needs RSA keys"));
        v["local"]["signingKeys"]["certManager"]["algorithm"] = json!("RSA");
        assert!(auth_of(v.clone())[0].contains("size 384 is not a RSA key size"));
        v["local"]["signingKeys"]["certManager"]["size"] = json!(2048);
        assert_eq!(auth_of(v), Vec::<String>::new());

        let mut v = good();
        v["local"]["signingAlgorithm"] = json!("ES256");
        assert!(auth_of(v)[0].contains("P-256"));

        let mut v = good();
        v["local"]["signingKeys"]["rotationInterval"] = json!("720h");
        assert!(auth_of(v.clone())[0].contains("together"));
        v["local"]["signingKeys"]["retainDuration"] = json!("1h");
        assert!(auth_of(v.clone())[0].contains("shorter than maxTokenAge"));
        v["local"]["maxTokenAge"] = json!("30m");
        assert_eq!(auth_of(v), Vec::<String>::new());

        let mut v = good();
        v["oidc"] = json!({"providers": [
            {"name": "_x", "discoveryURL": "http://idp.example"},
            {"name": "okta", "discoveryURL": "http://127.0.0.1:8080/.well-known"}]});
        v["preferredAuthorizationServer"] = json!("google");
        let p = auth_of(v);
        assert_eq!(p.len(), 3, "{p:?}");
        assert!(p[0].contains("reserved") && p[1].contains("https") && p[2].contains("google"));

        let off = auth_of(json!({"enabled": false, "preferredAuthorizationServer": "_local"}));
        assert!(off[0].contains("only while spec.auth.enabled"));
        assert!(auth_of(json!({"enabled": true}))[0].contains("local is required"));
    }

    #[test]
    fn upstreams_auth_and_tls_example_passes_every_rule() {
        let spec: crate::spec::InstanceSpec = serde_json::from_value(json!({
            "metadata": {}, "gateway": {"replicas": 2},
            "auth": {"enabled": true, "preferredAuthorizationServer": "okta",
                "local": {"passwordLogin": "admin_only",
                    "admin": {"name": "firebolt",
                              "password": {"name": "firebolt-admin-credentials", "key": "password"}},
                    "signingAlgorithm": "ES384",
                    "signingKeys": {"certManager": {"issuerRef": {"name": "internal-ca", "kind": "ClusterIssuer"},
                                                    "algorithm": "ECDSA", "size": 384},
                                    "rotationInterval": "720h", "retainDuration": "24h"}},
                "oidc": {"providers": [{"name": "okta", "title": "Okta",
                    "discoveryURL": "https://company.okta.com/oauth2/default/.well-known/openid-configuration",
                    "usernameMapping": "{{ iss }}|{{ sub }}",
                    "jitProvisioning": {"enabled": true, "defaultRoles": ["public"]}}]}},
            "tls": {"engine": {"enabled": true,
                               "certManager": {"issuerRef": {"name": "internal-ca", "kind": "ClusterIssuer"}}},
                    "gateway": {"enabled": true,
                                "certManager": {"issuerRef": {"name": "internal-ca", "kind": "ClusterIssuer"}},
                                "dnsNames": ["firebolt.example.com"]}},
        }))
        .unwrap();
        assert_eq!(auth(&spec.auth), Vec::<String>::new());
        assert_eq!(
            tls(ListenerKind::Engine, &spec.tls.engine),
            Vec::<String>::new()
        );
        assert_eq!(
            tls(ListenerKind::Gateway, &spec.tls.gateway),
            Vec::<String>::new()
        );
    }

    #[test]
    fn tls_listeners_take_exactly_one_source_and_crls_need_a_client_ca() {
        let l = |v: Value| -> TlsListener { serde_json::from_value(v).unwrap() };
        let cm = json!({"issuerRef": {"name": "ca"}});
        assert!(
            tls(
                ListenerKind::Engine,
                &l(json!({"enabled": true, "certManager": cm}))
            )
            .is_empty()
        );
        assert!(tls(ListenerKind::Engine, &l(json!({"enabled": true})))[0].contains("exactly one"));
        assert!(
            tls(
                ListenerKind::Gateway,
                &l(json!({"enabled": true, "certManager": cm, "secretRef": {"name": "s"}}))
            )[0]
            .contains("not both")
        );
        assert!(
            tls(
                ListenerKind::Engine,
                &l(json!({"enabled": false, "clientCASecretRef": {"name": "c"}}))
            )[0]
            .contains("not supported")
        );
        let crl = l(json!({"enabled": true, "certManager": cm, "crlSecretRef": {"name": "r"}}));
        assert!(tls(ListenerKind::Gateway, &crl)[0].contains("needs clientCASecretRef"));
        assert!(tls(ListenerKind::Engine, &crl).is_empty());
        let bad = l(
            json!({"enabled": true, "certManager": {"issuerRef": {"name": "ca"},
                          "duration": "1h", "renewBefore": "2h", "size": 300}}),
        );
        let p = tls(ListenerKind::Gateway, &bad);
        assert_eq!(p.len(), 2, "{p:?}");
    }
}
