//! The wasmtime engine every plugin runs on, and the only way to get a
//! [`Store`] for a plugin call: with a memory cap and a deadline.
//!
//! One [`Sandbox`] is shared by all plugins. It owns the [`Engine`]
//! (component model, pooling allocator, epoch interruption), the
//! [`Linker`] (the contract's `diagnostics` import, and WASI preview 2 with
//! nothing granted for plugins built for `wasm32-wasip2`), and an epoch ticker
//! thread that holds only a weak engine reference and stops when the
//! engine is dropped.
//!
//! Calls are synchronous (no wasmtime async): the live controller runs them
//! on `tokio::task::spawn_blocking`.
//!
//! # Guarantees
//!
//! Each call starts from the plugin's initial memory, ends on time and is
//! held to one memory cap, as the next three sections say. The engine's
//! tuning and memory reset are `tuning`, a call's store state and clocks
//! `store`, the memory cap `memory`.
//!
//! # Every call starts from the plugin's initial memory
//!
//! Each call is a new instance in a new store. Its linear memory (and its
//! tables) come from a pool slot, which wasmtime restores to the module's
//! initial image before the slot is used again. As shipped
//! ([`MemoryReset::Whole`]), when a call ends the first
//! [`Tuning::rewrite_resident`] bytes (512 KiB) of its memory are rewritten
//! from the image (or zeroed), every one of them, and stay mapped; every
//! other page it touched is returned to the kernel, and the next call in
//! the slot faults in the image or zeroes afresh there. Neither depends on
//! what the kernel did to the pages meanwhile (swapped them out, moved
//! them). Plugins linked as this repository links them (a 256 KiB stack,
//! first in memory, `.cargo/config.toml`) have their stack, data and the
//! start of their heap in those 512 KiB, so a small call faults in no page.
//!
//! The faster reset, [`SandboxConfig::dirty_pages_reset`], finds the pages
//! a call dirtied with `PAGEMAP_SCAN` and copies them back from the image
//! (or zeroes them) within the first [`Tuning::memory_keep_resident`] bytes
//! (4 MiB), sparing the next call a page fault for each page it touches
//! beyond the whole reset's 512 KiB (a 1 MB call is about a quarter
//! faster; calls that stay within them gain nothing). The scan, as wasmtime 48 uses it, reports only pages that are
//! present, and a dirty page is not present while the kernel has it in
//! swap or is migrating it (compaction moves pages to make room for large
//! allocations): such a page is neither reset nor returned, and the next
//! call in the slot reads what the previous one wrote there.
//! `host/tests/swap.rs` shows it with a swap file and
//! `host/tests/compaction.rs` with compaction, which every Linux kernel
//! runs; so it is opt-in, and even then used only where the kernel has the
//! scan (Linux 6.7+) and swap cannot reach this process ([`swap_in_reach`]:
//! no active swap device, or a cgroup whose `memory.swap.max` is 0).
//! [`Sandbox::memory_reset`] says which reset is in use, and the operator
//! logs it at start; with the faster reset, swap turned on later is logged
//! as an error (checked every 10 s) asking for a restart.
//!
//! # Every call ends on time
//!
//! Epoch interruption stops wasm code at the deadline, but not a host call
//! that blocks. The only WASI calls that can block in this sandbox are
//! waits on a monotonic-clock subscription (`std::thread::sleep`, `poll`
//! with a timeout): stdin is closed, stdout is a sink, stderr a bounded
//! buffer, and there are no files or sockets. So the linker replaces
//! `wasi:clocks/monotonic-clock`'s `subscribe-duration` and
//! `subscribe-instant`: a wait that ends before the call's deadline sleeps
//! (so it ends before the deadline too); a wait that would end after it
//! traps at once with [`DeadlineExceeded`], reported as a timeout like a
//! busy loop. No call, whatever the guest does, outlives its deadline by
//! more than one epoch tick. The contract's one import,
//! `diagnostics.panic-text`, only appends to a bounded buffer.
//!
//! # One memory cap per store
//!
//! The [`wasmtime::ResourceLimiter`] of a store sums every linear memory
//! and every table (at one pointer per element) of every instance in it; the
//! sum may not exceed [`Limits::memory_bytes`].

mod memory;
mod store;
mod tuning;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use crate::contract::bindings::wasmop::reconciler::diagnostics;
use crate::judge::validate::PlanLimits;
use thiserror::Error;
use wasmtime::component::{HasSelf, Linker, ResourceTable};
use wasmtime::{
    Config, Enabled, Engine, Inlining, InstanceAllocationStrategy, PoolingAllocationConfig, Store,
};

/// How the shared engine is sized.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxConfig {
    /// Plugin calls that may run at once (pool slots). Default 64.
    pub max_instances: u32,
    /// Largest memory any plugin may be given, in bytes (the pool's slot
    /// size). Per-plugin caps ([`Limits::memory_bytes`]) must not exceed it.
    /// Default 512 MiB.
    pub max_memory_bytes: usize,
    /// How often the epoch advances; deadlines are enforced to about this
    /// precision. Default 10 ms.
    pub epoch_tick: Duration,
    /// Reset only the pages a call dirtied ([`MemoryReset::DirtyPages`])
    /// where the kernel has `PAGEMAP_SCAN` and swap cannot reach this
    /// process, instead of the whole reset ([`MemoryReset::Whole`]).
    /// Faster for calls that touch more than the whole reset's first
    /// 512 KiB (BENCHMARKS.md, "The first 512 KiB kept"), but
    /// a dirty page the kernel is migrating as the call ends escapes the
    /// scan and keeps the call's data for the next call of the same plugin
    /// (see the module documentation). Default off.
    pub dirty_pages_reset: bool,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            max_instances: 64,
            max_memory_bytes: 512 << 20,
            epoch_tick: Duration::from_millis(10),
            dirty_pages_reset: false,
        }
    }
}

/// The bounds of one plugin call; configurable per plugin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Wall-clock time a call may run. Default 2 s.
    pub deadline: Duration,
    /// Largest size of all linear memories and tables of one call together,
    /// in bytes (a table element counts as one pointer). Default 64 MiB.
    pub memory_bytes: usize,
    /// How much one plan may ask for (counts and the requeue floor).
    pub plan: PlanLimits,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            deadline: Duration::from_secs(2),
            memory_bytes: 64 << 20,
            plan: PlanLimits::default(),
        }
    }
}

use self::memory::MemoryCap;
use self::store::bounded_clock_waits;
pub use self::store::{DeadlineExceeded, StoreState};
use self::tuning::scan_in_kernel;
pub use self::tuning::{MemoryReset, SWAP_CHECK_EVERY, Tuning, swap_in_reach};

/// Size of the in-memory stderr a call may fill (for panic messages).
pub const STDERR_CAPACITY: usize = 16 << 10;

/// Why the sandbox could not be built.
#[derive(Debug, Error)]
pub enum SandboxError {
    /// wasmtime rejected the engine configuration.
    #[error("cannot create the wasmtime engine")]
    Engine(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// WASI could not be added to the linker.
    #[error("cannot link WASI into the plugin linker")]
    Linker(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The epoch ticker thread could not be started.
    #[error("cannot start the epoch ticker thread")]
    Ticker(#[source] std::io::Error),
}

/// The shared engine and linker. Cheap to share behind an [`Arc`].
pub struct Sandbox {
    engine: Engine,
    reset: MemoryReset,
    /// Set by the epoch ticker when swap came into reach after a sandbox
    /// that scans for dirty pages was made.
    swap_late: Arc<AtomicBool>,
    linker: Linker<StoreState>,
    config: SandboxConfig,
    /// False only for a benchmark's sandbox without deadlines.
    epochs: bool,
    /// True only for a benchmark's sandbox that counts fuel.
    fuel: bool,
    /// Epoch checks per place in the guest, for a benchmark's sandbox
    /// made with [`Tuning::count_checks`].
    checks: Option<Arc<Mutex<HashMap<CheckPlace, u64>>>>,
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Sandbox {
    /// Builds the engine, the WASI linker and starts the epoch ticker.
    ///
    /// # Errors
    ///
    /// [`SandboxError`] when wasmtime rejects the configuration (e.g. the
    /// platform cannot reserve the pool) or the ticker thread cannot start.
    pub fn new(config: SandboxConfig) -> Result<Arc<Sandbox>, SandboxError> {
        Self::tuned(config, Tuning::default())
    }

    /// [`Sandbox::new`] with the engine settings of `tuning`. Only the
    /// benchmarks use anything but [`Tuning::default`], to compare settings
    /// in one run; `Tuning { epoch_interruption: false, .. }` gives calls
    /// no deadline.
    ///
    /// # Errors
    ///
    /// As [`Sandbox::new`].
    #[doc(hidden)]
    pub fn tuned(config: SandboxConfig, tuning: Tuning) -> Result<Arc<Sandbox>, SandboxError> {
        let reset = if !config.dirty_pages_reset {
            MemoryReset::Whole {
                why: "the default: the page scan misses pages the kernel is moving".into(),
            }
        } else if tuning.pagemap_scan {
            let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
            // Swap is looked at only where the kernel has the scan at all,
            // and not by a tuning that ignores it.
            let swap = || (!tuning.ignore_swap).then(swap_in_reach).flatten();
            match scan_in_kernel(&release).or_else(swap) {
                Some(why) => MemoryReset::Whole { why },
                None => MemoryReset::DirtyPages,
            }
        } else {
            MemoryReset::Whole {
                why: "the page scan is off in this sandbox's tuning".into(),
            }
        };
        // Without the scan, wasmtime rewrites the whole kept stretch after
        // every call (its `memset`/copy of the first bytes), which is what
        // the whole reset wants of its first bytes; with the scan, only the
        // dirty pages it finds (BENCHMARKS.md, "Swap", "The first 512 KiB
        // kept").
        let (memory_keep_resident, pagemap_scan) = match reset {
            MemoryReset::DirtyPages => (tuning.memory_keep_resident, Enabled::Auto),
            MemoryReset::Whole { .. } => (tuning.rewrite_resident, Enabled::No),
        };
        let mut pool = PoolingAllocationConfig::new();
        let n = config.max_instances.max(1);
        pool.total_component_instances(n)
            // A Rust wasip2 component holds a few core instances (the
            // program plus adapter shims) and usually one memory.
            .total_core_instances(n.saturating_mul(8))
            .total_memories(n.saturating_mul(2))
            .total_tables(n.saturating_mul(8))
            .max_memories_per_module(1)
            .max_memory_size(config.max_memory_bytes)
            .linear_memory_keep_resident(memory_keep_resident)
            .table_keep_resident(tuning.table_keep_resident)
            .pagemap_scan(pagemap_scan);

        let mut wasm = Config::new();
        wasm.wasm_component_model(true)
            .epoch_interruption(tuning.epoch_interruption)
            .consume_fuel(tuning.fuel)
            .compiler_inlining(if tuning.inlining {
                Inlining::Yes
            } else {
                Inlining::No
            })
            .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let engine = Engine::new(&wasm).map_err(|e| SandboxError::Engine(e.into()))?;

        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker)
            .map_err(|e| SandboxError::Linker(e.into()))?;
        bounded_clock_waits(&mut linker).map_err(|e| SandboxError::Linker(e.into()))?;
        diagnostics::add_to_linker::<StoreState, HasSelf<StoreState>>(&mut linker, |s| s)
            .map_err(|e| SandboxError::Linker(e.into()))?;

        let weak = engine.weak();
        let tick = config.epoch_tick;
        // The reset is chosen once; swap turned on later is reported (once)
        // so that a person knows to restart the operator.
        let mut watch_swap = reset == MemoryReset::DirtyPages && !tuning.ignore_swap;
        let mut next_swap_check = Instant::now() + SWAP_CHECK_EVERY;
        let swap_late = Arc::new(AtomicBool::new(false));
        let seen_late = Arc::clone(&swap_late);
        std::thread::Builder::new()
            .name("wasmop-epoch".into())
            .spawn(move || {
                while let Some(engine) = weak.upgrade() {
                    engine.increment_epoch();
                    drop(engine);
                    if watch_swap && Instant::now() >= next_swap_check {
                        next_swap_check = Instant::now() + SWAP_CHECK_EVERY;
                        if let Some(why) = swap_in_reach() {
                            tracing::error!(
                                %why,
                                "swap came on after the operator started: plugin calls may see memory an earlier call left; restart the operator so that calls reset their memory the safe way"
                            );
                            seen_late.store(true, Ordering::Relaxed);
                            watch_swap = false;
                        }
                    }
                    std::thread::sleep(tick);
                }
            })
            .map_err(SandboxError::Ticker)?;

        Ok(Arc::new(Sandbox {
            engine,
            reset,
            swap_late,
            linker,
            config,
            epochs: tuning.epoch_interruption,
            fuel: tuning.fuel,
            checks: (tuning.epoch_interruption && tuning.count_checks).then(Default::default),
        }))
    }

    /// How a call's memory is restored for the next call in its pool slot.
    pub fn memory_reset(&self) -> &MemoryReset {
        &self.reset
    }

    /// Whether swap came into reach after this sandbox chose to reset only
    /// dirty pages (checked every 10 s, and logged as an error when seen).
    pub fn swap_came_on_after_start(&self) -> bool {
        self.swap_late.load(Ordering::Relaxed)
    }

    /// The shared engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The configuration the sandbox was built with.
    pub fn config(&self) -> &SandboxConfig {
        &self.config
    }

    /// The epoch checks counted since the last take, per place, in no
    /// particular order (empty unless made with [`Tuning::count_checks`]).
    #[doc(hidden)]
    pub fn take_check_counts(&self) -> Vec<(CheckPlace, u64)> {
        let Some(checks) = &self.checks else {
            return Vec::new();
        };
        checks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain()
            .collect()
    }

    pub(crate) fn linker(&self) -> &Linker<StoreState> {
        &self.linker
    }

    /// A fresh store for one call, bounded by `limits`: memories and tables
    /// together may not grow past `limits.memory_bytes`, the call traps
    /// with `Trap::Interrupt` once `limits.deadline` has passed, and a clock
    /// wait that would end after the deadline traps with
    /// [`DeadlineExceeded`] at once. The guest's
    /// wall clock reads `now`, its monotonic clock stands still, its
    /// random sources are fixed, it has no files, environment, arguments
    /// or network, and its stderr goes to a [`STDERR_CAPACITY`] buffer.
    pub fn store(&self, limits: &Limits, now: SystemTime) -> Store<StoreState> {
        let state = StoreState {
            wasi: None,
            panic_text: Vec::new(),
            now,
            table: ResourceTable::new(),
            limiter: MemoryCap {
                bytes: limits.memory_bytes,
                used: 0,
                hit: false,
            },
            deadline: Instant::now() + limits.deadline,
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limiter);
        if let Some(checks) = &self.checks {
            count_checks(&mut store, Arc::clone(checks));
        } else if self.epochs {
            store.set_epoch_deadline(deadline_ticks(limits.deadline, self.config.epoch_tick));
            store.epoch_deadline_trap();
        }
        if self.fuel {
            // Cannot fail: fuel is enabled in this engine's config.
            let _ = store.set_fuel(u64::MAX);
        }
        store
    }
}

/// Where an epoch check is: the guest function (its name, or `#` and its
/// index in a module without names) and the check's offset in the
/// function's code. A function's entry check is the one at its lowest
/// offset; the others are at loop headers.
#[doc(hidden)]
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CheckPlace {
    /// The function's name.
    pub function: String,
    /// Offset of the check in the function's code, when known.
    pub offset: Option<usize>,
}

/// Makes every epoch check of `store` call back (a deadline of the current
/// epoch, renewed the same way each time), count the check against its
/// [`CheckPlace`] on top of the guest's stack and trap once the store's
/// deadline has passed.
fn count_checks(store: &mut Store<StoreState>, checks: Arc<Mutex<HashMap<CheckPlace, u64>>>) {
    store.set_epoch_deadline(0);
    store.epoch_deadline_callback(move |ctx| {
        if Instant::now() >= ctx.data().deadline {
            return Err(wasmtime::Trap::Interrupt.into());
        }
        let trace = wasmtime::WasmBacktrace::force_capture(&ctx);
        let place = trace.frames().first().map_or_else(
            || CheckPlace {
                function: "(no guest frame)".to_owned(),
                offset: None,
            },
            |f| CheckPlace {
                function: f
                    .func_name()
                    .map_or_else(|| format!("#{}", f.func_index()), str::to_owned),
                offset: f.func_offset(),
            },
        );
        let mut checks = checks.lock().unwrap_or_else(PoisonError::into_inner);
        *checks.entry(place).or_insert(0) += 1;
        Ok(wasmtime::UpdateDeadline::Continue(0))
    });
}

/// Epoch ticks that cover `deadline`, plus one for the tick in progress.
/// A deadline in epoch ticks of `tick` (rounded up, plus the tick under
/// way when the call starts).
pub fn deadline_ticks(deadline: Duration, tick: Duration) -> u64 {
    let tick = tick.as_nanos().max(1);
    let ticks = deadline.as_nanos().div_ceil(tick);
    u64::try_from(ticks).unwrap_or(u64::MAX).saturating_add(1)
}

#[cfg(test)]
mod tests {
    use super::memory::TABLE_ELEMENT_BYTES;
    use super::tuning::{cgroup_v2_path, swap_max_files, swap_verdict};
    use super::*;
    use std::time::UNIX_EPOCH;
    use wasmtime_wasi::WasiView;

    /// A guest may call `diagnostics.panic-text` as often as its deadline
    /// lets it and with any `len`: the host keeps at most
    /// [`STDERR_CAPACITY`] bytes, and never more than 8 from one call.
    #[test]
    fn reported_panic_text_is_bounded() {
        let sandbox = Sandbox::new(SandboxConfig::default()).expect("sandbox");
        let mut store = sandbox.store(&Limits::default(), UNIX_EPOCH);
        let state = store.data_mut();
        diagnostics::Host::panic_text(state, u64::from_le_bytes(*b"panicked"), 255);
        diagnostics::Host::panic_text(state, u64::from_le_bytes(*b" at x\0\0\0"), 5);
        diagnostics::Host::panic_text(state, 0, 0);
        assert_eq!(state.stderr(), "panicked at x");
        for _ in 0..STDERR_CAPACITY {
            diagnostics::Host::panic_text(state, u64::MAX, u8::MAX);
        }
        assert_eq!(state.panic_text.len(), STDERR_CAPACITY);
        assert!(state.panic_text.starts_with(b"panicked at x\xff"));
    }

    #[test]
    fn deadlines_round_up_to_whole_ticks_plus_one() {
        let tick = Duration::from_millis(10);
        assert_eq!(deadline_ticks(Duration::from_secs(2), tick), 201);
        assert_eq!(deadline_ticks(Duration::from_millis(15), tick), 3);
        assert_eq!(deadline_ticks(Duration::ZERO, tick), 1);
    }

    #[test]
    fn the_epoch_ticker_stops_when_the_engine_is_dropped() {
        let sandbox = Sandbox::new(SandboxConfig {
            max_instances: 2,
            max_memory_bytes: 16 << 20,
            epoch_tick: Duration::from_millis(1),
            ..SandboxConfig::default()
        })
        .expect("sandbox");
        let weak = sandbox.engine().weak();
        drop(sandbox);
        // The ticker holds the engine only for the instant of a tick.
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while weak.upgrade().is_some() {
            assert!(std::time::Instant::now() < deadline, "engine still alive");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn the_memory_cap_is_one_sum_over_every_memory_and_table() {
        use wasmtime::ResourceLimiter;
        let mut cap = MemoryCap {
            bytes: 4 << 20,
            used: 0,
            hit: false,
        };
        // Two memories of 1.5 MiB each fit; a third does not.
        assert!(cap.memory_growing(0, 3 << 19, None).unwrap());
        assert!(cap.memory_growing(0, 3 << 19, None).unwrap());
        assert!(!cap.hit);
        assert!(!cap.memory_growing(0, 3 << 19, None).unwrap());
        assert!(cap.hit);
        assert_eq!(cap.used, 3 << 20);
        // Tables count too: 1 MiB of table elements is one too many now.
        let elements = (1 << 20) / TABLE_ELEMENT_BYTES;
        assert!(!cap.table_growing(0, elements, None).unwrap());
        assert!(cap.table_growing(0, 1000, None).unwrap());
        assert_eq!(cap.used, (3 << 20) + 1000 * TABLE_ELEMENT_BYTES);
        // Growth counts only the difference.
        assert!(cap.memory_growing(3 << 19, 4 << 19, None).unwrap());
        assert_eq!(cap.used, (3 << 20) + (1 << 19) + 1000 * TABLE_ELEMENT_BYTES);
        // Growth past an object's own maximum is refused without counting.
        let used = cap.used;
        assert!(!cap.memory_growing(0, 1 << 16, Some(0)).unwrap());
        assert_eq!(cap.used, used);
    }

    /// A component whose `probe` reads four places of its memory — a data
    /// segment's word at 128 KiB (5 in the image), zero bytes at 256 KiB,
    /// 1 MiB and 9 MiB (within the stretch a whole reset rewrites, and
    /// within and beyond the part a dirty-pages reset keeps) — and then
    /// dirties all of them: 5 when every one is as in the image.
    fn probe_component(engine: &Engine) -> wasmtime::component::Component {
        let wat = r#"(component
  (core module $m
    (memory 160)
    (data (i32.const 131072) "\05\00\00\00")
    (func (export "probe") (result i32)
      (local $seen i32)
      (local.set $seen (i32.add
        (i32.load (i32.const 131072))
        (i32.add
          (i32.add
            (i32.shl (i32.load8_u (i32.const 1048576)) (i32.const 8))
            (i32.shl (i32.load8_u (i32.const 9437184)) (i32.const 16)))
          (i32.shl (i32.load8_u (i32.const 262144)) (i32.const 24)))))
      (memory.fill (i32.const 0) (i32.const 171) (i32.const 10485760))
      (local.get $seen)))
  (core instance $i (instantiate $m))
  (func (export "probe") (result u32) (canon lift (core func $i "probe"))))"#;
        let bytes = wat::parse_str(wat).expect("the probe component parses");
        wasmtime::component::Component::new(engine, bytes).expect("compiles")
    }

    /// A sandbox of one pooled slot (so each call reuses the last one's
    /// memory), 16 MiB per call, 10 ms epoch ticks, with the faster reset of
    /// dirty pages where this machine allows it (so that `tuning`'s page
    /// scan and resident bytes are what a call's memory goes through).
    fn one_slot(tuning: Tuning) -> Arc<Sandbox> {
        Sandbox::tuned(
            SandboxConfig {
                max_instances: 1,
                max_memory_bytes: 16 << 20,
                epoch_tick: Duration::from_millis(10),
                dirty_pages_reset: true,
            },
            tuning,
        )
        .expect("sandbox")
    }

    /// A fresh store under `limits`, an instance of `pre` in it and a call
    /// of its `export` (no arguments, one `u32` result); the store is kept
    /// for what the call left in it.
    fn call_u32(
        sandbox: &Sandbox,
        pre: &wasmtime::component::InstancePre<StoreState>,
        limits: &Limits,
        export: &str,
    ) -> (Store<StoreState>, wasmtime::Result<u32>) {
        let mut store = sandbox.store(limits, UNIX_EPOCH);
        let instance = pre.instantiate(&mut store).expect("instantiates");
        let func = instance
            .get_typed_func::<(), (u32,)>(&mut store, export)
            .unwrap_or_else(|e| panic!("{export} export: {e}"));
        let result = func.call(&mut store, ()).map(|(n,)| n);
        (store, result)
    }

    /// Every tuning a benchmark may build a sandbox with.
    fn every_tuning() -> [Tuning; 4] {
        [
            Tuning::default(),
            Tuning::wasmtime_defaults(),
            Tuning {
                inlining: true,
                ..Tuning::default()
            },
            Tuning {
                count_checks: true,
                ..Tuning::default()
            },
        ]
    }

    #[test]
    fn counted_checks_are_each_function_entry_and_loop_turn() {
        let wat = r#"(component
  (core module $m
    (func $step (param i32) (result i32) (i32.add (local.get 0) (i32.const 1)))
    (func $run (export "run") (result i32)
      (local $n i32)
      (loop $again
        (local.set $n (call $step (local.get $n)))
        (br_if $again (i32.lt_u (local.get $n) (i32.const 10))))
      (local.get $n)))
  (core instance $i (instantiate $m))
  (func (export "run") (result u32) (canon lift (core func $i "run"))))"#;
        let bytes = wat::parse_str(wat).expect("the component parses");
        let sandbox = one_slot(Tuning {
            count_checks: true,
            ..Tuning::default()
        });
        let component =
            wasmtime::component::Component::new(sandbox.engine(), &bytes).expect("compiles");
        let pre = sandbox.linker().instantiate_pre(&component).expect("links");
        for _ in 0..2 {
            let (_, ran) = call_u32(&sandbox, &pre, &Limits::default(), "run");
            assert_eq!(ran.expect("runs"), 10);
            // `step` is entered 10 times; `run` once (its check at the
            // lowest offset), and its loop's header is passed 10 times.
            let mut places = sandbox.take_check_counts();
            places.sort_by(|a, b| a.0.cmp(&b.0));
            let seen: Vec<(&str, u64)> = places
                .iter()
                .map(|(place, n)| (place.function.as_str(), *n))
                .collect();
            assert_eq!(seen, [("run", 1), ("run", 10), ("step", 10)], "{places:?}");
            assert!(places.iter().all(|(place, _)| place.offset.is_some()));
        }
        // Nothing is counted without the tuning.
        assert!(one_slot(Tuning::default()).take_check_counts().is_empty());
    }

    #[test]
    fn a_spinning_call_meets_its_deadline_under_every_tuning() {
        // A loop whose body is only a call to a tiny function: with
        // inlining, the callee's entry check is gone and only the loop's
        // back-edge check is left to stop it.
        let wat = r#"(component
  (core module $m
    (func $step (param i32) (result i32) (i32.add (local.get 0) (i32.const 1)))
    (func (export "spin") (result i32)
      (local $n i32)
      (loop $again
        (local.set $n (call $step (local.get $n)))
        (br $again))
      (local.get $n)))
  (core instance $i (instantiate $m))
  (func (export "spin") (result u32) (canon lift (core func $i "spin"))))"#;
        let bytes = wat::parse_str(wat).expect("the spinning component parses");
        for tuning in every_tuning() {
            let sandbox = one_slot(tuning);
            let component =
                wasmtime::component::Component::new(sandbox.engine(), &bytes).expect("compiles");
            let pre = sandbox.linker().instantiate_pre(&component).expect("links");
            let limits = Limits {
                deadline: Duration::from_millis(100),
                ..Limits::default()
            };
            let started = std::time::Instant::now();
            let (_, spun) = call_u32(&sandbox, &pre, &limits, "spin");
            let e = spun.expect_err("never returns by itself");
            assert_eq!(
                e.downcast_ref::<wasmtime::Trap>(),
                Some(&wasmtime::Trap::Interrupt),
                "under {tuning:?}: {e:?}"
            );
            // Generous for a loaded machine; a check that never fires would
            // spin forever, not for seconds.
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "under {tuning:?} it ran {:?}",
                started.elapsed()
            );
        }
    }

    #[test]
    fn pooled_slots_are_pristine_for_every_call_under_every_tuning() {
        // The benchmarks' fuel tuning too (it has no deadline, so it is not
        // one of `every_tuning`).
        let fuel = Tuning {
            epoch_interruption: false,
            fuel: true,
            ..Tuning::default()
        };
        for tuning in every_tuning().into_iter().chain([fuel]) {
            let sandbox = one_slot(tuning);
            let component = probe_component(sandbox.engine());
            let pre = sandbox.linker().instantiate_pre(&component).expect("links");
            // One slot: every call reuses the memory the previous one dirtied.
            for call in 0..4 {
                let (_, seen) = call_u32(&sandbox, &pre, &Limits::default(), "probe");
                let seen = seen.expect("runs");
                assert_eq!(seen, 5, "call {call} under {tuning:?} saw {seen:#x}");
            }
        }
    }

    #[test]
    fn the_default_reset_rewrites_or_returns_every_page_on_any_machine_and_keeps_slots_pristine() {
        let sandbox = Sandbox::new(SandboxConfig {
            max_instances: 1,
            max_memory_bytes: 16 << 20,
            ..SandboxConfig::default()
        })
        .expect("sandbox");
        match sandbox.memory_reset() {
            MemoryReset::Whole { why } => assert!(why.contains("default"), "{why}"),
            MemoryReset::DirtyPages => {
                panic!("the page scan is used although dirty_pages_reset is off")
            }
        }
        // The data word and the zero byte at 256 KiB lie in the rewritten
        // stretch, the rest beyond it.
        assert!(Tuning::default().rewrite_resident > 256 << 10);
        let component = probe_component(sandbox.engine());
        let pre = sandbox.linker().instantiate_pre(&component).expect("links");
        for call in 0..4 {
            let (_, seen) = call_u32(&sandbox, &pre, &Limits::default(), "probe");
            assert_eq!(seen.expect("runs"), 5, "call {call}");
        }
    }

    #[test]
    fn swap_is_in_reach_unless_none_is_on_or_a_cgroup_forbids_it() {
        let header = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n";
        let on =
            format!("{header}/swapfile                               file\t\t65532\t\t0\t\t-2\n");
        let unread = || -> Vec<Option<String>> { panic!("no device: nothing more to read") };
        assert_eq!(swap_verdict(header, unread), None);
        assert_eq!(swap_verdict("", unread), None);
        let why = swap_verdict(&on, || vec![None, Some("max\n".into())]).expect("in reach");
        assert!(why.contains("/swapfile"), "{why}");
        // A limit of 0 anywhere on the path keeps this process out of swap.
        assert_eq!(
            swap_verdict(&on, || vec![Some("max\n".into()), Some("0\n".into()), None]),
            None
        );
        assert!(swap_verdict(&on, || vec![Some("1048576\n".into())]).is_some());
        assert_eq!(
            cgroup_v2_path("12:memory:/a\n0::/kubepods/pod1/c1\n").as_deref(),
            Some("/kubepods/pod1/c1")
        );
        assert_eq!(cgroup_v2_path("4:memory:/a\n"), None);
        let files = swap_max_files("/kubepods/pod1");
        let files: Vec<_> = files.iter().map(|f| f.to_str().unwrap()).collect();
        assert_eq!(
            files,
            [
                "/sys/fs/cgroup/memory.swap.max",
                "/sys/fs/cgroup/kubepods/memory.swap.max",
                "/sys/fs/cgroup/kubepods/pod1/memory.swap.max",
            ]
        );
    }

    #[test]
    fn the_scan_is_used_from_linux_6_7_on() {
        for release in ["6.7.0", "6.18.44-fc-v1045", "7.0.1", "6.10.0-rc1\n"] {
            assert_eq!(scan_in_kernel(release), None, "{release}");
        }
        for release in ["6.6.30", "5.15.0-124-generic", "6.1.0-28-amd64"] {
            let why = scan_in_kernel(release).expect(release);
            assert!(why.contains(release) && why.contains("6.7"), "{why}");
        }
        for release in ["", "linux", "6"] {
            assert!(scan_in_kernel(release).is_some(), "{release:?}");
        }
    }

    #[test]
    fn the_wasi_context_is_made_at_the_first_wasi_call_only() {
        let sandbox = one_slot(Tuning::default());
        let component = probe_component(sandbox.engine());
        let pre = sandbox.linker().instantiate_pre(&component).expect("links");
        let (mut store, probed) = call_u32(&sandbox, &pre, &Limits::default(), "probe");
        probed.expect("runs");
        // A call that made no WASI call leaves none made, and no stderr.
        assert!(store.data().wasi.is_none());
        assert_eq!(store.data().stderr(), "");
        // The first WASI call makes it, with the buffer `stderr` reads;
        // later calls use the same context.
        let state = store.data_mut();
        let _ = state.ctx();
        let mut pipe = state.wasi.as_ref().expect("made").1.clone();
        wasmtime_wasi::p2::OutputStream::write_zeroes(&mut pipe, 4).expect("writes");
        let _ = state.ctx();
        assert_eq!(store.data().stderr(), "\0\0\0\0");
    }

    #[test]
    fn every_store_has_a_memory_cap() {
        let sandbox = Sandbox::new(SandboxConfig {
            max_instances: 2,
            max_memory_bytes: 16 << 20,
            epoch_tick: Duration::from_millis(10),
            ..SandboxConfig::default()
        })
        .expect("sandbox");
        let store = sandbox.store(&Limits::default(), UNIX_EPOCH);
        assert_eq!(store.data().memory_cap(), 64 << 20);
        assert!(!store.data().memory_cap_hit());
    }
}
