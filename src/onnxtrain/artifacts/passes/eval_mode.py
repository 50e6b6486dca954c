"""EvalMode: the forward graph in inference mode, for the eval model.

Cases handled:

1. BatchNormalization in training mode: ``training_mode`` set to 0 (normalise with the running statistics) and
   its training-only outputs (the updated running statistics) removed.
2. Dropout: its ``training_mode`` input emptied (inference mode: the identity; the slot stays, as in the
   peer's eval model) and its mask output removed.
3. Then nodes and initializers that no graph output depends on any more are removed.
"""

from __future__ import annotations

import onnx

from onnxtrain.ir.pass_infra import Pass, PassResult
from onnxtrain.ir.passes import clone, node_inputs, prune_nodes

__all__ = ["EvalMode"]


class EvalMode(Pass):
    """Switch training-mode BatchNormalization and Dropout nodes to inference mode."""

    def call(self, model: onnx.ModelProto) -> PassResult:
        out = clone(model)
        graph = out.graph
        modified = False
        for node in graph.node:
            if node.op_type == "BatchNormalization":
                for a in node.attribute:
                    if a.name == "training_mode" and a.i:
                        a.i = 0
                        modified = True
                modified |= len(node.output) > 1
                del node.output[1:]
            elif node.op_type == "Dropout":
                modified |= (len(node.input) > 2 and bool(node.input[2])) or len(node.output) > 1
                if len(node.input) > 2:
                    node.input[2] = ""
                del node.output[1:]
        if not modified:
            return PassResult(model, False)
        kept = prune_nodes(list(graph.node), [o.name for o in graph.output])
        used = {x for n in kept for x in node_inputs(n)}
        initializers = [i for i in graph.initializer if i.name in used]
        for field, values in ((graph.node, kept), (graph.initializer, initializers)):
            del field[:]
            field.extend(values)
        return PassResult(out, True)
