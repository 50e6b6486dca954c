"""Element types and shapes of the values of a graph, from ONNX shape inference."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

__all__ = ["TensorInfo", "value_info", "infer_tensor_info", "np_dtype", "onnx_dtype", "FLOAT_TYPES"]

FLOAT_TYPES = frozenset(
    {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}
)

Dim = int | str | None


@dataclass(frozen=True)
class TensorInfo:
    """Element type (``onnx.TensorProto`` enum) and shape (ints, symbolic names or None) of one value."""

    elem_type: int
    shape: tuple[Dim, ...] | None

    @property
    def is_float(self) -> bool:
        return self.elem_type in FLOAT_TYPES

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    @property
    def static_shape(self) -> tuple[int, ...] | None:
        """The shape if every dimension is a known integer, else None."""
        if self.shape is None or not all(isinstance(d, int) for d in self.shape):
            return None
        return tuple(self.shape)  # type: ignore[arg-type]


def np_dtype(elem_type: int) -> np.dtype:
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))


def onnx_dtype(dtype: np.dtype | type) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def _info_from_type(tp: onnx.TypeProto) -> TensorInfo | None:
    if not tp.HasField("tensor_type"):
        return None
    tt = tp.tensor_type
    shape = None
    if tt.HasField("shape"):
        shape = tuple(
            d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim
        )
    return TensorInfo(tt.elem_type, shape)


def value_info(name: str, info: TensorInfo | None) -> onnx.ValueInfoProto:
    """A graph input/output declaration for ``name``; type and shape left open when ``info`` is None."""
    if info is None:
        return helper.make_tensor_value_info(name, onnx.TensorProto.UNDEFINED, None)
    return helper.make_tensor_value_info(name, info.elem_type, info.shape)


def infer_tensor_info(model: onnx.ModelProto) -> dict[str, TensorInfo]:
    """Run ONNX shape inference (without touching ``model``) and map every typed value name to its info."""
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    g = inferred.graph
    infos: dict[str, TensorInfo] = {}
    for init in g.initializer:
        infos[init.name] = TensorInfo(init.data_type, tuple(init.dims))
    for vi in [*g.input, *g.value_info, *g.output]:
        info = _info_from_type(vi.type)
        if info is not None and (vi.name not in infos or infos[vi.name].shape is None):
            infos[vi.name] = info
    return infos
