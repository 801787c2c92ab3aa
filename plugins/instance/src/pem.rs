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

/// One DER element at the start of `der`: (tag, content, rest).
fn der_element(der: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = der.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (len, &rest[n..])
    };
    if rest.len() < len {
        return None;
    }
    Some((tag, &rest[..len], &rest[len..]))
}

/// The DER `SubjectPublicKeyInfo` of a DER X.509 certificate; `None` when
/// the bytes are not one.
pub fn subject_public_key_info(cert: &[u8]) -> Option<&[u8]> {
    const SEQUENCE: u8 = 0x30;
    let (tag, certificate, _) = der_element(cert)?;
    if tag != SEQUENCE {
        return None;
    }
    let (tag, tbs, _) = der_element(certificate)?;
    if tag != SEQUENCE {
        return None;
    }
    let mut rest = tbs;
    // [0] version (optional), serialNumber, signature, issuer, validity,
    // subject, then subjectPublicKeyInfo.
    if rest.first() == Some(&0xa0) {
        rest = der_element(rest)?.2;
    }
    for _ in 0..5 {
        rest = der_element(rest)?.2;
    }
    let (tag, _, after) = der_element(rest)?;
    if tag != SEQUENCE {
        return None;
    }
    Some(&rest[..rest.len() - after.len()])
}

/// Hex SHA-256 of the `SubjectPublicKeyInfo` of the first certificate in
/// PEM text (what `openssl x509 -pubkey | openssl pkey -pubin -outform DER
/// | sha256sum` prints): the identity of a key, whatever certificate
/// carries it.
pub fn public_key_fingerprint(pem: &[u8]) -> Option<String> {
    let der = certificates(pem).into_iter().next()?;
    subject_public_key_info(&der).map(fingerprint)
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

    #[test]
    fn the_public_key_fingerprint_matches_openssl_and_junk_has_none() {
        let pem = include_bytes!("testdata/ca-p384.crt");
        assert_eq!(
            public_key_fingerprint(pem).as_deref(),
            Some("b43e9fccf6cebe126c1e901b294413c5b3f38e874874ae0faf1ee2b081b6da5c")
        );
        assert_ne!(
            public_key_fingerprint(include_bytes!("testdata/ca-p256.crt")),
            public_key_fingerprint(pem)
        );
        assert_eq!(public_key_fingerprint(b"not pem"), None);
        assert_eq!(subject_public_key_info(&[0x30, 0x05, 0x30]), None);
    }
}
