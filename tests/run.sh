#!/usr/bin/env bash
# The one command that sets up and runs every test of wasmop:
#   1. installs what the build needs (the wasm32-unknown-unknown and
#      wasm32-wasip2 targets, clippy, rustfmt);
#   2. builds or reuses the cached control-plane binaries (tests/cluster/build.sh),
#      in the background while steps 3 and 4 run: on a cold machine both are
#      long, and each leaves a core idle at times (Go's links, cargo's
#      single-crate stretches, downloads);
#   3. builds every plugin and test plugin to a real .wasm component;
#   4. checks formatting; builds the test binaries of every target with
#      clippy as the compiler of the workspace's crates (the lints of
#      `cargo clippy --workspace --all-targets -- -D warnings`, checked as
#      the code compiles rather than in a separate check build of every
#      dependency);
#   5. waits for step 2, then starts the local control plane (tests/cluster/up.sh),
#      and a second one for the test binaries that break theirs on purpose
#      (tests/tests/chaos.rs, faults.rs);
#   6. runs `cargo test --workspace` — unit tests, golden plans and the
#      integration tests against the control plane — in two lanes at once.
#      The first runs everything but chaos and faults on the first control
#      plane. The second, on the second control plane: the README's demo
#      unattended, as the operator's ServiceAccount under deploy/rbac.yaml
#      (`deploy/run-local.sh --check --rbac`: every shipped plugin's example
#      primaries must converge, no request may be forbidden, and the audit
#      log's comparison of used and granted verbs is printed), which cleans
#      up after itself; the deployment files (tests/deploy-check.sh:
#      restricted Pod Security, RBAC drift, the Helm chart); a plugin
#      scaffolded outside the workspace with `wasmop new`, built, its plan
#      checked (tests/scaffold-check.sh); `wasmop check` on every shipped
#      plugin (tests/check-plugins.sh); then chaos and faults. With
#      CARGO_TEST_ARGS set, all of it runs in one lane, one step at a time;
#   7. stops the control planes, also when something failed.
# Exits non-zero on any failure.
#
# Environment:
#   WASMOP_CACHE        cache for Go binaries and the cargo target dir
#                       (default ${XDG_CACHE_HOME:-$HOME/.cache}/wasmop)
#   WASMOP_KEEP_CLUSTER=1  leave the control plane running afterwards
#   CARGO_TEST_ARGS     extra arguments for cargo test (e.g. a test name filter)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. tests/cluster/lib.sh

t0=$(date +%s)
# Each step is stamped with the seconds since the start, so a slow run's log
# shows where its time went.
step() { printf '\n==> [%ds] %s\n' "$(($(date +%s) - t0))" "$*"; }

# Three tests need root: host/tests/swap.rs turns a swap file on for a moment
# (mkswap, swapon, swapoff: util-linux) to show that a call's memory is
# reset even when swap took part of it, host/tests/compaction.rs keeps
# the kernel compacting memory (/proc/sys/vm/compact_memory) to show the
# same while pages move, and tests/tests/image.rs runs the container
# image's binary from its pulled layer as uid 65532 (chroot --userspec).
# As root (CI) they run; as any other user they are
# skipped, named here and in the closing line, and everything else runs.
root_only=(
  pages_swapped_out_during_a_call_are_reset_too
  the_shipped_reset_holds_while_the_kernel_moves_pages
  the_image_builds_reproducibly_and_its_binary_runs_as_65532_from_the_pulled_layer
)
skip_args=()
if [[ $(id -u) != 0 ]]; then
  echo "note: not running as root: skipping the ${#root_only[@]} tests that need it (${root_only[*]}: swapon, /proc/sys/vm/compact_memory, chroot); run as root to include them" >&2
  for t in "${root_only[@]}"; do skip_args+=(--skip "$t"); done
else
  for tool in mkswap swapon swapoff; do
    if ! command -v "$tool" >/dev/null; then
      echo "error: $tool is not on PATH ($PATH); host/tests/swap.rs needs it: install util-linux, or add /usr/sbin and /sbin to PATH" >&2
      exit 1
    fi
  done
fi
# Before anything is built: a control plane left in the cluster directory by
# a run as another user (CI as root) would stop this one only at step 5.
require_own_cluster_dir

step "toolchain: wasm32-unknown-unknown and wasm32-wasip2 targets, clippy, rustfmt"
rustup target add wasm32-unknown-unknown wasm32-wasip2
rustup component add clippy rustfmt

# Cargo's build output is cached outside the repository, so a fresh clone on
# the same machine reuses compiled dependencies.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$WASMOP_CACHE/target}"
export WASMOP_PLUGIN_DIR="${WASMOP_PLUGIN_DIR:-$CARGO_TARGET_DIR/plugins}"
export WASMOP_PLUGIN_OUT="$WASMOP_PLUGIN_DIR"
# Incremental state only pays off in an edit-compile loop; in a test run it
# doubles the build's size on disk for nothing.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
mkdir -p "$CARGO_TARGET_DIR"
free_kb=$(df -Pk "$CARGO_TARGET_DIR" | awk 'NR==2 {print $4}')
if [ "${free_kb:-0}" -lt $((6 * 1024 * 1024)) ]; then
  echo "warning: only $((free_kb / 1024)) MiB free for $CARGO_TARGET_DIR; a cold build needs about 6 GiB" >&2
fi

step "control-plane binaries (in the background; their log follows when they are needed)"
build_log="$(mktemp)"
# In a process group of its own (setsid), so that stopping it stops the Go
# builds under it too.
setsid bash tests/cluster/build.sh >"$build_log" 2>&1 &
build_pid=$!
control_plane_built() {
  local rc=0
  wait "$build_pid" || rc=$?
  step "control-plane binaries: the build's log"
  cat "$build_log"
  rm -f "$build_log"
  if [[ $rc != 0 ]]; then
    echo "error: building the control plane failed (exit $rc); its log is above" >&2
    exit "$rc"
  fi
}

step "plugin toolchains and Envoy (in the background; their log follows the plugins')"
# componentize-js, componentize-py (tests/toolchains.sh) and Envoy
# (tests/install-envoy.sh) are downloads, not builds: on a cold machine they
# take minutes of waiting on the registries, which the Rust plugins' builds
# can fill. Each installer holds a lock while it installs, so the plugin
# build (and the gateway tests) that need one wait for this install rather
# than start another; if this one fails, they try again and report it.
fetch_log="$(mktemp)"
setsid bash -c '
  bash tests/toolchains.sh js >/dev/null &
  bash tests/toolchains.sh python >/dev/null &
  bash tests/install-envoy.sh >/dev/null &
  wait' >"$fetch_log" 2>&1 &
fetch_pid=$!
# Stop the builds and downloads too when a step below fails first.
trap 'kill -- "-$build_pid" "-$fetch_pid" 2>/dev/null || true' EXIT

step "plugins (components, most without WASI)"
bash tests/build-plugins.sh "$WASMOP_PLUGIN_DIR"
wait "$fetch_pid" || true
if [[ -s $fetch_log ]]; then
  step "plugin toolchains and Envoy: the background install's log"
  cat "$fetch_log"
fi
rm -f "$fetch_log"

step "formatting"
cargo fmt --all --check

# Clippy's lints, checked while the test binaries compile: clippy-driver
# stands in for rustc on the workspace's own crates (as `cargo clippy` does)
# and then compiles them as rustc would, so the dependencies are built once
# rather than once for the tests and once more in check mode for clippy (11
# of a cold run's minutes). Every cargo command below that builds the
# workspace for this machine runs through `linted`: cargo tells the two
# kinds of build apart, and a plain one would rebuild the workspace's crates.
clippy_driver="$(rustup which clippy-driver)"
linted() {
  RUSTC_WORKSPACE_WRAPPER="$clippy_driver" \
    CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__" "$@"
}

step "lints (clippy -D warnings) and test binaries of every target, next to the control plane's build"
# shellcheck disable=SC2086
linted cargo test --workspace --all-targets --no-run ${CARGO_TEST_ARGS:-}
# The operator's binary from that build (the integration tests run it), for
# the scripts below: they would otherwise build it themselves with
# `cargo build -p wasmop`, whose features resolve differently, a second build
# of the host crate.
export WASMOP_BIN="$CARGO_TARGET_DIR/debug/wasmop"
[[ -x $WASMOP_BIN ]] || {
  echo "error: the test build left no $WASMOP_BIN" >&2
  exit 1
}

# The checks that need no control plane: a plugin crate scaffolded outside
# the workspace, and every shipped plugin explored offline. (Each check
# returns at its first failure itself: the second lane below runs them
# where `set -e` does not act.)
offline_checks() {
  step "a plugin crate outside the workspace (wasmop new, build, wasmop plan)"
  bash tests/scaffold-check.sh || return
  step "wasmop check: the eight properties of every shipped plugin, in a modelled cluster"
  bash tests/check-plugins.sh || return
}
# The checks that need one: the README's run command, on a fresh control
# plane (so its CRD handling meets CRDs just created), and the deployment
# files.
cluster_checks() {
  step "the README's run command, unattended, as the operator's ServiceAccount under deploy/rbac.yaml (deploy/run-local.sh --check --rbac)"
  bash deploy/run-local.sh --check --rbac || return
  step "deployment files: Pod Security restricted, generated RBAC, Helm chart"
  bash tests/deploy-check.sh || return
}

# The test binaries that stop, kill and freeze their control plane's
# components on purpose (tests/tests/<name>.rs) get a control plane of their
# own, and run in a lane beside the other tests, which share the first one:
# most integration tests wait on the cluster (Jobs, deadlines, leases) far
# more than they compute, so the lanes overlap without slowing each other
# much. That second lane first runs the checks above (on its control plane,
# still fresh), so they take none of the first lane's time either. With
# CARGO_TEST_ARGS (a filter of a developer's) everything runs in one lane on
# the first control plane, one step after the other.
breaking=(chaos faults)
lanes=0
[[ -z ${CARGO_TEST_ARGS:-} ]] && lanes=1
breakable_dir="$WASMOP_CLUSTER_DIR-breakable"
# Its own ports: each default of tests/cluster/up.sh plus one (etcd's two)
# or plus ten (the rest).
breakable_env=(WASMOP_CLUSTER_DIR="$breakable_dir"
  WASMOP_ETCD_PORT=23791 WASMOP_ETCD_PEER_PORT=23801 WASMOP_API_PORT=26453
  WASMOP_KCM_PORT=26267 WASMOP_SCHED_PORT=26269 WASMOP_KWOK_PORT=26270)

[[ $lanes == 1 ]] || offline_checks

control_plane_built

step "local control plane$([[ $lanes == 1 ]] && echo "s: one for the tests, one for those that break it (${breaking[*]}) and for the checks")"
cleanup() {
  if [[ ${WASMOP_KEEP_CLUSTER:-0} == 1 ]]; then
    log "leaving the control plane running (WASMOP_KEEP_CLUSTER=1); stop it with bash tests/cluster/down.sh"
    [[ $lanes == 1 ]] && log "and the second with WASMOP_CLUSTER_DIR=$breakable_dir bash tests/cluster/down.sh"
  else
    bash tests/cluster/down.sh --keep-logs || true
    [[ $lanes == 1 ]] && env "${breakable_env[@]}" bash tests/cluster/down.sh --keep-logs || true
  fi
}
trap cleanup EXIT
KUBECONFIG="$(bash tests/cluster/up.sh)"
export KUBECONFIG
if [[ $lanes == 1 ]]; then
  breakable_kubeconfig="$(env "${breakable_env[@]}" bash tests/cluster/up.sh)"
else
  cluster_checks
fi

test_log="$(mktemp)"
set +e
# shellcheck disable=SC2206
test_args=(${CARGO_TEST_ARGS:-})
if [[ ${#skip_args[@]} -gt 0 ]]; then
  # Test-binary arguments go after one `--` (CARGO_TEST_ARGS may hold it).
  [[ " ${test_args[*]} " == *" -- "* ]] || test_args+=(--)
  test_args+=("${skip_args[@]}")
fi
side_failed=""
if [[ $lanes == 0 ]]; then
  step "cargo test --workspace"
  linted cargo test --workspace --no-fail-fast "${test_args[@]}" 2>&1 | tee "$test_log"
  status=${PIPESTATUS[0]}
else
  # What `cargo test --workspace` runs, in two lanes. The second runs its
  # test binaries itself, one after the other from the package's directory,
  # as cargo would.
  [[ ${#test_args[@]} -gt 0 ]] || test_args=(--)
  mapfile -t breaking_bins < <(linted cargo test --workspace --no-run --message-format=json \
    $(printf -- '--test %s ' "${breaking[@]}") 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and "test" in m["target"]["kind"]:
        print(m["target"]["name"], m["executable"], m["manifest_path"])
')
  if [[ ${#breaking_bins[@]} != "${#breaking[@]}" ]]; then
    echo "error: found ${#breaking_bins[@]} test binaries for ${breaking[*]}: ${breaking_bins[*]}" >&2
    exit 1
  fi
  # Every other test target of the workspace: unit tests, golden plans,
  # integration tests, then the doc tests.
  mapfile -t other_tests < <(cargo metadata --format-version 1 --no-deps | python3 -c '
import json, sys
breaking = set(sys.argv[1:])
names = sorted({t["name"] for p in json.load(sys.stdin)["packages"] for t in p["targets"]
                if "test" in t["kind"] and not (p["name"] == "wasmop-tests" and t["name"] in breaking)})
for n in names:
    print("--test=" + n)
' "${breaking[@]}")
  side_log="$(mktemp)"
  side_failures="$(mktemp)"
  (
    export "${breakable_env[@]}"
    export KUBECONFIG="$breakable_kubeconfig"
    rc=0
    cluster_checks || {
      rc=1
      echo "  the README's run command or the deployment files (deploy/run-local.sh --check --rbac, tests/deploy-check.sh): see the second lane's output" >>"$side_failures"
    }
    offline_checks || {
      rc=1
      echo "  the offline checks (tests/scaffold-check.sh, tests/check-plugins.sh): see the second lane's output" >>"$side_failures"
    }
    step "cargo test: ${breaking[*]}"
    for entry in "${breaking_bins[@]}"; do
      read -r name exe manifest <<<"$entry"
      printf '     Running tests/%s.rs (%s)\n' "$name" "$exe"
      (cd "$(dirname "$manifest")" && "$exe" "${test_args[@]:1}") || rc=1
    done
    exit "$rc"
  ) >"$side_log" 2>&1 &
  side_pid=$!
  step "cargo test --workspace, but ${breaking[*]}; beside it, on the second control plane: the README's run command, the deployment files, the offline checks, then ${breaking[*]} (that lane's output follows this one's)"
  linted cargo test --workspace --no-fail-fast --lib --bins "${other_tests[@]}" "${test_args[@]}" 2>&1 | tee "$test_log"
  status=${PIPESTATUS[0]}
  linted cargo test --workspace --no-fail-fast --doc "${test_args[@]}" 2>&1 | tee -a "$test_log"
  doc_status=${PIPESTATUS[0]}
  side_status=0
  wait "$side_pid" || side_status=$?
  step "the second lane's output"
  tee -a "$test_log" <"$side_log"
  side_failed="$(cat "$side_failures")"
  rm -f "$side_log" "$side_failures"
  for s in "$doc_status" "$side_status"; do
    [[ $status != 0 ]] || status=$s
  done
fi
set -e
# One closing line over every test binary (cargo prints one per binary, the
# last of which is usually an empty doc-test run).
totals="$(awk '/^test result:/ { p += $4; f += $6 } END { printf "%d passed, %d failed", p, f }' "$test_log")"
# What failed, repeated at the end: a CI log is often read from its tail,
# and cargo prints each binary's failures where that binary ran: the name of
# each failed test, then the first twelve lines of its panic or error.
failed="$(awk '
  /^ *Running / { bin = $2 }
  /^test .* \.\.\. FAILED$/ { names = names "  " bin ": " $2 "\n" }
  /^---- .* stdout ----$/ { test = $2; keep = 0; next }
  test != "" && keep == 0 && (/panicked at/ || /^Error: /) { keep = 12; detail = detail "  " test ":\n" }
  keep > 0 { detail = detail "      " $0 "\n"; keep--; if (keep == 0) test = "" }
  END { printf "%s%s", names, detail }
' "$test_log")"
rm -f "$test_log"
step "finished in $(( $(date +%s) - t0 ))s"
if [[ ${#skip_args[@]} -gt 0 ]]; then
  echo "tests: $totals, ${#root_only[@]} skipped"
  echo "skipped (they need root): ${root_only[*]}"
else
  echo "tests: $totals"
fi
if [[ -n $failed || -n $side_failed ]]; then
  echo "failed:"
  [[ -z $side_failed ]] || echo "$side_failed"
  echo "$failed"
fi
exit "$status"
