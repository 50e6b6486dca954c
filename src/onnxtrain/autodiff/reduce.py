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
    if axes is None or len(axes) == 0:
        if axes is not None and ctx.attr("noop_with_empty_axes", 0):
            return []
        return None
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
