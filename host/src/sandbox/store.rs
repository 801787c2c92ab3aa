//! What one call's store holds ([`StoreState`]): its memory cap, its
//! stderr, the guest's WASI context (made at the first WASI call), and the
//! clocks a guest reads and waits on.
//!
//! # Guarantees
//! - The wall clock reads the snapshot's `now` and the monotonic clock
//!   never advances: a plugin cannot tell time from its own run.
//! - A clock wait never outlasts the call's deadline: a wait past it ends
//!   the call with [`DeadlineExceeded`].
//! - No files, no network (TCP, UDP and name lookups are refused), and
//!   randomness from fixed deterministic sources: the same snapshot gives
//!   the same call.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use thiserror::Error;
use wasmtime::StoreContextMut;
use wasmtime::component::{Linker, Resource, ResourceTable};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::p2::{DynPollable, Pollable, subscribe};
use wasmtime_wasi::{HostMonotonicClock, HostWallClock, WasiCtx, WasiCtxView, WasiView};

use super::{MemoryCap, STDERR_CAPACITY};
use crate::contract::bindings::wasmop::reconciler::diagnostics;

/// Per-call state inside a [`Store`](wasmtime::Store).
pub struct StoreState {
    /// The guest's WASI context and its stderr, made on the guest's first
    /// WASI call: most reconciles make none, and building the context
    /// (streams, clocks, random sources) was about a quarter of a store's
    /// cost. What the guest sees is the same either way.
    pub(super) wasi: Option<(WasiCtx, MemoryOutputPipe)>,
    /// What the guest reported of a panic (`diagnostics.panic-text`), at
    /// most [`STDERR_CAPACITY`] bytes.
    pub(super) panic_text: Vec<u8>,
    /// The wall-clock time the guest's clock reads.
    pub(super) now: SystemTime,
    pub(super) table: ResourceTable,
    pub(super) limiter: MemoryCap,
    /// When the call's deadline passes (wall time).
    pub(super) deadline: Instant,
}

/// `diagnostics.panic-text`: keeps up to [`STDERR_CAPACITY`] bytes of
/// what the guest reports, the first `len` (at most 8) bytes of `bytes`,
/// lowest first, each time. A guest that calls it in a loop fills the
/// buffer and then only spends its own deadline.
impl diagnostics::Host for StoreState {
    fn panic_text(&mut self, bytes: u64, len: u8) {
        let room = STDERR_CAPACITY.saturating_sub(self.panic_text.len());
        let take = usize::from(len).min(8).min(room);
        self.panic_text
            .extend_from_slice(&bytes.to_le_bytes()[..take]);
    }
}

impl std::fmt::Debug for StoreState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreState")
            .field("memory_cap", &self.limiter.bytes)
            .field("memory_cap_hit", &self.limiter.hit)
            .finish_non_exhaustive()
    }
}

impl StoreState {
    /// What the guest wrote to stderr so far, then what it reported of a
    /// panic through `diagnostics.panic-text` (lossy UTF-8).
    pub fn stderr(&self) -> String {
        let mut text = match &self.wasi {
            Some((_, stderr)) => String::from_utf8_lossy(&stderr.contents()).into_owned(),
            None => String::new(),
        };
        text.push_str(&String::from_utf8_lossy(&self.panic_text));
        text
    }

    /// True when the guest tried to grow a memory past its cap.
    pub fn memory_cap_hit(&self) -> bool {
        self.limiter.hit
    }

    /// The memory cap of this store, in bytes.
    pub fn memory_cap(&self) -> usize {
        self.limiter.bytes
    }

    /// Bytes of memories and tables the store's instances hold now.
    pub fn memory_used(&self) -> usize {
        self.limiter.used
    }
}

/// A guest waited on a clock past its call's deadline; the call is over
/// (reported as a timeout, like a busy loop that hits the epoch deadline).
#[derive(Debug, Error)]
#[error("the plugin waited on a clock past its deadline")]
pub struct DeadlineExceeded;

/// Replaces the two WASI calls that create clock waits (see the module
/// docs) by deadline-aware ones. The versioned instance name matches what
/// `wasmtime_wasi` defines; guests importing an older 0.2 version link to
/// it by semver.
pub(super) fn bounded_clock_waits(linker: &mut Linker<StoreState>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    let mut clock = linker.instance("wasi:clocks/monotonic-clock@0.2.12")?;
    clock.func_wrap(
        "subscribe-duration",
        |store: StoreContextMut<'_, StoreState>, (nanos,): (u64,)| wait(store, nanos).map(|r| (r,)),
    )?;
    // The guest's monotonic clock stands at 0, so an instant is a wait of
    // that many nanoseconds from now.
    clock.func_wrap(
        "subscribe-instant",
        |store: StoreContextMut<'_, StoreState>, (when,): (u64,)| wait(store, when).map(|r| (r,)),
    )?;
    linker.allow_shadowing(false);
    Ok(())
}

/// A pollable ready `nanos` from now, or [`DeadlineExceeded`] when that is
/// after the call's deadline.
pub(super) fn wait(
    mut store: StoreContextMut<'_, StoreState>,
    nanos: u64,
) -> wasmtime::Result<Resource<DynPollable>> {
    let state = store.data_mut();
    let now = Instant::now();
    let until = now
        .checked_add(Duration::from_nanos(nanos))
        .filter(|until| *until <= state.deadline)
        .ok_or(DeadlineExceeded)?;
    let pollable = if nanos == 0 {
        ClockWait::Now
    } else {
        ClockWait::Until(tokio::time::Instant::from_std(until))
    };
    let resource = state.table.push(pollable)?;
    subscribe(&mut state.table, resource)
}

/// A clock wait that ends before its call's deadline.
pub(super) enum ClockWait {
    Now,
    Until(tokio::time::Instant),
}

#[wasmtime_wasi::async_trait]
impl Pollable for ClockWait {
    async fn ready(&mut self) {
        match self {
            ClockWait::Now => {}
            ClockWait::Until(until) => tokio::time::sleep_until(*until).await,
        }
    }
}

impl WasiView for StoreState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        let now = self.now;
        let (ctx, _) = self.wasi.get_or_insert_with(|| wasi_context(now));
        WasiCtxView {
            ctx,
            table: &mut self.table,
        }
    }
}

/// The WASI context of one call (see [`Sandbox::store`]) and the buffer its
/// stderr writes to.
pub(super) fn wasi_context(now: SystemTime) -> (WasiCtx, MemoryOutputPipe) {
    let stderr = MemoryOutputPipe::new(STDERR_CAPACITY);
    let wasi = WasiCtx::builder()
        .stderr(stderr.clone())
        .wall_clock(FixedWallClock(
            now.duration_since(UNIX_EPOCH).unwrap_or_default(),
        ))
        .monotonic_clock(FrozenMonotonicClock)
        .secure_random(wasmtime_wasi::Deterministic::new(vec![
            0x5a, 0xa5, 0x3c, 0xc3,
        ]))
        .insecure_random(wasmtime_wasi::Deterministic::new(vec![0x42, 0x24]))
        .insecure_random_seed(0x7761_736d_6f70)
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false)
        .build();
    (wasi, stderr)
}

/// A wall clock that always reads the same instant (the snapshot's `now`).
pub(super) struct FixedWallClock(Duration);

impl HostWallClock for FixedWallClock {
    fn resolution(&self) -> Duration {
        Duration::from_secs(1)
    }

    fn now(&self) -> Duration {
        self.0
    }
}

/// A monotonic clock that never advances.
pub(super) struct FrozenMonotonicClock;

impl HostMonotonicClock for FrozenMonotonicClock {
    fn resolution(&self) -> u64 {
        1_000_000_000
    }

    fn now(&self) -> u64 {
        0
    }
}
