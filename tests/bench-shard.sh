#!/usr/bin/env bash
# Sharding benchmark (tests/src/bin/shard-bench.rs): N Widgets reconciled
# by 1, 2 and 4 `wasmop run --sharding` replicas; per shard count the
# convergence against a plain client's floor, each replica's RSS, and with
# two or more replicas the re-homing after a SIGKILL and after a join, and
# the count of primaries reconciled by two shards at once. Starts the local
# control plane (tests/cluster/up.sh, same environment variables) and stops
# it again unless WASMOP_KEEP_CLUSTER=1.
#
# usage: tests/bench-shard.sh [N [K...]]     e.g. tests/bench-shard.sh 10000 1 2 4
#
# WASMOP_BENCH_PROFILE=dev (the default here) runs the unoptimised build
# the tests use; `release` builds both binaries optimised.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. tests/cluster/lib.sh

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$WASMOP_CACHE/target}"
export WASMOP_PLUGIN_DIR="${WASMOP_PLUGIN_DIR:-$CARGO_TARGET_DIR/plugins}"
bash tests/cluster/build.sh
[[ -f "$WASMOP_PLUGIN_DIR/good.wasm" ]] || bash tests/build-plugins.sh "$WASMOP_PLUGIN_DIR" >/dev/null
profile="${WASMOP_BENCH_PROFILE:-dev}"
cargo build --profile "$profile" -p wasmop -p wasmop-tests --bin wasmop --bin shard-bench
bin_dir="$CARGO_TARGET_DIR/$profile"
[[ "$profile" == dev ]] && bin_dir="$CARGO_TARGET_DIR/debug"

cleanup() {
  if [[ ${WASMOP_KEEP_CLUSTER:-0} != 1 ]]; then
    bash tests/cluster/down.sh || true
  fi
}
trap cleanup EXIT
KUBECONFIG="$(bash tests/cluster/up.sh)"
export KUBECONFIG
WASMOP_BIN="$bin_dir/wasmop" RUST_LOG="${RUST_LOG:-warn}" "$bin_dir/shard-bench" "$@"
