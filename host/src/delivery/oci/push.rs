//! Publishing a plugin (`wasmop oci push`) as a wasm OCI artifact (one
//! `application/wasm` layer, CNCF wasm working group layout), and telling
//! a component from a core module ([`is_component`]).
//!
//! # Guarantees
//! - The digest answered is the manifest's as the registry stored it
//!   (read back after the push; computed from the manifest sent when the
//!   read fails), so `oci://…@<digest>` pulls exactly the bytes pushed.

use std::collections::BTreeMap;

use oci_client::Reference;
use oci_client::client::{Config, ImageLayer};
use oci_client::manifest::OciImageManifest;

use super::{PUSH_CONFIG_TYPE, PUSH_LAYER_TYPE, RegistryOptions, sha256};

/// True when `bytes` start like a WebAssembly component (not a core
/// module).
pub fn is_component(bytes: &[u8]) -> bool {
    bytes.len() >= 8 && bytes[..4] == *b"\0asm" && bytes[6..8] == [0x01, 0x00]
}

/// Publishes the component `bytes` under `reference` as a wasm OCI artifact
/// (CNCF wasm working group layout); returns the manifest digest.
///
/// # Errors
/// A message when the registry refuses the push.
pub async fn push(
    registry: &RegistryOptions,
    reference: &Reference,
    file_name: &str,
    bytes: Vec<u8>,
) -> Result<String, String> {
    let client = registry.client();
    let auth = registry.auth(reference);
    let layer_digest = sha256(&bytes);
    let mut annotations = BTreeMap::new();
    annotations.insert(
        "org.opencontainers.image.title".to_owned(),
        file_name.to_owned(),
    );
    let config = serde_json::json!({
        "architecture": "wasm",
        "os": "wasip2",
        "layerDigests": [layer_digest],
    });
    let layers = [ImageLayer::new(
        bytes,
        PUSH_LAYER_TYPE.to_owned(),
        Some(annotations),
    )];
    let config = Config::new(
        serde_json::to_vec(&config).unwrap_or_default(),
        PUSH_CONFIG_TYPE.to_owned(),
        None,
    );
    let mut image_manifest = OciImageManifest::build(&layers, &config, None);
    image_manifest.artifact_type = Some(PUSH_CONFIG_TYPE.to_owned());
    let manifest_digest =
        sha256(&serde_json::to_vec(&image_manifest).map_err(|e| format!("manifest: {e}"))?);
    client
        .push(reference, &layers, config, &auth, Some(image_manifest))
        .await
        .map_err(|e| format!("push to {}: {e}", reference.whole()))?;
    // The registry's view of what it stored is the authority.
    match client.fetch_manifest_digest(reference, &auth).await {
        Ok(d) => Ok(d),
        Err(_) => Ok(manifest_digest),
    }
}
