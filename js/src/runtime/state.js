// CheckpointState (onnxtrain/runtime/state.py): the one owner of parameters, gradients, buffers, optimizer
// state, the step count and properties. Module and Optimizer read and write them through its methods.

import { CheckpointData } from '../checkpoint/data.js';
import { loadCheckpoint, saveCheckpoint } from '../checkpoint/format.js';
import { FlatStorage } from './storage.js';
import { readBytes, writeFileAtomic } from './io.js';

export class CheckpointState {
  /** @param {CheckpointData} data */
  constructor(data) {
    const dtypes = new Set([...data.trainable.values()].map((t) => t.dtype));
    if (dtypes.size > 1 || (dtypes.size === 1 && !dtypes.has('float32'))) {
      throw new TypeError(`trainable parameters must all be float32 here, got ${[...dtypes].join(', ')}`);
    }
    const layout = [...data.trainable].map(([name, t]) => [name, t.shape]);
    this.params = new FlatStorage(layout);
    this.grads = new FlatStorage(layout);
    for (const [name, t] of data.trainable) this.params.views.get(name).set(t.data);
    /** @type {Map<string, {dtype: string, shape: number[], data: ArrayBufferView}>} */
    this.frozen = new Map([...data.frozen].map(([n, t]) => [n, { ...t, data: t.data.slice() }]));
    this.buffers = new Map([...data.buffers].map(([n, t]) => [n, { ...t, data: t.data.slice() }]));
    this._optimizerData = data.optimizer;
    /** @type {Map<string, FlatStorage>} optimizer state name -> flat storage (once an Optimizer uses it) */
    this.optimizerStates = new Map();
    this.step = data.step;
    /** @type {Map<string, bigint | number | string>} int (bigint), float (number) or str properties */
    this.properties = new Map(data.properties);
    /** Bumped by every write to the parameters from outside a training step (an update prepared before is stale). */
    this.version = 0;
  }

  /** Load a checkpoint written by generate_artifacts, save_checkpoint (Python) or saveCheckpoint (here). */
  static async loadCheckpoint(source) {
    const bytes = await readBytes(source, 'checkpoint');
    return new CheckpointState(loadCheckpoint(bytes, typeof source === 'string' ? `checkpoint ${source}` : 'checkpoint'));
  }

  /**
   * The checkpoint file's bytes; in Node.js also written atomically to `path` when one is given.
   * @returns {Promise<Uint8Array>}
   */
  static async saveCheckpoint(state, path = undefined, includeOptimizerState = false) {
    const bytes = state.toBytes(includeOptimizerState);
    if (path !== undefined) await writeFileAtomic(path, bytes);
    return bytes;
  }

  /** The checkpoint file's bytes (identical to Python's save_checkpoint of the same state). */
  toBytes(includeOptimizerState = false) {
    return saveCheckpoint(this.toData(includeOptimizerState), includeOptimizerState);
  }

  /** A copy of everything as CheckpointData (optimizer state in state-name order per parameter, as Python). */
  toData(includeOptimizerState = true) {
    const copy = (t) => ({ ...t, data: t.data.slice() });
    const tensor = (view, shape) => ({ dtype: 'float32', shape: [...shape], data: view.slice() });
    const optimizer = new Map();
    if (includeOptimizerState && this.optimizerStates.size > 0) {
      for (const [name] of this.params.layout) optimizer.set(name, new Map());
      for (const [stateName, storage] of this.optimizerStates) {
        for (const [name, shape] of storage.layout) optimizer.get(name).set(stateName, tensor(storage.views.get(name), shape));
      }
    } else if (includeOptimizerState) {
      for (const [name, states] of this._optimizerData) optimizer.set(name, new Map([...states].map(([s, t]) => [s, copy(t)])));
    }
    return new CheckpointData({
      trainable: new Map(this.params.layout.map(([name, shape]) => [name, tensor(this.params.views.get(name), shape)])),
      frozen: new Map([...this.frozen].map(([n, t]) => [n, copy(t)])),
      buffers: new Map([...this.buffers].map(([n, t]) => [n, copy(t)])),
      optimizer, step: this.step, properties: new Map(this.properties),
    });
  }

  /** Names of the trainable parameters, in checkpoint order. */
  trainableNames() {
    return this.params.layout.map(([name]) => name);
  }

  /** A copy of a parameter's value (trainable or frozen). */
  getParameter(name) {
    if (this.params.has(name)) return this.params.views.get(name).slice();
    if (this.frozen.has(name)) return this.frozen.get(name).data.slice();
    throw new RangeError(`no parameter named ${name}; the checkpoint has ${[...this.trainableNames(), ...this.frozen.keys()].slice(0, 5).join(', ')}...`);
  }

  /** Set a parameter's value; its length must match. */
  setParameter(name, value) {
    const target = this.params.has(name) ? this.params.views.get(name) : this.frozen.get(name)?.data;
    if (!target) throw new RangeError(`no parameter named ${name}`);
    if (value.length !== target.length) throw new RangeError(`parameter ${name} has ${target.length} elements, got ${value.length}`);
    target.set(value);
    this.version += 1;
  }

  /** Set every trainable parameter (then, unless trainableOnly, every frozen one) from one flat Float32Array. */
  setParameters(flat, trainableOnly = true) {
    this.params.vector.set(flat.subarray(0, this.params.size));
    if (!trainableOnly) {
      let offset = this.params.size;
      for (const t of this.frozen.values()) {
        t.data.set(flat.subarray(offset, offset + t.data.length));
        offset += t.data.length;
      }
    }
    this.version += 1;
  }

  /** A copy of a trainable parameter's accumulated gradient. */
  getGradient(name) {
    if (!this.grads.has(name)) throw new RangeError(`no trainable parameter named ${name}`);
    return this.grads.views.get(name).slice();
  }

  /** Flat storage for each optimizer state, initialised from the checkpoint (zeros where absent). */
  optimizerStorage(stateNames) {
    for (const s of stateNames) {
      if (this.optimizerStates.has(s)) continue;
      const storage = new FlatStorage(this.params.layout);
      for (const [name, view] of storage.views) {
        const saved = this._optimizerData.get(name)?.get(s);
        if (saved) {
          if (saved.data.length !== view.length) throw new RangeError(`optimizer state ${s} of ${name} has ${saved.data.length} elements, expected ${view.length}`);
          view.set(saved.data);
        }
      }
      this.optimizerStates.set(s, storage);
    }
    return new Map(stateNames.map((s) => [s, this.optimizerStates.get(s)]));
  }
}
