"""Gradients of the spectral ops: DFT and STFT.

Both are linear in the signal, so the gradient is the adjoint transform. With F the L-point DFT matrix
(F_kn = exp(-2 pi i k n / L), symmetric) and real and imaginary parts treated as separate real variables:

    forward DFT   y = F x             dx = conj(F) dy = L * IDFT(dy)
    inverse DFT   y = conj(F) x / L   dx = F dy / L   = DFT(dy) / L

A one-sided output keeps bins 0 .. L/2: the adjoint zero-pads dy back to L bins (DFT's ``dft_length`` pads).
The one-sided inverse (irfft) reads only bins 0 .. L/2 and mirrors the others, so each mirrored bin's gradient
counts twice. A ``dft_length`` that truncates or zero-pads the signal is undone by padding or truncating the
gradient, and a real signal (last axis 1) takes the real part. L is read at run time.
STFT is recomputed from Gather (frames), Mul (window) and DFT, and that small graph is differentiated.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from onnxtrain.autodiff.context import GradContext
from onnxtrain.autodiff.registry import register
from onnxtrain.autodiff.subgraph import differentiate

__all__ = ["dft", "stft"]


def _emit_dft(ctx: GradContext, x: str, length: str | None, axis: int, *, inverse: int, onesided: int) -> str:
    """A DFT node valid at the model's opset (``axis`` is an input since opset 20, an attribute before)."""
    if ctx.b.opset >= 20:
        return ctx.op.DFT(x, length or "", ctx.b.const(np.asarray(axis, dtype=np.int64)), inverse=inverse,
                          onesided=onesided)
    return ctx.op.DFT(x, length or "", axis=axis, inverse=inverse, onesided=onesided)


def _axis(ctx: GradContext) -> int:
    """The signal axis, as a non-negative index."""
    rank = ctx.rank(ctx.x[0])
    if ctx.b.opset < 20:
        return ctx.attr("axis", 1) % rank
    if len(ctx.x) < 3 or not ctx.x[2]:
        return -2 % rank
    value = ctx.const_value(ctx.x[2])
    if value is None:
        raise ValueError(f"DFT node {ctx.node.name!r}: the gradient needs a constant axis, got the run-time value "
                         f"{ctx.x[2]!r}")
    return int(np.asarray(value)) % rank


def _resize_axis(ctx: GradContext, g: str, size: str, axis: int, rank: int) -> str:
    """``g`` truncated or zero-padded at the end of ``axis`` to ``size`` (a 1-element int64 tensor)."""
    op = ctx.op
    kept = op.Slice(g, ctx.b.ints([0]), size, ctx.b.ints([axis]))
    missing = op.Sub(size, op.Slice(op.Shape(kept), ctx.b.ints([axis]), ctx.b.ints([axis + 1])))
    pads = op.Mul(ctx.b.ints([int(i == rank + axis) for i in range(2 * rank)]), missing)
    return op.Pad(kept, pads)


@register("DFT")
def dft(ctx: GradContext):
    """The adjoint transform (module docstring): an inverse DFT for a DFT and a DFT for an inverse one."""
    x, dy, op = ctx.x[0], ctx.dy[0], ctx.op
    inverse, onesided = ctx.attr("inverse", 0), ctx.attr("onesided", 0)
    rank, axis = ctx.rank(x), _axis(ctx)
    channels = ctx.shape(x)[-1]
    if channels not in (1, 2):
        raise ValueError(f"DFT node {ctx.node.name!r}: the gradient needs the last axis of {x!r} (1 for a real, 2 for "
                         f"a complex signal) to be known, got {channels!r}")
    irfft = inverse and onesided
    n = op.Slice(op.Shape(x), ctx.b.ints([axis]), ctx.b.ints([axis + 1]))             # the signal's length
    given = len(ctx.x) > 1 and ctx.x[1]
    if given:
        length = op.Cast(op.Reshape(ctx.x[1], ctx.b.ints([1])), to=TensorProto.INT64)
    elif irfft:                                                                         # L = 2 (bins - 1)
        length = op.Mul(op.Sub(n, ctx.b.ints([1])), ctx.b.ints([2]))
    else:
        length = n
    scalar_length = op.Reshape(length, ctx.b.ints([]))
    length_f = op.Cast(length, to=ctx.elem_type(x))
    if not inverse:
        g = op.Mul(_emit_dft(ctx, dy, scalar_length, axis, inverse=1, onesided=0), length_f)
    elif not onesided:
        g = op.Div(_emit_dft(ctx, dy, scalar_length, axis, inverse=0, onesided=0), length_f)
    else:
        half = _emit_dft(ctx, dy, scalar_length, axis, inverse=0, onesided=1)          # bins 0 .. L/2
        k = op.Range(ctx.b.const(np.asarray(0, np.int64)),
                     op.Reshape(op.Add(op.Div(length, ctx.b.ints([2])), ctx.b.ints([1])), ctx.b.ints([])),
                     ctx.b.const(np.asarray(1, np.int64)))
        alone = op.Or(op.Equal(k, ctx.b.const(np.asarray(0, np.int64))), op.Equal(op.Mul(k, ctx.b.ints([2])), length))
        weight = op.Sub(ctx.const_like(2.0, x), op.Cast(alone, to=ctx.elem_type(x)))   # 1 for bins 0 and L/2, else 2
        weight = op.Reshape(weight, ctx.b.ints([*[1] * axis, -1, *[1] * (rank - 1 - axis)]))
        g = op.Div(op.Mul(half, weight), length_f)
    if given or irfft:
        g = _resize_axis(ctx, g, n, axis, rank)
    if channels == 1:                                                                   # a real signal
        g = op.Slice(g, ctx.b.ints([0]), ctx.b.ints([1]), ctx.b.ints([-1]))
    return [g]


@register("STFT")
def stft(ctx: GradContext):
    """Frames of the signal (a Gather), times the window, through a DFT along the frame: that graph is
    recomputed from the node's inputs and differentiated."""
    signal, step = ctx.x[0], ctx.x[1]
    window = ctx.x[2] if len(ctx.x) > 2 and ctx.x[2] else None
    op, start = ctx.op, len(ctx.b.nodes)
    if len(ctx.x) > 3 and ctx.x[3]:
        frame_length = op.Reshape(op.Cast(ctx.x[3], to=TensorProto.INT64), ctx.b.ints([]))
    elif window is not None:
        frame_length = op.Reshape(op.Shape(window), ctx.b.ints([]))
    else:
        raise ValueError(f"STFT node {ctx.node.name!r}: neither frame_length nor window is given")
    step = op.Reshape(op.Cast(step, to=TensorProto.INT64), ctx.b.ints([]))
    signal_length = op.Reshape(op.Slice(op.Shape(signal), ctx.b.ints([1]), ctx.b.ints([2])), ctx.b.ints([]))
    zero, one = ctx.b.const(np.asarray(0, np.int64)), ctx.b.const(np.asarray(1, np.int64))
    frames = op.Add(op.Div(op.Sub(signal_length, frame_length), step), one)
    starts = op.Mul(op.Range(zero, frames, one), step)                                    # (F,)
    positions = op.Add(op.Unsqueeze(starts, ctx.b.ints([1])), op.Range(zero, frame_length, one))  # (F, n)
    framed = op.Gather(signal, positions, axis=1)                                        # (B, F, n, c)
    if window is not None:
        framed = op.Mul(framed, op.Unsqueeze(window, ctx.b.ints([1])))
    y = _emit_dft(ctx, framed, None, 2, inverse=0, onesided=ctx.attr("onesided", 1))
    grads = differentiate(ctx, ctx.b.nodes[start:], {y: ctx.dy[0]}, [x for x in (signal, window) if x])
    return [grads.get(signal), None, grads.get(window) if window else None]
