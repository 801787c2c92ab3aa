//! Recordings of live reconciles (`wasmop run --record DIR`), for
//! `wasmop replay`.
//!
//! # Format
//! One JSON file per decided reconcile (and per call of a kind-scoped
//! controller, see [`kind_recording`]), in the shape `wasmop plan -f`
//! reads: a `kind: List` whose items are a `PlanOptions` document (now,
//! controller, settings), an `Observations` document, a `Recorded`
//! document (plugin name, version and digest; the primary; the outcome in
//! the golden form of [`crate::reconcile::offline::to_golden_text`]), and
//! the snapshot's objects (primary, owned, related). `wasmop plan --plugin
//! P -f FILE` recomputes the plan from it; `wasmop replay` does that for a
//! whole directory and diffs.
//!
//! File names start with the UTC time and a sequence number, so their
//! order is the order of the reconciles.
//!
//! # Guarantees
//! - **Bounded.** The directory holds at most the configured bytes of
//!   recordings; the oldest are deleted first. A recording larger than the
//!   bound on its own is not written.
//! - **Secret values are never written.** In every `v1` `Secret` (in the
//!   snapshot and in the plan) each `data` and `stringData` value is
//!   replaced by a token, `wasmop-redacted-` and 24 hex digits of a keyed
//!   SHA-256 of the value (the key is random per process and never
//!   stored), and the `kubectl.kubernetes.io/last-applied-configuration`
//!   annotation is replaced by a token too. Then every string anywhere in
//!   the recording is scrubbed of each Secret value at least
//!   [`SCRUB_MIN_LEN`] bytes long, raw or base64, wherever it was copied
//!   (status, events, ConfigMaps, observations), except `apiVersion` and
//!   `kind` values, which name types (a Secret value such as `firebolt`
//!   would otherwise turn `compute.firebolt.io` into a group no replay
//!   knows). The same value gives the
//!   same token within one process, so a plugin that copies a Secret
//!   replays to the same plan.
//! - **Recording never fails a reconcile.** A write error is logged and
//!   counted (`wasmop_record_errors_total`).

use std::collections::{BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

use crate::judge::snapshot::Snapshot;
use crate::metrics;
use crate::object;
use crate::plugin::LoadedPlugin;
use crate::reconcile::decide::Decision;
use crate::reconcile::diff::{kind_outcome_of, outcome_of};
use crate::reconcile::kind::KindDecided;
use crate::reconcile::offline::INPUT_API_VERSION;
pub use crate::reconcile::offline::RECORDED_KIND;

/// Secret values shorter than this are redacted inside Secrets only, not
/// scrubbed from other strings (where they would match too much).
pub const SCRUB_MIN_LEN: usize = 6;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// Replaces Secret values with keyed tokens.
#[derive(Clone)]
pub struct Redactor {
    key: [u8; 32],
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Redactor")
    }
}

impl Redactor {
    /// A redactor with a random key.
    pub fn new() -> Self {
        let mut key = [0u8; 32];
        let filled = std::fs::File::open("/dev/urandom")
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut key));
        if filled.is_err() {
            // No /dev/urandom: derive a key from what differs per process.
            let seed = format!(
                "{:?}{}{:?}",
                std::time::SystemTime::now(),
                std::process::id(),
                std::thread::current().id()
            );
            key.copy_from_slice(&Sha256::digest(seed.as_bytes()));
        }
        Self { key }
    }

    /// The token standing for `value`.
    pub fn token(&self, value: &[u8]) -> String {
        let mut h = Sha256::new();
        h.update(self.key);
        h.update(value);
        let digest = h.finalize();
        let mut out = String::from("wasmop-redacted-");
        for b in &digest[..12] {
            out.push_str(&format!("{b:02x}"));
        }
        out
    }

    /// Redacts the Secrets among `values` in place and returns the values
    /// to scrub elsewhere, `(secret, token)` pairs, longest first.
    fn redact_secrets<'a>(
        &self,
        values: impl Iterator<Item = &'a mut Value>,
    ) -> Vec<(String, String)> {
        let mut scrub = BTreeSet::new();
        for v in values {
            if object::api_version(v) != "v1" || object::kind(v) != "Secret" {
                continue;
            }
            if let Some(data) = v.get_mut("data").and_then(Value::as_object_mut) {
                for value in data.values_mut() {
                    let Some(text) = value.as_str() else { continue };
                    let raw = B64
                        .decode(text)
                        .unwrap_or_else(|_| text.as_bytes().to_vec());
                    let token = self.token(&raw);
                    scrub.insert((text.to_owned(), B64.encode(&token)));
                    if let Ok(plain) = String::from_utf8(raw) {
                        scrub.insert((plain, token.clone()));
                    }
                    *value = Value::String(B64.encode(&token));
                }
            }
            if let Some(data) = v.get_mut("stringData").and_then(Value::as_object_mut) {
                for value in data.values_mut() {
                    let Some(text) = value.as_str() else { continue };
                    let token = self.token(text.as_bytes());
                    scrub.insert((text.to_owned(), token.clone()));
                    scrub.insert((B64.encode(text), B64.encode(&token)));
                    *value = Value::String(token);
                }
            }
            if let Some(a) = v
                .pointer_mut("/metadata/annotations")
                .and_then(Value::as_object_mut)
                && let Some(last) = a.get_mut(object::LAST_APPLIED_ANNOTATION)
            {
                let text = last.as_str().unwrap_or_default().as_bytes().to_vec();
                *last = Value::String(self.token(&text));
            }
        }
        let mut pairs: Vec<(String, String)> = scrub
            .into_iter()
            .filter(|(s, _)| s.len() >= SCRUB_MIN_LEN)
            .collect();
        pairs.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
        pairs
    }
}

impl Default for Redactor {
    fn default() -> Self {
        Self::new()
    }
}

/// Replaces every occurrence of each secret in every string of `v`
/// (object keys included).
fn scrub(v: &mut Value, pairs: &[(String, String)]) {
    if pairs.is_empty() {
        return;
    }
    let clean = |s: &str| -> Option<String> {
        let mut out: Option<String> = None;
        for (secret, token) in pairs {
            let cur = out.as_deref().unwrap_or(s);
            if cur.contains(secret.as_str()) {
                out = Some(cur.replace(secret.as_str(), token));
            }
        }
        out
    };
    match v {
        Value::String(s) => {
            if let Some(c) = clean(s) {
                *s = c;
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|i| scrub(i, pairs)),
        Value::Object(map) => {
            let keys: Vec<String> = map.keys().cloned().collect();
            for k in keys {
                if let Some(mut inner) = map.remove(&k) {
                    // An object's type is never a secret, and a Secret
                    // value that is a word of it (`firebolt`) must not
                    // change which kind a replay reads.
                    if k != "apiVersion" && k != "kind" {
                        scrub(&mut inner, pairs);
                    }
                    map.insert(clean(&k).unwrap_or(k), inner);
                }
            }
        }
        _ => {}
    }
}

/// The recording of one reconcile, redacted.
pub fn recording(
    redactor: &Redactor,
    plugin: &LoadedPlugin,
    snapshot: &Snapshot,
    decision: &Decision,
) -> Value {
    let primaries = std::slice::from_ref(&snapshot.primary);
    let outcome = outcome_of(decision);
    let primary = json!({
        "kind": object::kind(&snapshot.primary),
        "namespace": object::namespace(&snapshot.primary),
        "name": object::name(&snapshot.primary),
        "uid": object::uid(&snapshot.primary),
    });
    redacted_recording(
        Some(redactor),
        plugin,
        snapshot,
        primaries,
        primary,
        outcome,
    )
}

/// The recording of one reconcile of a modelled cluster (`wasmop check`),
/// *not* redacted: its Secrets are the examples' and what the plugin
/// generated offline, and a plugin that derives anything from a Secret
/// value replays to the same plan only from the value itself.
pub fn offline_recording(plugin: &LoadedPlugin, snapshot: &Snapshot, decision: &Decision) -> Value {
    let primaries = std::slice::from_ref(&snapshot.primary);
    let primary = json!({
        "kind": object::kind(&snapshot.primary),
        "namespace": object::namespace(&snapshot.primary),
        "name": object::name(&snapshot.primary),
        "uid": object::uid(&snapshot.primary),
    });
    redacted_recording(
        None,
        plugin,
        snapshot,
        primaries,
        primary,
        outcome_of(decision),
    )
}

/// [`kind_recording`] of a modelled cluster, not redacted (see
/// [`offline_recording`]).
pub fn offline_kind_recording(plugin: &LoadedPlugin, decided: &KindDecided) -> Option<Value> {
    let snapshot = decided.snapshot.as_ref()?;
    let first = decided.primaries.first()?;
    let primary = json!({
        "apiVersion": object::api_version(first),
        "kind": object::kind(first),
        "scope": "Kind",
        "primaries": decided.primaries.len(),
    });
    Some(redacted_recording(
        None,
        plugin,
        snapshot,
        &decided.primaries,
        primary,
        kind_outcome_of(decided),
    ))
}

/// The recording of one call of a kind-scoped controller, redacted: its
/// `Recorded` document names the primary kind (`scope: Kind`) and holds the
/// call's outcome in the golden form of
/// [`crate::reconcile::offline::to_kind_golden_text`]; its objects are
/// every primary the call covered, and what they own and read. `None`
/// when the plugin was not called.
pub fn kind_recording(
    redactor: &Redactor,
    plugin: &LoadedPlugin,
    decided: &KindDecided,
) -> Option<Value> {
    let snapshot = decided.snapshot.as_ref()?;
    let first = decided.primaries.first()?;
    let outcome = kind_outcome_of(decided);
    let primary = json!({
        "apiVersion": object::api_version(first),
        "kind": object::kind(first),
        "scope": "Kind",
        "primaries": decided.primaries.len(),
    });
    Some(redacted_recording(
        Some(redactor),
        plugin,
        snapshot,
        &decided.primaries,
        primary,
        outcome,
    ))
}

/// The objects an outcome in golden form applies: its plan's (or its
/// rejected plan's), or those of each object plan of a kind call.
fn plan_objects(outcome: &mut Value) -> Vec<&mut Value> {
    fn one(o: &mut Value) -> Vec<&mut Value> {
        let at = if o.get("rejected").is_some() {
            "/rejected/plan/apply"
        } else {
            "/apply"
        };
        o.pointer_mut(at)
            .and_then(Value::as_array_mut)
            .map(|a| a.iter_mut().filter_map(|op| op.get_mut("object")).collect())
            .unwrap_or_default()
    }
    if outcome.get("objects").is_some() {
        outcome
            .get_mut("objects")
            .and_then(Value::as_array_mut)
            .map(|plans| plans.iter_mut().flat_map(one).collect())
            .unwrap_or_default()
    } else {
        one(outcome)
    }
}

/// A recording: the objects (`primaries`, then what the snapshot owns and
/// reads, each once, without managedFields), the options and observations
/// of `snapshot`, and the `Recorded` document of `primary` and `outcome`;
/// Secrets redacted and their values scrubbed everywhere.
fn redacted_recording(
    redactor: Option<&Redactor>,
    plugin: &LoadedPlugin,
    snapshot: &Snapshot,
    primaries: &[Arc<Value>],
    primary: Value,
    mut outcome: Value,
) -> Value {
    let mut objects: Vec<Value> = Vec::new();
    let mut seen = BTreeSet::new();
    let all = primaries
        .iter()
        .chain(snapshot.owned.iter())
        .chain(snapshot.related.iter().map(|r| &r.object));
    for o in all {
        let id = (
            object::api_version(o).to_owned(),
            object::kind(o).to_owned(),
            object::namespace(o).unwrap_or_default().to_owned(),
            object::name(o).to_owned(),
        );
        if seen.insert(id) {
            let mut o = (**o).clone();
            object::strip_bookkeeping(&mut o);
            objects.push(o);
        }
    }
    // Unique (collected in a set) and longest first already.
    let pairs = match redactor {
        Some(r) => r.redact_secrets(objects.iter_mut().chain(plan_objects(&mut outcome))),
        None => Vec::new(),
    };
    let mut doc = json!({
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {
                "apiVersion": INPUT_API_VERSION,
                "kind": "PlanOptions",
                "now": snapshot.now,
                "controller": snapshot.controller,
                "settings": snapshot.settings,
            },
            {
                "apiVersion": INPUT_API_VERSION,
                "kind": "Observations",
                "items": snapshot.observations,
            },
            {
                "apiVersion": INPUT_API_VERSION,
                "kind": RECORDED_KIND,
                "plugin": {
                    "name": plugin.name(),
                    "version": plugin.version(),
                    "digest": plugin.digest(),
                },
                "primary": primary,
                "outcome": outcome,
            },
        ],
    });
    if let Some(items) = doc.get_mut("items").and_then(Value::as_array_mut) {
        items.extend(objects);
    }
    scrub(&mut doc, &pairs);
    doc
}

/// A recording rendered and redacted, not yet written.
#[derive(Debug)]
pub struct Rendered {
    controller: String,
    namespace: String,
    name: String,
    bytes: Vec<u8>,
}

/// Writes recordings into a directory, keeping it under a byte bound.
#[derive(Debug)]
pub struct Recorder {
    dir: PathBuf,
    max_bytes: u64,
    redactor: Redactor,
    seq: AtomicU64,
    /// Files in the directory, oldest first, with their sizes.
    files: Mutex<(VecDeque<(PathBuf, u64)>, u64)>,
}

impl Recorder {
    /// A recorder into `dir` (created), bounded by `max_bytes`; recordings
    /// already there count against the bound.
    ///
    /// # Errors
    /// When the directory cannot be created or listed.
    pub fn new(dir: PathBuf, max_bytes: u64) -> std::io::Result<Self> {
        std::fs::create_dir_all(&dir)?;
        let mut existing: Vec<(PathBuf, u64)> = std::fs::read_dir(&dir)?
            .filter_map(Result::ok)
            .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
            .filter_map(|e| Some((e.path(), e.metadata().ok()?.len())))
            .collect();
        existing.sort();
        let total = existing.iter().map(|(_, n)| n).sum();
        Ok(Self {
            dir,
            max_bytes,
            redactor: Redactor::new(),
            seq: AtomicU64::new(0),
            files: Mutex::new((existing.into(), total)),
        })
    }

    /// The directory recordings go to.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Records one reconcile. Never fails the caller: errors are logged.
    pub fn record(&self, plugin: &LoadedPlugin, snapshot: &Snapshot, decision: &Decision) {
        if let Some(rendered) = self.render(plugin, snapshot, decision) {
            self.write(rendered);
        }
    }

    /// The redacted recording of one reconcile, ready for [`Self::write`]
    /// (which does the file I/O and may run on a blocking thread).
    pub fn render(
        &self,
        plugin: &LoadedPlugin,
        snapshot: &Snapshot,
        decision: &Decision,
    ) -> Option<Rendered> {
        let doc = recording(&self.redactor, plugin, snapshot, decision);
        let mut bytes = serde_json::to_vec_pretty(&doc).ok()?;
        bytes.push(b'\n');
        Some(Rendered {
            controller: snapshot.controller.clone(),
            namespace: object::namespace(&snapshot.primary)
                .unwrap_or("-")
                .to_owned(),
            name: object::name(&snapshot.primary).to_owned(),
            bytes,
        })
    }

    /// The redacted recording of one kind call (see [`kind_recording`]),
    /// named after the controller and the primary kind; `None` when the
    /// plugin was not called.
    pub fn render_kind(&self, plugin: &LoadedPlugin, decided: &KindDecided) -> Option<Rendered> {
        let doc = kind_recording(&self.redactor, plugin, decided)?;
        let mut bytes = serde_json::to_vec_pretty(&doc).ok()?;
        bytes.push(b'\n');
        let snapshot = decided.snapshot.as_ref()?;
        Some(Rendered {
            controller: snapshot.controller.clone(),
            namespace: "kind".to_owned(),
            name: decided
                .primaries
                .first()
                .map(|p| object::kind(p).to_owned())
                .unwrap_or_default(),
            bytes,
        })
    }

    /// Writes a rendered recording, then drops the oldest recordings until
    /// the bound holds. Never fails the caller: errors are logged.
    pub fn write(&self, rendered: Rendered) {
        let Rendered {
            controller,
            namespace,
            name: primary_name,
            bytes,
        } = rendered;
        let size = bytes.len() as u64;
        if size > self.max_bytes {
            tracing::warn!(
                size,
                max = self.max_bytes,
                "recording larger than the whole --record bound; not written"
            );
            metrics::global().inc("wasmop_record_errors_total", &[("reason", "TooLarge")]);
            return;
        }
        let seq = self.seq.fetch_add(1, Ordering::SeqCst);
        let now = jiff::Timestamp::now().strftime("%Y%m%dT%H%M%SZ");
        let safe = |s: &str| -> String {
            s.chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '-' {
                        c
                    } else {
                        '_'
                    }
                })
                .take(60)
                .collect()
        };
        let name = format!(
            "{now}-{seq:08}-{}-{}-{}.json",
            safe(&controller),
            safe(&namespace),
            safe(&primary_name)
        );
        let path = self.dir.join(&name);
        let tmp = self.dir.join(format!(".{name}.tmp"));
        let written = std::fs::write(&tmp, &bytes).and_then(|()| std::fs::rename(&tmp, &path));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            tracing::warn!(file = %path.display(), error = %e, "cannot write a recording");
            metrics::global().inc("wasmop_record_errors_total", &[("reason", "WriteFailed")]);
            return;
        }
        metrics::global().inc("wasmop_recordings_total", &[]);
        self.account(path, size);
    }

    /// Counts a new file and deletes the oldest until the bound holds.
    fn account(&self, path: PathBuf, size: u64) {
        let mut files = self.files.lock().expect("recorder lock");
        files.0.push_back((path, size));
        files.1 += size;
        while files.1 > self.max_bytes {
            let Some((old, n)) = files.0.pop_front() else {
                break;
            };
            let _ = std::fs::remove_file(&old);
            files.1 = files.1.saturating_sub(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_values_are_replaced_and_scrubbed_everywhere() {
        let r = Redactor::new();
        let canary = "canary-5ecret-value";
        let encoded = B64.encode(canary);
        let mut secret = json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "s", "annotations": {
                "kubectl.kubernetes.io/last-applied-configuration":
                    format!("{{\"data\":{{\"k\":\"{encoded}\"}},\"short\":\"eHl6\"}}")
            }},
            "data": {"k": encoded, "short": "eHl6"},
            "stringData": {"p": "plain-text-password"},
        });
        let mut copy = json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"},
            "data": {"leak": format!("prefix {canary} suffix"), "b64": encoded,
                     "pw": "plain-text-password"},
        });
        let pairs = r.redact_secrets([&mut secret, &mut copy].into_iter());
        let mut doc = json!([secret, copy]);
        scrub(&mut doc, &pairs);
        let text = doc.to_string();
        for leaked in [canary, encoded.as_str(), "plain-text-password", "eHl6"] {
            assert!(!text.contains(leaked), "{leaked} in {text}");
        }
        // The same value always gives the same token in one process.
        let token = r.token(canary.as_bytes());
        assert!(text.contains(&format!("prefix {token} suffix")), "{text}");
        assert_eq!(doc[0]["data"]["k"], B64.encode(&token));
        assert_eq!(doc[1]["data"]["b64"], B64.encode(&token));
        // A second redactor (another process) gives other tokens.
        assert_ne!(Redactor::new().token(canary.as_bytes()), token);
    }

    #[test]
    fn a_secret_value_that_is_a_word_of_a_kind_leaves_the_kind_as_it_is() {
        let pairs = vec![("firebolt".to_owned(), "TOKEN".to_owned())];
        let mut v = json!({"apiVersion": "compute.firebolt.io/v1alpha1", "kind": "FireboltX",
                           "spec": {"user": "firebolt"}});
        scrub(&mut v, &pairs);
        assert_eq!(v["apiVersion"], "compute.firebolt.io/v1alpha1");
        assert_eq!(v["spec"]["user"], "TOKEN");
    }

    #[test]
    fn the_directory_stays_under_its_bound_oldest_dropped_first() {
        let dir = std::env::temp_dir().join(format!("wasmop-record-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let rec = Recorder::new(dir.clone(), 3000).unwrap();
        let push = |name: &str, size: usize| {
            let path = dir.join(name);
            std::fs::write(&path, vec![b'x'; size]).unwrap();
            rec.account(path, size as u64);
        };
        push("a.json", 1000);
        push("b.json", 1000);
        push("c.json", 1000);
        push("d.json", 1000);
        assert!(!dir.join("a.json").exists());
        assert!(dir.join("d.json").exists());
        // A new recorder counts what is already there.
        let again = Recorder::new(dir.clone(), 3000).unwrap();
        assert_eq!(again.files.lock().unwrap().1, 3000);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn secrets_in_every_object_plan_of_a_kind_call_are_found() {
        let secret = |name: &str| {
            json!({"object": {"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": name}, "data": {"k": B64.encode("kind-call-secret")}}})
        };
        let mut outcome = json!({"objects": [
            {"namespace": "ns", "name": "a", "apply": [secret("sa")]},
            {"namespace": "ns", "name": "b",
             "rejected": {"violations": [], "plan": {"apply": [secret("sb")]}}},
            {"namespace": "ns", "name": "c", "apply": []},
        ], "refused": []});
        let names: Vec<String> = plan_objects(&mut outcome)
            .iter()
            .map(|o| object::name(o).to_owned())
            .collect();
        assert_eq!(names, ["sa", "sb"]);
        // One object's plan, as before.
        let mut one = json!({"apply": [secret("s1")]});
        assert_eq!(plan_objects(&mut one).len(), 1);
        let mut failed = json!({"failed": {"reason": "PluginTrapped", "message": "x"}});
        assert!(plan_objects(&mut failed).is_empty());
        // And they are redacted and scrubbed like any other.
        let r = Redactor::new();
        let pairs = r.redact_secrets(plan_objects(&mut outcome).into_iter());
        scrub(&mut outcome, &pairs);
        let text = outcome.to_string();
        assert!(!text.contains(&B64.encode("kind-call-secret")), "{text}");
    }
}
