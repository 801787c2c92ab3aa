#!/usr/bin/env bash
# Starts a local Kubernetes control plane on loopback: etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler and kwok (which simulates one Node
# and the kubelet's work on Pods). Writes $WASMOP_CLUSTER_DIR/kubeconfig and
# waits until /readyz answers and the fake Node is Ready.
#
# Idempotent: when a cluster started by this script is already healthy it is
# reused. Builds (or reuses) the binaries through build.sh first.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

ETCD_PORT="${WASMOP_ETCD_PORT:-23790}"
ETCD_PEER_PORT="${WASMOP_ETCD_PEER_PORT:-23800}"
API_PORT="${WASMOP_API_PORT:-26443}"
KCM_PORT="${WASMOP_KCM_PORT:-26257}"
SCHED_PORT="${WASMOP_SCHED_PORT:-26259}"
KWOK_PORT="${WASMOP_KWOK_PORT:-26260}"
NODE_NAME="${WASMOP_NODE_NAME:-kwok-node-0}"
READY_TIMEOUT="${WASMOP_READY_TIMEOUT:-120}"

D="$WASMOP_CLUSTER_DIR"
KUBECTL="$K8S_BIN/kubectl"
export KUBECONFIG="$D/kubeconfig"

components=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)

alive() { # component -> 0 when its recorded process runs
  local f="$D/pids/$1.pid" pid
  [[ -f $f ]] || return 1
  pid="$(cat "$f")"
  [[ -d /proc/$pid ]] && grep -q "$1" "/proc/$pid/cmdline" 2>/dev/null
}

fail() { # component message -> print the component's log tail and exit
  local c="$1"; shift
  printf '[cluster] error: %s\n' "$*" >&2
  if [[ -f "$D/logs/$c.log" ]]; then
    printf '[cluster] last lines of %s:\n' "$D/logs/$c.log" >&2
    tail -n 40 "$D/logs/$c.log" | sed 's/^/    /' >&2
  fi
  printf '[cluster] stopping what was started\n' >&2
  bash "$CLUSTER_SCRIPTS/down.sh" --keep-logs >&2 || true
  exit 1
}

wait_for() { # component description timeout-seconds command...
  local c="$1" what="$2" t="$3"; shift 3
  local deadline=$(( $(date +%s) + t ))
  until "$@" >/dev/null 2>&1; do
    alive "$c" || fail "$c" "$c exited while waiting for $what"
    (( $(date +%s) < deadline )) || fail "$c" "timed out after ${t}s waiting for $what"
    sleep 0.5
  done
}

healthy() {
  local c
  # Every component running, with its command line recorded for component.sh
  # (a cluster from an older up.sh without the records is started afresh).
  for c in "${components[@]}"; do alive "$c" && [[ -f $D/cmd/$c ]] || return 1; done
  [[ -f $KUBECONFIG ]] && "$KUBECTL" get --raw /readyz >/dev/null 2>&1
}

require_own_cluster_dir
if healthy; then
  log "already running; kubeconfig: $KUBECONFIG; logs: $D/logs"
  echo "$KUBECONFIG"
  exit 0
fi
if [[ -d $D ]]; then
  log "found a stopped or partial cluster in $D; cleaning it up first"
  bash "$CLUSTER_SCRIPTS/down.sh" >&2
fi

bash "$CLUSTER_SCRIPTS/build.sh"
command -v openssl >/dev/null || die "openssl is required to generate the cluster's certificates"

for p in "$ETCD_PORT" "$ETCD_PEER_PORT" "$API_PORT" "$KCM_PORT" "$SCHED_PORT" "$KWOK_PORT"; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
    die "port $p on 127.0.0.1 is already in use (set WASMOP_*_PORT to move it)"
  fi
done

started=$(date +%s)
mkdir -p "$D"/{pki,logs,pids,cmd,etcd,stages}
log "state in $D; logs in $D/logs"

# --- certificates -----------------------------------------------------------
pki="$D/pki"
(
  cd "$pki"
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=wasmop-local-ca" \
    -keyout ca.key -out ca.crt
  cat > serving.ext <<EXT
subjectAltName=DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,IP:127.0.0.1,IP:10.0.0.1
extendedKeyUsage=serverAuth
EXT
  openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" -keyout serving.key -out serving.csr
  openssl x509 -req -in serving.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
    -extfile serving.ext -out serving.crt
  printf 'extendedKeyUsage=clientAuth\n' > client.ext
  openssl req -newkey rsa:2048 -nodes -subj "/O=system:masters/CN=wasmop-admin" -keyout admin.key -out admin.csr
  openssl x509 -req -in admin.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
    -extfile client.ext -out admin.crt
  openssl genrsa -out sa.key 2048
  openssl rsa -in sa.key -pubout -out sa.pub
) >"$D/logs/pki.log" 2>&1 || { cat "$D/logs/pki.log" >&2; die "certificate generation failed"; }

b64() { base64 -w0 < "$1"; }
cat > "$KUBECONFIG" <<KC
apiVersion: v1
kind: Config
clusters:
- name: wasmop-local
  cluster:
    server: https://127.0.0.1:$API_PORT
    certificate-authority-data: $(b64 "$pki/ca.crt")
users:
- name: wasmop-admin
  user:
    client-certificate-data: $(b64 "$pki/admin.crt")
    client-key-data: $(b64 "$pki/admin.key")
contexts:
- name: wasmop-local
  context: {cluster: wasmop-local, user: wasmop-admin}
current-context: wasmop-local
KC
chmod 600 "$KUBECONFIG"

start() { # component binary args...
  local c="$1" bin="$2"; shift 2
  # The exact command line, NUL-separated, so component.sh can start the
  # component again with identical flags.
  printf '%s\0' "$bin" "$@" > "$D/cmd/$c"
  setsid "$bin" "$@" >"$D/logs/$c.log" 2>&1 < /dev/null &
  echo $! > "$D/pids/$c.pid"
}

# --- etcd -------------------------------------------------------------------
echo "http://127.0.0.1:$ETCD_PORT" > "$D/etcd-url"
start etcd "$ETCD_BIN/etcd" \
  --name=wasmop --data-dir="$D/etcd" \
  --listen-client-urls="http://127.0.0.1:$ETCD_PORT" --advertise-client-urls="http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-cluster="wasmop=http://127.0.0.1:$ETCD_PEER_PORT" \
  --unsafe-no-fsync=true --quota-backend-bytes=4294967296 --log-level=warn
wait_for etcd "etcd /health" 30 curl -fsS "http://127.0.0.1:$ETCD_PORT/health"

# --- kube-apiserver ---------------------------------------------------------
# Audit: the requests of the operator's ServiceAccount (wasmop/wasmop, what
# deploy/rbac.yaml binds) at Metadata level, one JSON line each, and nothing
# else, so the log costs nothing for the tests' admin traffic.
# `deploy/run-local.sh --rbac` compares what the operator did with what
# deploy/rbac.yaml grants. Also the writes (never reads or watches) of the
# ServiceAccounts in namespace wasmop-audited, as which tests run operator
# replicas whose writes they check from the API server's side (who wrote
# what when, told apart by user agent: tests/src/audit.rs). Up to 2 GB
# before the log rotates: tests/src/audit.rs reads one file from where it
# ended, and the sharding bench writes about 70 MB per shard count.
cat > "$D/audit-policy.yaml" <<'POLICY'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived, ResponseStarted]
rules:
- level: Metadata
  users: ["system:serviceaccount:wasmop:wasmop"]
- level: Metadata
  userGroups: ["system:serviceaccounts:wasmop-audited"]
  verbs: [create, update, patch, delete, deletecollection]
- level: None
POLICY
start kube-apiserver "$K8S_BIN/kube-apiserver" \
  --audit-policy-file="$D/audit-policy.yaml" --audit-log-path="$D/logs/audit.log" \
  --audit-log-format=json --audit-log-maxsize=2000 --audit-log-maxbackup=1 \
  --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
  --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$API_PORT" \
  --cert-dir="$pki" --tls-cert-file="$pki/serving.crt" --tls-private-key-file="$pki/serving.key" \
  --client-ca-file="$pki/ca.crt" \
  --service-cluster-ip-range=10.0.0.0/24 --allow-privileged=true \
  --authorization-mode=RBAC --disable-admission-plugins=ServiceAccount \
  --service-account-issuer="https://127.0.0.1:$API_PORT/" \
  --service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
  --endpoint-reconciler-type=none --enable-priority-and-fairness=false \
  --v=1
wait_for kube-apiserver "kube-apiserver /readyz" "$READY_TIMEOUT" "$KUBECTL" get --raw /readyz

# --- controllers, scheduler ---------------------------------------------------
# Volumes are kwok's alone: its stages provision, bind, release and delete
# them. The controller manager's PersistentVolume binder is off, because
# under load it raced kwok's binding writes, released freshly bound volumes
# (which kwok then deleted) and left StatefulSet members Pending for good.
# Tests that need a claim Lost mark it so themselves, as the binder would.
# A Pod tried while its claim is still unbound is parked as unschedulable
# and woken by the binding event; should that wake-up be missed, the
# scheduler retries parked Pods after 10 s here instead of 5 min.
start kube-controller-manager "$K8S_BIN/kube-controller-manager" \
  --kubeconfig="$KUBECONFIG" --authentication-kubeconfig="$KUBECONFIG" --authorization-kubeconfig="$KUBECONFIG" \
  --leader-elect=false --bind-address=127.0.0.1 --secure-port="$KCM_PORT" \
  --service-account-private-key-file="$pki/sa.key" --root-ca-file="$pki/ca.crt" \
  --use-service-account-credentials=false --concurrent-gc-syncs=5 --v=1 \
  --controllers='*,-persistentvolume-binder-controller'
start kube-scheduler "$K8S_BIN/kube-scheduler" \
  --kubeconfig="$KUBECONFIG" --authentication-kubeconfig="$KUBECONFIG" --authorization-kubeconfig="$KUBECONFIG" \
  --leader-elect=false --bind-address=127.0.0.1 --secure-port="$SCHED_PORT" --v=1 \
  --pod-max-in-unschedulable-pods-duration=10s

# --- kwok: one fake Node, simulated Pods ------------------------------------
stage_args=()
for s in "$KWOK_BIN"/stages/*.yaml; do stage_args+=("--config=$s"); done
start kwok "$KWOK_BIN/kwok" \
  --kubeconfig="$KUBECONFIG" --manage-all-nodes=false \
  --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
  --cidr=10.244.0.0/16 --node-ip=10.240.0.1 --node-lease-duration-seconds=40 \
  --server-address="127.0.0.1:$KWOK_PORT" "${stage_args[@]}"

"$KUBECTL" apply -f - >/dev/null <<NODE || fail kube-apiserver "could not create the fake Node"
apiVersion: v1
kind: Node
metadata:
  name: $NODE_NAME
  annotations:
    kwok.x-k8s.io/node: fake
    node.alpha.kubernetes.io/ttl: "0"
  labels:
    kubernetes.io/hostname: $NODE_NAME
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    type: kwok
status:
  allocatable: {cpu: "32", memory: 256Gi, ephemeral-storage: 1Ti, pods: "250"}
  capacity: {cpu: "32", memory: 256Gi, ephemeral-storage: 1Ti, pods: "250"}
NODE
"$KUBECTL" apply -f "$KWOK_BIN/storage-class.yaml" >/dev/null || fail kube-apiserver "could not create the StorageClass"
wait_for kwok "Node $NODE_NAME Ready" "$READY_TIMEOUT" \
  "$KUBECTL" wait --for=condition=Ready "node/$NODE_NAME" --timeout=2s
wait_for kube-controller-manager "the default ServiceAccount" "$READY_TIMEOUT" \
  "$KUBECTL" get serviceaccount default -n default
# kwok marks the Node Ready before it binds its own server, and exits when
# that fails (its port still held by an earlier kwok): the Node would then
# go NotReady 40 s later and no Pod would ever run.
wait_for kwok "its server on 127.0.0.1:$KWOK_PORT" "$READY_TIMEOUT" \
  curl -fsS "http://127.0.0.1:$KWOK_PORT/healthz"
for c in kube-controller-manager kube-scheduler kwok; do
  alive "$c" || fail "$c" "$c exited during start-up"
done

log "ready in $(( $(date +%s) - started ))s; kubeconfig: $KUBECONFIG; logs: $D/logs"
echo "$KUBECONFIG"
