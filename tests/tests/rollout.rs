//! Staged plugin rollouts against the real local control plane: a
//! `PluginRollout` takes the candidate `good.shadow.wasm` through a shadow
//! step and canary steps on a growing share of the Widgets (by the stable
//! bucket of their UID) to promotion; a candidate that deletes what it
//! should not (`good-pruner`) is rolled back by itself, by its shadow
//! differences or, with shadow analysis off, by its deletes at the first
//! canary step; a rollout goes on across a leader change and an operator
//! restart; a candidate comes by OCI digest; a paused step holds; a rollout that
//! cannot be followed says why and routes nothing. The undo and the status
//! go through the `wasmop rollout` command. Windows are short (a step holds
//! about a second); nothing sleeps to synchronise.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use http::Method;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use serde_json::{Value, json};
use wasmop::LoadOptions;
use wasmop::controller::OperatorConfig;
use wasmop::controller::leader::LeaderConfig;
use wasmop::controller::rollout::rollout_resource;
use wasmop::delivery::hotswap::{OptionsFor, PluginDir};
use wasmop::rollout::bucket;
use wasmop_tests::interpose::Interposer;
use wasmop_tests::operator::{LeaderLoop, RunningOperator, plugin_path, sandbox, test_config};
use wasmop_tests::status::wait_event;
use wasmop_tests::widgets::{TempDir, create_widget, install, settle, widgets};
use wasmop_tests::{
    DEFAULT_DEADLINE, TestNamespace, apply_crd_files, apply_test_crds, kubeconfig_path, repo_root,
    wait_for, wasmop_bin,
};

/// The label that ties a test's PluginRollouts to its operators.
const LABEL: &str = "wasmop.dev/test";
/// The version label `good` (`v1`) and `good-v2` (`v2`) put on ConfigMaps.
const VERSION_LABEL: &str = "test.wasmop.dev/version";
/// Widgets per test.
const WIDGETS: usize = 6;

fn config(ns: &TestNamespace) -> OperatorConfig {
    OperatorConfig {
        rollout_interval: Some(Duration::from_millis(200)),
        rollout_selector: Some(format!("{LABEL}={}", ns.name)),
        ..test_config()
    }
}

fn rollouts(ns: &TestNamespace) -> Api<DynamicObject> {
    Api::all_with(ns.client.clone(), &rollout_resource())
}

/// Creates the PluginRollout `name` with `spec`, labelled for `ns`.
/// A rollout of good's spec: `fields` over the defaults these tests share
/// (a field given as null is left out). The defaults: each step held for
/// a second; analysis thresholds only a real fault crosses, since these
/// tests are about the steps and the metric each names, and a loaded
/// machine (slow calls, a transient API error) must not roll them back
/// by another metric; and good-v2's only difference from good, the
/// version label, allowed.
fn spec(fields: Value) -> Value {
    let mut spec = json!({
        "plugin": "good",
        "holdSeconds": 1,
        "analysis": {"errors": 1, "p99CallSeconds": 30, "cpuSecondsPerCall": 5},
        "allowDifferences": [{"op": "apply", "path": ".metadata.labels"}],
    });
    let (Value::Object(spec_fields), Value::Object(fields)) = (&mut spec, fields) else {
        panic!("a rollout spec is an object");
    };
    for (k, v) in fields {
        if v.is_null() {
            spec_fields.remove(&k);
        } else {
            spec_fields.insert(k, v);
        }
    }
    spec
}

async fn create_rollout(ns: &TestNamespace, name: &str, spec: Value) -> Result<()> {
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "wasmop.dev/v1alpha1", "kind": "PluginRollout",
        "metadata": {"name": name, "labels": {LABEL: ns.name}},
        "spec": spec,
    }))?;
    rollouts(ns).create(&PostParams::default(), &obj).await?;
    Ok(())
}

async fn status_of(ns: &TestNamespace, name: &str) -> Result<Value> {
    let obj = rollouts(ns).get(name).await?;
    Ok(obj.data.get("status").cloned().unwrap_or(Value::Null))
}

/// Waits until the rollout's phase is `phase`; returns its status.
/// Waits until rollout `name` is at canary step `step`.
async fn wait_step(ns: &TestNamespace, name: &str, step: u64) -> Result<()> {
    wait_for(
        &format!("the rollout at step {step}"),
        DEFAULT_DEADLINE,
        || async {
            let st = status_of(ns, name).await?;
            if st["step"] == step && st["phase"] == "Canary" {
                Ok(Some(()))
            } else {
                bail!("{st}")
            }
        },
    )
    .await
}

async fn wait_phase(ns: &TestNamespace, name: &str, phase: &str) -> Result<Value> {
    wait_for(
        &format!("rollout {name} to be {phase}"),
        DEFAULT_DEADLINE,
        || async move {
            let st = status_of(ns, name).await?;
            if st["phase"] == phase {
                Ok(Some(st))
            } else {
                bail!("status: {st}")
            }
        },
    )
    .await
}

/// The widgets' names by their UID's bucket, lowest first.
type Buckets = Vec<(u32, String)>;

/// A namespace with `good` running over [`WIDGETS`] Widgets whose
/// ConfigMaps exist, through an interposed client.
struct Fixture {
    ns: TestNamespace,
    dir: TempDir,
    interposer: Arc<Interposer>,
    /// The interposed client the operators use.
    client: kube::Client,
    buckets: Buckets,
}

impl Fixture {
    /// A [`Watcher`] of rollout `name` over this fixture's Widgets.
    fn watch(&self, name: &str) -> Watcher {
        let buckets: BTreeMap<String, u32> =
            self.buckets.iter().map(|(b, n)| (n.clone(), *b)).collect();
        Watcher::start(&self.ns, name, buckets)
    }

    async fn new(prefix: &str) -> Result<Self> {
        let ns = TestNamespace::new(prefix).await?;
        apply_test_crds(&ns.client).await?;
        apply_crd_files(
            &ns.client,
            &[repo_root().join("crds/wasmop.dev_pluginrollouts.yaml")],
        )
        .await?;
        let dir = TempDir::new("wasmop-rollout");
        install(&plugin_path("good")?, &dir.0.join("good.wasm"))?;
        let (interposer, client) = Interposer::new(ns.client.clone());
        Ok(Self {
            ns,
            dir,
            interposer,
            client,
            buckets: Vec::new(),
        })
    }

    /// Starts an operator (a follower when `follower`) with the fixture's
    /// plugin directory; returns it and its directory watcher.
    async fn operator(&self, follower: bool) -> Result<(RunningOperator, PluginDir)> {
        let client = self.client.clone();
        let op = if follower {
            RunningOperator::start_follower(
                client,
                vec![self.ns.name.clone()],
                vec![],
                config(&self.ns),
            )
            .await?
        } else {
            RunningOperator::start_with(
                client,
                vec![self.ns.name.clone()],
                vec![],
                config(&self.ns),
            )
            .await?
        };
        let options: OptionsFor = Arc::new(|_stem: &str| LoadOptions::default());
        let mut plugins =
            PluginDir::new(self.dir.0.clone(), sandbox(), op.operator.clone(), options);
        let report = plugins.scan(false).await;
        ensure!(report.rejected.is_empty(), "{report:?}");
        Ok((op, plugins))
    }

    /// Creates the Widgets, waits for their ConfigMaps (label `v1`) and
    /// sorts them by bucket.
    async fn widgets(&mut self) -> Result<()> {
        for i in 0..WIDGETS {
            create_widget(&self.ns, &format!("w{i}")).await?;
        }
        all_at(&self.ns.api(), "v1").await?;
        let mut buckets = Vec::new();
        for i in 0..WIDGETS {
            let name = format!("w{i}");
            let w = widgets(&self.ns).get(&name).await?;
            let uid = w.metadata.uid.context("a widget without a UID")?;
            buckets.push((bucket(&uid), name));
        }
        buckets.sort();
        self.buckets = buckets;
        Ok(())
    }

    /// The share, in percent, that holds exactly the first `n` widgets by
    /// bucket (100 for all of them).
    fn percent_for(&self, n: usize) -> f64 {
        if n >= self.buckets.len() {
            return 100.0;
        }
        f64::from(self.buckets[n - 1].0 + 1) / 100.0
    }

    /// The widgets a share in basis points holds.
    fn within(&self, share_bp: u32) -> Vec<String> {
        self.buckets
            .iter()
            .filter(|(b, _)| *b < share_bp)
            .map(|(_, n)| n.clone())
            .collect()
    }

    fn bucket_of(&self, widget: &str) -> u32 {
        self.buckets
            .iter()
            .find(|(_, n)| n == widget)
            .map_or(u32::MAX, |(b, _)| *b)
    }

    /// The DELETEs of ConfigMaps the operator sent, by widget name.
    fn deleted_widgets(&self) -> Vec<String> {
        self.interposer
            .writes()
            .iter()
            .filter(|w| w.method == Method::DELETE && w.path.contains("/configmaps/"))
            .filter_map(|w| {
                let name = w.path.split('?').next()?.rsplit('/').next()?;
                Some(name.strip_suffix("-cm")?.to_owned())
            })
            .collect()
    }
}

/// Waits until the ConfigMap of every one of the `WIDGETS` Widgets carries
/// `version`.
async fn all_at(cms: &Api<ConfigMap>, version: &str) -> Result<()> {
    wait_for(
        &format!("every ConfigMap at {version}"),
        DEFAULT_DEADLINE,
        || async {
            let labels = cm_labels(cms).await?;
            if labels.values().filter(|v| *v == version).count() == WIDGETS {
                Ok(Some(()))
            } else {
                bail!("{labels:?}")
            }
        },
    )
    .await
}

/// Widget name → the version label of its ConfigMap.
async fn cm_labels(cms: &Api<ConfigMap>) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for cm in cms.list(&Default::default()).await?.items {
        let name = cm.metadata.name.clone().unwrap_or_default();
        let Some(widget) = name.strip_suffix("-cm") else {
            continue;
        };
        let label = cm
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(VERSION_LABEL).cloned())
            .unwrap_or_default();
        out.insert(widget.to_owned(), label);
    }
    Ok(out)
}

/// Watches, until stopped, that a ConfigMap labelled `v2` belongs to a
/// Widget inside the share the rollout's status names (the ConfigMaps
/// are read first: a later status never names a narrower share), and
/// records the steps seen. Returns the violations and steps.
struct Watcher {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Result<(Vec<String>, Vec<u64>)>>,
}

impl Watcher {
    fn start(ns: &TestNamespace, name: &str, buckets: BTreeMap<String, u32>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let cms: Api<ConfigMap> = ns.api();
        let api = rollouts(ns);
        let name = name.to_owned();
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let mut violations = Vec::new();
            let mut steps: Vec<u64> = Vec::new();
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            while !flag.load(Ordering::SeqCst) {
                tick.tick().await;
                let labels = cm_labels(&cms).await?;
                // The watcher starts before the rollout is created: no
                // rollout yet is a share of nothing.
                let st = match api.get_opt(&name).await? {
                    Some(r) => r.data["status"].clone(),
                    None => Value::Null,
                };
                let share_bp = match st["phase"].as_str() {
                    Some("Promoted") => 10_000,
                    Some("Canary") => {
                        (st["sharePercent"].as_f64().unwrap_or(0.0) * 100.0).round() as u32
                    }
                    _ => 0,
                };
                for (widget, label) in &labels {
                    let b = buckets.get(widget).copied().unwrap_or(u32::MAX);
                    if label == "v2" && b >= share_bp {
                        violations.push(format!(
                            "{widget} (bucket {b}) at v2 with the share at {share_bp} bp ({st})"
                        ));
                    }
                }
                if let Some(step) = st["step"].as_u64()
                    && steps.last() != Some(&step)
                {
                    steps.push(step);
                }
            }
            Ok((violations, steps))
        });
        Self { stop, task }
    }

    async fn finish(self) -> Result<(Vec<String>, Vec<u64>)> {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await?
    }
}

#[tokio::test]
async fn good_is_rolled_out_to_good_v2_through_shadow_and_canary_steps_to_promotion() -> Result<()>
{
    rolled_out_to_promotion_and_undone("rollout-promote", "good-v2").await
}

/// From the Rust good to good-v2 in JavaScript (its shadow step, canary
/// steps, promotion), and back to the Rust good by the undo.
#[tokio::test]
async fn good_is_rolled_out_to_its_javascript_v2_and_back() -> Result<()> {
    rolled_out_to_promotion_and_undone("rollout-js", "good-v2-js").await
}

/// The same with good-v2 in Python.
#[tokio::test]
async fn good_is_rolled_out_to_its_python_v2_and_back() -> Result<()> {
    rolled_out_to_promotion_and_undone("rollout-py", "good-v2-py").await
}

/// The Rust good, then `candidate` (good 0.2.0 in some language) through
/// a shadow step and canary steps to promotion, then `wasmop rollout undo`
/// back to the Rust good.
async fn rolled_out_to_promotion_and_undone(prefix: &str, candidate: &str) -> Result<()> {
    let mut fx = Fixture::new(prefix).await?;
    let (op, mut plugins) = fx.operator(false).await?;
    fx.widgets().await?;
    install(&plugin_path(candidate)?, &fx.dir.0.join("good.shadow.wasm"))?;
    let report = settle(&mut plugins).await;
    ensure!(
        report.activated == vec![("good.shadow".to_string(), "0.2.0".to_string())],
        "{report:?}"
    );
    let name = format!("{}-good", fx.ns.name);
    let steps = [
        fx.percent_for(1),
        fx.percent_for(3),
        fx.percent_for(5),
        100.0,
    ];
    let watcher = fx.watch(&name);
    create_rollout(
        &fx.ns,
        &name,
        spec(json!({
            "candidate": {"version": "0.2.0"},
            // Held by time (every primary is compared once at its start).
            "shadow": {"reconciles": 1000, "seconds": 2},
            "steps": steps.iter().map(|p| json!({"percent": p})).collect::<Vec<_>>(),
        })),
    )
    .await?;
    let st = wait_phase(&fx.ns, &name, "Promoted").await?;
    let cms: Api<ConfigMap> = fx.ns.api();
    all_at(&cms, "v2").await?;
    let (violations, seen) = watcher.finish().await?;
    ensure!(violations.is_empty(), "outside the share: {violations:#?}");
    // Every step was passed through, in order.
    ensure!(seen == [0, 1, 2, 3, 4], "steps seen {seen:?}");
    ensure!(
        st["candidateVersion"] == "0.2.0" && st["currentVersion"] == "0.1.0",
        "{st}"
    );
    ensure!(st["sharePercent"] == 100.0, "{st}");
    // The shadow step compared every primary; its differences were all
    // allow-listed.
    wait_event(
        &fx.ns.client,
        "default",
        &name,
        Some("Normal"),
        "RolloutStepPassed",
        DEFAULT_DEADLINE,
    )
    .await?;
    let (_, note) = wait_event(
        &fx.ns.client,
        "default",
        &name,
        Some("Normal"),
        "RolloutPromoted",
        DEFAULT_DEADLINE,
    )
    .await?;
    ensure!(note.contains("0.2.0"), "{note}");
    // Nothing was deleted on the way.
    ensure!(
        fx.deleted_widgets().is_empty(),
        "{:?}",
        fx.deleted_widgets()
    );

    // The budgets of both versions are metrics, per plugin and version.
    let budgets = wasmop::plugin::budget::render();
    for version in ["0.1.0", "0.2.0"] {
        let labels = format!("{{plugin=\"good\",version=\"{version}\"}}");
        for name in [
            "wasmop_plugin_calls_total",
            "wasmop_plugin_call_peak_memory_bytes_count",
            "wasmop_plugin_call_epoch_ticks_count",
            "wasmop_plugin_call_input_bytes_total",
            "wasmop_plugin_call_output_bytes_total",
        ] {
            let value = budgets
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{name}{labels} ")))
                .and_then(|v| v.parse::<f64>().ok())
                .with_context(|| format!("{name}{labels} in {budgets}"))?;
            ensure!(value > 0.0, "{name}{labels} is {value}");
        }
    }

    // One-command undo: `wasmop rollout undo` sends every primary back to
    // 0.1.0.
    let out = tokio::process::Command::new(wasmop_bin()?)
        .args(["rollout", "undo", &name, "--kubeconfig"])
        .arg(kubeconfig_path())
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success() && stdout.contains("back to 0.1.0"),
        "{:?} {stdout} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let st = wait_phase(&fx.ns, &name, "RolledBack").await?;
    ensure!(st["conditions"][0]["reason"] == "RollbackRequested", "{st}");
    all_at(&cms, "v1").await?;
    ensure!(
        op.operator.shadow("good").is_some(),
        "the candidate stays a shadow"
    );
    let _ = rollouts(&fx.ns)
        .delete(&name, &DeleteParams::default())
        .await;
    drop(op);
    Ok(())
}

/// Starts a rollout of `good-pruner` (which deletes every Widget's
/// ConfigMap) with `shadow`, two canary steps (the first widget by
/// bucket, then all), and waits for its automatic rollback; returns the
/// fixture, the status and the Warning Event's note.
async fn roll_out_the_pruner(
    prefix: &str,
    shadow: Value,
) -> Result<(Fixture, RunningOperator, Value, String)> {
    let mut fx = Fixture::new(prefix).await?;
    let (op, mut plugins) = fx.operator(false).await?;
    fx.widgets().await?;
    install(
        &plugin_path("good-pruner")?,
        &fx.dir.0.join("good.shadow.wasm"),
    )?;
    let report = settle(&mut plugins).await;
    ensure!(
        report.activated == vec![("good.shadow".to_string(), "0.3.0".to_string())],
        "{report:?}"
    );
    let name = format!("{}-pruner", fx.ns.name);
    create_rollout(
        &fx.ns,
        &name,
        spec(json!({
            "shadow": shadow,
            "steps": [{"percent": fx.percent_for(1)}, {"percent": 100}],
            // The pruner's differences are what this test is about.
            "allowDifferences": null,
        })),
    )
    .await?;
    let st = wait_phase(&fx.ns, &name, "RolledBack").await?;
    let (_, note) = wait_event(
        &fx.ns.client,
        "default",
        &name,
        Some("Warning"),
        "ThresholdCrossed",
        DEFAULT_DEADLINE,
    )
    .await?;
    ensure!(
        op.operator.shadow("good").is_some(),
        "the candidate stays a shadow"
    );
    let _ = rollouts(&fx.ns)
        .delete(&name, &DeleteParams::default())
        .await;
    Ok((fx, op, st, note))
}

#[tokio::test]
async fn a_pruning_candidate_is_rolled_back_at_the_shadow_step_by_its_differences() -> Result<()> {
    let (fx, op, st, note) =
        roll_out_the_pruner("rollout-shadow", json!({"reconciles": 3, "seconds": 30})).await?;
    ensure!(st["step"] == 0, "rolled back at the shadow step: {st}");
    let condition = &st["conditions"][0];
    ensure!(
        condition["type"] == "Healthy"
            && condition["status"] == "False"
            && condition["reason"] == "ThresholdCrossed",
        "{st}"
    );
    for text in [
        condition["message"].as_str().unwrap_or_default(),
        note.as_str(),
    ] {
        ensure!(
            text.contains("shadowDifferences is ") && text.contains("threshold 0"),
            "the metric, its value and the threshold: {text}"
        );
    }
    // No primary was touched: no DELETE at all, every ConfigMap at v1.
    ensure!(
        fx.deleted_widgets().is_empty(),
        "{:?}",
        fx.deleted_widgets()
    );
    let labels = cm_labels(&fx.ns.api()).await?;
    ensure!(
        labels.len() == WIDGETS && labels.values().all(|v| v == "v1"),
        "{labels:?}"
    );
    drop(op);
    Ok(())
}

#[tokio::test]
async fn a_pruning_candidate_without_shadow_analysis_is_rolled_back_at_the_first_canary_step_by_its_deletes()
-> Result<()> {
    let (fx, op, st, note) = roll_out_the_pruner(
        "rollout-canary",
        json!({"reconciles": 3, "seconds": 30, "analyze": false}),
    )
    .await?;
    ensure!(
        st["step"] == 1,
        "rolled back at the first canary step: {st}"
    );
    ensure!(st["conditions"][0]["reason"] == "ThresholdCrossed", "{st}");
    ensure!(
        note.contains("deletesPerMinute is 1.000") && note.contains("threshold 0"),
        "the metric, its value and the threshold: {note}"
    );
    // Only the one widget of the first step lost its ConfigMap...
    let canary = fx.within(fx.buckets[0].0 + 1);
    let deleted = fx.deleted_widgets();
    ensure!(!deleted.is_empty(), "the pruner deleted nothing");
    for w in &deleted {
        ensure!(
            canary.contains(w),
            "{w} (bucket {}) is outside the canary share {canary:?}",
            fx.bucket_of(w)
        );
    }
    // ...and the current version gives it back after the rollback.
    let cms: Api<ConfigMap> = fx.ns.api();
    all_at(&cms, "v1").await?;
    drop(op);
    Ok(())
}

const LEASE_DURATION: Duration = Duration::from_secs(2);

#[tokio::test]
async fn a_rollout_goes_on_across_a_leader_change() -> Result<()> {
    let mut fx = Fixture::new("rollout-leader").await?;
    install(&plugin_path("good-v2")?, &fx.dir.0.join("good.shadow.wasm"))?;
    let mut replicas = Vec::new();
    for identity in ["a", "b"] {
        let (op, plugins) = fx.operator(true).await?;
        ensure!(
            op.operator.shadow("good").is_some(),
            "{identity} runs the candidate as a shadow"
        );
        let election = LeaderLoop::start(
            fx.ns.client.clone(),
            LeaderConfig {
                identity: identity.to_string(),
                lease_name: "wasmop-leader".to_string(),
                lease_duration: LEASE_DURATION,
                renew_every: Duration::from_millis(500),
                ..LeaderConfig::new(&fx.ns.name)
            },
            &op.operator,
        );
        replicas.push(Some((op, plugins, election)));
    }
    fx.widgets().await?;
    let name = format!("{}-good", fx.ns.name);
    let watcher = fx.watch(&name);
    create_rollout(
        &fx.ns,
        &name,
        spec(json!({
            "steps": [{"percent": fx.percent_for(2)}, {"percent": fx.percent_for(4), "holdSeconds": 3}, {"percent": 100}],
        })),
    )
    .await?;
    wait_step(&fx.ns, &name, 2).await?;
    let digest = status_of(&fx.ns, &name).await?["candidateDigest"].clone();
    // Crash the leader mid-step: the other replica takes the Lease over
    // and continues from the status.
    let leader = replicas
        .iter()
        .position(|r| {
            r.as_ref()
                .is_some_and(|(op, _, _)| op.operator.leader_flag().load(Ordering::SeqCst))
        })
        .context("no leader")?;
    let (op, _plugins, election) = replicas[leader].take().context("the leader")?;
    election.kill().await;
    op.kill();
    let survivor = replicas.iter().flatten().next().context("a survivor")?;
    wait_for("the other replica to lead", DEFAULT_DEADLINE, || async {
        if survivor.0.operator.leader_flag().load(Ordering::SeqCst) {
            Ok(Some(()))
        } else {
            bail!("not yet")
        }
    })
    .await?;
    let st = wait_phase(&fx.ns, &name, "Promoted").await?;
    ensure!(st["candidateDigest"] == digest, "the same candidate: {st}");
    let (violations, seen) = watcher.finish().await?;
    ensure!(violations.is_empty(), "outside the share: {violations:#?}");
    ensure!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "steps went back: {seen:?}"
    );
    ensure!(
        seen.last() == Some(&3) && seen.contains(&2),
        "steps seen {seen:?}"
    );
    let cms: Api<ConfigMap> = fx.ns.api();
    all_at(&cms, "v2").await?;
    // Deleting the rollout sends every primary back to the current
    // version.
    rollouts(&fx.ns)
        .delete(&name, &DeleteParams::default())
        .await?;
    all_at(&cms, "v1").await?;
    Ok(())
}

#[tokio::test]
async fn a_rollout_that_cannot_be_followed_says_why_and_routes_nothing() -> Result<()> {
    let mut fx = Fixture::new("rollout-refused").await?;
    let (op, mut plugins) = fx.operator(false).await?;
    fx.widgets().await?;
    install(&plugin_path("good-v2")?, &fx.dir.0.join("good.shadow.wasm"))?;
    settle(&mut plugins).await;
    ensure!(op.operator.shadow("good").is_some());
    // Steps that narrow, and a selector that does not parse.
    let bad = format!("{}-bad", fx.ns.name);
    create_rollout(
        &fx.ns,
        &bad,
        json!({"plugin": "good", "steps": [{"percent": 50}, {"percent": 10, "selector": "a in (b"}]}),
    )
    .await?;
    let st = wait_phase(&fx.ns, &bad, "Invalid").await?;
    let message = st["message"].as_str().unwrap_or_default();
    ensure!(
        message.contains("narrows the previous step") && message.contains("steps[1].selector"),
        "{st}"
    );
    // A pinned candidate that is not the loaded shadow waits.
    let pinned = format!("{}-pinned", fx.ns.name);
    create_rollout(
        &fx.ns,
        &pinned,
        json!({"plugin": "good", "candidate": {"version": "9.9.9"},
               "steps": [{"percent": 100}], "holdSeconds": 0}),
    )
    .await?;
    let st = wait_phase(&fx.ns, &pinned, "Waiting").await?;
    ensure!(
        st["message"]
            .as_str()
            .is_some_and(|m| m.contains("good.shadow.wasm")),
        "{st}"
    );
    // A second rollout of the same plugin (after `-bad` and `-pinned` by
    // name) is refused.
    let second = format!("{}-second", fx.ns.name);
    create_rollout(
        &fx.ns,
        &second,
        json!({"plugin": "good", "steps": [{"percent": 100}], "holdSeconds": 0}),
    )
    .await?;
    let st = wait_phase(&fx.ns, &second, "Invalid").await?;
    ensure!(
        st["message"]
            .as_str()
            .is_some_and(|m| m.contains("another PluginRollout")),
        "{st}"
    );
    // None of them routes a primary to the candidate: no routing is set,
    // and every ConfigMap is still v1.
    let cms: Api<ConfigMap> = fx.ns.api();
    let labels = cm_labels(&cms).await?;
    ensure!(
        labels.len() == WIDGETS && labels.values().all(|v| v == "v1"),
        "{labels:?}"
    );
    ensure!(
        op.operator.rollouts().routing("good").is_none(),
        "nothing routed"
    );
    // `wasmop rollout status` shows why, and undo of a rollout that does
    // not exist is an error naming it.
    let status = tokio::process::Command::new(wasmop_bin()?)
        .args(["rollout", "status", &bad, "--kubeconfig"])
        .arg(kubeconfig_path())
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&status.stdout);
    ensure!(
        status.status.success() && stdout.contains("phase=Invalid") && stdout.contains("narrows"),
        "{stdout}"
    );
    let missing = tokio::process::Command::new(wasmop_bin()?)
        .args(["rollout", "undo", "no-such-rollout", "--kubeconfig"])
        .arg(kubeconfig_path())
        .output()
        .await?;
    let stderr = String::from_utf8_lossy(&missing.stderr);
    ensure!(
        !missing.status.success() && stderr.contains("PluginRollout no-such-rollout"),
        "{stderr}"
    );
    for name in [&bad, &pinned, &second] {
        let _ = rollouts(&fx.ns)
            .delete(name, &DeleteParams::default())
            .await;
    }
    Ok(())
}

#[tokio::test]
async fn a_candidate_pulled_by_oci_digest_is_rolled_out() -> Result<()> {
    use clap::Parser;
    use wasmop::delivery::oci::{OciMirror, PluginSource, RegistryOptions, SyncOutcome};
    use wasmop_tests::registry::Registry;

    let mut fx = Fixture::new("rollout-oci").await?;
    // good-v2 published; the candidate is named by its digest.
    let registry = Registry::start().await?;
    let argv: Vec<String> = vec![
        "wasmop".into(),
        "push".into(),
        plugin_path("good-v2")?.display().to_string(),
        format!("oci://{}/wasmop/good:v2", registry.host),
        "--insecure-registry".into(),
        registry.host.clone(),
    ];
    let cli = wasmop::cli::Cli::try_parse_from(&argv)?;
    let code = tokio::task::spawn_blocking(move || wasmop::cli::execute(cli)).await??;
    ensure!(code == std::process::ExitCode::SUCCESS, "push failed");
    let options = RegistryOptions {
        insecure: vec![registry.host.clone()],
        ..RegistryOptions::default()
    };
    let tagged = match format!("oci://{}/wasmop/good:v2", registry.host).parse::<PluginSource>() {
        Ok(PluginSource::Oci(s)) => s,
        other => bail!("not an oci source: {other:?}"),
    };
    let digest = options
        .client()
        .fetch_manifest_digest(&tagged.reference, &options.auth(&tagged.reference))
        .await?;
    let source = match format!("good.shadow=oci://{}/wasmop/good@{digest}", registry.host)
        .parse::<PluginSource>()
    {
        Ok(PluginSource::Oci(s)) => s,
        other => bail!("not an oci source: {other:?}"),
    };
    let cache = TempDir::new("wasmop-rollout-oci");
    let mut mirror = OciMirror::new(
        cache.0.clone(),
        vec![source],
        options,
        wasmop::delivery::oci::DEFAULT_MAX_BYTES,
    )?;
    let synced = mirror.sync().await;
    ensure!(
        matches!(&synced[..], [SyncOutcome::Installed(name, d)] if name == "good.shadow" && *d == digest),
        "{synced:?}"
    );
    // The operator reads the plugin directory and the mirror's.
    let op = RunningOperator::start_with(
        fx.client.clone(),
        vec![fx.ns.name.clone()],
        vec![],
        config(&fx.ns),
    )
    .await?;
    let options: OptionsFor = Arc::new(|_stem: &str| LoadOptions::default());
    let mut plugins = PluginDir::with_dirs(
        vec![fx.dir.0.clone(), mirror.active_dir().to_owned()],
        sandbox(),
        op.operator.clone(),
        options,
    );
    let report = plugins.scan(false).await;
    ensure!(report.rejected.is_empty(), "{report:?}");
    let shadow = op
        .operator
        .shadow("good")
        .context("the pulled candidate runs as the shadow")?;
    ensure!(shadow.version() == "0.2.0", "{}", shadow.version());
    // The rollout pins the candidate by the wasm's digest (the layer's).
    let file_digest = shadow.digest().to_owned();
    fx.widgets().await?;
    let name = format!("{}-oci", fx.ns.name);
    create_rollout(
        &fx.ns,
        &name,
        spec(json!({
            "candidate": {"digest": file_digest},
            "steps": [{"percent": fx.percent_for(3)}, {"percent": 100}],
        })),
    )
    .await?;
    let st = wait_phase(&fx.ns, &name, "Promoted").await?;
    ensure!(st["candidateDigest"] == file_digest.as_str(), "{st}");
    let cms: Api<ConfigMap> = fx.ns.api();
    all_at(&cms, "v2").await?;
    let _ = rollouts(&fx.ns)
        .delete(&name, &DeleteParams::default())
        .await;
    drop(op);
    Ok(())
}

#[tokio::test]
async fn a_paused_rollout_holds_its_step_until_it_is_resumed() -> Result<()> {
    let mut fx = Fixture::new("rollout-paused").await?;
    let (op, mut plugins) = fx.operator(false).await?;
    fx.widgets().await?;
    install(&plugin_path("good-v2")?, &fx.dir.0.join("good.shadow.wasm"))?;
    settle(&mut plugins).await;
    let name = format!("{}-paused", fx.ns.name);
    create_rollout(
        &fx.ns,
        &name,
        spec(json!({
            "steps": [{"percent": fx.percent_for(2)}, {"percent": 100}],
            "holdSeconds": 0,
            "paused": true,
        })),
    )
    .await?;
    // Step 1 is done (no hold, its reconciles made) yet holds, and says so.
    let st = wait_for("step 1 to hold, paused", DEFAULT_DEADLINE, || async {
        let st = status_of(&fx.ns, &name).await?;
        let paused = st["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("paused"));
        if paused && st["candidate"]["reconciles"].as_u64().unwrap_or(0) >= 1 {
            Ok(Some(st))
        } else {
            bail!("{st}")
        }
    })
    .await?;
    ensure!(st["step"] == 1 && st["phase"] == "Canary", "{st}");
    // The canary share (two widgets) runs the candidate, the rest does not.
    let cms: Api<ConfigMap> = fx.ns.api();
    let canary = fx.within(fx.buckets[1].0 + 1);
    wait_for(
        "the canary share at v2, the rest at v1",
        DEFAULT_DEADLINE,
        || {
            let (cms, canary) = (cms.clone(), canary.clone());
            async move {
                let labels = cm_labels(&cms).await?;
                for (widget, label) in &labels {
                    if !canary.contains(widget) && label != "v1" {
                        // Never right again: the wait runs out with this.
                        bail!("{widget}, outside the share, is {label}");
                    }
                }
                let moved = labels.iter().filter(|(_, l)| *l == "v2").count();
                if moved == canary.len() {
                    Ok(Some(()))
                } else {
                    bail!("{labels:?}")
                }
            }
        },
    )
    .await?;
    // Still held at step 1.
    let st = status_of(&fx.ns, &name).await?;
    ensure!(
        st["step"] == 1
            && st["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("paused")),
        "{st}"
    );
    // Resumed, it goes on to promotion.
    rollouts(&fx.ns)
        .patch(
            &name,
            &Default::default(),
            &kube::api::Patch::Merge(json!({"spec": {"paused": false}})),
        )
        .await?;
    wait_phase(&fx.ns, &name, "Promoted").await?;
    let _ = rollouts(&fx.ns)
        .delete(&name, &DeleteParams::default())
        .await;
    drop(op);
    Ok(())
}

#[tokio::test]
async fn a_rollout_survives_an_operator_restart() -> Result<()> {
    let mut fx = Fixture::new("rollout-restart").await?;
    install(&plugin_path("good-v2")?, &fx.dir.0.join("good.shadow.wasm"))?;
    let (first, _plugins) = fx.operator(false).await?;
    fx.widgets().await?;
    let name = format!("{}-restart", fx.ns.name);
    let watcher = fx.watch(&name);
    create_rollout(
        &fx.ns,
        &name,
        spec(json!({
            "steps": [{"percent": fx.percent_for(2), "holdSeconds": 2}, {"percent": 100}],
        })),
    )
    .await?;
    wait_step(&fx.ns, &name, 1).await?;
    let digest = status_of(&fx.ns, &name).await?["candidateDigest"].clone();
    // The operator goes away mid-step; a new one (nothing in memory)
    // continues from the status.
    first.stop().await;
    let (second, _plugins) = fx.operator(false).await?;
    let st = wait_phase(&fx.ns, &name, "Promoted").await?;
    ensure!(st["candidateDigest"] == digest, "the same candidate: {st}");
    let (violations, seen) = watcher.finish().await?;
    ensure!(violations.is_empty(), "outside the share: {violations:#?}");
    ensure!(seen == [1, 2], "steps seen {seen:?}");
    let cms: Api<ConfigMap> = fx.ns.api();
    all_at(&cms, "v2").await?;
    let _ = rollouts(&fx.ns)
        .delete(&name, &DeleteParams::default())
        .await;
    drop(second);
    Ok(())
}

// ---------------------------------------------------------------------------
// Rollbacks that must not be lost, routing that must not freeze, and a
// status fenced by the rollout's identity (issue 48, items 3 and 9).

/// Starts an operator over `fx`'s plugin directory with `client` (a
/// follower when `follower`).
async fn operator_with(
    fx: &Fixture,
    client: kube::Client,
    follower: bool,
) -> Result<(RunningOperator, PluginDir)> {
    let op = if follower {
        RunningOperator::start_follower(client, vec![fx.ns.name.clone()], vec![], config(&fx.ns))
            .await?
    } else {
        RunningOperator::start_with(client, vec![fx.ns.name.clone()], vec![], config(&fx.ns))
            .await?
    };
    let options: OptionsFor = Arc::new(|_stem: &str| LoadOptions::default());
    let mut plugins = PluginDir::new(fx.dir.0.clone(), sandbox(), op.operator.clone(), options);
    let report = plugins.scan(false).await;
    ensure!(report.rejected.is_empty(), "{report:?}");
    Ok((op, plugins))
}

/// The status writes of rollout `name` the operator sent, in order, with
/// the API server's answer.
fn status_writes(fx: &Fixture, name: &str) -> Vec<u16> {
    fx.interposer
        .writes()
        .iter()
        .filter(|w| w.is(&Method::PATCH, &format!("/pluginrollouts/{name}/status")))
        .map(|w| w.status)
        .collect()
}

/// An automatic rollback whose status write the API server refuses (a
/// ValidatingAdmissionPolicy refuses `phase: RolledBack` for this test's
/// rollouts) is not lost: the leader keeps every primary on the current
/// version and writes the same rollback again each tick (no other status,
/// no delete of the candidate), and records it once the write goes
/// through. Before, the next tick re-read the old phase, opened a fresh
/// window and routed the canary share to the candidate again.
#[tokio::test]
async fn an_automatic_rollback_whose_status_write_fails_is_held_until_it_is_recorded() -> Result<()>
{
    let mut fx = Fixture::new("rollout-held").await?;
    let policy = wasmop_tests::policy::Policy::apply(
        &fx.ns.client,
        &format!("{}-no-rollback", fx.ns.name),
        json!({"spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": ["wasmop.dev"], "apiVersions": ["*"],
                "operations": ["UPDATE"], "resources": ["pluginrollouts/status"],
            }]},
            "validations": [{
                "expression": "!has(object.status) || !has(object.status.phase) || object.status.phase != 'RolledBack'",
                "message": "test: RolledBack may not be recorded yet",
            }],
        }}),
        json!({"objectSelector": {"matchLabels": {LABEL: fx.ns.name}}}),
    )
    .await?;
    let probe = format!("{}-probe", fx.ns.name);
    create_rollout(
        &fx.ns,
        &probe,
        spec(json!({"plugin": "nothing-here", "steps": [{"percent": 1}]})),
    )
    .await?;
    policy
        .wait_enforced("RolledBack may not be recorded", || async {
            let pp = kube::api::PatchParams {
                dry_run: true,
                ..Default::default()
            };
            rollouts(&fx.ns)
                .patch_status(
                    &probe,
                    &pp,
                    &kube::api::Patch::Merge(json!({"status": {"phase": "RolledBack"}})),
                )
                .await
                .map(|_| ())
        })
        .await?;
    rollouts(&fx.ns)
        .delete(&probe, &DeleteParams::default())
        .await?;
    let (op, mut plugins) = fx.operator(false).await?;
    fx.widgets().await?;
    install(
        &plugin_path("good-pruner")?,
        &fx.dir.0.join("good.shadow.wasm"),
    )?;
    settle(&mut plugins).await;
    let name = format!("{}-held", fx.ns.name);
    create_rollout(
        &fx.ns,
        &name,
        spec(json!({
            "shadow": {"reconciles": 3, "seconds": 30, "analyze": false},
            "steps": [{"percent": fx.percent_for(1)}, {"percent": 100}],
            "allowDifferences": null,
        })),
    )
    .await?;
    wait_event(
        &fx.ns.client,
        "default",
        &name,
        Some("Warning"),
        "ThresholdCrossed",
        DEFAULT_DEADLINE,
    )
    .await?;
    // The rollback is written again and again, refused each time.
    wait_for(
        "the rollback written again three times",
        DEFAULT_DEADLINE,
        || async {
            let refused = status_writes(&fx, &name)
                .iter()
                .filter(|s| **s >= 400)
                .count();
            if refused >= 3 {
                Ok(Some(()))
            } else {
                bail!("{:?}", status_writes(&fx, &name))
            }
        },
    )
    .await?;
    let writes = fx.interposer.writes();
    let is_status = |w: &wasmop_tests::interpose::Recorded| {
        w.is(&Method::PATCH, &format!("/pluginrollouts/{name}/status"))
    };
    let first_refused = writes
        .iter()
        .position(|w| is_status(w) && w.status >= 400)
        .context("a refused status write")?;
    let second_refused = writes
        .iter()
        .enumerate()
        .skip(first_refused + 1)
        .find(|(_, w)| is_status(w) && w.status >= 400)
        .map(|(i, _)| i)
        .context("a second refused status write")?;
    for w in &writes[first_refused..] {
        ensure!(
            !(is_status(w) && w.status < 400),
            "another status was written while the rollback was held: {w:?}"
        );
    }
    for w in &writes[second_refused..] {
        ensure!(
            !(w.method == Method::DELETE && w.path.contains("/configmaps/")),
            "the candidate deleted again after the rollback: {w:?}"
        );
    }
    ensure!(
        status_of(&fx.ns, &name).await?["phase"] == "Canary",
        "not recorded while refused"
    );
    // Once the API server takes it, it is recorded, and the current
    // version gives every Widget its ConfigMap back.
    policy.remove().await?;
    let st = wait_phase(&fx.ns, &name, "RolledBack").await?;
    ensure!(st["conditions"][0]["reason"] == "ThresholdCrossed", "{st}");
    all_at(&fx.ns.api(), "v1").await?;
    let _ = rollouts(&fx.ns)
        .delete(&name, &DeleteParams::default())
        .await;
    drop(op);
    Ok(())
}

/// A rollout deleted and re-created under its name while the leader
/// decides its step never inherits what was decided for its predecessor:
/// the status write is fenced by the rollout's UID, and the new rollout
/// starts from its first step. Before, the write landed by name on the
/// new object, which went on from its predecessor's step.
#[tokio::test]
async fn a_rollout_recreated_mid_tick_never_inherits_its_predecessors_status() -> Result<()> {
    let mut fx = Fixture::new("rollout-fence").await?;
    install(&plugin_path("good-v2")?, &fx.dir.0.join("good.shadow.wasm"))?;
    let (op, _plugins) = fx.operator(false).await?;
    fx.widgets().await?;
    let name = format!("{}-fence", fx.ns.name);
    create_rollout(
        &fx.ns,
        &name,
        spec(json!({
            "steps": [{"percent": fx.percent_for(2)}, {"percent": fx.percent_for(4), "holdSeconds": 3600}, {"percent": 100}],
        })),
    )
    .await?;
    wait_step(&fx.ns, &name, 2).await?;
    let old_uid = rollouts(&fx.ns).get(&name).await?.metadata.uid;
    // Just before the next status write of the rollout, it is deleted and
    // made again (one step, held for an hour).
    let recreated: Arc<std::sync::Mutex<Option<jiff::Timestamp>>> = Arc::default();
    {
        let (ns_client, ns_name, name, recreated) = (
            fx.ns.client.clone(),
            fx.ns.name.clone(),
            name.clone(),
            recreated.clone(),
        );
        let suffix = format!("/pluginrollouts/{name}/status");
        fx.interposer.before(
            move |m, path| {
                *m == Method::PATCH
                    && path
                        .split('?')
                        .next()
                        .unwrap_or_default()
                        .ends_with(&suffix)
            },
            move || async move {
                let api: Api<DynamicObject> = Api::all_with(ns_client, &rollout_resource());
                let _ = api.delete(&name, &DeleteParams::default()).await;
                *recreated.lock().expect("lock") = Some(jiff::Timestamp::now());
                let obj: DynamicObject = serde_json::from_value(json!({
                    "apiVersion": "wasmop.dev/v1alpha1", "kind": "PluginRollout",
                    "metadata": {"name": name, "labels": {LABEL: ns_name}},
                    "spec": spec(json!({"steps": [{"percent": 100, "holdSeconds": 3600}]})),
                }))
                .expect("a rollout");
                if let Err(e) = api.create(&PostParams::default(), &obj).await {
                    eprintln!("re-creating the rollout: {e}");
                }
            },
        );
    }
    let st = wait_for(
        "the new rollout at its own first step",
        DEFAULT_DEADLINE,
        || async {
            let obj = rollouts(&fx.ns).get(&name).await?;
            let st = obj.data["status"].clone();
            let Some(at) = *recreated.lock().expect("lock") else {
                bail!("not re-created yet")
            };
            ensure!(obj.metadata.uid != old_uid, "not re-created yet");
            let started: jiff::Timestamp = st["stepStartedAt"]
                .as_str()
                .unwrap_or_default()
                .parse()
                .map_err(|e| anyhow::anyhow!("stepStartedAt of {st}: {e}"))?;
            if st["phase"] == "Canary" && st["step"] == 1 && started >= at {
                Ok(Some(st))
            } else {
                bail!("{st}")
            }
        },
    )
    .await?;
    ensure!(st["phase"] != "Promoted", "{st}");
    let _ = rollouts(&fx.ns)
        .delete(&name, &DeleteParams::default())
        .await;
    drop(op);
    Ok(())
}

/// Every replica honours `spec.rollback` at once, before the leader has
/// recorded it; and a replica that can no longer list the rollouts (its
/// RBAC for them removed) does not keep routing to the candidate: after
/// `LIST_FAILURE_GRACE` every plugin goes back to its current version.
/// A follower (never leading, so nobody writes the status but the test)
/// routes by a status written by hand.
#[tokio::test]
async fn a_follower_honours_rollback_and_a_failing_list_does_not_freeze_its_routing() -> Result<()>
{
    let fx = Fixture::new("rollout-follow").await?;
    install(&plugin_path("good-v2")?, &fx.dir.0.join("good.shadow.wasm"))?;
    // The follower runs as a ServiceAccount: admin in the namespace, and
    // PluginRollouts through a ClusterRole the test takes away later.
    let account = wasmop_tests::audit::AuditedAccount::create(&fx.ns, &fx.dir.0, false).await?;
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    let rbac_name = format!("{}-rollouts", fx.ns.name);
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": rbac_name},
        "rules": [{"apiGroups": ["wasmop.dev"], "resources": ["pluginrollouts", "pluginrollouts/status"],
                   "verbs": ["get", "list", "watch", "patch", "update"]}],
    }))?;
    let roles: Api<ClusterRole> = Api::all(fx.ns.client.clone());
    roles.create(&PostParams::default(), &role).await?;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": rbac_name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": rbac_name},
        "subjects": [{"kind": "ServiceAccount", "name": account.user.rsplit(':').next().unwrap_or_default(),
                      "namespace": "wasmop-audited"}],
    }))?;
    let bindings: Api<ClusterRoleBinding> = Api::all(fx.ns.client.clone());
    bindings.create(&PostParams::default(), &binding).await?;
    let kubeconfig = kube::config::Kubeconfig::read_from(&account.kubeconfig)?;
    let cfg = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    let client = kube::Client::try_from(cfg)?;
    let (op, _plugins) = operator_with(&fx, client, true).await?;
    let digest = op
        .operator
        .shadow("good")
        .context("the candidate loaded as a shadow")?
        .digest()
        .to_owned();
    let name = format!("{}-follow", fx.ns.name);
    create_rollout(&fx.ns, &name, spec(json!({"steps": [{"percent": 100}]}))).await?;
    rollouts(&fx.ns)
        .patch_status(
            &name,
            &Default::default(),
            &kube::api::Patch::Merge(json!({"status": {
                "phase": "Canary", "step": 1, "candidateDigest": digest,
            }})),
        )
        .await?;
    let routed = |want: bool, why: &'static str| {
        let op = op.operator.clone();
        async move {
            wait_for(
                &format!("the follower routing to the candidate: {want} ({why})"),
                DEFAULT_DEADLINE,
                || {
                    let op = op.clone();
                    async move {
                        if op.rollouts().routing("good").is_some() == want {
                            Ok(Some(()))
                        } else {
                            bail!("not yet")
                        }
                    }
                },
            )
            .await
        }
    };
    routed(true, "Canary in the status").await?;
    let set_rollback = |on: bool| {
        let (api, name) = (rollouts(&fx.ns), name.clone());
        async move {
            api.patch(
                &name,
                &Default::default(),
                &kube::api::Patch::Merge(json!({"spec": {"rollback": on}})),
            )
            .await
        }
    };
    set_rollback(true).await?;
    routed(false, "spec.rollback").await?;
    set_rollback(false).await?;
    routed(true, "spec.rollback unset").await?;
    // The rollouts can no longer be listed: back to the current version.
    bindings
        .delete(&rbac_name, &DeleteParams::default())
        .await?;
    routed(false, "the rollouts cannot be listed").await?;
    roles.delete(&rbac_name, &DeleteParams::default()).await?;
    let _ = rollouts(&fx.ns)
        .delete(&name, &DeleteParams::default())
        .await;
    drop(op);
    drop(account);
    Ok(())
}
