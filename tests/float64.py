"""Models widened to float64, to check what a graph computes without float32 rounding (onnx.reference)."""

from __future__ import annotations

import numpy as np
import onnx


def as_float64(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` with float32 replaced by float64 everywhere: tensors, declared types, casts and
    subgraphs (not type-checked: some ops need float32 inputs, e.g. Resize scales)."""
    f, d = onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE
    wide = onnx.ModelProto()
    wide.CopyFrom(model)

    def tensor(t: onnx.TensorProto) -> None:
        if t.data_type == f:
            t.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(t).astype(np.float64), t.name))

    def graph(g: onnx.GraphProto) -> None:
        for vi in [*g.input, *g.output, *g.value_info]:
            if vi.type.tensor_type.elem_type == f:
                vi.type.tensor_type.elem_type = d
        for t in g.initializer:
            tensor(t)
        for n in g.node:
            for a in n.attribute:
                if a.name in ("to", "dtype") and a.type == onnx.AttributeProto.INT and a.i == f:
                    a.i = d
                if a.type == onnx.AttributeProto.TENSOR:
                    tensor(a.t)
                for sub in [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs):
                    graph(sub)

    graph(wide.graph)
    return wide
