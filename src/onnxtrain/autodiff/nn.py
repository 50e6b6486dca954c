"""Gradients of neural-network ops: convolution, pooling, normalization, softmax, dropout."""

from __future__ import annotations

import numpy as np
import onnx

from onnxtrain.autodiff.context import GradContext
from onnxtrain.autodiff.reduce import expand_back
from onnxtrain.autodiff.registry import register
from onnxtrain.autodiff.shape import scatter_add, shape_of
from onnxtrain.errors import UnsupportedOpError
from onnxtrain.ir.types import np_dtype

Size = list  # spatial sizes: ints, or None for a dimension only known at run time


def _spatial_attrs(ctx: GradContext, kernel: list[int]):
    """strides, dilations and explicit (begin..., end...) pads of a conv/pool node, auto_pad resolved.

    SAME padding with a stride pads by an amount that depends on the input size: when that size is only known
    at run time, use :func:`_same_pads_at_run_time` (the Conv rule does) or refuse with a clear error."""
    n = len(kernel)
    strides = list(ctx.attr("strides") or [1] * n)
    dilations = list(ctx.attr("dilations") or [1] * n)
    pads = list(ctx.attr("pads") or [0] * (2 * n))
    auto_pad = ctx.attr("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        spatial = _spatial(ctx, ctx.x[0])
        for i, (size, k, s, d) in enumerate(zip(spatial, kernel, strides, dilations)):
            if size is None and s != 1:
                raise UnsupportedOpError(
                    f"{ctx.node.op_type} node {ctx.node.name!r}: auto_pad={auto_pad} with stride {s} pads by an "
                    f"amount that depends on the input size, which is dynamic here ({ctx.shape(ctx.x[0])}). - help: "
                    f"export with explicit pads (torch does), or with a static size for that axis")
            # With stride 1 the total padding is (k - 1) d whatever the size.
            total = (k - 1) * d if size is None else max(0, (-(-size // s) - 1) * s + (k - 1) * d + 1 - size)
            small, big = total // 2, total - total // 2
            pads[i], pads[i + n] = (small, big) if auto_pad == "SAME_UPPER" else (big, small)
    elif auto_pad == "VALID":
        pads = [0] * (2 * n)
    return strides, dilations, pads


def _needs_run_time_pads(ctx: GradContext, kernel: list[int]) -> bool:
    """SAME padding with a stride over an axis whose size is only known at run time."""
    strides = list(ctx.attr("strides") or [1] * len(kernel))
    return (ctx.attr("auto_pad", "NOTSET") in ("SAME_UPPER", "SAME_LOWER")
            and any(size is None and s != 1 for size, s in zip(_spatial(ctx, ctx.x[0]), strides)))


def _same_pads_at_run_time(ctx: GradContext, kernel: list[int]) -> str:
    """The Pad-op pads (int64, begin and end of every axis) that SAME padding adds to X, computed from its shape:
    total = max(0, (ceil(size / s) - 1) s + (k - 1) d + 1 - size), the odd one at the end (SAME_UPPER) or begin."""
    op, b = ctx.op, ctx.b
    n = len(kernel)
    strides = list(ctx.attr("strides") or [1] * n)
    dilations = list(ctx.attr("dilations") or [1] * n)
    size = shape_of(b, ctx.x[0], 2, 2 + n)
    s, reach = b.ints(strides), b.ints([(k - 1) * d + 1 for k, d in zip(kernel, dilations)])
    out = op.Div(op.Add(size, op.Sub(s, b.ints([1] * n))), s)                   # ceil(size / s)
    total = op.Max(op.Sub(op.Add(op.Mul(op.Sub(out, b.ints([1] * n)), s), reach), size), b.ints([0] * n))
    small = op.Div(total, b.ints([2] * n))
    big = op.Sub(total, small)
    begin, end = (small, big) if ctx.attr("auto_pad") == "SAME_UPPER" else (big, small)
    return op.Concat(b.ints([0, 0]), begin, b.ints([0, 0]), end, axis=0)


def _spatial(ctx: GradContext, name: str) -> Size:
    """The spatial sizes of ``name`` (axes 2...), None for each one only known at run time."""
    return [d if isinstance(d, int) else None for d in ctx.shape(name)[2:]]


def _known(*sizes: Size) -> bool:
    return all(d is not None for size in sizes for d in size)


def _crop_like(ctx: GradContext, t: str, like: str, n: int) -> str:
    """``t`` cut at the end of its ``n`` spatial axes to the spatial size of ``like``, read at run time."""
    b = ctx.b
    return ctx.op.Slice(t, b.ints([0] * n), shape_of(b, like, 2, 2 + n), b.ints(list(range(2, 2 + n))))


@register("Conv")
def conv(ctx: GradContext):
    """dX = ConvTranspose(dY, W); dW = sum over samples and positions of dY times the patches of X; dB = sum of dY."""
    x, w = ctx.x[0], ctx.x[1]
    bias = ctx.x[2] if len(ctx.x) > 2 and ctx.x[2] else None
    dy, group = ctx.dy[0], ctx.attr("group", 1)
    w_shape = ctx.shape(w)
    kernel = list(w_shape[2:])
    n = len(kernel)
    db = ctx.b.reduce("ReduceSum", dy, [0, *range(2, 2 + n)], keepdims=False) if bias is not None else None
    if _needs_run_time_pads(ctx, kernel):
        # The Conv of X padded at run time, without padding of its own: differentiate that, then crop dX.
        pads = _same_pads_at_run_time(ctx, kernel)
        padded = ctx.op.Pad(x, pads)
        strides = list(ctx.attr("strides") or [1] * n)
        dilations = list(ctx.attr("dilations") or [1] * n)
        unknown = [None] * n
        dx = _conv_input_gradient(ctx, dy, w, padded, w_shape, group, strides, dilations, [0] * (2 * n),
                                  unknown, unknown)
        dw = _conv_weight_grad(ctx, padded, dy, w_shape, strides, dilations, [0] * (2 * n), group, unknown,
                               unknown, same_size=False, positions_like=None)
        return ctx.op.Pad(dx, ctx.op.Neg(pads)), dw, db
    strides, dilations, pads = _spatial_attrs(ctx, kernel)
    in_size, out_size = _spatial(ctx, x), _spatial(ctx, ctx.y[0])

    dx = _conv_input_gradient(ctx, dy, w, x, w_shape, group, strides, dilations, pads, in_size, out_size)
    # A 1x1 stride-1 unpadded Conv keeps the spatial size; otherwise the patches' positions are dY's.
    same_size = all(k == 1 for k in kernel) and all(s == 1 for s in strides) and not any(pads)
    dw = _conv_weight_grad(ctx, x, dy, w_shape, strides, dilations, pads, group, in_size, out_size,
                           same_size=same_size, positions_like=None)
    return dx, dw, db


def _conv_weight_grad(ctx: GradContext, x: str, dy: str, w_shape, strides, dilations, pads, group: int,
                      in_size: Size, out_size: Size, same_size: bool, positions_like: str | None) -> str:
    """dW of Y = Conv(X, W): dW[o, i, k] = sum_{n, p} dY[n, o, p] patch(X)[n, i, k, p], one batched product per group.

    The patches (im2col) come from a depthwise Conv of X with one-hot kernels (same strides, pads and
    dilations as the forward node), which costs N Ci K Ho Wo multiply-adds; 1x1 stride-1 convolutions use X
    as it is (``same_size``). onnxruntime runs the products as GEMMs; the classic "Conv of X with dY as the
    kernel" form degenerates into matrix-vector products there. When the patches can reach past dY's
    positions (ConvTranspose's weight gradient), they are cut to the spatial size of ``positions_like``.
    """
    op, b = ctx.op, ctx.b
    kernel = list(w_shape[2:])
    n, window = len(kernel), int(np.prod(kernel))
    c_out, c_in_g = w_shape[0], w_shape[1]
    c_in, c_out_g = c_in_g * group, c_out // group
    if c_in_g == 1 and c_out_g == 1:
        return _depthwise_weight_grad(ctx, x, dy, w_shape, strides, dilations, pads, group, in_size, out_size)
    if window == 1 and all(s == 1 for s in strides) and not any(pads) and (same_size or in_size == out_size):
        patches = x                                                                # (N, Ci, *P)
    else:
        one_hot = np.tile(np.eye(window, dtype=np_dtype(ctx.elem_type(ctx.x[1]))), (c_in, 1))
        patches = op.Conv(x, b.const(one_hot.reshape(c_in * window, 1, *kernel)), strides=strides, pads=pads,
                          dilations=dilations, group=c_in)                        # (N, Ci*K, *P')
        if not _known(in_size, out_size):
            if positions_like is not None:
                patches = _crop_like(ctx, patches, positions_like, n)
        else:
            reach = [(in_size[i] + pads[i] + pads[i + n] - (kernel[i] - 1) * dilations[i] - 1) // strides[i] + 1
                     for i in range(n)]
            if reach != list(out_size):  # positions past dY are never used
                patches = op.Slice(patches, b.ints([0] * n), b.ints(out_size), b.ints(list(range(2, 2 + n))))
    positions = int(np.prod(out_size)) if _known(out_size) else None
    # Few positions, many channels (the late 1x1 layers): one GEMM over (N*P) after moving the batch next to
    # the positions costs two passes over the activations instead of N full-size partial products. With a
    # size known only at run time, the GEMM also bounds the temporaries by the activations' size.
    if group == 1 and (positions is None or c_out * c_in * window > 2 * positions * (c_out + c_in * window)):
        rows = op.Reshape(op.Transpose(op.Reshape(patches, b.ints([0, c_in * window, -1])), perm=[1, 0, 2]),
                          b.ints([c_in * window, -1]))                            # (Ci*K, N*P)
        grads = op.Reshape(op.Transpose(op.Reshape(dy, b.ints([0, c_out, -1])), perm=[1, 0, 2]),
                           b.ints([c_out, -1]))                                   # (Co, N*P)
        return op.Reshape(op.Gemm(grads, rows, transB=1), b.ints([c_out, c_in_g, *kernel]))
    pg = op.Reshape(patches, b.ints([0, group, c_in_g * window, -1]))
    dg = op.Reshape(dy, b.ints([0, group, c_out_g, -1]))
    per_sample = op.MatMul(dg, op.Transpose(pg, perm=[0, 1, 3, 2]))                # (N, G, Co, Ci*K)
    dw = b.reduce("ReduceSum", per_sample, [0], keepdims=False)
    return op.Reshape(dw, b.ints([c_out, c_in_g, *kernel]))


def _depthwise_weight_grad(ctx: GradContext, x: str, dy: str, w_shape, strides, dilations, pads, group: int,
                           in_size: Size, out_size: Size) -> str:
    """Depthwise dW as one grouped Conv of X (batch moved into the channels) with dY as the kernel; the roles
    of stride and dilation swap. (A patches form with one matrix-vector product per sample and channel is
    faster alone but its 9-fold intermediate slows the whole step; see BENCHMARKS.md.)"""
    op, b = ctx.op, ctx.b
    kernel = list(w_shape[2:])
    n = len(kernel)
    xg = op.Reshape(op.Transpose(x, perm=[1, 0, *range(2, 2 + n)]), b.ints([1, -1, *[0] * n]))  # (1, C*N, *S)
    kg = op.Transpose(dy, perm=[1, 0, *range(2, 2 + n)])                                         # (C, N, *P)
    dw = op.Conv(xg, kg, strides=dilations, dilations=strides, pads=pads, group=group)           # (1, C, *K')
    # The spatial size of that Conv's output, floor((S + pads - ((P-1)*s + 1)) / d) + 1, can exceed K.
    if _known(in_size, out_size):
        dw_size = [(in_size[i] + pads[i] + pads[i + n] - ((out_size[i] - 1) * strides[i] + 1)) // dilations[i] + 1
                   for i in range(n)]
    else:
        dw_size = None
    if dw_size != kernel:
        dw = op.Slice(dw, b.ints([0] * n), b.ints(kernel), b.ints(list(range(2, 2 + n))))
    return op.Reshape(dw, b.ints([w_shape[0], 1, *kernel]))


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
    auto_pad, explicit = ctx.attr("auto_pad", "NOTSET"), ctx.attr("pads")
    reach = [(kernel[i] - 1) * dilations[i] + 1 for i in range(n)]
    # total padding = (the full transposed-conv extent) - (the output size); the spec splits it as follows.
    if ctx.attr("output_shape") is not None:
        if not _known(in_size):
            raise UnsupportedOpError(
                f"ConvTranspose node {ctx.node.name!r}: output_shape fixes the output size while the input size "
                f"is dynamic ({ctx.shape(x)}); the padding is then only known at run time. - help: export with "
                f"pads/output_padding instead of output_shape")
        out_size = list(ctx.attr("output_shape"))[-n:]
        total = [strides[i] * (in_size[i] - 1) + output_padding[i] + reach[i] - out_size[i] for i in range(n)]
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):   # the output is input * stride, whatever the input size
        total = [output_padding[i] + reach[i] - strides[i] for i in range(n)]
    elif auto_pad == "VALID":
        total = [0] * n
    else:
        explicit_pads = list(explicit or [0] * (2 * n))
        total = [explicit_pads[i] + explicit_pads[i + n] for i in range(n)]
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
    if _known(in_size, out_size):
        conv_out = [(out_size[i] + begin[i] + end[i] - reach[i]) // strides[i] + 1 for i in range(n)]
        if conv_out != in_size:
            dx = ctx.op.Slice(dx, ctx.b.ints([0] * n), ctx.b.ints(in_size), ctx.b.ints(list(range(2, 2 + n))))
    elif any(p >= s for p, s in zip(output_padding, strides)):  # only then can the Conv reach past X's size
        dx = _crop_like(ctx, dx, x, n)
    dw = _conv_weight_grad(ctx, dy, x, w_shape, strides, dilations, pads, group, out_size, in_size,
                           same_size=False, positions_like=x)
    db = ctx.b.reduce("ReduceSum", dy, [0, *range(2, 2 + n)], keepdims=False) if bias is not None else None
    return dx, dw, db


def _conv_input_gradient(ctx: GradContext, dy: str, w: str, x: str, w_shape, group: int, strides, dilations, pads,
                         in_size: Size, out_size: Size) -> str:
    """dX of a convolution: the transposed convolution of dY with W.

    With stride 1 it is a plain Conv of dY with W flipped in space and with its channel axes swapped per
    group, padded by (k - 1) d - p: onnxruntime's Conv is 2-3x faster than its ConvTranspose on CPU.
    """
    n = len(in_size)
    kernel = list(w_shape[2:])
    back_pads = [(kernel[i % n] - 1) * dilations[i % n] - pads[i] for i in range(2 * n)]
    if all(s == 1 for s in strides) and all(p >= 0 for p in back_pads):
        op, b = ctx.op, ctx.b
        c_out_g, c_in_g = w_shape[0] // group, w_shape[1]
        if c_out_g > 1 or c_in_g > 1:  # (G*Co, Ci, k...) -> (G*Ci, Co, k...)
            w = op.Reshape(w, b.ints([group, c_out_g, c_in_g, *kernel]))
            w = op.Transpose(w, perm=[0, 2, 1, *range(3, 3 + n)])
            w = op.Reshape(w, b.ints([group * c_in_g, c_out_g, *kernel]))
        spatial = list(range(2, 2 + n))
        if all(k == 1 for k in kernel):  # nothing to flip
            return op.Conv(dy, w, pads=back_pads, dilations=dilations, group=group)
        flipped = op.Slice(w, b.ints([-1] * n), b.ints([-(2**62)] * n), b.ints(spatial), b.ints([-1] * n))
        return op.Conv(dy, flipped, pads=back_pads, dilations=dilations, group=group)
    if not _known(in_size, out_size):
        # The rows/cols the stride skipped at the end depend on the sizes: pad every axis by stride - 1 at the
        # end (always enough to cover X) and cut the result to X's size at run time.
        dx = ctx.op.ConvTranspose(dy, w, strides=strides, pads=[*pads[:n], *[0] * n], dilations=dilations,
                                  group=group, output_padding=[s - 1 for s in strides])
        return _crop_like(ctx, dx, x, n)
    # Strided: the transposed convolution, with output_padding for the rows/cols the stride skipped.
    output_padding = [in_size[i] + pads[i] + pads[i + n] - ((out_size[i] - 1) * strides[i]
                      + (kernel[i] - 1) * dilations[i] + 1) for i in range(n)]
    return ctx.op.ConvTranspose(dy, w, strides=strides, pads=pads, dilations=dilations, group=group,
                                output_padding=output_padding if any(output_padding) else None)


@register("MaxPool")
def max_pool(ctx: GradContext):
    """dY goes to the first arg-max of each window (as torch)."""
    x = ctx.x[0]
    separate = _windows_apart(ctx)
    if separate and ctx.elem_type(x) in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16):
        # Windows that do not overlap: each index comes up once, so MaxUnpool puts every dY in place
        # (one pass; 2x faster than the ArgMax route on LeNet's pools, the forward's indices included).
        return (ctx.op.MaxUnpool(ctx.dy[0], _max_pool_indices(ctx), ctx.op.Shape(x), **separate),)
    fast = _max_pool_tiled(ctx)  # onnxruntime has no double MaxUnpool
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
    strides, dilations, pads = _spatial_attrs(ctx, kernel)
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
    dy = ctx.dy[0]
    if not ctx.attr("ceil_mode", 0) and (ctx.attr("count_include_pad", 0) or not any(pads)):
        dy = ctx.op.Div(dy, ctx.const_like(float(np.prod(kernel)), x))
    else:   # windows at the border (or past it, with ceil_mode) have their own divisor
        dy = ctx.op.Mul(dy, _inverse_divisor(ctx, kernel, strides, dilations, pads))
    return (_window_sum_transpose(ctx, dy, kernel, strides, dilations, pads),)


def _inverse_divisor(ctx: GradContext, kernel: list[int], strides, dilations, pads) -> str:
    """1 / (the number AveragePool divides each window's sum by), shaped (1, 1, out...).

    Read off the op itself, so that count_include_pad, ceil_mode and partial windows match the runtime:
    averaging ones gives (elements inside x) / divisor, and a Conv of ones with a ones kernel counts the
    elements inside x (its end padding extended to reach the windows ceil_mode adds)."""
    n = len(kernel)
    op, b = ctx.op, ctx.b
    x = ctx.x[0]
    in_size, out_size = _spatial(ctx, x), _spatial(ctx, ctx.y[0])
    dtype = np_dtype(ctx.elem_type(x))
    if _known(in_size):
        ones = b.const(np.ones((1, 1, *in_size), dtype=dtype))
    else:
        ones = b.full(op.Concat(b.ints([1, 1]), shape_of(b, x, 2, 2 + n), axis=0), 1, ctx.elem_type(x))
    dil = dilations if any(d != 1 for d in dilations) else None
    averaged = op.AveragePool(ones, kernel_shape=kernel, strides=strides, pads=pads, dilations=dil,
                              count_include_pad=ctx.attr("count_include_pad", 0), ceil_mode=ctx.attr("ceil_mode", 0))
    if _known(in_size, out_size):
        reach = [(out_size[i] - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 for i in range(n)]
        end = [max(pads[n + i], reach[i] - in_size[i] - pads[i]) for i in range(n)]
    else:   # ceil_mode's last window reaches at most stride - 1 past the end padding; extra windows are cut
        end = [pads[n + i] + (strides[i] - 1 if ctx.attr("ceil_mode", 0) else 0) for i in range(n)]
    inside = op.Conv(ones, b.const(np.ones((1, 1, *kernel), dtype=dtype)), strides=strides,
                     dilations=dilations, pads=[*pads[:n], *end])
    if not _known(in_size, out_size) and ctx.attr("ceil_mode", 0):
        inside = _crop_like(ctx, inside, averaged, n)
    return op.Div(averaged, inside)


def _window_sum_transpose(ctx: GradContext, g: str, kernel: list[int], strides, dilations, pads) -> str:
    """The transpose of summing each pooling window: every input element receives the sum of ``g`` over
    the windows it lies in. A depthwise ConvTranspose with a ones kernel, plus output_padding for the
    rows/cols the stride skipped. With a channel count known only at run time, the channels move into the
    batch axis and one single-channel ConvTranspose does the same."""
    x = ctx.x[0]
    op, b = ctx.op, ctx.b
    n = len(kernel)
    channels = ctx.shape(x)[1]
    dtype = np_dtype(ctx.elem_type(x))
    if isinstance(channels, int):
        ones, group = b.const(np.ones((channels, 1, *kernel), dtype=dtype)), channels
    else:
        ones, group = b.const(np.ones((1, 1, *kernel), dtype=dtype)), 1
        g = op.Reshape(g, b.ints([-1, 1, *[0] * n]))                               # (N*C, 1, out...)
    in_size, out_size = _spatial(ctx, x), _spatial(ctx, ctx.y[0])
    if _known(in_size, out_size):
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
        g = _crop_like(ctx, g, x, n)
    return g if isinstance(channels, int) else op.Reshape(g, op.Shape(x))


@register("LpPool")
def lp_pool(ctx: GradContext):
    """y = (sum_window |x|^p)^(1/p):  dX = sign(x) |x|^(p-1) * (window-sum transpose of dY / y^(p-1))."""
    x, y, op = ctx.x[0], ctx.y[0], ctx.op
    kernel = list(ctx.attr("kernel_shape"))
    strides, dilations, pads = _spatial_attrs(ctx, kernel)
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
