"""SequencesToSplit: ``SplitToSequence`` read only by ``SequenceAt`` at constant positions becomes a ``Split``.

torch's dynamo exporter writes ``torch.split`` / ``chunk`` (GPT-2's query/key/value, ShuffleNet's channel
split) as a sequence of tensors. Sequences carry no gradient rule; the same values from a Split do.

Cases handled:
1. ``split`` a constant 1-D tensor of sizes: one Split output per size.
2. ``split`` a constant scalar chunk length, or omitted (pieces of length 1, squeezed unless ``keepdims``),
   when the split axis has a static length.
Every reader of the sequence must be a ``SequenceAt`` whose position is a constant; otherwise the nodes are
left as they are (and the gradient reports the op it cannot differentiate).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from onnxtrain.ir.pass_infra import Pass, PassResult
from onnxtrain.ir.passes import constant_values, default_opset, node_inputs
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
            if sizes is not None:
                plans[seq] = sizes
        if not plans:
            return PassResult(model, False)
        out = onnx.ModelProto()
        out.CopyFrom(model)
        nodes: list[onnx.NodeProto] = []
        taken = {v for n in out.graph.node for v in [*n.input, *n.output]}
        pieces_of: dict[str, list[str]] = {}
        for node in out.graph.node:
            if node.op_type == "SplitToSequence" and node.output[0] in plans:
                sizes, squeeze = plans[node.output[0]]
                nodes.extend(_split_nodes(node, sizes, squeeze, taken, pieces_of, default_opset(out) or 18))
            elif node.op_type == "SequenceAt" and node.input[0] in pieces_of:
                pieces = pieces_of[node.input[0]]
                position = int(np.asarray(constants[node.input[1]]).reshape(-1)[0])
                nodes.append(helper.make_node("Identity", [pieces[position]], [node.output[0]], name=node.name))
            else:
                nodes.append(node)
        del out.graph.node[:]
        out.graph.node.extend(nodes)
        return PassResult(out, True)


def _piece_sizes(node: onnx.NodeProto, constants: dict, infos: dict) -> tuple[list[int], bool] | None:
    """The length of every piece along the axis, and whether the pieces lose that axis; None if unknown."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    axis, keepdims = attrs.get("axis", 0), attrs.get("keepdims", 1)
    split = node.input[1] if len(node.input) > 1 and node.input[1] else None
    if split is not None and split not in constants:
        return None
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


def _split_nodes(node: onnx.NodeProto, sizes: list[int], squeeze: bool, taken: set[str],
                 pieces_of: dict[str, list[str]], opset: int) -> list[onnx.NodeProto]:
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    axis = attrs.get("axis", 0)

    def fresh(hint: str) -> str:
        name, k = hint, 0
        while name in taken:
            k += 1
            name = f"{hint}_{k}"
        taken.add(name)
        return name

    base = node.output[0]
    split_sizes = fresh(f"{base}/sizes")
    pieces = [fresh(f"{base}/{i}") for i in range(len(sizes))]
    if opset >= 13:   # the sizes are an input from opset 13, an attribute before
        nodes = [helper.make_node("Constant", [], [split_sizes], value=onnx.numpy_helper.from_array(
                     np.asarray(sizes, dtype=np.int64))),
                 helper.make_node("Split", [node.input[0], split_sizes], pieces, axis=axis, name=node.name or base)]
    else:
        nodes = [helper.make_node("Split", [node.input[0]], pieces, axis=axis, split=sizes, name=node.name or base)]
    if squeeze and opset < 13:
        squeezed = [fresh(f"{p}/squeezed") for p in pieces]
        nodes += [helper.make_node("Squeeze", [p], [q], axes=[axis]) for p, q in zip(pieces, squeezed)]
        pieces = squeezed
    elif squeeze:
        axes = fresh(f"{base}/axes")
        nodes.append(helper.make_node("Constant", [], [axes], value=onnx.numpy_helper.from_array(
            np.asarray([axis], dtype=np.int64))))
        squeezed = [fresh(f"{p}/squeezed") for p in pieces]
        nodes += [helper.make_node("Squeeze", [p, axes], [s]) for p, s in zip(pieces, squeezed)]
        pieces = squeezed
    pieces_of[base] = pieces
    return nodes
