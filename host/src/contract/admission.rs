//! The admission rules of loaded manifests: their load-time checks and the
//! ValidatingWebhookConfiguration they become.

use std::collections::BTreeSet;

use serde_json::{Value, json};
use wasmop_contract::{AdmissionRule, Manifest, Selector};

use crate::contract::manifest::ManifestProblem;
use crate::contract::selector::LabelSelector;
use crate::names;

/// Suffix of every webhook name: `<rule>.<plugin>.admission.wasmop.dev`.
pub const WEBHOOK_SUFFIX: &str = "admission.wasmop.dev";

/// Longest rule name (with the plugin name it must fit a DNS subdomain).
const MAX_RULE_NAME: usize = 63;

/// The problems of a manifest's admission rules. `exports_admit` tells
/// whether the component has the `admit` export; rules without it are a
/// problem (the host could not decide them).
pub fn problems(manifest: &Manifest, exports_admit: bool) -> Vec<ManifestProblem> {
    let mut out = Vec::new();
    let mut problem = |path: String, message: String| out.push(ManifestProblem { path, message });
    if !manifest.admission.is_empty() && !exports_admit {
        problem(
            "admission".into(),
            "the manifest declares admission rules but the component does not export admit \
             (build it for the admitting-plugin world: wasmop_sdk_admitting::export_admitting_plugin!)"
                .into(),
        );
    }
    let mut names_seen = BTreeSet::new();
    for (i, rule) in manifest.admission.iter().enumerate() {
        let at = format!("admission[{i}]");
        if let Err(why) = names::dns1123_label(&rule.name) {
            problem(
                format!("{at}.name"),
                format!("rule name {:?} {why}", rule.name),
            );
        } else if rule.name.len() > MAX_RULE_NAME {
            problem(format!("{at}.name"), "rule name is too long".into());
        }
        if !names_seen.insert(rule.name.as_str()) {
            problem(
                format!("{at}.name"),
                format!("rule name {:?} is used twice", rule.name),
            );
        }
        if rule.kind.kind.is_empty() || rule.kind.plural.is_empty() || rule.kind.version.is_empty()
        {
            problem(
                format!("{at}.kind"),
                "kind needs version, kind and plural".into(),
            );
        }
        if rule.operations.is_empty() {
            problem(
                format!("{at}.operations"),
                "a rule admits at least one operation".into(),
            );
        }
        let mut ids = BTreeSet::new();
        for (j, read) in rule.reads.iter().enumerate() {
            let at = format!("{at}.reads[{j}]");
            if read.id.is_empty() {
                problem(format!("{at}.id"), "read id is empty".into());
            } else if !ids.insert(read.id.as_str()) {
                problem(
                    format!("{at}.id"),
                    format!("read id {:?} is used twice", read.id),
                );
            }
            match &read.selector {
                Selector::OwnedByPrimary => problem(
                    format!("{at}.selector"),
                    "ownedByPrimary cannot select objects for admission".into(),
                ),
                Selector::Field(f) if f.name_path.is_empty() => {
                    problem(format!("{at}.selector"), "field path is empty".into());
                }
                Selector::Labels(text) => {
                    if let Err(e) = LabelSelector::parse(text) {
                        problem(format!("{at}.selector"), e.to_string());
                    }
                }
                _ => {}
            }
        }
    }
    out
}

/// Where the API server reaches this host's admission server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// A Service in front of the operator's Pods (in-cluster deploys).
    Service {
        /// The Service's namespace (the operator's).
        namespace: String,
        /// The Service's name.
        name: String,
        /// The Service port.
        port: u16,
    },
    /// A URL the API server can reach, such as `https://127.0.0.1:9443`
    /// when the API server runs beside the operator (tests, local runs).
    Url(String),
}

/// Everything the webhook configuration needs besides the rules.
#[derive(Clone, Debug)]
pub struct WebhookSettings {
    /// Name of the ValidatingWebhookConfiguration.
    pub configuration_name: String,
    /// How the API server reaches us.
    pub endpoint: Endpoint,
    /// The namespace excluded from admission (the operator's own), when
    /// known.
    pub exclude_namespace: Option<String>,
    /// `timeoutSeconds` (1–30).
    pub timeout_seconds: u8,
}

/// The URL path of one rule: `/admit/<plugin>/<rule>`.
pub fn path(plugin: &str, rule: &str) -> String {
    format!("/admit/{plugin}/{rule}")
}

/// The webhook name of one rule.
pub fn webhook_name(plugin: &str, rule: &str) -> String {
    format!("{rule}.{plugin}.{WEBHOOK_SUFFIX}")
}

/// The ValidatingWebhookConfiguration for `rules` (`(plugin, rule)`,
/// in a stable order), with `ca_bundle` as PEM text.
pub fn configuration(
    settings: &WebhookSettings,
    rules: &[(String, AdmissionRule)],
    ca_bundle: &str,
) -> Value {
    use base64::Engine as _;
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_bundle.as_bytes());
    let webhooks: Vec<Value> = rules
        .iter()
        .map(|(plugin, rule)| {
            let path = path(plugin, &rule.name);
            let client_config = match &settings.endpoint {
                Endpoint::Service {
                    namespace,
                    name,
                    port,
                } => json!({
                    "service": {"namespace": namespace, "name": name, "port": port, "path": path},
                    "caBundle": ca,
                }),
                Endpoint::Url(base) => json!({
                    "url": format!("{}{path}", base.trim_end_matches('/')),
                    "caBundle": ca,
                }),
            };
            let scope = if rule.kind.namespaced {
                "Namespaced"
            } else {
                "Cluster"
            };
            let operations: Vec<&str> = rule.operations.iter().map(|o| o.as_str()).collect();
            let mut webhook = json!({
                "name": webhook_name(plugin, &rule.name),
                "clientConfig": client_config,
                "rules": [{
                    "apiGroups": [rule.kind.group],
                    "apiVersions": [rule.kind.version],
                    "operations": operations,
                    "resources": [rule.kind.plural],
                    "scope": scope,
                }],
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "matchPolicy": "Equivalent",
                "timeoutSeconds": settings.timeout_seconds,
                "admissionReviewVersions": ["v1"],
            });
            if let Some(ns) = &settings.exclude_namespace {
                webhook["namespaceSelector"] = json!({"matchExpressions": [{
                    "key": "kubernetes.io/metadata.name",
                    "operator": "NotIn",
                    "values": [ns],
                }]});
            }
            webhook
        })
        .collect();
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {
            "name": settings.configuration_name,
            "labels": {(wasmop_contract::MANAGED_BY_LABEL): wasmop_contract::MANAGED_BY_VALUE},
        },
        "webhooks": webhooks,
    })
}

#[cfg(test)]
mod tests {
    use wasmop_contract::{AdmissionOperation, AdmissionRead, KindRef};

    use super::*;

    fn kind() -> KindRef {
        KindRef::namespaced("g.io", "v1", "Widget", "widgets")
    }

    #[test]
    fn rules_need_the_export_unique_names_and_operations() {
        let manifest = Manifest::new("p", "0.1.0")
            .admission(AdmissionRule::new("ok", kind()).operation(AdmissionOperation::Create))
            .admission(AdmissionRule::new("ok", kind()))
            .admission(
                AdmissionRule::new("Bad_Name", kind())
                    .operation(AdmissionOperation::Delete)
                    .reads(AdmissionRead::live("o", kind(), Selector::OwnedByPrimary))
                    .reads(AdmissionRead::cached(
                        "o",
                        kind(),
                        Selector::Labels("a in".into()),
                    )),
            );
        let found: Vec<String> = problems(&manifest, false)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert!(found[0].contains("does not export admit"), "{found:?}");
        let text = found.join("\n");
        for expected in [
            "admission[1].name: rule name \"ok\" is used twice",
            "admission[1].operations: a rule admits at least one operation",
            "admission[2].name: rule name \"Bad_Name\"",
            "admission[2].reads[0].selector: ownedByPrimary",
            "admission[2].reads[1].id: read id \"o\" is used twice",
            "admission[2].reads[1].selector:",
        ] {
            assert!(text.contains(expected), "missing {expected:?} in\n{text}");
        }
        let good = Manifest::new("p", "0.1.0")
            .admission(AdmissionRule::new("ok", kind()).operation(AdmissionOperation::Create));
        assert!(problems(&good, true).is_empty());
        assert!(problems(&Manifest::new("p", "0.1.0"), false).is_empty());
    }

    #[test]
    fn the_configuration_fails_closed_and_excludes_the_operator_namespace() {
        let rules = vec![(
            "engine".to_owned(),
            AdmissionRule::new("class-exists", kind())
                .operation(AdmissionOperation::Create)
                .operation(AdmissionOperation::Update),
        )];
        let settings = WebhookSettings {
            configuration_name: "wasmop-admission".into(),
            endpoint: Endpoint::Service {
                namespace: "wasmop-system".into(),
                name: "wasmop".into(),
                port: 443,
            },
            exclude_namespace: Some("wasmop-system".into()),
            timeout_seconds: 5,
        };
        let config = configuration(&settings, &rules, "PEM");
        let hook = &config["webhooks"][0];
        assert_eq!(hook["name"], "class-exists.engine.admission.wasmop.dev");
        assert_eq!(hook["failurePolicy"], "Fail");
        assert_eq!(hook["sideEffects"], "None");
        assert_eq!(hook["matchPolicy"], "Equivalent");
        assert_eq!(hook["timeoutSeconds"], 5);
        assert_eq!(hook["clientConfig"]["caBundle"], "UEVN");
        assert_eq!(
            hook["clientConfig"]["service"]["path"],
            "/admit/engine/class-exists"
        );
        assert_eq!(hook["rules"][0]["operations"], json!(["CREATE", "UPDATE"]));
        assert_eq!(hook["rules"][0]["resources"], json!(["widgets"]));
        assert_eq!(
            hook["namespaceSelector"]["matchExpressions"][0]["values"],
            json!(["wasmop-system"])
        );
        let url = configuration(
            &WebhookSettings {
                endpoint: Endpoint::Url("https://127.0.0.1:9443/".into()),
                exclude_namespace: None,
                ..settings
            },
            &rules,
            "PEM",
        );
        assert_eq!(
            url["webhooks"][0]["clientConfig"]["url"],
            "https://127.0.0.1:9443/admit/engine/class-exists"
        );
        assert!(url["webhooks"][0].get("namespaceSelector").is_none());
    }
}
