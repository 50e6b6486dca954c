"""Sizes an input cannot exceed: a run-time dimension of an input that indexes a table of fixed length.

Transformers find their positions in a table of ``max_position_embeddings`` rows, by the sequence length. A BERT
slices its position ids by it: a longer sequence gets the whole table, and a later node fails on shapes that no
longer agree (onnxruntime names an Expand or an Add, not the input). A GPT-2 gathers ``arange(sequence)`` from
its position embeddings: onnxruntime reports an index out of range, which reads like a token id above the
vocabulary. After such a failure the runtime looks for both patterns (:func:`size_limits`) so that the error
names the input, its length and the table's (runtime/engine_errors.py). They only explain a failure: a model
that slices a table by a length and never needs the two to agree still runs with longer inputs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx

from onnxtrain.ir.passes import constant_values
from onnxtrain.ir.types import TensorInfo

__all__ = ["SizeLimit", "exceeded", "size_limits"]

# ops that pass a value on unchanged but for its layout or type
_PASS_THROUGH = frozenset({"Unsqueeze", "Squeeze", "Reshape", "Cast", "Identity", "Flatten", "Expand"})


@dataclass(frozen=True)
class SizeLimit:
    """``input``'s dimension ``axis`` indexes ``table`` (``limit`` long on the indexed axis) from 0."""

    input: str
    axis: int
    limit: int
    table: str


def size_limits(graph: onnx.GraphProto, infos: Mapping[str, TensorInfo] | None = None,
                constants: Mapping[str, np.ndarray] | None = None) -> tuple[SizeLimit, ...]:
    """The Slices of ``graph`` (top level) that cut a table of fixed length at a graph input's dimension from 0,
    and the Gathers that read ``range(0, dimension)`` from one. ``infos`` (the graph's inferred shapes, symbolic)
    also find a dimension read from an intermediate value's shape; ``constants``, the graph's small constants
    (``ir.passes.constant_values``) when the caller has them already."""
    infos = infos or {}
    producer = {o: n for n in graph.node for o in n.output if o}
    values = _small_constants(graph, constants)
    dims = {i.name: list(i.dims) for i in graph.initializer}
    dims.update({n.output[0]: list(a.t.dims) for n in graph.node if n.op_type == "Constant"
                 for a in n.attribute if a.name == "value"})
    for name, info in infos.items():
        if name not in dims and info.shape is not None:
            dims[name] = list(info.shape)
    inputs = {i.name: [d.dim_value if d.HasField("dim_value") else d.dim_param
                       for d in i.type.tensor_type.shape.dim] for i in graph.input}

    def dimension(value: str) -> tuple[str, int] | None:
        return _input_dimension(value, producer, values, inputs, infos)

    limits = []
    for node in graph.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        table = dims.get(node.input[0]) if node.input else None
        if node.op_type == "Slice" and len(node.input) >= 3 and table:
            dim, starts = dimension(node.input[2]), values.get(node.input[1])
            axes = values.get(node.input[3]) if len(node.input) > 3 and node.input[3] else np.zeros(1, np.int64)
            if dim is None or starts is None or axes is None or starts.size != 1 or axes.size != 1:
                continue
            axis = int(axes.reshape(-1)[0]) % len(table)
            if int(starts.reshape(-1)[0]) == 0:
                limits.append((dim, table[axis], node.input[0]))
        elif node.op_type == "Gather" and len(node.input) == 2 and table:
            axis = next((a.i for a in node.attribute if a.name == "axis"), 0) % len(table)
            dim = _range_limit(node.input[1], producer, values, dimension)
            if dim is not None:
                limits.append((dim, table[axis], node.input[0]))
    found = [SizeLimit(dim[0], dim[1], size, table) for dim, size, table in limits
             if isinstance(size, int) and size > 0]
    return tuple(dict.fromkeys(found))


def exceeded(limits: tuple[SizeLimit, ...], feeds: Mapping[str, object]) -> str:
    """A sentence naming the first fed input longer than a table it indexes, or ''."""
    for limit in limits:
        shape = getattr(feeds.get(limit.input), "shape", None)
        if shape is not None and len(shape) > limit.axis and shape[limit.axis] > limit.limit:
            return (f"input {limit.input!r} is {shape[limit.axis]} long on axis {limit.axis}, and the model indexes "
                    f"a table of {limit.limit} ({limit.table!r}) by that length: it takes at most {limit.limit} "
                    f"there, for a transformer its longest sequence")
    return ""


def _small_constants(graph: onnx.GraphProto, constants: Mapping[str, np.ndarray] | None) -> dict[str, np.ndarray]:
    """The graph's small constants (ir.passes.constant_values, unless given), also as read through a Reshape or a
    Cast (torch.export's slice bounds)."""
    values = dict(constants) if constants is not None else constant_values(graph)
    for n in graph.node:
        if n.op_type in _PASS_THROUGH and n.input and n.input[0] in values and n.output[0] not in values:
            values[n.output[0]] = values[n.input[0]]
    return values


def _range_limit(indices: str, producer: dict[str, onnx.NodeProto], values: dict[str, np.ndarray],
                 dimension) -> tuple[str, int] | None:
    """The input dimension ``d`` if ``indices`` are ``range(0, d)`` (through view ops, or plus a zero)."""
    node = producer.get(indices)
    while node is not None and (node.op_type in _PASS_THROUGH or (
            node.op_type == "Add" and len(node.input) == 2 and _is(values, node.input[1], 0))):
        node = producer.get(node.input[0])
    if (node is None or node.op_type != "Range" or not _is(values, node.input[0], 0)
            or not _is(values, node.input[2], 1)):
        return None
    return dimension(node.input[1])


def _is(values: dict[str, np.ndarray], name: str, number: int) -> bool:
    value = values.get(name)
    return value is not None and value.size == 1 and value.reshape(-1)[0] == number


def _input_dimension(value: str, producer: dict[str, onnx.NodeProto], values: dict[str, np.ndarray],
                     inputs: dict[str, list], infos: Mapping[str, TensorInfo]) -> tuple[str, int] | None:
    """(graph input, axis) if ``value`` is one dimension of a graph input, read through Shape (with start and
    end), Gather or Slice of a shape, and ops that pass it on; the shape read may be an intermediate value's
    whose dimension ``infos`` name after an input's. Else None."""
    node = producer.get(value)
    while node is not None and (node.op_type in _PASS_THROUGH
                                or (node.op_type == "Concat" and len(node.input) == 1)):
        node = producer.get(node.input[0])
    if node is None:
        return None
    if node.op_type in ("Gather", "Slice") and len(node.input) >= 2:
        index = values.get(node.input[1])
        if index is None or index.size != 1:
            return None
        if node.op_type == "Slice":
            ends = values.get(node.input[2]) if len(node.input) > 2 else None
            if ends is None or ends.size != 1 or int(ends.reshape(-1)[0]) != int(index.reshape(-1)[0]) + 1:
                return None
        axis = int(index.reshape(-1)[0])
        node = producer.get(node.input[0])
        if node is None or node.op_type != "Shape" or any(a.name in ("start", "end") for a in node.attribute):
            return None
    elif node.op_type == "Shape":
        attrs = {a.name: a.i for a in node.attribute}
        if "start" not in attrs or "end" not in attrs or attrs["end"] - attrs["start"] != 1:
            return None
        axis = attrs["start"]
    else:
        return None
    shaped = node.input[0]
    shape = inputs.get(shaped)
    if shape is None:
        info = infos.get(shaped)
        shape = list(info.shape) if info is not None and info.shape is not None else None
    if shape is None or not -len(shape) <= axis < len(shape):
        return None
    axis %= len(shape)
    if shaped in inputs:
        return shaped, axis
    symbol = shape[axis]
    if not isinstance(symbol, str) or not symbol:
        return None
    return next(((name, k) for name, dims in inputs.items() for k, d in enumerate(dims) if d == symbol), None)
