"""SequencesToSplit: ``SplitToSequence`` read only by ``SequenceAt`` at constant positions becomes a ``Split``.

torch's dynamo exporter writes ``torch.split`` / ``chunk`` (GPT-2's query/key/value, ShuffleNet's channel
split) as a sequence of tensors. Sequences carry no gradient rule; the same values from a Split do.

Cases handled:
1. ``split`` a constant 1-D tensor of sizes: one Split output per size.
2. ``split`` a constant scalar chunk length, or omitted (pieces of length 1, squeezed unless ``keepdims``),
   when the split axis has a static length.
3. ``split`` a 1-D tensor of sizes computed at run time (CvT's ``torch.split(x, [1, height * width], 1)``, sizes
   read from the input's shape) whose length is static: a Split reading the same sizes, one output per entry.
Every reader of the sequence must be a ``SequenceAt`` whose position is a constant; otherwise the nodes are
left as they are (and the gradient reports the op it cannot differentiate).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from onnxtrain.ir.builder import GraphBuilder
from onnxtrain.ir.pass_infra import Pass, PassResult
from onnxtrain.ir.passes import clone, constant_values, default_opset, node_inputs, used_names
from onnxtrain.ir.types import infer_tensor_info

__all__ = ["SequencesToSplit"]


class SequencesToSplit(Pass):
    """Rewrite SplitToSequence + constant SequenceAt into Split."""

    def call(self, model: onnx.ModelProto) -> PassResult:
        graph = model.graph
        splits = [n for n in graph.node if n.op_type == "SplitToSequence"]
        if not splits:
            return PassResult(model, False)
        constants = constant_values(graph)
        readers: dict[str, list[onnx.NodeProto]] = {}
        for n in graph.node:
            for x in node_inputs(n):
                readers.setdefault(x, []).append(n)
        outputs = {o.name for o in graph.output}
        infos = None
        plans: dict[str, tuple[list[int], bool]] = {}
        for node in splits:
            seq = node.output[0]
            users = readers.get(seq, [])
            if seq in outputs or not users or any(u.op_type != "SequenceAt" or u.input[1] not in constants
                                                  for u in users):
                continue
            if infos is None:
                infos = infer_tensor_info(model)
            sizes = _piece_sizes(node, constants, infos)
            if sizes is not None and None in sizes[0] and (default_opset(model) or 18) < 13:
                sizes = None  # Split reads its sizes as an input from opset 13 only
            if sizes is not None:
                plans[seq] = sizes
        if not plans:
            return PassResult(model, False)
        out = clone(model)
        nodes: list[onnx.NodeProto] = []
        b = GraphBuilder(default_opset(out) or 18, taken=used_names(out.graph))
        pieces_of: dict[str, list[str]] = {}
        for node in out.graph.node:
            if node.op_type == "SplitToSequence" and node.output[0] in plans:
                start = len(b.nodes)
                pieces_of[node.output[0]] = _split_nodes(b, node, *plans[node.output[0]])
                nodes.extend(b.nodes[start:])
            elif node.op_type == "SequenceAt" and node.input[0] in pieces_of:
                pieces = pieces_of[node.input[0]]
                position = int(np.asarray(constants[node.input[1]]).reshape(-1)[0])
                nodes.append(helper.make_node("Identity", [pieces[position]], [node.output[0]], name=node.name))
            else:
                nodes.append(node)
        del out.graph.node[:]
        out.graph.node.extend(nodes)
        return PassResult(out, True)


def _piece_sizes(node: onnx.NodeProto, constants: dict, infos: dict) -> tuple[list[int | None], bool] | None:
    """The length of every piece along the axis (None: read at run time), and whether the pieces lose that axis;
    None if unknown."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    axis, keepdims = attrs.get("axis", 0), attrs.get("keepdims", 1)
    split = node.input[1] if len(node.input) > 1 and node.input[1] else None
    if split is not None and split not in constants:
        sizes = infos.get(split)
        count = sizes.static_shape if sizes is not None else None
        if count is None or len(count) != 1 or not count[0]:
            return None
        return [None] * count[0], False  # as many pieces as sizes, each read at run time
    value = np.asarray(constants[split]) if split is not None else None
    if value is not None and value.ndim == 1:
        return [int(v) for v in value], False
    info = infos.get(node.input[0])
    length = info.shape[axis] if info is not None and info.shape is not None else None
    if not isinstance(length, int):
        return None
    if value is None:
        return [1] * length, not keepdims
    chunk = int(value)
    return [min(chunk, length - start) for start in range(0, length, chunk)], False


def _split_nodes(b: GraphBuilder, node: onnx.NodeProto, sizes: list[int], squeeze: bool) -> list[str]:
    """Emit into ``b`` the Split (and Squeeze) replacing ``node``; return the pieces' names."""
    axis = {a.name: helper.get_attribute_value(a) for a in node.attribute}.get("axis", 0)
    base = node.output[0]
    pieces = [b.unique(f"{base}/{i}") for i in range(len(sizes))]

    def constant(values: list[int], hint: str) -> str:   # a Constant node: the source graph has no initializers
        return b.node("Constant", [], 1, name=hint, value=onnx.numpy_helper.from_array(
            np.asarray(values, dtype=np.int64)))

    if None in sizes:  # sizes computed at run time (opset 13 on: Split reads them as an input)
        b.node("Split", [node.input[0], node.input[1]], pieces, name=node.name or base, axis=axis)
    elif b.opset >= 13:   # the sizes (and Squeeze's axes) are inputs from opset 13, attributes before
        b.node("Split", [node.input[0], constant(sizes, f"{base}/sizes")], pieces, name=node.name or base, axis=axis)
    else:
        b.node("Split", [node.input[0]], pieces, name=node.name or base, axis=axis, split=sizes)
    if not squeeze:
        return pieces
    if b.opset >= 13:
        axes = constant([axis], f"{base}/axes")
        return [b.node("Squeeze", [p, axes]) for p in pieces]
    return [b.node("Squeeze", [p], axes=[axis]) for p in pieces]
