// Artifacts altered for a test, at the protobuf level and without changing any length (no library needed):
// a model whose training graph leaves the class count open, as generate_artifacts writes one with ignore_index,
// and an eval model whose "onnxtrain.training" metadata says it was written with other artifacts. And small
// graphs written from scratch (onnxModel), for what the graph readers find in them.

/** The length-delimited fields `number` of a protobuf message, as views into the same bytes. */
function submessages(bytes, number) {
  const found = [];
  let i = 0;
  const varint = () => {
    let value = 0;
    for (let scale = 1; ; scale *= 128) {
      const b = bytes[i++];
      value += (b & 0x7f) * scale;
      if (b < 0x80) return value;
    }
  };
  while (i < bytes.length) {
    const tag = varint();
    const wire = tag & 7;
    if (wire === 0) varint();
    else if (wire === 1) i += 8;
    else if (wire === 5) i += 4;
    else if (wire === 2) {
      const length = varint();
      if (Math.floor(tag / 8) === number) found.push(bytes.subarray(i, i + length));
      i += length;
    } else throw new Error(`protobuf wire type ${wire}`);
  }
  return found;
}

/**
 * A copy of the model where the value `name` (graph input, output or value_info) no longer declares axis 1
 * (the class count): its Dimension's dim_value (field 1, tag 0x08) becomes an unknown field 15 (tag 0x78).
 * ModelProto.graph = 7; GraphProto input/output/value_info = 11/12/13; ValueInfoProto name = 1, type = 2;
 * TypeProto.tensor_type = 1; Tensor.shape = 2; TensorShapeProto.dim = 1.
 */
export function withoutClassCount(model, name) {
  const copy = model.slice();
  const decoder = new TextDecoder();
  let changed = 0;
  const [graph] = submessages(copy, 7);
  for (const value of [11, 12, 13].flatMap((n) => submessages(graph, n))) {
    if (decoder.decode(submessages(value, 1)[0]) !== name) continue;
    const [shape] = submessages(submessages(submessages(value, 2)[0], 1)[0], 2);
    const dim = submessages(shape, 1)[1];
    if (dim[0] !== 0x08) throw new Error(`axis 1 of ${name} is not a dim_value`);
    dim[0] = 0x78;
    changed += 1;
  }
  if (!changed) throw new Error(`no declared value ${name}`);
  return copy;
}

/** A copy of the model with `from` replaced by `to` (same length) in its metadata. */
export function withMetadataEdited(model, from, to) {
  if (from.length !== to.length) throw new Error('the edit must keep the length');
  const encoder = new TextEncoder();
  const [a, b] = [encoder.encode(from), encoder.encode(to)];
  const copy = model.slice();
  for (let i = 0; i + a.length <= copy.length; i++) {
    if (a.every((byte, k) => copy[i + k] === byte)) {
      copy.set(b, i);
      return copy;
    }
  }
  throw new Error(`${from} not found`);
}

// -- a ModelProto from scratch: enough of onnx.proto for a few nodes, inputs, outputs and initializers ----------
const varint = (n) => {
  const out = [];
  let v = BigInt.asUintN(64, BigInt(n));
  do {
    const b = Number(v & 0x7fn);
    v >>= 7n;
    out.push(v ? b | 0x80 : b);
  } while (v);
  return out;
};
const int = (number, n) => [...varint(number * 8), ...varint(n)];
const message = (number, bytes) => [...varint(number * 8 + 2), ...varint(bytes.length), ...bytes];
const string = (number, text) => message(number, [...new TextEncoder().encode(text)]);
// TensorProto.DataType
export const FLOAT = 1;
export const INT32 = 6;
export const INT64 = 7;

/** A ValueInfoProto: a tensor of element type `elem` and shape `dims` (numbers static, strings symbolic). */
export function tensorInfo(name, elem, dims) {
  const dim = (d) => message(1, typeof d === 'number' ? int(1, d) : string(2, d));
  const tensor = [...int(1, elem), ...message(2, dims.flatMap(dim))];  // TypeProto.Tensor: elem_type, shape
  return { name, bytes: [...string(1, name), ...message(2, message(1, tensor))] };
}

/** A NodeProto of the default domain; `attributes` {name: integer}. NodeProto: input = 1, output = 2, op_type = 4,
 * attribute = 5; AttributeProto: name = 1, i = 3, type = 20. */
export function node(op, inputs, outputs, attributes = {}) {
  const attribute = ([name, value]) => message(5, [...string(1, name), ...int(3, value), ...int(20, 2)]);  // type INT
  return [...inputs.flatMap((i) => string(1, i)), ...outputs.flatMap((o) => string(2, o)), ...string(4, op),
    ...Object.entries(attributes).flatMap(attribute)];
}

/** A TensorProto (an initializer) of element type FLOAT or INT64 holding `values`. */
export function initializer(name, dims, values, elem = FLOAT) {
  const data = elem === INT64 ? BigInt64Array.from(values, BigInt) : Float32Array.from(values);
  // TensorProto: dims, data_type, name, raw_data (little-endian, as typed arrays are on the engines' platforms)
  return [...dims.flatMap((d) => int(1, d)), ...int(2, elem), ...string(8, name), ...message(9, [...new Uint8Array(data.buffer)])];
}

/** A serialized ModelProto (IR 8, opset 17) of one graph. ModelProto: ir_version = 1, graph = 7, opset_import = 8;
 * GraphProto: node = 1, name = 2, initializer = 5, input = 11, output = 12. */
export function onnxModel({ nodes, inputs, outputs, initializers = [] }) {
  const graph = [...nodes.flatMap((n) => message(1, n)), ...string(2, 'g'), ...initializers.flatMap((t) => message(5, t)),
    ...inputs.flatMap((v) => message(11, v.bytes)), ...outputs.flatMap((v) => message(12, v.bytes))];
  return Uint8Array.from([...int(1, 8), ...message(7, graph), ...message(8, [...string(1, ''), ...int(2, 17)])]);
}
