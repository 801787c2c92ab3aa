//! The short chaos soak (`wasmop_tests::chaos`): two `wasmop run
//! --leader-elect` replicas with the `good` plugin and every shipped plugin
//! (the primaries of `deploy/examples/`), Widgets, EtcdBackups and the
//! examples' primaries created, edited, deleted and re-created while faults
//! drawn from a seed hit the replicas and the control plane; no bystander
//! touched, nothing deleted that no owner's deletion explains, no
//! duplicate, every Widget converged within 5 s of recovery and every
//! example primary done within 60 s at every quiet point, nothing left
//! behind at the end.
//!
//! Five soaks: a fixed seed and a random one, both printed, and the fixed
//! seed twice more with the replicas as shards (`--sharding`), once with
//! every kind of fault and once through the control plane's faults only
//! (API server and etcd restarted, frozen, compacted; a shard killed); replay one
//! with `WASMOP_CHAOS_SEED=<seed>` (the first test then runs that seed
//! alone); `WASMOP_CHAOS_FAULTS` narrows the kinds of fault, e.g.
//! `KillLeader,CrashBeforeWrite`. A soak of the features together
//! (`SoakConfig::features`, the fixed seed): shards joining and killed, a
//! staged rollout rolled back, the orphan sweep every 3 s, primaries
//! re-created under their names mid-call; no status naming another UID,
//! nothing collected whose owner lives, no primary written by two shards
//! (the API server's audit log). And a soak that
//! breaks every invariant itself, to show each check fails when it should.
//!
//! The soaks stop and freeze the cluster's components, so they live in a
//! test binary of their own (cargo runs test binaries one at a time) and
//! take a lock so that its tests run one after another. The 30-minute
//! soak is `tests/chaos-soak.sh`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use wasmop_tests::chaos::{
    Breach, FaultKind, GOOD_WRITES, Invariant, Report, SoakConfig, faults_from_env,
    faults_from_env_or, random_seed, seed_from_env, soak,
};

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The fixed seed of the CI soak.
/// Its first faults: a crash before each write of a plan, the
/// controller-manager stopped, the leader killed, a hot swap (the plugin
/// comes from the OCI registry: odd seed), the registry stopped.
const FIXED_SEED: u64 = 0x5eed_001b;

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_wasmop-under-test"))
}

/// A short soak: 40 s of faults every ~6 s, a quiet point after 20 s;
/// `WASMOP_CHAOS_FAULTS` may narrow the kinds of fault.
fn short(seed: u64) -> Result<SoakConfig> {
    Ok(SoakConfig {
        faults: faults_from_env()?,
        fault_every: Duration::from_secs(6),
        quiet_every: Duration::from_secs(20),
        ..SoakConfig::new(seed, Duration::from_secs(40), bin())
    })
}

fn assert_clean(report: &Report) {
    assert_clean_with(report, true);
}

/// The checks of every soak; `zoo`: the zoo of every shipped plugin ran.
fn assert_clean_with(report: &Report, zoo: bool) {
    eprintln!("{}", report.summary());
    // The violations come first: a CI log keeps only the first lines of a
    // panic.
    assert!(
        report.violations.is_empty(),
        "seed {} (replay: WASMOP_CHAOS_SEED={}) broke {} invariant(s):\n{}\n{}",
        report.seed,
        report.seed,
        report.violations.len(),
        report
            .violations
            .iter()
            .map(|v| format!("  {v}"))
            .collect::<Vec<_>>()
            .join("\n"),
        report.summary()
    );
    assert!(report.quiet_points >= 1, "no quiet point was measured");
    assert!(
        report.faults.values().sum::<usize>() >= 3,
        "fewer than 3 faults injected: {:?}",
        report.faults
    );
    assert!(report.ops.total() > 0, "no load operation completed");
    if report.faults.contains_key(&FaultKind::CrashBeforeWrite) {
        // Both of good's writes; a zoo plan's later index is reported.
        assert!(
            (0..GOOD_WRITES).all(|i| report.crashed_at_writes.contains(&i)),
            "the leader did not crash before every write of a plan:\n{}",
            report.summary()
        );
    }
    assert!(
        !zoo || (!report.zoo.is_empty() && !report.zoo_convergence.is_empty()),
        "the zoo of every shipped plugin was not measured:\n{}",
        report.summary()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_soak_a_fixed_seed_and_a_random_one() -> Result<()> {
    let _serial = SERIAL.lock().await;
    let seeds = match seed_from_env()? {
        Some(seed) => vec![seed],
        None => vec![FIXED_SEED, random_seed()],
    };
    eprintln!("chaos soak seeds: {seeds:?}");
    for seed in seeds {
        let report = soak(short(seed)?).await?;
        assert_clean(&report);
    }
    Ok(())
}

/// The same with the replicas as shards (`--sharding`): a primary's
/// shard makes its plans, a killed shard's primaries are re-homed before
/// recovery, and the invariants hold as without sharding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_soak_with_the_replicas_as_shards() -> Result<()> {
    let _serial = SERIAL.lock().await;
    let seed = seed_from_env()?.unwrap_or(FIXED_SEED);
    let report = soak(SoakConfig {
        sharding: true,
        ..short(seed)?
    })
    .await?;
    assert_clean(&report);
    Ok(())
}

/// Sharded again, through the control plane's faults only: the API server
/// restarted and frozen, etcd restarted and compacted, a shard killed.
/// Each shard's label-selected watches (its own primaries, the owned
/// objects it labelled, the leader's watch of unlabelled primaries) must
/// resume after each, and a primary created while the API server was away
/// must still be placed and reconciled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_soak_with_the_replicas_as_shards_through_control_plane_faults() -> Result<()> {
    let _serial = SERIAL.lock().await;
    let seed = seed_from_env()?.unwrap_or(FIXED_SEED);
    let control_plane = [
        FaultKind::ApiServerRestart,
        FaultKind::ApiServerFreeze,
        FaultKind::EtcdRestart,
        FaultKind::EtcdCompaction,
    ];
    let report = soak(SoakConfig {
        sharding: true,
        faults: [
            &control_plane[..],
            &[FaultKind::KillLeader, FaultKind::KillFollower],
        ]
        .concat(),
        ..short(seed)?
    })
    .await?;
    assert_clean(&report);
    assert!(
        report.faults.keys().any(|k| control_plane.contains(k)),
        "no control-plane fault was drawn:\n{}",
        report.summary()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_invariant_fails_when_the_soak_breaks_it() -> Result<()> {
    let _serial = SERIAL.lock().await;
    let config = SoakConfig {
        // No fault: only the soak's own breaches.
        fault_every: Duration::from_secs(3600),
        quiet_every: Duration::from_secs(8),
        breach: Breach::Every,
        // Widgets only: the breaches are of ConfigMaps.
        backup: false,
        zoo: false,
        ..SoakConfig::new(FIXED_SEED, Duration::from_secs(8), bin())
    };
    let report = soak(config).await?;
    eprintln!("{}", report.summary());
    for kind in [
        Invariant::Bystander,
        Invariant::UnexplainedDeletion,
        Invariant::Ownership,
        Invariant::Convergence,
    ] {
        assert!(
            !report.broken(kind).is_empty(),
            "the soak broke {kind:?} but the check did not see it:\n{}",
            report.summary()
        );
    }
    assert!(
        report.broken(Invariant::ReplicaExited).is_empty(),
        "{}",
        report.summary()
    );
    Ok(())
}

/// The features mode (`SoakConfig::features`): the replicas are shards (a
/// third joins and is killed, besides the kills of the leader and of a
/// follower), a staged rollout of `good-v2` goes on and is rolled back in
/// each window, the orphan sweep runs every 3 s, Stamps are deleted and
/// created again under their names while their call holds, Labellers
/// (owned by label) churn. On top of the soak's invariants: no Stamp's
/// status names a UID other than its own, no object whose owner lives is
/// collected (label-owned ones included), the rollout is rolled back and
/// every Widget back on the current version, and the API server's audit
/// log shows no primary written by two shards without a hand-over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_soak_of_the_features_together() -> Result<()> {
    let _serial = SERIAL.lock().await;
    let seed = seed_from_env()?.unwrap_or(FIXED_SEED);
    let report = soak(SoakConfig {
        sharding: true,
        features: true,
        oci: false,
        // The zoo runs in the 30-minute soak (`--features`); here the
        // minutes go to the features.
        zoo: false,
        faults: faults_from_env_or(&FaultKind::FEATURES)?,
        ..short(seed)?
    })
    .await?;
    assert_clean_with(&report, false);
    let count = |what: &str| report.features.get(what).copied().unwrap_or(0);
    for what in [
        "rollouts on their canary step",
        "rollouts rolled back",
        "stamps re-created under their name",
        "stamp statuses checked",
    ] {
        assert!(
            count(what) >= 1,
            "{what}: none in this soak:\n{}",
            report.summary()
        );
    }
    assert!(
        report.audit.is_some(),
        "the audit log was not checked:\n{}",
        report.summary()
    );
    Ok(())
}
