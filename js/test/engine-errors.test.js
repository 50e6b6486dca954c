// An engine failure names the step, the op and the node; the class-label hint only where an index is read.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { run } from '../src/runtime/module.js';

const failing = (message) => ({ run: async () => { throw new Error(message); } });
const ortMessage = (op, name) => `Non-zero status code returned while running ${op} node. Name:'${name}' Status Message: bad`;

test('a shape failure names the node and does not blame the labels', async () => {
  await assert.rejects(run(failing(ortMessage('MatMul', 'first_matmul')), {}, 'training step'), (e) =>
    e.message.startsWith("the training step failed in a MatMul node ('first_matmul'):")
    && !e.message.includes('class labels') && e.message.includes("check the inputs' shapes"));
});

test('a failure where labels are read keeps the class-label hint', async () => {
  await assert.rejects(run(failing(ortMessage('SoftmaxCrossEntropyLoss', 'loss')), {}, 'eval step'),
    /the eval step failed in a SoftmaxCrossEntropyLoss node \('loss'\).*class labels must be below/);
  await assert.rejects(run(failing('something else'), {}, 'eval step'), /the eval step failed: something else \(check the input values/);
});
