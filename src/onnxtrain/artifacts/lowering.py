"""What the lowerings of other domains' ops to default-domain ops share (``ml_ops.py``, ``contrib_ops.py``): the
nodes that replace one node, with fresh value names.

Constants are Constant nodes, not initializers: the model is read with its initializers taken out into the
weights, and an initializer put there would be a candidate parameter (``plan_parameters``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import helper

from onnxtrain.ir.builder import AXES_AS_INPUT_SINCE
from onnxtrain.ir.passes import fresh_name

__all__ = ["NodeEmitter"]


class NodeEmitter:
    """The default-domain nodes that replace ``node``, in ``nodes``; value names are fresh against ``taken``
    (which they join) and start with the node's name."""

    def __init__(self, node: onnx.NodeProto, taken: set[str], opset: int):
        self.prefix, self.taken, self.opset = node.name or node.output[0], taken, opset
        self.nodes: list[onnx.NodeProto] = []

    def name(self, suffix: str) -> str:
        out = fresh_name(f"{self.prefix}/{suffix}", self.taken)
        self.taken.add(out)
        return out

    def op(self, op_type: str, *inputs: str, out: str | None = None, **attrs) -> str:
        """One node with one output (``out``, or a fresh name); returns the output's name."""
        out = out or self.name(op_type)
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=self.name(op_type), **attrs))
        return out

    def const(self, value: np.ndarray, suffix: str = "Constant") -> str:
        return self.op("Constant", out=self.name(suffix), value=onnx.numpy_helper.from_array(np.asarray(value)))

    def ints(self, values: int | Sequence[int]) -> str:
        """An int64 constant: a scalar, or a 1-D vector (axes, shapes, splits)."""
        return self.const(np.asarray(values, np.int64))

    def reduce(self, op_type: str, x: str, axes: Sequence[int], keepdims: int = 1) -> str:
        """``op_type`` over ``axes``, as an input or an attribute as the opset wants."""
        if self.opset >= AXES_AS_INPUT_SINCE[op_type]:
            return self.op(op_type, x, self.ints(list(axes)), keepdims=keepdims)
        return self.op(op_type, x, axes=list(axes), keepdims=keepdims)
