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
import { ArtifactError, ExecutionError } from '../errors.js';
import { CLASS_LOSSES, TRAINING_METADATA, classLabelInputs, graphInputs, readMetadataProps, tableIndexInputs,
  trainingMetadata } from './model-metadata.js';
import { checkFeeds } from './inputs.js';
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
    const userNames = [...meta.user_inputs, ...meta.labels];
    const declared = new Map(graphInputs(trainBytes).map((m) => [m.name, m]));
    const inputs = { train: userNames.map((n) => declared.get(n) ?? { name: n, type: null, shape: null }), eval: [] };
    const labels = { train: classLabelInputs(trainBytes), eval: {} };
    const parameters = [...meta.trainable, ...meta.frozen];
    const tables = { train: tableIndexInputs(trainBytes, parameters), eval: {} };
    let evalBytes = null;
    if (evalModel !== undefined && evalModel !== null && evalModel !== '') {
      evalBytes = await readBytes(evalModel, 'eval model');
      inputs.eval = evalUserInputs(evalBytes, meta, inputs.train, state);
      labels.eval = classLabelInputs(evalBytes);
      labels.train = withEvalClassCounts(labels.train, labels.eval);
      tables.eval = tableIndexInputs(evalBytes, parameters);
    }
    const train = await openSession(ort, trainBytes, 'training model', sessionOptions);
    const evalSession = evalBytes && await openSession(ort, evalBytes, 'eval model', sessionOptions);
    return new Module(ort, state, meta, train, evalSession, labels, inputs, tables);
  }

  constructor(ort, state, meta, train, evalSession, labels = { train: {}, eval: {} }, inputs = undefined,
    tables = { train: {}, eval: {} }) {
    this.ort = ort;
    this.state = state;
    this.meta = meta;
    this._train = train;
    this._eval = evalSession;
    // the inputs each graph's class loss reads as labels, checked before a run (onnxruntime reads -1 as the
    // last class without an error)
    this._labels = labels;
    // the inputs each graph reads as row indices of a parameter or constant table (token ids), checked too
    // (onnxruntime reads -1 as the last row without an error)
    this._tables = tables;
    // each graph's declared user inputs ([{name, type, shape}]), the feeds are checked against before a run
    const unchecked = (n) => ({ name: n, type: null, shape: null });
    this._inputs = inputs ?? { train: [...meta.user_inputs, ...meta.labels].map(unchecked),
      eval: evalSession ? [...meta.user_inputs, ...meta.labels].map(unchecked) : [] };
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

  /** The user inputs (inputs, then labels) of the training graph (`training`) or the eval graph. */
  inputNames(training = this.training) {
    return this._inputs[training ? 'train' : 'eval'].map((m) => m.name);
  }

  /** The outputs a step returns in training (`training`: the loss, then the additional outputs) or eval mode. */
  outputNames(training = this.training) {
    if (training) return [this._train.outputNames[0], ...this.meta.additional_outputs];
    return this._eval ? [...this._eval.outputNames] : [];
  }

  /** Whether the Module was created with an eval model. */
  get hasEvalModel() {
    return Boolean(this._eval);
  }

  /**
   * One training step: forward, backward, gradients accumulated into the state (reset first after
   * lazyResetGrad()). Returns {loss, ...additional outputs} as engine tensors.
   */
  async trainStep(feeds, runOptions = undefined) {
    const state = this.state;
    this._resetFlag[0] = this._resetPending ? 1 : 0;
    const userFeeds = checkFeeds(this._inputs.train, feeds, 'training step', this._labels.train, this._tables.train);
    const how = { runOptions, hasLabels: Object.keys(this._labels.train).length > 0, sizeLimits: this.meta.size_limits };
    const fused = this._fusing() ? this._trainStep : null;
    this._prepared = null;
    let outputs;
    if (fused) {
      const inputs = { ...userFeeds, ...this._stateFeeds };
      if (fused.takesGradientBuffers) Object.assign(inputs, this._gradFeeds);
      if (fused.reset === null) Object.assign(inputs, this._resetFeed);
      const result = await fused.run(inputs, state, how);
      outputs = result.outputs;
      state.grads.vector.set(result.gradients.data);
      this._prepared = result.prepared;
      this.fusedCalls += 1;
    } else {
      outputs = await run(this._train, { ...userFeeds, ...this._stateFeeds, ...this._gradFeeds, ...this._resetFeed },
        'training step', how);
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
  async evalStep(feeds, runOptions = undefined) {
    if (!this._eval) throw new Error('this Module has no eval model: pass evalModel to create() to evaluate');
    const inputs = checkFeeds(this._inputs.eval, feeds, 'eval step', this._labels.eval, this._tables.eval);
    for (const name of this._eval.inputNames) if (!(name in inputs)) inputs[name] = this._stateFeeds[name];
    return run(this._eval, inputs, 'eval step', { runOptions, hasLabels: Object.keys(this._labels.eval).length > 0,
      sizeLimits: this.meta.size_limits });
  }

  /** Fuse when a train-step model applies and the last cycle had one training call per optimizer step (an
   * accumulation loop would throw the update away at every call but the last). */
  _fusing() {
    return this.fuse && this._trainStep !== null && this._callsSinceStep === 0 && this._callsLastCycle === 1
      && this._trainStep.appliesTo(this._resetPending);
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
    if (!(flat instanceof Float32Array)) throw new TypeError(`copyBufferToParameters expects a Float32Array, got ${flat?.constructor?.name ?? flat}`);
    if (flat.length !== expected) {
      throw new RangeError(`copyBufferToParameters expects ${expected} values (the ${trainableOnly ? 'trainable' : 'trainable and frozen'} `
        + `parameters), got ${flat.length}`);
    }
    this.state.setParameters(flat, trainableOnly);
  }

  async release() {
    await this._train.release();
    if (this._eval) await this._eval.release();
    if (this._trainStep) await this._trainStep.release();
  }
}

/**
 * The eval graph's user inputs, once it is known to belong to the training model's artifacts: the same
 * "onnxtrain.training" metadata (both models carry it) and, as Python's TrainingRun checks, the same user
 * inputs and no input the checkpoint does not have. Otherwise an ArtifactError.
 */
function evalUserInputs(evalBytes, meta, trainInputs, state) {
  const refuse = (reason) => new ArtifactError(`the eval model does not belong to the training model's artifacts: `
    + `${reason}; pass the eval_model.onnx written with this training_model.onnx`);
  const declared = graphInputs(evalBytes);
  const user = declared.slice(0, trainInputs.length);
  const known = (n) => state.params.has(n) || state.frozen.has(n) || state.buffers.has(n);
  const foreign = declared.slice(trainInputs.length).map((m) => m.name).filter((n) => !known(n));
  if (foreign.length) throw refuse(`it reads ${JSON.stringify(foreign.slice(0, 3))}, which the checkpoint and the training model do not have`);
  const names = (inputs) => JSON.stringify(inputs.map((m) => m.name));
  if (names(user) !== names(trainInputs)) throw refuse(`it takes the inputs ${names(user)}, the training model ${names(trainInputs)}`);
  // stricter than Python: an eval graph of other artifacts over a subset of the same parameters passes the
  // checks above (e.g. one that baked in parameters the training model trains)
  if (TRAINING_METADATA in readMetadataProps(evalBytes)) {
    const evalMeta = trainingMetadata(evalBytes, 'eval model');
    const differs = Object.keys({ ...meta, ...evalMeta }).filter((k) => JSON.stringify(meta[k]) !== JSON.stringify(evalMeta[k]));
    if (differs.length) throw refuse(`its "${TRAINING_METADATA}" metadata differs from the training model's in ${differs.join(', ')}`);
  }
  return user;
}

/**
 * The training graph's label inputs with the class count the eval graph declares where the training graph
 * leaves it open (with ignore_index, the training graph's scores may have no declared class dim); the eval
 * graph belongs to the same artifacts (evalUserInputs), so the count is the same.
 */
function withEvalClassCounts(train, evalLabels) {
  const filled = {};
  for (const [name, info] of Object.entries(train)) {
    const other = evalLabels[name];
    const same = other && other.loss === info.loss && other.ignoreIndex === info.ignoreIndex;
    filled[name] = info.classes === null && same ? { ...info, classes: other.classes } : info;
  }
  return filled;
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
    throw new ArtifactError(`the ${what} cannot be loaded: ${error.message ?? error}`);
  }
}

const NODE = /running (\w+) node(?:\. Name:'([^']*)')?/;
// onnxruntime's checks of the feeds against the graph's declared inputs, before any node runs
const SHAPE_MESSAGE = /invalid dimensions|Invalid rank|Unexpected input data type/i;
// the ops where an index out of range fails; elsewhere an index hint would mislead
const INDEX_READERS = new Set([...CLASS_LOSSES, 'OneHot', 'Gather', 'GatherElements', 'GatherND', 'ScatterElements',
  'ScatterND']);
// of those, the ones a class loss's decomposition reads the labels with
const LABEL_READERS = new Set(['OneHot', 'GatherElements']);

/**
 * session.run(); an engine failure is an ExecutionError naming the step, the op and the node, as Python's
 * runtime/engine_errors.py.
 * @param {{runOptions?: object, hasLabels?: boolean, sizeLimits?: object[]}} how onnxruntime RunOptions; whether
 *   the graph has class labels; the inputs' dimensions that index a table of fixed length (the training metadata's
 *   size_limits, written by generate_artifacts), which a failure explains first
 */
export async function run(session, feeds, what, { runOptions = undefined, hasLabels = false, sizeLimits = [] } = {}) {
  try {
    return await (runOptions === undefined ? session.run(feeds) : session.run(feeds, [...session.outputNames], runOptions));
  } catch (error) {
    const message = String(error?.message ?? error);
    const node = NODE.exec(message);
    const where = node ? ` in a ${node[1]} node${node[2] ? ` ('${node[2]}')` : ''}` : '';
    const explained = exceeded(sizeLimits ?? [], feeds) || hint(node?.[1], message, hasLabels);
    throw new ExecutionError(`the ${what} failed${where}: ${engineMessage(message)} (${explained})`);
  }
}

/** A sentence naming the first fed input longer than a table it indexes, or '' (as runtime/size_limits.py). */
export function exceeded(sizeLimits, feeds) {
  for (const { input, axis, limit, table } of sizeLimits) {
    const length = feeds[input]?.dims?.[axis];
    if (length !== undefined && Number(length) > limit) {
      return `input '${input}' is ${length} long on axis ${axis}, and the model indexes a table of ${limit} `
        + `('${table}') by that length: it takes at most ${limit} there, for a transformer its longest sequence`;
    }
  }
  return '';
}

/** The class-label hint only where labels are read, and an index hint where another index is. */
function hint(op, message, hasLabels) {
  const classes = 'check the input values, e.g. class labels must be below the number of classes';
  const shapes = "check the inputs' shapes and values";
  if (op === undefined) return hasLabels && !SHAPE_MESSAGE.test(message) ? classes : shapes;
  if (CLASS_LOSSES.has(op) || (hasLabels && LABEL_READERS.has(op))) return classes;
  return INDEX_READERS.has(op) ? 'check the input values, e.g. indices such as token ids must be below the size they index' : shapes;
}

/** What the engine said, on one line, without onnxruntime's status prefix and source locations (as Python's). */
function engineMessage(message) {
  let text = message.split(/\s+/).join(' ').trim();
  text = text.replace(/^\[ONNXRuntimeError\] : \d+ : \w+ : /, '');
  if (text.includes('Status Message:')) {
    text = text.split('Status Message:').slice(1).join('Status Message:').trim();
    text = text.replace(/^\S+\.(cc|h|cpp):\d+ (.*?\] )?/, '');
  }
  return text.slice(0, 300) || 'unknown engine error';
}
