// Types of onnxtrain's JavaScript package. The engine type is structural: onnxruntime-web and onnxruntime-node
// both fit it (their `Tensor` and `InferenceSession`).

/** A checkpoint tensor: numpy dtype name, shape and the raw values (float16/bfloat16 as Uint16 bits). */
export interface TensorData {
  dtype: string;
  shape: number[];
  data: Float32Array | Float64Array | Int32Array | Int16Array | Int8Array | Uint32Array | Uint16Array | Uint8Array
    | BigInt64Array | BigUint64Array;
}

/** Checkpoint property values: bigint is an int (int64), number a float, string a str. */
export type Property = bigint | number | string;

/** Any onnxruntime JavaScript engine: `import * as ort from 'onnxruntime-web'` (or 'onnxruntime-node'). */
export interface Engine {
  Tensor: new (type: any, data: any, dims?: readonly number[]) => any;
  InferenceSession: { create(model: Uint8Array, options?: any): Promise<any> };
}

export type URIorBuffer = string | Uint8Array;
export type Feeds = Record<string, any>;
export type Outputs = Record<string, any>;
/** The outputs a step returns: their names, or {name: null | a Tensor that receives the values}. */
export type Fetches = readonly string[] | Record<string, any>;

export class CheckpointData {
  constructor(init?: Partial<Pick<CheckpointData, 'trainable' | 'frozen' | 'buffers' | 'optimizer' | 'step' | 'properties'>>);
  trainable: Map<string, TensorData>;
  frozen: Map<string, TensorData>;
  buffers: Map<string, TensorData>;
  optimizer: Map<string, Map<string, TensorData>>;
  step: number;
  properties: Map<string, Property>;
  /** Every tensor by tensor key (trainable/<name>, frozen/<name>, buffer/<name>, optimizer/<param>/<state>). */
  tensors(): Map<string, TensorData>;
  static fromTensors(tensors: Map<string, TensorData>, step?: number, properties?: Map<string, Property>): CheckpointData;
}

export class CheckpointError extends Error {}
/** A feed has an unknown name, the wrong dtype or shape, a batch that differs from the others', a bad label, or a
 * token id outside the table it indexes. */
export class InputError extends Error {}
/** A model is unreadable or does not belong with the others (e.g. an eval model of other artifacts). */
export class ArtifactError extends Error {}
/** The engine stopped while running a graph; names the step, the node's op type and what the engine said. */
export class ExecutionError extends Error {}
export const CHECKPOINT_FORMAT_VERSION: number;
export function tensorKey(kind: string, name: string, state?: string): string;
export function splitTensorKey(key: string): [string, string, string | undefined];
/** The bytes Python's onnxtrain.checkpoint.save_checkpoint writes for the same data. */
export function saveCheckpoint(data: CheckpointData, includeOptimizerState?: boolean): Uint8Array;
/** Read and verify (checksums, header vs metadata) a checkpoint; throws CheckpointError. */
export function loadCheckpoint(bytes: Uint8Array, where?: string): CheckpointData;
export function readSafetensors(bytes: Uint8Array, where?: string): { metadata: Record<string, string>; tensors: Map<string, TensorData> };
export function writeSafetensors(tensors: Map<string, TensorData>, metadata: Record<string, string>): Uint8Array;
/** Whether the bytes start an onnxruntime-training checkpoint (file identifier "ODTC"). */
export function isPeerCheckpoint(bytes: Uint8Array): boolean;
/** An onnxruntime-training checkpoint's parameters, AdamW moments (exp_avg / exp_avg_sq), step and properties. */
export function readPeerCheckpoint(bytes: Uint8Array, where?: string): CheckpointData;
/** The peer checkpoint's values in the layout of onnxtrain's checkpoint for the same forward model (as Python's
 * import_peer_checkpoint). */
export function importPeerCheckpoint(peerBytes: Uint8Array, template: Uint8Array | CheckpointData, where?: string): CheckpointData;
export function readMetadataProps(model: Uint8Array): Record<string, string>;

/** Parameters, gradients, buffers, optimizer state, step and properties (one owner, flat storage). */
export class CheckpointState {
  constructor(data: CheckpointData);
  step: number;
  properties: Map<string, Property>;
  frozen: Map<string, TensorData>;
  buffers: Map<string, TensorData>;
  static loadCheckpoint(source: URIorBuffer): Promise<CheckpointState>;
  /** The file's bytes; in Node.js also written atomically to `path`. */
  static saveCheckpoint(state: CheckpointState, path?: string, includeOptimizerState?: boolean): Promise<Uint8Array>;
  toBytes(includeOptimizerState?: boolean): Uint8Array;
  toData(includeOptimizerState?: boolean): CheckpointData;
  trainableNames(): string[];
  getParameter(name: string): Float32Array | TensorData['data'];
  setParameter(name: string, value: ArrayLike<number>): void;
  getGradient(name: string): Float32Array;
  /** Bumped by every write to the parameters from outside a training step (an update prepared before is stale). */
  readonly version: number;
  /** Set the trainable parameters (then, unless trainableOnly, the frozen ones) from one flat Float32Array. */
  setParameters(flat: Float32Array, trainableOnly?: boolean): void;
}

/** Runs the training and eval graphs (onnxruntime.training.api.Module). */
export class Module {
  static create(ort: Engine, trainModel: URIorBuffer, state: CheckpointState, evalModel?: URIorBuffer, sessionOptions?: object): Promise<Module>;
  readonly state: CheckpointState;
  training: boolean;
  nonfiniteSteps: number;
  /** Training calls that ran the train-step model (the rest ran the training graph alone). */
  fusedCalls: number;
  /** Run the train-step model when the loop allows it (false: always the two graphs; same results). */
  fuse: boolean;
  /** Use a train-step model for the training calls it applies to (null detaches it). */
  attachTrainStep(trainStep: TrainStep | null): void;
  train(mode?: boolean): this;
  eval(): this;
  lazyResetGrad(): void;
  /** The user inputs of the training graph (`training`, default: the current mode) or the eval graph. */
  inputNames(training?: boolean): string[];
  /** The outputs a step returns in training (`training`, default: the current mode) or eval mode. */
  outputNames(training?: boolean): string[];
  /** Whether the Module was created with an eval model. */
  readonly hasEvalModel: boolean;
  trainStep(feeds: Feeds, runOptions?: object): Promise<Outputs>;
  evalStep(feeds: Feeds, runOptions?: object): Promise<Outputs>;
  getParametersSize(trainableOnly?: boolean): number;
  getContiguousParameters(trainableOnly?: boolean): Float32Array;
  copyBufferToParameters(flat: Float32Array, trainableOnly?: boolean): void;
  release(): Promise<void>;
}

/** Runs the optimizer graph (onnxruntime.training.api.Optimizer). */
export class Optimizer {
  static create(ort: Engine, optimizerModel: URIorBuffer, module: Module, sessionOptions?: object): Promise<Optimizer>;
  readonly type: string;
  readonly stateNames: string[];
  skippedSteps: number;
  setLearningRate(learningRate: number): void;
  getLearningRate(): number;
  step(runOptions?: object): Promise<void>;
  release(): Promise<void>;
}

/**
 * The train-step model (train_step_model.onnx, written by Python's onnxtrain.artifacts.fused): the training
 * graph fused with the optimizer graph, one session run per training step.
 */
export class TrainStep {
  static create(ort: Engine, trainStepModel: URIorBuffer, module: Module, optimizer: Optimizer, sessionOptions?: object): Promise<TrainStep>;
  readonly prefix: string;
  /** The lazy_reset_grad value the graph assumes, or null if the flag is an input. */
  readonly reset: boolean | null;
  readonly optimizer: Optimizer;
  appliesTo(reset: boolean): boolean;
  release(): Promise<void>;
}

export interface TrainingSessionCreateOptions {
  checkpointState: URIorBuffer | CheckpointState;
  trainModel: URIorBuffer;
  evalModel?: URIorBuffer;
  optimizerModel?: URIorBuffer;
  /**
   * Not in the former API: train_step_model.onnx, written next to the artifacts by Python's
   * onnxtrain.artifacts.fused.write_train_step_model. Needs optimizerModel; a training step then runs one
   * session instead of two, with the same results.
   */
  trainStepModel?: URIorBuffer;
}

/** onnxruntime-web's former TrainingSession API, over plain InferenceSessions. */
export class TrainingSession {
  static createWith(ort: Engine, trainingOptions: TrainingSessionCreateOptions, sessionOptions?: object): Promise<TrainingSession>;
  readonly checkpointState: CheckpointState;
  readonly module: Module;
  readonly optimizer: Optimizer | null;
  /** fetches: output names, or {name: null | Tensor}; options: onnxruntime RunOptions, passed to the sessions. */
  runTrainStep(feeds: Feeds, fetchesOrOptions?: Fetches | object, options?: object): Promise<Outputs>;
  runOptimizerStep(options?: object): Promise<void>;
  runEvalStep(feeds: Feeds, fetchesOrOptions?: Fetches | object, options?: object): Promise<Outputs>;
  lazyResetGrad(): Promise<void>;
  getParametersSize(trainableOnly?: boolean): Promise<number>;
  getContiguousParameters(trainableOnly?: boolean): Promise<any>;
  /** float32 values: raw bytes (Uint8Array, Node.js Buffer, ArrayBuffer), a Float32Array or a float32 Tensor. */
  loadParametersBuffer(buffer: Uint8Array | ArrayBuffer | Float32Array | { type: 'float32'; data: Float32Array },
    trainableOnly?: boolean): Promise<void>;
  getLearningRate(): number;
  setLearningRate(learningRate: number): void;
  saveCheckpoint(path?: string, includeOptimizerState?: boolean): Promise<Uint8Array>;
  readonly trainingInputNames: readonly string[];
  readonly trainingOutputNames: readonly string[];
  readonly evalInputNames: readonly string[];
  readonly evalOutputNames: readonly string[];
  release(): Promise<void>;
}

export interface BoundApi {
  ort: Engine;
  CheckpointState: typeof CheckpointState;
  TrainingSession: { create(trainingOptions: TrainingSessionCreateOptions, sessionOptions?: object): Promise<TrainingSession> };
  Module: { create(trainModel: URIorBuffer, state: CheckpointState, evalModel?: URIorBuffer, sessionOptions?: object): Promise<Module> };
  Optimizer: { create(optimizerModel: URIorBuffer, module: Module, sessionOptions?: object): Promise<Optimizer> };
  TrainStep: { create(trainStepModel: URIorBuffer, module: Module, optimizer: Optimizer, sessionOptions?: object): Promise<TrainStep> };
}

/** The API with an engine bound (what 'onnxtrain/web' and 'onnxtrain/node' export). */
export function bindEngine(ort: Engine): BoundApi;
