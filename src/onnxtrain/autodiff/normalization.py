"""Gradients of normalizations: Instance, Group, RMS and Lp normalization, LRN, and global max/Lp pooling.

Mean-variance normalizations share one formula (see ``nn._normalized_backward``): with
xhat = (x - mean) / std over some axes and dxhat = dY * scale,
    dX = (dxhat - mean(dxhat) - xhat mean(dxhat xhat)) / std.
"""

from __future__ import annotations

import numpy as np

from onnxtrain.autodiff.context import GradContext
from onnxtrain.autodiff.nn import _normalized_backward
from onnxtrain.autodiff.registry import register
from onnxtrain.autodiff.shape import shape_of
from onnxtrain.ir.types import np_dtype


def _standardize(ctx: GradContext, x: str, axes: list[int], eps: float) -> tuple[str, str]:
    """xhat = (x - mean) / sqrt(var + eps) over ``axes``, and 1 / sqrt(var + eps) (x: the node's input, reshaped)."""
    op = ctx.op
    centered = op.Sub(x, ctx.b.reduce("ReduceMean", x, axes, keepdims=True))
    var = ctx.b.reduce("ReduceMean", op.Mul(centered, centered), axes, keepdims=True)
    inv_std = op.Reciprocal(op.Sqrt(op.Add(var, ctx.const_like(eps, ctx.x[0]))))
    return op.Mul(centered, inv_std), inv_std


def _per_channel(ctx: GradContext, v: str, rank: int) -> str:
    """A (C,) tensor shaped (1, C, 1, ...) to broadcast over (N, C, ...)."""
    return ctx.op.Reshape(v, ctx.b.ints([1, -1, *[1] * (rank - 2)]))


@register("InstanceNormalization")
def instance_normalization(ctx: GradContext):
    """y = scale xhat + bias, with statistics over the spatial axes of each (n, c)."""
    x, scale, _ = ctx.x
    dy, rank = ctx.dy[0], ctx.rank(x)
    spatial = list(range(2, rank))
    xhat, inv_std = _standardize(ctx, x, spatial, ctx.attr("epsilon", 1e-5))
    dxhat = ctx.op.Mul(dy, _per_channel(ctx, scale, rank))
    dx = ctx.op.Mul(_normalized_backward(ctx, xhat, dxhat, spatial), inv_std)
    outer = [0, *spatial]
    dscale = ctx.b.reduce("ReduceSum", ctx.op.Mul(dy, xhat), outer, keepdims=False)
    return dx, dscale, ctx.b.reduce("ReduceSum", dy, outer, keepdims=False)


@register("GroupNormalization")
def group_normalization(ctx: GradContext):
    """Statistics over each group of C/G channels (and the spatial axes); scale and bias per channel
    (opset 21) or per group (opset 18).

    Needs neither the rank, the sizes nor the element type (shape inference may leave them unknown): x is
    viewed as (N, G, C/G * spatial) for the statistics, and as (N, C, spatial) for a per-channel scale.
    """
    x, scale, _ = ctx.x
    dy, op, groups = ctx.dy[0], ctx.op, ctx.attr("num_groups")
    grouped, by_channel = ctx.b.ints([0, groups, -1]), ctx.b.ints([0, 0, -1])
    eps = op.CastLike(ctx.b.const(np.asarray(ctx.attr("epsilon", 1e-5), np.float32)), x)
    xg = op.Reshape(x, grouped)
    centered = op.Sub(xg, ctx.b.reduce("ReduceMean", xg, [2], keepdims=True))
    var = ctx.b.reduce("ReduceMean", op.Mul(centered, centered), [2], keepdims=True)
    inv_std = op.Reciprocal(op.Sqrt(op.Add(var, eps)))
    xhat_g = op.Mul(centered, inv_std)
    if ctx.b.opset < 21:                                      # per group: everything in the grouped view
        dy_g = op.Reshape(dy, grouped)
        dxhat_g = op.Mul(dy_g, op.Reshape(scale, ctx.b.ints([1, -1, 1])))
        dscale = ctx.b.reduce("ReduceSum", op.Mul(dy_g, xhat_g), [0, 2], keepdims=False)
        dbias = ctx.b.reduce("ReduceSum", dy_g, [0, 2], keepdims=False)
    else:                                                     # per channel: the scale in the channel view
        dy_c = op.Reshape(dy, by_channel)
        dxhat_g = op.Reshape(op.Mul(dy_c, op.Reshape(scale, ctx.b.ints([1, -1, 1]))), grouped)
        xhat_c = op.Reshape(xhat_g, op.Shape(dy_c))
        dscale = ctx.b.reduce("ReduceSum", op.Mul(dy_c, xhat_c), [0, 2], keepdims=False)
        dbias = ctx.b.reduce("ReduceSum", dy_c, [0, 2], keepdims=False)
    dx = op.Reshape(op.Mul(_normalized_backward(ctx, xhat_g, dxhat_g, [2]), inv_std), op.Shape(x))
    return dx, dscale, dbias


@register("RMSNormalization")
def rms_normalization(ctx: GradContext):
    """y = scale xhat, xhat = x / rms(x) over the axes from ``axis`` on:
    dX = (dxhat - xhat mean(dxhat xhat)) / rms,  dxhat = dY scale."""
    x, scale = ctx.x[0], ctx.x[1]
    dy, op, rank = ctx.dy[0], ctx.op, ctx.rank(x)
    axes = list(range(ctx.attr("axis", -1) % rank, rank))
    mean_square = ctx.b.reduce("ReduceMean", op.Mul(x, x), axes, keepdims=True)
    inv_rms = op.Reciprocal(op.Sqrt(op.Add(mean_square, ctx.const_like(ctx.attr("epsilon", 1e-5), x))))
    xhat = op.Mul(x, inv_rms)
    dxhat = op.Mul(dy, scale)
    m = ctx.b.reduce("ReduceMean", op.Mul(dxhat, xhat), axes, keepdims=True)
    dx = op.Mul(op.Sub(dxhat, op.Mul(xhat, m)), inv_rms)
    return dx, ctx.unbroadcast(op.Mul(dy, xhat), scale)


@register("LpNormalization")
def lp_normalization(ctx: GradContext):
    """y = x / ||x||_p along ``axis``:  dX = (dY - u sum(dY y)) / ||x||_p, u = y (p = 2) or sign(x) (p = 1)."""
    x, y, dy, op = ctx.x[0], ctx.y[0], ctx.dy[0], ctx.op
    axis, p = ctx.attr("axis", -1), ctx.attr("p", 2)
    if p not in (1, 2):
        raise ValueError(f"LpNormalization node {ctx.node.name!r}: p must be 1 or 2, got {p}")
    norm = ctx.b.reduce("ReduceL2" if p == 2 else "ReduceL1", x, [axis], keepdims=True)
    direction = y if p == 2 else op.Sign(x)
    s = ctx.b.reduce("ReduceSum", op.Mul(dy, y), [axis], keepdims=True)
    return (op.Div(op.Sub(dy, op.Mul(direction, s)), norm),)


@register("GlobalMaxPool")
def global_max_pool(ctx: GradContext):
    """dY goes to the spatial maxima of each (n, c), split evenly between ties (as ReduceMax)."""
    x, y, op = ctx.x[0], ctx.y[0], ctx.op
    spatial = list(range(2, ctx.rank(x)))
    hit = op.Cast(op.Equal(x, y), to=ctx.elem_type(x))
    count = ctx.b.reduce("ReduceSum", hit, spatial, keepdims=True)
    return (op.Mul(hit, op.Div(ctx.dy[0], count)),)


@register("GlobalLpPool")
def global_lp_pool(ctx: GradContext):
    """y = (sum |x|^p)^(1/p) over the spatial axes:  dX = dY sign(x) |x|^(p-1) / y^(p-1)."""
    x, y, op = ctx.x[0], ctx.y[0], ctx.op
    p = float(ctx.attr("p", 2))
    ratio = op.Div(op.Abs(x), y)
    power = ratio if p == 2 else op.Pow(ratio, ctx.const_like(p - 1, x))
    return (op.Mul(op.Mul(ctx.dy[0], op.Sign(x)), power),)


@register("LRN")
def lrn(ctx: GradContext):
    """y = x d^-beta, d = bias + alpha/size sum_{c' in window(c)} x_c'^2 (a window over channels):
    dX_c = dY_c d_c^-beta - 2 alpha beta / size x_c sum_{c': c in window(c')} dY_c' x_c' d_c'^(-beta-1)."""
    x, y, dy, op = ctx.x[0], ctx.y[0], ctx.dy[0], ctx.op
    size, alpha, beta = ctx.attr("size"), ctx.attr("alpha", 1e-4), ctx.attr("beta", 0.75)
    bias = ctx.attr("bias", 1.0)
    channels = ctx.shape(x)[1]
    lo, hi = (size - 1) // 2, (size - 1) - (size - 1) // 2          # window(c) = [c - lo, c + hi]
    ones = ctx.b.const(np.ones((1, 1, size, 1), dtype=np_dtype(ctx.elem_type(x))))
    # (N, 1, C, rest): a window sum over channels is a Conv (C read at run time when it is not static)
    as_image = (ctx.b.ints([0, 1, channels, -1]) if isinstance(channels, int) else
                op.Concat(ctx.b.ints([0, 1]), shape_of(ctx.b, x, 1, 2), ctx.b.ints([-1]), axis=0))

    def window_sum(v: str, before: int, after: int) -> str:
        summed = op.Conv(op.Reshape(v, as_image), ones, pads=[before, 0, after, 0])
        return op.Reshape(summed, op.Shape(x))

    d = op.Add(ctx.const_like(bias, x), op.Mul(ctx.const_like(alpha / size, x), window_sum(op.Mul(x, x), lo, hi)))
    t = op.Div(op.Mul(dy, y), d)                                   # dY_c' x_c' d_c'^(-beta-1)
    back = window_sum(t, hi, lo)                                   # the transposed window
    return (op.Sub(op.Mul(dy, op.Pow(d, ctx.const_like(-beta, x))),
                   op.Mul(op.Mul(x, back), ctx.const_like(2 * alpha * beta / size, x))),)
