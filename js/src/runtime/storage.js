// Flat storage (onnxtrain/runtime/storage.py): every trainable parameter, gradient or optimizer state is a
// view into one contiguous vector, so the optimizer graph updates them all at once and engine tensors
// created over the views once stay bound to the live values.

/** One flat vector and a view per named slot. */
export class FlatStorage {
  /**
   * @param {Array<[string, number[]]>} layout (name, shape) of each slot, in order
   * @param {Function} ArrayType typed array constructor (Float32Array for float32 parameters)
   */
  constructor(layout, ArrayType = Float32Array) {
    this.layout = layout.map(([name, shape]) => [name, [...shape]]);
    this.offsets = new Map();
    let size = 0;
    for (const [name, shape] of this.layout) {
      this.offsets.set(name, size);
      size += shape.reduce((a, b) => a * b, 1);
    }
    this.size = size;
    this.vector = new ArrayType(size);
    /** @type {Map<string, ArrayBufferView>} */
    this.views = new Map(this.layout.map(([name, shape]) => {
      const start = this.offsets.get(name);
      return [name, this.vector.subarray(start, start + shape.reduce((a, b) => a * b, 1))];
    }));
  }

  has(name) {
    return this.offsets.has(name);
  }

  shape(name) {
    return this.layout.find(([n]) => n === name)[1];
  }
}
