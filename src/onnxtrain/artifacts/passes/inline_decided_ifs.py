"""InlineDecidedIfs: an If whose condition the source graph's ranks and static sizes decide becomes the branch it
takes.

torch's TorchScript exporter writes some ops as an If on the input's rank or shape: ``Tensor.tile`` (whether the
repeats outnumber the input's axes) and ``squeeze(dim)`` of a dimension it cannot prove is 1 (``Shape(x)[dim] ==
1``). ONNX shape inference cannot see through an If whose branches make values of different ranks, so the If's
outputs and every value computed from them had no rank, and the first gradient rule that needed one raised
UnknownShapeError (DINOv3's rotary angles, xLSTM's mLSTM kernel), though onnxruntime runs those exports.

Cases handled: top-level If nodes whose condition folds to a constant from the graph inputs' declared types, the
weights' shapes and the small integer constants (shape inference and folding of Shape, Size, Gather, Equal,
Less, ... as autodiff.subgraph.inline_constant_ifs does for function bodies); the values a taken branch makes are
renamed first where their names are used in the graph. Left alone: an If whose condition depends on a run-time
value or a symbolic size, and one whose branch would need renaming inside a nested subgraph.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx

from onnxtrain.autodiff.subgraph import inline_constant_ifs
from onnxtrain.ir.pass_infra import Pass, PassResult
from onnxtrain.ir.passes import (
    clone,
    constant_values,
    default_opset,
    fresh_name,
    has_subgraphs,
    rename_values,
    used_names,
)
from onnxtrain.ir.types import TensorInfo, info_from_type, onnx_dtype

__all__ = ["InlineDecidedIfs"]

_INTEGER_TYPES = (np.int64, np.int32)


class InlineDecidedIfs(Pass):
    """Replace each top-level If whose condition is known before the run by its taken branch.

    Args:
        weights: the model's initializers (the source graph is passed without them): their shapes, and the values
            of the small integer ones.
    """

    def __init__(self, weights: Mapping[str, np.ndarray]):
        self.weights = weights

    def call(self, model: onnx.ModelProto) -> PassResult:
        graph = model.graph
        if not any(n.op_type == "If" for n in graph.node):
            return PassResult(model, False)
        known = {i.name: info for i in graph.input if (info := info_from_type(i.type)) is not None}
        known.update({k: TensorInfo(onnx_dtype(v.dtype), tuple(v.shape)) for k, v in self.weights.items()})
        constants = {k: v for k, v in {**self.weights, **constant_values(graph)}.items()
                     if v.dtype in _INTEGER_TYPES and v.size <= 4096}
        taken = used_names(graph)
        nodes = []
        for node in graph.node:
            nodes.append(_unclashed(node, taken) if node.op_type == "If" else node)
        inlined = inline_constant_ifs(nodes, known, default_opset(model), constants)
        if sum(n.op_type == "If" for n in inlined) == sum(n.op_type == "If" for n in graph.node):
            return PassResult(model, False)
        out = clone(model)
        del out.graph.node[:]
        out.graph.node.extend(inlined)
        return PassResult(out, True)


def _unclashed(node: onnx.NodeProto, taken: set[str]) -> onnx.NodeProto:
    """The If ``node`` with the values its branches make renamed where ``taken`` (the graph's names) has them, or
    the node itself when none clash or a clashing name is read inside a nested subgraph; adds the branches' names
    to ``taken``."""
    branches = [a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH]
    made = [x for g in branches for x in [*(i.name for i in g.initializer), *(o for n in g.node for o in n.output)]
            if x]
    clashes = sorted(set(made) & taken)
    if not clashes:
        taken.update(made)
        return node
    if any(has_subgraphs(n) for g in branches for n in g.node):
        return node
    renamed = onnx.NodeProto()
    renamed.CopyFrom(node)
    for attr in renamed.attribute:
        if attr.type != onnx.AttributeProto.GRAPH:
            continue
        g = attr.g
        rename = {x: fresh_name(x, taken) for x in clashes if x in {i.name for i in g.initializer}
                  or any(x in n.output for n in g.node)}
        for init in g.initializer:
            init.name = rename.get(init.name, init.name)
        rename_values(g.node, rename)
        for o in g.output:
            o.name = rename.get(o.name, o.name)
    taken.update(made)
    return renamed
