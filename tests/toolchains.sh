#!/usr/bin/env bash
# Installs the component toolchains of the JavaScript and Python plugins
# into the cache, once per pinned version set, and prints where they are.
#
# usage: tests/toolchains.sh js|python
#   js      prints the directory whose node_modules/.bin holds
#           componentize-js, jco and wizer (tests/toolchains/js/package.json
#           and its lock pin them: @bytecodealliance/componentize-js,
#           @bytecodealliance/jco, and @bytecodealliance/wizer 10.0.0);
#   python  prints the directory whose bin/ holds componentize-py (a
#           virtual environment, tests/toolchains/requirements.txt).
#
# Both come from the package registries through npm and pip; nothing is
# built from source and nothing else is downloaded (componentize-js runs
# without weval's ahead-of-time compilation, which would fetch a binary).
# The cache is ${WASMOP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/wasmop}/toolchains,
# keyed by the digest of the pin files, so a new pin installs next to the
# old one and an unchanged one is never installed twice. Sourced, it
# defines ensure_js_toolchain and ensure_py_toolchain (each sets a
# variable: js_toolchain, py_toolchain).
set -euo pipefail

toolchains_root="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/toolchains"
toolchains_cache="${WASMOP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/wasmop}/toolchains"

# retry WHAT CMD...: the registries refused TLS for the first minutes of a
# fresh machine's life (tests/build-plugins.sh, binaryen): ask again for
# about six minutes before giving up.
toolchain_retry() {
  local what="$1" attempt pause
  shift
  for attempt in 1 2 3 4 5 6 7 8; do
    "$@" >&2 && return 0
    if [[ $attempt == 8 ]]; then
      echo "error: could not install $what (the installer's error is above)" >&2
      return 1
    fi
    pause=$((attempt * 15 > 60 ? 60 : attempt * 15))
    echo "installing $what failed (attempt $attempt of 8); trying again in $pause s" >&2
    sleep "$pause"
  done
}

# The digest of the files that pin a toolchain, as its cache key.
toolchain_key() {
  cat "$@" | sha256sum | cut -c1-16
}

# ensure_js_toolchain: sets js_toolchain to the installed directory.
ensure_js_toolchain() {
  command -v npm >/dev/null || {
    echo "error: npm (Node.js) is needed to install the JavaScript plugin toolchain (componentize-js)" >&2
    return 1
  }
  local key dir
  key="$(toolchain_key "$toolchains_root/js/package.json" "$toolchains_root/js/package-lock.json")"
  dir="$toolchains_cache/js-$key"
  if [[ ! -x "$dir/node_modules/.bin/componentize-js" ]]; then
    mkdir -p "$toolchains_cache"
    exec 7>"$toolchains_cache/.js.lock"
    flock 7
    if [[ ! -x "$dir/node_modules/.bin/componentize-js" ]]; then
      echo "installing the JavaScript plugin toolchain (componentize-js, jco, wizer 10.0.0) from the npm registry into $dir" >&2
      rm -rf "$dir.tmp"
      mkdir -p "$dir.tmp"
      cp "$toolchains_root/js/package.json" "$toolchains_root/js/package-lock.json" "$dir.tmp/"
      toolchain_retry "the JavaScript plugin toolchain" \
        npm ci --prefix "$dir.tmp" --no-audit --no-fund
      rm -rf "$dir"
      mv "$dir.tmp" "$dir"
    fi
    flock -u 7
  fi
  js_toolchain="$dir"
}

# ensure_py_toolchain: sets py_toolchain to the installed virtual
# environment.
ensure_py_toolchain() {
  command -v python3 >/dev/null || {
    echo "error: python3 is needed to install the Python plugin toolchain (componentize-py)" >&2
    return 1
  }
  local key dir
  key="$(toolchain_key "$toolchains_root/requirements.txt")"
  dir="$toolchains_cache/python-$key"
  if [[ ! -x "$dir/bin/componentize-py" ]]; then
    mkdir -p "$toolchains_cache"
    exec 6>"$toolchains_cache/.python.lock"
    flock 6
    if [[ ! -x "$dir/bin/componentize-py" ]]; then
      echo "installing the Python plugin toolchain (componentize-py) from PyPI into $dir" >&2
      rm -rf "$dir.tmp"
      # A virtual environment made in place (its scripts name their own
      # path), so it is made under its final name.
      rm -rf "$dir"
      python3 -m venv "$dir" >&2
      toolchain_retry "the Python plugin toolchain" \
        "$dir/bin/pip" install --quiet --disable-pip-version-check -r "$toolchains_root/requirements.txt" || {
        rm -rf "$dir"
        return 1
      }
    fi
    flock -u 6
  fi
  py_toolchain="$dir"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  case "${1:-}" in
    js) ensure_js_toolchain && echo "$js_toolchain" ;;
    python) ensure_py_toolchain && echo "$py_toolchain" ;;
    *)
      echo "usage: $0 js|python" >&2
      exit 2
      ;;
  esac
fi
