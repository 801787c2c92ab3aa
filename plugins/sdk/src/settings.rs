//! Settings checks: [`SettingsProblem`] and helpers for
//! [`crate::Plugin::validate_settings`].

use serde_json::Value;

pub use wasmop_contract::SettingsProblem;

/// Checks that `settings` is a JSON object whose keys are all in `allowed`.
///
/// # Errors
///
/// One problem per unknown key (in key order), or one problem for the whole
/// document when it is not an object.
pub fn only_keys(settings: &Value, allowed: &[&str]) -> Result<(), Vec<SettingsProblem>> {
    let Some(map) = settings.as_object() else {
        return Err(vec![SettingsProblem::new(
            "",
            "settings must be a JSON object",
        )]);
    };
    let mut unknown: Vec<&String> = map
        .keys()
        .filter(|k| !allowed.contains(&k.as_str()))
        .collect();
    unknown.sort();
    if unknown.is_empty() {
        return Ok(());
    }
    let known = if allowed.is_empty() {
        "this plugin takes no settings".to_owned()
    } else {
        format!("known settings: {}", allowed.join(", "))
    };
    Err(unknown
        .into_iter()
        .map(|k| SettingsProblem::new(k.as_str(), format!("unknown setting `{k}` ({known})")))
        .collect())
}

/// Checks that `settings[key]`, when present, is a string.
///
/// # Errors
///
/// One problem at `key` when the value is present and not a string.
pub fn optional_string(settings: &Value, key: &str) -> Result<(), Vec<SettingsProblem>> {
    match settings.get(key) {
        None | Some(Value::String(_)) => Ok(()),
        Some(other) => Err(vec![SettingsProblem::new(
            key,
            format!("`{key}` must be a string, got {}", json_type(other)),
        )]),
    }
}

/// The JSON type name of a value, for messages: `null`, `boolean`, `number`,
/// `string`, `array` or `object`.
pub fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_keys_names_each_unknown_key_and_accepts_known_ones() {
        assert_eq!(only_keys(&json!({"label": "x"}), &["label"]), Ok(()));
        let problems =
            only_keys(&json!({"zeta": 1, "alpha": 2, "label": "x"}), &["label"]).unwrap_err();
        let paths: Vec<&str> = problems.iter().map(|p| p.path.as_str()).collect();
        assert_eq!(paths, ["alpha", "zeta"]);
        assert!(problems[0].message.contains("known settings: label"));
    }

    #[test]
    fn only_keys_rejects_a_non_object_document() {
        let problems = only_keys(&json!([1]), &[]).unwrap_err();
        assert_eq!(
            problems,
            vec![SettingsProblem::new("", "settings must be a JSON object")]
        );
    }

    #[test]
    fn optional_string_rejects_other_types() {
        assert!(optional_string(&json!({}), "label").is_ok());
        assert!(optional_string(&json!({"label": "v"}), "label").is_ok());
        let problems = optional_string(&json!({"label": 3}), "label").unwrap_err();
        assert_eq!(problems[0].path, "label");
        assert_eq!(problems[0].message, "`label` must be a string, got number");
    }
}
