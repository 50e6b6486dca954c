"""Gradients of normalisations: Layer, Batch, Instance, Group, RMS and Lp normalisation, and LRN.
"""

from __future__ import annotations

import numpy as np

from onnxtrain.autodiff.context import GradContext
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


def _normalized_backward(ctx: GradContext, xhat: str, dxhat: str, axes: list[int]) -> str:
    """dx / inv_std for xhat = (x - mean) * inv_std over ``axes``: dxhat - mean(dxhat) - xhat mean(dxhat xhat)."""
    m1 = ctx.b.reduce("ReduceMean", dxhat, axes, keepdims=True)
    m2 = ctx.b.reduce("ReduceMean", ctx.op.Mul(dxhat, xhat), axes, keepdims=True)
    return ctx.op.Sub(ctx.op.Sub(dxhat, m1), ctx.op.Mul(xhat, m2))


@register("LayerNormalization")
def layer_normalization(ctx: GradContext):
    """Recompute xhat from the saved mean and inverse std-dev (optional outputs 1 and 2, kept in the stash type).

    Gradients flowing into those outputs add: dmean / N and dinv_std * (-inv_std^3 (x - mean) / N)."""
    x, scale = ctx.x[0], ctx.x[1]
    bias = ctx.x[2] if len(ctx.x) > 2 and ctx.x[2] else None
    op, rank = ctx.op, ctx.rank(x)
    axis = ctx.attr("axis", -1) % rank
    axes = list(range(axis, rank))
    stashed = ctx.attr("stash_type", 1) != ctx.elem_type(x)

    def like_x(v: str | None) -> str | None:       # the statistics are in the stash type
        return op.Cast(v, to=ctx.elem_type(x)) if v is not None and stashed else v

    mean = like_x(ctx.forward_output(1, "mean"))
    inv_std = like_x(ctx.forward_output(2, "inv_std_dev"))
    centered = op.Sub(x, mean)
    xhat = op.Mul(centered, inv_std)
    dy = ctx.dy_or_zeros(0)
    dxhat = op.Mul(dy, scale)
    dx = op.Mul(_normalized_backward(ctx, xhat, dxhat, axes), inv_std)
    d_mean, d_inv = (like_x(ctx.dy[k]) if len(ctx.dy) > k else None for k in (1, 2))
    if d_mean is not None or d_inv is not None:
        static = ctx.info(x).static_shape
        count = (ctx.const_like(float(np.prod(static[axis:])), x) if static is not None else
                 op.Cast(op.Div(op.Size(x), op.Size(mean)), to=ctx.elem_type(x)))
        if d_mean is not None:
            dx = op.Add(dx, op.Div(d_mean, count))
        if d_inv is not None:
            cube = op.Mul(op.Mul(inv_std, inv_std), inv_std)
            dx = op.Sub(dx, op.Div(op.Mul(op.Mul(d_inv, cube), centered), count))
    shape = ctx.info(x).shape
    dscale = ctx.unbroadcast(op.Mul(dy, xhat), scale, grad_shape=shape)
    dbias = ctx.unbroadcast(dy, bias, grad_shape=shape) if bias is not None else None
    return dx, dscale, dbias


@register("BatchNormalization")
def batch_normalization(ctx: GradContext):
    """Training mode: batch statistics (recomputed here), inference mode: the running statistics are constants."""
    x, scale, bias, mean, var = ctx.x[:5]
    eps = ctx.attr("epsilon", 1e-5)
    rank = ctx.rank(x)
    axes = [0, *range(2, rank)]
    bshape = ctx.b.ints([1, -1, *[1] * (rank - 2)])
    dy = ctx.dy_or_zeros(0)
    if ctx.attr("training_mode", 0):
        # dx = scale inv_std (dy - mean(dy) - xhat mean(dy xhat)), with xhat = centered inv_std folded into
        # per-channel factors rather than materialised: 9 passes over x (16 for the textbook form).
        op = ctx.op
        static = ctx.info(x).static_shape
        inv_count = (ctx.const_like(static[1] / float(np.prod(static)), x) if static is not None else
                     op.Div(op.Cast(shape_of(ctx.b, x, 1, 2), to=ctx.elem_type(x)),
                            op.Cast(op.Size(x), to=ctx.elem_type(x))))
        mu = ctx.b.reduce("ReduceMean", x, axes, keepdims=True)
        centered = op.Sub(x, mu)
        # ReduceSumSquare, not ReduceMean(centered^2): a little slower, but the squares are one more
        # activation-sized temporary per layer (MobileNetV2 peak RSS 713 -> 826 MB).
        batch_var = op.Mul(ctx.b.reduce("ReduceSumSquare", centered, axes, keepdims=True), inv_count)
        inv_std = op.Reciprocal(op.Sqrt(op.Add(batch_var, ctx.const_like(eps, x))))
        dbias_k = ctx.b.reduce("ReduceSum", dy, axes, keepdims=True)                   # sum(dy)
        dy_centered = ctx.b.reduce("ReduceSum", op.Mul(dy, centered), axes, keepdims=True)
        dscale_k = op.Mul(dy_centered, inv_std)                                         # sum(dy xhat)
        slope = op.Mul(op.Mul(op.Mul(inv_std, inv_std), dy_centered), inv_count)         # mean(dy xhat) inv_std
        centered_dy = op.Sub(op.Sub(dy, op.Mul(centered, slope)), op.Mul(dbias_k, inv_count))
        dx = op.Mul(centered_dy, op.Mul(op.Reshape(scale, bshape), inv_std))
        dscale, dbias = op.Reshape(dscale_k, ctx.b.ints([-1])), op.Reshape(dbias_k, ctx.b.ints([-1]))
    else:
        inv_std = ctx.op.Reciprocal(ctx.op.Sqrt(ctx.op.Add(var, ctx.const_like(eps, x))))   # (C,)
        centered = ctx.op.Sub(x, ctx.op.Reshape(mean, bshape))
        xhat = ctx.op.Mul(centered, ctx.op.Reshape(inv_std, bshape))
        dxhat = ctx.op.Mul(dy, ctx.op.Reshape(scale, bshape))
        dx = ctx.op.Mul(dxhat, ctx.op.Reshape(inv_std, bshape))
        # y depends on the statistics too: dmean = -sum(dxhat) inv_std, dvar = -sum(dxhat xhat) inv_std^2 / 2
        dmean = ctx.op.Neg(ctx.op.Mul(ctx.b.reduce("ReduceSum", dxhat, axes, keepdims=False), inv_std))
        dvar = ctx.op.Mul(ctx.b.reduce("ReduceSum", ctx.op.Mul(dxhat, xhat), axes, keepdims=False),
                          ctx.op.Mul(ctx.op.Mul(inv_std, inv_std), ctx.const_like(-0.5, x)))
        dscale = ctx.b.reduce("ReduceSum", ctx.op.Mul(dy, xhat), axes, keepdims=False)
        return dx, dscale, ctx.b.reduce("ReduceSum", dy, axes, keepdims=False), dmean, dvar
    # The running statistics: running_mean = m input_mean + (1 - m) mean(x), running_var likewise with var(x).
    dmean = dvar = None
    momentum = ctx.attr("momentum", 0.9)
    d_running = [ctx.dy[k] if len(ctx.dy) > k else None for k in (1, 2)]
    if any(d is not None for d in d_running):
        static = ctx.info(x).static_shape
        count = (ctx.const_like(float(np.prod(static) // static[1]), x) if static is not None else
                 ctx.op.Cast(ctx.op.Div(ctx.op.Size(x), shape_of(ctx.b, x, 1, 2)), to=ctx.elem_type(x)))
        rate = ctx.op.Div(ctx.const_like(1.0 - momentum, x), count)
        if d_running[0] is not None:
            dmean = ctx.op.Mul(d_running[0], ctx.const_like(momentum, x))
            dx = ctx.op.Add(dx, ctx.op.Mul(ctx.op.Reshape(d_running[0], bshape), rate))
        if d_running[1] is not None:
            dvar = ctx.op.Mul(d_running[1], ctx.const_like(momentum, x))
            two_rate_centered = ctx.op.Mul(centered, ctx.op.Mul(rate, ctx.const_like(2.0, x)))
            dx = ctx.op.Add(dx, ctx.op.Mul(ctx.op.Reshape(d_running[1], bshape), two_rate_centered))
    return dx, dscale, dbias, dmean, dvar
