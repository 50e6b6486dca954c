// The API bound to onnxruntime-node: `import { TrainingSession } from 'onnxtrain/node'`.
import * as ort from 'onnxruntime-node';
import { bindEngine } from './index.js';

export * from './index.js';
export const { TrainingSession, Module, Optimizer, TrainStep } = bindEngine(ort);
export { ort };
