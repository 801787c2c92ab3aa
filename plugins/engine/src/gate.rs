//! The instance gate: what an engine needs from its FireboltInstance
//! before it may render anything that references instance data.
//!
//! The instance (same namespace, `spec.instanceRef`) must exist, must have
//! `spec.id`, and must publish `status.metadataEndpoint` (unless the
//! engine sets `spec.metadataEndpointOverride`). When the instance asks
//! for auth or engine TLS, it must also have provisioned them
//! (`status.auth.authHash`, `status.engineTLS`; see [`crate::security`]).
//! Never its `Ready` condition nor its phase (which follows `Ready`):
//! `EngineTLSReady` is part of `Ready` and turns true only once every
//! engine serves TLS, so an engine waiting for `Ready` would never roll
//! and the instance would never become ready. Only the creating, stable
//! and stopped phases consult the gate.

use serde_json::Value;

use crate::render::InstanceData;

/// Checks the instance `instance` (None: not found) named `name`.
///
/// # Errors
///
/// Why the engine must wait, for the `InstanceReady` condition.
pub fn check(
    name: &str,
    instance: Option<&Value>,
    metadata_override: Option<&str>,
) -> Result<InstanceData, String> {
    let Some(instance) = instance else {
        return Err(format!("FireboltInstance {name} not found"));
    };
    let text = |path: &str| {
        instance
            .pointer(path)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let id = text("/spec/id");
    if id.is_empty() {
        return Err(format!("FireboltInstance {name} has no spec.id yet"));
    }
    let metadata_endpoint = match metadata_override.filter(|o| !o.is_empty()) {
        Some(o) => o.to_owned(),
        None => text("/status/metadataEndpoint"),
    };
    if metadata_endpoint.is_empty() {
        return Err(format!(
            "FireboltInstance {name} has not published status.metadataEndpoint"
        ));
    }
    let auth = crate::security::auth(instance)?;
    let mut tls = crate::security::tls(instance)?;
    if let Some(t) = tls.as_mut() {
        t.instance = name.to_owned();
    }
    Ok(InstanceData {
        id,
        metadata_endpoint,
        auth,
        tls,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn instance(phase: &str, endpoint: Option<&str>, id: &str) -> Value {
        json!({"spec": {"id": id}, "status": {"phase": phase, "metadataEndpoint": endpoint}})
    }

    #[test]
    fn each_missing_piece_blocks_with_its_own_reason() {
        assert!(check("fb", None, None).unwrap_err().contains("not found"));
        let no_id = instance("Ready", Some("m:7000"), "");
        assert!(
            check("fb", Some(&no_id), None)
                .unwrap_err()
                .contains("spec.id")
        );
        // The phase follows Ready (which waits for engines under engine
        // TLS): a provisioning instance with an endpoint lets engines on.
        let provisioning = instance("Provisioning", Some("m:7000"), "01J");
        assert!(check("fb", Some(&provisioning), None).is_ok());
        let no_endpoint = instance("Degraded", None, "01J");
        assert!(
            check("fb", Some(&no_endpoint), None)
                .unwrap_err()
                .contains("metadataEndpoint")
        );
    }

    #[test]
    fn a_ready_instance_passes_and_the_override_wins() {
        let ready = instance("Ready", Some("m:7000"), "01J");
        assert_eq!(
            check("fb", Some(&ready), None).unwrap(),
            InstanceData {
                id: "01J".into(),
                metadata_endpoint: "m:7000".into(),
                auth: None,
                tls: None,
            }
        );
        let no_endpoint = instance("Ready", None, "01J");
        assert_eq!(
            check("fb", Some(&no_endpoint), Some("other:7000"))
                .unwrap()
                .metadata_endpoint,
            "other:7000"
        );
    }
}
