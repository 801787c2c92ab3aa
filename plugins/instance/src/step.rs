//! The reconcile-step framework: what every step gets ([`Context`]), what
//! it answers ([`Outcome`] or [`Failure`]), and how it is declared
//! ([`StepDef`]).
//!
//! A step is a plain function from the [`Context`] to the objects it wants
//! and the health of what it manages. Each step reports on exactly one
//! condition. Steps are isolated (the seed's rule): a step that fails
//! reports on its own condition, its objects are neither written nor
//! pruned, and every other step runs as if nothing happened.
//!
//! Adding a step means writing one module with a `STEP: StepDef` and
//! listing it in [`crate::reconcile::STEPS`]. Steps read the snapshot, the
//! spec and what the security steps decided ([`Context::security`],
//! evaluated once before any step runs), so their order matters only for
//! the order of objects in the plan and of conditions in the status.

use serde::Serialize;
use serde_json::Value;
use wasmop_sdk::k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use wasmop_sdk::{GeneratedKey, ReconcileError, Snapshot};

use crate::names::{Component, Names};
use crate::pem;
use crate::settings::Settings;
use crate::spec::{FireboltInstance, InstanceSpec};

/// Everything a step may read.
#[derive(Clone, Copy, Debug)]
pub struct Context<'a> {
    /// The snapshot (owned and related objects, now).
    pub snapshot: &'a Snapshot,
    /// The instance.
    pub instance: &'a FireboltInstance,
    /// The instance's spec.
    pub spec: &'a InstanceSpec,
    /// The plugin's settings.
    pub settings: &'a Settings,
    /// Generated names.
    pub names: &'a Names,
    /// The instance ID: `spec.id`, or the one this reconcile generates.
    pub id: &'a str,
    /// The instance's UID.
    pub uid: &'a str,
    /// The snapshot time.
    pub now: &'a Time,
    /// What the security steps decided (auth, engine and gateway TLS);
    /// the gateway step renders from it.
    pub security: &'a crate::security::Security,
}

impl Context<'_> {
    /// The owned object of `kind` named `name`, deserialized into `T`.
    ///
    /// # Errors
    ///
    /// A [`Failure`] with reason `ObserveFailed` when it does not
    /// deserialize.
    pub fn observed<T: serde::de::DeserializeOwned>(
        &self,
        kind: &str,
        name: &str,
    ) -> Result<Option<T>, Failure> {
        self.snapshot
            .owned_named(kind, name)
            .map(|o| {
                T::deserialize(o).map_err(|e| {
                    Failure::new("ObserveFailed", format!("cannot read {kind} {name}: {e}"))
                })
            })
            .transpose()
    }
}

impl Context<'_> {
    /// The snapshot time in Unix seconds.
    pub fn now_seconds(&self) -> i64 {
        self.now.0.as_second()
    }

    /// The owned Secret `name`, if it holds a non-empty value under every
    /// key in `keys`.
    pub fn owned_secret_with(&self, name: &str, keys: &[&str]) -> Option<&serde_json::Value> {
        self.snapshot
            .owned_named("Secret", name)
            .filter(|s| pem::has_keys(s, keys))
    }
}

/// One object a step wants.
#[derive(Clone, Debug, PartialEq)]
pub struct Desired {
    /// The object (apiVersion, kind, metadata.name and namespace set).
    pub object: Value,
    /// Create it when missing, never update it.
    pub create_only: bool,
    /// Keys of this Secret whose values the host generates once (random
    /// bytes; the plan carries only their names).
    pub generate: Vec<GeneratedKey>,
}

impl Desired {
    /// An object to create or update by server-side apply.
    pub fn apply(object: impl Serialize) -> Self {
        Desired {
            object: to_value(object),
            create_only: false,
            generate: Vec::new(),
        }
    }

    /// A Secret to apply whose `keys` the host fills with random bytes
    /// once and never rewrites.
    pub fn generating(object: impl Serialize, keys: Vec<GeneratedKey>) -> Self {
        Desired {
            generate: keys,
            ..Desired::apply(object)
        }
    }

    /// An object to create once and then leave alone.
    pub fn create_only(object: impl Serialize) -> Self {
        Desired {
            object: to_value(object),
            create_only: true,
            generate: Vec::new(),
        }
    }

    /// `kind` of the object.
    pub fn kind(&self) -> &str {
        self.object["kind"].as_str().unwrap_or_default()
    }

    /// `metadata.name` of the object.
    pub fn name(&self) -> &str {
        self.object["metadata"]["name"].as_str().unwrap_or_default()
    }
}

fn to_value(object: impl Serialize) -> Value {
    // k8s-openapi objects and JSON values always serialize.
    serde_json::to_value(object).unwrap_or(Value::Null)
}

/// Health of what a step manages: the status of its condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Health {
    /// Condition status.
    pub ready: bool,
    /// Condition reason (CamelCase).
    pub reason: &'static str,
    /// Condition message.
    pub message: String,
}

impl Health {
    /// A True condition.
    pub fn ready(reason: &'static str, message: impl Into<String>) -> Self {
        Health {
            ready: true,
            reason,
            message: message.into(),
        }
    }

    /// A False condition that is expected to clear on its own (a rollout
    /// in progress).
    pub fn waiting(reason: &'static str, message: impl Into<String>) -> Self {
        Health {
            ready: false,
            reason,
            message: message.into(),
        }
    }
}

/// What a step that ran wants and reports.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// Objects to write, in order.
    pub objects: Vec<Desired>,
    /// The step's condition.
    pub health: Health,
}

/// Why a step could not do its work. Reported as its condition
/// (status False) and, when it first happens, a Warning event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// Condition reason.
    pub reason: &'static str,
    /// Condition message.
    pub message: String,
    /// The spec asks for something the operator refuses (phase `Failed`
    /// until the spec changes).
    pub rejects_spec: bool,
}

impl Failure {
    /// A failure that is not the spec's fault.
    pub fn new(reason: &'static str, message: impl Into<String>) -> Self {
        Failure {
            reason,
            message: message.into(),
            rejects_spec: false,
        }
    }

    /// A failure caused by a spec the operator refuses.
    pub fn rejected(reason: &'static str, message: impl Into<String>) -> Self {
        Failure {
            rejects_spec: true,
            ..Failure::new(reason, message)
        }
    }
}

impl From<ReconcileError> for Failure {
    fn from(e: ReconcileError) -> Self {
        Failure::new("EnsureFailed", e.message())
    }
}

/// A step's declaration.
#[derive(Clone, Copy, Debug)]
pub struct StepDef {
    /// Short name, for messages.
    pub name: &'static str,
    /// The condition type the step reports on.
    pub condition: &'static str,
    /// The components whose objects the step owns (for pruning).
    pub components: &'static [Component],
    /// Whether the condition counts towards the `Ready` roll-up.
    pub in_ready_rollup: bool,
    /// The step itself.
    pub run: fn(&Context<'_>) -> Result<Outcome, Failure>,
}

/// A step that ran, with its result.
#[derive(Clone, Debug)]
pub struct Ran {
    /// The step.
    pub step: StepDef,
    /// What it answered.
    pub result: Result<Outcome, Failure>,
}

impl Ran {
    /// The step's condition as (ready, reason, message).
    pub fn health(&self) -> Health {
        match &self.result {
            Ok(outcome) => outcome.health.clone(),
            Err(f) => Health::waiting(f.reason, f.message.clone()),
        }
    }
}
