//! The plugin's settings: where backups run and how their Pods reach etcd.
//!
//! Every setting is optional; [`Settings::parse`] fills the defaults and
//! reports every problem at once, so `validate_settings` and `reconcile`
//! read the settings the same way.
//!
//! | setting | default | what |
//! | --- | --- | --- |
//! | `targetNamespace` | `openshift-etcd` | namespace of the backup Jobs, the CronJobs and the PVCs |
//! | `image` | [`DEFAULT_IMAGE`] | image of every backup container (it must provide `cluster-etcd-operator`) |
//! | `etcdEndpoints` | none | etcd client URLs, passed as `ETCDCTL_ENDPOINTS`; when absent the backup tool finds etcd itself |
//! | `etcdClientSecret` | `etcd-client` | Secret with `tls.crt` and `tls.key` for etcd |
//! | `etcdCaConfigMap` | `etcd-ca-bundle` | ConfigMap with `ca-bundle.crt` for etcd |
//! | `serviceAccountName` | `etcd-backup-sa` | ServiceAccount of the scheduled runs (it must be allowed to create EtcdBackups) |
//! | `nodeSelector` | `{"node-role.kubernetes.io/master": ""}` | where backup Pods run (etcd's nodes) |
//! | `priorityClassName` | `system-node-critical` | priority of the backup Pods; empty for none |
//! | `backupDeadlineSeconds` | 900 | a backup Job's `activeDeadlineSeconds`: the Job controller fails a backup Job that has not ended by then, whatever its Pod's state |
//! | `schedulingTimeoutSeconds` | 300 | a backup whose Pod stays unschedulable this long fails, and its Job is deleted |
//! | `orphanGraceSeconds` | 60 | a backup requested by a Job the operator does not see is deleted only once it is this old |

use std::collections::BTreeMap;

use serde_json::Value;
use wasmop_sdk::settings::{json_type, only_keys};
use wasmop_sdk::{ReconcileError, SettingsProblem};

/// Namespace of the backup workloads unless `targetNamespace` says otherwise
/// (upstream's fixed namespace).
pub const DEFAULT_TARGET_NAMESPACE: &str = "openshift-etcd";
/// Image of the backup containers unless `image` says otherwise.
pub const DEFAULT_IMAGE: &str = "quay.io/openshift/origin-cluster-etcd-operator:latest";
/// Secret holding the etcd client certificate unless `etcdClientSecret` says otherwise.
pub const DEFAULT_ETCD_CLIENT_SECRET: &str = "etcd-client";
/// ConfigMap holding the etcd CA bundle unless `etcdCaConfigMap` says otherwise.
pub const DEFAULT_ETCD_CA_CONFIG_MAP: &str = "etcd-ca-bundle";
/// ServiceAccount of scheduled runs unless `serviceAccountName` says otherwise.
pub const DEFAULT_SERVICE_ACCOUNT: &str = "etcd-backup-sa";
/// Label of the nodes backup Pods run on unless `nodeSelector` says otherwise.
pub const DEFAULT_NODE_ROLE_LABEL: &str = "node-role.kubernetes.io/master";
/// Priority class of backup Pods unless `priorityClassName` says otherwise.
pub const DEFAULT_PRIORITY_CLASS: &str = "system-node-critical";
/// A backup Job's deadline unless `backupDeadlineSeconds` says otherwise
/// (upstream's Pod deadline).
pub const DEFAULT_BACKUP_DEADLINE_SECONDS: u32 = 900;
/// How long a backup Pod may stay unschedulable unless
/// `schedulingTimeoutSeconds` says otherwise.
pub const DEFAULT_SCHEDULING_TIMEOUT_SECONDS: u32 = 300;
/// How old a backup whose requesting Job the operator does not see must be
/// before it is deleted, unless `orphanGraceSeconds` says otherwise.
pub const DEFAULT_ORPHAN_GRACE_SECONDS: u32 = 60;

const KEYS: &[&str] = &[
    "targetNamespace",
    "image",
    "etcdEndpoints",
    "etcdClientSecret",
    "etcdCaConfigMap",
    "serviceAccountName",
    "nodeSelector",
    "priorityClassName",
    "backupDeadlineSeconds",
    "schedulingTimeoutSeconds",
    "orphanGraceSeconds",
];

/// The settings with every default filled in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Namespace of the backup Jobs, the CronJobs and the PVCs.
    pub target_namespace: String,
    /// Image of every backup container.
    pub image: String,
    /// etcd client URLs; empty when the backup tool finds etcd itself.
    pub etcd_endpoints: Vec<String>,
    /// Secret with the etcd client certificate and key.
    pub etcd_client_secret: String,
    /// ConfigMap with the etcd CA bundle.
    pub etcd_ca_config_map: String,
    /// ServiceAccount of the scheduled runs.
    pub service_account_name: String,
    /// Node selector of the backup Pods.
    pub node_selector: BTreeMap<String, String>,
    /// Priority class of the backup Pods; empty for none.
    pub priority_class_name: String,
    /// `activeDeadlineSeconds` of every backup Job.
    pub backup_deadline_seconds: u32,
    /// How long a backup Pod may stay unschedulable before its backup fails.
    pub scheduling_timeout_seconds: u32,
    /// How old a backup whose requesting Job is not seen must be before it
    /// is deleted as an orphan.
    pub orphan_grace_seconds: u32,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            target_namespace: DEFAULT_TARGET_NAMESPACE.to_owned(),
            image: DEFAULT_IMAGE.to_owned(),
            etcd_endpoints: Vec::new(),
            etcd_client_secret: DEFAULT_ETCD_CLIENT_SECRET.to_owned(),
            etcd_ca_config_map: DEFAULT_ETCD_CA_CONFIG_MAP.to_owned(),
            service_account_name: DEFAULT_SERVICE_ACCOUNT.to_owned(),
            node_selector: BTreeMap::from([(DEFAULT_NODE_ROLE_LABEL.to_owned(), String::new())]),
            priority_class_name: DEFAULT_PRIORITY_CLASS.to_owned(),
            backup_deadline_seconds: DEFAULT_BACKUP_DEADLINE_SECONDS,
            scheduling_timeout_seconds: DEFAULT_SCHEDULING_TIMEOUT_SECONDS,
            orphan_grace_seconds: DEFAULT_ORPHAN_GRACE_SECONDS,
        }
    }
}

impl Settings {
    /// Reads the settings document, filling defaults.
    ///
    /// # Errors
    ///
    /// Every problem found: unknown keys, values of the wrong type, names
    /// that are not valid Kubernetes names, endpoints that are not
    /// `http(s)://` URLs, an empty image.
    pub fn parse(settings: &Value) -> Result<Settings, Vec<SettingsProblem>> {
        only_keys(settings, KEYS)?;
        let mut problems = Vec::new();
        let mut out = Settings::default();

        if let Some(ns) = string(settings, "targetNamespace", &mut problems) {
            match dns1123_label(&ns) {
                Ok(()) => out.target_namespace = ns,
                Err(why) => problems.push(SettingsProblem::new(
                    "targetNamespace",
                    format!("namespace {ns:?} {why}"),
                )),
            }
        }
        if let Some(image) = string(settings, "image", &mut problems) {
            if image.is_empty() || image.chars().any(char::is_whitespace) {
                problems.push(SettingsProblem::new(
                    "image",
                    format!("image {image:?} must be non-empty and without blanks"),
                ));
            } else {
                out.image = image;
            }
        }
        for (key, slot) in [
            ("etcdClientSecret", &mut out.etcd_client_secret),
            ("etcdCaConfigMap", &mut out.etcd_ca_config_map),
            ("serviceAccountName", &mut out.service_account_name),
        ] {
            if let Some(name) = string(settings, key, &mut problems) {
                match dns1123_subdomain(&name) {
                    Ok(()) => *slot = name,
                    Err(why) => {
                        problems.push(SettingsProblem::new(key, format!("name {name:?} {why}")))
                    }
                }
            }
        }
        if let Some(class) = string(settings, "priorityClassName", &mut problems) {
            match dns1123_subdomain(&class) {
                Err(why) if !class.is_empty() => problems.push(SettingsProblem::new(
                    "priorityClassName",
                    format!("name {class:?} {why}"),
                )),
                _ => out.priority_class_name = class,
            }
        }
        match settings.get("etcdEndpoints") {
            None => {}
            Some(Value::Array(items)) => {
                for (i, item) in items.iter().enumerate() {
                    let path = format!("etcdEndpoints.{i}");
                    match item.as_str() {
                        Some(url) if is_endpoint(url) => out.etcd_endpoints.push(url.to_owned()),
                        Some(url) => problems.push(SettingsProblem::new(
                            path,
                            format!("endpoint {url:?} must be an http:// or https:// URL without blanks or commas"),
                        )),
                        None => problems.push(SettingsProblem::new(
                            path,
                            format!("an endpoint must be a string, got {}", json_type(item)),
                        )),
                    }
                }
            }
            Some(other) => problems.push(SettingsProblem::new(
                "etcdEndpoints",
                format!(
                    "`etcdEndpoints` must be a list of URLs, got {}",
                    json_type(other)
                ),
            )),
        }
        match settings.get("nodeSelector") {
            None => {}
            Some(Value::Object(map)) => {
                out.node_selector.clear();
                for (key, value) in map {
                    let path = format!("nodeSelector.{key}");
                    match value.as_str() {
                        Some(v) if !key.is_empty() => {
                            out.node_selector.insert(key.clone(), v.to_owned());
                        }
                        Some(_) => problems.push(SettingsProblem::new(
                            path,
                            "a node selector key must be non-empty",
                        )),
                        None => problems.push(SettingsProblem::new(
                            path,
                            format!(
                                "a node selector value must be a string, got {}",
                                json_type(value)
                            ),
                        )),
                    }
                }
            }
            Some(other) => problems.push(SettingsProblem::new(
                "nodeSelector",
                format!(
                    "`nodeSelector` must be an object of labels, got {}",
                    json_type(other)
                ),
            )),
        }
        for (key, slot) in [
            ("backupDeadlineSeconds", &mut out.backup_deadline_seconds),
            (
                "schedulingTimeoutSeconds",
                &mut out.scheduling_timeout_seconds,
            ),
            ("orphanGraceSeconds", &mut out.orphan_grace_seconds),
        ] {
            if let Some(value) = settings.get(key) {
                match value.as_u64().and_then(|n| u32::try_from(n).ok()) {
                    Some(n) if n >= 1 => *slot = n,
                    _ => problems.push(SettingsProblem::new(
                        key,
                        format!(
                            "`{key}` must be a whole number of seconds from 1 to {}, got {value}",
                            u32::MAX
                        ),
                    )),
                }
            }
        }
        if problems.is_empty() {
            Ok(out)
        } else {
            Err(problems)
        }
    }

    /// The settings of a reconcile.
    ///
    /// # Errors
    ///
    /// [`ReconcileError::Internal`]: the host validated the settings at
    /// load, so settings that do not parse here are a bug.
    pub fn of(settings: &Value) -> Result<Settings, ReconcileError> {
        Settings::parse(settings).map_err(|problems| {
            let text: Vec<String> = problems
                .iter()
                .map(|p| format!("{}: {}", p.path, p.message))
                .collect();
            ReconcileError::internal(format!("settings: {}", text.join("; ")))
        })
    }
}

/// The string at `key`, when present; a problem when it is not a string.
fn string(settings: &Value, key: &str, problems: &mut Vec<SettingsProblem>) -> Option<String> {
    match settings.get(key)? {
        Value::String(s) => Some(s.clone()),
        other => {
            problems.push(SettingsProblem::new(
                key,
                format!("`{key}` must be a string, got {}", json_type(other)),
            ));
            None
        }
    }
}

fn is_endpoint(url: &str) -> bool {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"));
    rest.is_some_and(|r| !r.is_empty() && !r.contains(',') && !r.chars().any(char::is_whitespace))
}

/// Checks a DNS-1123 label (namespaces): at most 63 lowercase alphanumerics
/// or `-`, starting and ending alphanumeric.
///
/// # Errors
///
/// What is wrong, as the end of a sentence ("is not …").
pub fn dns1123_label(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 63 {
        return Err("must be 1 to 63 characters long".to_owned());
    }
    let ok_chars = name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    let ends_ok = !name.starts_with('-') && !name.ends_with('-');
    if ok_chars && ends_ok {
        Ok(())
    } else {
        Err(
            "must consist of lowercase alphanumerics and '-', starting and ending alphanumeric"
                .to_owned(),
        )
    }
}

/// Checks a DNS-1123 subdomain (most object names): at most 253
/// characters, dot-separated DNS-1123 labels.
///
/// # Errors
///
/// What is wrong, as the end of a sentence.
pub fn dns1123_subdomain(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 253 {
        return Err("must be 1 to 253 characters long".to_owned());
    }
    if name.split('.').all(|part| dns1123_label(part).is_ok()) {
        Ok(())
    } else {
        Err("must be lowercase alphanumerics, '-' and '.', each dot-separated part starting and ending alphanumeric".to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn empty_settings_take_the_upstream_defaults() {
        let s = Settings::parse(&json!({})).unwrap();
        assert_eq!(s.target_namespace, "openshift-etcd");
        assert_eq!(s.image, DEFAULT_IMAGE);
        assert!(s.etcd_endpoints.is_empty());
        assert_eq!(s.etcd_client_secret, "etcd-client");
        assert_eq!(s.etcd_ca_config_map, "etcd-ca-bundle");
        assert_eq!(s.service_account_name, "etcd-backup-sa");
        assert_eq!(
            s.node_selector,
            BTreeMap::from([("node-role.kubernetes.io/master".to_owned(), String::new())])
        );
        assert_eq!(s.priority_class_name, "system-node-critical");
        assert_eq!(s.backup_deadline_seconds, 900);
        assert_eq!(s.scheduling_timeout_seconds, 300);
        assert_eq!(s.orphan_grace_seconds, 60);
    }

    #[test]
    fn every_setting_can_be_overridden() {
        let s = Settings::parse(&json!({
            "targetNamespace": "backups",
            "image": "registry.example/etcd-tools:1.2",
            "etcdEndpoints": ["https://10.0.0.1:2379", "https://10.0.0.2:2379"],
            "etcdClientSecret": "client-tls",
            "etcdCaConfigMap": "ca",
            "serviceAccountName": "runner",
            "nodeSelector": {"type": "kwok"},
            "priorityClassName": "",
            "backupDeadlineSeconds": 60,
            "schedulingTimeoutSeconds": 10,
            "orphanGraceSeconds": 5,
        }))
        .unwrap();
        assert_eq!(s.backup_deadline_seconds, 60);
        assert_eq!(s.scheduling_timeout_seconds, 10);
        assert_eq!(s.orphan_grace_seconds, 5);
        assert_eq!(s.target_namespace, "backups");
        assert_eq!(s.image, "registry.example/etcd-tools:1.2");
        assert_eq!(s.etcd_endpoints.len(), 2);
        assert_eq!(s.etcd_client_secret, "client-tls");
        assert_eq!(s.etcd_ca_config_map, "ca");
        assert_eq!(s.service_account_name, "runner");
        assert_eq!(
            s.node_selector,
            BTreeMap::from([("type".to_owned(), "kwok".to_owned())])
        );
        assert_eq!(s.priority_class_name, "");
    }

    #[test]
    fn every_bad_setting_is_reported_with_its_path() {
        let problems = Settings::parse(&json!({
            "targetNamespace": "Not_A_Namespace",
            "image": "",
            "etcdEndpoints": ["10.0.0.1:2379", 7],
            "etcdClientSecret": 3,
            "nodeSelector": {"zone": 1},
            "priorityClassName": "Bad Class",
            "backupDeadlineSeconds": 0,
            "schedulingTimeoutSeconds": "5m",
            "orphanGraceSeconds": 1.5,
        }))
        .unwrap_err();
        let paths: Vec<&str> = problems.iter().map(|p| p.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "targetNamespace",
                "image",
                "etcdClientSecret",
                "priorityClassName",
                "etcdEndpoints.0",
                "etcdEndpoints.1",
                "nodeSelector.zone",
                "backupDeadlineSeconds",
                "schedulingTimeoutSeconds",
                "orphanGraceSeconds",
            ]
        );
        assert!(problems[0].message.contains("Not_A_Namespace"));
    }

    #[test]
    fn unknown_keys_and_non_objects_are_refused() {
        let problems = Settings::parse(&json!({"namespace": "x"})).unwrap_err();
        assert_eq!(problems[0].path, "namespace");
        assert!(Settings::parse(&json!("x")).is_err());
        assert!(Settings::parse(&json!({"etcdEndpoints": "https://a:2379"})).is_err());
    }

    #[test]
    fn names_follow_dns1123() {
        assert!(dns1123_label("openshift-etcd").is_ok());
        assert!(dns1123_label("-x").is_err());
        assert!(dns1123_label(&"a".repeat(64)).is_err());
        assert!(dns1123_subdomain("etcd.client-1").is_ok());
        assert!(dns1123_subdomain("etcd..client").is_err());
    }
}
