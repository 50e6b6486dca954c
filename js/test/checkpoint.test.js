// The checkpoint format: files Python wrote come back byte for byte when JS writes the same state.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { CheckpointState, CheckpointError, loadCheckpoint, saveCheckpoint } from '../src/index.js';
import { fixtures, load } from './support/fixtures.js';

const { dir } = fixtures();

test('Python checkpoints (with and without optimizer state) are rewritten byte for byte', async () => {
  for (const file of ['mlp_sgd/checkpoint', 'cnn_adamw/checkpoint', 'cnn_adamw/expected.ckpt', 'resume/half.ckpt']) {
    const bytes = await load(join(dir, file));
    assert.deepEqual(saveCheckpoint(loadCheckpoint(bytes)), bytes, file);
    const state = await CheckpointState.loadCheckpoint(join(dir, file));
    assert.deepEqual(state.toBytes(file.endsWith('.ckpt')), bytes, `${file} through CheckpointState`);
  }
});

test('properties of every kind round-trip; step and optimizer state are kept', async () => {
  const data = loadCheckpoint(await load(join(dir, 'resume', 'half.ckpt')));
  assert.equal(data.step, 5);
  assert.deepEqual([...data.optimizer.get('fc2.bias').keys()], ['exp_avg', 'exp_avg_sq']);
  data.properties.set('epoch', 3n).set('lr', 0.1 + 0.2).set('user', 'Zoë ✍ 𝟘').set('nan', NaN);
  const back = loadCheckpoint(saveCheckpoint(data));
  assert.deepEqual([...back.properties], [['epoch', 3n], ['lr', 0.1 + 0.2], ['user', 'Zoë ✍ 𝟘'], ['nan', NaN]]);
});

test('a damaged checkpoint is a CheckpointError, not garbage', async () => {
  const bytes = (await load(join(dir, 'mlp_sgd', 'checkpoint'))).slice();
  bytes[bytes.length - 1] ^= 1;
  assert.throws(() => loadCheckpoint(bytes), (e) => e instanceof CheckpointError && /checksum mismatch in the tensor data/.test(e.message));
  assert.throws(() => loadCheckpoint(bytes.subarray(0, 100)), CheckpointError);
});
