//! TLS for `https` requests: a rustls client configuration trusting the
//! system's roots plus the request's CA bundle.
//!
//! The system's roots are read once per [`Observer`]; a configuration is
//! built once per distinct CA bundle and reused (a few at most: one per
//! server the plugins call), the cache cleared when it grows past
//! [`MAX_CONFIGS`].

use rustls::RootCertStore;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use super::*;

/// Distinct CA bundles whose configuration is kept.
const MAX_CONFIGS: usize = 32;

/// The system's roots and the configurations built on them.
#[derive(Debug, Default)]
pub(crate) struct Trust {
    system: std::sync::OnceLock<Arc<RootCertStore>>,
    configs: Mutex<HashMap<Vec<u8>, Arc<rustls::ClientConfig>>>,
}

impl Trust {
    /// The configuration for a request with `bundle` (the system's roots
    /// only when `None`). `secrets` finds a Secret of the primary's
    /// namespace by name.
    pub(crate) fn client_config(
        &self,
        bundle: Option<&CaBundle>,
        secrets: impl Fn(&str) -> Option<Value>,
    ) -> Result<Arc<rustls::ClientConfig>, Refusal> {
        let (source_name, pem) = match bundle {
            None => (String::new(), Vec::new()),
            Some(CaBundle::Pem(text)) => ("(inline PEM)".to_owned(), text.as_bytes().to_vec()),
            Some(CaBundle::Secret { name, key }) => {
                let source_name = format!("Secret {name} key {key}");
                let bad = |why: &str| Refusal::BadCaBundle {
                    source_name: source_name.clone(),
                    why: why.to_owned(),
                };
                let secret =
                    secrets(name).ok_or_else(|| bad("the Secret is not in the snapshot"))?;
                let encoded = secret
                    .get("data")
                    .and_then(|d| d.get(key))
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad("the Secret has no such key"))?;
                let pem = base64::engine::general_purpose::STANDARD
                    .decode(encoded)
                    .map_err(|_| bad("the value is not base64"))?;
                (source_name, pem)
            }
        };
        let mut configs = self
            .configs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(config) = configs.get(&pem) {
            return Ok(Arc::clone(config));
        }
        let mut roots = RootCertStore::clone(self.system_roots());
        if !pem.is_empty() {
            let bad = |why: String| Refusal::BadCaBundle {
                source_name: source_name.clone(),
                why,
            };
            let mut added = 0;
            for cert in CertificateDer::pem_slice_iter(&pem) {
                let cert = cert.map_err(|e| bad(format!("not PEM certificates: {e}")))?;
                roots
                    .add(cert)
                    .map_err(|e| bad(format!("a certificate cannot be used: {e}")))?;
                added += 1;
            }
            if added == 0 {
                return Err(bad("holds no PEM certificate".to_owned()));
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| Refusal::BadCaBundle {
                source_name: source_name.clone(),
                why: format!("no TLS protocol version available: {e}"),
            })?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let config = Arc::new(config);
        if configs.len() >= MAX_CONFIGS {
            configs.clear();
        }
        configs.insert(pem, Arc::clone(&config));
        Ok(config)
    }

    /// The system's trusted roots, read once; certificates that cannot be
    /// read are logged and skipped.
    fn system_roots(&self) -> &Arc<RootCertStore> {
        self.system.get_or_init(|| {
            let found = rustls_native_certs::load_native_certs();
            for error in &found.errors {
                tracing::warn!(%error, "a system root certificate could not be read");
            }
            let mut roots = RootCertStore::empty();
            let (added, ignored) = roots.add_parsable_certificates(found.certs);
            tracing::debug!(
                added,
                ignored,
                "system root certificates for https observations"
            );
            Arc::new(roots)
        })
    }
}
