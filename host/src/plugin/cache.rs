//! Compiled components cached on disk, keyed by the component's digest, the
//! wasmtime version and the engine's compilation settings, so a plugin
//! compiles once per machine rather than once per start.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

/// A directory of compiled components.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompileCache {
    dir: PathBuf,
}

impl CompileCache {
    /// A cache in `dir` (created on first write).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        CompileCache { dir: dir.into() }
    }

    /// The default location: `${XDG_CACHE_HOME:-$HOME/.cache}/wasmop/compiled`.
    /// `None` when neither variable is set.
    pub fn default_dir() -> Option<PathBuf> {
        let base = std::env::var_os("XDG_CACHE_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME")
                    .filter(|v| !v.is_empty())
                    .map(|home| PathBuf::from(home).join(".cache"))
            })?;
        Some(base.join("wasmop").join("compiled"))
    }

    /// The cache directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the artifact of the component with `digest` lives for `engine`:
    /// `<digest>-<engine key>.cwasm`, where the engine key hashes what
    /// wasmtime itself uses to tell artifacts apart (its version, target,
    /// compiler flags, tunables and enabled features).
    pub fn path_for(&self, engine: &Engine, digest: &str) -> PathBuf {
        let mut hasher = StableHasher(Sha256::new());
        engine.precompile_compatibility_hash().hash(&mut hasher);
        let engine_key = hex(&hasher.0.finalize()[..8]);
        let digest = digest.strip_prefix("sha256:").unwrap_or(digest);
        self.dir.join(format!("{digest}-{engine_key}.cwasm"))
    }

    /// The cached component, if an artifact exists and loads. A corrupt or
    /// incompatible artifact is removed and reported as a miss.
    pub(crate) fn load(&self, engine: &Engine, digest: &str) -> Option<Component> {
        let path = self.path_for(engine, digest);
        if !path.is_file() {
            return None;
        }
        match deserialize(engine, &path) {
            Ok(component) => Some(component),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "discarding unusable compiled plugin");
                let _ = std::fs::remove_file(&path);
                None
            }
        }
    }

    /// Stores `component` for later loads. Failures are logged, not
    /// returned: a cache that cannot be written only costs compile time.
    pub(crate) fn store(&self, engine: &Engine, digest: &str, component: &Component) {
        let path = self.path_for(engine, digest);
        let write = || -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
            let bytes = component.serialize()?;
            std::fs::create_dir_all(&self.dir)?;
            // Write a file of our own, then rename it into place: a reader
            // never sees half a file, and concurrent writers (threads or
            // processes) never share a temporary file.
            static WRITES: AtomicU64 = AtomicU64::new(0);
            let n = WRITES.fetch_add(1, Ordering::Relaxed);
            let tmp = path.with_extension(format!("tmp-{}-{n}", std::process::id()));
            let written = std::fs::write(&tmp, bytes).and_then(|()| std::fs::rename(&tmp, &path));
            if written.is_err() {
                let _ = std::fs::remove_file(&tmp);
            }
            Ok(written?)
        };
        if let Err(e) = write() {
            tracing::warn!(path = %path.display(), error = %e, "cannot cache compiled plugin");
        }
    }
}

/// Loads a compiled component from the cache.
#[allow(unsafe_code)]
fn deserialize(engine: &Engine, path: &Path) -> wasmtime::Result<Component> {
    // SAFETY: `Component::deserialize_file` trusts its input to be machine
    // code wasmtime produced. Files in this directory are written only by
    // `CompileCache::store` from `Component::serialize`, under a name keyed
    // by the component's sha256, the wasmtime version and the engine's
    // compilation settings, so the artifact matches this engine; wasmtime
    // also checks version and settings in the artifact header before use.
    // The file is mapped into memory for as long as the component lives;
    // `store` only ever replaces artifacts by rename (and `load` only
    // unlinks them), so a mapped file is never modified in place.
    unsafe { Component::deserialize_file(engine, path) }
}

/// Feeds `Hash` output into sha256 so the key is stable across runs
/// (unlike `DefaultHasher`, whose algorithm may change).
struct StableHasher(Sha256);

impl Hasher for StableHasher {
    fn finish(&self) -> u64 {
        0
    }

    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
}

/// Lowercase hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}
