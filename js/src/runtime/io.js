// Bytes in and out: a URI (a file path in Node.js, a URL in the browser) or a buffer.

const isNode = typeof globalThis.process?.versions?.node === 'string';

/**
 * The bytes of a model or checkpoint given as a Uint8Array, an ArrayBuffer, or a URI (file path in Node.js,
 * fetched URL elsewhere).
 * @returns {Promise<Uint8Array>}
 */
export async function readBytes(source, what) {
  // a plain Uint8Array over the same bytes: a Node.js Buffer's slice() would be a view, not a copy
  if (source instanceof Uint8Array) return new Uint8Array(source.buffer, source.byteOffset, source.byteLength);
  if (source instanceof ArrayBuffer) return new Uint8Array(source);
  if (typeof source !== 'string') throw new TypeError(`the ${what} must be a URI string or a Uint8Array, got ${typeof source}`);
  if (isNode && !/^(https?|blob|data):/.test(source)) {
    const { readFile } = await import('node:fs/promises');
    try {
      const buffer = await readFile(source);
      return new Uint8Array(buffer.buffer, buffer.byteOffset, buffer.byteLength);
    } catch (error) {
      throw new Error(`cannot read the ${what} ${source}: ${error.message}`);
    }
  }
  const response = await fetch(source);
  if (!response.ok) throw new Error(`cannot fetch the ${what} ${source}: HTTP ${response.status}`);
  return new Uint8Array(await response.arrayBuffer());
}

/**
 * Node.js only: write `bytes` to `path` atomically (temporary file in the same directory, fsync, rename), as
 * onnxtrain/checkpoint/atomic.py does, so a crash leaves the old file or the new one, never half of one.
 */
export async function writeFileAtomic(path, bytes) {
  if (!isNode) throw new Error('writing a file needs Node.js; in a browser, use the bytes (e.g. offer them as a download)');
  const fs = await import('node:fs/promises');
  const { dirname, basename, join } = await import('node:path');
  const temp = join(dirname(path), `.${basename(path)}.${Math.random().toString(16).slice(2, 10)}.tmp`);
  const handle = await fs.open(temp, 'wx');
  try {
    await handle.writeFile(bytes);
    await handle.sync();
    await handle.close();
    await fs.rename(temp, path);
  } catch (error) {
    await handle.close().catch(() => {});
    await fs.unlink(temp).catch(() => {});
    throw error;
  }
}
