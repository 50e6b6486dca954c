// TrainingSession: the API of onnxruntime-web's former training session (onnxruntime-common's
// training-session.ts, removed after 1.19), over plain InferenceSessions. Code written for it ports by
// changing the import to 'onnxtrain/web' or 'onnxtrain/node'. A thin layer over CheckpointState, Module
// and Optimizer, which hold all the state and logic.

import { CheckpointState } from './runtime/state.js';
import { Module } from './runtime/module.js';
import { Optimizer } from './runtime/optimizer.js';
import { TrainStep } from './runtime/train-step.js';

export class TrainingSession {
  /**
   * Load the artifacts (URIs or Uint8Arrays; the checkpoint may also be a CheckpointState). `trainStepModel`
   * (optional, not in the former API) is train_step_model.onnx, the training and optimizer graphs fused by
   * onnxtrain.artifacts.fused: a training step then runs one session instead of two, with the same results.
   * @param {object} ort the engine (bound for you by 'onnxtrain/web' and 'onnxtrain/node')
   * @param {{checkpointState: string | Uint8Array | CheckpointState, trainModel: string | Uint8Array,
   *          evalModel?: string | Uint8Array, optimizerModel?: string | Uint8Array,
   *          trainStepModel?: string | Uint8Array}} trainingOptions
   * @param {object} [sessionOptions] onnxruntime InferenceSession options for every session
   */
  static async createWith(ort, trainingOptions, sessionOptions = {}) {
    const { checkpointState, trainModel, evalModel, optimizerModel, trainStepModel } = trainingOptions;
    const given = (x) => x !== undefined && x !== null;
    if (given(trainStepModel) && !given(optimizerModel)) {
      throw new Error('trainStepModel needs the optimizerModel it was built from: pass both to create()');
    }
    const state = checkpointState instanceof CheckpointState ? checkpointState
      : await CheckpointState.loadCheckpoint(checkpointState);
    const module = await Module.create(ort, trainModel, state, evalModel, sessionOptions);
    const optimizer = given(optimizerModel) ? await Optimizer.create(ort, optimizerModel, module, sessionOptions) : null;
    if (given(trainStepModel)) module.attachTrainStep(await TrainStep.create(ort, trainStepModel, module, optimizer, sessionOptions));
    return new TrainingSession(ort, state, module, optimizer);
  }

  constructor(ort, state, module, optimizer) {
    this.ort = ort;
    /** The session's CheckpointState (parameters, optimizer state, step, properties). */
    this.checkpointState = state;
    this.module = module;
    this.optimizer = optimizer;
  }

  /** Forward and backward on one batch (feeds by input name); gradients accumulate. Returns loss and outputs. */
  async runTrainStep(feeds, _fetchesOrOptions = undefined, _options = undefined) {
    return this.module.train(true).trainStep(feeds);
  }

  /** Update the trainable parameters from the accumulated gradients. */
  async runOptimizerStep(_options = undefined) {
    if (!this.optimizer) throw new Error('this TrainingSession has no optimizer model: pass optimizerModel to create()');
    await this.optimizer.step();
  }

  /** Evaluate one batch with the eval model and the current parameters. */
  async runEvalStep(feeds, _fetchesOrOptions = undefined, _options = undefined) {
    return this.module.evalStep(feeds);
  }

  /** Reset the accumulated gradients before the next training step. */
  async lazyResetGrad() {
    this.module.lazyResetGrad();
  }

  async getParametersSize(trainableOnly = true) {
    return this.module.getParametersSize(trainableOnly);
  }

  /** The parameters as one float32 tensor of shape [n] (trainable first, then frozen unless trainableOnly). */
  async getContiguousParameters(trainableOnly = true) {
    const flat = this.module.getContiguousParameters(trainableOnly);
    return new this.ort.Tensor('float32', flat, [flat.length]);
  }

  /** Set the parameters from float32 values given as raw bytes (a Uint8Array), or as a Float32Array. */
  async loadParametersBuffer(buffer, trainableOnly = true) {
    let flat = buffer;
    if (!(buffer instanceof Float32Array)) {
      if (buffer.byteLength % 4 !== 0) throw new RangeError(`the parameter buffer has ${buffer.byteLength} bytes, not a whole number of float32 values`);
      flat = new Float32Array(buffer.slice().buffer, 0, buffer.byteLength / 4); // slice: aligned copy
    }
    this.module.copyBufferToParameters(flat, trainableOnly);
  }

  getLearningRate() {
    if (!this.optimizer) throw new Error('this TrainingSession has no optimizer model');
    return this.optimizer.getLearningRate();
  }

  setLearningRate(learningRate) {
    if (!this.optimizer) throw new Error('this TrainingSession has no optimizer model');
    this.optimizer.setLearningRate(learningRate);
  }

  /** The checkpoint file's bytes (loads in Python's CheckpointState.load_checkpoint); Node.js: also written to `path`. */
  async saveCheckpoint(path = undefined, includeOptimizerState = true) {
    return CheckpointState.saveCheckpoint(this.checkpointState, path, includeOptimizerState);
  }

  get trainingInputNames() {
    return this.module.inputNames();
  }

  get trainingOutputNames() {
    return [this.module._train.outputNames[0], ...this.module.meta.additional_outputs];
  }

  get evalInputNames() {
    return this.module._eval ? this.module.inputNames() : [];
  }

  get evalOutputNames() {
    return this.module._eval ? [...this.module._eval.outputNames] : [];
  }

  async release() {
    await this.module.release();
    if (this.optimizer) await this.optimizer.release();
  }
}
