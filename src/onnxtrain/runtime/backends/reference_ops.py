"""Fixes to onnx.reference kernels that the generated graphs rely on (passed as ``new_ops``), and one to its
evaluator (:func:`name_omitted_outputs`)."""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx.reference.op_run import OpRun
from onnx.reference.ops.op_conv_transpose import ConvTranspose as _ConvTranspose
from onnx.reference.ops.op_erf import Erf as _Erf
from onnx.reference.ops.op_grid_sample import GridSample as _GridSample
from onnx.reference.ops.op_loop import Loop as _Loop
from onnx.reference.ops.op_max_pool import MaxPool as _MaxPool
from onnx.reference.ops.op_max_unpool import MaxUnpool as _MaxUnpool
from onnx.reference.ops.op_scan import Scan as _Scan

__all__ = ["PATCHED_OPS", "name_omitted_outputs"]


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


class Erf(_Erf):
    """onnx.reference computes Erf in float32 whatever the input type: compute it in the input's precision."""

    op_domain = ""

    def _run(self, x):
        return (np.vectorize(math.erf, otypes=[x.dtype])(x) if x.size else x.copy(),)


class Gelu(OpRun):
    """onnx.reference has no Gelu kernel and runs its function body, whose Erf is the float32 one above
    (function bodies do not see ``new_ops``)."""

    op_domain = ""

    def _run(self, x, approximate="none"):
        approximate = approximate or "none"
        if approximate == "tanh":
            inner = math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)
            return ((0.5 * x * (1 + np.tanh(inner))).astype(x.dtype),)
        erf = np.vectorize(math.erf, otypes=[x.dtype])(x / math.sqrt(2)) if x.size else x.copy()
        return ((0.5 * x * (1 + erf)).astype(x.dtype),)


class MaxPool(_MaxPool):
    """With unit strides and dilations onnx.reference takes a shortcut whose Indices output is wrong (each
    window's arg-max is offset): always take its general path, which gets the indices right."""

    op_domain = ""

    def _run(self, x, auto_pad=None, ceil_mode=None, dilations=None, kernel_shape=None, pads=None,
             storage_order=None, strides=None):
        n = len(kernel_shape)
        strides, dilations = strides or [1] * n, dilations or [1] * n
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            pads = [0] * (2 * n)
            for i, (size, k, s, d) in enumerate(zip(x.shape[2:], kernel_shape, strides, dilations)):
                total = max(0, (-(-size // s) - 1) * s + (k - 1) * d + 1 - size)
                small, big = total // 2, total - total // 2
                pads[i], pads[i + n] = (small, big) if auto_pad == "SAME_UPPER" else (big, small)
        elif auto_pad == "VALID":
            pads = None
        return self._max_pool(x, auto_pad="NOTSET", ceil_mode=ceil_mode, dilations=dilations,
                              kernel_shape=kernel_shape, pads=pads, storage_order=storage_order, strides=strides)


class MaxUnpool(_MaxUnpool):
    """onnx.reference scatters into the size the kernel and strides give, then pads to ``output_shape``; a
    MaxPool's indices, which its gradient scatters with, address the pooled input's layout, that is
    ``output_shape``'s (an odd size under 2x2 windows: index out of bounds). Scatter into ``output_shape`` itself,
    as onnxruntime does. (The ONNX backend test ``maxunpool_export_with_output_shape`` reads the indices in the
    un-padded layout instead; onnxruntime, which runs the training graphs, and the gradient rule do not.)"""

    op_domain = ""

    def _run(self, x, indices, output_shape=None, kernel_shape=None, pads=None, strides=None):
        if output_shape is None:
            return super()._run(x, indices, kernel_shape=kernel_shape, pads=pads, strides=strides)
        y = np.zeros(int(np.prod(output_shape)), dtype=x.dtype)
        y[indices.reshape(-1)] = x.reshape(-1)
        return (y.reshape(tuple(int(d) for d in output_shape)),)


class Mean(OpRun):
    """onnx.reference adds the inputs in place into the first one, so it fails when that one is broadcast."""

    op_domain = ""

    def _run(self, *args):
        return ((sum(args[1:], args[0]) / len(args)).astype(args[0].dtype),)


class LRN(OpRun):
    """onnx.reference loops over the batch axis instead of the channels (and accepts only 4-D input)."""

    op_domain = ""

    def _run(self, x, alpha=1e-4, beta=0.75, bias=1.0, size=None):
        lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
        square = x ** 2
        square_sum = np.stack([square[:, max(0, c - lo):c + hi + 1].sum(axis=1) for c in range(x.shape[1])], axis=1)
        return ((x / (bias + alpha / size * square_sum) ** beta).astype(x.dtype),)


class LpNormalization(OpRun):
    """onnx.reference sums x^p instead of |x|^p, so p=1 (and any odd p) gives a wrong norm."""

    op_domain = ""

    def _run(self, x, axis=-1, p=2):
        axis, p = -1 if axis is None else axis, 2 if p is None else p
        norm = np.power(np.power(np.abs(x), p).sum(axis=axis, keepdims=True), 1.0 / p)
        return (np.where(norm == 0, 0, x / np.where(norm == 0, 1, norm)).astype(x.dtype),)


class GlobalLpPool(OpRun):
    """Missing from onnx.reference: the Lp norm over the spatial axes."""

    op_domain = ""

    def _run(self, x, p=2):
        p = 2 if p is None else p
        axes = tuple(range(2, x.ndim))
        return (np.power(np.power(np.abs(x), p).sum(axis=axes, keepdims=True), 1.0 / p).astype(x.dtype),)


class Pad(OpRun):
    """onnx.reference hands the pads to numpy, which rejects negative pads (the spec crops there)."""

    op_domain = ""

    def _run(self, data, pads=None, constant_value=None, axes=None, mode=None, value=None):
        mode = mode or "constant"
        fill = constant_value if constant_value is not None else (value or 0)
        rank = data.ndim
        axes = list(range(rank)) if axes is None else [int(a) % rank for a in axes]
        pads = [int(p) for p in pads]
        k = len(axes)
        width, crop = [(0, 0)] * rank, [slice(None)] * rank
        for i, a in enumerate(axes):
            begin, end = pads[i], pads[i + k]
            width[a] = (max(begin, 0), max(end, 0))
            crop[a] = slice(max(-begin, 0), data.shape[a] - max(-end, 0))
        data = data[tuple(crop)]
        if mode == "constant":
            return (np.pad(data, width, mode="constant", constant_values=fill).astype(data.dtype),)
        return (np.pad(data, width, mode=mode).astype(data.dtype),)


class GridSample(_GridSample):
    """onnx.reference rounds the sampling coordinates to float32 whatever the input type: keep float64."""

    op_domain = ""

    def _gs_denormalize_coordinates(self, n, dims, align_corners: bool):
        return np.array([self._gs_denormalize(n=v, length=d, align_corners=align_corners) for v, d in zip(n, dims)],
                        dtype=np.float64)


class GlobalMaxPool(OpRun):
    """onnx.reference reduces axes 1 and 2 of a 3-D input (the channels with the time axis): the spatial axes."""

    op_domain = ""

    def _run(self, x):
        return (x.max(axis=tuple(range(2, x.ndim)), keepdims=True),)


class Loop(_Loop):
    """onnx.reference joins a Loop's scan outputs with np.vstack, along their first axis instead of a new one:
    (T*N, H) for T iterations of (N, H), (T, 1) for scalars. Each is reshaped to (T, *one iteration's shape)."""

    def __init__(self, onnx_node, run_params):
        super().__init__(onnx_node, run_params)
        run_body = self._run_body  # set per instance by OpRun for the body attribute

        def counted(*args, **kwargs):
            outputs = run_body(*args, **kwargs)
            self._iterations += 1
            self._scan_shapes = [np.shape(o) for o in outputs[len(outputs) - self.K:]] if self.K else []
            return outputs

        self._run_body = counted

    def _run(self, *args, **kwargs):
        self._iterations, self._scan_shapes = 0, []
        outputs = list(super()._run(*args, **kwargs))
        for k, shape in enumerate(self._scan_shapes if self._iterations else []):
            outputs[self.N + k] = outputs[self.N + k].reshape(self._iterations, *shape)
        return tuple(outputs)


class SoftmaxCrossEntropyLoss(OpRun):
    """onnx.reference takes the log of the softmax, which underflows to log(0) = -inf for a class far below the
    largest score (a loss of about 104 and more in float32): the log-softmax as scores minus their log-sum-exp,
    as onnxruntime computes it."""

    op_domain = ""

    def _run(self, scores, labels, weights=None, ignore_index=None, reduction=None):
        x = np.moveaxis(scores, 1, -1)   # [N, C, d...] -> [N, d..., C]
        shifted = x - x.max(axis=-1, keepdims=True)
        log_prob = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
        kept = np.ones(labels.shape, bool) if ignore_index is None else labels != ignore_index
        safe = np.where(kept, labels, 0).astype(np.int64)
        picked = -np.take_along_axis(log_prob, safe[..., None], axis=-1)[..., 0]
        weight = (weights[safe] if weights is not None else np.ones_like(picked)) * kept
        loss = picked * weight
        loss = loss.sum() if reduction == "sum" else loss if reduction == "none" else loss.sum() / weight.sum()
        outputs = (np.asarray(loss, dtype=scores.dtype), np.moveaxis(log_prob, -1, 1).astype(scores.dtype))
        return outputs[:len(self.onnx_node.output)]


class Scan(_Scan):
    """onnx.reference's Scan refuses reversed directions and axes other than 0, which a reverse-direction
    recurrence and the backward of every Scan use: the scan inputs are turned to axis 0, forward, before its
    loop, and the scan outputs back after it."""

    def __init__(self, onnx_node, run_params):
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in onnx_node.attribute}
        self._in_axes = list(attributes.get("scan_input_axes", []))
        self._in_directions = list(attributes.get("scan_input_directions", []))
        self._out_axes = list(attributes.get("scan_output_axes", []))
        self._out_directions = list(attributes.get("scan_output_directions", []))
        plain = onnx.NodeProto()
        plain.CopyFrom(onnx_node)
        del plain.attribute[:]
        plain.attribute.extend(a for a in onnx_node.attribute if not a.name.startswith(("scan_input_", "scan_output_")))
        super().__init__(plain, run_params)

    def _run(self, *args, **kwargs):
        states = len(args) - self.num_scan_inputs
        scans = [self._to_front(x, self._in_axes, self._in_directions, i) for i, x in enumerate(args[states:])]
        outputs = super()._run(*args[:states], *scans, **kwargs)
        return (*outputs[:states], *(self._from_front(y, self._out_axes, self._out_directions, i)
                                     for i, y in enumerate(outputs[states:])))

    @staticmethod
    def _to_front(x, axes, directions, i):
        axis = axes[i] if i < len(axes) else 0
        x = np.moveaxis(x, axis, 0)
        return x[::-1] if i < len(directions) and directions[i] else x

    @staticmethod
    def _from_front(y, axes, directions, i):
        y = y[::-1] if i < len(directions) and directions[i] else y
        axis = axes[i] if i < len(axes) else 0
        return np.ascontiguousarray(np.moveaxis(y, 0, axis))


PATCHED_OPS = [ConvTranspose, Erf, Gelu, GlobalLpPool, GlobalMaxPool, GridSample, LRN, LpNormalization, Loop, MaxPool,
               MaxUnpool, Mean, Pad, Scan, SoftmaxCrossEntropyLoss]


def name_omitted_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose omitted node outputs ("") get unused names.

    ReferenceEvaluator stores every output under its name, "" included, so a later node whose omitted
    optional input is also "" receives that stale value (e.g. a Pad(x, pads, "", axes) after an Attention
    with omitted present_key gets the present_key as its constant_value).
    """
    model = onnx.ModelProto.FromString(model.SerializeToString())
    count = 0

    def fix(graph: onnx.GraphProto) -> None:
        nonlocal count
        for node in graph.node:
            for i, out in enumerate(node.output):
                if not out:
                    node.output[i] = f"_omitted_output_{count}"
                    count += 1
            for attr in node.attribute:
                for g in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
                    fix(g)

    fix(model.graph)
    return model
