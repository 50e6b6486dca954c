// User feeds checked against a graph's declared inputs before a run, as onnxtrain/runtime/inputs.py's
// check_inputs: names, tensor type, rank, static dims, a symbolic dim (the batch) equal across the inputs that
// declare it, class labels, and indices into a table's rows (token ids). onnxruntime would reject some of these
// with a message naming no step (or, on WebAssembly, only an error code), would broadcast a batch-1 target
// silently, and reads a negative label or index as one counted from the end.

import { InputError } from '../errors.js';

/** 'float32[batch, 8]', as inputs.py's describe; '?' for what the graph leaves open. */
export function describe({ type, shape }) {
  return `${type ?? '?'}${shape === null ? '?' : `[${shape.map((d) => d ?? '?').join(', ')}]`}`;
}

/**
 * The feeds of the graph's user inputs `inputs` ([{name, type, shape}], model-metadata.js graphInputs), in
 * their order; an InputError names the first feed that is unknown, missing or does not fit its declaration,
 * a label (`labels`: classLabelInputs) that is not a class index, or an index (`tables`: tableIndexInputs) that is
 * not a row of the table it indexes.
 */
export function checkFeeds(inputs, feeds, what, labels = {}, tables = {}) {
  const expected = inputs.map((m) => m.name);
  const given = Object.keys(feeds).filter((n) => feeds[n] !== undefined);
  const unknown = given.filter((n) => !expected.includes(n));
  const missing = expected.filter((n) => feeds[n] === undefined);
  if (unknown.length || missing.length) {
    const problems = [[unknown, 'unknown'], [missing, 'missing']].filter(([names]) => names.length)
      .map(([names, kind]) => `${kind} input${names.length > 1 ? 's' : ''} ${names.map((n) => `'${n}'`).join(', ')}`);
    throw new InputError(`${what}: ${problems.join(', ')}; it takes ${inputs.map((m) => `${m.name}: ${describe(m)}`).join(', ')}`);
  }
  const symbols = new Map();
  for (const meta of inputs) {
    checkTensor(meta, feeds[meta.name], what, symbols);
    if (Object.hasOwn(labels, meta.name)) checkLabels(meta.name, feeds[meta.name], labels[meta.name], what);
    if (Object.hasOwn(tables, meta.name)) checkIndices(meta.name, feeds[meta.name], tables[meta.name], what);
  }
  checkComputedSizes(inputs, feeds, symbols, what);
  return Object.fromEntries(expected.map((n) => [n, feeds[n]]));
}

const IDENTIFIER = /^[A-Za-z_][A-Za-z0-9_]*$/;
const FUNCTIONS = { floor: Math.floor, ceil: Math.ceil, min: Math.min, max: Math.max, Min: Math.min, Max: Math.max };
const parsedSizes = new Map();

/** A declared size computed from other sizes ('s27-1', '2*batch', 'floor((height+1)/2)') as a function of the
 * symbols' sizes returning a number, or undefined when a symbol is unknown; null for a plain symbol or what is not
 * such arithmetic. As inputs.py's _size_expression and _evaluate. */
export function sizeExpression(text) {
  if (IDENTIFIER.test(text)) return null;
  if (!parsedSizes.has(text)) parsedSizes.set(text, parseSize(text));
  return parsedSizes.get(text);
}

function parseSize(text) {
  const tokens = text.match(/\/\/|[A-Za-z_][A-Za-z0-9_]*|\d+|\S/g) ?? [];
  let at = 0;
  const peek = () => tokens[at];
  const take = () => tokens[at++];
  const binary = (next, ops) => () => {
    let left = next();
    while (ops[peek()]) {
      const op = ops[take()], l = left, r = next();
      left = (s) => { const a = l(s), b = r(s); return a === undefined || b === undefined ? undefined : op(a, b); };
    }
    return left;
  };
  const divide = (f) => (a, b) => (b === 0 ? undefined : f(a, b));
  let sum;
  const atom = () => {
    const token = take();
    if (token === undefined) throw new SyntaxError(text);
    if (token === '-') { const v = atom(); return (s) => { const a = v(s); return a === undefined ? undefined : -a; }; }
    if (token === '(') { const v = sum(); if (take() !== ')') throw new SyntaxError(text); return v; }
    if (/^\d+$/.test(token)) return () => Number(token);
    if (!IDENTIFIER.test(token)) throw new SyntaxError(text);
    if (peek() !== '(') return (s) => s.get(token);
    if (!(token in FUNCTIONS)) throw new SyntaxError(text);
    take();
    const args = [sum()];
    while (peek() === ',') { take(); args.push(sum()); }
    if (take() !== ')') throw new SyntaxError(text);
    return (s) => { const v = args.map((f) => f(s)); return v.includes(undefined) ? undefined : FUNCTIONS[token](...v); };
  };
  const product = binary(atom, { '*': (a, b) => a * b, '/': divide((a, b) => a / b),
    '//': divide((a, b) => Math.floor(a / b)), '%': divide((a, b) => a - b * Math.floor(a / b)) });
  sum = binary(product, { '+': (a, b) => a + b, '-': (a, b) => a - b });
  try {
    const value = sum();
    return at === tokens.length ? value : null;
  } catch {
    return null;
  }
}

/** An InputError for the first axis whose declared size is computed from the other inputs' sizes (a causal
 * language model's labels are one token shorter than its input) and differs from the tensor's. */
function checkComputedSizes(inputs, feeds, symbols, what) {
  for (const meta of inputs) {
    (meta.shape ?? []).forEach((want, axis) => {
      const size = typeof want === 'string' ? sizeExpression(want) : null;
      const value = size ? size(symbols) : undefined;
      const dims = feeds[meta.name].dims;
      if (value === undefined || value === dims[axis]) return;
      const given = [...symbols.keys()].filter((k) => IDENTIFIER.test(k) && new RegExp(`\\b${k}\\b`).test(want))
        .map((k) => `${k}=${symbols.get(k)}`).join(', ');
      throw new InputError(`${what}: input '${meta.name}' expects ${want}=${value} on axis ${axis} (${given} from the other inputs), got shape [${dims.join(', ')}]`);
    });
  }
}

const isTensor = (value) => typeof value === 'object' && value !== null && typeof value.type === 'string'
  && Array.isArray(value.dims);

/** An InputError unless `tensor` fits `meta`; `symbols` holds the sizes of the symbolic dims seen so far. */
function checkTensor(meta, tensor, what, symbols) {
  const { name, type, shape } = meta;
  if (!isTensor(tensor)) {
    const got = tensor === null ? 'null' : tensor?.constructor?.name ?? typeof tensor;
    throw new InputError(`${what}: input '${name}' must be a Tensor (new ort.Tensor('${type}', data, dims)), got ${got}`);
  }
  const dims = [...tensor.dims];
  const got = `${tensor.type}[${dims.join(', ')}]`;
  if (type !== null && tensor.type !== type) {
    throw new InputError(`${what}: input '${name}' expects dtype ${type}, got ${tensor.type} (expected ${describe(meta)}, got ${got})`);
  }
  if (shape === null) return;
  if (dims.length && dims[0] === 0 && shape.length && typeof shape[0] !== 'number') {
    throw new InputError(`${what}: input '${name}' holds no examples (shape [${dims.join(', ')}]); a step needs a batch of at least one`);
  }
  if (dims.length !== shape.length) {
    throw new InputError(`${what}: input '${name}' expects rank ${shape.length} (${describe(meta)}), got shape [${dims.join(', ')}]`);
  }
  shape.forEach((want, axis) => {
    const have = dims[axis];
    if (typeof want === 'number' && want !== have) {
      throw new InputError(`${what}: input '${name}' expects shape ${describe(meta)}, got [${dims.join(', ')}] (axis ${axis} should be ${want})`);
    }
    if (typeof want !== 'string') return;
    if (!symbols.has(want)) symbols.set(want, have);
    if (symbols.get(want) !== have) {
      throw new InputError(`${what}: input '${name}' has ${want}=${have} on axis ${axis}, but an earlier input has ${want}=${symbols.get(want)}`);
    }
  });
}

const INTEGER_TYPES = new Set(['int8', 'uint8', 'int16', 'uint16', 'int32', 'uint32', 'int64', 'uint64']);

/** The values of an integer tensor held on the CPU, or null (a float or bool tensor, or data on a GPU: not
 * checked; inputs.py checks integer arrays only). */
function integers(tensor) {
  const onCpu = tensor.location === undefined || tensor.location === 'cpu' || tensor.location === 'cpu-pinned';
  return INTEGER_TYPES.has(tensor.type) && onCpu ? tensor.data : null;
}

/** The position of the `k`-th value of a tensor of shape `dims`, as the list inputs.py's _first_where quotes. */
function multiIndex(k, dims) {
  const index = [];
  for (let rest = k, d = dims.length - 1; d >= 0; d--) {
    index.unshift(rest % dims[d]);
    rest = Math.floor(rest / dims[d]);
  }
  return `[${index.join(', ')}]`;
}

/** An InputError unless every label of `tensor` is a class index (below the declared class count) or the loss's
 * ignore_index; as inputs.py's _check_labels (onnxruntime reads -1 as the last class without an error). */
export function checkLabels(name, tensor, { loss, classes, ignoreIndex }, what) {
  const data = integers(tensor);
  if (!data) return;
  const high = classes === null ? null : BigInt(classes);
  for (let k = 0; k < data.length; k++) {
    const value = BigInt(data[k]);
    if ((value >= 0n && (high === null || value < high)) || value === ignoreIndex) continue;
    const allowed = high === null ? 'from 0 to the number of classes - 1' : `0 to ${high - 1n}`;
    const ignore = ignoreIndex !== null ? ` or equal ignore_index=${ignoreIndex}`
      : value < 0n ? "; the loss has no ignore_index (torch's default of -100 is not implied: set it on the loss block)" : '';
    throw new InputError(`${what}: input '${name}' holds the class label ${value} at index ${multiIndex(k, tensor.dims)}; `
      + `${loss} labels must be class indices, ${allowed}${ignore}`);
  }
}

/** An InputError unless every value of `tensor` is a row of the table it indexes, in [0, rows); as inputs.py's
 * _check_indices (onnxruntime reads a negative index as a row from the end, and one past the table fails in a
 * Gather node). */
export function checkIndices(name, tensor, { table, rows }, what) {
  const data = integers(tensor);
  if (!data) return;
  for (let k = 0; k < data.length; k++) {
    const value = data[k];  // a number or a BigInt: both compare with a number
    if (value >= 0 && value < rows) continue;
    const why = value < 0 ? " (onnxruntime would read it as a row from the end, torch's Embedding refuses it: a padding id "
      + 'needs a row of its own)' : '';
    throw new InputError(`${what}: input '${name}' holds ${value} at index ${multiIndex(k, tensor.dims)}, and it indexes `
      + `the ${rows} rows of '${table}': its values must be from 0 to ${rows - 1}${why}`);
  }
}
