// Module (onnxtrain/runtime/module.py): runs the training and eval graphs on a CheckpointState with any
// onnxruntime JavaScript engine (onnxruntime-web or onnxruntime-node, passed in as `ort`).
//
// State is bound once: the engine tensors fed for parameters, gradients and buffers are created once over
// the CheckpointState's flat storage, so each step only copies the graph's outputs back into it.
//
// With a train-step model attached (attachTrainStep), a training call runs the training graph fused with the
// optimizer graph when the loop allows it, as Python's TrainingRun does: an optimizer attached, one training
// call per optimizer step in the last cycle, and a graph built for the current reset flag. The update it
// computes waits in a PreparedUpdate until Optimizer.step() commits it (or finds it stale). Otherwise the
// training graph runs alone and the optimizer graph at step().

import * as names from '../conventions.js';
import { CLASS_LOSSES, classLabelInputs, trainingMetadata } from './model-metadata.js';
import { readBytes } from './io.js';

export class Module {
  /**
   * @param {object} ort the engine: `import * as ort from 'onnxruntime-web'` or `'onnxruntime-node'`
   * @param {string | Uint8Array} trainModel the training model written by generate_artifacts
   * @param {import('./state.js').CheckpointState} state
   * @param {string | Uint8Array} [evalModel] the eval model (needed for evaluation)
   * @param {object} [sessionOptions] onnxruntime InferenceSession options
   */
  static async create(ort, trainModel, state, evalModel = undefined, sessionOptions = {}) {
    const trainBytes = await readBytes(trainModel, 'training model');
    const meta = trainingMetadata(trainBytes, 'training model');
    checkStateMatches(meta, state);
    const train = await openSession(ort, trainBytes, 'training model', sessionOptions);
    const labels = { train: classLabelInputs(trainBytes), eval: {} };
    let evalSession = null;
    if (evalModel !== undefined && evalModel !== null) {
      const evalBytes = await readBytes(evalModel, 'eval model');
      evalSession = await openSession(ort, evalBytes, 'eval model', sessionOptions);
      labels.eval = classLabelInputs(evalBytes);
    }
    return new Module(ort, state, meta, train, evalSession, labels);
  }

  constructor(ort, state, meta, train, evalSession, labels = { train: {}, eval: {} }) {
    this.ort = ort;
    this.state = state;
    this.meta = meta;
    this._train = train;
    this._eval = evalSession;
    // the inputs each graph's class loss reads as labels, checked before a run (onnxruntime reads -1 as the
    // last class without an error)
    this._labels = labels;
    this.training = true;
    this.nonfiniteSteps = 0;
    /** Training calls that ran the train-step model (the rest ran the training graph alone). */
    this.fusedCalls = 0;
    this.lastLossFinite = true;
    this._resetPending = true;
    const tensor = (data, shape) => new ort.Tensor('float32', data, shape);
    const ortTensor = (t) => new ort.Tensor(t.dtype, t.data, t.shape);
    // Engine tensors over the live state (see the module comment).
    this._stateFeeds = {};
    for (const [name, shape] of state.params.layout) this._stateFeeds[name] = tensor(state.params.views.get(name), shape);
    for (const [name, t] of state.frozen) this._stateFeeds[name] = ortTensor(t);
    for (const [name, t] of state.buffers) this._stateFeeds[name] = ortTensor(t);
    this._gradFeeds = {};
    for (const [name, shape] of state.grads.layout) {
      this._gradFeeds[names.gradBufferName(name)] = tensor(state.grads.views.get(name), shape);
    }
    this._resetFlag = new Uint8Array(1);
    this._resetFeed = { [names.LAZY_RESET_GRAD]: new ort.Tensor('bool', this._resetFlag, []) };
    this._gradOutputs = state.grads.layout.map(([name]) => [names.gradOutputName(name), state.grads.views.get(name)]);
    /** Run the train-step model when the loop allows it (false: always the two graphs; same results). */
    this.fuse = true;
    this._trainStep = null;
    this._prepared = null;
    this._callsSinceStep = 0;
    this._callsLastCycle = 1;
  }

  /**
   * Use a train-step model (a TrainStep) for the training calls it applies to; its update is the one of
   * `trainStep.optimizer`. Null detaches it.
   * @param {import('./train-step.js').TrainStep | null} trainStep
   */
  attachTrainStep(trainStep) {
    this._trainStep = trainStep;
    this._prepared = null;
  }

  /** The update the last training call computed in advance (or null), and the start of a new cycle. */
  takePreparedUpdate() {
    const prepared = this._prepared;
    this._prepared = null;
    this._callsLastCycle = this._callsSinceStep;
    this._callsSinceStep = 0;
    return prepared;
  }

  /** Switch to training (true) or eval (false) mode; returns this. */
  train(mode = true) {
    this.training = mode;
    return this;
  }

  eval() {
    return this.train(false);
  }

  /** Start the gradient accumulation afresh at the next training step. */
  lazyResetGrad() {
    this._resetPending = true;
  }

  /** The user inputs (inputs and labels) of the current mode's graph. */
  inputNames() {
    return [...this.meta.user_inputs, ...this.meta.labels];
  }

  /** The outputs a step returns: the loss, then the additional outputs. */
  outputNames() {
    if (this.training) return [this._train.outputNames[0], ...this.meta.additional_outputs];
    return this._eval ? [...this._eval.outputNames] : [];
  }

  /**
   * One training step: forward, backward, gradients accumulated into the state (reset first after
   * lazyResetGrad()). Returns {loss, ...additional outputs} as engine tensors.
   */
  async trainStep(feeds) {
    const state = this.state;
    this._resetFlag[0] = this._resetPending ? 1 : 0;
    const userFeeds = this._userFeeds(feeds, 'training step', this._labels.train);
    const fused = this._fusing() ? this._trainStep : null;
    this._prepared = null;
    let outputs;
    if (fused) {
      const inputs = { ...userFeeds, ...this._stateFeeds };
      if (fused.takesGradientBuffers) Object.assign(inputs, this._gradFeeds);
      if (fused.reset === null) Object.assign(inputs, this._resetFeed);
      const result = await fused.run(inputs, state);
      outputs = result.outputs;
      state.grads.vector.set(result.gradients.data);
      this._prepared = result.prepared;
      this.fusedCalls += 1;
    } else {
      outputs = await run(this._train, { ...userFeeds, ...this._stateFeeds, ...this._gradFeeds, ...this._resetFeed },
        'training step');
      for (const [output, view] of this._gradOutputs) view.set(outputs[output].data);
    }
    this._callsSinceStep += 1;
    this._resetPending = false;
    const loss = outputs[this._train.outputNames[0]];
    this.lastLossFinite = Number.isFinite(Number(loss.data[0]));
    // a batch whose loss is not finite leaves the running statistics as they were, as in Python
    if (this.lastLossFinite) {
      for (const [name, t] of state.buffers) t.data.set(outputs[names.bufferOutputName(name)].data);
    }
    if (!this.lastLossFinite) {
      this.nonfiniteSteps += 1;
      console.warn(`onnxtrain: the training loss is ${loss.data[0]} (not finite); the next optimizer step will be skipped`);
    }
    const result = {};
    for (const name of this.outputNames()) result[name] = outputs[name];
    return result;
  }

  /** One evaluation with the eval graph and the current parameters; returns its outputs (loss first). */
  async evalStep(feeds) {
    if (!this._eval) throw new Error('this Module has no eval model: pass evalModel to create() to evaluate');
    const inputs = this._userFeeds(feeds, 'eval step', this._labels.eval);
    for (const name of this._eval.inputNames) if (!(name in inputs)) inputs[name] = this._stateFeeds[name];
    return run(this._eval, inputs, 'eval step');
  }

  /** Fuse when a train-step model applies and the last cycle had one training call per optimizer step (an
   * accumulation loop would throw the update away at every call but the last). */
  _fusing() {
    return this.fuse && this._trainStep !== null && this._callsSinceStep === 0 && this._callsLastCycle === 1
      && this._trainStep.appliesTo(this._resetPending);
  }

  _userFeeds(feeds, what, labels) {
    const expected = this.inputNames();
    const missing = expected.filter((n) => !(n in feeds));
    if (missing.length) throw new Error(`${what}: missing inputs ${missing.join(', ')} (expected ${expected.join(', ')})`);
    for (const [name, range] of Object.entries(labels)) if (name in feeds) checkLabels(name, feeds[name], range, what);
    return Object.fromEntries(expected.map((n) => [n, feeds[n]]));
  }

  /** Number of parameter elements (trainable only, or all). */
  getParametersSize(trainableOnly = true) {
    let size = this.state.params.size;
    if (!trainableOnly) for (const t of this.state.frozen.values()) size += t.data.length;
    return size;
  }

  /** All parameters (trainable, then frozen unless trainableOnly) as one new Float32Array. */
  getContiguousParameters(trainableOnly = true) {
    const flat = new Float32Array(this.getParametersSize(trainableOnly));
    flat.set(this.state.params.vector);
    if (!trainableOnly) {
      let offset = this.state.params.size;
      for (const t of this.state.frozen.values()) {
        flat.set(t.data, offset);
        offset += t.data.length;
      }
    }
    return flat;
  }

  /** Set the parameters from one flat Float32Array, in getContiguousParameters order. */
  copyBufferToParameters(flat, trainableOnly = true) {
    const expected = this.getParametersSize(trainableOnly);
    if (!(flat instanceof Float32Array) || flat.length !== expected) {
      throw new RangeError(`expected a Float32Array of ${expected} parameters, got ${flat?.constructor?.name} of ${flat?.length}`);
    }
    this.state.setParameters(flat, trainableOnly);
  }

  async release() {
    await this._train.release();
    if (this._eval) await this._eval.release();
    if (this._trainStep) await this._trainStep.release();
  }
}

/** A RangeError unless every label of `tensor` is a class index (below the declared class count) or the loss's
 * ignore_index; as the Python runtime's runtime/inputs.py. */
export function checkLabels(name, tensor, { loss, classes, ignoreIndex }, what) {
  const data = tensor?.data;
  if (!data || !(data instanceof BigInt64Array || data instanceof Int32Array)) return;
  const high = classes === null ? null : BigInt(classes);
  for (let k = 0; k < data.length; k++) {
    const value = BigInt(data[k]);
    if ((value >= 0n && (high === null || value < high)) || value === ignoreIndex) continue;
    const index = [];
    for (let rest = k, d = tensor.dims.length - 1; d >= 0; d--) {
      index.unshift(rest % tensor.dims[d]);
      rest = Math.floor(rest / tensor.dims[d]);
    }
    const allowed = high === null ? 'from 0 to the number of classes - 1' : `0 to ${high - 1n}`;
    const ignore = ignoreIndex !== null ? ` or equal ignore_index=${ignoreIndex}`
      : value < 0n ? "; the loss has no ignore_index (torch's default of -100 is not implied: set it on the loss block)" : '';
    throw new RangeError(`${what}: input '${name}' holds the class label ${value} at index [${index.join(', ')}]; `
      + `${loss} labels must be class indices, ${allowed}${ignore}`);
  }
}

function checkStateMatches(meta, state) {
  const have = state.trainableNames();
  if (have.join('\u0000') !== meta.trainable.join('\u0000')) {
    throw new Error(`the checkpoint does not match the training model: trainable parameters ${have.slice(0, 3)}... vs ${meta.trainable.slice(0, 3)}...`);
  }
  for (const [kind, present] of [['frozen', state.frozen], ['buffers', state.buffers]]) {
    const missing = meta[kind].filter((n) => !present.has(n));
    if (missing.length) throw new Error(`the checkpoint does not match the training model: ${kind} ${missing.slice(0, 5)} missing`);
  }
}

/** An InferenceSession for an artifact; an engine that rejects it gives an error naming the artifact. */
export async function openSession(ort, bytes, what, sessionOptions) {
  try {
    return await ort.InferenceSession.create(bytes, sessionOptions);
  } catch (error) {
    throw new Error(`the ${what} cannot be loaded: ${error.message ?? error}`);
  }
}

// the ops where a class label (or another index) out of range fails; elsewhere that hint would mislead
const INDEX_READERS = new Set([...CLASS_LOSSES, 'OneHot', 'Gather', 'GatherElements', 'GatherND', 'ScatterElements',
  'ScatterND']);

/** session.run(); an engine failure names the step, the op and the node (as the Python runtime's). */
export async function run(session, feeds, what) {
  try {
    return await session.run(feeds);
  } catch (error) {
    const message = String(error.message ?? error);
    const node = /running (\w+) node(?:\. Name:'([^']*)')?/.exec(message);
    const where = node ? ` in a ${node[1]} node${node[2] ? ` ('${node[2]}')` : ''}` : '';
    const hint = !node || INDEX_READERS.has(node[1])
      ? 'check the input values, e.g. class labels must be below the number of classes'
      : "check the inputs' shapes and values";
    throw new Error(`the ${what} failed${where}: ${message} (${hint})`);
  }
}
