#!/usr/bin/env bash
# The plugin author's path outside this repository: `wasmop new` scaffolds a
# plugin crate into a temporary directory (not under this workspace), with
# the SDK as a path dependency on this checkout; it is built to a wasm
# component and `wasmop plan` on its golden fixture must print exactly the
# expected plan the scaffold ships. The same for `wasmop new --lang js` and
# `--lang python`, each built by the build command its scaffold gives
# (`npm run build`, `sh build.sh`) with the toolchain tests/toolchains.sh
# installs into the cache. Run by tests/run.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. tests/cluster/lib.sh
repo="$(pwd)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$WASMOP_CACHE/target}"
fail() { printf '[scaffold-check] FAILED: %s\n' "$*" >&2; exit 1; }

if [[ -z ${WASMOP_BIN:-} ]]; then cargo build -q -p wasmop; fi
WASMOP="${WASMOP_BIN:-$CARGO_TARGET_DIR/debug/wasmop}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
case "$work/" in "$repo"/*) fail "the temporary directory is inside the workspace" ;; esac

"$WASMOP" new scaffolded-demo --kind demo.example.com/v1/Gizmo --dir "$work/scaffolded-demo" --sdk-path "$repo"
# Same dependency versions as this workspace: nothing new to download or
# compile beyond the plugin itself.
cp Cargo.lock "$work/scaffolded-demo/"
(
  cd "$work/scaffolded-demo"
  cargo build --release --target wasm32-unknown-unknown
)
wasm="$CARGO_TARGET_DIR/wasm32-unknown-unknown/release/scaffolded_demo.wasm"
[[ -f $wasm ]] || fail "no component at $wasm"
# The scaffold's .cargo/config.toml links the component to start with
# 2 MiB of linear memory, as this repository's plugins do.
inspection="$("$WASMOP" inspect "$wasm" --no-compile-cache -o json)" || fail "wasmop inspect on the scaffolded component"
start="$(grep -o '"startMemoryBytes": *[0-9]*' <<<"$inspection" | grep -o '[0-9]*$')" \
  || fail "wasmop inspect shows no startMemoryBytes"
(( start >= 2097152 )) || fail "the scaffolded component starts with $start bytes of memory, not 2 MiB"
# Built without WASI: it imports the contract's interfaces and nothing else.
imports="$(tr -d '\n ' <<<"$inspection" | grep -o '"imports":\[[^]]*\]')" \
  || fail "wasmop inspect shows no imports"
[[ "$imports" == *'"wasmop:reconciler/diagnostics@0.4.0"'* ]] || fail "the scaffolded component does not import diagnostics: $imports"
[[ "$imports" != *wasi:* ]] || fail "the scaffolded component imports WASI: $imports"
"$WASMOP" plan --plugin "$wasm" --no-compile-cache -f "$work/scaffolded-demo/fixtures/example.yaml" > "$work/plan.json" \
  || fail "wasmop plan on the scaffold's fixture"
diff -u "$work/scaffolded-demo/fixtures/example.plan.json" "$work/plan.json" \
  || fail "the scaffolded plugin's plan differs from its expected plan"
echo "[scaffold-check] ok: wasmop new -> cargo build (wasm32-unknown-unknown, no WASI imported, $start bytes of memory at start) -> wasmop plan matches the expected plan"

# The JavaScript and Python scaffolds, from a clean directory each: the
# scaffold's own build command, then the same plan check.
. tests/toolchains.sh
ensure_js_toolchain
ensure_py_toolchain
for lang in js python; do
  dir="$work/demo-$lang"
  "$WASMOP" new "demo-$lang" --lang "$lang" --kind demo.example.com/v1/Gizmo --dir "$dir"
  if [[ $lang == js ]]; then
    (cd "$dir" && PATH="$js_toolchain/node_modules/.bin:$PATH" npm run --silent build) \
      || fail "npm run build in the JavaScript scaffold"
  else
    PATH="$py_toolchain/bin:$PATH" sh "$dir/build.sh" || fail "build.sh in the Python scaffold"
  fi
  wasm="$dir/demo-$lang.wasm"
  [[ -f $wasm ]] || fail "no component at $wasm"
  # Compiled without the compile cache: neither tool builds the same bytes
  # twice (two builds of one scaffold differ in digest), so each run's
  # component would add 30-70 MB to the cache and never be read again.
  "$WASMOP" plan --plugin "$wasm" --no-compile-cache -f "$dir/fixtures/example.yaml" > "$work/plan-$lang.json" \
    || fail "wasmop plan on the $lang scaffold's fixture"
  diff -u "$dir/fixtures/example.plan.json" "$work/plan-$lang.json" \
    || fail "the $lang scaffold's plan differs from its expected plan"
  echo "[scaffold-check] ok: wasmop new --lang $lang -> its build -> wasmop plan matches the expected plan"
done
