//! `wasmop new --lang js|python`: the same plugin as the Rust scaffold (one
//! ConfigMap per primary holding `spec.message`, the condition `Ready`), in
//! JavaScript (componentize-js) or Python (componentize-py), with the same
//! golden fixture and expected plan. The scaffold carries its own copy of
//! the contract (`wit/reconciler.wit`) and of the language's SDK module
//! (`plugins/sdk-js/wasmop.js`, `plugins/sdk-python/wasmop.py`), so it
//! builds without a checkout of this repository.

use super::{Gvk, NewArgs};

/// The contract the scaffold builds against.
const WIT: &str = include_str!("../../../../wit/reconciler.wit");
/// The JavaScript SDK module.
const SDK_JS: &str = include_str!("../../../../plugins/sdk-js/wasmop.js");
/// The Python SDK module.
const SDK_PYTHON: &str = include_str!("../../../../plugins/sdk-python/wasmop.py");

/// The versions the scaffold pins: those this repository's own builds use
/// (tests/toolchains/).
pub const COMPONENTIZE_JS: &str = "0.23.0";
/// See [`COMPONENTIZE_JS`].
pub const PREVIEW2_SHIM: &str = "0.25.0";
/// See [`COMPONENTIZE_JS`].
pub const WIZER: &str = "10.0.0";
/// See [`COMPONENTIZE_JS`].
pub const COMPONENTIZE_PY: &str = "0.25.1";

/// A plugin's language.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    /// Rust (the SDK crate; built by cargo).
    Rust,
    /// JavaScript (componentize-js).
    Js,
    /// Python (componentize-py).
    Python,
}

/// The files of a JavaScript scaffold; `golden` are the fixture and its
/// expected plan, shared with the Rust scaffold.
pub(super) fn js_files(
    args: &NewArgs,
    gvk: &Gvk,
    golden: Vec<(&'static str, String)>,
) -> Vec<(&'static str, String)> {
    let name = &args.name;
    let Gvk {
        group,
        version,
        kind,
        plural,
    } = gvk;
    let package = format!(
        r#"{{
  "name": "{name}",
  "version": "0.1.0",
  "private": true,
  "type": "module",
  "scripts": {{
    "build": "componentize-js plugin.js --wit wit/reconciler.wit --world-name plugin --disable stdio random clocks http fetch-event -o {name}.wasm"
  }},
  "devDependencies": {{
    "@bytecodealliance/componentize-js": "{COMPONENTIZE_JS}",
    "@bytecodealliance/preview2-shim": "{PREVIEW2_SHIM}",
    "@bytecodealliance/wizer": "{WIZER}"
  }},
  "overrides": {{
    "@bytecodealliance/wizer": "{WIZER}"
  }}
}}
"#
    );
    let plugin = format!(
        r#"// Plugin `{name}`: reconciles `{kind}` ({group}/{version}). For each one it
// applies the ConfigMap `<name>-{name}` holding `spec.message` and sets the
// condition `Ready`. Its functions are pure: no clock, network or files.
import {{
  Controller,
  KindRef,
  Manifest,
  Plan,
  ReconcileError,
  conditionsOf,
  exportPlugin,
  setCondition,
  settings,
}} from './wasmop.js';

const plugin = {{
  manifest() {{
    return new Manifest('{name}', '0.1.0').controller(
      new Controller('{name}', KindRef.namespaced('{group}', '{version}', '{kind}', '{plural}')).owns(
        KindRef.configMap(),
      ),
    );
  }},

  validateSettings(value) {{
    return settings.onlyKeys(value, []); // takes no settings
  }},

  reconcile(snapshot) {{
    const message = snapshot.primarySpec().message ?? '';
    if (typeof message !== 'string') {{
      throw ReconcileError.invalidSpec(`spec.message must be a string`);
    }}
    const name = `${{snapshot.primaryName()}}-{name}`;
    const conditions = conditionsOf(snapshot.primary);
    setCondition(conditions, 'Ready', true, 'Written', `wrote ConfigMap ${{name}}`, snapshot.primaryGeneration(), snapshot.now);
    return new Plan()
      .apply({{
        apiVersion: 'v1',
        kind: 'ConfigMap',
        metadata: {{ name, namespace: snapshot.primaryNamespace() }},
        data: {{ message }},
      }})
      .status({{ conditions }});
  }},
}};

// componentize-js sees exports by name, one by one.
const exported = exportPlugin(plugin);
export const manifest = exported.manifest;
export const validateSettings = exported.validateSettings;
export const reconcile = exported.reconcile;
"#
    );
    let readme = format!(
        r#"# {name}

A [wasmop](https://github.com/wasmop/wasmop) plugin in JavaScript reconciling
`{kind}` (`{group}/{version}`): one ConfigMap per object, and a `Ready`
condition. `wasmop.js` is the wasmop SDK for JavaScript and
`wit/reconciler.wit` the contract, both copied here by `wasmop new`.

## Build

```sh
npm install        # componentize-js {COMPONENTIZE_JS} (with wizer {WIZER}), from the npm registry
npm run build      # -> {name}.wasm, a component of the `plugin` world
```

The build turns every WASI feature off (`--disable …`): the component
imports only the contract, and `Date`, `Math.random`, `console` and
`fetch` do nothing useful; `snapshot.now` is the only clock. The component
holds the JavaScript engine (about 12 MB, too large for a ConfigMap):
deliver it by OCI (`wasmop push`) or a plugin directory. Its initial memory
counts against the plugin's memory cap.

## Check offline

```sh
wasmop inspect {name}.wasm   # manifest and RBAC
wasmop plan --plugin {name}.wasm -f fixtures/example.yaml | diff - fixtures/example.plan.json
```

## Run and hot-swap

```sh
mkdir -p plugins && cp {name}.wasm plugins/
wasmop run --plugins plugins &          # with your kubeconfig; the {plural}.{group} CRD installed
# edit plugin.js, rebuild, copy again: the running operator swaps to the new version
```
"#
    );
    let mut files = vec![
        ("package.json", package),
        ("plugin.js", plugin),
        ("wasmop.js", SDK_JS.to_owned()),
        ("wit/reconciler.wit", WIT.to_owned()),
        ("README.md", readme),
        (".gitignore", "/node_modules\n/*.wasm\n".to_owned()),
    ];
    files.extend(golden);
    files
}

/// The files of a Python scaffold; `golden` as for [`js_files`].
pub(super) fn python_files(
    args: &NewArgs,
    gvk: &Gvk,
    golden: Vec<(&'static str, String)>,
) -> Vec<(&'static str, String)> {
    let name = &args.name;
    let Gvk {
        group,
        version,
        kind,
        plural,
    } = gvk;
    let plugin = format!(
        r#""""Plugin ``{name}``: reconciles ``{kind}`` ({group}/{version}). For each one
it applies the ConfigMap ``<name>-{name}`` holding ``spec.message`` and sets
the condition ``Ready``. Its functions are pure: no clock, network or files.
"""

import wasmop
from wasmop import Controller, KindRef, Manifest, Plan, ReconcileError, settings


class Plugin:
    def manifest(self):
        return Manifest("{name}", "0.1.0").controller(
            Controller("{name}", KindRef.namespaced("{group}", "{version}", "{kind}", "{plural}")).owns(
                KindRef.config_map()
            )
        )

    def validate_settings(self, value):
        return settings.only_keys(value, [])  # takes no settings

    def reconcile(self, snapshot):
        message = snapshot.primary_spec().get("message", "")
        if not isinstance(message, str):
            raise ReconcileError.invalid_spec("spec.message must be a string")
        name = f"{{snapshot.primary_name()}}-{name}"
        conditions = wasmop.conditions_of(snapshot.primary)
        wasmop.set_condition(
            conditions, "Ready", True, "Written", f"wrote ConfigMap {{name}}", snapshot.primary_generation(), snapshot.now
        )
        return (
            Plan()
            .apply(
                {{
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {{"name": name, "namespace": snapshot.primary_namespace()}},
                    "data": {{"message": message}},
                }}
            )
            .status({{"conditions": conditions}})
        )


# The component's exports (componentize-py looks for `WitWorld`).
WitWorld = wasmop.export_plugin(Plugin())
"#
    );
    let build = format!(
        r#"#!/usr/bin/env sh
# Builds {name}.wasm, a component of the `plugin` world, with componentize-py
# (pip install -r requirements.txt).
set -eu
cd "$(dirname "$0")"
componentize-py -d wit/reconciler.wit -w plugin componentize plugin -o {name}.wasm
"#
    );
    let readme = format!(
        r#"# {name}

A [wasmop](https://github.com/wasmop/wasmop) plugin in Python reconciling
`{kind}` (`{group}/{version}`): one ConfigMap per object, and a `Ready`
condition. `wasmop.py` is the wasmop SDK for Python and
`wit/reconciler.wit` the contract, both copied here by `wasmop new`.

## Build

```sh
python3 -m venv .venv && .venv/bin/pip install -r requirements.txt   # componentize-py {COMPONENTIZE_PY}
PATH=.venv/bin:$PATH sh build.sh   # -> {name}.wasm, a component of the `plugin` world
```

The component holds the Python interpreter (about 18 MB, too large for a
ConfigMap): deliver it by OCI (`wasmop push`) or a plugin directory. It
imports WASI, which the host links with nothing granted: no files,
network or environment, a clock that reads the snapshot's `now`, and
stderr kept for the error of a failed call. Its initial memory counts
against the plugin's memory cap. Only the standard library modules the
plugin imports are built in; packages with native code are not available.

## Check offline

```sh
wasmop inspect {name}.wasm   # manifest and RBAC
wasmop plan --plugin {name}.wasm -f fixtures/example.yaml | diff - fixtures/example.plan.json
```

## Run and hot-swap

```sh
mkdir -p plugins && cp {name}.wasm plugins/
wasmop run --plugins plugins &          # with your kubeconfig; the {plural}.{group} CRD installed
# edit plugin.py, rebuild, copy again: the running operator swaps to the new version
```
"#
    );
    let mut files = vec![
        (
            "requirements.txt",
            format!("componentize-py=={COMPONENTIZE_PY}\n"),
        ),
        ("plugin.py", plugin),
        ("wasmop.py", SDK_PYTHON.to_owned()),
        ("build.sh", build),
        ("wit/reconciler.wit", WIT.to_owned()),
        ("README.md", readme),
        (".gitignore", "/.venv\n/*.wasm\n__pycache__/\n".to_owned()),
    ];
    files.extend(golden);
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scaffold pins what this repository's builds use.
    #[test]
    fn the_pins_are_the_repositorys() {
        let js = include_str!("../../../../tests/toolchains/js/package.json");
        for (package, pin) in [
            ("componentize-js", COMPONENTIZE_JS),
            ("preview2-shim", PREVIEW2_SHIM),
            ("wizer", WIZER),
        ] {
            assert!(
                js.contains(&format!("\"@bytecodealliance/{package}\": \"{pin}\"")),
                "{package} {pin}"
            );
        }
        let py = include_str!("../../../../tests/toolchains/requirements.txt");
        assert!(py.contains(&format!("componentize-py=={COMPONENTIZE_PY}")));
    }
}
