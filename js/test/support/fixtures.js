// The fixtures the tests train on: ONNXTRAIN_JS_FIXTURES (written by tests/js/reference.py, as the pytest
// driver does), or a temporary directory filled by running that script with ONNXTRAIN_PYTHON (default python3).

import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

export const REPO = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');

let cached;

export function fixtures() {
  if (cached) return cached;
  let dir = process.env.ONNXTRAIN_JS_FIXTURES;
  if (!dir) {
    dir = mkdtempSync(join(tmpdir(), 'onnxtrain-js-'));
    execFileSync(process.env.ONNXTRAIN_PYTHON || 'python3', [join(REPO, 'tests', 'js', 'reference.py'), dir], {
      stdio: 'inherit', env: { ...process.env, PYTHONPATH: join(REPO, 'src') },
    });
  }
  cached = { dir, cases: JSON.parse(readFileSync(join(dir, 'cases.json'), 'utf8')) };
  return cached;
}

/** A file's bytes as a Uint8Array. */
export async function load(path) {
  const buffer = readFileSync(path);
  return new Uint8Array(buffer.buffer, buffer.byteOffset, buffer.byteLength);
}
