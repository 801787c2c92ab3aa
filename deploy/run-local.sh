#!/usr/bin/env bash
# Shows wasmop working on a fresh machine with no cluster of your own:
# builds the plugins, starts the local control plane (tests/cluster/up.sh,
# the same scripts the tests use), installs the CRDs, runs the operator,
# applies the examples in deploy/examples/ and shows what the operator made
# and the primaries' conditions as they converge. Ctrl-C stops everything
# this script started.
#
#   bash deploy/run-local.sh [EXAMPLE.yaml ...]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. tests/cluster/lib.sh

examples=("$@")
[[ ${#examples[@]} -gt 0 ]] || examples=(deploy/examples/widgets.yaml deploy/examples/firebolt-instance.yaml)

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$WASMOP_CACHE/target}"
built="$CARGO_TARGET_DIR/plugins"
# The operator's plugin directory for the demo: the shipped plugins plus the
# `good` test plugin that reconciles the example Widgets (the other test
# plugins misbehave on purpose, or claim the same kinds).
plugins="$WASMOP_CLUSTER_DIR/demo-plugins"
KUBECTL="$K8S_BIN/kubectl"

bash tests/build-plugins.sh "$built"
cargo build -p wasmop
WASMOP="$CARGO_TARGET_DIR/debug/wasmop"

# Reuse a control plane that is already up (and leave it running after);
# otherwise start one and stop it on exit.
started_cluster=1
if [[ -x $KUBECTL ]] && KUBECONFIG="$WASMOP_CLUSTER_DIR/kubeconfig" "$KUBECTL" get --raw /readyz >/dev/null 2>&1; then
  started_cluster=0
  echo "reusing the local control plane already running in $WASMOP_CLUSTER_DIR"
fi
bash tests/cluster/up.sh >/dev/null
export KUBECONFIG="$WASMOP_CLUSTER_DIR/kubeconfig"

op_pid=""
stop() {
  trap - INT TERM EXIT
  echo
  if [[ -n $op_pid ]]; then
    kill "$op_pid" 2>/dev/null || true
    wait "$op_pid" 2>/dev/null || true
  fi
  if [[ $started_cluster == 1 ]]; then bash tests/cluster/down.sh; fi
  exit 0
}
trap stop INT TERM EXIT

mkdir -p "$plugins"
cp "$built/good.wasm" "$plugins/"
for dir in plugins/*/; do
  name="$(basename "$dir")"
  if [[ $name != sdk && -f "$built/$name.wasm" ]]; then cp "$built/$name.wasm" "$plugins/"; fi
done
echo "plugins: $(cd "$plugins" && ls | paste -sd' ' -)"

"$KUBECTL" apply --server-side -f tests/fixtures/crds/ >/dev/null
if compgen -G "crds/*.yaml" >/dev/null; then "$KUBECTL" apply --server-side -f crds/ >/dev/null; fi
# The instance and engine plugins own cert-manager Certificates: their CRDs
# must exist (tests/cluster/build.sh, run by up.sh, fetched them).
"$KUBECTL" apply --server-side -f "$CERT_MANAGER_CRDS/" >/dev/null
"$KUBECTL" wait --for=condition=Established crd --all --timeout=60s >/dev/null

log_file="$WASMOP_CLUSTER_DIR/logs/wasmop.log"
"$WASMOP" run --plugins "$plugins" --metrics-addr 127.0.0.1:9464 >"$log_file" 2>&1 &
op_pid=$!
echo "operator running (pid $op_pid), log: $log_file"

for f in "${examples[@]}"; do "$KUBECTL" apply --server-side -f "$f"; done

kinds=$(for f in "${examples[@]}"; do awk '/^kind:/{print $2}' "$f"; done | sort -u | paste -sd, -)
while true; do
  clear 2>/dev/null || true
  date
  echo "--- primaries ($kinds) and their conditions"
  "$KUBECTL" get "$kinds" -A --sort-by=.kind \
    -o custom-columns='KIND:.kind,NAMESPACE:.metadata.namespace,NAME:.metadata.name,READY:.status.conditions[?(@.type=="Ready")].status,RECONCILED:.status.conditions[?(@.type=="Reconciled")].status,REASON:.status.conditions[?(@.type=="Reconciled")].reason,RECONCILED-BY:.metadata.annotations.wasmop\.dev/reconciled-by' || true
  echo "--- objects the operator made (label app.kubernetes.io/managed-by=wasmop)"
  "$KUBECTL" get deployments,statefulsets,services,configmaps,secrets,pods -A -l app.kubernetes.io/managed-by=wasmop || true
  echo "--- last operator log lines"
  tail -n 5 "$log_file"
  echo "(Ctrl-C stops the operator and the control plane)"
  kill -0 "$op_pid" 2>/dev/null || { echo "operator exited; see $log_file"; exit 1; }
  sleep 2
done
