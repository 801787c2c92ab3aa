"""The wasmop plugin SDK for Python.

Snapshot, plan, conditions and settings helpers over the ``plugin`` world
of wit/reconciler.wit, named after the Rust SDK's (plugins/sdk). A plugin
is one module built into a component by componentize-py
(tests/build-plugins.sh); see README.md.

The host validates every answer anyway; this module only catches shape
mistakes early, naming the field, the way the ``wasmop-contract`` crate's
types read a plan.
"""

import json
from typing import Any, Callable, Dict, List, Optional


class ReconcileError(Exception):
    """Why a reconcile produced no plan (WIT ``reconcile-error``). Raise it."""

    def __init__(self, tag: str, message: str):
        super().__init__(message)
        self.tag = tag
        self.message = message

    @staticmethod
    def invalid_spec(message: str) -> "ReconcileError":
        """The primary's spec cannot be reconciled as written."""
        return ReconcileError("invalid-spec", message)

    @staticmethod
    def not_ready(message: str) -> "ReconcileError":
        """Something the plugin needs is not there yet; retried with backoff."""
        return ReconcileError("not-ready", message)

    @staticmethod
    def internal(message: str) -> "ReconcileError":
        """The snapshot was not what the plugin expected (a bug)."""
        return ReconcileError("internal", message)


def json_type(value: Any) -> str:
    """The JSON type name of a value, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _at(value: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def _str_at(value: Any, *path: str) -> str:
    v = _at(value, *path)
    return v if isinstance(v, str) else ""


# ---------------------------------------------------------------- manifest


class KindRef:
    """A Kubernetes kind (``{group, version, kind, plural, namespaced}``)."""

    @staticmethod
    def namespaced(group: str, version: str, kind: str, plural: str) -> dict:
        return {"group": group, "version": version, "kind": kind, "plural": plural, "namespaced": True}

    @staticmethod
    def cluster_scoped(group: str, version: str, kind: str, plural: str) -> dict:
        return {"group": group, "version": version, "kind": kind, "plural": plural, "namespaced": False}

    @staticmethod
    def config_map() -> dict:
        return KindRef.namespaced("", "v1", "ConfigMap", "configmaps")

    @staticmethod
    def secret() -> dict:
        return KindRef.namespaced("", "v1", "Secret", "secrets")

    @staticmethod
    def service() -> dict:
        return KindRef.namespaced("", "v1", "Service", "services")

    @staticmethod
    def api_version(kind: dict) -> str:
        return f"{kind['group']}/{kind['version']}" if kind["group"] else kind["version"]


class Selector:
    """A read selector: by labels or by a field of the primary."""

    @staticmethod
    def labels(match_labels: Dict[str, str]) -> dict:
        return {"labels": match_labels}

    @staticmethod
    def field(name_path: str) -> dict:
        return {"field": {"namePath": name_path}}

    @staticmethod
    def field_in(name_path: str, namespace_path: str) -> dict:
        return {"field": {"namePath": name_path, "namespacePath": namespace_path}}


def read(id: str, kind: dict, selector: dict, optional: bool = False) -> dict:
    """A read of related objects."""
    r = {"id": id, "kind": kind, "selector": selector}
    if optional:
        r["optional"] = True
    return r


class Controller:
    """One controller of a manifest, built with chained methods."""

    def __init__(self, name: str, primary: dict):
        self.json = {
            "name": name,
            "primary": primary,
            "owns": [],
            "reads": [],
            "finalizer": None,
            "writeNamespaces": [],
            "primaryFields": [],
            "httpTargets": [],
            "deletePrimary": False,
        }

    def owns(self, kind: dict, adopt: bool = False) -> "Controller":
        """Owns ``kind`` by a controller ownerReference."""
        self.json["owns"].append({**kind, "ownership": "ownerReference", "adopt": adopt})
        return self

    def reads(self, r: dict) -> "Controller":
        """Reads the objects ``r`` (see :func:`read`) selects."""
        self.json["reads"].append(r)
        return self

    def finalizer(self, finalizer: str) -> "Controller":
        self.json["finalizer"] = finalizer
        return self

    def write_namespace(self, namespace: str) -> "Controller":
        self.json["writeNamespaces"].append(namespace)
        return self

    def primary_field(self, path: str) -> "Controller":
        self.json["primaryFields"].append(path)
        return self

    def http_target(self, id: str, kind: dict, ports: List[int]) -> "Controller":
        self.json["httpTargets"].append({"id": id, "kind": kind, "ports": ports})
        return self


class Manifest:
    """The manifest: name, version and controllers."""

    def __init__(self, name: str, version: str):
        self.name = name
        self.version = version
        self.controllers: List[Controller] = []

    def controller(self, controller: Controller) -> "Manifest":
        self.controllers.append(controller)
        return self

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "version": self.version,
            "controllers": [c.json for c in self.controllers],
            "admission": [],
        }


# ---------------------------------------------------------------- settings


def settings_problem(path: str, message: str) -> dict:
    """A problem with the operator's settings, at a dotted path."""
    return {"path": path, "message": message}


class settings:
    """Settings checks for ``validate_settings``; each returns a list of problems."""

    @staticmethod
    def only_keys(value: Any, allowed: List[str]) -> List[dict]:
        if not isinstance(value, dict):
            return [settings_problem("", "settings must be a JSON object")]
        unknown = sorted(k for k in value if k not in allowed)
        known = (
            "this plugin takes no settings" if not allowed else "known settings: " + ", ".join(allowed)
        )
        return [settings_problem(k, f"unknown setting `{k}` ({known})") for k in unknown]

    @staticmethod
    def optional_string(value: Any, key: str) -> List[dict]:
        if not isinstance(value, dict) or key not in value or isinstance(value[key], str):
            return []
        return [settings_problem(key, f"`{key}` must be a string, got {json_type(value[key])}")]


# ---------------------------------------------------------------- snapshot


class Snapshot:
    """Everything a plugin sees for one reconcile, its objects parsed."""

    def __init__(self, record: Any):
        self.controller: str = record.controller
        self.primary: dict = json.loads(record.primary)
        self.owned: List[dict] = [json.loads(o) for o in record.owned]
        self.related: List[dict] = [{"read": r.read, "object": json.loads(r.object)} for r in record.related]
        self.now: str = record.now
        self.deleting: bool = record.deleting
        self.settings: Any = json.loads(record.settings)
        self.observations = record.observations

    def primary_name(self) -> str:
        return _str_at(self.primary, "metadata", "name")

    def primary_namespace(self) -> Optional[str]:
        """The primary's namespace; None for a cluster-scoped one."""
        ns = _at(self.primary, "metadata", "namespace")
        return ns if isinstance(ns, str) and ns else None

    def primary_generation(self) -> Optional[int]:
        g = _at(self.primary, "metadata", "generation")
        return g if isinstance(g, int) and not isinstance(g, bool) else None

    def primary_spec(self) -> dict:
        """The primary's ``spec``, ``{}`` when missing; invalid-spec when not an object."""
        spec = _at(self.primary, "spec")
        if spec is None and "spec" not in self.primary:
            return {}
        if not isinstance(spec, dict):
            raise ReconcileError.invalid_spec(
                f"{_str_at(self.primary, 'kind')} {self.primary_name()}: spec must be an object, got {json_type(spec)}"
            )
        return spec

    def owned_of_kind(self, api_version: str, kind: str) -> List[dict]:
        return [o for o in self.owned if o.get("apiVersion") == api_version and o.get("kind") == kind]

    def owned_named(self, kind: str, name: str) -> Optional[dict]:
        for o in self.owned:
            if o.get("kind") == kind and _str_at(o, "metadata", "name") == name:
                return o
        return None

    def related_of(self, read_id: str) -> List[dict]:
        return [r["object"] for r in self.related if r["read"] == read_id]

    def observation(self, id: str) -> Any:
        for o in self.observations:
            if o.id == id:
                return o
        return None


# -------------------------------------------------------------- conditions

_CONDITION_FIELDS = ("type", "status", "reason", "message", "lastTransitionTime")


def conditions_of(obj: Any) -> List[dict]:
    """The valid conditions in ``obj.status.conditions`` (copies)."""
    found = _at(obj, "status", "conditions")
    if not isinstance(found, list):
        return []
    out = []
    for c in found:
        if isinstance(c, dict) and all(isinstance(c.get(f), str) for f in _CONDITION_FIELDS):
            copy = {f: c[f] for f in _CONDITION_FIELDS}
            g = c.get("observedGeneration")
            if isinstance(g, int) and not isinstance(g, bool):
                copy["observedGeneration"] = g
            out.append(copy)
    return out


def set_condition(
    conditions: List[dict],
    type: str,
    status: Any,
    reason: str,
    message: str,
    observed_generation: Optional[int],
    now: str,
) -> bool:
    """Sets condition ``type`` (adding it when missing); ``lastTransitionTime``
    moves to ``now`` only when the status changes. True when anything changed."""
    s = "True" if status is True else "False" if status is False else status
    for existing in conditions:
        if existing["type"] == type:
            before = dict(existing)
            if existing["status"] != s:
                existing["status"] = s
                existing["lastTransitionTime"] = now
            existing["reason"] = reason
            existing["message"] = message
            existing.pop("observedGeneration", None)
            if observed_generation is not None:
                existing["observedGeneration"] = observed_generation
            return existing != before
    fresh = {"type": type, "status": s, "reason": reason, "message": message, "lastTransitionTime": now}
    if observed_generation is not None:
        fresh["observedGeneration"] = observed_generation
    conditions.append(fresh)
    return True


def find_condition(conditions: List[dict], type: str) -> Optional[dict]:
    for c in conditions:
        if c["type"] == type:
            return c
    return None


def is_true(conditions: List[dict], type: str) -> bool:
    c = find_condition(conditions, type)
    return c is not None and c["status"] == "True"


# -------------------------------------------------------------------- plan


class Plan:
    """What the plugin wants done, built with chained methods."""

    def __init__(self):
        self._apply: List[dict] = []
        self._delete: List[dict] = []
        self._status: Optional[dict] = None
        self._primary_patch: Optional[dict] = None
        self._events: List[dict] = []
        self._requeue_after_ms: Optional[int] = None
        self._cleanup_complete = False
        self._http_requests: List[dict] = []

    def apply(self, obj: dict, precondition: Optional[dict] = None, force: bool = False) -> "Plan":
        """Create or update ``obj`` by server-side apply."""
        self._apply.append({"object": obj, "precondition": precondition, "force": force})
        return self

    def create(self, obj: dict) -> "Plan":
        """Create ``obj`` only when it does not exist yet."""
        return self.apply(obj, precondition={"absent": True})

    def delete(self, seen: dict) -> "Plan":
        """Delete ``seen``, an owned object as the snapshot shows it."""

        def need(*path: str) -> str:
            v = _str_at(seen, *path)
            if not v:
                raise ReconcileError.internal(
                    f"cannot delete {_str_at(seen, 'kind')} {_str_at(seen, 'metadata', 'name')}: it has no {'.'.join(path)}"
                )
            return v

        self._delete.append(
            {
                "target": {
                    "apiVersion": need("apiVersion"),
                    "kind": need("kind"),
                    "namespace": _str_at(seen, "metadata", "namespace"),
                    "name": need("metadata", "name"),
                },
                "uid": need("metadata", "uid"),
                "resourceVersion": need("metadata", "resourceVersion"),
            }
        )
        return self

    def status(self, status: dict) -> "Plan":
        self._status = status
        return self

    def primary_patch(self, patch: dict) -> "Plan":
        self._primary_patch = patch
        return self

    def event(self, reason: str, message: str) -> "Plan":
        self._events.append({"type": "Normal", "reason": reason, "message": message})
        return self

    def warning(self, reason: str, message: str) -> "Plan":
        self._events.append({"type": "Warning", "reason": reason, "message": message})
        return self

    def requeue_after(self, ms: int) -> "Plan":
        self._requeue_after_ms = ms
        return self

    def cleanup_complete(self) -> "Plan":
        self._cleanup_complete = True
        return self

    def http_request(self, request: dict) -> "Plan":
        self._http_requests.append(request)
        return self

    def to_json(self) -> dict:
        """The plan's JSON value (the shape ``wasmop_contract::Plan`` reads)."""
        return {
            "apply": self._apply,
            "delete": self._delete,
            "status": self._status,
            "primaryPatch": self._primary_patch,
            "events": self._events,
            "requeueAfterMs": self._requeue_after_ms,
            "cleanupComplete": self._cleanup_complete,
            "httpRequests": self._http_requests,
        }


def plan_problems(plan: Any) -> List[str]:
    """The problems of a plan's JSON value against the shape the host reads
    (``wasmop_contract::Plan``), each ``"<path>: <what>"``; empty when it fits."""
    if not isinstance(plan, dict):
        return [f"plan: must be an object, got {json_type(plan)}"]
    problems: List[str] = []

    def bad(path: str, what: str) -> None:
        problems.append(f"{path}: {what}")

    def each(key: str, check: Callable[[Any, str], None]) -> None:
        v = plan.get(key)
        if v is None and key not in plan:
            return
        if not isinstance(v, list):
            bad(key, f"must be a list, got {json_type(v)}")
            return
        for i, item in enumerate(v):
            check(item, f"{key}[{i}]")

    def string(obj: dict, key: str, path: str) -> None:
        if not isinstance(obj.get(key), str):
            bad(f"{path}.{key}", f"must be a string, got {json_type(obj.get(key))}")

    def apply_op(op: Any, path: str) -> None:
        if not isinstance(op, dict):
            return bad(path, "must be an object")
        if not isinstance(op.get("object"), dict):
            bad(f"{path}.object", "must be an object")
        p = op.get("precondition")
        if not (
            p is None
            or (isinstance(p, dict) and len(p) == 1 and (p.get("absent") is True or isinstance(p.get("resourceVersion"), str)))
        ):
            bad(f"{path}.precondition", 'is either {"absent":true} or {"resourceVersion":"…"}')
        if "force" in op and not isinstance(op["force"], bool):
            bad(f"{path}.force", "must be a boolean")

    def delete_op(op: Any, path: str) -> None:
        if not isinstance(op, dict) or not isinstance(op.get("target"), dict):
            return bad(path, 'must be {"target":{…},"uid","resourceVersion"}')
        for key in ("apiVersion", "kind", "name"):
            string(op["target"], key, f"{path}.target")
        string(op, "uid", path)
        string(op, "resourceVersion", path)

    def event(e: Any, path: str) -> None:
        if not isinstance(e, dict):
            return bad(path, "must be an object")
        if e.get("type") not in ("Normal", "Warning"):
            bad(f"{path}.type", 'must be "Normal" or "Warning"')
        string(e, "reason", path)
        string(e, "message", path)

    def http_request(h: Any, path: str) -> None:
        if not isinstance(h, dict):
            return bad(path, "must be an object")
        string(h, "id", path)
        string(h, "path", path)
        if h.get("method") not in ("GET", "POST", "PUT", "PATCH", "DELETE"):
            bad(f"{path}.method", "must be GET, POST, PUT, PATCH or DELETE")

    each("apply", apply_op)
    each("delete", delete_op)
    for key in ("status", "primaryPatch"):
        if plan.get(key) is not None and not isinstance(plan[key], dict):
            bad(key, f"must be an object or null, got {json_type(plan[key])}")
    each("events", event)
    r = plan.get("requeueAfterMs")
    if r is not None and not (isinstance(r, int) and not isinstance(r, bool) and r >= 0):
        bad("requeueAfterMs", "must be a whole number of milliseconds, at least 0")
    if "cleanupComplete" in plan and not isinstance(plan["cleanupComplete"], bool):
        bad("cleanupComplete", "must be a boolean")
    each("httpRequests", http_request)
    return problems


# ------------------------------------------------------------------ export


def export_plugin(plugin: Any) -> type:
    """The component's ``WitWorld`` class for ``plugin``, an object with
    ``manifest()`` (a Manifest), ``validate_settings(settings)`` (a list of
    problems, empty when fine) and ``reconcile(snapshot)`` (a Plan). In the
    plugin module: ``WitWorld = wasmop.export_plugin(MyPlugin())``."""
    import wit_world  # generated by componentize-py at build time
    from componentize_py_types import Err
    from wit_world.imports import types

    errors = {
        "invalid-spec": types.ReconcileError_InvalidSpec,
        "not-ready": types.ReconcileError_NotReady,
        "internal": types.ReconcileError_Internal,
    }

    class WitWorld(wit_world.WitWorld):
        def manifest(self) -> str:
            m = plugin.manifest()
            return json.dumps(m.to_json() if isinstance(m, Manifest) else m)

        def validate_settings(self, text: str) -> None:
            problems = plugin.validate_settings(json.loads(text))
            if problems:
                raise Err(json.dumps(problems))

        def reconcile(self, record: Any) -> str:
            try:
                plan = plugin.reconcile(Snapshot(record))
            except ReconcileError as e:
                raise Err(errors[e.tag](e.message))
            except Exception as e:  # a bug of the plugin's: reported, not a trap
                raise Err(types.ReconcileError_Internal(f"the plugin raised {type(e).__name__}: {e}"))
            value = plan.to_json() if isinstance(plan, Plan) else plan
            problems = plan_problems(value)
            if problems:
                raise Err(types.ReconcileError_Internal("the plan is malformed: " + "; ".join(problems)))
            return json.dumps(value, separators=(",", ":"))

    return WitWorld
