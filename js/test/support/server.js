// A static file server on 127.0.0.1 for the browser tests: /js/* from the package directory, /fixtures/* from
// the fixtures directory. Cross-origin isolated (COOP/COEP), so onnxruntime-web may use threads.

import http from 'node:http';
import { readFile } from 'node:fs/promises';
import { join, normalize, extname } from 'node:path';

const TYPES = { '.html': 'text/html', '.js': 'text/javascript', '.mjs': 'text/javascript', '.wasm': 'application/wasm',
  '.json': 'application/json', '.png': 'image/png', '.css': 'text/css' };

/** Start serving `roots` ({'/js': dir, ...}); resolves to {url, close()}. */
export function serve(roots) {
  const server = http.createServer(async (request, response) => {
    const path = decodeURIComponent(new URL(request.url, 'http://localhost').pathname);
    const prefix = Object.keys(roots).find((p) => path.startsWith(p + '/'));
    const relative = prefix && normalize(path.slice(prefix.length + 1));
    if (!prefix || relative.startsWith('..')) {
      response.writeHead(404).end();
      return;
    }
    try {
      const body = await readFile(join(roots[prefix], relative));
      response.writeHead(200, {
        'Content-Type': TYPES[extname(path)] ?? 'application/octet-stream',
        'Cross-Origin-Opener-Policy': 'same-origin',
        'Cross-Origin-Embedder-Policy': 'require-corp',
        'Cache-Control': 'no-store',
      }).end(body);
    } catch {
      response.writeHead(404).end();
    }
  });
  return new Promise((resolve) => {
    server.listen(0, '127.0.0.1', () => resolve({
      url: `http://127.0.0.1:${server.address().port}`,
      close: () => new Promise((done) => server.close(done)),
    }));
  });
}
