// What a checkpoint holds (onnxtrain/checkpoint/data.py): named tensors by kind, per-parameter optimizer state,
// the step count and properties. A tensor is {dtype: numpy dtype name, shape: number[], data: typed array}.

export const KINDS = ['trainable', 'frozen', 'buffer', 'optimizer'];

/** tensorKey('trainable', 'w') === 'trainable/w'; tensorKey('optimizer', 'w', 'exp_avg') === 'optimizer/w/exp_avg'. */
export function tensorKey(kind, name, state = undefined) {
  if (kind === 'optimizer') {
    if (typeof state !== 'string' || state.includes('/')) throw new RangeError(`optimizer state name ${state} of ${name} must be a string without '/'`);
    return `optimizer/${name}/${state}`;
  }
  if (!KINDS.includes(kind)) throw new RangeError(`unknown tensor kind ${kind}; expected one of ${KINDS.join(', ')}`);
  return `${kind}/${name}`;
}

/** Inverse of tensorKey: 'optimizer/a/b/m' -> ['optimizer', 'a/b', 'm']. */
export function splitTensorKey(key) {
  const slash = key.indexOf('/');
  const kind = key.slice(0, slash);
  if (slash < 0 || !KINDS.includes(kind)) throw new RangeError(`tensor key ${JSON.stringify(key)} does not start with one of ${KINDS.map((k) => k + '/').join(', ')}`);
  const rest = key.slice(slash + 1);
  if (kind !== 'optimizer') return [kind, rest, undefined];
  const last = rest.lastIndexOf('/');
  if (last < 0) throw new RangeError(`optimizer tensor key ${JSON.stringify(key)} is not optimizer/<param>/<state>`);
  return [kind, rest.slice(0, last), rest.slice(last + 1)];
}

const FIELDS = { trainable: 'trainable', frozen: 'frozen', buffer: 'buffers' };

/** Everything a checkpoint file holds; Maps keep the checkpoint's order (plain objects would reorder "0", "1"). */
export class CheckpointData {
  constructor({ trainable = new Map(), frozen = new Map(), buffers = new Map(), optimizer = new Map(), step = 0,
    properties = new Map() } = {}) {
    /** @type {Map<string, {dtype: string, shape: number[], data: ArrayBufferView}>} */
    this.trainable = trainable;
    this.frozen = frozen;
    this.buffers = buffers;
    /** @type {Map<string, Map<string, {dtype: string, shape: number[], data: ArrayBufferView}>>} */
    this.optimizer = optimizer;
    this.step = step;
    /** @type {Map<string, bigint | number | string>} int (bigint), float (number) or str values */
    this.properties = properties;
  }

  /** Every tensor by tensor key: trainable, frozen, buffers, then optimizer state (the checkpoint order). */
  tensors() {
    const flat = new Map();
    for (const [kind, field] of Object.entries(FIELDS)) {
      for (const [name, t] of this[field]) flat.set(tensorKey(kind, name), t);
    }
    for (const [param, states] of this.optimizer) {
      for (const [state, t] of states) flat.set(tensorKey('optimizer', param, state), t);
    }
    return flat;
  }

  /** Inverse of tensors(). */
  static fromTensors(tensors, step = 0, properties = new Map()) {
    const data = new CheckpointData({ step, properties: new Map(properties) });
    for (const [key, t] of tensors) {
      const [kind, name, state] = splitTensorKey(key);
      if (kind === 'optimizer') {
        if (!data.optimizer.has(name)) data.optimizer.set(name, new Map());
        data.optimizer.get(name).set(state, t);
      } else {
        data[FIELDS[kind]].set(name, t);
      }
    }
    return data;
  }
}
