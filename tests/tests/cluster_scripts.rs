//! The local control plane's build script (`tests/cluster/build.sh`) run
//! twice at once: the second run waits for the first instead of building
//! the same binaries into the same temporary directories.
//!
//! `tests/run.sh` runs the script before the tests, so every binary is in
//! the cache here and a run that gets the lock finds them all.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use wasmop_tests::repo_root;

/// Where `tests/cluster/lib.sh` keeps the cache, by the same rule.
fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("WASMOP_CACHE") {
        return dir.into();
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache"));
    base.join("wasmop")
}

/// Kills a child process when the test ends, whatever happened.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Polls `done` until it answers true or `deadline` passes.
fn wait_until(what: &str, deadline: Duration, mut done: impl FnMut() -> bool) {
    let end = Instant::now() + deadline;
    while !done() {
        assert!(Instant::now() < end, "{what}: not within {deadline:?}");
        // Poll interval of a bounded wait, not a synchronisation sleep.
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_second_control_plane_build_waits_for_the_first() {
    let lock = cache_dir().join("bin").join(".build.lock");
    std::fs::create_dir_all(lock.parent().expect("parent")).expect("cache dir");
    let lock_is_free = || {
        Command::new("flock")
            .args(["-n", "-E", "75"])
            .arg(&lock)
            .arg("true")
            .status()
            .expect("flock runs")
            .success()
    };
    // Some other build may hold it now (another checkout); wait it out.
    wait_until(
        "the build lock to be free",
        Duration::from_secs(1800),
        lock_is_free,
    );

    // The first build, standing in: it holds the lock until its stdin ends.
    let mut holder = Reaped(
        Command::new("flock")
            .arg(&lock)
            .args(["-c", "read -r _"])
            .stdin(Stdio::piped())
            .spawn()
            .expect("flock runs"),
    );
    wait_until(
        "the stand-in to hold the lock",
        Duration::from_secs(30),
        || !lock_is_free(),
    );

    let mut second = Reaped(
        Command::new("bash")
            .arg(repo_root().join("tests/cluster/build.sh"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("bash runs"),
    );
    let (tx, lines) = mpsc::channel::<String>();
    let stderr = second.0.stderr.take().expect("stderr");
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    let mut saw = |pattern: &str, deadline: Duration| {
        let end = Instant::now() + deadline;
        loop {
            if seen.iter().any(|l: &String| l.contains(pattern)) {
                return seen.clone();
            }
            let left = end.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) => seen.push(line),
                Err(_) => {
                    panic!("build.sh did not say {pattern:?} within {deadline:?}; said {seen:?}")
                }
            }
        }
    };

    let said = saw("waiting for it", Duration::from_secs(60));
    assert!(
        second.0.try_wait().expect("try_wait").is_none(),
        "the second build went on while the lock was held: {said:?}"
    );
    assert!(
        !said
            .iter()
            .any(|l| l.contains("cached in") || l.contains("building")),
        "the second build looked at the cache before it had the lock: {said:?}"
    );

    // The first one ends; the second finds everything it built.
    drop(holder.0.stdin.take());
    let said = saw("cached in", Duration::from_secs(120));
    let mut status = None;
    wait_until(
        "the second build to finish",
        Duration::from_secs(120),
        || {
            status = second.0.try_wait().expect("try_wait");
            status.is_some()
        },
    );
    assert!(
        status.expect("finished").success(),
        "the second build failed: {said:?}"
    );
}
