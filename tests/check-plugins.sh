#!/usr/bin/env bash
# `wasmop check` on every shipped plugin, from its example in deploy/examples
# with the CRDs of crds/, and on the JavaScript and Python test plugins
# (tests/polyglot: the ports of `good` and `referrer`, from the examples of
# tests/fixtures/check with the test CRDs) (run by tests/run.sh; about 2
# minutes in all on 2 cores, the four ports 25 s of it). Each line names what the plugin needs besides its example: the
# settings deploy/run-local.yaml gives it, objects another operator provides
# (--with), the kinds it documents as outliving its primary (--kept), and
# the properties whose findings it lists as known deviations in its README
# (--known). A finding's trace is written under $WASMOP_CHECK_TRACES
# (default: a temporary directory) and replays with `wasmop replay`.
#
# usage: tests/check-plugins.sh [PLUGIN...]   (default: all nine)
#   WASMOP_BIN         the wasmop binary (default: cargo run -p wasmop)
#   WASMOP_PLUGIN_DIR  the built plugins (default: target/plugins)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
plugins_dir="${WASMOP_PLUGIN_DIR:-$root/target/plugins}"
traces="${WASMOP_CHECK_TRACES:-$(mktemp -d)}"
if [[ -n ${WASMOP_BIN:-} ]]; then
  wasmop=("$WASMOP_BIN")
else
  wasmop=(cargo run -q -p wasmop --)
fi
fixtures=tests/fixtures/check

check() {
  local plugin=$1
  shift
  echo "--- wasmop check $plugin" >&2
  "${wasmop[@]}" check "$plugins_dir/$plugin.wasm" --crds "$crds" --trace-dir "$traces" \
    --budget 25 "$@"
}

want=("$@")
[[ ${#want[@]} -gt 0 ]] || want=(instance engine fleet team backup good-js good-py referrer-js referrer-py)
failed=()
for p in "${want[@]}"; do
  crds=crds
  case $p in
    # Ready once one pod of each Deployment is available (workload.rs,
    # deployment_health), not every replica: a node lost under one gateway
    # Pod of two leaves Ready=True (tests/fixtures/check/findings/).
    instance) args=(-f deploy/examples/firebolt-instance.yaml --known ready-honesty) ;;
    # plugins/engine/README.md, "Known deviations from wasmop check": with
    # its StatefulSet missing from the snapshot, Ready=True stays; a
    # generation that never becomes ready turns Degraded at its progress
    # deadline, a write the hour-later determinism check sees.
    engine) args=(-f deploy/examples/firebolt-engine.yaml --with "$fixtures/firebolt-instance-provisioned.yaml" --known stale,determinism) ;;
    # plugins/fleet/README.md, "Known deviations from wasmop check".
    fleet) args=(-f deploy/examples/celld-fleet.yaml --settings "$fixtures/fleet-settings.yaml" --kept CelldStorageReservation --known stale,ready-honesty) ;;
    team) args=(-f deploy/examples/terdut-team.yaml) ;;
    backup) args=(-f deploy/examples/etcd-backup.yaml --settings "$fixtures/backup-settings.yaml") ;;
    # The ports of the test plugins `good` and `referrer` to JavaScript and
    # Python: the same eight properties as any plugin (the Rust originals
    # hold them on the same examples).
    good-js | good-py) crds=tests/fixtures/crds/test-kinds.yaml args=(-f "$fixtures/widget.yaml") ;;
    referrer-js | referrer-py) crds=tests/fixtures/crds/test-kinds.yaml args=(-f "$fixtures/referrer.yaml") ;;
    *) echo "error: no check of plugin $p" >&2; exit 2 ;;
  esac
  check "$p" "${args[@]}" || failed+=("$p")
done
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "error: wasmop check found what the plugins do not document: ${failed[*]} (traces under $traces)" >&2
  exit 1
fi
