//! Small models of the built-in controllers the plugins depend on, run by
//! `wasmop check` between reconciles, each one step at a time:
//!
//! - StatefulSet → Pods `<name>-<ordinal>`, replaced highest ordinal first
//!   when the template changes; status `replicas`, `readyReplicas`,
//!   `currentReplicas`, `updatedReplicas`, `availableReplicas`,
//!   `currentRevision`/`updateRevision`, `observedGeneration`.
//! - Deployment → Pods `<name>-<revision>-<i>`; old ones go once the new
//!   are ready; status counts, `observedGeneration` and the `Available`
//!   and `Progressing` conditions.
//! - Pods (scheduler and kubelet): Pending → Running and Ready.
//! - Job → one Pod → `Complete` (or `Failed`), `succeeded`/`failed`,
//!   `startTime`/`completionTime`.
//! - PersistentVolumeClaim → `Bound`.
//! - cert-manager `Certificate` → its `spec.secretName` Secret
//!   (`tls.crt`, `tls.key`, `ca.crt`) and `Ready=True`, `notBefore`,
//!   `notAfter`, `renewalTime`.
//!
//! Services need no controller here: the world gives them a `clusterIP`
//! on create.
//!
//! [`Knobs`] make them fail the way clusters do: Pods never ready, an
//! image that cannot be pulled, a node lost under a ready Pod (it turns
//! not ready, then is evicted and replaced), a slow cluster (every step
//! takes three), Jobs that fail.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde_json::{Value, json};

use crate::check::world::{ObjKey, World, key_of};
use crate::object;

/// How the modelled cluster misbehaves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Knobs {
    /// Pods run but never become ready.
    pub never_ready: bool,
    /// Pods stay Pending with `ImagePullBackOff`.
    pub image_pull: bool,
    /// At this tick the node under the first ready Pod is lost.
    pub node_lost_at: Option<u32>,
    /// Each controller step happens every third tick only.
    pub slow: bool,
    /// Job Pods fail.
    pub job_fails: bool,
}

impl Knobs {
    /// A short name, for traces.
    pub fn name(&self) -> String {
        let mut parts = Vec::new();
        if self.never_ready {
            parts.push("never-ready".to_owned());
        }
        if self.image_pull {
            parts.push("image-pull-failure".to_owned());
        }
        if let Some(t) = self.node_lost_at {
            parts.push(format!("node-lost@{t}"));
        }
        if self.slow {
            parts.push("slow".to_owned());
        }
        if self.job_fails {
            parts.push("job-fails".to_owned());
        }
        if parts.is_empty() {
            "healthy".to_owned()
        } else {
            parts.join(",")
        }
    }

    /// True when the cluster can make every workload ready eventually.
    pub fn healthy_eventually(&self) -> bool {
        !self.never_ready && !self.image_pull && !self.job_fails
    }
}

/// The controllers' own state, beside the world.
#[derive(Clone, Debug, Default)]
pub struct Sim {
    /// The knobs.
    pub knobs: Knobs,
    /// Steps taken.
    pub tick: u32,
    /// Pods whose node was lost, with the tick it happened.
    lost: BTreeMap<String, u32>,
    /// True once the node loss happened.
    node_lost: bool,
}

const LOST_FOR: u32 = 2;

impl Sim {
    /// A simulation with these knobs.
    pub fn new(knobs: Knobs) -> Self {
        Sim {
            knobs,
            ..Sim::default()
        }
    }

    /// One step of every controller. Returns true when anything changed.
    pub fn step(&mut self, w: &mut World) -> bool {
        self.tick += 1;
        if self.knobs.slow && !self.tick.is_multiple_of(3) {
            // Nothing happens this time, but something is still to come.
            return self.pending(w);
        }
        let before = w.content();
        self.lose_node(w);
        self.pods(w);
        self.statefulsets(w);
        self.deployments(w);
        self.jobs(w);
        self.claims(w);
        self.certificates(w);
        w.collect_garbage();
        w.content() != before
    }

    /// True when a step could still change something (for a slow cluster's
    /// idle ticks).
    fn pending(&self, w: &World) -> bool {
        let mut copy = self.clone();
        copy.knobs.slow = false;
        let mut w2 = w.clone();
        copy.step(&mut w2)
    }

    fn lose_node(&mut self, w: &mut World) {
        if !self.node_lost && self.knobs.node_lost_at.is_some_and(|t| self.tick >= t) {
            self.lose_one(w);
        }
        // Evict pods lost long enough; their owners replace them.
        let evict: Vec<ObjKey> = w
            .objects()
            .filter(|(_, o)| {
                self.lost
                    .get(object::uid(o))
                    .is_some_and(|t| self.tick >= t + LOST_FOR)
            })
            .map(|(k, _)| k.clone())
            .collect();
        for k in evict {
            let _ = w.delete(&k, None, None);
        }
    }

    fn lose_one(&mut self, w: &mut World) {
        let victim = w
            .objects()
            .find(|(k, o)| k.1 == "Pod" && pod_ready(o))
            .map(|(k, o)| (k.clone(), object::uid(o).to_owned()));
        if let Some((k, uid)) = victim {
            self.node_lost = true;
            self.lost.insert(uid, self.tick);
            w.edit(&k, |p| {
                p["status"]["phase"] = json!("Unknown");
                set_cond(p, "Ready", "False", "NodeLost");
            });
        }
    }

    fn pods(&self, w: &mut World) {
        let pods: Vec<(ObjKey, Value)> = w
            .objects()
            .filter(|(k, _)| k.0.is_empty() && k.1 == "Pod")
            .map(|(k, o)| (k.clone(), o.clone()))
            .collect();
        let now = w.now_text();
        for (k, p) in pods {
            if self.lost.contains_key(object::uid(&p)) || object::is_deleting(&p) {
                continue;
            }
            let phase = p["status"]["phase"].as_str().unwrap_or("Pending");
            let job = object::controller_ref(&p).is_some_and(|r| r["kind"] == "Job");
            let knobs = self.knobs;
            match phase {
                "Pending" if knobs.image_pull => {
                    w.edit(&k, |p| {
                        p["status"]["phase"] = json!("Pending");
                        p["status"]["containerStatuses"] = json!([{"name": "main", "ready": false,
                            "state": {"waiting": {"reason": "ImagePullBackOff",
                                                  "message": "Back-off pulling image"}}}]);
                        set_cond(p, "Ready", "False", "ContainersNotReady");
                    });
                }
                "Pending" => {
                    let ready = !knobs.never_ready;
                    w.edit(&k, |p| {
                        p["status"]["phase"] = json!("Running");
                        p["status"]["startTime"] = json!(now);
                        p["status"]["podIP"] = json!("10.244.0.10");
                        p["status"]["containerStatuses"] = json!([{"name": "main", "ready": ready,
                            "state": {"running": {"startedAt": now}}}]);
                        set_cond(p, "Ready", if ready { "True" } else { "False" }, "");
                    });
                }
                "Running" if job => {
                    let phase = if knobs.job_fails {
                        "Failed"
                    } else {
                        "Succeeded"
                    };
                    w.edit(&k, |p| {
                        p["status"]["phase"] = json!(phase);
                        set_cond(p, "Ready", "False", "PodCompleted");
                    });
                }
                _ => {}
            }
        }
    }

    fn statefulsets(&self, w: &mut World) {
        for (k, sts) in of_kind(w, "apps", "StatefulSet") {
            if object::is_deleting(&sts) {
                continue;
            }
            let replicas = sts["spec"]["replicas"].as_i64().unwrap_or(1).max(0);
            let revision = revision_of(&sts["spec"]["template"]);
            let name = k.3.clone();
            let pods = owned_pods(w, object::uid(&sts));
            // Create missing ordinals (in order, one at a time, as the
            // default OrderedReady policy does: only after the previous one
            // is ready).
            let mut all_ready_before = true;
            let mut acted = false;
            for i in 0..replicas {
                let pod_name = format!("{name}-{i}");
                match pods.iter().find(|p| object::name(p) == pod_name) {
                    None if all_ready_before && !acted => {
                        let _ = w.create(pod(&sts, &pod_name, &revision));
                        acted = true;
                    }
                    Some(p) => all_ready_before &= pod_ready(p),
                    None => all_ready_before = false,
                }
            }
            // Surplus Pods go, highest ordinal first.
            for p in &pods {
                let ord = ordinal(object::name(p), &name);
                if ord.is_none_or(|o| o >= replicas) && !acted {
                    let _ = w.delete(&key_of(p), None, None);
                    acted = true;
                }
            }
            // Rolling update, highest ordinal first, once the rest are ready.
            if !acted && pods.iter().all(pod_ready) {
                let mut stale: Vec<&Value> = pods
                    .iter()
                    .filter(|p| {
                        object::labels_get(p, "controller-revision-hash") != Some(&revision)
                    })
                    .collect();
                stale.sort_by_key(|p| std::cmp::Reverse(ordinal(object::name(p), &name)));
                if let Some(p) = stale.first() {
                    let _ = w.delete(&key_of(p), None, None);
                }
            }
            let pods = owned_pods(w, object::uid(&sts));
            let ready = pods.iter().filter(|p| pod_ready(p)).count();
            let updated = pods
                .iter()
                .filter(|p| object::labels_get(p, "controller-revision-hash") == Some(&revision))
                .count();
            let current_revision = if updated as i64 == replicas && ready as i64 == replicas {
                revision.clone()
            } else {
                sts["status"]["currentRevision"]
                    .as_str()
                    .unwrap_or(&revision)
                    .to_owned()
            };
            let status = json!({
                "observedGeneration": sts["metadata"]["generation"],
                "replicas": pods.len(),
                "readyReplicas": ready,
                "availableReplicas": ready,
                "currentReplicas": if current_revision == revision { updated } else { pods.len() - updated },
                "updatedReplicas": updated,
                "currentRevision": current_revision,
                "updateRevision": revision,
                "collisionCount": 0,
            });
            let _ = w.write_status(&k, status);
        }
    }

    fn deployments(&self, w: &mut World) {
        for (k, dep) in of_kind(w, "apps", "Deployment") {
            if object::is_deleting(&dep) {
                continue;
            }
            let replicas = dep["spec"]["replicas"].as_i64().unwrap_or(1).max(0);
            let revision = revision_of(&dep["spec"]["template"]);
            let pods = owned_pods(w, object::uid(&dep));
            let (new, old): (Vec<&Value>, Vec<&Value>) = pods
                .iter()
                .partition(|p| object::labels_get(p, "pod-template-hash") == Some(&revision));
            for i in 0..replicas {
                let pod_name = format!("{}-{revision}-{i}", k.3);
                if !new.iter().any(|p| object::name(p) == pod_name) {
                    let mut p = pod(&dep, &pod_name, &revision);
                    p["metadata"]["labels"]["pod-template-hash"] = json!(revision);
                    let _ = w.create(p);
                }
            }
            for p in &new {
                let i = object::name(p)
                    .rsplit('-')
                    .next()
                    .and_then(|s| s.parse::<i64>().ok());
                if i.is_none_or(|i| i >= replicas) {
                    let _ = w.delete(&key_of(p), None, None);
                }
            }
            let new_ready = new.iter().filter(|p| pod_ready(p)).count() as i64;
            if new_ready >= replicas {
                for p in &old {
                    let _ = w.delete(&key_of(p), None, None);
                }
            }
            let pods = owned_pods(w, object::uid(&dep));
            let ready = pods.iter().filter(|p| pod_ready(p)).count() as i64;
            let updated = pods
                .iter()
                .filter(|p| object::labels_get(p, "pod-template-hash") == Some(&revision))
                .count() as i64;
            let available = if ready >= replicas { "True" } else { "False" };
            let status = json!({
                "observedGeneration": dep["metadata"]["generation"],
                "replicas": pods.len(),
                "readyReplicas": ready,
                "availableReplicas": ready,
                "updatedReplicas": updated,
                "unavailableReplicas": (replicas - ready).max(0),
                "conditions": [
                    {"type": "Available", "status": available,
                     "reason": if available == "True" { "MinimumReplicasAvailable" } else { "MinimumReplicasUnavailable" }},
                    {"type": "Progressing", "status": "True",
                     "reason": if updated == replicas && ready >= replicas { "NewReplicaSetAvailable" } else { "ReplicaSetUpdated" }},
                ],
            });
            let _ = w.write_status(&k, status);
        }
    }

    fn jobs(&self, w: &mut World) {
        let now = w.now_text();
        for (k, job) in of_kind(w, "batch", "Job") {
            if object::is_deleting(&job) || is_finished(&job) {
                continue;
            }
            let pods = owned_pods(w, object::uid(&job));
            let Some(p) = pods.first() else {
                let name = format!("{}-{}", k.3, &revision_of(&job["spec"]["template"])[..5]);
                let _ = w.create(pod(&job, &name, ""));
                let _ = w.write_status(&k, json!({"startTime": now, "active": 1}));
                continue;
            };
            let start = job["status"]["startTime"].clone();
            let status = match p["status"]["phase"].as_str() {
                Some("Succeeded") => json!({"startTime": start, "completionTime": now,
                    "succeeded": 1, "conditions": [
                        {"type": "SuccessCriteriaMet", "status": "True", "lastTransitionTime": now},
                        {"type": "Complete", "status": "True", "lastTransitionTime": now}]}),
                Some("Failed") => json!({"startTime": start, "failed": 1, "conditions": [
                    {"type": "FailureTarget", "status": "True", "reason": "BackoffLimitExceeded", "lastTransitionTime": now},
                    {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                     "message": "Job has reached the specified backoff limit", "lastTransitionTime": now}]}),
                _ => json!({"startTime": start, "active": 1,
                    "ready": i64::from(pod_ready(p))}),
            };
            let _ = w.write_status(&k, status);
        }
    }

    fn claims(&self, w: &mut World) {
        for (k, pvc) in of_kind(w, "", "PersistentVolumeClaim") {
            if pvc["status"]["phase"] != "Bound" {
                let _ = w.write_status(
                    &k,
                    json!({"phase": "Bound", "accessModes": pvc["spec"]["accessModes"],
                           "capacity": pvc["spec"]["resources"]["requests"]}),
                );
            }
        }
    }

    fn certificates(&self, w: &mut World) {
        let now = w.now;
        let text = |t: jiff::Timestamp| crate::reconcile::decide::format_now(t);
        let day = jiff::SignedDuration::from_hours(24);
        for (k, cert) in of_kind(w, "cert-manager.io", "Certificate") {
            if object::is_deleting(&cert) {
                continue;
            }
            let Some(secret_name) = cert["spec"]["secretName"].as_str() else {
                continue;
            };
            let sk: ObjKey = (
                String::new(),
                "Secret".into(),
                k.2.clone(),
                secret_name.into(),
            );
            let fingerprint = revision_of(&cert["spec"]);
            let issued = w
                .get(&sk)
                .and_then(|s| {
                    s["metadata"]["annotations"]["cert-manager.io/check-spec"]
                        .as_str()
                        .map(str::to_owned)
                })
                .is_some_and(|f| f == fingerprint);
            if !issued {
                let b64 = base64::engine::general_purpose::STANDARD;
                let pem = |what: &str| {
                    b64.encode(format!(
                        "-----BEGIN {what}-----\nY2hlY2s{fingerprint}\n-----END {what}-----\n"
                    ))
                };
                let secret = json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                    "metadata": {"name": secret_name, "namespace": k.2,
                        "annotations": {"cert-manager.io/certificate-name": k.3,
                                        "cert-manager.io/check-spec": fingerprint}},
                    "data": {"tls.crt": pem("CERTIFICATE"), "tls.key": pem("PRIVATE KEY"),
                             "ca.crt": pem("CERTIFICATE")}});
                if w.get(&sk).is_some() {
                    w.edit(&sk, |s| {
                        s["data"] = secret["data"].clone();
                        s["metadata"]["annotations"]["cert-manager.io/check-spec"] =
                            json!(fingerprint);
                        s["metadata"]["annotations"]["cert-manager.io/certificate-name"] =
                            json!(k.3);
                    });
                } else {
                    let _ = w.create(secret);
                }
            }
            let status = json!({
                "conditions": [{"type": "Ready", "status": "True", "reason": "Ready",
                                "message": "Certificate is up to date and has not expired",
                                "observedGeneration": cert["metadata"]["generation"]}],
                "notBefore": text(now),
                "notAfter": text(now + day * 90),
                "renewalTime": text(now + day * 60),
                "revision": 1,
            });
            let mut keep = status.clone();
            if let Some(old) = cert.get("status")
                && old["conditions"] == status["conditions"]
            {
                keep = old.clone();
            }
            let _ = w.write_status(&k, keep);
        }
    }
}

fn of_kind(w: &World, group: &str, kind: &str) -> Vec<(ObjKey, Value)> {
    w.objects()
        .filter(|(k, _)| k.0 == group && k.1 == kind)
        .map(|(k, o)| (k.clone(), o.clone()))
        .collect()
}

fn owned_pods(w: &World, uid: &str) -> Vec<Value> {
    w.objects()
        .filter(|(k, o)| k.1 == "Pod" && object::controller_uid(o) == Some(uid))
        .map(|(_, o)| o.clone())
        .collect()
}

fn ordinal(pod: &str, set: &str) -> Option<i64> {
    pod.strip_prefix(set)?.strip_prefix('-')?.parse().ok()
}

/// True when the Pod is Ready.
pub fn pod_ready(p: &Value) -> bool {
    p["status"]["conditions"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

/// True when the Job has completed or failed.
pub fn is_finished(job: &Value) -> bool {
    job["status"]["conditions"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| (c["type"] == "Complete" || c["type"] == "Failed") && c["status"] == "True")
    })
}

fn set_cond(p: &mut Value, t: &str, s: &str, reason: &str) {
    p["status"]["conditions"] = json!([{"type": t, "status": s, "reason": reason}]);
}

fn revision_of(template: &Value) -> String {
    use sha2::Digest as _;
    let d = sha2::Sha256::digest(template.to_string().as_bytes());
    d.iter().take(5).map(|b| format!("{b:02x}")).collect()
}

fn pod(owner: &Value, name: &str, revision: &str) -> Value {
    let mut labels = owner["spec"]["template"]["metadata"]["labels"].clone();
    if !labels.is_object() {
        labels = json!({});
    }
    if !revision.is_empty() {
        labels["controller-revision-hash"] = json!(revision);
    }
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": object::namespace(owner),
            "labels": labels,
            "ownerReferences": [{"apiVersion": object::api_version(owner), "kind": object::kind(owner),
                "name": object::name(owner), "uid": object::uid(owner),
                "controller": true, "blockOwnerDeletion": true}],
        },
        "spec": owner["spec"]["template"]["spec"].clone(),
        "status": {"phase": "Pending"},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sts_world() -> (World, ObjKey) {
        let w = World::new(
            vec![json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
                "metadata": {"name": "db", "namespace": "ns"},
                "spec": {"replicas": 2, "template": {"metadata": {"labels": {"a": "b"}},
                         "spec": {"containers": [{"name": "c", "image": "i:1"}]}}}})],
            "2026-01-01T00:00:00Z".parse().unwrap(),
        );
        let k = (
            "apps".into(),
            "StatefulSet".into(),
            "ns".into(),
            "db".into(),
        );
        (w, k)
    }

    fn run(sim: &mut Sim, w: &mut World, n: usize) {
        for _ in 0..n {
            sim.step(w);
        }
    }

    #[test]
    fn a_statefulset_becomes_ready_and_rolls_a_new_template_out() {
        let (mut w, k) = sts_world();
        let mut sim = Sim::new(Knobs::default());
        run(&mut sim, &mut w, 6);
        assert_eq!(w.get(&k).unwrap()["status"]["readyReplicas"], 2);
        w.edit(&k, |s| {
            s["spec"]["template"]["spec"]["containers"][0]["image"] = json!("i:2")
        });
        sim.step(&mut w);
        assert!(w.get(&k).unwrap()["status"]["updatedReplicas"].as_i64() < Some(2));
        run(&mut sim, &mut w, 10);
        let s = w.get(&k).unwrap();
        assert_eq!(s["status"]["updatedReplicas"], 2);
        assert_eq!(s["status"]["readyReplicas"], 2);
        assert!(!sim.step(&mut w), "quiet");
    }

    #[test]
    fn never_ready_pods_keep_a_statefulset_unready() {
        let (mut w, k) = sts_world();
        let mut sim = Sim::new(Knobs {
            never_ready: true,
            ..Knobs::default()
        });
        run(&mut sim, &mut w, 8);
        assert_eq!(w.get(&k).unwrap()["status"]["readyReplicas"], 0);
    }

    #[test]
    fn a_lost_node_makes_a_pod_unready_and_it_is_replaced() {
        let (mut w, k) = sts_world();
        let mut sim = Sim::new(Knobs {
            node_lost_at: Some(6),
            ..Knobs::default()
        });
        run(&mut sim, &mut w, 6);
        assert_eq!(w.get(&k).unwrap()["status"]["readyReplicas"], 1);
        run(&mut sim, &mut w, 8);
        assert_eq!(w.get(&k).unwrap()["status"]["readyReplicas"], 2);
    }
}
