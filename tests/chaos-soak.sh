#!/usr/bin/env bash
# The 30-minute chaos soak (tests/src/chaos.rs, tests/src/bin/chaos-soak.rs):
# builds the plugins and the soak, starts the local control plane
# (tests/cluster/up.sh, same environment variables), runs the soak and stops
# the control plane again unless WASMOP_KEEP_CLUSTER=1. Prints the figures:
# faults survived, operations, convergence (worst included), anything lost.
# Exits non-zero when an invariant broke.
#
# usage: tests/chaos-soak.sh [--minutes N] [--seed SEED] [--sharding | --features]
#
# --sharding runs the replicas as shards; --features runs the features
# together (shards joining and killed, a staged rollout rolled back in every
# window, the orphan sweep every 3 s, primaries re-created under their names
# mid-call; the status-UID, collection and audit-log one-writer checks:
# tests/src/chaos/features.rs).
#
# WASMOP_CHAOS_SEED=<seed> replays a soak (same faults, timing and load;
# the cluster's answers may interleave differently); WASMOP_CHAOS_FAULTS
# narrows the kinds of fault, e.g. KillLeader,CrashBeforeWrite.
#
# The soak stops and freezes the control plane's components: run it on a
# control plane no other test is using.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. tests/cluster/lib.sh

prepare_run
# The replicas run wasmop-under-test: the wasmop program with the test-only
# failpoint (feature failpoints) that crashes it between two writes.
cargo build -p wasmop-tests --bin chaos-soak --bin wasmop-under-test
cluster_for_script
"$CARGO_TARGET_DIR/debug/chaos-soak" "$@"
