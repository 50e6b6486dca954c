// TrainStep: the train-step model (train_step_model.onnx, written in Python by onnxtrain.artifacts.fused), the
// training graph fused with the optimizer graph, so that a training step is one session run, as Python's
// runtime does (onnxtrain/runtime/run.py). The graph is built by Python's passes, never here.
//
// A fused run computes the optimizer's update in advance; the Module keeps it as a PreparedUpdate and the
// Optimizer commits it only if nothing it was computed from changed in between (see Optimizer.step).

import * as names from '../conventions.js';
import { trainStepMetadata, trainingMetadata, optimizerMetadata } from './model-metadata.js';
import { readBytes } from './io.js';
import { openSession, run } from './module.js';

export class TrainStep {
  /**
   * @param {object} ort the engine
   * @param {string | Uint8Array} trainStepModel the train-step model written next to the artifacts
   * @param {import('./module.js').Module} module
   * @param {import('./optimizer.js').Optimizer} optimizer the optimizer whose update the fused graph computes
   * @param {object} [sessionOptions]
   */
  static async create(ort, trainStepModel, module, optimizer, sessionOptions = {}) {
    const bytes = await readBytes(trainStepModel, 'train-step model');
    const meta = trainStepMetadata(bytes);
    const built = [[trainingMetadata(bytes, 'train-step model'), module.meta, 'training'],
      [optimizerMetadata(bytes), optimizer.meta, 'optimizer']];
    for (const [got, expected, kind] of built) {
      if (JSON.stringify(got) !== JSON.stringify(expected)) {
        throw new Error(`the train-step model was built from another ${kind} model than the one given; write it `
          + 'again next to these artifacts (onnxtrain.artifacts.fused.write_train_step_model)');
      }
    }
    return new TrainStep(meta, optimizer, await openSession(ort, bytes, 'train-step model', sessionOptions));
  }

  constructor(meta, optimizer, session) {
    this.prefix = meta.prefix;
    /** The lazy_reset_grad value the graph assumes, or null if the flag is an input. */
    this.reset = meta.reset;
    this.optimizer = optimizer;
    this._session = session;
    this.takesGradientBuffers = session.inputNames.some((n) => n.endsWith('_grad.accumulation.buffer'));
    this._optimizerFeeds = Object.fromEntries(
      Object.entries(optimizer.graphFeeds()).map(([name, tensor]) => [this.name(name), tensor]));
  }

  /** The fused graph's name for an optimizer input or output. */
  name(optimizerName) {
    return this.prefix + optimizerName;
  }

  /** Whether this graph computes a training call with this reset flag. */
  appliesTo(reset) {
    return this.reset === null || this.reset === reset;
  }

  /**
   * One fused run: `inputs` are the training graph's (user feeds, state, gradient buffers and flag as needed),
   * `state` the CheckpointState they come from, `how` run()'s options. Returns the outputs, the flat gradient and
   * the update prepared.
   */
  async run(inputs, state, how = {}) {
    this.optimizer.prepareFeeds();
    const feeds = { ...inputs, ...this._optimizerFeeds };
    const outputs = await run(this._session, feeds, 'training step (fused with the optimizer)', how);
    const update = {};
    for (const name of this.optimizer.outputNames()) update[name] = outputs[this.name(name)];
    return { outputs, gradients: outputs[this.name(names.GRADIENTS)],
      prepared: new PreparedUpdate(this.optimizer, state, update) };
  }

  async release() {
    await this._session.release();
  }
}

/** An update a fused training call computed in advance, and what it was computed from. */
export class PreparedUpdate {
  constructor(optimizer, state, update) {
    this.optimizer = optimizer;
    this.learningRate = optimizer.getLearningRate();
    this.version = state.version;
    this.step = state.step;
    /** optimizer output name (params.out, <state>.out, gradients_finite) -> tensor */
    this.update = update;
  }

  /** Still the update `optimizer` would compute now: same optimizer, learning rate, parameters and step. */
  isValidFor(optimizer, state) {
    return optimizer === this.optimizer && optimizer.getLearningRate() === this.learningRate
      && state.version === this.version && state.step === this.step;
  }
}
