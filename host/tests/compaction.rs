//! A call's memory is reset for the next call even when the kernel moves
//! some of its pages just as the call ends.
//!
//! The kernel moves pages to make room for large allocations (compaction,
//! which every Linux kernel runs in the background and on demand); while
//! it copies one, the page is not present. `PAGEMAP_SCAN`, which the
//! faster reset (`--memory-reset=dirty-pages`) uses to find what a call
//! dirtied, reports only present pages, so a page being moved at that
//! moment keeps the call's data for the next one. The shipped reset instead
//! rewrites the first 512 KiB whole (copied from the image or zeroed, page
//! by page, whatever the kernel is doing with them) and returns every other
//! touched page to the kernel.
//!
//! Its own test binary: it keeps the kernel compacting memory for the whole
//! machine while it runs (`/proc/sys/vm/compact_memory`, which needs root).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, UNIX_EPOCH};

use wasmop::sandbox::{MemoryReset, StoreState, Tuning};
use wasmop::{Limits, Sandbox};
use wasmtime::component::InstancePre;

mod common;

/// Bytes each call checks and then dirties.
const DIRTIED: u32 = 16 << 20;

/// Asks the kernel to compact all memory, again and again, while it lives.
struct Compactor {
    stop: Arc<AtomicBool>,
    runs: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl Compactor {
    fn start() -> Compactor {
        // Once here, so that a machine where it is refused fails clearly.
        std::fs::write("/proc/sys/vm/compact_memory", "1")
            .expect("/proc/sys/vm/compact_memory (this test needs root)");
        let stop = Arc::new(AtomicBool::new(false));
        let runs = Arc::new(AtomicU64::new(1));
        let thread = std::thread::spawn({
            let (stop, runs) = (Arc::clone(&stop), Arc::clone(&runs));
            move || {
                while !stop.load(Ordering::Relaxed) {
                    std::fs::write("/proc/sys/vm/compact_memory", "1").expect("compacts");
                    runs.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        Compactor {
            stop,
            runs,
            thread: Some(thread),
        }
    }

    fn runs(&self) -> u64 {
        self.runs.load(Ordering::Relaxed)
    }
}

impl Drop for Compactor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A sandbox of one pool slot, 64 MiB, with the faster reset if
/// `dirty_pages`, keeping all a call dirties.
fn one_slot(dirty_pages: bool) -> Arc<Sandbox> {
    let tuning = Tuning {
        memory_keep_resident: DIRTIED as usize,
        ..Tuning::default()
    };
    common::one_slot(64 << 20, dirty_pages, tuning)
}

/// A component whose `call(bytes)` counts the pages among the first
/// `bytes` of its memory whose first word is 0xffffffff (none in its
/// initial memory, which has a data segment at 64 KiB so that the image is
/// copied back there, not zeroed), then fills those bytes with 0xff.
fn component(sandbox: &Sandbox) -> InstancePre<StoreState> {
    let wat = r#"(component
  (core module $m
    (memory 512)
    (data (i32.const 65536) "\01\00\00\00")
    (func (export "call") (param $bytes i32) (result i32)
      (local $at i32) (local $left i32)
      (loop $page
        (if (i32.eq (i32.load (local.get $at)) (i32.const -1))
          (then (local.set $left (i32.add (local.get $left) (i32.const 1)))))
        (local.set $at (i32.add (local.get $at) (i32.const 4096)))
        (br_if $page (i32.lt_u (local.get $at) (local.get $bytes))))
      (memory.fill (i32.const 0) (i32.const 255) (local.get $bytes))
      (local.get $left)))
  (core instance $i (instantiate $m))
  (func (export "call") (param "bytes" u32) (result u32)
    (canon lift (core func $i "call"))))"#;
    common::link(sandbox, wat)
}

/// One call in a fresh store: the pages it found left by an earlier call.
fn pages_left(sandbox: &Sandbox, pre: &InstancePre<StoreState>, bytes: u32) -> u32 {
    let mut store = sandbox.store(&Limits::default(), UNIX_EPOCH);
    let instance = pre.instantiate(&mut store).expect("instantiates");
    let call = instance
        .get_typed_func::<(u32,), (u32,)>(&mut store, "call")
        .expect("call");
    call.call(&mut store, (bytes,)).expect("runs").0
}

/// Calls the shipped reset for `time` under compaction; none may read a page
/// an earlier call left. Returns the number of calls.
fn shipped_calls_for(time: Duration, compactor: &Compactor) -> u64 {
    let shipped = one_slot(false);
    assert!(matches!(shipped.memory_reset(), MemoryReset::Whole { .. }));
    let pre = component(&shipped);
    let runs = compactor.runs();
    let until = Instant::now() + time;
    let mut calls = 0u64;
    while Instant::now() < until {
        calls += 1;
        assert_eq!(
            pages_left(&shipped, &pre, DIRTIED),
            0,
            "call {calls} of the shipped reset read pages an earlier call left"
        );
    }
    assert!(
        compactor.runs() > runs,
        "the kernel did not compact meanwhile"
    );
    calls
}

#[test]
fn the_shipped_reset_holds_while_the_kernel_moves_pages() {
    let compactor = Compactor::start();
    let calls = shipped_calls_for(Duration::from_secs(15), &compactor);
    eprintln!(
        "{calls} calls, none read a page an earlier call left ({} compaction runs)",
        compactor.runs()
    );
}

/// The gap of the faster reset, shown: under compaction a call soon reads a
/// page the previous call filled (here after 1-53 s, a few thousand to
/// 36,000 calls: how soon varies too much for every test run to wait for
/// it). Then the shipped reset for as long again.
#[test]
#[ignore = "runs until the faster reset leaks, up to 10 minutes: cargo test -p wasmop --test compaction -- --ignored"]
fn the_faster_reset_misses_pages_the_kernel_moves_as_a_call_ends() {
    let compactor = Compactor::start();
    let scanning = one_slot(true);
    assert_eq!(
        scanning.memory_reset(),
        &MemoryReset::DirtyPages,
        "this machine has swap on or no PAGEMAP_SCAN"
    );
    let pre = component(&scanning);
    let started = Instant::now();
    let mut calls = 0u64;
    loop {
        calls += 1;
        let left = pages_left(&scanning, &pre, DIRTIED);
        if left > 0 {
            eprintln!(
                "call {calls} of the faster reset read {left} pages the previous call left ({:?} of compaction, {} runs)",
                started.elapsed(),
                compactor.runs()
            );
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "no call read a page left by the previous one in {calls} calls under compaction"
        );
    }
    drop(scanning);
    let calls = shipped_calls_for(started.elapsed(), &compactor);
    eprintln!("then {calls} calls of the shipped reset, none read a page an earlier call left");
}
