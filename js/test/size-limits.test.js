// A sequence longer than a model's position table fails in the engine on a node that does not name the input (an
// Expand or an Add for a BERT, a Gather that reads like a token id out of range for a GPT-2). The limits
// generate_artifacts records in the training metadata (runtime/size_limits.py) make the ExecutionError name the
// input, its length and the table's, as Python's does (tests/runtime/test_size_limits.py).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import * as ortNode from 'onnxruntime-node';
import { bindEngine, ExecutionError } from '../src/index.js';
import { exceeded } from '../src/runtime/module.js';
import { fixtures } from './support/fixtures.js';

const { dir } = fixtures();
const POSITIONS = 8;  // tests.models.POSITIONS

const ids = (length) => new ortNode.Tensor('int64', new BigInt64Array(2 * length).fill(1n), [2, length]);
const labels = new ortNode.Tensor('int64', BigInt64Array.from([0n, 2n]), [2]);

for (const [positions, table] of [['slice', 'position_ids'], ['range', 'positions']]) {
  test(`a sequence longer than the position table (${positions}) names the input and the table, in both modes`, async () => {
    const folder = join(dir, `positions_${positions}`);
    const api = bindEngine(ortNode);
    const session = await api.TrainingSession.create({ checkpointState: join(folder, 'checkpoint'),
      trainModel: join(folder, 'training_model.onnx'), evalModel: join(folder, 'eval_model.onnx') });
    await session.runTrainStep({ ids: ids(POSITIONS), labels });   // the longest sequence trains
    const named = new RegExp(`failed in a \\w+ node.*\\(input 'ids' is ${POSITIONS + 3} long on axis 1, and the model `
      + `indexes a table of ${POSITIONS} \\('${table}'\\) by that length: it takes at most ${POSITIONS} there`);
    for (const step of ['runTrainStep', 'runEvalStep']) {
      await assert.rejects(session[step]({ ids: ids(POSITIONS + 3), labels }), (e) => e instanceof ExecutionError && named.test(e.message));
    }
    await session.release();
  });
}

test('an input within its limits, or not fed, is not blamed', () => {
  const limits = [{ input: 'ids', axis: 1, limit: 8, table: 'wpe' }];
  assert.equal(exceeded(limits, { ids: { dims: [2, 8] } }), '');
  assert.equal(exceeded(limits, { other: { dims: [2, 80] } }), '');
  assert.equal(exceeded([], { ids: { dims: [2, 80] } }), '');
  assert.match(exceeded(limits, { ids: { dims: [2, 9] } }), /^input 'ids' is 9 long on axis 1, and the model indexes a table of 8 \('wpe'\)/);
});
