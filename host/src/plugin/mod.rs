//! Loading a plugin component and calling it.
//!
//! [`LoadedPlugin::load`] reads a `.wasm` file, hashes it, compiles it (or
//! takes the compiled artifact from the [`CompileCache`]), links it against
//! the [`Sandbox`], reads its manifest, checks it, has the plugin validate
//! its settings, and resolves the manifest's `setting:<key>` write
//! namespaces from those settings ([`LoadedPlugin::effective_manifest`]).
//! Anything wrong rejects the load with a [`LoadError`]; a loaded plugin is
//! known to be usable.
//!
//! [`LoadedPlugin::reconcile`] runs one call in a fresh store — no state
//! survives between calls — under the plugin's deadline and memory cap.
//! A failed call is a [`CallError`] with a stable [`CallError::reason`].
//! Calls are synchronous and may run from many threads at once; the live
//! controller runs them on `tokio::task::spawn_blocking`.
//!
//! # Caveats
//!
//! Loading and calling must not happen directly on an async task: the
//! synchronous WASI bindings block on tokio internally, which panics
//! inside a runtime's worker thread. Use `spawn_blocking` (or a plain
//! thread).
//!
//! # Guarantees
//! - A loaded plugin is known to be usable: its manifest passed every
//!   check and its settings were accepted by the plugin itself.
//! - No state survives between calls, and no call outlives its deadline
//!   or exceeds its memory cap (see [`crate::sandbox`]).

mod admit;
pub mod budget;
mod cache;
mod convert;
pub mod rbac;

mod errors;

use std::path::Path;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;
use sha2::{Digest, Sha256};
use wasmtime::Store;
use wasmtime::component::Component;

pub use self::admit::AdmitInput;
pub use self::cache::CompileCache;
pub use self::convert::{MAX_OUTPUT_BYTES, MAX_OUTPUT_VALUES, OutputProblem, json_value_bound};
use crate::contract::bindings::{self, Plugin, PluginPre, types as wit};
pub use crate::contract::manifest;
use crate::contract::manifest::{Manifest, ManifestProblem};
use crate::judge::snapshot::Snapshot;
use crate::judge::validate::Plan;
use crate::sandbox::{Limits, Sandbox, StoreState};

/// A boxed error from wasmtime or the OS, kept as a `source`.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// How to load one plugin.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// The plugin's settings (JSON); `{}` when the operator gives none.
    pub settings: Value,
    /// Deadline and memory cap of each call.
    pub limits: Limits,
    /// Where compiled artifacts are cached; `None` compiles every time.
    pub cache: Option<CompileCache>,
}

impl Default for LoadOptions {
    /// Empty settings, default limits, and the cache in
    /// [`CompileCache::default_dir`] when a home directory is known.
    fn default() -> Self {
        LoadOptions {
            settings: Value::Object(serde_json::Map::new()),
            limits: Limits::default(),
            cache: CompileCache::default_dir().map(CompileCache::new),
        }
    }
}

pub use wasmop_contract::SettingsProblem;

pub use self::errors::{CallError, LoadError, PluginErrorKind};
use self::errors::{classify, trap_message};

/// A plugin ready to be called: compiled, linked, its manifest checked and
/// its settings accepted.
pub struct LoadedPlugin {
    name: String,
    version: String,
    digest: String,
    manifest: Manifest,
    effective: Manifest,
    settings: Value,
    limits: Limits,
    /// What a fresh instance holds against the memory cap before the
    /// guest runs: its linear memory's initial size and its tables.
    start_memory_bytes: usize,
    /// The component's imports, by name.
    imports: Vec<String>,
    from_cache: bool,
    sandbox: Arc<Sandbox>,
    pre: PluginPre<StoreState>,
    /// Set when the component also fits the `admitting-plugin` world.
    admit_pre: Option<bindings::admitting::AdmittingPluginPre<StoreState>>,
    /// What its calls cost, once loaded (see [`budget`]).
    budget: Option<Arc<budget::CallBudget>>,
}

impl std::fmt::Debug for LoadedPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedPlugin")
            .field("name", &self.name)
            .field("version", &self.version)
            .field("digest", &self.digest)
            .field("limits", &self.limits)
            .field("from_cache", &self.from_cache)
            .finish_non_exhaustive()
    }
}

/// `sha256:<hex>` of `bytes`.
pub fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", cache::hex(&Sha256::digest(bytes)))
}

impl LoadedPlugin {
    /// Loads the component at `path`.
    ///
    /// # Errors
    ///
    /// [`LoadError`] when the file cannot be read, is not a component of
    /// the `plugin` world, its manifest is invalid, or it rejects
    /// `options.settings`. A failed load changes nothing.
    pub fn load(
        sandbox: &Arc<Sandbox>,
        path: &Path,
        options: &LoadOptions,
    ) -> Result<LoadedPlugin, LoadError> {
        let bytes = std::fs::read(path).map_err(|source| LoadError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_bytes(sandbox, &bytes, &path.display().to_string(), options)
    }

    /// Loads a component from its bytes; `origin` names it in errors.
    ///
    /// # Errors
    ///
    /// As [`LoadedPlugin::load`], except reading.
    pub fn from_bytes(
        sandbox: &Arc<Sandbox>,
        bytes: &[u8],
        origin: &str,
        options: &LoadOptions,
    ) -> Result<LoadedPlugin, LoadError> {
        let maximum = sandbox.config().max_memory_bytes;
        if options.limits.memory_bytes > maximum {
            return Err(LoadError::LimitsTooLarge {
                requested: options.limits.memory_bytes,
                maximum,
            });
        }
        let engine = sandbox.engine();
        let digest = digest(bytes);
        let cached = options
            .cache
            .as_ref()
            .and_then(|cache| cache.load(engine, &digest));
        let from_cache = cached.is_some();
        let component = match cached {
            Some(component) => component,
            None => {
                let component = Component::new(engine, bytes).map_err(|e| LoadError::Compile {
                    origin: origin.to_owned(),
                    source: e.into(),
                })?;
                if let Some(cache) = &options.cache {
                    cache.store(engine, &digest, &component);
                }
                component
            }
        };
        let imports = component
            .component_type()
            .imports(engine)
            .map(|(name, _)| name.to_owned())
            .collect();
        let link_error = |e: wasmtime::Error| LoadError::Link {
            origin: origin.to_owned(),
            source: e.into(),
        };
        let instance_pre = sandbox
            .linker()
            .instantiate_pre(&component)
            .map_err(link_error)?;
        let pre = PluginPre::new(instance_pre.clone()).map_err(link_error)?;
        // The optional `admit` export: present when the component fits the
        // `admitting-plugin` world too.
        let admit_pre = bindings::admitting::AdmittingPluginPre::new(instance_pre).ok();

        let mut plugin = LoadedPlugin {
            name: String::new(),
            version: String::new(),
            digest,
            manifest: Manifest {
                name: String::new(),
                version: String::new(),
                controllers: Vec::new(),
                admission: Vec::new(),
            },
            effective: Manifest {
                name: String::new(),
                version: String::new(),
                controllers: Vec::new(),
                admission: Vec::new(),
            },
            settings: options.settings.clone(),
            limits: options.limits,
            start_memory_bytes: 0,
            imports,
            from_cache,
            sandbox: Arc::clone(sandbox),
            pre,
            admit_pre,
            budget: None,
        };

        let call_error = |export| {
            move |source| LoadError::Call {
                origin: origin.to_owned(),
                export,
                source,
            }
        };
        let (manifest, start_memory_bytes) = plugin
            .call(UNIX_EPOCH, |p, store| {
                let start = store.data().memory_used();
                Ok((p.call_manifest(&mut *store)?, start))
            })
            .map_err(call_error("manifest"))?;
        plugin.start_memory_bytes = start_memory_bytes;
        let manifest = convert::manifest_from_json(&manifest).map_err(|problem| {
            LoadError::InvalidManifest {
                origin: origin.to_owned(),
                problems: vec![ManifestProblem {
                    path: String::new(),
                    message: problem.to_string(),
                }],
            }
        })?;
        let mut problems = crate::contract::manifest::problems(&manifest);
        problems.extend(crate::contract::admission::problems(
            &manifest,
            plugin.admit_pre.is_some(),
        ));
        if !problems.is_empty() {
            return Err(LoadError::InvalidManifest {
                origin: origin.to_owned(),
                problems,
            });
        }
        let settings_text =
            serde_json::to_string(&options.settings).unwrap_or_else(|_| "{}".into());
        let verdict = plugin
            .call(UNIX_EPOCH, |p, store| {
                p.call_validate_settings(store, &settings_text)
            })
            .map_err(call_error("validate-settings"))?;
        if let Err(problems) = verdict {
            return Err(LoadError::InvalidSettings {
                plugin: manifest.name,
                problems: convert::settings_problems_from_json(&problems),
            });
        }
        let effective = crate::contract::manifest::resolve_settings(&manifest, &options.settings)
            .map_err(|problems| LoadError::WriteNamespaceSetting {
            plugin: manifest.name.clone(),
            problems,
        })?;
        plugin.name = manifest.name.clone();
        plugin.version = manifest.version.clone();
        plugin.budget = Some(budget::budget_for(
            &plugin.name,
            &plugin.version,
            crate::sandbox::deadline_ticks(options.limits.deadline, sandbox.config().epoch_tick),
        ));
        plugin.manifest = manifest;
        plugin.effective = effective;
        Ok(plugin)
    }

    /// What the component imports, by name (`wasi:cli/stderr@0.2.6`,
    /// `wasmop:reconciler/diagnostics@0.4.0`, …). A plugin built without
    /// WASI imports only the contract's interfaces.
    pub fn imports(&self) -> &[String] {
        &self.imports
    }

    /// The plugin's name (from its manifest).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The plugin's version (from its manifest).
    pub fn version(&self) -> &str {
        &self.version
    }

    /// `sha256:<hex>` of the component file.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// The checked manifest as the plugin declared it (what `wasmop
    /// inspect` shows), `setting:<key>` write namespaces unresolved.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The manifest the host enforces: the declared one with every
    /// `setting:<key>` write namespace replaced by the namespace the
    /// setting names (or dropped when the setting is absent). Snapshots,
    /// plan validation and execution use this one.
    pub fn effective_manifest(&self) -> &Manifest {
        &self.effective
    }

    /// Bytes a fresh instance of this plugin holds against its memory cap
    /// before it runs any code: the initial size of its linear memory
    /// (set when the plugin is linked) and its tables.
    pub fn start_memory_bytes(&self) -> usize {
        self.start_memory_bytes
    }

    /// The settings the plugin accepted.
    pub fn settings(&self) -> &Value {
        &self.settings
    }

    /// Deadline and memory cap of each call.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// True when the compiled code came from the compile cache.
    pub fn compiled_from_cache(&self) -> bool {
        self.from_cache
    }

    /// Computes the plan for one snapshot.
    ///
    /// # Guarantees
    ///
    /// A fresh store per call: nothing of an earlier call is visible. The
    /// call is interrupted at the plugin's deadline and cannot grow memory
    /// past its cap. The guest's clock reads `snapshot.now`.
    ///
    /// # Errors
    ///
    /// [`CallError`] for a trap, timeout, memory cap, malformed output or
    /// the plugin's own error. The plan is *not* validated against the
    /// manifest here; see [`crate::judge::validate::validate`].
    pub fn reconcile(&self, snapshot: &Snapshot) -> Result<Plan, CallError> {
        let input = convert::snapshot_to_wit(snapshot);
        let now = parse_now(&snapshot.now);
        let (answer, cap_hit) = self.call(now, |p, store| {
            let answer = p.call_reconcile(&mut *store, &input)?;
            Ok((answer, store.data().memory_cap_hit()))
        })?;
        if let Some(b) = &self.budget {
            let output = answer.as_ref().map_or(0, String::len);
            b.record_bytes(convert::wit_snapshot_bytes(&input), output);
        }
        match answer {
            Ok(plan) => convert::plan_from_json(&plan).map_err(CallError::MalformedOutput),
            // A language runtime may catch the failed growth itself (a
            // JavaScript or Python plugin sees an out-of-memory exception)
            // and answer with an error: the cause is still the cap.
            Err(_) if cap_hit => Err(CallError::OutOfMemory {
                cap_bytes: self.limits.memory_bytes,
            }),
            Err(e) => {
                let (kind, message) = match e {
                    wit::ReconcileError::InvalidSpec(m) => (PluginErrorKind::InvalidSpec, m),
                    wit::ReconcileError::NotReady(m) => (PluginErrorKind::NotReady, m),
                    wit::ReconcileError::Internal(m) => (PluginErrorKind::Internal, m),
                };
                Err(CallError::PluginError { kind, message })
            }
        }
    }

    /// The stages of [`LoadedPlugin::reconcile`] one at a time, for
    /// `host/benches/reconcile.rs`: a fresh store and instantiation only.
    ///
    /// # Errors
    ///
    /// As [`LoadedPlugin::reconcile`].
    #[doc(hidden)]
    pub fn bench_instantiate(&self) -> Result<(), CallError> {
        self.call(UNIX_EPOCH, |_, _| Ok(()))
    }

    /// A fresh store, instantiation and the cheapest export
    /// (`validate-settings` of `{}`), for the benchmarks.
    ///
    /// # Errors
    ///
    /// As [`LoadedPlugin::reconcile`].
    #[doc(hidden)]
    pub fn bench_trivial_call(&self) -> Result<(), CallError> {
        self.call(UNIX_EPOCH, |p, store| p.call_validate_settings(store, "{}"))
            .map(drop)
    }

    /// [`LoadedPlugin::reconcile`] without parsing the plan: the plan's
    /// JSON text as the plugin returned it, for the benchmarks.
    ///
    /// # Errors
    ///
    /// As [`LoadedPlugin::reconcile`], except a malformed plan.
    #[doc(hidden)]
    pub fn bench_reconcile_text(&self, snapshot: &Snapshot) -> Result<String, CallError> {
        let input = convert::snapshot_to_wit(snapshot);
        let now = parse_now(&snapshot.now);
        self.call(now, |p, store| p.call_reconcile(store, &input))?
            .map_err(|_| CallError::PluginError {
                kind: PluginErrorKind::Internal,
                message: "the plugin answered with an error".to_owned(),
            })
    }

    /// Instantiates the plugin in a fresh bounded store and runs `f`.
    fn call<R>(
        &self,
        now: SystemTime,
        f: impl FnOnce(&Plugin, &mut Store<StoreState>) -> wasmtime::Result<R>,
    ) -> Result<R, CallError> {
        // The budget's measures: thread CPU time and wall time around the
        // whole call, the store's memory at its end (it never shrinks).
        let started = self
            .budget
            .as_ref()
            .map(|_| (budget::thread_cpu_time(), std::time::Instant::now()));
        let mut store = self.sandbox.store(&self.limits, now);
        let result = match self.pre.instantiate(&mut store) {
            Ok(plugin) => f(&plugin, &mut store).map_err(|e| {
                classify(&e, store.data(), self.limits).unwrap_or_else(|| CallError::Trap {
                    message: trap_message(&e, &store.data().stderr()),
                })
            }),
            Err(e) => Err(match classify(&e, store.data(), self.limits) {
                Some(err) => err,
                None => CallError::Instantiate(e.into()),
            }),
        };
        if let (Some(b), Some((cpu, wall))) = (&self.budget, started) {
            let tick = self.sandbox.config().epoch_tick.as_nanos().max(1);
            let ticks = u64::try_from(wall.elapsed().as_nanos().div_ceil(tick)).unwrap_or(u64::MAX);
            b.record_call(
                budget::thread_cpu_time().saturating_sub(cpu),
                store.data().memory_used(),
                ticks,
            );
        }
        result
    }

    /// What this plugin version's calls cost (see [`budget`]).
    pub fn budget(&self) -> Option<&Arc<budget::CallBudget>> {
        self.budget.as_ref()
    }
}

/// The host's halves of a call, for `host/benches/reconcile.rs`.
#[doc(hidden)]
pub mod stages {
    use super::{OutputProblem, Plan, Snapshot, convert};

    /// The snapshot as the WIT record handed to the plugin (its objects as
    /// JSON texts); opaque.
    pub fn snapshot_to_wit(snapshot: &Snapshot) -> impl Sized + use<> {
        convert::snapshot_to_wit(snapshot)
    }

    /// The plan from the plugin's JSON text, checked as
    /// [`super::LoadedPlugin::reconcile`] checks it.
    ///
    /// # Errors
    ///
    /// When the text is not a well-formed plan.
    pub fn plan_from_json(text: &str) -> Result<Plan, OutputProblem> {
        convert::plan_from_json(text)
    }
}

/// The snapshot's `now` as a time for the guest clock; the Unix epoch when
/// it does not parse.
fn parse_now(now: &str) -> SystemTime {
    now.parse::<k8s_openapi::jiff::Timestamp>()
        .map(SystemTime::from)
        .unwrap_or(UNIX_EPOCH)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn loaded_plugins_are_shareable_across_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<LoadedPlugin>();
    }

    #[test]
    fn reasons_are_stable() {
        let cases = [
            (
                CallError::Trap {
                    message: String::new(),
                },
                "PluginTrapped",
            ),
            (
                CallError::Timeout {
                    deadline: Duration::from_secs(2),
                },
                "PluginTimedOut",
            ),
            (
                CallError::OutOfMemory {
                    cap_bytes: 64 << 20,
                },
                "PluginOutOfMemory",
            ),
            (
                CallError::MalformedOutput(OutputProblem::NotAnObject {
                    field: "status".into(),
                }),
                "PluginOutputMalformed",
            ),
            (
                CallError::PluginError {
                    kind: PluginErrorKind::InvalidSpec,
                    message: String::new(),
                },
                "InvalidSpec",
            ),
            (
                CallError::PluginError {
                    kind: PluginErrorKind::NotReady,
                    message: String::new(),
                },
                "NotReady",
            ),
            (
                CallError::PluginError {
                    kind: PluginErrorKind::Internal,
                    message: String::new(),
                },
                "PluginError",
            ),
        ];
        for (err, reason) in cases {
            assert_eq!(err.reason(), reason, "{err}");
        }
    }

    #[test]
    fn trap_messages_keep_the_panic_and_drop_the_backtrace_hint() {
        let e = wasmtime::Error::new(wasmtime::Trap::UnreachableCodeReached);
        let stderr = "\nthread '<unnamed>' panicked at src/lib.rs:5:5:\ndeliberate panic\nnote: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n";
        let message = trap_message(&e, stderr);
        assert!(
            message.starts_with(
                "thread '<unnamed>' panicked at src/lib.rs:5:5: deliberate panic (wasm trap: wasm `unreachable`"
            ),
            "{message}"
        );
        assert!(!message.contains('\n'));
    }

    #[test]
    fn now_parses_rfc3339() {
        assert_eq!(
            parse_now("1970-01-01T00:00:10Z"),
            UNIX_EPOCH + Duration::from_secs(10)
        );
        assert_eq!(parse_now("yesterday"), UNIX_EPOCH);
    }
}
