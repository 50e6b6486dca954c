// The train-step model (one session run per step) gives the results of the two separate graphs in every loop
// shape: a prepared update that went stale (learning rate changed, parameters loaded, two training calls
// before one optimizer step) is thrown away and the optimizer graph runs; a non-finite loss skips the step.
// Each check runs the same calls on a session with the train-step model and one without, and counts runs.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import * as ortNode from 'onnxruntime-node';
import * as ortWeb from 'onnxruntime-web';
import { bindEngine } from '../src/index.js';
import { countingEngine, relativeError } from './support/harness.js';
import { fixtures } from './support/fixtures.js';

ortWeb.env.wasm.numThreads = 1;
const { dir } = fixtures();
const CASE = join(dir, 'mlp_adamw');
const files = (folder) => ({ checkpointState: join(folder, 'checkpoint'), trainModel: join(folder, 'training_model.onnx'),
  evalModel: join(folder, 'eval_model.onnx'), optimizerModel: join(folder, 'optimizer_model.onnx') });

async function open(ort, trainStepModel) {
  const { engine, runs } = countingEngine(ort);
  const session = await bindEngine(engine).TrainingSession.create({ ...files(CASE), trainStepModel });
  session.setLearningRate(0.01);
  return { session, runs };
}

function batch(ort, seed, scale = 1) {
  const x = new Float32Array(16 * 8).map((_, i) => scale * Math.sin(seed * 7.1 + i * 1.3));
  return { input: new ort.Tensor('float32', x, [16, 8]),
    labels: new ort.Tensor('int64', new BigInt64Array(16).map((_, i) => BigInt((i + seed) % 4)), [16]) };
}

/** Parameters, optimizer state and step of the two sessions agree (the fused graph may round differently). */
function assertSame(fused, plain, what) {
  const a = fused.session.checkpointState.toData(true);
  const b = plain.session.checkpointState.toData(true);
  assert.equal(a.step, b.step, `${what}: step`);
  for (const [name, t] of b.trainable) {
    assert.ok(relativeError(a.trainable.get(name).data, t.data) <= 1e-6, `${what}: ${name} differs`);
    for (const [s, v] of b.optimizer.get(name)) {
      assert.ok(relativeError(a.optimizer.get(name).get(s).data, v.data) <= 1e-6, `${what}: ${s} of ${name} differs`);
    }
  }
}

for (const [engineName, ort] of Object.entries({ node: ortNode, web: ortWeb })) {
  test(`onnxruntime-${engineName}: stale prepared updates fall back to the optimizer graph, same results`, async () => {
    const fused = await open(ort, join(CASE, 'train_step_model.onnx'));
    const plain = await open(ort, undefined);
    let seed = 0;
    // Each row: what the loop does between steps, and how many session runs the fused session makes for it
    // (all graphs, and the optimizer graph alone).
    const rows = [
      ['a plain step', 1, 0, async (s) => { await s.runTrainStep(batch(ort, seed)); await s.runOptimizerStep(); }],
      ['learning rate changed after the training call', 2, 1, async (s) => {
        await s.runTrainStep(batch(ort, seed));
        s.setLearningRate(0.003);
        await s.runOptimizerStep();
      }],
      ['a plain step at the new learning rate', 1, 0, async (s) => { await s.runTrainStep(batch(ort, seed)); await s.runOptimizerStep(); }],
      ['parameters loaded after the training call', 2, 1, async (s) => {
        await s.runTrainStep(batch(ort, seed));
        const flat = (await s.getContiguousParameters(true)).data;
        await s.loadParametersBuffer(Float32Array.from(flat, (v) => 0.9 * v), true);
        await s.runOptimizerStep();
      }],
      ['two training calls before one optimizer step (accumulation)', 3, 1, async (s) => {
        await s.runTrainStep(batch(ort, seed));
        await s.runTrainStep(batch(ort, seed + 100));
        await s.runOptimizerStep();
      }],
      ['the step after an accumulation cycle', 2, 1, async (s) => { await s.runTrainStep(batch(ort, seed)); await s.runOptimizerStep(); }],
      ['one call per step again: fused again', 1, 0, async (s) => { await s.runTrainStep(batch(ort, seed)); await s.runOptimizerStep(); }],
      ['an eval between the training call and the step', 2, 0, async (s) => {
        await s.runTrainStep(batch(ort, seed));
        await s.runEvalStep(batch(ort, seed + 1));
        await s.runOptimizerStep();
      }],
    ];
    const optimizerRuns = () => fused.runs.sessions.find((e) => e.outputNames.includes('params.out')).count;
    for (const [what, expectedRuns, expectedOptimizerRuns, body] of rows) {
      seed += 1;
      const before = fused.runs.total;
      const optimizerBefore = optimizerRuns();
      for (const { session } of [fused, plain]) {
        await body(session);
        await session.lazyResetGrad();
      }
      assert.equal(fused.runs.total - before, expectedRuns, `${what}: session runs`);
      assert.equal(optimizerRuns() - optimizerBefore, expectedOptimizerRuns, `${what}: optimizer graph runs`);
      assertSame(fused, plain, what);
    }
    for (const { session } of [fused, plain]) await session.release();
  });
}

test('a non-finite loss skips the fused step: parameters, optimizer state and step unchanged', async () => {
  const fused = await open(ortNode, join(CASE, 'train_step_model.onnx'));
  const plain = await open(ortNode, undefined);
  for (const { session } of [fused, plain]) {
    await session.runTrainStep(batch(ortNode, 1));
    await session.runOptimizerStep();
    await session.lazyResetGrad();
  }
  const before = fused.session.checkpointState.toBytes(true);
  const nan = batch(ortNode, 2, NaN);
  const runs = fused.runs.total;
  const warn = console.warn;
  console.warn = () => {};
  try {
    const { loss } = await fused.session.runTrainStep(nan);
    assert.ok(Number.isNaN(Number(loss.data[0])));
    await fused.session.runOptimizerStep();
    await plain.session.runTrainStep(nan);
    await plain.session.runOptimizerStep();
  } finally {
    console.warn = warn;
  }
  assert.equal(fused.runs.total - runs, 1, 'the NaN step ran the fused graph once and nothing else');
  assert.deepEqual(fused.session.checkpointState.toBytes(true), before);
  assert.equal(fused.session.optimizer.skippedSteps, 1);
  for (const { session } of [fused, plain]) {
    await session.lazyResetGrad();
    await session.runTrainStep(batch(ortNode, 3));
    await session.runOptimizerStep();
  }
  assert.equal(fused.runs.total - runs, 2, 'the next step is fused again');
  assertSame(fused, plain, 'after the skipped step');
  for (const { session } of [fused, plain]) await session.release();
});

test('a train-step model that does not belong to the artifacts is refused with the reason', async () => {
  const { TrainingSession } = bindEngine(ortNode);
  const base = files(CASE);
  await assert.rejects(TrainingSession.create({ ...base, optimizerModel: undefined, trainStepModel: join(CASE, 'train_step_model.onnx') }),
    /trainStepModel needs the optimizerModel it was built from/);
  await assert.rejects(TrainingSession.create({ ...base, trainStepModel: join(dir, 'mlp_sgd', 'train_step_model.onnx') }),
    /built from another optimizer model than the one given; write it again/);
  await assert.rejects(TrainingSession.create({ ...base, trainStepModel: join(dir, 'cnn_adamw', 'train_step_model.onnx') }),
    /built from another training model/);
  await assert.rejects(TrainingSession.create({ ...base, trainStepModel: base.trainModel }),
    /not written by onnxtrain\.artifacts\.fused \(no "onnxtrain\.train_step" metadata\)/);
});
