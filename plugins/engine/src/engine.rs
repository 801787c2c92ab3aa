//! One reconcile of a FireboltEngine: the instance gate, then one step of
//! the blue-green phase machine, then a bounded sweep of stray
//! generations, answered as one plan with at most one status write.
//!
//! # Phases
//!
//! | phase | does | next |
//! | --- | --- | --- |
//! | (none) | writes the intent: generation 0, no active generation | creating |
//! | creating | applies generation N's ConfigMap, headless Service and StatefulSet (forced) (and the cluster Service if absent); a spec change meanwhile abandons N for N+1; Pods not Ready name their cause on `Ready` (Warning Event per cause), past `spec.progressDeadlineSeconds` `Degraded=True` | switching, once every pod of N is Ready and N's StatefulSet reports them ready |
//! | switching | points `<e>-service` (the whole Service) at N | draining (or, on the first generation, as cleaning ends), once the Service selects N |
//! | draining | polls every running old Pod on every pass, judged on readings younger than the window ([`crate::drain`]; skipped for `drainCheckEnabled: false` or `rollout: recreate`) | cleaning, once drained |
//! | cleaning | deletes the old generation with preconditions | creating N+1 if the spec moved meanwhile; else stable / stopped (not Ready when the gate blocks) |
//! | stable, stopped | re-creates a missing ConfigMap, headless Service or cluster Service in place; drift (spec, missing StatefulSet, re-issued certificate, a hand scale or edit of the StatefulSet) writes the intent N+1 | creating on drift |
//!
//! The plugin's README lists every transition with its condition and
//! Event.
//!
//! # Guarantees
//!
//! - Intent first: a new generation number and the creating phase are
//!   written to status in a pass that creates nothing; objects of a
//!   generation are created only once status names it. A crash anywhere
//!   resumes from status plus what exists.
//! - The cluster Service is switched to a generation only after all its
//!   pods were seen Ready and its StatefulSet's `readyReplicas` says so.
//! - Deletes carry the uid and resourceVersion of the object seen.
//! - A steady engine yields an empty plan.
//! - Only creating, stable and stopped (and the first pass) wait for the
//!   instance; switching, draining and cleaning act on existing objects
//!   (they read the instance and class only to know whether the spec
//!   moved).
//! - `status.observedGeneration` moves only in a pass that ends stable or
//!   stopped on a StatefulSet built from the current spec; every other
//!   pass holds it (`Plan::not_yet_applied`).

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{Map, Value, json};
use wasmop_sdk::conditions::{conditions_of, set_condition};
use wasmop_sdk::k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use wasmop_sdk::{Plan, ReconcileError, Snapshot};

use crate::drain::{self, PodDrain};
use crate::gate;
use crate::names::{ENGINE_LABEL, METRICS_PORT, Names};
use crate::render::{Desired, cluster_service, generation_of};
use crate::settings::Settings;
use crate::spec::{EngineStatus, FireboltEngine, FireboltEngineClass, resolve};
use crate::stuck;
use crate::{CLASS_READ, INSTANCE_READ, POD_READ, POD_TARGET};

/// Phase names, as upstream spells them.
pub mod phase {
    /// Building a new generation.
    pub const CREATING: &str = "creating";
    /// Pointing the Service at the new generation.
    pub const SWITCHING: &str = "switching";
    /// Waiting for the old generation's queries to finish.
    pub const DRAINING: &str = "draining";
    /// Deleting the old generation.
    pub const CLEANING: &str = "cleaning";
    /// Serving on one generation.
    pub const STABLE: &str = "stable";
    /// Zero replicas.
    pub const STOPPED: &str = "stopped";
}

/// Requeue after writing an intent or a phase change.
pub const STEP_REQUEUE: Duration = Duration::from_secs(1);
/// Requeue while pods of a new generation are not Ready (pod changes
/// trigger a reconcile too).
pub const PODS_REQUEUE: Duration = Duration::from_secs(5);
/// Requeue while the instance (or class) blocks the engine.
pub const BLOCKED_REQUEUE: Duration = Duration::from_secs(10);
/// Requeue when the stray sweep left objects for the next pass.
pub const SWEEP_REQUEUE: Duration = Duration::from_secs(2);
/// Stray per-generation objects deleted per pass at most.
pub const SWEEP_LIMIT: usize = 20;

/// The condition types the engine writes.
pub mod condition {
    /// Roll-up.
    pub const READY: &str = "Ready";
    /// The instance gate.
    pub const INSTANCE_READY: &str = "InstanceReady";
    /// A generation missed its progress deadline.
    pub const DEGRADED: &str = "Degraded";
}

/// Status field: `metadata.generation` of the active StatefulSet as the
/// operator last saw it; a higher one is a hand edit of its spec.
pub const STS_GENERATION: &str = "statefulSetGeneration";

/// Default of `spec.progressDeadlineSeconds`.
pub const DEFAULT_PROGRESS_DEADLINE: Duration = Duration::from_secs(600);

/// What a phase step decided.
struct Step {
    plan: Plan,
    phase: String,
    current: i64,
    active: i64,
    draining: Option<i64>,
    ready: (bool, String, String),
    requeue: Option<Duration>,
    /// Why the rollout is past its progress deadline (`Degraded=True`).
    degraded: Option<String>,
    /// `metadata.generation` of the active StatefulSet to record.
    sts_generation: Option<i64>,
}

impl Step {
    /// A step in `phase` that keeps the generations `status` records, with
    /// an empty plan and no requeue; callers override what their phase
    /// changes.
    fn keeping(phase: &str, status: &EngineStatus) -> Self {
        Step {
            plan: Plan::new(),
            phase: phase.into(),
            current: status.current_generation,
            active: status.active_generation,
            draining: status.draining_generation,
            ready: rolling(phase),
            requeue: None,
            degraded: None,
            sts_generation: None,
        }
    }
}

/// Reconciles the engine in `snapshot`.
///
/// # Errors
///
/// [`ReconcileError::InvalidSpec`] when the primary is not a
/// FireboltEngine or a drain interval does not parse;
/// [`ReconcileError::Internal`] when the snapshot lacks what the host
/// always provides.
pub fn reconcile(snapshot: &Snapshot) -> Result<Plan, ReconcileError> {
    if snapshot.deleting {
        // Everything carries the engine's ownerReference.
        return Ok(Plan::new());
    }
    let settings: Settings = snapshot.settings_as()?;
    let engine: FireboltEngine = snapshot.primary_as()?;
    let namespace = snapshot
        .primary_namespace()
        .ok_or_else(|| ReconcileError::internal("the primary has no namespace"))?;
    let names = Names::new(snapshot.primary_name(), namespace, &settings.cluster_domain);
    let now = snapshot.now()?;
    let generation = snapshot.primary_generation();
    let status = &engine.status;
    let spec = &engine.spec;
    let mut conditions = conditions_of(&snapshot.primary);

    // What a generation is built from: the instance (gate), the class and
    // the resolved settings. Every phase computes it when it can, so the
    // phases that do not consult the gate still know whether the
    // generation they roll out matches the spec.
    let override_ = spec.metadata_endpoint_override.as_deref();
    let instance = gate::check(
        &spec.instance_ref,
        snapshot.related(INSTANCE_READ).next(),
        override_,
    );
    let class = match spec.engine_class_ref.as_deref().filter(|c| !c.is_empty()) {
        None => Ok(None),
        Some(name) => match snapshot.related_one::<FireboltEngineClass>(CLASS_READ) {
            Ok(Some(c)) => Ok(Some(c)),
            Ok(None) => Err(format!(
                "FireboltEngineClass {name} does not exist in namespace {namespace}"
            )),
            Err(e) => Err(format!("FireboltEngineClass {name} cannot be read: {e}")),
        },
    };
    let resolved = class
        .as_ref()
        .ok()
        .map(|c| resolve(spec, c.as_ref().map(|c| &c.spec)));
    let desired = match (&instance, &class, &resolved) {
        (Ok(instance), Ok(class), Some(Ok(resolved))) => Some(Desired {
            names: &names,
            settings: &settings,
            replicas: spec.replicas,
            class_template: class.as_ref().and_then(|c| c.spec.template.as_ref()),
            engine_template: spec.template.as_ref(),
            resolved,
            instance,
            metadata_override: override_.filter(|o| !o.is_empty()),
        }),
        _ => None,
    };
    let want_hash = desired.as_ref().map(Desired::hash);
    let ending = Ending {
        want_hash: want_hash.as_deref(),
        unknown: match (&instance, &class, &resolved) {
            (Err(why), _, _) => ("InstanceNotReady", why.as_str()),
            (_, Err(why), _) => ("FireboltEngineClassUnready", why.as_str()),
            (_, _, Some(Err(why))) => ("InvalidSpec", why.as_str()),
            _ => ("", ""),
        },
    };

    let step = match status.phase.as_str() {
        phase::SWITCHING => switching(snapshot, &names, &engine, &ending)?,
        phase::DRAINING => draining(snapshot, &names, &engine)?,
        phase::CLEANING => cleaning(snapshot, &names, &engine, &ending)?,
        _ => {
            // Gated phases: "", creating, stable, stopped.
            match &instance {
                Ok(_) => {
                    set_condition(
                        &mut conditions,
                        condition::INSTANCE_READY,
                        true,
                        "InstanceReady",
                        &format!("FireboltInstance {} is ready", spec.instance_ref),
                        generation,
                        &now,
                    );
                }
                Err(why) => {
                    set_condition(
                        &mut conditions,
                        condition::INSTANCE_READY,
                        false,
                        "InstanceNotReady",
                        why,
                        generation,
                        &now,
                    );
                    return Ok(blocked(
                        snapshot,
                        &engine,
                        conditions,
                        "InstanceNotReady",
                        why,
                        &now,
                    ));
                }
            }
            if let Err(why) = &class {
                return Ok(blocked(
                    snapshot,
                    &engine,
                    conditions,
                    "FireboltEngineClassUnready",
                    why,
                    &now,
                ));
            }
            if let Some(Err(why)) = &resolved {
                return Err(ReconcileError::invalid_spec(why.clone()));
            }
            let Some(desired) = &desired else {
                return Err(ReconcileError::internal("no desired state"));
            };
            match status.phase.as_str() {
                "" => Step {
                    plan: Plan::new(),
                    phase: phase::CREATING.into(),
                    current: 0,
                    active: -1,
                    draining: None,
                    ready: (false, "Initializing".into(), "creating generation 0".into()),
                    requeue: Some(STEP_REQUEUE),
                    degraded: None,
                    sts_generation: None,
                },
                phase::CREATING => creating(snapshot, &names, &engine, desired, &now)?,
                _ => steady(snapshot, &names, &engine, desired)?,
            }
        }
    };

    let Step {
        mut plan,
        phase,
        current,
        active,
        draining,
        ready,
        requeue,
        degraded,
        sts_generation,
    } = step;
    let (ok, reason, message) = ready;
    set_condition(
        &mut conditions,
        condition::READY,
        ok,
        &reason,
        &message,
        generation,
        &now,
    );
    let was_degraded = conditions
        .iter()
        .any(|c| c.type_ == condition::DEGRADED && c.status == "True");
    match &degraded {
        Some(why) => {
            if !was_degraded {
                plan = plan.warning("ProgressDeadlineExceeded", why.clone());
            }
            set_condition(
                &mut conditions,
                condition::DEGRADED,
                true,
                "ProgressDeadlineExceeded",
                why,
                generation,
                &now,
            );
        }
        None if was_degraded => {
            set_condition(
                &mut conditions,
                condition::DEGRADED,
                false,
                "Progressing",
                &format!("Engine is in {phase} phase on generation {current}"),
                generation,
                &now,
            );
        }
        None => {}
    }
    let keep: BTreeSet<i64> = [
        status.current_generation,
        status.active_generation,
        current,
        active,
    ]
    .into_iter()
    .chain(status.draining_generation)
    .chain(draining)
    .chain(selected_generation(snapshot, &names))
    .collect();
    let (swept, more) = sweep(&mut plan, snapshot, &names, &keep)?;
    if swept > 0 {
        plan = plan.event(
            "StrayGenerationsSwept",
            format!("deleted {swept} object(s) of abandoned generations"),
        );
    }
    let mut new_status = status_object(&snapshot.primary);
    let terminal = phase == phase::STABLE || phase == phase::STOPPED;
    if terminal {
        observe_hashes(&mut new_status, snapshot, &names, active);
        observe_serving_cert(&mut new_status, snapshot, &names, active);
    }
    new_status.insert("phase".into(), json!(phase));
    new_status.insert("currentGeneration".into(), json!(current));
    new_status.insert("activeGeneration".into(), json!(active));
    match draining {
        Some(d) => new_status.insert("drainingGeneration".into(), json!(d)),
        None => new_status.remove("drainingGeneration"),
    };
    if let Some(g) = sts_generation {
        new_status.insert(STS_GENERATION.into(), json!(g));
    }
    new_status.insert("conditions".into(), json!(conditions));
    let new_status = Value::Object(new_status);
    if new_status != snapshot.primary["status"] {
        plan = plan.status(new_status);
    }
    // `status.observedGeneration` is the spec generation last rolled out
    // (upstream: "last fully reconciled to stable"): only a terminal pass
    // whose serving StatefulSet was built from the current spec moves it.
    let rolled_out = terminal
        && want_hash.as_deref().is_some_and(|want| {
            snapshot
                .owned_named("StatefulSet", &names.statefulset(active))
                .is_some_and(|sts| spec_hash(sts) == want)
        });
    if !rolled_out {
        plan = plan.not_yet_applied();
    }
    let requeue = if more { Some(SWEEP_REQUEUE) } else { requeue };
    if let Some(r) = requeue {
        plan = plan.requeue_after(r);
    }
    Ok(plan)
}

/// Keys a generation's TLS Secret holds once issued.
const TLS_KEYS: [&str; 3] = ["tls.crt", "tls.key", "ca.crt"];

/// `status.observedAuthHash` and `status.observedEngineTLSHash`: what the
/// active generation renders, recorded only while no pod of another
/// generation of this engine is left (so every pod serves it). Empty
/// means no auth / plaintext.
fn observe_hashes(
    status: &mut Map<String, Value>,
    snapshot: &Snapshot,
    names: &Names,
    active: i64,
) {
    let others = snapshot.related(POD_READ).any(|p| {
        let labels = &p["metadata"]["labels"];
        labels[ENGINE_LABEL] == names.engine()
            && labels[crate::names::GENERATION_LABEL] != active.to_string().as_str()
    });
    if others {
        return;
    }
    let Some(sts) = snapshot.owned_named("StatefulSet", &names.statefulset(active)) else {
        return;
    };
    for (field, annotation) in [
        ("observedAuthHash", crate::names::AUTH_HASH_ANNOTATION),
        (
            "observedEngineTLSHash",
            crate::names::ENGINE_TLS_HASH_ANNOTATION,
        ),
    ] {
        let value = sts
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(annotation))
            .and_then(Value::as_str)
            .unwrap_or_default();
        if value.is_empty() {
            status.remove(field);
        } else {
            status.insert(field.into(), json!(value));
        }
    }
}

/// `status.observedEngineServingCertFP` (SHA-256 of the `tls.crt` the
/// stable generation serves) and `status.observedEngineServingCertGen`
/// (that generation); both removed while the generation serves no TLS.
fn observe_serving_cert(
    status: &mut Map<String, Value>,
    snapshot: &Snapshot,
    names: &Names,
    active: i64,
) {
    match serving_cert_fingerprint(snapshot, names, active) {
        Some(fp) => {
            status.insert(SERVING_CERT_FP.into(), json!(fp));
            status.insert(SERVING_CERT_GEN.into(), json!(active));
        }
        None => {
            status.remove(SERVING_CERT_FP);
            status.remove(SERVING_CERT_GEN);
        }
    }
}

const SERVING_CERT_FP: &str = "observedEngineServingCertFP";
const SERVING_CERT_GEN: &str = "observedEngineServingCertGen";

/// Fingerprint of the leaf in generation `g`'s TLS Secret, once issued.
fn serving_cert_fingerprint(snapshot: &Snapshot, names: &Names, g: i64) -> Option<String> {
    snapshot
        .owned_named("Secret", &names.tls(g))
        .filter(|s| crate::security::issued(s, &TLS_KEYS))
        .and_then(|s| crate::security::cert_fingerprint(s, "tls.crt"))
}

/// Why generation `g` must be replaced because its serving certificate
/// was re-issued in place (cert-manager renewed it: a new key under
/// `rotationPolicy: Always`): running pods keep serving the stale leaf
/// until they restart, so a fresh generation rolls, cutting over through
/// the trust-bundle gate like any other. Only a certificate recorded for
/// this very generation counts: every new generation has its own
/// certificate, so a different fingerprint across generations is normal.
fn reissued(snapshot: &Snapshot, names: &Names, g: i64) -> Option<String> {
    let status = &snapshot.primary["status"];
    let recorded = status[SERVING_CERT_FP].as_str().filter(|f| !f.is_empty())?;
    if status[SERVING_CERT_GEN].as_i64() != Some(g) {
        return None;
    }
    let now = serving_cert_fingerprint(snapshot, names, g)?;
    (now != recorded).then(|| {
        format!(
            "the serving certificate of generation {g} was re-issued ({} -> {})",
            &recorded[..recorded.len().min(12)],
            &now[..now.len().min(12)]
        )
    })
}

/// The plan of an engine the gate (or a missing class) holds: status only.
fn blocked(
    snapshot: &Snapshot,
    engine: &FireboltEngine,
    mut conditions: Vec<Condition>,
    reason: &str,
    why: &str,
    now: &Time,
) -> Plan {
    set_condition(
        &mut conditions,
        condition::READY,
        false,
        reason,
        why,
        snapshot.primary_generation(),
        now,
    );
    let mut status = status_object(&snapshot.primary);
    if engine.status.phase.is_empty() {
        // The intent of the first generation costs nothing and shows
        // where the engine stands.
        status.insert("phase".into(), json!(phase::CREATING));
        status.insert("currentGeneration".into(), json!(0));
        status.insert("activeGeneration".into(), json!(-1));
    }
    status.insert("conditions".into(), json!(conditions));
    let status = Value::Object(status);
    // Nothing of the current spec is rolled out while blocked.
    let mut plan = Plan::new().requeue_after(BLOCKED_REQUEUE).not_yet_applied();
    if status != snapshot.primary["status"] {
        plan = plan.status(status);
    }
    plan
}

fn creating(
    snapshot: &Snapshot,
    names: &Names,
    engine: &FireboltEngine,
    desired: &Desired<'_>,
    now: &Time,
) -> Result<Step, ReconcileError> {
    let s = &engine.status;
    let g = s.current_generation;
    let sts = snapshot.owned_named("StatefulSet", &names.statefulset(g));
    if let Some(sts) = sts
        && spec_hash(sts) != desired.hash()
    {
        // The spec moved while N was being built (or N is stuck and the
        // spec was fixed): abandon N (the sweep deletes it once status no
        // longer names it) and build N+1.
        return Ok(Step {
            plan: Plan::new().event(
                "GenerationAbandoned",
                format!(
                    "spec changed while generation {g} was created; creating generation {}",
                    g + 1
                ),
            ),
            current: g + 1,
            requeue: Some(STEP_REQUEUE),
            ..Step::keeping(phase::CREATING, s)
        });
    }
    let deadline = progress_deadline(engine);
    let mut plan = Plan::new()
        .apply(desired.config_map(g))
        .apply(desired.headless_service(g));
    // With engine TLS the generation's certificate comes first: its
    // Secret (created empty, filled by cert-manager) and Certificate; the
    // StatefulSet only once the Secret is issued.
    let tls_secret = snapshot.owned_named("Secret", &names.tls(g));
    if let Some(tls) = &desired.instance.tls {
        for o in desired.tls_objects(g) {
            plan = if o["kind"] == "Secret" {
                if tls_secret.is_none() {
                    plan.apply_if_absent(o)
                } else {
                    plan
                }
            } else {
                plan.apply(o)
            };
        }
        let issued = tls_secret.is_some_and(|s| crate::security::issued(s, &TLS_KEYS));
        if !issued {
            let why = format!("waiting for cert-manager to issue Secret {}", names.tls(g));
            return Ok(Step {
                plan,
                current: g,
                degraded: past_deadline(snapshot, names, g, deadline, now, &why),
                ready: (false, "CertificatePending".into(), why),
                requeue: Some(PODS_REQUEUE),
                ..Step::keeping(phase::CREATING, s)
            });
        }
        // The gateway re-encrypts: switch only to a generation whose CA
        // every gateway pod trusts.
        if tls.reencrypting {
            let cas = tls_secret
                .map(crate::security::ca_fingerprints)
                .unwrap_or_default();
            let untrusted: Vec<&String> = cas
                .iter()
                .filter(|f| !tls.rolled_trust.contains(f))
                .collect();
            if !untrusted.is_empty() || cas.is_empty() {
                plan = plan.apply_forced(desired.statefulset(g));
                let why = format!("generation {g} waits for the gateway to trust its CA");
                return Ok(Step {
                    plan,
                    current: g,
                    degraded: past_deadline(snapshot, names, g, deadline, now, &why),
                    ready: (false, "TrustPending".into(), why),
                    requeue: Some(PODS_REQUEUE),
                    ..Step::keeping(phase::CREATING, s)
                });
            }
        }
    }
    // Forced: a hand edit of the StatefulSet being built is taken back
    // (kubectl's fields would otherwise make the apply a conflict).
    plan = plan.apply_forced(desired.statefulset(g));
    if snapshot.owned_named("Service", &names.service()).is_none() {
        let target = if s.active_generation >= 0 {
            s.active_generation
        } else {
            g
        };
        plan = plan.apply(desired.cluster_service(target));
    }
    let want = engine.spec.replicas.max(0);
    let ready = ready_pods(snapshot, names, g);
    // The StatefulSet's own count lags the Pods it counts; switching on
    // the Pods alone can point the Service at a generation its
    // StatefulSet still reports as not ready. Both must agree.
    let sts_ready = sts
        .and_then(|s| s.pointer("/status/readyReplicas"))
        .and_then(Value::as_i64)
        .unwrap_or(0);
    if sts.is_some() && ready == want && sts_ready >= want {
        return Ok(Step {
            plan: plan.event(
                "GenerationReady",
                format!("generation {g} has {ready} ready pod(s); switching the Service"),
            ),
            current: g,
            requeue: Some(STEP_REQUEUE),
            ..Step::keeping(phase::SWITCHING, s)
        });
    }
    let counts = if ready == want && sts.is_some() {
        format!(
            "generation {g} has {ready} of {want} pod(s) ready; its StatefulSet reports {sts_ready}"
        )
    } else {
        format!("generation {g} has {ready} of {want} pod(s) ready")
    };
    let (reason, message) = match stuck::cause(&pods_of(snapshot, names, g)) {
        Some(cause) => {
            let message = format!("{counts}; {}", cause.message);
            // A Warning Event each time the cause (or the count) changes,
            // not on every pass.
            if !ready_condition_is(snapshot, &cause.reason, &message) {
                plan = plan.warning(&cause.reason, message.clone());
            }
            (cause.reason, message)
        }
        None => ("PodsNotReady".to_owned(), counts),
    };
    let degraded = past_deadline(snapshot, names, g, deadline, now, &message);
    Ok(Step {
        plan,
        current: g,
        ready: (false, reason, message),
        requeue: Some(PODS_REQUEUE),
        degraded,
        ..Step::keeping(phase::CREATING, s)
    })
}

/// `spec.progressDeadlineSeconds`, or [`DEFAULT_PROGRESS_DEADLINE`].
fn progress_deadline(engine: &FireboltEngine) -> Duration {
    engine
        .spec
        .progress_deadline_seconds
        .and_then(|s| u64::try_from(s).ok())
        .map_or(DEFAULT_PROGRESS_DEADLINE, Duration::from_secs)
}

/// Why generation `g` is past its progress deadline, if it is: the
/// deadline counts from the creation of the generation's ConfigMap (the
/// first object a generation gets).
fn past_deadline(
    snapshot: &Snapshot,
    names: &Names,
    g: i64,
    deadline: Duration,
    now: &Time,
    why: &str,
) -> Option<String> {
    let created = snapshot
        .owned_named("ConfigMap", &names.config(g))?
        .pointer("/metadata/creationTimestamp")?
        .as_str()?
        .parse::<wasmop_sdk::k8s_openapi::jiff::Timestamp>()
        .ok()?;
    let elapsed = now.0.as_second().saturating_sub(created.as_second());
    let limit = i64::try_from(deadline.as_secs()).unwrap_or(i64::MAX);
    let active = snapshot.primary["status"]["activeGeneration"]
        .as_i64()
        .filter(|a| *a >= 0);
    let serving = match active {
        Some(a) => format!("; {} keeps serving generation {a}", names.service()),
        None => String::new(),
    };
    (elapsed > limit).then(|| {
        format!(
            "generation {g} did not become ready within its progress deadline ({limit}s, \
             started {elapsed}s ago){serving}: {why}"
        )
    })
}

/// True when the engine's `Ready` condition already has this reason and
/// message.
fn ready_condition_is(snapshot: &Snapshot, reason: &str, message: &str) -> bool {
    conditions_of(&snapshot.primary)
        .iter()
        .any(|c| c.type_ == condition::READY && c.reason == reason && c.message == message)
}

fn switching(
    snapshot: &Snapshot,
    names: &Names,
    engine: &FireboltEngine,
    end: &Ending<'_>,
) -> Result<Step, ReconcileError> {
    let s = &engine.status;
    let g = s.current_generation;
    let mut step = Step {
        current: g,
        requeue: Some(STEP_REQUEUE),
        ..Step::keeping(phase::SWITCHING, s)
    };
    if selected_generation(snapshot, names) != Some(g) {
        // The whole Service, not just its selector: it may have been
        // deleted by hand, and a Service needs its ports.
        step.plan = step.plan.apply(cluster_service(names, g));
        return Ok(step);
    }
    let old = s.active_generation;
    step.active = g;
    // What the StatefulSet now serving looks like to the operator; a later
    // change of its spec is a hand edit.
    step.sts_generation = snapshot
        .owned_named("StatefulSet", &names.statefulset(g))
        .and_then(|sts| sts.pointer("/metadata/generation"))
        .and_then(Value::as_i64);
    step.plan = step.plan.event(
        "Switched",
        format!("{} now selects generation {g}", names.service()),
    );
    if old >= 0 && old != g {
        step.phase = phase::DRAINING.into();
        step.draining = Some(old);
        step.ready = rolling(phase::DRAINING);
    } else {
        finish(&mut step, snapshot, names, engine, end);
    }
    Ok(step)
}

fn draining(
    snapshot: &Snapshot,
    names: &Names,
    engine: &FireboltEngine,
) -> Result<Step, ReconcileError> {
    let s = &engine.status;
    let mut step = Step {
        requeue: Some(STEP_REQUEUE),
        ..Step::keeping(phase::DRAINING, s)
    };
    let Some(old) = s.draining_generation else {
        step.phase = phase::CLEANING.into();
        step.ready = rolling(phase::CLEANING);
        return Ok(step);
    };
    // The class is not consulted here: its drain settings resolve
    // engine → default when the class is gone.
    let class: Option<FireboltEngineClass> = snapshot.related_one(CLASS_READ).unwrap_or(None);
    let resolved = resolve(&engine.spec, class.as_ref().map(|c| &c.spec))
        .map_err(ReconcileError::invalid_spec)?;
    if !resolved.drain_check_enabled || resolved.recreate {
        step.phase = phase::CLEANING.into();
        step.ready = rolling(phase::CLEANING);
        return Ok(step);
    }
    let running: Vec<&str> = pods_of(snapshot, names, old)
        .into_iter()
        .filter(|pod| {
            pod["status"]["phase"] == "Running"
                && pod["status"]["podIP"]
                    .as_str()
                    .is_some_and(|ip| !ip.is_empty())
        })
        .filter_map(|pod| pod["metadata"]["name"].as_str())
        .collect();
    // Every running old Pod is judged on a reading younger than the
    // window, every pass: a Pod drained once may take queries again.
    let window = drain::window(resolved.drain_check_interval, running.len());
    let mut failing = Vec::new();
    let mut pending = Vec::new();
    for name in &running {
        match drain::judge(drain::fresh(&snapshot.observations, name, window)) {
            PodDrain::Drained => {}
            PodDrain::Failing(why) => {
                failing.push(format!("{name}: {why}"));
                pending.push(*name);
            }
            PodDrain::Busy(_) | PodDrain::Unknown => pending.push(*name),
        }
    }
    if pending.is_empty() {
        step.phase = phase::CLEANING.into();
        step.ready = rolling(phase::CLEANING);
        step.plan = step.plan.event(
            "Drained",
            format!("generation {old} has no queries in flight"),
        );
        return Ok(step);
    }
    let now_ms = snapshot.now()?.0.as_millisecond();
    for pod in &running {
        step.plan = step.plan.http(
            wasmop_sdk::HttpRequest::get(
                &drain::request_id(pod, now_ms, window),
                POD_TARGET,
                pod,
                METRICS_PORT as u16,
                "/metrics",
            )
            .max_age(window * 2),
        );
    }
    if !failing.is_empty() {
        step.ready = (
            false,
            "DrainCheckFailing".into(),
            format!("drain check of generation {old}: {}", failing.join("; ")),
        );
    }
    step.requeue = Some(window);
    Ok(step)
}

fn cleaning(
    snapshot: &Snapshot,
    names: &Names,
    engine: &FireboltEngine,
    end: &Ending<'_>,
) -> Result<Step, ReconcileError> {
    let s = &engine.status;
    let mut step = Step {
        draining: None,
        ..Step::keeping(phase::CLEANING, s)
    };
    if let Some(old) = s.draining_generation {
        for (kind, name) in [
            ("StatefulSet", names.statefulset(old)),
            ("Service", names.headless(old)),
            ("ConfigMap", names.config(old)),
            ("Certificate", names.tls(old)),
            ("Secret", names.tls(old)),
        ] {
            if let Some(seen) = snapshot.owned_named(kind, &name) {
                step.plan = step.plan.delete_owned(seen)?;
            }
        }
        step.plan = step
            .plan
            .event("Cleaned", format!("deleted generation {old}"));
    }
    finish(&mut step, snapshot, names, engine, end);
    Ok(step)
}

/// What the end of a rollout checks the generation it rolled out against.
struct Ending<'a> {
    /// The hash of the current spec, when the instance and class allow
    /// computing it.
    want_hash: Option<&'a str>,
    /// Why it cannot be computed (reason, message).
    unknown: (&'a str, &'a str),
}

/// Ends a rollout (switching without an old generation, cleaning): when
/// the spec moved while the generation was switched to or the old one
/// drained, the next generation starts at once instead of reporting a
/// stale generation as stable and Ready; when the spec cannot be checked
/// (the instance gate or the class blocks), the phase is terminal but not
/// Ready.
fn finish(
    step: &mut Step,
    snapshot: &Snapshot,
    names: &Names,
    engine: &FireboltEngine,
    end: &Ending<'_>,
) {
    let g = step.active;
    let built = snapshot
        .owned_named("StatefulSet", &names.statefulset(g))
        .map(spec_hash);
    match end.want_hash {
        Some(want) if built.is_some_and(|b| b != want) => {
            step.phase = phase::CREATING.into();
            step.current = g + 1;
            step.ready = rolling(phase::CREATING);
            step.requeue = Some(STEP_REQUEUE);
            step.plan = std::mem::take(&mut step.plan).event(
                "GenerationStarted",
                format!(
                    "the spec changed while generation {g} was rolled out; creating generation {}",
                    g + 1
                ),
            );
        }
        Some(_) => terminal(step, snapshot, names, engine),
        None => {
            terminal(step, snapshot, names, engine);
            if step.phase == phase::STABLE {
                let (reason, why) = end.unknown;
                step.ready = (false, reason.into(), why.into());
                step.requeue = Some(BLOCKED_REQUEUE);
            }
        }
    }
}

/// stable and stopped: repair in place, or write the intent of the next
/// generation on drift. A StatefulSet edited by hand (its replicas, or a
/// spec generation above the one recorded when it started serving) rolls a
/// new generation, as upstream does: the edit may already have restarted
/// Pods, and a fresh generation replaces them blue-green.
fn steady(
    snapshot: &Snapshot,
    names: &Names,
    engine: &FireboltEngine,
    desired: &Desired<'_>,
) -> Result<Step, ReconcileError> {
    let s = &engine.status;
    let g = s.current_generation;
    let sts = snapshot.owned_named("StatefulSet", &names.statefulset(g));
    let recorded = snapshot.primary["status"][STS_GENERATION].as_i64();
    let live = sts
        .and_then(|sts| sts.pointer("/metadata/generation"))
        .and_then(Value::as_i64);
    let (drift, edited) = match sts {
        None => (
            Some(format!("StatefulSet {} is missing", names.statefulset(g))),
            false,
        ),
        Some(sts) if spec_hash(sts) != desired.hash() => {
            (Some(format!("the spec of generation {g} changed")), false)
        }
        Some(sts) => {
            let replicas = sts.pointer("/spec/replicas").and_then(Value::as_i64);
            if replicas != Some(desired.replicas) {
                (
                    Some(format!(
                        "StatefulSet {} was scaled to {} replica(s) outside the operator (the engine asks for {})",
                        names.statefulset(g),
                        replicas.map_or_else(|| "no".to_owned(), |r| r.to_string()),
                        desired.replicas
                    )),
                    true,
                )
            } else if let (Some(r), Some(l)) = (recorded, live)
                && l > r
            {
                (
                    Some(format!(
                        "the spec of StatefulSet {} was changed outside the operator (its generation went from {r} to {l})",
                        names.statefulset(g)
                    )),
                    true,
                )
            } else {
                (None, false)
            }
        }
    };
    let drift = drift.or_else(|| reissued(snapshot, names, g));
    if let Some(why) = drift {
        let mut plan = Plan::new();
        if edited {
            plan = plan.warning(
                "StatefulSetDrifted",
                format!("{why}; rolling a new generation"),
            );
        }
        return Ok(Step {
            plan: plan.event(
                "GenerationStarted",
                format!("{why}; creating generation {}", g + 1),
            ),
            current: g + 1,
            requeue: Some(STEP_REQUEUE),
            ..Step::keeping(phase::CREATING, s)
        });
    }
    let mut plan = Plan::new();
    if snapshot
        .owned_named("ConfigMap", &names.config(g))
        .is_none()
    {
        plan = plan.apply(desired.config_map(g));
    }
    if snapshot
        .owned_named("Service", &names.headless(g))
        .is_none()
    {
        plan = plan.apply(desired.headless_service(g));
    }
    if selected_generation(snapshot, names) != Some(g) {
        plan = plan.apply(desired.cluster_service(g));
    }
    for o in desired.tls_objects(g) {
        let kind = o["kind"].as_str().unwrap_or_default().to_owned();
        if snapshot.owned_named(&kind, &names.tls(g)).is_none() {
            plan = if kind == "Secret" {
                plan.apply_if_absent(o)
            } else {
                plan.apply(o)
            };
        }
    }
    let mut step = Step {
        plan,
        current: g,
        active: g,
        // An engine from before this field records what it serves now.
        sts_generation: if recorded.is_none() { live } else { None },
        ..Step::keeping(&s.phase, s)
    };
    terminal(&mut step, snapshot, names, engine);
    Ok(step)
}

/// Ends a rollout: stable (Ready once every pod of the active generation
/// is) or stopped.
fn terminal(step: &mut Step, snapshot: &Snapshot, names: &Names, engine: &FireboltEngine) {
    let want = engine.spec.replicas.max(0);
    let g = step.active;
    if want == 0 {
        step.phase = phase::STOPPED.into();
        step.ready = (
            false,
            "Stopped".into(),
            "Engine is stopped (0 replicas)".into(),
        );
        return;
    }
    step.phase = phase::STABLE.into();
    let ready = ready_pods(snapshot, names, g);
    step.ready = if ready >= want {
        (
            true,
            "EngineReady".into(),
            format!("Engine is serving traffic on generation {g}"),
        )
    } else {
        (
            false,
            "PodsNotReady".into(),
            format!("generation {g} has {ready} of {want} pod(s) ready"),
        )
    };
}

fn rolling(phase: &str) -> (bool, String, String) {
    (
        false,
        "Rolling".into(),
        format!("Engine is in {phase} phase"),
    )
}

fn status_object(primary: &Value) -> Map<String, Value> {
    primary["status"].as_object().cloned().unwrap_or_default()
}

fn spec_hash(sts: &Value) -> &str {
    sts.pointer("/metadata/annotations")
        .and_then(|a| a.get(crate::names::SPEC_HASH_ANNOTATION))
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// The generation `<e>-service` selects, if it exists.
fn selected_generation(snapshot: &Snapshot, names: &Names) -> Option<i64> {
    let service = snapshot.owned_named("Service", &names.service())?;
    generation_of(service.pointer("/spec/selector"))
}

/// Pods of generation `g` of this engine (not being deleted).
fn pods_of<'a>(snapshot: &'a Snapshot, names: &'a Names, g: i64) -> Vec<&'a Value> {
    let g = g.to_string();
    snapshot
        .related(POD_READ)
        .filter(|p| {
            let labels = &p["metadata"]["labels"];
            labels[ENGINE_LABEL] == names.engine()
                && labels[crate::names::GENERATION_LABEL] == g.as_str()
                && p["metadata"]["deletionTimestamp"].is_null()
        })
        .collect()
}

fn ready_pods(snapshot: &Snapshot, names: &Names, g: i64) -> i64 {
    let ready = pods_of(snapshot, names, g)
        .into_iter()
        .filter(|p| {
            p["status"]["phase"] == "Running"
                && p["status"]["conditions"].as_array().is_some_and(|cs| {
                    cs.iter()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True")
                })
        })
        .count();
    i64::try_from(ready).unwrap_or(i64::MAX)
}

/// Deletes up to [`SWEEP_LIMIT`] owned per-generation objects of
/// generations not in `keep` (and not already deleted by the plan).
/// Returns how many were deleted and whether more remain.
fn sweep(
    plan: &mut Plan,
    snapshot: &Snapshot,
    names: &Names,
    keep: &BTreeSet<i64>,
) -> Result<(usize, bool), ReconcileError> {
    let already: BTreeSet<(String, String)> = plan
        .delete
        .iter()
        .map(|d| (d.target.kind.clone(), d.target.name.clone()))
        .collect();
    let strays: Vec<&Value> = snapshot
        .owned
        .iter()
        .filter(|o| {
            let labels = o.pointer("/metadata/labels");
            labels
                .and_then(|l| l.get(ENGINE_LABEL))
                .and_then(Value::as_str)
                == Some(names.engine())
                && generation_of(labels).is_some_and(|g| !keep.contains(&g))
                && !already.contains(&(
                    o["kind"].as_str().unwrap_or_default().to_owned(),
                    o["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                ))
        })
        .collect();
    let mut taken = std::mem::take(plan);
    for stray in strays.iter().take(SWEEP_LIMIT) {
        taken = taken.delete_owned(stray)?;
    }
    *plan = taken;
    Ok((strays.len().min(SWEEP_LIMIT), strays.len() > SWEEP_LIMIT))
}
