//! Sharding against the real local control plane: real `wasmop run
//! --leader-elect --sharding` processes, each a shard with its own Lease
//! (2 s), the leader assigning Widgets (`good` plugin: Widget → ConfigMap
//! `<name>-cm`) or Fanouts (`fanout` plugin: many ConfigMaps per plan) by
//! the label `shard.wasmop.dev/shard`.
//!
//! Covered: a shard joining (primaries spread as the ring says, each
//! reconciled by its owner only), a shard leaving gracefully and one
//! crashing (its primaries re-homed within a lease duration plus 5 s), a
//! shard frozen past its Lease and thawed (it writes nothing for the
//! primaries it lost and exits), a primary moving while its plan runs
//! (the old shard stops mid-plan and acknowledges before the new owner
//! writes), owned objects that move with their primary (relabelled for
//! the new shard, never made again; each shard caches only its own
//! primaries and their objects; an object carrying a primary's owner
//! label that the primary does not control is not claimed), shard labels
//! a user wrote, an identity that cannot name a
//! shard, and a hot swap reaching every shard.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};
use wasmop::controller::shard::{DRAIN_LABEL, Ring, SHARD_LABEL, lease_name};
use wasmop_tests::operator::{plugin_path, shard_command};
use wasmop_tests::{TestNamespace, apply_test_crds, kubeconfig_path, wait_for, wasmop_bin};

/// Lease duration of the leader and shard Leases.
const LEASE: Duration = Duration::from_secs(2);
/// The bound for re-homing: one lease duration plus 5 s.
const REHOME_BOUND: Duration = Duration::from_secs(2 + 5);
/// Bound for anything else to happen (process start, convergence).
const DEADLINE: Duration = Duration::from_secs(60);

/// One `wasmop run --sharding` process.
struct Shard {
    identity: String,
    child: tokio::process::Child,
    pid: u32,
    log: PathBuf,
}

impl Shard {
    async fn start(ns: &TestNamespace, work: &Path, identity: &str) -> Result<Self> {
        let log = work.join(format!("{identity}.log"));
        let child = shard_command(
            &wasmop_bin()?,
            &work.join("plugins"),
            &ns.name,
            identity,
            LEASE,
            &log,
        )?
        .arg("--kubeconfig")
        .arg(kubeconfig_path())
        .args(["--poll-interval-ms", "500"])
        .args(["--metrics-addr", "127.0.0.1:0"])
        .spawn()
        .context("starting wasmop")?;
        let pid = child.id().context("pid")?;
        Ok(Self {
            identity: identity.to_owned(),
            child,
            pid,
            log,
        })
    }

    fn signal(&self, sig: &str) -> Result<()> {
        let status = std::process::Command::new("kill")
            .args([&format!("-{sig}"), &self.pid.to_string()])
            .status()?;
        if !status.success() {
            bail!("kill -{sig} {} failed", self.pid);
        }
        Ok(())
    }

    /// Waits for the process to end; its exit code.
    async fn exited(&mut self, deadline: Duration) -> Result<Option<i32>> {
        let status = tokio::time::timeout(deadline, self.child.wait())
            .await
            .context("the shard did not exit")??;
        Ok(status.code())
    }

    /// The address its /metrics is served at.
    async fn metrics_addr(&self) -> Result<String> {
        wait_for("the shard serves /metrics", DEADLINE, || async {
            Ok(self
                .lines()
                .into_iter()
                .find(|l| l["msg"] == "serving metrics at /metrics")
                .and_then(|l| l["addr"].as_str().map(str::to_owned)))
        })
        .await
    }

    /// Its `wasmop_cache_objects` of `kind` (a cache key such as
    /// `/v1/ConfigMap`), read from its /metrics.
    async fn cached(&self, kind: &str) -> Result<Option<f64>> {
        let page = http_get(&self.metrics_addr().await?, "/metrics").await?;
        let head = format!("wasmop_cache_objects{{kind=\"{kind}\"}} ");
        Ok(page
            .lines()
            .find_map(|l| l.strip_prefix(&head))
            .and_then(|v| v.trim().parse().ok()))
    }

    /// The JSON log lines so far.
    fn lines(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

/// The body of a plain HTTP GET of `path` from `addr` (loopback).
async fn http_get(addr: &str, path: &str) -> Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let mut out = String::new();
    s.read_to_string(&mut out).await?;
    let (_, body) = out.split_once("\r\n\r\n").context("no HTTP head")?;
    Ok(body.to_owned())
}

/// The cache key of Widgets and of ConfigMaps in `wasmop_cache_objects`.
const WIDGET_KIND: &str = "test.wasmop.dev/v1/Widget";
const CM_KIND: &str = "/v1/ConfigMap";

/// Log lines of `shard` with message `msg` about primary `name`, after
/// the first `skip` lines.
fn said(shard: &Shard, skip: usize, msg: &str, name: &str) -> Vec<Value> {
    shard
        .lines()
        .into_iter()
        .skip(skip)
        .filter(|l| l["msg"] == msg && l["name"] == name)
        .collect()
}

fn ts(line: &Value) -> jiff::Timestamp {
    line["ts"]
        .as_str()
        .and_then(|t| t.parse().ok())
        .unwrap_or(jiff::Timestamp::MAX)
}

/// A namespace, the test CRDs and a plugin directory holding `plugin`.
async fn setup(prefix: &str, plugin: &str) -> Result<(TestNamespace, PathBuf)> {
    let ns = TestNamespace::new(prefix).await?;
    apply_test_crds(&ns.client).await?;
    let work = std::env::temp_dir().join(format!("wasmop-{}", ns.name));
    std::fs::create_dir_all(work.join("plugins"))?;
    std::fs::copy(
        plugin_path(plugin)?,
        work.join("plugins").join(format!("{plugin}.wasm")),
    )?;
    Ok((ns, work))
}

fn api(ns: &TestNamespace, kind: &str, plural: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("test.wasmop.dev", "v1", kind);
    let ar = ApiResource::from_gvk_with_plural(&gvk, plural);
    Api::namespaced_with(ns.client.clone(), &ns.name, &ar)
}

fn widgets(ns: &TestNamespace) -> Api<DynamicObject> {
    api(ns, "Widget", "widgets")
}

fn label<'a>(o: &'a DynamicObject, key: &str) -> Option<&'a str> {
    o.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

async fn create_widgets(ns: &TestNamespace, n: usize, value: &str) -> Result<()> {
    for i in 0..n {
        let w: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
            "metadata": {"name": format!("w{i:02}")}, "spec": {"value": value},
        }))?;
        widgets(ns).create(&PostParams::default(), &w).await?;
    }
    Ok(())
}

async fn set_value(ns: &TestNamespace, names: &[String], value: &str) -> Result<()> {
    for name in names {
        widgets(ns)
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"value": value}})),
            )
            .await?;
    }
    Ok(())
}

/// Widget name → its shard label, for every Widget.
async fn owners(ns: &TestNamespace) -> Result<BTreeMap<String, (String, Option<String>)>> {
    Ok(widgets(ns)
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|w| {
            (
                w.metadata.name.clone().unwrap_or_default(),
                (
                    w.metadata.uid.clone().unwrap_or_default(),
                    label(w, SHARD_LABEL).map(str::to_owned),
                ),
            )
        })
        .collect())
}

/// Waits until every Widget is labelled with its place on the ring of
/// `shards`, carries no drain mark, and its ConfigMap holds `value`.
async fn wait_placed(
    ns: &TestNamespace,
    shards: &[&str],
    value: &str,
    deadline: Duration,
) -> Result<BTreeMap<String, String>> {
    let ring = Ring::new(shards.iter().copied());
    let cms: Api<ConfigMap> = ns.api();
    wait_for("every Widget placed and converged", deadline, || async {
        let mut placed = BTreeMap::new();
        for w in widgets(ns).list(&ListParams::default()).await?.items {
            let name = w.metadata.name.clone().unwrap_or_default();
            let uid = w.metadata.uid.clone().unwrap_or_default();
            let want = ring.shard_of(&uid).context("empty ring")?;
            if label(&w, SHARD_LABEL) != Some(want) || label(&w, DRAIN_LABEL).is_some() {
                bail!(
                    "{name} labelled {:?}, wanted {want}",
                    label(&w, SHARD_LABEL)
                );
            }
            let cm = cms.get_opt(&format!("{name}-cm")).await?;
            let got = cm
                .as_ref()
                .and_then(|c| c.data.as_ref()?.get("value").cloned());
            if got.as_deref() != Some(value) {
                bail!("{name}-cm holds {got:?}, wanted {value}");
            }
            placed.insert(name, want.to_owned());
        }
        Ok(Some(placed))
    })
    .await
}

/// ConfigMap name → UID, for every ConfigMap a Widget owns (`<name>-cm`).
async fn cm_uids(ns: &TestNamespace) -> Result<BTreeMap<String, String>> {
    let cms: Api<ConfigMap> = ns.api();
    Ok(cms
        .list_metadata(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|c| {
            let name = c.metadata.name?;
            name.ends_with("-cm")
                .then(|| (name, c.metadata.uid.unwrap_or_default()))
        })
        .collect())
}

/// Waits until the ConfigMap of every Widget of `placed` carries its
/// Widget's shard label (and the Widget's UID as owner label).
async fn wait_cms_labelled(
    ns: &TestNamespace,
    placed: &BTreeMap<String, String>,
    deadline: Duration,
) -> Result<()> {
    let cms: Api<ConfigMap> = ns.api();
    wait_for(
        "every ConfigMap labelled for its Widget's shard",
        deadline,
        || async {
            let uids = owners(ns).await?;
            for (name, shard) in placed {
                let cm = cms.get(&format!("{name}-cm")).await?;
                let labels = cm.metadata.labels.clone().unwrap_or_default();
                let got = labels.get(SHARD_LABEL).map(String::as_str);
                if got != Some(shard.as_str()) {
                    bail!("{name}-cm labelled {got:?}, wanted {shard}");
                }
                let owner = labels.get("wasmop.dev/owner-uid");
                if owner != uids.get(name).map(|(uid, _)| uid) {
                    bail!("{name}-cm carries owner label {owner:?}");
                }
            }
            Ok(Some(()))
        },
    )
    .await
}

/// Waits until `shard`'s caches hold exactly `n` Widgets and `n`
/// ConfigMaps.
async fn wait_cached(shard: &Shard, n: usize) -> Result<()> {
    let want = Some(n as f64);
    wait_for(
        &format!("{} caches {n} Widgets and {n} ConfigMaps", shard.identity),
        DEADLINE,
        || async {
            let (w, c) = (
                shard.cached(WIDGET_KIND).await?,
                shard.cached(CM_KIND).await?,
            );
            if (w, c) != (want, want) {
                bail!("{}: {w:?} Widgets, {c:?} ConfigMaps cached", shard.identity);
            }
            Ok(Some(()))
        },
    )
    .await
}

/// The holder of the leader Lease.
async fn leader(ns: &TestNamespace) -> Result<Option<String>> {
    let lease = Api::<Lease>::namespaced(ns.client.clone(), &ns.name)
        .get_opt("wasmop-leader")
        .await?;
    Ok(lease.and_then(|l| l.spec?.holder_identity))
}

/// Starts `a`, waits until it leads and owns `n` Widgets holding `value`.
/// Widgets enough that the ring (keyed by random UIDs) leaves no shard of
/// two without one but once in 2^15 runs (at 8 it was once in 128).
const SPREAD: usize = 16;

async fn first_shard(ns: &TestNamespace, work: &Path, a: &str, n: usize) -> Result<Shard> {
    let shard = Shard::start(ns, work, a).await?;
    wait_for("the first shard leads", DEADLINE, || async {
        Ok((leader(ns).await?.as_deref() == Some(a)).then_some(()))
    })
    .await?;
    create_widgets(ns, n, "v1").await?;
    wait_placed(ns, &[a], "v1", DEADLINE).await?;
    Ok(shard)
}

#[tokio::test]
async fn a_joining_shard_takes_its_share_and_a_leaving_one_hands_it_back() -> Result<()> {
    let (ns, work) = setup("shard-join", "good").await?;
    let a = first_shard(&ns, &work, "shard-a", SPREAD).await?;
    let b = Shard::start(&ns, &work, "shard-b").await?;
    let placed = wait_placed(&ns, &["shard-a", "shard-b"], "v1", DEADLINE).await?;
    let on_b: Vec<String> = placed
        .iter()
        .filter(|(_, s)| *s == "shard-b")
        .map(|(n, _)| n.clone())
        .collect();
    assert!(
        !on_b.is_empty() && on_b.len() < placed.len(),
        "the ring splits {SPREAD} Widgets over two shards: {placed:?}"
    );
    // Each moved Widget was given up by shard-a before shard-b took it.
    for name in &on_b {
        let ack = said(&a, 0, "drain acknowledged; primary given up", name);
        assert_eq!(ack.len(), 1, "{name}: shard-a acknowledged once: {ack:?}");
    }
    // Edits are reconciled by the owner alone.
    let (skip_a, skip_b) = (a.lines().len(), b.lines().len());
    let all: Vec<String> = placed.keys().cloned().collect();
    set_value(&ns, &all, "v2").await?;
    wait_placed(&ns, &["shard-a", "shard-b"], "v2", DEADLINE).await?;
    for (name, owner) in &placed {
        let (mine, other) = if owner == "shard-a" {
            (&a, &b)
        } else {
            (&b, &a)
        };
        assert!(
            !said(
                mine,
                if owner == "shard-a" { skip_a } else { skip_b },
                "reconciled",
                name
            )
            .is_empty(),
            "{name}: its owner {owner} reconciled the edit"
        );
        let skip = if owner == "shard-a" { skip_b } else { skip_a };
        assert!(
            said(other, skip, "reconciled", name).is_empty(),
            "{name}: reconciled by {} too, which does not own it",
            other.identity
        );
    }
    // shard-b leaves gracefully: its Lease is released and its Widgets
    // come back to shard-a within one lease duration plus 5 s.
    let mut b = b;
    b.signal("TERM")?;
    assert_eq!(b.exited(DEADLINE).await?, Some(0), "a graceful stop");
    let started = Instant::now();
    wait_placed(&ns, &["shard-a"], "v2", REHOME_BOUND).await?;
    eprintln!("re-homed after a leave in {:?}", started.elapsed());
    set_value(&ns, &all, "v3").await?;
    wait_placed(&ns, &["shard-a"], "v3", DEADLINE).await?;
    drop(a);
    Ok(())
}

#[tokio::test]
async fn each_shard_caches_only_its_primaries_and_their_objects_which_move_with_them() -> Result<()>
{
    let (ns, work) = setup("shard-owned", "good").await?;
    let a = first_shard(&ns, &work, "shard-a", SPREAD).await?;
    let before = cm_uids(&ns).await?;
    assert_eq!(before.len(), SPREAD, "{before:?}");
    let only_a: BTreeMap<String, String> = owners(&ns)
        .await?
        .into_keys()
        .map(|n| (n, "shard-a".to_owned()))
        .collect();
    wait_cms_labelled(&ns, &only_a, DEADLINE).await?;
    wait_cached(&a, SPREAD).await?;
    // A join: the ConfigMaps of the Widgets that move are relabelled for
    // shard-b, not made again, and each shard caches only its own.
    let mut b = Shard::start(&ns, &work, "shard-b").await?;
    let placed = wait_placed(&ns, &["shard-a", "shard-b"], "v1", DEADLINE).await?;
    wait_cms_labelled(&ns, &placed, DEADLINE).await?;
    assert_eq!(cm_uids(&ns).await?, before, "a ConfigMap was made again");
    let on_b = placed.values().filter(|s| *s == "shard-b").count();
    assert!(on_b > 0 && on_b < SPREAD, "{placed:?}");
    wait_cached(&a, SPREAD - on_b).await?;
    wait_cached(&b, on_b).await?;
    let all: Vec<String> = placed.keys().cloned().collect();
    set_value(&ns, &all, "v2").await?;
    wait_placed(&ns, &["shard-a", "shard-b"], "v2", DEADLINE).await?;
    assert_eq!(cm_uids(&ns).await?, before, "a ConfigMap was made again");
    // A leave: they come back to shard-a the same way.
    b.signal("TERM")?;
    assert_eq!(b.exited(DEADLINE).await?, Some(0), "a graceful stop");
    wait_placed(&ns, &["shard-a"], "v2", REHOME_BOUND).await?;
    wait_cms_labelled(&ns, &only_a, DEADLINE).await?;
    assert_eq!(cm_uids(&ns).await?, before, "a ConfigMap was made again");
    wait_cached(&a, SPREAD).await?;
    set_value(&ns, &all, "v3").await?;
    wait_placed(&ns, &["shard-a"], "v3", DEADLINE).await?;
    drop(a);
    Ok(())
}

#[tokio::test]
async fn a_crashed_shards_primaries_are_rehomed_within_a_lease_and_five_seconds() -> Result<()> {
    let (ns, work) = setup("shard-crash", "good").await?;
    let a = first_shard(&ns, &work, "shard-a", SPREAD).await?;
    let mut b = Shard::start(&ns, &work, "shard-b").await?;
    let placed = wait_placed(&ns, &["shard-a", "shard-b"], "v1", DEADLINE).await?;
    wait_cms_labelled(&ns, &placed, DEADLINE).await?;
    let before = cm_uids(&ns).await?;
    // A ConfigMap that names a Widget of shard-b as its owner by label
    // (and shard-b by shard label) but is not controlled by it: the claim
    // after the crash must leave it alone.
    let victim = placed
        .iter()
        .find(|(_, s)| *s == "shard-b")
        .map(|(n, _)| n.clone())
        .context("shard-b owns a Widget")?;
    let victim_uid = owners(&ns).await?[&victim].0.clone();
    let cms: Api<ConfigMap> = ns.api();
    let intruder: ConfigMap = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "intruder", "labels": {
            "app.kubernetes.io/managed-by": "wasmop",
            "wasmop.dev/owner-uid": victim_uid,
            SHARD_LABEL: "shard-b",
        }},
        "data": {"value": "mine"},
    }))?;
    let intruder = cms.create(&PostParams::default(), &intruder).await?;
    b.signal("KILL")?;
    b.exited(DEADLINE).await?;
    let started = Instant::now();
    wait_placed(&ns, &["shard-a"], "v1", REHOME_BOUND).await?;
    eprintln!("re-homed after a crash in {:?}", started.elapsed());
    let only_a = placed
        .keys()
        .map(|n| (n.clone(), "shard-a".to_owned()))
        .collect();
    wait_cms_labelled(&ns, &only_a, DEADLINE).await?;
    assert_eq!(cm_uids(&ns).await?, before, "a ConfigMap was made again");
    let all: Vec<String> = owners(&ns).await?.keys().cloned().collect();
    set_value(&ns, &all, "v2").await?;
    wait_placed(&ns, &["shard-a"], "v2", DEADLINE).await?;
    let left = cms.get("intruder").await?;
    assert_eq!(
        left.metadata.resource_version, intruder.metadata.resource_version,
        "the claim wrote the intruder"
    );
    assert_eq!(
        left.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(SHARD_LABEL)),
        Some(&"shard-b".to_owned()),
        "the intruder was relabelled"
    );
    let refused = a.lines().iter().any(|l| {
        l["object"] == "intruder"
            && l["msg"]
                .as_str()
                .is_some_and(|m| m.contains("the primary does not control it"))
    });
    assert!(refused, "shard-a says it left the intruder alone");
    drop(a);
    Ok(())
}

#[tokio::test]
async fn a_shard_frozen_past_its_lease_writes_nothing_for_the_primaries_it_lost() -> Result<()> {
    let (ns, work) = setup("shard-freeze", "good").await?;
    let a = first_shard(&ns, &work, "shard-a", SPREAD).await?;
    let mut b = Shard::start(&ns, &work, "shard-b").await?;
    let placed = wait_placed(&ns, &["shard-a", "shard-b"], "v1", DEADLINE).await?;
    let lost: Vec<String> = placed
        .iter()
        .filter(|(_, s)| *s == "shard-b")
        .map(|(n, _)| n.clone())
        .collect();
    assert!(!lost.is_empty(), "shard-b owns some Widgets: {placed:?}");
    b.signal("STOP")?;
    let frozen_lines = b.lines().len();
    // Edited while shard-b still holds them: the events wait in its
    // connections for the thaw, and would make it write `mid` again.
    let all: Vec<String> = placed.keys().cloned().collect();
    set_value(&ns, &all, "mid").await?;
    wait_placed(&ns, &["shard-a"], "mid", REHOME_BOUND + LEASE).await?;
    set_value(&ns, &all, "after").await?;
    wait_placed(&ns, &["shard-a"], "after", DEADLINE).await?;
    let cms: Api<ConfigMap> = ns.api();
    let mut before = BTreeMap::new();
    for name in &lost {
        let cm = cms.get(&format!("{name}-cm")).await?;
        before.insert(name.clone(), cm.metadata.resource_version.clone());
    }
    b.signal("CONT")?;
    // Its term ended while frozen: it stops instead of acting on stale
    // caches.
    let code = b.exited(DEADLINE).await?;
    assert_eq!(
        code,
        Some(wasmop::controller::shard::LOST_TERM_EXIT_CODE),
        "the thawed shard exits"
    );
    for name in &lost {
        let cm = cms.get(&format!("{name}-cm")).await?;
        assert_eq!(
            cm.data
                .as_ref()
                .and_then(|d| d.get("value"))
                .map(String::as_str),
            Some("after"),
            "{name}-cm was written back by the thawed shard"
        );
        assert_eq!(
            Some(&cm.metadata.resource_version),
            before.get(name),
            "{name}-cm written after the thaw"
        );
        let after_thaw: Vec<Value> = b
            .lines()
            .into_iter()
            .skip(frozen_lines)
            .filter(|l| {
                l["name"] == name.as_str()
                    && (l["msg"] == "reconciled" || l["msg"] == "reconcile failed")
            })
            .collect();
        assert!(
            after_thaw.is_empty(),
            "{name}: the thawed shard wrote: {after_thaw:?}"
        );
    }
    let said_why = b.lines().iter().any(|l| {
        l["msg"]
            .as_str()
            .is_some_and(|m| m.starts_with("shard Lease term ended"))
    });
    assert!(said_why, "the thawed shard says why it stops");
    drop(a);
    Ok(())
}

/// Every Fanout.
async fn fanouts(ns: &TestNamespace) -> Result<Vec<DynamicObject>> {
    Ok(api(ns, "Fanout", "fanouts")
        .list(&ListParams::default())
        .await?
        .items)
}

async fn fanout_cms(ns: &TestNamespace, name: &str) -> Result<usize> {
    let cms: Api<ConfigMap> = ns.api();
    Ok(cms
        .list_metadata(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|c| {
            c.metadata
                .name
                .as_deref()
                .and_then(|n| n.strip_prefix(&format!("{name}-")))
                .is_some_and(|i| i.parse::<usize>().is_ok())
        })
        .count())
}

/// A shard Lease held by a shard that does not run: the sharder counts it
/// live while the test renews it.
async fn ghost_lease(ns: &TestNamespace, identity: &str) -> Result<()> {
    let lease = Lease {
        metadata: kube::api::ObjectMeta {
            name: Some(lease_name(identity)),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(identity.to_owned()),
            lease_duration_seconds: Some(3600),
            renew_time: Some(MicroTime(jiff::Timestamp::now())),
            ..Default::default()
        }),
    };
    Api::<Lease>::namespaced(ns.client.clone(), &ns.name)
        .create(&PostParams::default(), &lease)
        .await?;
    Ok(())
}

#[tokio::test]
async fn a_primary_moving_while_its_plan_runs_is_given_up_before_its_new_owner_writes() -> Result<()>
{
    /// At least this many Fanouts, more until one would go to `ghost`.
    const FANOUTS: usize = 8;
    const COUNT: usize = 400;
    let (ns, work) = setup("shard-move", "fanout").await?;
    let a = Shard::start(&ns, &work, "shard-a").await?;
    wait_for("shard-a leads", DEADLINE, || async {
        Ok((leader(&ns).await?.as_deref() == Some("shard-a")).then_some(()))
    })
    .await?;
    let fans = api(&ns, "Fanout", "fanouts");
    // Which Fanouts a third shard `ghost` would take (the ring is keyed by
    // UID): some must, so the ring cannot leave the test without one.
    let ring = Ring::new(["shard-a", "ghost"]);
    let mut made = 0;
    let mut any_moves = false;
    while made < FANOUTS || !any_moves {
        let f: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "test.wasmop.dev/v1", "kind": "Fanout",
            "metadata": {"name": format!("f{made}")}, "spec": {"count": 1},
        }))?;
        let f = fans.create(&PostParams::default(), &f).await?;
        any_moves |= ring.shard_of(f.metadata.uid.as_deref().unwrap_or_default()) == Some("ghost");
        made += 1;
    }
    wait_for(
        "every Fanout assigned to shard-a and reconciled",
        DEADLINE,
        || async {
            for f in fanouts(&ns).await? {
                if label(&f, SHARD_LABEL) != Some("shard-a")
                    || f.data["status"]["count"].as_u64() != Some(1)
                {
                    return Ok(None);
                }
            }
            Ok(Some(()))
        },
    )
    .await?;
    let moving: BTreeSet<String> = fanouts(&ns)
        .await?
        .iter()
        .filter(|f| ring.shard_of(f.metadata.uid.as_deref().unwrap_or_default()) == Some("ghost"))
        .filter_map(|f| f.metadata.name.clone())
        .collect();
    assert!(!moving.is_empty(), "some Fanouts go to a second shard");
    // Big plans, then `ghost` joins while one of the moving Fanouts' plan
    // is being written.
    let skip = a.lines().len();
    for i in 0..made {
        fans.patch(
            &format!("f{i}"),
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"count": COUNT}})),
        )
        .await?;
    }
    let running = wait_for(
        "a moving Fanout's plan is half written",
        DEADLINE,
        || async {
            for name in &moving {
                let n = fanout_cms(&ns, name).await?;
                if n > 5 && n < COUNT / 2 {
                    return Ok(Some(name.clone()));
                }
            }
            Ok(None)
        },
    )
    .await?;
    ghost_lease(&ns, "ghost").await?;
    // The moving Fanouts are given up by shard-a and assigned to ghost.
    let cut = wait_for("the moving Fanouts assigned to ghost", DEADLINE, || async {
        let mut cut = BTreeMap::new();
        for f in fanouts(&ns).await? {
            let name = f.metadata.name.clone().unwrap_or_default();
            if moving.contains(&name) {
                if label(&f, SHARD_LABEL) != Some("ghost") {
                    return Ok(None);
                }
                cut.insert(name.clone(), fanout_cms(&ns, &name).await?);
            }
        }
        Ok(Some(cut))
    })
    .await?;
    assert!(
        cut[&running] < COUNT,
        "{running}'s plan was cut short by the move: {cut:?}"
    );
    for name in &moving {
        let ack = said(&a, skip, "drain acknowledged; primary given up", name);
        assert_eq!(ack.len(), 1, "{name} acknowledged once: {ack:?}");
        let after: Vec<Value> = said(&a, skip, "reconciled", name)
            .into_iter()
            .filter(|l| ts(l) > ts(&ack[0]))
            .collect();
        assert!(
            after.is_empty(),
            "{name} reconciled by shard-a after it gave it up: {after:?}"
        );
    }
    let stopped = a
        .lines()
        .into_iter()
        .skip(skip)
        .any(|l| l["name"] == running.as_str() && l["reason"] == "LeadershipLost");
    assert!(
        stopped,
        "{running}: shard-a stopped its plan mid-way (LeadershipLost)"
    );
    // Nothing writes for them while their owner (ghost) does not run.
    for name in &moving {
        assert_eq!(
            fanout_cms(&ns, name).await?,
            cut[name],
            "{name} written while on ghost"
        );
    }
    // ghost goes away: the sharder hands them back and the plans finish.
    Api::<Lease>::namespaced(ns.client.clone(), &ns.name)
        .delete(&lease_name("ghost"), &Default::default())
        .await?;
    wait_for(
        "every Fanout back on shard-a and complete",
        DEADLINE,
        || async {
            for f in fanouts(&ns).await? {
                if label(&f, SHARD_LABEL) != Some("shard-a")
                    || f.data["status"]["count"].as_u64() != Some(COUNT as u64)
                {
                    return Ok(None);
                }
            }
            Ok(Some(()))
        },
    )
    .await?;
    for name in &moving {
        assert_eq!(fanout_cms(&ns, name).await?, COUNT, "{name} complete");
    }
    drop(a);
    Ok(())
}

#[tokio::test]
async fn labels_a_user_wrote_are_corrected_and_a_bad_identity_is_refused() -> Result<()> {
    let (ns, work) = setup("shard-labels", "good").await?;
    // An identity that cannot name a Lease or a label: a clear error,
    // before anything is written.
    let mut bad = Shard::start(&ns, &work, "Bad_Name").await?;
    assert_ne!(bad.exited(DEADLINE).await?, Some(0), "refused");
    let text = std::fs::read_to_string(&bad.log)?;
    assert!(
        text.contains("--sharding: shard identity") && text.contains("Bad_Name"),
        "{text}"
    );
    let leases = Api::<Lease>::namespaced(ns.client.clone(), &ns.name)
        .list(&ListParams::default())
        .await?;
    assert!(
        leases.items.is_empty(),
        "no Lease written: {:?}",
        leases.items
    );
    // Widgets created with a shard label naming no live shard, with a
    // drain mark, and with an empty label: each ends up on the ring's
    // shard, reconciled.
    let a = Shard::start(&ns, &work, "shard-a").await?;
    for (name, labels) in [
        ("forged", json!({SHARD_LABEL: "nobody"})),
        (
            "drained",
            json!({SHARD_LABEL: "shard-a", DRAIN_LABEL: "true"}),
        ),
        ("empty", json!({SHARD_LABEL: ""})),
    ] {
        let w: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
            "metadata": {"name": name, "labels": labels}, "spec": {"value": "v1"},
        }))?;
        widgets(&ns).create(&PostParams::default(), &w).await?;
    }
    wait_placed(&ns, &["shard-a"], "v1", DEADLINE).await?;
    drop(a);
    Ok(())
}

#[tokio::test]
async fn a_hot_swap_reaches_every_shard_and_each_reconciles_only_its_own() -> Result<()> {
    let (ns, work) = setup("shard-swap", "good").await?;
    let a = first_shard(&ns, &work, "shard-a", SPREAD).await?;
    let b = Shard::start(&ns, &work, "shard-b").await?;
    let placed = wait_placed(&ns, &["shard-a", "shard-b"], "v1", DEADLINE).await?;
    let (skip_a, skip_b) = (a.lines().len(), b.lines().len());
    // The new version replaces the file both shards watch.
    let staged = work.join("good.wasm.new");
    std::fs::copy(plugin_path("good-v2")?, &staged)?;
    std::fs::rename(&staged, work.join("plugins/good.wasm"))?;
    let cms: Api<ConfigMap> = ns.api();
    wait_for(
        "every ConfigMap written by good 0.2.0",
        DEADLINE,
        || async {
            for name in placed.keys() {
                let cm = cms.get(&format!("{name}-cm")).await?;
                let version = cm
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("test.wasmop.dev/version"))
                    .cloned();
                if version.as_deref() != Some("v2") {
                    return Ok(None);
                }
            }
            Ok(Some(()))
        },
    )
    .await?;
    let by_v2 = |s: &Shard, skip: usize, name: &str| {
        said(s, skip, "reconciled", name)
            .iter()
            .any(|l| l["plugin_version"] == "0.2.0")
    };
    for (name, owner) in &placed {
        let (mine, other, skip_mine, skip_other) = if owner == "shard-a" {
            (&a, &b, skip_a, skip_b)
        } else {
            (&b, &a, skip_b, skip_a)
        };
        assert!(
            by_v2(mine, skip_mine, name),
            "{name}: its owner {owner} ran 0.2.0"
        );
        assert!(
            said(other, skip_other, "reconciled", name).is_empty(),
            "{name}: reconciled by {} too",
            other.identity
        );
    }
    drop((a, b));
    Ok(())
}

/// A `labeller` shard (`wasmop-under-test`, the build with failpoints)
/// that sweeps for orphans every second, held where the file `failpoint`
/// says (`WASMOP_FAILPOINT=@failpoint`).
async fn sweeping_shard(
    ns: &TestNamespace,
    work: &Path,
    identity: &str,
    failpoint: &Path,
) -> Result<Shard> {
    let log = work.join(format!("{identity}.log"));
    let child = shard_command(
        Path::new(env!("CARGO_BIN_EXE_wasmop-under-test")),
        &work.join("plugins"),
        &ns.name,
        identity,
        LEASE,
        &log,
    )?
    .arg("--kubeconfig")
    .arg(kubeconfig_path())
    .arg("--config")
    .arg(work.join("config.yaml"))
    .args(["--orphan-sweep-interval-secs", "1"])
    .args(["--metrics-addr", "127.0.0.1:0"])
    .env("WASMOP_FAILPOINT", format!("@{}", failpoint.display()))
    .spawn()
    .context("starting wasmop-under-test")?;
    let pid = child.id().context("pid")?;
    Ok(Shard {
        identity: identity.to_owned(),
        child,
        pid,
        log,
    })
}

/// The orphan sweep judges an owner gone only by a read that cannot
/// predate the object: the leader's sweep is held between its read of the
/// owners (made for a real orphan, whose owner never existed) and its
/// deletes; meanwhile Labellers are created, some on the other shard
/// (whose primaries the leader does not cache), and make their Badges.
/// When the sweep goes on, it reaches those Badges, listed after its read
/// of the owners: none is collected (same UID), and the real orphan is.
#[tokio::test]
async fn the_orphan_sweep_never_collects_what_a_primary_made_on_another_shard_during_it()
-> Result<()> {
    let (ns, work) = setup("shard-sweep", "labeller").await?;
    std::fs::write(
        work.join("config.yaml"),
        format!(
            "plugins:\n  labeller:\n    settings: {{targetNamespace: {}}}\n",
            ns.name
        ),
    )?;
    let failpoint = work.join("failpoint");
    let held = |point: &str| work.join(format!("failpoint.held-{point}"));
    std::fs::write(&failpoint, "hold:sweep-before-delete\n")?;
    let cms: Api<ConfigMap> = ns.api();
    let orphan: ConfigMap = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "orphan-mirror", "labels": {
            "app.kubernetes.io/managed-by": "wasmop", "wasmop.dev/plugin": "labeller",
            "wasmop.dev/owner-uid": "00000000-0000-0000-0000-0000000000aa"}},
    }))?;
    cms.create(&PostParams::default(), &orphan).await?;
    let a = sweeping_shard(&ns, &work, "shard-a", &failpoint).await?;
    wait_for("shard-a leads", DEADLINE, || async {
        Ok((leader(&ns).await?.as_deref() == Some("shard-a")).then_some(()))
    })
    .await?;
    let b = sweeping_shard(&ns, &work, "shard-b", &failpoint).await?;
    let leases = Api::<Lease>::namespaced(ns.client.clone(), &ns.name);
    wait_for("shard-b holds its Lease", DEADLINE, || async {
        let lease = leases.get_opt(&lease_name("shard-b")).await?;
        Ok(lease
            .and_then(|l| l.spec?.holder_identity)
            .filter(|h| h == "shard-b")
            .map(|_| ()))
    })
    .await?;
    wait_for(
        "the sweep held before deleting the orphan",
        DEADLINE,
        || async { Ok(held("sweep-before-delete").exists().then_some(())) },
    )
    .await?;

    // Labellers made while the sweep is held, until two are the other
    // shard's; each placed as the ring says, with its Badge.
    let labellers = api(&ns, "Labeller", "labellers");
    let badges: Api<DynamicObject> = Api::all_with(
        ns.client.clone(),
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("test.wasmop.dev", "v1", "Badge"),
            "badges",
        ),
    );
    let ring = Ring::new(["shard-a", "shard-b"]);
    let mut on_b = 0;
    let mut names = Vec::new();
    while on_b < 2 {
        ensure!(names.len() < 20, "no Labeller placed on shard-b");
        let name = format!("l{:02}", names.len());
        let made = labellers
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "apiVersion": "test.wasmop.dev/v1", "kind": "Labeller",
                    "metadata": {"name": name}, "spec": {"value": "v"},
                }))?,
            )
            .await?;
        if ring.shard_of(made.metadata.uid.as_deref().unwrap_or_default()) == Some("shard-b") {
            on_b += 1;
        }
        names.push(name);
    }
    let badge_uids = wait_for("every Labeller's Badge", DEADLINE, || async {
        let mut uids = BTreeMap::new();
        for name in &names {
            let l = labellers.get(name).await?;
            let badge = format!("{}-{name}", ns.name);
            let Some(b) = badges.get_opt(&badge).await? else {
                return Ok(None);
            };
            let want = ring.shard_of(l.metadata.uid.as_deref().unwrap_or_default());
            if label(&l, SHARD_LABEL) != want || label(&l, DRAIN_LABEL).is_some() {
                return Ok(None);
            }
            uids.insert(badge, b.metadata.uid.unwrap_or_default());
        }
        Ok(Some(uids))
    })
    .await?;

    // The sweep goes on, and is held again at its end.
    std::fs::write(&failpoint, "hold:sweep-done\n")?;
    wait_for("the sweep done", DEADLINE, || async {
        Ok(held("sweep-done").exists().then_some(()))
    })
    .await?;
    let orphan_gone = cms.get_opt("orphan-mirror").await?.is_none();
    let mut collected = Vec::new();
    for (badge, uid) in &badge_uids {
        let now = badges.get_opt(badge).await?;
        if now.and_then(|b| b.metadata.uid).as_ref() != Some(uid) {
            collected.push(badge.clone());
        }
    }
    std::fs::write(&failpoint, "")?;
    // Cleanup: the Labellers go with their finalizer's cleanup while the
    // shards run.
    for name in &names {
        labellers.delete(name, &Default::default()).await?;
    }
    wait_for("every Labeller gone", DEADLINE, || async {
        Ok(labellers
            .list(&ListParams::default())
            .await?
            .items
            .is_empty()
            .then_some(()))
    })
    .await?;
    drop((a, b));
    ensure!(orphan_gone, "the orphan was not collected");
    ensure!(
        collected.is_empty(),
        "Badges of live Labellers collected by the sweep: {collected:?}"
    );
    Ok(())
}

/// A person labels a primary's owned ConfigMap for another shard by hand
/// (where the shard label policy of `deploy/` is not installed): the
/// object leaves its shard's view, and every apply of it conflicts over
/// that label. The primary says so, naming the object, in its `Reconciled`
/// condition (reason `ShardLabelForged`) and a Warning Event, instead of
/// retrying in silence; once the label is removed, the shard writes the
/// object again.
#[tokio::test]
async fn a_forged_shard_label_on_an_owned_object_is_reported_on_its_primary() -> Result<()> {
    let (ns, work) = setup("shard-forged", "good").await?;
    let a = first_shard(&ns, &work, "shard-a", 2).await?;
    let cms: Api<ConfigMap> = ns.api();
    cms.patch(
        "w00-cm",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {SHARD_LABEL: "shard-b"}}})),
    )
    .await?;
    set_value(&ns, &["w00".to_owned(), "w01".to_owned()], "v2").await?;
    let condition = wait_for("w00 reports the forged label", DEADLINE, || async {
        let w = widgets(&ns).get("w00").await?;
        let c = w.data["status"]["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == "Reconciled"))
            .cloned()
            .unwrap_or_default();
        if c["reason"] == "ShardLabelForged" {
            Ok(Some(c))
        } else {
            bail!("{c}")
        }
    })
    .await?;
    let message = condition["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("w00-cm") && message.contains(SHARD_LABEL),
        "{condition}"
    );
    assert_eq!(condition["status"], "False", "{condition}");
    let (_, note) = wasmop_tests::status::wait_event(
        &ns.client,
        &ns.name,
        "w00",
        Some("Warning"),
        "ShardLabelForged",
        DEADLINE,
    )
    .await?;
    assert!(note.contains("w00-cm"), "{note}");
    // The label removed, the shard writes the object again.
    cms.patch(
        "w00-cm",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {SHARD_LABEL: null}}})),
    )
    .await?;
    wait_placed(&ns, &["shard-a"], "v2", DEADLINE).await?;
    drop(a);
    Ok(())
}
