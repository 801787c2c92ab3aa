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
                out.push_str(&Value::String(key.clone()).to_string());
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
        scalar => out.push_str(&scalar.to_string()),
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
