#!/usr/bin/env bash
# Builds every plugin crate (plugins/*, except the SDK, and tests/plugins/*)
# into a WebAssembly component and copies each to OUT/<crate-name>.wasm,
# and every JavaScript or Python test plugin (tests/polyglot/*/plugin.js or
# plugin.py) to OUT/<directory-name>.wasm.
#
# usage: tests/build-plugins.sh [OUT]
#   OUT defaults to $WASMOP_PLUGIN_OUT, then to <repo>/target/plugins.
#
# Each crate is built in its own cargo invocation: `good-v2` links `good`
# without its exports, and building both at once would unify their features.
#
# The shipped plugins (plugins/*) are built with the workspace's `plugin`
# profile (LTO, one codegen unit, stripped, panic=abort; each plugin at the
# fastest opt-level that fits, see Cargo.toml),
# then optimised once more by binaryen's `wasm-opt -O3`
# (tests/shrink-component.py; the LTO build is already size-optimised where
# it must be, and -O3 after it makes calls 2-5% faster and the deadline's
# epoch checks cheaper for 3-4% more bytes than -Oz: BENCHMARKS.md, "wasm-opt
# -O3 for the shipped plugins"), and each must stay within 1 MiB, the most
# a ConfigMap holds: the script fails naming any that does not. wasm-opt
# comes from the npm package `binaryen` (a WebAssembly build run by
# Node.js), installed once into the cache; optimised files are cached by
# the digest of their input and the flags.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-${WASMOP_PLUGIN_OUT:-$root/target/plugins}}"
# Plugins are built without WASI (wasm-component-ld makes the component,
# .cargo/config.toml); a crate whose Cargo.toml says
#   [package.metadata.wasmop]
#   target = "wasm32-wasip2"
# is built for WASI preview 2 instead (the test plugins that exercise what
# the host grants of WASI).
default_target=wasm32-unknown-unknown
targets=(wasm32-unknown-unknown wasm32-wasip2)
component_magic="0061736d0d000100"
shipped_profile=plugin
# The most a ConfigMap (and so the deploy/ delivery of a plugin) holds.
max_shipped_bytes=1048576
BINARYEN_VERSION=132.0.0
cache="${WASMOP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/wasmop}"
binaryen="$cache/bin/binaryen-$BINARYEN_VERSION"
shrunk_cache="$cache/shrunk"

ensure_wasm_opt() {
  if [[ ! -x "$binaryen/node_modules/.bin/wasm-opt" ]]; then
    command -v npm >/dev/null || {
      echo "error: npm (Node.js) is needed to install binaryen's wasm-opt, which shrinks the shipped plugins" >&2
      exit 1
    }
    # One install at a time: a second build waits, then finds it installed.
    mkdir -p "$cache/bin"
    exec 8>"$cache/bin/.binaryen.lock"
    flock 8
    if [[ ! -x "$binaryen/node_modules/.bin/wasm-opt" ]]; then
      echo "installing binaryen $BINARYEN_VERSION (wasm-opt) from the npm registry into $binaryen" >&2
      rm -rf "$binaryen.tmp"
      mkdir -p "$binaryen.tmp"
      # The registry refused TLS for the first quarter of an hour of a fresh
      # machine's life (seen twice: each of npm's own three tries failed,
      # then it answered): ask again for about six minutes before giving up.
      local attempt
      for attempt in 1 2 3 4 5 6 7 8; do
        npm install --prefix "$binaryen.tmp" --no-save --no-audit --no-fund "binaryen@$BINARYEN_VERSION" >&2 && break
        if [[ $attempt == 8 ]]; then
          echo "error: could not install binaryen $BINARYEN_VERSION from the npm registry (npm's error is above)" >&2
          exit 1
        fi
        local pause=$((attempt * 15 > 60 ? 60 : attempt * 15))
        echo "npm install of binaryen failed (attempt $attempt of 8); trying again in $pause s" >&2
        sleep "$pause"
      done
      rm -rf "$binaryen"
      mv "$binaryen.tmp" "$binaryen"
    fi
    flock -u 8
  fi
  export PATH="$binaryen/node_modules/.bin:$PATH"
}

# What wasm-opt runs with on each shipped plugin's core module.
wasm_opt_level=-O3

# shrink IN OUT: wasm-opt $wasm_opt_level on IN's core module, cached by
# IN's digest and the level.
shrink() {
  local digest cached
  digest="$(sha256sum "$1" | cut -d' ' -f1)"
  cached="$shrunk_cache/$digest-binaryen-$BINARYEN_VERSION$wasm_opt_level.wasm"
  if [[ ! -f "$cached" ]]; then
    ensure_wasm_opt
    mkdir -p "$shrunk_cache"
    # A temporary name of its own, so two builds at once never write into
    # each other's file; the rename is atomic.
    python3 tests/shrink-component.py "$1" "$cached.tmp.$$" "$wasm_opt_level"
    mv "$cached.tmp.$$" "$cached"
  fi
  cp "$cached" "$2"
}

for target in "${targets[@]}"; do
  if ! rustup target list --installed | grep -qx "$target"; then
    rustup target add "$target"
  fi
done

mkdir -p "$out"
out="$(cd "$out" && pwd)"

cd "$root"
target_dir="$(cargo metadata --format-version 1 --no-deps |
  sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')"

# toml_string FILE SECTION KEY: the string value of KEY under [SECTION] in
# FILE (the first one; empty when there is none).
toml_string() {
  awk -v section="[$2]" -v key="$3" '
       /^\[/ { in_section = ($0 == section) }
       in_section && $0 ~ "^" key " *=" { sub(/^[^=]*= *"/, ""); sub(/".*$/, ""); print; exit }' "$1"
}

# The target a crate directory asks for in [package.metadata.wasmop], or
# the default.
crate_target() {
  local asked t
  asked="$(toml_string "$1/Cargo.toml" package.metadata.wasmop target)"
  for t in "${targets[@]}"; do
    if [[ "${asked:-$default_target}" == "$t" ]]; then
      echo "$t"
      return
    fi
  done
  echo "error: $1/Cargo.toml asks for target \"$asked\"; plugins build for ${targets[*]}" >&2
  exit 1
}

built=()
for dir in plugins/*/ tests/plugins/*/; do
  dir="${dir%/}"
  [[ -f "$dir/Cargo.toml" ]] || continue
  [[ "$dir" == plugins/sdk || "$dir" == plugins/sdk-admitting ]] && continue
  if ! grep -q cdylib "$dir/Cargo.toml"; then
    echo "skip $dir: not a cdylib crate" >&2
    continue
  fi
  name="$(toml_string "$dir/Cargo.toml" package name)"
  if ! cargo pkgid -p "$name" >/dev/null 2>&1; then
    echo "skip $dir: not a workspace member" >&2
    continue
  fi
  target="$(crate_target "$dir")"
  echo "building $name ($dir, $target)" >&2
  profile=release
  [[ "$dir" == plugins/* ]] && profile="$shipped_profile"
  cargo build --profile "$profile" --target "$target" -p "$name"
  wasm="$target_dir/$target/$profile/${name//-/_}.wasm"
  magic="$(head -c 8 "$wasm" | od -An -tx1 | tr -d ' \n')"
  if [[ "$magic" != "$component_magic" ]]; then
    echo "error: $wasm is not a WebAssembly component (header $magic)" >&2
    exit 1
  fi
  if [[ "$dir" == plugins/* ]]; then
    shrink "$wasm" "$out/$name.wasm"
    size="$(wc -c <"$out/$name.wasm")"
    echo "$name.wasm: $size bytes (at most $max_shipped_bytes)" >&2
    if ((size > max_shipped_bytes)); then
      echo "error: $name.wasm is $size bytes, over the $max_shipped_bytes bytes (1 MiB) a ConfigMap holds; shrink the plugin" >&2
      exit 1
    fi
  else
    cp "$wasm" "$out/$name.wasm"
  fi
  built+=("$name")
done

# Plugins in JavaScript and Python (tests/polyglot/*/plugin.js,
# tests/polyglot/*/plugin.py): built by componentize-js and componentize-py,
# installed into the cache by tests/toolchains.sh, against the same WIT
# world. Each is built from a staging directory holding the plugin's files
# and its SDK module (plugins/sdk-js/wasmop.js, plugins/sdk-python/wasmop.py;
# componentize-js reads only the source's own directory), and the component
# is cached by the digest of those files, the WIT and the toolchain's pins:
# an unchanged plugin is copied, not built again (a build takes 10-20 s).
. "$root/tests/toolchains.sh"
components_cache="$cache/components"
for dir in tests/polyglot/*/; do
  dir="${dir%/}"
  name="$(basename "$dir")"
  if [[ -f "$dir/plugin.js" ]]; then
    lang=js sdk=plugins/sdk-js/wasmop.js pins=(tests/toolchains/js/package-lock.json)
  elif [[ -f "$dir/plugin.py" ]]; then
    lang=python sdk=plugins/sdk-python/wasmop.py pins=(tests/toolchains/requirements.txt)
  else
    continue
  fi
  digest="$(cat wit/reconciler.wit "$sdk" "${pins[@]}" $(find -L "$dir" -type f -name "*.${sdk##*.}" | sort) |
    sha256sum | cut -c1-32)"
  cached="$components_cache/$name-$digest.wasm"
  if [[ ! -f "$cached" ]]; then
    echo "building $name ($dir, $lang)" >&2
    stage="$(mktemp -d)"
    # -L: a file may be a link to another plugin's (good-v2-js is good-js
    # with its own version.js).
    cp -rL "$dir"/. "$stage/"
    cp "$sdk" "$stage/"
    mkdir -p "$components_cache"
    if [[ $lang == js ]]; then
      ensure_js_toolchain
      # Every WASI feature off: the component imports only the contract
      # (no clock, random source, stdio or HTTP), like a Rust plugin built
      # without WASI. No weval ahead-of-time compilation (it downloads a
      # binary).
      (cd "$stage" && "$js_toolchain/node_modules/.bin/componentize-js" plugin.js \
        --wit "$root/wit/reconciler.wit" --world-name plugin \
        --disable stdio random clocks http fetch-event \
        -o "$cached.tmp.$$") >&2
    else
      ensure_py_toolchain
      "$py_toolchain/bin/componentize-py" -d "$root/wit/reconciler.wit" -w plugin \
        componentize -p "$stage" plugin -o "$cached.tmp.$$" >&2
    fi
    rm -rf "$stage"
    magic="$(head -c 8 "$cached.tmp.$$" | od -An -tx1 | tr -d ' \n')"
    if [[ "$magic" != "$component_magic" ]]; then
      echo "error: $name built by $lang is not a WebAssembly component (header $magic)" >&2
      exit 1
    fi
    mv "$cached.tmp.$$" "$cached"
  fi
  cp "$cached" "$out/$name.wasm"
  built+=("$name")
done

echo "built ${#built[@]} plugins: ${built[*]}" >&2
echo "$out"
