// Inputs checked before a run, as in Python (runtime/inputs.py: check_inputs): names, dtype, rank, static dims
// and a symbolic dim (the batch) equal across inputs, so that no raw engine message (or, on WebAssembly, an error
// code) and no silent broadcast of a batch-1 input stands for them. Class labels: onnxruntime reads -1 as the
// last class without an error, so a negative label, or one past the class count the graphs declare, is refused
// with the input, the label and its position named. And the eval model must belong to the training model's
// artifacts (runtime/run.py).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import * as ortNode from 'onnxruntime-node';
import * as ortWeb from 'onnxruntime-web';
import { ArtifactError, bindEngine, ExecutionError, InputError } from '../src/index.js';
import { classLabelInputs } from '../src/runtime/model-metadata.js';
import { countingEngine } from './support/harness.js';
import { fixtures, load } from './support/fixtures.js';
import { withoutClassCount, withMetadataEdited } from './support/models.js';

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

ortWeb.env.wasm.numThreads = 1;
const files = (folder) => ({ checkpointState: join(folder, 'checkpoint'), trainModel: join(folder, 'training_model.onnx'),
  evalModel: join(folder, 'eval_model.onnx') });

for (const [engine, ort] of Object.entries({ node: ortNode, web: ortWeb })) {
  test(`onnxruntime-${engine}: feeds are checked against the declared inputs before the run, naming the input`, async () => {
    const { engine: counted, runs } = countingEngine(ort);
    const session = await bindEngine(counted).TrainingSession.create(files(folder));
    const F = (shape, type = 'float32') => new ort.Tensor(type, type === 'float64' ? new Float64Array(shape.reduce((a, b) => a * b, 1))
      : new Float32Array(shape.reduce((a, b) => a * b, 1)), shape);
    const L = (n, type = 'int64') => new ort.Tensor(type, type === 'int64' ? new BigInt64Array(n) : new Int32Array(n), [n]);
    const takes = 'it takes input: float32[batch, 8], labels: int64[batch]';
    const cases = [
      [{ input: F([6, 8]), labels: L(6), inptu: F([6, 8]) }, `training step: unknown input 'inptu'; ${takes}`],
      [{ inputs: F([6, 8]), labels: L(6) }, `training step: unknown input 'inputs', missing input 'input'; ${takes}`],
      [{ input: F([6, 8]) }, `training step: missing input 'labels'; ${takes}`],
      [{ input: F([6, 8], 'float64'), labels: L(6) }, "training step: input 'input' expects dtype float32, got float64 (expected float32[batch, 8], got float64[6, 8])"],
      [{ input: F([6, 8]), labels: L(6, 'int32') }, "training step: input 'labels' expects dtype int64, got int32 (expected int64[batch], got int32[6])"],
      [{ input: F([6, 7]), labels: L(6) }, "training step: input 'input' expects shape float32[batch, 8], got [6, 7] (axis 1 should be 8)"],
      [{ input: F([48]), labels: L(6) }, "training step: input 'input' expects rank 2 (float32[batch, 8]), got shape [48]"],
      [{ input: F([6, 8]), labels: L(1) }, "training step: input 'labels' has batch=1 on axis 0, but an earlier input has batch=6"],
      [{ input: F([0, 8]), labels: L(0) }, "training step: input 'input' holds no examples (shape [0, 8]); a step needs a batch of at least one"],
      [{ input: new Float32Array(48), labels: L(6) }, "training step: input 'input' must be a Tensor (new ort.Tensor('float32', data, dims)), got Float32Array"],
    ];
    for (const [feeds, message] of cases) {
      await assert.rejects(session.runTrainStep(feeds), (e) => e instanceof InputError && e.message === message, message);
    }
    await assert.rejects(session.runEvalStep({ input: F([5, 8]), labels: L(6) }),
      /^InputError: eval step: input 'labels' has batch=6 on axis 0, but an earlier input has batch=5$/);
    assert.equal(runs.total, 0, 'a bad feed reached the engine');
    await session.release();
  });
}

test('an eval model of other artifacts is refused at create(), as in Python', async () => {
  const api = bindEngine(ortNode);
  const other = join(dir, 'cnn_adamw', 'eval_model.onnx');
  await assert.rejects(api.TrainingSession.create({ ...files(folder), evalModel: other }), (e) => e instanceof ArtifactError
    && /^the eval model does not belong to the training model's artifacts: it reads \[.*\], which the checkpoint and the training model do not have; pass the eval_model.onnx written with this training_model.onnx$/.test(e.message));
  // same inputs and parameters, but written with other artifacts (their metadata says so)
  const edited = withMetadataEdited(await load(join(folder, 'eval_model.onnx')), '"loss_reduction": "mean"', '"loss_reduction": "sum_"');
  await assert.rejects(api.TrainingSession.create({ ...files(folder), evalModel: edited }),
    /^ArtifactError: the eval model does not belong to the training model's artifacts: its "onnxtrain.training" metadata differs from the training model's in loss_reduction;/);
  const session = await api.TrainingSession.create(files(folder));
  assert.deepEqual(session.evalInputNames, ['input', 'labels']);
  await session.release();
});

test("a training graph that leaves the class count open (as with ignore_index) checks labels against the eval graph's", async () => {
  const trainModel = withoutClassCount(await load(join(folder, 'training_model.onnx')), 'output');
  assert.equal(classLabelInputs(trainModel).labels.classes, null);
  const api = bindEngine(ortNode);
  const x = new ortNode.Tensor('float32', new Float32Array(6 * 8).fill(0.5), [6, 8]);
  const labels = new ortNode.Tensor('int64', BigInt64Array.from([0, 1, 2, 4, 0, 1], BigInt), [6]);
  const session = await api.TrainingSession.create({ ...files(folder), trainModel });
  await assert.rejects(session.runTrainStep({ input: x, labels }),
    /^InputError: training step: input 'labels' holds the class label 4 at index \[3\]; SoftmaxCrossEntropyLoss labels must be class indices, 0 to 3$/);
  await session.release();
  // without an eval model the count is unknown before the run: the engine's failure names the loss
  const alone = await api.TrainingSession.create({ checkpointState: join(folder, 'checkpoint'), trainModel });
  await assert.rejects(alone.runTrainStep({ input: x, labels }), (e) => e instanceof ExecutionError
    && /^the training step failed in a \w+ node.*\(check the input values, e.g. class labels must be below the number of classes\)$/.test(e.message));
  await alone.release();
});

test('a size computed from another input (a language model\'s shifted labels) is checked, as in Python', async () => {
  const { checkFeeds } = await import('../src/runtime/inputs.js');
  const ids = { name: 'input_ids', type: 'int64', shape: ['s77', 's27'] };
  const tensor = (dims) => new ortNode.Tensor('int64', new BigInt64Array(dims[0] * dims[1]), dims);
  for (const [declared, good, bad] of [['s27-1', 7, 8], ['2*s27', 16, 8], ['floor((s27+1)/2)', 4, 5],
    ['((s27//3)) - 1', 1, 2], ['max(s27, 10)', 10, 8]]) {
    const labels = { name: 'labels', type: 'int64', shape: ['s77', declared] };
    checkFeeds([ids, labels], { input_ids: tensor([2, 8]), labels: tensor([2, good]) }, 'training step');
    assert.throws(() => checkFeeds([ids, labels], { input_ids: tensor([2, 8]), labels: tensor([2, bad]) }, 'training step'),
      (e) => e instanceof InputError && e.message === `training step: input 'labels' expects ${declared}=${good} on axis 1 `
        + `(s27=8 from the other inputs), got shape [2, ${bad}]`);
  }
  for (const declared of ['s99-1', 'Mod(s27, 2)', 'unk__3']) {  // unknown symbol, unread form, plain symbol
    const other = { name: 'x', type: 'float32', shape: ['batch', declared] };
    checkFeeds([other], { x: new ortNode.Tensor('float32', new Float32Array(10), [2, 5]) }, 'eval step');
  }
});
