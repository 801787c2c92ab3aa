#!/usr/bin/env python3
"""The wasmop container image, without a container engine: a single-layer
OCI image (`FROM scratch` equivalent) holding the wasmop binary and, for a
glibc build, exactly the shared libraries it loads, run as uid/gid 65532.

    oci-image.py build BINARY OUT_DIR    # OCI image layout in OUT_DIR; prints the manifest digest
    oci-image.py push OUT_DIR HOST:PORT/REPO:TAG [--insecure]
    oci-image.py pull HOST:PORT/REPO@DIGEST ROOTFS [--insecure]
    oci-image.py set-image MANIFEST REPO@sha256:DIGEST   # MANIFEST with its image by digest, on stdout

Reproducible: the same binary gives the same digest. Every tar entry is
sorted, owned by 0:0 with mtime SOURCE_DATE_EPOCH (default 0); gzip carries
no name or time; the config's `created` is that epoch too. The binary is
copied with its debug information stripped (`objcopy --strip-debug`), which
drops the DWARF sections that hold the build machine's absolute paths.

`set-image` prints a manifest (deploy/wasmop.yaml) with the value of its
one `image:` line replaced by an image reference by digest; it fails on a
reference that is not `REPO@sha256:<64 hex>` or a manifest without exactly
one `image:` line, and changes nothing else (comments included).

`pull` checks every digest (manifest and blobs) and extracts the layer,
refusing entries that leave ROOTFS. It exists for the tests: they run the
binary from the pulled image.
"""
import datetime
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request

UID = GID = 65532
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"


def sha(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def shared_libraries(binary):
    """Absolute paths of what the dynamic loader maps for BINARY (with the
    loader itself); empty for a static binary."""
    out = subprocess.run(["ldd", binary], capture_output=True, text=True)
    if out.returncode != 0 and ("not a dynamic executable" in out.stdout + out.stderr
                                or "statically linked" in out.stdout + out.stderr):
        return []
    libs = []
    for line in out.stdout.splitlines():
        line = line.strip()
        if "=>" in line:
            path = line.split("=>", 1)[1].split("(")[0].strip()
        else:
            path = line.split("(")[0].strip()
        if path.startswith("/"):
            libs.append(path)
        elif "not found" in line:
            sys.exit(f"ldd: {line}")
    return sorted(set(libs))


def layer(binary, epoch):
    """The uncompressed layer tar."""
    stripped = tempfile.NamedTemporaryFile(delete=False)
    stripped.close()
    try:
        subprocess.run(["objcopy", "--strip-debug", binary, stripped.name], check=True)
        files = {"wasmop": (open(stripped.name, "rb").read(), 0o755)}
    finally:
        os.unlink(stripped.name)
    for lib in shared_libraries(binary):
        files[lib.lstrip("/")] = (open(os.path.realpath(lib), "rb").read(), 0o755)
    files["etc/passwd"] = (b"root:x:0:0:root:/root:/sbin/nologin\n"
                           b"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n", 0o644)
    files["etc/group"] = (b"root:x:0:\nnonroot:x:65532:\n", 0o644)
    dirs = {"tmp": 0o1777, "home/nonroot": 0o700, "plugins": 0o755}
    for path in list(files) + list(dirs):
        parent = os.path.dirname(path)
        while parent:
            dirs.setdefault(parent, 0o755)
            parent = os.path.dirname(parent)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(set(dirs) | set(files)):
            info = tarfile.TarInfo(path)
            info.mtime = epoch
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if path in files:
                data, info.mode = files[path]
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                info.type = tarfile.DIRTYPE
                info.mode = dirs[path]
                if path == "home/nonroot":
                    info.uid = info.gid = UID
                tar.addfile(info)
    return buf.getvalue()


def build(binary, out):
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
    tar = layer(binary, epoch)
    gz = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=gz, mtime=0, compresslevel=6) as g:
        g.write(tar)
    gz = gz.getvalue()
    created = datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    config = json.dumps({
        "architecture": "amd64",
        "os": "linux",
        "created": created,
        "config": {
            "User": f"{UID}:{GID}",
            "Entrypoint": ["/wasmop"],
            "Cmd": ["run", "--plugins=/plugins"],
            "WorkingDir": "/",
            "Env": ["HOME=/home/nonroot"],
        },
        "rootfs": {"type": "layers", "diff_ids": [sha(tar)]},
        "history": [{"created": created, "created_by": "deploy/image/oci-image.py build"}],
    }, sort_keys=True, separators=(",", ":")).encode()
    manifest = json.dumps({
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": {"mediaType": CONFIG, "digest": sha(config), "size": len(config)},
        "layers": [{"mediaType": LAYER, "digest": sha(gz), "size": len(gz)}],
    }, sort_keys=True, separators=(",", ":")).encode()
    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(os.path.join(out, "blobs", "sha256"))
    for blob in (gz, config, manifest):
        with open(os.path.join(out, "blobs", "sha256", sha(blob)[7:]), "wb") as f:
            f.write(blob)
    with open(os.path.join(out, "oci-layout"), "w") as f:
        f.write('{"imageLayoutVersion":"1.0.0"}')
    with open(os.path.join(out, "index.json"), "w") as f:
        json.dump({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                   "manifests": [{"mediaType": MANIFEST, "digest": sha(manifest),
                                  "size": len(manifest)}]}, f, sort_keys=True)
    print(sha(manifest))


def split_ref(ref):
    host, _, rest = ref.partition("/")
    if "@" in rest:
        repo, _, tag = rest.partition("@")
    else:
        repo, _, tag = rest.rpartition(":")
    if not host or not repo or not tag:
        sys.exit(f"not HOST:PORT/REPO:TAG or @DIGEST: {ref}")
    return host, repo, tag


def request(method, url, data=None, headers=None):
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    return urllib.request.urlopen(req, timeout=60)


def push(out, ref, scheme):
    host, repo, tag = split_ref(ref)
    base = f"{scheme}://{host}/v2/{repo}"
    index = json.load(open(os.path.join(out, "index.json")))
    digest = index["manifests"][0]["digest"]
    blob = lambda d: open(os.path.join(out, "blobs", "sha256", d[7:]), "rb").read()
    manifest = blob(digest)
    m = json.loads(manifest)
    for d in [m["config"]["digest"]] + [l["digest"] for l in m["layers"]]:
        try:
            request("HEAD", f"{base}/blobs/{d}")
            continue
        except urllib.error.HTTPError as e:
            if e.code != 404:
                raise
        loc = request("POST", f"{base}/blobs/uploads/").headers["Location"]
        if loc.startswith("/"):
            loc = f"{scheme}://{host}{loc}"
        sep = "&" if "?" in loc else "?"
        request("PUT", f"{loc}{sep}digest={d}", data=blob(d),
                headers={"Content-Type": "application/octet-stream"})
    request("PUT", f"{base}/manifests/{tag}", data=manifest, headers={"Content-Type": MANIFEST})
    print(f"{host}/{repo}@{digest}")


def pull(ref, rootfs, scheme):
    host, repo, digest = split_ref(ref)
    if not digest.startswith("sha256:"):
        sys.exit("pull takes a digest reference")
    base = f"{scheme}://{host}/v2/{repo}"
    manifest = request("GET", f"{base}/manifests/{digest}", headers={"Accept": MANIFEST}).read()
    if sha(manifest) != digest:
        sys.exit(f"manifest digest {sha(manifest)} is not {digest}")
    m = json.loads(manifest)
    os.makedirs(rootfs, exist_ok=True)
    root = os.path.realpath(rootfs)
    for l in m["layers"]:
        data = request("GET", f"{base}/blobs/{l['digest']}").read()
        if sha(data) != l["digest"]:
            sys.exit(f"layer digest mismatch for {l['digest']}")
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            for member in tar.getmembers():
                target = os.path.realpath(os.path.join(root, member.name))
                if not (target == root or target.startswith(root + os.sep)) or member.issym() or member.islnk():
                    sys.exit(f"refusing layer entry {member.name}")
            tar.extractall(root, numeric_owner=True)
    print(root)


IMAGE_LINE = re.compile(r"^(\s*(?:- )?image:\s*)(\S+)(.*)$")
BY_DIGEST = re.compile(r"^[^@\s]+@sha256:[0-9a-f]{64}$")


def set_image(manifest, image):
    if not BY_DIGEST.match(image):
        sys.exit(f"set-image takes REPO@sha256:<64 hex digits>, not {image!r}")
    lines = open(manifest).read().split("\n")
    found = [i for i, l in enumerate(lines) if IMAGE_LINE.match(l)]
    if len(found) != 1:
        sys.exit(f"{manifest}: {len(found)} image: lines, expected exactly one")
    i = found[0]
    lines[i] = IMAGE_LINE.sub(lambda m: m.group(1) + image + m.group(3), lines[i])
    sys.stdout.write("\n".join(lines))


def main():
    args = [a for a in sys.argv[1:] if a != "--insecure"]
    scheme = "http" if "--insecure" in sys.argv else "https"
    if len(args) == 3 and args[0] == "build":
        build(args[1], args[2])
    elif len(args) == 3 and args[0] == "push":
        push(args[1], args[2], scheme)
    elif len(args) == 3 and args[0] == "pull":
        pull(args[1], args[2], scheme)
    elif len(args) == 3 and args[0] == "set-image":
        set_image(args[1], args[2])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
