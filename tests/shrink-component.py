#!/usr/bin/env python3
"""Optimises a WebAssembly component's core module with binaryen's wasm-opt
(for size unless flags are given: tests/build-plugins.sh passes -O3).

usage: shrink-component.py IN.wasm OUT.wasm [wasm-opt flags...]

A plugin is a component wrapping one large core module (the plugin's
code): alone when built for wasm32-unknown-unknown, with two tiny modules
that wire WASI's imports when built for wasm32-wasip2. This runs
binaryen's `wasm-opt` on the largest core module and writes the component
back with that module replaced: the component's other sections refer to the
module by index, and wasm-opt keeps every import and export, so the
component's interface is unchanged. Custom sections at the component level
(producers, names) are dropped.
"""
import os
import subprocess
import sys
import tempfile

MAGIC = b"\x00asm\x0d\x00\x01\x00"
CORE_MODULE = 1
FEATURES = [
    "--enable-sign-ext",
    "--enable-mutable-globals",
    "--enable-nontrapping-float-to-int",
    "--enable-bulk-memory",
    "--enable-reference-types",
    "--enable-multivalue",
]


def uleb(buf, i):
    result = shift = 0
    while True:
        byte = buf[i]
        i += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return result, i


def enc_uleb(n):
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def sections(buf):
    i = 8
    while i < len(buf):
        sid = buf[i]
        size, j = uleb(buf, i + 1)
        if j + size > len(buf):
            raise ValueError("truncated section")
        yield sid, buf[j : j + size]
        i = j + size


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    src, dst, flags = sys.argv[1], sys.argv[2], sys.argv[3:] or ["-Oz"]
    data = open(src, "rb").read()
    if data[:8] != MAGIC:
        sys.exit(f"error: {src} is not a WebAssembly component")
    secs = list(sections(data))
    modules = [k for k, (sid, _) in enumerate(secs) if sid == CORE_MODULE]
    if not modules:
        sys.exit(f"error: {src} has no core module")
    big = max(modules, key=lambda k: len(secs[k][1]))
    with tempfile.TemporaryDirectory() as tmp:
        core_in = os.path.join(tmp, "in.wasm")
        core_out = os.path.join(tmp, "out.wasm")
        with open(core_in, "wb") as f:
            f.write(secs[big][1])
        # The stripped module has no target_features section to detect
        # them from: these are what rustc enables for wasm32-unknown-unknown
        # and wasm32-wasip2 alike.
        subprocess.run(
            ["wasm-opt", *FEATURES, *flags, "--strip-debug", "--strip-producers",
             core_in, "-o", core_out],
            check=True,
        )
        core = open(core_out, "rb").read()
    secs[big] = (CORE_MODULE, core)
    out = bytearray(MAGIC)
    for sid, body in secs:
        if sid == 0:
            continue
        out += bytes([sid]) + enc_uleb(len(body)) + body
    with open(dst, "wb") as f:
        f.write(out)


if __name__ == "__main__":
    main()
