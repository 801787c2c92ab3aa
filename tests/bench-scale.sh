#!/usr/bin/env bash
# Scale benchmark (tests/src/bin/scale-bench.rs): builds the plugins, starts
# the local control plane (tests/cluster/up.sh, same environment variables),
# runs the benchmark in release mode for each size given (default 100 1000)
# and stops the control plane again unless WASMOP_KEEP_CLUSTER=1.
#
# usage: tests/bench-scale.sh [N...]      e.g. tests/bench-scale.sh 100 1000 10000
#
# WASMOP_BENCH_MEMORY_ONLY=1 measures only the memory per cached object
# (host cache against a minimal reflector), over objects the bench writes
# itself, without the operator and floor runs.
#
# WASMOP_BENCH_ROLLOVERS=<n> sets the rounds of hot-swap rollovers per
# size (default 3; each next to a floor rollover, medians reported).
# WASMOP_BENCH_REQUESTS=1 also prints every request the API server counted
# in each phase, by verb and resource.
# WASMOP_BENCH_FLOOR_WATCHES=1 gives the floor's rollovers the two watches
# an operator holds (its Widgets, its labelled ConfigMaps), to price what
# the API server spends serving them.
#
# WASMOP_BENCH_PROFILE=dev runs an unoptimised build (no release build of
# wasmtime needed; the host is slower, the floor client too).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. tests/cluster/lib.sh

prepare_run
profile="${WASMOP_BENCH_PROFILE:-release}"
cargo build --profile "$profile" -p wasmop-tests --bin scale-bench
bin_dir="$(profile_dir "$profile")"
cluster_for_script
WASMOP_LOG="${WASMOP_LOG:-warn}" RUST_LOG="${RUST_LOG:-warn}" "$bin_dir/scale-bench" "$@"
