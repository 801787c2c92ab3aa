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
//! A change can also arrive while the write is still in flight: the API
//! server sends the watch event before the worker has read the write's
//! answer. [`Echoes::writing`] records the write before its request is
//! sent; a change of the object that the router would send to the writing
//! primary in that window is held ([`Seen::Held`]) rather than queued, and
//! settled when the answer comes ([`Echoes::wrote`]): the echo if the
//! versions match, otherwise a change queued in the foreground. A write
//! that fails (or is abandoned) settles as a change. Only the first change
//! in the window is held; further ones are queued at once. Each held change
//! counts in `wasmop_echoes_held_total`; `tests/tests/echo.rs` forces the
//! overtaking against the real API server by holding a write's answer back.
//!
//! An entry lives until the next change of its object arrives (matching or
//! not) or the host writes the object again; a write the API server
//! answered without a change (no new resourceVersion, so no event) leaves
//! its entry until then. So there is at most one entry per object the
//! host has written and that still exists.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::contract::manifest::KindRef;
use crate::controller::PrimaryKey;
use crate::execute::WriteLog;
use crate::metrics;
use crate::watch::cache::{Change, KindKey};

use super::queue::Queue;
use super::route::kind_key;

/// (kind, namespace, name) of a written object.
type Written = (KindKey, String, String);

/// What the record knows about one object the host writes.
#[derive(Debug)]
enum Entry {
    /// The request is on its way; no answer yet.
    InFlight {
        primary: PrimaryKey,
        /// The version answered to the previous write of the object, whose
        /// echo may still arrive during this one.
        previous: Option<String>,
        /// The version of a change that arrived meanwhile and was held.
        held: Option<String>,
    },
    /// Answered with this resourceVersion; its change has not arrived.
    Answered {
        resource_version: String,
        primary: PrimaryKey,
    },
}

/// What a change of an object is, for the primary that wrote it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Seen {
    /// Not known to be the host's own write: route it as usual.
    Change,
    /// The echo of this primary's write: queue it behind the foreground.
    Echo(PrimaryKey),
    /// Arrived while this primary's write is in flight: not queued now;
    /// [`Echoes::wrote`] settles it.
    Held(PrimaryKey),
}

/// How a held change was settled by its write's answer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Settled {
    pub(crate) primary: PrimaryKey,
    /// The held change was the write's echo (else: a real change).
    pub(crate) echo: bool,
}

/// The host's own writes whose watch events have not arrived yet.
#[derive(Debug, Default)]
pub(crate) struct Echoes {
    writes: Mutex<HashMap<Written, Entry>>,
}

impl Echoes {
    /// Records that `primary`'s plan is about to send a write of the object.
    pub(crate) fn writing(&self, kind: KindKey, namespace: &str, name: &str, primary: &PrimaryKey) {
        let mut writes = self.writes.lock().expect("echoes lock");
        let id = (kind, namespace.to_owned(), name.to_owned());
        let previous = match writes.remove(&id) {
            Some(Entry::Answered {
                resource_version, ..
            }) => Some(resource_version),
            _ => None,
        };
        writes.insert(
            id,
            Entry::InFlight {
                primary: primary.clone(),
                previous,
                held: None,
            },
        );
    }

    /// Records that `primary`'s plan wrote the object, which the API server
    /// answered with `resource_version` (empty: the write failed or was
    /// answered without a version). Returns how a change held meanwhile is
    /// settled, if one was.
    pub(crate) fn wrote(
        &self,
        kind: KindKey,
        namespace: &str,
        name: &str,
        resource_version: &str,
        primary: &PrimaryKey,
    ) -> Option<Settled> {
        let mut writes = self.writes.lock().expect("echoes lock");
        let id = (kind, namespace.to_owned(), name.to_owned());
        let settled = match writes.remove(&id) {
            Some(Entry::InFlight {
                held: Some(held),
                primary: writer,
                ..
            }) => Some(Settled {
                primary: writer,
                echo: !resource_version.is_empty() && held == resource_version,
            }),
            _ => None,
        };
        // Unless the echo already came (and was held), it is still to come.
        if !resource_version.is_empty() && !settled.as_ref().is_some_and(|s| s.echo) {
            writes.insert(
                id,
                Entry::Answered {
                    resource_version: resource_version.to_owned(),
                    primary: primary.clone(),
                },
            );
        }
        settled
    }

    /// What `change` is for the primary that wrote its object.
    /// `routed_to(p)`: the router sends this change to `p` (per object, in
    /// the foreground); only then is a change in a write's window held.
    /// Any change of an answered object forgets its entry.
    pub(crate) fn take(&self, change: &Change, routed_to: impl Fn(&PrimaryKey) -> bool) -> Seen {
        let Some(object) = change.new.as_ref().or(change.old.as_ref()) else {
            return Seen::Change;
        };
        let mut writes = self.writes.lock().expect("echoes lock");
        if writes.is_empty() {
            return Seen::Change;
        }
        let id = (
            change.kind.clone(),
            object.namespace().to_owned(),
            object.name().to_owned(),
        );
        let Some(entry) = writes.get_mut(&id) else {
            return Seen::Change;
        };
        let version = change.new.as_ref().map(|new| new.resource_version());
        match entry {
            Entry::Answered {
                resource_version,
                primary,
            } => {
                let seen = if version == Some(resource_version.as_str()) {
                    Seen::Echo(primary.clone())
                } else {
                    Seen::Change
                };
                writes.remove(&id);
                seen
            }
            Entry::InFlight {
                primary,
                previous,
                held,
            } => {
                let Some(version) = version else {
                    // A deletion: never an echo.
                    return Seen::Change;
                };
                if previous.as_deref() == Some(version) {
                    *previous = None;
                    Seen::Echo(primary.clone())
                } else if held.is_none() && routed_to(primary) {
                    *held = Some(version.to_owned());
                    Seen::Held(primary.clone())
                } else {
                    Seen::Change
                }
            }
        }
    }

    /// Objects written whose change has not arrived.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.writes.lock().expect("echoes lock").len()
    }
}

/// [`Echoes`] bound to the primary whose plan is being executed, and the
/// queue that settles what its writes held.
pub(crate) struct EchoLog<'a> {
    pub(crate) echoes: &'a Echoes,
    pub(crate) primary: &'a PrimaryKey,
    pub(crate) queue: Option<&'a Queue<PrimaryKey>>,
}

impl EchoLog<'_> {
    fn id<'k>(kind: &KindRef, namespace: &'k str) -> (KindKey, &'k str) {
        (kind_key(kind), if kind.namespaced { namespace } else { "" })
    }
}

impl WriteLog for EchoLog<'_> {
    fn writing(&self, kind: &KindRef, namespace: &str, name: &str) {
        let (kind, namespace) = Self::id(kind, namespace);
        self.echoes.writing(kind, namespace, name, self.primary);
    }

    fn wrote(&self, kind: &KindRef, namespace: &str, name: &str, resource_version: &str) {
        let (kind, namespace) = Self::id(kind, namespace);
        let settled = self
            .echoes
            .wrote(kind, namespace, name, resource_version, self.primary);
        if let (Some(settled), Some(queue)) = (settled, self.queue) {
            settle(queue, settled);
        }
    }
}

/// Queues a held change as its write's answer settled it.
pub(crate) fn settle(queue: &Queue<PrimaryKey>, settled: Settled) {
    if settled.echo {
        metrics::global().inc(
            "wasmop_reconcile_echoes_total",
            &[("controller", &settled.primary.controller)],
        );
        queue.add_echo(settled.primary);
    } else {
        queue.add(settled.primary);
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
        KindRef::namespaced("", "v1", "ConfigMap", "configmaps")
    }

    #[test]
    fn only_the_event_with_the_written_version_is_an_echo_and_each_is_taken_once() {
        let echoes = Echoes::default();
        let log = EchoLog {
            echoes: &echoes,
            primary: &key("w1"),
            queue: None,
        };
        log.wrote(&cm_kind(), "ns", "a", "10");
        log.wrote(&cm_kind(), "ns", "b", "11");
        // An object nobody wrote: no echo, nothing forgotten.
        assert_eq!(
            echoes.take(&change(None, Some(cm("c", "12"))), all),
            Seen::Change
        );
        assert_eq!(echoes.len(), 2);
        // The echo of the write to a.
        assert_eq!(
            echoes.take(&change(Some(cm("a", "9")), Some(cm("a", "10"))), all),
            Seen::Echo(key("w1"))
        );
        // The same version again (a relist replaying it): no longer an echo.
        assert_eq!(
            echoes.take(&change(Some(cm("a", "10")), Some(cm("a", "10"))), all),
            Seen::Change
        );
        // Someone else's write to b arrives first: not an echo, and the
        // entry is gone, so b's later events are not echoes either.
        assert_eq!(
            echoes.take(&change(Some(cm("b", "9")), Some(cm("b", "13"))), all),
            Seen::Change
        );
        assert_eq!(echoes.len(), 0);
        // A deletion of a written object is no echo and forgets it.
        log.wrote(&cm_kind(), "ns", "a", "20");
        assert_eq!(
            echoes.take(&change(Some(cm("a", "20")), None), all),
            Seen::Change
        );
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
            queue: None,
        }
        .wrote(&cm_kind(), "ns", name, rv);
    }

    #[test]
    fn the_last_write_of_an_object_names_the_primary_of_its_echo() {
        let echoes = Echoes::default();
        wrote(&echoes, "w1", "a", "10");
        wrote(&echoes, "w2", "a", "11");
        assert_eq!(
            echoes.take(&change(None, Some(cm("a", "10"))), all),
            Seen::Change,
            "the first write's version is superseded"
        );
        wrote(&echoes, "w2", "a", "12");
        assert_eq!(
            echoes.take(&change(None, Some(cm("a", "12"))), all),
            Seen::Echo(key("w2"))
        );
    }

    /// The router sends every change to every writer.
    fn all(_: &PrimaryKey) -> bool {
        true
    }

    fn writing(echoes: &Echoes, primary: &str, name: &str) {
        echoes.writing(cm_key(), "ns", name, &key(primary));
    }

    fn answered(echoes: &Echoes, primary: &str, name: &str, rv: &str) -> Option<Settled> {
        echoes.wrote(cm_key(), "ns", name, rv, &key(primary))
    }

    fn cm_key() -> KindKey {
        KindKey::new("", "v1", "ConfigMap")
    }

    fn settled(primary: &str, echo: bool) -> Option<Settled> {
        Some(Settled {
            primary: key(primary),
            echo,
        })
    }

    #[test]
    fn a_change_during_the_write_is_held_until_the_answer_settles_it() {
        let echoes = Echoes::default();
        let seen = |name: &str, rv: &str| echoes.take(&change(None, Some(cm(name, rv))), all);

        // The echo arrives before the answer: held, then settled as the echo.
        writing(&echoes, "w1", "a");
        assert_eq!(seen("a", "10"), Seen::Held(key("w1")));
        assert_eq!(answered(&echoes, "w1", "a", "10"), settled("w1", true));
        assert_eq!(echoes.len(), 0);

        // Someone else's write arrives in the window: settled as a change,
        // and the write's own echo, still to come, is recognised.
        writing(&echoes, "w1", "a");
        assert_eq!(seen("a", "11"), Seen::Held(key("w1")));
        assert_eq!(answered(&echoes, "w1", "a", "12"), settled("w1", false));
        assert_eq!(seen("a", "12"), Seen::Echo(key("w1")));

        // Only the first change in the window is held; a second is routed.
        writing(&echoes, "w1", "a");
        assert_eq!(seen("a", "13"), Seen::Held(key("w1")));
        assert_eq!(seen("a", "14"), Seen::Change);
        assert_eq!(answered(&echoes, "w1", "a", "13"), settled("w1", true));

        // A write that fails settles what it held as a change.
        writing(&echoes, "w1", "a");
        assert_eq!(seen("a", "15"), Seen::Held(key("w1")));
        assert_eq!(answered(&echoes, "w1", "a", ""), settled("w1", false));
        assert_eq!(echoes.len(), 0);

        // A deletion in the window is never held, and the write goes on.
        writing(&echoes, "w1", "b");
        assert_eq!(
            echoes.take(&change(Some(cm("b", "16")), None), all),
            Seen::Change
        );
        assert_eq!(answered(&echoes, "w1", "b", "17"), None);
        assert_eq!(seen("b", "17"), Seen::Echo(key("w1")));
    }

    #[test]
    fn a_change_the_router_does_not_send_to_the_writer_is_never_held() {
        let echoes = Echoes::default();
        writing(&echoes, "w1", "a");
        assert_eq!(
            echoes.take(&change(None, Some(cm("a", "10"))), |_| false),
            Seen::Change
        );
        // Nothing held, so the answer settles nothing: the echo was routed.
        assert_eq!(answered(&echoes, "w1", "a", "10"), None);
    }

    #[test]
    fn the_previous_writes_echo_is_recognised_during_the_next_write() {
        let echoes = Echoes::default();
        writing(&echoes, "w1", "a");
        assert_eq!(answered(&echoes, "w1", "a", "20"), None);
        writing(&echoes, "w1", "a");
        let seen = |rv: &str| echoes.take(&change(None, Some(cm("a", rv))), all);
        assert_eq!(seen("20"), Seen::Echo(key("w1")));
        assert_eq!(seen("21"), Seen::Held(key("w1")));
        assert_eq!(answered(&echoes, "w1", "a", "21"), settled("w1", true));
    }
}
