#!/usr/bin/env bash
# Builds the wasmop container image without a container engine: an OCI
# image layout (FROM scratch equivalent: the binary, the glibc libraries it
# loads, /etc/passwd with the user 65532, /tmp, /plugins), run as
# 65532:65532, entrypoint /wasmop, command `run --plugins=/plugins`.
#
#   bash deploy/image/build.sh [--release] [--out DIR]
#                             [--push HOST[:PORT]/REPO:TAG [--insecure] [--manifest FILE]]
#
# --release   build the binary with `cargo build --release -p wasmop` (what
#             to publish). Without it the debug binary is used, the one the
#             test build already made ($WASMOP_BIN, else
#             $CARGO_TARGET_DIR/debug/wasmop, built if missing): no second
#             build of the host, which on CI would cost minutes.
# --out DIR   where the OCI image layout goes (default
#             $CARGO_TARGET_DIR/image/{debug,release}).
# --push REF  push it to a registry (HTTPS; --insecure: plain HTTP) and
#             print REF's repository @ the digest: what the chart's
#             image.digest and deploy/wasmop.yaml take.
# --manifest FILE  with --push: also write deploy/wasmop.yaml to FILE with
#             its image set to that REPO@sha256:... (nothing else changed),
#             ready for `kubectl apply -f FILE` (a relative FILE, like
#             --out DIR, is taken from the repository root).
# Prints the manifest digest. The same binary gives the same digest
# (deploy/image/oci-image.py: sorted entries, fixed owners and times,
# debug information, with its build paths, stripped).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
. tests/cluster/lib.sh

release=0 out="" push="" manifest="" insecure=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --release) release=1 ;;
    --out) out=$2; shift ;;
    --push) push=$2; shift ;;
    --insecure) insecure=(--insecure) ;;
    --manifest) manifest=$2; shift ;;
    -h|--help) sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
  shift
done
[[ -z $manifest || -n $push ]] || die "--manifest needs --push (the manifest names the pushed digest)"

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$WASMOP_CACHE/target}"
if [[ $release == 1 ]]; then
  cargo build --release --locked -p wasmop
  bin="$CARGO_TARGET_DIR/release/wasmop"
  out="${out:-$CARGO_TARGET_DIR/image/release}"
else
  bin="${WASMOP_BIN:-$CARGO_TARGET_DIR/debug/wasmop}"
  [[ -x $bin ]] || cargo build -p wasmop
  out="${out:-$CARGO_TARGET_DIR/image/debug}"
fi
digest=$(python3 deploy/image/oci-image.py build "$bin" "$out")
echo "image layout $out: $digest" >&2
if [[ -n $push ]]; then
  pushed=$(python3 deploy/image/oci-image.py push "$out" "$push" "${insecure[@]}")
  if [[ -n $manifest ]]; then
    python3 deploy/image/oci-image.py set-image deploy/wasmop.yaml "$pushed" > "$manifest.tmp"
    mv "$manifest.tmp" "$manifest"
    echo "deploy/wasmop.yaml with image $pushed: $manifest" >&2
  fi
  echo "$pushed"
else
  echo "$digest"
fi
