#!/usr/bin/env bash
# Stops the local control plane started by up.sh: only the processes whose
# PIDs it recorded, then removes its state. Idempotent.
#   --keep-logs  keep $WASMOP_CLUSTER_DIR/logs (used when start-up failed)
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

keep_logs=0
[[ ${1:-} == --keep-logs ]] && keep_logs=1
D="$WASMOP_CLUSTER_DIR"
if [[ ! -d $D ]]; then
  log "nothing to stop ($D does not exist)"
  exit 0
fi
require_own_cluster_dir

# Reverse start order: clients first, etcd last.
for c in kwok kube-scheduler kube-controller-manager kube-apiserver etcd; do
  f="$D/pids/$c.pid"
  [[ -f $f ]] || continue
  pid="$(cat "$f")"
  # Only signal the process we started: the PID must still run our binary.
  if [[ -d /proc/$pid ]] && grep -q "$c" "/proc/$pid/cmdline" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do exited "$pid" && break; sleep 0.1; done
    if ! exited "$pid"; then
      log "$c (pid $pid) did not stop within 10s; killing it"
      kill -KILL "$pid" 2>/dev/null || true
      # Until every thread is gone: a zombie's last threads may still hold
      # its ports, and an up.sh right after would fail to bind them.
      for _ in $(seq 1 100); do exited "$pid" && break; sleep 0.1; done
    fi
    log "stopped $c (pid $pid)"
  fi
  rm -f "$f"
done

if [[ $keep_logs == 1 ]]; then
  find "$D" -mindepth 1 -maxdepth 1 ! -name logs -exec rm -rf {} +
  log "removed cluster state; logs kept in $D/logs"
else
  rm -rf "$D"
  log "removed $D"
fi
