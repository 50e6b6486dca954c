// Checkpoints: one safetensors file, byte-compatible with onnxtrain/checkpoint/format.py.
//
// Layout (the safetensors format): an 8-byte little-endian header length N, N bytes of JSON header padded with
// spaces to a multiple of 8, then the tensor data. Tensors are named by their tensor key (trainable/<name>,
// frozen/<name>, buffer/<name>, optimizer/<param>/<state>) and written ordered by dtype then name, as the
// safetensors library does. The header's __metadata__ holds one entry, "onnxtrain": a JSON object with the
// format version, the step, every tensor's key/dtype/shape in checkpoint order, the properties, and two
// SHA-256 checksums (see onnxtrain/checkpoint/metadata.py for the full description).

import { codeOf, dtypeOfCode, arrayType, writeRank } from './dtypes.js';
import { pyDumps } from './pyjson.js';
import { Sha256, sha256Hex } from './sha256.js';
import { CheckpointData, tensorKey, splitTensorKey } from './data.js';
// peer.js imports this module too; the cycle is safe: isPeerCheckpoint is a function declaration, used at call time
import { isPeerCheckpoint } from './peer.js';

export const CHECKPOINT_FORMAT_VERSION = 1;
export const METADATA_KEY = 'onnxtrain';
const INT64_MIN = -(2n ** 63n);
const INT64_MAX = 2n ** 63n - 1n;

/** A checkpoint defect: not safetensors, truncated, altered (checksum), or not an onnxtrain checkpoint. */
export class CheckpointError extends Error {
  constructor(message) {
    super(message);
    this.name = 'CheckpointError';
  }
}

// ---- safetensors ------------------------------------------------------------------------------------------

/**
 * Serialize tensors as safetensors, exactly as `safetensors.numpy.save(tensors, metadata)` does.
 * @param {Map<string, {dtype: string, shape: number[], data: ArrayBufferView}>} tensors
 * @param {Record<string, string>} metadata
 * @returns {Uint8Array}
 */
export function writeSafetensors(tensors, metadata) {
  const encoder = new TextEncoder();
  const entries = [...tensors].map(([name, t]) => ({ name, t, code: codeOf(t.dtype), key: encoder.encode(name) }));
  entries.sort((a, b) => writeRank(a.code) - writeRank(b.code) || compareBytes(a.key, b.key));
  const parts = [`"__metadata__":{${Object.entries(metadata).map(([k, v]) => `${JSON.stringify(k)}:${JSON.stringify(v)}`).join(',')}}`];
  let offset = 0;
  for (const { name, t, code } of entries) {
    const end = offset + t.data.byteLength;
    parts.push(`${JSON.stringify(name)}:{"dtype":"${code}","shape":[${t.shape.join(',')}],"data_offsets":[${offset},${end}]}`);
    offset = end;
  }
  let header = encoder.encode(`{${parts.join(',')}}`);
  const padded = Math.ceil(header.length / 8) * 8;
  const out = new Uint8Array(8 + padded + offset);
  new DataView(out.buffer).setBigUint64(0, BigInt(padded), true);
  out.fill(0x20, 8, 8 + padded);
  out.set(header, 8);
  let position = 8 + padded;
  for (const { t } of entries) {
    out.set(bytesOf(t.data), position);
    position += t.data.byteLength;
  }
  return out;
}

/**
 * What a file that is not a safetensors file looks like from its first 8 bytes ('' if unknown), as the Python
 * reader says it (checkpoint/header.py `_recognized`): the model given for the checkpoint, a .npz, a pickle, text.
 * @param {Uint8Array} bytes at least 8 bytes
 * @returns {string}
 */
function recognized(bytes) {
  const b = bytes.subarray(0, 8);
  if (b[0] === 0x50 && b[1] === 0x4b && b[2] === 0x03 && b[3] === 0x04) return 'a zip archive (a .npz, or a torch .pt file)';
  if (b[0] === 0x80 && b[1] >= 2 && b[1] <= 5) return 'a Python pickle (a torch or numpy file?)';
  if (b[0] === 0x08 && b[1] >= 1 && b[1] <= 20 && [0x12, 0x1a, 0x22, 0x2a, 0x32, 0x3a, 0x42, 0x72].includes(b[2])) return 'an ONNX model';
  if (b.every((c) => (c >= 32 && c < 127) || c === 9 || c === 10 || c === 13)) return 'a text file';
  return '';
}

/**
 * Parse a safetensors file. Every offset is checked against the file size before any data is read.
 * @param {Uint8Array} bytes
 * @param {string} where names the file in error messages
 * @returns {{metadata: Record<string,string>, tensors: Map<string, {dtype: string, shape: number[], data: ArrayBufferView}>}}
 */
export function readSafetensors(bytes, where = 'checkpoint') {
  if (bytes.length < 8) throw new CheckpointError(`${where} is not a safetensors file: only ${bytes.length} bytes`);
  const length = Number(new DataView(bytes.buffer, bytes.byteOffset, 8).getBigUint64(0, true));
  if (length > bytes.length - 8) {
    const kind = recognized(bytes);
    if (kind) {
      throw new CheckpointError(`${where} is ${kind}, not a checkpoint (a safetensors file, as generate_artifacts writes the file named 'checkpoint' in the artifact folder)`);
    }
    throw new CheckpointError(`${where} is truncated or not a safetensors file: header length ${length} runs past the end of the ${bytes.length}-byte file`);
  }
  let header;
  try {
    header = JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(bytes.subarray(8, 8 + length)));
  } catch (error) {
    throw new CheckpointError(`${where} is not a safetensors file: its header is not valid JSON (${error.message})`);
  }
  if (header === null || typeof header !== 'object' || Array.isArray(header)) {
    throw new CheckpointError(`${where} is not a safetensors file: its header is not a JSON object`);
  }
  const metadata = header.__metadata__ ?? {};
  delete header.__metadata__;
  const dataStart = 8 + length;
  const dataSize = bytes.length - dataStart;
  const spans = [];
  const tensors = new Map();
  for (const [name, info] of Object.entries(header)) {
    const dtype = dtypeOfCode(info?.dtype);
    const [begin, end] = info?.data_offsets ?? [];
    if (!dtype || !Array.isArray(info.shape) || !(begin <= end && end <= dataSize)) {
      throw new CheckpointError(`${where} has a malformed safetensors header: tensor ${JSON.stringify(name)} (${JSON.stringify(info)})`);
    }
    const Ctor = arrayType(dtype);
    const count = info.shape.reduce((a, b) => a * b, 1);
    if (count * Ctor.BYTES_PER_ELEMENT !== end - begin) {
      throw new CheckpointError(`${where}: tensor ${JSON.stringify(name)} of ${info.dtype}${JSON.stringify(info.shape)} needs ${count * Ctor.BYTES_PER_ELEMENT} bytes, its offsets span ${end - begin}`);
    }
    // a copy in its own, aligned buffer: the file's bytes may sit at any offset of a larger buffer (a Node.js
    // Buffer's slice() is a view into a shared pool, so slice().buffer is not the tensor's bytes)
    const data = new Ctor(new Uint8Array(bytes.subarray(dataStart + begin, dataStart + end)).buffer);
    tensors.set(name, { dtype, shape: info.shape, data });
    spans.push([begin, end]);
  }
  spans.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  let position = 0;
  for (const [begin, end] of spans) {
    if (begin !== position) throw new CheckpointError(`${where} is corrupt: tensor data at byte ${begin} overlaps or leaves a gap (expected ${position})`);
    position = end;
  }
  if (position !== dataSize) throw new CheckpointError(`${where} is corrupt: ${dataSize - position} bytes follow the last tensor's data`);
  return { metadata, tensors };
}

// ---- the onnxtrain metadata entry ---------------------------------------------------------------------------

/** SHA-256 over the tensors' raw bytes, concatenated in checkpoint order. */
export function tensorsSha256(tensors) {
  const hash = new Sha256();
  for (const t of tensors) hash.update(bytesOf(t.data));
  return hash.hex();
}

function encodeMetadata(specs, step, properties, nominal, tensorDigest) {
  if (!Number.isSafeInteger(step) || step < 0) throw new RangeError(`step must be a non-negative integer, got ${step}`);
  const body = {
    format_version: CHECKPOINT_FORMAT_VERSION,
    nominal: Boolean(nominal),
    step,
    tensors: [...specs].map(([key, spec]) => [key, spec.dtype, spec.shape]),
    properties: [...properties].map(([name, value]) => encodeProperty(name, value)),
  };
  body.sha256 = { metadata: digest(body), tensors: tensorDigest };
  return pyDumps(body);
}

function decodeMetadata(metadata, where) {
  if (!(METADATA_KEY in metadata)) {
    throw new CheckpointError(`${where} is a safetensors file but not an onnxtrain checkpoint: its metadata has no "${METADATA_KEY}" entry`);
  }
  let body;
  try {
    body = JSON.parse(metadata[METADATA_KEY]);
  } catch (error) {
    throw new CheckpointError(`${where} is corrupt: its "${METADATA_KEY}" metadata is not valid JSON (${error.message})`);
  }
  const version = body?.format_version;
  if (version !== CHECKPOINT_FORMAT_VERSION) {
    const hint = version > CHECKPOINT_FORMAT_VERSION ? '; it was written by a newer onnxtrain, upgrade to load it' : '';
    throw new CheckpointError(`${where} has unsupported format version ${version}; this onnxtrain reads version ${CHECKPOINT_FORMAT_VERSION}${hint}`);
  }
  const sums = body.sha256;
  delete body.sha256;
  if (typeof sums?.metadata !== 'string' || typeof sums?.tensors !== 'string') {
    throw new CheckpointError(`${where} is corrupt or was altered: its metadata has no sha256 checksums`);
  }
  if (digest(body) !== sums.metadata) throw new CheckpointError(`${where} is corrupt or was altered: checksum mismatch in the metadata`);
  const specs = new Map(body.tensors.map(([key, dtype, shape]) => {
    splitTensorKey(key);
    return [key, { dtype, shape }];
  }));
  const properties = new Map(body.properties.map(([name, kind, text]) => [name, decodeProperty(name, kind, text)]));
  return { nominal: body.nominal, step: body.step, specs, properties, tensorsSha256: sums.tensors };
}

function digest(body) {
  return sha256Hex(pyDumps(body, true));
}

/** Properties: bigint -> "int" (int64, exact), number -> "float" (16 hex digits of the binary64 bits), string -> "str". */
function encodeProperty(name, value) {
  if (typeof value === 'bigint') {
    if (value < INT64_MIN || value > INT64_MAX) throw new RangeError(`property ${name} = ${value} does not fit in int64`);
    return [name, 'int', value.toString()];
  }
  if (typeof value === 'number') {
    const view = new DataView(new ArrayBuffer(8));
    view.setFloat64(0, value); // big-endian, as Python's struct.pack(">d")
    return [name, 'float', Array.from(new Uint8Array(view.buffer), (b) => b.toString(16).padStart(2, '0')).join('')];
  }
  if (typeof value === 'string') return [name, 'str', value];
  throw new TypeError(`property ${name} must be a bigint (int), number (float) or string, got ${typeof value}`);
}

function decodeProperty(name, kind, text) {
  if (kind === 'int') return BigInt(text);
  if (kind === 'float') {
    const view = new DataView(new ArrayBuffer(8));
    for (let i = 0; i < 8; i++) view.setUint8(i, parseInt(text.slice(2 * i, 2 * i + 2), 16));
    return view.getFloat64(0);
  }
  if (kind === 'str') return text;
  throw new CheckpointError(`property ${name} has type ${kind}, expected int, float or str`);
}

// ---- checkpoints --------------------------------------------------------------------------------------------

/**
 * The bytes of a checkpoint file, identical to what onnxtrain.checkpoint.save_checkpoint writes for the same data.
 * @param {CheckpointData} data
 * @param {boolean} includeOptimizerState false leaves out the optimizer state and saves step 0 (the step goes
 *   with the state: a run resumed from the file starts a fresh optimizer, as in Python)
 * @returns {Uint8Array}
 */
export function saveCheckpoint(data, includeOptimizerState = true) {
  let tensors = data.tensors();
  if (!includeOptimizerState) tensors = new Map([...tensors].filter(([key]) => !key.startsWith('optimizer/')));
  const specs = new Map([...tensors].map(([key, t]) => [key, { dtype: t.dtype, shape: t.shape }]));
  const step = includeOptimizerState ? data.step : 0;
  const text = encodeMetadata(specs, step, data.properties, false, tensorsSha256(tensors.values()));
  return writeSafetensors(tensors, { [METADATA_KEY]: text });
}

/**
 * Read and verify a checkpoint file (checksums, header against metadata). A nominal checkpoint (shapes only)
 * comes back with zero-filled tensors.
 * @param {Uint8Array} bytes
 * @param {string} where names the file in error messages
 * @returns {CheckpointData}
 */
export function loadCheckpoint(bytes, where = 'checkpoint') {
  if (isPeerCheckpoint(bytes)) {
    throw new CheckpointError(`${where} is an onnxruntime-training checkpoint; onnxtrain writes its own format: generate onnxtrain's artifacts from the same forward model, then convert it with importPeerCheckpoint(bytes, artifactsCheckpointBytes)`);
  }
  const { metadata, tensors } = readSafetensors(bytes, where);
  const meta = decodeMetadata(metadata, where);
  const expected = meta.nominal ? new Map() : meta.specs;
  for (const [key, spec] of expected) {
    const t = tensors.get(key);
    if (!t || t.dtype !== spec.dtype || t.shape.join() !== spec.shape.join()) {
      throw new CheckpointError(`${where} is corrupt or was altered: tensor ${JSON.stringify(key)} differs between the header and the metadata`);
    }
  }
  if (tensors.size !== expected.size) throw new CheckpointError(`${where} is corrupt or was altered: its tensors do not match its metadata`);
  const ordered = new Map([...expected.keys()].map((key) => [key, tensors.get(key)]));
  if (tensorsSha256(ordered.values()) !== meta.tensorsSha256) {
    throw new CheckpointError(`${where} is corrupt or was altered: checksum mismatch in the tensor data`);
  }
  if (meta.nominal) {
    for (const [key, spec] of meta.specs) {
      const Ctor = arrayType(spec.dtype);
      ordered.set(key, { ...spec, data: new Ctor(spec.shape.reduce((a, b) => a * b, 1)) });
    }
  }
  return CheckpointData.fromTensors(ordered, meta.step, meta.properties);
}

function bytesOf(view) {
  return new Uint8Array(view.buffer, view.byteOffset, view.byteLength);
}

function compareBytes(a, b) {
  for (let i = 0; i < Math.min(a.length, b.length); i++) if (a[i] !== b[i]) return a[i] - b[i];
  return a.length - b.length;
}

export { tensorKey };
