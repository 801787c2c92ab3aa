#!/usr/bin/env bash
# Builds the wasmop container image without a container engine: one layer
# (FROM scratch equivalent: the binary, the glibc libraries it loads,
# /etc/passwd and /etc/group with the user 65532, /tmp, /home/nonroot,
# /plugins), run as 65532:65532, entrypoint /wasmop, command
# `run --plugins=/plugins`. The layer is a tar made here by GNU tar; crane
# (go-containerregistry, built by `tests/cluster/build.sh crane` into
# $WASMOP_CACHE/bin, which this script runs when it is missing) makes the
# image of it and pushes it.
#
#   bash deploy/image/build.sh [--release] [--out DIR]
#                             [--push HOST[:PORT]/REPO:TAG [--insecure] [--manifest FILE]]
#
# --release   build the binary with `cargo build --release -p wasmop` (what
#             to publish). Without it the debug binary is used, the one the
#             test build already made ($WASMOP_BIN, else
#             $CARGO_TARGET_DIR/debug/wasmop, built if missing): no second
#             build of the host, which on CI would cost minutes.
# --push REF  push it to a registry (HTTPS; --insecure: plain HTTP) and
#             print REF's repository @ the digest: what the chart's
#             image.digest and deploy/wasmop.yaml take. Without --push the
#             digest alone is printed: the one a push would give.
# --manifest FILE  with --push: also write deploy/wasmop.yaml to FILE with
#             its image set to that REPO@sha256:... (nothing else changed),
#             ready for `kubectl apply -f FILE`.
# --out DIR   also write the image to DIR as an OCI image layout.
# A relative FILE or DIR is taken from the repository root.
#
# crane assembles an image in a registry: it is first put into a registry
# of crane's own (`crane registry serve`) on loopback that lives as long as
# this script, then given its configuration (`crane mutate`), which pushes
# it to REF, so REF only ever names the finished image.
#
# Reproducible: the same binary gives the same digest. The binary's debug
# information, which holds the build machine's paths, is stripped; the tar
# entries are sorted, owned by 0:0 (/home/nonroot by 65532:65532) with the
# time 0 and fixed modes; crane's gzip carries no name or time, and the
# configuration's `created` is the zero time, as crane leaves it.
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
    -h|--help) sed -n '2,38p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
  shift
done
[[ -z $manifest || -n $push ]] || die "--manifest needs --push (the manifest names the pushed digest)"
case $(uname -m) in
  x86_64) arch=amd64 ;;
  aarch64 | arm64) arch=arm64 ;;
  *) die "no image platform known for $(uname -m)" ;;
esac

crane="$CRANE_BIN/crane"
[[ -x $crane ]] || bash tests/cluster/build.sh crane

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$WASMOP_CACHE/target}"
if [[ $release == 1 ]]; then
  cargo build --release --locked -p wasmop
  bin="$CARGO_TARGET_DIR/release/wasmop"
else
  bin="${WASMOP_BIN:-$CARGO_TARGET_DIR/debug/wasmop}"
  [[ -x $bin ]] || cargo build -p wasmop
fi

work="$(mktemp -d)"
serve_pid=""
trap '[[ -z $serve_pid ]] || kill "$serve_pid" 2>/dev/null || true; rm -rf "$work"' EXIT

# The layer's files.
root="$work/rootfs"
mkdir -p "$root/etc" "$root/tmp" "$root/home/nonroot" "$root/plugins"
objcopy --strip-debug "$bin" "$root/wasmop"
if ! libs="$(ldd "$bin" 2>&1)"; then
  [[ $libs == *"not a dynamic executable"* ]] || die "ldd $bin: $libs"
  libs="" # static: no libraries
fi
[[ $libs != *"not found"* ]] || die "ldd $bin: $libs"
for lib in $(grep -o '/[^ ]*' <<<"$libs" | sort -u); do
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
done
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$root/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$root/etc/group"
find "$root" -exec chmod 0755 {} +
chmod 0644 "$root/etc/passwd" "$root/etc/group"
chmod 1777 "$root/tmp"
chmod 0700 "$root/home/nonroot"

# The layer: every entry named in sorted order (no recursion), time 0, no
# atime/ctime records; /home/nonroot appended last, owned by 65532.
tar_opts=(--format=pax --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime
  --mtime=@0 --numeric-owner --no-recursion -C "$root")
(cd "$root" && find . -mindepth 1 ! -path ./home/nonroot -printf '%P\n' | LC_ALL=C sort) >"$work/entries"
tar -cf "$work/layer.tar" "${tar_opts[@]}" --owner=0 --group=0 -T "$work/entries"
tar -rf "$work/layer.tar" "${tar_opts[@]}" --owner=65532 --group=65532 home/nonroot

# crane's registry on loopback, on a port of its choosing.
mkdir "$work/blobs"
"$crane" registry serve --address 127.0.0.1:0 --disk "$work/blobs" 2>"$work/serve.log" &
serve_pid=$!
port=""
for _ in $(seq 200); do
  port="$(sed -n 's/.*serving on port \([0-9]*\).*/\1/p' "$work/serve.log")"
  [[ -z $port ]] || break
  kill -0 "$serve_pid" 2>/dev/null || die "crane registry serve stopped: $(cat "$work/serve.log")"
  sleep 0.1
done
[[ -n $port ]] || die "crane registry serve did not say its port within 20 s: $(cat "$work/serve.log")"
local_ref="127.0.0.1:$port/wasmop:build"

"$crane" append --oci-empty-base -f "$work/layer.tar" -t "$local_ref" >/dev/null 2>"$work/append.log" ||
  die "crane append: $(cat "$work/append.log")"
mutate=(--set-platform "linux/$arch" --entrypoint=/wasmop --cmd=run,--plugins=/plugins
  --user=65532:65532 --env=HOME=/home/nonroot --workdir=/)
[[ -z $push ]] || mutate+=(--tag "$push" "${insecure[@]}")
ref="$("$crane" mutate "$local_ref" "${mutate[@]}")"
[[ $ref =~ ^[^@[:space:]]+@(sha256:[0-9a-f]{64})$ ]] || die "crane mutate printed $ref, not REPO@sha256:<64 hex>"
digest="${BASH_REMATCH[1]}"
echo "image $ref" >&2

if [[ -n $out ]]; then
  rm -rf "$out"
  "$crane" pull --format=oci "$ref" "$out" "${insecure[@]}"
  echo "OCI image layout: $out" >&2
fi

if [[ -z $push ]]; then
  echo "$digest"
  exit 0
fi
if [[ -n $manifest ]]; then
  image_line='^([[:space:]]*(- )?image:[[:space:]]*)[^[:space:]]+'
  n="$(grep -cE "$image_line" deploy/wasmop.yaml || true)"
  [[ $n == 1 ]] || die "deploy/wasmop.yaml: $n image: lines, expected exactly one"
  sed -E "s#$image_line#\\1$ref#" deploy/wasmop.yaml >"$manifest.tmp"
  mv "$manifest.tmp" "$manifest"
  echo "deploy/wasmop.yaml with image $ref: $manifest" >&2
fi
echo "$ref"
