"""Composable elementwise and reduction blocks for writing custom losses."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from onnxtrain.blocks.base import Block, BuildContext, Value
from onnxtrain.ir.types import np_dtype

__all__ = ["Identity", "Add", "Sub", "Mul", "Div", "Pow", "Neg", "Abs", "Exp", "Log", "Sqrt", "Sigmoid", "Relu",
           "Constant", "ReduceMean", "ReduceSum", "Clip", "reduce"]


def _operand(ctx: BuildContext, value, like: str) -> str:
    """A value name, or a Python number turned into a scalar constant of ``like``'s element type."""
    if isinstance(value, str):
        return value
    return ctx.builder.const(np.asarray(value, dtype=np_dtype(ctx.info(like).elem_type)))


class Identity(Block):
    """Its input, unchanged (``generate_artifacts(loss=None)``: the model's output already is the loss)."""

    def build(self, x: str) -> str:
        return x


class _Binary(Block):
    op_type = ""

    def __init__(self, constant: float | None = None):
        """With ``constant``, the block takes one input and uses the constant as its second operand."""
        super().__init__()
        self.constant = constant

    def build(self, a: str, b: str | float | None = None) -> str:
        b = self.constant if b is None else b
        if b is None:
            raise TypeError(f"{type(self).__name__} needs two inputs or a constant")
        return getattr(self.op, self.op_type)(a, _operand(self.context, b, a))


class Add(_Binary):
    op_type = "Add"


class Sub(_Binary):
    op_type = "Sub"


class Mul(_Binary):
    op_type = "Mul"


class Div(_Binary):
    op_type = "Div"


class Pow(_Binary):
    op_type = "Pow"


class _Unary(Block):
    op_type = ""

    def build(self, x: str) -> str:
        return getattr(self.op, self.op_type)(x)


class Neg(_Unary):
    op_type = "Neg"


class Abs(_Unary):
    op_type = "Abs"


class Exp(_Unary):
    op_type = "Exp"


class Log(_Unary):
    op_type = "Log"


class Sqrt(_Unary):
    op_type = "Sqrt"


class Sigmoid(_Unary):
    op_type = "Sigmoid"


class Relu(_Unary):
    op_type = "Relu"


class Clip(Block):
    def __init__(self, low: float | None = None, high: float | None = None):
        super().__init__()
        self.low, self.high = low, high

    def build(self, x: str) -> str:
        lo = None if self.low is None else _operand(self.context, self.low, x)
        hi = None if self.high is None else _operand(self.context, self.high, x)
        return self.op.Clip(x, lo, hi)


class Constant(Block):
    """A constant tensor (its dtype is taken from ``like`` when given)."""

    def __init__(self, value, dtype=None):
        super().__init__()
        self.value, self.dtype = value, dtype

    def build(self, like: str | None = None) -> str:
        dtype = self.dtype
        if dtype is None and like is not None:
            dtype = np_dtype(self.context.info(like).elem_type)
        return self.builder.const(np.asarray(self.value, dtype=dtype))


def reduce(x: Value, reduction: str) -> Value:
    """Apply a loss reduction: "mean", "sum" or "none"."""
    if reduction == "none":
        return x
    if reduction not in ("mean", "sum"):
        raise ValueError(f"unknown reduction {reduction!r}: expected 'mean', 'sum' or 'none'")
    if not isinstance(x, Value):
        raise TypeError(f"reduce: {x!r} is not a value of a graph being built (a block's input or output)")
    ctx = x.context
    return ctx.value(ctx.builder.reduce("ReduceMean" if reduction == "mean" else "ReduceSum", x, None,
                                        keepdims=False))


class _Reduce(Block):
    op_type = ""

    def __init__(self, axes: Sequence[int] | None = None, keepdims: bool = False):
        super().__init__()
        self.axes, self.keepdims = axes, keepdims

    def build(self, x: str) -> str:
        return self.builder.reduce(self.op_type, x, self.axes, keepdims=self.keepdims)


class ReduceMean(_Reduce):
    op_type = "ReduceMean"


class ReduceSum(_Reduce):
    op_type = "ReduceSum"
