"""Build small TFLite graphs in memory (for per-operator tests), with circle-schema's object API.

Circle's tables are TFLite's with fields appended, so a model packed from them under the "TFL3" identifier is
a TFLite file LiteRT runs. Tensors are NHWC float32 unless given as arrays of another dtype.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

import numpy as np

_PKG = "circle_schema.v0_10.circle"
_TYPES = {np.dtype(np.float32): 0, np.dtype(np.int32): 2, np.dtype(np.float16): 1}


def _cls(name: str):
    """A generated class: ``Conv2DOptions``, or its object-API twin ``Conv2DOptionsT`` (same module)."""
    module = name[:-1] if name.endswith("T") else name
    return getattr(importlib.import_module(f"{_PKG}.{module}"), name)


@dataclass
class Graph:
    """Tensors by name; ``input`` declares a graph input (its batch dynamic), ``const`` a constant."""

    tensors: list = field(default_factory=list)
    buffers: list = field(default_factory=lambda: [_cls("BufferT")()])  # buffer 0: the empty one
    operators: list = field(default_factory=list)
    codes: list = field(default_factory=list)
    inputs: list = field(default_factory=list)
    _index: dict = field(default_factory=dict)
    _outside: list = field(default_factory=list)

    def _tensor(self, name: str, shape, dtype, buffer: int = 0, signature=None) -> int:
        t = _cls("TensorT")()
        t.name, t.shape, t.type, t.buffer = name, list(shape), _TYPES[np.dtype(dtype)], buffer
        t.shapeSignature = list(signature) if signature is not None else None
        self.tensors.append(t)
        self._index[name] = len(self.tensors) - 1
        return self._index[name]

    def input(self, name: str, shape, dynamic=(0,)) -> str:
        signature = [-1 if axis in dynamic else d for axis, d in enumerate(shape)]
        self.inputs.append(self._tensor(name, shape, np.float32, signature=signature))
        return name

    def const(self, name: str, value, outside: bool = False) -> str:
        """A constant; ``outside=True`` stores its bytes after the flatbuffer (Buffer.offset / size, as models
        over 2 GB do)."""
        value = np.asarray(value)
        b = _cls("BufferT")()
        if outside:
            b.offset, b.size, b.data = 2, value.nbytes, None  # the real offset is set by build()
            self._outside.append((b, value.tobytes()))
        else:
            b.data = list(value.tobytes())
        self.buffers.append(b)
        self._tensor(name, value.shape, value.dtype, buffer=len(self.buffers) - 1)
        return name

    def op(self, code: str, inputs: list[str | None], output: str, shape, options: str | None = None,
           dynamic=(0,), **fields) -> str:
        builtin = getattr(_cls("BuiltinOperator"), code)
        if builtin not in [c.builtinCode for c in self.codes]:
            oc = _cls("OperatorCodeT")()
            oc.builtinCode, oc.deprecatedBuiltinCode = builtin, min(builtin, 127)
            self.codes.append(oc)
        op = _cls("OperatorT")()
        op.opcodeIndex = [c.builtinCode for c in self.codes].index(builtin)
        op.inputs = [self._index[i] if i is not None else -1 for i in inputs]
        signature = [-1 if axis in dynamic else d for axis, d in enumerate(shape)]
        op.outputs = [self._tensor(output, shape, np.float32, signature=signature)]
        if options:
            opts = _cls(f"{options}T")()
            for key, value in fields.items():
                setattr(opts, key, value)
            op.builtinOptionsType = getattr(_cls("BuiltinOptions"), options)
            op.builtinOptions = opts
        self.operators.append(op)
        return output

    def build(self, outputs: list[str]) -> bytes:
        import flatbuffers

        sub = _cls("SubGraphT")()
        sub.tensors, sub.operators, sub.inputs = self.tensors, self.operators, self.inputs
        sub.outputs = [self._index[o] for o in outputs]
        model = _cls("ModelT")()
        model.version, model.operatorCodes, model.subgraphs, model.buffers = 3, self.codes, [sub], self.buffers

        def pack() -> bytes:
            builder = flatbuffers.Builder(1024)
            builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
            return bytes(builder.Output())

        data = pack()
        if not self._outside:
            return data
        tail, position = b"", len(data)
        for b, raw in self._outside:  # same fields present, so packing again keeps the size
            pad = -(position + len(tail)) % 16
            tail += bytes(pad)
            b.offset = position + len(tail)
            tail += raw
        data = pack()
        assert len(data) == position
        return data + tail
