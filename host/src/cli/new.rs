//! `wasmop new NAME`: scaffolds a plugin crate of its own (not a member of
//! this workspace): `Cargo.toml` with the SDK as a git or path dependency,
//! `src/lib.rs` (a controller that owns one ConfigMap per primary and sets
//! `Ready`), a golden fixture with its expected plan, and a README with the
//! build, plan and hot-swap steps. With `--lang js` or `--lang python` the
//! same plugin, fixture and README in JavaScript or Python (its `lang` module).

mod lang;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;

use crate::cli::CliError;

/// Where the SDK comes from when neither `--sdk-path` nor `--sdk-git` is
/// given.
pub const DEFAULT_SDK_GIT: &str = "https://github.com/wasmop/wasmop";

/// Arguments of `wasmop new`.
#[derive(Debug, Args)]
pub struct NewArgs {
    /// Crate name (lowercase letters, digits and dashes); also the plugin
    /// name and the default directory.
    #[arg(value_name = "NAME")]
    pub name: String,
    /// The primary kind, `GROUP/VERSION/KIND` (plural: lowercase kind + s).
    #[arg(long, value_name = "G/V/K", default_value = "example.com/v1/Hello")]
    pub kind: String,
    /// Directory to create [default: ./NAME].
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Use the SDK from a checkout of this repository (its `plugins/sdk`
    /// directory, or the repository root).
    #[arg(long, value_name = "PATH", conflicts_with = "sdk_git")]
    pub sdk_path: Option<PathBuf>,
    /// Use the SDK from this git repository.
    #[arg(long, value_name = "URL")]
    pub sdk_git: Option<String>,
    /// The plugin's language.
    #[arg(long, value_enum, default_value = "rust")]
    pub lang: lang::Lang,
}

/// A parsed `GROUP/VERSION/KIND`.
#[derive(Debug, PartialEq, Eq)]
struct Gvk {
    group: String,
    version: String,
    kind: String,
    plural: String,
}

fn parse_kind(text: &str) -> Result<Gvk, String> {
    let parts: Vec<&str> = text.split('/').collect();
    let [group, version, kind] = parts.as_slice() else {
        return Err(format!("--kind {text:?}: expected GROUP/VERSION/KIND"));
    };
    if group.is_empty() || !group.contains('.') {
        return Err(format!(
            "--kind {text:?}: a custom kind needs a group with a dot (example.com)"
        ));
    }
    let ok_kind = kind.chars().next().is_some_and(|c| c.is_ascii_uppercase())
        && kind.chars().all(|c| c.is_ascii_alphanumeric());
    if version.is_empty() || !ok_kind {
        return Err(format!(
            "--kind {text:?}: VERSION must be set and KIND be CamelCase letters and digits"
        ));
    }
    Ok(Gvk {
        group: (*group).to_owned(),
        version: (*version).to_owned(),
        kind: (*kind).to_owned(),
        plural: format!("{}s", kind.to_ascii_lowercase()),
    })
}

fn valid_name(name: &str) -> bool {
    name.chars().next().is_some_and(|c| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.ends_with('-')
        && name.len() <= 63
}

/// The SDK dependency line of the generated Cargo.toml.
fn sdk_dependency(args: &NewArgs) -> Result<String, CliError> {
    if let Some(path) = &args.sdk_path {
        let path = if path.join("plugins/sdk/Cargo.toml").is_file() {
            path.join("plugins/sdk")
        } else {
            path.clone()
        };
        if !path.join("Cargo.toml").is_file() {
            return Err(CliError::Scaffold {
                reason: format!(
                    "--sdk-path {}: neither the SDK crate nor a checkout holding plugins/sdk",
                    path.display()
                ),
            });
        }
        let abs = std::fs::canonicalize(&path).map_err(|source| CliError::Read {
            path: path.clone(),
            source,
        })?;
        return Ok(format!("path = {:?}", abs.display().to_string()));
    }
    let url = args.sdk_git.as_deref().unwrap_or(DEFAULT_SDK_GIT);
    Ok(format!("git = {url:?}"))
}

fn files(args: &NewArgs, gvk: &Gvk, sdk: &str) -> Vec<(&'static str, String)> {
    let name = &args.name;
    let crate_ident = name.replace('-', "_");
    let Gvk {
        group,
        version,
        kind,
        plural,
    } = gvk;
    let cargo = format!(
        r#"[package]
name = "{name}"
version = "0.1.0"
edition = "2024"
publish = false

# A crate of its own, not part of any enclosing workspace.
[workspace]

[lib]
# cdylib: the wasm component; rlib: native unit tests.
crate-type = ["cdylib", "rlib"]

[dependencies]
serde = {{ version = "1", features = ["derive"] }}
serde_json = "1"
# The wasmop plugin SDK. From git (pin a tag or rev for repeatable builds),
# or `path = "/path/to/wasmop/plugins/sdk"` for a local checkout.
wasmop-sdk = {{ {sdk} }}

[dev-dependencies]
wasmop-sdk = {{ {sdk}, features = ["testing"] }}

[profile.release]
codegen-units = 16
"#
    );
    let lib = format!(
        r#"//! Plugin `{name}`: reconciles `{kind}` ({group}/{version}). For each
//! one it applies the ConfigMap `<name>-{name}` holding `spec.message` and
//! sets the condition `Ready`.

use serde::Deserialize;
use serde_json::{{Value, json}};
use wasmop_sdk::conditions::{{conditions_of, set_condition}};
use wasmop_sdk::k8s_openapi::api::core::v1::ConfigMap;
use wasmop_sdk::{{
    Controller, KindRef, Manifest, Plan, Plugin, ReconcileError, SettingsProblem, Snapshot,
}};

#[derive(Deserialize)]
struct Primary {{
    #[serde(default)]
    spec: Spec,
}}

#[derive(Deserialize, Default)]
struct Spec {{
    #[serde(default)]
    message: String,
}}

/// The plugin. Its functions are pure: no clock, network or filesystem.
#[derive(Debug)]
pub struct ThePlugin;

impl Plugin for ThePlugin {{
    fn manifest() -> Manifest {{
        Manifest::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")).controller(
            Controller::new(
                "{name}",
                KindRef::namespaced("{group}", "{version}", "{kind}", "{plural}"),
            )
            .owns(KindRef::of::<ConfigMap>()),
        )
    }}

    fn validate_settings(settings: &Value) -> Result<(), Vec<SettingsProblem>> {{
        wasmop_sdk::settings::only_keys(settings, &[]) // takes no settings
    }}

    fn reconcile(snapshot: &Snapshot) -> Result<Plan, ReconcileError> {{
        let primary: Primary = snapshot.primary_as()?; // InvalidSpec if the shape is wrong
        let name = format!("{{}}-{name}", snapshot.primary_name());
        let mut conditions = conditions_of(&snapshot.primary);
        set_condition(
            &mut conditions,
            "Ready",
            true,
            "Written",
            &format!("wrote ConfigMap {{name}}"),
            snapshot.primary_generation(),
            &snapshot.now()?,
        );
        Ok(Plan::new()
            .apply(json!({{
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {{"name": name, "namespace": snapshot.primary_namespace()}},
                "data": {{"message": primary.spec.message}},
            }}))
            .status(json!({{"conditions": conditions}})))
    }}
}}

wasmop_sdk::export_plugin!(ThePlugin);

#[cfg(test)]
mod tests {{
    use super::*;
    use wasmop_sdk::testing::{{SnapshotBuilder, run}};

    #[test]
    fn writes_the_message() {{
        let snapshot = SnapshotBuilder::from_yaml(
            "{name}",
            "
apiVersion: {group}/{version}
kind: {kind}
metadata: {{name: a, namespace: ns, generation: 1}}
spec: {{message: hi}}
",
        )
        .build();
        let plan = run::<ThePlugin>(&snapshot).unwrap();
        assert_eq!(plan.apply[0].object["data"]["message"], "hi");
    }}
}}
"#
    );
    let fixture = format!(
        r#"# A golden fixture: the primary (first document) and what else the
# snapshot holds, at a fixed time. `wasmop plan` prints the plan; the
# expected one is example.plan.json next to this file.
apiVersion: {group}/{version}
kind: {kind}
metadata: {{name: example, namespace: default, uid: uid-example, generation: 1}}
spec: {{message: hello}}
---
apiVersion: wasmop.dev/v1
kind: PlanOptions
now: "2026-01-01T00:00:00Z"
"#
    );
    let plan = format!(
        r#"{{
  "apply": [
    {{
      "object": {{
        "apiVersion": "v1",
        "data": {{
          "message": "hello"
        }},
        "kind": "ConfigMap",
        "metadata": {{
          "name": "example-{name}",
          "namespace": "default"
        }}
      }},
      "precondition": null,
      "force": false
    }}
  ],
  "delete": [],
  "status": {{
    "conditions": [
      {{
        "lastTransitionTime": "2026-01-01T00:00:00Z",
        "message": "wrote ConfigMap example-{name}",
        "observedGeneration": 1,
        "reason": "Written",
        "status": "True",
        "type": "Ready"
      }}
    ]
  }},
  "primaryPatch": null,
  "events": [],
  "requeueAfterMs": null,
  "cleanupComplete": false,
  "httpRequests": []
}}
"#
    );
    let readme = format!(
        r#"# {name}

A [wasmop](https://github.com/wasmop/wasmop) plugin reconciling `{kind}`
(`{group}/{version}`): one ConfigMap per object, and a `Ready` condition.

## Build

```sh
rustup target add wasm32-unknown-unknown   # once
cargo test                                 # native unit tests
cargo build --release --target wasm32-unknown-unknown
# -> target/wasm32-unknown-unknown/release/{crate_ident}.wasm, a component
```

`.cargo/config.toml` links it with `wasm-component-ld` (it comes with Rust),
which makes the component; without WASI it is one core module, and the
host makes its instance for each call faster. `--target wasm32-wasip2`
builds a component too, for a plugin that needs what the standard library
does through WASI (the host grants no files, network or real clock).

## Check offline

```sh
wasmop inspect target/wasm32-unknown-unknown/release/{crate_ident}.wasm   # manifest and RBAC
wasmop plan --plugin target/wasm32-unknown-unknown/release/{crate_ident}.wasm \
  -f fixtures/example.yaml | diff - fixtures/example.plan.json
# its behaviour in a modelled cluster: convergence, idempotence, crashes,
# stale snapshots, honest Ready, deletion (exit 1 with a trace on a finding)
wasmop check target/wasm32-unknown-unknown/release/{crate_ident}.wasm -f fixtures/example.yaml
```

## Run and hot-swap

```sh
mkdir -p plugins && cp target/wasm32-unknown-unknown/release/{crate_ident}.wasm plugins/{name}.wasm
wasmop run --plugins plugins &          # with your kubeconfig; the {plural}.{group} CRD installed
# edit src/lib.rs, rebuild, copy again: the running operator swaps to the
# new version without a restart (a broken build is refused; the old one keeps serving)
```

The SDK is a git dependency in `Cargo.toml`; pin a tag or revision there,
or point it at a local checkout with `path = ".../plugins/sdk"`.
"#
    );
    vec![
        ("Cargo.toml", cargo),
        ("src/lib.rs", lib),
        ("fixtures/example.yaml", fixture),
        ("fixtures/example.plan.json", plan),
        ("README.md", readme),
        (".gitignore", "/target\n".to_owned()),
        (".cargo/config.toml", CARGO_CONFIG.to_owned()),
    ]
}

/// The scaffold's `.cargo/config.toml`: the plugin link settings this
/// repository's own `.cargo/config.toml` gives every plugin built here.
const CARGO_CONFIG: &str = r#"# Built for wasm32-unknown-unknown, the plugin links no WASI; Rust's
# `wasm-component-ld` makes the component (one core module, which the
# wasmop host instantiates faster for every call than a WASI component).
#
# The component starts with 2 MiB of linear memory rather than the
# linker's default (the stack and the data): a reconcile of up to about
# 64 KB of snapshot then finds its heap already there. Growing a memory costs
# the wasmop host a change of page protections when the call grows it and
# another when the next call gets the slot. Untouched pages cost nothing;
# the memory counts against the plugin's memory cap (`memoryMiB`).
#
# Its stack is 256 KiB rather than 1 MiB, so that its data and the start of
# its heap lie in the first 512 KiB of memory, which the wasmop host rewrites
# after every call and keeps mapped: a small call faults in no page. A
# plugin that overflows its stack traps (the stack comes first in memory).
# A RUSTFLAGS environment variable replaces these flags.
[target.wasm32-unknown-unknown]
linker = "wasm-component-ld"
rustflags = ["-C", "link-arg=--initial-memory=2097152", "-C", "link-arg=-zstack-size=262144"]

[target.wasm32-wasip2]
rustflags = ["-C", "link-arg=--initial-memory=2097152", "-C", "link-arg=-zstack-size=262144"]
"#;

fn write_all(dir: &Path, files: &[(&'static str, String)]) -> Result<(), CliError> {
    for (rel, text) in files {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|source| CliError::Write {
                path: parent.to_owned(),
                source,
            })?;
        }
        std::fs::write(&path, text).map_err(|source| CliError::Write { path, source })?;
    }
    Ok(())
}

/// `wasmop new`.
pub fn new_command(args: NewArgs) -> Result<ExitCode, CliError> {
    if !valid_name(&args.name) {
        return Err(CliError::Scaffold {
            reason: format!(
                "{:?} is not a plugin name: lowercase letters, digits and dashes, starting with a letter",
                args.name
            ),
        });
    }
    let gvk = parse_kind(&args.kind).map_err(|reason| CliError::Scaffold { reason })?;
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(&args.name));
    if dir.exists()
        && std::fs::read_dir(&dir)
            .map(|mut d| d.next().is_some())
            .unwrap_or(true)
    {
        return Err(CliError::Scaffold {
            reason: format!("{} exists and is not empty; nothing written", dir.display()),
        });
    }
    let files = match args.lang {
        lang::Lang::Rust => files(&args, &gvk, &sdk_dependency(&args)?),
        other => {
            let golden = files(&args, &gvk, "")
                .into_iter()
                .filter(|(path, _)| path.starts_with("fixtures/"))
                .collect();
            if other == lang::Lang::Js {
                lang::js_files(&args, &gvk, golden)
            } else {
                lang::python_files(&args, &gvk, golden)
            }
        }
    };
    write_all(&dir, &files)?;
    println!(
        "created plugin {} in {} (primary {}/{}/{}); see its README.md",
        args.name,
        dir.display(),
        gvk.group,
        gvk.version,
        gvk.kind
    );
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_and_names_are_checked() {
        assert_eq!(
            parse_kind("apps.example.com/v1beta1/Gadget").unwrap(),
            Gvk {
                group: "apps.example.com".into(),
                version: "v1beta1".into(),
                kind: "Gadget".into(),
                plural: "gadgets".into()
            }
        );
        assert!(parse_kind("v1/ConfigMap").is_err());
        assert!(parse_kind("example.com/v1/gadget").is_err());
        assert!(valid_name("my-plugin2"));
        assert!(!valid_name("My_plugin"));
        assert!(!valid_name("-x"));
    }

    #[test]
    fn the_scaffold_links_plugins_as_this_repository_does() {
        // Every setting line of the repository's own cargo config (comments
        // aside) is in the scaffold's, so plugins built outside get the
        // same initial memory as the ones built here.
        let ours = include_str!("../../../.cargo/config.toml");
        let settings: Vec<&str> = ours
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect();
        assert!(
            settings
                .iter()
                .any(|l| l.contains("--initial-memory=") && l.contains("-zstack-size=262144")),
            "{settings:?}"
        );
        for line in settings {
            assert!(
                CARGO_CONFIG.lines().any(|l| l.trim() == line),
                "the scaffold's .cargo/config.toml lacks {line:?}"
            );
        }
    }

    #[test]
    fn refuses_a_non_empty_directory_and_writes_nothing() {
        let dir = std::env::temp_dir().join(format!("wasmop-new-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("keep"), "x").unwrap();
        let err = new_command(NewArgs {
            name: "p".into(),
            kind: "example.com/v1/Hello".into(),
            dir: Some(dir.clone()),
            sdk_path: None,
            sdk_git: None,
            lang: lang::Lang::Rust,
        })
        .unwrap_err();
        assert!(err.to_string().contains("not empty"), "{err}");
        assert!(!dir.join("Cargo.toml").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
