// The wasmop plugin SDK for JavaScript: snapshot, plan, conditions and
// settings helpers over the `plugin` world of wit/reconciler.wit, named
// after the Rust SDK's (plugins/sdk). A plugin is one ES module built into
// a component by componentize-js (tests/build-plugins.sh); see README.md.
//
// The host validates every answer anyway; this module only catches the
// shape mistakes early, naming the field, the way the `wasmop-contract`
// crate's types read a plan.

/** Why a reconcile produced no plan (WIT `reconcile-error`). Throw it. */
export class ReconcileError extends Error {
  constructor(tag, message) {
    super(message);
    this.tag = tag;
  }
  /** The primary's spec cannot be reconciled as written. */
  static invalidSpec(message) {
    return new ReconcileError('invalid-spec', message);
  }
  /** Something the plugin needs is not there yet; retried with backoff. */
  static notReady(message) {
    return new ReconcileError('not-ready', message);
  }
  /** The snapshot was not what the plugin expected (a bug). */
  static internal(message) {
    return new ReconcileError('internal', message);
  }
}

/** The JSON type name of a value, for messages. */
export function jsonType(value) {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'array';
  if (typeof value === 'boolean') return 'boolean';
  if (typeof value === 'number') return 'number';
  if (typeof value === 'string') return 'string';
  return 'object';
}

function isObject(value) {
  return value !== null && typeof value === 'object' && !Array.isArray(value);
}

function at(value, path) {
  let v = value;
  for (const key of path) {
    if (!isObject(v)) return undefined;
    v = v[key];
  }
  return v;
}

function strAt(value, path) {
  const v = at(value, path);
  return typeof v === 'string' ? v : '';
}

// ---------------------------------------------------------------- manifest

/** A Kubernetes kind (`{group, version, kind, plural, namespaced}`). */
export const KindRef = {
  namespaced(group, version, kind, plural) {
    return { group, version, kind, plural, namespaced: true };
  },
  clusterScoped(group, version, kind, plural) {
    return { group, version, kind, plural, namespaced: false };
  },
  configMap() {
    return KindRef.namespaced('', 'v1', 'ConfigMap', 'configmaps');
  },
  secret() {
    return KindRef.namespaced('', 'v1', 'Secret', 'secrets');
  },
  service() {
    return KindRef.namespaced('', 'v1', 'Service', 'services');
  },
  apiVersion(kind) {
    return kind.group ? `${kind.group}/${kind.version}` : kind.version;
  },
};

/** A read selector: by label selector or by a field of the primary. */
export const Selector = {
  labels(matchLabels) {
    return { labels: matchLabels };
  },
  field(namePath) {
    return { field: { namePath } };
  },
  fieldIn(namePath, namespacePath) {
    return { field: { namePath, namespacePath } };
  },
};

/** A read of related objects: `new Read(id, kind, selector)`. */
export function Read(id, kind, selector, { optional = false } = {}) {
  const read = { id, kind, selector };
  if (optional) read.optional = true;
  return read;
}

/** One controller of a manifest, built with chained methods. */
export class Controller {
  constructor(name, primary) {
    this.json = {
      name,
      primary,
      owns: [],
      reads: [],
      finalizer: null,
      writeNamespaces: [],
      primaryFields: [],
      httpTargets: [],
      deletePrimary: false,
    };
  }
  /** Owns `kind` by a controller ownerReference. */
  owns(kind, { adopt = false } = {}) {
    this.json.owns.push({ ...kind, ownership: 'ownerReference', adopt });
    return this;
  }
  /** Reads the objects `read` (see Read) selects. */
  reads(read) {
    this.json.reads.push(read);
    return this;
  }
  finalizer(finalizer) {
    this.json.finalizer = finalizer;
    return this;
  }
  writeNamespace(namespace) {
    this.json.writeNamespaces.push(namespace);
    return this;
  }
  primaryField(path) {
    this.json.primaryFields.push(path);
    return this;
  }
  httpTarget(id, kind, ports) {
    this.json.httpTargets.push({ id, kind, ports });
    return this;
  }
  toJSON() {
    return this.json;
  }
}

/** The manifest: name, version and controllers. */
export class Manifest {
  constructor(name, version) {
    this.name = name;
    this.version = version;
    this.controllers = [];
    this.admission = [];
  }
  controller(controller) {
    this.controllers.push(controller);
    return this;
  }
}

// ---------------------------------------------------------------- settings

/** A problem with the operator's settings, at a dotted path. */
export function settingsProblem(path, message) {
  return { path, message };
}

export const settings = {
  /** One problem per key of `value` not in `allowed` (sorted). */
  onlyKeys(value, allowed) {
    if (!isObject(value)) return [settingsProblem('', 'settings must be a JSON object')];
    const unknown = Object.keys(value)
      .filter((k) => !allowed.includes(k))
      .sort();
    const known =
      allowed.length === 0
        ? 'this plugin takes no settings'
        : `known settings: ${allowed.join(', ')}`;
    return unknown.map((k) => settingsProblem(k, `unknown setting \`${k}\` (${known})`));
  },
  /** A problem when `value[key]` is present and not a string. */
  optionalString(value, key) {
    if (!isObject(value) || value[key] === undefined || typeof value[key] === 'string') return [];
    return [settingsProblem(key, `\`${key}\` must be a string, got ${jsonType(value[key])}`)];
  },
};

// ---------------------------------------------------------------- snapshot

/** Everything a plugin sees for one reconcile, its objects parsed. */
export class Snapshot {
  /** From the WIT record (its objects as JSON texts). */
  constructor(record) {
    this.controller = record.controller;
    this.primary = JSON.parse(record.primary);
    this.owned = record.owned.map((o) => JSON.parse(o));
    this.related = record.related.map((r) => ({ read: r.read, object: JSON.parse(r.object) }));
    this.now = record.now;
    this.deleting = record.deleting;
    this.settings = JSON.parse(record.settings);
    this.observations = record.observations;
  }
  primaryName() {
    return strAt(this.primary, ['metadata', 'name']);
  }
  /** The primary's namespace; null for a cluster-scoped one. */
  primaryNamespace() {
    const ns = at(this.primary, ['metadata', 'namespace']);
    return typeof ns === 'string' && ns !== '' ? ns : null;
  }
  primaryGeneration() {
    const g = at(this.primary, ['metadata', 'generation']);
    return Number.isInteger(g) ? g : null;
  }
  /** The primary's `spec`, `{}` when missing; invalid-spec when not an object. */
  primarySpec() {
    const spec = at(this.primary, ['spec']);
    if (spec === undefined) return {};
    if (!isObject(spec)) {
      throw ReconcileError.invalidSpec(
        `${strAt(this.primary, ['kind'])} ${this.primaryName()}: spec must be an object, got ${jsonType(spec)}`,
      );
    }
    return spec;
  }
  /** Owned objects of this apiVersion and kind. */
  ownedOfKind(apiVersion, kind) {
    return this.owned.filter((o) => o.apiVersion === apiVersion && o.kind === kind);
  }
  /** The owned object of this kind and name, or null. */
  ownedNamed(kind, name) {
    return this.owned.find((o) => o.kind === kind && strAt(o, ['metadata', 'name']) === name) ?? null;
  }
  /** The objects read `readId` selected. */
  relatedOf(readId) {
    return this.related.filter((r) => r.read === readId).map((r) => r.object);
  }
  /** The observation of request `id`, or null. */
  observation(id) {
    return this.observations.find((o) => o.id === id) ?? null;
  }
}

// -------------------------------------------------------------- conditions

const CONDITION_FIELDS = ['type', 'status', 'reason', 'message', 'lastTransitionTime'];

/** The valid conditions in `object.status.conditions` (copies). */
export function conditionsOf(object) {
  const list = at(object, ['status', 'conditions']);
  if (!Array.isArray(list)) return [];
  return list
    .filter((c) => isObject(c) && CONDITION_FIELDS.every((f) => typeof c[f] === 'string'))
    .map((c) => {
      const copy = {};
      for (const f of CONDITION_FIELDS) copy[f] = c[f];
      if (Number.isInteger(c.observedGeneration)) copy.observedGeneration = c.observedGeneration;
      return copy;
    });
}

/**
 * Sets condition `type` (adding it when missing); `lastTransitionTime`
 * moves to `now` only when the status changes. Returns true when anything
 * changed.
 */
export function setCondition(conditions, type, status, reason, message, observedGeneration, now) {
  const s = status === true ? 'True' : status === false ? 'False' : status;
  const existing = conditions.find((c) => c.type === type);
  const fresh = { type, status: s, reason, message, lastTransitionTime: now };
  if (observedGeneration !== null && observedGeneration !== undefined) {
    fresh.observedGeneration = observedGeneration;
  }
  if (!existing) {
    conditions.push(fresh);
    return true;
  }
  const before = JSON.stringify(existing);
  if (existing.status !== s) {
    existing.status = s;
    existing.lastTransitionTime = now;
  }
  existing.reason = reason;
  existing.message = message;
  delete existing.observedGeneration;
  if (fresh.observedGeneration !== undefined) existing.observedGeneration = fresh.observedGeneration;
  return JSON.stringify(existing) !== before;
}

export function findCondition(conditions, type) {
  return conditions.find((c) => c.type === type) ?? null;
}

export function isTrue(conditions, type) {
  return findCondition(conditions, type)?.status === 'True';
}

// -------------------------------------------------------------------- plan

/** What the plugin wants done, built with chained methods. */
export class Plan {
  constructor() {
    this.apply_ = [];
    this.delete_ = [];
    this.status_ = null;
    this.primaryPatch_ = null;
    this.events = [];
    this.requeueAfterMs = null;
    this.cleanupComplete_ = false;
    this.httpRequests = [];
  }
  /** Create or update `object` by server-side apply. */
  apply(object, { precondition = null, force = false } = {}) {
    this.apply_.push({ object, precondition, force });
    return this;
  }
  /** Create `object` only when it does not exist yet. */
  create(object) {
    return this.apply(object, { precondition: { absent: true } });
  }
  /** Delete `seen`, an owned object as the snapshot shows it. */
  delete(seen) {
    const need = (path) => {
      const v = strAt(seen, path);
      if (v === '') {
        throw ReconcileError.internal(
          `cannot delete ${strAt(seen, ['kind'])} ${strAt(seen, ['metadata', 'name'])}: it has no ${path.join('.')}`,
        );
      }
      return v;
    };
    this.delete_.push({
      target: {
        apiVersion: need(['apiVersion']),
        kind: need(['kind']),
        namespace: strAt(seen, ['metadata', 'namespace']),
        name: need(['metadata', 'name']),
      },
      uid: need(['metadata', 'uid']),
      resourceVersion: need(['metadata', 'resourceVersion']),
    });
    return this;
  }
  status(status) {
    this.status_ = status;
    return this;
  }
  primaryPatch(patch) {
    this.primaryPatch_ = patch;
    return this;
  }
  event(reason, message) {
    this.events.push({ type: 'Normal', reason, message });
    return this;
  }
  warning(reason, message) {
    this.events.push({ type: 'Warning', reason, message });
    return this;
  }
  requeueAfter(ms) {
    this.requeueAfterMs = ms;
    return this;
  }
  cleanupComplete() {
    this.cleanupComplete_ = true;
    return this;
  }
  httpRequest(request) {
    this.httpRequests.push(request);
    return this;
  }
  /** The plan's JSON value (the shape `wasmop_contract::Plan` reads). */
  toJSON() {
    return {
      apply: this.apply_,
      delete: this.delete_,
      status: this.status_,
      primaryPatch: this.primaryPatch_,
      events: this.events,
      requeueAfterMs: this.requeueAfterMs,
      cleanupComplete: this.cleanupComplete_,
      httpRequests: this.httpRequests,
    };
  }
}

/**
 * The problems of a plan's JSON value against the shape the host reads
 * (`wasmop_contract::Plan`), each `"<path>: <what>"`; empty when it fits.
 */
export function planProblems(plan) {
  const problems = [];
  const bad = (path, what) => problems.push(`${path}: ${what}`);
  const list = (key, each) => {
    const v = plan[key];
    if (v === undefined) return;
    if (!Array.isArray(v)) return bad(key, `must be a list, got ${jsonType(v)}`);
    v.forEach((item, i) => each(item, `${key}[${i}]`));
  };
  const str = (obj, key, path) => {
    if (typeof obj[key] !== 'string') bad(`${path}.${key}`, `must be a string, got ${jsonType(obj[key] ?? null)}`);
  };
  if (!isObject(plan)) return [`plan: must be an object, got ${jsonType(plan)}`];
  list('apply', (op, path) => {
    if (!isObject(op)) return bad(path, 'must be an object');
    if (!isObject(op.object)) bad(`${path}.object`, 'must be an object');
    const p = op.precondition;
    const ok =
      p === null ||
      p === undefined ||
      (isObject(p) && Object.keys(p).length === 1 && (p.absent === true || typeof p.resourceVersion === 'string'));
    if (!ok) bad(`${path}.precondition`, 'is either {"absent":true} or {"resourceVersion":"…"}');
    if (op.force !== undefined && typeof op.force !== 'boolean') bad(`${path}.force`, 'must be a boolean');
  });
  list('delete', (op, path) => {
    if (!isObject(op) || !isObject(op.target)) return bad(path, 'must be {"target":{…},"uid","resourceVersion"}');
    for (const key of ['apiVersion', 'kind', 'name']) str(op.target, key, `${path}.target`);
    str(op, 'uid', path);
    str(op, 'resourceVersion', path);
  });
  for (const key of ['status', 'primaryPatch']) {
    if (plan[key] !== undefined && plan[key] !== null && !isObject(plan[key])) {
      bad(key, `must be an object or null, got ${jsonType(plan[key])}`);
    }
  }
  list('events', (e, path) => {
    if (!isObject(e)) return bad(path, 'must be an object');
    if (e.type !== 'Normal' && e.type !== 'Warning') bad(`${path}.type`, 'must be "Normal" or "Warning"');
    str(e, 'reason', path);
    str(e, 'message', path);
  });
  const r = plan.requeueAfterMs;
  if (r !== undefined && r !== null && !(Number.isInteger(r) && r >= 0)) {
    bad('requeueAfterMs', 'must be a whole number of milliseconds, at least 0');
  }
  if (plan.cleanupComplete !== undefined && typeof plan.cleanupComplete !== 'boolean') {
    bad('cleanupComplete', 'must be a boolean');
  }
  list('httpRequests', (h, path) => {
    if (!isObject(h)) return bad(path, 'must be an object');
    str(h, 'id', path);
    str(h, 'path', path);
    if (!['GET', 'POST', 'PUT', 'PATCH', 'DELETE'].includes(h.method)) bad(`${path}.method`, 'must be GET, POST, PUT, PATCH or DELETE');
  });
  return problems;
}

// ------------------------------------------------------------------ export

function errorOf(e) {
  if (e instanceof ReconcileError) return { tag: e.tag, val: e.message };
  return { tag: 'internal', val: `the plugin threw ${e instanceof Error ? `${e.name}: ${e.message}` : String(e)}` };
}

/**
 * The component's exports for `plugin`, an object with
 * `manifest()` (a Manifest), `validateSettings(settings)` (a list of
 * problems, empty when fine) and `reconcile(snapshot)` (a Plan). Export
 * each: `export const { manifest, validateSettings, reconcile } = exportPlugin(plugin)`
 * is not seen by componentize-js; name them one by one (see README.md).
 */
export function exportPlugin(plugin) {
  return {
    manifest() {
      return JSON.stringify(plugin.manifest());
    },
    validateSettings(text) {
      const problems = plugin.validateSettings(JSON.parse(text));
      if (problems.length > 0) throw JSON.stringify(problems);
    },
    reconcile(record) {
      let plan;
      try {
        plan = plugin.reconcile(new Snapshot(record));
      } catch (e) {
        throw errorOf(e);
      }
      const value = plan instanceof Plan ? plan.toJSON() : plan;
      const problems = planProblems(value);
      if (problems.length > 0) {
        throw { tag: 'internal', val: `the plan is malformed: ${problems.join('; ')}` };
      }
      return JSON.stringify(value);
    },
  };
}
