# Shared settings for the local control plane scripts. Sourced, not run.
# shellcheck shell=bash

CLUSTER_SCRIPTS="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=tests/cluster/versions.env
. "$CLUSTER_SCRIPTS/versions.env"

# Built binaries live outside the repository, keyed by version, so a fresh
# clone on the same machine reuses them.
WASMOP_CACHE="${WASMOP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/wasmop}"
K8S_BIN="$WASMOP_CACHE/bin/k8s-$K8S_VERSION"
ETCD_BIN="$WASMOP_CACHE/bin/etcd-$ETCD_VERSION"
KWOK_BIN="$WASMOP_CACHE/bin/kwok-$KWOK_VERSION"
CERT_MANAGER_CRDS="$WASMOP_CACHE/crds/cert-manager-$CERT_MANAGER_VERSION"
HELM_BIN="$WASMOP_CACHE/bin/helm-$HELM_VERSION"
GATEWAY_API_CRDS="$WASMOP_CACHE/crds/gateway-api-$GATEWAY_API_VERSION"
ISTIO_CRDS="$WASMOP_CACHE/crds/istio-$ISTIO_API_VERSION"
REGISTRY_BIN="$WASMOP_CACHE/bin/registry-$REGISTRY_VERSION"
CRANE_BIN="$WASMOP_CACHE/bin/crane-$CRANE_VERSION"

# Runtime state of one local cluster (certs, data, logs, pids, kubeconfig).
WASMOP_CLUSTER_DIR="${WASMOP_CLUSTER_DIR:-${TMPDIR:-/tmp}/wasmop-cluster}"

log() { printf '[cluster] %s\n' "$*" >&2; }
die() { printf '[cluster] error: %s\n' "$*" >&2; exit 1; }

# Stops with a message when $WASMOP_CLUSTER_DIR holds a file of another
# user: a cluster directory left by a run as root (as CI runs) cannot be
# cleaned up, reused or replaced by a normal user, and up.sh would fail on
# its first `rm` or `mkdir`. Root can remove anything, so it is not checked.
require_own_cluster_dir() {
  [[ -e $WASMOP_CLUSTER_DIR && $(id -u) != 0 ]] || return 0
  local other
  other="$(find "$WASMOP_CLUSTER_DIR" ! -user "$(id -u)" -print -quit 2>/dev/null || true)"
  [[ -z $other ]] ||
    die "$WASMOP_CLUSTER_DIR is another user's control plane ($other belongs to $(stat -c %U "$other"), not to $(id -un); a run as root leaves one): remove it as that user (bash tests/cluster/down.sh), or set WASMOP_CLUSTER_DIR to a directory of your own"
}

# pid -> 0 when the process is reaped, or when each of its threads is a
# zombie: the first thread of a multi-threaded process (all the components
# are Go programs) may turn zombie while others still hold its sockets.
exited() {
  local pid="$1" t
  [[ -d /proc/$pid ]] || return 0
  for t in /proc/"$pid"/task/*; do
    [[ -e $t/status ]] || continue
    grep -q '^State:.*Z' "$t/status" 2>/dev/null || return 1
  done
  return 0
}

# For the bench and soak scripts run outside tests/run.sh: the cargo target
# and plugin dirs exported (the same defaults as tests/run.sh), the
# control-plane binaries and the plugins built.
prepare_run() {
  export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$WASMOP_CACHE/target}"
  export WASMOP_PLUGIN_DIR="${WASMOP_PLUGIN_DIR:-$CARGO_TARGET_DIR/plugins}"
  bash tests/cluster/build.sh
  bash tests/build-plugins.sh "$WASMOP_PLUGIN_DIR" >/dev/null
}

# profile -> the directory cargo puts that profile's binaries in.
profile_dir() {
  if [[ "$1" == dev ]]; then echo "$CARGO_TARGET_DIR/debug"; else echo "$CARGO_TARGET_DIR/$1"; fi
}

# Starts a local control plane for this script and exports KUBECONFIG; it
# is stopped when the script exits, unless WASMOP_KEEP_CLUSTER=1.
cluster_for_script() {
  trap '[[ ${WASMOP_KEEP_CLUSTER:-0} == 1 ]] || bash tests/cluster/down.sh || true' EXIT
  KUBECONFIG="$(bash tests/cluster/up.sh)"
  export KUBECONFIG
}
