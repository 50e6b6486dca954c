"""Gradients of convolutions: Conv (grouped and depthwise included) and ConvTranspose.

dX is the transposed convolution of dY with the same weights; dW correlates x with dY.
"""

from __future__ import annotations

import math

import numpy as np

from onnxtrain.autodiff.context import GradContext
from onnxtrain.autodiff.registry import register
from onnxtrain.autodiff.spatial import (
    Size,
    all_known,
    crop_like,
    needs_run_time_pads,
    same_pads_at_run_time,
    spatial_attrs,
    spatial_sizes,
)
from onnxtrain.errors import UnsupportedOpError
from onnxtrain.ir.types import np_dtype

# The stride-1 dX of a dense k x k convolution whose output has at most this many positions per image is
# onnxruntime's ConvTranspose of dY with W, no flip and no transpose of W (bench/conv_kernels.py, ms per layer,
# ConvTranspose vs the Conv of dY with the flipped W): ResNet-18's 512 at 7x7, 24.7 vs 31.0 (1 thread, CPU time) and
# 18.7 vs 19.6 (2 threads). Not at 14x14: faster with 1 thread (LeNet's 32->64, batch 64: 4.8 vs 7.9; ResNet-18's
# 256: 18.2 vs 19.2) but not with 2 (4.8 vs 4.9; 17.0 vs 15.7), the benchmark's setting; slower above.
SMALL_IMAGE = 7 * 7


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
    if needs_run_time_pads(ctx, kernel):
        # The Conv of X padded at run time, without padding of its own: differentiate that, then crop dX.
        pads = same_pads_at_run_time(ctx, kernel)
        padded = ctx.op.Pad(x, pads)
        strides = list(ctx.attr("strides") or [1] * n)
        dilations = list(ctx.attr("dilations") or [1] * n)
        unknown = [None] * n
        dx = _conv_input_gradient(ctx, dy, w, padded, w_shape, group, strides, dilations, [0] * (2 * n),
                                  unknown, unknown)
        dw = _conv_weight_grad(ctx, padded, dy, w_shape, strides, dilations, [0] * (2 * n), group, unknown,
                               unknown, same_size=False, positions_like=None)
        return ctx.op.Pad(dx, ctx.op.Neg(pads)), dw, db
    strides, dilations, pads = spatial_attrs(ctx, kernel)
    in_size, out_size = spatial_sizes(ctx, x), spatial_sizes(ctx, ctx.y[0])

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
        if not all_known(in_size, out_size):
            if positions_like is not None:
                patches = crop_like(ctx, patches, positions_like, n)
        else:
            reach = [(in_size[i] + pads[i] + pads[i + n] - (kernel[i] - 1) * dilations[i] - 1) // strides[i] + 1
                     for i in range(n)]
            if reach != list(out_size):  # positions past dY are never used
                patches = op.Slice(patches, b.ints([0] * n), b.ints(out_size), b.ints(list(range(2, 2 + n))))
    positions = int(np.prod(out_size)) if all_known(out_size) else None
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
    if all_known(in_size, out_size):
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
    in_size, out_size = spatial_sizes(ctx, x), spatial_sizes(ctx, ctx.y[0])
    auto_pad, explicit = ctx.attr("auto_pad", "NOTSET"), ctx.attr("pads")
    reach = [(kernel[i] - 1) * dilations[i] + 1 for i in range(n)]
    # total padding = (the full transposed-conv extent) - (the output size); the spec splits it as follows.
    if ctx.attr("output_shape") is not None:
        if not all_known(in_size):
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
    if all_known(in_size, out_size):
        conv_out = [(out_size[i] + begin[i] + end[i] - reach[i]) // strides[i] + 1 for i in range(n)]
        if conv_out != in_size:
            dx = ctx.op.Slice(dx, ctx.b.ints([0] * n), ctx.b.ints(in_size), ctx.b.ints(list(range(2, 2 + n))))
    elif any(p >= s for p, s in zip(output_padding, strides)):  # only then can the Conv reach past X's size
        dx = crop_like(ctx, dx, x, n)
    dw = _conv_weight_grad(ctx, dy, x, w_shape, strides, dilations, pads, group, out_size, in_size,
                           same_size=False, positions_like=x)
    db = ctx.b.reduce("ReduceSum", dy, [0, *range(2, 2 + n)], keepdims=False) if bias is not None else None
    return dx, dw, db


def _conv_input_gradient(ctx: GradContext, dy: str, w: str, x: str, w_shape, group: int, strides, dilations, pads,
                         in_size: Size, out_size: Size) -> str:
    """dX of a convolution: the transposed convolution of dY with W.

    With stride 1 it is a plain Conv of dY with W flipped in space and with its channel axes swapped per
    group, padded by (k - 1) d - p: onnxruntime's Conv is faster than its ConvTranspose there, except on small
    images (see SMALL_IMAGE).
    """
    n = len(in_size)
    kernel = list(w_shape[2:])
    back_pads = [(kernel[i % n] - 1) * dilations[i % n] - pads[i] for i in range(2 * n)]
    small = all_known(out_size) and math.prod(out_size) <= SMALL_IMAGE
    if (all(s == 1 for s in strides) and all(p >= 0 for p in back_pads) and small and group == 1
            and any(k > 1 for k in kernel)):
        return ctx.op.ConvTranspose(dy, w, pads=pads, dilations=dilations)
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
    if not all_known(in_size, out_size):
        # The rows/cols the stride skipped at the end depend on the sizes: pad every axis by stride - 1 at the
        # end (always enough to cover X) and cut the result to X's size at run time.
        dx = ctx.op.ConvTranspose(dy, w, strides=strides, pads=[*pads[:n], *[0] * n], dilations=dilations,
                                  group=group, output_padding=[s - 1 for s in strides])
        return crop_like(ctx, dx, x, n)
    # Strided: the transposed convolution, with output_padding for the rows/cols the stride skipped.
    output_padding = [in_size[i] + pads[i] + pads[i + n] - ((out_size[i] - 1) * strides[i]
                      + (kernel[i] - 1) * dilations[i] + 1) for i in range(n)]
    return ctx.op.ConvTranspose(dy, w, strides=strides, pads=pads, dilations=dilations, group=group,
                                output_padding=output_padding if any(output_padding) else None)
