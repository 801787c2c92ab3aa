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

# Runtime state of one local cluster (certs, data, logs, pids, kubeconfig).
WASMOP_CLUSTER_DIR="${WASMOP_CLUSTER_DIR:-${TMPDIR:-/tmp}/wasmop-cluster}"

log() { printf '[cluster] %s\n' "$*" >&2; }
die() { printf '[cluster] error: %s\n' "$*" >&2; exit 1; }

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
