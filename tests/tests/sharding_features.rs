//! What else keeps working per shard, against the real local control
//! plane: real `wasmop run --leader-elect --sharding` processes running as
//! a ServiceAccount whose writes the API server audits
//! (`wasmop_tests::audit`), each naming itself in its user agent.
//!
//! Covered: no primary written by two shards at once while primaries move
//! under load (checked from the API server's audit log, not from the
//! replicas' logs); the per-minute deletion budget split over the live
//! shards; admission answered by either shard, with the webhook
//! configuration written by the leader only.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;
use wasmop::controller::shard::{DRAIN_LABEL, Ring, SHARD_LABEL};
use wasmop_tests::audit::{AuditedAccount, Write, check_one_writer, widget_of};
use wasmop_tests::net::{free_port, round_robin};
use wasmop_tests::operator::{plugin_path, shard_command};
use wasmop_tests::status::wait_event;
use wasmop_tests::{TestNamespace, apply_test_crds, wait_for, wasmop_bin};

/// Lease duration of the leader and shard Leases.
const LEASE: Duration = Duration::from_secs(2);
/// Bound for anything to happen (process start, convergence).
const DEADLINE: Duration = Duration::from_secs(90);

/// One `wasmop run --sharding` process, as the audited account.
struct Shard {
    child: tokio::process::Child,
    log: PathBuf,
}

impl Shard {
    async fn start(t: &Setup, identity: &str, extra: &[String]) -> Result<Self> {
        let log = t.work.join(format!("{identity}.log"));
        let child = shard_command(
            &wasmop_bin()?,
            &t.work.join("plugins"),
            &t.ns.name,
            identity,
            LEASE,
            &log,
        )?
        .arg("--kubeconfig")
        .arg(&t.account.kubeconfig)
        .args(["--poll-interval-ms", "300"])
        .args(extra)
        .spawn()
        .context("starting wasmop")?;
        Ok(Self { child, log })
    }

    fn kill(&mut self) -> Result<()> {
        self.child.start_kill()?;
        Ok(())
    }

    fn text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// How many admission requests of `rule` this shard decided (its log).
    fn decided(&self, rule: &str) -> usize {
        self.text()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|l| l["rule"] == rule && l["allowed"].is_boolean())
            .count()
    }
}

/// A namespace with the test CRDs, a plugin directory holding `plugin`
/// (none for `""`), and the audited account the shards run as.
struct Setup {
    ns: TestNamespace,
    work: PathBuf,
    account: AuditedAccount,
}

async fn setup(prefix: &str, plugin: &str, cluster_admin: bool) -> Result<Setup> {
    let ns = TestNamespace::new(prefix).await?;
    apply_test_crds(&ns.client).await?;
    let work = std::env::temp_dir().join(format!("wasmop-{}", ns.name));
    std::fs::create_dir_all(work.join("plugins"))?;
    if !plugin.is_empty() {
        std::fs::copy(
            plugin_path(plugin)?,
            work.join("plugins").join(format!("{plugin}.wasm")),
        )?;
    }
    let account = AuditedAccount::create(&ns, &work, cluster_admin).await?;
    Ok(Setup { ns, work, account })
}

fn api(ns: &TestNamespace, kind: &str, plural: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("test.wasmop.dev", "v1", kind);
    let ar = ApiResource::from_gvk_with_plural(&gvk, plural);
    Api::namespaced_with(ns.client.clone(), &ns.name, &ar)
}

fn label<'a>(o: &'a DynamicObject, key: &str) -> Option<&'a str> {
    o.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

async fn leader(ns: &TestNamespace) -> Result<Option<String>> {
    let lease = Api::<Lease>::namespaced(ns.client.clone(), &ns.name)
        .get_opt("wasmop-leader")
        .await?;
    Ok(lease.and_then(|l| l.spec?.holder_identity))
}

async fn wait_leader(ns: &TestNamespace, who: &str) -> Result<()> {
    wait_for(&format!("{who} leads"), DEADLINE, || async {
        Ok((leader(ns).await?.as_deref() == Some(who)).then_some(()))
    })
    .await
}

/// Waits until every object of `objects` is labelled with its place on the
/// ring of `shards`, without a drain mark, and `done` holds for it.
async fn wait_placed(
    objects: &Api<DynamicObject>,
    shards: &[&str],
    what: &str,
    done: impl Fn(&DynamicObject) -> bool,
) -> Result<BTreeMap<String, String>> {
    let ring = Ring::new(shards.iter().copied());
    wait_for(what, DEADLINE, || async {
        let mut placed = BTreeMap::new();
        for o in objects.list(&ListParams::default()).await?.items {
            let name = o.metadata.name.clone().unwrap_or_default();
            let want = ring
                .shard_of(o.metadata.uid.as_deref().unwrap_or_default())
                .context("empty ring")?;
            if label(&o, SHARD_LABEL) != Some(want) || label(&o, DRAIN_LABEL).is_some() {
                bail!("{name} on {:?}, wanted {want}", label(&o, SHARD_LABEL));
            }
            if !done(&o) {
                bail!("{name} not done: {}", o.data["status"]);
            }
            placed.insert(name, want.to_owned());
        }
        Ok(Some(placed))
    })
    .await
}

/// Waits until every Widget is placed on the ring of `shards` and each of
/// the `n` ConfigMaps `wNN-cm` holds `value`.
async fn converged(ns: &TestNamespace, shards: &[&str], n: usize, value: &str) -> Result<()> {
    wait_placed(
        &api(ns, "Widget", "widgets"),
        shards,
        "Widgets placed",
        |_| true,
    )
    .await?;
    let cms: Api<ConfigMap> = ns.api();
    wait_for(
        &format!("every ConfigMap holds {value}"),
        DEADLINE,
        || async {
            for i in 0..n {
                let cm = cms.get_opt(&format!("w{i:02}-cm")).await?;
                let got = cm.and_then(|c| c.data?.get("value").cloned());
                ensure!(got.as_deref() == Some(value), "w{i:02}-cm holds {got:?}");
            }
            Ok(Some(()))
        },
    )
    .await
}

/// Widgets `w00`… whose spec.value is edited over and over by a
/// background task (the load) while shards join and crash; the API
/// server's audit log shows that no Widget was written by two shards
/// without a hand-over between, by acknowledgement and by expiry.
#[tokio::test]
async fn no_primary_is_written_by_two_shards_at_once_while_they_move_under_load() -> Result<()> {
    const WIDGETS: usize = 16;
    let t = setup("shardf-audit", "good", false).await?;
    let widgets = api(&t.ns, "Widget", "widgets");
    let _a = Shard::start(&t, "shard-a", &[]).await?;
    wait_leader(&t.ns, "shard-a").await?;
    let mut b = Shard::start(&t, "shard-b", &[]).await?;
    create_widgets(&t.ns, WIDGETS).await?;
    converged(&t.ns, &["shard-a", "shard-b"], WIDGETS, "v0").await?;
    // The load: every Widget edited in turn, as fast as the API answers.
    let stop = Arc::new(AtomicBool::new(false));
    let edits = Arc::new(AtomicUsize::new(0));
    let load = {
        let (widgets, stop, edits) = (widgets.clone(), stop.clone(), edits.clone());
        tokio::spawn(async move {
            let mut n = 0usize;
            while !stop.load(Ordering::SeqCst) {
                let name = format!("w{:02}", n % WIDGETS);
                let patch = json!({"spec": {"value": format!("load-{n}")}});
                if widgets
                    .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
                    .await
                    .is_ok()
                {
                    edits.fetch_add(1, Ordering::SeqCst);
                }
                n += 1;
            }
        })
    };
    // A third shard joins (hand-overs by acknowledgement) ...
    let _c = Shard::start(&t, "shard-c", &[]).await?;
    wait_placed(
        &widgets,
        &["shard-a", "shard-b", "shard-c"],
        "Widgets on three shards",
        |_| true,
    )
    .await?;
    // ... and one crashes (hand-overs once its Lease expired).
    b.kill()?;
    wait_placed(
        &widgets,
        &["shard-a", "shard-c"],
        "Widgets back on two shards",
        |_| true,
    )
    .await?;
    stop.store(true, Ordering::SeqCst);
    load.await?;
    ensure!(edits.load(Ordering::SeqCst) > WIDGETS, "the load edited");
    for i in 0..WIDGETS {
        widgets
            .patch(
                &format!("w{i:02}"),
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"value": "end"}})),
            )
            .await?;
    }
    converged(&t.ns, &["shard-a", "shard-c"], WIDGETS, "end").await?;

    let writes = t.account.writes()?;
    let seen = match check_one_writer(&writes, widget_of, LEASE) {
        Ok(seen) => seen,
        Err(problems) => bail!(
            "primaries written by two shards at once:\n{}",
            problems.join("\n")
        ),
    };
    eprintln!("audited writes: {seen:?}");
    for shard in ["shard-a", "shard-b", "shard-c"] {
        ensure!(
            seen.writes.get(shard).copied().unwrap_or(0) > 0,
            "the audit log names {shard} as a writer: {:?}",
            seen.writes
        );
    }
    ensure!(
        seen.acknowledged > 0,
        "hand-overs by acknowledgement were checked: {seen:?}"
    );
    ensure!(
        seen.expired > 0,
        "hand-overs after the crashed shard's Lease expired were checked: {seen:?}"
    );
    Ok(())
}

/// The state of a Fanout's `Reconciled` condition at its generation.
fn reconciled_reason(f: &DynamicObject) -> Option<String> {
    let c = f.data["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Reconciled")?;
    (c["observedGeneration"].as_i64() == f.metadata.generation)
        .then(|| c["reason"].as_str().unwrap_or_default().to_owned())
}

/// `maxDeletesPerMinute: 8` over two shards: each enforces ceil(8/2) = 4.
/// Eight Fanouts each want to delete 2 ConfigMaps (16 in all): the API
/// server saw at most 4 deletes per shard and 8 in all, and the plans
/// that did not fit are rejected with DeletionBudgetExceeded (condition
/// and Warning Event). Without the split each shard would delete up to 8.
#[tokio::test]
async fn the_per_minute_deletion_budget_is_split_over_the_live_shards() -> Result<()> {
    const FANOUTS: usize = 8;
    const BUDGET: usize = 8;
    let t = setup("shardf-budget", "fanout", false).await?;
    let config = t.work.join("config.yaml");
    std::fs::write(
        &config,
        format!("plugins: {{fanout: {{maxDeletesPerMinute: {BUDGET}}}}}\n"),
    )?;
    let extra = ["--config".to_owned(), config.display().to_string()];
    let _a = Shard::start(&t, "shard-a", &extra).await?;
    wait_leader(&t.ns, "shard-a").await?;
    let _b = Shard::start(&t, "shard-b", &extra).await?;
    let fanouts = api(&t.ns, "Fanout", "fanouts");
    for i in 0..FANOUTS {
        let f: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "test.wasmop.dev/v1", "kind": "Fanout",
            "metadata": {"name": format!("f{i}")}, "spec": {"count": 4},
        }))?;
        fanouts.create(&PostParams::default(), &f).await?;
    }
    let placed = wait_placed(
        &fanouts,
        &["shard-a", "shard-b"],
        "Fanouts placed, 4 ConfigMaps each",
        |f| f.data["status"]["count"] == 4 && reconciled_reason(f).as_deref() == Some("Reconciled"),
    )
    .await?;
    let per_shard = |s: &str| placed.values().filter(|o| *o == s).count();
    ensure!(
        per_shard("shard-a") > 0 && per_shard("shard-b") > 0,
        "both shards own Fanouts: {placed:?}"
    );
    let before = t.account.writes()?.len();
    for i in 0..FANOUTS {
        fanouts
            .patch(
                &format!("f{i}"),
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"count": 2}})),
            )
            .await?;
    }
    let reasons = wait_for(
        "every Fanout decided: deleted or rejected",
        DEADLINE,
        || async {
            let mut reasons = BTreeMap::new();
            for f in fanouts.list(&ListParams::default()).await?.items {
                match reconciled_reason(&f) {
                    Some(r) if r == "Reconciled" || r == "PlanRejected" => {
                        reasons.insert(f.metadata.name.clone().unwrap_or_default(), r);
                    }
                    other => bail!("{:?}: {other:?}", f.metadata.name),
                }
            }
            Ok(Some(reasons))
        },
    )
    .await?;
    let rejected: Vec<&String> = reasons
        .iter()
        .filter(|(_, r)| *r == "PlanRejected")
        .map(|(n, _)| n)
        .collect();
    ensure!(
        !rejected.is_empty(),
        "{} deletes wanted against a budget of {BUDGET}: some plans are rejected: {reasons:?}",
        2 * FANOUTS
    );
    let f = fanouts.get(rejected[0]).await?;
    let message = f.data["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Reconciled"))
        .and_then(|c| c["message"].as_str())
        .unwrap_or_default()
        .to_owned();
    ensure!(
        message.contains("DeletionBudgetExceeded") && message.contains("maxDeletesPerMinute"),
        "{message}"
    );
    let (_, note) = wait_event(
        &t.ns.client,
        &t.ns.name,
        rejected[0],
        Some("Warning"),
        "PlanRejected",
        DEADLINE,
    )
    .await?;
    ensure!(note.contains("DeletionBudgetExceeded"), "{note}");
    // The deletes as the API server saw them, per shard.
    let mut deletes: BTreeMap<String, usize> = BTreeMap::new();
    for w in t.account.writes()?.iter().skip(before) {
        if w.verb == "delete" && w.resource == "configmaps" && (200..300).contains(&w.code) {
            *deletes.entry(w.replica.clone()).or_insert(0) += 1;
        }
    }
    eprintln!("deletes per shard: {deletes:?}; decisions: {reasons:?}");
    let share = BUDGET.div_ceil(2);
    for (shard, n) in &deletes {
        ensure!(
            *n <= share,
            "{shard} deleted {n}, more than its share {share}: {deletes:?}"
        );
    }
    let total: usize = deletes.values().sum();
    ensure!(
        total <= BUDGET && total > 0,
        "cluster-wide deletes {total} within the budget {BUDGET}: {deletes:?}"
    );
    // What the API server holds agrees: every accepted plan deleted 2.
    let cms: Api<ConfigMap> = t.ns.api();
    let left = cms.list_metadata(&ListParams::default()).await?.items.len();
    let accepted = reasons.values().filter(|r| *r == "Reconciled").count();
    let fanned = FANOUTS * 4 - accepted * 2;
    ensure!(
        left >= fanned,
        "{left} ConfigMaps left, {fanned} fanned out expected at least"
    );
    Ok(())
}

/// Two shards serving admission for `t`'s plugin behind one round-robin
/// front (a Service in front of the replicas), shard-a leading; the
/// connections each got.
struct Admitting {
    a: Shard,
    b: Shard,
    _counts: Arc<Vec<AtomicUsize>>,
    configuration: String,
}

async fn admitting(t: &Setup) -> Result<Admitting> {
    let configuration = format!("wasmop-admission-{}", t.ns.name);
    let front = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let front_port = front.local_addr()?.port();
    let ports = [free_port()?, free_port()?];
    let flags = |port: u16| -> Vec<String> {
        [
            "--admission-port",
            &port.to_string(),
            "--admission-bind",
            "127.0.0.1",
            "--admission-namespace",
            &t.ns.name,
            "--admission-url",
            &format!("https://127.0.0.1:{front_port}"),
            "--admission-webhook-config",
            &configuration,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let a = Shard::start(t, "shard-a", &flags(ports[0])).await?;
    wait_leader(&t.ns, "shard-a").await?;
    let b = Shard::start(t, "shard-b", &flags(ports[1])).await?;
    // A replica serves admission once its plugins are loaded; until then
    // the front's connection to it fails. Under load shard-b can take
    // seconds more than shard-a to compile the plugin.
    wait_for("both shards running their plugins", DEADLINE, || async {
        Ok([&a, &b]
            .iter()
            .all(|s| s.text().contains("operator running"))
            .then_some(()))
    })
    .await?;
    let counts = round_robin(front, ports.to_vec());
    Ok(Admitting {
        a,
        b,
        _counts: counts,
        configuration,
    })
}

fn widget(name: &str, value: &str) -> Result<DynamicObject> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
        "metadata": {"name": name}, "spec": {"value": value},
    }))?)
}

/// Sends 8 concurrent dry-run creates of the Widgets `make(i)` names
/// until both shards decided requests of `rule` (their logs say so).
/// Every answer must satisfy `expect`: one that does not fails at once
/// (it is not tried again).
async fn through_both(
    widgets: &Api<DynamicObject>,
    on: &Admitting,
    rule: &str,
    make: impl Fn(usize) -> (String, String),
    expect: impl Fn(&str, &Result<DynamicObject, kube::Error>) -> bool,
) -> Result<()> {
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let wrong = std::sync::Mutex::new(Vec::new());
    let answered = AtomicUsize::new(0);
    let (make, expect, dry, wrong_ref, answered_ref) = (&make, &expect, &dry, &wrong, &answered);
    wait_for("both shards answer admission", DEADLINE, || async move {
        let round = async move {
            let calls = (0..8).map(|i| async move {
                let (name, value) = make(i);
                let got = widgets.create(dry, &widget(&name, &value)?).await;
                anyhow::Ok((name, got))
            });
            let mut n = 0;
            for answer in futures::future::join_all(calls).await {
                let (name, got) = answer?;
                n += 1;
                if !expect(&name, &got) {
                    wrong_ref
                        .lock()
                        .expect("lock")
                        .push(format!("{name}: answered {got:?}"));
                }
            }
            anyhow::Ok(n)
        };
        answered_ref.fetch_add(round.await?, Ordering::SeqCst);
        if !wrong_ref.lock().expect("lock").is_empty() {
            return Ok(Some(()));
        }
        let per = [on.a.decided(rule), on.b.decided(rule)];
        ensure!(
            per.iter().all(|n| *n > 0),
            "requests decided per shard: {per:?}"
        );
        Ok(Some(()))
    })
    .await?;
    let wrong = wrong.into_inner().expect("lock");
    ensure!(
        wrong.is_empty(),
        "wrong answers ({} of {}):\n{}",
        wrong.len(),
        answered.load(Ordering::SeqCst),
        wrong.join("\n")
    );
    Ok(())
}

/// Waits until the API server calls the webhook: a dry-run create of
/// `name` holding `value` is refused with `text` (by either shard).
async fn wait_refused(
    widgets: &Api<DynamicObject>,
    name: &str,
    value: &str,
    text: &str,
) -> Result<()> {
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    wait_for("the webhook to refuse", DEADLINE, || async {
        let got = widgets.create(&dry, &widget(name, value)?).await;
        Ok(denied_with(&got, text).then_some(()))
    })
    .await
}

fn denied_with(got: &Result<DynamicObject, kube::Error>, text: &str) -> bool {
    matches!(got, Err(kube::Error::Api(e)) if e.message.contains(text))
}

/// Two shards both serving admission behind one front: a denied Widget is
/// denied and an allowed one admitted whichever shard answers (each got
/// connections), and the webhook configuration is written only by the
/// replica holding the leader Lease, as the API server's audit log shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn either_shard_answers_admission_and_only_the_leader_writes_the_configuration() -> Result<()>
{
    let t = setup("shardf-admit", "admitter", true).await?;
    let on = admitting(&t).await?;
    let run = async {
        let widgets = api(&t.ns, "Widget", "widgets");
        wait_refused(&widgets, "deny-probe", "v1", admitter::DENIAL).await?;
        through_both(
            &widgets,
            &on,
            admitter::RULE,
            |i| {
                let name = if i % 2 == 0 { "deny" } else { "fine" };
                (format!("{name}-{i}"), "v1".to_owned())
            },
            |name, got| {
                if name.starts_with("deny-") {
                    denied_with(got, admitter::DENIAL)
                } else {
                    got.is_ok()
                }
            },
        )
        .await?;
        // Real (not dry-run) creates: the allowed one is there, reconciled
        // by its shard; the denied one is not.
        widgets
            .create(&PostParams::default(), &widget("fine-real", "v1")?)
            .await?;
        let err = widgets
            .create(&PostParams::default(), &widget("deny-real", "v1")?)
            .await
            .expect_err("denied");
        ensure!(err.to_string().contains(admitter::DENIAL), "{err}");
        ensure!(widgets.get_opt("deny-real").await?.is_none());
        wait_placed(
            &widgets,
            &["shard-a", "shard-b"],
            "fine-real placed",
            |_| true,
        )
        .await?;
        let config_writes: Vec<Write> = t
            .account
            .writes()?
            .into_iter()
            .filter(|w| {
                w.resource == "validatingwebhookconfigurations" && w.name == on.configuration
            })
            .collect();
        ensure!(
            !config_writes.is_empty(),
            "the configuration was written (audited)"
        );
        let writers: std::collections::BTreeSet<&str> =
            config_writes.iter().map(|w| w.replica.as_str()).collect();
        ensure!(
            writers == ["shard-a"].into(),
            "only the leader shard-a writes the configuration: {writers:?}\nshard-b: {}",
            on.b.text()
        );
        anyhow::Ok(())
    };
    let result = run.await;
    wasmop_tests::admission::delete_configuration(&t.ns.client, &on.configuration).await?;
    drop(on);
    result
}

/// An admission rule reading Widgets from the cache (`unique-admitter`:
/// a value another Widget holds is refused) while each shard's Widget
/// cache holds only its own Widgets: the host reads a label-filtered cache
/// from the API server instead, so a duplicate is refused whichever shard
/// answers, also the shard that does not own the Widget holding the value.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cached_admission_read_is_whole_on_every_shard() -> Result<()> {
    let t = setup("shardf-unique", "unique-admitter", true).await?;
    let on = admitting(&t).await?;
    let run = async {
        let widgets = api(&t.ns, "Widget", "widgets");
        widgets
            .create(&PostParams::default(), &widget("holder", "taken")?)
            .await?;
        let placed =
            wait_placed(&widgets, &["shard-a", "shard-b"], "holder placed", |_| true).await?;
        eprintln!("holder is on {}", placed["holder"]);
        // The webhook is called once one shard refuses a duplicate.
        wait_refused(&widgets, "dup-probe", "taken", unique_admitter::DENIAL).await?;
        // Only duplicates: whichever shard answers must refuse them.
        through_both(
            &widgets,
            &on,
            unique_admitter::RULE,
            |i| (format!("dup-{i}"), "taken".to_owned()),
            |_, got| denied_with(got, unique_admitter::DENIAL),
        )
        .await?;
        anyhow::Ok(())
    };
    let result = run.await;
    wasmop_tests::admission::delete_configuration(&t.ns.client, &on.configuration).await?;
    drop(on);
    result
}

/// `GET path` on a loopback port over plain HTTP/1.0; the body.
async fn http_get(port: u16, path: &str) -> Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .await?;
    let mut text = String::new();
    stream.read_to_string(&mut text).await?;
    let (head, body) = text.split_once("\r\n\r\n").context("no HTTP head")?;
    ensure!(
        head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200"),
        "{head}"
    );
    Ok(body.to_owned())
}

/// Waits until both shard Leases are held, so the sharder's rounds place
/// new primaries over both from the start.
async fn wait_both_live(ns: &TestNamespace) -> Result<()> {
    let leases = Api::<Lease>::namespaced(ns.client.clone(), &ns.name);
    wait_for("both shard Leases held", DEADLINE, || async {
        for id in ["shard-a", "shard-b"] {
            let held = leases
                .get_opt(&wasmop::controller::shard::lease_name(id))
                .await?
                .and_then(|l| l.spec?.holder_identity);
            ensure!(held.as_deref() == Some(id), "{id}'s Lease: {held:?}");
        }
        Ok(Some(()))
    })
    .await
}

/// `shard-a`, the leader, then `shard-b`, each with `flags(identity)`,
/// both holding their shard Leases.
async fn two_shards(t: &Setup, flags: impl Fn(&str) -> Vec<String>) -> Result<(Shard, Shard)> {
    let a = Shard::start(t, "shard-a", &flags("shard-a")).await?;
    wait_leader(&t.ns, "shard-a").await?;
    let b = Shard::start(t, "shard-b", &flags("shard-b")).await?;
    wait_both_live(&t.ns).await?;
    Ok((a, b))
}

/// `n` Widgets created, placed on the two shards and reconciled by the
/// first version (`v1`): which shard got each.
async fn widgets_placed_at_v1(t: &Setup, n: usize) -> Result<BTreeMap<String, String>> {
    create_widgets(&t.ns, n).await?;
    let widgets = api(&t.ns, "Widget", "widgets");
    let placed = wait_placed(&widgets, &["shard-a", "shard-b"], "Widgets placed", |_| {
        true
    })
    .await?;
    wait_cm_version(&t.ns, n, "v1").await?;
    Ok(placed)
}

async fn create_widgets(ns: &TestNamespace, n: usize) -> Result<()> {
    let widgets = api(ns, "Widget", "widgets");
    for i in 0..n {
        widgets
            .create(&PostParams::default(), &widget(&format!("w{i:02}"), "v0")?)
            .await?;
    }
    Ok(())
}

/// Waits until every ConfigMap `wNN-cm` carries the version label `v`.
async fn wait_cm_version(ns: &TestNamespace, n: usize, v: &str) -> Result<()> {
    let cms: Api<ConfigMap> = ns.api();
    wait_for(
        &format!("every ConfigMap written by {v}"),
        DEADLINE,
        || async {
            for i in 0..n {
                let cm = cms.get_opt(&format!("w{i:02}-cm")).await?;
                let got =
                    cm.and_then(|c| c.metadata.labels?.get("test.wasmop.dev/version").cloned());
                ensure!(got.as_deref() == Some(v), "w{i:02}-cm has version {got:?}");
            }
            Ok(Some(()))
        },
    )
    .await
}

/// Names of the primaries `owner` holds in `placed`.
fn owned_by(placed: &BTreeMap<String, String>, owner: &str) -> std::collections::BTreeSet<String> {
    placed
        .iter()
        .filter(|(_, o)| *o == owner)
        .map(|(n, _)| n.clone())
        .collect()
}

/// The plugin comes from a tag in a loopback registry, polled by both
/// shards: a push of a new version under the tag reaches both, and each
/// shard's primaries are rewritten by the new digest by that shard alone
/// (the API server's audit log).
#[tokio::test]
async fn a_tag_push_reaches_every_shard_and_each_rewrites_its_own_primaries() -> Result<()> {
    const WIDGETS: usize = 16;
    let t = setup("shardf-oci", "", false).await?;
    let registry = wasmop_tests::registry::Registry::start().await?;
    let reference = format!("oci://{}/wasmop/good:stable", registry.host);
    let push = |file: PathBuf| {
        let argv = vec![
            "wasmop".to_owned(),
            "push".to_owned(),
            file.display().to_string(),
            reference.clone(),
            "--insecure-registry".to_owned(),
            registry.host.clone(),
        ];
        async move {
            use clap::Parser;
            let cli = wasmop::cli::Cli::try_parse_from(&argv)?;
            let code = tokio::task::spawn_blocking(move || wasmop::cli::execute(cli)).await??;
            ensure!(code == std::process::ExitCode::SUCCESS, "push failed");
            anyhow::Ok(())
        }
    };
    push(plugin_path("good")?).await?;
    let flags = |id: &str| -> Vec<String> {
        vec![
            "--plugins".into(),
            reference.clone(),
            "--insecure-registry".into(),
            registry.host.clone(),
            "--oci-poll-interval-ms".into(),
            "300".into(),
            "--oci-cache".into(),
            t.work.join(format!("{id}-oci")).display().to_string(),
        ]
    };
    let _shards = two_shards(&t, |id| flags(id)).await?;
    let placed = widgets_placed_at_v1(&t, WIDGETS).await?;
    for s in ["shard-a", "shard-b"] {
        ensure!(
            !owned_by(&placed, s).is_empty(),
            "{s} owns Widgets: {placed:?}"
        );
    }
    let before = t.account.writes()?.len();
    push(plugin_path("good-v2")?).await?;
    wait_cm_version(&t.ns, WIDGETS, "v2").await?;
    // Who rewrote each ConfigMap after the push: its Widget's shard only.
    let mut by: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
    for w in t.account.writes()?.iter().skip(before) {
        if w.resource == "configmaps" && (200..300).contains(&w.code) {
            by.entry(w.replica.clone())
                .or_default()
                .insert(w.name.strip_suffix("-cm").unwrap_or(&w.name).to_owned());
        }
    }
    for s in ["shard-a", "shard-b"] {
        ensure!(
            by.get(s) == Some(&owned_by(&placed, s)),
            "{s} rewrote {:?}, owns {:?}",
            by.get(s),
            owned_by(&placed, s)
        );
    }
    ensure!(by.len() == 2, "only the shards wrote: {by:?}");
    Ok(())
}

/// `--record` and a shadow candidate (`good.shadow.wasm`, version 0.2.0)
/// on two shards: each shard records exactly the reconciles of its own
/// primaries, and its `/shadow` lists differences for its own primaries
/// only.
#[tokio::test]
async fn each_shard_records_and_shadows_only_its_own_primaries() -> Result<()> {
    const WIDGETS: usize = 16;
    let t = setup("shardf-rec", "good", false).await?;
    std::fs::copy(
        plugin_path("good-v2")?,
        t.work.join("plugins/good.shadow.wasm"),
    )?;
    let ports = [free_port()?, free_port()?];
    let flags = |id: &str, port: u16| -> Vec<String> {
        vec![
            "--record".into(),
            t.work.join(format!("{id}-rec")).display().to_string(),
            "--metrics-addr".into(),
            format!("127.0.0.1:{port}"),
        ]
    };
    let _shards = two_shards(&t, |id| {
        flags(id, if id == "shard-a" { ports[0] } else { ports[1] })
    })
    .await?;
    let placed = widgets_placed_at_v1(&t, WIDGETS).await?;
    let ns = &t.ns.name;
    for (s, port) in ["shard-a", "shard-b"].iter().zip(ports) {
        let own = owned_by(&placed, s);
        ensure!(!own.is_empty(), "{s} owns Widgets: {placed:?}");
        // Every reconcile of its own primaries recorded, none of another's.
        let recorded = wait_for(&format!("{s}'s recordings"), DEADLINE, || async {
            let mut names = std::collections::BTreeSet::new();
            for e in std::fs::read_dir(t.work.join(format!("{s}-rec")))? {
                let file = e?.file_name().to_string_lossy().into_owned();
                if let Some(rest) = file.strip_suffix(".json")
                    && let Some((_, name)) = rest.split_once(&format!("-{ns}-"))
                {
                    names.insert(name.to_owned());
                }
            }
            ensure!(
                names.is_superset(&own),
                "{s} recorded {names:?}, owns {own:?}"
            );
            Ok(Some(names))
        })
        .await?;
        ensure!(
            recorded == own,
            "{s} recorded {recorded:?}, owns only {own:?}"
        );
        // Its /shadow: differences (v1 → v2 labels) of its own primaries.
        let shown = wait_for(&format!("{s}'s /shadow"), DEADLINE, || async {
            let report: serde_json::Value =
                serde_json::from_str(&http_get(port, "/shadow").await?)?;
            let primaries: std::collections::BTreeSet<String> = report["latest"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|d| {
                    d["primary"]
                        .as_str()?
                        .strip_prefix(&format!("{ns}/"))
                        .map(str::to_owned)
                })
                .collect();
            ensure!(
                !primaries.is_empty(),
                "{s} shows no difference yet: {report}"
            );
            Ok(Some(primaries))
        })
        .await?;
        ensure!(
            shown.is_subset(&own),
            "{s}'s /shadow lists {shown:?}, owns only {own:?}"
        );
    }
    Ok(())
}

/// What a person's write of `patch` onto object `name` of `objects` got:
/// refused by the shard label policy (its message), or accepted.
async fn person_writes(
    objects: &Api<DynamicObject>,
    name: &str,
    patch: serde_json::Value,
) -> Result<String> {
    match objects
        .patch(name, &PatchParams::default(), &Patch::Merge(patch.clone()))
        .await
    {
        Err(kube::Error::Api(e)) if e.message.contains("only the wasmop operator") => Ok(e.message),
        other => bail!("{patch} on {name}: not refused by the policy: {other:?}"),
    }
}

/// The shard label policy as shipped (`deploy/shard-label-policy.yaml`),
/// for the shards' account and bound to this test's namespace only. A
/// person's relabel of a primary to the other live shard, a removal of its
/// label, a drain mark, a Widget created with a shard label, and a relabel
/// of an owned ConfigMap are refused by the API server with the policy's
/// message, and the primary stays where it was; the operator's own
/// assignments, drains, acknowledgements and claims pass while a shard
/// joins.
#[tokio::test]
async fn only_the_operator_sets_shard_labels_where_the_label_policy_is_installed() -> Result<()> {
    const WIDGETS: usize = 16;
    let t = setup("shardf-policy", "good", false).await?;
    let name = format!("wasmop-shard-labels-{}", t.ns.name);
    let policy = wasmop_tests::policy::Policy::shard_labels(
        &t.ns.client,
        &name,
        &t.account.user,
        &t.ns.name,
    )
    .await?;
    let cms_dynamic: Api<DynamicObject> = Api::namespaced_with(
        t.ns.client.clone(),
        &t.ns.name,
        &ApiResource::from_gvk(&GroupVersionKind::gvk("", "v1", "ConfigMap")),
    );
    let probe: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "probe", "labels": {SHARD_LABEL: "x"}},
    }))?;
    policy
        .wait_enforced("only the wasmop operator", || async {
            let pp = PostParams {
                dry_run: true,
                ..PostParams::default()
            };
            cms_dynamic.create(&pp, &probe).await.map(|_| ())
        })
        .await?;
    let widgets = api(&t.ns, "Widget", "widgets");
    let _a = Shard::start(&t, "shard-a", &[]).await?;
    wait_leader(&t.ns, "shard-a").await?;
    create_widgets(&t.ns, WIDGETS).await?;
    converged(&t.ns, &["shard-a"], WIDGETS, "v0").await?;
    // The operator's moves pass: a join drains, acknowledges, assigns and
    // claims owned objects.
    let _b = Shard::start(&t, "shard-b", &[]).await?;
    converged(&t.ns, &["shard-a", "shard-b"], WIDGETS, "v0").await?;
    let placed = wait_placed(&widgets, &["shard-a", "shard-b"], "Widgets placed", |_| {
        true
    })
    .await?;
    let (on_a, _) = placed
        .iter()
        .find(|(_, s)| *s == "shard-a")
        .context("a Widget on shard-a")?;
    // A person's writes are refused.
    let message = person_writes(
        &widgets,
        on_a,
        json!({"metadata": {"labels": {SHARD_LABEL: "shard-b"}}}),
    )
    .await?;
    ensure!(
        message.contains(SHARD_LABEL) || message.contains("shard.wasmop.dev/*"),
        "{message}"
    );
    person_writes(
        &widgets,
        on_a,
        json!({"metadata": {"labels": {SHARD_LABEL: null}}}),
    )
    .await?;
    person_writes(
        &widgets,
        on_a,
        json!({"metadata": {"labels": {DRAIN_LABEL: "true"}}}),
    )
    .await?;
    person_writes(
        &cms_dynamic,
        &format!("{on_a}-cm"),
        json!({"metadata": {"labels": {SHARD_LABEL: "shard-b"}}}),
    )
    .await?;
    let forged = widget("forged", "v0")?;
    let mut forged = serde_json::to_value(forged)?;
    forged["metadata"]["labels"] = json!({SHARD_LABEL: "shard-b"});
    match widgets
        .create(&PostParams::default(), &serde_json::from_value(forged)?)
        .await
    {
        Err(kube::Error::Api(e)) if e.message.contains("only the wasmop operator") => {}
        other => bail!("a Widget created with a shard label: {other:?}"),
    }
    // Labels of their own are the person's to write.
    widgets
        .patch(
            on_a,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"team": "x"}}})),
        )
        .await?;
    let w = widgets.get(on_a).await?;
    ensure!(
        label(&w, SHARD_LABEL) == Some("shard-a"),
        "{:?}",
        w.metadata.labels
    );
    policy.remove().await?;
    Ok(())
}

/// With `--sharding`, the rollout analysis counts every shard's
/// reconciles. The candidate (`good-pruner`, which deletes its Widgets'
/// ConfigMaps) is routed only to Widgets labelled `canary=yes`, and only
/// the Widgets of the shard that does not lead carry it: the candidate
/// fails (deletes) only on another shard's primaries than the leader's,
/// and the rollout is rolled back all the same, by that shard's deletes,
/// which it published in the rollout's status. Without them the leader
/// saw no candidate reconcile at all, and the step waited forever.
#[tokio::test]
async fn a_candidate_that_fails_only_on_another_shards_primaries_is_rolled_back() -> Result<()> {
    const WIDGETS: usize = 16;
    let t = setup("shardf-rollout", "good", true).await?;
    wasmop_tests::apply_crd_files(
        &t.ns.client,
        &[wasmop_tests::repo_root().join("crds/wasmop.dev_pluginrollouts.yaml")],
    )
    .await?;
    let extra = [
        "--rollout-interval-ms".to_owned(),
        "200".to_owned(),
        "--rollout-selector".to_owned(),
        format!("wasmop.dev/test={}", t.ns.name),
    ];
    let _a = Shard::start(&t, "shard-a", &extra).await?;
    wait_leader(&t.ns, "shard-a").await?;
    let _b = Shard::start(&t, "shard-b", &extra).await?;
    create_widgets(&t.ns, WIDGETS).await?;
    converged(&t.ns, &["shard-a", "shard-b"], WIDGETS, "v0").await?;
    let widgets = api(&t.ns, "Widget", "widgets");
    let placed = wait_placed(&widgets, &["shard-a", "shard-b"], "Widgets placed", |_| {
        true
    })
    .await?;
    let canaries = owned_by(&placed, "shard-b");
    ensure!(
        !canaries.is_empty() && canaries.len() < WIDGETS,
        "both shards own Widgets: {placed:?}"
    );
    for w in &canaries {
        widgets
            .patch(
                w,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"canary": "yes"}}})),
            )
            .await?;
    }
    std::fs::copy(
        plugin_path("good-pruner")?,
        t.work.join("plugins").join("good.shadow.wasm"),
    )?;
    let rollouts: Api<DynamicObject> = Api::all_with(
        t.ns.client.clone(),
        &wasmop::controller::rollout::rollout_resource(),
    );
    let name = format!("{}-pruner", t.ns.name);
    let rollout: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "wasmop.dev/v1alpha1", "kind": "PluginRollout",
        "metadata": {"name": name, "labels": {"wasmop.dev/test": t.ns.name}},
        "spec": {
            "plugin": "good",
            "holdSeconds": 1,
            "analysis": {"errors": 1, "p99CallSeconds": 30, "cpuSecondsPerCall": 5},
            "shadow": {"reconciles": 1, "analyze": false},
            "steps": [{"percent": 100, "selector": "canary=yes"}, {"percent": 100}],
        },
    }))?;
    rollouts.create(&PostParams::default(), &rollout).await?;
    let st = wait_for("the rollout rolled back", DEADLINE, || async {
        let st = rollouts.get(&name).await?.data["status"].clone();
        ensure!(st["phase"] != "Promoted", "promoted: {st}");
        if st["phase"] == "RolledBack" {
            Ok(Some(st))
        } else {
            bail!("{st}")
        }
    })
    .await?;
    ensure!(st["step"] == 1, "rolled back at the canary step: {st}");
    let message = st["conditions"][0]["message"].as_str().unwrap_or_default();
    ensure!(message.contains("deletesPerMinute"), "{st}");
    ensure!(
        st["candidate"]["deletes"].as_u64().unwrap_or(0) > 0,
        "the candidate's deletes counted: {st}"
    );
    ensure!(
        st["shards"]["shard-b"]["candidate"]["deletes"]
            .as_u64()
            .unwrap_or(0)
            > 0,
        "shard-b published the deletes it counted: {st}"
    );
    // The current version gives the canaries their ConfigMaps back.
    wait_cm_version(&t.ns, WIDGETS, "v1").await?;
    Ok(())
}
