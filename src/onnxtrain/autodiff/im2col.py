"""Gradients of ops that move image patches: Col2Im and DeformConv.

Col2Im adds the entries of each column into the image positions its block covers; its adjoint reads them
back (im2col). Im2col is a convolution with one-hot kernels: output channel k of a Conv whose kernel is 1 at
block offset k and 0 elsewhere reads, at every block position, the image element at offset k, with the same
strides, dilations and pads.

DeformConv is recomputed from GridSample (the bilinear samples at the offset kernel taps, as the spec's
reference computes them), Mul (the mask) and MatMul (the weights), and that graph is differentiated.
"""

from __future__ import annotations

import numpy as np

from onnxtrain.autodiff.context import GradContext
from onnxtrain.autodiff.registry import register
from onnxtrain.autodiff.subgraph import differentiate
from onnxtrain.ir.types import np_dtype

__all__ = ["col2im", "deform_conv"]


@register("Col2Im")
def col2im(ctx: GradContext):
    """X (N, C prod(block), L) -> Y (N, C, *image):  dX = im2col(dY), a Conv of each channel of dY with the
    prod(block) one-hot kernels of the block's shape."""
    x, dy, op = ctx.x[0], ctx.dy[0], ctx.op
    block = ctx.const_value(ctx.x[2])
    if block is None:
        raise ValueError(f"Col2Im node {ctx.node.name!r}: the gradient needs a constant block_shape (the kernel "
                         f"of its im2col), got the run-time value {ctx.x[2]!r}")
    block = [int(b) for b in np.asarray(block).reshape(-1)]
    size = int(np.prod(block))
    one_hot = np.eye(size, dtype=np_dtype(ctx.elem_type(x))).reshape(size, 1, *block)
    spatial = op.Slice(op.Shape(dy), ctx.b.ints([2]), ctx.b.ints([2 + len(block)]))
    channels = op.Reshape(dy, op.Concat(ctx.b.ints([-1, 1]), spatial, axis=0))       # (N C, 1, *image)
    columns = op.Conv(channels, ctx.b.const(one_hot), kernel_shape=block,
                      strides=ctx.attr("strides"), dilations=ctx.attr("dilations"), pads=ctx.attr("pads"))
    return op.Reshape(columns, op.Shape(x)), None, None                              # (N C, size, *L) -> X


@register("DeformConv")
def deform_conv(ctx: GradContext):
    """Y = W * sample(X at the kernel taps moved by the offsets) * mask + B, recomputed and differentiated.

    Per offset group g, tap k = (i, j) and output position (p, q) the sample sits at
    (p s_h - pad_t + i d_h + offset_y, q s_w - pad_l + j d_w + offset_x): one GridSample (align_corners, zero
    padding) of X, with the offset groups folded into the batch, reads all of them.
    """
    x, w, offset = ctx.x[:3]
    bias = ctx.x[3] if len(ctx.x) > 3 and ctx.x[3] else None
    mask = ctx.x[4] if len(ctx.x) > 4 and ctx.x[4] else None
    op, b, start = ctx.op, ctx.b, len(ctx.b.nodes)
    kernel = ctx.attr("kernel_shape") or list(ctx.shape(w)[2:])
    if ctx.rank(x) != 4 or not all(isinstance(k, int) for k in kernel):
        raise ValueError(f"DeformConv node {ctx.node.name!r}: the gradient covers 2-D inputs with a known kernel "
                         f"shape, got rank {ctx.rank(x)} and kernel {kernel}")
    (kh, kw), taps = kernel, kernel[0] * kernel[1]
    sh, sw = ctx.attr("strides") or [1, 1]
    dh, dw = ctx.attr("dilations") or [1, 1]
    pads = ctx.attr("pads") or [0, 0, 0, 0]
    groups, offset_groups = ctx.attr("group", 1), ctx.attr("offset_group", 1)
    dtype = np_dtype(ctx.elem_type(x))

    def dim(v: str, i: int) -> str:                                     # dimension i of v, a 1-element vector
        return op.Slice(op.Shape(v), b.ints([i]), b.ints([i + 1]))

    def positions(i: int, stride: int, pad: int) -> str:                # p s - pad along output axis i
        count = op.Reshape(dim(offset, i), b.ints([]))
        steps = op.Cast(op.Range(b.const(np.asarray(0, np.int64)), count, b.const(np.asarray(1, np.int64))),
                        to=ctx.elem_type(x))
        return op.Sub(op.Mul(steps, ctx.const_like(stride, x)), ctx.const_like(pad, x))

    def normalized(p: str, size_axis: int) -> str:                      # pixel -> [-1, 1] (align_corners)
        size = op.Cast(dim(x, size_axis), to=ctx.elem_type(x))
        return op.Sub(op.Div(op.Mul(p, ctx.const_like(2.0, x)), op.Sub(size, ctx.const_like(1.0, x))),
                      ctx.const_like(1.0, x))

    tap_y = np.repeat(np.arange(kh) * dh, kw).astype(dtype).reshape(taps, 1, 1)
    tap_x = np.tile(np.arange(kw) * dw, kh).astype(dtype).reshape(taps, 1, 1)
    rows = op.Add(b.const(tap_y), op.Reshape(positions(2, sh, pads[0]), b.ints([1, -1, 1])))    # (K, oH, 1)
    cols = op.Add(b.const(tap_x), op.Reshape(positions(3, sw, pads[1]), b.ints([1, 1, -1])))    # (K, 1, oW)
    out_hw = op.Slice(op.Shape(offset), b.ints([2]), b.ints([4]))
    moved = op.Reshape(offset, op.Concat(b.ints([0, offset_groups, taps, 2]), out_hw, axis=0))
    grid_y = normalized(op.Add(rows, op.Gather(moved, b.const(np.asarray(0, np.int64)), axis=3)), 2)
    grid_x = normalized(op.Add(cols, op.Gather(moved, b.const(np.asarray(1, np.int64)), axis=3)), 3)
    grid = op.Concat(b.unsqueeze(grid_x, [-1]), b.unsqueeze(grid_y, [-1]), axis=-1)   # (N, og, K, oH, oW, 2)
    grid = op.Reshape(grid, op.Concat(b.ints([-1]), op.Mul(dim(offset, 2), b.ints([taps])), dim(offset, 3),
                                      b.ints([2]), axis=0))                             # (N og, K oH, oW, 2)
    per_group = op.Reshape(x, op.Concat(b.ints([-1]), op.Div(dim(x, 1), b.ints([offset_groups])),
                                        op.Slice(op.Shape(x), b.ints([2]), b.ints([4])), axis=0))
    mode = "linear" if b.opset >= 20 else "bilinear"
    sampled = op.GridSample(per_group, grid, align_corners=1, mode=mode, padding_mode="zeros")  # (N og, C/og, K oH, oW)
    batch, length = dim(x, 0), op.Mul(dim(offset, 2), dim(offset, 3))
    sampled = op.Reshape(sampled, op.Concat(batch, b.ints([offset_groups, -1, taps]), length, axis=0))
    if mask is not None:
        sampled = op.Mul(sampled, op.Reshape(mask, op.Concat(batch, b.ints([offset_groups, 1, taps]), length, axis=0)))
    columns = op.Reshape(sampled, op.Concat(batch, b.ints([groups, -1]), length, axis=0))   # (N, g, C/g K, L)
    flat_w = op.Reshape(w, b.ints([0, -1]))                                                  # (oC, C/g K)
    weights = op.Reshape(flat_w, op.Concat(b.ints([groups, -1]), dim(flat_w, 1), axis=0))  # (g, oC/g, C/g K)
    y = op.Reshape(op.MatMul(weights, columns), op.Concat(batch, b.ints([-1]), out_hw, axis=0))
    if bias is not None:
        y = op.Add(y, op.Reshape(bias, b.ints([1, -1, 1, 1])))
    wrt = [v for v in (x, w, offset, bias, mask) if v is not None]
    grads = differentiate(ctx, ctx.b.nodes[start:], {y: ctx.dy[0]}, wrt)
    return [grads.get(v) if v else None for v in ctx.x]
