"""RecomputeElementwise: the backward recomputes cheap elementwise forward values instead of keeping them.

Every forward value that a gradient node reads stays alive from the forward to the backward. The erf GELU
``x * 0.5 * (1 + erf(x / sqrt(2)))`` of a BERT is the costly case: its backward reads ``x``,
``x / sqrt(2)`` and ``1 + erf(...)``, three activations of the intermediate size (6 MB each per layer at
batch 8, sequence 128). Recomputed from ``x`` next to the gradient nodes, only ``x`` is kept.

Cases handled:

1. A forward value ``v`` read by a node outside the forward (the nodes the loss depends on), produced by a
   unary elementwise op (``UNARY``), or by ``Add``/``Sub``/``Mul``/``Div``/``Pow`` whose other input is a
   one-element constant, and whose variable input is a graph input, an initializer, a value the backward
   reads anyway, or such a value itself: the backward reads a copy of its chain, built once, inserted
   before the first node that needs it. The forward then no longer holds ``v`` past its forward readers.
2. Left alone: a chain that ends in a forward value the backward does not read (keeping its root
   instead would save nothing), ops with other attributes of state (Dropout, random ops), and nodes with
   subgraphs.

onnxruntime shares one-element constants of rank 0 or 1 between nodes and then merges a copy with its
original (same op, same inputs), undoing the rewrite. So the first op of a copied chain reads its
constant through an initializer of its own, of shape ``[1] * rank`` with the output's rank (which
broadcasts to the same shape); a chain whose first op has a unary op, or an output of unknown rank or of rank
below 2, is not copied (such values are small, or the copy would be merged).
"""

from __future__ import annotations

import onnx
from onnx import numpy_helper

from onnxtrain.ir.pass_infra import Pass, PassResult
from onnxtrain.ir.passes import constant_values, node_inputs, used_names
from onnxtrain.ir.types import TensorInfo, infer_tensor_info

__all__ = ["RecomputeElementwise"]

UNARY = frozenset({"Abs", "Neg", "Exp", "Log", "Sqrt", "Reciprocal", "Erf", "Tanh", "Sigmoid", "Relu",
                   "Softplus", "Sin", "Cos"})
BINARY_WITH_CONSTANT = frozenset({"Add", "Sub", "Mul", "Div", "Pow"})
SUFFIX = "/recomputed"


class RecomputeElementwise(Pass):
    """Recompute, in the backward, the cheap elementwise forward values the gradient nodes read."""

    def __init__(self, loss: str | None = None):
        self.loss = loss  # None: the graph's first output

    def call(self, model: onnx.ModelProto) -> PassResult:
        graph = model.graph
        loss = self.loss or graph.output[0].name
        forward = _ancestors(graph.node, loss)
        producer = {o: k for k, n in enumerate(graph.node) if k in forward for o in n.output if o}
        constants = {k: v for k, v in constant_values(graph).items() if v.size == 1}
        infos = infer_tensor_info(model)
        kept = {x for k, n in enumerate(graph.node) if k not in forward for x in node_inputs(n) if x in producer}

        chains: dict[str, int | None] = {}  # value -> the index of its variable input in its producer

        def recomputable(v: str) -> bool:
            if v not in chains:
                chains[v] = None  # a cycle cannot occur in a valid graph; this also ends the recursion
                node = graph.node[producer[v]] if v in producer else None
                k = _variable_input(node, constants) if node is not None else None
                if k is not None:
                    x = node.input[k]
                    if x in producer and recomputable(x):  # continues the copy of x's chain
                        chains[v] = k
                    elif (x not in producer or x in kept) and len(node.input) == 2 and _rank(infos, v) >= 2:
                        chains[v] = k  # starts a chain at a value that is kept anyway (see above)
            return chains[v] is not None

        targets = [v for v in kept if recomputable(v)]
        if not targets:
            return PassResult(model, False)

        out = onnx.ModelProto()
        out.CopyFrom(model)
        taken = used_names(out.graph)
        copies: dict[str, str] = {}
        nodes: list[onnx.NodeProto] = []

        def unique(name: str) -> str:
            k, candidate = 0, name
            while candidate in taken:
                k += 1
                candidate = f"{name}_{k}"
            taken.add(candidate)
            return candidate

        def copy_of(v: str) -> str:
            if v in copies:
                return copies[v]
            original = graph.node[producer[v]]
            node = onnx.NodeProto()
            node.CopyFrom(original)
            node.name = unique((original.name or original.output[0]) + SUFFIX)
            k = chains[v]
            x = node.input[k]
            if x in producer and chains.get(x) is not None:
                node.input[k] = copy_of(x)
            else:  # the chain's first op: its own constant, so that CSE does not merge it with the original
                c = node.input[1 - k]
                value = constants[c].reshape((1,) * _rank(infos, v))
                node.input[1 - k] = unique(c + SUFFIX)
                out.graph.initializer.append(numpy_helper.from_array(value, node.input[1 - k]))
            del node.output[:]
            node.output.append(unique(v + SUFFIX))
            nodes.append(node)
            copies[v] = node.output[0]
            return copies[v]

        for k, node in enumerate(out.graph.node):
            if k not in forward:
                for j, x in enumerate(node.input):
                    if x in producer and chains.get(x) is not None:
                        node.input[j] = copy_of(x)
            nodes.append(node)
        del out.graph.node[:]
        out.graph.node.extend(nodes)
        return PassResult(out, True)


def _ancestors(nodes, value: str) -> set[int]:
    """The indices of the nodes ``value`` depends on."""
    producer = {o: k for k, n in enumerate(nodes) for o in n.output if o}
    seen: set[int] = set()
    stack = [value]
    while stack:
        k = producer.get(stack.pop())
        if k is not None and k not in seen:
            seen.add(k)
            stack.extend(x for x in node_inputs(nodes[k]) if x)
    return seen


def _rank(infos: dict[str, TensorInfo], value: str) -> int:
    """The value's rank, -1 if unknown."""
    info = infos.get(value)
    return -1 if info is None or info.rank is None else info.rank


def _variable_input(node: onnx.NodeProto, constants: dict) -> int | None:
    """The index of the one non-constant input of a cheap elementwise node, or None for other nodes."""
    if node.domain not in ("", "ai.onnx") or len(node.output) != 1:
        return None
    if node.op_type in UNARY and len(node.input) == 1 and not node.attribute:
        return 0
    if node.op_type in BINARY_WITH_CONSTANT and len(node.input) == 2:
        variable = [k for k, x in enumerate(node.input) if x not in constants]
        return variable[0] if len(variable) == 1 else None
    return None
