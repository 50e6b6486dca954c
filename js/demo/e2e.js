// Drives the web demo in headless Chromium like a person: draws digits with the mouse in one writer's style,
// labels them, personalizes, downloads the checkpoint and takes a screenshot.
//
//   node demo/e2e.js URL OUT_DIR        (tests/js/test_web_demo.py runs it against `onnxtrain web-demo`'s server)
//
// Writes OUT_DIR/personalized.ckpt (the download), OUT_DIR/web-demo.png and OUT_DIR/result.json (the page's
// numbers and examples, checked in Python).

import { existsSync, readdirSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { launch } from '../test/support/browser.js';

// The digits as pen strokes in a unit box (x right, y down).
const ellipse = (cx, cy, rx, ry, from = 0, to = 2 * Math.PI, n = 24) =>
  Array.from({ length: n + 1 }, (_, i) => {
    const a = from + ((to - from) * i) / n;
    return [cx + rx * Math.cos(a), cy + ry * Math.sin(a)];
  });
const DIGITS = {
  // this writer's 1 has a long flag and a base, their 7 a crossbar, their 4 an open top, their 9 a straight stem
  1: [[[0.2, 0.35], [0.55, 0.05], [0.55, 0.95]], [[0.25, 0.95], [0.85, 0.95]]],
  7: [[[0.15, 0.1], [0.85, 0.05], [0.35, 0.95]], [[0.3, 0.5], [0.8, 0.5]]],
  4: [[[0.55, 0.05], [0.1, 0.65], [0.95, 0.65]], [[0.7, 0.3], [0.7, 0.95]]],
  9: [ellipse(0.5, 0.28, 0.28, 0.23), [[0.78, 0.28], [0.78, 0.95]]],
  0: [ellipse(0.5, 0.5, 0.3, 0.45)],
};
const REPEATS = 3;

/** This writer's style: a slant to the right, and a small wobble that differs between repeats. */
function styled(strokes, repeat) {
  const wobble = 0.03 * (repeat - 1);
  return strokes.map((stroke) => stroke.map(([x, y]) => [x + 0.3 * (0.5 - y) + wobble, y + wobble * x]));
}

async function draw(page, strokes) {
  const box = await (await page.$('#pad')).boundingBox();
  const at = ([x, y]) => [box.x + box.width * (0.15 + 0.7 * x), box.y + box.height * (0.12 + 0.76 * y)];
  for (const stroke of strokes) {
    const [start, ...rest] = stroke.map(at);
    await page.mouse.move(...start);
    await page.mouse.down();
    for (const point of rest) await page.mouse.move(...point, { steps: 3 });
    await page.mouse.up();
  }
  // The page guesses after each stroke; wait for the guess of the whole drawing.
  await page.waitForFunction((n) => document.getElementById('guess').dataset.strokes === String(n), {}, strokes.length);
}

async function text(page, selector) {
  return page.$eval(selector, (element) => element.textContent);
}

async function main([url, out]) {
  out = resolve(out);
  const chromium = await launch();
  try {
    const page = await chromium.browser.newPage();
    await page.setViewport({ width: 1000, height: 760 });
    const errors = [];
    page.on('console', (message) => { if (message.type() === 'error') errors.push(message.text()); });
    page.on('pageerror', (error) => errors.push(String(error)));
    await page.goto(url);
    await page.waitForFunction(() => window.webDemo?.ready || window.webDemo?.error, { timeout: 30000 });
    const loadError = await page.evaluate(() => window.webDemo.error);
    if (loadError) throw new Error(`the page failed to load: ${loadError}`);

    const guesses = [];
    for (const [digit, strokes] of Object.entries(DIGITS)) {
      for (let repeat = 0; repeat < REPEATS; repeat++) {
        await draw(page, styled(strokes, repeat));
        guesses.push({ digit: Number(digit), guess: await text(page, '#guess') });
        const buttons = await page.$$('#labels button');
        await buttons[Number(digit)].click();
      }
    }
    await page.waitForFunction((n) => window.webDemo.examples().length === n && !window.webDemo.busy, {},
      Object.keys(DIGITS).length * REPEATS);

    // A bad setting is refused with a message, and nothing trains.
    const steps = await page.$eval('#steps', (input) => input.value);
    await page.$eval('#steps', (input) => { input.value = '0'; });
    await page.click('#personalize');
    const refused = { status: await text(page, '#status'), trained: await page.evaluate(() => window.webDemo.lastRun !== null) };
    await page.$eval('#steps', (input, value) => { input.value = value; }, steps);

    await page.click('#personalize');
    await page.waitForFunction(() => window.webDemo.lastRun !== null && !window.webDemo.busy, { timeout: 60000 });
    const shown = {};
    for (const id of ['examples-before', 'examples-after', 'heldout-before', 'heldout-after', 'progress-text', 'status']) {
      shown[id] = await text(page, `#${id}`);
    }
    const progress = await page.$eval('#progress', (bar) => bar.value);

    const cdp = await page.createCDPSession();
    await cdp.send('Browser.setDownloadBehavior', { behavior: 'allow', downloadPath: out });
    await page.click('#download');
    const checkpoint = join(out, 'personalized.ckpt');
    for (let waited = 0; !existsSync(checkpoint) || readdirSync(out).some((f) => f.endsWith('.crdownload')); waited += 100) {
      if (waited > 15000) throw new Error(`the download did not arrive in ${out}: ${readdirSync(out).join(', ')}`);
      await new Promise((done) => setTimeout(done, 100));
    }
    // One more of this writer's 1s, unlabelled: the screenshot shows the personalized model reading it.
    await draw(page, styled(DIGITS[1], REPEATS));
    const after = { digit: 1, guess: await text(page, '#guess') };
    await page.screenshot({ path: join(out, 'web-demo.png'), fullPage: true });

    const state = await page.evaluate(() => ({ lastRun: window.webDemo.lastRun, examples: window.webDemo.examples() }));
    const misread = () => page.$$eval('#examples .wrong', (captions) => captions.length);
    const misreadAfter = await misread();
    await page.click('#reset');
    await page.waitForFunction(() => window.webDemo.lastRun === null && !window.webDemo.busy);
    const reset = { misreadAfter, misreadReset: await misread(), accuracyShown: await text(page, '#examples-after') };
    const result = { ...state, shown, guesses, after, reset, refused, errors, progress };
    writeFileSync(join(out, 'result.json'), JSON.stringify(result, null, 1));
    console.log(JSON.stringify({ shown, guesses }));
  } finally {
    await chromium.close();
  }
}

main(process.argv.slice(2)).catch((error) => {
  console.error(error);
  process.exit(1);
});
