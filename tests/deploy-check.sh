#!/usr/bin/env bash
# Checks the deployment files against the running local control plane
# (KUBECONFIG): run by tests/run.sh after tests/cluster/up.sh.
#
#   1. deploy/wasmop.yaml, applied with a server-side dry run into the
#      namespace `wasmop` labelled pod-security.kubernetes.io/enforce and
#      warn = restricted, is accepted without a single warning.
#
# Exits non-zero on the first failure, printing what the API server said.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. tests/cluster/lib.sh
KUBECTL="$K8S_BIN/kubectl"
[[ -n ${KUBECONFIG:-} ]] || die "KUBECONFIG must point at the local control plane"

fail() { printf '[deploy-check] FAILED: %s\n' "$*" >&2; exit 1; }
ok() { printf '[deploy-check] ok: %s\n' "$*"; }

# Applies FILE... with a server-side dry run; fails on an error or on any
# warning (kubectl prints the API server's Warning headers on stderr).
dry_run_clean() {
  local out err
  out="$(mktemp)" err="$(mktemp)"
  if ! "$KUBECTL" apply --server-side --dry-run=server --field-manager=deploy-check "$@" >"$out" 2>"$err"; then
    cat "$out" "$err" >&2
    rm -f "$out" "$err"
    return 1
  fi
  if grep -qi 'warning' "$err"; then
    cat "$err" >&2
    rm -f "$out" "$err"
    return 1
  fi
  rm -f "$out" "$err"
}

restricted_ns() {
  local ns=$1
  "$KUBECTL" create namespace "$ns" --dry-run=client -o yaml | "$KUBECTL" apply -f - >/dev/null
  "$KUBECTL" label namespace "$ns" --overwrite \
    pod-security.kubernetes.io/enforce=restricted \
    pod-security.kubernetes.io/enforce-version=latest \
    pod-security.kubernetes.io/warn=restricted \
    pod-security.kubernetes.io/warn-version=latest >/dev/null
}

# 1. Pod Security "restricted".
restricted_ns wasmop
trap '"$KUBECTL" delete namespace wasmop --wait=false >/dev/null 2>&1 || true' EXIT
dry_run_clean -f deploy/wasmop.yaml || fail "deploy/wasmop.yaml in a restricted namespace (above)"
ok "deploy/wasmop.yaml passes Pod Security restricted with no warning"
