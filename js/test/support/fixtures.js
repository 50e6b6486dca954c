// The fixtures the tests train on: ONNXTRAIN_JS_FIXTURES (written by tests/js/reference.py, as the pytest
// driver does), or a temporary directory filled by running that script with ONNXTRAIN_PYTHON (default: the repo's
// .venv, as the README creates it, else python3).

import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

export const REPO = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');

let cached;

/** The Python that writes the fixtures: it needs onnxtrain's dependencies (numpy, onnx, onnxruntime, safetensors). */
function python() {
  if (process.env.ONNXTRAIN_PYTHON) return process.env.ONNXTRAIN_PYTHON;
  const venv = [join(REPO, '.venv', 'bin', 'python'), join(REPO, '.venv', 'Scripts', 'python.exe')].find(existsSync);
  return venv || 'python3';
}

export function fixtures() {
  if (cached) return cached;
  let dir = process.env.ONNXTRAIN_JS_FIXTURES;
  if (!dir) {
    dir = mkdtempSync(join(tmpdir(), 'onnxtrain-js-'));
    const interpreter = python();
    try {
      execFileSync(interpreter, [join(REPO, 'tests', 'js', 'reference.py'), dir], {
        stdio: 'inherit', env: { ...process.env, PYTHONPATH: join(REPO, 'src') },
      });
    } catch (error) {
      throw new Error(`writing the test fixtures with ${interpreter} failed (${error.message}); it needs onnxtrain's `
        + 'Python dependencies (numpy, onnx, onnxruntime, safetensors): set ONNXTRAIN_PYTHON to a Python that has '
        + 'them, e.g. the .venv that the README\'s commands create');
    }
  }
  cached = { dir, cases: JSON.parse(readFileSync(join(dir, 'cases.json'), 'utf8')) };
  return cached;
}

/** A file's bytes as a Uint8Array. */
export async function load(path) {
  const buffer = readFileSync(path);
  return new Uint8Array(buffer.buffer, buffer.byteOffset, buffer.byteLength);
}
