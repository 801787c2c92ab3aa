//! Go durations (`720h`, `1h30m`, `90s`, `250ms`) as the CRD's duration
//! fields spell them, and RFC 3339 timestamps for status.

use wasmop_sdk::k8s_openapi::jiff::Timestamp;

/// Seconds in a Go duration made of `<integer><unit>` parts (`h`, `m`,
/// `s`, `ms`; milliseconds are truncated); `None` when it does not parse.
pub fn seconds(text: &str) -> Option<i64> {
    let mut rest = text.trim();
    if rest.is_empty() {
        return None;
    }
    let mut millis: i64 = 0;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return None;
        }
        let n: i64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let scale = match &rest[..unit] {
            "h" => 3_600_000,
            "m" => 60_000,
            "s" => 1_000,
            "ms" => 1,
            _ => return None,
        };
        millis = millis.checked_add(n.checked_mul(scale)?)?;
        rest = &rest[unit..];
    }
    Some(millis / 1000)
}

/// RFC 3339 text of Unix seconds (`2025-01-01T00:00:00Z`).
pub fn rfc3339(seconds: i64) -> String {
    Timestamp::from_second(seconds).map_or_else(|_| String::new(), |t| t.to_string())
}

/// Unix seconds of RFC 3339 text.
pub fn parse_rfc3339(text: &str) -> Option<i64> {
    text.parse::<Timestamp>().ok().map(|t| t.as_second())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_and_timestamps() {
        assert_eq!(seconds("720h"), Some(720 * 3600));
        assert_eq!(seconds("1h30m"), Some(5400));
        assert_eq!(seconds("90s"), Some(90));
        assert_eq!(seconds("1500ms"), Some(1));
        for bad in ["", "h", "5", "5d", "-1h", "1.5h"] {
            assert_eq!(seconds(bad), None, "{bad}");
        }
        assert_eq!(rfc3339(1_735_689_600), "2025-01-01T00:00:00Z");
        assert_eq!(parse_rfc3339("2025-01-01T00:00:00Z"), Some(1_735_689_600));
        assert_eq!(parse_rfc3339("yesterday"), None);
    }
}
