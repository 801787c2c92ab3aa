//! Label selectors in kubectl syntax, as a manifest's `labels(...)` read
//! uses them: `app=web,tier in (a,b),!legacy`.
//!
//! Supported requirements, joined by commas (all must hold):
//! `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k` (exists) and
//! `!k` (does not exist). As in Kubernetes, `k!=v` and `k notin (…)` also
//! match objects without the label. An empty selector matches everything.

use std::collections::BTreeMap;

use thiserror::Error;

/// Why a selector text could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SelectorError {
    /// A requirement has no label key (`=v`, `in (a)`).
    #[error("requirement {requirement:?} has no label key")]
    MissingKey {
        /// The offending requirement text.
        requirement: String,
    },
    /// A set requirement's value list is not a parenthesised list.
    #[error("requirement {requirement:?}: expected a list like (a,b)")]
    BadSet {
        /// The offending requirement text.
        requirement: String,
    },
    /// A key or value contains characters labels never have.
    #[error("requirement {requirement:?}: {text:?} is not a valid label key or value")]
    BadToken {
        /// The offending requirement text.
        requirement: String,
        /// The key or value that is not valid.
        text: String,
    },
    /// Parentheses that do not pair up.
    #[error("unbalanced parentheses in selector {selector:?}")]
    Unbalanced {
        /// The whole selector text.
        selector: String,
    },
}

/// One requirement of a selector.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

impl Requirement {
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Requirement::Equals(k, v) => labels.get(k) == Some(v),
            Requirement::NotEquals(k, v) => labels.get(k) != Some(v),
            Requirement::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::DoesNotExist(k) => !labels.contains_key(k),
        }
    }
}

/// A parsed label selector.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

impl LabelSelector {
    /// Parses kubectl selector syntax.
    ///
    /// # Errors
    ///
    /// A [`SelectorError`] naming the requirement that does not parse.
    pub fn parse(text: &str) -> Result<Self, SelectorError> {
        let mut requirements = Vec::new();
        for part in split_top_level(text)? {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            requirements.push(parse_requirement(part)?);
        }
        Ok(LabelSelector { requirements })
    }

    /// True when every requirement holds for `labels`.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }
}

/// Parses `selector` and tests it against `labels` in one step. A
/// selector that does not parse matches nothing (manifests are checked at
/// load, so a loaded plugin's selectors always parse); use
/// [`LabelSelector::parse`] to see the error.
pub fn selector_matches(selector: &str, labels: &BTreeMap<String, String>) -> bool {
    LabelSelector::parse(selector).is_ok_and(|s| s.matches(labels))
}

/// Splits on commas outside parentheses.
fn split_top_level(text: &str) -> Result<Vec<&str>, SelectorError> {
    let unbalanced = || SelectorError::Unbalanced {
        selector: text.to_owned(),
    };
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.checked_sub(1).ok_or_else(unbalanced)?,
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(unbalanced());
    }
    parts.push(&text[start..]);
    Ok(parts)
}

fn parse_requirement(part: &str) -> Result<Requirement, SelectorError> {
    let key = |k: &str| -> Result<String, SelectorError> {
        let k = k.trim();
        if k.is_empty() {
            return Err(SelectorError::MissingKey {
                requirement: part.to_owned(),
            });
        }
        token(part, k, true)
    };
    let value = |v: &str| token(part, v.trim(), false);

    if let Some(rest) = part.strip_prefix('!') {
        return Ok(Requirement::DoesNotExist(key(rest)?));
    }
    if let Some((k, v)) = part.split_once("!=") {
        return Ok(Requirement::NotEquals(key(k)?, value(v)?));
    }
    if let Some((k, v)) = part.split_once("==") {
        return Ok(Requirement::Equals(key(k)?, value(v)?));
    }
    if let Some((k, v)) = part.split_once('=') {
        return Ok(Requirement::Equals(key(k)?, value(v)?));
    }
    if let Some((k, rest)) = split_keyword(part, "notin") {
        return Ok(Requirement::NotIn(key(k)?, set(part, rest)?));
    }
    if let Some((k, rest)) = split_keyword(part, "in") {
        return Ok(Requirement::In(key(k)?, set(part, rest)?));
    }
    Ok(Requirement::Exists(key(part)?))
}

/// Splits `key <keyword> (…)` at the keyword, which must stand alone.
fn split_keyword<'a>(part: &'a str, keyword: &str) -> Option<(&'a str, &'a str)> {
    let mut words = part.splitn(2, char::is_whitespace);
    let k = words.next()?;
    let rest = words.next()?.trim_start();
    let after = rest.strip_prefix(keyword)?;
    (after.starts_with(char::is_whitespace) || after.starts_with('(')).then_some((k, after))
}

fn set(part: &str, rest: &str) -> Result<Vec<String>, SelectorError> {
    let inner = rest
        .trim()
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| SelectorError::BadSet {
            requirement: part.to_owned(),
        })?;
    inner
        .split(',')
        .map(|v| token(part, v.trim(), false))
        .collect()
}

/// Checks a label key (`prefix/name`) or value against the label alphabet.
fn token(part: &str, text: &str, is_key: bool) -> Result<String, SelectorError> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    let valid = if is_key {
        let name = text.rsplit_once('/').map_or(text, |(_, n)| n);
        !name.is_empty()
            && text.chars().all(|c| allowed(c) || c == '/')
            && text.matches('/').count() <= 1
    } else {
        text.chars().all(allowed)
    };
    if valid {
        Ok(text.to_owned())
    } else {
        Err(SelectorError::BadToken {
            requirement: part.to_owned(),
            text: text.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn matches(selector: &str, pairs: &[(&str, &str)]) -> bool {
        LabelSelector::parse(selector)
            .expect("selector parses")
            .matches(&labels(pairs))
    }

    #[test]
    fn equality_forms_match_exact_values() {
        assert!(matches("app=web", &[("app", "web")]));
        assert!(matches("app==web", &[("app", "web")]));
        assert!(!matches("app=web", &[("app", "db")]));
        assert!(!matches("app=web", &[]));
    }

    #[test]
    fn inequality_matches_missing_labels_too() {
        assert!(matches("app!=web", &[("app", "db")]));
        assert!(matches("app!=web", &[]));
        assert!(!matches("app!=web", &[("app", "web")]));
    }

    #[test]
    fn set_requirements_follow_kubernetes() {
        assert!(matches("tier in (a, b)", &[("tier", "b")]));
        assert!(!matches("tier in (a,b)", &[]));
        assert!(matches("tier notin (a,b)", &[("tier", "c")]));
        assert!(matches("tier notin (a,b)", &[]));
        assert!(!matches("tier notin (a,b)", &[("tier", "a")]));
    }

    #[test]
    fn existence_requirements() {
        assert!(matches("legacy", &[("legacy", "")]));
        assert!(!matches("legacy", &[]));
        assert!(matches("!legacy", &[]));
        assert!(!matches("!legacy", &[("legacy", "yes")]));
    }

    #[test]
    fn requirements_combine_with_and() {
        let sel = "app=web,tier in (a,b),!legacy,example.com/team";
        assert!(matches(
            sel,
            &[("app", "web"), ("tier", "a"), ("example.com/team", "x")]
        ));
        assert!(!matches(
            sel,
            &[("app", "web"), ("tier", "a"), ("legacy", "1")]
        ));
    }

    #[test]
    fn an_empty_selector_matches_everything() {
        assert!(matches("", &[]));
        assert!(matches("", &[("a", "b")]));
    }

    #[test]
    fn broken_selectors_are_rejected() {
        assert!(LabelSelector::parse("app in (a").is_err());
        assert!(LabelSelector::parse("=web").is_err());
        assert!(LabelSelector::parse("app in a,b").is_err());
        assert!(LabelSelector::parse("app=we b").is_err());
    }

    #[test]
    fn keys_named_like_keywords_still_parse() {
        assert!(matches("in=x", &[("in", "x")]));
        assert!(matches("index", &[("index", "1")]));
    }
}
