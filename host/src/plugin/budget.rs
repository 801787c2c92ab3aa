//! Per-plugin budgets: what the calls of each plugin version cost, kept in
//! atomics on the hot path and rendered as metrics only when `/metrics` is
//! scraped.
//!
//! | metric | labels | meaning |
//! | --- | --- | --- |
//! | `wasmop_plugin_calls_total` | plugin, version | calls into the plugin (every export: reconcile, settings, admission) |
//! | `wasmop_plugin_call_cpu_seconds_total` | plugin, version | CPU time of the calling thread during the calls (instantiation included) |
//! | `wasmop_plugin_call_peak_memory_bytes` | plugin, version | histogram: memories and tables a call's store held at its end (they never shrink, so its peak) |
//! | `wasmop_plugin_call_epoch_ticks` | plugin, version | histogram: epoch ticks a call spent (its wall time in ticks, rounded up) |
//! | `wasmop_plugin_call_deadline_epoch_ticks` | plugin, version | the deadline of a call, in epoch ticks |
//! | `wasmop_plugin_call_input_bytes_total` | plugin, version | JSON text handed to reconcile calls (the snapshot's objects and settings) |
//! | `wasmop_plugin_call_output_bytes_total` | plugin, version | JSON text of the plans reconcile calls returned |
//!
//! # Guarantees
//! - A call touches only the atomics of its plugin version (no lock); the
//!   registry's lock is taken when a plugin is loaded and when metrics are
//!   rendered.
//! - The series of a version stay after it is swapped out: counters never
//!   go back.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// Upper bounds (bytes) of the peak-memory histogram: 1 MiB to 1 GiB.
pub const MEMORY_BUCKETS: &[u64] = &[
    1 << 20,
    2 << 20,
    4 << 20,
    8 << 20,
    16 << 20,
    32 << 20,
    64 << 20,
    128 << 20,
    256 << 20,
    512 << 20,
    1 << 30,
];

/// Upper bounds of the epoch-tick histogram.
pub const TICK_BUCKETS: &[u64] = &[1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 5000];

/// A histogram of atomics over fixed integer bounds (one more bucket for
/// above the last bound).
#[derive(Debug)]
struct AtomicHistogram {
    bounds: &'static [u64],
    counts: Vec<AtomicU64>,
    sum: AtomicU64,
}

impl AtomicHistogram {
    fn new(bounds: &'static [u64]) -> Self {
        Self {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0),
        }
    }

    fn observe(&self, value: u64) {
        let i = self
            .bounds
            .iter()
            .position(|&le| value <= le)
            .unwrap_or(self.bounds.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(value, Ordering::Relaxed);
    }

    fn counts(&self) -> Vec<u64> {
        self.counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect()
    }
}

/// The costs of one plugin version's calls.
#[derive(Debug)]
pub struct CallBudget {
    plugin: String,
    version: String,
    calls: AtomicU64,
    cpu_nanos: AtomicU64,
    input_bytes: AtomicU64,
    output_bytes: AtomicU64,
    deadline_ticks: AtomicU64,
    memory: AtomicHistogram,
    ticks: AtomicHistogram,
}

/// What a budget holds at one moment (for an analysis window's deltas).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BudgetCounts {
    /// Calls.
    pub calls: u64,
    /// CPU time, nanoseconds.
    pub cpu_nanos: u64,
    /// Peak-memory histogram counts, per [`MEMORY_BUCKETS`] bucket and one
    /// above.
    pub memory: Vec<u64>,
}

impl BudgetCounts {
    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &BudgetCounts) -> BudgetCounts {
        BudgetCounts {
            calls: self.calls.saturating_sub(earlier.calls),
            cpu_nanos: self.cpu_nanos.saturating_sub(earlier.cpu_nanos),
            memory: self
                .memory
                .iter()
                .enumerate()
                .map(|(i, n)| n.saturating_sub(earlier.memory.get(i).copied().unwrap_or(0)))
                .collect(),
        }
    }

    /// CPU seconds per call (0 without calls).
    pub fn cpu_seconds_per_call(&self) -> f64 {
        if self.calls == 0 {
            0.0
        } else {
            self.cpu_nanos as f64 / 1e9 / self.calls as f64
        }
    }

    /// The upper bound of the bucket holding the 99th percentile of the
    /// calls' peak memory, bytes (0 without calls; above the last bound
    /// counts as twice it).
    pub fn p99_memory_bytes(&self) -> f64 {
        let total: u64 = self.memory.iter().sum();
        if total == 0 {
            return 0.0;
        }
        let rank = (total as f64 * 0.99).ceil() as u64;
        let mut seen = 0;
        for (i, n) in self.memory.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return MEMORY_BUCKETS
                    .get(i)
                    .copied()
                    .unwrap_or(MEMORY_BUCKETS[MEMORY_BUCKETS.len() - 1] * 2)
                    as f64;
            }
        }
        0.0
    }
}

impl CallBudget {
    fn new(plugin: &str, version: &str) -> Self {
        Self {
            plugin: plugin.to_owned(),
            version: version.to_owned(),
            calls: AtomicU64::new(0),
            cpu_nanos: AtomicU64::new(0),
            input_bytes: AtomicU64::new(0),
            output_bytes: AtomicU64::new(0),
            deadline_ticks: AtomicU64::new(0),
            memory: AtomicHistogram::new(MEMORY_BUCKETS),
            ticks: AtomicHistogram::new(TICK_BUCKETS),
        }
    }

    /// Accounts one call.
    pub fn record_call(&self, cpu: Duration, peak_memory: usize, ticks: u64) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.cpu_nanos.fetch_add(
            u64::try_from(cpu.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        self.memory.observe(peak_memory as u64);
        self.ticks.observe(ticks);
    }

    /// Accounts the JSON text into and out of a reconcile call.
    pub fn record_bytes(&self, input: usize, output: usize) {
        self.input_bytes.fetch_add(input as u64, Ordering::Relaxed);
        self.output_bytes
            .fetch_add(output as u64, Ordering::Relaxed);
    }

    /// The counts now.
    pub fn counts(&self) -> BudgetCounts {
        BudgetCounts {
            calls: self.calls.load(Ordering::Relaxed),
            cpu_nanos: self.cpu_nanos.load(Ordering::Relaxed),
            memory: self.memory.counts(),
        }
    }

    fn render(&self, out: &mut String, part: Part) {
        let labels = format!(
            "plugin=\"{}\",version=\"{}\"",
            escape(&self.plugin),
            escape(&self.version)
        );
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        match part {
            Part::Calls => {
                let _ = writeln!(
                    out,
                    "wasmop_plugin_calls_total{{{labels}}} {}",
                    load(&self.calls)
                );
            }
            Part::Cpu => {
                let secs = load(&self.cpu_nanos) as f64 / 1e9;
                let _ = writeln!(
                    out,
                    "wasmop_plugin_call_cpu_seconds_total{{{labels}}} {secs}"
                );
            }
            Part::Input => {
                let _ = writeln!(
                    out,
                    "wasmop_plugin_call_input_bytes_total{{{labels}}} {}",
                    load(&self.input_bytes)
                );
            }
            Part::Output => {
                let _ = writeln!(
                    out,
                    "wasmop_plugin_call_output_bytes_total{{{labels}}} {}",
                    load(&self.output_bytes)
                );
            }
            Part::Deadline => {
                let _ = writeln!(
                    out,
                    "wasmop_plugin_call_deadline_epoch_ticks{{{labels}}} {}",
                    load(&self.deadline_ticks)
                );
            }
            Part::Memory => render_histogram(
                out,
                "wasmop_plugin_call_peak_memory_bytes",
                &labels,
                &self.memory,
            ),
            Part::Ticks => {
                render_histogram(out, "wasmop_plugin_call_epoch_ticks", &labels, &self.ticks)
            }
        }
    }
}

#[derive(Clone, Copy)]
enum Part {
    Calls,
    Cpu,
    Input,
    Output,
    Deadline,
    Memory,
    Ticks,
}

const PARTS: [(Part, &str, &str); 7] = [
    (Part::Calls, "wasmop_plugin_calls_total", "counter"),
    (Part::Cpu, "wasmop_plugin_call_cpu_seconds_total", "counter"),
    (
        Part::Input,
        "wasmop_plugin_call_input_bytes_total",
        "counter",
    ),
    (
        Part::Output,
        "wasmop_plugin_call_output_bytes_total",
        "counter",
    ),
    (
        Part::Deadline,
        "wasmop_plugin_call_deadline_epoch_ticks",
        "gauge",
    ),
    (
        Part::Memory,
        "wasmop_plugin_call_peak_memory_bytes",
        "histogram",
    ),
    (Part::Ticks, "wasmop_plugin_call_epoch_ticks", "histogram"),
];

fn render_histogram(out: &mut String, name: &str, labels: &str, h: &AtomicHistogram) {
    let counts = h.counts();
    let mut cumulative = 0;
    for (le, n) in h.bounds.iter().zip(&counts) {
        cumulative += n;
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {cumulative}");
    }
    let total: u64 = counts.iter().sum();
    let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {total}");
    let _ = writeln!(
        out,
        "{name}_sum{{{labels}}} {}",
        h.sum.load(Ordering::Relaxed)
    );
    let _ = writeln!(out, "{name}_count{{{labels}}} {total}");
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

type Registry = Mutex<BTreeMap<(String, String), Arc<CallBudget>>>;

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(Registry::default)
}

/// The budget of `plugin` at `version` (one per process, shared by every
/// load of that version), its deadline set to `deadline_ticks`.
pub fn budget_for(plugin: &str, version: &str, deadline_ticks: u64) -> Arc<CallBudget> {
    let mut r = registry().lock().expect("budget registry lock");
    let b = r
        .entry((plugin.to_owned(), version.to_owned()))
        .or_insert_with(|| Arc::new(CallBudget::new(plugin, version)))
        .clone();
    b.deadline_ticks.store(deadline_ticks, Ordering::Relaxed);
    b
}

/// Every budget in the Prometheus text format.
pub fn render() -> String {
    let budgets: Vec<Arc<CallBudget>> = registry()
        .lock()
        .expect("budget registry lock")
        .values()
        .cloned()
        .collect();
    let mut out = String::new();
    if budgets.is_empty() {
        return out;
    }
    for (part, name, kind) in PARTS {
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for b in &budgets {
            b.render(&mut out, part);
        }
    }
    out
}

/// CPU time the calling thread has used.
pub fn thread_cpu_time() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(
        u64::try_from(t.tv_sec).unwrap_or(0),
        u32::try_from(t.tv_nsec).unwrap_or(0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_counts_calls_and_renders_per_plugin_and_version() {
        let b = budget_for("budget-test", "1.0.0", 100);
        let before = b.counts();
        b.record_call(Duration::from_millis(3), 3 << 20, 2);
        b.record_call(Duration::from_millis(1), 900 << 10, 1);
        b.record_bytes(100, 20);
        let delta = b.counts().since(&before);
        assert_eq!(delta.calls, 2);
        assert!((delta.cpu_seconds_per_call() - 0.002).abs() < 1e-9);
        assert_eq!(delta.p99_memory_bytes(), f64::from(4u32 << 20));
        // The same version loaded again shares the budget.
        assert!(Arc::ptr_eq(&b, &budget_for("budget-test", "1.0.0", 100)));
        let text = render();
        for line in [
            "wasmop_plugin_calls_total{plugin=\"budget-test\",version=\"1.0.0\"} 2",
            "wasmop_plugin_call_input_bytes_total{plugin=\"budget-test\",version=\"1.0.0\"} 100",
            "wasmop_plugin_call_output_bytes_total{plugin=\"budget-test\",version=\"1.0.0\"} 20",
            "wasmop_plugin_call_deadline_epoch_ticks{plugin=\"budget-test\",version=\"1.0.0\"} 100",
            "wasmop_plugin_call_peak_memory_bytes_bucket{plugin=\"budget-test\",version=\"1.0.0\",le=\"1048576\"} 1",
            "wasmop_plugin_call_peak_memory_bytes_bucket{plugin=\"budget-test\",version=\"1.0.0\",le=\"+Inf\"} 2",
            "wasmop_plugin_call_epoch_ticks_bucket{plugin=\"budget-test\",version=\"1.0.0\",le=\"2\"} 2",
            "# TYPE wasmop_plugin_call_peak_memory_bytes histogram",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
    }

    #[test]
    fn the_thread_cpu_clock_moves_with_work() {
        let start = thread_cpu_time();
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(thread_cpu_time() > start);
    }
}
