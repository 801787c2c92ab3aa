//! The shard's reads and writes on the API server: the live Leases and
//! the membership, the labels a move, a drain acknowledgement and a claim
//! set, and how a shard label someone else set is recognised in a write's
//! answer.
//!
//! # Guarantees
//! - Every label write is a JSON merge patch of those labels only, at the
//!   resourceVersion the object was judged at, under the writer's own
//!   field manager: a race is a conflict, never a silent overwrite, and
//!   nothing else of the object changes.

use std::collections::BTreeSet;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

use super::{
    CLAIM_MANAGER, DRAIN_LABEL, Move, SHARD_LABEL, SHARD_MANAGER, SHARDER_MANAGER, Sharding,
    live_shards, next_expiry,
};

/// The live shards, read from the API server.
///
/// # Errors
/// When the Leases cannot be listed.
pub async fn read_live(
    client: &kube::Client,
    s: &Sharding,
) -> Result<BTreeSet<String>, kube::Error> {
    Ok(read_membership(client, s).await?.0)
}

/// The live shards and when the first of their Leases expires unless
/// renewed ([`next_expiry`]), read from the API server.
///
/// # Errors
/// When the Leases cannot be listed.
pub async fn read_membership(
    client: &kube::Client,
    s: &Sharding,
) -> Result<(BTreeSet<String>, Option<jiff::Timestamp>), kube::Error> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), &s.namespace);
    let list = leases.list(&ListParams::default()).await?;
    let live = live_shards(&list.items, jiff::Timestamp::now(), s.lease_duration);
    let expiry = next_expiry(&list.items, &live, s.lease_duration);
    Ok((live, expiry))
}

/// Writes a move's labels on a primary, with the resourceVersion it was
/// judged at.
pub(crate) async fn write_move(
    api: &Api<kube::api::DynamicObject>,
    name: &str,
    resource_version: &str,
    m: &Move,
) -> Result<(), kube::Error> {
    let labels = match m {
        Move::Keep => return Ok(()),
        Move::Assign(to) => json!({ SHARD_LABEL: to, DRAIN_LABEL: null }),
        Move::Drain => json!({ DRAIN_LABEL: "true" }),
        Move::Undrain => json!({ DRAIN_LABEL: null }),
    };
    patch_labels(api, name, resource_version, labels, SHARDER_MANAGER)
        .await
        .map(|_| ())
}

/// The acknowledgement of a drain: the shard label removed, at the
/// resourceVersion the shard saw the drain mark at.
pub(crate) async fn acknowledge(
    api: &Api<kube::api::DynamicObject>,
    name: &str,
    resource_version: &str,
) -> Result<(), kube::Error> {
    let labels = json!({ SHARD_LABEL: null });
    patch_labels(api, name, resource_version, labels, SHARD_MANAGER)
        .await
        .map(|_| ())
}

/// Relabels one owned object for shard `to` (a claim), at the
/// resourceVersion it was listed at: a JSON merge patch of that one label,
/// so nothing else of the object changes. Answers the object as written.
pub(crate) async fn claim_object(
    api: &Api<kube::api::DynamicObject>,
    name: &str,
    resource_version: &str,
    to: &str,
) -> Result<kube::api::DynamicObject, kube::Error> {
    patch_labels(
        api,
        name,
        resource_version,
        json!({ SHARD_LABEL: to }),
        CLAIM_MANAGER,
    )
    .await
}

/// A JSON merge patch of `labels` (null removes one) onto the object
/// `name`, only at `resource_version`, as field manager `manager`.
pub(super) async fn patch_labels(
    api: &Api<kube::api::DynamicObject>,
    name: &str,
    resource_version: &str,
    labels: serde_json::Value,
    manager: &str,
) -> Result<kube::api::DynamicObject, kube::Error> {
    let patch = json!({"metadata": {"resourceVersion": resource_version, "labels": labels}});
    api.patch(
        name,
        &PatchParams {
            field_manager: Some(manager.to_owned()),
            ..PatchParams::default()
        },
        &Patch::Merge(&patch),
    )
    .await
}

/// Whether an API server's answer to a write is a server-side apply
/// conflict over a shard label ([`SHARD_LABEL`], [`DRAIN_LABEL`]): a field
/// manager other than the plugin's holds it, so someone (a user, by hand)
/// labelled the owned object for a shard. The object left this shard's
/// caches with that label, and every apply of it conflicts until the label
/// goes: the primary is told (`ShardLabelForged`, naming the object) rather
/// than retried in silence.
pub fn forged_label_conflict(message: &str) -> bool {
    message.contains(".metadata.labels.shard.wasmop.dev/")
}

/// The message of a `ShardLabelForged` failure: the write's error (which
/// names the object and the field manager holding the label) and what to
/// do.
pub fn forged_label_message(e: &impl std::fmt::Display) -> String {
    format!(
        "{e}; someone else set the label {SHARD_LABEL} on this owned object (only the \
         operator sets it: it moved the object out of this shard's view): remove the label \
         (kubectl label <object> {SHARD_LABEL}-) and the shard writes the object again"
    )
}
