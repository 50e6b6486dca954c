"""Gradients of neural-network ops: convolution, pooling, normalization, softmax, dropout."""

from __future__ import annotations

import numpy as np

from onnxtrain.autodiff.context import GradContext
from onnxtrain.autodiff.reduce import expand_back
from onnxtrain.autodiff.registry import register
from onnxtrain.ir.types import np_dtype


def _spatial_attrs(ctx: GradContext, kernel: list[int]):
    """strides, dilations and explicit (begin..., end...) pads of a conv/pool node, auto_pad resolved."""
    n = len(kernel)
    strides = list(ctx.attr("strides") or [1] * n)
    dilations = list(ctx.attr("dilations") or [1] * n)
    pads = list(ctx.attr("pads") or [0] * (2 * n))
    auto_pad = ctx.attr("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        spatial = ctx.shape(ctx.x[0])[2:]
        if not all(isinstance(d, int) for d in spatial):
            raise ValueError(f"node {ctx.node.name!r}: auto_pad={auto_pad} needs static spatial dimensions")
        for i, (size, k, s, d) in enumerate(zip(spatial, kernel, strides, dilations)):
            out = -(-size // s)
            total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
            small, big = total // 2, total - total // 2
            pads[i], pads[i + n] = (small, big) if auto_pad == "SAME_UPPER" else (big, small)
    elif auto_pad == "VALID":
        pads = [0] * (2 * n)
    return strides, dilations, pads


def _spatial(ctx: GradContext, name: str) -> list[int]:
    dims = ctx.shape(name)[2:]
    if not all(isinstance(d, int) for d in dims):
        raise ValueError(f"node {ctx.node.name!r} ({ctx.node.op_type}): the gradient needs static spatial "
                         f"dimensions, got {ctx.shape(name)} for {name!r}")
    return list(dims)


@register("Conv")
def conv(ctx: GradContext):
    """dX = ConvTranspose(dY, W); dW = a grouped Conv of X with dY as the kernel; dB = sum of dY."""
    x, w = ctx.x[0], ctx.x[1]
    bias = ctx.x[2] if len(ctx.x) > 2 and ctx.x[2] else None
    dy, group = ctx.dy[0], ctx.attr("group", 1)
    w_shape = ctx.shape(w)
    kernel = list(w_shape[2:])
    strides, dilations, pads = _spatial_attrs(ctx, kernel)
    n = len(kernel)
    in_size, out_size = _spatial(ctx, x), _spatial(ctx, ctx.y[0])

    # dX: the transposed convolution, with output_padding for the rows/cols the stride skipped.
    output_padding = [in_size[i] + pads[i] + pads[i + n] - ((out_size[i] - 1) * strides[i]
                      + (kernel[i] - 1) * dilations[i] + 1) for i in range(n)]
    dx = ctx.op.ConvTranspose(dy, w, strides=strides, pads=pads, dilations=dilations, group=group,
                              output_padding=output_padding if any(output_padding) else None)

    dw = _conv_weight_grad(ctx, x, dy, w_shape, strides, dilations, pads, group, in_size, out_size)
    db = None
    if bias is not None:
        db = ctx.b.reduce("ReduceSum", dy, [0, *range(2, 2 + n)], keepdims=False)
    return dx, dw, db


def _conv_weight_grad(ctx: GradContext, x: str, dy: str, w_shape, strides, dilations, pads, group: int,
                      in_size: list[int], out_size: list[int]) -> str:
    """dW of Y = Conv(X, W): dW[o, i, k] = sum_{n, p} dY[n, o, p] X[n, i, p*s + k*d - pad].

    That is a Conv of X (batch and channels swapped, split per group) with dY as the kernel, where the roles
    of stride and dilation swap.
    """
    n = len(in_size)
    kernel = list(w_shape[2:])
    c_out, c_in_g = w_shape[0], w_shape[1]
    c_out_g = c_out // group
    xg = ctx.op.Reshape(x, ctx.b.ints([-1, group, c_in_g, *in_size]))               # (N, G, Ci, *S)
    xg = ctx.op.Transpose(xg, perm=[2, 1, 0, *range(3, 3 + n)])                    # (Ci, G, N, *S)
    xg = ctx.op.Reshape(xg, ctx.b.ints([c_in_g, -1, *in_size]))                     # (Ci, G*N, *S)
    kg = ctx.op.Reshape(dy, ctx.b.ints([-1, group, c_out_g, *out_size]))            # (N, G, Co, *P)
    kg = ctx.op.Transpose(kg, perm=[1, 2, 0, *range(3, 3 + n)])                    # (G, Co, N, *P)
    kg = ctx.op.Reshape(kg, ctx.b.ints([c_out, -1, *out_size]))                     # (G*Co, N, *P)
    dw = ctx.op.Conv(xg, kg, strides=dilations, dilations=strides, pads=pads, group=group)  # (Ci, G*Co, *K')
    dw = ctx.op.Transpose(dw, perm=[1, 0, *range(2, 2 + n)])                       # (G*Co, Ci, *K')
    # The spatial size of that Conv's output, floor((S + pads - ((P-1)*s + 1)) / d) + 1, can exceed K.
    dw_size = [(in_size[i] + pads[i] + pads[i + n] - ((out_size[i] - 1) * strides[i] + 1)) // dilations[i] + 1
               for i in range(n)]
    if dw_size != kernel:
        dw = ctx.op.Slice(dw, ctx.b.ints([0] * n), ctx.b.ints(kernel), ctx.b.ints(list(range(2, 2 + n))))
    return dw


@register("ConvTranspose")
def conv_transpose(ctx: GradContext):
    """ConvTranspose is the transpose of the Conv with the same W, strides, pads and dilations:
    dX = Conv(dY, W), and dW is that Conv's weight gradient with dY as its input and X as its output gradient."""
    x, w = ctx.x[0], ctx.x[1]
    bias = ctx.x[2] if len(ctx.x) > 2 and ctx.x[2] else None
    dy, group = ctx.dy[0], ctx.attr("group", 1)
    w_shape = ctx.shape(w)
    kernel = list(w_shape[2:])
    n = len(kernel)
    strides = list(ctx.attr("strides") or [1] * n)
    dilations = list(ctx.attr("dilations") or [1] * n)
    output_padding = list(ctx.attr("output_padding") or [0] * n)
    in_size, out_size = _spatial(ctx, x), _spatial(ctx, ctx.y[0])
    # total padding = (the full transposed-conv extent) - (the output size); the spec splits it as follows.
    total = [strides[i] * (in_size[i] - 1) + output_padding[i] + (kernel[i] - 1) * dilations[i] + 1 - out_size[i]
             for i in range(n)]
    auto_pad, explicit = ctx.attr("auto_pad", "NOTSET"), ctx.attr("pads")
    if auto_pad == "SAME_UPPER":
        begin = [t // 2 for t in total]
    elif auto_pad == "SAME_LOWER" or (ctx.attr("output_shape") is not None and explicit is None):
        begin = [t - t // 2 for t in total]
    else:
        begin = list(explicit or [0] * (2 * n))[:n]
    # The Conv reads dY from position begin; the output_padding rows at the end are never read.
    end = [max(0, total[i] - begin[i] - output_padding[i]) for i in range(n)]
    pads = [*begin, *end]
    dx = ctx.op.Conv(dy, w, strides=strides, pads=pads, dilations=dilations, group=group)
    conv_out = [(out_size[i] + begin[i] + end[i] - (kernel[i] - 1) * dilations[i] - 1) // strides[i] + 1
                for i in range(n)]
    if conv_out != in_size:
        dx = ctx.op.Slice(dx, ctx.b.ints([0] * n), ctx.b.ints(in_size), ctx.b.ints(list(range(2, 2 + n))))
    dw = _conv_weight_grad(ctx, dy, x, w_shape, strides, dilations, pads, group, out_size, in_size)
    db = ctx.b.reduce("ReduceSum", dy, [0, *range(2, 2 + n)], keepdims=False) if bias is not None else None
    return dx, dw, db


@register("MaxPool")
def max_pool(ctx: GradContext):
    """dY goes to the first arg-max of each window (as torch)."""
    x = ctx.x[0]
    if ctx.attr("storage_order", 0):
        raise ValueError(f"MaxPool node {ctx.node.name!r}: storage_order=1 is not supported for gradients")
    fast = _max_pool_tiled(ctx)
    if fast is not None:
        return (fast,)
    # General windows (overlapping, padded): scatter-add dY at the flat indices MaxPool reports.
    indices = ctx.forward_output(1, "indices")
    zeros = ctx.op.Reshape(ctx.b.zeros_like(x, ctx.elem_type(x)), ctx.b.ints([-1]))
    flat = ctx.op.ScatterElements(zeros, ctx.op.Reshape(indices, ctx.b.ints([-1])),
                                  ctx.op.Reshape(ctx.dy[0], ctx.b.ints([-1])), axis=0, reduction="add")
    return (ctx.op.Reshape(flat, ctx.op.Shape(x)),)


def _max_pool_tiled(ctx: GradContext) -> str | None:
    """Windows that tile the input exactly (kernel == stride, no padding): view X as (N, C, outs..., window),
    take ArgMax over the window and route dY there. About 6 passes over X, several times faster on CPU than
    MaxPool's Indices output plus a ScatterElements. None when the windows do not tile the input."""
    x = ctx.x[0]
    kernel = list(ctx.attr("kernel_shape"))
    n = len(kernel)
    strides, dilations, pads = _spatial_attrs(ctx, kernel)
    shape = ctx.info(x).shape
    if (strides != kernel or any(pads) or any(d != 1 for d in dilations) or shape is None
            or not all(isinstance(d, int) for d in shape[2:]) or any(d % k for d, k in zip(shape[2:], kernel))):
        return None
    op, b = ctx.op, ctx.b
    outs = [d // k for d, k in zip(shape[2:], kernel)]
    window = int(np.prod(kernel))
    tiles = [v for o, k in zip(outs, kernel) for v in (o, k)]                        # o1, k1, o2, k2, ...
    to_windows = [0, 1, *range(2, 2 + 2 * n, 2), *range(3, 3 + 2 * n, 2)]            # N, C, o..., k...
    xw = op.Reshape(op.Transpose(op.Reshape(x, b.ints([0, 0, *tiles])), perm=to_windows),
                    b.ints([0, 0, *outs, window]))
    first_max = op.ArgMax(xw, axis=-1, keepdims=1)                                   # (N, C, o..., 1)
    hit = op.Cast(op.Equal(first_max, b.const(np.arange(window, dtype=np.int64))), to=ctx.elem_type(x))
    g = op.Mul(hit, b.unsqueeze(ctx.dy[0], [-1]))                                     # (N, C, o..., window)
    g = op.Reshape(g, b.ints([0, 0, *outs, *kernel]))
    g = op.Transpose(g, perm=[int(i) for i in np.argsort(to_windows)])
    return op.Reshape(g, b.ints([0, 0, *shape[2:]]))


@register("AveragePool")
def average_pool(ctx: GradContext):
    """Spread each dY over its window: a depthwise ConvTranspose with a ones kernel, divided by the count."""
    x = ctx.x[0]
    kernel = list(ctx.attr("kernel_shape"))
    strides, dilations, pads = _spatial_attrs(ctx, kernel)
    n = len(kernel)
    channels = ctx.shape(x)[1]
    if not isinstance(channels, int):
        raise ValueError(f"AveragePool node {ctx.node.name!r}: the gradient needs a static channel count")
    if ctx.attr("ceil_mode", 0):
        raise ValueError(f"AveragePool node {ctx.node.name!r}: ceil_mode=1 is not supported for gradients")
    ones = ctx.b.const(np.ones((channels, 1, *kernel), dtype=np_dtype(ctx.elem_type(x))))
    dy = ctx.dy[0]
    if ctx.attr("count_include_pad", 0) or not any(pads):
        dy = ctx.op.Div(dy, ctx.const_like(float(np.prod(kernel)), x))
    else:
        # Windows near the border average over fewer elements: divide by each window's own count.
        count = ctx.op.AveragePool(ctx.b.ones_like(x, ctx.elem_type(x)), kernel_shape=kernel, strides=strides,
                                   pads=pads, count_include_pad=1)
        dy = ctx.op.Div(dy, ctx.op.Mul(count, ctx.const_like(float(np.prod(kernel)), x)))
    in_size, out_size = _spatial(ctx, x), _spatial(ctx, ctx.y[0])
    output_padding = [in_size[i] + pads[i] + pads[i + n] - ((out_size[i] - 1) * strides[i]
                      + (kernel[i] - 1) * dilations[i] + 1) for i in range(n)]
    dx = ctx.op.ConvTranspose(dy, ones, strides=strides, pads=pads, dilations=dilations, group=channels,
                              output_padding=output_padding if any(output_padding) else None)
    return (dx,)


@register("GlobalAveragePool")
def global_average_pool(ctx: GradContext):
    x = ctx.x[0]
    spatial = ctx.shape(x)[2:]
    if all(isinstance(d, int) for d in spatial):
        count = ctx.const_like(float(np.prod(spatial)), x)
    else:
        count = ctx.op.Cast(ctx.op.ReduceProd(ctx.op.Shape(x, start=2), keepdims=0), to=ctx.elem_type(x))
    return (expand_back(ctx, ctx.op.Div(ctx.dy[0], count), None),)


@register("Softmax")
def softmax(ctx: GradContext):
    """dX = y * (dY - sum(dY * y))  along the softmax axis."""
    y, dy = ctx.y[0], ctx.dy[0]
    axis = ctx.attr("axis", -1)
    s = ctx.b.reduce("ReduceSum", ctx.op.Mul(dy, y), [axis], keepdims=True)
    return (ctx.op.Mul(y, ctx.op.Sub(dy, s)),)


@register("LogSoftmax")
def log_softmax(ctx: GradContext):
    """dX = dY - softmax(x) * sum(dY)  along the axis."""
    y, dy = ctx.y[0], ctx.dy[0]
    axis = ctx.attr("axis", -1)
    s = ctx.b.reduce("ReduceSum", dy, [axis], keepdims=True)
    return (ctx.op.Sub(dy, ctx.op.Mul(ctx.op.Exp(y), s)),)


@register("Dropout")
def dropout(ctx: GradContext):
    """dX = dY * mask / (1 - ratio) in training mode; dX = dY otherwise."""
    x = ctx.x[0]
    flag = ctx.x[2] if len(ctx.x) > 2 and ctx.x[2] else None
    if flag is None or (ctx.const_value(flag) is not None and not bool(ctx.const_value(flag))):
        return ctx.dy[0], None, None
    mask = ctx.op.Cast(ctx.forward_output(1, "mask"), to=ctx.elem_type(x))
    ratio = ctx.x[1] if len(ctx.x) > 1 and ctx.x[1] else ctx.const_like(0.5, x)
    one = ctx.const_like(1.0, x)
    scale = ctx.op.Div(one, ctx.op.Sub(one, ctx.op.Cast(ratio, to=ctx.elem_type(x))))
    if ctx.const_value(flag) is None:  # decided at run time: no scaling when the flag is off
        scale = ctx.op.Where(flag, scale, one)
    return ctx.op.Mul(ctx.op.Mul(ctx.dy[0], mask), scale), None, None


def _normalized_backward(ctx: GradContext, xhat: str, dxhat: str, axes: list[int]) -> str:
    """dx / inv_std for xhat = (x - mean) * inv_std over ``axes``: dxhat - mean(dxhat) - xhat mean(dxhat xhat)."""
    m1 = ctx.b.reduce("ReduceMean", dxhat, axes, keepdims=True)
    m2 = ctx.b.reduce("ReduceMean", ctx.op.Mul(dxhat, xhat), axes, keepdims=True)
    return ctx.op.Sub(ctx.op.Sub(dxhat, m1), ctx.op.Mul(xhat, m2))


@register("LayerNormalization")
def layer_normalization(ctx: GradContext):
    """Recompute xhat from the saved mean and inverse std-dev (optional outputs 1 and 2)."""
    x, scale = ctx.x[0], ctx.x[1]
    bias = ctx.x[2] if len(ctx.x) > 2 and ctx.x[2] else None
    rank = ctx.rank(x)
    axis = ctx.attr("axis", -1) % rank
    axes = list(range(axis, rank))
    mean = ctx.forward_output(1, "mean")
    inv_std = ctx.forward_output(2, "inv_std_dev")
    xhat = ctx.op.Mul(ctx.op.Sub(x, mean), inv_std)
    dy = ctx.dy[0]
    dxhat = ctx.op.Mul(dy, scale)
    dx = ctx.op.Mul(_normalized_backward(ctx, xhat, dxhat, axes), inv_std)
    outer = list(range(axis))
    dscale = ctx.b.reduce("ReduceSum", ctx.op.Mul(dy, xhat), outer, keepdims=False) if outer else ctx.op.Mul(dy, xhat)
    dbias = None
    if bias is not None:
        dbias = ctx.b.reduce("ReduceSum", dy, outer, keepdims=False) if outer else dy
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
        mu = ctx.b.reduce("ReduceMean", x, axes, keepdims=True)
        centered = ctx.op.Sub(x, mu)
        batch_var = ctx.b.reduce("ReduceMean", ctx.op.Mul(centered, centered), axes, keepdims=True)
        inv_std = ctx.op.Reciprocal(ctx.op.Sqrt(ctx.op.Add(batch_var, ctx.const_like(eps, x))))
        xhat = ctx.op.Mul(centered, inv_std)
        dxhat = ctx.op.Mul(dy, ctx.op.Reshape(scale, bshape))
        dx = ctx.op.Mul(_normalized_backward(ctx, xhat, dxhat, axes), inv_std)
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
    dscale = ctx.b.reduce("ReduceSum", ctx.op.Mul(dy, xhat), axes, keepdims=False)
    dbias = ctx.b.reduce("ReduceSum", dy, axes, keepdims=False)
    # The running statistics: running_mean = m input_mean + (1 - m) mean(x), running_var likewise with var(x).
    dmean = dvar = None
    momentum = ctx.attr("momentum", 0.9)
    d_running = [ctx.dy[k] if len(ctx.dy) > k else None for k in (1, 2)]
    if any(d is not None for d in d_running):
        static = ctx.info(x).static_shape
        count = (ctx.const_like(float(np.prod(static) // static[1]), x) if static is not None else
                 ctx.op.Cast(ctx.op.Div(ctx.op.Size(x), ctx.op.Shape(x, start=1, end=2)), to=ctx.elem_type(x)))
        rate = ctx.op.Div(ctx.const_like(1.0 - momentum, x), count)
        if d_running[0] is not None:
            dmean = ctx.op.Mul(d_running[0], ctx.const_like(momentum, x))
            dx = ctx.op.Add(dx, ctx.op.Mul(ctx.op.Reshape(d_running[0], bshape), rate))
        if d_running[1] is not None:
            dvar = ctx.op.Mul(d_running[1], ctx.const_like(momentum, x))
            two_rate_centered = ctx.op.Mul(centered, ctx.op.Mul(rate, ctx.const_like(2.0, x)))
            dx = ctx.op.Add(dx, ctx.op.Mul(ctx.op.Reshape(d_running[1], bshape), two_rate_centered))
    return dx, dscale, dbias, dmean, dvar
