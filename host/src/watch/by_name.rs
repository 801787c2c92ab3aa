//! Secrets read by name instead of watched.
//!
//! A controller that names a Secret through a field reference
//! (`spec.credentialsSecretRef.name`) needs that one Secret, not every
//! Secret in the cluster. Watching the kind would list and hold them all,
//! and would need `list`/`watch` on every Secret. Instead the host reads each
//! named Secret from the API server when it builds the snapshot, keeps only
//! what it read, and polls the Secrets some primary names so that a change
//! (created, rotated, deleted) re-triggers the primaries that name it.
//!
//! # Guarantees
//!
//! - No list or watch of Secrets is made for field reads: only GETs of the
//!   names primaries reference (`wasmop inspect` grants `get` alone for them).
//! - A snapshot holds the Secret as the API server had it when the snapshot
//!   was built.
//! - Only Secrets some primary still references are kept; the rest are
//!   forgotten at the next poll.
//! - A failed read keeps the last value read (a transient API error does
//!   not make a Secret look deleted to the plugin).
//!
//! # Caveats
//!
//! A change reaches the referencing primaries within one poll interval
//! (`--secret-poll-interval`), not at once as a watch would.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kube::Client;
use kube::api::{Api, DynamicObject};
use serde_json::Value;
use tokio::runtime::Handle;

use crate::contract::manifest::{KindRef, Read, Selector};
use crate::object;
use crate::watch::cache::{CachedObject, Change, KindKey};

/// Whether a read is served by name from the API server rather than by a
/// watch: a field reference to core `v1` Secrets.
pub fn is_by_name(read: &Read) -> bool {
    matches!(read.selector, Selector::Field(_)) && is_secret(&read.kind)
}

/// Whether `kind` is the core `v1` Secret.
pub fn is_secret(kind: &KindRef) -> bool {
    kind.group.is_empty() && kind.version == "v1" && kind.kind == "Secret"
}

/// The kind key of core `v1` Secrets.
pub fn secret_key() -> KindKey {
    KindKey::new("", "v1", "Secret")
}

/// `(namespace, name)` of a Secret.
pub type SecretId = (String, String);

/// The Secrets read by name, as last read.
pub struct SecretReads {
    client: Client,
    seen: Mutex<HashMap<SecretId, Option<Arc<Value>>>>,
}

impl std::fmt::Debug for SecretReads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretReads")
            .field("held", &self.len())
            .finish()
    }
}

impl SecretReads {
    /// An empty store reading through `client`.
    pub fn new(client: Client) -> Arc<Self> {
        Arc::new(Self {
            client,
            seen: Mutex::new(HashMap::new()),
        })
    }

    async fn read(&self, namespace: &str, name: &str) -> Result<Option<Arc<Value>>, kube::Error> {
        let api: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            namespace,
            &crate::key::api_resource(&KindRef::namespaced("", "v1", "Secret", "secrets")),
        );
        let found = api.get_opt(name).await?;
        Ok(found.map(|o| {
            let mut v = serde_json::to_value(o).unwrap_or_default();
            // A GET carries the type, but make sure: the snapshot and the
            // HTTP target lookup match objects by apiVersion and kind.
            if let Some(m) = v.as_object_mut() {
                m.insert("apiVersion".into(), "v1".into());
                m.insert("kind".into(), "Secret".into());
            }
            crate::object::strip_bookkeeping(&mut v);
            Arc::new(v)
        }))
    }

    /// The Secret `namespace`/`name` as the API server has it now, blocking
    /// the calling thread (call from a blocking task). On a read error, the
    /// last value read.
    pub fn get_blocking(
        &self,
        runtime: &Handle,
        namespace: &str,
        name: &str,
    ) -> Option<Arc<Value>> {
        let id = (namespace.to_owned(), name.to_owned());
        match runtime.block_on(self.read(namespace, name)) {
            Ok(found) => {
                self.seen
                    .lock()
                    .expect("secret reads lock")
                    .insert(id, found.clone());
                found
            }
            Err(e) => {
                tracing::warn!(namespace, name, error = %e,
                    "could not read a referenced Secret; using the last value read");
                self.seen
                    .lock()
                    .expect("secret reads lock")
                    .get(&id)
                    .cloned()
                    .flatten()
            }
        }
    }

    /// Reads every Secret in `referenced` again and returns a change for each
    /// that differs from what was last read (created, changed, deleted).
    /// Forgets the Secrets no longer referenced. A Secret never read before
    /// counts as changed only when it exists now.
    pub async fn poll(&self, referenced: &[SecretId]) -> Vec<Change> {
        {
            let mut seen = self.seen.lock().expect("secret reads lock");
            seen.retain(|id, _| referenced.contains(id));
        }
        let mut changes = Vec::new();
        for (namespace, name) in referenced {
            let now = match self.read(namespace, name).await {
                Ok(found) => found,
                Err(e) => {
                    tracing::debug!(namespace, name, error = %e, "Secret poll failed; next poll retries");
                    continue;
                }
            };
            let id = (namespace.clone(), name.clone());
            let before = self
                .seen
                .lock()
                .expect("secret reads lock")
                .insert(id, now.clone());
            let before = before.flatten();
            let version = |o: &Option<Arc<Value>>| {
                o.as_ref().map(|o| {
                    (
                        object::uid(o).to_owned(),
                        object::resource_version(o).to_owned(),
                    )
                })
            };
            if version(&before) != version(&now) {
                let cached =
                    |o: Option<Arc<Value>>| o.map(|v| Arc::new(CachedObject::from_value(&v)));
                changes.push(Change {
                    kind: secret_key(),
                    old: cached(before),
                    new: cached(now),
                });
            }
        }
        changes
    }

    /// How many Secrets are held.
    pub fn len(&self) -> usize {
        self.seen.lock().expect("secret reads lock").len()
    }

    /// Whether no Secret is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::manifest::FieldRef;

    fn read(kind: KindRef, selector: Selector) -> Read {
        Read {
            id: "r".into(),
            kind,
            selector,
            optional: false,
        }
    }

    #[test]
    fn only_field_reads_of_core_secrets_are_by_name() {
        let secret = KindRef::namespaced("", "v1", "Secret", "secrets");
        let field = Selector::Field(FieldRef {
            name_path: "spec.secretRef".into(),
            namespace_path: None,
        });
        assert!(is_by_name(&read(secret.clone(), field.clone())));
        assert!(!is_by_name(&read(secret.clone(), Selector::SameNamespace)));
        assert!(!is_by_name(&read(secret, Selector::Labels("a=b".into()))));
        let cm = KindRef::namespaced("", "v1", "ConfigMap", "configmaps");
        assert!(!is_by_name(&read(cm, field.clone())));
        let lookalike = KindRef::namespaced("example.com", "v1", "Secret", "secrets");
        assert!(!is_by_name(&read(lookalike, field)));
    }
}
