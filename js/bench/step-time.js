// Step time of the MLP and the digits CNN (tests/js/reference.py's cases, AdamW): onnxruntime-node,
// onnxruntime-web's WebAssembly backend in Node.js, and headless Chromium with 1 and 2 threads, each with the
// train-step model (one session run per step) and without it (the training and optimizer graphs).
//
//   node bench/step-time.js [FIXTURES_DIR]        (prints a Markdown table; Python's figure: bench/step_time.py)
//
// Each engine gets two sessions, with and without the train-step model, trained in alternating rounds after
// 20 warm-up steps each (harness.js's benchPair): the figures are medians over 7 rounds of 10 (CNN) or 50 (MLP)
// steps. Each Chromium thread count gets a fresh browser (onnxruntime-web fixes it at first use).

import { join } from 'node:path';
import { loadavg } from 'node:os';
import * as ortNode from 'onnxruntime-node';
import * as ortWeb from 'onnxruntime-web';
import { bindEngine } from '../src/index.js';
import { benchPair } from '../test/support/harness.js';
import { fixtures, load, REPO } from '../test/support/fixtures.js';
import { serve } from '../test/support/server.js';
import { haveChromium, launch } from '../test/support/browser.js';

if (process.argv[2]) process.env.ONNXTRAIN_JS_FIXTURES = process.argv[2];
const { dir, cases } = fixtures();
const CASES = ['mlp_adamw', 'cnn_adamw'];
const options = (c) => ({ steps: c.startsWith('mlp') ? 50 : 10 });
const rows = Object.fromEntries(CASES.map((c) => [c, {}]));
const load0 = loadavg()[0];

ortNode.env.logLevel = 'error';
ortWeb.env.wasm.numThreads = 1;
for (const c of CASES) {
  rows[c]['onnxruntime-node'] = await benchPair(bindEngine(ortNode), load, join(dir, c), cases[c], options(c));
  rows[c]['onnxruntime-web wasm in Node.js, 1 thread'] = await benchPair(bindEngine(ortWeb), load, join(dir, c), cases[c], options(c));
}

if (haveChromium()) {
  const server = await serve({ '/js': join(REPO, 'js'), '/fixtures': dir });
  for (const threads of [1, 2]) {
    const chromium = await launch();
    const page = await chromium.browser.newPage();
    await page.goto(`${server.url}/js/test/browser/index.html`);
    await page.waitForFunction(() => typeof window.benchPair === 'function');
    for (const c of CASES) {
      const r = await page.evaluate((d, i, t, o) => window.benchPair(d, i, t, o), `/fixtures/${c}`, cases[c], threads, options(c));
      if (threads > 1 && !r.crossOriginIsolated) throw new Error('the page is not cross-origin isolated: no wasm threads');
      rows[c][`Chromium wasm, ${threads} thread${threads > 1 ? 's' : ''}`] = r;
    }
    await chromium.close();
  }
  await server.close();
}

const columns = Object.keys(rows[CASES[0]]);
const ms = (v) => `${v < 10 ? v.toFixed(2) : v.toFixed(1)} ms`;
console.log(`load average ${load0.toFixed(1)} -> ${loadavg()[0].toFixed(1)}`);
console.log(`| workload | ${columns.join(' | ')} |`);
console.log(`|---|${columns.map(() => '---').join('|')}|`);
for (const c of CASES) {
  console.log(`| ${c}, one run per step | ${columns.map((k) => `${ms(rows[c][k].fused)} (${rows[c][k].ratio.toFixed(2)}x)`).join(' | ')} |`);
  console.log(`| ${c}, two runs per step | ${columns.map((k) => ms(rows[c][k].separate)).join(' | ')} |`);
}
