// Train the MLP and the digits CNN with SGD and AdamW on onnxruntime-node and on onnxruntime-web's WebAssembly
// backend (in Node.js), on the same data as Python onnxtrain (tests/js/reference.py), and compare. The cases
// train with the train-step model (one session run per step); the resume test without it (two runs).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import * as ortNode from 'onnxruntime-node';
import * as ortWeb from 'onnxruntime-web';
import { bindEngine } from '../src/index.js';
import { runCase } from './support/harness.js';
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
