//! cert-manager Certificates (`cert-manager.io/v1`) and the Secrets they
//! are issued into.
//!
//! The plugin creates each Certificate's Secret itself, empty
//! (`kubernetes.io/tls` with empty `tls.crt`/`tls.key`), before
//! cert-manager issues into it. That makes the Secret the instance's own
//! object: it is in the snapshot (so the plugin sees when it is issued),
//! it is deleted with the Certificate, and it is garbage-collected with
//! the instance. The Secret is create-only: the plugin never rewrites what
//! the issuer wrote.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::spec::CertManagerSpec;
use crate::step::Desired;

/// API version of cert-manager's Certificate.
pub const API_VERSION: &str = "cert-manager.io/v1";
/// Kind of cert-manager's Certificate.
pub const KIND: &str = "Certificate";
/// Keys a serving certificate's Secret holds once issued.
pub const SERVING_KEYS: [&str; 2] = ["tls.crt", "tls.key"];
/// Lifetime of a serving certificate (engine TLS anchor, gateway) unless
/// `certManager.duration` says otherwise: 90 days, renewed by cert-manager
/// a third before it ends.
pub const DEFAULT_SERVING_DURATION: &str = "2160h";
/// Lifetime of a JWT signing keypair's certificate unless
/// `certManager.duration` says otherwise: one year (the key itself is
/// replaced by rotation, `rotationPolicy: Never`).
pub const DEFAULT_SIGNING_DURATION: &str = "8760h";

/// The Certificate kind, for the manifest.
pub fn kind_ref() -> wasmop_sdk::KindRef {
    wasmop_sdk::KindRef::namespaced("cert-manager.io", "v1", KIND, "certificates")
}

/// What a Certificate is for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Usage {
    /// A JWT signing keypair: the certificate is never presented, the key
    /// is never regenerated under the same name (`rotationPolicy: Never`;
    /// the operator rotates by minting new names).
    Signing {
        /// Common name (cert-manager needs a subject).
        common_name: String,
    },
    /// A TLS server certificate, re-keyed on every renewal
    /// (`rotationPolicy: Always`).
    Server {
        /// Subject alternative names.
        dns_names: Vec<String>,
    },
}

/// The Certificate `name` issuing into the Secret `name`, and that Secret
/// (created empty), both labelled `labels`.
pub fn certificate(
    name: &str,
    namespace: &str,
    labels: &BTreeMap<String, String>,
    cm: &CertManagerSpec,
    usage: &Usage,
) -> [Desired; 2] {
    let rotation_policy = match usage {
        Usage::Signing { .. } => "Never",
        Usage::Server { .. } => "Always",
    };
    let mut spec = json!({
        "secretName": name,
        "issuerRef": {
            "name": cm.issuer_ref.name,
            "kind": cm.issuer_ref.kind(),
            "group": "cert-manager.io",
        },
        "privateKey": {
            "algorithm": cm.algorithm(),
            "size": cm.size(),
            "encoding": "PKCS8",
            "rotationPolicy": rotation_policy,
        },
        "secretTemplate": {"labels": labels},
    });
    match usage {
        Usage::Signing { common_name } => {
            spec["commonName"] = json!(common_name);
            spec["usages"] = json!(["digital signature"]);
        }
        Usage::Server { dns_names } => {
            spec["dnsNames"] = json!(dns_names);
            spec["usages"] = json!(["server auth", "digital signature", "key encipherment"]);
        }
    }
    // Bounded by default, per use: a serving key is not valid for long if
    // it leaks; the signing keypair's certificate is never presented and
    // its rotation is the operator's, so it may live longer, but not for
    // ever.
    let default_duration = match usage {
        Usage::Signing { .. } => DEFAULT_SIGNING_DURATION,
        Usage::Server { .. } => DEFAULT_SERVING_DURATION,
    };
    spec["duration"] = json!(
        cm.duration
            .as_deref()
            .filter(|d| !d.is_empty())
            .unwrap_or(default_duration)
    );
    if let Some(r) = cm.renew_before.as_ref().filter(|r| !r.is_empty()) {
        spec["renewBefore"] = json!(r);
    }
    let meta = json!({"name": name, "namespace": namespace, "labels": labels});
    [
        Desired::create_only(empty_tls_secret(name, namespace, labels)),
        Desired::apply(json!({
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": meta,
            "spec": spec,
        })),
    ]
}

/// An empty `kubernetes.io/tls` Secret for an issuer to fill.
pub fn empty_tls_secret(name: &str, namespace: &str, labels: &BTreeMap<String, String>) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "type": "kubernetes.io/tls",
        "data": {"tls.crt": "", "tls.key": ""},
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::IssuerRef;

    #[test]
    fn a_signing_certificate_never_rotates_its_key_and_a_server_one_always_does() {
        let cm = CertManagerSpec {
            issuer_ref: IssuerRef {
                name: "ca".into(),
                kind: None,
            },
            duration: Some("2160h".into()),
            ..CertManagerSpec::default()
        };
        let labels = BTreeMap::from([("a".to_owned(), "b".to_owned())]);
        let [secret, cert] = certificate(
            "fb-auth-signing-1",
            "ns",
            &labels,
            &cm,
            &Usage::Signing {
                common_name: "fb signing-1".into(),
            },
        );
        assert!(secret.create_only);
        assert_eq!(secret.object["type"], "kubernetes.io/tls");
        let spec = &cert.object["spec"];
        assert_eq!(cert.object["apiVersion"], "cert-manager.io/v1");
        assert_eq!(spec["secretName"], "fb-auth-signing-1");
        assert_eq!(spec["issuerRef"]["kind"], "ClusterIssuer");
        assert_eq!(spec["privateKey"]["rotationPolicy"], "Never");
        assert_eq!(spec["privateKey"]["algorithm"], "ECDSA");
        assert_eq!(spec["privateKey"]["size"], 384);
        assert_eq!(spec["duration"], "2160h");
        assert_eq!(spec["secretTemplate"]["labels"]["a"], "b");
        let [_, server] = certificate(
            "x",
            "ns",
            &labels,
            &cm,
            &Usage::Server {
                dns_names: vec!["x.ns.svc".into()],
            },
        );
        assert_eq!(
            server.object["spec"]["privateKey"]["rotationPolicy"],
            "Always"
        );
        assert_eq!(server.object["spec"]["dnsNames"][0], "x.ns.svc");
    }

    #[test]
    fn lifetimes_are_bounded_by_default_and_the_spec_wins() {
        let labels = BTreeMap::new();
        let duration = |cm: &CertManagerSpec, usage: Usage| {
            let [_, cert] = certificate("x", "ns", &labels, cm, &usage);
            cert.object["spec"]["duration"].clone()
        };
        let signing = || Usage::Signing {
            common_name: "s".into(),
        };
        let server = || Usage::Server {
            dns_names: vec!["x".into()],
        };
        let unset = CertManagerSpec::default();
        assert_eq!(duration(&unset, signing()), "8760h");
        assert_eq!(duration(&unset, server()), "2160h");
        let set = CertManagerSpec {
            duration: Some("720h".into()),
            ..CertManagerSpec::default()
        };
        assert_eq!(duration(&set, signing()), "720h");
        assert_eq!(duration(&set, server()), "720h");
    }
}
