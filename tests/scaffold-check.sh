#!/usr/bin/env bash
# The plugin author's path outside this repository: `wasmop new` scaffolds a
# plugin crate into a temporary directory (not under this workspace), with
# the SDK as a path dependency on this checkout; it is built to a wasm
# component and `wasmop plan` on its golden fixture must print exactly the
# expected plan the scaffold ships. Run by tests/run.sh.
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
