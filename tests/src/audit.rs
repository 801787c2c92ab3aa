//! Who wrote what, from the API server's side.
//!
//! Tests run operator replicas as a ServiceAccount of namespace
//! [`AUDITED_NAMESPACE`], whose writes the local control plane's audit
//! policy logs at Metadata level (`tests/cluster/up.sh`): verb, object,
//! request URI (with its `fieldManager`), user agent and the server's
//! timestamps. Each replica names itself in its user agent,
//! `wasmop/<version> (<identity>)`, so the log tells the replicas apart
//! while their field managers stay the same.
//!
//! [`check_one_writer`] reads that log for the primaries of a sharded
//! operator: a primary's writes by two shards never interleave; a shard
//! hands a primary over (its acknowledgement, or its shard Lease expired)
//! before another shard writes for it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleBinding};
use kube::api::{Api, DeleteParams, PostParams};
use kube::config::Kubeconfig;
use serde_json::{Value, json};

use crate::{TestNamespace, kubeconfig_path};

/// Namespace of the ServiceAccounts whose writes the audit policy logs.
pub const AUDITED_NAMESPACE: &str = "wasmop-audited";

// The field managers of the sharder's label writes and of a shard's drain
// acknowledgements; a shard's claims (`CLAIM_MANAGER`) are writes of the
// shard like any other.
use wasmop::controller::shard::{SHARD_MANAGER, SHARDER_MANAGER};

/// The audit log of the local control plane the tests' client talks to:
/// `up.sh` writes it beside the kubeconfig, in the cluster directory.
pub fn audit_log_path() -> PathBuf {
    crate::kubeconfig_path()
        .parent()
        .map(PathBuf::from)
        .unwrap_or_default()
        .join("logs/audit.log")
}

/// A ServiceAccount whose writes are audited, with admin rights in one
/// test namespace (and, when asked, in the whole cluster) and a kubeconfig
/// holding its token. Deleted when dropped.
#[derive(Debug)]
pub struct AuditedAccount {
    /// Kubeconfig authenticating as the account.
    pub kubeconfig: PathBuf,
    /// Its user name, `system:serviceaccount:wasmop-audited:<name>`.
    pub user: String,
    name: String,
    cluster_admin: bool,
    offset: u64,
}

impl AuditedAccount {
    /// Creates the account for `ns` (admin there through a RoleBinding;
    /// with `cluster_admin` a ClusterRoleBinding too, for cluster-scoped
    /// writes such as webhook configurations), writes its kubeconfig into
    /// `dir`, and remembers where the audit log ends now (only later
    /// events are read).
    ///
    /// # Errors
    /// When the API refuses, or the control plane writes no audit log.
    pub async fn create(ns: &TestNamespace, dir: &Path, cluster_admin: bool) -> Result<Self> {
        let log = audit_log_path();
        let offset = std::fs::metadata(&log)
            .with_context(|| {
                format!(
                    "no API server audit log at {}: start the control plane with tests/cluster/up.sh",
                    log.display()
                )
            })?
            .len();
        let namespaces: Api<Namespace> = Api::all(ns.client.clone());
        let audited: Namespace = serde_json::from_value(json!({
            "metadata": {"name": AUDITED_NAMESPACE, "labels": {"wasmop.dev/test": "true"}}
        }))?;
        match namespaces.create(&PostParams::default(), &audited).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
        let name = ns.name.clone();
        let accounts: Api<ServiceAccount> = Api::namespaced(ns.client.clone(), AUDITED_NAMESPACE);
        let account: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": name}}))?;
        accounts.create(&PostParams::default(), &account).await?;
        let user = format!("system:serviceaccount:{AUDITED_NAMESPACE}:{name}");
        let binding: RoleBinding = serde_json::from_value(json!({
            "metadata": {"name": "wasmop-audited"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": AUDITED_NAMESPACE}],
        }))?;
        ns.api::<RoleBinding>()
            .create(&PostParams::default(), &binding)
            .await?;
        if cluster_admin {
            let binding: ClusterRoleBinding = serde_json::from_value(json!({
                "metadata": {"name": format!("{AUDITED_NAMESPACE}-{name}")},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
                "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": AUDITED_NAMESPACE}],
            }))?;
            Api::<ClusterRoleBinding>::all(ns.client.clone())
                .create(&PostParams::default(), &binding)
                .await?;
        }
        let token = accounts
            .create_token_request(
                &name,
                &PostParams::default(),
                &TokenRequest {
                    spec: TokenRequestSpec {
                        expiration_seconds: Some(3600),
                        ..TokenRequestSpec::default()
                    },
                    ..TokenRequest::default()
                },
            )
            .await?
            .status
            .context("no token in the TokenRequest")?
            .token;
        let admin = Kubeconfig::read_from(kubeconfig_path())?;
        let cluster = admin
            .clusters
            .first()
            .and_then(|c| c.cluster.clone())
            .context("the local kubeconfig names no cluster")?;
        let kubeconfig = dir.join(format!("{name}.kubeconfig"));
        let text = serde_json::to_string(&json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "local", "cluster": {
                "server": cluster.server,
                "certificate-authority-data": cluster.certificate_authority_data,
            }}],
            "users": [{"name": "audited", "user": {"token": token}}],
            "contexts": [{"name": "audited", "context": {"cluster": "local", "user": "audited"}}],
            "current-context": "audited",
        }))?;
        std::fs::write(&kubeconfig, text)?;
        Ok(Self {
            kubeconfig,
            user,
            name,
            cluster_admin,
            offset,
        })
    }

    /// The account's writes the API server logged since it was created.
    ///
    /// # Errors
    /// When the log cannot be read.
    pub fn writes(&self) -> Result<Vec<Write>> {
        use std::io::{Read, Seek, SeekFrom};
        let mut file = std::fs::File::open(audit_log_path())?;
        let len = file.metadata()?.len();
        if len < self.offset {
            bail!("the audit log was rotated during the test");
        }
        file.seek(SeekFrom::Start(self.offset))?;
        let mut text = String::new();
        file.read_to_string(&mut text)?;
        Ok(text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|e| e["user"]["username"] == self.user.as_str())
            .filter_map(|e| Write::from_event(&e))
            .collect())
    }
}

impl Drop for AuditedAccount {
    fn drop(&mut self) {
        let name = self.name.clone();
        let cluster_admin = self.cluster_admin;
        let _ = std::fs::remove_file(&self.kubeconfig);
        crate::cleanup_from_drop(move |client| async move {
            if cluster_admin {
                Api::<ClusterRoleBinding>::all(client.clone())
                    .delete(
                        &format!("{AUDITED_NAMESPACE}-{name}"),
                        &DeleteParams::default(),
                    )
                    .await?;
            }
            Api::<ServiceAccount>::namespaced(client, AUDITED_NAMESPACE)
                .delete(&name, &DeleteParams::default())
                .await?;
            Ok(())
        });
    }
}

/// One write as the API server logged it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    /// The replica, from the user agent `wasmop/<version> (<identity>)`;
    /// empty when the agent names none.
    pub replica: String,
    /// `create`, `update`, `patch`, `delete`, ...
    pub verb: String,
    /// Resource (plural), with `/subresource` when there is one.
    pub resource: String,
    /// Namespace of the object.
    pub namespace: String,
    /// Name of the object.
    pub name: String,
    /// The request's `fieldManager` parameter.
    pub field_manager: String,
    /// When the server received it.
    pub received: jiff::Timestamp,
    /// When the server answered it.
    pub completed: jiff::Timestamp,
    /// The response code.
    pub code: u16,
}

impl Write {
    fn from_event(e: &Value) -> Option<Self> {
        if e["stage"] != "ResponseComplete" {
            return None;
        }
        let agent = e["userAgent"].as_str().unwrap_or_default();
        let replica = agent
            .strip_prefix("wasmop/")
            .and_then(|rest| rest.split_once(" ("))
            .and_then(|(_, id)| id.strip_suffix(')'))
            .unwrap_or_default()
            .to_owned();
        let o = &e["objectRef"];
        let mut resource = o["resource"].as_str()?.to_owned();
        if let Some(sub) = o["subresource"].as_str() {
            resource = format!("{resource}/{sub}");
        }
        let uri = e["requestURI"].as_str().unwrap_or_default();
        let field_manager = uri
            .split_once('?')
            .map(|(_, q)| q)
            .unwrap_or_default()
            .split('&')
            .find_map(|kv| kv.strip_prefix("fieldManager="))
            .unwrap_or_default()
            .to_owned();
        Some(Self {
            replica,
            verb: e["verb"].as_str()?.to_owned(),
            resource,
            namespace: o["namespace"].as_str().unwrap_or_default().to_owned(),
            name: o["name"].as_str().unwrap_or_default().to_owned(),
            field_manager,
            received: e["requestReceivedTimestamp"].as_str()?.parse().ok()?,
            completed: e["stageTimestamp"].as_str()?.parse().ok()?,
            code: u16::try_from(e["responseStatus"]["code"].as_u64()?).ok()?,
        })
    }

    fn succeeded(&self) -> bool {
        (200..300).contains(&self.code)
    }
}

/// What [`check_one_writer`] saw.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Handovers {
    /// Successful writes per replica for the primaries (plans and
    /// acknowledgements).
    pub writes: BTreeMap<String, usize>,
    /// Hand-overs by acknowledgement followed by another shard's writes.
    pub acknowledged: usize,
    /// Hand-overs after the old shard's Lease expired.
    pub expired: usize,
    /// Primaries written by more than one replica.
    pub shared: BTreeSet<String>,
}

/// How one primary's writes so far stand.
struct Holder {
    replica: String,
    last_completed: jiff::Timestamp,
    /// When it acknowledged a drain (it must not write again until the
    /// sharder wrote after that).
    released: Option<jiff::Timestamp>,
}

/// The Widget a write is for, by the `good` plugin's naming: the Widget
/// itself and its status, its ConfigMap `<name>-cm`, its Events
/// `<name>.<suffix>`; `None` for anything else.
pub fn widget_of(w: &Write) -> Option<String> {
    match w.resource.as_str() {
        "widgets" | "widgets/status" => Some(w.name.clone()),
        "configmaps" => w.name.strip_suffix("-cm").map(str::to_owned),
        "events" => w.name.split_once('.').map(|(n, _)| n.to_owned()),
        _ => None,
    }
}

/// Checks, for every primary, that the writes of two shards never
/// interleave: once shard A wrote for a primary, shard B writes for it
/// only after A handed it over (A's acknowledgement, fieldManager
/// `wasmop-shard`, completed; or A's shard Lease `wasmop-shard-A` not
/// renewed for `lease` before B's write was received, less an eighth of
/// it: the server receives a renewal a little after the `renewTime` the
/// sharder judges expiry by, while a live shard renews every third of
/// the lease), and after a
/// sharder write that followed the hand-over; every write of A was
/// answered before B's was received; and after acknowledging, A writes
/// again only once the sharder wrote since.
///
/// `primary_of` maps a write to the primary it is for (`None`: not a
/// primary's write). Writes by the sharder (fieldManager `wasmop-sharder`)
/// are the assignments; a claim (`wasmop-claim`: an owned object's shard
/// label rewritten by the shard its primary moved to) is a write of that
/// shard. Only successful writes count.
///
/// # Errors
/// Every violation, one line each; also a write by a replica its user
/// agent does not name.
pub fn check_one_writer(
    writes: &[Write],
    primary_of: impl Fn(&Write) -> Option<String>,
    lease: Duration,
) -> std::result::Result<Handovers, Vec<String>> {
    let lease =
        jiff::SignedDuration::try_from(lease - lease / 8).unwrap_or(jiff::SignedDuration::MAX);
    let mut problems = Vec::new();
    // Renewals (received) of each shard's Lease.
    let mut renewals: BTreeMap<&str, Vec<jiff::Timestamp>> = BTreeMap::new();
    for w in writes.iter().filter(|w| w.succeeded()) {
        if w.resource == "leases"
            && let Some(id) = w.name.strip_prefix("wasmop-shard-")
            && w.replica == id
        {
            renewals.entry(id).or_default().push(w.received);
        }
    }
    let expired_before = |id: &str, at: jiff::Timestamp| -> bool {
        let last = renewals
            .get(id)
            .and_then(|r| r.iter().filter(|t| **t < at).max().copied());
        last.is_none_or(|t| t.checked_add(lease).is_ok_and(|end| end <= at))
    };
    let mut per: BTreeMap<String, Vec<&Write>> = BTreeMap::new();
    for w in writes.iter().filter(|w| w.succeeded()) {
        if let Some(p) = primary_of(w) {
            per.entry(p).or_default().push(w);
        }
    }
    let mut seen = Handovers::default();
    for (primary, mut ws) in per {
        ws.sort_by_key(|w| (w.received, w.completed));
        let mut holder: Option<Holder> = None;
        let mut last_sharder: Option<jiff::Timestamp> = None;
        let mut writers = BTreeSet::new();
        for w in ws {
            if w.field_manager == SHARDER_MANAGER {
                last_sharder = Some(w.completed);
                continue;
            }
            if w.replica.is_empty() {
                problems.push(format!(
                    "{primary}: a {} of {}/{} by an agent that names no replica",
                    w.verb, w.resource, w.name
                ));
                continue;
            }
            *seen.writes.entry(w.replica.clone()).or_insert(0) += 1;
            writers.insert(w.replica.clone());
            let ack = w.field_manager == SHARD_MANAGER;
            match holder.as_mut() {
                None => {}
                Some(h) if h.replica == w.replica => {
                    if let Some(at) = h.released
                        && last_sharder.is_none_or(|s| s <= at)
                    {
                        problems.push(format!(
                            "{primary}: {} wrote ({} {}/{} at {}) after it acknowledged its drain at {at}, \
                             before the sharder assigned it again",
                            w.replica, w.verb, w.resource, w.name, w.received
                        ));
                    }
                }
                Some(h) => {
                    let released = h.released.filter(|at| *at <= w.received);
                    let expired = expired_before(&h.replica, w.received);
                    let after = released.or(expired.then_some(w.received));
                    if after.is_none() {
                        problems.push(format!(
                            "{primary}: {} wrote ({} {}/{} at {}) while {} held it (last write \
                             answered at {}), without a hand-over",
                            w.replica,
                            w.verb,
                            w.resource,
                            w.name,
                            w.received,
                            h.replica,
                            h.last_completed
                        ));
                    } else if h.last_completed > w.received {
                        problems.push(format!(
                            "{primary}: {} wrote at {} before {}'s write was answered at {}",
                            w.replica, w.received, h.replica, h.last_completed
                        ));
                    } else if last_sharder
                        .is_none_or(|s| s > w.received || released.is_some_and(|r| s < r))
                    {
                        problems.push(format!(
                            "{primary}: {} wrote at {} with no assignment by the sharder since \
                             {} gave it up",
                            w.replica, w.received, h.replica
                        ));
                    } else if released.is_some() {
                        seen.acknowledged += 1;
                    } else {
                        seen.expired += 1;
                    }
                }
            }
            match holder.as_mut() {
                Some(h) if h.replica == w.replica => {
                    h.last_completed = h.last_completed.max(w.completed);
                    if ack {
                        h.released = Some(w.completed);
                    } else if h.released.is_some() {
                        h.released = None;
                    }
                }
                _ => {
                    holder = Some(Holder {
                        replica: w.replica.clone(),
                        last_completed: w.completed,
                        released: ack.then_some(w.completed),
                    });
                }
            }
        }
        if writers.len() > 1 {
            seen.shared.insert(primary);
        }
    }
    if problems.is_empty() {
        Ok(seen)
    } else {
        Err(problems)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_millisecond(1_700_000_000_000 + ms).unwrap()
    }

    fn w(replica: &str, resource: &str, name: &str, manager: &str, from: i64, to: i64) -> Write {
        Write {
            replica: replica.into(),
            verb: "patch".into(),
            resource: resource.into(),
            namespace: "ns".into(),
            name: name.into(),
            field_manager: manager.into(),
            received: at(from),
            completed: at(to),
            code: 200,
        }
    }

    fn plan(replica: &str, from: i64) -> Write {
        w(replica, "configmaps", "p-cm", "good", from, from + 5)
    }

    fn ack(replica: &str, from: i64) -> Write {
        w(replica, "widgets", "p", SHARD_MANAGER, from, from + 5)
    }

    fn sharder(replica: &str, from: i64) -> Write {
        w(replica, "widgets", "p", SHARDER_MANAGER, from, from + 5)
    }

    fn renew(replica: &str, from: i64) -> Write {
        w(
            replica,
            "leases",
            &format!("wasmop-shard-{replica}"),
            "",
            from,
            from + 5,
        )
    }

    fn primary(w: &Write) -> Option<String> {
        match w.resource.as_str() {
            "widgets" | "widgets/status" => Some(w.name.clone()),
            "configmaps" => w.name.strip_suffix("-cm").map(str::to_owned),
            _ => None,
        }
    }

    const LEASE: Duration = Duration::from_millis(2000);

    fn renewing(replica: &str, until: i64) -> Vec<Write> {
        (0..=until / 500).map(|i| renew(replica, i * 500)).collect()
    }

    #[test]
    fn an_acknowledged_and_reassigned_handover_passes() {
        let mut ws = renewing("a", 10_000);
        ws.extend(renewing("b", 10_000));
        ws.extend([
            plan("a", 100),
            sharder("a", 200),
            ack("a", 300),
            sharder("a", 400),
            plan("b", 500),
        ]);
        let seen = check_one_writer(&ws, primary, LEASE).unwrap();
        assert_eq!(seen.acknowledged, 1);
        assert_eq!(seen.shared.len(), 1);
    }

    #[test]
    fn a_second_writer_without_a_handover_is_caught() {
        let mut ws = renewing("a", 10_000);
        ws.extend([plan("a", 100), sharder("a", 200), plan("b", 500)]);
        let err = check_one_writer(&ws, primary, LEASE).unwrap_err();
        assert!(err[0].contains("without a hand-over"), "{err:?}");
    }

    #[test]
    fn writing_after_the_acknowledgement_is_caught() {
        let mut ws = renewing("a", 10_000);
        ws.extend([plan("a", 100), ack("a", 300), plan("a", 350)]);
        let err = check_one_writer(&ws, primary, LEASE).unwrap_err();
        assert!(err[0].contains("after it acknowledged"), "{err:?}");
    }

    #[test]
    fn overlapping_writes_are_caught_even_after_an_acknowledgement() {
        let mut ws = renewing("a", 10_000);
        let mut slow = plan("a", 100);
        slow.completed = at(900);
        ws.extend([slow, ack("a", 300), sharder("a", 400), plan("b", 500)]);
        let err = check_one_writer(&ws, primary, LEASE).unwrap_err();
        assert!(err[0].contains("before a's write was answered"), "{err:?}");
    }

    #[test]
    fn a_takeover_needs_the_old_lease_expired_and_an_assignment() {
        // a stopped renewing at 1000: expired at 3000 (2750 with the
        // tolerance of an eighth of the lease).
        let mut early = renewing("a", 1000);
        early.extend([plan("a", 100), sharder("b", 2500), plan("b", 2600)]);
        let err = check_one_writer(&early, primary, LEASE).unwrap_err();
        assert!(err[0].contains("without a hand-over"), "{err:?}");
        let mut late = renewing("a", 1000);
        late.extend([plan("a", 100), sharder("b", 3100), plan("b", 3200)]);
        assert_eq!(check_one_writer(&late, primary, LEASE).unwrap().expired, 1);
        let mut unassigned = renewing("a", 1000);
        unassigned.extend([plan("a", 100), plan("b", 3200)]);
        let err = check_one_writer(&unassigned, primary, LEASE).unwrap_err();
        assert!(err[0].contains("no assignment by the sharder"), "{err:?}");
    }

    #[test]
    fn a_replica_the_agent_does_not_name_is_a_problem_and_failed_writes_do_not_count() {
        let mut ws = renewing("a", 10_000);
        ws.push(plan("", 100));
        let err = check_one_writer(&ws, primary, LEASE).unwrap_err();
        assert!(err[0].contains("names no replica"), "{err:?}");
        let mut refused = plan("b", 600);
        refused.code = 409;
        let ws = vec![plan("a", 100), refused];
        assert!(check_one_writer(&ws, primary, LEASE).is_ok());
    }

    #[test]
    fn audit_events_parse_into_writes() {
        let e = json!({
            "stage": "ResponseComplete", "verb": "patch",
            "userAgent": "wasmop/0.1.0 (shard-a)",
            "requestURI": "/apis/test.wasmop.dev/v1/namespaces/ns/widgets/w1?fieldManager=wasmop-shard",
            "objectRef": {"resource": "widgets", "namespace": "ns", "name": "w1"},
            "requestReceivedTimestamp": "2026-01-01T00:00:00.000001Z",
            "stageTimestamp": "2026-01-01T00:00:00.002Z",
            "responseStatus": {"code": 200},
        });
        let w = Write::from_event(&e).unwrap();
        assert_eq!(
            (w.replica.as_str(), w.field_manager.as_str(), w.code),
            ("shard-a", SHARD_MANAGER, 200)
        );
        let mut plain = e.clone();
        plain["userAgent"] = json!("wasmop/0.1.0");
        assert_eq!(Write::from_event(&plain).unwrap().replica, "");
    }
}
