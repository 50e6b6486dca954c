// The API bound to onnxruntime-web: `import { TrainingSession } from 'onnxtrain/web'`.
import * as ort from 'onnxruntime-web';
import { bindEngine } from './index.js';

export * from './index.js';
export const { TrainingSession, Module, Optimizer, TrainStep } = bindEngine(ort);
export { ort };
