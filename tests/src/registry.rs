//! A real OCI registry on loopback: distribution's `registry` binary, built
//! from its Go module by `tests/cluster/build.sh` (pinned as
//! `REGISTRY_VERSION`), storing into a temporary directory.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::net::free_port;
use anyhow::{Context, Result, bail};

use crate::{pinned_version, wait_for, wasmop_cache};

/// A running registry; stopped (and its storage removed) when dropped.
#[derive(Debug)]
pub struct Registry {
    /// `127.0.0.1:PORT`.
    pub host: String,
    dir: PathBuf,
    bin: PathBuf,
    child: Option<Child>,
}

impl Registry {
    /// Starts a registry and waits until it answers.
    ///
    /// # Errors
    /// When the binary is missing (with what to run) or it does not come up.
    pub async fn start() -> Result<Self> {
        let version = pinned_version("REGISTRY_VERSION")?;
        let bin = wasmop_cache()?.join(format!("bin/registry-{version}/registry"));
        if !bin.is_file() {
            bail!(
                "registry {version} not found at {}: run `bash tests/cluster/build.sh`",
                bin.display()
            );
        }
        let dir = std::env::temp_dir().join(format!(
            "wasmop-registry-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos()
        ));
        std::fs::create_dir_all(dir.join("data"))?;
        let port = free_port()?;
        let host = format!("127.0.0.1:{port}");
        let config = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {host}\n",
            dir.join("data").display()
        );
        std::fs::write(dir.join("config.yml"), config)?;
        let mut registry = Self {
            host,
            dir,
            bin,
            child: None,
        };
        registry.serve()?;
        registry.wait_up().await?;
        Ok(registry)
    }

    fn serve(&mut self) -> Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("registry.log"))?;
        let child = Command::new(&self.bin)
            .arg("serve")
            .arg(self.dir.join("config.yml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", self.bin.display()))?;
        self.child = Some(child);
        Ok(())
    }

    /// Starts a stopped registry again on the same address with the same
    /// storage; returns once it answers.
    ///
    /// # Errors
    /// When it does not come up.
    pub async fn restart(&mut self) -> Result<()> {
        if self.child.is_none() {
            self.serve()?;
        }
        self.wait_up().await
    }

    async fn wait_up(&mut self) -> Result<()> {
        let host = self.host.clone();
        wait_for(
            "the registry to answer /v2/",
            Duration::from_secs(20),
            || {
                let host = host.clone();
                async move {
                    let answer = get_v2(&host).await?;
                    if answer.starts_with("HTTP/1.1 200") {
                        Ok(Some(()))
                    } else {
                        bail!("registry answered {answer:?}")
                    }
                }
            },
        )
        .await
        .with_context(|| {
            format!(
                "registry log:\n{}",
                std::fs::read_to_string(self.dir.join("registry.log")).unwrap_or_default()
            )
        })
    }

    /// Stops the registry process (its storage stays until drop).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The status line of `GET /v2/` on `host`.
async fn get_v2(host: &str) -> Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(host).await?;
    stream
        .write_all(
            format!("GET /v2/ HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await?;
    let mut buf = Vec::new();
    stream.read_to_end(&mut buf).await?;
    Ok(String::from_utf8_lossy(&buf)
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned())
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
