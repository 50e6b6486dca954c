"""Tensor sequences as one flat vector and back, so that onnxtrain's flat-vector update rules apply.

``flatten`` concatenates the raveled tensors of a sequence; ``unflatten`` splits a flat vector back into a
sequence shaped like another one. Both use SequenceMap, so the number and shapes of the tensors are only
known at run time (the peer's optimizer models take sequences of any length).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnxtrain.blocks.base import BuildContext
from onnxtrain.ir.builder import GraphBuilder

__all__ = ["flatten", "unflatten", "sequence_input", "constant_true"]


def sequence_input(ctx: BuildContext, name: str, elem_type: int) -> str:
    """Declare ``name`` as a graph input holding a sequence of ``elem_type`` tensors."""
    ctx.builder.reserve(name)
    ctx.new_inputs.append(helper.make_tensor_sequence_value_info(name, elem_type, None))
    return name


def _map(outer: GraphBuilder, inputs: list[str], in_types: list[int], out_type: int, body: Callable[..., str],
         output: str | None = None) -> str:
    """SequenceMap of ``body(builder, *element_names) -> name`` over the sequences ``inputs``."""
    sub = GraphBuilder(outer.opset, prefix="map/")
    args = [sub.unique(f"x{i}") for i in range(len(inputs))]
    result = body(sub, *args)
    constants = [helper.make_node("Constant", [], [t.name], value=t) for t in sub.initializers]
    graph = helper.make_graph(
        constants + sub.nodes, "sequence_map",
        [helper.make_tensor_value_info(a, t, None) for a, t in zip(args, in_types)],
        [helper.make_tensor_value_info(result, out_type, None)])
    if output is None:
        return outer.node("SequenceMap", inputs, body=graph)
    outer.node("SequenceMap", inputs, [output], body=graph)
    return output


def flatten(builder: GraphBuilder, seq: str, elem_type: int) -> str:
    """One 1-D tensor: the raveled tensors of ``seq``, one after the other."""
    raveled = _map(builder, [seq], [elem_type], elem_type, lambda b, x: b.op.Reshape(x, b.ints([-1])))
    return builder.op.ConcatFromSequence(raveled, axis=0)


def unflatten(builder: GraphBuilder, flat: str, like: str, elem_type: int, output: str | None = None) -> str:
    """Split the 1-D ``flat`` into a sequence of tensors shaped as those of the sequence ``like``."""
    op = builder.op
    sizes = op.ConcatFromSequence(
        _map(builder, [like], [elem_type], onnx.TensorProto.INT64,
             lambda b, x: b.op.Reshape(b.op.Size(x), b.ints([1]))),
        axis=0)
    pieces = op.SplitToSequence(flat, sizes, axis=0)
    return _map(builder, [pieces, like], [elem_type, elem_type], elem_type,
                lambda b, piece, x: b.op.Reshape(piece, b.op.Shape(x)), output=output)


def constant_true(builder: GraphBuilder, name: str) -> str:
    """A bool [1] tensor holding True, named ``name``."""
    value = numpy_helper.from_array(np.ones(1, dtype=bool))
    builder.node("Constant", [], [name], value=value)
    return name
