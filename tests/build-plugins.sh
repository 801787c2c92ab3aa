#!/usr/bin/env bash
# Builds every plugin crate (plugins/*, except the SDK, and tests/plugins/*)
# into a WebAssembly component and copies each to OUT/<crate-name>.wasm.
#
# usage: tests/build-plugins.sh [OUT]
#   OUT defaults to $WASMOP_PLUGIN_OUT, then to <repo>/target/plugins.
#
# Each crate is built in its own cargo invocation: `good-v2` links `good`
# without its exports, and building both at once would unify their features.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-${WASMOP_PLUGIN_OUT:-$root/target/plugins}}"
target=wasm32-wasip2
component_magic="0061736d0d000100"

if ! rustup target list --installed | grep -qx "$target"; then
  rustup target add "$target"
fi

mkdir -p "$out"
out="$(cd "$out" && pwd)"

cd "$root"
target_dir="$(cargo metadata --format-version 1 --no-deps |
  sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')"

# The package name of a crate directory: the first `name = "…"` of [package].
package_name() {
  awk '/^\[/ { in_package = ($0 == "[package]") }
       in_package && /^name *=/ { gsub(/^name *= *"|".*$/, ""); print; exit }' "$1/Cargo.toml"
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
  name="$(package_name "$dir")"
  if ! cargo pkgid -p "$name" >/dev/null 2>&1; then
    echo "skip $dir: not a workspace member" >&2
    continue
  fi
  echo "building $name ($dir)" >&2
  cargo build --release --target "$target" -p "$name"
  wasm="$target_dir/$target/release/${name//-/_}.wasm"
  magic="$(head -c 8 "$wasm" | od -An -tx1 | tr -d ' \n')"
  if [[ "$magic" != "$component_magic" ]]; then
    echo "error: $wasm is not a WebAssembly component (header $magic)" >&2
    exit 1
  fi
  cp "$wasm" "$out/$name.wasm"
  built+=("$name")
done

echo "built ${#built[@]} plugins: ${built[*]}" >&2
echo "$out"
