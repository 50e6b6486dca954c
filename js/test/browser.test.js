// In a real browser: headless Chromium loads the package and onnxruntime-web's WebAssembly build from a
// static server on 127.0.0.1, trains the MLP and the digits CNN, and resumes a Python checkpoint; the results
// must match Python onnxtrain's. Skipped (with the reason) when Chromium is not installed.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fixtures, REPO } from './support/fixtures.js';
import { serve } from './support/server.js';
import { haveChromium, launch, CHROMIUM } from './support/browser.js';

const TOLERANCE = 1e-5;
const skip = haveChromium() ? false : `no Chromium at ${CHROMIUM} (apt-get install -y chromium, or set CHROMIUM)`;
let server;
let chromium;
let page;

before(async () => {
  if (skip) return;
  const { dir } = fixtures();
  server = await serve({ '/js': join(REPO, 'js'), '/fixtures': dir });
  chromium = await launch();
  page = await chromium.browser.newPage();
  page.on('console', (message) => { if (message.type() === 'error') console.log('page:', message.text()); });
  await page.goto(`${server.url}/js/test/browser/index.html`);
  await page.waitForFunction(() => typeof window.runCase === 'function', { timeout: 20000 });
});

after(async () => {
  await chromium?.close();
  await server?.close();
});

async function runInPage(name, info, options = {}) {
  const result = await page.evaluate((d, i, o) => window.runCase(d, i, o), `/fixtures/${name}`, info, options);
  return { ...result, checkpoint: Buffer.from(result.checkpoint, 'base64') };
}

const { dir, cases } = skip ? { cases: {} } : fixtures();

for (const name of ['mlp_sgd', 'mlp_adamw', 'cnn_adamw']) {
  test(`${name} in Chromium (WebAssembly): matches Python`, { skip }, async () => {
    const r = await runInPage(name, cases[name]);
    console.log(`chromium ${name}: loss ${r.losses[0].toFixed(4)} -> ${r.losses.at(-1).toFixed(4)}, parameter/state rel. error ${r.worst.toExponential(2)}, eval ${r.evalOutputError.toExponential(2)}, ${r.stepMs.toFixed(2)} ms/step, ${r.runsPerStep} session runs/step`);
    assert.ok(r.worst <= TOLERANCE, `parameters differ from Python's by ${r.worst}`);
    assert.equal(r.runsPerStep, 1, 'the train-step model (one session run per step) was not used');
    assert.ok(r.lossError <= TOLERANCE && r.evalOutputError <= TOLERANCE, `losses or eval differ: ${r.lossError}, ${r.evalOutputError}`);
    assert.ok(r.losses.at(-1) < r.losses[0]);
    writeFileSync(join(dir, name, 'js_browser.ckpt'), r.checkpoint);
  });
}

test('a Python checkpoint resumes in Chromium and the result loads back (checked by tests/js)', { skip }, async () => {
  const { case: name, from_step: first } = cases._resume;
  // Without the train-step model: the two graphs of the former API's four artifacts.
  const r = await runInPage(name, cases[name], { checkpoint: `/fixtures/resume/half.ckpt`, first, fused: false });
  assert.equal(r.runsPerStep, 2);
  console.log(`chromium resume ${name} from step ${first}: parameter/state rel. error ${r.worst.toExponential(2)}`);
  assert.ok(r.worst <= TOLERANCE);
  writeFileSync(join(dir, 'resume', 'js_browser.ckpt'), r.checkpoint);
});
