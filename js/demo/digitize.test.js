// digitize(): drawings become images like scikit-learn's digits (run by tests/js/test_web_demo.py).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { digitize, SIDE, MAX_VALUE } from './digitize.js';

const line = (x0, y0, x1, y1, n = 10) =>
  Array.from({ length: n + 1 }, (_, i) => ({ x: x0 + ((x1 - x0) * i) / n, y: y0 + ((y1 - y0) * i) / n }));
const rows = (image) => Array.from({ length: SIDE }, (_, r) => Array.from(image.subarray(r * SIDE, (r + 1) * SIDE)));

test('an empty drawing is null', () => {
  assert.equal(digitize([]), null);
  assert.equal(digitize([[]]), null);
});

test('a vertical stroke spans the full height, centred, as the data set\'s 1s do', () => {
  const image = rows(digitize([line(100, 20, 100, 250)]));
  for (const row of image) {
    assert.deepEqual(row.map((v) => v > 0), [false, false, false, true, true, false, false, false]);
    assert.equal(row[3], row[4]);
  }
  assert.ok(image.flat().every((v) => Number.isInteger(v) && v >= 0 && v <= MAX_VALUE));
  // A 5-pixel pen centred on the block edge covers pixel centres within 2.5: 3 columns of each block's 4 rows.
  assert.equal(image[3][3], 12);
});

test('size and position on the pad do not matter', () => {
  const small = digitize([line(10, 10, 40, 60), line(40, 60, 10, 60)]);
  const big = digitize([line(110, 30, 200, 180), line(200, 180, 110, 180)]);
  assert.deepEqual(Array.from(big), Array.from(small));
});

test('a wide drawing is fitted by its width and centred vertically', () => {
  const image = rows(digitize([line(0, 50, 300, 50)]));
  assert.deepEqual(image.map((row) => row.every((v) => v > 0)), [false, false, false, true, true, false, false, false]);
});

test('a dot stays a dot', () => {
  const image = digitize([[{ x: 5, y: 5 }]]);
  assert.deepEqual(Array.from(image).filter((v) => v > 0).length, 4);
});
