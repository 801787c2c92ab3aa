//! The operator's registry of running plugins: adding a plugin's
//! controllers or swapping in a new version ([`Operator::add_plugin`]),
//! removing them, the shadow candidates, and the watches they need.
//!
//! # Guarantees
//! - A swap happens in one step once every cache the new version needs has
//!   synced: reconciles already running finish on the old version, every
//!   later one runs the new; a swap that fails (a kind claimed by another
//!   plugin, a cache that does not sync) changes nothing.
//! - Removing a plugin stops its controllers and deletes nothing.
//! - A watch runs exactly while a running controller needs it.

use std::collections::HashSet;
use std::sync::Arc;

use wasmop_contract::Scope;

use super::route::{Route, cached_key_of};
use super::{Active, Operator, OperatorError, PrimaryKey, api_resource, kind_key, whole_kind_key};
use crate::contract::manifest::{Controller, KindRef};
use crate::execute::writer::Writer;
use crate::metrics;
use crate::plugin::LoadedPlugin;
use crate::watch::by_name;
use crate::watch::cache::{KindCache, KindKey, WatchSpec};

impl Operator {
    /// Starts the controllers of a loaded plugin, or replaces the running
    /// version of a plugin with the same name (hot swap).
    ///
    /// Watches the plugin's kinds, waits until their caches synced, then
    /// switches over in one step: reconciles already running finish on the
    /// old version, every later one runs the new. Every primary of the
    /// plugin is queued again in the queue's background
    /// ([`Queue::add_background`](crate::controller::queue::Queue::add_background)): at most `workers` at once, like every
    /// reconcile, and behind every change that arrives meanwhile, so a swap
    /// neither floods the API server nor holds back other work.
    ///
    /// # Errors
    /// [`OperatorError::KindClaimed`] when a primary kind is reconciled by
    /// another plugin; [`OperatorError::NotSynced`] when a kind's cache does
    /// not sync in time (e.g. its CRD is not installed). Nothing changes
    /// then: the running version, if any, keeps serving.
    pub async fn add_plugin(&self, plugin: Arc<LoadedPlugin>) -> Result<(), OperatorError> {
        // The manifest with `setting:` write namespaces resolved: what
        // validation enforces.
        let manifest = plugin.effective_manifest().clone();
        {
            let controllers = self.controllers.read().expect("controllers lock");
            for c in &manifest.controllers {
                for other in controllers.values() {
                    if other.plugin.name() != plugin.name()
                        && other.spec.primary.same_type(&c.primary)
                    {
                        return Err(OperatorError::KindClaimed {
                            kind: c.primary.to_string(),
                            owner: other.id.to_string(),
                            plugin: plugin.name().to_string(),
                        });
                    }
                }
            }
        }
        let mut caches: Vec<Arc<KindCache>> = Vec::new();
        // Optional kinds (named only by optional reads or optional owned
        // kinds): watched, not waited for.
        let mut optional: Vec<Arc<KindCache>> = Vec::new();
        let mut actives = Vec::new();
        for c in &manifest.controllers {
            let id: Arc<str> = format!("{}/{}", plugin.name(), c.name).into();
            caches.push(self.cache.ensure(WatchSpec {
                resource: api_resource(&c.primary),
                namespaced: c.primary.namespaced,
                managed_only: false,
                selector: self.primary_selector(c, &manifest.controllers),
            }));
            let required = c.required_kinds();
            // Secrets named by a field are read by name, not watched.
            for r in c.reads.iter().filter(|r| !by_name::is_by_name(r)) {
                let cache = self.cache.ensure(WatchSpec {
                    resource: api_resource(&r.kind),
                    namespaced: r.kind.namespaced,
                    managed_only: false,
                    selector: None,
                });
                if required.iter().any(|k| k.same_type(&r.kind)) {
                    caches.push(cache);
                } else {
                    optional.push(cache);
                }
            }
            // Dependent kinds are judged by a read of the object when it
            // is deleted; nothing to watch for them.
            for o in c.owns.iter().filter(|o| !o.is_dependent()) {
                let read_elsewhere = self.kind_is_read(&kind_key(&o.kind), &manifest.controllers);
                let cache = self.cache.ensure(WatchSpec {
                    resource: api_resource(&o.kind),
                    namespaced: o.kind.namespaced,
                    managed_only: !read_elsewhere,
                    selector: self.owned_selector(c, !read_elsewhere),
                });
                if required.iter().any(|k| k.same_type(&o.kind)) {
                    caches.push(cache);
                } else {
                    optional.push(cache);
                }
            }
            actives.push(Arc::new(Active {
                id: id.clone(),
                spec: c.clone(),
                primary: kind_key(&c.primary),
                primary_resource: api_resource(&c.primary),
                writer: Writer::new(self.client.clone(), format!("wasmop-{}", plugin.name())),
                plugin: plugin.clone(),
                route: Route::new(id.clone(), c.clone()),
                kinds: watched_kinds(c)
                    .into_iter()
                    .filter(|k| required.iter().any(|r| kind_key(r) == *k))
                    .collect(),
            }));
        }
        for c in &caches {
            let synced = tokio::time::timeout(self.config.sync_timeout, async {
                tokio::select! {
                    () = c.wait_synced() => true,
                    () = c.wait_not_served() => false,
                }
            })
            .await;
            if synced == Ok(false) {
                self.drop_unused_caches();
                return Err(OperatorError::KindNotServed {
                    kind: c.key().to_string(),
                    crd: c.crd_name(),
                    hint: crate::watch::cache::install_hint(&c.spec().resource.group).to_owned(),
                    plugin: plugin.name().to_string(),
                });
            }
            if synced.is_err() {
                self.drop_unused_caches();
                return Err(OperatorError::NotSynced {
                    kind: c.key().to_string(),
                    plugin: plugin.name().to_string(),
                    waited: self.config.sync_timeout,
                });
            }
        }
        for c in optional.iter().filter(|c| !c.synced()) {
            tracing::info!(
                plugin = plugin.name(),
                kind = %c.key(),
                "optional kind not served yet (is its CRD installed?); \
                 snapshots name it absent until its watch lists it"
            );
        }
        let mut queued = Vec::new();
        let replaced = {
            let mut controllers = self.controllers.write().expect("controllers lock");
            let old: Vec<Arc<str>> = controllers
                .iter()
                .filter(|(_, a)| a.plugin.name() == plugin.name())
                .map(|(k, _)| k.clone())
                .collect();
            let replaced = old.iter().filter_map(|k| controllers.remove(k)).next();
            for a in actives {
                if let Some(kc) = self.cache.kind(&a.primary) {
                    let field_reads = a.route.has_field_reads();
                    for obj in kc.list(None) {
                        if field_reads {
                            a.route.index_refs(&obj.value());
                        }
                        if a.spec.scope == Scope::Object {
                            queued.push(cached_key_of(&a.id, &obj));
                        }
                    }
                }
                if a.spec.scope == Scope::Kind {
                    queued.push(whole_kind_key(&a.id));
                }
                controllers.insert(a.id.clone(), a);
            }
            replaced
        };
        let m = metrics::global();
        if let Some(old) = &replaced {
            m.remove_where("wasmop_plugin_info", "plugin", old.plugin.name());
        }
        m.set(
            "wasmop_plugin_info",
            &[
                ("plugin", plugin.name()),
                ("version", plugin.version()),
                ("digest", plugin.digest()),
            ],
            1.0,
        );
        m.inc("wasmop_plugin_loads_total", &[("plugin", plugin.name())]);
        match &replaced {
            Some(old) => tracing::info!(
                plugin = plugin.name(),
                from = old.plugin.version(),
                to = plugin.version(),
                digest = plugin.digest(),
                primaries = queued.len(),
                "plugin swapped"
            ),
            None => tracing::info!(
                plugin = plugin.name(),
                version = plugin.version(),
                digest = plugin.digest(),
                controllers = manifest.controllers.len(),
                primaries = queued.len(),
                "plugin started"
            ),
        }
        for key in queued {
            self.queue.add_background(key);
        }
        self.drop_unused_caches();
        Ok(())
    }

    /// Stops the controllers of a plugin. Its objects stay: nothing is
    /// deleted because a plugin went away. Returns whether it was running.
    pub fn remove_plugin(&self, name: &str) -> bool {
        let removed: Vec<Arc<Active>> = {
            let mut controllers = self.controllers.write().expect("controllers lock");
            let ids: Vec<Arc<str>> = controllers
                .iter()
                .filter(|(_, a)| a.plugin.name() == name)
                .map(|(k, _)| k.clone())
                .collect();
            ids.iter().filter_map(|k| controllers.remove(k)).collect()
        };
        if removed.is_empty() {
            return false;
        }
        metrics::global().remove_where("wasmop_plugin_info", "plugin", name);
        tracing::info!(
            plugin = name,
            "plugin removed; its controllers stopped, its objects left in place"
        );
        self.drop_unused_caches();
        true
    }

    /// Runs `plugin` as the shadow of the active plugin of the same name:
    /// called on every snapshot the active one decides, compared, never
    /// written (see [`crate::report::shadow`]). Replaces an earlier shadow.
    ///
    /// # Errors
    /// When no plugin of that name is active (a message naming it).
    pub fn set_shadow(&self, plugin: Arc<LoadedPlugin>) -> Result<(), String> {
        let name = plugin.name().to_owned();
        let active = self
            .controllers
            .read()
            .expect("controllers lock")
            .values()
            .any(|a| a.plugin.name() == name);
        if !active {
            return Err(format!(
                "no active plugin {name} to shadow (a shadow runs beside {name}.wasm)"
            ));
        }
        tracing::info!(plugin = %name, version = plugin.version(), digest = plugin.digest(),
            "shadow candidate running beside the active plugin; it writes nothing");
        self.shadows
            .write()
            .expect("shadows lock")
            .insert(name, plugin);
        Ok(())
    }

    /// Stops the shadow of plugin `name`; returns whether one ran.
    pub fn remove_shadow(&self, name: &str) -> bool {
        let removed = self
            .shadows
            .write()
            .expect("shadows lock")
            .remove(name)
            .is_some();
        if removed {
            tracing::info!(plugin = name, "shadow candidate stopped");
        }
        removed
    }

    /// The shadow of plugin `name`, if any.
    pub fn shadow(&self, name: &str) -> Option<Arc<LoadedPlugin>> {
        self.shadows
            .read()
            .expect("shadows lock")
            .get(name)
            .cloned()
    }

    /// The keys of the primaries of `a` the watch cache holds.
    pub(super) fn cached_primary_keys(&self, a: &Active) -> Vec<PrimaryKey> {
        self.cache
            .kind(&a.primary)
            .map(|kc| kc.list(None))
            .unwrap_or_default()
            .iter()
            .map(|o| cached_key_of(&a.id, o))
            .collect()
    }

    /// Queues every primary of every running controller again, in the
    /// queue's background like a plugin start (e.g. after this replica
    /// became the leader and its earlier reconciles skipped their writes).
    pub fn requeue_all(&self) {
        let keys: Vec<PrimaryKey> = {
            let controllers = self.controllers.read().expect("controllers lock");
            controllers
                .values()
                .flat_map(|a| {
                    if a.spec.scope == Scope::Kind {
                        return vec![whole_kind_key(&a.id)];
                    }
                    self.cached_primary_keys(a)
                })
                .collect()
        };
        for key in keys {
            self.queue.add_background(key);
        }
    }

    /// The name, version and digest of every running plugin.
    pub fn plugins(&self) -> Vec<(String, String, String)> {
        let mut out: Vec<(String, String, String)> = self
            .controllers
            .read()
            .expect("controllers lock")
            .values()
            .map(|a| {
                (
                    a.plugin.name().to_string(),
                    a.plugin.version().to_string(),
                    a.plugin.digest().to_string(),
                )
            })
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// Every running plugin, once each (admission asks per request).
    pub fn loaded_plugins(&self) -> Vec<Arc<LoadedPlugin>> {
        let mut out: Vec<Arc<LoadedPlugin>> = Vec::new();
        for a in self.controllers.read().expect("controllers lock").values() {
            if !out.iter().any(|p| Arc::ptr_eq(p, &a.plugin)) {
                out.push(a.plugin.clone());
            }
        }
        out
    }

    /// Stops the watches no running controller needs any more.
    pub(super) fn drop_unused_caches(&self) {
        let needed: HashSet<KindKey> = self
            .controllers
            .read()
            .expect("controllers lock")
            .values()
            .flat_map(|a| {
                let c = &a.spec;
                watched_kinds(c)
            })
            .collect();
        for k in self.cache.kinds() {
            if !needed.contains(&k) {
                self.cache.remove(&k);
            }
        }
    }

    pub(super) fn kind_is_read(&self, key: &KindKey, incoming: &[Controller]) -> bool {
        let reads = |c: &Controller| {
            kind_key(&c.primary) == *key
                || c.reads
                    .iter()
                    .any(|r| !by_name::is_by_name(r) && kind_key(&r.kind) == *key)
        };
        incoming.iter().any(reads)
            || self
                .controllers
                .read()
                .expect("controllers lock")
                .values()
                .any(|a| reads(&a.spec))
    }
}

/// The kinds a controller's snapshots come from through watches: its
/// primary, owned and read kinds, and its HTTP target kinds, except Secrets
/// that are only named by field references (read by name) and dependent
/// kinds nothing else reads.
pub(super) fn watched_kinds(c: &Controller) -> Vec<KindKey> {
    let unwatched = |kind: &KindRef| {
        !kind.same_type(&c.primary)
            && !c
                .owns
                .iter()
                .any(|o| !o.is_dependent() && o.kind.same_type(kind))
            && !c.http_targets.iter().any(|t| t.kind.same_type(kind))
            && c.reads
                .iter()
                .filter(|r| r.kind.same_type(kind))
                .all(by_name::is_by_name)
    };
    c.kinds()
        .into_iter()
        .filter(|k| !unwatched(k))
        .map(kind_key)
        .collect()
}
