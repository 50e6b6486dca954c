"""Differentiate a small graph inside a rule: an expanded function body, an unrolled RNN, an If branch.

A rule emits (or copies) the nodes that recompute its op from primitive ops, then asks for their gradients:

    start = len(ctx.b.nodes)
    h = ctx.op.Tanh(ctx.op.Add(ctx.op.MatMul(x, w), b))        # the forward, recomputed from primitives
    grads = differentiate(ctx, ctx.b.nodes[start:], {h: ctx.dy[0]}, [x, w, b])

Shapes of the new values come from ONNX shape inference over those nodes alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnxtrain.autodiff.context import GradContext
from onnxtrain.autodiff.engine import vjp
from onnxtrain.autodiff.folding import fold_constants, free_values, infer_infos
from onnxtrain.ir.passes import constant_values
from onnxtrain.ir.types import TensorInfo

__all__ = ["differentiate", "fold_constants", "free_values", "infer_infos", "inline_constant_ifs"]


def inline_constant_ifs(nodes: Sequence[onnx.NodeProto], known: Mapping[str, TensorInfo], opset: int,
                        constants: Mapping[str, np.ndarray]) -> list[onnx.NodeProto]:
    """``nodes`` with every If whose condition folds to a constant replaced by the branch it takes.

    Function bodies pick paths by rank or shape that way (AffineGrid's 2-D or 3-D grid), and shape
    inference cannot see through an If. The branch's values must already have unique names.
    """
    nodes = list(nodes)
    while True:
        infos = {**known, **infer_infos(nodes, known, opset, constants)}
        values = {**constants, **fold_constants(nodes, infos, opset, constants)}
        decided = [i for i, n in enumerate(nodes) if n.op_type == "If" and n.input[0] in values]
        if not decided:
            return nodes
        for at in reversed(decided):  # every If decided now, then inference again for the ones they decide
            node = nodes[at]
            taken = "then_branch" if bool(np.asarray(values[node.input[0]]).reshape(-1)[0]) else "else_branch"
            branch = next(a.g for a in node.attribute if a.name == taken)
            body = list(branch.node)
            body += [helper.make_node("Identity", [o.name], [y], name=f"{y}_from_{taken}")
                     for o, y in zip(branch.output, node.output) if y]
            constant_inits = [helper.make_node("Constant", [], [i.name], value=i) for i in branch.initializer]
            nodes[at:at + 1] = [*constant_inits, *body]


def differentiate(ctx: GradContext, nodes: Sequence[onnx.NodeProto], seeds: Mapping[str, str | None],
                  wrt: Sequence[str]) -> dict[str, str | None]:
    """Gradients of ``wrt`` through ``nodes`` (already emitted into ``ctx.b``), seeded with ``seeds``."""
    seeds = {k: v for k, v in seeds.items() if v is not None}
    free = set(free_values(nodes))
    own = {i.name: numpy_helper.to_array(i) for i in ctx.b.initializers if i.name in free}  # the rule's constants
    constants = {**ctx.constants, **own, **_constant_nodes(nodes)}
    infos = {**ctx.infos, **infer_infos(nodes, ctx.infos, ctx.b.opset, constants)}
    constants.update(fold_constants(nodes, infos, ctx.b.opset, constants))
    return vjp(list(nodes), seeds, list(dict.fromkeys(wrt)), ctx.b, infos, constants)


def _constant_nodes(nodes: Sequence[onnx.NodeProto]) -> dict[str, np.ndarray]:
    return constant_values(helper.make_graph([n for n in nodes if n.op_type == "Constant"], "c", [], []))
