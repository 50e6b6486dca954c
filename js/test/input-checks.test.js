// Inputs checked before a run, as in Python (runtime/inputs.py: check_inputs): names, dtype, rank, static dims
// and a symbolic dim (the batch) equal across inputs, so that no raw engine message (or, on WebAssembly, an error
// code) and no silent broadcast of a batch-1 input stands for them. Class labels: onnxruntime reads -1 as the
// last class without an error, so a negative label, or one past the class count the graphs declare, is refused
// with the input, the label and its position named. Token ids likewise (tests/runtime/test_table_indices.py): an
// input that a Gather reads as row indices of a parameter or of a constant table must hold rows, in [0, rows);
// onnxruntime reads -1 as the last row and fails in the Gather node on an index past the table. And the eval model
// must belong to the training model's artifacts (runtime/run.py).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import * as ortNode from 'onnxruntime-node';
import * as ortWeb from 'onnxruntime-web';
import { ArtifactError, bindEngine, ExecutionError, InputError } from '../src/index.js';
import { classLabelInputs, graphInputs, tableIndexInputs } from '../src/runtime/model-metadata.js';
import { checkFeeds } from '../src/runtime/inputs.js';
import { countingEngine } from './support/harness.js';
import { fixtures, load } from './support/fixtures.js';
import { FLOAT, INT32, INT64, initializer, node, onnxModel, tensorInfo, withoutClassCount, withMetadataEdited }
  from './support/models.js';

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

// -- token ids: indices into a table's rows -------------------------------------------------------------------------
const positions = join(dir, 'positions_slice');  // ids [batch, sequence] -> Gather of 'tokens' (trainable) -> ... -> Gemm
const VOCAB = 20;  // tests.models.VOCAB: the rows of 'tokens'

test('the inputs a Gather reads as rows of a parameter are found in the graphs', async () => {
  for (const file of ['training_model.onnx', 'eval_model.onnx']) {
    assert.deepEqual(tableIndexInputs(await load(join(positions, file)), ['tokens', 'positions', 'fc']),
      { ids: { table: 'tokens', rows: VOCAB } });
  }
});

test('an index outside the table is refused before the run, in both modes, and nothing runs or changes', async () => {
  const { engine, runs } = countingEngine(ortNode);
  const session = await bindEngine(engine).TrainingSession.create(files(positions));
  const state = session.checkpointState;
  const ids = BigInt64Array.from({ length: 15 }, (_, k) => BigInt((7 * k) % VOCAB));
  const labels = BigInt64Array.from([0n, 1n, 0n]);
  const feeds = () => ({ ids: new ortNode.Tensor('int64', ids, [3, 5]), labels: new ortNode.Tensor('int64', labels, [3]) });
  const before = [state.params.vector.slice(), state.grads.vector.slice()];
  const rows = `and it indexes the ${VOCAB} rows of 'tokens': its values must be from 0 to ${VOCAB - 1}`;
  const fromTheEnd = " (onnxruntime would read it as a row from the end, torch's Embedding refuses it: a padding id needs a "
    + 'row of its own)';
  for (const [bad, why] of [[-1, fromTheEnd], [VOCAB, '']]) {
    ids[7] = BigInt(bad);  // [1, 2]
    for (const [step, what] of [['runTrainStep', 'training step'], ['runEvalStep', 'eval step']]) {
      const message = `${what}: input 'ids' holds ${bad} at index [1, 2], ${rows}${why}`;
      await assert.rejects(session[step](feeds()), (e) => e instanceof InputError && e.message === message, message);
    }
  }
  assert.equal(runs.total, 0, 'a bad index reached the engine');
  assert.deepEqual([state.params.vector, state.grads.vector], before);
  ids[7] = BigInt(VOCAB - 1);  // the last row is a row: the same batch trains
  assert.ok(Number.isFinite(Number((await session.runTrainStep(feeds())).loss.data[0])));
  assert.ok(state.grads.views.get('tokens').some((g) => g !== 0));
  await session.release();
});

/**
 * As test_table_indices.py's _gather: `ids` (int32 cast to int64 with `cast`, int32 [n, 1] cast and reshaped with
 * `nested`) gathered from a [7, 2] table `table`, an initializer (a weight kept as a constant of the graph) or,
 * with `tableIsInput`, an input of the graph (a parameter if the caller lists it, else another input of the model).
 */
function gather({ cast = false, nested = false, tableIsInput = false, axis = undefined } = {}) {
  const ids = tensorInfo('ids', cast || nested ? INT32 : INT64, nested ? ['n', 1] : ['n']);
  const nodes = [];
  let index = 'ids';
  if (cast || nested) nodes.push(node('Cast', ['ids'], [index = 'ids64'], { to: INT64 }));
  if (nested) nodes.push(node('Reshape', ['ids64', 'flat'], [index = 'flat_ids']));
  nodes.push(node('Gather', ['table', index], ['rows'], axis === undefined ? {} : { axis }));
  const table = Array.from({ length: 14 }, (_, k) => k);
  return onnxModel({ nodes, inputs: tableIsInput ? [ids, tensorInfo('table', FLOAT, [7, 2])] : [ids],
    outputs: [tensorInfo('rows', FLOAT, ['n', 2])],
    initializers: [...(tableIsInput ? [] : [initializer('table', [7, 2], table)]), initializer('flat', [1], [-1], INT64)] });
}

test('indices are traced through casts and views, and only into parameters and constants', () => {
  const found = { ids: { table: 'table', rows: 7 } };
  assert.deepEqual(tableIndexInputs(gather({ cast: true }), ['table']), found);
  assert.deepEqual(tableIndexInputs(gather(), ['table']), found);
  assert.deepEqual(tableIndexInputs(gather({ nested: true }), ['table']), found);  // Cast, then Reshape
  // a parameter fed as an input of the graph (the rows from its declared shape), as in a training graph
  assert.deepEqual(tableIndexInputs(gather({ tableIsInput: true }), ['table']), found);
  // a weight kept as a constant of the graph (not a parameter of the checkpoint) is a table too
  assert.deepEqual(tableIndexInputs(gather(), []), found);
  // a Gather from another input of the model may mean a negative index as ONNX defines it: not checked
  assert.deepEqual(tableIndexInputs(gather({ tableIsInput: true }), []), {});
  // nor a Gather on another axis than the rows
  assert.deepEqual(tableIndexInputs(gather({ axis: 1 }), ['table']), {});
});

test('an index into a constant table is refused; a float input cast to indices is not checked', async () => {
  const [ids] = graphInputs(gather({ cast: true }));
  const tables = tableIndexInputs(gather({ cast: true }), []);
  const feed = (values) => ({ ids: new ortNode.Tensor('int32', Int32Array.from(values), [values.length]) });
  checkFeeds([ids], feed([0, 6]), 'eval step', {}, tables);
  assert.throws(() => checkFeeds([ids], feed([0, 6, 7]), 'eval step', {}, tables), (e) => e instanceof InputError
    && e.message === "eval step: input 'ids' holds 7 at index [2], and it indexes the 7 rows of 'table': its values must be from 0 to 6");
  const float = { name: 'ids', type: 'float32', shape: ['n'] };
  checkFeeds([float], { ids: new ortNode.Tensor('float32', Float32Array.from([-1, 9]), [2]) }, 'eval step', {}, tables);
  // why: onnxruntime reads -1 as the last row of the table, without an error
  const session = await ortNode.InferenceSession.create(gather());
  const { rows } = await session.run({ ids: new ortNode.Tensor('int64', BigInt64Array.from([-1n]), [1]) });
  assert.deepEqual(Array.from(rows.data), [12, 13]);
  await session.release();
});
