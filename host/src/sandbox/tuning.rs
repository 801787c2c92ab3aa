//! Engine settings that change speed, not behaviour ([`Tuning`]), and how
//! a store's memory is reset between calls ([`MemoryReset`]): whether the
//! kernel can scan for dirty pages and whether swap is out of reach.
//!
//! # Guarantees
//! - A tuning changes speed, not what a call does, except turning epoch
//!   interruption off (benchmarks only), which takes the deadline away.
//! - Dirty pages are found by a scan only when it is asked for, the kernel
//!   has it (Linux 6.7+) and swap cannot reach the process; swap turned on
//!   later is checked for every [`SWAP_CHECK_EVERY`] and logged as an
//!   error.

use std::time::Duration;

/// Engine settings that change speed, not behaviour (except
/// `epoch_interruption`, which the deadline needs). [`Tuning::default`] is
/// what [`Sandbox::new`] uses; the benchmarks compare it with
/// [`Tuning::wasmtime_defaults`] and with epoch interruption off.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tuning {
    /// Compile deadline checks into the code (off: calls have no deadline).
    pub epoch_interruption: bool,
    /// With the dirty-pages reset: at most this many bytes of each pooled
    /// linear memory that a call dirtied are reset in place and kept mapped
    /// when it ends, rather than returned to the kernel with `madvise`
    /// (which makes the next call fault every page in again).
    pub memory_keep_resident: usize,
    /// With the whole reset ([`MemoryReset::Whole`]): the first this many
    /// bytes of each pooled linear memory are rewritten from the image (or
    /// zeroed) after every call, touched or not, and kept mapped; the rest
    /// is returned to the kernel. Writing every byte is what makes it safe
    /// whatever the kernel did to the pages; it costs time in proportion,
    /// so it pays only where a call's pages are (a plugin's stack, data and
    /// early heap, with the 256 KiB stack of `.cargo/config.toml`).
    pub rewrite_resident: usize,
    /// The same for tables.
    pub table_keep_resident: usize,
    /// Find the pages a call dirtied with the `PAGEMAP_SCAN` ioctl (Linux
    /// 6.7+; ignored where unsupported) and reset only those, when
    /// [`SandboxConfig::dirty_pages_reset`] asks for that reset.
    pub pagemap_scan: bool,
    /// Let Cranelift inline small functions into their callers within a
    /// plugin (wasmtime's `Inlining::Yes`; off: `Inlining::No`, wasmtime's
    /// default). Off as shipped: it made compiling the shipped plugins
    /// about 5x slower (0.5-1.1 s to 2.6-4.9 s each) for calls 0-7% faster
    /// (BENCHMARKS.md, "Epoch interruption").
    pub inlining: bool,
    /// Compile fuel accounting into the code, wasmtime's other way to stop
    /// a guest, and give every store all the fuel there is (so it never
    /// stops a call). Only for the benchmarks, to price fuel against epoch
    /// interruption; off as shipped.
    pub fuel: bool,
    /// Make every epoch check of a call stop in the host, which counts it
    /// against the guest function and the place in it where it is
    /// ([`Sandbox::take_check_counts`]) and lets the call go on until its
    /// deadline. Only for the benchmarks, to see where a plugin's checks
    /// are: calls take hundreds of times as long. Needs
    /// `epoch_interruption`; off as shipped.
    pub count_checks: bool,
    /// Use the page scan even where swap can reach this process (see
    /// [`MemoryReset`]): calls may then see pages an earlier call left.
    /// Only for tests that show it, and benchmarks; off as shipped.
    pub ignore_swap: bool,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            epoch_interruption: true,
            memory_keep_resident: 4 << 20,
            rewrite_resident: 512 << 10,
            table_keep_resident: 64 << 10,
            pagemap_scan: true,
            inlining: false,
            fuel: false,
            count_checks: false,
            ignore_swap: false,
        }
    }
}

impl Tuning {
    /// wasmtime's own defaults (what the sandbox used before).
    pub fn wasmtime_defaults() -> Self {
        Tuning {
            epoch_interruption: true,
            memory_keep_resident: 0,
            rewrite_resident: 0,
            table_keep_resident: 0,
            pagemap_scan: false,
            inlining: false,
            fuel: false,
            count_checks: false,
            ignore_swap: false,
        }
    }
}

/// How the pool restores a slot's linear memory when a call ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemoryReset {
    /// Only the pages the call dirtied, found with `PAGEMAP_SCAN`, are
    /// restored (or zeroed) in place; the rest stays as it was. Used only
    /// when [`SandboxConfig::dirty_pages_reset`](super::SandboxConfig::dirty_pages_reset) asks for it, the kernel has
    /// the scan and swap cannot reach this process; a page the kernel is
    /// migrating as the call ends escapes it.
    DirtyPages,
    /// The first [`Tuning::rewrite_resident`] bytes are rewritten from the
    /// image (or zeroed), all of them, and stay mapped; every other page
    /// the call touched is returned to the kernel, which maps the initial
    /// image or zeroes afresh at the next touch.
    Whole {
        /// Why the page scan is not used, for the operator's log.
        why: String,
    },
}

impl std::fmt::Display for MemoryReset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MemoryReset::DirtyPages => {
                f.write_str("dirty pages only (PAGEMAP_SCAN; no swap can reach this process)")
            }
            MemoryReset::Whole { why } => {
                write!(
                    f,
                    "the first bytes rewritten, every other touched page returned to the kernel ({why})"
                )
            }
        }
    }
}

/// Why the kernel of release `release` (`/proc/sys/kernel/osrelease`) has
/// no `PAGEMAP_SCAN` (Linux 6.7 and later have it), or `None` when it has.
/// Without the scan, wasmtime would `memset` every page kept resident after
/// every call, slower than keeping none (BENCHMARKS.md, "Swap").
pub(super) fn scan_in_kernel(release: &str) -> Option<String> {
    let release = release.trim();
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major = parts.next().and_then(|p| p.parse::<u32>().ok());
    let minor = parts.next().and_then(|p| p.parse::<u32>().ok());
    match (major, minor) {
        (Some(major), Some(minor)) if (major, minor) >= (6, 7) => None,
        (Some(_), Some(_)) => Some(format!(
            "Linux {release} has no PAGEMAP_SCAN, which came with 6.7"
        )),
        _ => Some(format!(
            "the kernel release {release:?} could not be read, so PAGEMAP_SCAN is not assumed"
        )),
    }
}

/// Why swap could take pages of this process, or `None` when it cannot:
/// `/proc/swaps` lists no active device, or this process's cgroup (v2) or
/// one above it has `memory.swap.max` 0. Unreadable files count as swap in
/// reach, except a missing `/proc/swaps` (a kernel without swap support).
pub fn swap_in_reach() -> Option<String> {
    let swaps = match std::fs::read_to_string("/proc/swaps") {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => return Some(format!("/proc/swaps could not be read: {e}")),
    };
    swap_verdict(&swaps, || {
        let cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        cgroup_v2_path(&cgroup)
            .map(|path| {
                swap_max_files(&path)
                    .into_iter()
                    .map(|file| std::fs::read_to_string(file).ok())
                    .collect()
            })
            .unwrap_or_default()
    })
}

/// [`swap_in_reach`] on the text of `/proc/swaps` and, read only when it
/// lists a device, the `memory.swap.max` of this process's cgroup and each
/// one above it (`None` where there is no such file).
pub(super) fn swap_verdict(
    swaps: &str,
    swap_max: impl FnOnce() -> Vec<Option<String>>,
) -> Option<String> {
    let device = swaps
        .lines()
        .skip(1)
        .find_map(|line| line.split_whitespace().next())?;
    if swap_max().iter().flatten().any(|max| max.trim() == "0") {
        return None;
    }
    Some(format!(
        "swap is on ({device}) and no cgroup of this process sets memory.swap.max to 0"
    ))
}

/// The cgroup v2 path of `/proc/self/cgroup`'s text (its `0::` line).
pub(super) fn cgroup_v2_path(text: &str) -> Option<String> {
    text.lines()
        .find_map(|line| line.strip_prefix("0::"))
        .map(str::to_owned)
}

/// `memory.swap.max` of the cgroup at `path` and of each one above it.
pub(super) fn swap_max_files(path: &str) -> Vec<std::path::PathBuf> {
    let mut dir = std::path::PathBuf::from("/sys/fs/cgroup");
    let mut files = vec![dir.join("memory.swap.max")];
    for part in path.split('/').filter(|p| !p.is_empty()) {
        dir.push(part);
        files.push(dir.join("memory.swap.max"));
    }
    files
}

/// How often a sandbox that scans for dirty pages checks that swap is
/// still out of reach.
pub const SWAP_CHECK_EVERY: Duration = Duration::from_secs(10);
