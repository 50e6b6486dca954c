"""CastLikeToCast: a ``CastLike`` whose target type is declared becomes a ``Cast`` to that type.

torch's dynamo exporter (``optimize=False``) writes the zero bias of a bias-free convolution as
``Expand(CastLike(0, input), Shape(weight)[:1])``: the value depends on the model's input only through its type,
but onnxruntime cannot fold it, so the Conv's bias is not a constant and onnxruntime neither folds the
BatchNormalization after it nor lays the convolution out for its blocked kernels, even when the weights are
constants (runtime/passes/frozen_constants.py). As a ``Cast`` of a constant it folds.

Cases handled: a default-domain ``CastLike(x, like)`` where ``like`` is a graph input, an initializer, a graph
output or a ``value_info`` with a declared element type (or one of the types given to the pass) becomes
``Cast(x, to=that type)`` with the same name, output and ``saturate`` attribute. Others are left alone.
"""

from __future__ import annotations

from collections.abc import Mapping

import onnx
from onnx import helper

from onnxtrain.ir.pass_infra import Pass, PassResult
from onnxtrain.ir.passes import clone

__all__ = ["CastLikeToCast"]


class CastLikeToCast(Pass):
    """Rewrite ``CastLike`` nodes whose target element type is declared (cases in the module's docstring).

    Args:
        types: element types (``onnx.TensorProto`` codes) of values the graph does not declare, e.g. the weights
            of a graph held without its initializers.
    """

    def __init__(self, types: Mapping[str, int] | None = None):
        self.types = dict(types or {})

    def call(self, model: onnx.ModelProto) -> PassResult:
        graph = model.graph
        declared = {v.name: v.type.tensor_type.elem_type for v in [*graph.input, *graph.value_info, *graph.output]
                    if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type}
        declared.update({t.name: t.data_type for t in graph.initializer}, **self.types)
        targets = [k for k, n in enumerate(graph.node) if n.op_type == "CastLike" and n.domain in ("", "ai.onnx")
                   and len(n.input) == 2 and declared.get(n.input[1])]
        if not targets:
            return PassResult(model, False)
        out = clone(model)
        for k in targets:
            node = out.graph.node[k]
            cast = helper.make_node("Cast", [node.input[0]], list(node.output), name=node.name,
                                    to=declared[node.input[1]])
            cast.attribute.extend(a for a in node.attribute if a.name == "saturate")
            node.CopyFrom(cast)
        return PassResult(out, True)
