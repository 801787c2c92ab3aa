// Test plugin `referrer-js`: the Rust `referrer` (tests/plugins/referrer) in
// JavaScript, with the same manifest and plans: a read by field reference,
// an owned ConfigMap, a primary field set once and a finalizer.
//
// For each Referrer (test.wasmop.dev/v1):
// - reads the ConfigMap named by `spec.configRef` (read id `config`) and
//   applies ConfigMap `<name>-copy` with the same `data`; when it is
//   missing, writes `status.configFound: false` and asks for no requeue;
// - sets `spec.id` once, to `id-` and the first 8 characters of its UID;
// - holds the finalizer `test.wasmop.dev/cleanup` and releases it on
//   deletion only once `spec.allowCleanup` is true.
import { Controller, KindRef, Manifest, Plan, Read, Selector, exportPlugin } from './wasmop.js';

const FINALIZER = 'test.wasmop.dev/cleanup';

const referrer = {
  manifest() {
    return new Manifest('referrer', '0.1.0').controller(
      new Controller('referrer', KindRef.namespaced('test.wasmop.dev', 'v1', 'Referrer', 'referrers'))
        .owns(KindRef.configMap())
        .reads(Read('config', KindRef.configMap(), Selector.field('spec.configRef')))
        .finalizer(FINALIZER)
        .primaryField('spec.id'),
    );
  },

  validateSettings() {
    return [];
  },

  reconcile(snapshot) {
    const spec = snapshot.primarySpec();
    if (snapshot.deleting) {
      return spec.allowCleanup === true
        ? new Plan().event('CleanupDone', 'external cleanup finished').cleanupComplete()
        : new Plan().warning('CleanupBlocked', 'waiting for spec.allowCleanup');
    }
    const plan = new Plan();
    if (!spec.id) {
      const uid = snapshot.primary.metadata.uid ?? '';
      plan.primaryPatch({ spec: { id: `id-${uid.slice(0, 8)}` } });
    }
    const [config] = snapshot.relatedOf('config');
    if (config === undefined) {
      return plan.status({ configFound: false });
    }
    const data = config.data !== null && typeof config.data === 'object' ? config.data : {};
    return plan
      .apply({
        apiVersion: 'v1',
        kind: 'ConfigMap',
        metadata: { name: `${snapshot.primaryName()}-copy`, namespace: snapshot.primaryNamespace() },
        data,
      })
      .status({ configFound: true });
  },
};

const exported = exportPlugin(referrer);
export const manifest = exported.manifest;
export const validateSettings = exported.validateSettings;
export const reconcile = exported.reconcile;
