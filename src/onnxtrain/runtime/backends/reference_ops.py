"""Fixes to onnx.reference kernels that the generated graphs rely on (passed as ``new_ops``)."""

from __future__ import annotations

import numpy as np
from onnx.reference.ops.op_conv_transpose import ConvTranspose as _ConvTranspose

__all__ = ["PATCHED_OPS"]


class ConvTranspose(_ConvTranspose):
    """Two fixes to onnx.reference's ConvTranspose:

    - grouped: it mis-shapes its output when groups have several channels, so run each group on its own
      and concatenate;
    - ``output_shape`` without ``pads`` and ``auto_pad``: it pads nothing and fails, where the spec (and
      onnxruntime) derive the pads from the output shape, the larger half at the beginning.
    """

    op_domain = ""

    def _run(self, X, W, B=None, group=None, **kwargs):
        group = group or 1
        output_shape = kwargs.get("output_shape")
        if output_shape is not None and kwargs.get("pads") is None and kwargs.get("auto_pad") in (None, "NOTSET"):
            n = X.ndim - 2
            strides = kwargs.get("strides") or [1] * n
            dilations = kwargs.get("dilations") or [1] * n
            output_padding = kwargs.get("output_padding") or [0] * n
            total = [strides[i] * (X.shape[i + 2] - 1) + output_padding[i] + (W.shape[i + 2] - 1) * dilations[i]
                     + 1 - output_shape[i] for i in range(n)]
            kwargs["pads"] = [t - t // 2 for t in total] + [t // 2 for t in total]
        if group == 1:
            return super()._run(X, W, B, group=1, **kwargs)
        xs, ws = np.split(X, group, axis=1), np.split(W, group, axis=0)
        bs = np.split(B, group) if B is not None else [None] * group
        outs = [super(ConvTranspose, self)._run(x, w, b, group=1, **kwargs)[0] for x, w, b in zip(xs, ws, bs)]
        return (np.concatenate(outs, axis=1),)


PATCHED_OPS = [ConvTranspose]
