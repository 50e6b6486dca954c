// onnxtrain for JavaScript: train onnxtrain's plain-ONNX artifacts on stock onnxruntime-web or onnxruntime-node.
//
//   import * as ort from 'onnxruntime-web';
//   import { bindEngine } from 'onnxtrain';
//   const { TrainingSession } = bindEngine(ort);      // or: import { TrainingSession } from 'onnxtrain/web'
//   const session = await TrainingSession.create({checkpointState, trainModel, evalModel, optimizerModel,
//     trainStepModel});                               // optional: one session run per step
//   const { loss } = await session.runTrainStep({input, labels});
//   await session.runOptimizerStep(); await session.lazyResetGrad();
//   const bytes = await session.saveCheckpoint();     // loads in Python: CheckpointState.load_checkpoint

import { TrainingSession } from './training-session.js';
import { Module } from './runtime/module.js';
import { Optimizer } from './runtime/optimizer.js';
import { CheckpointState } from './runtime/state.js';
import { TrainStep } from './runtime/train-step.js';

export { TrainingSession, Module, Optimizer, CheckpointState, TrainStep };
export { CheckpointData, tensorKey, splitTensorKey } from './checkpoint/data.js';
export { CheckpointError, loadCheckpoint, saveCheckpoint, readSafetensors, writeSafetensors, CHECKPOINT_FORMAT_VERSION } from './checkpoint/format.js';
export { importPeerCheckpoint, isPeerCheckpoint, readPeerCheckpoint } from './checkpoint/peer.js';
export { readMetadataProps } from './runtime/model-metadata.js';
export { InputError, ArtifactError, ExecutionError } from './errors.js';

/**
 * The API with an engine bound: TrainingSession.create, Module.create and Optimizer.create without the `ort` argument.
 * @param {object} ort `import * as ort from 'onnxruntime-web'` (or '-node')
 */
export function bindEngine(ort) {
  return {
    ort,
    CheckpointState,
    TrainingSession: {
      create: (trainingOptions, sessionOptions) => TrainingSession.createWith(ort, trainingOptions, sessionOptions),
    },
    Module: { create: (...args) => Module.create(ort, ...args) },
    Optimizer: { create: (...args) => Optimizer.create(ort, ...args) },
    TrainStep: { create: (...args) => TrainStep.create(ort, ...args) },
  };
}
