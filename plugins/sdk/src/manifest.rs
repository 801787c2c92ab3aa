//! What a plugin declares about itself: [`Manifest`] and the records inside
//! it. The host reads the manifest once at load and enforces it on every plan.
//!
//! Each type has small builder methods so a manifest reads top-down:
//!
//! ```
//! use wasmop_sdk::{Controller, KindRef, Manifest, Read, Selector};
//!
//! let manifest = Manifest::new("engine", "0.1.0").controller(
//!     Controller::new("engine", KindRef::namespaced("firebolt.io", "v1", "FireboltEngine", "fireboltengines"))
//!         .owns(KindRef::namespaced("apps", "v1", "Deployment", "deployments"))
//!         .reads(Read::new(
//!             "instance",
//!             KindRef::namespaced("firebolt.io", "v1", "FireboltInstance", "fireboltinstances"),
//!             Selector::field("spec.instanceRef"),
//!         ))
//!         .finalizer("firebolt.io/engine"),
//! );
//! assert_eq!(manifest.controllers[0].owns[0].kind, "Deployment");
//! ```

use serde::{Deserialize, Serialize};

/// A Kubernetes resource type and how it is addressed (WIT `kind-ref`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KindRef {
    /// API group, empty for the core group.
    pub group: String,
    /// API version within the group, e.g. `v1`.
    pub version: String,
    /// Kind, e.g. `ConfigMap`.
    pub kind: String,
    /// Plural resource name used in URLs, e.g. `configmaps`.
    pub plural: String,
    /// True for namespaced kinds.
    pub namespaced: bool,
}

impl KindRef {
    /// A namespaced kind.
    pub fn namespaced(group: &str, version: &str, kind: &str, plural: &str) -> Self {
        KindRef {
            group: group.to_owned(),
            version: version.to_owned(),
            kind: kind.to_owned(),
            plural: plural.to_owned(),
            namespaced: true,
        }
    }

    /// A cluster-scoped kind.
    pub fn cluster_scoped(group: &str, version: &str, kind: &str, plural: &str) -> Self {
        KindRef {
            namespaced: false,
            ..KindRef::namespaced(group, version, kind, plural)
        }
    }

    /// The kind of a `k8s-openapi` resource type, e.g. `KindRef::of::<ConfigMap>()`.
    pub fn of<K>() -> Self
    where
        K: k8s_openapi::Resource,
        K::Scope: 'static,
    {
        use std::any::TypeId;
        KindRef {
            group: K::GROUP.to_owned(),
            version: K::VERSION.to_owned(),
            kind: K::KIND.to_owned(),
            plural: K::URL_PATH_SEGMENT.to_owned(),
            namespaced: TypeId::of::<K::Scope>()
                == TypeId::of::<k8s_openapi::NamespaceResourceScope>(),
        }
    }

    /// The `apiVersion` string of objects of this kind: `group/version`, or
    /// just `version` for the core group.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

/// Names a related object through fields of the primary (WIT `field-ref`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FieldRef {
    /// Dotted path to the string field holding the object's name.
    pub name_path: String,
    /// Dotted path to the string field holding its namespace; the primary's
    /// namespace when `None` or empty.
    pub namespace_path: Option<String>,
}

/// How the objects of a read kind are selected for a snapshot (WIT `selector`).
///
/// JSON: `"ownedByPrimary"`, `{"field":{"namePath":"spec.x","namespacePath":null}}`,
/// `"sameNamespace"`, `"clusterWide"`, `{"labels":"app=web"}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Selector {
    /// Objects whose controller ownerReference is the primary.
    OwnedByPrimary,
    /// The one object named by a field of the primary.
    Field(FieldRef),
    /// Every object of the kind in the primary's namespace.
    SameNamespace,
    /// Every object of the kind in the cluster.
    ClusterWide,
    /// Objects matching a label selector in kubectl syntax.
    Labels(String),
}

impl Selector {
    /// The object named by the primary's string field at `name_path`, in the
    /// primary's namespace.
    pub fn field(name_path: &str) -> Self {
        Selector::Field(FieldRef {
            name_path: name_path.to_owned(),
            namespace_path: None,
        })
    }

    /// The object named by the fields at `name_path` and `namespace_path`.
    pub fn field_in(name_path: &str, namespace_path: &str) -> Self {
        Selector::Field(FieldRef {
            name_path: name_path.to_owned(),
            namespace_path: Some(namespace_path.to_owned()),
        })
    }
}

/// A kind the plugin reads without owning it (WIT `read`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Read {
    /// Name under which the objects appear in [`crate::Snapshot::related`].
    pub id: String,
    /// The kind read.
    pub kind: KindRef,
    /// Which objects of the kind belong in the snapshot.
    pub selector: Selector,
}

impl Read {
    /// A read with the given id, kind and selector.
    pub fn new(id: &str, kind: KindRef, selector: Selector) -> Self {
        Read {
            id: id.to_owned(),
            kind,
            selector,
        }
    }
}

/// A network target the plugin may ask the host to call (WIT `http-target`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpTarget {
    /// Name requests use for this target.
    pub id: String,
    /// Kind of the addressed objects (Pods or Services).
    pub kind: KindRef,
    /// Ports that may be called.
    pub ports: Vec<u16>,
}

/// One reconciler inside a plugin (WIT `controller`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Controller {
    /// Name, unique within the plugin.
    pub name: String,
    /// The kind reconciled.
    pub primary: KindRef,
    /// Kinds the controller may create, update and delete.
    pub owns: Vec<KindRef>,
    /// Kinds read without owning.
    pub reads: Vec<Read>,
    /// Finalizer the host manages on each primary, if any.
    pub finalizer: Option<String>,
    /// Namespaces other than the primary's that owned objects may be
    /// written to (`*` for any; `setting:<key>` for the namespace the
    /// top-level string setting `<key>` names, resolved by the host at load).
    pub write_namespaces: Vec<String>,
    /// Dotted paths of primary fields a plan may set.
    pub primary_fields: Vec<String>,
    /// Targets of HTTP requests.
    pub http_targets: Vec<HttpTarget>,
    /// A plan may delete the primary itself ([`crate::Plan::delete_self`]).
    #[serde(default)]
    pub delete_primary: bool,
}

impl Controller {
    /// A controller of `primary` that owns, reads and may call nothing yet.
    pub fn new(name: &str, primary: KindRef) -> Self {
        Controller {
            name: name.to_owned(),
            primary,
            owns: Vec::new(),
            reads: Vec::new(),
            finalizer: None,
            write_namespaces: Vec::new(),
            primary_fields: Vec::new(),
            http_targets: Vec::new(),
            delete_primary: false,
        }
    }

    /// Adds an owned kind.
    pub fn owns(mut self, kind: KindRef) -> Self {
        self.owns.push(kind);
        self
    }

    /// Adds a read.
    pub fn reads(mut self, read: Read) -> Self {
        self.reads.push(read);
        self
    }

    /// Sets the finalizer.
    pub fn finalizer(mut self, finalizer: &str) -> Self {
        self.finalizer = Some(finalizer.to_owned());
        self
    }

    /// Adds a namespace owned objects may be written to (`*`: any).
    pub fn write_namespace(mut self, namespace: &str) -> Self {
        self.write_namespaces.push(namespace.to_owned());
        self
    }

    /// Adds the namespace named by the top-level string setting `key` as a
    /// write namespace (the entry `setting:<key>`). The host resolves it
    /// once at load, after `validate_settings` accepted the settings; an
    /// absent setting resolves to nothing, so a setting with a default
    /// needs the default added with [`Controller::write_namespace`] too.
    pub fn write_namespace_from_setting(mut self, key: &str) -> Self {
        self.write_namespaces.push(format!("setting:{key}"));
        self
    }

    /// Lets plans delete the primary itself (e.g. an orphaned request that
    /// nothing else garbage-collects), with its uid and resourceVersion as
    /// preconditions: see [`crate::Plan::delete_self`].
    pub fn delete_primary(mut self) -> Self {
        self.delete_primary = true;
        self
    }

    /// Adds a dotted path of the primary that plans may set.
    pub fn primary_field(mut self, path: &str) -> Self {
        self.primary_fields.push(path.to_owned());
        self
    }

    /// Adds an HTTP target.
    pub fn http_target(mut self, id: &str, kind: KindRef, ports: &[u16]) -> Self {
        self.http_targets.push(HttpTarget {
            id: id.to_owned(),
            kind,
            ports: ports.to_vec(),
        });
        self
    }
}

/// What a plugin is and what it reconciles (WIT `manifest`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// Plugin name.
    pub name: String,
    /// Plugin version (semver).
    pub version: String,
    /// One or more controllers.
    pub controllers: Vec<Controller>,
}

impl Manifest {
    /// A manifest with no controllers yet.
    pub fn new(name: &str, version: &str) -> Self {
        Manifest {
            name: name.to_owned(),
            version: version.to_owned(),
            controllers: Vec::new(),
        }
    }

    /// Adds a controller.
    pub fn controller(mut self, controller: Controller) -> Self {
        self.controllers.push(controller);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
    use serde_json::json;

    #[test]
    fn kind_ref_of_reads_group_plural_and_scope_from_k8s_openapi() {
        assert_eq!(
            KindRef::of::<ConfigMap>(),
            KindRef::namespaced("", "v1", "ConfigMap", "configmaps")
        );
        assert_eq!(
            KindRef::of::<Namespace>(),
            KindRef::cluster_scoped("", "v1", "Namespace", "namespaces")
        );
        assert_eq!(
            KindRef::of::<k8s_openapi::api::apps::v1::Deployment>().api_version(),
            "apps/v1"
        );
    }

    #[test]
    fn selector_json_is_camel_case_externally_tagged() {
        assert_eq!(
            serde_json::to_value(Selector::OwnedByPrimary).unwrap(),
            json!("ownedByPrimary")
        );
        assert_eq!(
            serde_json::to_value(Selector::field("spec.instanceRef")).unwrap(),
            json!({"field": {"namePath": "spec.instanceRef", "namespacePath": null}})
        );
        assert_eq!(
            serde_json::to_value(Selector::Labels("app=web".into())).unwrap(),
            json!({"labels": "app=web"})
        );
    }

    #[test]
    fn controller_json_has_every_list() {
        let c = Controller::new("c", KindRef::namespaced("g", "v1", "K", "ks"));
        assert_eq!(
            serde_json::to_value(&c).unwrap(),
            json!({
                "name": "c",
                "primary": {"group": "g", "version": "v1", "kind": "K", "plural": "ks", "namespaced": true},
                "owns": [], "reads": [], "finalizer": null, "writeNamespaces": [],
                "primaryFields": [], "httpTargets": [], "deletePrimary": false
            })
        );
    }

    #[test]
    fn setting_namespaces_and_delete_primary_are_declared_by_builders() {
        let c = Controller::new("c", KindRef::cluster_scoped("g", "v1", "K", "ks"))
            .write_namespace_from_setting("targetNamespace")
            .write_namespace("default-ns")
            .delete_primary();
        assert_eq!(
            c.write_namespaces,
            ["setting:targetNamespace", "default-ns"]
        );
        assert!(c.delete_primary);
    }
}
