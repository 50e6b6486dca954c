// Type check only (npm run typecheck): the documented usage compiles against the .d.ts files.
import { TrainingSession, ort, CheckpointState } from '../../src/web.js';

export async function example(): Promise<number> {
  const session = await TrainingSession.create({ checkpointState: 'checkpoint', trainModel: 'training_model.onnx',
    evalModel: 'eval_model.onnx', optimizerModel: 'optimizer_model.onnx', trainStepModel: 'train_step_model.onnx' });
  session.module.fuse = true;
  session.setLearningRate(1e-3);
  const input = new ort.Tensor('float32', new Float32Array(8), [1, 8]);
  const labels = new ort.Tensor('int64', new BigInt64Array(1), [1]);
  const { loss } = await session.runTrainStep({ input, labels });
  await session.runOptimizerStep();
  await session.lazyResetGrad();
  const bytes: Uint8Array = await session.saveCheckpoint();
  const state = await CheckpointState.loadCheckpoint(bytes);
  return Number(loss.data[0]) + state.step + (await session.getParametersSize(true));
}
