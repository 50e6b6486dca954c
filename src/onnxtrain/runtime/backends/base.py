"""The interface the runtime needs from an execution engine."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx

from onnxtrain.errors import ArtifactError
from onnxtrain.ir.types import infer_tensor_info, np_dtype
from onnxtrain.runtime.size_limits import SizeLimit, size_limits

__all__ = ["Session", "TensorMeta", "graph_io"]


@dataclass(frozen=True)
class TensorMeta:
    name: str
    dtype: np.dtype
    shape: tuple | None  # ints, or str/None for symbolic dimensions


def graph_io(values) -> list[TensorMeta]:
    metas = []
    for v in values:
        tt = v.type.tensor_type
        shape = None
        if tt.HasField("shape"):
            shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim)
        try:
            dtype = np_dtype(tt.elem_type) if tt.elem_type else np.dtype(np.float32)
        except (KeyError, TypeError, ValueError):
            raise ArtifactError(f"the model's value {v.name!r} has an unknown element type {tt.elem_type}") from None
        metas.append(TensorMeta(v.name, dtype, shape))
    return metas


class Session:
    """Runs one model. ``run`` writes outputs into the arrays given in ``out`` (persistent buffers) and
    returns the other requested outputs as new arrays. Feeds that are not inputs of the model are ignored."""

    def __init__(self, model: onnx.ModelProto):
        self.inputs = graph_io(model.graph.input)
        self.outputs = graph_io(model.graph.output)
        self.input_names = frozenset(m.name for m in self.inputs)
        self._model = model  # the graph, for explaining a failed run (size_limits)
        self._size_limits: tuple[SizeLimit, ...] | None = None

    def size_limits(self) -> tuple[SizeLimit, ...]:
        """The inputs' dimensions that index a table of fixed length (runtime/size_limits.py), found on the
        first call: a failed run asks, to name an input longer than the model takes."""
        if self._size_limits is None:
            try:
                infos = infer_tensor_info(self._model)
            except Exception:  # the shapes only add cases; the inputs' own dimensions are known without them
                infos = {}
            try:
                self._size_limits = size_limits(self._model.graph, infos)
            except Exception:  # a graph this reading does not expect: the engine's own error must still come out
                self._size_limits = ()
        return self._size_limits

    def run(self, feeds: Mapping[str, np.ndarray], out: Mapping[str, np.ndarray], fetch: list[str],
            state: Mapping[str, np.ndarray] | None = None) -> list[np.ndarray]:
        """Run once. ``feeds`` change from call to call (data); ``state`` and ``out`` are persistent arrays
        (parameters, gradients, buffers) whose contents change but which are the same objects every time
        they come back, so a backend may bind them once."""
        raise NotImplementedError
