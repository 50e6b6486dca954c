// The API bound to onnxruntime-node, with onnxruntime-node's own exports (Tensor, env, InferenceSession, ...), so
// code written for the former API's namespace import (`import * as ort from 'onnxruntime-web/training'`) runs
// with `import * as ort from 'onnxtrain/node'`: ort.TrainingSession.create, new ort.Tensor(...), ort.env.
import * as ort from 'onnxruntime-node';
import { bindEngine } from './index.js';

export * from 'onnxruntime-node';
export * from './index.js';
export const { TrainingSession, Module, Optimizer, TrainStep } = bindEngine(ort);
export { ort };
