// TrainingSession: the API of onnxruntime-web's former training session (onnxruntime-common's
// training-session.ts, removed after 1.19), over plain InferenceSessions. Code written for it ports by
// changing the import to 'onnxtrain/web' or 'onnxtrain/node'. A thin layer over CheckpointState, Module
// and Optimizer, which hold all the state and logic; it adds the former API's argument forms (fetches,
// options) and errors, and runs a session's calls one after the other.

import { CheckpointState } from './runtime/state.js';
import { Module } from './runtime/module.js';
import { Optimizer } from './runtime/optimizer.js';
import { TrainStep } from './runtime/train-step.js';

const RELEASED = 'the TrainingSession was released: create a new one to train or evaluate again';

export class TrainingSession {
  #queue = Promise.resolve();
  #released = null;

  /**
   * Load the artifacts (URIs or Uint8Arrays; the checkpoint may also be a CheckpointState). `trainStepModel`
   * (optional, not in the former API) is train_step_model.onnx, the training and optimizer graphs fused by
   * onnxtrain.artifacts.fused: a training step then runs one session instead of two, with the same results.
   * An optional model given as '' (or null) is not given, as in the former API.
   * @param {object} ort the engine (bound for you by 'onnxtrain/web' and 'onnxtrain/node')
   * @param {{checkpointState: string | Uint8Array | CheckpointState, trainModel: string | Uint8Array,
   *          evalModel?: string | Uint8Array, optimizerModel?: string | Uint8Array,
   *          trainStepModel?: string | Uint8Array}} trainingOptions
   * @param {object} [sessionOptions] onnxruntime InferenceSession options for every session
   */
  static async createWith(ort, trainingOptions, sessionOptions = {}) {
    const { checkpointState, trainModel } = trainingOptions;
    const optional = (x) => (x === '' || x === null ? undefined : x);
    const evalModel = optional(trainingOptions.evalModel);
    const optimizerModel = optional(trainingOptions.optimizerModel);
    const trainStepModel = optional(trainingOptions.trainStepModel);
    if (trainStepModel !== undefined && optimizerModel === undefined) {
      throw new Error('trainStepModel needs the optimizerModel it was built from: pass both to create()');
    }
    const state = checkpointState instanceof CheckpointState ? checkpointState
      : await CheckpointState.loadCheckpoint(checkpointState);
    const module = await Module.create(ort, trainModel, state, evalModel, sessionOptions);
    const optimizer = optimizerModel !== undefined ? await Optimizer.create(ort, optimizerModel, module, sessionOptions) : null;
    if (trainStepModel !== undefined) module.attachTrainStep(await TrainStep.create(ort, trainStepModel, module, optimizer, sessionOptions));
    return new TrainingSession(ort, state, module, optimizer);
  }

  constructor(ort, state, module, optimizer) {
    this.ort = ort;
    /** The session's CheckpointState (parameters, optimizer state, step, properties). */
    this.checkpointState = state;
    this.module = module;
    this.optimizer = optimizer;
  }

  /**
   * Forward and backward on one batch (feeds by input name); gradients accumulate. Returns loss and outputs,
   * or the outputs `fetches` names (['loss'] or {loss: null}); `options` are onnxruntime RunOptions.
   */
  async runTrainStep(feeds, fetchesOrOptions = undefined, options = undefined) {
    return this.#serial(async () => {
      const [fetches, runOptions] = runStepArguments(feeds, this.trainingOutputNames, fetchesOrOptions, options);
      return selectOutputs(await this.module.train(true).trainStep(feeds, runOptions), fetches);
    });
  }

  /** Update the trainable parameters from the accumulated gradients. */
  async runOptimizerStep(options = undefined) {
    return this.#serial(async () => {
      if (!this.optimizer) throw new Error('this TrainingSession has no optimizer model: pass optimizerModel to create()');
      await this.optimizer.step(checkOptions(options));
    });
  }

  /** Evaluate one batch with the eval model and the current parameters (fetches and options as runTrainStep). */
  async runEvalStep(feeds, fetchesOrOptions = undefined, options = undefined) {
    return this.#serial(async () => {
      if (!this.module.hasEvalModel) throw new Error('this TrainingSession has no eval model: pass evalModel to create() to evaluate');
      const [fetches, runOptions] = runStepArguments(feeds, this.evalOutputNames, fetchesOrOptions, options);
      return selectOutputs(await this.module.evalStep(feeds, runOptions), fetches);
    });
  }

  /** Reset the accumulated gradients before the next training step. */
  async lazyResetGrad() {
    return this.#serial(async () => this.module.lazyResetGrad());
  }

  async getParametersSize(trainableOnly = true) {
    return this.#serial(async () => this.module.getParametersSize(trainableOnly));
  }

  /** The parameters as one float32 tensor of shape [n] (trainable first, then frozen unless trainableOnly). */
  async getContiguousParameters(trainableOnly = true) {
    return this.#serial(async () => {
      const flat = this.module.getContiguousParameters(trainableOnly);
      return new this.ort.Tensor('float32', flat, [flat.length]);
    });
  }

  /**
   * Set the parameters (in getContiguousParameters order) from float32 values: raw bytes (a Uint8Array, a
   * Node.js Buffer, an ArrayBuffer), a Float32Array or a float32 Tensor.
   */
  async loadParametersBuffer(buffer, trainableOnly = true) {
    return this.#serial(async () => {
      const values = float32Values(buffer);
      const expected = this.module.getParametersSize(trainableOnly);
      if (values.length !== expected) {
        throw new RangeError(`loadParametersBuffer expects ${expected} float32 values (${4 * expected} bytes; `
          + `getParametersSize(${trainableOnly})), got ${values.length} (${4 * values.length} bytes)`);
      }
      this.module.copyBufferToParameters(values, trainableOnly);
    });
  }

  getLearningRate() {
    this.#checkOpen();
    if (!this.optimizer) throw new Error('this TrainingSession has no optimizer model');
    return this.optimizer.getLearningRate();
  }

  /** Takes effect at once, for the calls still waiting their turn too (see #serial). */
  setLearningRate(learningRate) {
    this.#checkOpen();
    if (!this.optimizer) throw new Error('this TrainingSession has no optimizer model');
    this.optimizer.setLearningRate(learningRate);
  }

  /** The checkpoint file's bytes (loads in Python's CheckpointState.load_checkpoint); Node.js: also written to `path`. */
  async saveCheckpoint(path = undefined, includeOptimizerState = true) {
    return this.#serial(async () => CheckpointState.saveCheckpoint(this.checkpointState, path, includeOptimizerState));
  }

  get trainingInputNames() {
    return this.module.inputNames(true);
  }

  get trainingOutputNames() {
    return this.module.outputNames(true);
  }

  get evalInputNames() {
    return this.module.hasEvalModel ? this.module.inputNames(false) : [];
  }

  get evalOutputNames() {
    return this.module.outputNames(false);
  }

  /** Release the sessions once the calls made before have run; later calls throw; a second release is a no-op. */
  async release() {
    if (this.#released) return this.#released;
    this.#released = this.#serial(async () => {
      await this.module.release();
      if (this.optimizer) await this.optimizer.release();
    });
    return this.#released;
  }

  /**
   * Run `call` once every call made before it has finished, as if each had been awaited: the calls share the
   * state (two training steps in Promise.all would both start a reset accumulation).
   */
  #serial(call) {
    if (this.#released) return Promise.reject(new Error(RELEASED));
    const result = this.#queue.then(call);
    this.#queue = result.catch(() => {});
    return result;
  }

  #checkOpen() {
    if (this.#released) throw new Error(RELEASED);
  }
}

const isTensor = (value) => typeof value === 'object' && value !== null && typeof value.type === 'string'
  && Array.isArray(value.dims);
const kind = (value) => (value === null ? 'null' : value?.constructor?.name ?? typeof value);

/**
 * The fetches ({name: null | Tensor}, or null for every output) and RunOptions of runTrainStep / runEvalStep's
 * arguments, with the former API's errors (onnxruntime-common 1.19, training-session-impl.ts:
 * typeNarrowingForRunStep). An object naming an output with null or a Tensor is fetches, any other options.
 */
function runStepArguments(feeds, outputNames, arg1, arg2) {
  if (typeof feeds !== 'object' || feeds === null || isTensor(feeds) || Array.isArray(feeds)) {
    throw new TypeError("'feeds' must be an object that use input names as keys and OnnxValue as corresponding "
      + `values, got ${kind(feeds)}`);
  }
  if (arg1 === undefined) return [null, undefined];
  if (typeof arg1 !== 'object') throw new TypeError("Unexpected argument[1]: must be 'fetches' or 'options'.");
  if (arg1 === null) throw new TypeError('Unexpected argument[1]: cannot be null.');
  if (isTensor(arg1)) throw new TypeError("'fetches' cannot be a Tensor");
  let fetches;
  if (Array.isArray(arg1)) {
    if (arg1.length === 0) throw new TypeError("'fetches' cannot be an empty array.");
    for (const name of arg1) {
      if (typeof name !== 'string') throw new TypeError("'fetches' must be a string array or an object.");
      if (!outputNames.includes(name)) {
        throw new RangeError(`'fetches' contains invalid output name: ${name}. The outputs are ${outputNames.join(', ')}.`);
      }
    }
    fetches = Object.fromEntries(arg1.map((name) => [name, null]));
  } else {
    const named = outputNames.filter((n) => Object.hasOwn(arg1, n) && (arg1[n] === null || isTensor(arg1[n])));
    if (named.length === 0) return [null, arg1];
    fetches = Object.fromEntries(named.map((n) => [n, arg1[n]]));
  }
  return [fetches, checkOptions(arg2)];
}

function checkOptions(options) {
  if (options !== undefined && (typeof options !== 'object' || options === null)) {
    throw new TypeError(`'options' must be an object (onnxruntime RunOptions), got ${kind(options)}`);
  }
  return options;
}

/** The outputs `fetches` names; a Tensor given for one receives its values (as a pre-allocated output). */
function selectOutputs(outputs, fetches) {
  if (fetches === null) return outputs;
  const selected = {};
  for (const [name, target] of Object.entries(fetches)) {
    const value = outputs[name];
    if (target === null) {
      selected[name] = value;
      continue;
    }
    if (target.type !== value.type || target.dims.join() !== value.dims.join()) {
      throw new TypeError(`'fetches': the tensor given for output '${name}' is ${target.type}[${target.dims.join(', ')}], `
        + `the output is ${value.type}[${value.dims.join(', ')}]`);
    }
    target.data.set(value.data);
    selected[name] = target;
  }
  return selected;
}

/** float32 values from raw bytes (a Uint8Array, Buffer included, or an ArrayBuffer), a Float32Array or a Tensor. */
function float32Values(buffer) {
  if (buffer instanceof Float32Array) return buffer;
  if (isTensor(buffer) && buffer.type === 'float32') return buffer.data;
  const bytes = buffer instanceof ArrayBuffer ? new Uint8Array(buffer) : buffer instanceof Uint8Array ? buffer : null;
  if (bytes === null) {
    throw new TypeError(`loadParametersBuffer expects float32 values as raw bytes (a Uint8Array) or a Float32Array, got ${isTensor(buffer) ? `a ${buffer.type} Tensor` : kind(buffer)}`);
  }
  if (bytes.byteLength % 4 !== 0) {
    throw new RangeError(`loadParametersBuffer: the buffer has ${bytes.byteLength} bytes, not a whole number of float32 values (4 bytes each)`);
  }
  // a copy in its own buffer: the bytes may sit at any offset of a larger one (a Node.js Buffer in its pool)
  return new Float32Array(new Uint8Array(bytes).buffer);
}
