"""Test plugin ``hostile-py``: what a Python plugin can do to its host, one
behaviour per ``spec.mode`` of a ``Hostile`` (test.wasmop.dev/v1):

- ``loop``: spins forever (only the deadline ends the call);
- ``allocate``: keeps allocating and touching 1 MiB strings (only the memory
  cap ends it);
- ``huge-plan``: answers with a status of ``spec.bytes`` (default 9 MiB) of
  text, more than the 8 MiB the host reads of a plan;
- ``dense``: answers with a status of ``spec.values`` (default 300 000)
  zeros, more than the 250 000 JSON values the host reads of a plan, in a
  small text;
- ``remember``: counts its calls in a module variable and answers the count
  in ``status.calls`` (1 when every call starts afresh);
- ``throw``: raises a TypeError (reported as the plugin's internal error);
- anything else answers an empty plan.
"""

import wasmop
from wasmop import Controller, KindRef, Manifest, Plan

calls = 0
hoard = []


class Hostile:
    def manifest(self):
        return Manifest("hostile-py", "0.1.0").controller(
            Controller("hostile", KindRef.namespaced("test.wasmop.dev", "v1", "Hostile", "hostiles")).owns(
                KindRef.config_map()
            )
        )

    def validate_settings(self, value):
        return []

    def reconcile(self, snapshot):
        global calls
        calls += 1
        spec = snapshot.primary_spec()
        mode = spec.get("mode")
        if mode == "loop":
            while True:
                pass
        if mode == "allocate":
            i = 0
            while True:
                hoard.append(str(i).ljust(1 << 20, "x") + str(i))
                i += 1
        if mode == "huge-plan":
            return Plan().status({"filler": "x" * spec.get("bytes", 9 << 20)})
        if mode == "dense":
            return Plan().status({"zeros": [0] * spec.get("values", 300000)})
        if mode == "remember":
            hoard.append(snapshot.primary_name())
            return Plan().status({"calls": calls, "seen": hoard})
        if mode == "throw":
            return None + 1
        return Plan()


WitWorld = wasmop.export_plugin(Hostile())
