export * from 'onnxruntime-web';
export * from './index.js';
import type { BoundApi } from './index.js';
export declare const TrainingSession: BoundApi['TrainingSession'];
export declare const Module: BoundApi['Module'];
export declare const Optimizer: BoundApi['Optimizer'];
export declare const TrainStep: BoundApi['TrainStep'];
export * as ort from 'onnxruntime-web';
