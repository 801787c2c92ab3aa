//! What the garbage collector missed, collected by the host: with
//! kube-controller-manager stopped (no garbage collection at all), a Widget
//! deleted and re-created under the same name converges within 5 s of its
//! creation, because the host deletes the old ConfigMap whose owner is gone
//! (Event `CollectedOrphan`). Objects that only look like it — a user's
//! object without our labels, another plugin's, one whose owner is alive,
//! a protected one — are never touched, and neither the refusal path nor
//! the periodic sweep deletes them.
//!
//! These tests stop kube-controller-manager, which every other test of the
//! cluster relies on (namespace deletion, garbage collection), so they live
//! in a test binary of their own and run one at a time.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use serde_json::json;
use wasmop_tests::faults::{Fault, metric};
use wasmop_tests::operator::{RunningOperator, load_plugin};
use wasmop_tests::status::{events, wait_condition, wait_event};
use wasmop_tests::widgets::{create_widget, widgets};
use wasmop_tests::{DEFAULT_DEADLINE, TestNamespace, apply_test_crds, wait_for};

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// What the issue asks: a re-created Widget converges this soon after its
/// creation, the garbage collector stopped.
const CONVERGE_BOUND: Duration = Duration::from_secs(5);

async fn uid_of(api: &Api<DynamicObject>, name: &str) -> Result<String> {
    api.get(name)
        .await?
        .metadata
        .uid
        .context("a Widget without a uid")
}

/// The controller ownerReference's uid of ConfigMap `name`, if it exists.
async fn cm_controller(cms: &Api<ConfigMap>, name: &str) -> Result<Option<String>> {
    Ok(cms.get_opt(name).await?.and_then(|cm| {
        cm.metadata
            .owner_references
            .unwrap_or_default()
            .into_iter()
            .find(|r| r.controller == Some(true))
            .map(|r| r.uid)
    }))
}

/// Waits until `name`'s ConfigMap is controlled by the Widget with `uid`.
async fn wait_cm_owned(cms: &Api<ConfigMap>, widget: &str, uid: &str) -> Result<()> {
    let cm = format!("{widget}-cm");
    wait_for(
        &format!("{cm} controlled by {uid}"),
        DEFAULT_DEADLINE,
        || async {
            match cm_controller(cms, &cm).await? {
                Some(u) if u == uid => Ok(Some(())),
                other => bail!("controlled by {other:?}"),
            }
        },
    )
    .await
}

/// A ConfigMap as a bystander would have made it: `labels`, and a
/// controller ownerReference to a Widget `owner` with `owner_uid`.
fn bystander(name: &str, labels: serde_json::Value, owner: &str, owner_uid: &str) -> ConfigMap {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "labels": labels, "ownerReferences": [{
            "apiVersion": "test.wasmop.dev/v1", "kind": "Widget", "name": owner,
            "uid": owner_uid, "controller": true, "blockOwnerDeletion": false}]},
        "data": {"value": "not the operator's"},
    }))
    .expect("a ConfigMap")
}

/// (uid, resourceVersion) of ConfigMap `name`; fails when it is gone.
async fn identity(cms: &Api<ConfigMap>, name: &str) -> Result<(String, String)> {
    let cm = cms
        .get_opt(name)
        .await?
        .with_context(|| format!("ConfigMap {name} is gone"))?;
    Ok((
        cm.metadata.uid.unwrap_or_default(),
        cm.metadata.resource_version.unwrap_or_default(),
    ))
}

fn collected(found_by: &str) -> f64 {
    metric(
        "wasmop_orphans_collected_total",
        &[
            ("controller", "good/widget"),
            ("kind", "ConfigMap"),
            ("found_by", found_by),
        ],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_widget_recreated_while_the_garbage_collector_is_stopped_converges_within_5s()
-> Result<()> {
    let _serial = SERIAL.lock().await;
    let ns = TestNamespace::new("orphans-recreate").await?;
    apply_test_crds(&ns.client).await?;
    let op = RunningOperator::start(
        ns.client.clone(),
        vec![ns.name.clone()],
        vec![load_plugin("good", json!({}))?],
    )
    .await?;
    let api = widgets(&ns);
    let cms: Api<ConfigMap> = ns.api();
    for name in ["w", "live", "keep"] {
        create_widget(&ns, name).await?;
    }
    let old = uid_of(&api, "w").await?;
    let live = uid_of(&api, "live").await?;
    wait_cm_owned(&cms, "w", &old).await?;
    wait_cm_owned(&cms, "live", &live).await?;

    // No garbage collection from here on.
    let gc = Fault::kill("kube-controller-manager").await?;
    // Bystanders (made now: the garbage collector would delete them),
    // named as plans of Widgets created below will name their
    // ConfigMaps, each controlled by a Widget that does not exist:
    // a user's object without our labels; another plugin's; a protected
    // one of ours. And one of ours whose owner is alive (Widget `live`).
    let gone_uid = "00000000-0000-0000-0000-000000000000";
    let ours = json!({"app.kubernetes.io/managed-by": "wasmop", "wasmop.dev/plugin": "good"});
    let mut protected = ours.clone();
    protected["wasmop.dev/protected"] = json!("true");
    let bystanders = [
        ("user-cm", bystander("user-cm", json!({}), "user", gone_uid)),
        (
            "other-cm",
            bystander(
                "other-cm",
                json!({"app.kubernetes.io/managed-by": "wasmop", "wasmop.dev/plugin": "other"}),
                "other",
                gone_uid,
            ),
        ),
        (
            "guarded-cm",
            bystander("guarded-cm", protected, "guarded", gone_uid),
        ),
        ("alive-cm", bystander("alive-cm", ours, "live", &live)),
    ];
    let mut before = Vec::new();
    for (name, cm) in &bystanders {
        cms.create(&PostParams::default(), cm).await?;
        before.push((*name, identity(&cms, name).await?));
    }

    let refusals_before = collected("refusal");
    api.delete("w", &DeleteParams::background()).await?;
    wait_for("Widget w gone", DEFAULT_DEADLINE, || async {
        Ok(api.get_opt("w").await?.is_none().then_some(()))
    })
    .await?;
    assert_eq!(
        cm_controller(&cms, "w-cm").await?.as_deref(),
        Some(old.as_str()),
        "w-cm should outlive its Widget while the garbage collector is stopped"
    );

    let created = Instant::now();
    create_widget(&ns, "w").await?;
    let new = uid_of(&api, "w").await?;
    assert_ne!(new, old);
    wait_cm_owned(&cms, "w", &new).await?;
    let took = created.elapsed();
    let w = wait_condition(&api, "w", "Ready", "True", None, DEFAULT_DEADLINE).await?;
    eprintln!("Widget w re-created with the garbage collector stopped: converged in {took:?}");
    assert!(
        took <= CONVERGE_BOUND,
        "the re-created Widget took {took:?} to own its ConfigMap, more than {CONVERGE_BOUND:?}"
    );
    assert_eq!(w.metadata.uid.as_deref(), Some(new.as_str()));
    let (kind, note) = wait_event(
        &ns.client,
        &ns.name,
        "w",
        Some("Normal"),
        "CollectedOrphan",
        DEFAULT_DEADLINE,
    )
    .await?;
    assert_eq!(kind, "Normal");
    assert!(
        note.contains("ConfigMap") && note.contains("w-cm") && note.contains(&old),
        "the Event names the object and its gone owner: {note}"
    );
    assert_eq!(collected("refusal") - refusals_before, 1.0);

    // Widgets whose ConfigMaps are taken by the bystanders: each plan is
    // refused and stays refused; nothing of theirs is touched.
    for owner in ["user", "other", "guarded", "alive"] {
        create_widget(&ns, owner).await?;
    }
    for owner in ["user", "other", "guarded", "alive"] {
        let refused = wait_condition(
            &api,
            owner,
            "Reconciled",
            "False",
            Some("PlanRejected"),
            DEFAULT_DEADLINE,
        )
        .await?;
        let message = wasmop_tests::status::condition(&refused, "Reconciled")["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(
            message.contains("NotControlledByPrimary"),
            "{owner}: {message}"
        );
        let evs = events(&ns.client, &ns.name, owner).await?;
        assert!(
            !evs.iter().any(|(_, r, _)| r == "CollectedOrphan"),
            "{owner}: a bystander was collected: {evs:?}"
        );
    }

    // The sweep: Widget keep deleted, not re-created. The sweep collects
    // its ConfigMap, and still none of the bystanders.
    let sweeps_before = collected("sweep");
    api.delete("keep", &DeleteParams::background()).await?;
    wait_for("Widget keep gone", DEFAULT_DEADLINE, || async {
        Ok(api.get_opt("keep").await?.is_none().then_some(()))
    })
    .await?;
    let (looked, swept) = op.operator.sweep_orphans().await;
    eprintln!("sweep: looked at {looked} objects, collected {swept}");
    assert_eq!(swept, 1, "the sweep collects keep-cm and nothing else");
    assert!(looked >= 4, "the sweep looked at {looked} objects");
    assert!(cms.get_opt("keep-cm").await?.is_none());
    assert_eq!(collected("sweep") - sweeps_before, 1.0);
    // A second sweep finds nothing more.
    assert_eq!(op.operator.sweep_orphans().await.1, 0);

    for (name, identity_before) in &before {
        assert_eq!(
            &identity(&cms, name).await?,
            identity_before,
            "bystander {name} was changed"
        );
    }
    gc.start().await?;
    op.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_collects_nothing() -> Result<()> {
    let _serial = SERIAL.lock().await;
    let ns = TestNamespace::new("orphans-follower").await?;
    apply_test_crds(&ns.client).await?;
    let cms: Api<ConfigMap> = ns.api();
    // The garbage collector would delete it on its own.
    let gc = Fault::kill("kube-controller-manager").await?;
    // Ours by every label, controlled by a Widget that does not exist.
    let ours = json!({"app.kubernetes.io/managed-by": "wasmop", "wasmop.dev/plugin": "good"});
    cms.create(
        &PostParams::default(),
        &bystander(
            "gone-cm",
            ours,
            "gone",
            "00000000-0000-0000-0000-000000000001",
        ),
    )
    .await?;
    let before = identity(&cms, "gone-cm").await?;
    let op = RunningOperator::start_follower(
        ns.client.clone(),
        vec![ns.name.clone()],
        vec![load_plugin("good", json!({}))?],
        wasmop_tests::operator::test_config(),
    )
    .await?;
    assert_eq!(op.operator.sweep_orphans().await, (0, 0));
    assert_eq!(identity(&cms, "gone-cm").await?, before);
    // The same operator as leader collects it: the object was a real
    // orphan, so the follower's restraint is what the first assertion saw.
    op.operator
        .leader_flag()
        .store(true, std::sync::atomic::Ordering::SeqCst);
    *op.operator.lease_deadline().lock().expect("lease lock") = None;
    let (_, swept) = op.operator.sweep_orphans().await;
    assert_eq!(swept, 1);
    assert!(cms.get_opt("gone-cm").await?.is_none());
    gc.start().await?;
    op.stop().await;
    Ok(())
}

/// Objects owned by label (a ConfigMap in another namespace, a
/// cluster-scoped Badge) leak when their Labeller goes without its
/// cleanup (its finalizer taken off by hand). The sweep collects them, and
/// leaves alone a look-alike whose owner lives in a namespace this
/// operator does not watch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweep_collects_label_owned_objects_whose_owner_is_gone() -> Result<()> {
    let _serial = SERIAL.lock().await;
    let ns = TestNamespace::new("orphans-label").await?;
    let target = TestNamespace::new("orphans-label-target").await?;
    let elsewhere = TestNamespace::new("orphans-label-elsewhere").await?;
    apply_test_crds(&ns.client).await?;
    let op = RunningOperator::start(
        ns.client.clone(),
        vec![ns.name.clone(), target.name.clone()],
        vec![load_plugin(
            "labeller",
            json!({"targetNamespace": target.name}),
        )?],
    )
    .await?;
    let resource = |kind: &str, plural: &str| {
        kube::core::ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk("test.wasmop.dev", "v1", kind),
            plural,
        )
    };
    let labellers: Api<DynamicObject> = Api::namespaced_with(
        ns.client.clone(),
        &ns.name,
        &resource("Labeller", "labellers"),
    );
    let badges: Api<DynamicObject> = Api::all_with(ns.client.clone(), &resource("Badge", "badges"));
    let labeller = |name: &str| -> Result<DynamicObject> {
        Ok(serde_json::from_value(json!({
            "apiVersion": "test.wasmop.dev/v1", "kind": "Labeller",
            "metadata": {"name": name}, "spec": {"value": name},
        }))?)
    };
    labellers
        .create(&PostParams::default(), &labeller("l")?)
        .await?;
    let cms: Api<ConfigMap> = target.api();
    let badge = format!("{}-l", ns.name);
    wait_for("l's ConfigMap and Badge", DEFAULT_DEADLINE, || async {
        Ok(
            (cms.get_opt("l-mirror").await?.is_some() && badges.get_opt(&badge).await?.is_some())
                .then_some(()),
        )
    })
    .await?;

    // A Labeller in a namespace this operator does not watch, and a
    // ConfigMap in the watched target namespace that names it as owner by
    // label: alive, so never collected.
    let far: Api<DynamicObject> = Api::namespaced_with(
        ns.client.clone(),
        &elsewhere.name,
        &resource("Labeller", "labellers"),
    );
    let far_uid = far
        .create(&PostParams::default(), &labeller("far")?)
        .await?
        .metadata
        .uid
        .context("no uid")?;
    let lookalike: ConfigMap = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "far-mirror", "labels": {
            "app.kubernetes.io/managed-by": "wasmop", "wasmop.dev/plugin": "labeller",
            "wasmop.dev/owner-uid": far_uid}},
    }))?;
    cms.create(&PostParams::default(), &lookalike).await?;
    let lookalike_before = identity(&cms, "far-mirror").await?;

    // l goes without its cleanup: its finalizer taken off by hand, while
    // this operator writes nothing (a follower). As the leader it would
    // reconcile the patch below, put its finalizer back before the delete,
    // and the plugin's own cleanup would then delete l-mirror: the sweep
    // would have nothing left to collect.
    let leader = op.operator.leader_flag();
    leader.store(false, std::sync::atomic::Ordering::SeqCst);
    labellers
        .patch(
            "l",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await?;
    labellers.delete("l", &DeleteParams::background()).await?;
    wait_for("Labeller l gone", DEFAULT_DEADLINE, || async {
        Ok(labellers.get_opt("l").await?.is_none().then_some(()))
    })
    .await?;
    assert!(cms.get_opt("l-mirror").await?.is_some());

    leader.store(true, std::sync::atomic::Ordering::SeqCst);
    let (looked, swept) = op.operator.sweep_orphans().await;
    eprintln!("label sweep: looked at {looked} objects, collected {swept}");
    assert!(cms.get_opt("l-mirror").await?.is_none(), "l-mirror leaked");
    assert!(badges.get_opt(&badge).await?.is_none(), "the Badge leaked");
    assert_eq!(
        identity(&cms, "far-mirror").await?,
        lookalike_before,
        "a label-owned object whose owner lives elsewhere was touched"
    );
    assert!(swept >= 2, "collected {swept}");
    op.stop().await;
    Ok(())
}

/// Collections count against the plugin's per-minute deletion budget: a
/// leak of three objects, with `maxDeletesPerMinute: 2`, is collected two
/// now and the third deferred (counted, not deleted); the plugin's plans go
/// on (that a collection never marks the budget exceeded is the unit test
/// of `execute/budget.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collections_wait_for_room_in_the_plugins_deletion_budget() -> Result<()> {
    let _serial = SERIAL.lock().await;
    let ns = TestNamespace::new("orphans-budget").await?;
    apply_test_crds(&ns.client).await?;
    let cms: Api<ConfigMap> = ns.api();
    let gc = Fault::kill("kube-controller-manager").await?;
    let ours = json!({"app.kubernetes.io/managed-by": "wasmop", "wasmop.dev/plugin": "good"});
    for i in 1..=3 {
        cms.create(
            &PostParams::default(),
            &bystander(
                &format!("gone{i}-cm"),
                ours.clone(),
                &format!("gone{i}"),
                &format!("00000000-0000-0000-0000-00000000000{i}"),
            ),
        )
        .await?;
    }
    let mut options = wasmop::plugin::LoadOptions {
        settings: json!({}),
        ..wasmop::plugin::LoadOptions::default()
    };
    options.limits.plan.max_deletes_per_minute = 2;
    let path = wasmop_tests::operator::plugin_path("good")?;
    let plugin =
        wasmop::plugin::LoadedPlugin::load(&wasmop_tests::operator::sandbox(), &path, &options)?;
    let op = RunningOperator::start(
        ns.client.clone(),
        vec![ns.name.clone()],
        vec![std::sync::Arc::new(plugin)],
    )
    .await?;
    let deferred = || {
        metric(
            "wasmop_orphans_deferred_total",
            &[("controller", "good/widget")],
        )
    };
    let deferred_before = deferred();
    let (looked, swept) = op.operator.sweep_orphans().await;
    assert_eq!((looked, swept), (3, 2), "two collected, the third waits");
    assert_eq!(deferred() - deferred_before, 1.0);
    let mut left = Vec::new();
    for i in 1..=3 {
        if cms.get_opt(&format!("gone{i}-cm")).await?.is_some() {
            left.push(i);
        }
    }
    assert_eq!(left.len(), 1, "exactly one left: {left:?}");
    // Within the same minute a second sweep still waits.
    assert_eq!(op.operator.sweep_orphans().await.1, 0);
    assert_eq!(deferred() - deferred_before, 2.0);
    // The plugin's own plans go on: a Widget converges.
    create_widget(&ns, "fresh").await?;
    wait_condition(
        &widgets(&ns),
        "fresh",
        "Reconciled",
        "True",
        None,
        DEFAULT_DEADLINE,
    )
    .await?;
    gc.start().await?;
    op.stop().await;
    Ok(())
}

/// The controller ownerReference's uid of `meta`, if any.
fn controller_of(meta: &kube::api::ObjectMeta) -> Option<String> {
    meta.owner_references
        .as_ref()?
        .iter()
        .find(|r| r.controller == Some(true))
        .map(|r| r.uid.clone())
}

/// An instance (a StatefulSet, Deployments and their support objects)
/// deleted and re-created while kube-controller-manager is frozen: the
/// host collects every object of the old instance (its owner is gone), and
/// one Event names each of them (a dozen objects: the note is cut to the
/// API server's 1,024 bytes, not refused). Then the API server restarts and
/// etcd is compacted, so the thawed controller-manager re-lists instead of
/// resuming its watches; the instance becomes Ready again with a Pod of its
/// new StatefulSet, the old one's Pod gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_recreated_while_the_controller_manager_is_frozen_is_ready_again_with_new_pods()
-> Result<()> {
    use k8s_openapi::api::apps::v1::StatefulSet;
    use k8s_openapi::api::core::v1::Pod;
    use kube::core::{ApiResource, GroupVersionKind};
    use wasmop_tests::apply_project_crds;
    use wasmop_tests::faults::component;

    const DEADLINE: Duration = Duration::from_secs(180);
    let _serial = SERIAL.lock().await;
    let ns = TestNamespace::new("orphans-workload").await?;
    apply_project_crds(&ns.client).await?;
    let op = RunningOperator::start(
        ns.client.clone(),
        vec![ns.name.clone()],
        vec![load_plugin("instance", json!({}))?],
    )
    .await?;
    let gvk = GroupVersionKind::gvk("compute.firebolt.io", "v1alpha1", "FireboltInstance");
    let api: Api<DynamicObject> = Api::namespaced_with(
        ns.client.clone(),
        &ns.name,
        &ApiResource::from_gvk_with_plural(&gvk, "fireboltinstances"),
    );
    let instance: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "compute.firebolt.io/v1alpha1", "kind": "FireboltInstance",
        "metadata": {"name": "fb"}, "spec": {"metadata": {}, "gateway": {}},
    }))?;
    let statefulsets: Api<StatefulSet> = ns.api();
    let pods: Api<Pod> = ns.api();
    let (sts, pod) = ("fb-metadata-pg", "fb-metadata-pg-0");

    api.create(&PostParams::default(), &instance).await?;
    wait_condition(&api, "fb", "Ready", "True", None, DEADLINE).await?;
    let old_sts = statefulsets
        .get(sts)
        .await?
        .metadata
        .uid
        .context("a StatefulSet without a uid")?;
    let old_pod = pods.get(pod).await?;
    assert_eq!(controller_of(&old_pod.metadata), Some(old_sts.clone()));

    let kcm = Fault::freeze("kube-controller-manager").await?;
    let old_uid = uid_of(&api, "fb").await?;
    api.delete("fb", &DeleteParams::background()).await?;
    wait_for("the instance gone", DEFAULT_DEADLINE, || async {
        Ok(api.get_opt("fb").await?.is_none().then_some(()))
    })
    .await?;
    api.create(&PostParams::default(), &instance).await?;
    let new_uid = uid_of(&api, "fb").await?;
    assert_ne!(new_uid, old_uid);
    // The host collects the old objects.
    wait_for(
        "a CollectedOrphan Event naming the StatefulSet",
        DEFAULT_DEADLINE,
        || async {
            Ok(events(&ns.client, &ns.name, "fb")
                .await?
                .into_iter()
                .any(|(kind, reason, note)| {
                    kind == "Normal"
                        && reason == "CollectedOrphan"
                        && note.len() <= 1024
                        && note.contains(&format!("StatefulSet {}/{sts}", ns.name))
                        && note.contains(&old_uid)
                })
                .then_some(()))
        },
    )
    .await?;

    // The controller-manager's watches cannot resume: the API server
    // restarts and etcd forgets the revisions they were at.
    component(&["restart", "kube-apiserver", "--down", "0"]).await?;
    component(&["compact-etcd", "--bump", "3"]).await?;
    kcm.thaw().await?;

    // The new StatefulSet's own Pod, and the instance Ready again.
    let new_sts = wait_for(
        "Pod fb-metadata-pg-0 of a new StatefulSet",
        DEADLINE,
        || async {
            let (Some(s), Some(p)) = (statefulsets.get_opt(sts).await?, pods.get_opt(pod).await?)
            else {
                return Ok(None);
            };
            let uid = s.metadata.uid.clone().unwrap_or_default();
            Ok((uid != old_sts
                && s.metadata.deletion_timestamp.is_none()
                && p.metadata.deletion_timestamp.is_none()
                && controller_of(&p.metadata).as_deref() == Some(uid.as_str()))
            .then_some(uid))
        },
    )
    .await
    .with_context(|| "the old StatefulSet's Pod stayed: the garbage collector lost it")?;
    assert_eq!(
        controller_of(&statefulsets.get(sts).await?.metadata),
        Some(new_uid.clone()),
        "the new StatefulSet is the new instance's"
    );
    assert_ne!(new_sts, old_sts);
    wait_condition(&api, "fb", "Ready", "True", None, DEADLINE).await?;
    op.stop().await;
    Ok(())
}

/// Collection happens only where the controller writes the kind: a
/// ConfigMap a user labelled to look like one of `labeller`'s (its
/// labels, a made-up owner UID) in a watched namespace that is not the
/// plugin's write namespace stays, while the same look-alike in the write
/// namespace, whose owner is as gone, is collected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_look_alike_outside_the_write_namespaces_is_never_collected() -> Result<()> {
    let _serial = SERIAL.lock().await;
    let ns = TestNamespace::new("orphans-where").await?;
    let target = TestNamespace::new("orphans-where-target").await?;
    apply_test_crds(&ns.client).await?;
    let op = RunningOperator::start(
        ns.client.clone(),
        vec![ns.name.clone(), target.name.clone()],
        vec![load_plugin(
            "labeller",
            json!({"targetNamespace": target.name}),
        )?],
    )
    .await?;
    let made_up = "00000000-0000-0000-0000-00000000dead";
    let look_alike = |name: &str| -> Result<ConfigMap> {
        Ok(serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "labels": {
                "app.kubernetes.io/managed-by": "wasmop", "wasmop.dev/plugin": "labeller",
                "wasmop.dev/owner-uid": made_up}},
            "data": {"value": "the user's"},
        }))?)
    };
    let home: Api<ConfigMap> = ns.api();
    let written: Api<ConfigMap> = target.api();
    home.create(&PostParams::default(), &look_alike("users-mirror")?)
        .await?;
    written
        .create(&PostParams::default(), &look_alike("gone-mirror")?)
        .await?;
    let before = identity(&home, "users-mirror").await?;
    let (looked, swept) = op.operator.sweep_orphans().await;
    eprintln!("sweep: looked at {looked} objects, collected {swept}");
    assert!(
        written.get_opt("gone-mirror").await?.is_none(),
        "the look-alike in the write namespace, its owner gone, is collected"
    );
    assert_eq!(
        identity(&home, "users-mirror").await?,
        before,
        "a look-alike outside the write namespaces was touched"
    );
    op.stop().await;
    Ok(())
}
