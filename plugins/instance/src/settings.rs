//! The operator's settings for this plugin, checked at load by
//! [`validate`] and read on every reconcile as [`Settings`].
//!
//! | key | default | what |
//! | --- | --- | --- |
//! | `postgresImage` | [`DEFAULT_POSTGRES_IMAGE`] | image of the provisioned PostgreSQL |
//! | `metadataImage` | [`DEFAULT_METADATA_IMAGE`] | metadata service image, unless the instance's template names one |
//! | `envoyImage` | [`DEFAULT_ENVOY_IMAGE`] | gateway image, unless the instance's template names one |
//! | `postgresStorageSize` | `10Gi` | size of the provisioned PostgreSQL volume (used when the StatefulSet is created) |
//! | `clusterDomain` | `cluster.local` | DNS domain of the cluster, for the endpoints the plugin publishes |
//! | `credentialSeed` | empty | ignored (accepted so existing configurations load): the PostgreSQL password is random bytes the host generates |

use serde::Deserialize;
use serde_json::Value;
use wasmop_sdk::SettingsProblem;
use wasmop_sdk::settings::{only_keys, optional_string};

/// Default image of the provisioned PostgreSQL (upstream's choice).
pub const DEFAULT_POSTGRES_IMAGE: &str = "postgres:16-alpine";
/// Default image of the metadata service.
pub const DEFAULT_METADATA_IMAGE: &str = "ghcr.io/firebolt-db/metadata:latest";
/// Default image of the gateway.
pub const DEFAULT_ENVOY_IMAGE: &str = "envoyproxy/envoy:v1.36.4";
/// Default size of the provisioned PostgreSQL volume.
pub const DEFAULT_POSTGRES_STORAGE_SIZE: &str = "10Gi";
/// Default cluster DNS domain.
pub const DEFAULT_CLUSTER_DOMAIN: &str = "cluster.local";

const KEYS: [&str; 6] = [
    "postgresImage",
    "metadataImage",
    "envoyImage",
    "postgresStorageSize",
    "clusterDomain",
    "credentialSeed",
];

/// The plugin's settings, defaults filled in.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Settings {
    /// Image of the provisioned PostgreSQL.
    pub postgres_image: String,
    /// Default image of the metadata service.
    pub metadata_image: String,
    /// Default image of the gateway.
    pub envoy_image: String,
    /// Size of the provisioned PostgreSQL volume.
    pub postgres_storage_size: String,
    /// The cluster's DNS domain.
    pub cluster_domain: String,
    /// Ignored: once mixed into a derived PostgreSQL password, which the
    /// host now generates at random. Accepted so configurations that set it
    /// still load.
    pub credential_seed: String,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            postgres_image: DEFAULT_POSTGRES_IMAGE.to_owned(),
            metadata_image: DEFAULT_METADATA_IMAGE.to_owned(),
            envoy_image: DEFAULT_ENVOY_IMAGE.to_owned(),
            postgres_storage_size: DEFAULT_POSTGRES_STORAGE_SIZE.to_owned(),
            cluster_domain: DEFAULT_CLUSTER_DOMAIN.to_owned(),
            credential_seed: String::new(),
        }
    }
}

/// Checks the settings document.
///
/// # Errors
///
/// Every problem found: unknown keys, values that are not strings, empty
/// or blank-containing image names, a storage size that is not a
/// Kubernetes quantity, a cluster domain that is not a DNS name.
pub fn validate(settings: &Value) -> Result<(), Vec<SettingsProblem>> {
    only_keys(settings, &KEYS)?;
    let mut problems = Vec::new();
    for key in KEYS {
        if let Err(p) = optional_string(settings, key) {
            problems.extend(p);
        }
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    let text = |key: &str| settings.get(key).and_then(Value::as_str);
    for key in ["postgresImage", "metadataImage", "envoyImage"] {
        if let Some(image) = text(key)
            && (image.is_empty() || image.chars().any(char::is_whitespace))
        {
            problems.push(SettingsProblem::new(
                key,
                format!("`{key}` must be an image reference without blanks, got {image:?}"),
            ));
        }
    }
    if let Some(size) = text("postgresStorageSize")
        && !is_quantity(size)
    {
        problems.push(SettingsProblem::new(
            "postgresStorageSize",
            format!("`postgresStorageSize` must be a quantity such as 10Gi, got {size:?}"),
        ));
    }
    if let Some(domain) = text("clusterDomain")
        && !is_dns_name(domain)
    {
        problems.push(SettingsProblem::new(
            "clusterDomain",
            format!("`clusterDomain` must be a DNS name such as cluster.local, got {domain:?}"),
        ));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

/// A positive Kubernetes quantity with a binary or decimal suffix
/// (`512Mi`, `10Gi`, `1.5G`, `1000`).
fn is_quantity(s: &str) -> bool {
    const SUFFIXES: [&str; 13] = [
        "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "k", "M", "G", "T", "P", "E", "",
    ];
    SUFFIXES.iter().any(|suffix| {
        s.strip_suffix(suffix).is_some_and(|number| {
            let mut parts = number.splitn(2, '.');
            let whole = parts.next().unwrap_or_default();
            let fraction = parts.next();
            !whole.is_empty()
                && whole.bytes().all(|b| b.is_ascii_digit())
                && fraction.is_none_or(|f| !f.is_empty() && f.bytes().all(|b| b.is_ascii_digit()))
                && number.bytes().any(|b| (b'1'..=b'9').contains(&b))
        })
    })
}

/// Lowercase DNS labels joined by dots.
fn is_dns_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn no_settings_means_every_default() {
        assert_eq!(validate(&json!({})), Ok(()));
        let s: Settings = serde_json::from_value(json!({})).unwrap();
        assert_eq!(s, Settings::default());
        assert_eq!(s.postgres_image, "postgres:16-alpine");
    }

    #[test]
    fn known_settings_override_their_defaults() {
        let doc = json!({"envoyImage": "registry.local/envoy:1", "clusterDomain": "corp.internal",
                         "postgresStorageSize": "1.5Gi", "credentialSeed": "s3cr3t"});
        assert_eq!(validate(&doc), Ok(()));
        let s: Settings = serde_json::from_value(doc).unwrap();
        assert_eq!(s.envoy_image, "registry.local/envoy:1");
        assert_eq!(s.metadata_image, DEFAULT_METADATA_IMAGE);
        assert_eq!(s.cluster_domain, "corp.internal");
    }

    #[test]
    fn bad_values_are_each_reported_at_their_key() {
        let problems = validate(&json!({
            "envoyImage": "has blank", "postgresStorageSize": "lots",
            "clusterDomain": "Not_DNS", "metadataImage": "",
        }))
        .unwrap_err();
        let paths: Vec<&str> = problems.iter().map(|p| p.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "metadataImage",
                "envoyImage",
                "postgresStorageSize",
                "clusterDomain"
            ]
        );
    }

    #[test]
    fn unknown_keys_and_wrong_types_are_rejected() {
        assert_eq!(
            validate(&json!({"replicas": 3})).unwrap_err()[0].path,
            "replicas"
        );
        assert_eq!(
            validate(&json!({"envoyImage": 3})).unwrap_err()[0].message,
            "`envoyImage` must be a string, got number"
        );
    }

    #[test]
    fn quantities_need_a_positive_number_and_a_known_suffix() {
        for ok in ["10Gi", "512Mi", "1.5G", "1000", "1k"] {
            assert!(is_quantity(ok), "{ok}");
        }
        for bad in ["", "Gi", "0Gi", "10GB", "1.Gi", "-1Gi", "ten"] {
            assert!(!is_quantity(bad), "{bad}");
        }
    }
}
