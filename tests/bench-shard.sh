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

prepare_run
profile="${WASMOP_BENCH_PROFILE:-dev}"
cargo build --profile "$profile" -p wasmop -p wasmop-tests --bin wasmop --bin shard-bench
bin_dir="$(profile_dir "$profile")"
cluster_for_script
WASMOP_BIN="$bin_dir/wasmop" RUST_LOG="${RUST_LOG:-warn}" "$bin_dir/shard-bench" "$@"
