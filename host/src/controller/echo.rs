//! Echoes: the watch events of the operator's own writes.
//!
//! Every write a plan makes (an apply or create of an owned object, a patch
//! of the primary's fields or finalizers) comes back as a watch event, and
//! that event routes to the primary whose plan made it. The primary must be
//! reconciled again — the plugin has to see what its write produced (a
//! defaulted field, a server-assigned value) — but nothing about it is
//! urgent while other primaries wait for their first reconcile of a change.
//!
//! [`Echoes`] keeps, per object, the resourceVersion the API server
//! answered to the host's last write of it and the primary that wrote it.
//! When a change of that object arrives with exactly that resourceVersion,
//! the change is the echo of that write, and the router re-queues the
//! writing primary with [`super::queue::Queue::add_echo`] (behind the
//! foreground) instead of [`super::queue::Queue::add`]. Nothing is skipped:
//! the primary is still reconciled. Everything else about the change is
//! routed as usual (other primaries that read the object are re-queued in
//! the foreground), and any other change of the object — someone else's
//! write, a deletion, a relist — is no echo.
//!
//! An entry lives until the next change of its object arrives (matching or
//! not) or the host writes the object again; a write the API server
//! answered without a change (no new resourceVersion, so no event) leaves
//! its entry until then. So there is at most one entry per object the
//! host has written and that still exists.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::controller::PrimaryKey;
use crate::execute::WriteLog;
use crate::plugin::manifest::KindRef;
use crate::watch::cache::{Change, KindKey};

use super::route::kind_key;

/// (kind, namespace, name) of a written object.
type Written = (KindKey, String, String);

/// The host's own writes whose watch events have not arrived yet.
#[derive(Debug, Default)]
pub(crate) struct Echoes {
    writes: Mutex<HashMap<Written, (String, PrimaryKey)>>,
}

impl Echoes {
    /// Records that `primary`'s plan wrote the object, which the API server
    /// answered with `resource_version`.
    pub(crate) fn wrote(
        &self,
        kind: KindKey,
        namespace: &str,
        name: &str,
        resource_version: &str,
        primary: &PrimaryKey,
    ) {
        if resource_version.is_empty() {
            return;
        }
        self.writes.lock().expect("echoes lock").insert(
            (kind, namespace.to_owned(), name.to_owned()),
            (resource_version.to_owned(), primary.clone()),
        );
    }

    /// The primary whose own write `change` is the echo of, if it is one.
    /// Any change of a recorded object forgets its entry.
    pub(crate) fn take(&self, change: &Change) -> Option<PrimaryKey> {
        let object = change.new.as_ref().or(change.old.as_ref())?;
        let mut writes = self.writes.lock().expect("echoes lock");
        if writes.is_empty() {
            return None;
        }
        let id = (
            change.kind.clone(),
            object.namespace().to_owned(),
            object.name().to_owned(),
        );
        let (resource_version, primary) = writes.remove(&id)?;
        let new = change.new.as_ref()?;
        (new.resource_version() == resource_version).then_some(primary)
    }

    /// Objects written whose change has not arrived.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.writes.lock().expect("echoes lock").len()
    }
}

/// [`Echoes`] bound to the primary whose plan is being executed.
pub(crate) struct EchoLog<'a> {
    pub(crate) echoes: &'a Echoes,
    pub(crate) primary: &'a PrimaryKey,
}

impl WriteLog for EchoLog<'_> {
    fn wrote(&self, kind: &KindRef, namespace: &str, name: &str, resource_version: &str) {
        self.echoes.wrote(
            kind_key(kind),
            if kind.namespaced { namespace } else { "" },
            name,
            resource_version,
            self.primary,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watch::cache::CachedObject;
    use serde_json::json;
    use std::sync::Arc;

    fn cm(name: &str, rv: &str) -> Arc<CachedObject> {
        Arc::new(CachedObject::from_value(&json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"namespace": "ns", "name": name, "uid": format!("u-{name}"), "resourceVersion": rv},
        })))
    }

    fn change(old: Option<Arc<CachedObject>>, new: Option<Arc<CachedObject>>) -> Change {
        Change {
            kind: KindKey::new("", "v1", "ConfigMap"),
            old,
            new,
        }
    }

    fn key(name: &str) -> PrimaryKey {
        PrimaryKey {
            controller: Arc::from("good/widgets"),
            namespace: "ns".into(),
            name: name.into(),
        }
    }

    fn cm_kind() -> KindRef {
        KindRef {
            group: String::new(),
            version: "v1".into(),
            kind: "ConfigMap".into(),
            plural: "configmaps".into(),
            namespaced: true,
        }
    }

    #[test]
    fn only_the_event_with_the_written_version_is_an_echo_and_each_is_taken_once() {
        let echoes = Echoes::default();
        let log = EchoLog {
            echoes: &echoes,
            primary: &key("w1"),
        };
        log.wrote(&cm_kind(), "ns", "a", "10");
        log.wrote(&cm_kind(), "ns", "b", "11");
        // An object nobody wrote: no echo, nothing forgotten.
        assert_eq!(echoes.take(&change(None, Some(cm("c", "12")))), None);
        assert_eq!(echoes.len(), 2);
        // The echo of the write to a.
        assert_eq!(
            echoes.take(&change(Some(cm("a", "9")), Some(cm("a", "10")))),
            Some(key("w1"))
        );
        // The same version again (a relist replaying it): no longer an echo.
        assert_eq!(
            echoes.take(&change(Some(cm("a", "10")), Some(cm("a", "10")))),
            None
        );
        // Someone else's write to b arrives first: not an echo, and the
        // entry is gone, so b's later events are not echoes either.
        assert_eq!(
            echoes.take(&change(Some(cm("b", "9")), Some(cm("b", "13")))),
            None
        );
        assert_eq!(echoes.len(), 0);
        // A deletion of a written object is no echo and forgets it.
        log.wrote(&cm_kind(), "ns", "a", "20");
        assert_eq!(echoes.take(&change(Some(cm("a", "20")), None)), None);
        assert_eq!(echoes.len(), 0);
        // A write without a version (dry run answers, odd servers) is not
        // recorded.
        log.wrote(&cm_kind(), "ns", "a", "");
        assert_eq!(echoes.len(), 0);
    }

    /// Primary `primary`'s plan wrote ConfigMap `name`, answered `rv`.
    fn wrote(echoes: &Echoes, primary: &str, name: &str, rv: &str) {
        EchoLog {
            echoes,
            primary: &key(primary),
        }
        .wrote(&cm_kind(), "ns", name, rv);
    }

    #[test]
    fn the_last_write_of_an_object_names_the_primary_of_its_echo() {
        let echoes = Echoes::default();
        wrote(&echoes, "w1", "a", "10");
        wrote(&echoes, "w2", "a", "11");
        assert_eq!(
            echoes.take(&change(None, Some(cm("a", "10")))),
            None,
            "the first write's version is superseded"
        );
        wrote(&echoes, "w2", "a", "12");
        assert_eq!(
            echoes.take(&change(None, Some(cm("a", "12")))),
            Some(key("w2"))
        );
    }
}
