//! Events on the operator's own Pod (`POD_NAME` in `POD_NAMESPACE`, set by
//! the Deployment through the downward API): a plugin file that is
//! rejected raises a Warning Event there, so `kubectl describe pod` and
//! event-based alerting see it, not only the log.
//!
//! Without both variables (the operator runs outside a Pod) nothing is
//! recorded.

use std::sync::OnceLock;

use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::execute::Reporter;

struct SelfEvents {
    reporter: Reporter,
    pod: Value,
}

static SELF: OnceLock<SelfEvents> = OnceLock::new();

/// Looks up the operator's own Pod from `POD_NAME` and `POD_NAMESPACE` and
/// enables [`plugin_rejected`]. Returns the Pod's `namespace/name` when
/// enabled.
pub async fn init(client: Client) -> Option<String> {
    let name = std::env::var("POD_NAME").ok().filter(|s| !s.is_empty())?;
    let namespace = std::env::var("POD_NAMESPACE")
        .ok()
        .filter(|s| !s.is_empty())?;
    let uid = match Api::<Pod>::namespaced(client.clone(), &namespace)
        .get(&name)
        .await
    {
        Ok(pod) => pod.metadata.uid,
        Err(e) => {
            tracing::warn!(pod = %name, namespace = %namespace, error = %e,
                "cannot read the operator's own Pod; its Events carry no UID");
            None
        }
    };
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
    });
    let _ = SELF.set(SelfEvents {
        reporter: Reporter::new(client, "wasmop"),
        pod,
    });
    Some(format!("{namespace}/{name}"))
}

/// Raises a Warning Event `PluginRejected` on the operator's Pod, when
/// [`init`] found one; returns at once (the Event is sent in the
/// background).
pub fn plugin_rejected(file: &str, reason: &str, message: &str) {
    let message = format!("plugin file {file} rejected ({reason}): {message}");
    warning("PluginRejected", &message);
}

/// Raises a Warning Event with `reason` on the operator's Pod, when
/// [`init`] found one; returns at once (the Event is sent in the
/// background).
pub fn warning(reason: &str, message: &str) {
    let Some(me) = SELF.get() else { return };
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let (reason, message) = (reason.to_owned(), message.to_owned());
    runtime.spawn(async move {
        me.reporter.event(&me.pod, true, &reason, &message).await;
    });
}
