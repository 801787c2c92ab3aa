#!/usr/bin/env bash
# Shows wasmop working on a fresh machine with no cluster of your own:
# builds the plugins, starts the local control plane (tests/cluster/up.sh,
# the same scripts the tests use), installs the CRDs and waits until each is
# established, runs the operator, applies the examples in deploy/examples/
# and shows the examples' primaries (the objects of kinds a CRD serves) with
# their conditions as they converge, and what the operator made. The
# examples cover every shipped plugin (instance, engine, backup, fleet,
# team) and the `good` test plugin; the operator runs with the settings of
# deploy/run-local.yaml, labels the kwok Node with the zone the fleet
# example uses, and calls the stand-in terdut-server (tests/terdut-standin)
# this script starts on loopback for the team example. Ctrl-C stops
# everything this script started.
#
#   bash deploy/run-local.sh [--check] [EXAMPLE.yaml ...]
#
# --check   run the same demo without a screen: wait until every example
#           primary has the condition Ready=True (EtcdBackup:
#           BackupCompleted=True, its Job completed; Backup: Scheduled=True,
#           its CronJob made) (deadline
#           WASMOP_DEMO_TIMEOUT seconds, default 300), check the operator's
#           /metrics, /readyz and /healthz, delete the examples again, and exit 0;
#           exit 1 with the primaries' state and the operator's log tail
#           when the deadline passes or the operator exits. tests/run.sh
#           runs this, so the demo is exercised on every CI run.
# --rbac    run the operator as it runs in a cluster: as the ServiceAccount
#           wasmop/wasmop of deploy/wasmop.yaml with the Roles and bindings
#           of deploy/rbac.yaml (its token from the TokenRequest API), with
#           leader election and the admission webhooks on, and only the five
#           shipped plugins (the `good` test plugin and widgets.yaml, which
#           the shipped RBAC does not cover, are left out). With --check,
#           after the examples converged and were deleted again, compares
#           the API server's audit log of the ServiceAccount's requests with
#           the grants (tests/rbac-audit.py; reasons for unused grants in
#           tests/rbac-reasons.txt) and fails on any forbidden request or
#           unexplained grant. Needs the audit log tests/cluster/up.sh
#           turns on.
#
# Environment: WASMOP_CLUSTER_DIR and the WASMOP_*_PORT variables of
# tests/cluster/up.sh; WASMOP_DEMO_METRICS_ADDR (default 127.0.0.1:9464;
# --check defaults to a free port) where the operator serves /metrics,
# /healthz and /readyz;
# WASMOP_PLUGIN_DIR, where the plugins are built; WASMOP_BIN and
# WASMOP_STANDIN_BIN, a wasmop and a terdut-standin binary to use instead of
# building them.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. tests/cluster/lib.sh

check=0
rbac=0
examples=()
for arg in "$@"; do
  case $arg in
    --check) check=1 ;;
    --rbac) rbac=1 ;;
    -h|--help) sed -n '2,45p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option $arg (see --help)" ;;
    *) [[ -f $arg ]] || die "no such example file: $arg"; examples+=("$arg") ;;
  esac
done
if [[ ${#examples[@]} -eq 0 ]]; then
  # The Widgets need the `good` test plugin, which --rbac leaves out.
  [[ $rbac == 1 ]] || examples=(deploy/examples/widgets.yaml)
  examples+=(
    deploy/examples/firebolt-instance.yaml
    deploy/examples/firebolt-engine.yaml
    deploy/examples/etcd-backup.yaml
    deploy/examples/celld-fleet.yaml
    deploy/examples/terdut-team.yaml
  )
fi
# The condition that says a primary of a kind converged, where it is not
# Ready: a finished backup, a scheduled one.
done_condition() {
  case $1 in
    EtcdBackup) echo BackupCompleted ;;
    Backup) echo Scheduled ;;
    *) echo Ready ;;
  esac
}
# The address the team example names for its server; replaced by the
# stand-in's when applied.
TERDUT_PLACEHOLDER=http://127.0.0.1:18091

if [[ $check == 1 ]]; then
  metrics_addr="${WASMOP_DEMO_METRICS_ADDR:-127.0.0.1:0}"
else
  metrics_addr="${WASMOP_DEMO_METRICS_ADDR:-127.0.0.1:9464}"
fi
timeout_s="${WASMOP_DEMO_TIMEOUT:-300}"

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$WASMOP_CACHE/target}"
built="${WASMOP_PLUGIN_DIR:-$CARGO_TARGET_DIR/plugins}"
# The operator's plugin directory for the demo: the shipped plugins plus the
# `good` test plugin that reconciles the example Widgets (the other test
# plugins misbehave on purpose, or claim the same kinds).
plugins="$WASMOP_CLUSTER_DIR/demo-plugins"
KUBECTL="$K8S_BIN/kubectl"

bash tests/build-plugins.sh "$built"
# WASMOP_BIN: use this wasmop binary instead of building one.
if [[ -z ${WASMOP_BIN:-} ]]; then cargo build -p wasmop; fi
# The stand-in terdut-server program: `cargo test --workspace` builds it too
# (tests/run.sh's build leaves it where this looks first).
STANDIN="${WASMOP_STANDIN_BIN:-$CARGO_TARGET_DIR/debug/terdut-standin}"
if [[ -z ${WASMOP_BIN:-} || ! -x $STANDIN ]]; then cargo build -p terdut-standin --bin terdut-standin; fi
WASMOP="${WASMOP_BIN:-$CARGO_TARGET_DIR/debug/wasmop}"

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
standin_pid=""
applied=0
log_file="$WASMOP_CLUSTER_DIR/logs/wasmop.log"
cleanup() {
  local status=$?
  trap - INT TERM EXIT
  echo
  # --check leaves the cluster as it found it: the examples are deleted
  # while the operator still runs (it removes its finalizers).
  if [[ $check == 1 && $applied == 1 ]]; then
    for f in "${examples[@]}"; do
      "$KUBECTL" delete -f "$f" --ignore-not-found --wait=true --timeout=60s >/dev/null 2>&1 || echo "could not delete everything of $f"
    done
    delete_stale_reservations
  fi
  for pid in $op_pid $standin_pid; do
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  # Webhooks with failurePolicy Fail pointing at an operator that is gone
  # would refuse every later write of their kinds.
  if [[ $rbac == 1 ]]; then
    "$KUBECTL" delete validatingwebhookconfiguration wasmop-admission --ignore-not-found >/dev/null 2>&1 || true
  fi
  if [[ $started_cluster == 1 ]]; then bash tests/cluster/down.sh --keep-logs; fi
  if [[ $check == 1 ]]; then exit "$status"; fi
  exit 0
}
trap cleanup INT TERM EXIT

mkdir -p "$plugins"
rm -f "$plugins"/*.wasm
[[ $rbac == 1 ]] || cp "$built/good.wasm" "$plugins/"
for dir in plugins/*/; do
  name="$(basename "$dir")"
  if [[ $name != sdk && -f "$built/$name.wasm" ]]; then cp "$built/$name.wasm" "$plugins/"; fi
done
echo "plugins: $(cd "$plugins" && ls | paste -sd' ' -)"

# Applies CRD files and waits until each CRD is Established. A CRD has no
# status at all for a moment after it is created, so this polls its
# condition rather than `kubectl wait ... crd --all`, which fails on that.
apply_crds() {
  local names name deadline=$(( $(date +%s) + 60 ))
  names=$("$KUBECTL" apply --server-side -o name "$@")
  for name in $names; do
    until [[ $("$KUBECTL" get "$name" -o jsonpath='{.status.conditions[?(@.type=="Established")].status}' 2>/dev/null) == True ]]; do
      (( $(date +%s) < deadline )) || die "$name is not established after 60s"
      sleep 0.2
    done
  done
}
apply_crds -f tests/fixtures/crds/
if compgen -G "crds/*.yaml" >/dev/null; then apply_crds -f crds/; fi
# The instance and engine plugins own cert-manager Certificates: their CRDs
# must exist (tests/cluster/build.sh, run by up.sh, fetched them).
apply_crds -f "$CERT_MANAGER_CRDS/"
echo "CRDs established"

# A CelldStorageReservation binds its bucket to one fleet for good and
# outlives the fleet; the reservations of example fleets that are gone
# (an earlier run's) are deleted so that the example can be applied again.
delete_stale_reservations() {
  local name fns fname
  while read -r name fns fname; do
    [[ -n $name ]] || continue
    if ! "$KUBECTL" get celldfleets.celld.eric.dev -n "$fns" "$fname" >/dev/null 2>&1; then
      "$KUBECTL" delete celldstoragereservations.celld.eric.dev "$name" --ignore-not-found >/dev/null
    fi
  done < <("$KUBECTL" get celldstoragereservations.celld.eric.dev -o jsonpath='{range .items[?(@.spec.bucket=="wasmop-demo-celld")]}{.metadata.name} {.spec.fleetNamespace} {.spec.fleetName}{"\n"}{end}' 2>/dev/null)
}
delete_stale_reservations

# The fleet example places its member in zone us-east-1a.
"$KUBECTL" label nodes -l type=kwok topology.kubernetes.io/zone=us-east-1a --overwrite >/dev/null

# The stand-in terdut-server for the team example, on loopback.
mkdir -p "$(dirname "$log_file")"
standin_out="$WASMOP_CLUSTER_DIR/logs/terdut-standin.out"
"$STANDIN" >"$standin_out" 2>&1 &
standin_pid=$!
deadline=$(( $(date +%s) + 30 ))
until [[ -s $standin_out ]]; do
  kill -0 "$standin_pid" 2>/dev/null || die "the stand-in terdut-server exited: $(cat "$standin_out")"
  (( $(date +%s) < deadline )) || die "the stand-in terdut-server printed no address in 30s"
  sleep 0.1
done
terdut_url=$(head -n1 "$standin_out")
[[ $terdut_url == http://127.0.0.1:* ]] || die "the stand-in terdut-server printed no loopback address: $terdut_url"
echo "stand-in terdut-server at $terdut_url (pid $standin_pid)"

op_args=()
if [[ $rbac == 1 ]]; then
  # The ServiceAccount as deploy/wasmop.yaml makes it, the RBAC of
  # deploy/rbac.yaml, and a kubeconfig with a token of the account.
  "$KUBECTL" create --dry-run=client -o json -f deploy/wasmop.yaml | python3 -c '
import json, sys
text, decoder, pos, items = sys.stdin.read(), json.JSONDecoder(), 0, []
while text[pos:].strip():
    while text[pos].isspace():
        pos += 1
    item, pos = decoder.raw_decode(text, pos)
    items.append(item)
json.dump({"apiVersion": "v1", "kind": "List",
           "items": [i for i in items if i["kind"] in ("Namespace", "ServiceAccount")]}, sys.stdout)' |
    "$KUBECTL" apply --server-side -f - >/dev/null
  "$KUBECTL" apply --server-side -f deploy/rbac.yaml >/dev/null
  audit_log="$WASMOP_CLUSTER_DIR/logs/audit.log"
  [[ -f $audit_log ]] || die "no API server audit log at $audit_log: the control plane was started by an older tests/cluster/up.sh; stop it (tests/cluster/down.sh) and run again"
  audit_offset=$(stat -c %s "$audit_log")
  token=$("$KUBECTL" create token wasmop -n wasmop --duration=2h)
  sa_kubeconfig="$WASMOP_CLUSTER_DIR/wasmop-sa.kubeconfig"
  server=$("$KUBECTL" config view --raw -o jsonpath='{.clusters[0].cluster.server}')
  ca=$("$KUBECTL" config view --raw -o jsonpath='{.clusters[0].cluster.certificate-authority-data}')
  ( umask 077
    cat >"$sa_kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters: [{name: local, cluster: {server: "$server", certificate-authority-data: "$ca"}}]
users: [{name: wasmop, user: {token: "$token"}}]
contexts: [{name: wasmop, context: {cluster: local, user: wasmop, namespace: wasmop}}]
current-context: wasmop
KC
  )
  admission_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  op_args=(--kubeconfig "$sa_kubeconfig" --leader-elect --leader-election-namespace wasmop
    --admission-port "$admission_port" --admission-bind 127.0.0.1 --admission-namespace wasmop
    --admission-url "https://127.0.0.1:$admission_port")
  echo "operator runs as system:serviceaccount:wasmop:wasmop with deploy/rbac.yaml (admission on 127.0.0.1:$admission_port)"
fi
"$WASMOP" run --plugins "$plugins" --config deploy/run-local.yaml --allow-url "$terdut_url" \
  --metrics-addr "$metrics_addr" "${op_args[@]}" >"$log_file" 2>&1 &
op_pid=$!
echo "operator running (pid $op_pid), log: $log_file"

applied=1
for f in "${examples[@]}"; do
  sed "s#$TERDUT_PLACEHOLDER#$terdut_url#g" "$f" | "$KUBECTL" apply --server-side -f -
done

# The examples' primaries: objects whose kind a CRD serves (not the
# Namespaces and other built-in objects the examples also hold), as
# "resource.group namespace name" lines.
crd_map=$("$KUBECTL" get crd -o jsonpath='{range .items[*]}{.spec.names.kind}.{.spec.group} {.spec.names.plural}.{.spec.group}{"\n"}{end}')
primaries=()
while read -r api kind ns name; do
  [[ -n $kind ]] || continue
  group="${api%/*}"
  [[ $group == "$api" ]] && group=""
  resource=$(awk -v k="$kind.$group" '$1 == k {print $2}' <<<"$crd_map")
  [[ -n $resource ]] || continue
  [[ $ns == "<none>" ]] && ns=""
  primaries+=("$resource ${ns:--} $name $(done_condition "$kind")")
done < <(for f in "${examples[@]}"; do
  "$KUBECTL" get -f "$f" --no-headers -o custom-columns='A:.apiVersion,K:.kind,N:.metadata.namespace,M:.metadata.name'
done)
[[ ${#primaries[@]} -gt 0 ]] || die "the examples hold no object of a kind a CRD serves"
resources=$(printf '%s\n' "${primaries[@]}" | awk '{print $1}' | sort -u | paste -sd, -)

show_primaries() {
  "$KUBECTL" get "$resources" -A --sort-by=.kind \
    -o custom-columns='KIND:.kind,NAMESPACE:.metadata.namespace,NAME:.metadata.name,READY:.status.conditions[?(@.type=="Ready")].status,BACKUP-COMPLETED:.status.conditions[?(@.type=="BackupCompleted")].status,SCHEDULED:.status.conditions[?(@.type=="Scheduled")].status,RECONCILED:.status.conditions[?(@.type=="Reconciled")].status,REASON:.status.conditions[?(@.type=="Reconciled")].reason,RECONCILED-BY:.status.conditions[?(@.type=="Reconciled")].message' || true
}

# Prints the primaries whose condition (Ready, or done_condition's) is not
# True yet.
not_ready() {
  local p resource ns name cond args status
  for p in "${primaries[@]}"; do
    read -r resource ns name cond <<<"$p"
    args=("$resource" "$name")
    [[ $ns == - ]] || args+=(-n "$ns")
    status=$("$KUBECTL" get "${args[@]}" -o jsonpath="{.status.conditions[?(@.type==\"$cond\")].status}" 2>/dev/null || true)
    [[ $status == True ]] || echo "$p"
  done
}

# The address the operator bound (its log line "serving metrics").
bound_addr() {
  sed -n 's/.*serving metrics.*addr=\([0-9.:]*\).*/\1/p' "$log_file" | head -n1
}

if [[ $check == 1 ]]; then
  echo "waiting up to ${timeout_s}s for every primary's condition to be True: ${primaries[*]/%/;}"
  deadline=$(( $(date +%s) + timeout_s ))
  while true; do
    kill -0 "$op_pid" 2>/dev/null || { show_primaries; echo "operator exited; log tail:"; tail -n 40 "$log_file"; exit 1; }
    pending=$(not_ready)
    [[ -n $pending ]] || break
    if (( $(date +%s) >= deadline )); then
      echo "not Ready after ${timeout_s}s:"; echo "$pending"
      show_primaries
      echo "operator log tail:"; tail -n 40 "$log_file"
      exit 1
    fi
    sleep 1
  done
  show_primaries
  addr=$(bound_addr)
  [[ -n $addr ]] || { echo "the operator did not log its metrics address"; exit 1; }
  for path in metrics readyz healthz; do
    curl -fsS "http://$addr/$path" >/dev/null || { echo "GET /$path on the operator failed"; curl -sS "http://$addr/$path"; exit 1; }
  done
  # Read the whole page first: `curl | grep -q` fails under pipefail when
  # grep stops reading at its first match before curl has written it all.
  metrics="$(curl -fsS "http://$addr/metrics")" || { echo "GET /metrics on the operator failed"; exit 1; }
  grep -q '^workqueue_adds_total{name=' <<<"$metrics" \
    || { echo "/metrics has no workqueue_adds_total series"; exit 1; }
  echo "demo check passed: every example primary converged (its condition True); /metrics, /readyz and /healthz answer 200"
  if [[ $rbac == 1 ]]; then
    # Deleted while the operator runs, so its deletion paths (finalizers,
    # cleanup) are in the audit log too.
    for f in "${examples[@]}"; do
      "$KUBECTL" delete -f "$f" --ignore-not-found --wait=true --timeout=60s >/dev/null || { echo "could not delete everything of $f"; exit 1; }
    done
    delete_stale_reservations
    applied=0
    # RBAC's refusal reads 'User "..." cannot VERB resource "..."'.
    if grep -q 'cannot [a-z]* resource' "$log_file"; then
      echo "the operator's log shows a request RBAC refused:"; grep -m5 'cannot [a-z]* resource' "$log_file"; exit 1
    fi
    # Stopped first: a watch is in the audit log once it ended.
    kill "$op_pid"; wait "$op_pid" || true; op_pid=""
    rbac_json="$WASMOP_CLUSTER_DIR/rbac.json"
    "$KUBECTL" create --dry-run=client -o json -f deploy/rbac.yaml >"$rbac_json"
    python3 tests/rbac-audit.py "$audit_log" "$audit_offset" "$rbac_json" tests/rbac-reasons.txt \
      system:serviceaccount:wasmop:wasmop || exit 1
    echo "RBAC check passed: the operator ran as its ServiceAccount with deploy/rbac.yaml; no request was forbidden"
  fi
  exit 0
fi

while true; do
  clear 2>/dev/null || true
  date
  echo "--- primaries (${resources}) and their conditions"
  show_primaries
  echo "--- objects the operator made (label app.kubernetes.io/managed-by=wasmop)"
  "$KUBECTL" get deployments,statefulsets,services,configmaps,secrets,pods -A -l app.kubernetes.io/managed-by=wasmop || true
  echo "--- last operator log lines"
  tail -n 5 "$log_file"
  echo "(Ctrl-C stops the operator and the control plane; metrics at http://$(bound_addr)/metrics)"
  kill -0 "$op_pid" 2>/dev/null || { echo "operator exited; see $log_file"; exit 1; }
  sleep 2
done
