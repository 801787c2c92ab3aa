//! The admission server's certificate: a self-signed CA and a serving
//! certificate kept in a Secret (or a Secret cert-manager maintains),
//! reloaded into the TLS resolver when it changes.
//!
//! # The Secret
//! `ca.crt`, `tls.crt` and `tls.key` (PEM), the keys cert-manager writes
//! too. In self-signed mode the host also keeps `ca.key` and the serving
//! certificate's end of validity in the annotation
//! [`NOT_AFTER_ANNOTATION`]. Any replica creates the Secret when it is
//! missing and renews the serving certificate (signed by the same CA) once
//! less than a third of its validity is left; both writes carry
//! preconditions (create, or replace at the read resourceVersion), so
//! replicas racing for it end with one certificate.
//!
//! # Rotation without downtime
//! Every replica re-reads the Secret periodically and swaps the key pair
//! in its resolver: new TLS handshakes get the new certificate, open
//! connections keep theirs. The CA does not change when the serving
//! certificate is renewed, so the webhook's `caBundle` stays valid
//! throughout. With cert-manager, `caBundle` follows `ca.crt`.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::PostParams;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use thiserror::Error;

/// Annotation holding the serving certificate's end of validity (RFC 3339).
pub const NOT_AFTER_ANNOTATION: &str = "wasmop.dev/not-after";

/// How long the self-signed CA is valid.
const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// How far back a new certificate's validity starts (clock skew).
const BACKDATE: Duration = Duration::from_secs(300);

/// Why certificate material could not be made or used.
#[derive(Debug, Error)]
pub enum TlsError {
    /// Generating or signing failed.
    #[error("cannot generate the certificate: {0}")]
    Generate(#[from] rcgen::Error),
    /// The Secret lacks a key or holds something that is not PEM.
    #[error("Secret {secret}: {problem}")]
    Material {
        /// `namespace/name`.
        secret: String,
        /// What is wrong.
        problem: String,
    },
}

/// The PEM texts of one Secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Material {
    /// The CA certificate(s): the webhook's `caBundle`.
    pub ca_crt: String,
    /// The serving certificate chain.
    pub tls_crt: String,
    /// The serving key.
    pub tls_key: String,
    /// The CA key (self-signed mode only).
    pub ca_key: Option<String>,
    /// When the serving certificate expires, when known.
    pub not_after: Option<jiff::Timestamp>,
}

/// The fixed parameters of the self-signed CA; the issuer of every serving
/// certificate is rebuilt from them and the stored CA key.
fn ca_params(now: jiff::Timestamp) -> Result<CertificateParams, rcgen::Error> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(DnType::CommonName, "wasmop admission CA");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = offset(now, BACKDATE, false);
    params.not_after = offset(now, CA_VALIDITY, true);
    Ok(params)
}

fn offset(now: jiff::Timestamp, by: Duration, forward: bool) -> time::OffsetDateTime {
    let secs = now.as_second();
    let by = i64::try_from(by.as_secs()).unwrap_or(i64::MAX / 2);
    let at = if forward {
        secs.saturating_add(by)
    } else {
        secs.saturating_sub(by)
    };
    time::OffsetDateTime::from_unix_timestamp(at).unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

/// A new CA and a serving certificate for `names` valid for `validity`.
///
/// # Errors
/// [`TlsError::Generate`] when a key or certificate cannot be made.
pub fn bootstrap(
    names: &[String],
    validity: Duration,
    now: jiff::Timestamp,
) -> Result<Material, TlsError> {
    let ca_key = KeyPair::generate()?;
    let ca = ca_params(now)?.self_signed(&ca_key)?;
    let mut material = issue(&ca.pem(), &ca_key.serialize_pem(), names, validity, now)?;
    material.ca_crt = ca.pem();
    Ok(material)
}

/// A serving certificate for `names` signed by the stored CA.
///
/// # Errors
/// [`TlsError`] when the CA key is not PEM or signing fails.
pub fn issue(
    ca_crt: &str,
    ca_key: &str,
    names: &[String],
    validity: Duration,
    now: jiff::Timestamp,
) -> Result<Material, TlsError> {
    let signing_key = KeyPair::from_pem(ca_key)?;
    let issuer = Issuer::new(ca_params(now)?, signing_key);
    let mut params = CertificateParams::new(names.to_vec())?;
    params
        .distinguished_name
        .push(DnType::CommonName, names.first().map_or("wasmop", |n| n));
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    params.not_before = offset(now, BACKDATE, false);
    params.not_after = offset(now, validity, true);
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    let not_after = now
        .checked_add(jiff::SignedDuration::try_from(validity).unwrap_or(jiff::SignedDuration::MAX))
        .ok();
    Ok(Material {
        ca_crt: ca_crt.to_owned(),
        tls_crt: cert.pem(),
        tls_key: key.serialize_pem(),
        ca_key: Some(ca_key.to_owned()),
        not_after,
    })
}

/// True when less than a third of the serving certificate's validity
/// (`validity`) is left at `now`, or its end is unknown.
pub fn needs_renewal(material: &Material, validity: Duration, now: jiff::Timestamp) -> bool {
    let Some(not_after) = material.not_after else {
        return true;
    };
    let left = now.duration_until(not_after);
    let third = jiff::SignedDuration::try_from(validity / 3).unwrap_or(jiff::SignedDuration::MAX);
    left < third
}

fn text(secret: &Secret, key: &str) -> Option<String> {
    secret
        .data
        .as_ref()?
        .get(key)
        .and_then(|b| String::from_utf8(b.0.clone()).ok())
        .filter(|t| !t.trim().is_empty())
}

/// The material of a Secret.
///
/// # Errors
/// [`TlsError::Material`] naming the first key that is missing.
pub fn from_secret(secret: &Secret) -> Result<Material, TlsError> {
    let name = format!(
        "{}/{}",
        secret.metadata.namespace.as_deref().unwrap_or_default(),
        secret.metadata.name.as_deref().unwrap_or_default()
    );
    let need = |key: &str| {
        text(secret, key).ok_or_else(|| TlsError::Material {
            secret: name.clone(),
            problem: format!("has no {key}"),
        })
    };
    Ok(Material {
        ca_crt: need("ca.crt")?,
        tls_crt: need("tls.crt")?,
        tls_key: need("tls.key")?,
        ca_key: text(secret, "ca.key"),
        not_after: secret
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(NOT_AFTER_ANNOTATION))
            .and_then(|t| t.parse().ok()),
    })
}

/// `secret` with `material` as its data (labels and annotations kept).
pub fn into_secret(mut secret: Secret, material: &Material) -> Secret {
    let data = secret.data.get_or_insert_with(Default::default);
    for (key, value) in [
        ("ca.crt", Some(&material.ca_crt)),
        ("tls.crt", Some(&material.tls_crt)),
        ("tls.key", Some(&material.tls_key)),
        ("ca.key", material.ca_key.as_ref()),
    ] {
        if let Some(value) = value {
            data.insert(key.to_owned(), ByteString(value.clone().into_bytes()));
        }
    }
    if let Some(not_after) = material.not_after {
        secret
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(NOT_AFTER_ANNOTATION.to_owned(), not_after.to_string());
    }
    secret
        .metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert(
            wasmop_contract::MANAGED_BY_LABEL.to_owned(),
            wasmop_contract::MANAGED_BY_VALUE.to_owned(),
        );
    secret.type_ = Some("kubernetes.io/tls".to_owned());
    secret
}

/// The rustls key of `material`.
///
/// # Errors
/// [`TlsError::Material`] when the certificate or key is not usable PEM.
pub fn certified_key(material: &Material) -> Result<CertifiedKey, TlsError> {
    let bad = |problem: String| TlsError::Material {
        secret: "admission".into(),
        problem,
    };
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(material.tls_crt.as_bytes())
            .collect::<Result<_, _>>()
            .map_err(|e| bad(format!("tls.crt is not PEM: {e}")))?;
    if chain.is_empty() {
        return Err(bad("tls.crt holds no certificate".into()));
    }
    let key = PrivateKeyDer::from_pem_slice(material.tls_key.as_bytes())
        .map_err(|e| bad(format!("tls.key is not a PEM private key: {e}")))?;
    let signer = rustls::crypto::ring::sign::any_supported_type(&key)
        .map_err(|e| bad(format!("tls.key cannot sign: {e}")))?;
    Ok(CertifiedKey::new(chain, signer))
}

/// The serving key of every new TLS handshake, swapped on rotation.
#[derive(Debug, Default)]
pub struct Resolver {
    current: RwLock<Option<Arc<CertifiedKey>>>,
}

impl Resolver {
    /// Serves `key` from the next handshake on.
    pub fn set(&self, key: CertifiedKey) {
        *self.current.write().expect("resolver lock") = Some(Arc::new(key));
    }

    /// True once a key is set.
    pub fn ready(&self) -> bool {
        self.current.read().expect("resolver lock").is_some()
    }
}

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.read().expect("resolver lock").clone()
    }
}

/// Where the certificate comes from.
#[derive(Clone, Debug)]
pub struct CertSource {
    /// The Secret's namespace.
    pub namespace: String,
    /// The Secret's name.
    pub name: String,
    /// False: cert-manager (or a person) maintains the Secret; the host
    /// only reads it.
    pub self_signed: bool,
    /// DNS names and IP addresses of the serving certificate.
    pub names: Vec<String>,
    /// Validity of a serving certificate the host issues.
    pub validity: Duration,
}

/// Reads the Secret, creating or renewing it in self-signed mode, and
/// returns its material.
///
/// # Errors
/// A message for the log: the API refused, or the Secret is unusable.
pub async fn ensure(api: &Api<Secret>, source: &CertSource) -> Result<Material, String> {
    let now = jiff::Timestamp::now();
    let existing = api.get_opt(&source.name).await.map_err(|e| {
        format!(
            "cannot read Secret {}/{}: {e}",
            source.namespace, source.name
        )
    })?;
    let Some(secret) = existing else {
        if !source.self_signed {
            return Err(format!(
                "Secret {}/{} does not exist yet (it is expected from cert-manager)",
                source.namespace, source.name
            ));
        }
        let material = bootstrap(&source.names, source.validity, now).map_err(|e| e.to_string())?;
        let mut fresh = Secret::default();
        fresh.metadata.name = Some(source.name.clone());
        fresh.metadata.namespace = Some(source.namespace.clone());
        let fresh = into_secret(fresh, &material);
        return match api.create(&PostParams::default(), &fresh).await {
            Ok(created) => {
                tracing::info!(secret = %source.name, "admission CA and serving certificate created");
                from_secret(&created).map_err(|e| e.to_string())
            }
            // Another replica created it first: use theirs.
            Err(kube::Error::Api(s)) if s.code == 409 => {
                let secret = api.get(&source.name).await.map_err(|e| e.to_string())?;
                from_secret(&secret).map_err(|e| e.to_string())
            }
            Err(e) => Err(format!("cannot create Secret {}: {e}", source.name)),
        };
    };
    let material = from_secret(&secret).map_err(|e| e.to_string())?;
    if !source.self_signed || !needs_renewal(&material, source.validity, now) {
        return Ok(material);
    }
    let Some(ca_key) = material.ca_key.clone() else {
        return Ok(material);
    };
    let renewed = issue(
        &material.ca_crt,
        &ca_key,
        &source.names,
        source.validity,
        now,
    )
    .map_err(|e| e.to_string())?;
    let replaced = into_secret(secret, &renewed);
    match api
        .replace(&source.name, &PostParams::default(), &replaced)
        .await
    {
        Ok(stored) => {
            tracing::info!(secret = %source.name, not_after = ?renewed.not_after, "admission serving certificate renewed");
            from_secret(&stored).map_err(|e| e.to_string())
        }
        // Another replica renewed it at the same time: keep serving the
        // current one; the next check reads theirs.
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(material),
        Err(e) => Err(format!("cannot renew Secret {}: {e}", source.name)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bootstrapped_certificate_loads_and_renews_from_the_same_ca() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let now: jiff::Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let names = vec!["wasmop.ops.svc".to_owned(), "127.0.0.1".to_owned()];
        let validity = Duration::from_secs(90);
        let first = bootstrap(&names, validity, now).unwrap();
        assert!(first.ca_crt.starts_with("-----BEGIN CERTIFICATE-----"));
        certified_key(&first).unwrap();
        assert!(!needs_renewal(&first, validity, now));
        let later = now + jiff::SignedDuration::from_secs(61);
        assert!(needs_renewal(&first, validity, later));
        let renewed = issue(
            &first.ca_crt,
            first.ca_key.as_deref().unwrap(),
            &names,
            validity,
            later,
        )
        .unwrap();
        assert_eq!(renewed.ca_crt, first.ca_crt);
        assert_ne!(renewed.tls_crt, first.tls_crt);
        certified_key(&renewed).unwrap();

        let secret = into_secret(Secret::default(), &renewed);
        assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
        assert_eq!(from_secret(&secret).unwrap(), renewed);
        let err = from_secret(&Secret::default()).unwrap_err().to_string();
        assert!(err.contains("has no ca.crt"), "{err}");
    }
}
