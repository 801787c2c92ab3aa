//! The chaos soak: two real `wasmop run --leader-elect` replicas with the
//! `good` test plugin (Widget → ConfigMap `<name>-cm`) and every shipped
//! plugin: `backup` (EtcdBackup → Job, cluster-scoped primaries, the soak's
//! namespace as its target namespace) and the zoo ([`zoo`]: the primaries
//! of `deploy/examples/`, after the upstream samples — FireboltInstance,
//! FireboltEngineClass and FireboltEngine, EtcdBackup and Backup,
//! CelldFleet, TerdutServer and TerdutTeam against an in-process stand-in
//! terdut-server). Widgets are created, edited, deleted and re-created
//! under the same names, EtcdBackups created, deleted and re-created under
//! the same names (`pvcName` is immutable: no edits), the zoo's primaries
//! deleted and re-created, while faults drawn at random from a printed
//! seed hit the replicas and the control plane; invariants checked all
//! along and at every quiet point.
//!
//! Faults ([`FaultKind`]): SIGKILL of the leader or of the follower replica
//! (restarted at once), kube-apiserver restarted or frozen, etcd restarted
//! or its history compacted, kube-controller-manager stopped for 30 s (no
//! garbage collection meanwhile), a hot swap of the plugin (`good` ↔
//! `good-v2`, or the same plugin written again), a crash of the leader
//! right before write N of a plan (the host's test-only failpoint,
//! `host/src/execute/failpoint.rs`), at both write indices of `good`'s
//! plans and at one index from [`ZOO_WRITE_MIN`] to [`ZOO_WRITE_MAX`] in
//! the longer plan of a zoo primary created anew, and, when the plugin comes from a local OCI
//! registry (`oci://`, odd seeds; a hot swap is then a push to its tag),
//! the registry stopped for 20 s in the background. Faults come every `fault_every` (±25 %), drawn from
//! a shuffled deck of every kind so each comes up once per deck; a
//! controller-manager outage runs in the background while other faults
//! follow. The seed decides the faults, their timing and the load, not the
//! timing of the cluster's answers, so a replay with the same seed is the
//! same script, not the same interleaving.
//!
//! Invariants ([`Invariant`]), each checked by [`Ledger`] from the
//! ConfigMaps (and the `backup` plugin's Jobs) listed every 300 ms and at
//! the end:
//!
//! - `Bystander`: objects the soak made before the operator started and
//!   that no plan may touch — an unlabelled ConfigMap `<name>-cm` for each
//!   Widget name `b<i>` the load creates and deletes, unrelated ConfigMaps
//!   in the soak's namespace, and look-alikes (`w<i>-cm`) in a namespace
//!   the operator does not watch — keep their UID and resourceVersion.
//! - `UnexplainedDeletion`: a ConfigMap or Job labelled
//!   `app.kubernetes.io/managed-by=wasmop` disappears only when the primary
//!   that controlled it (by UID) was deleted by the load (the garbage
//!   collector, the host collecting what it missed, or the plugin's cleanup
//!   under its finalizer); neither plugin deletes otherwise here.
//! - `Ownership`: no two managed ConfigMaps have the same controller, and
//!   none changes controller.
//! - `SerialBackups`: at most one backup Job in the `backup` plugin's target
//!   namespace holds the slot, as its README promises: a Job holds it while
//!   it has not ended (also while it is being deleted), and then while a
//!   Pod of it may still run (not ended; being deleted, until a minute past
//!   its deletion's due time), also once the Job is gone.
//! - `Convergence`: at every quiet point (load paused, every fault over and
//!   the operator led again) every Widget is edited once more, and each
//!   converges within 5 s of the later of the last fault's recovery and the
//!   last load operation: its
//!   ConfigMap holds `spec.value`, controlled by it, and `Reconciled=True`
//!   for its generation; or, for the `b<i>` Widgets whose ConfigMap is a
//!   bystander, the documented `Reconciled=False` `PlanRejected` naming
//!   that ConfigMap; every EtcdBackup `Reconciled=True` for its generation;
//!   every zoo primary (re-created first if the load left it deleted, and
//!   edited once more) `Reconciled` for its generation within 5 s, and at
//!   its done condition within [`ZOO_BOUND`]. The distributions are reported. At the end the zoo is
//!   deleted and must be gone within 120 s with every object its plugins
//!   wrote for it, the soak's EtcdBackups are deleted and must be gone
//!   within 60 s, and no managed object may be left whose owner is gone.
//!
//! The soak's own API calls at quiet points and at the end retry errors a
//! fault explains ([`transient`]) for up to a minute and count them; a
//! soak that still cannot go on returns that first error, with the faults
//! so far, after putting the cluster right as far as it can.
//!
//! The replicas sweep for objects whose owner is gone every 15 s
//! (`--orphan-sweep-interval-secs`): kube-controller-manager is stopped and
//! started again over and over, and its garbage collector misses owners'
//! deletions then (a 30-minute soak with the default 10-minute sweep ended
//! with a backup Job whose EtcdBackup was long gone).
//!
//! Recovery, the instant convergence is timed from: the API server answers
//! `/readyz`, kube-controller-manager runs, both replicas run and answer
//! `/readyz`, both run the active plugin version (`wasmop_plugin_info`),
//! and the Lease is held by a running replica and was renewed within its
//! duration — so a replica may write.
//!
//! **Sharding** ([`SoakConfig::sharding`]): the replicas run with
//! `--sharding`, each a shard with a Lease of its own and the leader also
//! the sharder. A crash before a write is then armed on every shard (the
//! primary's shard makes the plan), and recovery also waits until every
//! Widget is placed on a running replica's shard (a killed shard's Lease
//! expired and its primaries re-homed), so convergence within 5 s covers
//! the reconciles of re-homed primaries; the invariants are the same.
//!
//! **Features** ([`SoakConfig::features`], module `features`): the
//! features run together — a third shard joins and leaves
//! ([`FaultKind::ShardJoin`]), a staged rollout is rolled back in every
//! window, the orphan sweep runs every 3 s, Stamps are re-created under
//! their names mid-call, Labellers (owned by label) churn — with three
//! more invariants: `StatusUid`, `Rollout` and `OneWriter` (the API
//! server's audit log); `UnexplainedDeletion` then also covers the objects
//! owned by label (their owner is the host's owner label).
//!
//! [`Breach`] makes the soak break every invariant itself once (touch a
//! bystander, delete a managed ConfigMap whose Widget lives, forge a second
//! ConfigMap for one Widget, stop both replicas before a quiet point), to
//! show each check can fail; `SerialBackups` is shown to fail by
//! `tests/tests/backup.rs` (two backup Jobs made by hand, one of them
//! being deleted, then its Pod alone), which calls [`backup_slot_holders`].
//!
//! The soak disturbs the whole cluster: only a test binary of its own may
//! run it (`tests/chaos.rs`), or `tests/chaos-soak.sh`.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::net::free_port;
use anyhow::{Context, Result, bail};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
    Preconditions,
};
use kube::core::GroupVersionKind;
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::faults::{Fault, component, readyz, wait_readyz};
use crate::operator::plugin_path;
use crate::registry::Registry;
use crate::widgets::{TempDir, install, widgets};
use crate::{TestNamespace, apply_test_crds, kubeconfig_path, wait_for};

/// What the issue asks: converged this soon after recovery.
pub const CONVERGE_BOUND: Duration = Duration::from_secs(5);
/// How long kube-controller-manager stays stopped.
pub const GC_OUTAGE: Duration = Duration::from_secs(30);
/// How long the OCI registry stays stopped.
pub const REGISTRY_OUTAGE: Duration = Duration::from_secs(20);
/// The plugin's repository and tag in the soak's registry.
const OCI_REFERENCE: &str = "wasmop/good:live";
/// The PVC the soak's EtcdBackups name (kwok binds it).
const BACKUP_PVC: &str = "etcd-backup-pvc";
/// Label on the soak's cluster-scoped objects (its EtcdBackups), valued
/// with the soak's namespace.
const CHAOS_LABEL: &str = "wasmop.dev/chaos";
/// The label every object the host writes carries.
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// The host's owner label on an object owned by label.
pub const OWNER_UID_LABEL: &str = wasmop::reconcile::validate::OWNER_UID_LABEL;
/// Name of the replicas' Lease.
const LEASE: &str = "wasmop-chaos";
/// Writes of a `good` plan: the ConfigMap, the status.
pub const GOOD_WRITES: usize = 2;
/// The crash-before-write fault also aborts at one index from here up to
/// [`ZOO_WRITE_MAX`], in the longer plans of the zoo's plugins.
pub const ZOO_WRITE_MIN: usize = GOOD_WRITES;
/// See [`ZOO_WRITE_MIN`].
pub const ZOO_WRITE_MAX: usize = 5;
/// How long a zoo primary may take to its done condition after a quiet
/// point's recovery before it is a violation: that waits on the work of
/// other controllers (Deployments rolled out, Pods scheduled and run by
/// kwok, Jobs completed, HTTP calls answered). `Reconciled` for its
/// generation, the host's own part, is held to [`CONVERGE_BOUND`].
pub const ZOO_BOUND: Duration = Duration::from_secs(60);
/// How long the simulated kubelet may take to run a new Pod after a quiet
/// point's recovery before the soak stops with an error: an environment
/// that does not run Pods cannot measure the zoo.
pub const KUBELET_BOUND: Duration = Duration::from_secs(180);

mod features;
mod zoo;
use features::Features;
pub use features::stamp_uid_problem;
use zoo::Zoo;

/// Deterministic random numbers from the seed (splitmix64).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator starting from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }

    /// `d` scaled by a factor in [0.75, 1.25).
    pub fn jitter(&mut self, d: Duration) -> Duration {
        d.mul_f64(0.75 + self.below(500) as f64 / 1000.0)
    }

    /// A short lowercase token.
    pub fn token(&mut self) -> String {
        format!("{:08x}", self.next_u64() as u32)
    }
}

/// `$WASMOP_CHAOS_SEED` when set (decimal or `0x…`), else a seed from the
/// clock.
///
/// # Errors
/// When the variable is set but is not a number.
pub fn seed_from_env() -> Result<Option<u64>> {
    let Ok(text) = std::env::var("WASMOP_CHAOS_SEED") else {
        return Ok(None);
    };
    let text = text.trim();
    let seed = match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.parse(),
    }
    .with_context(|| format!("WASMOP_CHAOS_SEED={text:?} is not a number"))?;
    Ok(Some(seed))
}

/// The fault kinds `$WASMOP_CHAOS_FAULTS` names (comma-separated, as
/// [`FaultKind`]'s variants are spelt, e.g. `KillLeader,CrashBeforeWrite`),
/// else every kind.
///
/// # Errors
/// When it names an unknown kind.
pub fn faults_from_env() -> Result<Vec<FaultKind>> {
    faults_from_env_or(&FaultKind::ALL)
}

/// [`faults_from_env`] with `default` when the variable is not set (the
/// features mode's [`FaultKind::FEATURES`]).
///
/// # Errors
/// When it names an unknown kind.
pub fn faults_from_env_or(default: &[FaultKind]) -> Result<Vec<FaultKind>> {
    let Ok(text) = std::env::var("WASMOP_CHAOS_FAULTS") else {
        return Ok(default.to_vec());
    };
    let known: Vec<FaultKind> = FaultKind::ALL
        .into_iter()
        .chain([FaultKind::ShardJoin])
        .collect();
    text.split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|t| {
            known
                .iter()
                .copied()
                .find(|k| format!("{k:?}") == t)
                .with_context(|| {
                    format!("WASMOP_CHAOS_FAULTS: unknown fault {t:?}; one of {known:?}")
                })
        })
        .collect()
}

/// A seed from the clock and the process id.
pub fn random_seed() -> u64 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as u64;
    Rng::new(nanos ^ u64::from(std::process::id()).rotate_left(32)).next_u64()
}

/// One kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultKind {
    /// SIGKILL of the replica holding the Lease; started again at once.
    KillLeader,
    /// SIGKILL of the other replica; started again at once.
    KillFollower,
    /// kube-apiserver SIGKILLed, kept down 0-3 s, started again.
    ApiServerRestart,
    /// kube-apiserver SIGSTOPped for 2-8 s.
    ApiServerFreeze,
    /// etcd SIGKILLed and started again.
    EtcdRestart,
    /// etcd's history compacted up to its newest revision.
    EtcdCompaction,
    /// kube-controller-manager stopped for [`GC_OUTAGE`].
    GcStopped,
    /// The plugin file rewritten: the other version, or the same bytes.
    HotSwap,
    /// The leader aborts right before write N of its next plan, for
    /// every N in turn (each time the replica is started again and the
    /// next leader armed).
    CrashBeforeWrite,
    /// The OCI registry the plugin comes from stopped for
    /// [`REGISTRY_OUTAGE`] (soaks that deliver it by `oci://` only).
    RegistryStopped,
    /// A third shard joins (its share handed over by drain and
    /// acknowledgement), or, when it runs, is SIGKILLed and stays away
    /// (its primaries re-homed once its shard Lease expired). Features
    /// mode only (not in [`FaultKind::ALL`]).
    ShardJoin,
}

impl FaultKind {
    /// Every kind, in a fixed order.
    pub const ALL: [FaultKind; 10] = [
        FaultKind::KillLeader,
        FaultKind::KillFollower,
        FaultKind::ApiServerRestart,
        FaultKind::ApiServerFreeze,
        FaultKind::EtcdRestart,
        FaultKind::EtcdCompaction,
        FaultKind::GcStopped,
        FaultKind::HotSwap,
        FaultKind::CrashBeforeWrite,
        FaultKind::RegistryStopped,
    ];

    /// The kinds of the features mode ([`SoakConfig::features`]): every
    /// kind but the hot swap (the rollout's candidate is the plugin's
    /// shadow beside it) and the registry (the plugins come from a
    /// directory), plus [`FaultKind::ShardJoin`].
    pub const FEATURES: [FaultKind; 9] = [
        FaultKind::KillLeader,
        FaultKind::KillFollower,
        FaultKind::ShardJoin,
        FaultKind::ApiServerRestart,
        FaultKind::ApiServerFreeze,
        FaultKind::EtcdRestart,
        FaultKind::EtcdCompaction,
        FaultKind::GcStopped,
        FaultKind::CrashBeforeWrite,
    ];
}

/// The invariants the soak asserts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Invariant {
    /// A bystander was changed, adopted or deleted.
    Bystander,
    /// A managed object disappeared though no plan or owner deletion
    /// explains it.
    UnexplainedDeletion,
    /// Two managed objects for one owner, or one that changed owner.
    Ownership,
    /// A primary did not converge within [`CONVERGE_BOUND`] of recovery.
    Convergence,
    /// A replica exited without being killed by the soak (but for a
    /// shard's designed exit on a lost Lease term: `Report::shard_terms_lost`).
    ReplicaExited,
    /// Features mode: a status names a UID other than its object's (a
    /// status decided for a primary landed on a successor of its name).
    StatusUid,
    /// Features mode: a primary written by two shards without a hand-over
    /// between (the API server's audit log, [`crate::audit::check_one_writer`]).
    OneWriter,
    /// Features mode: a rollout not rolled back when asked, promoted, or
    /// a primary left on the candidate after the rollback.
    Rollout,
    /// Two backups held the `backup` plugin's single slot at once (see
    /// [`backup_slot_holders`]).
    SerialBackups,
}

/// One broken invariant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Which.
    pub invariant: Invariant,
    /// What was seen.
    pub detail: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}: {}", self.invariant, self.detail)
    }
}

/// A ConfigMap as the checks see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// Kind (`ConfigMap`, `Job`).
    pub kind: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
    /// resourceVersion.
    pub resource_version: String,
    /// UID of its controller ownerReference.
    pub controller: Option<String>,
    /// Labelled `app.kubernetes.io/managed-by=wasmop`.
    pub managed: bool,
    /// `data.value`.
    pub value: Option<String>,
}

impl Seen {
    /// The checks' view of `cm`.
    pub fn of(cm: &ConfigMap) -> Self {
        Self::of_meta(
            "ConfigMap",
            &cm.metadata,
            cm.data.as_ref().and_then(|d| d.get("value").cloned()),
        )
    }

    /// The checks' view of an object of `kind` with metadata `m`.
    pub fn of_meta(kind: &str, m: &kube::api::ObjectMeta, value: Option<String>) -> Self {
        Self {
            kind: kind.to_owned(),
            namespace: m.namespace.clone().unwrap_or_default(),
            name: m.name.clone().unwrap_or_default(),
            uid: m.uid.clone().unwrap_or_default(),
            resource_version: m.resource_version.clone().unwrap_or_default(),
            // A controller ownerReference, else the host's owner label
            // (a kind owned by label: `labeller`'s ConfigMaps).
            controller: m
                .owner_references
                .iter()
                .flatten()
                .find(|r| r.controller == Some(true))
                .map(|r| r.uid.clone())
                .or_else(|| {
                    m.labels
                        .as_ref()
                        .and_then(|l| l.get(OWNER_UID_LABEL))
                        .cloned()
                }),
            managed: m
                .labels
                .as_ref()
                .and_then(|l| l.get(MANAGED_BY))
                .is_some_and(|v| v == "wasmop"),
            value,
        }
    }

    fn key(&self) -> String {
        if self.kind == "ConfigMap" {
            format!("{}/{}", self.namespace, self.name)
        } else {
            format!("{} {}/{}", self.kind, self.namespace, self.name)
        }
    }
}

/// The invariant checks' memory: the bystanders as made, the managed
/// objects as last seen, what was reported already.
#[derive(Debug, Default)]
pub struct Ledger {
    /// `namespace/name` → (UID, resourceVersion) as the soak made them.
    bystanders: BTreeMap<String, (String, String)>,
    /// Managed ConfigMaps by UID, as last seen.
    managed: HashMap<String, Seen>,
    reported: HashSet<String>,
    /// Every violation, in the order seen.
    pub violations: Vec<Violation>,
    /// Managed objects seen to disappear, each explained.
    pub explained_deletions: usize,
}

impl Ledger {
    /// Remembers a bystander as made.
    pub fn bystander(&mut self, seen: &Seen) {
        self.bystanders.insert(
            seen.key(),
            (seen.uid.clone(), seen.resource_version.clone()),
        );
    }

    /// Records a violation another check found (the features mode's),
    /// once under `key`; true when it is new.
    pub fn note(&mut self, key: String, invariant: Invariant, detail: String) -> bool {
        let before = self.violations.len();
        self.report(key, invariant, detail);
        self.violations.len() > before
    }

    fn report(&mut self, key: String, invariant: Invariant, detail: String) {
        if self.reported.insert(key) {
            self.violations.push(Violation { invariant, detail });
        }
    }

    /// Checks one complete listing of the watched namespaces: `seen` is
    /// every ConfigMap of `namespaces` now, `deleted_owners` the UIDs of
    /// every Widget the load deleted (recorded before each delete is
    /// sent). Returns the violations this listing found.
    pub fn observe(
        &mut self,
        namespaces: &[String],
        seen: &[Seen],
        deleted_owners: &HashSet<String>,
    ) -> Vec<Violation> {
        let before = self.violations.len();
        let by_key: HashMap<String, &Seen> = seen.iter().map(|s| (s.key(), s)).collect();
        let bystanders: Vec<(String, (String, String))> = self
            .bystanders
            .iter()
            .filter(|(k, _)| namespaces.iter().any(|n| k.starts_with(&format!("{n}/"))))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (key, (uid, rv)) in bystanders {
            match by_key.get(&key) {
                None => self.report(
                    format!("bystander-gone {key}"),
                    Invariant::Bystander,
                    format!("bystander ConfigMap {key} was deleted"),
                ),
                Some(s) if s.uid != uid => self.report(
                    format!("bystander-uid {key}"),
                    Invariant::Bystander,
                    format!(
                        "bystander ConfigMap {key} was replaced (uid {uid} → {})",
                        s.uid
                    ),
                ),
                Some(s) if s.resource_version != rv => self.report(
                    format!("bystander-rv {key}"),
                    Invariant::Bystander,
                    format!(
                        "bystander ConfigMap {key} was changed (resourceVersion {rv} → {}; managed-by wasmop: {}, controller {:?})",
                        s.resource_version, s.managed, s.controller
                    ),
                ),
                Some(_) => {}
            }
        }
        let now: HashMap<&str, &Seen> = seen
            .iter()
            .filter(|s| s.managed)
            .map(|s| (s.uid.as_str(), s))
            .collect();
        let gone: Vec<Seen> = self
            .managed
            .values()
            .filter(|s| namespaces.contains(&s.namespace) && !now.contains_key(s.uid.as_str()))
            .cloned()
            .collect();
        for s in gone {
            self.managed.remove(&s.uid);
            match &s.controller {
                Some(owner) if deleted_owners.contains(owner) => self.explained_deletions += 1,
                owner => self.report(
                    format!("deleted {}", s.uid),
                    Invariant::UnexplainedDeletion,
                    format!(
                        "managed {} {} (uid {}) was deleted while its owner {owner:?} was not",
                        s.kind,
                        s.key(),
                        s.uid
                    ),
                ),
            }
        }
        for s in now.values() {
            if let Some(prev) = self.managed.get(&s.uid)
                && prev.controller != s.controller
            {
                let (key, uid, from, to) = (
                    s.key(),
                    s.uid.clone(),
                    prev.controller.clone(),
                    s.controller.clone(),
                );
                self.report(
                    format!("owner {uid}"),
                    Invariant::Ownership,
                    format!("managed ConfigMap {key} changed controller {from:?} → {to:?}"),
                );
            }
            self.managed.insert(s.uid.clone(), (*s).clone());
        }
        let mut by_owner: BTreeMap<(&str, &str), Vec<String>> = BTreeMap::new();
        for s in now.values() {
            if let Some(owner) = &s.controller {
                by_owner
                    .entry((owner, s.kind.as_str()))
                    .or_default()
                    .push(s.key());
            }
        }
        for ((owner, kind), mut objs) in by_owner {
            if objs.len() > 1 {
                objs.sort();
                self.report(
                    format!("duplicate {owner} {objs:?}"),
                    Invariant::Ownership,
                    format!(
                        "{} managed {kind}s controlled by {owner}: {objs:?}",
                        objs.len()
                    ),
                );
            }
        }
        self.violations[before..].to_vec()
    }
}

/// Where one Widget stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Reconciled for its generation, its ConfigMap holds its value.
    Converged,
    /// The documented blocking condition (its ConfigMap is a bystander).
    Blocked,
    /// Not there yet: why.
    Behind(String),
}

/// The verdict on `widget` given the ConfigMap named after it, if any;
/// `bystander_cm` when that name belongs to a bystander.
pub fn verdict(widget: &Value, cm: Option<&Seen>, bystander_cm: bool) -> Verdict {
    let generation = widget["metadata"]["generation"].as_i64();
    let uid = widget["metadata"]["uid"].as_str().unwrap_or_default();
    let name = widget["metadata"]["name"].as_str().unwrap_or_default();
    let status = &widget["status"];
    let reconciled = status["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Reconciled"))
        .cloned()
        .unwrap_or(Value::Null);
    let cond_gen = reconciled["observedGeneration"].as_i64();
    if generation.is_none() || cond_gen != generation {
        return Verdict::Behind(format!(
            "Reconciled is for generation {cond_gen:?}, the Widget is at {generation:?}: {reconciled}"
        ));
    }
    if bystander_cm {
        let message = reconciled["message"].as_str().unwrap_or_default();
        return if reconciled["status"] == "False"
            && reconciled["reason"] == "PlanRejected"
            && message.contains(&format!("{name}-cm"))
        {
            Verdict::Blocked
        } else {
            Verdict::Behind(format!(
                "expected PlanRejected naming the bystander {name}-cm: {reconciled}"
            ))
        };
    }
    if reconciled["status"] != "True" {
        return Verdict::Behind(format!("Reconciled is not True: {reconciled}"));
    }
    if status["observedGeneration"].as_i64() != generation {
        return Verdict::Behind(format!(
            "status.observedGeneration {} for generation {generation:?}",
            status["observedGeneration"]
        ));
    }
    let want = widget["spec"]["value"].as_str().unwrap_or_default();
    match cm {
        None => Verdict::Behind(format!("no ConfigMap {name}-cm")),
        Some(c) if c.controller.as_deref() != Some(uid) => Verdict::Behind(format!(
            "{name}-cm is controlled by {:?}, not {uid}",
            c.controller
        )),
        Some(c) if c.value.as_deref() != Some(want) => Verdict::Behind(format!(
            "{name}-cm holds {:?}, spec.value is {want:?}",
            c.value
        )),
        Some(_) => Verdict::Converged,
    }
}

/// The figures of convergence times.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Distribution {
    /// Fastest.
    pub min: Duration,
    /// Median.
    pub median: Duration,
    /// 90th percentile.
    pub p90: Duration,
    /// Slowest.
    pub max: Duration,
}

impl Distribution {
    /// Of `times`; `None` when empty.
    pub fn of(times: &[Duration]) -> Option<Self> {
        let mut t = times.to_vec();
        t.sort();
        let at = |q: f64| t[((t.len() - 1) as f64 * q).round() as usize];
        (!t.is_empty()).then(|| Self {
            min: t[0],
            median: at(0.5),
            p90: at(0.9),
            max: t[t.len() - 1],
        })
    }
}

/// Which invariant-breaking actions the soak takes itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Breach {
    /// None: an honest soak.
    None,
    /// Break every invariant once before the first quiet point.
    Every,
}

/// How to run a soak.
#[derive(Debug, Clone)]
pub struct SoakConfig {
    /// The seed of every random choice.
    pub seed: u64,
    /// How long faults and load run, quiet points excluded.
    pub duration: Duration,
    /// Mean time between faults.
    pub fault_every: Duration,
    /// A quiet point after this long of faults and load.
    pub quiet_every: Duration,
    /// Widgets `w<i>` the load works on.
    pub widgets: usize,
    /// Widgets `b<i>` whose ConfigMap name a bystander holds.
    pub blocked: usize,
    /// The `wasmop` program the replicas run.
    pub wasmop_bin: PathBuf,
    /// Invariant-breaking actions of the soak itself.
    pub breach: Breach,
    /// The kinds of fault drawn (default every kind).
    pub faults: Vec<FaultKind>,
    /// Deliver the plugin from a local OCI registry (`oci://`, hot swaps
    /// are pushes to its tag) instead of a directory (hot swaps rewrite
    /// the file). Default: odd seeds.
    pub oci: bool,
    /// Run the shipped `backup` plugin as well, with EtcdBackups created,
    /// deleted and re-created under the same names (its Jobs checked like
    /// the ConfigMaps). Default: true.
    pub backup: bool,
    /// Run every shipped plugin on the primaries of `deploy/examples/`
    /// ([`Zoo`]), churned; needs `backup`. Default: true.
    pub zoo: bool,
    /// Run the replicas with `--sharding`: each a shard of its own, the
    /// Lease holder also the sharder (see "Sharding" above). Default:
    /// false.
    pub sharding: bool,
    /// The features mode ([`features`]): the replicas are shards (a third
    /// joins and leaves), a staged rollout of `good-v2` goes on and is
    /// rolled back in every window, the orphan sweep runs every
    /// [`features::SWEEP_SECS`] s, Stamps (`stamper`) are deleted and
    /// created again under their names while a call holds, Labellers
    /// (`labeller`, owned by label) churn; the replicas run as an audited
    /// ServiceAccount. Needs `sharding`; the plugins come from a
    /// directory. Default: false.
    pub features: bool,
}

impl SoakConfig {
    /// The defaults for `seed` and `duration`, replicas running `bin`.
    pub fn new(seed: u64, duration: Duration, bin: PathBuf) -> Self {
        Self {
            seed,
            duration,
            fault_every: Duration::from_secs(10),
            quiet_every: Duration::from_secs(60),
            widgets: 10,
            blocked: 2,
            wasmop_bin: bin,
            breach: Breach::None,
            faults: FaultKind::ALL.to_vec(),
            oci: seed % 2 == 1,
            backup: true,
            zoo: true,
            sharding: false,
            features: false,
        }
    }
}

/// Load operations done and refused.
#[derive(Debug, Clone, Default)]
pub struct Ops {
    /// Widgets created.
    pub created: usize,
    /// Widgets edited.
    pub edited: usize,
    /// Primaries deleted.
    pub deleted: usize,
    /// Of those, created again at once under the same name.
    pub recreated: usize,
    /// Operations the API server did not complete (a fault was on).
    pub failed: usize,
    /// The soak's own calls retried after a transient error.
    pub retried: usize,
}

impl Ops {
    /// Operations completed (a deletion and its re-creation count as two).
    pub fn total(&self) -> usize {
        self.created + self.edited + self.deleted + self.recreated
    }
}

/// What a soak saw.
#[derive(Debug, Clone)]
pub struct Report {
    /// Its seed.
    pub seed: u64,
    /// Faults injected, by kind.
    pub faults: BTreeMap<FaultKind, usize>,
    /// Every fault in order, with its moment and detail.
    pub fault_log: Vec<String>,
    /// Write indices the failpoint crashed the leader at.
    pub crashed_at_writes: BTreeSet<usize>,
    /// Load.
    pub ops: Ops,
    /// Convergence time of each Widget at each quiet point.
    pub convergence: Vec<Duration>,
    /// Time of each zoo primary to its done condition at each quiet point.
    pub zoo_convergence: Vec<Duration>,
    /// Time of each zoo primary to `Reconciled` for its generation at each
    /// quiet point.
    pub zoo_reconciled: Vec<Duration>,
    /// The zoo's primaries (`Kind/name`), empty without a zoo.
    pub zoo: Vec<String>,
    /// Zoo primaries not done at a quiet point because Kubernetes' garbage
    /// collector has not removed a Pod of their predecessor (a Pod of a
    /// StatefulSet re-created under its name, or a Pod the primary
    /// controlled itself), or waiting for an instance so blocked, with the
    /// evidence: the cluster's fault, not a broken invariant (see
    /// `Zoo::gc_blocked`).
    pub gc_blocked: Vec<String>,
    /// Control-plane components (kube-controller-manager, kube-scheduler,
    /// kwok) found not running at a quiet point and started again, each
    /// with the end of its log: the cluster's fault, not the operator's,
    /// and repaired as a kubelet restarts a static Pod. A component that
    /// stays gone would otherwise leave the zoo without Pods or Jobs for
    /// the rest of the soak.
    pub components_restarted: Vec<String>,
    /// With sharding: replicas that exited with
    /// [`wasmop::lease::shard::LOST_TERM_EXIT_CODE`] after logging that
    /// their shard Lease term ended (they could not renew it in time, as
    /// when the API server is away longer than the Lease lasts), and were
    /// started again as a kubelet restarts a container. That exit is the
    /// host's design (its caches may be stale and its primaries given
    /// away); any other exit is a violation.
    pub shard_terms_lost: Vec<String>,
    /// At each quiet point with a zoo: how long after recovery the
    /// simulated kubelet (kwok) ran a new Pod again. The zoo's bound to its
    /// done conditions starts then (see `Zoo::kubelet_runs_pods`).
    pub kubelet_back: Vec<Duration>,
    /// Features mode: what its load and checks did (rollouts created, on
    /// their canary step, rolled back; Stamps re-created; statuses
    /// checked), by what.
    pub features: BTreeMap<String, usize>,
    /// Features mode: the audit log's one-writer check, in a line.
    pub audit: Option<String>,
    /// Quiet points.
    pub quiet_points: usize,
    /// Recovery times (end of the last fault to recovered) at quiet points.
    pub recoveries: Vec<Duration>,
    /// Managed objects that disappeared, each explained.
    pub explained_deletions: usize,
    /// Every broken invariant.
    pub violations: Vec<Violation>,
    /// Wall time.
    pub took: Duration,
}

impl Report {
    /// Broken invariants of `kind`.
    pub fn broken(&self, kind: Invariant) -> Vec<&Violation> {
        self.violations
            .iter()
            .filter(|v| v.invariant == kind)
            .collect()
    }

    /// The figures, one per line.
    pub fn summary(&self) -> String {
        let mut out = format!(
            "chaos soak seed {} (replay: WASMOP_CHAOS_SEED={}) took {:.0?}\n",
            self.seed, self.seed, self.took
        );
        let total: usize = self.faults.values().sum();
        out += &format!("faults survived: {total} ({:?})\n", self.faults);
        out += &format!(
            "crash-before-write indices reached: {:?}\n",
            self.crashed_at_writes
        );
        out += &format!(
            "operations: {} ({} created, {} edited, {} deleted, {} of them re-created at once under the same name; {} not completed during faults; {} of the soak's own calls retried after a transient error)\n",
            self.ops.total(),
            self.ops.created,
            self.ops.edited,
            self.ops.deleted,
            self.ops.recreated,
            self.ops.failed,
            self.ops.retried
        );
        if let Some(r) = Distribution::of(&self.recoveries) {
            out += &format!(
                "recovery after the last fault at {} quiet points: min {:.2?} median {:.2?} max {:.2?}\n",
                self.quiet_points, r.min, r.median, r.max
            );
        }
        match Distribution::of(&self.convergence) {
            Some(d) => {
                out += &format!(
                    "convergence after recovery ({} primary·quiet points): min {:.2?} median {:.2?} p90 {:.2?} max (worst) {:.2?}\n",
                    self.convergence.len(),
                    d.min,
                    d.median,
                    d.p90,
                    d.max
                )
            }
            None => out += "convergence: none measured\n",
        }
        if !self.zoo.is_empty() {
            out += &format!("zoo: {}\n", self.zoo.join(", "));
        }
        for (what, times) in [
            ("reconciled for its generation", &self.zoo_reconciled),
            ("at its done condition", &self.zoo_convergence),
        ] {
            if let Some(d) = Distribution::of(times) {
                out += &format!(
                    "zoo primary {what} after recovery ({} primary·quiet points): min {:.2?} median {:.2?} p90 {:.2?} max (worst) {:.2?}\n",
                    times.len(),
                    d.min,
                    d.median,
                    d.p90,
                    d.max
                );
            }
        }
        if !self.features.is_empty() {
            out += &format!("features: {:?}\n", self.features);
        }
        if let Some(a) = &self.audit {
            out += &format!("{a}\n");
        }
        out += &format!(
            "managed objects deleted, each explained by its owner's deletion: {}\n",
            self.explained_deletions
        );
        let lost = self.broken(Invariant::UnexplainedDeletion).len()
            + self.broken(Invariant::Bystander).len();
        out += &format!("lost or touched objects: {lost}\n");
        if let Some(worst) = self.kubelet_back.iter().max() {
            out += &format!(
                "simulated kubelet running new Pods again after recovery ({} quiet points): worst {worst:.2?}\n",
                self.kubelet_back.len()
            );
        }
        if !self.gc_blocked.is_empty() {
            out += &format!(
                "blocked by Kubernetes' garbage collector, not the operator (not violations): {}\n",
                self.gc_blocked.len()
            );
            for b in &self.gc_blocked {
                out += &format!("  {b}\n");
            }
        }
        if !self.components_restarted.is_empty() {
            out += &format!(
                "control-plane components found not running and started again (the cluster's fault, not violations): {}\n",
                self.components_restarted.len()
            );
            for c in &self.components_restarted {
                for line in c.lines() {
                    out += &format!("  {line}\n");
                }
            }
        }
        if !self.shard_terms_lost.is_empty() {
            out += &format!(
                "shards that exited on a lost Lease term and were started again (the host's design, not violations): {}\n",
                self.shard_terms_lost.len()
            );
            for s in &self.shard_terms_lost {
                out += &format!("  {s}\n");
            }
        }
        out += &format!("violations: {}\n", self.violations.len());
        for v in &self.violations {
            out += &format!("  {v}\n");
        }
        out += "faults:\n";
        for f in &self.fault_log {
            out += &format!("  {f}\n");
        }
        out
    }
}

/// Shared state of a running soak.
struct Shared {
    ledger: Mutex<Ledger>,
    deleted_owners: Mutex<HashSet<String>>,
    ops: Mutex<Ops>,
    last_op: Mutex<Instant>,
}

/// One `wasmop run --leader-elect` process.
struct Replica {
    child: tokio::process::Child,
    pid: u32,
    metrics_port: u16,
    /// Its stderr.
    log: PathBuf,
}

/// How a replica the soak did not kill ended.
struct Exit {
    slot: usize,
    status: std::process::ExitStatus,
    log: PathBuf,
}

impl Exit {
    /// The host's own exit on a lost shard Lease term: its exit code, and
    /// the line saying why at the end of its log.
    fn lost_shard_term(&self) -> bool {
        self.status.code() == Some(wasmop::lease::shard::LOST_TERM_EXIT_CODE)
            && std::fs::read_to_string(&self.log)
                .is_ok_and(|log| log.contains("shard Lease term ended"))
    }
}

/// The two replicas, restarted by the soak after each kill.
struct Replicas {
    bin: PathBuf,
    plugins: PathBuf,
    /// `127.0.0.1:PORT` of the registry the plugin comes from, if any.
    registry: Option<String>,
    work: PathBuf,
    namespace: String,
    /// More arguments of `wasmop run` (the zoo's namespace, its allowed
    /// URL).
    extra: Vec<String>,
    slots: Vec<Option<Replica>>,
    starts: usize,
    /// `--sharding`.
    sharding: bool,
    /// The kubeconfig the replicas use.
    kubeconfig: PathBuf,
    /// `--orphan-sweep-interval-secs`.
    sweep_secs: u64,
    /// The slots that should run a replica (the third, in the features
    /// mode, only while joined).
    wanted: Vec<bool>,
    /// More primaries whose placement on a running shard recovery waits
    /// for (the features mode's Stamps and Labellers).
    extra_primaries: Vec<Api<DynamicObject>>,
}

/// An error a fault explains: the API server unreachable, restarting,
/// overloaded or timing out. The soak retries its own calls on these.
pub fn transient(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => s.code >= 500 || s.code == 429,
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
}

/// Runs the soak's own API call `call` until it succeeds, retrying what
/// [`transient`] accepts for up to a minute (each retry counted).
async fn retrying<T, F, Fut>(what: &str, shared: &Shared, mut call: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match call().await {
            Ok(v) => return Ok(v),
            Err(e) if transient(&e) && Instant::now() < deadline => {
                shared.ops.lock().unwrap().retried += 1;
                // A retry's pace while the API server comes back, bounded.
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => return Err(anyhow::Error::new(e).context(what.to_owned())),
        }
    }
}

/// Deletes the load's primary `name` of UID `uid` (a UID precondition,
/// so a re-created one is not deleted), and counts it. The UID is recorded
/// among the deleted owners before the delete is sent (the checks may see
/// what it owned go before this call returns) and forgotten again when the
/// precondition failed.
async fn delete_owner(
    api: &Api<DynamicObject>,
    name: &str,
    uid: &str,
    shared: &Shared,
) -> Result<()> {
    shared.deleted_owners.lock().unwrap().insert(uid.to_owned());
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.to_owned()),
            resource_version: None,
        }),
        ..DeleteParams::background()
    };
    if let Err(e) = api.delete(name, &dp).await {
        if matches!(&e, kube::Error::Api(s) if s.code == 409) {
            shared.deleted_owners.lock().unwrap().remove(uid);
        }
        return Err(e.into());
    }
    shared.ops.lock().unwrap().deleted += 1;
    Ok(())
}

/// GET `path` from the replica's metrics server: status and body.
async fn http_get(port: u16, path: &str) -> Result<(u16, String)> {
    let io = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await?;
        anyhow::Ok(String::from_utf8_lossy(&buf).into_owned())
    };
    let text = tokio::time::timeout(Duration::from_secs(2), io)
        .await
        .context("metrics server did not answer in 2 s")??;
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("no HTTP status")?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((code, body))
}

impl Replicas {
    fn failpoint_file(&self, slot: usize) -> PathBuf {
        self.work.join(format!("failpoint-{slot}"))
    }

    /// Where the replica in `slot` moves its failpoint file when it takes
    /// the abort (`host/src/execute/failpoint.rs`).
    fn fired_file(&self, slot: usize) -> PathBuf {
        self.work.join(format!("failpoint-{slot}.fired"))
    }

    async fn start(&mut self, slot: usize) -> Result<()> {
        let port = free_port()?;
        let _ = std::fs::remove_file(self.failpoint_file(slot));
        let _ = std::fs::remove_file(self.fired_file(slot));
        self.starts += 1;
        let log_path = self
            .work
            .join(format!("replica-{slot}-start-{}.log", self.starts));
        let log = std::fs::File::create(&log_path)?;
        let mut cmd = tokio::process::Command::new(&self.bin);
        self.wanted[slot] = true;
        cmd.arg("run").arg("--plugins").arg(&self.plugins);
        if let Some(host) = &self.registry {
            cmd.arg("--plugins")
                .arg(format!("oci://{host}/{OCI_REFERENCE}"))
                .args(["--insecure-registry", host])
                .args(["--oci-poll-interval-ms", "500"])
                .arg("--oci-cache")
                .arg(self.work.join(format!("oci-cache-{slot}")));
        }
        let config = self.work.join("operator.yaml");
        if config.is_file() {
            cmd.arg("--config").arg(config);
        }
        let child = cmd
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--namespace")
            .arg(&self.namespace)
            .arg("--leader-elect")
            .arg("--leader-election-namespace")
            .arg(&self.namespace)
            .arg("--leader-election-id")
            .arg(LEASE)
            .arg("--metrics-addr")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--poll-interval-ms")
            .arg("500")
            .args([
                "--orphan-sweep-interval-secs".to_owned(),
                self.sweep_secs.to_string(),
            ])
            .args(self.sharding.then_some("--sharding"))
            .args(&self.extra)
            .env_remove("POD_NAME")
            .env_remove("POD_NAMESPACE")
            .env(
                "WASMOP_FAILPOINT",
                format!("@{}", self.failpoint_file(slot).display()),
            )
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", self.bin.display()))?;
        let pid = child.id().context("replica pid")?;
        self.slots[slot] = Some(Replica {
            child,
            pid,
            metrics_port: port,
            log: log_path,
        });
        Ok(())
    }

    /// SIGKILLs the replica in `slot` and waits until it is gone.
    async fn kill(&mut self, slot: usize) -> Result<()> {
        if let Some(mut r) = self.slots[slot].take() {
            r.child.start_kill()?;
            r.child.wait().await?;
        }
        Ok(())
    }

    /// SIGKILLs every replica.
    async fn kill_all(&mut self) -> Result<()> {
        for slot in 0..self.slots.len() {
            self.kill(slot).await?;
        }
        Ok(())
    }

    /// How the process in `slot` exited, if it did.
    fn exited_slot(&mut self, slot: usize) -> Option<String> {
        let r = self.slots[slot].as_mut()?;
        let status = r.child.try_wait().ok()??;
        self.slots[slot] = None;
        Some(status.to_string())
    }

    /// Whether the replica in `slot` took the abort of its failpoint: it
    /// moved the file to [`Self::fired_file`] (its process may not have
    /// exited yet).
    fn fired(&self, slot: usize) -> bool {
        self.slots[slot].is_some() && self.fired_file(slot).exists()
    }

    /// The replicas whose process exited by itself, with how.
    fn exited(&mut self) -> Vec<Exit> {
        let mut out = Vec::new();
        for (slot, s) in self.slots.iter_mut().enumerate() {
            if let Some(r) = s
                && let Ok(Some(status)) = r.child.try_wait()
            {
                out.push(Exit {
                    slot,
                    status,
                    log: r.log.clone(),
                });
                *s = None;
            }
        }
        out
    }

    fn slot_of_identity(&self, holder: &str) -> Option<usize> {
        let pid: u32 = holder.rsplit_once('-')?.1.parse().ok()?;
        self.slots
            .iter()
            .position(|s| s.as_ref().is_some_and(|r| r.pid == pid))
    }

    /// The slot of the replica holding an unexpired Lease.
    async fn leader(&self, client: &Client) -> Option<usize> {
        let lease = Api::<Lease>::namespaced(client.clone(), &self.namespace)
            .get_opt(LEASE)
            .await
            .ok()??;
        let spec = lease.spec?;
        let renewed = spec.renew_time?.0;
        let term = i64::from(spec.lease_duration_seconds?);
        let now = jiff::Timestamp::now();
        if now.as_second() - renewed.as_second() > term {
            return None;
        }
        self.slot_of_identity(spec.holder_identity.as_deref()?)
    }

    /// Without sharding, true. With it: every Widget and zoo primary is
    /// placed on a running replica's shard (labelled for it, not
    /// draining) — a killed shard's Lease has expired and the sharder has
    /// re-homed its primaries.
    async fn placed(&self, widgets: &Api<DynamicObject>, zoo: Option<&Zoo>) -> bool {
        if !self.sharding {
            return true;
        }
        let running = |shard: &str| self.slot_of_identity(shard).is_some();
        let Ok(list) = widgets.list(&ListParams::default()).await else {
            return false;
        };
        if !list.items.iter().all(|w| zoo::placed(w, &running)) {
            return false;
        }
        for api in &self.extra_primaries {
            let Ok(list) = api.list(&ListParams::default()).await else {
                return false;
            };
            if !list
                .items
                .iter()
                .filter(|o| o.metadata.deletion_timestamp.is_none())
                .all(|o| zoo::placed(o, &running))
            {
                return false;
            }
        }
        match zoo {
            Some(zoo) => zoo.unplaced(&running).await.is_empty(),
            None => true,
        }
    }

    /// Every replica runs, answers `/readyz`, and runs `version` of the
    /// plugin.
    async fn ready(&self, version: &str) -> bool {
        for (s, wanted) in self.slots.iter().zip(&self.wanted) {
            if !wanted {
                continue;
            }
            let Some(r) = s else { return false };
            if !matches!(http_get(r.metrics_port, "/readyz").await, Ok((200, _))) {
                return false;
            }
            let Ok((200, metrics)) = http_get(r.metrics_port, "/metrics").await else {
                return false;
            };
            let running = metrics.lines().any(|l| {
                l.starts_with("wasmop_plugin_info")
                    && l.contains("plugin=\"good\"")
                    && l.contains(&format!("version=\"{version}\""))
            });
            if !running {
                return false;
            }
        }
        true
    }
}

/// The plugin versions the hot swap alternates: file and version.
const VERSIONS: [(&str, &str); 2] = [("good", "0.1.0"), ("good-v2", "0.2.0")];

/// The fault injector: owns the replicas and the plugin file.
struct Injector {
    client: Client,
    rng: Rng,
    replicas: Replicas,
    kinds: Vec<FaultKind>,
    deck: Vec<FaultKind>,
    active_version: usize,
    gc_outage: Option<tokio::task::JoinHandle<Result<()>>>,
    /// What [`Injector::recovered`] found stopped and started again.
    components_restarted: Vec<String>,
    /// Shards that exited on a lost Lease term (see `Report`).
    shard_terms_lost: Vec<String>,
    registry: Option<Arc<tokio::sync::Mutex<Registry>>>,
    registry_outage: Option<tokio::task::JoinHandle<Result<()>>>,
    widgets: Api<DynamicObject>,
    zoo: Option<Arc<Zoo>>,
    shared: Arc<Shared>,
    started: Instant,
}

impl Injector {
    fn draw(&mut self) -> FaultKind {
        if self.deck.is_empty() {
            let mut deck = self.kinds.clone();
            for i in (1..deck.len()).rev() {
                let j = self.rng.below(i as u64 + 1) as usize;
                deck.swap(i, j);
            }
            self.deck = deck;
        }
        self.deck.pop().expect("a full deck")
    }

    fn version(&self) -> &'static str {
        VERSIONS[self.active_version].1
    }

    /// Injects one fault; returns its description.
    async fn inject(&mut self, kind: FaultKind, report: &mut Report) -> Result<String> {
        let detail = match kind {
            FaultKind::KillLeader | FaultKind::KillFollower => {
                let leader = self.replicas.leader(&self.client).await;
                // The follower: another running replica, by the seed.
                let others: Vec<usize> = (0..self.replicas.slots.len())
                    .filter(|s| Some(*s) != leader && self.replicas.slots[*s].is_some())
                    .collect();
                let slot = match (kind, leader) {
                    (FaultKind::KillLeader, Some(l)) => l,
                    (_, Some(_)) if others.len() == 1 => others[0],
                    (_, Some(_)) if others.len() > 1 => {
                        others[self.rng.below(others.len() as u64) as usize]
                    }
                    (_, Some(l)) => 1 - l.min(1),
                    (_, None) => self.rng.below(2) as usize,
                };
                self.replicas.kill(slot).await?;
                self.replicas.start(slot).await?;
                format!(
                    "SIGKILL replica {slot} ({}), restarted",
                    if leader == Some(slot) {
                        "leader"
                    } else if leader.is_some() {
                        "follower"
                    } else {
                        "no live leader"
                    }
                )
            }
            FaultKind::ApiServerRestart => {
                let down = self.rng.below(4);
                component(&["restart", "kube-apiserver", "--down", &down.to_string()]).await?;
                format!("kube-apiserver killed, down {down} s, started")
            }
            FaultKind::ApiServerFreeze => {
                let hold = Duration::from_millis(2000 + self.rng.below(6000));
                let frozen = Fault::freeze("kube-apiserver").await?;
                // The freeze itself: how long it lasts is the fault.
                tokio::time::sleep(hold).await;
                frozen.thaw().await?;
                format!("kube-apiserver frozen {hold:.1?}")
            }
            FaultKind::EtcdRestart => {
                let killed = Instant::now();
                Fault::kill("etcd").await?.start().await?;
                let ready = wait_readyz(&self.client, Duration::from_secs(60)).await?;
                format!(
                    "etcd killed and started; the API server ready {:.1?} after the kill",
                    ready - killed
                )
            }
            FaultKind::EtcdCompaction => {
                let rev = component(&["compact-etcd", "--bump", "3"]).await?;
                format!(
                    "etcd compacted at revision {}",
                    rev.lines().last().unwrap_or_default()
                )
            }
            FaultKind::GcStopped => {
                if self.gc_outage.as_ref().is_some_and(|t| !t.is_finished()) {
                    "kube-controller-manager already stopped".to_owned()
                } else {
                    let stopped = Fault::kill("kube-controller-manager").await?;
                    self.gc_outage = Some(tokio::spawn(async move {
                        // The outage itself: no garbage collection this long.
                        tokio::time::sleep(GC_OUTAGE).await;
                        stopped.start().await
                    }));
                    format!("kube-controller-manager stopped for {GC_OUTAGE:?}")
                }
            }
            FaultKind::HotSwap
                if self
                    .registry_outage
                    .as_ref()
                    .is_some_and(|t| !t.is_finished()) =>
            {
                "hot swap skipped: the registry is stopped".to_owned()
            }
            FaultKind::HotSwap => {
                let same = self.rng.below(3) == 0;
                if !same {
                    self.active_version = 1 - self.active_version;
                }
                let (file, version) = VERSIONS[self.active_version];
                let what = match &self.registry {
                    Some(registry) => {
                        push(&*registry.lock().await, &plugin_path(file)?).await?;
                        "tag pushed"
                    }
                    None => {
                        install(
                            &plugin_path(file)?,
                            &self.replicas.plugins.join("good.wasm"),
                        )?;
                        "plugin file rewritten"
                    }
                };
                if same {
                    format!("{what} with the same {file} {version}")
                } else {
                    format!("{what}: swapped to {file} {version}")
                }
            }
            FaultKind::RegistryStopped => match &self.registry {
                None => "no registry in this soak (plugin from a directory), skipped".to_owned(),
                Some(_)
                    if self
                        .registry_outage
                        .as_ref()
                        .is_some_and(|t| !t.is_finished()) =>
                {
                    "registry already stopped".to_owned()
                }
                Some(registry) => {
                    registry.lock().await.stop();
                    let registry = registry.clone();
                    self.registry_outage = Some(tokio::spawn(async move {
                        // The outage itself: no registry this long.
                        tokio::time::sleep(REGISTRY_OUTAGE).await;
                        registry.lock().await.restart().await
                    }));
                    format!("OCI registry stopped for {REGISTRY_OUTAGE:?}")
                }
            },
            FaultKind::ShardJoin => {
                let third = 2;
                if self.replicas.slots.len() <= third {
                    "no third slot in this soak, skipped".to_owned()
                } else if self.replicas.wanted[third] {
                    self.replicas.kill(third).await?;
                    self.replicas.wanted[third] = false;
                    format!(
                        "SIGKILL replica {third} (the third shard), left out: its primaries go back to the others once its shard Lease expires"
                    )
                } else {
                    self.replicas.start(third).await?;
                    format!("replica {third} started: a third shard joins")
                }
            }
            FaultKind::CrashBeforeWrite => {
                // Every write index of the plan, one crash each.
                let mut done = Vec::new();
                for index in 0..GOOD_WRITES {
                    done.push(self.crash_before_write(index, report).await?);
                }
                if self.zoo.is_some() {
                    // One later index, in a zoo plugin's longer plan.
                    let span = (ZOO_WRITE_MAX - ZOO_WRITE_MIN + 1) as u64;
                    let index = ZOO_WRITE_MIN + self.rng.below(span) as usize;
                    done.push(self.crash_before_write(index, report).await?);
                }
                done.join("; ")
            }
        };
        Ok(detail)
    }

    /// Waits until every fault is over and the operator recovered; returns
    /// that moment.
    async fn recovered(&mut self, violations: &mut Vec<Violation>) -> Result<Instant> {
        if let Some(t) = self.gc_outage.take() {
            t.await??;
        }
        if let Some(t) = self.registry_outage.take() {
            t.await??;
        }
        // The API server's clients among the control plane's components
        // run again, whatever a fault did to them.
        for c in ["kube-controller-manager", "kube-scheduler", "kwok"] {
            let found = component(&["ensure", c]).await?;
            if !found.is_empty() {
                let at = self.started.elapsed();
                eprintln!("chaos soak: [{at:.0?}] {found}");
                self.components_restarted
                    .push(format!("[{at:.0?}] {found}"));
            }
        }
        self.restart_exited(violations).await?;
        let version = self.version();
        let client = self.client.clone();
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            if readyz(&client).await
                && self.replicas.ready(version).await
                && self.replicas.leader(&client).await.is_some()
                && self
                    .replicas
                    .placed(&self.widgets, self.zoo.as_deref())
                    .await
            {
                return Ok(Instant::now());
            }
            if Instant::now() > deadline {
                bail!(
                    "not recovered 90 s after the last fault: API server ready {}, replicas ready on {version} {}, leader {:?}, Widgets placed on running shards {}",
                    readyz(&client).await,
                    self.replicas.ready(version).await,
                    self.replicas.leader(&client).await,
                    self.replicas
                        .placed(&self.widgets, self.zoo.as_deref())
                        .await
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Injector {
    /// Arms the leader's failpoint at write `index`, edits a Widget so a
    /// plan makes every write, waits for the leader to abort, disarms it
    /// and starts it again.
    async fn crash_before_write(&mut self, index: usize, report: &mut Report) -> Result<String> {
        // Armed on the leader: wait for one after an earlier fault (a
        // crashed leader's Lease must expire first). With sharding, on
        // every running shard: the plan that reaches the index is made by
        // whichever shard the primary is placed on.
        let mut leader = None;
        let deadline = Instant::now() + Duration::from_secs(40);
        while leader.is_none() && Instant::now() < deadline {
            leader = self.replicas.leader(&self.client).await;
            if leader.is_none() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        let Some(slot) = leader else {
            return Ok(format!(
                "crash before write {index}: no live leader within 40 s, skipped"
            ));
        };
        let armed: Vec<usize> = if self.replicas.sharding {
            (0..self.replicas.slots.len())
                .filter(|s| self.replicas.slots[*s].is_some())
                .collect()
        } else {
            vec![slot]
        };
        for slot in &armed {
            std::fs::write(
                self.replicas.failpoint_file(*slot),
                format!("abort-before-write:{index}"),
            )?;
        }
        // A plan with every write: a zoo primary created anew for the
        // later indices, else a new value for a Widget.
        if index >= ZOO_WRITE_MIN
            && let Some(zoo) = &self.zoo
        {
            let made = zoo.recreate_one(self.rng.next_u64(), &self.shared).await;
            return self.await_crash(&armed, index, made, report).await;
        }
        let names: Vec<String> = self
            .widgets
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|w| w.metadata.name)
            .filter(|n| n.starts_with('w'))
            .collect();
        if let Some(name) = names.get(self.rng.below(names.len() as u64) as usize) {
            let _ = self
                .widgets
                .patch(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"value": self.rng.token()}})),
                )
                .await;
        }
        self.await_crash(&armed, index, None, report).await
    }

    /// Waits for one of the replicas in `armed`, each armed at write
    /// `index`, to abort at its failpoint; disarms them and starts again
    /// each that aborted. `made` names the zoo primary made to reach the
    /// index.
    ///
    /// A replica counts as this fault's only by its own act: it moves its
    /// failpoint file aside when it takes the abort, and an abort is taken
    /// only while the file is there. A replica of `armed` that exits
    /// without it is left for [`Self::restart_exited`], a violation. One
    /// that took it but is not yet reaped (two shards can reach the index
    /// at once; an abort takes a moment to become an exit) is waited for,
    /// so no abort of the fault is taken for a crash later.
    async fn await_crash(
        &mut self,
        armed: &[usize],
        index: usize,
        made: Option<String>,
        report: &mut Report,
    ) -> Result<String> {
        let by = made
            .map(|m| format!(" ({m} created anew)"))
            .unwrap_or_default();
        let who = |slot: usize| {
            if armed.len() == 1 {
                format!("leader (replica {slot})")
            } else {
                format!("shard replica {slot}")
            }
        };
        let fired = |replicas: &Replicas| -> Vec<usize> {
            armed
                .iter()
                .copied()
                .filter(|s| replicas.fired(*s))
                .collect()
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while fired(&self.replicas).is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for slot in armed {
            let _ = std::fs::remove_file(self.replicas.failpoint_file(*slot));
        }
        // Disarmed: a replica that takes the abort from now on cannot
        // (its rename of the removed file fails), so these are all.
        let mut crashed = Vec::new();
        for slot in fired(&self.replicas) {
            let reaped = Instant::now() + Duration::from_secs(20);
            loop {
                if let Some(status) = self.replicas.exited_slot(slot) {
                    crashed.push((slot, status));
                    break;
                }
                if Instant::now() > reaped {
                    bail!(
                        "replica {slot} took its failpoint's abort but had not exited 20 s later"
                    );
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        if crashed.is_empty() {
            let who = armed.iter().map(|s| who(*s)).collect::<Vec<_>>().join(", ");
            return Ok(format!(
                "{who} armed at write {index}{by}: no plan reached it in 20 s"
            ));
        }
        let mut done = Vec::new();
        report.crashed_at_writes.insert(index);
        for (slot, status) in crashed {
            self.replicas.start(slot).await?;
            done.push(format!(
                "{} crashed before write {index} of a plan{by} ({status}), restarted",
                who(slot)
            ));
        }
        Ok(done.join("; "))
    }

    /// Starts again every replica that exited without the soak killing
    /// it; each is a violation, but for a shard's designed exit on a lost
    /// Lease term (listed in the report).
    async fn restart_exited(&mut self, violations: &mut Vec<Violation>) -> Result<()> {
        for exit in self.replicas.exited() {
            self.judge_exit(&exit, violations);
            self.replicas.start(exit.slot).await?;
        }
        Ok(())
    }

    /// A violation for `exit`, or a line in the report when it is a
    /// shard's exit on a lost Lease term.
    fn judge_exit(&mut self, exit: &Exit, violations: &mut Vec<Violation>) {
        let (slot, status) = (exit.slot, exit.status);
        if self.replicas.sharding && exit.lost_shard_term() {
            let at = self.started.elapsed();
            eprintln!(
                "chaos soak: [{at:.0?}] replica {slot} exited on a lost shard Lease term ({status}); started again"
            );
            self.shard_terms_lost.push(format!(
                "[{at:.0?}] replica {slot} ({status}, log {})",
                exit.log.display()
            ));
        } else {
            violations.push(Violation {
                invariant: Invariant::ReplicaExited,
                detail: format!(
                    "replica {slot} exited by itself ({status}, log {})",
                    exit.log.display()
                ),
            });
        }
    }
}

/// A FireboltEngine not done because its FireboltInstance is not ready,
/// while that instance waits for the garbage collector: blocked with it.
fn waits_on_blocked(
    primary: &str,
    state: &str,
    gc_blocked: &BTreeMap<String, Vec<String>>,
) -> Option<Vec<String>> {
    if !primary.starts_with("FireboltEngine/") || !state.contains("InstanceNotReady") {
        return None;
    }
    let (instance, why) = gc_blocked
        .iter()
        .find(|(k, _)| k.starts_with("FireboltInstance/"))?;
    Some(vec![format!(
        "waits for {instance}, itself blocked: {}",
        why.join("; ")
    )])
}

/// Gives every Widget a new value; returns how many.
async fn edit_all(api: &Api<DynamicObject>, rng: &mut Rng, shared: &Shared) -> Result<usize> {
    let lp = ListParams::default();
    let names: Vec<String> = retrying("listing the Widgets", shared, || api.list(&lp))
        .await?
        .items
        .into_iter()
        .filter_map(|w| w.metadata.name)
        .collect();
    for name in &names {
        let (patch, pp) = (
            Patch::Merge(json!({"spec": {"value": rng.token()}})),
            PatchParams::default(),
        );
        retrying(&format!("editing Widget {name}"), shared, || {
            api.patch(name, &pp, &patch)
        })
        .await?;
    }
    Ok(names.len())
}

/// `wasmop push FILE oci://<registry>/wasmop/good:live`, through the real
/// command line.
async fn push(registry: &Registry, file: &std::path::Path) -> Result<()> {
    use clap::Parser;
    let argv = [
        "wasmop".to_owned(),
        "push".to_owned(),
        file.display().to_string(),
        format!("oci://{}/{OCI_REFERENCE}", registry.host),
        "--insecure-registry".to_owned(),
        registry.host.clone(),
    ];
    let cli = wasmop::cli::Cli::try_parse_from(&argv)?;
    let code = tokio::task::spawn_blocking(move || wasmop::cli::execute(cli)).await??;
    if code != std::process::ExitCode::SUCCESS {
        bail!("wasmop push {} failed", file.display());
    }
    Ok(())
}

/// Lists the Jobs of `namespace` as the checks see them.
async fn list_jobs(client: &Client, namespace: &str) -> Result<Vec<Seen>> {
    let api: Api<Job> = Api::namespaced(client.clone(), namespace);
    Ok(api
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|j| Seen::of_meta("Job", &j.metadata, None))
        .collect())
}

/// The backup Jobs (by uid, with their names) holding the `backup`
/// plugin's slot in `namespace` now: a Job labelled `app=cluster-backup-job`
/// without a `Complete`, `Failed` or `FailureTarget` condition (being
/// deleted or not), and the Job of every Pod so labelled that may still run
/// (not `Succeeded` or `Failed`, and if being deleted, not more than a
/// minute past its deletion's due time: the plugin takes such a Pod for
/// lost), whether or not its Job still exists.
///
/// # Errors
/// When the API server cannot be reached.
pub async fn backup_slot_holders(
    client: &Client,
    namespace: &str,
) -> Result<BTreeMap<String, String>> {
    use k8s_openapi::api::core::v1::Pod;
    let lp = ListParams::default().labels("app=cluster-backup-job");
    let jobs = Api::<Job>::namespaced(client.clone(), namespace)
        .list(&lp)
        .await?
        .items;
    let pods = Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&lp)
        .await?
        .items;
    let mut holders = BTreeMap::new();
    for job in &jobs {
        let ended = job
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| {
                cs.iter().any(|c| {
                    matches!(c.type_.as_str(), "Complete" | "Failed" | "FailureTarget")
                        && c.status == "True"
                })
            });
        if !ended {
            holders.insert(
                job.metadata.uid.clone().unwrap_or_default(),
                format!("Job {}", job.name_any()),
            );
        }
    }
    let now = k8s_openapi::jiff::Timestamp::now();
    for pod in &pods {
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) {
            continue;
        }
        let lost = pod.metadata.deletion_timestamp.as_ref().is_some_and(|t| {
            t.0.checked_add(Duration::from_secs(60))
                .is_ok_and(|due| now > due)
        });
        let Some(owner) = pod
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true))
        else {
            continue;
        };
        if !lost {
            holders
                .entry(owner.uid.clone())
                .or_insert_with(|| format!("Job {} (its Pod {})", owner.name, pod.name_any()));
        }
    }
    Ok(holders)
}

/// Everything the checks look at: the ConfigMaps of `namespaces`, and the
/// Jobs of the first (the `backup` plugin's target namespace) when `jobs`.
async fn list_watched(client: &Client, namespaces: &[String], jobs: bool) -> Result<Vec<Seen>> {
    let mut out = list_configmaps(client, namespaces).await?;
    if jobs && let Some(ns) = namespaces.first() {
        out.extend(list_jobs(client, ns).await?);
    }
    Ok(out)
}

/// Lists the ConfigMaps of `namespaces` as the checks see them.
async fn list_configmaps(client: &Client, namespaces: &[String]) -> Result<Vec<Seen>> {
    let mut out = Vec::new();
    for ns in namespaces {
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
        out.extend(
            api.list(&ListParams::default())
                .await?
                .items
                .iter()
                .map(Seen::of),
        );
    }
    Ok(out)
}

/// The load: one operation on a random Widget.
async fn load_step(
    api: &Api<DynamicObject>,
    rng: &mut Rng,
    names: &[String],
    shared: &Shared,
) -> Result<()> {
    let name = &names[rng.below(names.len() as u64) as usize];
    let value = rng.token();
    let roll = rng.below(100);
    let create = |value: String| {
        let api = api.clone();
        let name = name.clone();
        async move {
            let w: DynamicObject = serde_json::from_value(json!({
                "apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
                "metadata": {"name": name}, "spec": {"value": value},
            }))?;
            api.create(&PostParams::default(), &w).await?;
            anyhow::Ok(())
        }
    };
    let result = match api.get_opt(name).await? {
        None => create(value)
            .await
            .map(|()| shared.ops.lock().unwrap().created += 1),
        // A kept Widget `k<i>` (features mode) is edited, never deleted.
        Some(_) if roll < 55 || name.starts_with('k') => api
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"value": value}})),
            )
            .await
            .map(|_| shared.ops.lock().unwrap().edited += 1)
            .map_err(Into::into),
        Some(w) => {
            let uid = w.metadata.uid.clone().unwrap_or_default();
            match delete_owner(api, name, &uid, shared).await {
                Err(e) => Err(e),
                Ok(()) if roll < 80 => Ok(()),
                Ok(()) => create(value)
                    .await
                    .map(|()| shared.ops.lock().unwrap().recreated += 1),
            }
        }
    };
    *shared.last_op.lock().unwrap() = Instant::now();
    result
}

/// Runs one soak and returns what it saw; the caller asserts on the
/// report. Errors are for a soak that could not run (the cluster or the
/// replicas would not come up, a fault could not be injected or undone).
///
/// # Errors
/// When the soak cannot be set up or a fault cannot be injected or undone.
pub async fn soak(config: SoakConfig) -> Result<Report> {
    let begun = Instant::now();
    eprintln!(
        "chaos soak: seed {} (replay with WASMOP_CHAOS_SEED={}), {:?} of faults every ~{:?}",
        config.seed, config.seed, config.duration, config.fault_every
    );
    if !config
        .faults
        .iter()
        .any(|k| config.oci || *k != FaultKind::RegistryStopped)
    {
        bail!("no fault to draw: {:?} without a registry", config.faults);
    }
    if config.features && (!config.sharding || config.oci) {
        bail!("the features mode needs sharding and the plugins from a directory (oci: false)");
    }
    let mut rng = Rng::new(config.seed);
    let ns = TestNamespace::new("chaos").await?;
    let elsewhere = TestNamespace::new("chaos-elsewhere").await?;
    apply_test_crds(&ns.client).await?;
    let client = ns.client.clone();
    let watched = vec![ns.name.clone(), elsewhere.name.clone()];
    let shared = Arc::new(Shared {
        ledger: Mutex::new(Ledger::default()),
        deleted_owners: Mutex::new(HashSet::new()),
        ops: Mutex::new(Ops::default()),
        last_op: Mutex::new(Instant::now()),
    });

    // Bystanders, before any replica runs.
    let kept = if config.features { features::KEPT } else { 0 };
    let widget_names: Vec<String> = (0..config.widgets)
        .map(|i| format!("w{i}"))
        .chain((0..config.blocked).map(|i| format!("b{i}")))
        .chain((0..kept).map(|i| format!("k{i}")))
        .collect();
    let blocked: HashSet<String> = (0..config.blocked).map(|i| format!("b{i}")).collect();
    let mut bystander_names: Vec<(String, String)> = blocked
        .iter()
        .map(|b| (ns.name.clone(), format!("{b}-cm")))
        .collect();
    bystander_names.extend((0..3).map(|i| (ns.name.clone(), format!("unrelated-{i}"))));
    bystander_names
        .extend((0..config.widgets.min(3)).map(|i| (elsewhere.name.clone(), format!("w{i}-cm"))));
    for (n, name) in &bystander_names {
        let cm: ConfigMap = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "labels": {"test.wasmop.dev/bystander": "true"}},
            "data": {"value": "a user's"},
        }))?;
        let made = Api::<ConfigMap>::namespaced(client.clone(), n)
            .create(&PostParams::default(), &cm)
            .await?;
        shared.ledger.lock().unwrap().bystander(&Seen::of(&made));
    }

    // The replicas.
    let work = TempDir::new(&format!("chaos-{}", config.seed));
    let plugins = work.0.join("plugins");
    std::fs::create_dir_all(&plugins)?;
    if !config.oci {
        install(&plugin_path("good")?, &plugins.join("good.wasm"))?;
    }
    let backup_api = if config.backup {
        setup_backup(&ns, &work.0, &plugins).await?;
        Some((
            etcd_backups(&client),
            ListParams::default().labels(&format!("{CHAOS_LABEL}={}", ns.name)),
        ))
    } else {
        None
    };
    let zoo = if config.zoo {
        if !config.backup {
            bail!("the zoo needs the backup plugin's setup (SoakConfig::backup)");
        }
        crate::apply_project_crds(&client).await?;
        for plugin in ["instance", "engine", "fleet", "team"] {
            install(
                &plugin_path(plugin)?,
                &plugins.join(format!("{plugin}.wasm")),
            )?;
        }
        // The fleet's members are kwok Pods with no /state to observe.
        let config_file = work.0.join("operator.yaml");
        let mut text = std::fs::read_to_string(&config_file)?;
        text += "  fleet:\n    settings: {observeApplications: false}\n";
        std::fs::write(&config_file, text)?;
        let zoo = Zoo::setup(&client, &ns.name).await?;
        eprintln!(
            "chaos soak: the zoo, in namespace {}: {}",
            zoo.namespace.name,
            zoo.primaries().join(", ")
        );
        Some(Arc::new(zoo))
    } else {
        None
    };
    let features = if config.features {
        Some(Arc::new(Features::setup(&ns, &work.0, &plugins).await?))
    } else {
        None
    };
    let registry = if config.oci {
        let registry = Registry::start().await?;
        push(&registry, &plugin_path("good")?).await?;
        Some(registry)
    } else {
        None
    };
    eprintln!(
        "chaos soak: the plugin comes from {}",
        match &registry {
            Some(r) => format!("oci://{}/{OCI_REFERENCE}", r.host),
            None => format!("the directory {}", plugins.display()),
        }
    );
    let mut injector = Injector {
        client: client.clone(),
        rng: Rng::new(rng.next_u64()),
        replicas: Replicas {
            bin: config.wasmop_bin.clone(),
            plugins,
            registry: registry.as_ref().map(|r| r.host.clone()),
            work: work.0.clone(),
            namespace: ns.name.clone(),
            extra: zoo
                .as_ref()
                .map_or_else(Vec::new, |z| {
                    vec![
                        "--namespace".to_owned(),
                        z.namespace.name.clone(),
                        "--allow-url".to_owned(),
                        z.standin.url().to_owned(),
                    ]
                })
                .into_iter()
                .chain(features.iter().flat_map(|f| f.args()))
                .collect(),
            slots: (0..if features.is_some() { 3 } else { 2 })
                .map(|_| None)
                .collect(),
            starts: 0,
            sharding: config.sharding,
            kubeconfig: features
                .as_ref()
                .map_or_else(kubeconfig_path, |f| f.account.kubeconfig.clone()),
            // What the garbage collector misses while it is stopped and
            // restarted is the host's to collect: often enough to be seen
            // within the soak; in the features mode every few seconds.
            sweep_secs: if features.is_some() {
                features::SWEEP_SECS
            } else {
                15
            },
            wanted: vec![false; if features.is_some() { 3 } else { 2 }],
            extra_primaries: features
                .iter()
                .flat_map(|f| [f.stamps.clone(), f.labellers.clone()])
                .collect(),
        },
        kinds: config
            .faults
            .iter()
            .copied()
            .filter(|k| config.oci || *k != FaultKind::RegistryStopped)
            .collect(),
        deck: Vec::new(),
        active_version: 0,
        gc_outage: None,
        components_restarted: Vec::new(),
        shard_terms_lost: Vec::new(),
        registry: registry.map(|r| Arc::new(tokio::sync::Mutex::new(r))),
        registry_outage: None,
        widgets: widgets(&ns),
        zoo: zoo.clone(),
        shared: shared.clone(),
        started: begun,
    };
    injector.replicas.start(0).await?;
    injector.replicas.start(1).await?;
    if config.sharding {
        eprintln!("chaos soak: the replicas run with --sharding");
    }
    eprintln!(
        "chaos soak: namespace {}, replica logs in {} (kept with WASMOP_KEEP_NAMESPACES)",
        ns.name,
        work.0.display()
    );
    let mut early = Vec::new();
    injector
        .recovered(&mut early)
        .await
        .context("the replicas never led")?;
    if let Some(zoo) = &zoo {
        zoo.create_missing(&shared, Duration::from_secs(60)).await?;
    }

    // The checks, every 300 ms.
    let stop = Arc::new(AtomicBool::new(false));
    let observer = {
        let (client, shared, stop, watched) = (
            client.clone(),
            shared.clone(),
            stop.clone(),
            watched.clone(),
        );
        let jobs = backup_api.is_some();
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                if jobs
                    && let Some(target) = watched.first()
                    && let Ok(holders) = backup_slot_holders(&client, target).await
                    && holders.len() > 1
                {
                    let names: Vec<String> = holders.into_values().collect();
                    let detail = format!(
                        "{} backups held the single backup slot at once: {}",
                        names.len(),
                        names.join(", ")
                    );
                    let mut ledger = shared.ledger.lock().unwrap();
                    ledger.report(
                        format!("serial {names:?}"),
                        Invariant::SerialBackups,
                        detail.clone(),
                    );
                    drop(ledger);
                    eprintln!("chaos soak: VIOLATION SerialBackups: {detail}");
                }
                if let Ok(seen) = list_watched(&client, &watched, jobs).await {
                    let deleted = shared.deleted_owners.lock().unwrap().clone();
                    let found = shared
                        .ledger
                        .lock()
                        .unwrap()
                        .observe(&watched, &seen, &deleted);
                    for v in found {
                        eprintln!("chaos soak: VIOLATION {v}");
                    }
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    };
    // Features mode: every version of every Stamp checked for its UID.
    let stamp_watch = features
        .as_ref()
        .map(|f| f.watch_stamps(shared.clone(), stop.clone()));

    let mut report = Report {
        seed: config.seed,
        faults: BTreeMap::new(),
        fault_log: Vec::new(),
        crashed_at_writes: BTreeSet::new(),
        ops: Ops::default(),
        convergence: Vec::new(),
        zoo_convergence: Vec::new(),
        zoo_reconciled: Vec::new(),
        zoo: zoo.as_ref().map(|z| z.primaries()).unwrap_or_default(),
        gc_blocked: Vec::new(),
        components_restarted: Vec::new(),
        shard_terms_lost: Vec::new(),
        kubelet_back: Vec::new(),
        features: BTreeMap::new(),
        audit: None,
        quiet_points: 0,
        recoveries: Vec::new(),
        explained_deletions: 0,
        violations: early,
        took: Duration::ZERO,
    };
    let api = widgets(&ns);
    let mut spent = Duration::ZERO;
    let mut breached = false;
    let soak_result: Result<()> = async {
        let windows = config
            .duration
            .as_millis()
            .div_ceil(config.quiet_every.as_millis().max(1))
            .max(1);
        let window = config.duration / u32::try_from(windows).unwrap_or(u32::MAX);
        for _ in 0..windows {
            let window_start = Instant::now();
            // Load, in a task of its own, until the window ends.
            let load_stop = Arc::new(AtomicBool::new(false));
            let load = {
                let (api, shared, load_stop, names) = (
                    api.clone(),
                    shared.clone(),
                    load_stop.clone(),
                    widget_names.clone(),
                );
                let mut rng = Rng::new(rng.next_u64());
                tokio::spawn(async move {
                    while !load_stop.load(Ordering::SeqCst) {
                        if load_step(&api, &mut rng, &names, &shared).await.is_err() {
                            shared.ops.lock().unwrap().failed += 1;
                        }
                        // The load's pace, not a synchronisation.
                        tokio::time::sleep(Duration::from_millis(100 + rng.below(200))).await;
                    }
                })
            };
            let backup_load = backup_api.as_ref().map(|(api, _)| {
                let (api, shared, load_stop, label) = (
                    api.clone(),
                    shared.clone(),
                    load_stop.clone(),
                    ns.name.clone(),
                );
                let names: Vec<String> = (0..4).map(|i| format!("{}-e{i}", ns.name)).collect();
                let mut rng = Rng::new(rng.next_u64());
                tokio::spawn(async move {
                    while !load_stop.load(Ordering::SeqCst) {
                        if backup_step(&api, &mut rng, &names, &label, &shared)
                            .await
                            .is_err()
                        {
                            shared.ops.lock().unwrap().failed += 1;
                        }
                        *shared.last_op.lock().unwrap() = Instant::now();
                        // The load's pace, not a synchronisation.
                        tokio::time::sleep(Duration::from_millis(500 + rng.below(1000))).await;
                    }
                })
            });
            let zoo_load = zoo.as_ref().map(|zoo| {
                let (zoo, shared, load_stop) = (zoo.clone(), shared.clone(), load_stop.clone());
                let mut rng = Rng::new(rng.next_u64());
                tokio::spawn(async move {
                    while !load_stop.load(Ordering::SeqCst) {
                        if zoo
                            .step(rng.next_u64(), rng.next_u64(), &shared)
                            .await
                            .is_err()
                        {
                            shared.ops.lock().unwrap().failed += 1;
                        }
                        *shared.last_op.lock().unwrap() = Instant::now();
                        // The load's pace, not a synchronisation.
                        tokio::time::sleep(Duration::from_millis(1000 + rng.below(2000))).await;
                    }
                })
            });
            // Features mode: Stamps re-created mid-call, Labellers
            // churned, and the window's rollout.
            let features_load = features.as_ref().map(|f| {
                let (f, shared, load_stop) = (f.clone(), shared.clone(), load_stop.clone());
                let mut rng = Rng::new(rng.next_u64());
                tokio::spawn(async move {
                    while !load_stop.load(Ordering::SeqCst) {
                        if f.stamp_step(&mut rng, &shared).await.is_err() {
                            shared.ops.lock().unwrap().failed += 1;
                        }
                        if rng.below(3) == 0 && f.labeller_step(&mut rng, &shared).await.is_err() {
                            shared.ops.lock().unwrap().failed += 1;
                        }
                        *shared.last_op.lock().unwrap() = Instant::now();
                        // The load's pace, not a synchronisation.
                        tokio::time::sleep(Duration::from_millis(200 + rng.below(400))).await;
                    }
                })
            });
            let rollout_run = features.as_ref().map(|f| {
                let rollback_after = Duration::from_millis(1000 + rng.below(8000));
                f.run_rollout(rollback_after, shared.clone(), load_stop.clone())
            });
            // Faults until the window ends.
            let mut next = window_start + injector.rng.jitter(config.fault_every) / 2;
            while next < window_start + window {
                tokio::time::sleep_until(next.into()).await;
                injector.restart_exited(&mut report.violations).await?;
                let kind = injector.draw();
                let at = injector.started.elapsed();
                let detail = injector.inject(kind, &mut report).await?;
                eprintln!("chaos soak: [{at:.1?}] {kind:?}: {detail}");
                report
                    .fault_log
                    .push(format!("[{at:.1?}] {kind:?}: {detail}"));
                *report.faults.entry(kind).or_default() += 1;
                next = Instant::now() + injector.rng.jitter(config.fault_every);
            }
            // The rest of the window: load without a new fault.
            tokio::time::sleep_until((window_start + window).into()).await;
            spent += window_start.elapsed();
            // The quiet point: load stopped, faults over, operator led.
            load_stop.store(true, Ordering::SeqCst);
            load.await?;
            if let Some(l) = backup_load {
                l.await?;
            }
            if let Some(l) = zoo_load {
                l.await?;
            }
            if let Some(l) = features_load {
                l.await?;
            }
            let rollout_run = match rollout_run {
                Some(r) => Some(r.await?),
                None => None,
            };
            let fault_over = Instant::now();
            let recovered = if config.breach == Breach::Every && !breached {
                breached = true;
                // Both replicas stopped: nothing converges from here, and
                // nothing repairs the breaches.
                injector.replicas.kill(0).await?;
                injector.replicas.kill(1).await?;
                breach(&client, &ns, &shared, &bystander_names).await?;
                Instant::now()
            } else {
                injector.recovered(&mut report.violations).await?
            };
            report.recoveries.push(recovered - fault_over);
            if let (Some(f), Some(run)) = (&features, &rollout_run) {
                let found = f
                    .finish_rollout(run, report.quiet_points + 1, &shared)
                    .await?;
                report.violations.extend(found);
            }
            let since = recovered.max(*shared.last_op.lock().unwrap());
            // Every Widget edited once more after recovery, so each
            // convergence timed includes a reconcile made after it.
            if !(config.breach == Breach::Every && report.quiet_points == 0) {
                let edited = edit_all(&api, &mut rng, &shared).await?;
                shared.ops.lock().unwrap().edited += edited;
            }
            report.quiet_points += 1;
            let deadline = if config.breach == Breach::Every {
                Duration::from_secs(8)
            } else {
                Duration::from_secs(60)
            };
            let times = measure(
                &client,
                &ns,
                &blocked,
                backup_api.as_ref(),
                since,
                deadline,
            )
            .await?;
            for (name, took, state) in times {
                match took {
                    Some(t) => {
                        report.convergence.push(t);
                        if t > CONVERGE_BOUND {
                            report.violations.push(Violation {
                                invariant: Invariant::Convergence,
                                detail: format!(
                                    "quiet point {}: Widget {name} converged {t:.2?} after recovery, over {CONVERGE_BOUND:?}",
                                    report.quiet_points
                                ),
                            });
                        }
                    }
                    None => report.violations.push(Violation {
                        invariant: Invariant::Convergence,
                        detail: format!(
                            "quiet point {}: Widget {name} did not converge within {deadline:?} of recovery: {state}",
                            report.quiet_points
                        ),
                    }),
                }
            }
            if let Some(f) = &features
                && config.breach == Breach::None
            {
                // Every Widget back on the current version, then every
                // Stamp and Labeller edited and converged.
                let at = report.quiet_points;
                let found = f.versions_back(&client, &api, at, &shared).await?;
                report.violations.extend(found);
                let since = Instant::now();
                for (name, took, state) in f
                    .measure(&mut rng, &shared, since, Duration::from_secs(60))
                    .await?
                {
                    match took {
                        Some(t) => {
                            report.convergence.push(t);
                            if t > CONVERGE_BOUND {
                                report.violations.push(Violation {
                                    invariant: Invariant::Convergence,
                                    detail: format!(
                                        "quiet point {at}: {name} converged {t:.2?} after its edit, over {CONVERGE_BOUND:?}"
                                    ),
                                });
                            }
                        }
                        None => report.violations.push(Violation {
                            invariant: Invariant::Convergence,
                            detail: format!(
                                "quiet point {at}: {name} did not converge within 60 s of its edit: {state}"
                            ),
                        }),
                    }
                }
            }
            if let Some(zoo) = &zoo
                && config.breach == Breach::None
            {
                // Every zoo primary there again and edited once more, then
                // each reconciled for its generation within the bound and
                // at its done condition within the zoo's.
                // The zoo's Pods are run by kwok, which may itself miss
                // events after an API server restart (its Pod watch was
                // seen dead for a minute): its done conditions are timed
                // from when kwok runs a new Pod again.
                let kubelet = zoo.kubelet_runs_pods(&client, &shared, KUBELET_BOUND).await?;
                report
                    .kubelet_back
                    .push(kubelet.saturating_duration_since(recovered));
                let created = zoo.create_missing(&shared, Duration::from_secs(60)).await?;
                zoo.edit_all(rng.next_u64(), &shared).await?;
                let since = Instant::now().max(recovered);
                let times = zoo.measure(since, ZOO_BOUND).await;
                if times.iter().any(|t| t.done.is_none()) {
                    // For whoever reads the violation: the zoo as it was.
                    let path = work.0.join(format!("zoo-quiet-point-{}.json", report.quiet_points));
                    zoo.dump(&client, &ns.name, &path).await;
                }
                // Read once, and only when a primary is not done.
                let gc_blocked = if times.iter().any(|t| t.done.is_none()) {
                    zoo.gc_blocked(&client).await
                } else {
                    Default::default()
                };
                for t in times {
                    let at = report.quiet_points;
                    let (name, state) = (&t.primary, &t.state);
                    match t.reconciled {
                        Some(r) if r <= CONVERGE_BOUND => report.zoo_reconciled.push(r),
                        Some(r) => {
                            report.zoo_reconciled.push(r);
                            report.violations.push(Violation {
                                invariant: Invariant::Convergence,
                                detail: format!(
                                    "quiet point {at}: zoo primary {name} reconciled {r:.2?} after recovery, over {CONVERGE_BOUND:?} ({created} re-created first)"
                                ),
                            });
                        }
                        None => report.violations.push(Violation {
                            invariant: Invariant::Convergence,
                            detail: format!(
                                "quiet point {at}: zoo primary {name} not reconciled for its generation within {ZOO_BOUND:?} ({created} re-created first): {state}"
                            ),
                        }),
                    }
                    let blocked_by_gc = if t.done.is_none() && t.reconciled.is_some() {
                        gc_blocked
                            .get(name.as_str())
                            .cloned()
                            .or_else(|| waits_on_blocked(name, state, &gc_blocked))
                    } else {
                        None
                    };
                    match t.done {
                        Some(d) => report.zoo_convergence.push(d),
                        None if let Some(pods) = blocked_by_gc => report.gc_blocked.push(format!(
                            "quiet point {at}: zoo primary {name} not done within {ZOO_BOUND:?}: {}; {state}",
                            pods.join("; ")
                        )),
                        None if t.reconciled.is_some() => report.violations.push(Violation {
                            invariant: Invariant::Convergence,
                            detail: format!(
                                "quiet point {at}: zoo primary {name} not done within {ZOO_BOUND:?} of recovery ({created} re-created first): {state}"
                            ),
                        }),
                        None => {}
                    }
                }
            }
            eprintln!(
                "chaos soak: quiet point {} after {spent:.0?} of faults: recovered {:.2?} after the last fault",
                report.quiet_points,
                recovered - fault_over
            );
            let down: Vec<usize> = (0..injector.replicas.slots.len())
                .filter(|s| injector.replicas.wanted[*s] && injector.replicas.slots[*s].is_none())
                .collect();
            if !down.is_empty() {
                for slot in down {
                    injector.replicas.start(slot).await?;
                }
                injector.recovered(&mut report.violations).await?;
            }
        }
        // The end: the zoo deleted while the replicas run, and everything
        // its plugins wrote for it gone after it.
        if let Some(zoo) = &zoo {
            let left = zoo
                .delete_all(&client, &ns.name, &shared, Duration::from_secs(120))
                .await?;
            if !left.is_empty() {
                report.violations.push(Violation {
                    invariant: Invariant::Convergence,
                    detail: format!(
                        "the zoo deleted, 120 s later still there: {left:?}"
                    ),
                });
            }
        }
        // The features mode's Stamps and Labellers, likewise.
        if let Some(f) = &features {
            let found = f.delete_all(&shared).await?;
            report.violations.extend(found);
        }
        // The soak's EtcdBackups deleted while the replicas run (their
        // finalizer's cleanup), then whatever the garbage collector owes
        // is collected.
        if let Some((api, lp)) = &backup_api {
            for eb in api.list(lp).await?.items {
                if let Some(uid) = eb.metadata.uid.clone() {
                    shared.deleted_owners.lock().unwrap().insert(uid);
                }
                let _ = api.delete(&eb.name_any(), &DeleteParams::background()).await;
            }
            let gone = wait_for("the soak's EtcdBackups to be gone", Duration::from_secs(60), || async {
                let left: Vec<String> = api.list(lp).await?.items.iter().map(|e| e.name_any()).collect();
                if left.is_empty() { Ok(Some(())) } else { bail!("left: {left:?}") }
            })
            .await;
            if let Err(e) = gone {
                report.violations.push(Violation {
                    invariant: Invariant::Convergence,
                    detail: format!("{e:#}"),
                });
            }
        }
        let owed = wait_for(
            "every managed object's owner to be alive",
            Duration::from_secs(60),
            || {
                let (client, ns) = (client.clone(), ns.name.clone());
                let api = api.clone();
                let backups = backup_api.clone();
                async move {
                    let mut live: HashSet<String> = api
                        .list(&ListParams::default())
                        .await?
                        .items
                        .into_iter()
                        .filter_map(|w| w.metadata.uid)
                        .collect();
                    if let Some((api, lp)) = &backups {
                        live.extend(api.list(lp).await?.items.into_iter().filter_map(|e| e.metadata.uid));
                    }
                    let orphans: Vec<String> = list_watched(&client, &[ns], backups.is_some())
                        .await?
                        .into_iter()
                        .filter(|s| {
                            s.managed && s.controller.as_ref().is_none_or(|o| !live.contains(o))
                        })
                        .map(|s| s.key())
                        .collect();
                    if orphans.is_empty() {
                        Ok(Some(()))
                    } else {
                        bail!("orphans left: {orphans:?}")
                    }
                }
            },
        )
        .await;
        if let Err(e) = owed {
            report.violations.push(Violation {
                invariant: Invariant::Convergence,
                detail: format!("{e:#}"),
            });
        }
        Ok(())
    }
    .await;
    stop.store(true, Ordering::SeqCst);
    observer.await?;
    if let Some(w) = stamp_watch {
        w.await?;
    }
    if let Err(e) = soak_result {
        // The soak could not go on: what it leaves is put right as far as
        // it can be, and this error, not a later one, is what it returns.
        let _ = injector.replicas.kill_all().await;
        if let Some(zoo) = &zoo {
            zoo.forget_cluster_scoped().await;
        }
        if let Some(f) = &features {
            f.forget().await;
        }
        if let Some(t) = injector.gc_outage.take() {
            let _ = t.await;
        }
        if let Some(t) = injector.registry_outage.take() {
            let _ = t.await;
        }
        eprintln!("chaos soak: replica logs: {} (kept)", keep(work).display());
        return Err(e.context(format!(
            "the soak stopped after {:.0?} (faults so far: {:?})",
            begun.elapsed(),
            report.fault_log
        )));
    }
    // One last complete look.
    let (lp, cms) = (
        ListParams::default(),
        Api::<ConfigMap>::namespaced(client.clone(), &ns.name),
    );
    retrying("the API server after the soak", &shared, || cms.list(&lp)).await?;
    let seen = list_watched(&client, &watched, backup_api.is_some()).await?;
    let deleted = shared.deleted_owners.lock().unwrap().clone();
    let mut ledger = std::mem::take(&mut *shared.ledger.lock().unwrap());
    ledger.observe(&watched, &seen, &deleted);
    for exit in injector.replicas.exited() {
        injector.judge_exit(&exit, &mut report.violations);
    }
    injector.replicas.kill_all().await?;
    if let Some(zoo) = &zoo {
        zoo.forget_cluster_scoped().await;
    }
    if let Some(f) = &features {
        f.forget().await;
        // Every replica is gone: the audit log holds all their writes.
        let (found, line) = f.one_writer()?;
        report.violations.extend(found);
        report.audit = Some(line);
        report.features = f
            .counts
            .lock()
            .unwrap()
            .iter()
            .map(|(k, v)| ((*k).to_owned(), *v))
            .collect();
    }
    if let Some((api, lp)) = &backup_api {
        // Cluster-scoped: nothing deletes them with the namespace. With
        // the replicas gone, their finalizer goes too.
        for eb in api.list(lp).await?.items {
            let name = eb.name_any();
            let _ = api
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"finalizers": null}})),
                )
                .await;
            let _ = api.delete(&name, &DeleteParams::background()).await;
        }
    }
    if let Some(t) = injector.gc_outage.take() {
        t.await??;
    }
    if let Some(t) = injector.registry_outage.take() {
        t.await??;
    }
    report.violations.extend(ledger.violations);
    report.explained_deletions = ledger.explained_deletions;
    report.ops = shared.ops.lock().unwrap().clone();
    report.took = begun.elapsed();
    report.components_restarted = std::mem::take(&mut injector.components_restarted);
    report.shard_terms_lost = std::mem::take(&mut injector.shard_terms_lost);
    // Kept when they explain a failure; a soak that breaks the invariants
    // on purpose needs none.
    if !report.violations.is_empty() && config.breach == Breach::None {
        let kept = keep(work);
        // The report beside the logs, for a run whose output is cut.
        let _ = std::fs::write(kept.join("report.txt"), report.summary());
        eprintln!(
            "chaos soak: replica logs and report: {} (kept)",
            kept.display()
        );
    }
    Ok(report)
}

/// The `backup` plugin in the replicas' plugin directory, its settings
/// (target namespace: the soak's), its CRDs, and the PVC its backups name.
async fn setup_backup(
    ns: &TestNamespace,
    work: &std::path::Path,
    plugins: &std::path::Path,
) -> Result<()> {
    let crds = crate::repo_root().join("crds");
    crate::apply_crd_files(
        &ns.client,
        &[
            crds.join("operator.openshift.io_etcdbackups.yaml"),
            crds.join("config.openshift.io_backups.yaml"),
        ],
    )
    .await?;
    install(&plugin_path("backup")?, &plugins.join("backup.wasm"))?;
    std::fs::write(
        work.join("operator.yaml"),
        format!(
            "plugins:\n  backup:\n    settings:\n      targetNamespace: {}\n      image: registry.invalid/etcd-backup-tools:chaos\n      nodeSelector: {{type: kwok}}\n",
            ns.name
        ),
    )?;
    let pvc: k8s_openapi::api::core::v1::PersistentVolumeClaim = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": BACKUP_PVC},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }))?;
    ns.api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>()
        .create(&PostParams::default(), &pvc)
        .await?;
    Ok(())
}

/// Keeps a work directory past the soak (its logs explain a failure).
fn keep(dir: TempDir) -> PathBuf {
    let path = dir.0.clone();
    std::mem::forget(dir);
    path
}

/// Each Widget's convergence time from `since` (None: not within
/// `deadline`), with its last state.
async fn measure(
    client: &Client,
    ns: &TestNamespace,
    blocked: &HashSet<String>,
    backups: Option<&(Api<DynamicObject>, ListParams)>,
    since: Instant,
    deadline: Duration,
) -> Result<Vec<(String, Option<Duration>, String)>> {
    let api = widgets(ns);
    let mut done: BTreeMap<String, Duration> = BTreeMap::new();
    let mut behind: BTreeMap<String, String> = BTreeMap::new();
    loop {
        let listed = async {
            let ws = api.list(&ListParams::default()).await?.items;
            let cms = list_configmaps(client, std::slice::from_ref(&ns.name)).await?;
            let ebs = match backups {
                Some((api, lp)) => api.list(lp).await?.items,
                None => Vec::new(),
            };
            anyhow::Ok((ws, cms, ebs))
        }
        .await;
        let at = since.elapsed();
        if let Ok((ws, cms, ebs)) = listed {
            let by_name: HashMap<&str, &Seen> = cms.iter().map(|c| (c.name.as_str(), c)).collect();
            behind.clear();
            for eb in ebs {
                let name = format!(
                    "EtcdBackup/{}",
                    eb.metadata.name.clone().unwrap_or_default()
                );
                if done.contains_key(&name) || eb.metadata.deletion_timestamp.is_some() {
                    continue;
                }
                match reconciled_for_generation(&serde_json::to_value(&eb)?) {
                    Ok(()) => {
                        done.insert(name, at);
                    }
                    Err(why) => {
                        behind.insert(name, why);
                    }
                }
            }
            for w in ws {
                let name = w.metadata.name.clone().unwrap_or_default();
                if done.contains_key(&name) {
                    continue;
                }
                let value = serde_json::to_value(&w)?;
                let cm = by_name.get(format!("{name}-cm").as_str()).copied();
                match verdict(&value, cm, blocked.contains(&name)) {
                    Verdict::Converged | Verdict::Blocked => {
                        done.insert(name, at);
                    }
                    Verdict::Behind(why) => {
                        behind.insert(name, why);
                    }
                }
            }
            if behind.is_empty() {
                break;
            }
        }
        if at > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut out: Vec<(String, Option<Duration>, String)> = done
        .into_iter()
        .map(|(n, t)| (n, Some(t), String::new()))
        .collect();
    out.extend(behind.into_iter().map(|(n, why)| (n, None, why)));
    Ok(out)
}

/// `Ok` when the host's `Reconciled` condition of `obj` is True for its
/// generation.
///
/// # Errors
/// Why not.
pub fn reconciled_for_generation(obj: &Value) -> Result<(), String> {
    let generation = obj["metadata"]["generation"].as_i64();
    let c = obj["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Reconciled"))
        .cloned()
        .unwrap_or(Value::Null);
    if c["status"] == "True"
        && generation.is_some()
        && c["observedGeneration"].as_i64() == generation
    {
        Ok(())
    } else {
        Err(format!("Reconciled for generation {generation:?}: {c}"))
    }
}

/// The EtcdBackups of the `backup` plugin.
fn etcd_backups(client: &Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("operator.openshift.io", "v1alpha1", "EtcdBackup");
    Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(&gvk, "etcdbackups"),
    )
}

/// The `backup` load: one operation on a random EtcdBackup of this soak
/// (create; or delete, and sometimes create again at once: `pvcName` is
/// immutable, so there are no edits).
async fn backup_step(
    api: &Api<DynamicObject>,
    rng: &mut Rng,
    names: &[String],
    label: &str,
    shared: &Shared,
) -> Result<()> {
    let name = &names[rng.below(names.len() as u64) as usize];
    let create = || async {
        let eb: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "operator.openshift.io/v1alpha1", "kind": "EtcdBackup",
            "metadata": {"name": name, "labels": {CHAOS_LABEL: label}},
            "spec": {"pvcName": BACKUP_PVC},
        }))?;
        api.create(&PostParams::default(), &eb).await?;
        shared.ops.lock().unwrap().created += 1;
        anyhow::Ok(())
    };
    match api.get_opt(name).await? {
        None => create().await,
        Some(eb) if eb.metadata.deletion_timestamp.is_some() => Ok(()),
        Some(eb) => {
            let uid = eb.metadata.uid.clone().unwrap_or_default();
            delete_owner(api, name, &uid, shared).await?;
            if rng.below(2) == 0 {
                // Gone at once unless the plugin's finalizer holds it: then
                // the create is refused and counted so.
                create().await?;
                shared.ops.lock().unwrap().recreated += 1;
            }
            Ok(())
        }
    }
}

/// The soak breaking every invariant itself (see [`Breach`]).
async fn breach(
    client: &Client,
    ns: &TestNamespace,
    shared: &Shared,
    bystanders: &[(String, String)],
) -> Result<()> {
    // A bystander changed.
    let (bns, bname) = &bystanders[0];
    Api::<ConfigMap>::namespaced(client.clone(), bns)
        .patch(
            bname,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"chaos/breach": "touched"}}})),
        )
        .await?;
    // A managed ConfigMap whose Widget lives, deleted; and a second
    // managed ConfigMap forged for another live Widget.
    let cms: Api<ConfigMap> = ns.api();
    let live: HashMap<String, String> = widgets(ns)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|w| Some((w.metadata.uid?, w.metadata.name?)))
        .collect();
    let managed: Vec<Seen> = cms
        .list(&ListParams::default().labels(&format!("{MANAGED_BY}=wasmop")))
        .await?
        .items
        .iter()
        .map(Seen::of)
        .filter(|s| s.controller.as_ref().is_some_and(|o| live.contains_key(o)))
        .collect();
    let deleted_owners = shared.deleted_owners.lock().unwrap().clone();
    let mut managed = managed
        .into_iter()
        .filter(|s| !deleted_owners.contains(s.controller.as_deref().unwrap_or_default()));
    let victim = managed
        .next()
        .context("breach: no managed ConfigMap with a live owner")?;
    cms.delete(&victim.name, &DeleteParams::default()).await?;
    let twin = managed
        .next()
        .context("breach: a second managed ConfigMap with a live owner")?;
    let owner = twin.controller.clone().unwrap_or_default();
    let forged: ConfigMap = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {
            "name": format!("{}-twin", twin.name),
            "labels": {MANAGED_BY: "wasmop"},
            "ownerReferences": [{
                "apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
                "name": live[&owner], "uid": owner, "controller": true,
            }],
        },
    }))?;
    cms.create(&PostParams::default(), &forged).await?;
    eprintln!(
        "chaos soak: BREACH touched bystander {bns}/{bname}, deleted {} (owner alive), forged {}-twin",
        victim.name, twin.name
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cm(name: &str, uid: &str, rv: &str, owner: Option<&str>, managed: bool) -> Seen {
        Seen {
            kind: "ConfigMap".into(),
            namespace: "ns".into(),
            name: name.into(),
            uid: uid.into(),
            resource_version: rv.into(),
            controller: owner.map(Into::into),
            managed,
            value: Some("v".into()),
        }
    }

    fn ns() -> Vec<String> {
        vec!["ns".to_owned()]
    }

    #[test]
    fn only_an_exit_on_a_lost_shard_term_with_its_reason_logged_is_the_designed_one() {
        use std::os::unix::process::ExitStatusExt;
        let dir = std::env::temp_dir().join(format!("wasmop-exit-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let exit = |code: i32, log: &str| {
            let path = dir.join(format!("replica-{code}-{}.log", log.len()));
            std::fs::write(&path, log).unwrap();
            Exit {
                slot: 0,
                status: std::process::ExitStatus::from_raw(code << 8),
                log: path,
            }
        };
        let said = "ERROR wasmop::cli::run: shard Lease term ended: its primaries may have been given away and its caches may be stale; exiting shard=r0\n";
        assert!(exit(3, said).lost_shard_term());
        assert!(
            !exit(3, "panicked at host/src/x.rs\n").lost_shard_term(),
            "exit 3 without its reason"
        );
        assert!(!exit(1, said).lost_shard_term(), "another code");
        let mut killed = exit(3, said);
        killed.status = std::process::ExitStatus::from_raw(9);
        assert!(!killed.lost_shard_term(), "a signal");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_bystander_changed_replaced_or_deleted_is_a_violation_reported_once() {
        let mut l = Ledger::default();
        l.bystander(&cm("b0-cm", "u1", "10", None, false));
        l.bystander(&cm("b1-cm", "u2", "11", None, false));
        l.bystander(&cm("b2-cm", "u3", "12", None, false));
        let intact = [
            cm("b0-cm", "u1", "10", None, false),
            cm("b1-cm", "u2", "11", None, false),
            cm("b2-cm", "u3", "12", None, false),
        ];
        assert!(l.observe(&ns(), &intact, &HashSet::new()).is_empty());
        // Adopted (changed), replaced, deleted.
        let broken = [
            cm("b0-cm", "u1", "13", Some("w"), true),
            cm("b1-cm", "u9", "14", None, false),
        ];
        let v = l.observe(&ns(), &broken, &HashSet::new());
        assert_eq!(v.len(), 3, "{v:?}");
        assert!(v.iter().all(|v| v.invariant == Invariant::Bystander));
        assert!(l.observe(&ns(), &broken, &HashSet::new()).is_empty());
    }

    #[test]
    fn a_managed_object_may_go_only_with_its_deleted_owner() {
        let mut l = Ledger::default();
        let seen = [
            cm("a-cm", "c1", "1", Some("wa"), true),
            cm("b-cm", "c2", "1", Some("wb"), true),
        ];
        assert!(l.observe(&ns(), &seen, &HashSet::new()).is_empty());
        let deleted: HashSet<String> = ["wa".to_owned()].into();
        let v = l.observe(&ns(), &[], &deleted);
        assert_eq!(l.explained_deletions, 1);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].invariant, Invariant::UnexplainedDeletion);
        assert!(v[0].detail.contains("b-cm"), "{}", v[0].detail);
    }

    #[test]
    fn an_object_owned_by_label_is_judged_by_its_owner_label() {
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": "l0-mirror", "namespace": "ns", "uid": "c1",
                "resourceVersion": "1",
                "labels": {MANAGED_BY: "wasmop", OWNER_UID_LABEL: "owner-1"}},
        }))
        .unwrap();
        let seen = Seen::of(&cm);
        assert_eq!(seen.controller.as_deref(), Some("owner-1"));
        let mut l = Ledger::default();
        assert!(l.observe(&ns(), &[seen], &HashSet::new()).is_empty());
        // Collected while its owner lives: a violation.
        let v = l.observe(&ns(), &[], &HashSet::new());
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].invariant, Invariant::UnexplainedDeletion);
    }

    #[test]
    fn two_managed_objects_of_one_owner_or_a_change_of_owner_break_ownership() {
        let mut l = Ledger::default();
        let one = [cm("a-cm", "c1", "1", Some("wa"), true)];
        assert!(l.observe(&ns(), &one, &HashSet::new()).is_empty());
        let two = [
            cm("a-cm", "c1", "1", Some("wa"), true),
            cm("a-twin", "c2", "1", Some("wa"), true),
        ];
        let v = l.observe(&ns(), &two, &HashSet::new());
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].invariant, Invariant::Ownership);
        // a-twin goes with its owner; a-cm stays and changes owner.
        let moved = [cm("a-cm", "c1", "2", Some("wb"), true)];
        let v = l.observe(&ns(), &moved, &["wa".to_owned()].into());
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(
            v[0].detail.contains("changed controller"),
            "{}",
            v[0].detail
        );
    }

    fn widget(generation: i64, cond: Value, observed: i64) -> Value {
        json!({
            "metadata": {"name": "w0", "uid": "u", "generation": generation},
            "spec": {"value": "x"},
            "status": {"observedGeneration": observed, "conditions": [cond]},
        })
    }

    #[test]
    fn a_widget_converges_only_reconciled_for_its_generation_with_its_value() {
        let ok = json!({"type": "Reconciled", "status": "True", "reason": "Reconciled", "observedGeneration": 2});
        let mut good_cm = cm("w0-cm", "c", "1", Some("u"), true);
        good_cm.value = Some("x".into());
        let mut stale_cm = good_cm.clone();
        stale_cm.value = Some("old".into());
        let mut foreign_cm = good_cm.clone();
        foreign_cm.controller = Some("other".into());
        assert_eq!(
            verdict(&widget(2, ok.clone(), 2), Some(&good_cm), false),
            Verdict::Converged
        );
        for (w, c) in [
            (widget(3, ok.clone(), 2), Some(&good_cm)),
            (widget(2, ok.clone(), 2), Some(&stale_cm)),
            (widget(2, ok.clone(), 2), Some(&foreign_cm)),
            (widget(2, ok.clone(), 2), None),
            (widget(2, ok.clone(), 1), Some(&good_cm)),
        ] {
            assert!(matches!(verdict(&w, c, false), Verdict::Behind(_)), "{w}");
        }
        let rejected = json!({"type": "Reconciled", "status": "False", "reason": "PlanRejected",
            "observedGeneration": 2, "message": "ConfigMap w0-cm exists and is not controlled by this primary"});
        assert_eq!(
            verdict(&widget(2, rejected.clone(), 1), None, true),
            Verdict::Blocked
        );
        // The same refusal of a Widget whose ConfigMap is no bystander is
        // the wedge, not convergence.
        assert!(matches!(
            verdict(&widget(2, rejected, 1), None, false),
            Verdict::Behind(_)
        ));
    }

    #[test]
    fn the_distribution_is_of_sorted_times() {
        let ms = |v: u64| Duration::from_millis(v);
        let d = Distribution::of(&[ms(50), ms(10), ms(40), ms(30), ms(20)]).unwrap();
        assert_eq!((d.min, d.median, d.max), (ms(10), ms(30), ms(50)));
        assert_eq!(d.p90, ms(50));
        assert!(Distribution::of(&[]).is_none());
    }

    #[test]
    fn a_seed_replays_the_same_choices() {
        let mut a = Rng::new(42);
        let mut b = Rng::new(42);
        let xs: Vec<u64> = (0..8).map(|_| a.below(1000)).collect();
        let ys: Vec<u64> = (0..8).map(|_| b.below(1000)).collect();
        assert_eq!(xs, ys);
        let mut c = Rng::new(43);
        assert_ne!(xs, (0..8).map(|_| c.below(1000)).collect::<Vec<_>>());
    }
}
