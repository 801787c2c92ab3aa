#!/usr/bin/env python3
"""Compares what the operator's ServiceAccount did (the API server's audit
log, tests/cluster/up.sh) with what deploy/rbac.yaml grants it.

    rbac-audit.py AUDIT_LOG OFFSET RBAC_JSON REASONS USER

Reads the audit events from byte OFFSET of AUDIT_LOG that USER made, and
prints one line per grant (API group, resource, verb) of the Roles and
ClusterRoles in RBAC_JSON (deploy/rbac.yaml as `kubectl create
--dry-run=client -o json` prints it, one JSON object after the other:
Python's standard library reads no YAML): `used` with the number of requests, or `unused` with the
reason REASONS gives for keeping it. Then the requests the API server
refused by authorization (audit annotation authorization.k8s.io/decision
forbid), and the requests no grant covers. Exits 1 when a request
was forbidden, or a grant was neither used nor given a reason.

REASONS: lines `GROUP RESOURCE VERB  reason...` (group `core` for the core
group; `*` in GROUP, RESOURCE or VERB matches anything; the first match wins;
`#` starts a comment).
"""
import fnmatch
import json
import sys
from collections import Counter

def json_stream(text):
    """The JSON values of TEXT, one after the other (kubectl prints one per
    object)."""
    decoder = json.JSONDecoder()
    pos = 0
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos == len(text):
            return
        value, pos = decoder.raw_decode(text, pos)
        yield value


def grants(path):
    out = set()
    with open(path) as f:
        text = f.read()
    for doc in json_stream(text):
        if doc.get("kind") not in ("Role", "ClusterRole"):
            continue
        for rule in doc.get("rules") or []:
            for g in rule.get("apiGroups") or []:
                for r in rule.get("resources") or []:
                    for v in rule.get("verbs") or []:
                        out.add((g or "core", r, v))
    return out


def reasons(path):
    out = []
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            g, r, v, why = line.split(None, 3)
            out.append((g, r, v, why))
    return out


def reason_for(rs, grant):
    for g, r, v, why in rs:
        if all(fnmatch.fnmatchcase(x, p) for x, p in zip(grant, (g, r, v))):
            return why
    return None


def main():
    log, offset, rbac, reasons_file, user = sys.argv[1:6]
    used = Counter()
    forbidden = Counter()
    with open(log, "rb") as f:
        f.seek(int(offset))
        for raw in f:
            try:
                ev = json.loads(raw)
            except ValueError:
                continue
            if ev.get("user", {}).get("username") != user:
                continue
            ref = ev.get("objectRef") or {}
            if not ref.get("resource"):
                continue  # discovery, /version and the like: no RBAC rule
            resource = ref["resource"]
            if ref.get("subresource"):
                resource += "/" + ref["subresource"]
            key = (ref.get("apiGroup") or "core", resource, ev.get("verb"))
            # Refused by authorization (RBAC), not by admission (a 403 of
            # a namespace being deleted, for one).
            decision = (ev.get("annotations") or {}).get("authorization.k8s.io/decision")
            if decision == "forbid":
                forbidden[key] += 1
            else:
                used[key] += 1
    granted = grants(rbac)
    rs = reasons(reasons_file)
    failed = False
    print(f"RBAC grants of deploy/rbac.yaml against the audit log ({sum(used.values())} requests of {user}):")
    print(f"  {'GROUP':<26} {'RESOURCE':<34} {'VERB':<7} USE")
    for g, r, v in sorted(granted):
        n = sum(c for (ug, ur, uv), c in used.items()
                if uv == v and (ur == r or r == "*") and (ug == g or g == "*"))
        if n:
            print(f"  {g:<26} {r:<34} {v:<7} used ({n} requests)")
        else:
            why = reason_for(rs, (g, r, v))
            if why:
                print(f"  {g:<26} {r:<34} {v:<7} unused: {why}")
            else:
                failed = True
                print(f"  {g:<26} {r:<34} {v:<7} UNUSED, AND NO REASON TO KEEP IT")
    ungranted = [k for k in used if not any(
        (g == k[0] or g == "*") and (r == k[1] or r == "*") and (v == k[2] or v == "*")
        for g, r, v in granted)]
    for k in sorted(ungranted):
        print(f"  not in deploy/rbac.yaml but allowed (another binding?): {k} x{used[k]}")
    if forbidden:
        failed = True
        print("FORBIDDEN requests (denied by RBAC):")
        for k, n in sorted(forbidden.items()):
            print(f"  {k[0]} {k[1]} {k[2]} x{n}")
    else:
        print("no request of the operator was forbidden")
    if not used:
        failed = True
        print(f"no request of {user} in the audit log: was the operator running as it?")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
