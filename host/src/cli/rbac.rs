//! `wasmop rbac`: the least-privilege RBAC objects for the plugins in a
//! directory plus what the operator itself needs, as YAML.
//!
//! - Without `--namespace`: one ClusterRole with every plugin's rules
//!   ([`crate::plugin::rbac::grants`], what `wasmop inspect` prints per
//!   plugin) and a ClusterRoleBinding.
//! - With `--namespace NS` (repeatable, as `wasmop run --namespace`): a
//!   Role and RoleBinding per watched namespace holding the namespaced
//!   rules, plus Roles in the namespaces controllers may write to besides
//!   their primary's, each holding only the owned kinds whose write scope
//!   ([`Controller::kind_write_namespaces`]) names that namespace; the
//!   ClusterRole keeps only cluster-scoped resources and the owned kinds
//!   whose scope is any namespace (`*`), which no Role can confine. (The
//!   `team` plugin's server: its Secrets everywhere, its Deployments and
//!   Services only in the watched namespaces.)
//! - Always: a Role in the operator's namespace for its leader-election
//!   Lease and the Events it raises on its own Pod.
//!
//! Writes outside the primary's namespace (for example the `team` plugin
//! mirroring credentials Secrets into every admitted team's namespace) are
//! called out, kind by kind, in a comment at the top of the output.
//!
//! [`Controller::kind_write_namespaces`]: crate::contract::manifest::Controller::kind_write_namespaces

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;

use crate::cli::CliError;
use crate::contract::manifest::{Manifest, OwnedKind};
use crate::delivery::config::{OperatorFile, load_options, read_config};
use crate::plugin::LoadedPlugin;
use crate::plugin::rbac::{self, Grants};
use crate::sandbox::{Sandbox, SandboxConfig};

/// Arguments of `wasmop rbac`.
#[derive(Debug, Args)]
pub struct RbacArgs {
    /// Directory of plugin components (`*.wasm`), as given to `wasmop run`.
    #[arg(value_name = "PLUGIN_DIR")]
    pub plugins: PathBuf,
    /// Operator configuration (per-plugin settings decide some write
    /// namespaces), as given to `wasmop run --config`.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Watched namespace; repeat (or separate with commas) for several.
    /// Default: all namespaces (a ClusterRole).
    #[arg(
        long = "namespace",
        short = 'n',
        value_name = "NS",
        value_delimiter = ','
    )]
    pub namespaces: Vec<String>,
    /// Namespace the operator runs in (its ServiceAccount, Lease, Pod).
    #[arg(long, value_name = "NS", default_value = "wasmop")]
    pub operator_namespace: String,
    /// Grant what `wasmop run --sharding` needs beyond the default: `list`
    /// on the Leases of the operator's namespace (the leader reads the
    /// shard Leases). The label writes on primaries use the `patch` they
    /// already have.
    #[arg(long)]
    pub sharding: bool,
    /// The operator's ServiceAccount.
    #[arg(long, value_name = "NAME", default_value = "wasmop")]
    pub service_account: String,
    /// Name of the generated roles and bindings.
    #[arg(long, value_name = "NAME", default_value = "wasmop")]
    pub name: String,
}

/// One plugin as the RBAC output describes it.
struct PluginRbac {
    name: String,
    version: String,
    manifest: Manifest,
}

/// Loads every plugin of the directory, sorted by file name.
fn load_plugins(args: &RbacArgs) -> Result<Vec<PluginRbac>, CliError> {
    let file = match &args.config {
        Some(p) => read_config(p)?,
        None => OperatorFile::default(),
    };
    let entries = std::fs::read_dir(&args.plugins).map_err(|source| CliError::Read {
        path: args.plugins.clone(),
        source,
    })?;
    let mut paths: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "wasm") && p.is_file())
        .collect();
    paths.sort();
    let sandbox = Sandbox::new(SandboxConfig::default())?;
    let mut out = Vec::new();
    for path in paths {
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let options = load_options(&file, &stem, None);
        let plugin = LoadedPlugin::load(&sandbox, &path, &options)?;
        out.push(PluginRbac {
            name: plugin.name().to_owned(),
            version: plugin.version().to_owned(),
            manifest: plugin.effective_manifest().clone(),
        });
    }
    Ok(out)
}

fn meta(name: &str, namespace: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: namespace.map(str::to_owned),
        labels: Some(BTreeMap::from([(
            "app.kubernetes.io/name".to_owned(),
            "wasmop".to_owned(),
        )])),
        ..ObjectMeta::default()
    }
}

/// The operator's own needs in its namespace: the leader-election Lease
/// and Events on its own Pod (a rejected plugin file; with `sharding`, the
/// shard Leases listed too); with `admission`,
/// the Secret holding the webhook CA and serving certificate.
fn operator_rules(admission: bool, sharding: bool) -> Vec<PolicyRule> {
    let mut g = Grants::new();
    if admission {
        rbac::grant(
            &mut g,
            "",
            "secrets".into(),
            true,
            &["get", "create", "update"],
        );
    }
    rbac::grant(
        &mut g,
        "coordination.k8s.io",
        "leases".into(),
        true,
        if sharding {
            &["get", "list", "create", "update"]
        } else {
            &["get", "create", "update"]
        },
    );
    rbac::grant(
        &mut g,
        "events.k8s.io",
        "events".into(),
        true,
        &["create", "patch"],
    );
    rbac::merge_rules(&g)
}

/// The generated objects, and the comment lines that precede them.
#[derive(Debug, Default)]
pub struct Generated {
    /// Comment lines (without `# `).
    pub notes: Vec<String>,
    /// The objects, in apply order.
    pub objects: Vec<serde_json::Value>,
}

fn to_value<T: Serialize>(v: &T) -> serde_json::Value {
    serde_json::to_value(v).expect("RBAC objects serialize")
}

/// Builds the RBAC objects for `plugins`.
fn generate(args: &RbacArgs, plugins: &[PluginRbac]) -> Generated {
    let subject = Subject {
        kind: "ServiceAccount".into(),
        name: args.service_account.clone(),
        namespace: Some(args.operator_namespace.clone()),
        ..Subject::default()
    };
    let mut notes = vec![
        "Generated by `wasmop rbac`: least-privilege RBAC for these plugins".to_owned(),
        "(regenerate instead of editing; CI fails when this drifts):".to_owned(),
    ];
    let mut cluster = Grants::new();
    // Plugin rollouts (cluster-scoped PluginRollout objects): listed by
    // every replica, status written by the leader.
    rbac::grant(
        &mut cluster,
        crate::reconcile::rollout::GROUP,
        crate::reconcile::rollout::PLURAL.into(),
        false,
        &["list"],
    );
    rbac::grant(
        &mut cluster,
        crate::reconcile::rollout::GROUP,
        format!("{}/status", crate::reconcile::rollout::PLURAL),
        false,
        &["patch"],
    );
    // Plugins that admit: the leader keeps the webhook configuration.
    let admission = plugins.iter().any(|p| !p.manifest.admission.is_empty());
    if admission {
        rbac::grant(
            &mut cluster,
            "admissionregistration.k8s.io",
            "validatingwebhookconfigurations".into(),
            false,
            &["get", "create", "patch"],
        );
    }
    // Namespace -> grants of a Role there.
    let mut roles: BTreeMap<String, Grants> = BTreeMap::new();
    let watched: BTreeSet<&str> = args.namespaces.iter().map(String::as_str).collect();
    // Events about a cluster-scoped object (a PluginRollout) live in
    // `default`; watching every namespace, the plugins' grants cover it.
    if !watched.is_empty() {
        rbac::grant(
            roles.entry("default".to_owned()).or_default(),
            "events.k8s.io",
            "events".into(),
            true,
            &["create", "patch"],
        );
    }
    for p in plugins {
        notes.push(format!(
            "  {} {}: controllers {}",
            p.name,
            p.version,
            p.manifest
                .controllers
                .iter()
                .map(|c| c.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    for p in plugins {
        let grants = rbac::grants(&p.manifest);
        for c in &p.manifest.controllers {
            // Each owned kind where its scope lets it go besides the
            // primary's namespace, kinds with the same scope together.
            let mut scopes: Vec<(Vec<String>, Vec<&OwnedKind>)> = Vec::new();
            for o in &c.owns {
                let scope = c.kind_write_namespaces(o);
                if scope.is_empty() {
                    continue;
                }
                match scopes.iter_mut().find(|(s, _)| *s == scope) {
                    Some((_, kinds)) => kinds.push(o),
                    None => scopes.push((scope, vec![o])),
                }
            }
            for (scope, owned) in &scopes {
                let kinds: Vec<&str> = owned.iter().map(|o| o.kind.plural.as_str()).collect();
                let secrets = owned
                    .iter()
                    .any(|o| o.kind.group.is_empty() && o.kind.plural == "secrets");
                notes.push(String::new());
                notes.push(format!(
                    "{}{}/{} writes {} outside its primary's namespace, in: {}.",
                    if secrets { "NOTE: " } else { "" },
                    p.name,
                    c.name,
                    kinds.join(", "),
                    scope
                        .iter()
                        .map(|n| if n == "*" {
                            "ANY namespace"
                        } else {
                            n.as_str()
                        })
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
                if secrets {
                    notes.push(
                        "  That includes Secrets in namespaces other than the primary's (for the team"
                            .to_owned(),
                    );
                    notes.push(
                        "  plugin: the mirrored terdut-server credentials, a server-admin-equivalent key,"
                            .to_owned(),
                    );
                    notes.push(
                        "  written into each namespace an admitted TerdutTeam lives in). Only the"
                            .to_owned(),
                    );
                    notes.push("  operator's ServiceAccount holds this grant.".to_owned());
                }
                // Write namespaces besides the watched ones need their own
                // Role (namespaced mode), for the kinds whose scope names
                // them; `*` cannot be confined by Roles.
                if watched.is_empty() {
                    continue;
                }
                for ns in scope {
                    for o in owned {
                        let k = &o.kind;
                        let verbs: &[&'static str] = if o.is_dependent() {
                            &["get", "delete"]
                        } else {
                            &["get", "list", "watch", "create", "patch", "delete"]
                        };
                        if ns == "*" {
                            rbac::grant(&mut cluster, &k.group, k.plural.clone(), true, verbs);
                        } else {
                            rbac::grant(
                                roles.entry(ns.clone()).or_default(),
                                &k.group,
                                k.plural.clone(),
                                true,
                                verbs,
                            );
                        }
                    }
                }
            }
        }
        for ((group, resource), g) in grants {
            let verbs: Vec<&'static str> = g.verbs.iter().copied().collect();
            if watched.is_empty() || !g.namespaced {
                rbac::grant(&mut cluster, &group, resource, g.namespaced, &verbs);
            } else {
                for ns in &watched {
                    rbac::grant(
                        roles.entry((*ns).to_owned()).or_default(),
                        &group,
                        resource.clone(),
                        true,
                        &verbs,
                    );
                }
            }
        }
    }
    let mut objects = Vec::new();
    let cluster_rules = rbac::merge_rules(&cluster);
    if !cluster_rules.is_empty() {
        objects.push(to_value(&ClusterRole {
            metadata: meta(&args.name, None),
            rules: Some(cluster_rules),
            ..ClusterRole::default()
        }));
        objects.push(to_value(&ClusterRoleBinding {
            metadata: meta(&args.name, None),
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "ClusterRole".into(),
                name: args.name.clone(),
            },
            subjects: Some(vec![subject.clone()]),
        }));
    }
    let own = format!("{}-operator", args.name);
    let mut role = |name: &str, ns: &str, rules: Vec<PolicyRule>| {
        objects.push(to_value(&Role {
            metadata: meta(name, Some(ns)),
            rules: Some(rules),
        }));
        objects.push(to_value(&RoleBinding {
            metadata: meta(name, Some(ns)),
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "Role".into(),
                name: name.to_owned(),
            },
            subjects: Some(vec![subject.clone()]),
        }));
    };
    role(
        &own,
        &args.operator_namespace,
        operator_rules(admission, args.sharding),
    );
    for (ns, grants) in &roles {
        role(&args.name, ns, rbac::merge_rules(grants));
    }
    Generated { notes, objects }
}

/// Renders `generated` as commented multi-document YAML.
pub fn render(generated: &Generated) -> Result<String, CliError> {
    let mut out = String::new();
    for line in &generated.notes {
        if line.is_empty() {
            out.push_str("#\n");
        } else {
            out.push_str("# ");
            out.push_str(line);
            out.push('\n');
        }
    }
    for (i, o) in generated.objects.iter().enumerate() {
        if i > 0 {
            out.push_str("---\n");
        }
        out.push_str(&serde_yaml::to_string(o).map_err(|e| CliError::Render {
            reason: e.to_string(),
        })?);
    }
    Ok(out)
}

/// `wasmop rbac`.
pub fn rbac_command(args: RbacArgs) -> Result<ExitCode, CliError> {
    let plugins = load_plugins(&args)?;
    print!("{}", render(&generate(&args, &plugins))?);
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::manifest::tests::manifest;

    fn args(namespaces: &[&str]) -> RbacArgs {
        RbacArgs {
            plugins: PathBuf::from("p"),
            config: None,
            namespaces: namespaces.iter().map(|s| s.to_string()).collect(),
            operator_namespace: "ops".into(),
            service_account: "sa".into(),
            name: "wasmop".into(),
            sharding: false,
        }
    }

    #[test]
    fn sharding_adds_listing_the_leases_and_nothing_else() {
        let plain = render(&generate(&args(&[]), &[plugin(&[])])).unwrap();
        let sharded = render(&generate(
            &RbacArgs {
                sharding: true,
                ..args(&[])
            },
            &[plugin(&[])],
        ))
        .unwrap();
        let leases = |t: &str| {
            let i = t.find("- leases").expect("leases granted");
            t[i..].lines().take(6).collect::<Vec<_>>().join("\n")
        };
        assert!(!leases(&plain).contains("- list"), "{plain}");
        assert!(leases(&sharded).contains("- list"), "{sharded}");
        assert_eq!(
            plain.lines().count() + 1,
            sharded.lines().count(),
            "one verb more"
        );
    }

    /// The test manifest with its ConfigMaps owned by label (so they may
    /// be written outside the primary's namespace) and `write_ns`.
    fn plugin(write_ns: &[&str]) -> PluginRbac {
        let mut m = manifest();
        m.controllers[0].owns[0] = OwnedKind::label(m.controllers[0].owns[0].kind.clone());
        m.controllers[0].finalizer = Some("f".into());
        m.controllers[0].write_namespaces = write_ns.iter().map(|s| s.to_string()).collect();
        PluginRbac {
            name: m.name.clone(),
            version: m.version.clone(),
            manifest: m,
        }
    }

    fn kinds(g: &Generated) -> Vec<String> {
        g.objects
            .iter()
            .map(|o| {
                format!(
                    "{} {}/{}",
                    o["kind"].as_str().unwrap(),
                    o["metadata"]["namespace"].as_str().unwrap_or(""),
                    o["metadata"]["name"].as_str().unwrap()
                )
            })
            .collect()
    }

    #[test]
    fn cluster_wide_is_one_cluster_role_plus_the_operators_own_role() {
        let g = generate(&args(&[]), &[plugin(&[])]);
        assert_eq!(
            kinds(&g),
            [
                "ClusterRole /wasmop",
                "ClusterRoleBinding /wasmop",
                "Role ops/wasmop-operator",
                "RoleBinding ops/wasmop-operator"
            ]
        );
        let text = render(&g).unwrap();
        assert!(text.contains("widgets/status"), "{text}");
        assert!(text.contains("leases"), "{text}");
        assert!(!text.contains("NOTE"), "{text}");
        // Plugin rollouts: read by every replica, status by the leader.
        assert!(
            text.contains("- pluginrollouts\n  verbs:\n  - list\n"),
            "{text}"
        );
        assert!(
            text.contains("- pluginrollouts/status\n  verbs:\n  - patch\n"),
            "{text}"
        );
    }

    #[test]
    fn namespaces_give_roles_and_writes_elsewhere_are_called_out() {
        let g = generate(&args(&["a", "b"]), &[plugin(&["audit"])]);
        assert_eq!(
            kinds(&g),
            [
                "ClusterRole /wasmop",
                "ClusterRoleBinding /wasmop",
                "Role ops/wasmop-operator",
                "RoleBinding ops/wasmop-operator",
                "Role a/wasmop",
                "RoleBinding a/wasmop",
                "Role audit/wasmop",
                "RoleBinding audit/wasmop",
                "Role b/wasmop",
                "RoleBinding b/wasmop",
                // Events about PluginRollouts (cluster-scoped) live there.
                "Role default/wasmop",
                "RoleBinding default/wasmop",
            ]
        );
        let text = render(&g).unwrap();
        assert!(
            text.contains("writes configmaps outside its primary's namespace, in: audit"),
            "{text}"
        );
        // Writing anywhere cannot be confined by Roles: a ClusterRole.
        let g = generate(&args(&["a"]), &[plugin(&["*"])]);
        assert_eq!(kinds(&g)[0], "ClusterRole /wasmop");
        assert!(render(&g).unwrap().contains("ANY namespace"));
    }

    /// The rules of the object of `kind` named `name` in `ns`, one line per
    /// rule: `group resources verbs`.
    fn rules_of(g: &Generated, kind: &str, ns: &str) -> Vec<String> {
        let o = g
            .objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["namespace"].as_str().unwrap_or("") == ns)
            .unwrap_or_else(|| panic!("no {kind} in {ns:?}"));
        o["rules"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| format!("{} {} {}", r["apiGroups"], r["resources"], r["verbs"]))
            .collect()
    }

    #[test]
    fn a_kind_narrowed_to_its_primarys_namespace_is_granted_only_in_the_watched_ones() {
        use crate::contract::manifest::KindRef;
        // As the team plugin's server: Secrets anywhere, Deployments only
        // beside the primary.
        let mut p = plugin(&["*"]);
        p.manifest.controllers[0].owns[0].write_namespaces = Some(vec![]);
        p.manifest.controllers[0].owns.push(
            OwnedKind::label(KindRef::namespaced("", "v1", "Secret", "secrets"))
                .write_namespace("*"),
        );
        let g = generate(&args(&["a"]), &[p]);
        let cluster = rules_of(&g, "ClusterRole", "").join("\n");
        assert!(cluster.contains("[\"secrets\"]"), "{cluster}");
        assert!(!cluster.contains("configmaps"), "{cluster}");
        let a = rules_of(&g, "Role", "a").join("\n");
        assert!(a.contains("\"configmaps\""), "{a}");
        let text = render(&g).unwrap();
        assert!(
            text.contains("NOTE: widget/widget writes secrets outside its primary's namespace, in: ANY namespace."),
            "{text}"
        );
        assert!(!text.contains("writes configmaps"), "{text}");
        // Without the narrowing, the ConfigMaps go to the ClusterRole too.
        let g = generate(&args(&["a"]), &[plugin(&["*"])]);
        let cluster = rules_of(&g, "ClusterRole", "").join("\n");
        assert!(cluster.contains("configmaps"), "{cluster}");
    }
}
