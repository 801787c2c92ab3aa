//! The host against the real local control plane with real `.wasm` test
//! plugins (tests/plugins/): ownership rules, sandbox failures, empty
//! plans, crash and restart. Every misbehaving plugin must leave the
//! cluster unchanged, set a readable `Reconciled` condition, and leave the
//! other plugins reconciling.

use std::time::Duration;

use anyhow::{Result, bail};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};
use wasmop_tests::operator::{RunningOperator, load_plugin};
use wasmop_tests::{DEFAULT_DEADLINE, TestNamespace, apply_test_crds, wait_for};

fn test_kind(ns: &TestNamespace, kind: &str, plural: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("test.wasmop.dev", "v1", kind);
    let ar = ApiResource::from_gvk_with_plural(&gvk, plural);
    Api::namespaced_with(ns.client.clone(), &ns.name, &ar)
}

async fn create(
    api: &Api<DynamicObject>,
    kind: &str,
    name: &str,
    spec: Value,
) -> Result<DynamicObject> {
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "test.wasmop.dev/v1", "kind": kind,
        "metadata": {"name": name}, "spec": spec,
    }))?;
    Ok(api.create(&PostParams::default(), &obj).await?)
}

/// Waits until condition `type_` of `name` has `status`, returns it.
async fn wait_condition(
    api: &Api<DynamicObject>,
    name: &str,
    type_: &str,
    status: &str,
) -> Result<Value> {
    wait_for(
        &format!("{name}: condition {type_}={status}"),
        DEFAULT_DEADLINE,
        || {
            let api = api.clone();
            async move {
                let obj = api.get(name).await?;
                let conds = obj.data["status"]["conditions"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                let c = conds.into_iter().find(|c| c["type"] == type_);
                match c {
                    Some(c) if c["status"] == status => Ok(Some(c)),
                    Some(c) => bail!("condition is {c}"),
                    None => bail!("no {type_} condition yet; status: {}", obj.data["status"]),
                }
            }
        },
    )
    .await
}

async fn configmap_names(ns: &TestNamespace) -> Result<Vec<String>> {
    let cms: Api<ConfigMap> = ns.api();
    let mut names: Vec<String> = cms
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .filter(|n| n != "kube-root-ca.crt")
        .collect();
    names.sort();
    Ok(names)
}

async fn start(ns: &TestNamespace, plugins: &[&str]) -> Result<RunningOperator> {
    apply_test_crds(&ns.client).await?;
    let loaded = plugins
        .iter()
        .map(|p| load_plugin(p, json!({})))
        .collect::<Result<Vec<_>>>()?;
    RunningOperator::start(ns.client.clone(), vec![ns.name.clone()], loaded).await
}

#[tokio::test]
async fn good_plugin_creates_updates_and_garbage_collects_its_objects() -> Result<()> {
    creates_updates_and_garbage_collects("good", "host-good").await
}

/// The same for good's port to JavaScript (`tests/polyglot/good-js`).
#[tokio::test]
async fn good_in_javascript_creates_updates_and_garbage_collects_its_objects() -> Result<()> {
    creates_updates_and_garbage_collects("good-js", "host-good-js").await
}

/// The same for good's port to Python (`tests/polyglot/good-py`).
#[tokio::test]
async fn good_in_python_creates_updates_and_garbage_collects_its_objects() -> Result<()> {
    creates_updates_and_garbage_collects("good-py", "host-good-py").await
}

/// `plugin` (good or one of its ports) creates a Widget's ConfigMap,
/// follows a spec change and leaves the ConfigMap to garbage collection
/// when the Widget goes.
async fn creates_updates_and_garbage_collects(plugin: &str, prefix: &str) -> Result<()> {
    let ns = TestNamespace::new(prefix).await?;
    let _op = start(&ns, &[plugin]).await?;
    let widgets = test_kind(&ns, "Widget", "widgets");
    create(&widgets, "Widget", "w1", json!({"value": "one"})).await?;

    let cond = wait_condition(&widgets, "w1", "Reconciled", "True").await?;
    assert_eq!(cond["reason"], "Reconciled");
    let cms: Api<ConfigMap> = ns.api();
    let cm = cms.get("w1-cm").await?;
    assert_eq!(
        cm.data.unwrap_or_default().get("value").map(String::as_str),
        Some("one")
    );
    let labels = cm.metadata.labels.unwrap_or_default();
    assert_eq!(
        labels
            .get("app.kubernetes.io/managed-by")
            .map(String::as_str),
        Some("wasmop")
    );
    let owners = cm.metadata.owner_references.unwrap_or_default();
    assert_eq!(owners.len(), 1);
    assert_eq!(owners[0].kind, "Widget");
    assert_eq!(owners[0].controller, Some(true));
    let w1 = widgets.get("w1").await?;
    assert_eq!(w1.data["status"]["observedGeneration"], json!(1));

    // A spec change reaches the ConfigMap.
    widgets
        .patch(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"value": "two"}})),
        )
        .await?;
    wait_for(
        "the ConfigMap to follow the spec change",
        DEFAULT_DEADLINE,
        || {
            let cms = cms.clone();
            async move {
                let cm = cms.get("w1-cm").await?;
                Ok(
                    (cm.data.unwrap_or_default().get("value").map(String::as_str) == Some("two"))
                        .then_some(()),
                )
            }
        },
    )
    .await?;

    // Deleting the primary garbage-collects what it owned.
    widgets.delete("w1", &DeleteParams::background()).await?;
    wait_for(
        "the ConfigMap to be garbage-collected",
        DEFAULT_DEADLINE,
        || {
            let cms = cms.clone();
            async move { Ok(cms.get_opt("w1-cm").await?.is_none().then_some(())) }
        },
    )
    .await?;
    Ok(())
}

/// What benchmarks follow progress with instead of a watch of their own:
/// the operator's cache hands each Widget it stores to its observers, the
/// status the operator wrote included, and forgets an observer that left.
#[tokio::test]
async fn the_cache_hands_every_stored_object_to_its_observers() -> Result<()> {
    let ns = TestNamespace::new("host-observe").await?;
    let op = start(&ns, &["good"]).await?;
    let cache = op
        .operator
        .cache()
        .kind(&wasmop::watch::cache::KindKey::new(
            "test.wasmop.dev",
            "v1",
            "Widget",
        ))
        .expect("the operator caches Widgets once good is loaded");
    let mut stored = cache.observe();
    let left = cache.observe();
    drop(left);
    let widgets = test_kind(&ns, "Widget", "widgets");
    create(&widgets, "Widget", "w1", json!({"value": "one"})).await?;
    let deadline = tokio::time::Instant::now() + DEFAULT_DEADLINE;
    let mut versions = Vec::new();
    let mut first_ready = None;
    loop {
        let w = tokio::time::timeout_at(deadline, stored.recv())
            .await
            .map_err(|_| anyhow::anyhow!("no Ready Widget observed; saw {versions:?}"))?
            .expect("the observer stays registered while its receiver lives");
        assert_eq!((w.namespace(), w.name()), (ns.name.as_str(), "w1"));
        versions.push(w.resource_version().to_owned());
        let ready = w.value()["status"]["conditions"]
            .as_array()
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            });
        first_ready.get_or_insert(ready);
        if ready {
            break;
        }
    }
    // The first object observed is the Widget as created, without status;
    // the operator's status write came back through the same watch.
    assert_eq!(first_ready, Some(false), "{versions:?}");
    assert!(versions.len() >= 2, "{versions:?}");
    Ok(())
}

#[tokio::test]
async fn status_write_does_not_retrigger_the_primary() -> Result<()> {
    let ns = TestNamespace::new("host-noloop").await?;
    let _op = start(&ns, &["good"]).await?;
    let widgets = test_kind(&ns, "Widget", "widgets");
    create(&widgets, "Widget", "w", json!({"value": "v"})).await?;
    wait_condition(&widgets, "w", "Reconciled", "True").await?;
    let rv = widgets.get("w").await?.metadata.resource_version;
    // A status write that re-triggered `w` would loop: each pass rewrites
    // the status and bumps the resourceVersion. Instead of waiting for a
    // while, reconcile a second Widget to completion on the same operator;
    // by then a loop on `w` would have written again.
    create(&widgets, "Widget", "marker", json!({"value": "m"})).await?;
    wait_condition(&widgets, "marker", "Reconciled", "True").await?;
    let marker_cm: Api<ConfigMap> = ns.api();
    assert!(marker_cm.get_opt("marker-cm").await?.is_some());
    assert_eq!(
        widgets.get("w").await?.metadata.resource_version,
        rv,
        "no further write on w"
    );
    Ok(())
}

#[tokio::test]
async fn plan_writing_an_unowned_kind_writes_nothing_and_others_go_on() -> Result<()> {
    let ns = TestNamespace::new("host-badwriter").await?;
    let _op = start(&ns, &["good", "bad-writer"]).await?;
    let bad = test_kind(&ns, "BadWriter", "badwriters");
    create(&bad, "BadWriter", "bw", json!({})).await?;
    let cond = wait_condition(&bad, "bw", "Reconciled", "False").await?;
    assert_eq!(cond["reason"], "PlanRejected");
    let msg = cond["message"].as_str().unwrap_or_default();
    assert!(msg.contains("Secret"), "message names the kind: {msg}");

    // The plan also held a legal ConfigMap: all-or-nothing means it is absent.
    assert_eq!(configmap_names(&ns).await?, Vec::<String>::new());
    let secrets: Api<Secret> = ns.api();
    let managed = secrets
        .list(&ListParams::default().labels("app.kubernetes.io/managed-by=wasmop"))
        .await?;
    assert!(managed.items.is_empty());

    // The other plugin keeps reconciling.
    let widgets = test_kind(&ns, "Widget", "widgets");
    create(&widgets, "Widget", "ok", json!({"value": "x"})).await?;
    wait_condition(&widgets, "ok", "Reconciled", "True").await?;
    Ok(())
}

#[tokio::test]
async fn plan_deleting_another_owners_object_is_refused() -> Result<()> {
    let ns = TestNamespace::new("host-baddeleter").await?;
    let _op = start(&ns, &["bad-deleter"]).await?;
    let cms: Api<ConfigMap> = ns.api();
    let victim: ConfigMap = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "victim", "labels": {"app.kubernetes.io/managed-by": "wasmop"}},
        "data": {"precious": "yes"}
    }))?;
    let victim = cms.create(&PostParams::default(), &victim).await?;
    let bad = test_kind(&ns, "BadDeleter", "baddeleters");
    create(
        &bad,
        "BadDeleter",
        "bd",
        json!({
            "victim": "victim",
            "victimUid": victim.metadata.uid,
            "victimResourceVersion": victim.metadata.resource_version,
        }),
    )
    .await?;
    let cond = wait_condition(&bad, "bd", "Reconciled", "False").await?;
    assert_eq!(cond["reason"], "PlanRejected");
    assert!(
        cond["message"]
            .as_str()
            .unwrap_or_default()
            .contains("victim")
    );
    let still = cms.get("victim").await?;
    assert_eq!(still.metadata.uid, victim.metadata.uid);
    Ok(())
}

/// Each misbehaving plugin fails its reconcile with a readable reason and
/// changes nothing in the cluster, while `good` goes on.
async fn sandbox_failure(
    prefix: &str,
    plugin: &str,
    kind: &str,
    plural: &str,
    reason: &str,
    needle: &str,
) -> Result<()> {
    let ns = TestNamespace::new(prefix).await?;
    let _op = start(&ns, &["good", plugin]).await?;
    let api = test_kind(&ns, kind, plural);
    create(&api, kind, "x", json!({})).await?;
    let cond = wait_condition(&api, "x", "Reconciled", "False").await?;
    assert_eq!(cond["reason"], reason, "condition: {cond}");
    let msg = cond["message"].as_str().unwrap_or_default();
    assert!(
        msg.to_lowercase().contains(needle),
        "message {msg:?} should mention {needle:?}"
    );
    assert_eq!(
        configmap_names(&ns).await?,
        Vec::<String>::new(),
        "nothing written"
    );

    let widgets = test_kind(&ns, "Widget", "widgets");
    create(&widgets, "Widget", "ok", json!({"value": "x"})).await?;
    wait_condition(&widgets, "ok", "Reconciled", "True").await?;
    assert_eq!(configmap_names(&ns).await?, vec!["ok-cm".to_string()]);
    Ok(())
}

#[tokio::test]
async fn endless_loop_hits_the_deadline() -> Result<()> {
    sandbox_failure(
        "host-looper",
        "looper",
        "Looper",
        "loopers",
        "PluginTimedOut",
        "deadline",
    )
    .await
}

#[tokio::test]
async fn unbounded_allocation_hits_the_memory_cap() -> Result<()> {
    sandbox_failure(
        "host-hog",
        "hog",
        "Hog",
        "hogs",
        "PluginOutOfMemory",
        "memory",
    )
    .await
}

#[tokio::test]
async fn panic_is_reported_with_its_message() -> Result<()> {
    sandbox_failure(
        "host-panicker",
        "panicker",
        "Panicker",
        "panickers",
        "PluginTrapped",
        "deliberate panic",
    )
    .await
}

#[tokio::test]
async fn malformed_output_is_rejected() -> Result<()> {
    sandbox_failure(
        "host-malformed",
        "malformed",
        "Malformed",
        "malformeds",
        "PluginOutputMalformed",
        "json",
    )
    .await
}

#[tokio::test]
async fn empty_plan_never_deletes_children() -> Result<()> {
    let ns = TestNamespace::new("host-emptyplan").await?;
    let _op = start(&ns, &["empty-plan"]).await?;
    let api = test_kind(&ns, "EmptyPlan", "emptyplans");
    let primary = create(&api, "EmptyPlan", "e", json!({})).await?;
    let cms: Api<ConfigMap> = ns.api();
    let child: ConfigMap = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {
            "name": "child",
            "labels": {"app.kubernetes.io/managed-by": "wasmop", "wasmop.dev/plugin": "empty-plan"},
            "ownerReferences": [{
                "apiVersion": "test.wasmop.dev/v1", "kind": "EmptyPlan", "name": "e",
                "uid": primary.metadata.uid, "controller": true, "blockOwnerDeletion": true
            }]
        }
    }))?;
    cms.create(&PostParams::default(), &child).await?;
    // Touch the child so the primary is reconciled with it in the snapshot.
    cms.patch(
        "child",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"touched": "yes"}})),
    )
    .await?;
    wait_condition(&api, "e", "Reconciled", "True").await?;
    let gen_before = api.get("e").await?.data["status"]["observedGeneration"].clone();
    assert_eq!(gen_before, json!(1));
    assert!(
        cms.get_opt("child").await?.is_some(),
        "the child must survive an empty plan"
    );
    Ok(())
}

#[tokio::test]
async fn crash_mid_reconcile_and_restart_converges_without_duplicates() -> Result<()> {
    let ns = TestNamespace::new("host-restart").await?;
    apply_test_crds(&ns.client).await?;
    let widgets = test_kind(&ns, "Widget", "widgets");
    const N: usize = 20;
    let op = start(&ns, &["good"]).await?;
    for i in 0..N {
        create(
            &widgets,
            "Widget",
            &format!("w{i:02}"),
            json!({"value": format!("v{i}")}),
        )
        .await?;
    }
    // Crash as soon as the first objects are written: some primaries are
    // done, some in flight, some untouched.
    wait_for("the first ConfigMap", DEFAULT_DEADLINE, || {
        let ns = &ns;
        async move { Ok((!configmap_names(ns).await?.is_empty()).then_some(())) }
    })
    .await?;
    op.kill();

    let _op = start(&ns, &["good"]).await?;
    let expected: Vec<String> = (0..N).map(|i| format!("w{i:02}-cm")).collect();
    wait_for(
        "every Widget to have its ConfigMap",
        DEFAULT_DEADLINE + Duration::from_secs(30),
        || {
            let ns = &ns;
            let expected = &expected;
            async move { Ok((configmap_names(ns).await? == *expected).then_some(())) }
        },
    )
    .await?;
    for i in 0..N {
        wait_condition(&widgets, &format!("w{i:02}"), "Reconciled", "True").await?;
    }
    let cms: Api<ConfigMap> = ns.api();
    for cm in cms
        .list(&ListParams::default().labels("app.kubernetes.io/managed-by=wasmop"))
        .await?
        .items
    {
        assert_eq!(cm.metadata.owner_references.unwrap_or_default().len(), 1);
    }
    assert_eq!(
        configmap_names(&ns).await?,
        expected,
        "exactly one ConfigMap per Widget"
    );
    Ok(())
}

#[tokio::test]
async fn referenced_object_retriggers_its_referrer_and_finalizer_holds_deletion() -> Result<()> {
    referrer_follows_its_reference("referrer", "host-referrer").await
}

/// The same for referrer's port to JavaScript (`tests/polyglot/referrer-js`).
#[tokio::test]
async fn referrer_in_javascript_follows_its_reference_and_holds_deletion() -> Result<()> {
    referrer_follows_its_reference("referrer-js", "host-referrer-js").await
}

/// The same for referrer's port to Python (`tests/polyglot/referrer-py`).
#[tokio::test]
async fn referrer_in_python_follows_its_reference_and_holds_deletion() -> Result<()> {
    referrer_follows_its_reference("referrer-py", "host-referrer-py").await
}

/// `plugin` (referrer or one of its ports): the read by field reference
/// re-triggers it, it sets spec.id once, and its finalizer holds the
/// deletion until spec.allowCleanup.
async fn referrer_follows_its_reference(plugin: &str, prefix: &str) -> Result<()> {
    let ns = TestNamespace::new(prefix).await?;
    let _op = start(&ns, &[plugin]).await?;
    let api = test_kind(&ns, "Referrer", "referrers");
    let cms: Api<ConfigMap> = ns.api();
    create(&api, "Referrer", "r", json!({"configRef": "src"})).await?;

    // Finalizer first, the set-once spec.id, and a status saying the
    // referenced ConfigMap is missing. The plan asks for no requeue.
    let r = wait_for(
        "the finalizer, spec.id and status",
        DEFAULT_DEADLINE,
        || {
            let api = api.clone();
            async move {
                let r = api.get("r").await?;
                let ok = r.metadata.finalizers.clone().unwrap_or_default()
                    == vec!["test.wasmop.dev/cleanup".to_string()]
                    && r.data["spec"]["id"]
                        .as_str()
                        .is_some_and(|s| s.starts_with("id-"))
                    && r.data["status"]["configFound"] == json!(false);
                Ok(ok.then_some(r))
            }
        },
    )
    .await?;
    let uid = r.metadata.uid.clone().unwrap_or_default();
    assert_eq!(r.data["spec"]["id"], json!(format!("id-{}", &uid[..8])));
    assert!(cms.get_opt("r-copy").await?.is_none());

    // Creating the referenced ConfigMap re-triggers the referrer through the
    // reference index (no requeue, no backoff pending).
    let src: ConfigMap = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "src"}, "data": {"k": "one"}
    }))?;
    cms.create(&PostParams::default(), &src).await?;
    let copy_has = |v: &'static str| {
        let cms = cms.clone();
        move || {
            let cms = cms.clone();
            async move {
                let c = cms.get_opt("r-copy").await?;
                Ok(c.filter(|c| {
                    c.data
                        .clone()
                        .unwrap_or_default()
                        .get("k")
                        .map(String::as_str)
                        == Some(v)
                })
                .map(|_| ()))
            }
        }
    };
    wait_for(
        "the copy of the referenced ConfigMap",
        DEFAULT_DEADLINE,
        copy_has("one"),
    )
    .await?;
    cms.patch(
        "src",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "two"}})),
    )
    .await?;
    wait_for(
        "the copy to follow the referenced ConfigMap",
        DEFAULT_DEADLINE,
        copy_has("two"),
    )
    .await?;
    // spec.id is set once: still the same.
    assert_eq!(
        api.get("r").await?.data["spec"]["id"],
        json!(format!("id-{}", &uid[..8]))
    );

    // Deletion waits for the plugin to say cleanup is complete.
    api.delete("r", &DeleteParams::background()).await?;
    wait_for(
        "the CleanupBlocked event's effect: still present, deleting",
        DEFAULT_DEADLINE,
        || {
            let api = api.clone();
            async move {
                let r = api.get_opt("r").await?;
                Ok(r.filter(|r| r.metadata.deletion_timestamp.is_some())
                    .map(|_| ()))
            }
        },
    )
    .await?;
    api.patch(
        "r",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"allowCleanup": true}})),
    )
    .await?;
    wait_for(
        "the finalizer to be released and the Referrer gone",
        DEFAULT_DEADLINE,
        || {
            let api = api.clone();
            async move { Ok(api.get_opt("r").await?.is_none().then_some(())) }
        },
    )
    .await?;
    Ok(())
}

/// A kind whose CRD is installed after its watch started (an optional kind
/// of a plugin, say): its watch fails while the API server does not serve
/// it, the cache is not synced, and once the CRD is there the first list
/// syncs the cache and is announced as a `listed` change, although it
/// held no object. The operator's router re-queues the primaries of the
/// controllers that found the kind absent on that change; without it, a
/// primary waiting for the kind would wait for some unrelated change.
#[tokio::test]
async fn a_kind_served_late_is_announced_when_first_listed() -> Result<()> {
    use wasmop::watch::cache::{Cache, KindKey, WatchSpec};
    let ns = TestNamespace::new("host-late-kind").await?;
    let crd_name = "lates.late.test.wasmop.dev";
    wasmop_tests::delete_crds(&ns.client, &[crd_name.to_owned()]).await?;
    let (cache, mut changes) = Cache::new(ns.client.clone(), vec![ns.name.clone()]);
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("late.test.wasmop.dev", "v1", "Late"),
        "lates",
    );
    let key = KindKey::new("late.test.wasmop.dev", "v1", "Late");
    let kc = cache.ensure(WatchSpec {
        resource,
        namespaced: true,
        managed_only: false,
        selector: None,
    });
    let errors = || {
        wasmop_tests::faults::metric(
            "wasmop_watch_errors_total",
            &[("kind", &key.to_string()), ("reason", "rejected")],
        )
    };
    wait_for(
        "the watch of the unserved kind to fail",
        DEFAULT_DEADLINE,
        || async { Ok((errors() >= 1.0).then_some(())) },
    )
    .await?;
    assert!(!kc.synced(), "a kind the API server does not serve synced");

    let file = std::env::temp_dir().join(format!("wasmop-late-crd-{}.yaml", std::process::id()));
    std::fs::write(
        &file,
        serde_json::to_string(&json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": crd_name},
            "spec": {
                "group": "late.test.wasmop.dev", "scope": "Namespaced",
                "names": {"kind": "Late", "plural": "lates", "singular": "late", "listKind": "LateList"},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}],
            },
        }))?,
    )?;
    let applied = wasmop_tests::apply_crd_files(&ns.client, std::slice::from_ref(&file)).await;
    let _ = std::fs::remove_file(&file);
    applied?;
    let deadline = tokio::time::Instant::now() + DEFAULT_DEADLINE;
    let announced = loop {
        let change = tokio::time::timeout_at(deadline, changes.recv())
            .await
            .map_err(|_| anyhow::anyhow!("no listed change for {key} after its CRD appeared"))?
            .expect("the cache's change channel stays open while the cache lives");
        if change.kind == key {
            break change;
        }
    };
    assert!(announced.is_listed(), "{announced:?}");
    assert!(kc.synced());
    assert_eq!(kc.len(), 0);
    cache.stop();
    wasmop_tests::delete_crds(&ns.client, &[crd_name.to_owned()]).await?;
    Ok(())
}
