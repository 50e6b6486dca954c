"""Gradients of reductions: the output gradient is broadcast back over the reduced axes."""

from __future__ import annotations

import numpy as np

from onnxtrain.autodiff.context import GradContext
from onnxtrain.autodiff.registry import register


def reduced_axes(ctx: GradContext) -> list[int] | None:
    """The axes a Reduce* node reduces, normalised to non-negative; None means every axis."""
    axes = ctx.attr("axes")
    if axes is None and len(ctx.x) > 1 and ctx.x[1]:
        value = ctx.const_value(ctx.x[1])
        if value is None:
            raise ValueError(f"{ctx.node.op_type} node {ctx.node.name!r}: axes must be a constant to differentiate")
        axes = value.tolist()
    if axes is None or len(axes) == 0:   # not given or empty: every axis, or none with noop_with_empty_axes
        return [] if ctx.attr("noop_with_empty_axes", 0) else None
    if any(a < 0 for a in axes):
        rank = ctx.rank(ctx.x[0])
        axes = [a % rank for a in axes]
    return sorted(int(a) for a in axes)


def expand_back(ctx: GradContext, g: str, axes: list[int] | None) -> str:
    """Broadcast a reduced gradient ``g`` back to the shape of the input."""
    x = ctx.x[0]
    if axes is not None and not ctx.attr("keepdims", 1) and axes:
        g = ctx.b.unsqueeze(g, axes)
    info = ctx.infos.get(x)
    static = info.static_shape if info is not None else None
    return ctx.op.Expand(g, ctx.b.ints(static) if static is not None else ctx.op.Shape(x))


def keep_dims(ctx: GradContext, g: str, axes: list[int] | None) -> str:
    """A reduced value (the output, its gradient) with the reduced axes kept, so it broadcasts against x."""
    if axes and not ctx.attr("keepdims", 1):
        return ctx.b.unsqueeze(g, axes)
    return g


def _count(ctx: GradContext, axes: list[int] | None) -> str:
    """Number of elements averaged per output element, as a constant of X's type when shapes are static."""
    x = ctx.x[0]
    shape = ctx.info(x).shape
    dims = range(len(shape)) if (shape is not None and axes is None) else (axes or [])
    if shape is not None and all(isinstance(shape[a], int) for a in dims):
        return ctx.const_like(float(np.prod([shape[a] for a in dims])), x)
    return ctx.op.Cast(ctx.op.Div(ctx.op.Size(x), ctx.op.Size(ctx.y[0])), to=ctx.elem_type(x))


@register("ReduceSum")
def reduce_sum(ctx: GradContext):
    axes = reduced_axes(ctx)
    if axes == []:
        return ctx.dy[0], None
    return expand_back(ctx, ctx.dy[0], axes), None


@register("ReduceMean")
def reduce_mean(ctx: GradContext):
    axes = reduced_axes(ctx)
    if axes == []:
        return ctx.dy[0], None
    return expand_back(ctx, ctx.op.Div(ctx.dy[0], _count(ctx, axes)), axes), None


@register("ReduceSumSquare")
def reduce_sum_square(ctx: GradContext):
    """y = sum x^2:  dx = 2 x dy."""
    x = ctx.x[0]
    return ctx.op.Mul(ctx.op.Mul(x, ctx.const_like(2.0, x)), expand_back(ctx, ctx.dy[0], reduced_axes(ctx))), None


@register("ReduceL1")
def reduce_l1(ctx: GradContext):
    """y = sum |x|:  dx = sign(x) dy."""
    return ctx.op.Mul(ctx.op.Sign(ctx.x[0]), expand_back(ctx, ctx.dy[0], reduced_axes(ctx))), None


@register("ReduceL2")
def reduce_l2(ctx: GradContext):
    """y = sqrt(sum x^2):  dx = x dy / y, and 0 where y = 0 (every x there is 0; torch's subgradient, not 0/0)."""
    x, y, op = ctx.x[0], ctx.y[0], ctx.op
    nonzero_y = op.Where(op.Equal(y, ctx.const_like(0.0, y)), ctx.const_like(1.0, y), y)
    return op.Mul(x, expand_back(ctx, op.Div(ctx.dy[0], nonzero_y), reduced_axes(ctx))), None


@register("ReduceLogSum")
def reduce_log_sum(ctx: GradContext):
    """y = log(sum x):  dx = dy / sum x = dy / e^y."""
    return expand_back(ctx, ctx.op.Div(ctx.dy[0], ctx.op.Exp(ctx.y[0])), reduced_axes(ctx)), None


@register("ReduceLogSumExp")
def reduce_log_sum_exp(ctx: GradContext):
    """y = log(sum e^x):  dx = dy e^(x - y), the softmax of x."""
    axes = reduced_axes(ctx)
    softmax = ctx.op.Exp(ctx.op.Sub(ctx.x[0], keep_dims(ctx, ctx.y[0], axes)))
    return ctx.op.Mul(softmax, expand_back(ctx, ctx.dy[0], axes)), None


@register("ReduceProd")
def reduce_prod(ctx: GradContext):
    """y = prod x:  dx = dy times the product of the other elements: y / x where no element is 0; where one is,
    the product of the others at it and 0 elsewhere; 0 everywhere where two or more are (y / x would be 0/0)."""
    x, op = ctx.x[0], ctx.op
    axes = reduced_axes(ctx)
    if axes == []:
        return ctx.dy[0], None
    every = axes if axes is not None else list(range(ctx.rank(x)))
    zero, one = ctx.const_like(0.0, x), ctx.const_like(1.0, x)
    is_zero = op.Equal(x, zero)
    nonzero = op.Where(is_zero, one, x)
    rest = ctx.b.reduce("ReduceProd", nonzero, every, keepdims=True)             # the product of the non-zeros
    zeros = ctx.b.reduce("ReduceSum", op.Cast(is_zero, to=ctx.elem_type(x)), every, keepdims=True)
    others = op.Where(is_zero, op.Where(op.Equal(zeros, one), rest, zero),
                      op.Where(op.Equal(zeros, zero), op.Div(rest, nonzero), zero))
    return op.Mul(others, expand_back(ctx, ctx.dy[0], axes)), None


@register("ReduceMax", "ReduceMin")
def reduce_max(ctx: GradContext):
    """dy goes to the elements equal to the extremum, split evenly between ties (as Max and Min)."""
    x, axes = ctx.x[0], reduced_axes(ctx)
    if axes == []:
        return ctx.dy[0], None
    hit = ctx.op.Cast(ctx.op.Equal(x, keep_dims(ctx, ctx.y[0], axes)), to=ctx.elem_type(x))
    count = ctx.b.reduce("ReduceSum", hit, axes, keepdims=True)
    return ctx.op.Mul(hit, ctx.op.Div(keep_dims(ctx, ctx.dy[0], axes), count)), None
