//! What a plugin declares about itself: [`Manifest`] and the records inside
//! it. The host reads the manifest once at load, checks it, and enforces it
//! on every plan.
//!
//! Each type has small builder methods so a manifest reads top-down:
//!
//! ```
//! use wasmop_contract::{Controller, KindRef, Manifest, OwnedKind, Read, Selector};
//!
//! let manifest = Manifest::new("engine", "0.1.0").controller(
//!     Controller::new("engine", KindRef::namespaced("firebolt.io", "v1", "FireboltEngine", "fireboltengines"))
//!         .owns(KindRef::namespaced("apps", "v1", "Deployment", "deployments"))
//!         .owns_kind(OwnedKind::label(KindRef::cluster_scoped("example.com", "v1", "Claim", "claims"))
//!             .extra_label("example.com/engine-uid"))
//!         .reads(Read::new(
//!             "instance",
//!             KindRef::namespaced("firebolt.io", "v1", "FireboltInstance", "fireboltinstances"),
//!             Selector::field("spec.instanceRef"),
//!         ))
//!         .finalizer("firebolt.io/engine"),
//! );
//! assert_eq!(manifest.controllers[0].owns[0].kind.kind, "Deployment");
//! ```
//!
//! # JSON shape
//!
//! camelCase fields; every list is always printed. An owned kind is the
//! kind's fields plus `ownership` and `adopt`:
//! `{"group":"","version":"v1","kind":"ConfigMap","plural":"configmaps","namespaced":true,
//! "ownership":"ownerReference","adopt":false}`, or with
//! `"ownership":{"ownerLabel":{"extraLabel":"celld.eric.dev/fleet-uid"}}`.
//! When read, a missing `ownership` is `ownerReference` and a missing
//! `adopt` is `false`. `optional` and `writeNamespaces` (a kind's own,
//! narrower write scope) are printed only when set; missing, they mean what
//! they meant before they existed.

use serde::{Deserialize, Serialize};

use crate::admission::AdmissionRule;

/// A Kubernetes resource type and how it is addressed.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
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
    #[cfg(feature = "k8s")]
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

    /// True when an object with this `apiVersion` and `kind` is of this kind
    /// (group, version and kind all equal).
    pub fn matches(&self, api_version: &str, kind: &str) -> bool {
        self.kind == kind && self.api_version() == api_version
    }

    /// True when `other` names the same resource type regardless of version
    /// (same group and kind).
    pub fn same_type(&self, other: &KindRef) -> bool {
        self.group == other.group && self.kind == other.kind
    }
}

impl std::fmt::Display for KindRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.group.is_empty() {
            write!(f, "{}", self.kind)
        } else {
            write!(f, "{}.{}", self.kind, self.group)
        }
    }
}

/// `(group, version)` of an `apiVersion`: `("apps", "v1")`, `("", "v1")`.
pub fn split_api_version(api_version: &str) -> (&str, &str) {
    match api_version.rsplit_once('/') {
        Some((group, version)) => (group, version),
        None => ("", api_version),
    }
}

/// Names a related object through fields of the primary.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FieldRef {
    /// Dotted path to the string field holding the object's name
    /// (`spec.instanceRef`). A missing or empty field selects nothing.
    pub name_path: String,
    /// Dotted path to the string field holding its namespace; the primary's
    /// namespace when `None` or empty.
    #[serde(default)]
    pub namespace_path: Option<String>,
}

/// How the objects of a read kind are selected for a snapshot.
///
/// JSON: `"ownedByPrimary"`, `{"field":{"namePath":"spec.x","namespacePath":null}}`,
/// `"sameNamespace"`, `"clusterWide"`, `{"labels":"app=web"}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Selector {
    /// Objects the primary owns (controller ownerReference or owner label).
    OwnedByPrimary,
    /// The one object named by a field of the primary.
    Field(FieldRef),
    /// Every object of the kind in the primary's namespace.
    SameNamespace,
    /// Every object of the kind in the cluster.
    ClusterWide,
    /// Objects in the primary's namespace (cluster-wide for a cluster-scoped
    /// primary) matching a label selector in kubectl syntax:
    /// `app=web,tier in (a,b),!legacy`.
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

/// A kind the plugin reads without owning it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Read {
    /// Name under which the objects appear in the snapshot's `related`
    /// list, unique within a controller.
    pub id: String,
    /// The kind read.
    pub kind: KindRef,
    /// Which objects of the kind belong in the snapshot.
    pub selector: Selector,
    /// The kind may not be served (its CRD not installed): the plugin
    /// loads anyway, its reconciles do not wait for this kind, and the
    /// read selects nothing until the kind appears (its watch keeps
    /// retrying). While it is not listed, and no required read or owned
    /// kind names it, each snapshot names it under [`crate::ABSENT_KIND_READ`].
    /// For optional integrations, e.g. another operator's CRD.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub optional: bool,
}

impl Read {
    /// A read with the given id, kind and selector.
    pub fn new(id: &str, kind: KindRef, selector: Selector) -> Self {
        Read {
            id: id.to_owned(),
            kind,
            selector,
            optional: false,
        }
    }

    /// The same read, of a kind that may not be served (see
    /// [`Read::optional`](Read#structfield.optional)).
    #[must_use]
    pub fn optional(mut self) -> Self {
        self.optional = true;
        self
    }
}

/// A network target the plugin may ask the host to call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpTarget {
    /// Name requests use for this target, e.g. `members`.
    pub id: String,
    /// Kind of the addressed objects: Pods or Services the primary owns or
    /// reads.
    pub kind: KindRef,
    /// Ports that may be called.
    pub ports: Vec<u16>,
}

/// How the host marks, recognises and cleans up the objects of an owned
/// kind.
///
/// JSON: `"ownerReference"`, `{"ownerLabel":{"extraLabel":null|"key"}}` or
/// `"dependent"`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Ownership {
    /// The host sets a controller ownerReference to the primary, and
    /// Kubernetes garbage collection deletes the object with it. Allowed
    /// only in the primary's own namespace, or under a cluster-scoped
    /// primary.
    #[default]
    OwnerReference,
    /// The host stamps the label `wasmop.dev/owner-uid=<primary uid>` (and
    /// `extra_label=<primary uid>` when given) and sets no ownerReference:
    /// nothing is garbage-collected; the plugin deletes these objects itself
    /// while its finalizer holds the primary. Works across namespaces and
    /// for cluster-scoped objects of a namespaced primary. A controller
    /// with a label-owned kind must declare a finalizer.
    #[serde(rename_all = "camelCase")]
    OwnerLabel {
        /// A second label key the host sets to the primary's UID, for
        /// tools that know the object by it (celld's
        /// `celld.eric.dev/fleet-uid`).
        #[serde(default)]
        extra_label: Option<String>,
        /// Also gives objects in a namespaced primary's own namespace a
        /// non-controller ownerReference to the primary, so Kubernetes
        /// garbage collection removes them with it even when the finalizer
        /// never runs (for example it was removed by hand). Objects in other
        /// namespaces, and cluster-scoped ones, stay label-only: an
        /// ownerReference cannot cross namespaces.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        collected: bool,
    },
    /// Objects another object of this primary controls: a Pod whose
    /// controller ownerReference is a StatefulSet the primary owns. The plan
    /// may delete such an object (replacing a member), never apply one; it
    /// is judged by its controller ownerReference naming an object in the
    /// primary's `owned` snapshot list. The host neither watches the kind
    /// for it nor lists these objects in `owned`; read them to see them.
    Dependent,
}

/// A kind a controller may create, update and delete.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OwnedKind {
    /// The kind.
    #[serde(flatten)]
    pub kind: KindRef,
    /// How ownership is marked.
    #[serde(default)]
    pub ownership: Ownership,
    /// When true, an existing object of this kind that nothing controls (no
    /// controller ownerReference, no wasmop owner label) is adopted by the
    /// first plan that applies it, with a Normal Event naming it. When false
    /// (the default), an existing object this primary does not control
    /// refuses the whole plan.
    #[serde(default)]
    pub adopt: bool,
    /// When true, the kind's API may be absent (an optional CRD such as
    /// Gateway API's), exactly as for an optional read
    /// ([`Read::optional`](Read#structfield.optional)): the controller loads
    /// and reconciles without waiting for it, each snapshot names it under
    /// [`crate::ABSENT_KIND_READ`] while it is not listed, and its objects
    /// appear once it is. A plan must not apply or delete objects of an
    /// absent kind (the API server would refuse them).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub optional: bool,
    /// Where objects of this kind may be written besides the primary's
    /// namespace: entries as in the controller's
    /// [`Controller::write_namespaces`] (`*`, a namespace,
    /// `setting:<key>`), each of which the controller's list must allow too
    /// (checked at load), so a kind's list only narrows the controller's.
    /// `None` (missing in JSON): the controller's list, as before this
    /// field existed. `Some` of an empty list: the primary's namespace only.
    /// Only for namespaced kinds. See [`Controller::kind_write_namespaces`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_namespaces: Option<Vec<String>>,
}

impl OwnedKind {
    /// An owned kind marked by a controller ownerReference.
    pub fn reference(kind: KindRef) -> Self {
        OwnedKind {
            kind,
            ownership: Ownership::OwnerReference,
            adopt: false,
            optional: false,
            write_namespaces: None,
        }
    }

    /// An owned kind marked by the owner label.
    pub fn label(kind: KindRef) -> Self {
        OwnedKind {
            kind,
            ownership: Ownership::OwnerLabel {
                extra_label: None,
                collected: false,
            },
            adopt: false,
            optional: false,
            write_namespaces: None,
        }
    }

    /// Also stamps `key=<primary uid>` (owner-label kinds only; turns an
    /// owner-reference kind into an owner-label one).
    pub fn extra_label(mut self, key: &str) -> Self {
        let collected = self.is_collected();
        self.ownership = Ownership::OwnerLabel {
            extra_label: Some(key.to_owned()),
            collected,
        };
        self
    }

    /// Owner-label kinds: also garbage-collected with the primary in its
    /// own namespace (see [`Ownership::OwnerLabel`]'s `collected`); turns an
    /// owner-reference kind into an owner-label one.
    pub fn collected(mut self) -> Self {
        let extra_label = self.extra_label_key().map(str::to_owned);
        self.ownership = Ownership::OwnerLabel {
            extra_label,
            collected: true,
        };
        self
    }

    /// Whether objects in the primary's namespace also get a
    /// garbage-collection ownerReference (owner-label kinds only).
    pub fn is_collected(&self) -> bool {
        matches!(
            self.ownership,
            Ownership::OwnerLabel {
                collected: true,
                ..
            }
        )
    }

    /// A kind whose objects the primary's owned objects control (see
    /// [`Ownership::Dependent`]): deletable, never applied.
    pub fn dependent(kind: KindRef) -> Self {
        OwnedKind {
            kind,
            ownership: Ownership::Dependent,
            adopt: false,
            optional: false,
            write_namespaces: None,
        }
    }

    /// Narrows where objects of this kind may be written to the primary's
    /// namespace only (see
    /// [`OwnedKind::write_namespaces`](OwnedKind#structfield.write_namespaces)).
    #[must_use]
    pub fn own_namespace_only(mut self) -> Self {
        self.write_namespaces = Some(Vec::new());
        self
    }

    /// Adds a namespace (`*`: any the controller allows; `setting:<key>`)
    /// where objects of this kind may be written besides the primary's,
    /// narrowing the controller's write namespaces for this kind (see
    /// [`OwnedKind::write_namespaces`](OwnedKind#structfield.write_namespaces)).
    #[must_use]
    pub fn write_namespace(mut self, namespace: &str) -> Self {
        self.write_namespaces
            .get_or_insert_with(Vec::new)
            .push(namespace.to_owned());
        self
    }

    /// True for [`Ownership::Dependent`].
    pub fn is_dependent(&self) -> bool {
        matches!(self.ownership, Ownership::Dependent)
    }

    /// Lets the host adopt orphans of this kind (see [`OwnedKind::adopt`]).
    pub fn adopt_orphans(mut self) -> Self {
        self.adopt = true;
        self
    }

    /// Marks the kind's API as optional (see
    /// [`OwnedKind::optional`](OwnedKind#structfield.optional)).
    #[must_use]
    pub fn optional(mut self) -> Self {
        self.optional = true;
        self
    }

    /// True for [`Ownership::OwnerLabel`].
    pub fn is_label_owned(&self) -> bool {
        matches!(self.ownership, Ownership::OwnerLabel { .. })
    }

    /// The extra owner label key, if any.
    pub fn extra_label_key(&self) -> Option<&str> {
        match &self.ownership {
            Ownership::OwnerLabel { extra_label, .. } => extra_label.as_deref(),
            Ownership::OwnerReference | Ownership::Dependent => None,
        }
    }
}

/// Prefix of a `write-namespaces` entry naming a plugin setting:
/// `setting:targetNamespace`.
pub const SETTING_PREFIX: &str = "setting:";

/// One reconciler inside a plugin: a primary kind and what it touches.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Controller {
    /// Name, unique within the plugin, e.g. `engine`.
    pub name: String,
    /// The kind reconciled. Exactly one loaded controller may claim a kind.
    pub primary: KindRef,
    /// Kinds the controller may create, update and delete.
    pub owns: Vec<OwnedKind>,
    /// Kinds read without owning.
    pub reads: Vec<Read>,
    /// Finalizer the host adds to each primary before the first write and
    /// removes when a plan says cleanup is complete. Required when any
    /// owned kind is label-owned.
    pub finalizer: Option<String>,
    /// Namespaces other than the primary's that owned objects may be
    /// written to (`*` for any; `setting:<key>` for the namespace the
    /// top-level string setting `<key>` names, resolved by the host at
    /// load: a valid namespace name replaces the entry, an absent or null
    /// setting removes it, anything else rejects the load).
    pub write_namespaces: Vec<String>,
    /// Dotted paths of primary fields a plan may set (e.g. `spec.id`).
    /// A path allows that field and everything below it, matched by whole
    /// segments.
    pub primary_fields: Vec<String>,
    /// Targets of HTTP requests.
    pub http_targets: Vec<HttpTarget>,
    /// A plan may delete the primary itself (see `Plan::delete_self`).
    #[serde(default)]
    pub delete_primary: bool,
    /// Whether the controller is called once per primary (the default) or
    /// once for its whole primary kind (see [`Scope::Kind`]). Omitted from
    /// JSON when per object.
    #[serde(default, skip_serializing_if = "Scope::is_object")]
    pub scope: Scope,
}

/// How many primaries one reconcile call covers.
///
/// JSON: `"object"` (the default, also when the field is missing) or
/// `"kind"`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Scope {
    /// One call per primary; the snapshot's `primary` is that object.
    #[default]
    Object,
    /// One debounced call for every primary of the kind at once. The
    /// snapshot's `primary` is a `v1` `List` of all of them (see
    /// [`KIND_SNAPSHOT_KIND`](crate::KIND_SNAPSHOT_KIND)), `owned` holds
    /// what each of them owns, `related` what the reads select for any of
    /// them (each object once), and the plan answers one
    /// [`ObjectPlan`](crate::plan::ObjectPlan) per primary in its
    /// `objects`. The host runs each object plan through the same
    /// validation and execution as a per-object plan, against its own
    /// primary.
    Kind,
}

impl Scope {
    /// True for [`Scope::Object`].
    pub fn is_object(&self) -> bool {
        matches!(self, Scope::Object)
    }
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
            scope: Scope::Object,
        }
    }

    /// Reconciles the whole primary kind in one call (see [`Scope::Kind`]).
    pub fn kind_scope(mut self) -> Self {
        self.scope = Scope::Kind;
        self
    }

    /// Adds an owned kind marked by a controller ownerReference.
    pub fn owns(self, kind: KindRef) -> Self {
        self.owns_kind(OwnedKind::reference(kind))
    }

    /// Adds an owned kind marked by the owner label (and `extra_label` when
    /// given); see [`Ownership::OwnerLabel`].
    pub fn owns_by_label(self, kind: KindRef, extra_label: Option<&str>) -> Self {
        let owned = OwnedKind::label(kind);
        self.owns_kind(match extra_label {
            Some(key) => owned.extra_label(key),
            None => owned,
        })
    }

    /// Owns `kind` by label (as [`Controller::owns_by_label`]) and also
    /// lets garbage collection remove the objects in the primary's own
    /// namespace with it (a non-controller ownerReference).
    pub fn owns_by_label_collected(self, kind: KindRef) -> Self {
        self.owns_kind(OwnedKind::label(kind).collected())
    }

    /// Lets plans delete objects of `kind` that an object this primary owns
    /// controls (the Pods of its StatefulSet); see [`Ownership::Dependent`].
    pub fn deletes_dependents(self, kind: KindRef) -> Self {
        self.owns_kind(OwnedKind::dependent(kind))
    }

    /// Adds an owned kind in its general form.
    pub fn owns_kind(mut self, owned: OwnedKind) -> Self {
        self.owns.push(owned);
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
    /// write namespace (the entry `setting:<key>`). An absent setting
    /// resolves to nothing, so a setting with a default needs the default
    /// added with [`Controller::write_namespace`] too.
    pub fn write_namespace_from_setting(mut self, key: &str) -> Self {
        self.write_namespaces.push(format!("{SETTING_PREFIX}{key}"));
        self
    }

    /// Lets plans delete the primary itself, with its uid and
    /// resourceVersion as preconditions.
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

    /// The owned kind objects with this `apiVersion` and `kind` belong to.
    pub fn owned_kind(&self, api_version: &str, kind: &str) -> Option<&OwnedKind> {
        self.owns.iter().find(|k| k.kind.matches(api_version, kind))
    }

    /// True when any owned kind is label-owned.
    pub fn has_label_owned(&self) -> bool {
        self.owns.iter().any(OwnedKind::is_label_owned)
    }

    /// True when owned objects may be written into `namespace` for a primary
    /// living in `primary_namespace` (`None` for a cluster-scoped primary).
    ///
    /// An unresolved `setting:<key>` entry matches no namespace, so a
    /// manifest that was not resolved fails closed.
    pub fn may_write_namespace(&self, primary_namespace: Option<&str>, namespace: &str) -> bool {
        primary_namespace == Some(namespace)
            || self
                .write_namespaces
                .iter()
                .filter(|allowed| !allowed.starts_with(SETTING_PREFIX))
                .any(|allowed| allowed == "*" || allowed == namespace)
    }

    /// The namespaces besides the primary's where objects of `owned` may be
    /// written (`*`: any), as plan validation enforces them:
    ///
    /// - none for a cluster-scoped kind (its objects have no namespace);
    /// - none for an owner-reference kind of a namespaced primary (an
    ///   ownerReference cannot cross namespaces);
    /// - otherwise the controller's write namespaces, narrowed to the
    ///   kind's own list when it declares one
    ///   ([`OwnedKind::write_namespaces`](OwnedKind#structfield.write_namespaces)):
    ///   an entry of the kind's list counts only where the controller's
    ///   list allows it.
    ///
    /// Unresolved `setting:<key>` entries are left out, so a manifest that
    /// was not resolved fails closed.
    pub fn kind_write_namespaces(&self, owned: &OwnedKind) -> Vec<String> {
        if !owned.kind.namespaced
            || (self.primary.namespaced && owned.ownership == Ownership::OwnerReference)
        {
            return Vec::new();
        }
        let resolved = |list: &[String]| -> Vec<String> {
            list.iter()
                .filter(|n| !n.starts_with(SETTING_PREFIX))
                .cloned()
                .collect()
        };
        let controller = resolved(&self.write_namespaces);
        let Some(kind) = &owned.write_namespaces else {
            return controller;
        };
        let mut out: Vec<String> = Vec::new();
        for entry in resolved(kind) {
            let allowed: Vec<String> = if entry == "*" {
                controller.clone()
            } else if controller.iter().any(|c| c == "*" || *c == entry) {
                vec![entry]
            } else {
                Vec::new()
            };
            for ns in allowed {
                if !out.contains(&ns) {
                    out.push(ns);
                }
            }
        }
        out
    }

    /// True when objects of `owned` may be written into `namespace` for a
    /// primary living in `primary_namespace` (`None` for a cluster-scoped
    /// primary): the primary's namespace, or one of
    /// [`Controller::kind_write_namespaces`].
    pub fn may_write_kind(
        &self,
        owned: &OwnedKind,
        primary_namespace: Option<&str>,
        namespace: &str,
    ) -> bool {
        primary_namespace == Some(namespace)
            || self
                .kind_write_namespaces(owned)
                .iter()
                .any(|allowed| allowed == "*" || allowed == namespace)
    }

    /// Every kind the controller touches: primary, owned, read and HTTP
    /// target kinds, deduplicated, in that order.
    pub fn kinds(&self) -> Vec<&KindRef> {
        let mut out: Vec<&KindRef> = Vec::new();
        let all = std::iter::once(&self.primary)
            .chain(self.owns.iter().map(|o| &o.kind))
            .chain(self.reads.iter().map(|r| &r.kind))
            .chain(self.http_targets.iter().map(|t| &t.kind));
        for kind in all {
            if !out.contains(&kind) {
                out.push(kind);
            }
        }
        out
    }

    /// [`Controller::kinds`] without the optional kinds, those only
    /// optional reads ([`Read::optional`](Read#structfield.optional)) and
    /// optional owned kinds ([`OwnedKind::optional`](OwnedKind#structfield.optional))
    /// name: what must be served for the controller to run.
    pub fn required_kinds(&self) -> Vec<&KindRef> {
        let only_optional = |kind: &KindRef| {
            !std::iter::once(&self.primary)
                .chain(self.owns.iter().filter(|o| !o.optional).map(|o| &o.kind))
                .chain(self.reads.iter().filter(|r| !r.optional).map(|r| &r.kind))
                .chain(self.http_targets.iter().map(|t| &t.kind))
                .any(|k| k.same_type(kind))
        };
        self.kinds()
            .into_iter()
            .filter(|k| !only_optional(k))
            .collect()
    }
}

/// What a plugin is and what it reconciles.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// Plugin name, e.g. `instance`: the field manager suffix and the value
    /// of the `wasmop.dev/plugin` label.
    pub name: String,
    /// Plugin version (semver), shown in logs, metrics and on primaries.
    pub version: String,
    /// One or more controllers.
    pub controllers: Vec<Controller>,
    /// Validating webhooks the plugin decides through its `admit` export
    /// (contract 0.4; only for components of the `admitting-plugin` world).
    /// Missing in JSON reads as none.
    #[serde(default)]
    pub admission: Vec<AdmissionRule>,
}

impl Manifest {
    /// A manifest with no controllers yet.
    pub fn new(name: &str, version: &str) -> Self {
        Manifest {
            name: name.to_owned(),
            version: version.to_owned(),
            controllers: Vec::new(),
            admission: Vec::new(),
        }
    }

    /// Adds an admission rule (the plugin must export `admit`).
    pub fn admission(mut self, rule: AdmissionRule) -> Self {
        self.admission.push(rule);
        self
    }

    /// Adds a controller.
    pub fn controller(mut self, controller: Controller) -> Self {
        self.controllers.push(controller);
        self
    }

    /// The controller called `name`.
    pub fn controller_named(&self, name: &str) -> Option<&Controller> {
        self.controllers.iter().find(|c| c.name == name)
    }

    /// The controller whose primary kind matches an object's `apiVersion`
    /// and `kind` (group and kind compared; the version may differ).
    pub fn controller_for(&self, api_version: &str, kind: &str) -> Option<&Controller> {
        let (group, _) = split_api_version(api_version);
        self.controllers
            .iter()
            .find(|c| c.primary.kind == kind && c.primary.group == group)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

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
    fn optional_reads_and_owned_kinds_are_not_required() {
        let route =
            KindRef::namespaced("gateway.networking.k8s.io", "v1", "HTTPRoute", "httproutes");
        let policy = KindRef::namespaced("security.istio.io", "v1", "AuthorizationPolicy", "aps");
        let cm = KindRef::namespaced("", "v1", "ConfigMap", "configmaps");
        let c = Controller::new("c", KindRef::namespaced("g", "v1", "K", "ks"))
            .owns(cm.clone())
            .owns_kind(OwnedKind::label(route.clone()).optional())
            .reads(Read::new("policies", policy.clone(), Selector::SameNamespace).optional());
        let v = serde_json::to_value(&c).unwrap();
        assert_eq!(v["owns"][1]["optional"], true);
        assert!(
            v["owns"][0].get("optional").is_none(),
            "false is not written"
        );
        let required = c.required_kinds();
        assert!(required.contains(&&cm));
        assert!(!required.contains(&&route));
        assert!(!required.contains(&&policy));
        // A kind a required read also names is required.
        let c = c.reads(Read::new("routes", route.clone(), Selector::SameNamespace));
        assert!(c.required_kinds().contains(&&route));
        // An older manifest without the field means "required".
        let old: OwnedKind = serde_json::from_value(json!({
            "group": "", "version": "v1", "kind": "ConfigMap", "plural": "configmaps",
            "namespaced": true, "ownership": "ownerReference", "adopt": false}))
        .unwrap();
        assert!(!old.optional);
    }

    #[test]
    fn owned_kinds_flatten_the_kind_and_name_their_ownership() {
        let c = Controller::new("c", KindRef::namespaced("g", "v1", "K", "ks"))
            .owns(KindRef::namespaced("", "v1", "ConfigMap", "configmaps"))
            .owns_by_label(
                KindRef::cluster_scoped("g", "v1", "Claim", "claims"),
                Some("g/owner"),
            );
        let v = serde_json::to_value(&c).unwrap();
        assert_eq!(
            v["owns"][0],
            json!({"group": "", "version": "v1", "kind": "ConfigMap", "plural": "configmaps",
                   "namespaced": true, "ownership": "ownerReference", "adopt": false})
        );
        assert_eq!(
            v["owns"][1]["ownership"],
            json!({"ownerLabel": {"extraLabel": "g/owner"}})
        );
        let back: Controller = serde_json::from_value(v).unwrap();
        assert_eq!(back, c);
        assert!(back.has_label_owned());
        assert_eq!(back.owns[1].extra_label_key(), Some("g/owner"));
    }

    #[test]
    fn an_owned_kind_without_ownership_reads_as_owner_reference() {
        let owned: OwnedKind = serde_json::from_value(json!({
            "group": "", "version": "v1", "kind": "ConfigMap", "plural": "configmaps", "namespaced": true
        }))
        .unwrap();
        assert_eq!(owned.ownership, Ownership::OwnerReference);
        assert!(!owned.adopt);
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
        // Unresolved setting entries match nothing.
        assert!(!c.may_write_namespace(None, "targetNamespace"));
        assert!(c.may_write_namespace(None, "default-ns"));
    }

    #[cfg(feature = "k8s")]
    #[test]
    fn kind_ref_of_reads_group_plural_and_scope_from_k8s_openapi() {
        use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
        assert_eq!(
            KindRef::of::<ConfigMap>(),
            KindRef::namespaced("", "v1", "ConfigMap", "configmaps")
        );
        assert_eq!(
            KindRef::of::<Namespace>(),
            KindRef::cluster_scoped("", "v1", "Namespace", "namespaces")
        );
    }

    fn secret() -> KindRef {
        KindRef::namespaced("", "v1", "Secret", "secrets")
    }

    fn deployment() -> KindRef {
        KindRef::namespaced("apps", "v1", "Deployment", "deployments")
    }

    #[test]
    fn a_kinds_write_namespaces_narrow_the_controllers_and_old_manifests_keep_theirs() {
        let c = Controller::new("c", KindRef::namespaced("g", "v1", "K", "ks"))
            .owns_kind(OwnedKind::label(deployment()).own_namespace_only())
            .owns_kind(OwnedKind::label(secret()).write_namespace("*"))
            .owns_kind(OwnedKind::label(KindRef::namespaced(
                "",
                "v1",
                "ConfigMap",
                "cms",
            )))
            .write_namespace("*");
        let (deploy, secrets, cms) = (&c.owns[0], &c.owns[1], &c.owns[2]);
        assert!(c.kind_write_namespaces(deploy).is_empty());
        assert!(c.may_write_kind(deploy, Some("own"), "own"));
        assert!(!c.may_write_kind(deploy, Some("own"), "other"));
        // A cluster-scoped primary has no namespace of its own to alias.
        assert!(!c.may_write_kind(deploy, None, "own"));
        assert_eq!(c.kind_write_namespaces(secrets), ["*"]);
        assert!(c.may_write_kind(secrets, Some("own"), "other"));
        // Without a list of its own, a kind has the controller's.
        assert_eq!(c.kind_write_namespaces(cms), ["*"]);
        let v = serde_json::to_value(&c).unwrap();
        assert_eq!(v["owns"][0]["writeNamespaces"], json!([]));
        assert_eq!(v["owns"][1]["writeNamespaces"], json!(["*"]));
        assert!(
            v["owns"][2].get("writeNamespaces").is_none(),
            "None is not written"
        );
        let back: Controller = serde_json::from_value(v).unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn a_kind_cannot_widen_the_controllers_write_namespaces() {
        let c = Controller::new("c", KindRef::namespaced("g", "v1", "K", "ks"))
            .owns_kind(OwnedKind::label(secret()).write_namespace("*"))
            .owns_kind(
                OwnedKind::label(deployment())
                    .write_namespace("b")
                    .write_namespace("setting:x"),
            )
            .write_namespace("a");
        // `*` of the kind is the controller's list; `b` is not in it.
        assert_eq!(c.kind_write_namespaces(&c.owns[0]), ["a"]);
        assert!(c.kind_write_namespaces(&c.owns[1]).is_empty());
        assert!(!c.may_write_kind(&c.owns[1], Some("own"), "b"));
        assert!(!c.may_write_kind(&c.owns[0], Some("own"), "b"));
    }

    #[test]
    fn owner_reference_and_cluster_scoped_kinds_write_nowhere_else() {
        let c = Controller::new("c", KindRef::namespaced("g", "v1", "K", "ks"))
            .owns(deployment())
            .owns_by_label(KindRef::cluster_scoped("g", "v1", "Claim", "claims"), None)
            .write_namespace("*");
        assert!(c.kind_write_namespaces(&c.owns[0]).is_empty());
        assert!(!c.may_write_kind(&c.owns[0], Some("own"), "other"));
        assert!(c.kind_write_namespaces(&c.owns[1]).is_empty());
        // Under a cluster-scoped primary an owner reference works anywhere.
        let c = Controller::new("c", KindRef::cluster_scoped("g", "v1", "K", "ks"))
            .owns(deployment())
            .write_namespace("x");
        assert_eq!(c.kind_write_namespaces(&c.owns[0]), ["x"]);
    }
}
