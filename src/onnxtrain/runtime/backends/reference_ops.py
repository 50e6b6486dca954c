"""Fixes to onnx.reference kernels that the generated graphs rely on (passed as ``new_ops``)."""

from __future__ import annotations

import numpy as np
from onnx.reference.ops.op_conv_transpose import ConvTranspose as _ConvTranspose

__all__ = ["PATCHED_OPS"]


class ConvTranspose(_ConvTranspose):
    """onnx.reference's grouped ConvTranspose mis-shapes its output when groups have several channels:
    run each group on its own and concatenate."""

    op_domain = ""

    def _run(self, X, W, B=None, group=None, **kwargs):
        group = group or 1
        if group == 1:
            return super()._run(X, W, B, group=1, **kwargs)
        xs, ws = np.split(X, group, axis=1), np.split(W, group, axis=0)
        bs = np.split(B, group) if B is not None else [None] * group
        outs = [super(ConvTranspose, self)._run(x, w, b, group=1, **kwargs)[0] for x, w, b in zip(xs, ws, bs)]
        return (np.concatenate(outs, axis=1),)


PATCHED_OPS = [ConvTranspose]
