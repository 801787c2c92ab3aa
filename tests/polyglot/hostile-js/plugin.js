// Test plugin `hostile-js`: what a JavaScript plugin can do to its host,
// one behaviour per `spec.mode` of a `Hostile` (test.wasmop.dev/v1):
//   loop      spins forever (only the deadline ends the call);
//   allocate  keeps allocating and filling 1 MiB arrays (only the memory
//             cap ends it);
//   huge-plan answers with a status of `spec.bytes` (default 9 MiB) of
//             text, more than the 8 MiB the host reads of a plan;
//   dense     answers with a status of `spec.values` (default 300 000)
//             zeros, more than the 250 000 JSON values the host reads of
//             a plan, in a small text;
//   remember  counts its calls in a module variable and answers the count
//             in `status.calls` (1 when every call starts afresh);
//   throw     throws a TypeError (reported as the plugin's internal error);
//   anything else answers an empty plan.
import { Controller, KindRef, Manifest, Plan, exportPlugin } from './wasmop.js';

let calls = 0;
const hoard = [];

const hostile = {
  manifest() {
    return new Manifest('hostile-js', '0.1.0').controller(
      new Controller('hostile', KindRef.namespaced('test.wasmop.dev', 'v1', 'Hostile', 'hostiles')).owns(
        KindRef.configMap(),
      ),
    );
  },
  validateSettings() {
    return [];
  },
  reconcile(snapshot) {
    calls += 1;
    const spec = snapshot.primarySpec();
    switch (spec.mode) {
      case 'loop':
        for (;;) {}
      case 'allocate':
        for (let i = 0; ; i++) {
          hoard.push(new Uint8Array(1 << 20).fill((i % 255) + 1));
        }
      case 'huge-plan':
        return new Plan().status({ filler: 'x'.repeat(spec.bytes ?? 9 << 20) });
      case 'dense':
        return new Plan().status({ zeros: new Array(spec.values ?? 300000).fill(0) });
      case 'remember':
        hoard.push(snapshot.primaryName());
        return new Plan().status({ calls, seen: hoard });
      case 'throw':
        return null.field;
      default:
        return new Plan();
    }
  },
};

const exports = exportPlugin(hostile);
export const manifest = exports.manifest;
export const validateSettings = exports.validateSettings;
export const reconcile = exports.reconcile;
