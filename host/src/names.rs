//! Kubernetes name rules (DNS-1123), as the API server applies them to
//! object names and namespaces. Checked by the host before a write so a bad
//! name is reported as a plan violation instead of an API error halfway
//! through a plan.

/// Checks a DNS-1123 label: at most 63 characters of lowercase letters,
/// digits and `-`, starting and ending with a letter or digit. Namespaces
/// and many object names must be labels.
///
/// # Errors
///
/// A short reason, worded to follow the name (`"is longer than 63 characters"`).
pub fn dns1123_label(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("is empty");
    }
    if name.len() > 63 {
        return Err("is longer than 63 characters");
    }
    label_chars(name)
}

/// Checks a DNS-1123 subdomain: at most 253 characters, dot-separated
/// labels. This is the rule for most object names (ConfigMaps,
/// Deployments, custom resources).
///
/// # Errors
///
/// A short reason, worded to follow the name.
pub fn dns1123_subdomain(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("is empty");
    }
    if name.len() > 253 {
        return Err("is longer than 253 characters");
    }
    name.split('.').try_for_each(label_chars)
}

/// Checks a label key: an optional DNS-1123 subdomain prefix and `/`, then
/// a name of at most 63 characters of alphanumerics, `-`, `_` and `.`,
/// starting and ending with an alphanumeric.
///
/// # Errors
///
/// A short reason, worded to follow the key.
pub fn label_key(key: &str) -> Result<(), &'static str> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        dns1123_subdomain(prefix).map_err(|_| "has a prefix that is not a DNS-1123 subdomain")?;
    }
    let ok = |c: char| c.is_ascii_alphanumeric();
    if name.is_empty() || name.len() > 63 {
        return Err("must have a name part of 1 to 63 characters");
    }
    if !name.chars().all(|c| ok(c) || matches!(c, '-' | '_' | '.')) {
        return Err("may contain only alphanumerics, '-', '_' and '.' in its name part");
    }
    if !name.starts_with(ok) || !name.ends_with(ok) {
        return Err("must start and end its name part with an alphanumeric");
    }
    Ok(())
}

fn label_chars(label: &str) -> Result<(), &'static str> {
    let ok = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    if label.is_empty() {
        return Err("has an empty part between dots");
    }
    if !label.chars().all(|c| ok(c) || c == '-') {
        return Err("may contain only lowercase letters, digits, '-' and '.'");
    }
    if !label.starts_with(ok) || !label.ends_with(ok) {
        return Err("must start and end with a lowercase letter or digit");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_keys_take_an_optional_subdomain_prefix() {
        assert!(label_key("celld.eric.dev/fleet-uid").is_ok());
        assert!(label_key("app").is_ok());
        assert!(label_key("Bad_Prefix/x").is_err());
        assert!(label_key("a/").is_err());
        assert!(label_key("a/-x").is_err());
    }

    #[test]
    fn labels_accept_lowercase_alphanumerics_and_dashes() {
        assert!(dns1123_label("web-1").is_ok());
        assert!(dns1123_label("Web").is_err());
        assert!(dns1123_label("-web").is_err());
        assert!(dns1123_label("web.x").is_err());
        assert!(dns1123_label(&"a".repeat(64)).is_err());
    }

    #[test]
    fn subdomains_accept_dotted_labels() {
        assert!(dns1123_subdomain("web.example.com").is_ok());
        assert!(dns1123_subdomain("web..example").is_err());
        assert!(dns1123_subdomain("web_1").is_err());
        assert!(dns1123_subdomain("").is_err());
    }
}
