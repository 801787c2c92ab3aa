//! Fault injection on the local control plane for the fault-recovery
//! tests: kill, freeze and start its components again with the exact flags
//! `tests/cluster/up.sh` used (through `tests/cluster/component.sh`), compact
//! etcd, and time the API server's `/readyz`.
//!
//! These disturb every user of the cluster, so only a test binary of its
//! own that runs its tests one at a time may use them (`tests/faults.rs`).
//! A [`Fault`] puts the component back (thawed and running) when dropped,
//! also when the test panics, so later test binaries find a healthy cluster.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use kube::Client;

use crate::{kubeconfig_path, repo_root, wait_for};

/// The cluster directory `up.sh` wrote the kubeconfig into: the component
/// script must act on the cluster the tests' client talks to.
fn cluster_dir() -> PathBuf {
    kubeconfig_path()
        .parent()
        .map(PathBuf::from)
        .unwrap_or_default()
}

fn script(args: &[&str]) -> Command {
    let mut cmd = Command::new("bash");
    cmd.arg(repo_root().join("tests/cluster/component.sh"))
        .args(args)
        .env("WASMOP_CLUSTER_DIR", cluster_dir());
    cmd
}

/// Runs `tests/cluster/component.sh ARGS` and returns what it printed.
///
/// # Errors
/// When the script fails; the error holds its output.
pub async fn component(args: &[&str]) -> Result<String> {
    let mut cmd = tokio::process::Command::from(script(args));
    let out = cmd
        .output()
        .await
        .with_context(|| format!("cannot run component.sh {args:?}"))?;
    if !out.status.success() {
        bail!(
            "component.sh {args:?} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// A component stopped (killed or frozen) by a test. Dropping it thaws and
/// starts the component again if the test did not.
#[derive(Debug)]
pub struct Fault {
    component: String,
    restored: bool,
}

impl Fault {
    /// SIGKILLs `component`; returns once it is gone.
    ///
    /// # Errors
    /// When the script fails.
    pub async fn kill(component_name: &str) -> Result<Self> {
        let fault = Self {
            component: component_name.to_string(),
            restored: false,
        };
        component(&["kill", component_name]).await?;
        Ok(fault)
    }

    /// SIGSTOPs `component`: it keeps its connections but answers nothing.
    ///
    /// # Errors
    /// When the script fails.
    pub async fn freeze(component_name: &str) -> Result<Self> {
        let fault = Self {
            component: component_name.to_string(),
            restored: false,
        };
        component(&["freeze", component_name]).await?;
        Ok(fault)
    }

    /// Starts a killed component again with its original flags; returns
    /// once it is ready (the script waits for `/readyz` or `/health`).
    ///
    /// # Errors
    /// When it does not start or get ready.
    pub async fn start(mut self) -> Result<()> {
        component(&["start", &self.component]).await?;
        self.restored = true;
        Ok(())
    }

    /// Resumes a frozen component.
    ///
    /// # Errors
    /// When the script fails.
    pub async fn thaw(mut self) -> Result<()> {
        component(&["thaw", &self.component]).await?;
        self.restored = true;
        Ok(())
    }
}

impl Drop for Fault {
    fn drop(&mut self) {
        if self.restored {
            return;
        }
        // Also reached when restoring failed: one more try. Drop cannot
        // await; the script is a short blocking call either way.
        let _ = script(&["thaw", &self.component]).output();
        let _ = script(&["start", &self.component]).output();
    }
}

/// Whether the API server answers `/readyz` with `ok` now.
pub async fn readyz(client: &Client) -> bool {
    let Ok(req) = kube::core::Request::new("/readyz").list(&Default::default()) else {
        return false;
    };
    client
        .request_text(req)
        .await
        .is_ok_and(|body| body.trim() == "ok")
}

/// Polls `/readyz` every 50 ms until it answers `ok` and returns that
/// moment: the earliest point the API server is known to be ready again.
///
/// # Errors
/// When it is not ready within `deadline`.
pub async fn wait_readyz(client: &Client, deadline: Duration) -> Result<Instant> {
    let start = Instant::now();
    loop {
        if readyz(client).await {
            return Ok(Instant::now());
        }
        if start.elapsed() > deadline {
            bail!("the API server was not ready within {deadline:?}");
        }
        // Poll interval of a wait bounded by the deadline, kept short on
        // purpose: its moment is what the recovery time is measured from.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The value of one series of the operator's metrics (0 when absent).
pub fn metric(name: &str, labels: &[(&str, &str)]) -> f64 {
    wasmop::metrics::global().get(name, labels).unwrap_or(0.0)
}

/// Waits until a metric satisfies `ok`.
///
/// # Errors
/// When it does not within `deadline`.
pub async fn wait_metric(
    what: &str,
    deadline: Duration,
    name: &str,
    labels: &[(&str, &str)],
    ok: impl Fn(f64) -> bool,
) -> Result<f64> {
    wait_for(what, deadline, || {
        let v = metric(name, labels);
        let ok = ok(v);
        async move {
            if ok {
                Ok(Some(v))
            } else {
                bail!("{name}{labels:?} = {v}")
            }
        }
    })
    .await
}
