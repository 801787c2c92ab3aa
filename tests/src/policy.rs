//! ValidatingAdmissionPolicies (built into the API server, no webhook) for
//! tests: the shard label policy as `deploy/shard-label-policy.yaml` ships
//! it, or a policy a test writes to make one kind of write fail, each bound
//! to what the test names only, and removed again by [`Policy::remove`].

use anyhow::{Context, Result, bail};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};

use crate::{DEFAULT_DEADLINE, repo_root, wait_for};

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind),
        plural,
    )
}

/// A ValidatingAdmissionPolicy and its binding, both named `name`.
pub struct Policy {
    client: kube::Client,
    /// The name of the policy and of its binding.
    pub name: String,
}

impl std::fmt::Debug for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Policy").field("name", &self.name).finish()
    }
}

impl Policy {
    /// Applies `policy` and a binding of it (`Deny`) limited to
    /// `match_resources` (a binding's `matchResources`), both named `name`.
    ///
    /// # Errors
    /// When the API server refuses either.
    pub async fn apply(
        client: &kube::Client,
        name: &str,
        mut policy: Value,
        match_resources: Value,
    ) -> Result<Self> {
        policy["apiVersion"] = json!("admissionregistration.k8s.io/v1");
        policy["kind"] = json!("ValidatingAdmissionPolicy");
        policy["metadata"]["name"] = json!(name);
        let binding = json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {"policyName": name, "validationActions": ["Deny"],
                     "matchResources": match_resources},
        });
        let pp = PatchParams::apply("wasmop-tests").force();
        let policies: Api<DynamicObject> = Api::all_with(
            client.clone(),
            &resource("ValidatingAdmissionPolicy", "validatingadmissionpolicies"),
        );
        policies
            .patch(name, &pp, &Patch::Apply(&policy))
            .await
            .with_context(|| format!("applying policy {name}"))?;
        let bindings: Api<DynamicObject> = Api::all_with(
            client.clone(),
            &resource(
                "ValidatingAdmissionPolicyBinding",
                "validatingadmissionpolicybindings",
            ),
        );
        bindings
            .patch(name, &pp, &Patch::Apply(&binding))
            .await
            .with_context(|| format!("applying binding {name}"))?;
        Ok(Self {
            client: client.clone(),
            name: name.to_owned(),
        })
    }

    /// The shard label policy of `deploy/shard-label-policy.yaml`, with the
    /// operator's user name `operator` instead of `wasmop/wasmop`'s, named
    /// `name` and bound to namespace `namespace` only.
    ///
    /// # Errors
    /// When the file does not parse or the API server refuses it.
    pub async fn shard_labels(
        client: &kube::Client,
        name: &str,
        operator: &str,
        namespace: &str,
    ) -> Result<Self> {
        let file = repo_root().join("deploy/shard-label-policy.yaml");
        let text = std::fs::read_to_string(&file)?
            .replace("system:serviceaccount:wasmop:wasmop", operator);
        let mut policy = None;
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let value = <Value as serde::Deserialize>::deserialize(doc)?;
            if value["kind"] == "ValidatingAdmissionPolicy" {
                policy = Some(value);
            }
        }
        let mut policy = policy.context("no ValidatingAdmissionPolicy in the file")?;
        if !policy.to_string().contains(operator) {
            bail!("the shipped policy no longer names system:serviceaccount:wasmop:wasmop");
        }
        policy["metadata"] = json!({});
        Self::apply(
            client,
            name,
            policy,
            json!({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}),
        )
        .await
    }

    /// Waits until `probe` (a write the policy refuses, e.g. a dry run) is
    /// refused with a message holding `needle`: the API server enforces the
    /// policy (it takes a moment to see a new one).
    ///
    /// # Errors
    /// When it is not refused within the deadline.
    pub async fn wait_enforced<F, Fut>(&self, needle: &str, probe: F) -> Result<()>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<(), kube::Error>>,
    {
        wait_for(
            &format!("policy {} enforced", self.name),
            DEFAULT_DEADLINE,
            || async {
                match probe().await {
                    Err(kube::Error::Api(e)) if e.message.contains(needle) => Ok(Some(())),
                    other => bail!("the probe was not refused by the policy: {other:?}"),
                }
            },
        )
        .await
    }

    /// Deletes the binding and the policy.
    ///
    /// # Errors
    /// When the API server refuses.
    pub async fn remove(self) -> Result<()> {
        let dp = DeleteParams::default();
        let bindings: Api<DynamicObject> = Api::all_with(
            self.client.clone(),
            &resource(
                "ValidatingAdmissionPolicyBinding",
                "validatingadmissionpolicybindings",
            ),
        );
        bindings.delete(&self.name, &dp).await?;
        let policies: Api<DynamicObject> = Api::all_with(
            self.client.clone(),
            &resource("ValidatingAdmissionPolicy", "validatingadmissionpolicies"),
        );
        policies.delete(&self.name, &dp).await?;
        Ok(())
    }
}
