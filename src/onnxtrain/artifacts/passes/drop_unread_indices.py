"""DropUnreadIndices: MaxPool without an Indices output nothing reads.

The gradient of MaxPool asks the forward node for its Indices output; the eval graph reuses the forward nodes
and has no use for it. onnxruntime runs a faster, indices-free kernel for a MaxPool with one output.

Cases handled: a MaxPool whose second output no node, subgraph or graph output reads loses it. MaxPools whose
indices are read are left alone.
"""

from __future__ import annotations

import onnx

from onnxtrain.ir.pass_infra import Pass, PassResult
from onnxtrain.ir.passes import clone, node_inputs

__all__ = ["DropUnreadIndices"]


class DropUnreadIndices(Pass):
    """Remove unread Indices outputs of MaxPool nodes."""

    def call(self, model: onnx.ModelProto) -> PassResult:
        graph = model.graph
        read = {x for n in graph.node for x in node_inputs(n)} | {o.name for o in graph.output}
        unread = [i for i, n in enumerate(graph.node)
                  if n.op_type == "MaxPool" and len(n.output) > 1 and n.output[1] not in read]
        if not unread:
            return PassResult(model, False)
        out = clone(model)
        for i in unread:
            del out.graph.node[i].output[1:]
        return PassResult(out, True)
