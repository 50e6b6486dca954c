// Step time of the MLP and the digits CNN (tests/js/reference.py's cases, AdamW): onnxruntime-node,
// onnxruntime-web's WebAssembly backend in Node.js, and headless Chromium with 1 and 2 threads.
//
//   node bench/step-time.js [FIXTURES_DIR]        (prints a Markdown table; Python's figure: bench/step_time.py)
//
// Each figure is the median of 30 steps (train step + optimizer step + gradient reset) after 3 warm-up steps.
// Every engine gets a fresh session, and so does each Chromium run (one page, wasm threads set before the first).

import { join } from 'node:path';
import * as ortNode from 'onnxruntime-node';
import * as ortWeb from 'onnxruntime-web';
import { bindEngine } from '../src/index.js';
import { benchCase } from '../test/support/harness.js';
import { fixtures, load, REPO } from '../test/support/fixtures.js';
import { serve } from '../test/support/server.js';
import { haveChromium, launch } from '../test/support/browser.js';

if (process.argv[2]) process.env.ONNXTRAIN_JS_FIXTURES = process.argv[2];
const { dir, cases } = fixtures();
const CASES = ['mlp_adamw', 'cnn_adamw'];
const rows = Object.fromEntries(CASES.map((c) => [c, {}]));

ortNode.env.logLevel = 'error';
for (const c of CASES) {
  rows[c]['onnxruntime-node'] = await benchCase(bindEngine(ortNode), load, join(dir, c), cases[c]);
  ortWeb.env.wasm.numThreads = 1;
  rows[c]['onnxruntime-web wasm in Node.js, 1 thread'] = await benchCase(bindEngine(ortWeb), load, join(dir, c), cases[c]);
}

if (haveChromium()) {
  const server = await serve({ '/js': join(REPO, 'js'), '/fixtures': dir });
  for (const threads of [1, 2]) {
    const chromium = await launch(); // a fresh browser: onnxruntime-web fixes the thread count at first use
    const page = await chromium.browser.newPage();
    await page.goto(`${server.url}/js/test/browser/index.html`);
    await page.waitForFunction(() => typeof window.benchCase === 'function');
    for (const c of CASES) {
      const r = await page.evaluate((d, i, t) => window.benchCase(d, i, t), `/fixtures/${c}`, cases[c], threads);
      if (threads > 1 && !r.crossOriginIsolated) throw new Error('the page is not cross-origin isolated: no wasm threads');
      rows[c][`Chromium wasm, ${threads} thread${threads > 1 ? 's' : ''}`] = r.ms;
    }
    await chromium.close();
  }
  await server.close();
}

const columns = Object.keys(rows[CASES[0]]);
console.log(`| workload | ${columns.join(' | ')} |`);
console.log(`|---|${columns.map(() => '---').join('|')}|`);
for (const c of CASES) console.log(`| ${c} | ${columns.map((k) => rows[c][k].toFixed(2) + ' ms').join(' | ')} |`);
