"""A small tape that emits ONNX nodes: ``b.op.Mul(x, y)`` appends a node and returns its output name."""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

__all__ = ["GraphBuilder"]

# Ops whose ``axes`` moved from an attribute to an input, and the opset where it happened.
AXES_AS_INPUT_SINCE = {
    "ReduceSum": 13, "Squeeze": 13, "Unsqueeze": 13,
    "ReduceMean": 18, "ReduceMax": 18, "ReduceMin": 18, "ReduceProd": 18, "ReduceL1": 18, "ReduceL2": 18,
    "ReduceLogSum": 18, "ReduceLogSumExp": 18, "ReduceSumSquare": 18,
}


_NODE_FIELDS = frozenset({"domain", "doc_string", "overload"})


def _attribute(key: str, value: Any) -> onnx.AttributeProto:
    """``helper.make_attribute(key, value)``: the same proto, built directly for the common types (the helper's
    abstract-class checks cost more than the node itself when a graph is built)."""
    kind = type(value)
    if kind is int:
        return onnx.AttributeProto(name=key, i=value, type=onnx.AttributeProto.INT)
    if kind is float:
        return onnx.AttributeProto(name=key, f=value, type=onnx.AttributeProto.FLOAT)
    if kind is list and value and all(type(v) is int for v in value):
        return onnx.AttributeProto(name=key, ints=value, type=onnx.AttributeProto.INTS)
    return helper.make_attribute(key, value)


class _Ops:
    # A weak reference: a strong one would make a cycle (builder -> ops -> emit -> builder), which only the cyclic
    # collector frees, with the builder's nodes (on MobileNetV2, 11 ms at the first collection after generation).
    def __init__(self, builder: GraphBuilder):
        self._builder = weakref.ref(builder)

    def __getattr__(self, op_type: str):
        builder = self._builder

        def emit(*inputs: str | None, _outputs: int | Sequence[str] = 1, _name: str | None = None, **attrs: Any):
            return builder().node(op_type, inputs, _outputs, name=_name, **attrs)

        setattr(self, op_type, emit)  # found directly from now on: __getattr__ runs once per op type
        return emit


class GraphBuilder:
    """Collects nodes and constant initializers with names that never collide with existing ones.

    Args:
        opset: the default-domain opset the emitted nodes must be valid in.
        taken: names already used in the graph the nodes will join.
        prefix: prepended to every generated name (keeps generated parts recognisable).
    """

    def __init__(self, opset: int, taken: Iterable[str] = (), prefix: str = ""):
        self.opset = opset
        self.prefix = prefix
        self.nodes: list[onnx.NodeProto] = []
        # the nodes are made inside one graph, which allocates them together: a standalone NodeProto copied into a
        # graph later costs microseconds to free (2,500 nodes: 8 ms)
        self._arena = onnx.GraphProto()
        self.initializers: list[onnx.TensorProto] = []
        self._taken = set(taken)
        self._counter = 0
        self._consts: dict[tuple, str] = {}
        self.op = _Ops(self)

    def unique(self, hint: str) -> str:
        """A fresh value name derived from ``hint``."""
        name = self.prefix + hint
        taken = self._taken
        while name in taken:
            self._counter += 1
            name = f"{self.prefix}{hint}_{self._counter}"
        taken.add(name)
        return name

    def reserve(self, name: str) -> str:
        """Claim an exact name (a graph input or output name); fails if it is taken."""
        if name in self._taken:
            raise ValueError(f"the name {name!r} is already used in the graph")
        self._taken.add(name)
        return name

    def take(self, names: Iterable[str]) -> None:
        """Mark ``names`` as used (names that joined the graph after the builder was made)."""
        self._taken.update(names)

    def node(self, op_type: str, inputs: Sequence[str | None], outputs: int | Sequence[str] = 1,
             name: str | None = None, **attrs: Any) -> Any:
        """Append one node; returns its output name, or a list of names for several outputs."""
        # called for every node of a gradient graph: no work for what a node does not have (attributes, fields)
        if type(outputs) is int:
            out_names = [self.unique(op_type + "_out") for _ in range(outputs)]
        else:
            out_names = list(outputs)
            self._taken.update(out_names)
        names = [i or "" for i in inputs]
        while names and not names[-1]:   # trailing optional inputs are left out (older opsets have fewer slots)
            names.pop()
        n = self._arena.node.add(op_type=op_type, input=names, output=out_names, name=self.unique(name or op_type))
        if attrs:
            attrs = {k: v for k, v in attrs.items() if v is not None}
            for field in _NODE_FIELDS.intersection(attrs):  # helper.make_node's keywords (a node of another domain)
                value = attrs.pop(field)
                if value or field != "doc_string":  # as make_node: an empty doc_string is not set
                    setattr(n, field, value)
            if attrs:
                n.attribute.extend([_attribute(key, value) for key, value in sorted(attrs.items())])
        self.nodes.append(n)
        return out_names[0] if type(outputs) is int and outputs == 1 else out_names

    def const(self, value: Any, dtype: Any = None, name: str | None = None) -> str:
        """A constant initializer; small constants with equal value and dtype are shared."""
        arr = np.asarray(value, dtype=dtype)
        key = None
        if name is None and arr.size <= 16:
            key = (arr.dtype.str, arr.shape, arr.tobytes())
            if key in self._consts:
                return self._consts[key]
        out = self.unique(name or "const")
        self.initializers.append(numpy_helper.from_array(arr, out))
        if key is not None:
            self._consts[key] = out
        return out

    def ints(self, values: Sequence[int]) -> str:
        """A 1-D int64 constant (shapes, axes, starts, ...)."""
        return self.const(np.asarray(list(values), dtype=np.int64))

    # Ops whose signature changed across opsets, written once here.
    def reduce(self, op_type: str, x: str, axes: Sequence[int] | str | None, keepdims: bool = True) -> str:
        """``op_type`` over ``axes`` (a list, a name of an int64 tensor, or None for all axes)."""
        if self.opset >= AXES_AS_INPUT_SINCE[op_type]:
            if axes is None:
                return self.node(op_type, [x], keepdims=int(keepdims))
            ax = axes if isinstance(axes, str) else self.ints(axes)
            return self.node(op_type, [x, ax], keepdims=int(keepdims))
        if isinstance(axes, str):
            raise ValueError(f"{op_type} in opset {self.opset} needs static axes")
        return self.node(op_type, [x], keepdims=int(keepdims), axes=None if axes is None else list(axes))

    def squeeze(self, x: str, axes: Sequence[int]) -> str:
        return self.node("Squeeze", [x, self.ints(axes)])

    def unsqueeze(self, x: str, axes: Sequence[int]) -> str:
        return self.node("Unsqueeze", [x, self.ints(axes)])

    def full(self, shape: str, value: float, elem_type: int) -> str:
        """A tensor of the run-time ``shape`` (an int64 vector value) filled with ``value``."""
        fill = numpy_helper.from_array(np.full(1, value, dtype=helper.tensor_dtype_to_np_dtype(elem_type)))
        return self.node("ConstantOfShape", [shape], value=fill)

    def zeros_like(self, x: str, elem_type: int) -> str:
        return self.full(self.node("Shape", [x]), 0, elem_type)

    def ones_like(self, x: str, elem_type: int) -> str:
        return self.full(self.node("Shape", [x]), 1, elem_type)
