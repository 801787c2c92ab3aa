//! Names, labels and annotations, as upstream celld-operator spells them.

use sha2::{Digest, Sha256};

/// Label on every object and member Pod: the fleet's UID. Also the workload selector.
pub const FLEET_UID_LABEL: &str = "celld.eric.dev/fleet-uid";
/// The finalizer that guards a fleet until its compute and claims are gone.
pub const FINALIZER: &str = "celld.eric.dev/lifecycle-protection";
/// Pod-template annotation carrying `maintenance.restartToken`.
pub const RESTART_TOKEN_ANNOTATION: &str = "celld.eric.dev/restart-token";
/// Claim-template annotation naming the storage reservation.
pub const STORAGE_RESERVATION_ANNOTATION: &str = "celld.eric.dev/storage-reservation";
/// Reservation annotation recording the creation-time tuning.
pub const RESERVED_TUNING_ANNOTATION: &str = "celld.eric.dev/reserved-tuning";
/// Workload annotation: hash of the fields fixed at creation (wasmop's own).
pub const FIXED_CONFIG_ANNOTATION: &str = "celld.eric.dev/fixed-config";
/// Workload annotation: hash of the rendered pod template (wasmop's own).
pub const TEMPLATE_HASH_ANNOTATION: &str = "celld.eric.dev/template-hash";
/// Label a client Pod carries to reach a fleet's application port.
pub const CLIENT_OF_LABEL: &str = "celld.eric.dev/client-of";

/// Application port (Service `F`).
pub const APPLICATION_PORT: i32 = 8080;
/// Peer port (headless Service `F-peers`).
pub const PEER_PORT: i32 = 8081;
/// Name of the member container.
pub const CONTAINER: &str = "celld";
/// Name of the data volume and of the PersistentFleet claim template.
pub const DATA_VOLUME: &str = "data";

/// The headless peers Service of fleet `fleet`.
pub fn peers_service(fleet: &str) -> String {
    format!("{fleet}-peers")
}

/// The reservation of `bucket`: `s3-` and the first 56 hex characters of
/// the bucket name's SHA-256 (a valid object name whatever the bucket).
pub fn reservation_name(bucket: &str) -> String {
    let digest = Sha256::digest(bucket.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("s3-{}", &hex[..56])
}

/// The label selector text of a fleet (`status.labelSelector`).
pub fn selector_text(uid: &str) -> String {
    format!("{FLEET_UID_LABEL}={uid}")
}

/// The claim a StatefulSet makes for member `pod` from template `data`.
pub fn claim_of_pod(pod: &str) -> String {
    format!("{DATA_VOLUME}-{pod}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservation_names_are_stable_object_names() {
        let name = reservation_name("replace-with-dedicated-bucket");
        assert_eq!(name.len(), 59);
        assert!(name.starts_with("s3-"));
        assert_eq!(name, reservation_name("replace-with-dedicated-bucket"));
        assert_ne!(name, reservation_name("another-bucket"));
    }
}
