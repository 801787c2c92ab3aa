//! Plugins from OCI registries.
//!
//! `wasmop run --plugins oci://REGISTRY/REPO:TAG` (or `@sha256:…`) pulls a
//! plugin published as a wasm OCI artifact: an image manifest with exactly
//! one wasm layer, in the layout of the CNCF wasm working group
//! (`application/wasm`) or of Kubewarden and wasm-to-oci
//! (`application/vnd.wasm.content.layer.v1+wasm`,
//! `application/vnd.module.wasm.content.layer.v1+wasm`).
//!
//! # How it fits the plugin directory
//! The mirror writes each verified plugin as `NAME.wasm` into its own
//! *active* directory, which the [`PluginDir`](super::hotswap::PluginDir)
//! scans like any other. Everything the directory guarantees (compile and
//! validate before swap, the running version keeps serving when a new one
//! is rejected) therefore holds for registry plugins too.
//!
//! # Guarantees
//! - **Verified.** The manifest's bytes hash to the digest the registry
//!   resolved (or the reference names), and the wasm layer hashes to the
//!   manifest's layer digest; anything else is refused and nothing changes.
//! - **Cached by digest.** Verified layers are kept in a content-addressed
//!   store (`blobs/`), manifests by digest (`manifests/`) and the last digest
//!   seen for each tag (`tags/`). A digest reference whose layer is cached
//!   never touches the network; after a restart with the registry down, a
//!   tag runs the digest it last resolved to.
//! - **Tags are polled.** Every poll a tag is resolved again (a `HEAD` of
//!   the manifest); a new digest is pulled by digest (not by tag, so a tag
//!   moving mid-pull cannot mix two versions) and hot-swapped. A digest
//!   reference never changes.
//! - **An unreachable registry loses nothing.** The running version keeps
//!   serving; the failure is logged, counted, shown in
//!   `wasmop_plugin_source_up`, and raised once per outage as a Warning
//!   Event on the operator's Pod.
//! - **Bounded.** A layer larger than the limit is refused before it is
//!   downloaded.

mod push;
mod source;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use oci_client::Client;
use oci_client::manifest::{self, OciImageManifest};
use oci_client::secrets::RegistryAuth;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::metrics;

pub use self::push::{is_component, push};
pub use self::source::{OciSource, PluginSource, RegistryOptions};

/// The scheme that marks an OCI reference where a directory could be given.
pub const SCHEME: &str = "oci://";

/// Layer media types accepted as a wasm component.
pub const WASM_LAYER_TYPES: &[&str] = &[
    "application/wasm",
    manifest::WASM_LAYER_MEDIA_TYPE,
    "application/vnd.module.wasm.content.layer.v1+wasm",
];

/// The layer media type `wasmop push` writes (CNCF wasm working group).
pub const PUSH_LAYER_TYPE: &str = "application/wasm";
/// The config media type `wasmop push` writes (CNCF wasm working group).
pub const PUSH_CONFIG_TYPE: &str = "application/vnd.wasm.config.v0+json";

/// The largest wasm layer pulled, by default.
pub const DEFAULT_MAX_BYTES: u64 = 64 << 20;

/// `sha256:` + hex of `bytes`.
pub fn sha256(bytes: &[u8]) -> String {
    let mut out = String::from("sha256:");
    for b in Sha256::digest(bytes) {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// Why a pull did not produce a plugin.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    /// The registry could not be reached or refused the request.
    #[error("registry: {0}")]
    Registry(String),
    /// What the registry sent is not a single-layer wasm artifact, or does
    /// not match its digest.
    #[error("{0}")]
    Invalid(String),
    /// The local cache could not be written.
    #[error("cache: {0}")]
    Cache(String),
}

impl PullError {
    fn reason(&self) -> &'static str {
        match self {
            PullError::Registry(_) => "RegistryUnreachable",
            PullError::Invalid(_) => "InvalidArtifact",
            PullError::Cache(_) => "CacheUnwritable",
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CachedManifest {
    layer_digest: String,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CachedTag {
    reference: String,
    manifest_digest: String,
}

#[derive(Debug, Default)]
struct SourceState {
    /// Manifest digest installed in the active directory.
    installed: Option<String>,
    /// Whether the last attempt reached the registry (None: not tried).
    up: Option<bool>,
}

/// What one sync did for one source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SyncOutcome {
    /// A new digest was installed (plugin, manifest digest).
    Installed(String, String),
    /// The installed digest is current.
    Unchanged(String),
    /// The source failed; what is installed stays (plugin, reason, message).
    Failed(String, String, String),
}

/// Keeps `NAME.wasm` files in an active directory in step with OCI
/// references.
pub struct OciMirror {
    client: Client,
    registry: RegistryOptions,
    sources: Vec<OciSource>,
    root: PathBuf,
    active: PathBuf,
    max_bytes: u64,
    state: BTreeMap<String, SourceState>,
}

impl std::fmt::Debug for OciMirror {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OciMirror")
            .field("root", &self.root)
            .field("active", &self.active)
            .field("sources", &self.sources)
            .finish_non_exhaustive()
    }
}

fn atomic_write(path: &Path, bytes: &[u8]) -> Result<(), PullError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let file = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = dir.join(format!(".{file}.{}.tmp", std::process::id()));
    std::fs::write(&tmp, bytes)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            PullError::Cache(format!("cannot write {}: {e}", path.display()))
        })
}

fn digest_file(digest: &str) -> String {
    digest.replace(':', "-")
}

/// A file-system-safe key for a tag reference.
fn tag_key(text: &str) -> String {
    let mut key: String = text
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .take(80)
        .collect();
    key.push('-');
    key.push_str(&sha256(text.as_bytes())[7..23]);
    key
}

impl OciMirror {
    /// A mirror caching under `root`, installing into a directory named by
    /// the set of sources (so two configurations never share one).
    ///
    /// # Errors
    /// When the cache directories cannot be created.
    pub fn new(
        root: PathBuf,
        sources: Vec<OciSource>,
        registry: RegistryOptions,
        max_bytes: u64,
    ) -> std::io::Result<Self> {
        let mut names: Vec<String> = sources
            .iter()
            .map(|s| format!("{}={}", s.name, s.text))
            .collect();
        names.sort();
        let active = root
            .join("active")
            .join(&sha256(names.join("\n").as_bytes())[7..23]);
        for dir in ["blobs", "manifests", "tags"] {
            std::fs::create_dir_all(root.join(dir))?;
        }
        std::fs::create_dir_all(&active)?;
        // Files of names no longer configured (cannot happen with the
        // keyed directory, but a hand-edited one could hold strays).
        if let Ok(entries) = std::fs::read_dir(&active) {
            for e in entries.flatten() {
                let path = e.path();
                let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
                if path.extension().is_some_and(|x| x == "wasm")
                    && !sources.iter().any(|s| s.name == stem)
                {
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        Ok(Self {
            client: registry.client(),
            registry,
            sources,
            root,
            active,
            max_bytes,
            state: BTreeMap::new(),
        })
    }

    /// The directory holding the installed `NAME.wasm` files.
    pub fn active_dir(&self) -> &Path {
        &self.active
    }

    /// One pass over every source.
    pub async fn sync(&mut self) -> Vec<SyncOutcome> {
        let mut out = Vec::new();
        for i in 0..self.sources.len() {
            let source = self.sources[i].clone();
            let outcome = match self.sync_one(&source).await {
                Ok((digest, true)) => SyncOutcome::Installed(source.name.clone(), digest),
                Ok((digest, false)) => SyncOutcome::Unchanged(digest),
                Err(e) => {
                    SyncOutcome::Failed(source.name.clone(), e.reason().to_owned(), e.to_string())
                }
            };
            self.report(&source, &outcome);
            out.push(outcome);
        }
        out
    }

    /// Syncs forever, every `poll`.
    pub async fn watch(mut self, poll: Duration) {
        loop {
            tokio::time::sleep(poll).await;
            self.sync().await;
        }
    }

    fn report(&mut self, source: &OciSource, outcome: &SyncOutcome) {
        let m = metrics::global();
        let state = self.state.entry(source.name.clone()).or_default();
        let plugin = source.name.as_str();
        match outcome {
            SyncOutcome::Installed(_, digest) => {
                tracing::info!(plugin, reference = %source.text, %digest, "plugin pulled from the registry");
                m.inc(
                    "wasmop_plugin_source_pulls_total",
                    &[("plugin", plugin), ("result", "ok")],
                );
            }
            SyncOutcome::Unchanged(_) => {}
            SyncOutcome::Failed(_, reason, message) => {
                let keeping = state.installed.clone().unwrap_or_else(|| "nothing".into());
                tracing::warn!(plugin, reference = %source.text, reason, error = %message,
                    running = %keeping, "cannot update the plugin from its registry; the running version keeps serving");
                m.inc(
                    "wasmop_plugin_source_pulls_total",
                    &[("plugin", plugin), ("result", "error")],
                );
                if state.up != Some(false) {
                    crate::report::selfevent::warning(
                        reason,
                        &format!(
                            "plugin {plugin} from {SCHEME}{}: {message}; running {keeping}",
                            source.text
                        ),
                    );
                }
            }
        }
        let up = !matches!(outcome, SyncOutcome::Failed(..));
        if up && state.up == Some(false) {
            tracing::info!(plugin, reference = %source.text, "the plugin's registry is reachable again");
        }
        state.up = Some(up);
        m.set(
            "wasmop_plugin_source_up",
            &[("plugin", plugin)],
            if up { 1.0 } else { 0.0 },
        );
        if let Some(digest) = &state.installed {
            m.remove_where("wasmop_plugin_source_info", "plugin", plugin);
            m.set(
                "wasmop_plugin_source_info",
                &[
                    ("plugin", plugin),
                    ("reference", &source.text),
                    ("digest", digest),
                ],
                1.0,
            );
        }
    }

    /// Brings one source up to date: `(manifest digest, installed now)`.
    async fn sync_one(&mut self, source: &OciSource) -> Result<(String, bool), PullError> {
        let installed = self
            .state
            .get(&source.name)
            .and_then(|s| s.installed.clone());
        let auth = self.registry.auth(&source.reference);
        let digest = match source.reference.digest() {
            Some(d) => d.to_owned(),
            None => match self
                .client
                .fetch_manifest_digest(&source.reference, &auth)
                .await
            {
                Ok(d) => d,
                Err(e) => {
                    // Offline: at start-up, run what this tag last resolved to.
                    if installed.is_none()
                        && let Some(last) = self.cached_tag(source)
                        && self.install_cached(source, &last).is_ok()
                    {
                        self.set_installed(source, &last);
                    }
                    return Err(PullError::Registry(e.to_string()));
                }
            },
        };
        if installed.as_deref() == Some(digest.as_str()) {
            return Ok((digest, false));
        }
        if self.install_cached(source, &digest).is_err() {
            self.pull(source, &digest, &auth).await?;
            self.install_cached(source, &digest)?;
        }
        if source.reference.digest().is_none() {
            let tag = CachedTag {
                reference: source.text.clone(),
                manifest_digest: digest.clone(),
            };
            let bytes = serde_json::to_vec(&tag).unwrap_or_default();
            atomic_write(
                &self
                    .root
                    .join("tags")
                    .join(format!("{}.json", tag_key(&source.text))),
                &bytes,
            )?;
        }
        self.set_installed(source, &digest);
        Ok((digest, true))
    }

    fn set_installed(&mut self, source: &OciSource, digest: &str) {
        self.state.entry(source.name.clone()).or_default().installed = Some(digest.to_owned());
    }

    fn cached_tag(&self, source: &OciSource) -> Option<String> {
        let path = self
            .root
            .join("tags")
            .join(format!("{}.json", tag_key(&source.text)));
        let tag: CachedTag = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
        (tag.reference == source.text).then_some(tag.manifest_digest)
    }

    /// Installs the cached layer of manifest `digest` as `NAME.wasm`, after
    /// checking the cached bytes still hash to their digest.
    fn install_cached(&self, source: &OciSource, digest: &str) -> Result<(), PullError> {
        let manifest_path = self
            .root
            .join("manifests")
            .join(format!("{}.json", digest_file(digest)));
        let cached: CachedManifest = std::fs::read(&manifest_path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .ok_or_else(|| PullError::Cache(format!("{digest} is not cached")))?;
        let blob = self
            .root
            .join("blobs")
            .join(digest_file(&cached.layer_digest));
        let bytes = std::fs::read(&blob)
            .map_err(|e| PullError::Cache(format!("{}: {e}", blob.display())))?;
        if sha256(&bytes) != cached.layer_digest {
            let _ = std::fs::remove_file(&blob);
            return Err(PullError::Cache(format!(
                "cached layer {} is corrupt; removed",
                cached.layer_digest
            )));
        }
        let target = self.active.join(format!("{}.wasm", source.name));
        if std::fs::read(&target).is_ok_and(|b| b == bytes) {
            return Ok(());
        }
        atomic_write(&target, &bytes)
    }

    /// Pulls manifest `digest` of `source`'s repository and its wasm layer
    /// into the cache, verifying both.
    async fn pull(
        &self,
        source: &OciSource,
        digest: &str,
        auth: &RegistryAuth,
    ) -> Result<(), PullError> {
        let by_digest = source.reference.clone_with_digest(digest.to_owned());
        let (raw, _) = self
            .client
            .pull_manifest_raw(
                &by_digest,
                auth,
                &[
                    manifest::OCI_IMAGE_MEDIA_TYPE,
                    manifest::IMAGE_MANIFEST_MEDIA_TYPE,
                ],
            )
            .await
            .map_err(|e| PullError::Registry(e.to_string()))?;
        let actual = sha256(&raw);
        if actual != digest {
            return Err(PullError::Invalid(format!(
                "manifest digest mismatch: expected {digest}, got {actual}"
            )));
        }
        let manifest: OciImageManifest = serde_json::from_slice(&raw)
            .map_err(|e| PullError::Invalid(format!("not an OCI image manifest: {e}")))?;
        let layer = wasm_layer(&manifest, self.max_bytes)?;
        let mut bytes = Vec::with_capacity(usize::try_from(layer.size).unwrap_or(0));
        self.client
            .pull_blob(&by_digest, layer, &mut bytes)
            .await
            .map_err(|e| match e {
                oci_client::errors::OciDistributionError::DigestError(d) => {
                    PullError::Invalid(format!("layer digest mismatch: {d}"))
                }
                other => PullError::Registry(other.to_string()),
            })?;
        if bytes.len() as u64 > self.max_bytes {
            return Err(PullError::Invalid(format!(
                "layer is {} bytes, more than the limit of {}",
                bytes.len(),
                self.max_bytes
            )));
        }
        let actual = sha256(&bytes);
        if actual != layer.digest {
            return Err(PullError::Invalid(format!(
                "layer digest mismatch: expected {}, got {actual}",
                layer.digest
            )));
        }
        atomic_write(
            &self.root.join("blobs").join(digest_file(&layer.digest)),
            &bytes,
        )?;
        let cached = CachedManifest {
            layer_digest: layer.digest.clone(),
        };
        atomic_write(
            &self
                .root
                .join("manifests")
                .join(format!("{}.json", digest_file(digest))),
            &serde_json::to_vec(&cached).unwrap_or_default(),
        )
    }
}

/// The one wasm layer of `manifest`, checked against `max_bytes`.
fn wasm_layer(
    manifest: &OciImageManifest,
    max_bytes: u64,
) -> Result<&manifest::OciDescriptor, PullError> {
    let wasm: Vec<_> = manifest
        .layers
        .iter()
        .filter(|l| WASM_LAYER_TYPES.contains(&l.media_type.as_str()))
        .collect();
    let [layer] = wasm.as_slice() else {
        let types: Vec<&str> = manifest
            .layers
            .iter()
            .map(|l| l.media_type.as_str())
            .collect();
        return Err(PullError::Invalid(format!(
            "a wasm plugin artifact has exactly one layer of type {}; this one has {types:?}",
            WASM_LAYER_TYPES.join(" | ")
        )));
    };
    if u64::try_from(layer.size).map_or(true, |s| s > max_bytes) {
        return Err(PullError::Invalid(format!(
            "layer is {} bytes, more than the limit of {max_bytes}",
            layer.size
        )));
    }
    Ok(layer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_parse_directories_and_references() {
        assert_eq!(
            "plugins".parse::<PluginSource>().unwrap(),
            PluginSource::Dir(PathBuf::from("plugins"))
        );
        let PluginSource::Oci(s) = "oci://127.0.0.1:5000/wasmop/good:v1"
            .parse::<PluginSource>()
            .unwrap()
        else {
            panic!("not oci")
        };
        assert_eq!(s.name, "good");
        assert_eq!(s.reference.registry(), "127.0.0.1:5000");
        assert_eq!(s.reference.repository(), "wasmop/good");
        assert_eq!(s.reference.tag(), Some("v1"));
        let d = format!("sha256:{}", "a".repeat(64));
        let PluginSource::Oci(s) = format!("inst=oci://ghcr.io/x/instance@{d}")
            .parse::<PluginSource>()
            .unwrap()
        else {
            panic!("not oci")
        };
        assert_eq!(s.name, "inst");
        assert_eq!(s.reference.digest(), Some(d.as_str()));
        // A shadow candidate (what a PluginRollout rolls out) by digest.
        let PluginSource::Oci(s) = format!("good.shadow=oci://ghcr.io/x/good@{d}")
            .parse::<PluginSource>()
            .unwrap()
        else {
            panic!("not oci")
        };
        assert_eq!(s.name, "good.shadow");
        // A directory whose name holds '=' stays a directory.
        assert_eq!(
            "a=b".parse::<PluginSource>().unwrap(),
            PluginSource::Dir(PathBuf::from("a=b"))
        );
    }

    #[test]
    fn bad_references_are_refused_with_a_reason() {
        for (text, needle) in [
            ("oci://", "not an OCI reference"),
            ("oci://ghcr.io/UPPER/x:1", "not an OCI reference"),
            ("oci://UPPER/x:1", "registry host"),
            ("oci://org/plugin:1", "registry host"),
            ("bad name=oci://ghcr.io/x/y:1", "plugin name"),
            ("a.b=oci://ghcr.io/x/y:1", "plugin name"),
            (".shadow=oci://ghcr.io/x/y:1", "plugin name"),
            ("", "empty"),
        ] {
            let err = text.parse::<PluginSource>().unwrap_err();
            assert!(err.contains(needle), "{text}: {err}");
        }
    }

    #[test]
    fn docker_config_credentials_are_read() {
        let dir = std::env::temp_dir().join(format!("wasmop-oci-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("config.json");
        std::fs::write(
            &path,
            r#"{"auths":{"https://reg.example:5000/v1/":{"auth":"dXNlcjpwYXNz"},"ghcr.io":{"username":"u","password":"p:q"}}}"#,
        )
        .unwrap();
        let mut opts = RegistryOptions::default();
        opts.read_auth_file(&path).unwrap();
        assert_eq!(
            opts.auths.get("reg.example:5000"),
            Some(&("user".to_owned(), "pass".to_owned()))
        );
        assert_eq!(
            opts.auths.get("ghcr.io"),
            Some(&("u".to_owned(), "p:q".to_owned()))
        );
        std::fs::write(&path, r#"{"auths":{"x":{"auth":"bm9jb2xvbg=="}}}"#).unwrap();
        let err = opts.read_auth_file(&path).unwrap_err();
        assert!(err.contains("user:password"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn descriptor(media_type: &str, size: i64) -> manifest::OciDescriptor {
        manifest::OciDescriptor {
            media_type: media_type.to_owned(),
            digest: format!("sha256:{}", "b".repeat(64)),
            size,
            ..Default::default()
        }
    }

    #[test]
    fn an_artifact_has_exactly_one_wasm_layer_within_the_limit() {
        let mut m = OciImageManifest {
            layers: vec![descriptor("application/wasm", 10)],
            ..Default::default()
        };
        assert!(wasm_layer(&m, 100).is_ok());
        m.layers = vec![descriptor(manifest::WASM_LAYER_MEDIA_TYPE, 10)];
        assert!(wasm_layer(&m, 100).is_ok());
        m.layers = vec![descriptor("application/wasm", 101)];
        assert!(matches!(wasm_layer(&m, 100), Err(PullError::Invalid(e)) if e.contains("limit")));
        m.layers = vec![descriptor(manifest::IMAGE_LAYER_GZIP_MEDIA_TYPE, 10)];
        assert!(wasm_layer(&m, 100).is_err());
        m.layers = vec![
            descriptor("application/wasm", 10),
            descriptor("application/wasm", 10),
        ];
        assert!(wasm_layer(&m, 100).is_err());
        m.layers = vec![descriptor("application/wasm", -1)];
        assert!(wasm_layer(&m, 100).is_err());
    }

    #[test]
    fn components_are_told_from_core_modules() {
        assert!(is_component(b"\0asm\x0d\0\x01\0rest"));
        assert!(!is_component(b"\0asm\x01\0\0\0rest"));
        assert!(!is_component(b"PK\x03\x04"));
    }

    #[test]
    fn tag_keys_are_safe_and_distinct() {
        let a = tag_key("127.0.0.1:5000/a/b:v1");
        let b = tag_key("127.0.0.1:5000/a/b_v1");
        assert_ne!(a, b);
        assert!(
            a.chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-".contains(c))
        );
    }

    #[tokio::test]
    async fn a_cached_digest_installs_without_the_network_and_corruption_is_caught() {
        let root = std::env::temp_dir().join(format!("wasmop-oci-cache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let bytes = b"\0asm\x0d\0\x01\0component".to_vec();
        let layer = sha256(&bytes);
        let manifest_digest = format!("sha256:{}", "c".repeat(64));
        // An unreachable registry (nothing listens on port 9 of loopback).
        let PluginSource::Oci(source) = format!("oci://127.0.0.1:9/x/p@{manifest_digest}")
            .parse()
            .unwrap()
        else {
            panic!()
        };
        let registry = RegistryOptions {
            insecure: vec!["127.0.0.1:9".into()],
            ..Default::default()
        };
        let mut mirror = OciMirror::new(root.clone(), vec![source], registry, 1 << 20).unwrap();
        // Not cached: the pull fails, nothing is installed.
        let out = mirror.sync().await;
        assert!(
            matches!(&out[0], SyncOutcome::Failed(_, r, _) if r == "RegistryUnreachable"),
            "{out:?}"
        );
        assert!(!mirror.active_dir().join("p.wasm").exists());
        // Cached: installed without the network.
        std::fs::write(root.join("blobs").join(digest_file(&layer)), &bytes).unwrap();
        std::fs::write(
            root.join("manifests")
                .join(format!("{}.json", digest_file(&manifest_digest))),
            serde_json::to_vec(&CachedManifest {
                layer_digest: layer.clone(),
            })
            .unwrap(),
        )
        .unwrap();
        let out = mirror.sync().await;
        assert_eq!(
            out,
            vec![SyncOutcome::Installed("p".into(), manifest_digest.clone())]
        );
        assert_eq!(
            std::fs::read(mirror.active_dir().join("p.wasm")).unwrap(),
            bytes
        );
        assert_eq!(
            mirror.sync().await,
            vec![SyncOutcome::Unchanged(manifest_digest.clone())]
        );
        // A corrupt cache entry is refused, and the installed file stays.
        std::fs::write(root.join("blobs").join(digest_file(&layer)), b"tampered").unwrap();
        assert!(
            mirror
                .install_cached(&mirror.sources[0].clone(), &manifest_digest)
                .is_err()
        );
        assert!(!root.join("blobs").join(digest_file(&layer)).exists());
        assert_eq!(
            std::fs::read(mirror.active_dir().join("p.wasm")).unwrap(),
            bytes
        );
        std::fs::remove_dir_all(&root).unwrap();
    }
}
