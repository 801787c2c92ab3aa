//! Ownership: whose objects a plan may write or delete. An applied object
//! does not exist, is controlled by this primary, or is an orphan of a kind
//! the controller adopts; a deleted object exists, is this primary's (or,
//! for a dependent kind, an owned object's) and has the uid the plan names;
//! the primary itself is deleted only under `delete-primary`; nothing
//! labelled [`PROTECTED_LABEL`] is deleted.

use serde_json::Value;

use super::{
    ApplyJudgement, BeforeCreate, DeleteOp, Judged, ObjectRef, Precondition, Rule, Validator,
};
use crate::contract::manifest::{Controller, Ownership, split_api_version};
use crate::object;

pub use crate::judge::existing::PROTECTED_LABEL;

/// True when `target` names the primary object (apiVersion, kind, namespace
/// and name; the namespace only for a namespaced primary).
pub fn is_primary(target: &ObjectRef, controller: &Controller, primary: &Value) -> bool {
    let namespace = if controller.primary.namespaced {
        object::namespace(primary).unwrap_or_default()
    } else {
        ""
    };
    target.api_version == object::api_version(primary)
        && target.kind == object::kind(primary)
        && target.namespace == namespace
        && target.name == object::name(primary)
}

impl Validator<'_> {
    pub(super) fn apply(
        &mut self,
        obj: &Value,
        precondition: Option<&Precondition>,
    ) -> ApplyJudgement {
        if !self.apply_fields(obj) {
            return ApplyJudgement::default();
        }
        let desc = object::describe(obj);
        let (api_version, kind, namespace, name) = (
            object::api_version(obj),
            object::kind(obj),
            object::namespace(obj),
            object::name(obj),
        );
        let Some(owned) = self.target(api_version, kind, namespace, name, "object") else {
            return ApplyJudgement::default();
        };
        if owned.is_dependent() {
            self.push(
                Rule::KindNotOwned,
                desc,
                format!(
                    "{} is a dependent kind of controller {}: a plan may delete objects that its \
                     owned objects control, never apply one",
                    owned.kind, self.controller.name
                ),
            );
            return ApplyJudgement::default();
        }
        // An object the lookup does not hold may be judged absent without
        // asking further only when the write fails should it exist: a
        // create, or an apply fenced as absent. An apply that carries the
        // plugin's resourceVersion would succeed on any object at that
        // version, so its object is always looked up.
        let fenced_as_absent = matches!(precondition, None | Some(Precondition::Absent));
        let found = if fenced_as_absent {
            match self
                .existing
                .existing_before_create(&owned.kind, namespace, name)
            {
                BeforeCreate::Exists(found) => Some(found),
                BeforeCreate::Absent => None,
                BeforeCreate::Unasked => {
                    return ApplyJudgement {
                        unasked: true,
                        ..ApplyJudgement::default()
                    };
                }
            }
        } else {
            self.existing.existing(&owned.kind, namespace, name)
        };
        let Some(found) = found else {
            return ApplyJudgement::default();
        };
        let judged = ApplyJudgement {
            existing: Some(Judged {
                uid: found.uid.clone(),
                resource_version: found.resource_version.clone(),
            }),
            adopts: false,
            unasked: false,
        };
        if found.is_controlled_by(self.primary_uid, &owned.ownership) {
            return judged;
        }
        if found.is_orphan() && owned.adopt {
            return ApplyJudgement {
                adopts: true,
                ..judged
            };
        }
        let message = match (&found.controller_uid, &found.owner_label) {
            (Some(other), _) if other != self.primary_uid => {
                format!("exists and is controlled by another owner (uid {other})")
            }
            (_, Some(other)) if other != self.primary_uid => {
                format!("exists and is owned by label by another primary (uid {other})")
            }
            (None, None) => format!(
                "exists and nothing controls it; controller {} does not declare adoption of {}, \
                 so it is left alone",
                self.controller.name, owned.kind
            ),
            _ => format!(
                "exists and is not marked as this primary's the way {} is owned ({})",
                owned.kind,
                ownership_name(&owned.ownership)
            ),
        };
        self.push(Rule::NotControlledByPrimary, desc, message);
        judged
    }

    pub(super) fn delete(&mut self, op: &DeleteOp) {
        let t = &op.target;
        let namespace = Some(t.namespace.as_str()).filter(|ns| !ns.is_empty());
        let desc = t.to_string();
        let Some(owned) = self.target(&t.api_version, &t.kind, namespace, &t.name, "delete") else {
            return;
        };
        match self.existing.existing(&owned.kind, namespace, &t.name) {
            None => self.push(
                Rule::DeleteTargetMissing,
                desc,
                "the object to delete does not exist".to_owned(),
            ),
            Some(found) if found.protected => self.push(
                Rule::ProtectedObject,
                desc,
                format!(
                    "the object is labelled {PROTECTED_LABEL}=true, so no plan deletes it; \
                     remove the label to let this plan proceed"
                ),
            ),
            Some(found) if owned.is_dependent() => {
                let by_owned = found
                    .controller_uid
                    .as_deref()
                    .is_some_and(|c| self.owned_uids.contains(c));
                if !by_owned {
                    self.push(
                        Rule::NotControlledByPrimary,
                        desc.clone(),
                        match &found.controller_uid {
                            Some(c) => format!(
                                "the object to delete is controlled by uid {c}, which is not an \
                                 object this primary owns"
                            ),
                            None => "the object to delete has no controller; only objects this \
                                     primary's owned objects control may be deleted"
                                .to_owned(),
                        },
                    );
                } else if found.uid != op.uid {
                    self.push(
                        Rule::UidMismatch,
                        desc,
                        format!(
                            "the delete names uid {:?} but the object has uid {:?}",
                            op.uid, found.uid
                        ),
                    );
                }
            }
            Some(found) if !found.is_controlled_by(self.primary_uid, &owned.ownership) => self
                .push(
                    Rule::NotControlledByPrimary,
                    desc,
                    "the object to delete is not controlled by this primary".to_owned(),
                ),
            Some(found) if found.uid != op.uid => self.push(
                Rule::UidMismatch,
                desc,
                format!(
                    "the delete names uid {:?} but the object has uid {:?}",
                    op.uid, found.uid
                ),
            ),
            Some(_) => {}
        }
    }

    /// A delete of the primary itself: allowed only under `delete-primary`,
    /// with the primary's uid, once, and not next to a `primaryPatch`.
    pub(super) fn delete_primary(&mut self, op: &DeleteOp, patched: bool) {
        let desc = op.target.to_string();
        if self.primary_protected {
            self.push(
                Rule::ProtectedObject,
                desc.clone(),
                format!(
                    "the primary is labelled {PROTECTED_LABEL}=true, so no plan deletes it; \
                     remove the label to let this plan proceed"
                ),
            );
        }
        if !self.controller.delete_primary {
            self.push(
                Rule::KindNotOwned,
                desc,
                format!(
                    "the delete names the primary itself, and controller {} does not declare delete-primary",
                    self.controller.name
                ),
            );
            return;
        }
        if op.uid != self.primary_uid {
            self.push(
                Rule::UidMismatch,
                desc.clone(),
                format!(
                    "the delete names uid {:?} but the primary has uid {:?}",
                    op.uid, self.primary_uid
                ),
            );
        }
        let (group, _) = split_api_version(&op.target.api_version);
        let key = (
            group.to_owned(),
            op.target.kind.clone(),
            op.target.namespace.clone(),
            op.target.name.clone(),
        );
        if !self.seen.insert(key) {
            self.push(
                Rule::DuplicateTarget,
                desc.clone(),
                "the plan targets this object more than once".to_owned(),
            );
        }
        if patched {
            self.push(
                Rule::DuplicateTarget,
                desc,
                "the plan deletes the primary and also sets primaryPatch".to_owned(),
            );
        }
    }
}

/// `owner-reference` or `owner-label`, as the manifest docs name them.
fn ownership_name(ownership: &Ownership) -> &'static str {
    match ownership {
        Ownership::OwnerReference => "owner-reference",
        Ownership::OwnerLabel { .. } => "owner-label",
        Ownership::Dependent => "dependent",
    }
}
