//! A call's memory is reset for the next call even when swap took some of
//! it while the call ran.
//!
//! Its own test binary: it sends every page of its process to swap, which
//! must not reach the calls of other tests. It turns a swap file on for the
//! whole machine while it runs, so it needs root (`mkswap`, `swapon`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, UNIX_EPOCH};

use wasmop::sandbox::{MemoryReset, SWAP_CHECK_EVERY, Tuning};
use wasmop::{Limits, Sandbox, SandboxConfig};

mod common;

/// A swap file, on while it lives.
struct SwapFile(PathBuf);

impl SwapFile {
    fn on(bytes: usize) -> SwapFile {
        let path = std::env::temp_dir().join(format!("wasmop-test-swap-{}", std::process::id()));
        std::fs::write(&path, vec![0u8; bytes]).expect("swap file written");
        let mode = std::os::unix::fs::PermissionsExt::from_mode(0o600);
        std::fs::set_permissions(&path, mode).expect("swap file mode");
        let file = SwapFile(path);
        file.run("mkswap");
        file.run("swapon");
        file
    }

    fn run(&self, command: &str) {
        let out = std::process::Command::new(command)
            .arg(&self.0)
            .output()
            .unwrap_or_else(|e| panic!("{command}: {e}"));
        assert!(
            out.status.success(),
            "{command} {} (this test needs root): {}{}",
            self.0.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for SwapFile {
    fn drop(&mut self) {
        let _ = std::process::Command::new("swapoff").arg(&self.0).status();
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Asks the kernel to move every private writable mapping of this process
/// to swap (`MADV_PAGEOUT`), the pool's linear memories among them.
#[allow(unsafe_code)]
fn page_out_everything() {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("maps");
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let (Some(range), Some(perms)) = (fields.next(), fields.next()) else {
            continue;
        };
        let Some((start, end)) = range.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end)) = (
            usize::from_str_radix(start, 16),
            usize::from_str_radix(end, 16),
        ) else {
            continue;
        };
        if perms.starts_with("rw") && perms.ends_with('p') {
            // SAFETY: MADV_PAGEOUT is advice: it may move pages to swap but
            // never changes what the memory holds.
            let _ = unsafe {
                rustix::mm::madvise(
                    start as *mut std::ffi::c_void,
                    end - start,
                    rustix::mm::Advice::LinuxPageOut,
                )
            };
        }
    }
}

/// A sandbox of one pool slot, 16 MiB, asking for the faster reset of
/// dirty pages (`--memory-reset=dirty-pages`).
fn one_slot(tuning: Tuning) -> Arc<Sandbox> {
    common::one_slot(16 << 20, true, tuning)
}

/// Three calls through the sandbox's one slot of a component that returns
/// the word at 64 KiB (7 in its initial memory) and then writes 0xff over
/// its first 4 MiB; while each call's instance is alive, every page of the
/// process is sent to swap. Returns what each call read.
fn calls(sandbox: &Sandbox) -> Vec<u32> {
    let wat = r#"(component
  (core module $m
    (memory 64)
    (data (i32.const 65536) "\07\00\00\00")
    (func (export "peek") (result i32)
      (i32.load (i32.const 65536))
      (memory.fill (i32.const 0) (i32.const 255) (i32.const 4194304))))
  (core instance $i (instantiate $m))
  (func (export "peek") (result u32) (canon lift (core func $i "peek"))))"#;
    let pre = common::link(sandbox, wat);
    (0..3)
        .map(|_| {
            let mut store = sandbox.store(&Limits::default(), UNIX_EPOCH);
            let instance = pre.instantiate(&mut store).expect("instantiates");
            let peek = instance
                .get_typed_func::<(), (u32,)>(&mut store, "peek")
                .expect("peek");
            let (seen,) = peek.call(&mut store, ()).expect("runs");
            page_out_everything();
            drop(store);
            seen
        })
        .collect()
}

#[test]
fn pages_swapped_out_during_a_call_are_reset_too() {
    // Made before swap is on: it scans for dirty pages, and notices swap
    // coming on.
    let before = one_slot(Tuning::default());
    assert_eq!(
        before.memory_reset(),
        &MemoryReset::DirtyPages,
        "this machine has swap on (or no PAGEMAP_SCAN) before the test"
    );
    assert!(!before.swap_came_on_after_start());
    let swap = SwapFile::on(64 << 20);

    // The scan misses pages that are in swap: the second and third calls
    // read the previous call's 0xff. This also shows that the pages did go
    // to swap; should wasmtime reset them one day, this fails, and the scan
    // can be used with swap on.
    let scanning = one_slot(Tuning {
        ignore_swap: true,
        ..Tuning::default()
    });
    assert_eq!(scanning.memory_reset(), &MemoryReset::DirtyPages);
    assert_eq!(calls(&scanning), [7, u32::MAX, u32::MAX]);

    // Asked for the faster reset: swap is seen, the scan is off, every call
    // is pristine.
    let asked = one_slot(Tuning::default());
    let MemoryReset::Whole { why } = asked.memory_reset() else {
        panic!("the scan is used with swap on");
    };
    assert!(why.contains(swap.0.to_str().expect("utf-8")), "{why}");
    assert_eq!(calls(&asked), [7, 7, 7]);

    // As shipped: every touched page is returned, swap or not.
    let shipped = Sandbox::new(SandboxConfig {
        max_instances: 1,
        max_memory_bytes: 16 << 20,
        ..SandboxConfig::default()
    })
    .expect("sandbox");
    assert!(matches!(shipped.memory_reset(), MemoryReset::Whole { .. }));
    assert_eq!(calls(&shipped), [7, 7, 7]);

    // The sandbox made before swap came on says so within its period.
    let deadline = Instant::now() + SWAP_CHECK_EVERY + Duration::from_secs(5);
    while !before.swap_came_on_after_start() {
        assert!(Instant::now() < deadline, "swap coming on was not noticed");
        std::thread::sleep(Duration::from_millis(50));
    }
}
