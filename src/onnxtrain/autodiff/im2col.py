"""Gradients of ops that move image patches: Col2Im.

Col2Im adds the entries of each column into the image positions its block covers; its adjoint reads them
back (im2col). Im2col is a convolution with one-hot kernels: output channel k of a Conv whose kernel is 1 at
block offset k and 0 elsewhere reads, at every block position, the image element at offset k, with the same
strides, dilations and pads.
"""

from __future__ import annotations

import numpy as np

from onnxtrain.autodiff.context import GradContext
from onnxtrain.autodiff.registry import register
from onnxtrain.ir.types import np_dtype

__all__ = ["col2im"]


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
