#!/usr/bin/env bash
# Checks the deployment files against the running local control plane
# (KUBECONFIG): run by tests/run.sh after tests/cluster/up.sh.
#
#   1. deploy/wasmop.yaml, applied with a server-side dry run into the
#      namespace `wasmop` labelled pod-security.kubernetes.io/enforce and
#      warn = restricted, is accepted without a single warning.
#   2. deploy/rbac.yaml is what `wasmop rbac` generates for the shipped
#      plugins (no drift), and the API server accepts it.
#   3. The Helm chart deploy/chart: helm lint, helm template | kubectl
#      apply --dry-run=server (no warning, restricted namespace), sharding
#      turned on (its arguments, the RBAC of `wasmop rbac --sharding` and
#      the shard label policy, also deploy/shard-label-policy.yaml),
#      and helm install / uninstall.
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

# 2. Generated RBAC: deploy/rbac.yaml is exactly `wasmop rbac` of the
#    shipped plugins (plugins/*, not the SDK crates), and the chart holds a copy.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$WASMOP_CACHE/target}"
built="${WASMOP_PLUGIN_DIR:-$CARGO_TARGET_DIR/plugins}"
if [[ -z ${WASMOP_BIN:-} ]]; then cargo build -q -p wasmop; fi
WASMOP="${WASMOP_BIN:-$CARGO_TARGET_DIR/debug/wasmop}"
shipped="$(mktemp -d)"
trap '"$KUBECTL" delete namespace wasmop --wait=false >/dev/null 2>&1 || true; rm -rf "$shipped"' EXIT
for dir in plugins/*/; do
  name="$(basename "$dir")"
  [[ $name == sdk || $name == sdk-* ]] && continue
  [[ -f $built/$name.wasm ]] || fail "$built/$name.wasm is not built (tests/build-plugins.sh)"
  cp "$built/$name.wasm" "$shipped/"
done
"$WASMOP" rbac "$shipped" > "$shipped/rbac.yaml"
if ! diff -u deploy/rbac.yaml "$shipped/rbac.yaml"; then
  fail "deploy/rbac.yaml drifted from the shipped plugins' needs; regenerate it:
  wasmop rbac DIR-WITH-$(cd "$shipped" && ls ./*.wasm | xargs -n1 basename | paste -sd, -) > deploy/rbac.yaml && cp deploy/rbac.yaml deploy/chart/files/rbac.yaml"
fi
cmp -s deploy/rbac.yaml deploy/chart/files/rbac.yaml || fail "deploy/chart/files/rbac.yaml differs from deploy/rbac.yaml (cp deploy/rbac.yaml deploy/chart/files/rbac.yaml)"
grep -q "NOTE: team/server writes .*secrets" deploy/rbac.yaml || fail "deploy/rbac.yaml does not call out the team plugin's cross-namespace Secret writes"
dry_run_clean -f deploy/rbac.yaml || fail "deploy/rbac.yaml (above)"
ok "deploy/rbac.yaml is the generated least-privilege RBAC and the API server accepts it"

# 2b. Plugin delivery as documented in deploy/wasmop.yaml: each shipped
#     plugin in its own ConfigMap, created for real (server-side apply), and
#     every ConfigMap the manifest's projected volume names is one of them.
for f in "$shipped"/*.wasm; do
  name="$(basename "$f" .wasm)"
  "$KUBECTL" -n wasmop create configmap "wasmop-plugin-$name" --from-file="$f" --dry-run=client -o yaml \
    | "$KUBECTL" apply --server-side --field-manager=deploy-check -f - >/dev/null \
    || fail "plugin $name ($(stat -c %s "$f") bytes) does not fit a ConfigMap"
  grep -q "configMap: {name: wasmop-plugin-$name, optional: true}" deploy/wasmop.yaml \
    || fail "deploy/wasmop.yaml does not project wasmop-plugin-$name"
  grep -q -- "- wasmop-plugin-$name\$" deploy/chart/values.yaml \
    || fail "deploy/chart/values.yaml does not list wasmop-plugin-$name"
done
ok "each shipped plugin is accepted in its own ConfigMap, and both deployments project them all"

# 3. The Helm chart: lint, a server-side dry run of what it renders into a
#    restricted namespace, and a real install (the objects are accepted;
#    the Pod cannot pull an image here, so nothing waits for it).
HELM="$HELM_BIN/helm"
[[ -x $HELM ]] || fail "$HELM missing (tests/cluster/build.sh builds it)"
export HELM_CACHE_HOME="$shipped/helm/cache" HELM_CONFIG_HOME="$shipped/helm/config" HELM_DATA_HOME="$shipped/helm/data"
"$HELM" lint --strict deploy/chart >/dev/null || { "$HELM" lint --strict deploy/chart; fail "helm lint"; }
"$HELM" lint --strict deploy/chart --set replicaCount=2 --set 'plugins.oci[0]=oci://registry.example/p@sha256:0000000000000000000000000000000000000000000000000000000000000000' --set plugins.registryAuthSecret=regcred --set admission.enabled=true >/dev/null \
  || fail "helm lint with replicas, OCI plugins and admission"
restricted_ns wasmop-helm
trap '"$KUBECTL" delete namespace wasmop wasmop-helm --wait=false >/dev/null 2>&1 || true; rm -rf "$shipped"' EXIT
"$HELM" template wasmop deploy/chart -n wasmop-helm > "$shipped/chart.yaml"
dry_run_clean -f "$shipped/chart.yaml" || fail "helm template | kubectl apply --dry-run=server (above)"
"$HELM" template wasmop deploy/chart -n wasmop-helm --set replicaCount=2 \
  --set 'plugins.oci[0]=oci://registry.example/p@sha256:0000000000000000000000000000000000000000000000000000000000000000' \
  --set plugins.registryAuthSecret=regcred --set memoryReset=dirty-pages > "$shipped/chart-oci.yaml"
grep -q -- "--memory-reset=whole" "$shipped/chart.yaml" || fail "the chart does not pass --memory-reset=whole by default"
grep -q -- "--memory-reset=dirty-pages" "$shipped/chart-oci.yaml" || fail "the chart does not pass memoryReset to the operator"
grep -q -- "--leader-elect" "$shipped/chart-oci.yaml" || fail "two replicas do not turn on leader election"
grep -q -- "--plugins=oci://registry.example/p@sha256:0000" "$shipped/chart-oci.yaml" || fail "the chart does not pass its OCI plugins to the operator"
grep -q -- "--registry-auth=" "$shipped/chart-oci.yaml" || fail "the chart does not pass the registry credentials"
dry_run_clean -f "$shipped/chart-oci.yaml" || fail "the chart with OCI plugins and two replicas (above)"
ok "helm lint; helm template | kubectl apply --dry-run=server into a restricted namespace, no warning"

# 3b. Sharding from the chart: --sharding with leader election, one replica
#     refused, and the rendered RBAC grants exactly what `wasmop rbac
#     --sharding` generates for the shipped plugins (rules compared as
#     sets of group, resource, verb).
"$HELM" lint --strict deploy/chart --set sharding.enabled=true --set replicaCount=3 >/dev/null \
  || fail "helm lint with sharding"
"$HELM" template wasmop deploy/chart -n wasmop-helm --set sharding.enabled=true --set replicaCount=3 \
  > "$shipped/chart-shard.yaml"
grep -q -- "- --sharding$" "$shipped/chart-shard.yaml" || fail "sharding.enabled does not pass --sharding"
grep -q -- "- --leader-elect$" "$shipped/chart-shard.yaml" || fail "sharding.enabled does not turn on leader election"
if "$HELM" template wasmop deploy/chart -n wasmop-helm --set sharding.enabled=true >/dev/null 2>"$shipped/one.err"; then
  fail "the chart shards a single replica"
fi
grep -q "sharding.enabled needs replicaCount of 2 or more" "$shipped/one.err" \
  || fail "sharding one replica is refused without saying why: $(cat "$shipped/one.err")"
"$WASMOP" rbac --sharding "$shipped" > "$shipped/rbac-shard.yaml"
rules() {
  "$KUBECTL" create --dry-run=client -o json -f "$1" | python3 -c '
import json, sys
text, pos, out = sys.stdin.read(), 0, set()
decoder = json.JSONDecoder()
while True:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    if pos == len(text):
        break
    doc, pos = decoder.raw_decode(text, pos)
    for o in doc.get("items", [doc]):
        if o.get("kind") in ("Role", "ClusterRole"):
            for r in o.get("rules") or []:
                for g in r.get("apiGroups") or []:
                    for res in r.get("resources") or []:
                        for v in r.get("verbs") or []:
                            out.add(" ".join([g or "core", res, v]))
print("\n".join(sorted(out)))'
}
rules "$shipped/rbac-shard.yaml" > "$shipped/rules-generated.txt" || fail "cannot read the rules of wasmop rbac --sharding"
rules "$shipped/chart-shard.yaml" > "$shipped/rules-chart.txt" || fail "cannot read the rules of the chart with sharding"
[[ -s "$shipped/rules-generated.txt" ]] || fail "wasmop rbac --sharding generated no rules"
if ! diff -u "$shipped/rules-generated.txt" "$shipped/rules-chart.txt"; then
  fail "the chart's RBAC with sharding.enabled differs from wasmop rbac --sharding (above)"
fi
grep -qx "coordination.k8s.io leases list" "$shipped/rules-chart.txt" \
  || fail "the chart's RBAC with sharding.enabled does not list Leases"
if rules "$shipped/chart.yaml" | grep -qx "coordination.k8s.io leases list"; then
  fail "the chart lists Leases without sharding"
fi
dry_run_clean -f "$shipped/chart-shard.yaml" || fail "the chart with sharding (above)"
grep -q "^kind: ValidatingAdmissionPolicy$" "$shipped/chart-shard.yaml" \
  && grep -q "^kind: ValidatingAdmissionPolicyBinding$" "$shipped/chart-shard.yaml" \
  || fail "the chart with sharding does not render the shard label policy and its binding"
grep -q "system:serviceaccount:wasmop-helm:wasmop" "$shipped/chart-shard.yaml" \
  || fail "the chart's shard label policy does not exempt the release's ServiceAccount"
if grep -q "^kind: ValidatingAdmissionPolicy" "$shipped/chart.yaml"; then
  fail "the chart renders the shard label policy without sharding"
fi
dry_run_clean -f deploy/shard-label-policy.yaml || fail "deploy/shard-label-policy.yaml (above)"
ok "the chart shards with sharding.enabled (two or more replicas), with the RBAC wasmop rbac --sharding generates"
"$HELM" install wasmop deploy/chart -n wasmop-helm >/dev/null || fail "helm install"
for o in deployment/wasmop serviceaccount/wasmop configmap/wasmop-config role/wasmop-wasmop-operator rolebinding/wasmop-wasmop-operator; do
  "$KUBECTL" -n wasmop-helm get "$o" >/dev/null || fail "helm install made no $o"
done
"$KUBECTL" get clusterrole/wasmop-wasmop clusterrolebinding/wasmop-wasmop >/dev/null || fail "helm install made no ClusterRole/Binding"
"$HELM" uninstall wasmop -n wasmop-helm >/dev/null || fail "helm uninstall"
ok "helm install into the local control plane (objects accepted), uninstall"
