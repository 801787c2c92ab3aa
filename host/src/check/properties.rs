//! The properties `wasmop check` holds a plugin to, and the checks that
//! judge one state or one pair of plans.

use serde::Serialize;
use serde_json::Value;

use crate::check::controllers::is_finished;
use crate::check::world::{ObjKey, World, describe_key};
use crate::execute::economy::APPLIED_ANNOTATION;
use crate::judge::validate::Plan;
use crate::object;

/// The eight properties.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Property {
    /// 1: a fixpoint within the rounds, honest at the fixpoint.
    Convergence,
    /// 2: the same snapshot gives the same plan.
    Determinism,
    /// 3: no object written back and forth.
    NoOscillation,
    /// 4: a crash after any prefix of a plan's writes converges to the same
    /// fixpoint.
    Crash,
    /// 5: stale or unobserved snapshots never delete or downgrade what the
    /// fresh state keeps, nor report Ready.
    Stale,
    /// 6: Ready only where the world holds what the spec asks for.
    ReadyHonesty,
    /// 7: valid spec changes converge; invalid ones are refused or
    /// reported.
    SpecMutation,
    /// 8: deleting the primary mid-rollout finishes.
    Deletion,
}

impl Property {
    /// Every property, in order.
    pub const ALL: [Property; 8] = [
        Property::Convergence,
        Property::Determinism,
        Property::NoOscillation,
        Property::Crash,
        Property::Stale,
        Property::ReadyHonesty,
        Property::SpecMutation,
        Property::Deletion,
    ];

    /// Its number in the documentation.
    pub fn number(self) -> u8 {
        self as u8 + 1
    }

    /// Its short name (`--property`, trace directories).
    pub fn name(self) -> &'static str {
        match self {
            Property::Convergence => "convergence",
            Property::Determinism => "determinism",
            Property::NoOscillation => "no-oscillation",
            Property::Crash => "crash",
            Property::Stale => "stale",
            Property::ReadyHonesty => "ready-honesty",
            Property::SpecMutation => "spec-mutation",
            Property::Deletion => "deletion",
        }
    }

    /// The property named `s` (its name or its number).
    pub fn parse(s: &str) -> Option<Property> {
        Property::ALL
            .into_iter()
            .find(|p| p.name() == s || p.number().to_string() == s)
    }
}

/// Condition types that say "done".
pub const DONE_CONDITIONS: [&str; 3] = ["Ready", "Available", "BackupCompleted"];

/// The done conditions of `primary` that are True for its current
/// generation (a condition whose own `observedGeneration` is older speaks
/// of an older spec).
pub fn done_claims(primary: &Value) -> Vec<String> {
    let generation = primary["metadata"]["generation"].as_i64();
    let status_gen = primary["status"]["observedGeneration"].as_i64();
    primary["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| {
            c["status"] == "True"
                && DONE_CONDITIONS.contains(&c["type"].as_str().unwrap_or_default())
                && c["observedGeneration"]
                    .as_i64()
                    .or(status_gen)
                    .is_none_or(|g| Some(g) == generation)
        })
        .filter_map(|c| c["type"].as_str().map(str::to_owned))
        .collect()
}

/// Why a workload is not what its spec asks for, if it is not.
pub fn not_done(o: &Value, condition: &str) -> Option<String> {
    let g = o["metadata"]["generation"].as_i64();
    let observed = o["status"]["observedGeneration"].as_i64();
    let want = o["spec"]["replicas"].as_i64().unwrap_or(1);
    match (object::api_version(o), object::kind(o)) {
        ("apps/v1", "StatefulSet" | "Deployment") => {
            let ready = o["status"]["readyReplicas"].as_i64().unwrap_or(0);
            let updated = o["status"]["updatedReplicas"].as_i64().unwrap_or(0);
            if observed != g {
                Some(format!(
                    "its controller has not observed generation {} yet",
                    g.unwrap_or(0)
                ))
            } else if ready < want || updated < want {
                Some(format!(
                    "{ready}/{want} replicas ready, {updated}/{want} updated"
                ))
            } else {
                None
            }
        }
        ("batch/v1", "Job") => {
            let failed = o["status"]["conditions"].as_array().is_some_and(|c| {
                c.iter()
                    .any(|c| c["type"] == "Failed" && c["status"] == "True")
            });
            if failed {
                Some("it failed".to_owned())
            } else if condition != "Ready" && !is_finished(o) {
                Some("it has not completed".to_owned())
            } else {
                None
            }
        }
        ("cert-manager.io/v1", "Certificate") => {
            let ready = o["status"]["conditions"].as_array().is_some_and(|c| {
                c.iter().any(|c| {
                    c["type"] == "Ready"
                        && c["status"] == "True"
                        && c["observedGeneration"].as_i64() == g
                })
            });
            (!ready).then(|| "it is not issued for its spec".to_owned())
        }
        _ => None,
    }
}

/// Property 6 on the primary at `key`: every done condition it claims for
/// its generation holds in the world (every workload it controls is
/// rolled out and ready, every Job it controls completed, every
/// Certificate issued).
pub fn honest(w: &World, key: &ObjKey) -> Result<(), String> {
    let Some(primary) = w.get(key) else {
        return Ok(());
    };
    let claims = done_claims(primary);
    if claims.is_empty() {
        return Ok(());
    }
    let uid = object::uid(primary);
    for condition in &claims {
        for (k, o) in w.controlled_by(uid) {
            if let Some(why) = not_done(o, condition) {
                return Err(format!(
                    "{} says {condition}=True for generation {}, but {}: {why}",
                    describe_key(key),
                    primary["metadata"]["generation"].as_i64().unwrap_or(0),
                    describe_key(k)
                ));
            }
        }
    }
    Ok(())
}

/// The digest the host stamps on an applied object.
pub fn applied_digest(o: &Value) -> Option<&str> {
    o["metadata"]["annotations"][APPLIED_ANNOTATION].as_str()
}

/// True when the plan's status claims a done condition as True.
pub fn plan_claims_done(plan: &Plan) -> Option<String> {
    let s = plan.status.as_ref()?;
    s["conditions"].as_array()?.iter().find_map(|c| {
        (c["status"] == "True" && DONE_CONDITIONS.contains(&c["type"].as_str().unwrap_or_default()))
            .then(|| c["type"].as_str().unwrap_or_default().to_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn properties_parse_by_name_and_number() {
        assert_eq!(Property::parse("4"), Some(Property::Crash));
        assert_eq!(
            Property::parse("ready-honesty"),
            Some(Property::ReadyHonesty)
        );
        assert_eq!(Property::parse("9"), None);
        assert_eq!(Property::Deletion.number(), 8);
    }

    #[test]
    fn a_statefulset_not_rolled_out_is_not_done() {
        let sts = json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"generation": 2}, "spec": {"replicas": 2},
            "status": {"observedGeneration": 2, "readyReplicas": 2, "updatedReplicas": 1}});
        assert!(not_done(&sts, "Ready").is_some());
        let mut done = sts.clone();
        done["status"]["updatedReplicas"] = json!(2);
        assert_eq!(not_done(&done, "Ready"), None);
    }

    #[test]
    fn a_claim_for_an_older_generation_is_no_claim() {
        let p = json!({"metadata": {"generation": 3}, "status": {"observedGeneration": 2,
            "conditions": [{"type": "Ready", "status": "True"}]}});
        assert!(done_claims(&p).is_empty());
        let p = json!({"metadata": {"generation": 3}, "status": {"observedGeneration": 3,
            "conditions": [{"type": "Ready", "status": "True"}]}});
        assert_eq!(done_claims(&p), ["Ready"]);
    }
}
