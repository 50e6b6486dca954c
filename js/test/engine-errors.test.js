// An engine failure is an ExecutionError naming the step, the op and the node, with what the engine said on one
// line (no status prefix, no source location); the class-label hint only where class labels are read.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { run } from '../src/runtime/module.js';
import { ExecutionError } from '../src/errors.js';

const failing = (message) => ({ run: async () => { throw new Error(message); } });
const ortMessage = (op, name, status = 'bad') => `Non-zero status code returned while running ${op} node. Name:'${name}' Status Message: ${status}`;

test('a shape failure names the node and does not blame the labels', async () => {
  await assert.rejects(run(failing(ortMessage('MatMul', 'first_matmul')), {}, 'training step', { hasLabels: true }), (e) =>
    e instanceof ExecutionError && e.message.startsWith("the training step failed in a MatMul node ('first_matmul'):")
    && !e.message.includes('class labels') && e.message.includes("check the inputs' shapes"));
});

test('a failure where labels are read keeps the class-label hint', async () => {
  await assert.rejects(run(failing(ortMessage('SoftmaxCrossEntropyLoss', 'loss')), {}, 'eval step'),
    /the eval step failed in a SoftmaxCrossEntropyLoss node \('loss'\).*class labels must be below/);
  await assert.rejects(run(failing(ortMessage('GatherElements', '')), {}, 'training step', { hasLabels: true }),
    /failed in a GatherElements node: bad \(check the input values, e.g. class labels must be below/);
  await assert.rejects(run(failing('something else'), {}, 'eval step', { hasLabels: true }),
    /the eval step failed: something else \(check the input values, e.g. class labels/);
});

test('without class labels, or where another index is read, the hint does not mention class labels', async () => {
  await assert.rejects(run(failing(ortMessage('Gather', '', 'idx=25 out of range')), {}, 'training step', { hasLabels: true }),
    /failed in a Gather node: idx=25 out of range \(check the input values, e.g. indices such as token ids must be below/);
  await assert.rejects(run(failing(ortMessage('GatherElements', '')), {}, 'training step'), (e) => !e.message.includes('class labels'));
  await assert.rejects(run(failing('failed to call OrtRun(). ERROR_CODE: 2'), {}, 'eval step'),
    /the eval step failed: failed to call OrtRun\(\). ERROR_CODE: 2 \(check the inputs' shapes and values\)$/);
});

test("the engine's message on one line, without its status prefix and source location", async () => {
  const status = '/onnxruntime_src/onnxruntime/core/providers/cpu/tensor/gather_elements.cc:150 void onnxruntime::core_impl(const Tensor*) [with Tin = long int] GatherElements op:\n Out of range value';
  await assert.rejects(run(failing(ortMessage('GatherElements', 'g', status)), {}, 'training step'),
    (e) => e.message === "the training step failed in a GatherElements node ('g'): GatherElements op: Out of range value "
      + '(check the input values, e.g. indices such as token ids must be below the size they index)');
});

test('RunOptions reach the session, with every output fetched', async () => {
  const calls = [];
  const session = { outputNames: ['loss', 'out'], run: async (...args) => { calls.push(args); return {}; } };
  await run(session, { x: 1 }, 'training step');
  await run(session, { x: 1 }, 'training step', { runOptions: { tag: 't' } });
  assert.deepEqual(calls, [[{ x: 1 }], [{ x: 1 }, ['loss', 'out'], { tag: 't' }]]);
});
