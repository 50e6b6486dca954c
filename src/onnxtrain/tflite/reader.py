"""Read a .tflite or .circle flatbuffer into plain Python objects (the first subgraph, its tensors and operators).

Circle is TensorFlow Lite's schema with fields and operators appended and the file identifier "CIR0", so one
reader serves both: the identifier picks the generated schema package (`tflite` or `circle-schema`), whose
classes have the same names and fields. This module is only used by the importer, never at training time.
"""

from __future__ import annotations

import importlib
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["FlatTensor", "FlatOperator", "FlatModel", "read_flatbuffer", "FORMATS"]

# file identifier -> (format name, generated schema package, pip package)
FORMATS = {b"TFL3": ("tflite", "tflite", "tflite"), b"CIR0": ("circle", "circle_schema.v0_10.circle", "circle-schema")}

# TensorType -> numpy dtype (the types a float model's tensors use; others are refused where they matter)
_DTYPES = {0: np.float32, 1: np.float16, 2: np.int32, 3: np.uint8, 4: np.int64, 6: np.bool_, 7: np.int16,
           9: np.int8, 10: np.float64}
_PLACEHOLDER_FOR_GREATER_OP_CODES = 127


@dataclass
class FlatTensor:
    """One tensor of the subgraph; ``data`` is set for constants (their bytes are at ``location`` in the file)."""

    index: int
    name: str
    type_code: int
    shape: tuple[int, ...]
    signature: tuple[int, ...]          # shape_signature (-1 = dynamic), else the shape
    buffer: int
    data: np.ndarray | None = None
    location: tuple[int, int] | None = None  # (byte offset in the file, byte size) of the constant data
    quantized: bool = False
    sparse: bool = False

    @property
    def dtype(self) -> type | None:
        return _DTYPES.get(self.type_code)

    @property
    def is_float(self) -> bool:
        return self.type_code == 0 and not self.quantized

    @property
    def is_weight(self) -> bool:
        """A float32 or float16 constant (float16 ones are LiteRT's "float16 quantization", read via DEQUANTIZE)."""
        return self.data is not None and self.type_code in (0, 1) and not self.quantized


@dataclass
class FlatOperator:
    """One operator of the subgraph, with its builtin options object."""

    index: int
    code: str                       # BuiltinOperator name, e.g. "CONV_2D"; "CUSTOM:<name>" for custom ops
    inputs: list[int]               # -1 = optional input left out
    outputs: list[int]
    options: Any = None             # the generated *Options object (attribute getters), or None


@dataclass
class FlatModel:
    """The first subgraph of a parsed file, and the file's bytes."""

    format: str                     # "tflite" or "circle"
    data: bytes
    tensors: list[FlatTensor]
    operators: list[FlatOperator]
    inputs: list[int]
    outputs: list[int]
    subgraphs: int
    schema: Any = field(repr=False, default=None)


class _Schema:
    """The generated classes of one schema package, by name."""

    def __init__(self, package: str, pip_name: str):
        try:
            self.package = importlib.import_module(package)
        except ImportError:
            raise ImportError(f"reading this file needs the `{pip_name}` package: pip install 'onnxtrain[tflite]'") \
                from None
        self.name = package
        self._ops = {v: k for k, v in vars(self.cls("BuiltinOperator")).items() if not k.startswith("_")}
        self._options = {v: k for k, v in vars(self.cls("BuiltinOptions")).items() if not k.startswith("_")}

    def cls(self, name: str):
        return getattr(importlib.import_module(f"{self.name}.{name}"), name)

    def op_name(self, code: int) -> str:
        return self._ops.get(code, f"UNKNOWN_{code}")

    def options(self, op) -> Any:
        kind = op.BuiltinOptionsType()
        table = op.BuiltinOptions()
        if not kind or table is None:
            return None
        obj = self.cls(self._options[kind])()
        obj.Init(table.Bytes, table.Pos)
        return obj


def _constant(data: bytes, buf, tensor: FlatTensor) -> None:
    """Attach a constant's value and the place of its bytes in the file (inside the flatbuffer, or after it
    for models over 2 GB, whose buffers carry an offset and a size)."""
    if buf.Offset() > 1:
        start, size = int(buf.Offset()), int(buf.Size())
    else:
        # The generated classes give the bytes but not where they are; their flatbuffers Table does.
        slot = buf._tab.Offset(4)  # the `data` vector's vtable slot; 0 = no data (not a constant)
        if not slot:
            return
        start, size = buf._tab.Vector(slot), buf._tab.VectorLen(slot)
    if size == 0 or tensor.dtype is None:
        return
    dtype = np.dtype(tensor.dtype).newbyteorder("<")
    if size != dtype.itemsize * int(np.prod(tensor.shape)) or start + size > len(data):
        raise ValueError(f"tensor {tensor.index} ({tensor.name!r}): its buffer has {size} bytes at offset {start}, "
                         f"its shape {list(tensor.shape)} of {dtype.name} needs "
                         f"{dtype.itemsize * int(np.prod(tensor.shape))} (the file has {len(data)} bytes)")
    tensor.location = (start, size)
    tensor.data = np.frombuffer(data, dtype=dtype, count=size // dtype.itemsize, offset=start).reshape(
        tensor.shape).astype(tensor.dtype)


def read_flatbuffer(data: bytes, source: str = "model") -> FlatModel:
    """Parse ``data`` (the bytes of a .tflite or .circle file; ``source`` names it in errors)."""
    ident = bytes(data[4:8])
    if len(data) < 8 or ident not in FORMATS:
        raise ValueError(f"{source} is not a TensorFlow Lite or circle model: its file identifier is {ident!r}, "
                         f"expected one of {', '.join(repr(k) for k in FORMATS)}")
    fmt, package, pip_name = FORMATS[ident]
    schema = _Schema(package, pip_name)
    try:
        return _parse(data, fmt, schema, source)
    except (struct.error, IndexError, UnicodeDecodeError, OverflowError) as exc:  # Python flatbuffers has no verifier
        raise ValueError(f"{source} is not a valid {fmt} file: it is truncated or corrupt ({exc})") from None


def _parse(data: bytes, fmt: str, schema: _Schema, source: str) -> FlatModel:
    model = schema.cls("Model").GetRootAs(data, 0)
    if model.SubgraphsLength() < 1:
        raise ValueError(f"{source} has no subgraph")
    graph = model.Subgraphs(0)
    tensors = []
    for i in range(graph.TensorsLength()):
        t = graph.Tensors(i)
        shape = tuple(int(d) for d in t.ShapeAsNumpy()) if t.ShapeLength() else ()
        signature = tuple(int(d) for d in t.ShapeSignatureAsNumpy()) if t.ShapeSignatureLength() else shape
        q = t.Quantization()
        quantized = q is not None and (q.ScaleLength() > 0 or q.ZeroPointLength() > 0)
        tensor = FlatTensor(i, (t.Name() or b"").decode(), t.Type(), shape, signature, t.Buffer(),
                            quantized=quantized, sparse=t.Sparsity() is not None)
        if t.Buffer() > 0:
            _constant(data, model.Buffers(t.Buffer()), tensor)
        tensors.append(tensor)
    operators = []
    for i in range(graph.OperatorsLength()):
        op = graph.Operators(i)
        code_table = model.OperatorCodes(op.OpcodeIndex())
        deprecated, builtin = code_table.DeprecatedBuiltinCode(), code_table.BuiltinCode()
        code = builtin if deprecated == _PLACEHOLDER_FOR_GREATER_OP_CODES else max(deprecated, builtin)
        name = schema.op_name(code)
        if name == "CUSTOM":
            name = f"CUSTOM:{(code_table.CustomCode() or b'').decode()}"
        operators.append(FlatOperator(i, name, [int(j) for j in op.InputsAsNumpy()] if op.InputsLength() else [],
                                      [int(j) for j in op.OutputsAsNumpy()] if op.OutputsLength() else [],
                                      schema.options(op)))
    return FlatModel(fmt, bytes(data), tensors, operators, [int(j) for j in graph.InputsAsNumpy()],
                     [int(j) for j in graph.OutputsAsNumpy()], model.SubgraphsLength(), schema)
