// Element types a checkpoint can hold: numpy dtype name <-> safetensors code <-> JS typed array.
// The same table as onnxtrain/checkpoint/dtypes.py. float16 and bfloat16 travel as raw Uint16 bits.

/** numpy name -> [safetensors code, typed array constructor, onnxruntime tensor type]. */
export const DTYPES = {
  float32: ['F32', Float32Array, 'float32'],
  float64: ['F64', Float64Array, 'float64'],
  float16: ['F16', Uint16Array, 'float16'],
  bfloat16: ['BF16', Uint16Array, null],
  int64: ['I64', BigInt64Array, 'int64'],
  int32: ['I32', Int32Array, 'int32'],
  int16: ['I16', Int16Array, 'int16'],
  int8: ['I8', Int8Array, 'int8'],
  uint64: ['U64', BigUint64Array, 'uint64'],
  uint32: ['U32', Uint32Array, 'uint32'],
  uint16: ['U16', Uint16Array, 'uint16'],
  uint8: ['U8', Uint8Array, 'uint8'],
  bool: ['BOOL', Uint8Array, 'bool'],
};

const NAME_OF_CODE = Object.fromEntries(Object.entries(DTYPES).map(([name, [code]]) => [code, name]));

// The order the safetensors library (Rust) writes tensors in: by dtype, this one first, then by name.
// Checked against safetensors.numpy.save; byte-compatible files depend on it.
const WRITE_ORDER = ['U64', 'I64', 'F64', 'F32', 'U32', 'I32', 'BF16', 'F16', 'U16', 'I16', 'I8', 'U8', 'BOOL'];

export function codeOf(dtype) {
  const entry = DTYPES[dtype];
  if (!entry) throw new TypeError(`dtype ${JSON.stringify(dtype)} is not supported; expected one of ${Object.keys(DTYPES).join(', ')}`);
  return entry[0];
}

export function dtypeOfCode(code) {
  return NAME_OF_CODE[code];
}

export function arrayType(dtype) {
  codeOf(dtype);
  return DTYPES[dtype][1];
}

export function writeRank(code) {
  return WRITE_ORDER.indexOf(code);
}

/** The numpy dtype name of a typed array (Uint8Array is uint8; bool tensors must say so explicitly). */
export function dtypeOfArray(array) {
  for (const [name, [, ctor]] of Object.entries(DTYPES)) {
    if (array instanceof ctor && name !== 'float16' && name !== 'bfloat16' && name !== 'bool') return name;
  }
  throw new TypeError(`no checkpoint dtype for ${array?.constructor?.name}`);
}
