//! The long chaos soak (`wasmop_tests::chaos`), one run: `tests/chaos-soak.sh`
//! builds what it needs, starts the local control plane and runs this.
//!
//! usage: chaos-soak [--minutes N] [--seed SEED] [--sharding | --features]
//!
//! `--minutes` (default 30) of faults every ~10 s with a quiet point every
//! minute; the seed defaults to `$WASMOP_CHAOS_SEED`, else a random one
//! (printed either way); `WASMOP_CHAOS_FAULTS` narrows the kinds of fault;
//! `--sharding` runs the replicas as shards (`wasmop run --sharding`);
//! `--features` runs the features together (`SoakConfig::features`: shards
//! joining and killed, a staged rollout rolled back in every window, the
//! orphan sweep every 3 s, Stamps re-created under their names mid-call,
//! the audit log's one-writer check), with the zoo, its faults
//! `FaultKind::FEATURES` unless `WASMOP_CHAOS_FAULTS` names others.
//! Prints the figures (faults survived, operations, convergence, anything
//! lost or touched) and exits 1 when an invariant broke. The replicas run
//! `wasmop-under-test`, which cargo builds next to this binary.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use wasmop_tests::chaos::{
    FaultKind, SoakConfig, faults_from_env, faults_from_env_or, random_seed, seed_from_env, soak,
};

fn parse() -> Result<(u64, Option<u64>, bool, bool)> {
    let mut minutes = 30;
    let mut seed = None;
    let mut sharding = false;
    let mut features = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--minutes" => minutes = value()?.parse().context("--minutes")?,
            "--seed" => seed = Some(value()?.parse().context("--seed")?),
            "--sharding" => sharding = true,
            "--features" => features = true,
            other => {
                bail!(
                    "unknown argument {other:?}; usage: chaos-soak [--minutes N] [--seed SEED] [--sharding | --features]"
                )
            }
        }
    }
    Ok((minutes, seed, sharding, features))
}

async fn run() -> Result<bool> {
    let (minutes, seed, sharding, features) = parse()?;
    let seed = match seed {
        Some(s) => s,
        None => seed_from_env()?.unwrap_or_else(random_seed),
    };
    let bin = std::env::current_exe()?
        .parent()
        .context("the binary's directory")?
        .join("wasmop-under-test");
    if !bin.is_file() {
        bail!(
            "{} not found: build it with `cargo build -p wasmop-tests --bins`",
            bin.display()
        );
    }
    let config = if features {
        SoakConfig {
            faults: faults_from_env_or(&FaultKind::FEATURES)?,
            sharding: true,
            features: true,
            oci: false,
            ..SoakConfig::new(seed, Duration::from_secs(minutes * 60), bin)
        }
    } else {
        SoakConfig {
            faults: faults_from_env()?,
            sharding,
            ..SoakConfig::new(seed, Duration::from_secs(minutes * 60), bin)
        }
    };
    let report = soak(config).await?;
    println!("{}", report.summary());
    Ok(report.violations.is_empty())
}

fn main() -> ExitCode {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("chaos-soak: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run()) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            // Debug: the chain, and where it came from with RUST_BACKTRACE=1.
            eprintln!("chaos-soak: {e:?}");
            ExitCode::from(2)
        }
    }
}
