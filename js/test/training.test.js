// Train the MLP and the digits CNN with SGD and AdamW on onnxruntime-node and on onnxruntime-web's WebAssembly
// backend (in Node.js), on the same data as Python onnxtrain (tests/js/reference.py), and compare.

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
const ENGINES = { node: bindEngine(ortNode), web: bindEngine(ortWeb) };
const TOLERANCE = 1e-5;
const { dir, cases } = fixtures();

for (const [engine, api] of Object.entries(ENGINES)) {
  for (const [name, info] of Object.entries(cases)) {
    if (name.startsWith('_')) continue;
    test(`${name} on onnxruntime-${engine}: matches Python after ${info.steps} steps`, async () => {
      const r = await runCase(api, load, join(dir, name), info);
      console.log(`${engine} ${name}: loss ${r.losses[0].toFixed(4)} -> ${r.losses.at(-1).toFixed(4)}, parameter/state rel. error ${r.worst.toExponential(2)}, loss ${r.lossError.toExponential(2)}, eval ${r.evalOutputError.toExponential(2)}, ${r.stepMs.toFixed(2)} ms/step`);
      assert.ok(r.worst <= TOLERANCE, `parameters differ from Python's by ${r.worst}`);
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

  test(`a Python checkpoint resumes on onnxruntime-${engine}`, async () => {
    const { case: name, from_step: first } = cases._resume;
    const r = await runCase(api, load, join(dir, name), cases[name], { checkpoint: join(dir, 'resume', 'half.ckpt'), first });
    console.log(`${engine} resume ${name} from step ${first}: parameter/state rel. error ${r.worst.toExponential(2)}`);
    assert.ok(r.worst <= TOLERANCE, `resumed parameters differ from Python's by ${r.worst}`);
    assert.equal(r.stepJs, cases[name].steps);
    writeFileSync(join(dir, 'resume', `js_${engine}.ckpt`), r.checkpoint);
  });
}
