"""What a gradient rule sees of its forward node: inputs, outputs, output gradients, attributes, shapes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper

from onnxtrain.errors import UnknownShapeError
from onnxtrain.ir.builder import GraphBuilder
from onnxtrain.ir.types import TensorInfo

__all__ = ["GradContext"]


class GradContext:
    """One forward node during the reverse sweep.

    Attributes:
        x: input names ("" for an omitted optional input).
        y: output names.
        dy: gradient names of the outputs (None where an output gets no gradient).
        op: node emitter (``ctx.op.Mul(a, b)``).
        b: the underlying :class:`GraphBuilder` (constants, reductions).
    """

    def __init__(self, node: onnx.NodeProto, dy: Sequence[str | None], builder: GraphBuilder,
                 infos: dict[str, TensorInfo], constants: dict[str, np.ndarray]):
        self.node = node
        self.x = list(node.input)
        self.y = list(node.output)
        self.dy = list(dy)
        self.b = builder
        self.op = builder.op
        self.infos = infos
        self.constants = constants
        self._attrs: dict[str, Any] | None = None  # decoded on the first attr(): most rules read none


    # -- attributes and shapes -------------------------------------------------------------------------
    def attr(self, name: str, default: Any = None) -> Any:
        if self._attrs is None:
            self._attrs = {a.name: helper.get_attribute_value(a) for a in self.node.attribute}
        value = self._attrs.get(name, default)
        return value.decode() if isinstance(value, bytes) else value

    def info(self, name: str) -> TensorInfo:
        info = self.infos.get(name)
        if info is None:
            raise UnknownShapeError(f"no type information for {name!r} (input of node {self.node.name!r}); "
                             "the model needs shape inference to succeed")
        return info

    def rank(self, name: str) -> int:
        rank = self.info(name).rank
        if rank is None:
            raise UnknownShapeError(f"the rank of {name!r} (node {self.node.name!r}, {self.node.op_type}) is unknown")
        return rank

    def shape(self, name: str) -> tuple:
        shape = self.info(name).shape
        if shape is None:
            raise UnknownShapeError(f"the shape of {name!r} (node {self.node.name!r}, {self.node.op_type}) is unknown")
        return shape

    def elem_type(self, name: str) -> int:
        return self.info(name).elem_type

    def is_float(self, name: str) -> bool:
        info = self.infos.get(name)
        return info is not None and info.is_float

    def const_like(self, value: float, like: str) -> str:
        """A scalar constant with the element type of ``like``."""
        return self.b.const(np.asarray(value, dtype=helper.tensor_dtype_to_np_dtype(self.elem_type(like))))

    def const_value(self, name: str) -> np.ndarray | None:
        """The value of ``name`` if it is a constant (an initializer that is not a parameter, or a Constant)."""
        return self.constants.get(name)

    # -- gradients ---------------------------------------------------------------------------------------
    def dy_or_zeros(self, i: int) -> str:
        """The gradient of output ``i``, or zeros shaped like it when nothing flows back into it."""
        if self.dy[i] is not None:
            return self.dy[i]  # type: ignore[return-value]
        return self.b.zeros_like(self.y[i], self.elem_type(self.y[i]))

    def keep(self, value: str, cond: str) -> str:
        """``value`` where ``cond`` holds, zero elsewhere.

        Written as a multiplication by the cast mask: onnxruntime's Where with a broadcast scalar branch is
        several times slower than Cast + Mul on CPU.
        """
        return self.op.Mul(value, self.op.Cast(cond, to=self.elem_type(self.y[0])))

    def forward_output(self, index: int, hint: str) -> str:
        """Make the forward node produce its optional output ``index`` (a mask, indices) and return it."""
        outputs = list(self.node.output)
        if index < len(outputs) and outputs[index]:
            return outputs[index]
        while len(outputs) <= index:
            outputs.append("")
        outputs[index] = self.b.unique(f"{self.node.name or self.node.op_type}_{hint}")
        del self.node.output[:]
        self.node.output.extend(outputs)
        self.y = outputs
        return outputs[index]

    def unbroadcast(self, grad: str, like: str, grad_shape: Sequence | None = None) -> str:
        """Sum ``grad`` over the axes along which ``like`` was broadcast, so it takes the shape of ``like``.

        ``grad`` is shaped like the node's first output unless ``grad_shape`` says otherwise.
        """
        target = self.info(like).shape
        out_shape = grad_shape if grad_shape is not None else self._broadcast_shape()
        if target is None or out_shape is None:
            return self._unbroadcast_dynamic(grad, like)
        lead = len(out_shape) - len(target)
        axes = list(range(lead))
        for i, d in enumerate(target):
            od = out_shape[lead + i]
            if d is not None and d == od:
                continue
            if d == 1:
                axes.append(lead + i)
                continue
            return self._unbroadcast_dynamic(grad, like)
        if not axes:
            return grad
        if axes == list(range(lead)):  # only leading axes: one node
            return self.b.reduce("ReduceSum", grad, axes, keepdims=False)
        summed = self.b.reduce("ReduceSum", grad, axes, keepdims=True)
        return self.b.squeeze(summed, list(range(lead))) if lead else summed

    def _broadcast_shape(self) -> tuple | None:
        """Shape of the node's first output (the broadcast shape of elementwise ops)."""
        info = self.infos.get(self.y[0])
        return None if info is None else info.shape

    def _unbroadcast_dynamic(self, grad: str, like: str) -> str:
        """Fallback when shapes are symbolic: reduce over the axes computed at run time."""
        op = self.op
        shape_like = op.Shape(like)
        shape_grad = op.Shape(grad)
        rank_grad = op.Size(shape_grad)
        # Left-pad the target shape with ones to the gradient's rank.
        pad = op.Sub(rank_grad, op.Size(shape_like))
        ones = op.Expand(self.b.ints([1]), op.Reshape(pad, self.b.ints([1])))
        padded = op.Concat(ones, shape_like, axis=0)
        differ = op.Not(op.Equal(padded, shape_grad))
        axes = op.Reshape(op.NonZero(differ), self.b.ints([-1]))
        summed = op.ReduceSum(grad, axes, keepdims=1, noop_with_empty_axes=1)
        return op.Reshape(summed, shape_like)
