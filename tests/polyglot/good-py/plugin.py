"""Test plugin ``good-py``: the Rust ``good`` (tests/plugins/good) in Python,
with the same manifest (name ``good``, version 0.1.0) and the same plans, so
good's golden plans and live tests run against it too. ``good-v2-py`` is
this file (a link) with the version.py of ``good-v2``: version 0.2.0, label v2.

For each Widget it applies ConfigMap ``<name>-cm`` holding
``data.value = spec.value`` (default "") labelled
``test.wasmop.dev/version: v1`` (or the ``label`` setting), and sets status
``{"conditions": [Ready=True], "value": spec.value}``.
"""

import wasmop
from version import LABEL, VERSION
from wasmop import Controller, KindRef, Manifest, Plan, ReconcileError, settings

GROUP = "test.wasmop.dev"
VERSION_LABEL = "test.wasmop.dev/version"


class Good:
    def manifest(self):
        return Manifest("good", VERSION).controller(
            Controller("widget", KindRef.namespaced(GROUP, "v1", "Widget", "widgets")).owns(KindRef.config_map())
        )

    def validate_settings(self, value):
        return settings.only_keys(value, ["label"]) + settings.optional_string(value, "label")

    def reconcile(self, snapshot):
        if snapshot.deleting:
            # Nothing outside Kubernetes to clean up; ownerReferences do the rest.
            return Plan().cleanup_complete()
        spec = snapshot.primary_spec()
        value = spec.get("value", "")
        if not isinstance(value, str):
            raise ReconcileError.invalid_spec(f"Widget {snapshot.primary_name()}: spec.value must be a string")
        label = snapshot.settings.get("label")
        if label is None:
            label = LABEL
        name = f"{snapshot.primary_name()}-cm"
        conditions = wasmop.conditions_of(snapshot.primary)
        wasmop.set_condition(
            conditions,
            "Ready",
            True,
            "Reconciled",
            f"ConfigMap {name} holds the value",
            snapshot.primary_generation(),
            snapshot.now,
        )
        return (
            Plan()
            .apply(
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {
                        "name": name,
                        "namespace": snapshot.primary_namespace(),
                        "labels": {VERSION_LABEL: label},
                    },
                    "data": {"value": value},
                }
            )
            .status({"conditions": conditions, "value": value})
        )


WitWorld = wasmop.export_plugin(Good())
