// Optimizer (onnxtrain/runtime/optimizer.py): runs the optimizer graph over the Module's flat parameters.
// One run updates every parameter and optimizer state; a step after a non-finite loss or with non-finite
// gradients is skipped (parameters and state unchanged) and counted in skippedSteps. When the Module's last
// training call ran the train-step model, the update is already computed: it is committed if still valid
// (same learning rate, parameters and step), otherwise the optimizer graph runs on its own.

import * as names from '../conventions.js';
import { optimizerMetadata } from './model-metadata.js';
import { readBytes } from './io.js';
import { openSession, run } from './module.js';

export class Optimizer {
  /**
   * @param {object} ort the engine (the Module's)
   * @param {string | Uint8Array} optimizerModel the optimizer model written by generate_artifacts
   * @param {import('./module.js').Module} module
   */
  static async create(ort, optimizerModel, module, sessionOptions = {}) {
    const bytes = await readBytes(optimizerModel, 'optimizer model');
    const meta = optimizerMetadata(bytes);
    const layout = module.state.params.layout;
    if (JSON.stringify(meta.layout) !== JSON.stringify(layout)) {
      throw new Error(`the optimizer model does not match the checkpoint's trainable parameters (${meta.layout.length} in the optimizer, ${layout.length} in the checkpoint)`);
    }
    return new Optimizer(ort, module, meta, await openSession(ort, bytes, 'optimizer model', sessionOptions));
  }

  constructor(ort, module, meta, session) {
    this.module = module;
    this.meta = meta;
    this.config = meta.config;
    this.type = meta.type;
    this.stateNames = meta.states;
    this.skippedSteps = 0;
    this._session = session;
    const state = module.state;
    this._states = state.optimizerStorage(this.stateNames);
    this._lr = new Float32Array([1e-3]);
    this._step = new BigInt64Array(1);
    const flat = (vector) => new ort.Tensor('float32', vector, [vector.length]);
    // Bound once over the live flat vectors (see module.js).
    this._feeds = {
      [names.LEARNING_RATE]: new ort.Tensor('float32', this._lr, []),
      [names.STEP]: new ort.Tensor('int64', this._step, []),
      [names.PARAMS]: flat(state.params.vector),
      [names.GRADIENTS]: flat(state.grads.vector),
    };
    for (const [s, storage] of this._states) this._feeds[s] = flat(storage.vector);
  }

  /** The optimizer graph's inputs but the gradients, bound over the live vectors (for the train-step model). */
  graphFeeds() {
    const { [names.GRADIENTS]: _gradients, ...feeds } = this._feeds;
    return feeds;
  }

  /** The optimizer graph's outputs (params.out, one per state, gradients_finite). */
  outputNames() {
    return [...this._session.outputNames];
  }

  /** Set the step input for the next update (the step it will make). */
  prepareFeeds() {
    this._step[0] = BigInt(this.module.state.step + 1);
  }

  setLearningRate(learningRate) {
    // as Python's Optimizer.set_learning_rate: a NaN rate would turn every trained parameter into NaN
    if (typeof learningRate !== 'number') throw new TypeError(`the learning rate must be a number, got ${typeof learningRate} ${learningRate}`);
    if (!Number.isFinite(learningRate)) throw new RangeError(`the learning rate must be finite, got ${learningRate}: the parameters would all become NaN at the next step`);
    this._lr[0] = learningRate;
  }

  /** The learning rate as the graph sees it (float32). */
  getLearningRate() {
    return this._lr[0];
  }

  /** One update of every trainable parameter (skipped, with a warning, if the loss or a gradient is not finite). */
  async step(runOptions = undefined) {
    const state = this.module.state;
    const prepared = this.module.takePreparedUpdate();
    if (!this.module.lastLossFinite) return this._skip('the loss is not finite');
    this.prepareFeeds();
    const out = prepared?.isValidFor(this, state) ? prepared.update
      : await run(this._session, this._feeds, 'optimizer step', { runOptions });
    const finite = out[names.GRADIENTS_FINITE];
    if (finite && !finite.data[0]) return this._skip('the gradients are not finite');
    if (!finite && !state.grads.vector.every(Number.isFinite)) return this._skip('the gradients are not finite');
    state.params.vector.set(out[names.outputName(names.PARAMS)].data);
    for (const [s, storage] of this._states) storage.vector.set(out[names.outputName(s)].data);
    state.step += 1;
  }

  _skip(reason) {
    this.skippedSteps += 1;
    console.warn(`onnxtrain: optimizer step skipped: ${reason} (parameters unchanged)`);
  }

  async release() {
    await this._session.release();
  }
}
