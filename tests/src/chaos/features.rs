//! The soak's features mode ([`super::SoakConfig::features`]): the host's
//! features running together under the faults, not only beside them.
//!
//! - **Shards**: the replicas run with `--sharding`; a third replica
//!   joins and is SIGKILLed again ([`super::FaultKind::ShardJoin`]) besides
//!   the kills of the leader and of a follower, each restart a new shard
//!   (its identity names its process).
//! - **A staged rollout** in every window: a `PluginRollout` of `good`'s
//!   shadow `good-v2` (named after the soak's namespace, so each window's is
//!   a successor of the last under the same name) goes through a shadow step
//!   to a canary step of half the Widgets, held far longer than a window,
//!   and is rolled back by `spec.rollback` at a moment the seed draws once
//!   it is on the canary step (or at the quiet point, at the latest). At
//!   the quiet point it must be `RolledBack` within [`ROLLBACK_BOUND`], and
//!   every Widget's ConfigMap back at the current version's label
//!   ([`VERSION_BOUND`]) after the Widgets were edited once more; a
//!   `Promoted` phase is never seen.
//! - **The orphan sweep** every [`SWEEP_SECS`] s, over ConfigMaps owned by
//!   reference (Widgets, Stamps) and by label (Labellers: `labeller`'s
//!   `<name>-mirror`): the soak's `UnexplainedDeletion` check covers the
//!   objects owned by label through the host's owner label, so a collected
//!   object whose owner is alive is a violation.
//! - **Re-created mid-call**: Stamps (`stamper`, which holds each call up to
//!   1.2 s and then writes the UID it was given into the status) are
//!   edited, then deleted and created again under their names while that
//!   call holds. Every version of every Stamp the soak's watch sees must
//!   carry its own UID in `status.uid` (`StatusUid`).
//! - **One writer**: the replicas run as a ServiceAccount whose writes the
//!   API server audits ([`crate::audit`]); at the end, the writes for the
//!   Widgets `k<i>` (edited, never deleted: a name re-used by a successor
//!   would mix two objects' writes in the log, which names objects, not
//!   UIDs) must never come from two shards without a hand-over
//!   ([`check_one_writer`]; `OneWriter`).
//!
//! At every quiet point each Stamp and Labeller is edited once more and must
//! be `Reconciled` for its generation (a Stamp with its own UID in its
//! status) within [`super::CONVERGE_BOUND`]; at the end they are deleted
//! with the replicas running and must be gone within a minute.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Result;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use kube::core::GroupVersionKind;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use wasmop::controller::leader::DEFAULT_LEASE_DURATION;
use wasmop::controller::rollout::rollout_resource;

use super::{
    CHAOS_LABEL, Invariant, MANAGED_BY, Rng, Shared, Violation, delete_owner,
    reconciled_for_generation, retrying,
};
use crate::TestNamespace;
use crate::audit::{AuditedAccount, Write, check_one_writer, widget_of};
use crate::operator::plugin_path;
use crate::widgets::install;

/// `--orphan-sweep-interval-secs` of the features mode.
pub const SWEEP_SECS: u64 = 3;
/// Stamps `s<i>` the load works on.
pub const STAMPS: usize = 4;
/// Labellers `l<i>` the load works on.
pub const LABELLERS: usize = 3;
/// Widgets `k<i>`, edited but never deleted: the audit log's one-writer
/// check is made for them.
pub const KEPT: usize = 3;
/// The longest hold of a Stamp's call (`stamper`'s own bound).
pub const MAX_HOLD_MS: u64 = 1200;
/// How soon after the quiet point's `spec.rollback` the rollout must be
/// `RolledBack`.
pub const ROLLBACK_BOUND: Duration = Duration::from_secs(30);
/// How soon after the Widgets converged every ConfigMap must be back at
/// the current version's label.
pub const VERSION_BOUND: Duration = Duration::from_secs(10);
/// `good`'s version label on its ConfigMaps.
const VERSION_LABEL: &str = "test.wasmop.dev/version";

/// What the features mode set up and counts.
pub(super) struct Features {
    /// The audited account the replicas run as.
    pub(super) account: AuditedAccount,
    pub(super) stamps: Api<DynamicObject>,
    pub(super) labellers: Api<DynamicObject>,
    rollouts: Api<DynamicObject>,
    badges: Api<DynamicObject>,
    /// The rollout's name (the soak's namespace's).
    rollout: String,
    namespace: String,
    /// Figures for the report.
    pub(super) counts: Mutex<BTreeMap<&'static str, usize>>,
}

fn test_kind(client: &Client, ns: Option<&str>, kind: &str, plural: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("test.wasmop.dev", "v1", kind);
    let ar = ApiResource::from_gvk_with_plural(&gvk, plural);
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    }
}

/// The kept Widget `k<i>` a write is for, if any.
fn kept_widget(w: &Write) -> Option<String> {
    widget_of(w).filter(|n| n.starts_with('k'))
}

/// The verdict on a Stamp's status: `None` when it names its own UID or
/// none; else what is wrong.
pub fn stamp_uid_problem(stamp: &Value) -> Option<String> {
    let uid = stamp["metadata"]["uid"].as_str()?;
    let said = stamp["status"]["uid"].as_str()?;
    (said != uid).then(|| {
        format!(
            "Stamp {} (uid {uid}, resourceVersion {}) has status.uid {said}: a status decided for another object of its name landed on it",
            stamp["metadata"]["name"].as_str().unwrap_or_default(),
            stamp["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or_default()
        )
    })
}

impl Features {
    /// Installs `stamper`, `labeller` and the rollout's candidate
    /// (`good-v2` as `good.shadow.wasm`) into `plugins`, applies the
    /// PluginRollout CRD and creates the audited account.
    pub(super) async fn setup(ns: &TestNamespace, work: &Path, plugins: &Path) -> Result<Self> {
        install(&plugin_path("stamper")?, &plugins.join("stamper.wasm"))?;
        install(&plugin_path("labeller")?, &plugins.join("labeller.wasm"))?;
        install(&plugin_path("good-v2")?, &plugins.join("good.shadow.wasm"))?;
        crate::apply_crd_files(
            &ns.client,
            &[crate::repo_root().join("crds/wasmop.dev_pluginrollouts.yaml")],
        )
        .await?;
        let account = AuditedAccount::create(ns, work, true).await?;
        let client = &ns.client;
        Ok(Self {
            account,
            stamps: test_kind(client, Some(&ns.name), "Stamp", "stamps"),
            labellers: test_kind(client, Some(&ns.name), "Labeller", "labellers"),
            rollouts: Api::all_with(client.clone(), &rollout_resource()),
            badges: test_kind(client, None, "Badge", "badges"),
            rollout: format!("{}-good", ns.name),
            namespace: ns.name.clone(),
            counts: Mutex::new(BTreeMap::new()),
        })
    }

    /// More arguments of `wasmop run`: rollouts read often, only this
    /// soak's.
    pub(super) fn args(&self) -> Vec<String> {
        vec![
            "--rollout-interval-ms".to_owned(),
            "500".to_owned(),
            "--rollout-selector".to_owned(),
            format!("{CHAOS_LABEL}={}", self.namespace),
        ]
    }

    fn count(&self, what: &'static str) {
        *self.counts.lock().unwrap().entry(what).or_default() += 1;
    }

    /// Watches every Stamp until `stop`: each version seen is checked by
    /// [`stamp_uid_problem`].
    pub(super) fn watch_stamps(
        self: &Arc<Self>,
        shared: Arc<Shared>,
        stop: Arc<AtomicBool>,
    ) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            let mut events = watcher::watcher(me.stamps.clone(), watcher::Config::default())
                .default_backoff()
                .boxed();
            while !stop.load(Ordering::SeqCst) {
                // Wakes up now and then to see `stop`.
                let next = tokio::time::timeout(Duration::from_millis(300), events.next()).await;
                let obj = match next {
                    Ok(Some(Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)))) => o,
                    Ok(None) => break,
                    _ => continue,
                };
                let Ok(value) = serde_json::to_value(&obj) else {
                    continue;
                };
                if value["status"]["uid"].is_string() {
                    me.count("stamp statuses checked");
                }
                if let Some(problem) = stamp_uid_problem(&value) {
                    let uid = obj.metadata.uid.clone().unwrap_or_default();
                    let mut ledger = shared.ledger.lock().unwrap();
                    if ledger.note(
                        format!("status-uid {uid}"),
                        Invariant::StatusUid,
                        problem.clone(),
                    ) {
                        eprintln!("chaos soak: VIOLATION StatusUid: {problem}");
                    }
                }
            }
        })
    }

    /// One load operation on a random Stamp: created; or edited (a new
    /// hold), then, a moment later while that call may hold, deleted and
    /// mostly created again at once under its name.
    pub(super) async fn stamp_step(&self, rng: &mut Rng, shared: &Shared) -> Result<()> {
        let name = format!("s{}", rng.below(STAMPS as u64));
        let hold = rng.below(MAX_HOLD_MS + 1);
        let roll = rng.below(100);
        let body = |hold: u64, value: String| {
            json!({
                "apiVersion": "test.wasmop.dev/v1", "kind": "Stamp",
                "metadata": {"name": name},
                "spec": {"holdMs": hold, "value": value},
            })
        };
        let create = |hold: u64, value: String| async move {
            let s: DynamicObject = serde_json::from_value(body(hold, value))?;
            self.stamps.create(&PostParams::default(), &s).await?;
            anyhow::Ok(())
        };
        let Some(stamp) = self.stamps.get_opt(&name).await? else {
            create(hold, rng.token()).await?;
            shared.ops.lock().unwrap().created += 1;
            return Ok(());
        };
        let patch = Patch::Merge(json!({"spec": {"holdMs": hold, "value": rng.token()}}));
        self.stamps
            .patch(&name, &PatchParams::default(), &patch)
            .await?;
        shared.ops.lock().unwrap().edited += 1;
        if roll < 30 {
            return Ok(());
        }
        // The load's pace: into the hold of the call the edit started.
        tokio::time::sleep(Duration::from_millis(50 + rng.below(hold.max(100)))).await;
        let uid = stamp.metadata.uid.clone().unwrap_or_default();
        delete_owner(&self.stamps, &name, &uid, shared).await?;
        if roll < 85 {
            create(rng.below(MAX_HOLD_MS + 1), rng.token()).await?;
            shared.ops.lock().unwrap().recreated += 1;
            self.count("stamps re-created under their name");
        }
        Ok(())
    }

    /// One load operation on a random Labeller: created, edited, or
    /// deleted (its finalizer's cleanup deletes its mirror; a create while
    /// it is being deleted is refused).
    pub(super) async fn labeller_step(&self, rng: &mut Rng, shared: &Shared) -> Result<()> {
        let name = format!("l{}", rng.below(LABELLERS as u64));
        let value = rng.token();
        match self.labellers.get_opt(&name).await? {
            None => {
                let l: DynamicObject = serde_json::from_value(json!({
                    "apiVersion": "test.wasmop.dev/v1", "kind": "Labeller",
                    "metadata": {"name": name}, "spec": {"value": value},
                }))?;
                self.labellers.create(&PostParams::default(), &l).await?;
                shared.ops.lock().unwrap().created += 1;
            }
            Some(l) if l.metadata.deletion_timestamp.is_some() => {}
            Some(_) if rng.below(100) < 60 => {
                let patch = Patch::Merge(json!({"spec": {"value": value}}));
                self.labellers
                    .patch(&name, &PatchParams::default(), &patch)
                    .await?;
                shared.ops.lock().unwrap().edited += 1;
            }
            Some(l) => {
                let uid = l.metadata.uid.clone().unwrap_or_default();
                delete_owner(&self.labellers, &name, &uid, shared).await?;
            }
        }
        Ok(())
    }

    fn rollout_body(&self) -> Value {
        json!({
            "apiVersion": "wasmop.dev/v1alpha1", "kind": "PluginRollout",
            "metadata": {"name": self.rollout, "labels": {CHAOS_LABEL: self.namespace}},
            "spec": {
                "plugin": "good",
                "candidate": {"version": "0.2.0"},
                "shadow": {"reconciles": 2, "seconds": 3},
                // The canary step holds far longer than a soak: the
                // rollout is rolled back, never promoted.
                "steps": [{"percent": 50, "holdSeconds": 86400}, {"percent": 100}],
                "holdSeconds": 1,
                // Thresholds only a real fault crosses: the faults fail
                // calls of both versions alike, and the rollback this
                // soak checks is the one it asks for (an automatic one
                // is a rollback too).
                "analysis": {
                    "errors": 1, "timeouts": 1, "planRejected": 1, "dryRunRefused": 1,
                    "deletesPerMinute": 1000, "reconcilesPerMinute": 100000,
                    "p99CallSeconds": 30, "cpuSecondsPerCall": 5,
                },
                "allowDifferences": [{"op": "apply", "path": ".metadata.labels"}],
            },
        })
    }

    /// The rollout of one window, until `stop`: created (again) under its
    /// name, watched, and rolled back `rollback_after` after it was first
    /// seen on its canary step. A `Promoted` phase is a violation.
    pub(super) fn run_rollout(
        self: &Arc<Self>,
        rollback_after: Duration,
        shared: Arc<Shared>,
        stop: Arc<AtomicBool>,
    ) -> tokio::task::JoinHandle<RolloutRun> {
        let me = self.clone();
        tokio::spawn(async move {
            let mut run = RolloutRun::default();
            let mut canary_at: Option<Instant> = None;
            while !stop.load(Ordering::SeqCst) {
                if !run.created {
                    let Ok(obj) = serde_json::from_value::<DynamicObject>(me.rollout_body()) else {
                        break;
                    };
                    match me.rollouts.create(&PostParams::default(), &obj).await {
                        Ok(_) => {
                            run.created = true;
                            me.count("rollouts created");
                        }
                        // Left by a window whose delete did not go through.
                        Err(kube::Error::Api(e)) if e.code == 409 => run.created = true,
                        Err(_) => {}
                    }
                } else if let Ok(Some(obj)) = me.rollouts.get_opt(&me.rollout).await {
                    let phase = obj.data["status"]["phase"].as_str().unwrap_or_default();
                    me.promoted_check(&obj, &shared);
                    if phase == "Canary" && canary_at.is_none() {
                        canary_at = Some(Instant::now());
                        me.count("rollouts on their canary step");
                    }
                    if !run.asked && canary_at.is_some_and(|at| at.elapsed() >= rollback_after) {
                        run.asked = me.ask_rollback().await.is_ok();
                        if run.asked {
                            me.count("rollbacks asked on the canary step");
                        }
                    }
                }
                // The watch's pace, not a synchronisation.
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            run
        })
    }

    fn promoted_check(&self, obj: &DynamicObject, shared: &Shared) {
        if obj.data["status"]["phase"] == "Promoted" {
            let uid = obj.metadata.uid.clone().unwrap_or_default();
            let detail = format!(
                "PluginRollout {} (uid {uid}) reached Promoted, though its canary step holds a day and it was to be rolled back: {}",
                self.rollout, obj.data["status"]
            );
            shared.ledger.lock().unwrap().note(
                format!("promoted {uid}"),
                Invariant::Rollout,
                detail,
            );
        }
    }

    async fn ask_rollback(&self) -> Result<(), kube::Error> {
        let patch = Patch::Merge(json!({"spec": {"rollback": true}}));
        self.rollouts
            .patch(&self.rollout, &PatchParams::default(), &patch)
            .await
            .map(|_| ())
    }

    /// At a quiet point: the window's rollout rolled back (asked now if it
    /// was not yet) and `RolledBack` within [`ROLLBACK_BOUND`].
    pub(super) async fn finish_rollout(
        &self,
        run: &RolloutRun,
        quiet: usize,
        shared: &Shared,
    ) -> Result<Vec<Violation>> {
        let exists = retrying("reading the rollout", shared, || {
            self.rollouts.get_opt(&self.rollout)
        })
        .await?;
        let Some(obj) = exists else {
            return Ok(Vec::new());
        };
        self.promoted_check(&obj, shared);
        if !run.asked {
            retrying("asking the rollout's rollback", shared, || {
                self.ask_rollback()
            })
            .await?;
        }
        let deadline = Instant::now() + ROLLBACK_BOUND;
        loop {
            let obj = retrying("reading the rollout", shared, || {
                self.rollouts.get(&self.rollout)
            })
            .await?;
            self.promoted_check(&obj, shared);
            if obj.data["status"]["phase"] == "RolledBack" {
                self.count("rollouts rolled back");
                return Ok(Vec::new());
            }
            if Instant::now() > deadline {
                return Ok(vec![Violation {
                    invariant: Invariant::Rollout,
                    detail: format!(
                        "quiet point {quiet}: PluginRollout {} not RolledBack {ROLLBACK_BOUND:?} after spec.rollback: {}",
                        self.rollout, obj.data["status"]
                    ),
                }]);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// After the Widgets converged: every ConfigMap of a live Widget at
    /// the current version's label (`v1`) within [`VERSION_BOUND`]; then
    /// the rollout deleted, so the next window's is a new object of its
    /// name.
    pub(super) async fn versions_back(
        &self,
        client: &Client,
        widgets: &Api<DynamicObject>,
        quiet: usize,
        shared: &Shared,
    ) -> Result<Vec<Violation>> {
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &self.namespace);
        let deadline = Instant::now() + VERSION_BOUND;
        let mut out = Vec::new();
        loop {
            let lp = ListParams::default();
            let live: HashSet<String> =
                retrying("listing the Widgets", shared, || widgets.list(&lp))
                    .await?
                    .items
                    .into_iter()
                    .filter_map(|w| w.metadata.uid)
                    .collect();
            let lp = ListParams::default().labels(&format!("{MANAGED_BY}=wasmop"));
            let on_candidate: Vec<String> =
                retrying("listing the ConfigMaps", shared, || cms.list(&lp))
                    .await?
                    .items
                    .iter()
                    .filter(|c| c.name_any().ends_with("-cm"))
                    .filter(|c| {
                        super::Seen::of(c)
                            .controller
                            .is_some_and(|o| live.contains(&o))
                    })
                    .filter(|c| c.labels().get(VERSION_LABEL).map(String::as_str) != Some("v1"))
                    .map(|c| format!("{} ({:?})", c.name_any(), c.labels().get(VERSION_LABEL)))
                    .collect();
            if on_candidate.is_empty() {
                break;
            }
            if Instant::now() > deadline {
                out.push(Violation {
                    invariant: Invariant::Rollout,
                    detail: format!(
                        "quiet point {quiet}: {VERSION_BOUND:?} after the rollout was rolled back and the Widgets converged, ConfigMaps still at the candidate's label: {on_candidate:?}"
                    ),
                });
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let dp = DeleteParams::default();
        let _ = retrying("deleting the rollout", shared, || async {
            match self.rollouts.delete(&self.rollout, &dp).await {
                Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
                other => other.map(|_| ()),
            }
        })
        .await;
        Ok(out)
    }

    /// At a quiet point: every Stamp and Labeller edited once more (a
    /// Stamp without a hold), then each `Reconciled` for its generation,
    /// a Stamp with its own UID in its status; each one's time from
    /// `since` (None: not within `deadline`), with its last state.
    pub(super) async fn measure(
        &self,
        rng: &mut Rng,
        shared: &Shared,
        since: Instant,
        deadline: Duration,
    ) -> Result<Vec<(String, Option<Duration>, String)>> {
        let pp = PatchParams::default();
        for (api, kind) in [(&self.stamps, "Stamp"), (&self.labellers, "Labeller")] {
            let lp = ListParams::default();
            for o in retrying("listing the primaries", shared, || api.list(&lp))
                .await?
                .items
            {
                if o.metadata.deletion_timestamp.is_some() {
                    continue;
                }
                let name = o.name_any();
                let spec = if kind == "Stamp" {
                    json!({"holdMs": 0, "value": rng.token()})
                } else {
                    json!({"value": rng.token()})
                };
                let patch = Patch::Merge(json!({"spec": spec}));
                let edited = retrying(&format!("editing {kind} {name}"), shared, || async {
                    match api.patch(&name, &pp, &patch).await {
                        Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
                        other => other.map(|_| true),
                    }
                })
                .await?;
                if edited {
                    shared.ops.lock().unwrap().edited += 1;
                }
            }
        }
        let mut done: BTreeMap<String, Duration> = BTreeMap::new();
        let mut behind: BTreeMap<String, String> = BTreeMap::new();
        loop {
            let at = since.elapsed();
            behind.clear();
            for (api, kind) in [(&self.stamps, "Stamp"), (&self.labellers, "Labeller")] {
                let Ok(list) = api.list(&ListParams::default()).await else {
                    behind.insert(format!("{kind}s"), "not listed".to_owned());
                    continue;
                };
                for o in list.items {
                    let key = format!("{kind}/{}", o.name_any());
                    if done.contains_key(&key) || o.metadata.deletion_timestamp.is_some() {
                        continue;
                    }
                    let value = serde_json::to_value(&o)?;
                    let verdict = reconciled_for_generation(&value).and_then(|()| {
                        if kind == "Stamp" && value["status"]["uid"] != value["metadata"]["uid"] {
                            Err(format!(
                                "status.uid {} is not its uid {}",
                                value["status"]["uid"], value["metadata"]["uid"]
                            ))
                        } else {
                            Ok(())
                        }
                    });
                    match verdict {
                        Ok(()) => {
                            done.insert(key, at);
                        }
                        Err(why) => {
                            behind.insert(key, why);
                        }
                    }
                }
            }
            if behind.is_empty() || at > deadline {
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

    /// At the end, with the replicas running: every Stamp and Labeller
    /// deleted and gone within a minute (a Labeller's finalizer's cleanup
    /// deletes its mirror and Badge).
    pub(super) async fn delete_all(&self, shared: &Shared) -> Result<Vec<Violation>> {
        let dp = DeleteParams::background();
        for api in [&self.stamps, &self.labellers] {
            let lp = ListParams::default();
            for o in retrying("listing the primaries", shared, || api.list(&lp))
                .await?
                .items
            {
                if let Some(uid) = o.metadata.uid.clone() {
                    shared.deleted_owners.lock().unwrap().insert(uid);
                }
                let _ = api.delete(&o.name_any(), &dp).await;
            }
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let mut left = Vec::new();
            for api in [&self.stamps, &self.labellers] {
                let lp = ListParams::default();
                left.extend(
                    retrying("listing the primaries", shared, || api.list(&lp))
                        .await?
                        .items
                        .iter()
                        .map(|o| {
                            format!(
                                "{}/{}",
                                o.types.as_ref().map(|t| t.kind.as_str()).unwrap_or("?"),
                                o.name_any()
                            )
                        }),
                );
            }
            if left.is_empty() {
                return Ok(Vec::new());
            }
            if Instant::now() > deadline {
                return Ok(vec![Violation {
                    invariant: super::Invariant::Convergence,
                    detail: format!(
                        "Stamps and Labellers deleted, 60 s later still there: {left:?}"
                    ),
                }]);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The one-writer check of the kept Widgets from the audit log:
    /// violations, and a line for the report.
    pub(super) fn one_writer(&self) -> Result<(Vec<Violation>, String)> {
        let writes = self.account.writes()?;
        Ok(
            match check_one_writer(&writes, kept_widget, DEFAULT_LEASE_DURATION) {
                Ok(seen) => (
                    Vec::new(),
                    format!(
                        "audited writes for the kept Widgets by replica: {:?}; hand-overs by acknowledgement {}, after a shard Lease expired {}; written by more than one shard over the soak: {}",
                        seen.writes,
                        seen.acknowledged,
                        seen.expired,
                        seen.shared.len()
                    ),
                ),
                Err(problems) => (
                    problems
                        .into_iter()
                        .map(|p| Violation {
                            invariant: Invariant::OneWriter,
                            detail: p,
                        })
                        .collect(),
                    "the audit log shows a primary written by two shards".to_owned(),
                ),
            },
        )
    }

    /// What a soak that stopped leaves is put right: the Labellers'
    /// finalizers dropped (no replica runs to clean up), the rollout and
    /// this soak's Badges deleted.
    pub(super) async fn forget(&self) {
        if let Ok(list) = self.labellers.list(&ListParams::default()).await {
            for l in list.items {
                let name = l.name_any();
                let _ = self
                    .labellers
                    .patch(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
                    )
                    .await;
            }
        }
        let _ = self
            .rollouts
            .delete(&self.rollout, &DeleteParams::default())
            .await;
        if let Ok(list) = self.badges.list(&ListParams::default()).await {
            for b in list.items {
                let name = b.name_any();
                if name.starts_with(&format!("{}-", self.namespace)) {
                    let _ = self.badges.delete(&name, &DeleteParams::default()).await;
                }
            }
        }
    }
}

/// How one window's rollout went.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct RolloutRun {
    /// It was created (or found).
    pub(super) created: bool,
    /// Its rollback was asked on the canary step.
    pub(super) asked: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_naming_another_uid_is_a_problem_and_none_is_not() {
        let own = json!({"metadata": {"name": "s0", "uid": "u1"}, "status": {"uid": "u1"}});
        assert_eq!(stamp_uid_problem(&own), None);
        let fresh = json!({"metadata": {"name": "s0", "uid": "u2"}});
        assert_eq!(stamp_uid_problem(&fresh), None);
        let inherited = json!({"metadata": {"name": "s0", "uid": "u2"}, "status": {"uid": "u1"}});
        let problem = stamp_uid_problem(&inherited).unwrap();
        assert!(
            problem.contains("u1") && problem.contains("u2"),
            "{problem}"
        );
    }

    #[test]
    fn only_the_kept_widgets_writes_are_checked_for_one_writer() {
        let w = |resource: &str, name: &str| Write {
            replica: "a".into(),
            verb: "patch".into(),
            resource: resource.into(),
            namespace: "ns".into(),
            name: name.into(),
            field_manager: String::new(),
            received: jiff::Timestamp::UNIX_EPOCH,
            completed: jiff::Timestamp::UNIX_EPOCH,
            code: 200,
        };
        assert_eq!(kept_widget(&w("widgets/status", "k1")), Some("k1".into()));
        assert_eq!(kept_widget(&w("configmaps", "k0-cm")), Some("k0".into()));
        assert_eq!(kept_widget(&w("widgets", "w1")), None);
        assert_eq!(kept_widget(&w("configmaps", "s0-stamp")), None);
    }
}
