"""ShapesInForward: the backward reads the shapes of forward values, not the values, when their shapes are
all it needs.

With a dynamic axis (a batch size left open by the exporter) the gradient of a Reshape, of a broadcast or of
a batched MatMul reads ``Shape(x)`` of a forward value ``x`` in the backward. That keeps all of ``x`` alive
from the forward to the backward for a few integers: on a BERT with LoRA adapters the query, key and value
projections and the attention context of every layer (1.5 MB each at batch 8, sequence 128). onnxruntime
orders the nodes itself, so moving the ``Shape`` node up in the graph does not help: this pass makes the
forward depend on it.

Cases handled:

1. A value ``x`` produced by the forward (the nodes the loss depends on), read outside the forward only by
   ``Shape`` and ``Size`` nodes, and read by at least one forward node: ``s = Shape(x)`` is computed in the
   forward and the forward readers read ``Reshape(x, s)`` instead of ``x`` (the same tensor; onnxruntime's
   Reshape makes no copy), so ``s`` exists before ``x``'s last forward reader runs. The backward reads ``s``:
   a plain ``Shape`` becomes ``Identity(s)``, one with ``start``/``end`` a ``Slice`` of ``s``, a ``Size`` a
   ``ReduceProd`` of ``s``. A declaration of ``x`` (a value_info: the class count of a loss's scores) is
   copied to ``Reshape(x, s)``.
2. Left alone: a value the backward reads for more than its shape (it stays alive anyway), one that only
   backward nodes read, graph inputs and initializers (alive anyway), and values a subgraph reads.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnxtrain.ir.pass_infra import Pass, PassResult
from onnxtrain.ir.passes import clone, fresh_name, node_index, share_derived_index

__all__ = ["ShapesInForward"]

SHAPE_OPS = frozenset({"Shape", "Size"})


class ShapesInForward(Pass):
    """Compute in the forward the shapes the backward reads (cases in the module's docstring)."""

    def __init__(self, loss: str | None = None):
        self.loss = loss  # None: the graph's first output

    def call(self, model: onnx.ModelProto) -> PassResult:
        graph = model.graph
        index = node_index(model)
        nodes, made = index.nodes, index.producer
        forward = index.ancestors(self.loss or graph.output[0].name)
        producer = {o: k for o, k in made.items() if k in forward}
        captured = {x for xs in index.implicit.values() for x in xs}
        backward_readers: dict[str, list[int]] = {}
        for k, xs in enumerate(index.reads):
            if k not in forward:
                for x in xs[:len(xs) - len(index.implicit.get(k, ()))]:  # its own inputs
                    if x in producer:
                        backward_readers.setdefault(x, []).append(k)
        candidates = {x for x, readers in backward_readers.items()
                      if x not in captured and all(_shape_op(nodes[k]) for k in readers)}
        forward_readers: dict[str, list[int]] = {}
        for k in sorted(forward) if candidates else ():
            for x in candidates.intersection(nodes[k].input):
                forward_readers.setdefault(x, []).append(k)
        targets = [x for x in backward_readers if x in forward_readers]
        if not targets:
            return PassResult(model, False)

        out = clone(model)
        # every name in the graph: a node input is a node's output, a graph input or an initializer
        taken = {*made, *(n.name for n in nodes), *(v.name for v in graph.input), *(v.name for v in graph.output),
                 *(v.name for v in graph.value_info), *(i.name for i in graph.initializer)}
        taken.discard("")

        def unique(name: str) -> str:
            return fresh_name(name, taken)

        shapes = {x: unique(x + "/shape") for x in targets}
        pinned = {x: unique(x + "/pinned") for x in targets}
        after: dict[int, list[onnx.NodeProto]] = {}
        for x in targets:
            after.setdefault(producer[x], []).extend([
                helper.make_node("Shape", [x], [shapes[x]], name=unique(x + "/shape_in_forward")),
                helper.make_node("Reshape", [x, shapes[x]], [pinned[x]], name=unique(x + "/pinned_after_shape"))])
        graph = out.graph
        # a pinned value is its value, reshaped to its own shape: it has the same declaration, if any (a graph
        # output's too: the runtime reads a class loss's class count from its scores' declaration)
        declared = {v.name: v for v in (*graph.value_info, *graph.output)}
        for x in targets:
            if x in declared:
                graph.value_info.add().CopyFrom(declared[x])
                graph.value_info[-1].name = pinned[x]
        replaced = {k: x for x in targets for k in backward_readers[x]}
        for k in sorted(replaced):
            graph.node[k].CopyFrom(self._from_shape(graph, graph.node[k], shapes[replaced[k]], unique))
        for k in {k for x in targets for k in forward_readers[x]}:
            node = graph.node[k]
            node.input[:] = [pinned.get(x, x) for x in node.input]
        for k in sorted(after, reverse=True):  # from the end, so that the earlier positions stay valid
            for offset, node in enumerate(after[k], 1):
                graph.node.insert(k + offset, node)
        share_derived_index(out, index, {k: len(v) for k, v in after.items()},
                            {*replaced, *(k for x in targets for k in forward_readers[x])})
        return PassResult(out, True)

    @staticmethod
    def _from_shape(graph: onnx.GraphProto, node: onnx.NodeProto, shape: str, unique) -> onnx.NodeProto:
        """``node`` (a Shape or Size of x) computed from ``shape`` = Shape(x)."""
        name = node.name or node.output[0]
        if node.op_type == "Size":
            return helper.make_node("ReduceProd", [shape], list(node.output), name=name, keepdims=0)
        attrs = {a.name: a.i for a in node.attribute}
        if not attrs:
            return helper.make_node("Identity", [shape], list(node.output), name=name)
        bounds = []
        for key, value in (("starts", attrs.get("start", 0)), ("ends", attrs.get("end", np.iinfo(np.int64).max))):
            bounds.append(unique(f"{name}/{key}"))
            graph.initializer.append(numpy_helper.from_array(np.array([value], np.int64), bounds[-1]))
        return helper.make_node("Slice", [shape, *bounds], list(node.output), name=name)


def _shape_op(node: onnx.NodeProto) -> bool:
    return node.domain in ("", "ai.onnx") and node.op_type in SHAPE_OPS
