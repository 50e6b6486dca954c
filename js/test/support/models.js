// Artifacts altered for a test, at the protobuf level and without changing any length (no library needed):
// a model whose training graph leaves the class count open, as generate_artifacts writes one with ignore_index,
// and an eval model whose "onnxtrain.training" metadata says it was written with other artifacts.

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
