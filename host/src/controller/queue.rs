//! The work queue: which primaries to reconcile, when, and never twice at
//! once.
//!
//! # Guarantees
//! - A key waiting in the queue is held once, however often it is added.
//! - A key is handed to at most one worker at a time. A key added while it
//!   is being reconciled runs again right after (nothing is lost).
//! - A delayed add keeps only the earliest requested time per key.
//! - Keys come out in the order they were first added, every key added
//!   with [`Queue::add`] before any waiting background key
//!   ([`Queue::add_background`]: the re-queues of a plugin start or swap),
//!   so a change is never stuck behind a whole re-queued kind while the
//!   background keys still keep every worker busy. A background key added
//!   again with [`Queue::add`] moves to the foreground.
//! - An echo ([`Queue::add_echo`]: the watch event of the operator's own
//!   write, routed back to the primary whose plan made it) waits in the
//!   background too, also when it arrives while its key runs: the key then
//!   runs again after that run, behind the foreground. So under load every
//!   primary's first reconcile of a change comes before the confirmations
//!   of earlier ones; without load the echo runs at once, as before.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

#[derive(Debug)]
struct State<K> {
    order: VecDeque<K>,
    waiting: HashSet<K>,
    /// Background keys in the order added; a key no longer in
    /// `background_waiting` (moved to the foreground) is skipped.
    background: VecDeque<K>,
    background_waiting: HashSet<K>,
    running: HashSet<K>,
    /// Added while running: must run again when the current run ends.
    dirty: HashSet<K>,
    /// Echoed while running: runs again in the background when the
    /// current run ends, unless it is in `dirty` too.
    dirty_echo: HashSet<K>,
    /// Earliest pending delayed add per key.
    scheduled: HashMap<K, Instant>,
    /// When each waiting key was added (for `workqueue_queue_duration_seconds`).
    since: HashMap<K, Instant>,
    closed: bool,
}

/// A de-duplicating work queue of keys.
#[derive(Debug)]
pub struct Queue<K> {
    state: Mutex<State<K>>,
    notify: Notify,
    /// The `name` label of a key's workqueue metrics; no metrics without.
    metrics_name: Option<fn(&K) -> String>,
}

impl<K: Clone + Eq + Hash + Send + Sync + 'static> Queue<K> {
    /// An empty queue.
    pub fn new() -> Arc<Self> {
        Self::build(None)
    }

    /// An empty queue that records client-go's workqueue metrics
    /// (`workqueue_depth`, `workqueue_adds_total`,
    /// `workqueue_queue_duration_seconds`) labelled `name = name_of(key)`.
    pub fn with_metrics(name_of: fn(&K) -> String) -> Arc<Self> {
        Self::build(Some(name_of))
    }

    fn build(metrics_name: Option<fn(&K) -> String>) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                order: VecDeque::new(),
                waiting: HashSet::new(),
                background: VecDeque::new(),
                background_waiting: HashSet::new(),
                running: HashSet::new(),
                dirty: HashSet::new(),
                dirty_echo: HashSet::new(),
                scheduled: HashMap::new(),
                since: HashMap::new(),
                closed: false,
            }),
            notify: Notify::new(),
            metrics_name,
        })
    }

    /// Adds a key now.
    pub fn add(&self, key: K) {
        let mut s = self.state.lock().expect("queue lock");
        s.scheduled.remove(&key);
        if s.running.contains(&key) {
            s.dirty.insert(key);
            return;
        }
        if s.background_waiting.remove(&key) {
            // Already counted as waiting: it only moves up.
            s.waiting.insert(key.clone());
            s.order.push_back(key);
            drop(s);
            self.notify.notify_one();
            return;
        }
        if s.waiting.insert(key.clone()) {
            self.count_add(&mut s, &key);
            s.order.push_back(key);
            drop(s);
            self.notify.notify_one();
        }
    }

    /// Counts a key that starts waiting: the workqueue metrics and the
    /// instant its wait began.
    fn count_add(&self, s: &mut State<K>, key: &K) {
        if let Some(name_of) = self.metrics_name {
            let name = name_of(key);
            let m = crate::metrics::global();
            m.inc("workqueue_adds_total", &[("name", &name)]);
            m.add("workqueue_depth", &[("name", &name)], 1.0);
            s.since.insert(key.clone(), Instant::now());
        }
    }

    /// Adds a key behind every key added with [`Queue::add`] (now or
    /// later), unless it is already waiting. A key being reconciled runs
    /// again right after, as with [`Queue::add`]: the run in progress may
    /// have started before the change (a plugin swap) that re-queues it.
    pub fn add_background(&self, key: K) {
        self.add_behind(key, false);
    }

    /// Adds a key whose only cause is the echo of the operator's own write
    /// for it, behind every foreground key like [`Queue::add_background`].
    /// A key being reconciled runs again after that run, in the background
    /// too (unless something else re-queued it meanwhile: then it runs
    /// again right after, as with [`Queue::add`]).
    pub fn add_echo(&self, key: K) {
        self.add_behind(key, true);
    }

    fn add_behind(&self, key: K, echo: bool) {
        let mut s = self.state.lock().expect("queue lock");
        if s.running.contains(&key) {
            if echo {
                s.dirty_echo.insert(key);
            } else {
                s.dirty.insert(key);
            }
            return;
        }
        if s.waiting.contains(&key) {
            return;
        }
        if s.background_waiting.insert(key.clone()) {
            self.count_add(&mut s, &key);
            s.background.push_back(key);
            drop(s);
            self.notify.notify_one();
        }
    }

    /// Adds a key after `delay`, unless an earlier add is already scheduled.
    pub fn add_after(self: &Arc<Self>, key: K, delay: Duration) {
        if delay.is_zero() {
            self.add(key);
            return;
        }
        let at = Instant::now() + delay;
        {
            let mut s = self.state.lock().expect("queue lock");
            if s.scheduled.get(&key).is_some_and(|&t| t <= at) {
                return;
            }
            s.scheduled.insert(key.clone(), at);
        }
        let queue = Arc::downgrade(self);
        tokio::spawn(async move {
            tokio::time::sleep_until(at).await;
            let Some(queue) = queue.upgrade() else { return };
            let due = {
                let mut s = queue.state.lock().expect("queue lock");
                // Only the timer of the earliest schedule fires the add; an
                // immediate add in between already took the key.
                if s.scheduled.get(&key) == Some(&at) {
                    s.scheduled.remove(&key);
                    true
                } else {
                    false
                }
            };
            if due {
                queue.add(key);
            }
        });
    }

    /// Forgets a pending delayed add of `key` (e.g. the object is gone).
    pub fn forget(&self, key: &K) {
        self.state.lock().expect("queue lock").scheduled.remove(key);
    }

    /// Waits for the next key and marks it running. `None` once closed.
    pub async fn next(&self) -> Option<K> {
        loop {
            let notified = self.notify.notified();
            {
                let mut s = self.state.lock().expect("queue lock");
                if s.closed {
                    return None;
                }
                let next = match s.order.pop_front() {
                    Some(key) => {
                        s.waiting.remove(&key);
                        Some(key)
                    }
                    None => loop {
                        match s.background.pop_front() {
                            Some(key) if s.background_waiting.remove(&key) => break Some(key),
                            Some(_moved_up) => {}
                            None => break None,
                        }
                    },
                };
                if let Some(key) = next {
                    if let Some(name_of) = self.metrics_name {
                        let name = name_of(&key);
                        let m = crate::metrics::global();
                        m.add("workqueue_depth", &[("name", &name)], -1.0);
                        if let Some(at) = s.since.remove(&key) {
                            m.observe(
                                "workqueue_queue_duration_seconds",
                                &[("name", &name)],
                                at.elapsed().as_secs_f64(),
                            );
                        }
                    }
                    s.running.insert(key.clone());
                    if !s.order.is_empty() || !s.background_waiting.is_empty() {
                        self.notify.notify_one();
                    }
                    return Some(key);
                }
            }
            notified.await;
        }
    }

    /// Marks a key's run finished; re-adds it when it was added meanwhile.
    pub fn done(&self, key: &K) {
        let (again, echo) = {
            let mut s = self.state.lock().expect("queue lock");
            s.running.remove(key);
            (s.dirty.remove(key), s.dirty_echo.remove(key))
        };
        if again {
            self.add(key.clone());
        } else if echo {
            self.add_background(key.clone());
        }
    }

    /// Stops handing out keys; waiting workers get `None`.
    pub fn close(&self) {
        self.state.lock().expect("queue lock").closed = true;
        self.notify.notify_waiters();
    }

    /// Number of keys waiting (not running, not scheduled), background
    /// keys included.
    pub fn len(&self) -> usize {
        let s = self.state.lock().expect("queue lock");
        s.order.len() + s.background_waiting.len()
    }

    /// True when no key is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keys waiting or running (delayed adds not yet due excluded): zero
    /// when the workers have nothing to do.
    pub fn pending(&self) -> usize {
        let s = self.state.lock().expect("queue lock");
        s.order.len() + s.background_waiting.len() + s.running.len()
    }
}

/// Exponential backoff per key: `base * 2^failures`, at most `max`.
#[derive(Debug)]
pub struct Backoff<K> {
    failures: Mutex<HashMap<K, u32>>,
    base: Duration,
    max: Duration,
}

impl<K: Clone + Eq + Hash> Backoff<K> {
    /// A backoff starting at `base` and capped at `max`.
    pub fn new(base: Duration, max: Duration) -> Self {
        Self {
            failures: Mutex::new(HashMap::new()),
            base,
            max,
        }
    }

    /// Records a failure and returns how long to wait before the next try.
    pub fn fail(&self, key: &K) -> Duration {
        let mut f = self.failures.lock().expect("backoff lock");
        let n = f.entry(key.clone()).or_insert(0);
        let delay = self
            .base
            .checked_mul(1u32 << (*n).min(20))
            .unwrap_or(self.max)
            .min(self.max);
        *n = n.saturating_add(1);
        delay
    }

    /// Records a success: the next failure starts from `base` again.
    pub fn reset(&self, key: &K) {
        self.failures.lock().expect("backoff lock").remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn key_added_twice_while_waiting_is_handed_out_once() {
        let q = Queue::new();
        q.add("a");
        q.add("a");
        q.add("b");
        assert_eq!(q.len(), 2);
        assert_eq!(q.next().await, Some("a"));
        assert_eq!(q.next().await, Some("b"));
        assert!(q.is_empty());
    }

    #[tokio::test]
    async fn key_added_while_running_runs_again_after_done_and_not_concurrently() {
        let q = Queue::new();
        q.add("a");
        assert_eq!(q.next().await, Some("a"));
        q.add("a");
        // Still running: not handed out a second time.
        assert!(q.is_empty());
        q.done(&"a");
        assert_eq!(q.next().await, Some("a"));
        q.done(&"a");
        assert!(q.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn delayed_add_keeps_the_earliest_time() {
        let q = Queue::new();
        q.add_after("a", Duration::from_secs(10));
        q.add_after("a", Duration::from_secs(1));
        q.add_after("a", Duration::from_secs(30));
        let start = Instant::now();
        assert_eq!(q.next().await, Some("a"));
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_secs(1) && waited < Duration::from_secs(10),
            "{waited:?}"
        );
        q.done(&"a");
        // The later timers must not re-add the key.
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(q.is_empty());
    }

    #[tokio::test]
    async fn background_keys_wait_behind_every_foreground_key() {
        let q = Queue::new();
        q.add_background("b1");
        q.add_background("b2");
        q.add_background("b3");
        q.add("f1");
        // Added again in the background: no change; in the foreground: it
        // moves up, behind the foreground keys already waiting.
        q.add_background("b1");
        q.add("b3");
        assert_eq!(q.len(), 4);
        assert_eq!(q.next().await, Some("f1"));
        assert_eq!(q.next().await, Some("b3"));
        // A foreground add while background keys wait goes first.
        q.add("f2");
        assert_eq!(q.next().await, Some("f2"));
        assert_eq!(q.next().await, Some("b1"));
        // Running: a background add does not hand it out twice, but runs
        // it again once the current run ends (that run may have started
        // before the swap that re-queued it).
        q.add_background("b1");
        assert_eq!(q.next().await, Some("b2"));
        assert!(q.is_empty());
        q.done(&"b2");
        assert!(q.is_empty());
        q.done(&"b1");
        assert_eq!(q.len(), 1);
        assert_eq!(q.next().await, Some("b1"));
        q.done(&"b1");
        assert!(q.is_empty());
        // A waiting foreground key is not demoted.
        q.add("f3");
        q.add_background("f3");
        q.add_background("b4");
        assert_eq!(q.next().await, Some("f3"));
        assert_eq!(q.next().await, Some("b4"));
        assert!(q.is_empty());
    }

    #[tokio::test]
    async fn echoes_wait_behind_the_foreground_also_when_their_key_runs() {
        let q = Queue::new();
        q.add("a");
        q.add("b");
        assert_eq!(q.next().await, Some("a"));
        assert_eq!(q.pending(), 2);
        // a's own write echoes while a runs: a runs again, but after b.
        q.add_echo("a");
        q.done(&"a");
        assert_eq!(q.len(), 2);
        q.add("c");
        assert_eq!(q.next().await, Some("b"));
        assert_eq!(q.next().await, Some("c"));
        assert_eq!(q.next().await, Some("a"));
        q.done(&"a");
        // Waiting in the foreground: an echo does not demote it.
        q.add("b2");
        q.add_echo("b2");
        q.add_echo("e");
        q.add("f");
        assert_eq!(q.next().await, Some("b2"));
        assert_eq!(q.next().await, Some("f"));
        assert_eq!(q.next().await, Some("e"));
        // A real change next to the echo while running: right after, in
        // the foreground, whichever came first.
        q.add("g");
        q.add_echo("e");
        q.add("e");
        q.done(&"e");
        assert_eq!(q.next().await, Some("g"));
        assert_eq!(q.next().await, Some("e"));
        q.add("h");
        q.add("e");
        q.add_echo("e");
        q.done(&"e");
        assert_eq!(q.next().await, Some("h"));
        assert_eq!(q.next().await, Some("e"));
        // A swap's background re-queue of a running key still reruns it in
        // the foreground (its run may predate the swap), echo or not.
        q.add_echo("e");
        q.add_background("e");
        q.add("i");
        q.done(&"e");
        assert_eq!(q.next().await, Some("i"));
        assert_eq!(q.next().await, Some("e"));
        q.done(&"e");
        for k in ["b", "c", "b2", "f", "g", "h", "i"] {
            q.done(&k);
        }
        assert_eq!(q.pending(), 0);
        assert!(q.is_empty());
    }

    #[tokio::test]
    async fn close_releases_waiting_workers() {
        let q: Arc<Queue<&str>> = Queue::new();
        let q2 = q.clone();
        let waiter = tokio::spawn(async move { q2.next().await });
        tokio::task::yield_now().await;
        q.close();
        assert_eq!(waiter.await.unwrap(), None);
    }

    #[test]
    fn backoff_doubles_up_to_the_cap_and_resets_on_success() {
        let b = Backoff::new(Duration::from_secs(1), Duration::from_secs(5));
        assert_eq!(b.fail(&"k"), Duration::from_secs(1));
        assert_eq!(b.fail(&"k"), Duration::from_secs(2));
        assert_eq!(b.fail(&"k"), Duration::from_secs(4));
        assert_eq!(b.fail(&"k"), Duration::from_secs(5));
        b.reset(&"k");
        assert_eq!(b.fail(&"k"), Duration::from_secs(1));
    }
}
