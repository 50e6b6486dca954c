"""FoldOutputIdentities: the producer of ``Identity(x) -> graph output`` writes the graph output itself.

onnxruntime copies a value that is both read by other nodes and passed to an output through Identity (one
full pass over the tensor per run); written directly, the output buffer is the value.

Cases handled:

1. ``x`` is produced by a node and is neither a graph output nor read by a subgraph: the Identity is removed
   and ``x`` is renamed to the output everywhere (its readers read the output).
2. Left alone: ``x`` a graph input, an initializer or a graph output; ``x`` read by a subgraph; ``x`` passed
   to a second output (only the first Identity folds).
"""

from __future__ import annotations

import onnx

from onnxtrain.ir.pass_infra import Pass, PassResult
from onnxtrain.ir.passes import clone, implicit_inputs, rename_values

__all__ = ["FoldOutputIdentities"]


class FoldOutputIdentities(Pass):
    """Remove Identity nodes between a node's output and a graph output."""

    def call(self, model: onnx.ModelProto) -> PassResult:
        graph = model.graph
        outputs = {o.name for o in graph.output}
        producers = {o for n in graph.node for o in n.output if o}
        captured = {x for n in graph.node for x in implicit_inputs(n)}
        rename: dict[str, str] = {}
        for node in graph.node:
            if node.op_type != "Identity" or node.output[0] not in outputs:
                continue
            x = node.input[0]
            if x in producers and x not in outputs and x not in captured and x not in rename:
                rename[x] = node.output[0]
        if not rename:
            return PassResult(model, False)
        out = clone(model)
        folded = [n for n in out.graph.node if n.op_type == "Identity" and rename.get(n.input[0]) == n.output[0]]
        for node in folded:
            out.graph.node.remove(node)
        rename_values(out.graph.node, rename)
        stale = [vi for vi in out.graph.value_info if vi.name in rename]  # the outputs carry the types
        for vi in stale:
            out.graph.value_info.remove(vi)
        return PassResult(out, True)
