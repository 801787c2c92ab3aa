//! A stable content hash for rollout annotations: [`stable_hash`].
//!
//! Put the hash of a workload's configuration into its pod template's
//! annotations and the pods roll exactly when the configuration changes.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// Number of hex characters [`stable_hash`] returns (64 bits).
pub const STABLE_HASH_LEN: usize = 16;

/// The SHA-256 of `value`'s canonical JSON, as the first
/// [`STABLE_HASH_LEN`] lowercase hex characters.
///
/// # Guarantees
///
/// Equal values hash equally whatever the order of their object keys:
/// canonical JSON sorts keys (by their UTF-8 bytes), has no whitespace, and
/// writes strings and numbers as `serde_json` does. The result does not
/// depend on the platform or on `serde_json` features such as
/// `preserve_order`.
pub fn stable_hash(value: &Value) -> String {
    let mut canonical = String::new();
    write_canonical(value, &mut canonical);
    let digest = Sha256::digest(canonical.as_bytes());
    let mut hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    hex.truncate(STABLE_HASH_LEN);
    hex
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (key, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                crate::json::write_str(key, out);
                out.push(':');
                write_canonical(v, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(v, out);
            }
            out.push(']');
        }
        Value::String(s) => crate::json::write_str(s, out),
        Value::Number(n) => {
            use std::fmt::Write;
            // `Number`'s Display is how serde_json writes it.
            let _ = write!(out, "{n}");
        }
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Null => out.push_str("null"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn key_order_does_not_change_the_hash() {
        let a: Value = serde_json::from_str(r#"{"b":1,"a":{"y":[1,2],"x":"s"}}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"a":{"x":"s","y":[1,2]},"b":1}"#).unwrap();
        assert_eq!(stable_hash(&a), stable_hash(&b));
    }

    #[test]
    fn different_values_hash_differently() {
        assert_ne!(stable_hash(&json!({"a": 1})), stable_hash(&json!({"a": 2})));
        assert_ne!(stable_hash(&json!([1, 2])), stable_hash(&json!([2, 1])));
        assert_ne!(
            stable_hash(&json!({"a": "1"})),
            stable_hash(&json!({"a": 1}))
        );
    }

    /// The canonical text is serde_json's text of the value with its keys
    /// sorted: strings that need escapes and those that do not, non-ASCII
    /// text, every kind of number.
    #[test]
    fn canonical_text_is_serde_jsons_text_with_sorted_keys() {
        let value = json!({
            "plain": "nginx:1.27 -- a/b?c=d&e",
            "quote\"key": "say \"hi\"",
            "back\\slash": "C:\\dir\\file",
            "control": "line\nnext\ttab\u{1}\u{1f}",
            "del and unicode": "\u{7f} café ünïcödé 日本 🚀",
            "numbers": [0, 1, -1, 18446744073709551615u64, -9223372036854775808i64,
                        0.5, -2.25, 1e300, 1.5e-7, 3.0],
            "nested": {"z": [true, false, null], "a": {}, "m": []},
            "": "",
        });
        let mut canonical = String::new();
        write_canonical(&value, &mut canonical);
        // serde_json's text (its map is sorted unless `preserve_order` is
        // on; sort through a BTreeMap to be sure).
        fn sorted(v: &Value) -> Value {
            match v {
                Value::Object(m) => {
                    let by_key: std::collections::BTreeMap<&String, Value> =
                        m.iter().map(|(k, v)| (k, sorted(v))).collect();
                    let mut out = serde_json::Map::new();
                    for (k, v) in by_key {
                        out.insert(k.clone(), v);
                    }
                    Value::Object(out)
                }
                Value::Array(a) => Value::Array(a.iter().map(sorted).collect()),
                other => other.clone(),
            }
        }
        assert_eq!(canonical, sorted(&value).to_string());
    }

    #[test]
    fn hash_is_sixteen_hex_chars_of_the_sha256_of_canonical_json() {
        // `printf '%s' '{"a":1,"b":[true,null]}' | sha256sum` starts so.
        let h = stable_hash(&json!({"b": [true, null], "a": 1}));
        assert_eq!(h, "1cc69c7fa23616ca");
        let mut canonical = String::new();
        write_canonical(&json!({"b": [true, null], "a": 1}), &mut canonical);
        assert_eq!(canonical, r#"{"a":1,"b":[true,null]}"#);
    }
}
