// JSON text exactly as Python's json.dumps(value, ensure_ascii=True, separators=(",", ":")[, sort_keys=True])
// writes it: the checkpoint metadata is checksummed over this text, so it must match byte for byte.
// Values: strings, booleans, null, safe integers, bigints, arrays and plain objects (no floats: the
// format stores them as hex bits).

export function pyDumps(value, sortKeys = false) {
  if (value === null) return 'null';
  if (value === true) return 'true';
  if (value === false) return 'false';
  if (typeof value === 'bigint') return value.toString();
  if (typeof value === 'number') {
    if (!Number.isSafeInteger(value)) throw new TypeError(`pyDumps writes integers only, got ${value}`);
    return String(value);
  }
  if (typeof value === 'string') return pyString(value);
  if (Array.isArray(value)) return `[${value.map((v) => pyDumps(v, sortKeys)).join(',')}]`;
  let keys = Object.keys(value);
  if (sortKeys) keys = keys.sort(comparePy);
  return `{${keys.map((k) => `${pyString(k)}:${pyDumps(value[k], sortKeys)}`).join(',')}}`;
}

const SHORT = { '"': '\\"', '\\': '\\\\', '\n': '\\n', '\r': '\\r', '\t': '\\t', '\b': '\\b', '\f': '\\f' };

/** A string literal with every character outside ' '..'~' escaped, as ensure_ascii=True does. */
function pyString(text) {
  let out = '"';
  for (let i = 0; i < text.length; i++) {
    const ch = text[i];
    const code = text.charCodeAt(i);
    if (SHORT[ch]) out += SHORT[ch];
    else if (code >= 0x20 && code <= 0x7e) out += ch;
    else out += '\\u' + code.toString(16).padStart(4, '0'); // UTF-16 units: surrogate pairs, as Python
  }
  return out + '"';
}

/** Python sorts str keys by code point; JS sorts by UTF-16 unit. They agree outside the astral planes. */
function comparePy(a, b) {
  const x = Array.from(a, (c) => c.codePointAt(0));
  const y = Array.from(b, (c) => c.codePointAt(0));
  for (let i = 0; i < Math.min(x.length, y.length); i++) if (x[i] !== y[i]) return x[i] - y[i];
  return x.length - y.length;
}
