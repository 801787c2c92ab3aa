//! Secret values the host generates for a plan ([`GeneratedKey`]): random
//! bytes made at execution, never by the plugin, written once.
//!
//! # Guarantees
//!
//! - A generated key is written only while the Secret, as last seen at a
//!   known resourceVersion, lacks it (or holds it empty), by a merge patch
//!   fenced by that resourceVersion under the writer's
//!   [`generated manager`](super::writer::Writer::generated_manager): a
//!   value is never overwritten, and a Secret that changed meanwhile is a
//!   conflict, retried from a fresh snapshot.
//! - The applied body carries the annotation [`GENERATED_ANNOTATION`]
//!   (the generated key names, sorted) and never a value: the
//!   `wasmop.dev/applied` digest is taken over it, so it is the same on
//!   every replica and every reconcile, and a converged Secret is not
//!   written again.
//! - The bytes come from the operating system (`/dev/urandom`); when it
//!   cannot be read the write fails, never with a weaker value.

use std::io::Read as _;

use base64::Engine as _;
use serde_json::{Map, Value, json};

use crate::judge::validate::{GeneratedKey, SecretEncoding};

/// Annotation naming the keys of a Secret whose values the host generates
/// (comma-separated, sorted).
pub const GENERATED_ANNOTATION: &str = "wasmop.dev/generated-keys";

/// Puts [`GENERATED_ANNOTATION`] on `obj` when `keys` is not empty.
pub fn mark(obj: &mut Value, keys: &[GeneratedKey]) {
    if keys.is_empty() {
        return;
    }
    let mut names: Vec<&str> = keys.iter().map(|k| k.key.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    let ann = meta
        .entry("annotations")
        .or_insert_with(|| Value::Object(Map::new()));
    if !ann.is_object() {
        *ann = json!({});
    }
    ann[GENERATED_ANNOTATION] = json!(names.join(","));
}

/// The keys of `keys` that `present` (the non-empty `data` keys of the
/// Secret as last seen) lacks.
pub fn missing<'k>(
    keys: &'k [GeneratedKey],
    present: &std::collections::BTreeSet<String>,
) -> Vec<&'k GeneratedKey> {
    keys.iter().filter(|k| !present.contains(&k.key)).collect()
}

/// Fresh values for `keys`, as a Secret's `data` (base64 of the encoded
/// bytes).
///
/// # Errors
///
/// When the operating system's random source cannot be read.
pub fn values(keys: &[&GeneratedKey]) -> std::io::Result<Map<String, Value>> {
    let mut source = std::fs::File::open("/dev/urandom")?;
    let mut out = Map::new();
    for k in keys {
        let mut bytes = vec![0u8; usize::from(k.bytes)];
        source.read_exact(&mut bytes)?;
        let encoded = encode(&bytes, k.encoding);
        out.insert(
            k.key.clone(),
            json!(base64::engine::general_purpose::STANDARD.encode(encoded)),
        );
    }
    Ok(out)
}

/// `bytes` written as `encoding`.
fn encode(bytes: &[u8], encoding: SecretEncoding) -> Vec<u8> {
    match encoding {
        SecretEncoding::Hex => bytes
            .iter()
            .flat_map(|b| {
                let hex = b"0123456789abcdef";
                [hex[usize::from(b >> 4)], hex[usize::from(b & 15)]]
            })
            .collect(),
        SecretEncoding::Base64url => base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(bytes)
            .into_bytes(),
        SecretEncoding::Raw => bytes.to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str, bytes: u16, encoding: SecretEncoding) -> GeneratedKey {
        GeneratedKey::hex(name, bytes).encoded(encoding)
    }

    #[test]
    fn values_are_random_of_the_asked_length_and_encoding() {
        let keys = [
            key("hex", 16, SecretEncoding::Hex),
            key("url", 32, SecretEncoding::Base64url),
            key("raw", 20, SecretEncoding::Raw),
        ];
        let refs: Vec<&GeneratedKey> = keys.iter().collect();
        let decode = |m: &Map<String, Value>, k: &str| {
            base64::engine::general_purpose::STANDARD
                .decode(m[k].as_str().unwrap())
                .unwrap()
        };
        let a = values(&refs).unwrap();
        let b = values(&refs).unwrap();
        let hex = decode(&a, "hex");
        assert_eq!(hex.len(), 32);
        assert!(hex.iter().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(decode(&a, "url").len(), 43);
        assert_eq!(decode(&a, "raw").len(), 20);
        for k in ["hex", "url", "raw"] {
            assert_ne!(a[k], b[k], "{k}: two draws differ");
        }
    }

    #[test]
    fn the_mark_names_the_keys_and_only_missing_keys_are_filled() {
        let keys = [
            GeneratedKey::hex("password", 16),
            GeneratedKey::hex("api-key", 16),
        ];
        let mut obj = json!({"metadata": {"name": "s"}});
        mark(&mut obj, &keys);
        assert_eq!(
            obj["metadata"]["annotations"][GENERATED_ANNOTATION],
            "api-key,password"
        );
        let present = ["password".to_owned()].into();
        let want: Vec<&str> = missing(&keys, &present)
            .iter()
            .map(|k| k.key.as_str())
            .collect();
        assert_eq!(want, ["api-key"]);
        let mut plain = json!({"metadata": {"name": "s"}});
        mark(&mut plain, &[]);
        assert!(plain["metadata"].get("annotations").is_none());
    }
}
