// Type check only (npm run typecheck): the documented usage compiles against the .d.ts files.
import { TrainingSession, ort, CheckpointState, InputError } from '../../src/web.js';
import * as namespace from '../../src/node.js';

export async function example(): Promise<number> {
  const session = await TrainingSession.create({ checkpointState: 'checkpoint', trainModel: 'training_model.onnx',
    evalModel: 'eval_model.onnx', optimizerModel: 'optimizer_model.onnx', trainStepModel: 'train_step_model.onnx' });
  session.module.fuse = true;
  session.setLearningRate(1e-3);
  const input = new ort.Tensor('float32', new Float32Array(8), [1, 8]);
  const labels = new ort.Tensor('int64', new BigInt64Array(1), [1]);
  const { loss } = await session.runTrainStep({ input, labels });
  await session.runTrainStep({ input, labels }, ['loss'], { logSeverityLevel: 3 });
  await session.runOptimizerStep();
  await session.lazyResetGrad();
  const bytes: Uint8Array = await session.saveCheckpoint();
  const state = await CheckpointState.loadCheckpoint(bytes);
  await session.loadParametersBuffer(await session.getContiguousParameters(true));
  return Number(loss.data[0]) + state.step + (await session.getParametersSize(true));
}

// The former API's namespace import: the engine's names next to TrainingSession.
export async function formerNamespace(): Promise<boolean> {
  namespace.env.logLevel = 'warning';
  const session = await namespace.TrainingSession.create({ checkpointState: 'checkpoint', trainModel: 'training_model.onnx' });
  const input = new namespace.Tensor('float32', new Float32Array(8), [1, 8]);
  try {
    await session.runTrainStep({ input });
  } catch (error) {
    return error instanceof InputError;
  }
  return false;
}
