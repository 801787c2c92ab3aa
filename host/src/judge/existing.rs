//! What validation knows about objects that already exist: [`ExistingObject`]
//! (UID, controller, owner label, resourceVersion) and the [`ExistingLookup`]
//! seam that answers for them — the snapshot's source offline, the cache
//! backed by API reads live (`controller::truth`).
//!
//! It sits below both [`crate::judge::snapshot`] (whose every
//! [`ObjectSource`](crate::judge::snapshot::ObjectSource) is a lookup)
//! and [`crate::judge::validate`] (which asks it), and imports neither.

use serde_json::Value;

use crate::contract::manifest::{KindRef, Ownership};
use crate::object;
use wasmop_contract::OWNER_UID_LABEL;

/// The label a person sets (`true`) on an object no plan may delete. Plugins
/// may not set it: protection is a person's decision, not the plugin's.
pub const PROTECTED_LABEL: &str = "wasmop.dev/protected";

/// What the validator needs to know about an object that already exists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExistingObject {
    /// Its `metadata.uid`.
    pub uid: String,
    /// The UID of its controller ownerReference, if it has one.
    pub controller_uid: Option<String>,
    /// The value of its `wasmop.dev/owner-uid` label, if it has one.
    pub owner_label: Option<String>,
    /// Its `metadata.resourceVersion`: the version the plan was judged at,
    /// which the write then carries as its precondition.
    pub resource_version: String,
    /// It carries `wasmop.dev/protected=true`: no plan deletes it.
    pub protected: bool,
}

impl ExistingObject {
    /// What an object as JSON says about its control.
    pub fn of(obj: &Value) -> Self {
        ExistingObject {
            uid: object::uid(obj).to_owned(),
            controller_uid: object::controller_uid(obj).map(str::to_owned),
            owner_label: object::labels(obj).remove(OWNER_UID_LABEL),
            resource_version: object::resource_version(obj).to_owned(),
            protected: object::labels_get(obj, PROTECTED_LABEL) == Some("true"),
        }
    }

    /// True when neither an ownerReference controller nor a wasmop owner
    /// label claims the object.
    pub fn is_orphan(&self) -> bool {
        self.controller_uid.is_none() && self.owner_label.is_none()
    }

    /// True when `primary_uid` controls the object under `ownership`: the
    /// controller ownerReference for [`Ownership::OwnerReference`], the owner
    /// label (and no other controller) for [`Ownership::OwnerLabel`]; never
    /// for [`Ownership::Dependent`] (those are controlled by an owned
    /// object, not by the primary).
    pub fn is_controlled_by(&self, primary_uid: &str, ownership: &Ownership) -> bool {
        match ownership {
            Ownership::OwnerReference => self.controller_uid.as_deref() == Some(primary_uid),
            Ownership::Dependent => false,
            Ownership::OwnerLabel { .. } => {
                self.owner_label.as_deref() == Some(primary_uid)
                    && self
                        .controller_uid
                        .as_deref()
                        .is_none_or(|c| c == primary_uid)
            }
        }
    }
}

/// What a lookup answers for an object about to be created.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BeforeCreate {
    /// It exists.
    Exists(ExistingObject),
    /// It does not exist (as far as the lookup can tell).
    Absent,
    /// The lookup does not hold it and did not ask further: absent, unless
    /// the fenced write finds it (a conflict).
    Unasked,
}

/// Answers "does this object exist, and who controls it" for [`validate`](crate::judge::validate::validate).
///
/// Implemented for every [`crate::ObjectSource`], so the offline CLI's
/// `MemorySource` and the live watch cache both answer it.
pub trait ExistingLookup {
    /// The object of `kind` at `namespace`/`name`, if it exists.
    fn existing(
        &self,
        kind: &KindRef,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<ExistingObject>;

    /// The object of `kind` at `namespace`/`name` as an apply of it is
    /// judged, when the write will be fenced to fail should the object
    /// exist after all ([`crate::execute::writer::Fence::ABSENT`] or a
    /// create): a lookup may then answer [`BeforeCreate::Unasked`] for an
    /// object it does not hold, without asking further. The default asks
    /// [`Self::existing`].
    fn existing_before_create(
        &self,
        kind: &KindRef,
        namespace: Option<&str>,
        name: &str,
    ) -> BeforeCreate {
        match self.existing(kind, namespace, name) {
            Some(found) => BeforeCreate::Exists(found),
            None => BeforeCreate::Absent,
        }
    }
}
