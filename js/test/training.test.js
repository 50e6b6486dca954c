// Train the MLP and the digits CNN with SGD and AdamW on onnxruntime-node and on onnxruntime-web's WebAssembly
// backend (in Node.js), on the same data as Python onnxtrain (tests/js/reference.py), and compare. The cases
// train with the train-step model (one session run per step); the resume test without it (two runs). Then the
// former API's forms: fetches and options, '' for an absent model, release, concurrent calls, the namespace import.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import * as ortNode from 'onnxruntime-node';
import * as ortWeb from 'onnxruntime-web';
import { bindEngine } from '../src/index.js';
import * as nodeApi from '../src/node.js';
import * as webApi from '../src/web.js';
import { countingEngine, runCase } from './support/harness.js';
import { fixtures, load } from './support/fixtures.js';

ortWeb.env.wasm.numThreads = 1;
const ENGINES = { node: ortNode, web: ortWeb };
const TOLERANCE = 1e-5;
const { dir, cases } = fixtures();

for (const [engine, ort] of Object.entries(ENGINES)) {
  for (const [name, info] of Object.entries(cases)) {
    if (name.startsWith('_')) continue;
    test(`${name} on onnxruntime-${engine}: matches Python after ${info.steps} steps`, async () => {
      const r = await runCase(bindEngine, ort, load, join(dir, name), info);
      console.log(`${engine} ${name}: loss ${r.losses[0].toFixed(4)} -> ${r.losses.at(-1).toFixed(4)}, parameter/state rel. error ${r.worst.toExponential(2)}, loss ${r.lossError.toExponential(2)}, eval ${r.evalOutputError.toExponential(2)}, ${r.stepMs.toFixed(2)} ms/step, ${r.runsPerStep} session runs/step`);
      assert.ok(r.worst <= TOLERANCE, `parameters differ from Python's by ${r.worst}`);
      assert.equal(r.runsPerStep, 1, 'the train-step model (one session run per step) was not used');
      assert.equal(r.stepJs, r.stepPy);
      assert.ok(r.lossError <= TOLERANCE && r.evalLossError <= TOLERANCE && r.evalOutputError <= TOLERANCE,
        `losses or eval differ: ${r.lossError}, ${r.evalLossError}, ${r.evalOutputError}`);
      assert.ok(r.losses.at(-1) < r.losses[0], `loss did not go down: ${r.losses}`);
      assert.deepEqual(r.names[0], [info.input, 'labels']);
      assert.deepEqual(r.names[1], ['loss', info.output]);
      // For the pytest driver: the JS-trained checkpoint must load in Python and equal Python's result.
      writeFileSync(join(dir, name, `js_${engine}.ckpt`), r.checkpoint);
    });
  }

  test(`a Python checkpoint resumes on onnxruntime-${engine} (two graphs per step, no train-step model)`, async () => {
    const { case: name, from_step: first } = cases._resume;
    const r = await runCase(bindEngine, ort, load, join(dir, name), cases[name],
      { checkpoint: join(dir, 'resume', 'half.ckpt'), first, fused: false });
    assert.equal(r.runsPerStep, 2);
    console.log(`${engine} resume ${name} from step ${first}: parameter/state rel. error ${r.worst.toExponential(2)}`);
    assert.ok(r.worst <= TOLERANCE, `resumed parameters differ from Python's by ${r.worst}`);
    assert.equal(r.stepJs, cases[name].steps);
    writeFileSync(join(dir, 'resume', `js_${engine}.ckpt`), r.checkpoint);
  });
}

test('gradients accumulate until lazyResetGrad; getContiguousParameters/loadParametersBuffer round-trip', async () => {
  const api = bindEngine(ortNode);
  const folder = join(dir, 'mlp_sgd');
  const session = await api.TrainingSession.create({ checkpointState: join(folder, 'checkpoint'),
    trainModel: join(folder, 'training_model.onnx'), optimizerModel: join(folder, 'optimizer_model.onnx') });
  const x = new ortNode.Tensor('float32', new Float32Array(16 * 8).map((_, i) => Math.cos(i)), [16, 8]);
  const y = new ortNode.Tensor('int64', new BigInt64Array(16).map((_, i) => BigInt(i % 4)), [16]);
  const state = session.checkpointState;
  await session.runTrainStep({ input: x, labels: y });
  const once = state.getGradient('fc1.weight');
  await session.runTrainStep({ input: x, labels: y });
  const twice = state.getGradient('fc1.weight');
  assert.ok(twice.every((g, i) => Math.abs(g - 2 * once[i]) <= 1e-6 * (1 + Math.abs(g))));
  await session.lazyResetGrad();
  await session.runTrainStep({ input: x, labels: y });
  assert.deepEqual(state.getGradient('fc1.weight'), once);
  const flat = await session.getContiguousParameters(true);
  assert.equal(flat.dims[0], await session.getParametersSize(true));
  const doubled = Float32Array.from(flat.data, (v) => 2 * v);
  await session.loadParametersBuffer(new Uint8Array(doubled.buffer), true);
  assert.deepEqual((await session.getContiguousParameters(true)).data, doubled);
  await session.release();
});

const MLP = join(dir, 'mlp_sgd');
const mlpFiles = { checkpointState: join(MLP, 'checkpoint'), trainModel: join(MLP, 'training_model.onnx'),
  evalModel: join(MLP, 'eval_model.onnx'), optimizerModel: join(MLP, 'optimizer_model.onnx') };
const mlpBatch = (ort, seed, n = 6) => ({
  input: new ort.Tensor('float32', new Float32Array(n * 8).map((_, i) => Math.sin(seed + 0.7 * i)), [n, 8]),
  labels: new ort.Tensor('int64', new BigInt64Array(n).map((_, i) => BigInt((i + seed) % 4)), [n]),
});

test('loadParametersBuffer takes a Node.js Buffer at any offset, and names the expected size', async () => {
  const session = await bindEngine(ortNode).TrainingSession.create(mlpFiles);
  const n = await session.getParametersSize(true);
  const values = new Float32Array(n).map((_, i) => i / 1000);
  const bytes = new Uint8Array(values.buffer);
  // Buffer.from copies into Node's shared pool (byteOffset > 0), as fs.readFileSync of a small file does
  for (const buffer of [Buffer.from(bytes), Buffer.concat([Buffer.alloc(3), bytes]).subarray(3), bytes.buffer]) {
    await session.loadParametersBuffer(new Float32Array(n));
    await session.loadParametersBuffer(buffer, true);
    assert.deepEqual((await session.getContiguousParameters(true)).data, values, buffer.constructor.name);
  }
  await session.loadParametersBuffer(new Float32Array(n));
  await session.loadParametersBuffer(new ortNode.Tensor('float32', values, [n]));
  assert.deepEqual((await session.getContiguousParameters(true)).data, values);
  await assert.rejects(session.loadParametersBuffer(bytes.subarray(4)),
    new RegExp(`^RangeError: loadParametersBuffer expects ${n} float32 values \\(${4 * n} bytes; getParametersSize\\(true\\)\\), got ${n - 1} \\(${4 * n - 4} bytes\\)$`));
  await assert.rejects(session.loadParametersBuffer(bytes.subarray(2)), /has \d+ bytes, not a whole number of float32 values/);
  await assert.rejects(session.loadParametersBuffer(new Float64Array(n)), /^TypeError: loadParametersBuffer expects float32 values .*got Float64Array$/);
  await session.release();
});

test('fetches select the outputs, RunOptions reach the sessions, and wrong forms fail as in the former API', async () => {
  const { engine, runs } = countingEngine(ortNode);
  const seen = [];
  const create = async (...args) => {
    const session = await engine.InferenceSession.create(...args);
    const run = session.run.bind(session);
    session.run = (...runArgs) => { seen.push(runArgs[2]); return run(...runArgs); };
    return session;
  };
  const session = await bindEngine({ ...engine, InferenceSession: { create } }).TrainingSession.create(mlpFiles);
  const feeds = mlpBatch(ortNode, 1);
  assert.deepEqual(Object.keys(await session.runTrainStep(feeds)), ['loss', 'output']);
  assert.deepEqual(Object.keys(await session.runTrainStep(feeds, ['loss'])), ['loss']);
  assert.deepEqual(Object.keys(await session.runTrainStep(feeds, { output: null })), ['output']);
  assert.deepEqual(Object.keys(await session.runEvalStep(feeds, ['output'])), ['output']);
  const target = new ortNode.Tensor('float32', new Float32Array(1), []);
  const filled = await session.runEvalStep(feeds, { loss: target });
  assert.equal(filled.loss, target);
  assert.ok(target.data[0] > 0);
  const options = { tag: 'mine', logSeverityLevel: 3 };
  seen.length = 0;
  assert.deepEqual(Object.keys(await session.runTrainStep(feeds, options)), ['loss', 'output']);
  await session.runTrainStep(feeds, ['loss'], options);
  await session.runEvalStep(feeds, options);
  await session.runOptimizerStep(options);
  assert.deepEqual(seen, [options, options, options, options]);
  const before = runs.total;
  await assert.rejects(session.runTrainStep(feeds, ['nope']), /^RangeError: 'fetches' contains invalid output name: nope\. The outputs are loss, output\.$/);
  await assert.rejects(session.runTrainStep(feeds, []), /^TypeError: 'fetches' cannot be an empty array\.$/);
  await assert.rejects(session.runTrainStep(feeds, 'loss'), /^TypeError: Unexpected argument\[1\]: must be 'fetches' or 'options'\.$/);
  await assert.rejects(session.runTrainStep(feeds, ['loss'], 'x'), /^TypeError: 'options' must be an object/);
  await assert.rejects(session.runOptimizerStep(3), /^TypeError: 'options' must be an object/);
  for (const bad of [null, feeds.input, [feeds.input, feeds.labels], 'input']) {
    await assert.rejects(session.runTrainStep(bad), /^TypeError: 'feeds' must be an object that use input names as keys/);
  }
  assert.equal(runs.total, before, 'a call with bad arguments ran a session');
  await session.release();
});

test("an optional model given as '' is not given, as in the former API", async () => {
  const session = await bindEngine(ortNode).TrainingSession.create({ ...mlpFiles, evalModel: '', optimizerModel: '',
    trainStepModel: '' });
  assert.deepEqual([session.evalInputNames, session.evalOutputNames, session.optimizer], [[], [], null]);
  await assert.rejects(session.runEvalStep(mlpBatch(ortNode, 0)), /has no eval model: pass evalModel/);
  await session.release();
});

test('a released session refuses every call with a clear error; a second release does nothing', async () => {
  const session = await bindEngine(ortNode).TrainingSession.create({ ...mlpFiles,
    trainStepModel: join(MLP, 'train_step_model.onnx') });
  const feeds = mlpBatch(ortNode, 2);
  const pending = session.runTrainStep(feeds);   // called before release(): runs first
  const released = session.release();
  assert.ok(Number((await pending).loss.data[0]) > 0);
  await released;
  await session.release();
  const calls = [() => session.runTrainStep(feeds), () => session.runOptimizerStep(), () => session.runEvalStep(feeds),
    () => session.lazyResetGrad(), () => session.getParametersSize(), () => session.getContiguousParameters(),
    () => session.loadParametersBuffer(new Float32Array(4)), () => session.saveCheckpoint(),
    async () => session.getLearningRate(), async () => session.setLearningRate(0.1)];
  for (const call of calls) await assert.rejects(call(), /^Error: the TrainingSession was released/);
});

for (const [engineName, ort] of Object.entries(ENGINES)) {
  test(`onnxruntime-${engineName}: calls not awaited run one after the other, as awaited ones`, async () => {
    const api = bindEngine(ort);
    const [awaited, together] = [await api.TrainingSession.create(mlpFiles), await api.TrainingSession.create(mlpFiles)];
    for (const session of [awaited, together]) session.setLearningRate(0.1);
    const [a, b, c] = [mlpBatch(ort, 1), mlpBatch(ort, 2), mlpBatch(ort, 3)];
    await awaited.runTrainStep(a);
    await awaited.runTrainStep(b);
    const accumulated = awaited.checkpointState.getGradient('fc1.weight');
    await awaited.runOptimizerStep();
    await awaited.lazyResetGrad();
    await awaited.runTrainStep(c);
    await awaited.runOptimizerStep();
    let gradient;
    await Promise.all([together.runTrainStep(a), together.runTrainStep(b).then(() => {
      gradient = together.checkpointState.getGradient('fc1.weight');
    }), together.runOptimizerStep(), together.lazyResetGrad(), together.runTrainStep(c), together.runOptimizerStep()]);
    assert.deepEqual(gradient, accumulated);
    assert.deepEqual((await together.getContiguousParameters()).data, (await awaited.getContiguousParameters()).data);
    assert.equal(together.checkpointState.step, 2);
    await Promise.all([awaited.release(), together.release()]);
  });
}

test("the namespace import of the former API: ort.TrainingSession next to the engine's Tensor, env, InferenceSession", async () => {
  for (const [api, ort] of [[nodeApi, ortNode], [webApi, ortWeb]]) {
    assert.equal(api.Tensor, ort.Tensor);
    assert.equal(api.env, ort.env);
    assert.equal(api.InferenceSession, ort.InferenceSession);
    assert.equal(api.ort.Tensor, ort.Tensor);
    const session = await api.TrainingSession.create(mlpFiles);
    const { loss } = await session.runTrainStep(mlpBatch(api, 0), ['loss']);
    assert.ok(loss instanceof api.Tensor);
    await session.release();
  }
});
