#!/usr/bin/env bash
# Fault injection on the local control plane started by up.sh: stops, freezes
# and starts one of its components again with the exact command line up.sh
# used (recorded in $WASMOP_CLUSTER_DIR/cmd/), and compacts etcd.
#
#   component.sh kill COMPONENT            SIGKILL it; returns once it is gone
#   component.sh start COMPONENT           start it again with the same flags;
#                                          returns once it is ready (etcd: /health,
#                                          kube-apiserver: /readyz)
#   component.sh restart COMPONENT [--down SECONDS]
#                                          kill, keep it down SECONDS (default 0),
#                                          start
#   component.sh freeze|thaw COMPONENT     SIGSTOP / SIGCONT it
#   component.sh ensure COMPONENT          start it again if it is not running
#                                          (as a kubelet restarts a static Pod),
#                                          printing the end of its log first
#   component.sh compact-etcd [--bump N]   write N throw-away keys (default 0),
#                                          then compact etcd's history up to its
#                                          newest revision
#
# COMPONENT is one of etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kwok. Only processes whose PIDs up.sh or this script
# recorded are signalled.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

D="$WASMOP_CLUSTER_DIR"
KUBECTL="$K8S_BIN/kubectl"
export KUBECONFIG="$D/kubeconfig"
READY_TIMEOUT="${WASMOP_READY_TIMEOUT:-120}"

usage() { sed -n '2,23p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }

pid_of() { # component -> its recorded PID when that process still runs it
  local f="$D/pids/$1.pid" pid
  [[ -f $f ]] || return 1
  pid="$(cat "$f")"
  [[ -d /proc/$pid ]] && grep -q "$1" "/proc/$pid/cmdline" 2>/dev/null || return 1
  echo "$pid"
}

check_component() {
  case "$1" in
    etcd|kube-apiserver|kube-controller-manager|kube-scheduler|kwok) ;;
    *) die "unknown component '$1' (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok)" ;;
  esac
  [[ -f "$D/cmd/$1" ]] || die "no recorded command line for $1 in $D/cmd: start the cluster with tests/cluster/up.sh first"
}

flag_of() { # component flag -> the flag's value in its recorded command line
  tr '\0' '\n' < "$D/cmd/$1" | sed -n "/^$2=/{s///p;q}"
}

# Where the log of the start under way began: what it printed since.
log_at=0
since_start() { tail -c +"$((log_at + 1))" "$D/logs/$1.log" 2>/dev/null; }
# component text -> 0 when its log since this start holds the text (read
# whole, not piped into grep -q, whose early exit would fail the pipe).
printed() { [[ $(since_start "$1") == *"$2"* ]]; }

ready() { # component -> 0 when it answers its health check
  case "$1" in
    etcd) curl -fsS "$(cat "$D/etcd-url")/health" ;;
    kube-apiserver) "$KUBECTL" get --raw /readyz ;;
    # Running its controllers: kube-controller-manager first waits 10 s at
    # most for the API server's /healthz and exits when that fails (the API
    # server restarting or frozen by another fault), so a process that merely
    # runs is not ready yet.
    kube-controller-manager) pid_of "$1" && printed "$1" 'Started controller' ;;
    # Serving: kwok marks its Node Ready before it binds its own server, and
    # exits when that fails (its port still held by the kwok it replaces).
    kwok) pid_of "$1" && curl -fsS "http://$(flag_of kwok --server-address)/healthz" ;;
    *) pid_of "$1" ;;
  esac
}

do_kill() {
  local c="$1" pid
  if ! pid="$(pid_of "$c")"; then
    log "$c is not running"
    return 0
  fi
  kill -KILL "$pid"
  # Gone means reaped, or a zombie whose every thread has exited too: the
  # first thread of a multi-threaded process (all of these are Go programs)
  # may turn zombie while others still hold its sockets, and a start in
  # that moment fails to bind its port.
  for _ in $(seq 1 200); do
    exited "$pid" && break
    sleep 0.05
  done
  rm -f "$D/pids/$c.pid"
  log "killed $c (pid $pid)"
}

do_start() {
  local c="$1" argv
  if pid_of "$c" >/dev/null; then
    die "$c is already running"
  fi
  mapfile -d '' -t argv < "$D/cmd/$c"
  local deadline=$(( $(date +%s) + READY_TIMEOUT )) attempt=1
  while :; do
    log_at=$(stat -c %s "$D/logs/$c.log" 2>/dev/null || echo 0)
    setsid "${argv[@]}" >>"$D/logs/$c.log" 2>&1 < /dev/null &
    echo $! > "$D/pids/$c.pid"
    until ready "$c" >/dev/null 2>&1; do
      pid_of "$c" >/dev/null || break
      (( $(date +%s) < deadline )) || die "$c not ready after ${READY_TIMEOUT}s"
      sleep 0.1
    done
    pid_of "$c" >/dev/null && break
    # Its port still held by the process it replaces (another one's
    # would not free up): tried again, five times at most.
    if (( attempt < 5 )) && printed "$c" 'address already in use'; then
      log "$c could not bind its port yet (attempt $attempt); starting it again"
      attempt=$((attempt + 1))
      sleep 1
      continue
    fi
    # A client of the API server that gave up on it (kube-controller-manager
    # waits 10 s for its /healthz, then exits): started again until the
    # deadline, as a kubelet restarts a static Pod.
    if [[ $c != etcd && $c != kube-apiserver ]] && (( $(date +%s) < deadline )); then
      log "$c exited during start-up (attempt $attempt; its last lines follow); starting it again"
      since_start "$c" | tail -n 5 >&2
      attempt=$((attempt + 1))
      sleep 1
      continue
    fi
    tail -n 40 "$D/logs/$c.log" >&2
    die "$c exited during start-up"
  done
  log "started $c (pid $(cat "$D/pids/$c.pid")) and it is ready"
}

# Started again when it is not running; prints (on stdout) what it found.
do_ensure() {
  local c="$1"
  pid_of "$c" >/dev/null && return 0
  echo "$c was not running; the last lines of its log:"
  tail -n 20 "$D/logs/$c.log" 2>/dev/null | sed 's/^/  /'
  do_start "$c"
  echo "$c started again"
}

b64() { printf '%s' "$1" | base64 -w0; }

compact_etcd() {
  local bump="$1" url rev i
  url="$(cat "$D/etcd-url")"
  for (( i = 0; i < bump; i++ )); do
    curl -fsS -X POST "$url/v3/kv/put" \
      -d "{\"key\":\"$(b64 /wasmop-test/compaction-bump)\",\"value\":\"$(b64 "$i")\"}" >/dev/null
  done
  rev="$(curl -fsS -X POST "$url/v3/kv/range" -d "{\"key\":\"$(b64 /wasmop-test/none)\"}" \
    | sed -n 's/.*"revision":"\([0-9]*\)".*/\1/p')"
  [[ -n $rev ]] || die "could not read etcd's revision from $url"
  curl -fsS -X POST "$url/v3/kv/compaction" -d "{\"revision\":\"$rev\",\"physical\":true}" >/dev/null
  log "compacted etcd at revision $rev"
  echo "$rev"
}

[[ $# -ge 1 ]] || usage
cmd="$1"; shift
case "$cmd" in
  kill|start|ensure|freeze|thaw)
    [[ $# -eq 1 ]] || usage
    check_component "$1"
    case "$cmd" in
      kill) do_kill "$1" ;;
      start) do_start "$1" ;;
      ensure) do_ensure "$1" ;;
      freeze) pid="$(pid_of "$1")" || die "$1 is not running"; kill -STOP "$pid"; log "froze $1 (pid $pid)" ;;
      thaw) pid="$(pid_of "$1")" || die "$1 is not running"; kill -CONT "$pid"; log "thawed $1 (pid $pid)" ;;
    esac
    ;;
  restart)
    [[ $# -ge 1 ]] || usage
    c="$1"; shift
    down=0
    if [[ ${1:-} == --down ]]; then down="${2:?--down needs seconds}"; shift 2; fi
    [[ $# -eq 0 ]] || usage
    check_component "$c"
    do_kill "$c"
    # The outage itself: how long the component stays down is the point.
    sleep "$down"
    do_start "$c"
    ;;
  compact-etcd)
    bump=0
    if [[ ${1:-} == --bump ]]; then bump="${2:?--bump needs a count}"; shift 2; fi
    [[ $# -eq 0 ]] || usage
    compact_etcd "$bump"
    ;;
  *) usage ;;
esac
