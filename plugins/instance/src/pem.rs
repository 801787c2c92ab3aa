//! Reading certificate material out of Secrets: base64 `data` values, PEM
//! certificate blocks, and SHA-256 fingerprints (hex, lower case, of the
//! DER certificate — what `openssl x509 -fingerprint -sha256` prints,
//! without colons).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The decoded value of `data.<key>` of a Secret; `None` when absent,
/// empty or not base64.
pub fn secret_bytes(secret: &Value, key: &str) -> Option<Vec<u8>> {
    let text = secret.get("data")?.get(key)?.as_str()?;
    STANDARD.decode(text).ok().filter(|b| !b.is_empty())
}

/// Whether a Secret holds a non-empty value under every key in `keys`.
pub fn has_keys(secret: &Value, keys: &[&str]) -> bool {
    keys.iter().all(|k| secret_bytes(secret, k).is_some())
}

/// The DER bytes of every `CERTIFICATE` block in PEM text, in order.
/// Blocks that do not decode are skipped.
pub fn certificates(pem: &[u8]) -> Vec<Vec<u8>> {
    let text = String::from_utf8_lossy(pem);
    let mut out = Vec::new();
    let mut rest = text.as_ref();
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    while let Some(start) = rest.find(BEGIN) {
        let body_start = start + BEGIN.len();
        let Some(len) = rest[body_start..].find(END) else {
            break;
        };
        let body: String = rest[body_start..body_start + len]
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        if let Ok(der) = STANDARD.decode(body) {
            out.push(der);
        }
        rest = &rest[body_start + len + END.len()..];
    }
    out
}

/// Hex SHA-256 of DER bytes.
pub fn fingerprint(der: &[u8]) -> String {
    Sha256::digest(der)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// PEM text of one DER certificate.
pub fn to_pem(der: &[u8]) -> String {
    let body = STANDARD.encode(der);
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in body.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

/// Base64 of bytes (for a Secret's `data`).
pub fn encode(bytes: &[u8]) -> String {
    STANDARD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const P384: &str = include_str!("testdata/ca-p384.crt");
    const P256: &str = include_str!("testdata/ca-p256.crt");

    #[test]
    fn fingerprints_match_openssl() {
        let certs = certificates(format!("{P384}{P256}").as_bytes());
        assert_eq!(certs.len(), 2);
        assert_eq!(
            fingerprint(&certs[0]),
            "fad3cac8b473ff0c7974841c057f6102c25265e18638c58c3bf20f19e47c79f8"
        );
        assert_eq!(
            fingerprint(&certs[1]),
            "1b9ded21d19f31076afe0e038872063c847f39aece82d4801bb207bb226ade74"
        );
        assert_eq!(
            certificates(to_pem(&certs[0]).as_bytes()),
            vec![certs[0].clone()]
        );
    }

    #[test]
    fn secret_values_decode_and_empty_counts_as_missing() {
        let s = json!({"data": {"ca.crt": encode(P384.as_bytes()), "tls.key": ""}});
        assert_eq!(secret_bytes(&s, "ca.crt").unwrap(), P384.as_bytes());
        assert!(secret_bytes(&s, "tls.key").is_none());
        assert!(secret_bytes(&s, "tls.crt").is_none());
        assert!(has_keys(&s, &["ca.crt"]) && !has_keys(&s, &["ca.crt", "tls.key"]));
        assert!(certificates(b"garbage").is_empty());
    }
}
