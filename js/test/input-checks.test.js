// Inputs checked before a run, as in Python. Class labels (runtime/inputs.py): onnxruntime reads -1 as the last
// class without an error, so a negative label, or one past the class count the graphs declare, is refused with
// the input, the label and its position named.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import * as ortNode from 'onnxruntime-node';
import { bindEngine } from '../src/index.js';
import { classLabelInputs } from '../src/runtime/model-metadata.js';
import { fixtures, load } from './support/fixtures.js';

const { dir } = fixtures();
const folder = join(dir, 'mlp_sgd');  // 8 features, 4 classes, cross-entropy without ignore_index

test('the labels the class loss reads, with the declared class count, are found in the graph', async () => {
  for (const file of ['training_model.onnx', 'eval_model.onnx']) {
    assert.deepEqual(classLabelInputs(await load(join(folder, file))),
      { labels: { loss: 'SoftmaxCrossEntropyLoss', classes: 4, ignoreIndex: null } });
  }
});

test('a negative label and one past the class count are refused before the run, in both modes', async () => {
  const api = bindEngine(ortNode);
  const session = await api.TrainingSession.create({ checkpointState: join(folder, 'checkpoint'),
    trainModel: join(folder, 'training_model.onnx'), evalModel: join(folder, 'eval_model.onnx') });
  const x = new ortNode.Tensor('float32', new Float32Array(6 * 8).fill(0.5), [6, 8]);
  const labels = (values) => new ortNode.Tensor('int64', BigInt64Array.from(values, BigInt), [6]);
  const before = Float32Array.from((await session.getContiguousParameters(true)).data);
  await session.runTrainStep({ input: x, labels: labels([0, 1, 2, 3, 0, 1]) });
  await assert.rejects(session.runTrainStep({ input: x, labels: labels([0, 1, 2, -1, 0, 1]) }),
    /training step: input 'labels' holds the class label -1 at index \[3\]; SoftmaxCrossEntropyLoss labels must be class indices, 0 to 3; the loss has no ignore_index/);
  await assert.rejects(session.runTrainStep({ input: x, labels: labels([0, 1, 2, 3, 4, 1]) }),
    /holds the class label 4 at index \[4\]; SoftmaxCrossEntropyLoss labels must be class indices, 0 to 3$/);
  await assert.rejects(session.runEvalStep({ input: x, labels: labels([-1, 1, 2, 3, 0, 1]) }),
    /eval step: input 'labels' holds the class label -1 at index \[0\]/);
  assert.deepEqual(Float32Array.from((await session.getContiguousParameters(true)).data), before);
});

test('a learning rate that would corrupt the parameters is refused, as in Python', async () => {
  const api = bindEngine(ortNode);
  const session = await api.TrainingSession.create({ checkpointState: join(folder, 'checkpoint'),
    trainModel: join(folder, 'training_model.onnx'), optimizerModel: join(folder, 'optimizer_model.onnx') });
  await session.setLearningRate(0.01);
  assert.throws(() => session.optimizer.setLearningRate(NaN), /the learning rate must be finite, got NaN/);
  assert.throws(() => session.optimizer.setLearningRate('0.1'), /the learning rate must be a number, got string/);
  assert.ok(Math.abs((await session.getLearningRate()) - 0.01) < 1e-9);
});
