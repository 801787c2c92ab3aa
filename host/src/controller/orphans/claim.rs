//! Which objects are orphan candidates, judged from the object alone:
//! the control it carries ([`Claim`]: a controller ownerReference or the
//! owner label), whether it sits where its controller writes its kind, and
//! which refused applies of a plan are only foreign control.
//!
//! # Guarantees
//! - Pure judgement, no I/O: an object without the plugin's labels, a
//!   protected one, one of a kind the controller does not own, or one
//!   controlled by another kind is never a candidate.
//! - A list proves an owner gone only if it is at least as new as the
//!   object ([`not_older`]).

use serde_json::Value;

use crate::contract::manifest::{Controller, KindRef, Ownership};
use crate::judge::validate::{
    MANAGED_BY_LABEL, MANAGED_BY_VALUE, OWNER_UID_LABEL, PLUGIN_LABEL, PROTECTED_LABEL, Plan, Rule,
    Violation,
};
use crate::object;

/// True when a list at `list_version` cannot predate an object at
/// `object_version`: both are the API server's (etcd) revisions and the
/// list's is not older. Versions that are not numbers prove nothing.
pub(super) fn not_older(list_version: &str, object_version: &str) -> bool {
    match (list_version.parse::<u64>(), object_version.parse::<u64>()) {
        (Ok(list), Ok(object)) => list >= object,
        _ => false,
    }
}

/// Whether `plugin`'s controllers may write an object like `obj` where it
/// is, for the owner `claim` names: collection is only for objects that a
/// plan of theirs could have written there. `watched` tells whether a
/// namespace is one the operator watches (where its primaries may live).
///
/// - A cluster-scoped object: yes.
/// - Controlled by an ownerReference: the owner lives in the object's
///   namespace (a namespaced primary, in a watched namespace) or, for a
///   cluster-scoped primary, the namespace is one the controller declares
///   for the kind (`writeNamespaces`).
/// - Owned by label: the namespace is one the controller declares for the
///   kind, or the object names its owner by an ownerReference too (the
///   `owns_by_label_collected` kinds, in the primary's own namespace),
///   a namespaced primary in a watched namespace. A label alone does not
///   say which namespace its owner lived in.
///
/// Pure: no reads.
pub(crate) fn collectable_where_it_is(
    obj: &Value,
    claim: &Claim,
    controllers: &[&Controller],
    watched: &dyn Fn(&str) -> bool,
) -> Result<(), &'static str> {
    let Some(ns) = object::namespace(obj).filter(|n| !n.is_empty()) else {
        return Ok(());
    };
    let (api_version, kind) = (object::api_version(obj), object::kind(obj));
    let names_owner = |uid: &str| {
        obj["metadata"]["ownerReferences"]
            .as_array()
            .is_some_and(|refs| refs.iter().any(|r| r["uid"].as_str() == Some(uid)))
    };
    let allowed = controllers.iter().any(|c| {
        let Some(owned) = c
            .owned_kind(api_version, kind)
            .filter(|o| !o.is_dependent())
        else {
            return false;
        };
        match claim {
            Claim::Reference { kind: primary, .. } => {
                matches!(owned.ownership, Ownership::OwnerReference)
                    && c.primary.same_type(primary)
                    && if c.primary.namespaced {
                        watched(ns)
                    } else {
                        c.may_write_kind(owned, None, ns)
                    }
            }
            Claim::Label { kinds, uid } => {
                matches!(owned.ownership, Ownership::OwnerLabel { .. })
                    && kinds.iter().any(|k| k.same_type(&c.primary))
                    && (c.may_write_kind(owned, None, ns)
                        || (c.primary.namespaced && watched(ns) && names_owner(uid)))
            }
        }
    });
    if allowed {
        Ok(())
    } else {
        Err(
            "it is in a namespace where the plugin's controllers do not write its kind for such an owner",
        )
    }
}

/// Who an object says controls it, as far as collection is concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Claim {
    /// A controller ownerReference to an object of the primary kind `kind`.
    Reference {
        /// The primary kind the reference names.
        kind: KindRef,
        /// The owner's namespace (the object's, for a namespaced primary).
        namespace: Option<String>,
        /// The owner's name.
        name: String,
        /// The owner's UID.
        uid: String,
    },
    /// The owner label, for a kind owned by label: the owner is an object
    /// of one of `kinds` with this UID.
    Label {
        /// The primary kinds the owner may be of.
        kinds: Vec<KindRef>,
        /// The owner's UID.
        uid: String,
    },
}

impl Claim {
    pub(super) fn describe(&self) -> String {
        match self {
            Claim::Reference {
                kind,
                namespace,
                name,
                uid,
            } => format!(
                "{} (uid {uid})",
                object::describe_parts(&kind.kind, namespace.as_deref(), name)
            ),
            Claim::Label { kinds, uid } => {
                let kinds: Vec<&str> = kinds.iter().map(|k| k.kind.as_str()).collect();
                format!("the {} with uid {uid}", kinds.join(" or "))
            }
        }
    }
}

/// Whether `obj` (as read from the API server) is of the kind a collection
/// may consider for `plugin`: its labels, its kind among what `controllers`
/// own, not protected, and controlled in the way the kind is owned. Returns
/// the claim whose owner must then be found gone, or why it is left alone.
///
/// `controllers` are the running controllers of `plugin`; only those that
/// own the object's kind count. Pure: no reads.
pub(crate) fn claim_of(
    obj: &Value,
    plugin: &str,
    controllers: &[&Controller],
) -> Result<Claim, &'static str> {
    let labels = object::labels(obj);
    if labels.get(MANAGED_BY_LABEL).map(String::as_str) != Some(MANAGED_BY_VALUE)
        || labels.get(PLUGIN_LABEL).map(String::as_str) != Some(plugin)
    {
        return Err("it does not carry this plugin's labels");
    }
    if labels.get(PROTECTED_LABEL).map(String::as_str) == Some("true") {
        return Err("it is protected");
    }
    let (api_version, kind) = (object::api_version(obj), object::kind(obj));
    let owning: Vec<(&Controller, &Ownership)> = controllers
        .iter()
        .filter_map(|c| {
            c.owned_kind(api_version, kind)
                .filter(|o| !o.is_dependent())
                .map(|o| (*c, &o.ownership))
        })
        .collect();
    if owning.is_empty() {
        return Err("its kind is not owned by the plugin's controllers");
    }
    if let Some(r) = object::controller_ref(obj) {
        let text = |k: &str| r.get(k).and_then(Value::as_str).unwrap_or_default();
        let (ref_version, ref_kind) = (text("apiVersion"), text("kind"));
        let Some((c, _)) = owning.iter().find(|(c, ownership)| {
            matches!(ownership, Ownership::OwnerReference)
                && c.primary.matches(ref_version, ref_kind)
        }) else {
            return Err("its controller is not of a primary kind that owns it by reference");
        };
        if text("uid").is_empty() || text("name").is_empty() {
            return Err("its controller reference names no uid or name");
        }
        return Ok(Claim::Reference {
            kind: c.primary.clone(),
            namespace: if c.primary.namespaced {
                object::namespace(obj).map(str::to_owned)
            } else {
                None
            },
            name: text("name").to_owned(),
            uid: text("uid").to_owned(),
        });
    }
    let Some(uid) = labels.get(OWNER_UID_LABEL).filter(|u| !u.is_empty()) else {
        return Err("nothing controls it");
    };
    let mut kinds: Vec<KindRef> = Vec::new();
    for (c, ownership) in &owning {
        if matches!(ownership, Ownership::OwnerLabel { .. })
            && !kinds.iter().any(|k| k.same_type(&c.primary))
        {
            kinds.push(c.primary.clone());
        }
    }
    if kinds.is_empty() {
        return Err("it is owned by label, and no controller owns its kind by label");
    }
    Ok(Claim::Label {
        kinds,
        uid: uid.clone(),
    })
}

/// The objects of a refused plan that collection may help: when every
/// violation is `NotControlledByPrimary` on an object the plan applies,
/// those objects (as the plan named them); otherwise none.
pub(crate) fn refused_applies<'p>(plan: &'p Plan, violations: &[Violation]) -> Vec<&'p Value> {
    let mut out = Vec::new();
    for v in violations {
        if v.rule != Rule::NotControlledByPrimary {
            return Vec::new();
        }
        match plan
            .apply
            .iter()
            .find(|op| object::describe(&op.object) == v.object)
        {
            Some(op) => out.push(&op.object),
            None => return Vec::new(),
        }
    }
    out
}
