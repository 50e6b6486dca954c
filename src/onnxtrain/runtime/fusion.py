"""One graph for a whole training step: the training graph followed by the optimizer graph.

A plain loop (``module(x, y); optimizer.step(); module.lazy_reset_grad()``) otherwise runs two sessions
per step, each with its own thread pool waking up and its own per-run overhead. The runtime builds this
graph from the two artifacts it already has (the artifacts stay separate, as the peer's API expects):

    per-parameter gradients --Reshape/Concat--> the flat gradient vector --optimizer--> new params, states

Every optimizer value is renamed under a prefix, so nothing collides with the training graph's names.
The flat gradient and the optimizer's results are outputs: the runtime binds them to the spare halves of
its double buffers and only swaps them in when ``optimizer.step()`` is called (see Module).
"""

from __future__ import annotations

import onnx
from onnx import helper

from onnxtrain import conventions as names
from onnxtrain.ir.passes import default_opset, has_subgraphs, used_names

__all__ = ["fuse_optimizer", "FusedNames"]


class FusedNames:
    """The fused graph's names for the optimizer's inputs and outputs."""

    def __init__(self, prefix: str):
        self.prefix = prefix

    def __call__(self, optimizer_name: str) -> str:
        return self.prefix + optimizer_name


def fuse_optimizer(train: onnx.ModelProto, optimizer: onnx.ModelProto,
                   trainable: list[str]) -> tuple[onnx.ModelProto, FusedNames] | None:
    """The training model with the optimizer update appended, or None if the two do not fit together
    (a gradient output missing, or an optimizer graph of another shape)."""
    tg, og = train.graph, optimizer.graph
    grad_outputs = [names.grad_output_name(p) for p in trainable]
    train_outputs = {o.name: o for o in tg.output}
    opt_inputs = {i.name for i in og.input}
    if not all(g in train_outputs for g in grad_outputs) or not {names.PARAMS, names.GRADIENTS} <= opt_inputs:
        return None
    if default_opset(train) != default_opset(optimizer) or any(o.domain not in ("", "ai.onnx")
                                                                 for o in optimizer.opset_import):
        return None
    taken = used_names(tg)
    prefix = "optimizer/"
    while any(n.startswith(prefix) for n in taken):
        prefix = "_" + prefix
    fused = FusedNames(prefix)

    nodes = list(tg.node)
    flat_pieces = []
    minus_one = prefix + "flat_shape"
    for g in grad_outputs:
        flat_pieces.append(f"{g}/flat")
        nodes.append(helper.make_node("Reshape", [g, minus_one], [flat_pieces[-1]], name=f"{g}/flatten"))
    nodes.append(helper.make_node("Concat", flat_pieces, [fused(names.GRADIENTS)], axis=0,
                                  name=prefix + "concat_gradients"))
    nodes.extend(_renamed_nodes(og, fused))

    initializers = [*tg.initializer, helper.make_tensor(minus_one, onnx.TensorProto.INT64, [1], [-1])]
    for init in og.initializer:
        renamed = onnx.TensorProto()
        renamed.CopyFrom(init)
        renamed.name = fused(init.name)
        initializers.append(renamed)
    inputs = [*tg.input, *(_renamed_value(i, fused) for i in og.input if i.name != names.GRADIENTS)]
    gradients_vi = next(i for i in og.input if i.name == names.GRADIENTS)
    outputs = [o for o in tg.output if o.name not in set(grad_outputs)]
    outputs += [_renamed_value(gradients_vi, fused), *(_renamed_value(o, fused) for o in og.output)]
    graph = helper.make_graph(nodes, f"{tg.name}+{og.name}", inputs, outputs, initializer=initializers)
    model = onnx.ModelProto()
    model.CopyFrom(train)
    model.graph.CopyFrom(graph)
    model.ClearField("metadata_props")
    return model, fused


def _renamed_nodes(graph: onnx.GraphProto, fused: FusedNames) -> list[onnx.NodeProto]:
    out = []
    for node in graph.node:
        if has_subgraphs(node):
            raise ValueError("optimizer graphs with subgraphs cannot be fused")
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.name = fused(node.name or node.output[0])
        for field in (copy.input, copy.output):
            for i, x in enumerate(field):
                if x:
                    field[i] = fused(x)
        out.append(copy)
    return out


def _renamed_value(value: onnx.ValueInfoProto, fused: FusedNames) -> onnx.ValueInfoProto:
    copy = onnx.ValueInfoProto()
    copy.CopyFrom(value)
    copy.name = fused(value.name)
    return copy
