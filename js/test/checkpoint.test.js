// The checkpoint format: files Python wrote come back byte for byte when JS writes the same state.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { CheckpointState, CheckpointError, importPeerCheckpoint, loadCheckpoint, readPeerCheckpoint, readSafetensors,
  saveCheckpoint } from '../src/index.js';
import { REPO, fixtures, load } from './support/fixtures.js';

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

test('another kind of file given as the checkpoint is named (the model, a zip, a pickle, text), as in Python', async () => {
  const model = await load(join(dir, 'mlp_sgd', 'training_model.onnx'));
  const cases = [
    [model, /is an ONNX model, not a checkpoint/],
    [new Uint8Array([0x50, 0x4b, 0x03, 0x04, 0x14, 0x00, 0x00, 0x00, 0x08, 0x00]), /is a zip archive/],
    [new Uint8Array([0x80, 0x04, 0x95, 0x35, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00]), /is a Python pickle/],
    [new TextEncoder().encode('# notes about my model\n'), /is a text file/],
  ];
  for (const [bytes, message] of cases) {
    assert.throws(() => loadCheckpoint(bytes), (e) => e instanceof CheckpointError && message.test(e.message));
  }
});

test('a damaged checkpoint is a CheckpointError, not garbage', async () => {
  const bytes = (await load(join(dir, 'mlp_sgd', 'checkpoint'))).slice();
  bytes[bytes.length - 1] ^= 1;
  assert.throws(() => loadCheckpoint(bytes), (e) => e instanceof CheckpointError && /checksum mismatch in the tensor data/.test(e.message));
  assert.throws(() => loadCheckpoint(bytes.subarray(0, 100)), CheckpointError);
});

test('an onnxruntime-training checkpoint is imported into the layout of the artifacts, as Python does', async () => {
  const peer = await load(join(REPO, 'tests', 'checkpoint', 'data', 'peer_tiny', 'checkpoint'));
  const template = await load(join(dir, 'peer', 'checkpoint'));
  const data = importPeerCheckpoint(peer, template);
  assert.equal(data.step, 3);
  assert.deepEqual([...data.properties], [['epoch', 3n], ['best_loss', 0.25], ['user', 'alice']]);
  assert.deepEqual(saveCheckpoint(data, true), await load(join(dir, 'peer', 'imported.ckpt')));
  assert.deepEqual([...readPeerCheckpoint(peer).trainable.keys()], ['fc1.bias', 'fc1.weight', 'fc2.weight']);
  assert.throws(() => loadCheckpoint(peer), (e) => e instanceof CheckpointError && /onnxruntime-training checkpoint.*importPeerCheckpoint/.test(e.message));
});

test('a damaged onnxruntime-training checkpoint is a CheckpointError, never another error', async () => {
  const peer = await load(join(REPO, 'tests', 'checkpoint', 'data', 'peer_tiny', 'checkpoint'));
  let errors = 0;
  const cases = [];
  for (let n = 0; n < peer.length; n += 5) cases.push(peer.slice(0, n));
  let seed = 1;
  const random = (n) => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n; };
  for (let i = 0; i < 300; i++) {
    const damaged = peer.slice();
    for (let k = 0; k < 3; k++) damaged[8 + random(peer.length - 8)] = random(256);
    cases.push(damaged);
  }
  for (const bytes of cases) {
    try {
      readPeerCheckpoint(bytes);
    } catch (e) {
      assert.ok(e instanceof CheckpointError, `${e.constructor.name}: ${e.message}`);
      errors += 1;
    }
  }
  assert.ok(errors >= Math.floor(peer.length / 5), `${errors} errors`);
});

/** The bytes as a Node.js Buffer at an offset inside a larger buffer, as fs.readFileSync returns small files (a
 * view into Node's shared pool): Buffer.slice() is a view there, not a copy. */
const pooled = (bytes) => Buffer.concat([Buffer.alloc(13, 0xee), bytes, Buffer.alloc(7, 0xee)]).subarray(13, 13 + bytes.length);

test('a checkpoint given as a Node.js Buffer at an offset reads as its bytes (readSafetensors, loadCheckpoint, create)', async () => {
  const bytes = await load(join(dir, 'mlp_sgd', 'checkpoint'));
  const buffer = pooled(bytes);
  assert.ok(buffer.byteOffset > 0 && buffer.buffer.byteLength > buffer.length);
  const expected = readSafetensors(bytes).tensors;
  for (const [name, t] of readSafetensors(buffer).tensors) assert.deepEqual(t.data, expected.get(name).data, name);
  assert.deepEqual(saveCheckpoint(loadCheckpoint(buffer)), bytes);
  const state = await CheckpointState.loadCheckpoint(buffer);
  assert.deepEqual(state.toBytes(false), bytes);
});

test('importPeerCheckpoint takes Node.js Buffers', async () => {
  const peer = await load(join(REPO, 'tests', 'checkpoint', 'data', 'peer_tiny', 'checkpoint'));
  const template = await load(join(dir, 'peer', 'checkpoint'));
  const data = importPeerCheckpoint(pooled(peer), pooled(template));
  assert.deepEqual(saveCheckpoint(data, true), await load(join(dir, 'peer', 'imported.ckpt')));
});
