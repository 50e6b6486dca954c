"""Gradients of pooling: Max/Average/Lp pooling over windows and their Global forms.
"""

from __future__ import annotations

import numpy as np
import onnx

from onnxtrain.autodiff.context import GradContext
from onnxtrain.autodiff.reduce import expand_back
from onnxtrain.autodiff.registry import register
from onnxtrain.autodiff.shape import scatter_add, shape_of
from onnxtrain.autodiff.spatial import (
    all_known,
    crop_like,
    needs_run_time_pads,
    same_pads_at_run_time,
    spatial_attrs,
    spatial_sizes,
)
from onnxtrain.ir.types import np_dtype


@register("MaxPool")
def max_pool(ctx: GradContext):
    """dY goes to the first arg-max of each window (as torch)."""
    x = ctx.x[0]
    # SAME padding over a size known at run time: the faster routes need the pads; the indices do not
    separate = None if needs_run_time_pads(ctx, list(ctx.attr("kernel_shape"))) else _windows_apart(ctx)
    if separate and ctx.elem_type(x) in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16):
        # Windows that do not overlap: each index comes up once, so MaxUnpool puts every dY in place
        # (one pass; 2x faster than the ArgMax route on LeNet's pools, the forward's indices included).
        return (ctx.op.MaxUnpool(ctx.dy[0], _max_pool_indices(ctx), ctx.op.Shape(x), **separate),)
    fast = None if separate is None and needs_run_time_pads(ctx, list(ctx.attr("kernel_shape"))) else \
        _max_pool_tiled(ctx)  # onnxruntime has no double MaxUnpool
    if fast is not None:
        return (fast,)
    # General windows (overlapping, padded): scatter-add dY at the flat indices MaxPool reports.
    zeros = ctx.op.Reshape(ctx.b.zeros_like(x, ctx.elem_type(x)), ctx.b.ints([-1]))
    row = ctx.b.ints([-1])
    flat = scatter_add(ctx, zeros, ctx.op.Reshape(_max_pool_indices(ctx), row), ctx.op.Reshape(ctx.dy[0], row))
    return (ctx.op.Reshape(flat, ctx.op.Shape(x)),)


def _max_pool_indices(ctx: GradContext) -> str:
    """MaxPool's row-major flat indices of each window's first maximum."""
    if ctx.attr("storage_order", 0):        # column-major indices: ask a row-major twin for its own
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in ctx.node.attribute if a.name != "storage_order"}
        return ctx.op.MaxPool(ctx.x[0], _outputs=2, **{k: v.decode() if isinstance(v, bytes) else v
                                                       for k, v in attrs.items()})[1]
    return ctx.forward_output(1, "indices")


def _windows_apart(ctx: GradContext) -> dict | None:
    """MaxUnpool attributes when no two pooling windows share an element, else None."""
    kernel = list(ctx.attr("kernel_shape"))
    strides, dilations, pads = spatial_attrs(ctx, kernel)
    if any(s < (k - 1) * d + 1 for k, s, d in zip(kernel, strides, dilations)) or any(d != 1 for d in dilations):
        return None
    return {"kernel_shape": kernel, "strides": strides, "pads": pads}


def _max_pool_tiled(ctx: GradContext) -> str | None:
    """Windows that tile the input exactly (kernel == stride, no padding): view X as (N, C, outs..., window),
    take ArgMax over the window and route dY there. About 6 passes over X, several times faster on CPU than
    MaxPool's Indices output plus a ScatterElements. None when the windows do not tile the input."""
    x = ctx.x[0]
    kernel = list(ctx.attr("kernel_shape"))
    n = len(kernel)
    strides, dilations, pads = spatial_attrs(ctx, kernel)
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
    if needs_run_time_pads(ctx, kernel):
        return (_average_pool_padded_at_run_time(ctx, kernel),)
    strides, dilations, pads = spatial_attrs(ctx, kernel)
    dy = ctx.dy[0]
    if not ctx.attr("ceil_mode", 0) and (ctx.attr("count_include_pad", 0) or not any(pads)):
        dy = ctx.op.Div(dy, ctx.const_like(float(np.prod(kernel)), x))
    else:   # windows at the border (or past it, with ceil_mode) have their own divisor
        dy = ctx.op.Mul(dy, _inverse_divisor(ctx, kernel, strides, dilations, pads))
    return (_window_sum_transpose(ctx, dy, kernel, strides, dilations, pads),)


def _average_pool_padded_at_run_time(ctx: GradContext, kernel: list[int]) -> str:
    """SAME padding with a stride over a size known only at run time (TFLite's SAME pools on a dynamic image
    size): the pool is that of X padded at run time with zeros, without padding of its own, each window divided
    by the kernel's size or by the elements of X it covers; dX is the padded input's gradient, cropped."""
    op, b, x = ctx.op, ctx.b, ctx.x[0]
    n = len(kernel)
    strides, dilations = list(ctx.attr("strides") or [1] * n), list(ctx.attr("dilations") or [1] * n)
    pads = same_pads_at_run_time(ctx, kernel)
    if ctx.attr("count_include_pad", 0):
        dy = op.Div(ctx.dy[0], ctx.const_like(float(np.prod(kernel)), x))
    else:
        ones = b.full(op.Concat(b.ints([1, 1]), shape_of(b, x, 2, 2 + n), axis=0), 1, ctx.elem_type(x))
        window = b.const(np.ones((1, 1, *kernel), dtype=np_dtype(ctx.elem_type(x))))
        dy = op.Div(ctx.dy[0], op.Conv(op.Pad(ones, pads), window, strides=strides, dilations=dilations))
    g = _window_sum_transpose(ctx, dy, kernel, strides, dilations, [0] * (2 * n), like=op.Pad(x, pads))
    return op.Pad(g, op.Neg(pads))


def _inverse_divisor(ctx: GradContext, kernel: list[int], strides, dilations, pads) -> str:
    """1 / (the number AveragePool divides each window's sum by), shaped (1, 1, out...).

    Read off the op itself, so that count_include_pad, ceil_mode and partial windows match the runtime:
    averaging ones gives (elements inside x) / divisor, and a Conv of ones with a ones kernel counts the
    elements inside x (its end padding extended to reach the windows ceil_mode adds)."""
    n = len(kernel)
    op, b = ctx.op, ctx.b
    x = ctx.x[0]
    in_size, out_size = spatial_sizes(ctx, x), spatial_sizes(ctx, ctx.y[0])
    dtype = np_dtype(ctx.elem_type(x))
    if all_known(in_size):
        ones = b.const(np.ones((1, 1, *in_size), dtype=dtype))
    else:
        ones = b.full(op.Concat(b.ints([1, 1]), shape_of(b, x, 2, 2 + n), axis=0), 1, ctx.elem_type(x))
    dil = dilations if any(d != 1 for d in dilations) else None
    averaged = op.AveragePool(ones, kernel_shape=kernel, strides=strides, pads=pads, dilations=dil,
                              count_include_pad=ctx.attr("count_include_pad", 0), ceil_mode=ctx.attr("ceil_mode", 0))
    if all_known(in_size, out_size):
        reach = [(out_size[i] - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 for i in range(n)]
        end = [max(pads[n + i], reach[i] - in_size[i] - pads[i]) for i in range(n)]
    else:   # ceil_mode's last window reaches at most stride - 1 past the end padding; extra windows are cut
        end = [pads[n + i] + (strides[i] - 1 if ctx.attr("ceil_mode", 0) else 0) for i in range(n)]
    inside = op.Conv(ones, b.const(np.ones((1, 1, *kernel), dtype=dtype)), strides=strides,
                     dilations=dilations, pads=[*pads[:n], *end])
    if not all_known(in_size, out_size) and ctx.attr("ceil_mode", 0):
        inside = crop_like(ctx, inside, averaged, n)
    return op.Div(averaged, inside)


def _window_sum_transpose(ctx: GradContext, g: str, kernel: list[int], strides, dilations, pads,
                          like: str | None = None) -> str:
    """The transpose of summing each pooling window: every input element receives the sum of ``g`` over
    the windows it lies in. A depthwise ConvTranspose with a ones kernel, plus output_padding for the
    rows/cols the stride skipped. With a channel count known only at run time, the channels move into the
    batch axis and one single-channel ConvTranspose does the same. ``like``: the pooled input, when it is not
    the node's own (X padded at run time), whose sizes are then read at run time."""
    x = like or ctx.x[0]
    op, b = ctx.op, ctx.b
    n = len(kernel)
    channels = ctx.shape(ctx.x[0])[1]
    dtype = np_dtype(ctx.elem_type(ctx.x[0]))
    if isinstance(channels, int):
        ones, group = b.const(np.ones((channels, 1, *kernel), dtype=dtype)), channels
    else:
        ones, group = b.const(np.ones((1, 1, *kernel), dtype=dtype)), 1
        g = op.Reshape(g, b.ints([-1, 1, *[0] * n]))                               # (N*C, 1, out...)
    in_size, out_size = (spatial_sizes(ctx, x), spatial_sizes(ctx, ctx.y[0])) if like is None else ([None], [None])
    if all_known(in_size, out_size):
        output_padding = [in_size[i] + pads[i] + pads[i + n] - ((out_size[i] - 1) * strides[i]
                          + (kernel[i] - 1) * dilations[i] + 1) for i in range(n)]
        extend = [max(0, p) for p in output_padding]   # negative: ceil_mode windows reach past x; crop them
        g = op.ConvTranspose(g, ones, strides=strides, pads=pads, dilations=dilations, group=group,
                             output_padding=extend if any(extend) else None)
        if any(p < 0 for p in output_padding):
            g = op.Slice(g, b.ints([0] * n), b.ints(in_size), b.ints(list(range(2, 2 + n))))
    else:   # pad every axis by stride - 1 at the end (always enough to cover x), cut to x's size at run time
        g = op.ConvTranspose(g, ones, strides=strides, pads=[*pads[:n], *[0] * n], dilations=dilations,
                             group=group, output_padding=[s - 1 for s in strides] if any(s > 1 for s in strides)
                             else None)
        g = crop_like(ctx, g, x, n)
    return g if isinstance(channels, int) else op.Reshape(g, op.Shape(x))


@register("LpPool")
def lp_pool(ctx: GradContext):
    """y = (sum_window |x|^p)^(1/p):  dX = sign(x) |x|^(p-1) * (window-sum transpose of dY / y^(p-1))."""
    x, y, op = ctx.x[0], ctx.y[0], ctx.op
    kernel = list(ctx.attr("kernel_shape"))
    strides, dilations, pads = spatial_attrs(ctx, kernel)
    p = float(ctx.attr("p", 2))
    power = (lambda v: v) if p == 2 else (lambda v: op.Pow(v, ctx.const_like(p - 1, x)))  # noqa: E731
    spread = _window_sum_transpose(ctx, op.Div(ctx.dy[0], power(y)), kernel, strides, dilations, pads)
    return (op.Mul(op.Mul(op.Sign(x), power(op.Abs(x))), spread),)


@register("GlobalAveragePool")
def global_average_pool(ctx: GradContext):
    x = ctx.x[0]
    spatial = ctx.shape(x)[2:]
    if all(isinstance(d, int) for d in spatial):
        count = ctx.const_like(float(np.prod(spatial)), x)
    else:
        size = ctx.b.reduce("ReduceProd", shape_of(ctx.b, x, 2), None, keepdims=False)
        count = ctx.op.Cast(size, to=ctx.elem_type(x))
    return (expand_back(ctx, ctx.op.Div(ctx.dy[0], count), None),)


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
