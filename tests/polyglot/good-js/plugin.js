// Test plugin `good-js`: the Rust `good` (tests/plugins/good) in
// JavaScript, with the same manifest (name `good`, version 0.1.0) and the
// same plans, so good's golden plans and live tests run against it too.
//
// `good-v2-js` is this file (a link) with the version.js of `good-v2`:
// version 0.2.0, label v2.
//
// For each Widget it applies ConfigMap `<name>-cm` holding
// `data.value = spec.value` (default "") labelled
// `test.wasmop.dev/version: v1` (or the `label` setting), and sets status
// `{"conditions": [Ready=True], "value": spec.value}`.
import {
  Controller,
  KindRef,
  Manifest,
  Plan,
  ReconcileError,
  conditionsOf,
  exportPlugin,
  setCondition,
  settings,
} from './wasmop.js';
import { LABEL, VERSION } from './version.js';

const GROUP = 'test.wasmop.dev';
const VERSION_LABEL = 'test.wasmop.dev/version';

const good = {
  manifest() {
    return new Manifest('good', VERSION).controller(
      new Controller('widget', KindRef.namespaced(GROUP, 'v1', 'Widget', 'widgets')).owns(KindRef.configMap()),
    );
  },

  validateSettings(value) {
    return [...settings.onlyKeys(value, ['label']), ...settings.optionalString(value, 'label')];
  },

  reconcile(snapshot) {
    if (snapshot.deleting) {
      // Nothing outside Kubernetes to clean up; ownerReferences do the rest.
      return new Plan().cleanupComplete();
    }
    const spec = snapshot.primarySpec();
    const value = spec.value ?? '';
    if (typeof value !== 'string') {
      throw ReconcileError.invalidSpec(`Widget ${snapshot.primaryName()}: spec.value must be a string`);
    }
    const label = snapshot.settings.label ?? LABEL;
    const name = `${snapshot.primaryName()}-cm`;
    const conditions = conditionsOf(snapshot.primary);
    setCondition(
      conditions,
      'Ready',
      true,
      'Reconciled',
      `ConfigMap ${name} holds the value`,
      snapshot.primaryGeneration(),
      snapshot.now,
    );
    return new Plan()
      .apply({
        apiVersion: 'v1',
        kind: 'ConfigMap',
        metadata: { name, namespace: snapshot.primaryNamespace(), labels: { [VERSION_LABEL]: label } },
        data: { value },
      })
      .status({ conditions, value });
  },
};

const exports = exportPlugin(good);
export const manifest = exports.manifest;
export const validateSettings = exports.validateSettings;
export const reconcile = exports.reconcile;
