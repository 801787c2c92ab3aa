//! Changing a plugin without fear, against the real API server: deletion
//! budgets (per reconcile and per minute) stop a plan that deletes too
//! much before any of its writes, until a person raises the budget; a
//! server-side dry run of the whole plan (`dryRunFirst`) stops a plan the
//! API server would refuse half-way before its first write.

use std::sync::Arc;

use anyhow::{Result, bail};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};
use wasmop::cli::config_watch::ConfigWatch;
use wasmop::cli::run::read_config;
use wasmop::delivery::hotswap::PluginDir;
use wasmop::{CompileCache, Limits, LoadOptions, LoadedPlugin, PlanLimits};
use wasmop_tests::interpose::Interposer;
use wasmop_tests::operator::{RunningOperator, plugin_path, sandbox, test_config};
use wasmop_tests::status::wait_event;
use wasmop_tests::{DEFAULT_DEADLINE, TestNamespace, apply_test_crds, wait_for};

fn test_kind(ns: &TestNamespace, kind: &str, plural: &str) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("test.wasmop.dev", "v1", kind),
        plural,
    );
    Api::namespaced_with(ns.client.clone(), &ns.name, &resource)
}

async fn create(api: &Api<DynamicObject>, kind: &str, name: &str, spec: Value) -> Result<()> {
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "test.wasmop.dev/v1", "kind": kind,
        "metadata": {"name": name}, "spec": spec,
    }))?;
    api.create(&PostParams::default(), &obj).await?;
    Ok(())
}

async fn merge_spec(api: &Api<DynamicObject>, name: &str, spec: Value) -> Result<()> {
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": spec})),
    )
    .await?;
    Ok(())
}

/// Loads a built plugin with these plan limits, as the operator
/// configuration file gives them.
fn load(name: &str, plan: PlanLimits) -> Result<Arc<LoadedPlugin>> {
    let options = LoadOptions {
        limits: Limits {
            plan,
            ..Limits::default()
        },
        ..LoadOptions::default()
    };
    Ok(Arc::new(LoadedPlugin::load(
        &sandbox(),
        &plugin_path(name)?,
        &options,
    )?))
}

async fn start(
    client: kube::Client,
    ns: &TestNamespace,
    plugin: Arc<LoadedPlugin>,
) -> Result<RunningOperator> {
    apply_test_crds(&ns.client).await?;
    RunningOperator::start_with(client, vec![ns.name.clone()], vec![plugin], test_config()).await
}

/// An operator whose plugins come from a directory and whose plugin
/// configuration comes from an operator configuration file, both watched
/// as `wasmop run --plugins DIR --config FILE` watches them.
struct Configured {
    op: RunningOperator,
    dir: std::path::PathBuf,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Configured {
    async fn start(ns: &TestNamespace, plugin: &str, config: &str) -> Result<Self> {
        apply_test_crds(&ns.client).await?;
        let dir =
            std::env::temp_dir().join(format!("wasmop-budget-{}-{}", ns.name, std::process::id()));
        std::fs::create_dir_all(&dir)?;
        std::fs::copy(plugin_path(plugin)?, dir.join(format!("{plugin}.wasm")))?;
        let mut this = Self {
            op: RunningOperator::start(ns.client.clone(), vec![ns.name.clone()], vec![]).await?,
            dir,
            tasks: Vec::new(),
        };
        this.write_config(config)?;
        let path = this.dir.join("config.yaml");
        let watch = ConfigWatch::new(path.clone(), read_config(&path)?);
        let options = watch.options_for(CompileCache::default_dir().map(CompileCache::new));
        let mut plugins = PluginDir::new(
            this.dir.clone(),
            sandbox(),
            this.op.operator.clone(),
            options,
        );
        let first = plugins.scan(false).await;
        assert_eq!(first.activated.len(), 1, "{first:?}");
        let poll = std::time::Duration::from_millis(100);
        this.tasks.push(tokio::spawn(plugins.watch(poll)));
        this.tasks.push(tokio::spawn(watch.watch(poll)));
        Ok(this)
    }

    /// Replaces the configuration file atomically, as a ConfigMap volume
    /// update does.
    fn write_config(&self, text: &str) -> Result<()> {
        let tmp = self.dir.join("config.yaml.tmp");
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, self.dir.join("config.yaml"))?;
        Ok(())
    }
}

impl Drop for Configured {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Waits until `name`'s `Reconciled` condition has `reason` at the
/// primary's current generation, and returns it.
async fn wait_reason(api: &Api<DynamicObject>, name: &str, reason: &str) -> Result<Value> {
    wait_for(
        &format!("{name}: Reconciled with reason {reason}"),
        DEFAULT_DEADLINE,
        || async move {
            let obj = api.get(name).await?;
            let generation = obj.metadata.generation;
            let cond = obj.data["status"]["conditions"]
                .as_array()
                .and_then(|c| c.iter().find(|c| c["type"] == "Reconciled"))
                .cloned();
            match cond {
                Some(c)
                    if c["reason"] == reason && c["observedGeneration"].as_i64() == generation =>
                {
                    Ok(Some(c))
                }
                Some(c) => bail!("Reconciled is {c} (generation {generation:?})"),
                None => bail!("no Reconciled condition yet"),
            }
        },
    )
    .await
}

fn assert_names(what: &str, text: &str, needles: &[&str]) {
    for needle in needles {
        assert!(
            text.contains(needle),
            "{what} should name {needle:?}: {text}"
        );
    }
}

/// Names of the ConfigMaps `<prefix>-N` in the namespace that are not being
/// deleted, sorted by N.
async fn fanned_out(cms: &Api<ConfigMap>, prefix: &str) -> Result<Vec<u64>> {
    let mut out: Vec<u64> = cms
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter(|cm| cm.metadata.deletion_timestamp.is_none())
        .filter_map(|cm| {
            cm.metadata
                .name?
                .strip_prefix(&format!("{prefix}-"))?
                .parse()
                .ok()
        })
        .collect();
    out.sort_unstable();
    Ok(out)
}

async fn wait_fanned_out(cms: &Api<ConfigMap>, prefix: &str, count: u64) -> Result<()> {
    wait_for(
        &format!("exactly {prefix}-0 … {prefix}-{}", count - 1),
        DEFAULT_DEADLINE,
        || async move {
            let have = fanned_out(cms, prefix).await?;
            if have == (0..count).collect::<Vec<_>>() {
                Ok(Some(()))
            } else {
                bail!("have {} of them: {have:?}", have.len())
            }
        },
    )
    .await
}

/// A plan deleting 50 objects against a per-reconcile budget of 10 is
/// rejected whole: nothing deleted, nothing applied, the condition and a
/// Warning Event name the rule, the count, the budget and the setting;
/// once a person raises the budget the same plan goes through.
#[tokio::test]
async fn a_plan_over_the_per_reconcile_deletion_budget_writes_nothing_until_it_is_raised()
-> Result<()> {
    let ns = TestNamespace::new("budget-plan").await?;
    let op = Configured::start(&ns, "fanout", "plugins: {fanout: {maxDeletes: 10}}\n").await?;
    let fanouts = test_kind(&ns, "Fanout", "fanouts");
    let cms = ns.api::<ConfigMap>();
    create(&fanouts, "Fanout", "f", json!({"count": 60})).await?;
    wait_reason(&fanouts, "f", "Reconciled").await?;
    wait_fanned_out(&cms, "f", 60).await?;
    let versions: Vec<Option<String>> = {
        let mut out = Vec::new();
        for i in 0..60 {
            out.push(cms.get(&format!("f-{i}")).await?.metadata.resource_version);
        }
        out
    };

    // Down to 10: the plan deletes 50 and applies 10 (changed data: none).
    merge_spec(&fanouts, "f", json!({"count": 10})).await?;
    let cond = wait_reason(&fanouts, "f", "PlanRejected").await?;
    let message = cond["message"].as_str().unwrap_or_default();
    assert_eq!(cond["status"], "False", "{cond}");
    assert_names(
        "the condition",
        message,
        &[
            "DeletionBudgetExceeded",
            "deletes 50 objects",
            "per-reconcile deletion budget of 10",
            "maxDeletes",
        ],
    );
    let (_, note) = wait_event(
        &ns.client,
        &ns.name,
        "f",
        Some("Warning"),
        "PlanRejected",
        DEFAULT_DEADLINE,
    )
    .await?;
    assert_names(
        "the Warning Event",
        &note,
        &["DeletionBudgetExceeded", "deletes 50 objects", "maxDeletes"],
    );
    // Nothing of the plan was written: all 60 objects untouched, and the
    // plugin's status (count 10) not written either.
    for (i, rv) in versions.iter().enumerate() {
        let cm = cms.get(&format!("f-{i}")).await?;
        assert!(cm.metadata.deletion_timestamp.is_none(), "f-{i} deleted");
        assert_eq!(&cm.metadata.resource_version, rv, "f-{i} written");
    }
    assert_eq!(fanouts.get("f").await?.data["status"]["count"], 60);

    // A bad configuration file changes nothing (the running one stays);
    // then a person raises the budget in the file, the plugin is reloaded
    // with it through the hot-swap path, and the deletes proceed.
    let refused = || {
        wasmop::metrics::global()
            .get("wasmop_config_reload_failures_total", &[])
            .unwrap_or(0.0)
    };
    let before = refused();
    op.write_config("plugins: {fanout: {maxDeletes: fifty}}\n")?;
    wait_for(
        "the bad configuration refused",
        DEFAULT_DEADLINE,
        || async {
            if refused() > before {
                Ok(Some(()))
            } else {
                bail!("not read yet")
            }
        },
    )
    .await?;
    assert_eq!(fanned_out(&cms, "f").await?.len(), 60);
    let deleted = || {
        wasmop::metrics::global()
            .get("wasmop_deletes_total", &[("plugin", "fanout")])
            .unwrap_or(0.0)
    };
    let deleted_before = deleted();
    op.write_config("plugins: {fanout: {maxDeletes: 50}}\n")?;
    wait_fanned_out(&cms, "f", 10).await?;
    assert!(
        deleted() >= deleted_before + 50.0,
        "the 50 deletes are counted: {deleted_before} then {}",
        deleted()
    );
    wait_reason(&fanouts, "f", "Reconciled").await?;
    assert_eq!(fanouts.get("f").await?.data["status"]["count"], 10);
    Ok(())
}

/// Two reconciles of two primaries whose deletes together go over the
/// plugin's per-minute budget: the first proceeds, the second is rejected
/// whole and stays rejected until the budget is raised.
#[tokio::test]
async fn deletes_over_the_per_minute_budget_are_held_until_it_is_raised() -> Result<()> {
    let ns = TestNamespace::new("budget-minute").await?;
    let op = Configured::start(
        &ns,
        "fanout",
        "plugins: {fanout: {maxDeletesPerMinute: 8}}\n",
    )
    .await?;
    let fanouts = test_kind(&ns, "Fanout", "fanouts");
    let cms = ns.api::<ConfigMap>();
    for name in ["g", "h"] {
        create(&fanouts, "Fanout", name, json!({"count": 10})).await?;
    }
    for name in ["g", "h"] {
        wait_reason(&fanouts, name, "Reconciled").await?;
        wait_fanned_out(&cms, name, 10).await?;
    }

    // g deletes 5: within the budget of 8.
    merge_spec(&fanouts, "g", json!({"count": 5})).await?;
    wait_fanned_out(&cms, "g", 5).await?;
    wait_reason(&fanouts, "g", "Reconciled").await?;

    // h deletes 5 more in the same minute: 10 > 8, rejected whole.
    merge_spec(&fanouts, "h", json!({"count": 5})).await?;
    let cond = wait_reason(&fanouts, "h", "PlanRejected").await?;
    assert_names(
        "the condition",
        cond["message"].as_str().unwrap_or_default(),
        &[
            "DeletionBudgetExceeded",
            "deletes 5 objects",
            "deleted 5 in the last minute",
            "per-minute deletion budget of 8",
            "maxDeletesPerMinute of plugin fanout",
        ],
    );
    let (_, note) = wait_event(
        &ns.client,
        &ns.name,
        "h",
        Some("Warning"),
        "PlanRejected",
        DEFAULT_DEADLINE,
    )
    .await?;
    assert_names(
        "the Warning Event",
        &note,
        &["DeletionBudgetExceeded", "maxDeletesPerMinute"],
    );
    assert_eq!(fanned_out(&cms, "h").await?, (0..10).collect::<Vec<_>>());
    assert_eq!(fanouts.get("h").await?.data["status"]["count"], 10);

    // Raised in the configuration file: h's deletes proceed.
    op.write_config("plugins: {fanout: {maxDeletesPerMinute: 20}}\n")?;
    wait_fanned_out(&cms, "h", 5).await?;
    wait_reason(&fanouts, "h", "Reconciled").await?;
    Ok(())
}

/// The writes the operator sent to `guardeds`, as `(dry run, path)`.
fn guarded_writes(interposer: &Interposer) -> Vec<(bool, String)> {
    interposer
        .writes()
        .into_iter()
        .filter(|w| {
            w.path
                .split('?')
                .next()
                .unwrap_or_default()
                .contains("/guardeds")
        })
        .map(|w| (w.path.contains("dryRun=All"), w.path))
        .collect()
}

/// A plan whose second object breaks a CEL rule of its CRD: with
/// `dryRunFirst` the dry run catches it and nothing at all is written (no
/// write without `dryRun` reaches the server); without it the first object
/// is written before the API server refuses the second.
#[tokio::test]
async fn a_dry_run_catches_a_cel_invalid_object_before_any_write_of_the_plan() -> Result<()> {
    let dry_ns = TestNamespace::new("budget-dry").await?;
    let (interposer, client) = Interposer::new(dry_ns.client.clone());
    let dry_first = PlanLimits {
        dry_run_first: true,
        ..PlanLimits::default()
    };
    let _dry_op = start(client, &dry_ns, load("guarded", dry_first)?).await?;
    let guards = test_kind(&dry_ns, "Guard", "guards");
    let guarded = test_kind(&dry_ns, "Guarded", "guardeds");
    create(&guards, "Guard", "g", json!({"size": 50})).await?;
    let cond = wait_reason(&guards, "g", "DryRunRefused").await?;
    assert_eq!(cond["status"], "False", "{cond}");
    assert_names(
        "the condition",
        cond["message"].as_str().unwrap_or_default(),
        &[
            "nothing written",
            "Guarded",
            "g-b",
            "size must be at most 10",
        ],
    );
    let (_, note) = wait_event(
        &dry_ns.client,
        &dry_ns.name,
        "g",
        Some("Warning"),
        "DryRunRefused",
        DEFAULT_DEADLINE,
    )
    .await?;
    assert_names(
        "the Warning Event",
        &note,
        &["g-b", "size must be at most 10"],
    );
    assert!(guarded.get_opt("g-a").await?.is_none(), "g-a was written");
    let writes = guarded_writes(&interposer);
    assert!(
        writes.iter().any(|(_, p)| p.contains("/guardeds/g-a"))
            && writes.iter().any(|(_, p)| p.contains("/guardeds/g-b")),
        "both objects dry-run: {writes:?}"
    );
    assert!(
        writes.iter().all(|(dry, _)| *dry),
        "a write without dryRun reached the server: {writes:?}"
    );
    // The plugin's status was not written either.
    assert!(guards.get("g").await?.data["status"].get("size").is_none());

    // Within the rule, the dry run passes and the plan is written.
    merge_spec(&guards, "g", json!({"size": 5})).await?;
    wait_reason(&guards, "g", "Reconciled").await?;
    assert_eq!(guarded.get("g-b").await?.data["spec"]["size"], 5);
    assert!(
        guarded_writes(&interposer).iter().any(|(dry, _)| !dry),
        "the valid plan was written for real"
    );

    // The same plan without dryRunFirst: the first object is written before
    // the API server refuses the second, which the test above would see.
    let ns = TestNamespace::new("budget-nodry").await?;
    let _op = start(
        ns.client.clone(),
        &ns,
        load("guarded", PlanLimits::default())?,
    )
    .await?;
    let guards = test_kind(&ns, "Guard", "guards");
    let guarded = test_kind(&ns, "Guarded", "guardeds");
    create(&guards, "Guard", "h", json!({"size": 50})).await?;
    let cond = wait_reason(&guards, "h", "WriteFailed").await?;
    assert_names(
        "the condition",
        cond["message"].as_str().unwrap_or_default(),
        &["h-b", "size must be at most 10"],
    );
    assert_eq!(guarded.get("h-a").await?.data["spec"]["size"], 1);
    Ok(())
}

/// The real `wasmop run --config FILE`: a plan over the per-reconcile
/// deletion budget is held, and editing the file (as a ConfigMap update
/// does) raises the budget in the running process, without a restart.
#[tokio::test]
async fn wasmop_run_rereads_its_configuration_and_a_raised_budget_lets_the_deletes_proceed()
-> Result<()> {
    let ns = TestNamespace::new("budget-run").await?;
    apply_test_crds(&ns.client).await?;
    let dir = std::env::temp_dir().join(format!("wasmop-budget-run-{}", std::process::id()));
    let plugins = dir.join("plugins");
    std::fs::create_dir_all(&plugins)?;
    std::fs::copy(plugin_path("fanout")?, plugins.join("fanout.wasm"))?;
    let config = dir.join("operator.yaml");
    let write_config = |text: &str| -> Result<()> {
        let tmp = dir.join("operator.yaml.tmp");
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, &config)?;
        Ok(())
    };
    write_config("plugins: {fanout: {maxDeletes: 10}}\n")?;
    let _child = tokio::process::Command::new(env!("CARGO_BIN_EXE_wasmop-under-test"))
        .arg("run")
        .arg("--plugins")
        .arg(&plugins)
        .arg("--config")
        .arg(&config)
        .arg("--poll-interval-ms")
        .arg("200")
        .arg("--kubeconfig")
        .arg(wasmop_tests::kubeconfig_path())
        .arg("--namespace")
        .arg(&ns.name)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true)
        .spawn()?;
    let fanouts = test_kind(&ns, "Fanout", "fanouts");
    let cms = ns.api::<ConfigMap>();
    create(&fanouts, "Fanout", "r", json!({"count": 30})).await?;
    wait_reason(&fanouts, "r", "Reconciled").await?;
    wait_fanned_out(&cms, "r", 30).await?;

    merge_spec(&fanouts, "r", json!({"count": 5})).await?;
    let cond = wait_reason(&fanouts, "r", "PlanRejected").await?;
    assert_names(
        "the condition",
        cond["message"].as_str().unwrap_or_default(),
        &[
            "DeletionBudgetExceeded",
            "deletes 25 objects",
            "deletion budget of 10",
        ],
    );
    assert_eq!(fanned_out(&cms, "r").await?.len(), 30);

    write_config("plugins: {fanout: {maxDeletes: 25}}\n")?;
    wait_fanned_out(&cms, "r", 5).await?;
    wait_reason(&fanouts, "r", "Reconciled").await?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
