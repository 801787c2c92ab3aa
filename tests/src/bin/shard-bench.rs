//! Sharding benchmark (`tests/bench-shard.sh`): N Widgets (`good` plugin)
//! reconciled by 1, 2 and 4 real `wasmop run --leader-elect --sharding`
//! replicas against the local control plane.
//!
//! For each shard count K, in a namespace of its own:
//! - `converge`: K replicas running and live, N Widgets created → every
//!   Widget labelled and reconciled (its `status.value` is its
//!   `spec.value`); against the floor, a plain client making the same
//!   writes (create, ConfigMap apply, status patch) in the same run;
//! - `rss`: each replica's resident memory after converging (VmRSS, and
//!   its peak VmHWM);
//! - with K ≥ 2, `crash`: one replica SIGKILLed → every Widget it owned
//!   carries a live shard's label and was reconciled by its new owner
//!   (a `reconciled` log line after the kill);
//! - `join`: a new replica started → every Widget the ring gives it
//!   carries its label and was reconciled by it;
//! - `double`: Widgets whose reconciles, in time order over every
//!   replica's log, went back to a shard that had already given them up
//!   (A, B, A): a primary reconciled by two shards at once. Should be 0.
//! - `audit`: the same from the API server's side. The replicas run as a
//!   ServiceAccount whose writes the control plane's audit log records
//!   (`wasmop_tests::audit`); per primary, no shard writes before the
//!   one before it handed it over (acknowledged, or its Lease expired)
//!   and the sharder assigned it. Prints the writes per replica, the
//!   hand-overs of each kind, and the primaries written by two shards at
//!   once. Should be 0.
//!
//! Usage: `shard-bench [N] [K...]` (default 10000, shard counts 1 2 4).
//! Needs `KUBECONFIG` of a control plane from `tests/cluster/up.sh`, the
//! `wasmop` binary beside this one (or `WASMOP_BIN`) and
//! `$WASMOP_PLUGIN_DIR/good.wasm`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use wasmop_tests::TestNamespace;
use wasmop_tests::audit::{AuditedAccount, check_one_writer, widget_of};
use wasmop_tests::operator::shard_command;
use wasmop_tests::widgets::{create_numbered, numbered_widget, widgets_in};

use anyhow::{Context, Result, bail};
use futures::{StreamExt, stream};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, Config};
use serde_json::{Value, json};
use wasmop::controller::shard::{Ring, SHARD_LABEL, live_shards};

/// Lease duration of the replicas.
const LEASE: Duration = Duration::from_secs(5);
/// Concurrent creates (and floor writes).
const CONCURRENCY: usize = 16;
/// Longest any phase may take.
const PHASE_DEADLINE: Duration = Duration::from_secs(1800);

/// The floor: the writes a perfect operator makes for N fresh Widgets
/// (create, ConfigMap apply, status patch), by a plain client.
async fn floor(client: &Client, ns: &str, n: usize) -> Result<Duration> {
    let api = widgets_in(client, ns);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let started = Instant::now();
    let results: Vec<Result<()>> = stream::iter(0..n)
        .map(|i| {
            let (api, cms) = (api.clone(), cms.clone());
            async move {
                let created = api
                    .create(&PostParams::default(), &numbered_widget(i)?)
                    .await?;
                let cm = json!({
                    "apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": format!("w{i}-cm"), "ownerReferences": [{
                        "apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
                        "name": format!("w{i}"), "uid": created.metadata.uid,
                        "controller": true}]},
                    "data": {"value": format!("v{i}")},
                });
                cms.patch(
                    &format!("w{i}-cm"),
                    &PatchParams::apply("floor"),
                    &Patch::Apply(&cm),
                )
                .await?;
                api.patch_status(
                    &format!("w{i}"),
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"value": format!("v{i}")}})),
                )
                .await?;
                Ok(())
            }
        })
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    results.into_iter().collect::<Result<()>>()?;
    Ok(started.elapsed())
}

/// One replica.
struct Replica {
    identity: String,
    child: tokio::process::Child,
    pid: u32,
    log: PathBuf,
}

impl Replica {
    fn start(bin: &Path, work: &Path, ns: &str, identity: &str, kubeconfig: &Path) -> Result<Self> {
        let log = work.join(format!("{identity}.log"));
        let child = shard_command(bin, &work.join("plugins"), ns, identity, LEASE, &log)?
            .arg("--kubeconfig")
            .arg(kubeconfig)
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

    /// VmRSS and VmHWM in MiB.
    fn rss(&self) -> (f64, f64) {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.pid)).unwrap_or_default();
        let kib = |field: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        (kib("VmRSS:") / 1024.0, kib("VmHWM:") / 1024.0)
    }

    /// (time, Widget name) of each `reconciled` line so far.
    fn reconciled(&self) -> Vec<(jiff::Timestamp, String)> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("\"msg\":\"reconciled\""))
            .filter_map(|l| {
                let v: Value = serde_json::from_str(l).ok()?;
                Some((
                    v["ts"].as_str()?.parse().ok()?,
                    v["name"].as_str()?.to_owned(),
                ))
            })
            .collect()
    }

    fn running(&self) -> bool {
        std::fs::read_to_string(&self.log).is_ok_and(|t| t.contains("\"msg\":\"operator running\""))
    }
}

async fn until<F, Fut>(what: &str, mut done: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool>>,
{
    let started = Instant::now();
    loop {
        if done().await? {
            return Ok(());
        }
        if started.elapsed() > PHASE_DEADLINE {
            bail!("{what}: not within {PHASE_DEADLINE:?}");
        }
        // The poll interval of a bounded wait, not a synchronisation.
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn live(client: &Client, ns: &str) -> Result<BTreeSet<String>> {
    let leases = Api::<Lease>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await?;
    Ok(live_shards(&leases.items, jiff::Timestamp::now(), LEASE))
}

/// Name → (uid, shard label, status.value == spec.value).
async fn state(
    api: &Api<DynamicObject>,
) -> Result<BTreeMap<String, (String, Option<String>, bool)>> {
    let mut out = BTreeMap::new();
    let mut lp = ListParams::default().limit(2000);
    loop {
        let page = api.list(&lp).await?;
        for w in &page.items {
            let done = w.data["status"]["value"] == w.data["spec"]["value"];
            out.insert(
                w.metadata.name.clone().unwrap_or_default(),
                (
                    w.metadata.uid.clone().unwrap_or_default(),
                    w.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(SHARD_LABEL).cloned()),
                    done,
                ),
            );
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => lp = lp.continue_token(&c),
            None => break,
        }
    }
    Ok(out)
}

/// Waits until every Widget sits where the ring of `shards` puts it with
/// its status reconciled, and each Widget a replica reconciles for the
/// first time since `since` (all of them unless `only_moved`) was
/// reconciled by it after `since`. Returns how long it took and how many
/// Widgets had a new owner.
async fn placed(
    api: &Api<DynamicObject>,
    replicas: &[Replica],
    shards: &BTreeSet<String>,
    since: jiff::Timestamp,
    only_moved: bool,
) -> Result<(Duration, usize)> {
    let ring = Ring::new(shards.iter().map(String::as_str));
    let started = Instant::now();
    'poll: loop {
        if started.elapsed() > PHASE_DEADLINE {
            bail!("placement not within {PHASE_DEADLINE:?}");
        }
        // The poll interval of a bounded wait, not a synchronisation.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let st = state(api).await?;
        let mut want: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (name, (uid, label, done)) in &st {
            let target = ring.shard_of(uid).context("empty ring")?;
            if label.as_deref() != Some(target) || !done {
                continue 'poll;
            }
            want.entry(target.to_owned())
                .or_default()
                .push(name.clone());
        }
        let mut moved = 0;
        for r in replicas {
            let Some(names) = want.get(&r.identity) else {
                continue;
            };
            let (mut before, mut after) = (BTreeSet::new(), BTreeSet::new());
            for (t, n) in r.reconciled() {
                if t < since {
                    before.insert(n);
                } else {
                    after.insert(n);
                }
            }
            for n in names {
                let new_here = !before.contains(n);
                if only_moved && !new_here {
                    continue;
                }
                if !after.contains(n) {
                    continue 'poll;
                }
                moved += usize::from(new_here);
            }
        }
        return Ok((started.elapsed(), moved));
    }
}

/// Widgets whose reconciles, in time order over all logs, came back to
/// a shard after another shard had reconciled them.
fn double_reconciles(replicas: &[Replica]) -> usize {
    let mut by_name: BTreeMap<String, Vec<(jiff::Timestamp, String)>> = BTreeMap::new();
    for r in replicas {
        for (t, n) in r.reconciled() {
            by_name.entry(n).or_default().push((t, r.identity.clone()));
        }
    }
    for seq in by_name.values_mut() {
        seq.sort();
    }
    by_name
        .values()
        .filter(|seq| {
            let mut done: BTreeSet<&str> = BTreeSet::new();
            let mut current: Option<&str> = None;
            for (_, s) in seq.iter() {
                if current != Some(s.as_str()) {
                    if done.contains(s.as_str()) {
                        return true;
                    }
                    if let Some(c) = current {
                        done.insert(c);
                    }
                    current = Some(s.as_str());
                }
            }
            false
        })
        .count()
}

/// Prints what the API server's audit log says of the replicas' writes
/// ([`check_one_writer`]): writes per replica, hand-overs by
/// acknowledgement and by expiry, and the primaries written by two shards
/// at once (with the first few violations).
fn audit(k: usize, account: &AuditedAccount) -> Result<()> {
    let writes = account.writes()?;
    match check_one_writer(&writes, widget_of, LEASE) {
        Ok(seen) => println!(
            "K={k} audit: {} writes ({:?}), hand-overs {} by acknowledgement and {} by expiry, \
             0 primaries written by two shards at once",
            writes.len(),
            seen.writes,
            seen.acknowledged,
            seen.expired
        ),
        Err(problems) => {
            println!(
                "K={k} audit: {} writes, {} primaries written by two shards at once",
                writes.len(),
                problems.len()
            );
            for p in problems.iter().take(5) {
                println!("K={k} audit:   {p}");
            }
        }
    }
    Ok(())
}

async fn namespace(client: &Client, name: &str) -> Result<()> {
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await?;
    Ok(())
}

async fn run_k(client: &Client, bin: &Path, plugin: &Path, n: usize, k: usize) -> Result<()> {
    let stamp = jiff::Timestamp::now().as_second();
    let test_ns = TestNamespace::new(&format!("shard-bench-{k}")).await?;
    let ns = test_ns.name.clone();
    let work = std::env::temp_dir().join(&ns);
    std::fs::create_dir_all(work.join("plugins"))?;
    std::fs::copy(plugin, work.join("plugins/good.wasm"))?;
    // The replicas run as a ServiceAccount whose writes the API server's
    // audit log records, told apart by their user agents.
    let account = AuditedAccount::create(&test_ns, &work, false).await?;
    let mut replicas = Vec::new();
    for i in 0..k {
        replicas.push(Replica::start(
            bin,
            &work,
            &ns,
            &format!("shard-{i}"),
            &account.kubeconfig,
        )?);
    }
    until("replicas running and live", || async {
        Ok(replicas.iter().all(Replica::running) && live(client, &ns).await?.len() == k)
    })
    .await?;
    let api = widgets_in(client, &ns);
    let since = jiff::Timestamp::now();
    let started = Instant::now();
    create_numbered(&api, n, CONCURRENCY).await?;
    let created = started.elapsed();
    let shards: BTreeSet<String> = replicas.iter().map(|r| r.identity.clone()).collect();
    placed(&api, &replicas, &shards, since, false).await?;
    let converge = started.elapsed();
    let floor_ns = format!("shard-floor-{k}-{stamp}");
    namespace(client, &floor_ns).await?;
    let floor = floor(client, &floor_ns, n).await?;
    println!(
        "K={k} N={n} converge {:.1} s (creates {:.1} s); floor {:.1} s; ratio {:.2}",
        converge.as_secs_f64(),
        created.as_secs_f64(),
        floor.as_secs_f64(),
        converge.as_secs_f64() / floor.as_secs_f64()
    );
    let st = state(&api).await?;
    let per: BTreeMap<String, usize> =
        wasmop::controller::shard::tally(st.values().map(|(_, l, _)| l.as_deref()));
    for r in &replicas {
        let (rss, peak) = r.rss();
        println!(
            "K={k} rss {}: {rss:.0} MiB (peak {peak:.0}), {} primaries",
            r.identity,
            per.get(&r.identity).copied().unwrap_or(0)
        );
    }
    if k >= 2 {
        let mut victim = replicas.pop().context("a replica")?;
        victim.child.start_kill()?;
        victim.child.wait().await?;
        let killed_at = jiff::Timestamp::now();
        let mut survivors: BTreeSet<String> = shards.clone();
        survivors.remove(&victim.identity);
        let (took, moved) = placed(&api, &replicas, &survivors, killed_at, true).await?;
        println!(
            "K={k} crash: {moved} primaries re-homed and reconciled in {:.1} s (bound: lease {:.0} s + 5 s)",
            took.as_secs_f64(),
            LEASE.as_secs_f64()
        );
        replicas.push(victim);
        let joined = Replica::start(bin, &work, &ns, &format!("shard-{k}"), &account.kubeconfig)?;
        let joined_at = jiff::Timestamp::now();
        let mut all = survivors.clone();
        all.insert(joined.identity.clone());
        let victim = replicas.pop().context("victim")?;
        replicas.push(joined);
        let (took, moved) = placed(&api, &replicas, &all, joined_at, true).await?;
        println!(
            "K={k} join: {moved} primaries moved to the new shard and reconciled in {:.1} s (process start included)",
            took.as_secs_f64()
        );
        replicas.push(victim);
    }
    println!("K={k} double reconciles: {}", double_reconciles(&replicas));
    for mut r in replicas {
        let _ = r.child.start_kill();
        let _ = r.child.wait().await;
    }
    audit(k, &account)?;
    // The Widgets' namespace goes with `test_ns`.
    let _ = Api::<Namespace>::all(client.clone())
        .delete(&floor_ns, &Default::default())
        .await;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().context("arguments are numbers"))
        .collect::<Result<_>>()?;
    let n = args.first().copied().unwrap_or(10_000);
    let ks: Vec<usize> = if args.len() > 1 {
        args[1..].to_vec()
    } else {
        vec![1, 2, 4]
    };
    let client = Client::try_from(Config::infer().await?)?;
    wasmop_tests::apply_test_crds(&client).await?;
    let bin = match std::env::var_os("WASMOP_BIN") {
        Some(b) => PathBuf::from(b),
        None => std::env::current_exe()?
            .parent()
            .context("bin dir")?
            .join("wasmop"),
    };
    let plugin = wasmop_tests::operator::plugin_path("good")?;
    for k in ks {
        run_k(&client, &bin, &plugin, n, k).await?;
    }
    Ok(())
}
