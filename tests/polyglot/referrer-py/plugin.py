"""Test plugin ``referrer-py``: the Rust ``referrer`` (tests/plugins/referrer)
in Python, with the same manifest and plans: a read by field reference, an
owned ConfigMap, a primary field set once and a finalizer.

For each Referrer (test.wasmop.dev/v1):

- reads the ConfigMap named by ``spec.configRef`` (read id ``config``) and
  applies ConfigMap ``<name>-copy`` with the same ``data``; when it is
  missing, writes ``status.configFound: false`` and asks for no requeue;
- sets ``spec.id`` once, to ``id-`` and the first 8 characters of its UID;
- holds the finalizer ``test.wasmop.dev/cleanup`` and releases it on
  deletion only once ``spec.allowCleanup`` is true.
"""

import wasmop
from wasmop import Controller, KindRef, Manifest, Plan, Selector, read

FINALIZER = "test.wasmop.dev/cleanup"


class Referrer:
    def manifest(self):
        return Manifest("referrer", "0.1.0").controller(
            Controller("referrer", KindRef.namespaced("test.wasmop.dev", "v1", "Referrer", "referrers"))
            .owns(KindRef.config_map())
            .reads(read("config", KindRef.config_map(), Selector.field("spec.configRef")))
            .finalizer(FINALIZER)
            .primary_field("spec.id")
        )

    def validate_settings(self, value):
        return []

    def reconcile(self, snapshot):
        spec = snapshot.primary_spec()
        if snapshot.deleting:
            if spec.get("allowCleanup") is True:
                return Plan().event("CleanupDone", "external cleanup finished").cleanup_complete()
            return Plan().warning("CleanupBlocked", "waiting for spec.allowCleanup")
        plan = Plan()
        if not spec.get("id"):
            uid = snapshot.primary.get("metadata", {}).get("uid") or ""
            plan.primary_patch({"spec": {"id": f"id-{uid[:8]}"}})
        configs = snapshot.related_of("config")
        if not configs:
            return plan.status({"configFound": False})
        data = configs[0].get("data")
        if not isinstance(data, dict):
            data = {}
        return plan.apply(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": f"{snapshot.primary_name()}-copy", "namespace": snapshot.primary_namespace()},
                "data": data,
            }
        ).status({"configFound": True})


WitWorld = wasmop.export_plugin(Referrer())
