//! Ownership v2 (issue 11) against the real local control plane, each test
//! a case a user can hit: nothing is ever adopted silently, objects owned
//! by label live and die with their primary where ownerReferences cannot
//! work, every write is fenced (by what was judged, by leadership, by the
//! primary's resourceVersion), a kind narrowed to its primary's namespace
//! is written nowhere else, and Secret values stay out of logs, Events and
//! conditions.
//!
//! Races are made deterministic with an interposed client
//! (`wasmop_tests::interpose`): the operator's requests pass unchanged to
//! the real API server, and a test acts just before a chosen one is sent.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use anyhow::{Result, bail, ensure};
use http::Method;
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use wasmop_tests::interpose::{Interposer, nth, request_to};
use wasmop_tests::logs::Capture;
use wasmop_tests::operator::{RunningOperator, load_plugin};
use wasmop_tests::status::{events, wait_event};
use wasmop_tests::{DEFAULT_DEADLINE, TestNamespace, apply_test_crds, wait_for};

const OWNER_UID_LABEL: &str = "wasmop.dev/owner-uid";
const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
const PLUGIN_LABEL: &str = "wasmop.dev/plugin";
/// The extra owner label `labeller` declares for its ConfigMaps.
const LABELLER_EXTRA_LABEL: &str = "test.wasmop.dev/labeller-uid";
const LABELLER_FINALIZER: &str = "test.wasmop.dev/labeller";
/// An annotation users put on owned objects; `labeller` reports it.
const NOTE: &str = "test.wasmop.dev/note";

// ---------------------------------------------------------------------------
// Helpers

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("test.wasmop.dev", "v1", kind),
        plural,
    )
}

fn test_kind(ns: &TestNamespace, kind: &str, plural: &str) -> Api<DynamicObject> {
    Api::namespaced_with(ns.client.clone(), &ns.name, &resource(kind, plural))
}

fn badges(client: &Client) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &resource("Badge", "badges"))
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

async fn merge_spec(api: &Api<DynamicObject>, name: &str, spec: Value) -> Result<()> {
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": spec})),
    )
    .await?;
    Ok(())
}

/// A primary's namespace and a second one (`<prefix>-target`), both
/// watched by an operator running `plugin` with the settings `settings`
/// makes from the second one's name.
async fn two_namespaces(
    prefix: &str,
    plugin: &str,
    settings: impl FnOnce(&str) -> Value,
) -> Result<(TestNamespace, TestNamespace, RunningOperator)> {
    let ns = TestNamespace::new(prefix).await?;
    let other = TestNamespace::new(&format!("{prefix}-target")).await?;
    let op = start_on(
        ns.client.clone(),
        &[&ns.name, &other.name],
        &[(plugin, settings(&other.name))],
    )
    .await?;
    Ok((ns, other, op))
}

/// Starts an operator on `client` watching `namespaces` with `plugins`
/// (name and settings).
async fn start_on(
    client: Client,
    namespaces: &[&str],
    plugins: &[(&str, Value)],
) -> Result<RunningOperator> {
    apply_test_crds(&client).await?;
    let loaded = plugins
        .iter()
        .map(|(p, s)| load_plugin(p, s.clone()))
        .collect::<Result<Vec<_>>>()?;
    let namespaces = namespaces.iter().map(|n| n.to_string()).collect();
    RunningOperator::start(client, namespaces, loaded).await
}

async fn start(ns: &TestNamespace, plugins: &[(&str, Value)]) -> Result<RunningOperator> {
    start_on(ns.client.clone(), &[&ns.name], plugins).await
}

/// The host's `Reconciled` condition of `name`, if it has one.
async fn reconciled(api: &Api<DynamicObject>, name: &str) -> Result<Option<Value>> {
    let obj = api.get(name).await?;
    Ok(obj.data["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Reconciled"))
        .cloned())
}

/// Waits until `name`'s `Reconciled` condition has `reason` at the
/// primary's current generation, and returns it.
async fn wait_reason(api: &Api<DynamicObject>, name: &str, reason: &str) -> Result<Value> {
    wait_for(
        &format!("{name}: Reconciled with reason {reason}"),
        DEFAULT_DEADLINE,
        || async move {
            let generation = api.get(name).await?.metadata.generation;
            match reconciled(api, name).await? {
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

/// Rule names a rejection's message should have carried; checked at the
/// end of a test ([`Unnamed::check`]), so a missing name does not hide
/// what the rest of the test finds.
#[derive(Debug, Default)]
struct Unnamed(Vec<String>);

impl Unnamed {
    fn check(self) {
        assert!(
            self.0.is_empty(),
            "rejections that do not name their rule: {:#?}",
            self.0
        );
    }
}

/// Asserts a `PlanRejected` condition names every one of `needles` in its
/// message; notes in `unnamed` when it does not name `rule`.
fn expect_rejected(unnamed: &mut Unnamed, cond: &Value, rule: &str, needles: &[&str]) {
    assert_eq!(cond["status"], "False", "condition: {cond}");
    assert_eq!(cond["reason"], "PlanRejected", "condition: {cond}");
    let message = cond["message"].as_str().unwrap_or_default();
    for needle in needles {
        assert!(
            message.contains(needle),
            "the message should name {needle:?}: {message}"
        );
    }
    if !message.contains(rule) {
        unnamed.0.push(format!("{rule}: {message}"));
    }
}

/// Everything about a ConfigMap a takeover would change.
fn fingerprint(cm: &ConfigMap) -> Value {
    json!({
        "uid": cm.metadata.uid,
        "resourceVersion": cm.metadata.resource_version,
        "data": cm.data,
        "labels": cm.metadata.labels,
        "annotations": cm.metadata.annotations,
        "ownerReferences": cm.metadata.owner_references,
        "finalizers": cm.metadata.finalizers,
    })
}

/// A ConfigMap as `kubectl create cm <name> --from-literal=other=x` makes it.
fn user_config_map(name: &str) -> Result<ConfigMap> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name},
        "data": {"other": "x"},
    }))?)
}

/// Waits until `api` has no object `name`.
async fn wait_gone<K>(api: &Api<K>, what: &str, name: &str) -> Result<()>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    wait_for(
        &format!("{what} {name} to be gone"),
        DEFAULT_DEADLINE,
        || async move { Ok(api.get_opt(name).await?.is_none().then_some(())) },
    )
    .await
}

/// A ConfigMap in `namespace` with an ownerReference to `owner`: a probe
/// of the garbage collector. Once it is collected, the collector has
/// processed the owners of that namespace after everything created before.
async fn gc_probe(client: &Client, namespace: &str, name: &str, owner: &Value) -> Result<()> {
    let cm: ConfigMap = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "ownerReferences": [owner]},
    }))?;
    Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &cm)
        .await?;
    Ok(())
}

fn owner_ref(obj: &DynamicObject) -> Value {
    json!({
        "apiVersion": "test.wasmop.dev/v1",
        "kind": obj.types.as_ref().map(|t| t.kind.clone()).unwrap_or_default(),
        "name": obj.name_any(),
        "uid": obj.uid().unwrap_or_default(),
    })
}

// ---------------------------------------------------------------------------
// Nothing is adopted silently

/// The repro of issue 11: `kubectl create cm w-cm --from-literal=other=x`,
/// then a Widget `w` whose plan applies `w-cm`. The plan is refused, the
/// user's ConfigMap is unchanged, and deleting the Widget leaves it.
#[tokio::test]
async fn user_config_map_is_not_taken_over_and_outlives_the_widget() -> Result<()> {
    let mut unnamed = Unnamed::default();
    let ns = TestNamespace::new("own-repro").await?;
    apply_test_crds(&ns.client).await?;
    let cms: Api<ConfigMap> = ns.api();
    cms.create(&PostParams::default(), &user_config_map("w-cm")?)
        .await?;
    let before = fingerprint(&cms.get("w-cm").await?);

    let _op = start(&ns, &[("good", json!({}))]).await?;
    let widgets = test_kind(&ns, "Widget", "widgets");
    let w = create(&widgets, "Widget", "w", json!({"value": "mine"})).await?;
    let cond = wait_reason(&widgets, "w", "PlanRejected").await?;
    expect_rejected(&mut unnamed, &cond, "NotControlledByPrimary", &["w-cm"]);
    wait_event(
        &ns.client,
        &ns.name,
        "w",
        Some("Warning"),
        "PlanRejected",
        DEFAULT_DEADLINE,
    )
    .await?;
    assert_eq!(
        fingerprint(&cms.get("w-cm").await?),
        before,
        "the user's ConfigMap is byte-for-byte unchanged"
    );

    // Delete the Widget; a probe owned by it tells when the garbage
    // collector has dealt with its dependents.
    gc_probe(&ns.client, &ns.name, "gc-probe", &owner_ref(&w)).await?;
    widgets.delete("w", &DeleteParams::background()).await?;
    wait_gone(&cms, "the garbage collector's probe", "gc-probe").await?;
    wait_gone(&widgets, "Widget", "w").await?;
    assert_eq!(
        fingerprint(&cms.get("w-cm").await?),
        before,
        "the user's ConfigMap outlives the Widget, unchanged"
    );
    unnamed.check();
    Ok(())
}

/// A rejection whose reason changes is a new Event, not a repeat of the
/// first: `kubectl describe` shows what blocks the Widget now. The user's
/// ConfigMap first has no owner, then is replaced by one controlled by
/// someone else; the Widget's Events then hold both notes.
#[tokio::test]
async fn a_rejection_whose_reason_changes_is_a_new_event() -> Result<()> {
    let ns = TestNamespace::new("own-events").await?;
    apply_test_crds(&ns.client).await?;
    let cms: Api<ConfigMap> = ns.api();
    cms.create(&PostParams::default(), &user_config_map("w-cm")?)
        .await?;
    let _op = start(&ns, &[("good", json!({}))]).await?;
    let widgets = test_kind(&ns, "Widget", "widgets");
    create(&widgets, "Widget", "w", json!({"value": "mine"})).await?;
    let rejected = |needle: &'static str| {
        let ns = &ns;
        async move {
            anyhow::Ok(
                events(&ns.client, &ns.name, "w")
                    .await?
                    .into_iter()
                    .filter(|(kind, reason, note)| {
                        kind == "Warning" && reason == "PlanRejected" && note.contains(needle)
                    })
                    .count(),
            )
        }
    };
    wait_for(
        "a PlanRejected Event: nothing controls it",
        DEFAULT_DEADLINE,
        || async { Ok((rejected("nothing controls it").await? > 0).then_some(())) },
    )
    .await?;
    // The same ConfigMap, now controlled by another of the user's objects
    // (patched in place: never absent, so the Widget cannot create its
    // own meanwhile; the owner exists, so the garbage collector keeps it).
    let holder = cms
        .create(&PostParams::default(), &user_config_map("holder")?)
        .await?;
    let holder_uid = holder.metadata.uid.unwrap_or_default();
    cms.patch(
        "w-cm",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"ownerReferences": [{
            "apiVersion": "v1", "kind": "ConfigMap",
            "name": "holder", "uid": holder_uid,
            "controller": true, "blockOwnerDeletion": false,
        }]}})),
    )
    .await?;
    // A refusal for a user's object waits for a change: an edit.
    merge_spec(&widgets, "w", json!({"value": "mine, again"})).await?;
    wait_for(
        "a PlanRejected Event: another owner",
        DEFAULT_DEADLINE,
        || async { Ok((rejected("controlled by another owner").await? > 0).then_some(())) },
    )
    .await?;
    assert!(
        rejected("nothing controls it").await? > 0,
        "the first rejection's Event is still there"
    );
    Ok(())
}

/// The same with the object in a namespace the operator does not watch:
/// `labeller` writes its ConfigMap into another namespace, where the user
/// already has one of that name.
#[tokio::test]
async fn user_config_map_in_an_unwatched_namespace_is_not_taken_over() -> Result<()> {
    let mut unnamed = Unnamed::default();
    let ns = TestNamespace::new("own-unwatched").await?;
    let other = TestNamespace::new("own-unwatched-target").await?;
    apply_test_crds(&ns.client).await?;
    let cms: Api<ConfigMap> = other.api();
    cms.create(&PostParams::default(), &user_config_map("l-mirror")?)
        .await?;
    let before = fingerprint(&cms.get("l-mirror").await?);

    // The operator watches only the primary's namespace.
    let _op = start(&ns, &[("labeller", json!({"targetNamespace": other.name}))]).await?;
    let labellers = test_kind(&ns, "Labeller", "labellers");
    create(&labellers, "Labeller", "l", json!({"value": "mine"})).await?;
    let cond = wait_reason(&labellers, "l", "PlanRejected").await?;
    expect_rejected(&mut unnamed, &cond, "NotControlledByPrimary", &["l-mirror"]);
    wait_event(
        &ns.client,
        &ns.name,
        "l",
        Some("Warning"),
        "PlanRejected",
        DEFAULT_DEADLINE,
    )
    .await?;
    assert_eq!(fingerprint(&cms.get("l-mirror").await?), before);
    // All or nothing: the plan's Badge was not written either.
    let badge = format!("{}-l", ns.name);
    assert!(badges(&ns.client).get_opt(&badge).await?.is_none());

    labellers.delete("l", &DeleteParams::background()).await?;
    wait_gone(&labellers, "Labeller", "l").await?;
    assert_eq!(
        fingerprint(&cms.get("l-mirror").await?),
        before,
        "deleting the Labeller leaves the user's ConfigMap alone"
    );
    unnamed.check();
    Ok(())
}

/// A user creates the ConfigMap just after the operator judged it absent
/// and just before it writes: the write is a conflict, the retry refuses
/// the plan, and the ConfigMap stays as the user made it.
#[tokio::test]
async fn config_map_created_by_a_racing_client_is_not_taken_over() -> Result<()> {
    let mut unnamed = Unnamed::default();
    let ns = TestNamespace::new("own-race").await?;
    let (interposer, client) = Interposer::new(ns.client.clone());
    let made: Arc<Mutex<Option<ConfigMap>>> = Arc::default();
    {
        let user = ns.client.clone();
        let namespace = ns.name.clone();
        let made = made.clone();
        let create_path = format!("/namespaces/{}/configmaps", ns.name);
        let apply_path = format!("/namespaces/{}/configmaps/w-cm", ns.name);
        interposer.before(
            move |m: &Method, p: &str| {
                let p = p.split('?').next().unwrap_or_default();
                (*m == Method::POST && p.ends_with(&create_path))
                    || (*m == Method::PATCH && p.ends_with(&apply_path))
                    || (*m == Method::PUT && p.ends_with(&apply_path))
            },
            move || async move {
                let cms: Api<ConfigMap> = Api::namespaced(user, &namespace);
                let cm = user_config_map("w-cm").expect("a ConfigMap");
                let created = cms
                    .create(&PostParams::default(), &cm)
                    .await
                    .expect("the racing client creates w-cm");
                *made.lock().expect("made") = Some(created);
            },
        );
    }
    let _op = start_on(client, &[&ns.name], &[("good", json!({}))]).await?;
    let widgets = test_kind(&ns, "Widget", "widgets");
    create(&widgets, "Widget", "w", json!({"value": "mine"})).await?;

    let cond = wait_reason(&widgets, "w", "PlanRejected").await?;
    expect_rejected(&mut unnamed, &cond, "NotControlledByPrimary", &["w-cm"]);
    let made = made
        .lock()
        .expect("made")
        .clone()
        .expect("the race was run");
    let cms: Api<ConfigMap> = ns.api();
    assert_eq!(fingerprint(&cms.get("w-cm").await?), fingerprint(&made));
    // The raced write was answered with a conflict, and no write to the
    // ConfigMap ever succeeded.
    let writes: Vec<_> = interposer
        .writes()
        .into_iter()
        .filter(|w| w.path.contains("/configmaps"))
        .collect();
    ensure!(
        writes.first().is_some_and(|w| w.status == 409),
        "the raced write is a conflict: {writes:?}"
    );
    ensure!(
        writes.iter().all(|w| !(200..300).contains(&w.status)),
        "no write to the ConfigMap succeeded: {writes:?}"
    );
    unnamed.check();
    Ok(())
}

/// The operator does not read an object before creating it when its cache
/// would hold the object were it the operator's (a watched namespace): the
/// create is fenced instead. A user's unlabelled ConfigMap the cache cannot
/// see makes that create a conflict; the retry reads it and refuses the
/// plan, and every later retry reads it again instead of trying another
/// write.
#[tokio::test]
async fn an_unseen_user_config_map_makes_the_fenced_create_conflict_then_is_read_and_refused()
-> Result<()> {
    let mut unnamed = Unnamed::default();
    let ns = TestNamespace::new("own-fence").await?;
    apply_test_crds(&ns.client).await?;
    let cms: Api<ConfigMap> = ns.api();
    cms.create(&PostParams::default(), &user_config_map("w-cm")?)
        .await?;
    let before = fingerprint(&cms.get("w-cm").await?);
    let (interposer, client) = Interposer::new(ns.client.clone());
    let _op = start_on(client, &[&ns.name], &[("good", json!({}))]).await?;
    let widgets = test_kind(&ns, "Widget", "widgets");
    create(&widgets, "Widget", "w", json!({"value": "mine"})).await?;

    let cond = wait_reason(&widgets, "w", "PlanRejected").await?;
    expect_rejected(&mut unnamed, &cond, "NotControlledByPrimary", &["w-cm"]);
    let cm_path = format!("/namespaces/{}/configmaps/w-cm", ns.name);
    let on_cm = |interposer: &Interposer| -> Vec<_> {
        interposer
            .requests()
            .into_iter()
            .filter(|r| {
                r.path
                    .split('?')
                    .next()
                    .unwrap_or_default()
                    .ends_with(&cm_path)
            })
            .collect()
    };
    // Two reconciles judged the plan from a read (the refusal and its
    // backed-off retry).
    wait_for("two reads of w-cm", DEFAULT_DEADLINE, || {
        let reads = on_cm(&interposer)
            .iter()
            .filter(|r| r.method == Method::GET)
            .count();
        async move { Ok((reads >= 2).then_some(())) }
    })
    .await?;
    let requests = on_cm(&interposer);
    ensure!(
        requests
            .first()
            .is_some_and(|r| r.method != Method::GET && r.status == 409),
        "the first request to w-cm is the fenced create, a conflict: {requests:?}"
    );
    ensure!(
        requests.iter().filter(|r| r.method != Method::GET).count() == 1,
        "after the conflict the operator only reads w-cm: {requests:?}"
    );
    assert_eq!(
        fingerprint(&cms.get("w-cm").await?),
        before,
        "the user's ConfigMap is unchanged"
    );
    unnamed.check();
    Ok(())
}

/// `adopter` declares adoption: an orphan ConfigMap is adopted, with a
/// Normal Event naming it; one controlled by another owner, or carrying
/// another primary's owner label, is refused and left as it is.
#[tokio::test]
async fn declared_adoption_takes_orphans_only() -> Result<()> {
    let mut unnamed = Unnamed::default();
    let ns = TestNamespace::new("own-adopt").await?;
    apply_test_crds(&ns.client).await?;
    let cms: Api<ConfigMap> = ns.api();
    cms.create(&PostParams::default(), &user_config_map("a-cm")?)
        .await?;
    // b-cm is controlled by another object (a ConfigMap `boss`).
    let boss = cms
        .create(&PostParams::default(), &user_config_map("boss")?)
        .await?;
    let controlled: ConfigMap = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "b-cm", "ownerReferences": [{
            "apiVersion": "v1", "kind": "ConfigMap", "name": "boss",
            "uid": boss.metadata.uid, "controller": true}]},
        "data": {"other": "x"},
    }))?;
    cms.create(&PostParams::default(), &controlled).await?;
    // c-cm carries another primary's owner label.
    let labelled: ConfigMap = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "c-cm", "labels": {
            MANAGED_BY_LABEL: "wasmop", OWNER_UID_LABEL: "0b1e0b1e-0000-4000-8000-000000000000"}},
        "data": {"other": "x"},
    }))?;
    cms.create(&PostParams::default(), &labelled).await?;
    let b_before = fingerprint(&cms.get("b-cm").await?);
    let c_before = fingerprint(&cms.get("c-cm").await?);

    let _op = start(&ns, &[("adopter", json!({}))]).await?;
    let adopters = test_kind(&ns, "Adopter", "adopters");
    let a = create(&adopters, "Adopter", "a", json!({})).await?;
    create(&adopters, "Adopter", "b", json!({})).await?;
    create(&adopters, "Adopter", "c", json!({})).await?;

    wait_reason(&adopters, "a", "Reconciled").await?;
    let adopted = cms.get("a-cm").await?;
    let owners = adopted
        .metadata
        .owner_references
        .clone()
        .unwrap_or_default();
    assert_eq!(owners.len(), 1, "{owners:?}");
    assert_eq!(Some(&owners[0].uid), a.metadata.uid.as_ref());
    assert_eq!(owners[0].controller, Some(true));
    assert_eq!(
        adopted.labels().get(MANAGED_BY_LABEL).map(String::as_str),
        Some("wasmop")
    );
    assert_eq!(
        adopted
            .data
            .unwrap_or_default()
            .get("value")
            .map(String::as_str),
        Some("adopted")
    );
    let (_, note) = wait_event(
        &ns.client,
        &ns.name,
        "a",
        Some("Normal"),
        "Adopted",
        DEFAULT_DEADLINE,
    )
    .await?;
    assert!(note.contains("a-cm"), "the Event names the object: {note}");

    let cond = wait_reason(&adopters, "b", "PlanRejected").await?;
    expect_rejected(&mut unnamed, &cond, "NotControlledByPrimary", &["b-cm"]);
    let cond = wait_reason(&adopters, "c", "PlanRejected").await?;
    expect_rejected(&mut unnamed, &cond, "NotControlledByPrimary", &["c-cm"]);
    assert_eq!(fingerprint(&cms.get("b-cm").await?), b_before);
    assert_eq!(fingerprint(&cms.get("c-cm").await?), c_before);
    for name in ["b", "c"] {
        let adopted_events: Vec<_> = events(&ns.client, &ns.name, name)
            .await?
            .into_iter()
            .filter(|(_, r, _)| r == "Adopted")
            .collect();
        assert!(adopted_events.is_empty(), "{name}: {adopted_events:?}");
    }
    unnamed.check();
    Ok(())
}

// ---------------------------------------------------------------------------
// owner-label

/// Label-owned objects where ownerReferences cannot work — a ConfigMap in
/// another namespace and a cluster-scoped Badge — survive the garbage
/// collector, re-trigger their primary when changed, come back when
/// deleted, and are deleted by the plan under the finalizer only when the
/// primary is deleted.
#[tokio::test]
async fn label_owned_objects_live_and_die_with_their_primary() -> Result<()> {
    let (ns, other, _op) = two_namespaces(
        "own-label",
        "labeller",
        |target| json!({"targetNamespace": target}),
    )
    .await?;
    let labellers = test_kind(&ns, "Labeller", "labellers");
    let l = create(&labellers, "Labeller", "l", json!({"value": "one"})).await?;
    let uid = l.uid().unwrap_or_default();
    wait_reason(&labellers, "l", "Reconciled").await?;

    let cms: Api<ConfigMap> = other.api();
    let badges = badges(&ns.client);
    let badge_name = format!("{}-l", ns.name);
    let cm = cms.get("l-mirror").await?;
    let badge = badges.get(&badge_name).await?;
    let cm_labels = cm.labels();
    assert_eq!(cm_labels.get(OWNER_UID_LABEL), Some(&uid));
    assert_eq!(cm_labels.get(LABELLER_EXTRA_LABEL), Some(&uid));
    assert_eq!(
        cm_labels.get(MANAGED_BY_LABEL).map(String::as_str),
        Some("wasmop")
    );
    assert_eq!(
        cm_labels.get(PLUGIN_LABEL).map(String::as_str),
        Some("labeller")
    );
    assert!(
        cm.metadata
            .owner_references
            .clone()
            .unwrap_or_default()
            .is_empty()
    );
    assert_eq!(badge.labels().get(OWNER_UID_LABEL), Some(&uid));
    assert!(badge.owner_references().is_empty());
    assert_eq!(badge.data["spec"]["value"], "one");
    let l = labellers.get("l").await?;
    assert_eq!(l.finalizers(), [LABELLER_FINALIZER.to_string()]);

    // Both appear in the primary's snapshot (`owned`).
    wait_for("status.owned = 2", DEFAULT_DEADLINE, || async {
        let l = labellers.get("l").await?;
        Ok((l.data["status"]["owned"] == json!(2)).then_some(()))
    })
    .await?;

    // The garbage collector has its chance: a ConfigMap in the target
    // namespace with an ownerReference to the Labeller (what the host used
    // to write) is collected, a Badge with a dangling owner too; the
    // label-owned objects stay, with the same UIDs.
    gc_probe(&ns.client, &other.name, "gc-probe", &owner_ref(&l)).await?;
    let probe_badge: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "test.wasmop.dev/v1", "kind": "Badge",
        "metadata": {"name": format!("{}-gc-probe", ns.name), "ownerReferences": [{
            "apiVersion": "test.wasmop.dev/v1", "kind": "Badge",
            "name": format!("{}-absent", ns.name),
            "uid": "0b1e0b1e-0000-4000-8000-000000000001"}]},
    }))?;
    badges.create(&PostParams::default(), &probe_badge).await?;
    wait_gone(&cms, "the garbage collector's probe", "gc-probe").await?;
    wait_gone(
        &badges,
        "the garbage collector's probe",
        &format!("{}-gc-probe", ns.name),
    )
    .await?;
    assert_eq!(cms.get("l-mirror").await?.metadata.uid, cm.metadata.uid);
    assert_eq!(badges.get(&badge_name).await?.uid(), badge.uid());

    // A change re-triggers the primary: it reports the users' notes.
    cms.patch(
        "l-mirror",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {NOTE: "cm-note"}}})),
    )
    .await?;
    badges
        .patch(
            &badge_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {NOTE: "badge-note"}}})),
        )
        .await?;
    wait_for(
        "both notes observed by the primary",
        DEFAULT_DEADLINE,
        || async {
            let l = labellers.get("l").await?;
            let notes = &l.data["status"]["notes"];
            if notes["ConfigMap"] == "cm-note" && notes["Badge"] == "badge-note" {
                Ok(Some(()))
            } else {
                bail!("status: {}", l.data["status"])
            }
        },
    )
    .await?;

    // Deleted by someone else: re-triggered and made again.
    cms.delete("l-mirror", &DeleteParams::background()).await?;
    badges
        .delete(&badge_name, &DeleteParams::background())
        .await?;
    let (cm, badge) = wait_for("both objects made again", DEFAULT_DEADLINE, || async {
        let new_cm = cms.get_opt("l-mirror").await?;
        let new_badge = badges.get_opt(&badge_name).await?;
        Ok(match (new_cm, new_badge) {
            (Some(c), Some(b)) if c.metadata.uid != cm.metadata.uid && b.uid() != badge.uid() => {
                Some((c, b))
            }
            _ => None,
        })
    })
    .await?;

    // Deleting the primary: the finalizer holds it while the plugin holds
    // its cleanup, and nothing deletes the objects meanwhile.
    merge_spec(&labellers, "l", json!({"holdCleanup": true})).await?;
    labellers.delete("l", &DeleteParams::background()).await?;
    wait_event(
        &ns.client,
        &ns.name,
        "l",
        Some("Warning"),
        "CleanupHeld",
        DEFAULT_DEADLINE,
    )
    .await?;
    let held = labellers.get("l").await?;
    assert!(held.metadata.deletion_timestamp.is_some());
    assert_eq!(cms.get("l-mirror").await?.metadata.uid, cm.metadata.uid);
    assert_eq!(badges.get(&badge_name).await?.uid(), badge.uid());
    // Released: the plan deletes both, then the finalizer goes.
    merge_spec(&labellers, "l", json!({"holdCleanup": false})).await?;
    wait_gone(&labellers, "Labeller", "l").await?;
    assert!(
        cms.get_opt("l-mirror").await?.is_none(),
        "the plan deleted the ConfigMap"
    );
    assert!(
        badges.get_opt(&badge_name).await?.is_none(),
        "the plan deleted the Badge"
    );
    Ok(())
}

/// A plan cannot set the host's owner label (HostLabelForged), and an
/// object whose owner label a user removed is no longer the primary's: the
/// plan's apply is refused, the label is not put back, nothing is adopted,
/// and deleting the primary leaves that object.
#[tokio::test]
async fn forged_or_removed_owner_labels_are_refused() -> Result<()> {
    let mut unnamed = Unnamed::default();
    let (ns, other, _op) = two_namespaces(
        "own-forged",
        "labeller",
        |target| json!({"targetNamespace": target}),
    )
    .await?;
    let labellers = test_kind(&ns, "Labeller", "labellers");
    create(&labellers, "Labeller", "l", json!({"value": "one"})).await?;
    wait_reason(&labellers, "l", "Reconciled").await?;
    let cms: Api<ConfigMap> = other.api();
    let badges = badges(&ns.client);
    let badge_name = format!("{}-l", ns.name);
    let cm_before = fingerprint(&cms.get("l-mirror").await?);
    let badge_rv = badges.get(&badge_name).await?.resource_version();

    // The plan sets the owner label itself.
    merge_spec(&labellers, "l", json!({"forgeLabel": true, "value": "two"})).await?;
    let cond = wait_reason(&labellers, "l", "PlanRejected").await?;
    expect_rejected(
        &mut unnamed,
        &cond,
        "HostLabelForged",
        &["l-mirror", OWNER_UID_LABEL],
    );
    assert_eq!(fingerprint(&cms.get("l-mirror").await?), cm_before);
    assert_eq!(badges.get(&badge_name).await?.resource_version(), badge_rv);
    merge_spec(
        &labellers,
        "l",
        json!({"forgeLabel": false, "value": "one"}),
    )
    .await?;
    wait_reason(&labellers, "l", "Reconciled").await?;

    // A user takes the ConfigMap: removes its owner label.
    cms.patch(
        "l-mirror",
        &PatchParams::default(),
        &Patch::Json::<()>(serde_json::from_value(json!([
            {"op": "remove", "path": "/metadata/labels/wasmop.dev~1owner-uid"}
        ]))?),
    )
    .await?;
    let taken = fingerprint(&cms.get("l-mirror").await?);
    merge_spec(&labellers, "l", json!({"value": "three"})).await?;
    let cond = wait_reason(&labellers, "l", "PlanRejected").await?;
    expect_rejected(&mut unnamed, &cond, "NotControlledByPrimary", &["l-mirror"]);
    assert_eq!(
        fingerprint(&cms.get("l-mirror").await?),
        taken,
        "not relabelled, not changed"
    );
    assert_eq!(badges.get(&badge_name).await?.data["spec"]["value"], "one");

    // Deleting the primary deletes what is still its own, not the
    // ConfigMap the user took.
    labellers.delete("l", &DeleteParams::background()).await?;
    wait_gone(&labellers, "Labeller", "l").await?;
    assert!(badges.get_opt(&badge_name).await?.is_none());
    assert_eq!(fingerprint(&cms.get("l-mirror").await?), taken);
    unnamed.check();
    Ok(())
}

/// A manifest asking for ownerReferences across namespaces, or from a
/// namespaced primary to a cluster-scoped kind, is refused at load, and
/// the message tells what to declare instead.
#[tokio::test]
async fn cross_namespace_owner_references_are_refused_at_load() -> Result<()> {
    let err = match load_plugin("crossref", json!({})) {
        Ok(_) => bail!("crossref loaded; its manifest must be refused"),
        Err(e) => format!("{e:#}"),
    };
    assert!(err.contains("owner-label"), "{err}");
    assert!(
        err.contains("writeNamespaces"),
        "names the write namespaces: {err}"
    );
    assert!(
        err.contains("Badge"),
        "names the cluster-scoped kind: {err}"
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// No reconcile against an unsynced cache

/// `good` owns ConfigMaps and reads none, so they are watched
/// label-filtered. Loading `referrer`, which reads ConfigMaps, needs them
/// watched unfiltered. While that new watch has not synced, `good` keeps
/// reconciling and must never see its ConfigMaps missing: no create of one
/// that exists (neither a POST nor a create-fenced apply the API server
/// refuses with 409), no delete.
///
/// The window is held open: the new watch's first list is let through only
/// once `good` has written something for a Widget changed meanwhile, or
/// after [`HOLD`] without such a write (a host that waits for the sync
/// writes nothing while the list is held).
#[tokio::test]
async fn a_new_reader_of_a_kind_does_not_blind_running_controllers() -> Result<()> {
    const N: usize = 5;
    const HOLD: std::time::Duration = std::time::Duration::from_secs(5);
    let ns = TestNamespace::new("own-resync").await?;
    let (interposer, client) = Interposer::new(ns.client.clone());
    let op = start_on(client, &[&ns.name], &[("good", json!({}))]).await?;
    let widgets = test_kind(&ns, "Widget", "widgets");
    for i in 0..N {
        create(&widgets, "Widget", &format!("w{i}"), json!({"value": "v0"})).await?;
    }
    for i in 0..N {
        wait_reason(&widgets, &format!("w{i}"), "Reconciled").await?;
    }
    let settled = interposer.writes().len();

    let unfiltered_list = {
        let suffix = format!("/namespaces/{}/configmaps", ns.name);
        move |m: &Method, p: &str| {
            let (path, query) = p.split_once('?').unwrap_or((p, ""));
            *m == Method::GET && path.ends_with(&suffix) && !query.contains("labelSelector")
        }
    };
    let held = Arc::new(std::sync::atomic::AtomicBool::new(false));
    {
        let widgets = widgets.clone();
        let state = Arc::downgrade(&interposer);
        let held = held.clone();
        interposer.before(unfiltered_list, move || async move {
            held.store(true, Ordering::SeqCst);
            for i in 0..N {
                merge_spec(&widgets, &format!("w{i}"), json!({"value": "v1"}))
                    .await
                    .expect("the Widget changes");
            }
            // Bounded on purpose: no write is the expected outcome.
            let _ = wait_for("a write while the new watch is unsynced", HOLD, || {
                let state = state.clone();
                async move {
                    let writes = state.upgrade().map(|s| s.writes()).unwrap_or_default();
                    Ok(writes[settled.min(writes.len())..]
                        .iter()
                        .any(|w| w.path.contains("/configmaps"))
                        .then_some(()))
                }
            })
            .await;
        });
    }
    op.operator
        .add_plugin(load_plugin("referrer", json!({}))?)
        .await?;
    ensure!(held.load(Ordering::SeqCst), "the new watch's list was held");

    let cms: Api<ConfigMap> = ns.api();
    wait_for("every ConfigMap to hold v1", DEFAULT_DEADLINE, || async {
        let all = cms.list(&ListParams::default()).await?.items;
        let behind: Vec<String> = (0..N)
            .map(|i| format!("w{i}-cm"))
            .filter(|n| {
                !all.iter().any(|c| {
                    c.metadata.name.as_deref() == Some(n)
                        && c.data
                            .as_ref()
                            .and_then(|d| d.get("value"))
                            .map(String::as_str)
                            == Some("v1")
                })
            })
            .collect();
        if behind.is_empty() {
            Ok(Some(()))
        } else {
            bail!("not yet at v1: {behind:?}")
        }
    })
    .await?;
    // A controller blind to its ConfigMaps would create them again: a
    // POST, or a server-side apply fenced as "absent" that the API server
    // answers 409 because the object exists; or delete them.
    let spurious: Vec<_> = interposer.writes()[settled..]
        .iter()
        .filter(|w| {
            w.path.contains("/configmaps")
                && (w.method == Method::POST
                    || w.method == Method::DELETE
                    || (w.method == Method::PATCH && w.status == 409))
        })
        .cloned()
        .collect();
    assert!(
        spurious.is_empty(),
        "a running controller acted on an unsynced cache: {spurious:?}"
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// Leadership fence

/// The replica loses leadership while executing a plan of ten applies
/// (right before the fourth is sent): the write in flight completes, no
/// later one is made — no ConfigMap, no status, no Event. Once it leads
/// again the plan is carried out in full.
#[tokio::test]
async fn leadership_lost_mid_plan_stops_the_remaining_writes() -> Result<()> {
    let ns = TestNamespace::new("own-leader").await?;
    let (interposer, client) = Interposer::new(ns.client.clone());
    let op = start_on(client, &[&ns.name], &[("fanout", json!({}))]).await?;
    let flag = op.operator.leader_flag();
    let flipped: Arc<Mutex<Option<usize>>> = Arc::default();
    {
        let flag = flag.clone();
        let flipped = flipped.clone();
        let state = Arc::downgrade(&interposer);
        interposer.before(
            // The fourth ConfigMap write: creates are server-side applies
            // (PATCH to the object's path) fenced against a racing create.
            nth(4, {
                let prefix = format!("/namespaces/{}/configmaps/", ns.name);
                move |m: &Method, path: &str| *m == Method::PATCH && path.contains(&prefix)
            }),
            move || async move {
                flag.store(false, Ordering::SeqCst);
                let sent = state.upgrade().map_or(0, |s| s.writes().len());
                *flipped.lock().expect("flipped") = Some(sent);
            },
        );
    }
    let fanouts = test_kind(&ns, "Fanout", "fanouts");
    create(&fanouts, "Fanout", "f", json!({"count": 10})).await?;

    let lost = || {
        wasmop::metrics::global()
            .get(
                "wasmop_reconcile_total",
                &[
                    ("controller", "fanout/fanout"),
                    ("result", "LeadershipLost"),
                ],
            )
            .unwrap_or(0.0)
    };
    wait_for(
        "the reconcile to stop for lost leadership",
        DEFAULT_DEADLINE,
        || async { Ok((lost() >= 1.0).then_some(())) },
    )
    .await?;
    let sent_before = flipped
        .lock()
        .expect("flipped")
        .expect("the flag was flipped");
    let after: Vec<_> = interposer.writes()[sent_before..].to_vec();
    // The fourth create was already past the fence when the flag flipped.
    assert_eq!(
        after.len(),
        1,
        "only the write in flight went out: {after:?}"
    );
    assert!(after[0].path.contains("/configmaps"), "{after:?}");
    let mut names: Vec<String> = Api::<ConfigMap>::namespaced(ns.client.clone(), &ns.name)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .filter(|n| n.starts_with("f-"))
        .collect();
    names.sort();
    assert_eq!(names, ["f-0", "f-1", "f-2", "f-3"]);
    let f = fanouts.get("f").await?;
    assert!(
        f.data["status"]["count"].is_null(),
        "no status: {}",
        f.data["status"]
    );
    assert!(events(&ns.client, &ns.name, "f").await?.is_empty());

    // Leading again: the whole plan is made.
    flag.store(true, Ordering::SeqCst);
    op.operator.requeue_all();
    wait_reason(&fanouts, "f", "Reconciled").await?;
    assert_eq!(fanouts.get("f").await?.data["status"]["count"], 10);
    wait_event(
        &ns.client,
        &ns.name,
        "f",
        Some("Normal"),
        "FannedOut",
        DEFAULT_DEADLINE,
    )
    .await?;
    Ok(())
}

// ---------------------------------------------------------------------------
// primaryPatch

/// `patcher` declares `metadata.labels.app`. A patch of the label
/// `app.kubernetes.io/name` (a prefix match, not a whole segment) and a
/// patch setting an empty object elsewhere are refused and write nothing;
/// the declared label itself is set.
#[tokio::test]
async fn primary_patch_matches_whole_segments_and_counts_empty_objects() -> Result<()> {
    let mut unnamed = Unnamed::default();
    let ns = TestNamespace::new("own-patch").await?;
    let _op = start(&ns, &[("patcher", json!({}))]).await?;
    let patchers = test_kind(&ns, "Patcher", "patchers");
    create(
        &patchers,
        "Patcher",
        "prefix",
        json!({"patch": {"metadata": {"labels": {"app.kubernetes.io/name": "x"}}}}),
    )
    .await?;
    create(
        &patchers,
        "Patcher",
        "empty",
        json!({"patch": {"spec": {"extra": {}}}}),
    )
    .await?;
    create(&patchers, "Patcher", "ok", json!({"app": "mine"})).await?;

    let cond = wait_reason(&patchers, "prefix", "PlanRejected").await?;
    expect_rejected(
        &mut unnamed,
        &cond,
        "PrimaryFieldNotAllowed",
        &["metadata.labels.app.kubernetes.io/name"],
    );
    let prefix = patchers.get("prefix").await?;
    assert!(!prefix.labels().contains_key("app.kubernetes.io/name"));

    let cond = wait_reason(&patchers, "empty", "PlanRejected").await?;
    expect_rejected(
        &mut unnamed,
        &cond,
        "PrimaryFieldNotAllowed",
        &["spec.extra"],
    );
    let empty = patchers.get("empty").await?;
    assert!(
        empty.data["spec"].get("extra").is_none(),
        "{}",
        empty.data["spec"]
    );

    wait_reason(&patchers, "ok", "Reconciled").await?;
    let ok = patchers.get("ok").await?;
    assert_eq!(ok.labels().get("app").map(String::as_str), Some("mine"));
    unnamed.check();
    Ok(())
}

/// A user sets the label just before the operator's patch of it is sent:
/// the patch carries the resourceVersion the plugin saw, so it is a
/// conflict, and the user's value stays.
#[tokio::test]
async fn primary_patch_racing_a_user_edit_is_a_conflict_not_an_overwrite() -> Result<()> {
    let ns = TestNamespace::new("own-patch-race").await?;
    let (interposer, client) = Interposer::new(ns.client.clone());
    {
        let user = ns.client.clone();
        let namespace = ns.name.clone();
        interposer.before(
            request_to(Method::PATCH, format!("/namespaces/{}/patchers/p", ns.name)),
            move || async move {
                let api: Api<DynamicObject> =
                    Api::namespaced_with(user, &namespace, &resource("Patcher", "patchers"));
                api.patch(
                    "p",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"labels": {"app": "user"}}})),
                )
                .await
                .expect("the user's edit");
            },
        );
    }
    let _op = start_on(client, &[&ns.name], &[("patcher", json!({}))]).await?;
    let patchers = test_kind(&ns, "Patcher", "patchers");
    create(&patchers, "Patcher", "p", json!({"app": "plugin"})).await?;
    wait_for("status.app = user", DEFAULT_DEADLINE, || async {
        let p = patchers.get("p").await?;
        Ok((p.data["status"]["app"] == "user").then_some(()))
    })
    .await?;
    ensure!(!interposer.pending(), "the race was run");
    let p = patchers.get("p").await?;
    assert_eq!(p.labels().get("app").map(String::as_str), Some("user"));
    let first = interposer.writes().into_iter().find(|w| {
        w.is(
            &Method::PATCH,
            &format!("/namespaces/{}/patchers/p", ns.name),
        )
    });
    assert_eq!(
        first.map(|w| w.status),
        Some(409),
        "the raced patch was a conflict"
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// Secrets

/// A canary Secret is mirrored by `mirror` (so its value passes through
/// the operator), then the plugin makes two mistakes with it (values the
/// API server refuses; a forged host label). The value — raw or base64 —
/// appears in no log line at any level of any target, in no Event and in
/// no condition.
#[tokio::test]
async fn secret_values_stay_out_of_logs_events_and_conditions() -> Result<()> {
    let mut unnamed = Unnamed::default();
    let capture = Capture::start();
    let ns = TestNamespace::new("own-canary").await?;
    let canary = format!("canary-{}-{}", ns.name, std::process::id());
    let encoded = serde_json::to_value(ByteString(canary.clone().into_bytes()))?
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let secrets: Api<Secret> = ns.api();
    let src: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "src"},
        "data": {"password": encoded},
    }))?;
    secrets.create(&PostParams::default(), &src).await?;
    let _op = start(&ns, &[("mirror", json!({}))]).await?;
    let mirrors = test_kind(&ns, "Mirror", "mirrors");
    create(&mirrors, "Mirror", "m", json!({"secretRef": "src"})).await?;
    wait_reason(&mirrors, "m", "Reconciled").await?;
    let copy = secrets.get("m-mirror").await?;
    assert_eq!(
        copy.data.unwrap_or_default().get("password"),
        Some(&ByteString(canary.clone().into_bytes())),
        "the value went through the operator"
    );
    let mut conditions = Vec::new();

    merge_spec(&mirrors, "m", json!({"rawData": true})).await?;
    let cond = wait_for("the refused write reported", DEFAULT_DEADLINE, || async {
        match reconciled(&mirrors, "m").await? {
            Some(c) if c["status"] == "False" => Ok(Some(c)),
            other => bail!("Reconciled is {other:?}"),
        }
    })
    .await?;
    conditions.push(cond);

    merge_spec(&mirrors, "m", json!({"rawData": false, "forgeLabel": true})).await?;
    let cond = wait_reason(&mirrors, "m", "PlanRejected").await?;
    expect_rejected(&mut unnamed, &cond, "HostLabelForged", &["m-mirror"]);
    conditions.push(cond);
    let all_events: Vec<String> = Api::<Event>::namespaced(ns.client.clone(), &ns.name)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|e| serde_json::to_string(&e).unwrap_or_default())
        .collect();
    let status = mirrors.get("m").await?.data["status"].to_string();
    let logs = capture.text();
    drop(capture);

    // The capture works: it holds this primary's reconciles at info level
    // and other targets' lines at trace level.
    assert!(
        logs.contains(&format!("{}/m", ns.name)),
        "the capture holds the operator's lines about m"
    );
    assert!(logs.contains("TRACE"), "the capture is at trace level");
    for needle in [canary.as_str(), encoded.as_str()] {
        let leaked: Vec<&str> = logs.lines().filter(|l| l.contains(needle)).collect();
        assert!(
            leaked.is_empty(),
            "log lines hold the Secret value: {leaked:#?}"
        );
        for e in &all_events {
            assert!(!e.contains(needle), "an Event holds the Secret value: {e}");
        }
        assert!(
            !status.contains(needle),
            "the status holds the Secret value: {status}"
        );
        for c in &conditions {
            assert!(!c.to_string().contains(needle), "a condition holds it: {c}");
        }
    }
    unnamed.check();
    Ok(())
}

/// A field read of a Secret reads that Secret by name: the operator never
/// lists or watches Secrets beyond its own (label-filtered) owned ones, and
/// still follows the named Secret as it appears, changes and goes.
#[tokio::test]
async fn a_field_read_of_a_secret_reads_it_by_name_and_follows_it() -> Result<()> {
    let ns = TestNamespace::new("own-secret-read").await?;
    let (interposer, client) = Interposer::new(ns.client.clone());
    let _op = start_on(client, &[&ns.name], &[("mirror", json!({}))]).await?;
    let mirrors = test_kind(&ns, "Mirror", "mirrors");
    let secrets: Api<Secret> = ns.api();
    let status_of = |mirrors: Api<DynamicObject>| async move {
        let m = mirrors.get("m").await?;
        Ok::<_, anyhow::Error>(m.data["status"].clone())
    };
    let wait_status = |want: Value| {
        let mirrors = mirrors.clone();
        async move {
            wait_for(&format!("Mirror m status {want}"), DEFAULT_DEADLINE, || {
                let mirrors = mirrors.clone();
                let want = want.clone();
                async move {
                    let status = status_of(mirrors).await?;
                    if status["found"] == want["found"] && status["keys"] == want["keys"] {
                        Ok(Some(()))
                    } else {
                        bail!("status is {status}")
                    }
                }
            })
            .await
        }
    };

    // Named before it exists, then created, changed and deleted.
    create(&mirrors, "Mirror", "m", json!({"secretRef": "src"})).await?;
    wait_status(json!({"found": false, "keys": 0})).await?;
    let src: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "src"},
        "stringData": {"a": "1"},
    }))?;
    secrets.create(&PostParams::default(), &src).await?;
    wait_status(json!({"found": true, "keys": 1})).await?;
    secrets
        .patch(
            "src",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"b": "2"}})),
        )
        .await?;
    wait_status(json!({"found": true, "keys": 2})).await?;
    let copy = secrets.get("m-mirror").await?;
    assert_eq!(copy.data.unwrap_or_default().len(), 2, "the copy followed");
    secrets.delete("src", &DeleteParams::default()).await?;
    wait_status(json!({"found": false, "keys": 0})).await?;

    let secret_requests: Vec<_> = interposer
        .requests()
        .into_iter()
        .filter(|r| {
            r.path
                .split('?')
                .next()
                .unwrap_or_default()
                .contains("/secrets")
        })
        .collect();
    let broad: Vec<_> = secret_requests
        .iter()
        .filter(|r| {
            let (path, query) = r.path.split_once('?').unwrap_or((&r.path, ""));
            r.method == Method::GET
                && path.ends_with("/secrets")
                && !query.contains("labelSelector")
        })
        .collect();
    assert!(
        broad.is_empty(),
        "Secrets were listed or watched beyond the operator's own: {broad:?}"
    );
    let by_name = format!("/namespaces/{}/secrets/src", ns.name);
    assert!(
        secret_requests
            .iter()
            .any(|r| r.method == Method::GET && r.path.starts_with(&format!("/api/v1{by_name}"))),
        "the named Secret was read by name: {secret_requests:?}"
    );
    Ok(())
}

/// A person labels an owned object `wasmop.dev/protected=true`: a plan that
/// deletes it is refused whole (`ProtectedObject`, naming it), so nothing
/// of that plan is deleted; once the label goes, the same plan proceeds.
#[tokio::test]
async fn a_protected_owned_object_survives_a_plan_that_deletes_it() -> Result<()> {
    let ns = TestNamespace::new("own-protected").await?;
    let _op = start_on(ns.client.clone(), &[&ns.name], &[("fanout", json!({}))]).await?;
    let fanouts = test_kind(&ns, "Fanout", "fanouts");
    create(&fanouts, "Fanout", "f", json!({"count": 3})).await?;
    let cms = ns.api::<ConfigMap>();
    wait_reason(&fanouts, "f", "Reconciled").await?;
    for name in ["f-0", "f-1", "f-2"] {
        cms.get(name).await?;
    }
    let protect =
        |value: Option<&str>| json!({"metadata": {"labels": {"wasmop.dev/protected": value}}});
    cms.patch(
        "f-2",
        &PatchParams::default(),
        &Patch::Merge(protect(Some("true"))),
    )
    .await?;
    let before: Vec<Value> = {
        let mut out = Vec::new();
        for name in ["f-1", "f-2"] {
            out.push(fingerprint(&cms.get(name).await?));
        }
        out
    };

    // Down to one: the plan deletes f-1 and f-2, and f-2 is protected.
    fanouts
        .patch(
            "f",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"count": 1}})),
        )
        .await?;
    let cond = wait_reason(&fanouts, "f", "PlanRejected").await?;
    let mut unnamed = Unnamed::default();
    expect_rejected(
        &mut unnamed,
        &cond,
        "ProtectedObject",
        &["f-2", "wasmop.dev/protected"],
    );
    unnamed.check();
    for (name, was) in ["f-1", "f-2"].into_iter().zip(&before) {
        let cm = cms.get(name).await?;
        assert!(cm.metadata.deletion_timestamp.is_none(), "{name} untouched");
        assert_eq!(&fingerprint(&cm), was, "{name} untouched");
    }

    // A person lifts the protection: the plan goes through.
    cms.patch("f-2", &PatchParams::default(), &Patch::Merge(protect(None)))
        .await?;
    wait_for("f-1 and f-2 deleted", DEFAULT_DEADLINE, || {
        let cms = cms.clone();
        async move {
            let gone = cms.get_opt("f-1").await?.is_none() && cms.get_opt("f-2").await?.is_none();
            Ok(gone.then_some(()))
        }
    })
    .await?;
    cms.get("f-0").await?;
    Ok(())
}

/// A Deployment nothing of wasmop's owns.
fn foreign_deployment(name: &str) -> Result<Deployment> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": "example.invalid/none:1"}]},
            },
        },
    }))?)
}

/// A write scope per owned kind (issue 44): `scoped-writer` may write into
/// any namespace, but its Deployments only beside the primary, as the team
/// plugin's server. A plan that puts a Deployment elsewhere, or deletes a
/// foreign one there by name, is refused whole: the Secret it also held is
/// not written, the foreign Deployment survives.
#[tokio::test]
async fn a_kind_narrowed_to_its_primarys_namespace_is_written_nowhere_else() -> Result<()> {
    let (ns, far, _op) = two_namespaces("own-scope", "scoped-writer", |_| json!({})).await?;
    let writers = test_kind(&ns, "BadWriter", "badwriters");
    let far_secrets: Api<Secret> = far.api();
    let far_deployments: Api<Deployment> = far.api();
    let home_deployments: Api<Deployment> = ns.api();
    let mut unnamed = Unnamed::default();

    create(
        &writers,
        "BadWriter",
        "sw",
        json!({"target": far.name, "deploymentIn": "target"}),
    )
    .await?;
    let cond = wait_reason(&writers, "sw", "PlanRejected").await?;
    expect_rejected(
        &mut unnamed,
        &cond,
        "NamespaceNotAllowed",
        &[
            &format!("Deployment {}/sw", far.name),
            "only in the primary's namespace",
        ],
    );
    assert!(
        far_secrets.get_opt("sw-mirror").await?.is_none(),
        "the Secret of a refused plan is not written"
    );
    assert!(far_deployments.get_opt("sw").await?.is_none());
    assert!(home_deployments.get_opt("sw").await?.is_none());

    // The Deployment at home: the same Secret may go to the far namespace.
    merge_spec(&writers, "sw", json!({"deploymentIn": "home"})).await?;
    let sw = writers.get("sw").await?;
    wait_reason(&writers, "sw", "Reconciled").await?;
    let mirror = far_secrets.get("sw-mirror").await?;
    assert_eq!(mirror.labels().get(OWNER_UID_LABEL), sw.uid().as_ref());
    home_deployments.get("sw").await?;

    // A foreign Deployment in the far namespace, named by a hostile delete
    // with its true uid and resourceVersion.
    let victim = far_deployments
        .create(&PostParams::default(), &foreign_deployment("victim")?)
        .await?;
    merge_spec(
        &writers,
        "sw",
        json!({"deleteVictim": {
            "name": "victim",
            "uid": victim.metadata.uid,
            "resourceVersion": victim.metadata.resource_version,
        }}),
    )
    .await?;
    let cond = wait_reason(&writers, "sw", "PlanRejected").await?;
    expect_rejected(
        &mut unnamed,
        &cond,
        "NamespaceNotAllowed",
        &[&format!("Deployment {}/victim", far.name)],
    );
    let still = far_deployments.get("victim").await?;
    assert_eq!(still.metadata.uid, victim.metadata.uid);
    assert!(still.metadata.deletion_timestamp.is_none());

    // Deleting the primary cleans up what it wrote, in both namespaces.
    writers.delete("sw", &DeleteParams::default()).await?;
    wait_gone(&writers, "BadWriter", "sw").await?;
    wait_gone(&far_secrets, "Secret", "sw-mirror").await?;
    wait_gone(&home_deployments, "Deployment", "sw").await?;
    assert!(far_deployments.get_opt("victim").await?.is_some());
    unnamed.check();
    Ok(())
}

// ---------------------------------------------------------------------------
// Status writes fenced by identity

/// A Widget deleted and made anew under its name just before the status
/// decided for it is sent: the status write tests the UID it was decided
/// for, so it fails (a conflict), the successor never holds its
/// predecessor's status, and it then gets its own.
#[tokio::test]
async fn a_status_decided_for_a_deleted_primary_never_lands_on_its_successor() -> Result<()> {
    let ns = TestNamespace::new("own-status-uid").await?;
    let (interposer, client) = Interposer::new(ns.client.clone());
    let widgets = test_kind(&ns, "Widget", "widgets");
    let status_path = format!("/namespaces/{}/widgets/w/status", ns.name);
    // What the object under the name held right after the write answered:
    // its UID and status.
    let seen: Arc<Mutex<Option<(String, Value)>>> = Arc::default();
    {
        let api = widgets.clone();
        interposer.before(
            request_to(Method::PATCH, status_path.clone()),
            move || async move {
                api.delete("w", &DeleteParams::background())
                    .await
                    .expect("deleting w");
                wait_for("the first w gone", DEFAULT_DEADLINE, || async {
                    Ok(api.get_opt("w").await?.is_none().then_some(()))
                })
                .await
                .expect("the first w gone");
                create(&api, "Widget", "w", json!({"value": "new"}))
                    .await
                    .expect("re-creating w");
            },
        );
    }
    {
        let api = widgets.clone();
        let seen = seen.clone();
        interposer.after(
            request_to(Method::PATCH, status_path.clone()),
            move || async move {
                let w = api.get("w").await.expect("reading w");
                *seen.lock().expect("seen lock") =
                    Some((w.uid().unwrap_or_default(), w.data["status"].clone()));
            },
        );
    }
    let _op = start_on(client, &[&ns.name], &[("good", json!({}))]).await?;
    let old_uid = create(&widgets, "Widget", "w", json!({"value": "old"}))
        .await?
        .uid()
        .unwrap_or_default();
    wait_for("the race was run", DEFAULT_DEADLINE, || async {
        Ok(seen.lock().expect("seen lock").clone())
    })
    .await?;
    let (uid, status) = seen.lock().expect("seen lock").clone().expect("seen");
    ensure!(uid != old_uid, "w was made anew under its name");
    ensure!(
        status["value"] != "old",
        "the successor received the status decided for its predecessor: {status}"
    );
    let raced = interposer
        .writes()
        .into_iter()
        .find(|w| w.is(&Method::PATCH, &status_path))
        .map(|w| w.status);
    ensure!(
        matches!(raced, Some(409 | 422)),
        "the raced status write was refused, not applied: {raced:?}"
    );
    // The successor gets its own status.
    wait_for("w's own status", DEFAULT_DEADLINE, || async {
        let w = widgets.get("w").await?;
        Ok((w.uid().unwrap_or_default() == uid
            && w.data["status"]["value"] == "new"
            && w.data["status"]["conditions"].as_array().is_some_and(|c| {
                c.iter()
                    .any(|c| c["type"] == "Reconciled" && c["status"] == "True")
            }))
        .then_some(()))
    })
    .await?;
    Ok(())
}
