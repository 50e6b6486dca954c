"""Specialise the training graph for the two cases of the reset flag.

The artifact keeps onnxruntime-training's interface: every accumulated gradient is
``Where(lazy_reset_grad, g, buffer + g)``, which costs an Add and a (slow, broadcasting) Where per parameter
per step. The runtime knows the flag before it runs, so it loads a graph where the choice is made:
``out = g`` after a reset (the common case, no accumulation pass at all) or ``out = buffer + g``.
"""

from __future__ import annotations

import onnx
from onnx import helper

from onnxtrain import conventions as names
from onnxtrain.ir.passes import node_inputs, prune_nodes

__all__ = ["specialize_accumulation"]


def specialize_accumulation(model: onnx.ModelProto, params: list[str], reset: bool) -> onnx.ModelProto | None:
    """A copy of ``model`` with the reset flag fixed to ``reset``; None if the graph has another structure."""
    graph = model.graph
    producers = {o: n for n in graph.node for o in n.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in graph.node:
        for x in set(node_inputs(n)):
            consumers.setdefault(x, []).append(n)
    graph_outputs = {o.name for o in graph.output}
    rename: dict[str, str] = {}       # value -> new name (the gradient written straight into the output)
    replaced: dict[int, list[onnx.NodeProto]] = {}  # id of each Where -> the nodes that take its place
    for p in params:
        out = names.grad_output_name(p)
        where = producers.get(out)
        if where is None or where.op_type != "Where" or where.input[0] != names.LAZY_RESET_GRAD:
            return None
        chosen = where.input[1] if reset else where.input[2]
        accumulate = producers.get(where.input[2])
        # Write the chosen value straight into the output when nothing else reads it.
        only_here = all(c is where or c is accumulate for c in consumers.get(chosen, []))
        if chosen in producers and only_here and chosen not in graph_outputs and chosen not in rename:
            rename[chosen] = out
            replaced[id(where)] = []
        else:
            replaced[id(where)] = [helper.make_node("Identity", [chosen], [out], name=f"{out}/select")]
    nodes = []
    for n in graph.node:
        if id(n) in replaced:
            nodes.extend(replaced[id(n)])
            continue
        if any(o in rename for o in n.output):
            n = _copy(n)
            new_outputs = [rename.get(o, o) for o in n.output]
            del n.output[:]
            n.output.extend(new_outputs)
        nodes.append(n)
    nodes = prune_nodes(nodes, [o.name for o in graph.output])
    used = {x for n in nodes for x in node_inputs(n)}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    kept_inputs = [i for i in graph.input if i.name in used]
    del out.graph.input[:]
    out.graph.input.extend(kept_inputs)
    kept_inits = [i for i in graph.initializer if i.name in used]
    del out.graph.initializer[:]
    out.graph.initializer.extend(kept_inits)
    return out


def _copy(node: onnx.NodeProto) -> onnx.NodeProto:
    n = onnx.NodeProto()
    n.CopyFrom(node)
    return n
