//! Leader election against the real local control plane: replicas of the
//! operator with the `good` test plugin (Widget → ConfigMap `<name>-cm`)
//! share one Lease. Exactly one writes; a crashed leader is replaced once
//! its Lease expires; a leader that stops gracefully releases the Lease and
//! is replaced at once. Durations are short: lease 2 s, renew every 500 ms.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;
use wasmop::controller::leader::LeaderConfig;
use wasmop_tests::operator::{LeaderLoop, RunningOperator, load_plugin, test_config};
use wasmop_tests::{DEFAULT_DEADLINE, TestNamespace, apply_test_crds, wait_for};

const LEASE: &str = "wasmop-leader";
const LEASE_DURATION: Duration = Duration::from_secs(2);
const RENEW_EVERY: Duration = Duration::from_millis(500);

/// One replica: an operator and its leader-election loop.
struct Replica {
    identity: String,
    flag: Arc<AtomicBool>,
    operator: RunningOperator,
    election: LeaderLoop,
}

impl Replica {
    async fn start(ns: &TestNamespace, identity: &str) -> Result<Self> {
        let operator = RunningOperator::start_follower(
            ns.client.clone(),
            vec![ns.name.clone()],
            vec![load_plugin("good", json!({}))?],
            test_config(),
        )
        .await?;
        let config = LeaderConfig {
            identity: identity.to_string(),
            lease_name: LEASE.to_string(),
            lease_duration: LEASE_DURATION,
            renew_every: RENEW_EVERY,
            ..LeaderConfig::new(&ns.name)
        };
        let flag = operator.operator.leader_flag();
        assert!(
            !flag.load(Ordering::SeqCst),
            "{identity} starts as a follower"
        );
        let election = LeaderLoop::start(ns.client.clone(), config, &operator.operator);
        Ok(Self {
            identity: identity.to_string(),
            flag,
            operator,
            election,
        })
    }

    fn leads(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }

    /// Crash: the operator and the loop vanish, the Lease is left held.
    async fn crash(self) {
        self.election.kill().await;
        self.operator.kill();
    }

    /// Graceful stop: in-flight reconciles finish, then the Lease is
    /// released (the order `wasmop run` uses).
    async fn stop(self) {
        self.operator.stop().await;
        self.election.stop().await;
    }
}

/// The write flag of each live replica, by identity.
type Flags = Arc<Mutex<Vec<(String, Arc<AtomicBool>)>>>;

/// Samples the write flags of the live replicas and remembers whether two
/// were ever true at once. A crashed replica is removed (its process would
/// be gone; its stale flag means nothing).
#[derive(Clone, Default)]
struct Exclusion {
    flags: Flags,
    overlap: Arc<Mutex<Option<Vec<String>>>>,
}

impl Exclusion {
    fn watch(&self, r: &Replica) {
        self.flags
            .lock()
            .expect("flags")
            .push((r.identity.clone(), r.flag.clone()));
    }

    fn forget(&self, identity: &str) {
        self.flags
            .lock()
            .expect("flags")
            .retain(|(id, _)| id != identity);
    }

    fn spawn(&self) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(5));
            loop {
                tick.tick().await;
                let leaders: Vec<String> = this
                    .flags
                    .lock()
                    .expect("flags")
                    .iter()
                    .filter(|(_, f)| f.load(Ordering::SeqCst))
                    .map(|(id, _)| id.clone())
                    .collect();
                if leaders.len() > 1 {
                    this.overlap.lock().expect("overlap").get_or_insert(leaders);
                }
            }
        })
    }

    fn check(&self) -> Result<()> {
        if let Some(both) = self.overlap.lock().expect("overlap").clone() {
            bail!("two replicas held the write flag at once: {both:?}");
        }
        Ok(())
    }
}

fn widgets(ns: &TestNamespace) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("test.wasmop.dev", "v1", "Widget");
    let ar = ApiResource::from_gvk_with_plural(&gvk, "widgets");
    Api::namespaced_with(ns.client.clone(), &ns.name, &ar)
}

async fn create_widget(ns: &TestNamespace, name: &str) -> Result<()> {
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
        "metadata": {"name": name}, "spec": {"value": name},
    }))?;
    widgets(ns).create(&PostParams::default(), &obj).await?;
    Ok(())
}

async fn wait_configmap(ns: &TestNamespace, widget: &str) -> Result<()> {
    let cms: Api<ConfigMap> = ns.api();
    let name = format!("{widget}-cm");
    wait_for(&format!("ConfigMap {name}"), DEFAULT_DEADLINE, || {
        let cms = cms.clone();
        let name = name.clone();
        async move { Ok(cms.get_opt(&name).await?.map(|_| ())) }
    })
    .await
}

/// The Lease's holder and transition count.
async fn lease_state(ns: &TestNamespace) -> Result<(Option<String>, i32)> {
    let lease = ns.api::<Lease>().get(LEASE).await?;
    let spec = lease.spec.unwrap_or_default();
    Ok((
        spec.holder_identity.filter(|h| !h.is_empty()),
        spec.lease_transitions.unwrap_or(0),
    ))
}

/// Waits until `replica` leads and the Lease names it.
async fn wait_leader(ns: &TestNamespace, replica: &Replica, deadline: Duration) -> Result<()> {
    wait_for(
        &format!("{} to become leader", replica.identity),
        deadline,
        || async {
            let (holder, _) = lease_state(ns).await?;
            if replica.leads() && holder.as_deref() == Some(replica.identity.as_str()) {
                Ok(Some(()))
            } else {
                bail!("flag {}, Lease holder {holder:?}", replica.leads())
            }
        },
    )
    .await
}

#[tokio::test]
async fn one_replica_writes_and_another_takes_over_after_a_crash_or_a_release() -> Result<()> {
    let ns = TestNamespace::new("leader").await?;
    apply_test_crds(&ns.client).await?;
    let exclusion = Exclusion::default();
    let sampler = exclusion.spawn();

    // Two replicas race for the Lease: exactly one wins.
    let a = Replica::start(&ns, "replica-a").await?;
    let b = Replica::start(&ns, "replica-b").await?;
    exclusion.watch(&a);
    exclusion.watch(&b);
    let a_won = wait_for("exactly one leader", DEFAULT_DEADLINE, || async {
        let (holder, _) = lease_state(&ns).await?;
        match (a.leads(), b.leads(), holder.as_deref()) {
            (true, false, Some("replica-a")) => Ok(Some(true)),
            (false, true, Some("replica-b")) => Ok(Some(false)),
            (fa, fb, h) => bail!("flags a={fa} b={fb}, Lease holder {h:?}"),
        }
    })
    .await?;
    let (leader, follower) = if a_won { (a, b) } else { (b, a) };

    // The leader reconciles; the follower computes plans but never writes.
    create_widget(&ns, "w1").await?;
    wait_configmap(&ns, "w1").await?;
    assert!(leader.leads(), "{} still leads", leader.identity);
    assert_eq!(
        wasmop::metrics::global().get("wasmop_leader", &[]),
        Some(1.0),
        "the leader gauge says a replica of this process leads"
    );
    assert!(!follower.leads(), "{} still follows", follower.identity);
    let (_, transitions_before) = lease_state(&ns).await?;

    // The leader crashes: nothing releases its Lease. The follower waits
    // for the Lease to expire, then takes over and makes the writes it
    // skipped while following.
    let crashed = leader.identity.clone();
    exclusion.forget(&crashed);
    leader.crash().await;
    let crashed_at = Instant::now();
    create_widget(&ns, "w2").await?;
    wait_leader(&ns, &follower, DEFAULT_DEADLINE).await?;
    let waited = crashed_at.elapsed();
    // Its last renewal was at most one renew interval (plus a request)
    // before the crash; the Lease cannot have expired much sooner.
    assert!(
        waited >= LEASE_DURATION - RENEW_EVERY * 2,
        "{} took over after {waited:?}, before {crashed}'s Lease of {LEASE_DURATION:?} expired",
        follower.identity
    );
    let (_, transitions) = lease_state(&ns).await?;
    assert_eq!(
        transitions,
        transitions_before + 1,
        "a take-over counts one transition"
    );
    wait_configmap(&ns, "w2").await?;
    let second = follower;

    // A new replica joins as a follower; the leader stops gracefully and
    // releases the Lease, so the new one takes over without waiting for
    // expiry.
    let third = Replica::start(&ns, "replica-c").await?;
    exclusion.watch(&third);
    let second_flag = second.flag.clone();
    let stopping = Instant::now();
    second.stop().await;
    assert!(
        !second_flag.load(Ordering::SeqCst),
        "a stopped replica does not write"
    );
    let released = stopping.elapsed();
    let (holder, _) = lease_state(&ns).await?;
    assert!(
        holder.is_none() || holder.as_deref() == Some("replica-c"),
        "the graceful stop released the Lease; holder is {holder:?}"
    );
    create_widget(&ns, "w3").await?;
    wait_leader(&ns, &third, DEFAULT_DEADLINE).await?;
    let handover = stopping.elapsed() - released;
    assert!(
        handover < LEASE_DURATION,
        "replica-c took {handover:?} after the release, as long as waiting for expiry"
    );
    wait_configmap(&ns, "w3").await?;

    sampler.abort();
    exclusion.check()?;
    third.stop().await;
    Ok(())
}
