//! Where a plugin comes from: a directory or an `oci://` reference
//! ([`PluginSource`], [`OciSource`]), and how its registry is reached
//! ([`RegistryOptions`]: plain HTTP, credentials).
//!
//! # Guarantees
//! - A reference that is not an OCI reference, does not name its registry
//!   host, or gives no valid plugin name is refused with a message naming
//!   it, before any request.
//! - Credentials come from the Docker config file given, never from the
//!   reference.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use serde::Deserialize;

use super::SCHEME;

/// Where plugins come from: a directory of `*.wasm` files or one OCI
/// reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PluginSource {
    /// A directory, watched for changes.
    Dir(PathBuf),
    /// A plugin in a registry.
    Oci(OciSource),
}

/// One `oci://` reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OciSource {
    /// The plugin file stem (`NAME.wasm`): `NAME=` before the scheme, or
    /// the repository's last path segment. Keys the operator configuration
    /// file, like a directory's file stem.
    pub name: String,
    /// The reference as given, without the scheme.
    pub text: String,
    /// The parsed reference.
    pub reference: Reference,
}

impl FromStr for PluginSource {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (name, rest) = match s.split_once('=') {
            Some((name, rest)) if rest.starts_with(SCHEME) => (Some(name), rest),
            _ => (None, s),
        };
        let Some(text) = rest.strip_prefix(SCHEME) else {
            if s.is_empty() {
                return Err("empty plugin source".to_owned());
            }
            return Ok(PluginSource::Dir(PathBuf::from(s)));
        };
        let reference = Reference::from_str(text)
            .map_err(|e| format!("{SCHEME}{text} is not an OCI reference: {e}"))?;
        if !text.starts_with(reference.registry()) {
            return Err(format!(
                "{SCHEME}{text}: name the registry host explicitly (e.g. {SCHEME}ghcr.io/org/plugin:tag)"
            ));
        }
        let name = match name {
            Some(n) => n.to_owned(),
            None => reference
                .repository()
                .rsplit('/')
                .next()
                .unwrap_or_default()
                .to_owned(),
        };
        // `NAME.shadow` pulls a shadow candidate (see `crate::report::shadow`).
        let plain = name
            .strip_suffix(crate::report::shadow::SUFFIX)
            .unwrap_or(&name);
        let valid = !plain.is_empty()
            && plain.len() <= 63
            && plain
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            && !plain.starts_with(['-', '_']);
        if !valid {
            return Err(format!(
                "{s}: plugin name {name:?} must be 1-63 of [A-Za-z0-9_-], starting with a letter or digit (and may end in .shadow)"
            ));
        }
        Ok(PluginSource::Oci(OciSource {
            name,
            text: text.to_owned(),
            reference,
        }))
    }
}

/// Registry access: which registries speak plain HTTP, and credentials.
#[derive(Debug, Clone, Default)]
pub struct RegistryOptions {
    /// `HOST[:PORT]` of registries reached over plain HTTP.
    pub insecure: Vec<String>,
    /// Basic credentials by registry host, from a Docker config file.
    pub auths: BTreeMap<String, (String, String)>,
}

impl RegistryOptions {
    /// Reads credentials from a Docker config file (the content of a
    /// `kubernetes.io/dockerconfigjson` Secret): `{"auths": {"HOST":
    /// {"auth": base64(user:password)} | {"username", "password"}}}`.
    ///
    /// # Errors
    /// A message naming the file and what is wrong with it.
    pub fn read_auth_file(&mut self, path: &Path) -> Result<(), String> {
        #[derive(Deserialize)]
        struct File {
            #[serde(default)]
            auths: BTreeMap<String, Entry>,
        }
        #[derive(Deserialize)]
        struct Entry {
            auth: Option<String>,
            username: Option<String>,
            password: Option<String>,
        }
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let file: File = serde_json::from_str(&text)
            .map_err(|e| format!("{} is not a Docker config file: {e}", path.display()))?;
        for (host, entry) in file.auths {
            let host = host
                .trim_start_matches("https://")
                .trim_start_matches("http://")
                .trim_end_matches('/')
                .split('/')
                .next()
                .unwrap_or_default()
                .to_owned();
            let pair = if let (Some(u), Some(p)) = (entry.username, entry.password) {
                (u, p)
            } else if let Some(auth) = entry.auth {
                use base64::Engine as _;
                let raw = base64::engine::general_purpose::STANDARD
                    .decode(auth.trim())
                    .map_err(|e| format!("{}: auths.{host}.auth: {e}", path.display()))?;
                let raw = String::from_utf8(raw)
                    .map_err(|_| format!("{}: auths.{host}.auth is not UTF-8", path.display()))?;
                let (u, p) = raw.split_once(':').ok_or_else(|| {
                    format!("{}: auths.{host}.auth is not user:password", path.display())
                })?;
                (u.to_owned(), p.to_owned())
            } else {
                continue;
            };
            self.auths.insert(host, pair);
        }
        Ok(())
    }

    /// An OCI client for these registries.
    pub fn client(&self) -> Client {
        let _ = rustls::crypto::ring::default_provider().install_default();
        Client::new(ClientConfig {
            protocol: if self.insecure.is_empty() {
                ClientProtocol::Https
            } else {
                ClientProtocol::HttpsExcept(self.insecure.clone())
            },
            connect_timeout: Some(Duration::from_secs(5)),
            read_timeout: Some(Duration::from_secs(30)),
            user_agent: concat!("wasmop/", env!("CARGO_PKG_VERSION")),
            ..ClientConfig::default()
        })
    }

    /// The credentials for `reference`'s registry.
    pub fn auth(&self, reference: &Reference) -> RegistryAuth {
        match self.auths.get(reference.resolve_registry()) {
            Some((u, p)) => RegistryAuth::Basic(u.clone(), p.clone()),
            None => RegistryAuth::Anonymous,
        }
    }
}
