//! A crash between two writes of one plan, for the chaos soak
//! (`tests/tests/chaos.rs`).
//!
//! Compiled in only with the `failpoints` cargo feature of the `wasmop`
//! crate, which only the integration tests (`wasmop-tests`) enable; a build
//! without it has no failpoint, and [`plan`] and [`before_write`] do
//! nothing. (Cargo unifies features within one build, so a `wasmop` binary
//! built by `cargo test --workspace` has it too; it does nothing unless
//! the variable below is set.)
//!
//! With the feature, the variable `WASMOP_FAILPOINT` arms it:
//!
//! - `abort-before-write:N` aborts the process (SIGABRT, no cleanup, as a
//!   crash) right before write `N` (counted from 0) of the first plan that
//!   makes more than `N` writes;
//! - `@FILE` reads that same text from `FILE` before every write instead,
//!   so a running process can be armed (and a missing or empty file arms
//!   nothing). Armed so, the process takes the abort by renaming `FILE` to
//!   `FILE.fired` first: an abort happens only if that rename wins over
//!   the file's removal, so whoever disarms by removing `FILE` knows from
//!   `FILE.fired` alone whether the process aborted (or is about to).
//!
//! - `hold:POINT` or `hold:POINT:KEY` (one per line, in the `@FILE` form
//!   only) holds the host where it calls [`hold`] with that point (and
//!   key) until the line is gone: it writes `FILE.held-POINT` while it
//!   waits and removes it when it goes on. The points are
//!   `sweep-before-delete` (key `namespace/name` of the object, right
//!   before the orphan sweep deletes an object it judged orphaned) and
//!   `sweep-done` (the end of an orphan sweep).
//!
//! The writes of a plan are counted in the order [`super::execute`] makes
//! them, each right before it is sent, once its leadership check passed (a
//! replica that may not write never reaches the failpoint): the
//! finalizer, the unasked creates, the primary patch, the applies, the
//! deletes, the status, the Events, the finalizer release. Writes skipped
//! because they would change nothing are not counted; nor are the writes
//! of a `dryRunFirst` dry run.

use std::future::Future;

#[cfg(feature = "failpoints")]
tokio::task_local! {
    /// Writes of the plan being executed, so far.
    static WRITES: std::cell::Cell<usize>;
}

/// Runs `f`, one plan's execution, counting its writes.
#[cfg(feature = "failpoints")]
pub async fn plan<F: Future>(f: F) -> F::Output {
    WRITES.scope(std::cell::Cell::new(0), f).await
}

/// Runs `f` (no failpoints in this build).
#[cfg(not(feature = "failpoints"))]
pub async fn plan<F: Future>(f: F) -> F::Output {
    f.await
}

/// The write index `WASMOP_FAILPOINT` arms, if any.
#[cfg(feature = "failpoints")]
fn armed() -> Option<usize> {
    let var = std::env::var("WASMOP_FAILPOINT").ok()?;
    let text = match var.strip_prefix('@') {
        Some(file) => std::fs::read_to_string(file).ok()?,
        None => var,
    };
    parse(&text)
}

/// The file `WASMOP_FAILPOINT` names in its `@FILE` form.
#[cfg(feature = "failpoints")]
fn armed_file() -> Option<String> {
    std::env::var("WASMOP_FAILPOINT")
        .ok()
        .and_then(|v| v.strip_prefix('@').map(str::to_owned))
}

/// `abort-before-write:N` → `N`.
#[cfg(any(feature = "failpoints", test))]
fn parse(text: &str) -> Option<usize> {
    text.trim()
        .strip_prefix("abort-before-write:")?
        .parse()
        .ok()
}

/// True while `point` (or `point:key`) is held by the file
/// `WASMOP_FAILPOINT` names; marks it held (`FILE.held-POINT`) meanwhile.
#[cfg(feature = "failpoints")]
fn held(point: &str, key: &str) -> bool {
    let names = [point.to_owned(), format!("{point}:{key}")];
    let Some(file) = armed_file() else {
        return false;
    };
    let text = std::fs::read_to_string(&file).unwrap_or_default();
    let armed = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("hold:"))
        .any(|h| names.iter().any(|n| n == h));
    let marker = format!("{file}.held-{point}");
    if armed {
        let _ = std::fs::write(&marker, key);
    } else {
        let _ = std::fs::remove_file(&marker);
    }
    armed
}

/// Waits here while `point` (or `point:key`) is held (see the module
/// docs).
#[cfg(feature = "failpoints")]
pub async fn hold(point: &str, key: &str) {
    if !held(point, key) {
        return;
    }
    tracing::warn!(point, key, "failpoint: holding");
    while held(point, key) {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    tracing::warn!(point, key, "failpoint: going on");
}

/// Nothing (no failpoints in this build).
#[cfg(not(feature = "failpoints"))]
#[inline]
pub async fn hold(_point: &str, _key: &str) {}

/// Called right before each write of a plan (not of a dry run): aborts the
/// process when this is the write `WASMOP_FAILPOINT` names.
#[cfg(feature = "failpoints")]
pub fn before_write(dry_run: bool) {
    if dry_run {
        return;
    }
    let Ok(index) = WRITES.try_with(|n| {
        let i = n.get();
        n.set(i + 1);
        i
    }) else {
        return;
    };
    if armed() == Some(index) {
        if let Some(file) = armed_file()
            && std::fs::rename(&file, format!("{file}.fired")).is_err()
        {
            // Disarmed since it was read.
            return;
        }
        eprintln!("failpoint: aborting before write {index} of a plan (WASMOP_FAILPOINT)");
        std::process::abort();
    }
}

/// Nothing (no failpoints in this build).
#[cfg(not(feature = "failpoints"))]
#[inline]
pub fn before_write(_dry_run: bool) {}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn only_abort_before_write_with_an_index_arms_it() {
        assert_eq!(parse("abort-before-write:0"), Some(0));
        assert_eq!(parse("abort-before-write:3\n"), Some(3));
        assert_eq!(parse(""), None);
        assert_eq!(parse("abort-before-write:"), None);
        assert_eq!(parse("abort-before-write:-1"), None);
        assert_eq!(parse("panic-before-write:1"), None);
    }
}
