#!/usr/bin/env bash
# Builds etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl
# kwok, helm, an OCI registry (distribution) and crane (go-containerregistry)
# from their Go modules at the versions pinned in versions.env, and fetches cert-manager's CRDs
# (deploy/crds/*.yaml of its Go module), Gateway API's standard CRDs
# (config/crd/standard/*.yaml of sigs.k8s.io/gateway-api) and Istio's
# (kubernetes/customresourcedefinitions.gen.yaml of istio.io/api).
# Results are cached outside the repo ($WASMOP_CACHE/bin/<component>-<version>);
# a second run finds them and builds nothing.
#
#   bash tests/cluster/build.sh [COMPONENT...]   # all, or only those named (e.g. crane)
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

command -v go >/dev/null || die "go is required (Go >= 1.26) to build the control plane"
export CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN=local

# One build at a time per cache: two runs at once (two checkouts starting
# their clusters, or a bench next to the tests) would both find a binary
# missing and build it into the same `<out>.tmp`. The second waits here,
# then finds the first one's results cached.
mkdir -p "$WASMOP_CACHE/bin"
exec 9>"$WASMOP_CACHE/bin/.build.lock"
if ! flock -n 9; then
  log "another build of the control plane holds $WASMOP_CACHE/bin/.build.lock; waiting for it"
  flock 9
fi

build_k8s() {
  local out="$K8S_BIN" bins=(kube-apiserver kube-controller-manager kube-scheduler kubectl)
  local b missing=0
  for b in "${bins[@]}"; do [[ -x "$out/$b" ]] || missing=1; done
  if [[ $missing == 0 ]]; then log "kubernetes $K8S_VERSION: cached in $out"; return; fi
  log "kubernetes $K8S_VERSION: building ${bins[*]} (cold build takes a while)"
  local work; work="$(mktemp -d)"
  (
    cd "$work"
    go mod init wasmop.local/k8s-build >/dev/null 2>&1
    local gomod
    gomod="$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
    [[ -f "$gomod" ]] || die "could not download k8s.io/kubernetes@$K8S_VERSION"
    local minor_patch="${K8S_VERSION#v1.}"
    # Every staging module that k8s.io/kubernetes replaces with a local path is
    # published separately as k8s.io/<name> v0.<minor>.<patch>.
    grep -E '^\s*k8s\.io/[a-z0-9-]+ => \./staging/' "$gomod" | awk '{print $1}' | while read -r m; do
      go mod edit -replace "$m=$m@v0.$minor_patch"
    done
    go mod edit -require "k8s.io/kubernetes@$K8S_VERSION"
    local pkgs=()
    for b in "${bins[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$b"); done
    cat > tools.go <<GO
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
    go mod tidy -e >/dev/null 2>&1 || true
    go mod download
    local major=1 minor="${minor_patch%%.*}"
    local ld="-s -w"
    for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      ld+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=$major -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
    done
    mkdir -p "$out.tmp"
    go build -tags tools,notest -trimpath -ldflags "$ld" -o "$out.tmp/" "${pkgs[@]}"
  )
  rm -rf "$work" "$out"
  mv "$out.tmp" "$out"
  log "kubernetes $K8S_VERSION: built into $out"
}

build_etcd() {
  local out="$ETCD_BIN"
  if [[ -x "$out/etcd" ]]; then log "etcd $ETCD_VERSION: cached in $out"; return; fi
  log "etcd $ETCD_VERSION: building"
  local work; work="$(mktemp -d)"
  (
    cd "$work"
    go mod init wasmop.local/etcd-build >/dev/null 2>&1
    go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >/dev/null
    mkdir -p "$out.tmp"
    go build -trimpath -ldflags "-s -w" -o "$out.tmp/etcd" go.etcd.io/etcd/server/v3
  )
  rm -rf "$work" "$out"
  mv "$out.tmp" "$out"
  log "etcd $ETCD_VERSION: built into $out"
}

build_kwok() {
  local out="$KWOK_BIN"
  if [[ -x "$out/kwok" && -f "$out/storage-class.yaml" ]]; then log "kwok $KWOK_VERSION: cached in $out"; return; fi
  log "kwok $KWOK_VERSION: building"
  local work; work="$(mktemp -d)"
  (
    cd "$work"
    go mod init wasmop.local/kwok-build >/dev/null 2>&1
    go get "sigs.k8s.io/kwok@$KWOK_VERSION" >/dev/null
    mkdir -p "$out.tmp/stages"
    go build -trimpath -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION" -o "$out.tmp/kwok" sigs.k8s.io/kwok/cmd/kwok
    local dir
    dir="$(go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)"
    # The stage definitions ship in the module; kwok needs them passed
    # explicitly. Nodes: initialise and heartbeat through Leases. Pods: become
    # Ready, complete (Jobs), go away when deleted. Volumes: PVCs of the
    # `kwok-volume` StorageClass get bound to a simulated PV.
    local s
    for s in node/fast/node-initialize node/heartbeat-with-lease/node-heartbeat-with-lease \
             pod/fast/pod-ready pod/fast/pod-complete pod/fast/pod-delete \
             volume/fast/pvc-provision volume/fast/pv-bind volume/fast/pv-delete volume/fast/pvc-delete; do
      cp "$dir/kustomize/stage/$s.yaml" "$out.tmp/stages/"
    done
    cp "$dir/kustomize/stage/volume/fast/storage-class.yaml" "$out.tmp/storage-class.yaml"
    chmod -R u+w "$out.tmp"
  )
  rm -rf "$work" "$out"
  mv "$out.tmp" "$out"
  log "kwok $KWOK_VERSION: built into $out"
}

build_helm() {
  local out="$HELM_BIN"
  if [[ -x "$out/helm" ]]; then log "helm $HELM_VERSION: cached in $out"; return; fi
  log "helm $HELM_VERSION: building"
  local work; work="$(mktemp -d)"
  (
    cd "$work"
    go mod init wasmop.local/helm-build >/dev/null 2>&1
    go get "helm.sh/helm/v3@$HELM_VERSION" >/dev/null
    mkdir -p "$out.tmp"
    go build -trimpath -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
      -o "$out.tmp/helm" helm.sh/helm/v3/cmd/helm
  )
  rm -rf "$work" "$out"
  mv "$out.tmp" "$out"
  log "helm $HELM_VERSION: built into $out"
}

build_registry() {
  local out="$REGISTRY_BIN"
  if [[ -x "$out/registry" ]]; then log "registry $REGISTRY_VERSION: cached in $out"; return; fi
  log "registry $REGISTRY_VERSION: building"
  local work; work="$(mktemp -d)"
  (
    cd "$work"
    go mod init wasmop.local/registry-build >/dev/null 2>&1
    go get "github.com/distribution/distribution/v3@$REGISTRY_VERSION" >/dev/null
    mkdir -p "$out.tmp"
    go build -trimpath -ldflags "-s -w" -o "$out.tmp/registry" \
      github.com/distribution/distribution/v3/cmd/registry
  )
  rm -rf "$work" "$out"
  mv "$out.tmp" "$out"
  log "registry $REGISTRY_VERSION: built into $out"
}

build_crane() {
  local out="$CRANE_BIN"
  if [[ -x "$out/crane" ]]; then log "crane $CRANE_VERSION: cached in $out"; return; fi
  log "crane $CRANE_VERSION: building"
  local work; work="$(mktemp -d)"
  (
    cd "$work"
    go mod init wasmop.local/crane-build >/dev/null 2>&1
    go get "github.com/google/go-containerregistry@$CRANE_VERSION" >/dev/null
    mkdir -p "$out.tmp"
    go build -trimpath -ldflags "-s -w -X github.com/google/go-containerregistry/cmd/crane/cmd.Version=$CRANE_VERSION" \
      -o "$out.tmp/crane" github.com/google/go-containerregistry/cmd/crane
  )
  rm -rf "$work" "$out"
  mv "$out.tmp" "$out"
  log "crane $CRANE_VERSION: built into $out"
}

fetch_cert_manager_crds() {
  local out="$CERT_MANAGER_CRDS"
  if compgen -G "$out/*.yaml" >/dev/null; then log "cert-manager $CERT_MANAGER_VERSION CRDs: cached in $out"; return; fi
  log "cert-manager $CERT_MANAGER_VERSION CRDs: downloading the Go module"
  local work; work="$(mktemp -d)"
  (
    cd "$work"
    go mod init wasmop.local/cert-manager-crds >/dev/null 2>&1
    local dir
    dir="$(go mod download -json "github.com/cert-manager/cert-manager@$CERT_MANAGER_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
    [[ -d "$dir/deploy/crds" ]] || die "could not download github.com/cert-manager/cert-manager@$CERT_MANAGER_VERSION"
    rm -rf "$out.tmp"
    mkdir -p "$out.tmp"
    cp "$dir"/deploy/crds/*.yaml "$out.tmp/"
    chmod -R u+w "$out.tmp"
  )
  rm -rf "$work" "$out"
  mv "$out.tmp" "$out"
  log "cert-manager $CERT_MANAGER_VERSION CRDs: in $out"
}

# fetch_module_files NAME MODULE VERSION OUT FILE... copies FILEs (globs
# relative to the module root) of the Go module MODULE@VERSION into OUT,
# unless OUT already holds YAML files.
fetch_module_files() {
  local name="$1" module="$2" version="$3" out="$4"; shift 4
  if compgen -G "$out/*.yaml" >/dev/null; then log "$name $version CRDs: cached in $out"; return; fi
  log "$name $version CRDs: downloading the Go module"
  local work; work="$(mktemp -d)"
  (
    cd "$work"
    go mod init "wasmop.local/$name-crds" >/dev/null 2>&1
    local dir f
    dir="$(go mod download -json "$module@$version" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
    [[ -d "$dir" ]] || die "could not download $module@$version"
    rm -rf "$out.tmp"
    mkdir -p "$out.tmp"
    for f in "$@"; do
      compgen -G "$dir/$f" >/dev/null || die "$module@$version has no $f"
      cp "$dir"/$f "$out.tmp/"
    done
    chmod -R u+w "$out.tmp"
  )
  rm -rf "$work" "$out"
  mv "$out.tmp" "$out"
  log "$name $version CRDs: in $out"
}

start=$(date +%s)
if [[ $# -gt 0 ]]; then
  for c in "$@"; do
    declare -F "build_$c" >/dev/null || die "unknown component $c (one of: etcd kwok k8s helm registry crane)"
    "build_$c"
  done
  exit 0
fi
fetch_cert_manager_crds
fetch_module_files gateway-api sigs.k8s.io/gateway-api "$GATEWAY_API_VERSION" "$GATEWAY_API_CRDS" 'config/crd/standard/*.yaml'
fetch_module_files istio istio.io/api "$ISTIO_API_VERSION" "$ISTIO_CRDS" kubernetes/customresourcedefinitions.gen.yaml
build_etcd
build_kwok
build_k8s
build_helm
build_registry
build_crane
log "control plane binaries ready in $(( $(date +%s) - start ))s"
