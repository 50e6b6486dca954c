// Checkpoints written by onnxruntime-training (onnxruntime-web's former TrainingSession included): the same reader
// and the same carrying-over as onnxtrain/checkpoint/peer.py. The peer's file is a flatbuffer (identifier "ODTC",
// schema ort_training_checkpoint.fbs); its offsets are followed here and checked against the file's size.

import { CheckpointData } from './data.js';
import { CheckpointError, loadCheckpoint } from './format.js';

export const PEER_FILE_IDENTIFIER = 'ODTC';
// The peer's AdamW momentums momentum0 and momentum1: the first and second moments
const ADAMW_STATES = ['exp_avg', 'exp_avg_sq'];
// ONNX TensorProto data types -> [numpy dtype name, typed array]
const ONNX_TYPES = {
  1: ['float32', Float32Array], 2: ['uint8', Uint8Array], 3: ['int8', Int8Array], 4: ['uint16', Uint16Array],
  5: ['int16', Int16Array], 6: ['int32', Int32Array], 7: ['int64', BigInt64Array], 9: ['bool', Uint8Array],
  10: ['float16', Uint16Array], 11: ['float64', Float64Array], 12: ['uint32', Uint32Array],
  13: ['uint64', BigUint64Array], 16: ['bfloat16', Uint16Array],
};

/** Whether a file starting with these bytes is an onnxruntime-training checkpoint. */
export function isPeerCheckpoint(bytes) {
  return bytes.length >= 8 && String.fromCharCode(bytes[4], bytes[5], bytes[6], bytes[7]) === PEER_FILE_IDENTIFIER;
}

class Table {
  constructor(view, pos, where) {
    this.view = view;
    this.pos = pos;
    this.where = where;
    this.vtable = pos - this.i32(pos);
    this.vtableSize = this.u16(this.vtable);
  }

  check(pos, size) {
    if (pos < 0 || pos + size > this.view.byteLength) {
      throw new CheckpointError(`${this.where} is truncated or corrupt: an offset points past the end of the ${this.view.byteLength}-byte file`);
    }
  }

  u16(pos) { this.check(pos, 2); return this.view.getUint16(pos, true); }
  u32(pos) { this.check(pos, 4); return this.view.getUint32(pos, true); }
  i32(pos) { this.check(pos, 4); return this.view.getInt32(pos, true); }

  field(slot) {
    if (slot >= this.vtableSize) return null;
    const offset = this.u16(this.vtable + slot);
    return offset ? this.pos + offset : null;
  }

  target(slot) {
    const at = this.field(slot);
    return at === null ? null : at + this.u32(at);
  }

  scalar(slot, read, size, fallback) {
    const at = this.field(slot);
    if (at === null) return fallback;
    this.check(at, size);
    return read(at);
  }

  table(slot) {
    const at = this.target(slot);
    return at === null ? null : new Table(this.view, at, this.where);
  }

  bytes(slot) {
    const at = this.target(slot);
    if (at === null) return new Uint8Array(0);
    const n = this.u32(at);
    this.check(at + 4, n);
    return new Uint8Array(this.view.buffer, this.view.byteOffset + at + 4, n);
  }

  string(slot) {
    return new TextDecoder().decode(this.bytes(slot));
  }

  int64s(slot) {
    const at = this.target(slot);
    if (at === null) return [];
    const n = this.u32(at);
    this.check(at + 4, 8 * n);
    return Array.from({ length: n }, (_, i) => Number(this.view.getBigInt64(at + 4 + 8 * i, true)));
  }

  tables(slot) {
    const at = this.target(slot);
    if (at === null) return [];
    const n = this.u32(at);
    this.check(at + 4, 4 * n);
    return Array.from({ length: n }, (_, i) => {
      const element = at + 4 + 4 * i;
      return new Table(this.view, element + this.u32(element), this.where);
    });
  }
}

function readTensor(table, where) {
  // ort.fbs Tensor: name 4, doc_string 6, dims 8, data_type 10, raw_data 12, string_data 14, external_data_offset 16
  const name = table.string(4);
  const shape = table.int64s(8);
  const type = table.scalar(10, (p) => table.view.getInt32(p, true), 4, 0);
  if (table.scalar(16, (p) => table.view.getBigInt64(p, true), 8, -1n) >= 0n) {
    throw new CheckpointError(`${where}: tensor ${JSON.stringify(name)} is stored in the peer's external data file, which onnxtrain does not read`);
  }
  const entry = ONNX_TYPES[type];
  if (!entry) throw new CheckpointError(`${where}: tensor ${JSON.stringify(name)} has the data type ${type}, which onnxtrain checkpoints do not hold`);
  const [dtype, Ctor] = entry;
  const raw = table.bytes(12);
  const count = shape.reduce((a, b) => a * b, 1);
  if (raw.length !== count * Ctor.BYTES_PER_ELEMENT) {
    throw new CheckpointError(`${where}: tensor ${JSON.stringify(name)} of shape [${shape}] and type ${dtype} should hold ${count * Ctor.BYTES_PER_ELEMENT} bytes, the file has ${raw.length}`);
  }
  const data = new Ctor(count);  // a copy, aligned (the file's bytes may not be)
  new Uint8Array(data.buffer).set(raw);
  return [name, { dtype, shape, data }];
}

/**
 * Read an onnxruntime-training checkpoint: trainable parameters (in the file's order: the peer sorts them by name),
 * frozen parameters, AdamW moments as exp_avg / exp_avg_sq, step and properties (ints as bigint).
 * @param {Uint8Array} bytes
 * @param {string} where names the file in error messages
 * @returns {CheckpointData}
 */
export function readPeerCheckpoint(bytes, where = 'peer checkpoint') {
  if (!isPeerCheckpoint(bytes)) throw new CheckpointError(`${where} is not an onnxruntime-training checkpoint (no "${PEER_FILE_IDENTIFIER}" file identifier)`);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const root = new Table(view, view.getUint32(0, true), where);
  // Checkpoint: version 4, module_state 6, optimizer_groups 8, property_bag 10
  const module = root.table(6);
  if (module === null) throw new CheckpointError(`${where} holds no module state (no parameters)`);
  // ModuleState: requires_grad_params 4, frozen_params 6, is_nominal_state 8, has_external_data 10
  if (module.scalar(8, (p) => view.getUint8(p) !== 0, 1, false)) {
    throw new CheckpointError(`${where} is a nominal checkpoint: it names the parameters but holds no weights`);
  }
  const data = new CheckpointData({
    trainable: new Map(module.tables(4).map((t) => readTensor(t, where))),
    frozen: new Map(module.tables(6).map((t) => readTensor(t, where))),
  });
  const groups = root.tables(8);
  if (groups.length > 1) throw new CheckpointError(`${where} has ${groups.length} optimizer groups; onnxtrain has one optimizer`);
  for (const group of groups) {
    // OptimizerGroup: group_name 4, step 6, initial_learning_rate 8, optimizer_states 10
    data.step = Number(group.scalar(6, (p) => view.getBigInt64(p, true), 8, 0n));
    for (const state of group.tables(10)) {
      // ParameterOptimizerState: param_name 4, momentums 6
      const momentums = state.tables(6).map((t) => readTensor(t, where)[1]);
      if (momentums.length === ADAMW_STATES.length) {
        data.optimizer.set(state.string(4), new Map(ADAMW_STATES.map((s, i) => [s, momentums[i]])));
      } else if (momentums.length) {
        throw new CheckpointError(`${where}: parameter ${JSON.stringify(state.string(4))} has ${momentums.length} optimizer states; onnxtrain reads the peer's AdamW (two) and SGD (none)`);
      }
    }
  }
  const bag = root.table(10);
  if (bag !== null) {
    // PropertyBag: ints 4, floats 6, strings 8; each property: name 4, value 6
    for (const p of bag.tables(4)) data.properties.set(p.string(4), p.scalar(6, (q) => view.getBigInt64(q, true), 8, 0n));
    for (const p of bag.tables(6)) data.properties.set(p.string(4), p.scalar(6, (q) => view.getFloat32(q, true), 4, 0));
    for (const p of bag.tables(8)) data.properties.set(p.string(4), p.string(6));
  }
  return data;
}

/**
 * The peer checkpoint's values in the layout of `template`, onnxtrain's checkpoint for artifacts generated from
 * the same forward model: as Python's onnxtrain.checkpoint.import_peer_checkpoint (which writes the same bytes).
 * @param {Uint8Array} peerBytes
 * @param {Uint8Array | CheckpointData} template
 * @param {string} where
 * @returns {CheckpointData}
 */
export function importPeerCheckpoint(peerBytes, template, where = 'peer checkpoint') {
  const peer = readPeerCheckpoint(peerBytes, where);
  const base = template instanceof CheckpointData ? template : loadCheckpoint(template, 'artifacts checkpoint');
  const values = new Map([...peer.trainable, ...peer.frozen]);
  const layout = new Map([...base.trainable, ...base.frozen, ...base.buffers]);
  const foreign = [...values.keys()].filter((n) => !layout.has(n));
  if (foreign.length) {
    throw new CheckpointError(`${where} holds ${JSON.stringify(foreign.slice(0, 5))}, which the artifacts' checkpoint does not have: generate the artifacts from the forward model the peer's artifacts came from`);
  }
  for (const [name, value] of values) {
    const want = layout.get(name);
    if (value.dtype !== want.dtype || value.shape.join() !== want.shape.join()) {
      throw new CheckpointError(`${where}: ${JSON.stringify(name)} is ${value.dtype}[${value.shape.join(', ')}], the artifacts expect ${want.dtype}[${want.shape.join(', ')}]`);
    }
  }
  const take = (part) => new Map([...part].map(([n, t]) => [n, values.get(n) ?? t]));
  const optimizer = new Map([...peer.optimizer].filter(([n]) => base.trainable.has(n)));
  return new CheckpointData({
    trainable: take(base.trainable), frozen: take(base.frozen), buffers: take(base.buffers), optimizer,
    step: peer.step, properties: new Map([...base.properties, ...peer.properties]),
  });
}
