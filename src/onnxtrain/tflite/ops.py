"""One converter per TFLite operator, registered by operator name (as the autodiff rules are by op type).

A converter reads the op's inputs through the context (in the layout it wants), emits ONNX nodes with the
builder and records its outputs. The ops are those ONERT trains, their fused activations, and the shape
arithmetic (SHAPE, STRIDED_SLICE, PACK) TensorFlow's converter emits for a Flatten with a dynamic batch.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from onnxtrain.tflite.context import NHWC_TO_NCHW, ImportContext
from onnxtrain.tflite.reader import FlatOperator

__all__ = ["CONVERTERS", "converts"]

Converter = Callable[[ImportContext, FlatOperator], None]
CONVERTERS: dict[str, Converter] = {}

_SAME, _VALID = 0, 1
_ACTIVATIONS = {0: "NONE", 1: "RELU", 2: "RELU_N1_TO_1", 3: "RELU6", 4: "TANH", 5: "SIGN_BIT"}
_INT64_MAX = np.iinfo(np.int64).max


def converts(*codes: str) -> Callable[[Converter], Converter]:
    """Register the decorated function as the converter of the TFLite operators ``codes``."""
    def register(fn: Converter) -> Converter:
        for code in codes:
            if code in CONVERTERS:
                raise ValueError(f"a converter for {code} is already registered")
            CONVERTERS[code] = fn
        return fn
    return register


def _emit(ctx: ImportContext, op: FlatOperator, op_type: str, inputs: list[str | None], layout: str = "nhwc",
          **attrs) -> None:
    """Emit ``op_type`` and the op's fused activation; the last node writes the op's output."""
    out = ctx.output(op, 0, layout)
    if _fused_activation(ctx, op) == 0:
        ctx.builder.node(op_type, inputs, [out], **attrs)
        return
    _activate(ctx, op, ctx.builder.node(op_type, inputs, **attrs), out)


def _fused_activation(ctx: ImportContext, op: FlatOperator) -> int:
    fused = getattr(op.options, "FusedActivationFunction", lambda: 0)()
    if fused not in (0, 1, 2, 3, 4):
        raise ctx.fail(op, f"fused activation {_ACTIVATIONS.get(fused, fused)} is not supported (supported: NONE, "
                           f"RELU, RELU_N1_TO_1, RELU6, TANH)")
    return fused


def _activate(ctx: ImportContext, op: FlatOperator, x: str, out: str | None = None) -> str:
    """The op's fused activation of ``x`` (written to ``out`` if given); ``x`` itself when it has none."""
    fused, b = _fused_activation(ctx, op), ctx.builder
    outputs = [out] if out is not None else 1
    if fused == 0:
        return x if out is None else b.node("Identity", [x], outputs)
    if fused == 1:
        return b.node("Relu", [x], outputs)
    if fused in (2, 3):
        lo, hi = (-1.0, 1.0) if fused == 2 else (0.0, 6.0)
        return b.node("Clip", [x, b.const(np.float32(lo)), b.const(np.float32(hi))], outputs)
    return b.node("Tanh", [x], outputs)


def _same_pads(size: int, kernel: int, stride: int, dilation: int) -> tuple[int, int]:
    """TensorFlow's SAME padding along one axis: the extra pixel, if any, goes at the end."""
    out = -(-size // stride)
    total = max((out - 1) * stride + (kernel - 1) * dilation + 1 - size, 0)
    return total // 2, total - total // 2


def _pads(ctx: ImportContext, op: FlatOperator, kernel: tuple[int, int], strides: tuple[int, int],
          dilations: tuple[int, int] = (1, 1)) -> dict:
    """ONNX padding attributes for TFLite's SAME / VALID, explicit when the image size is static."""
    if op.options.Padding() == _VALID:
        return {}
    _, h, w, _ = ctx.tensor(op.inputs[0]).signature
    if h < 0 or w < 0:
        return {"auto_pad": "SAME_UPPER"}
    (t, bottom), (left, right) = (_same_pads(h, kernel[0], strides[0], dilations[0]),
                                  _same_pads(w, kernel[1], strides[1], dilations[1]))
    return {"pads": [t, left, bottom, right]}


@converts("CONV_2D")
def conv_2d(ctx: ImportContext, op: FlatOperator) -> None:
    """NHWC x OHWI -> Conv(NCHW, Transpose(weight) to OIHW): the weight stays a TFLite-layout initializer."""
    cin_per_group = ctx.tensor(op.inputs[1]).shape[3]
    _conv(ctx, op, list(NHWC_TO_NCHW), group=ctx.tensor(op.inputs[0]).shape[3] // cin_per_group)


@converts("DEPTHWISE_CONV_2D")
def depthwise_conv_2d(ctx: ImportContext, op: FlatOperator) -> None:
    """Weight [1, KH, KW, C*M] -> [C*M, 1, KH, KW], one group per input channel."""
    _conv(ctx, op, [3, 0, 1, 2], group=ctx.tensor(op.inputs[0]).shape[3])


def _conv(ctx: ImportContext, op: FlatOperator, weight_perm: list[int], group: int) -> None:
    """A Conv over the NCHW input, with the TFLite-layout weight transposed by ``weight_perm`` to OIHW."""
    o = op.options
    x, w = ctx.nchw(op.inputs[0]), ctx.nhwc(op.inputs[1])
    _, kh, kw, _ = ctx.tensor(op.inputs[1]).shape
    bias = ctx.nhwc(op.inputs[2]) if len(op.inputs) > 2 and op.inputs[2] >= 0 else None
    strides, dilations = (o.StrideH(), o.StrideW()), (o.DilationHFactor(), o.DilationWFactor())
    _emit(ctx, op, "Conv", [x, ctx.builder.op.Transpose(w, perm=weight_perm), bias], "nchw", strides=list(strides),
          dilations=list(dilations), group=group, kernel_shape=[kh, kw],
          **_pads(ctx, op, (kh, kw), strides, dilations))


@converts("AVERAGE_POOL_2D", "MAX_POOL_2D")
def pool_2d(ctx: ImportContext, op: FlatOperator) -> None:
    o = op.options
    kernel, strides = (o.FilterHeight(), o.FilterWidth()), (o.StrideH(), o.StrideW())
    attrs = dict(kernel_shape=list(kernel), strides=list(strides), **_pads(ctx, op, kernel, strides))
    if op.code == "AVERAGE_POOL_2D":  # TensorFlow averages over the pixels inside the image only
        _emit(ctx, op, "AveragePool", [ctx.nchw(op.inputs[0])], "nchw", count_include_pad=0, **attrs)
    else:
        _emit(ctx, op, "MaxPool", [ctx.nchw(op.inputs[0])], "nchw", **attrs)


def _flat_input(ctx: ImportContext, index: int) -> str:
    """A tensor in TFLite's element order; an [N, 1, 1, C] or [N, H, W, 1] NCHW value already is in it."""
    t = ctx.tensor(index)
    name, layout = ctx.value(index)
    if layout == "nchw" and not ctx.has(index, "nhwc"):
        _, h, w, c = t.signature
        if min(h, w, c) > 0 and (h == w == 1 or c == 1):
            return ctx.builder.op.Reshape(name, ctx.builder.ints([0, h, w, c]))
    return ctx.nhwc(index)


@converts("FULLY_CONNECTED")
def fully_connected(ctx: ImportContext, op: FlatOperator) -> None:
    """y = x W^T + b over the last axis; inputs of higher rank are flattened to [-1, in] first (keep_num_dims
    restores the leading axes)."""
    o = op.options
    b = ctx.builder
    if o is not None and o.WeightsFormat() != 0:
        raise ctx.fail(op, "only the DEFAULT weights format is supported (shuffled int8 weights are quantized)")
    x_t, w_t = ctx.tensor(op.inputs[0]), ctx.tensor(op.inputs[1])
    units, depth = w_t.shape
    x = _flat_input(ctx, op.inputs[0]) if len(x_t.signature) == 4 else ctx.nhwc(op.inputs[0])
    if len(x_t.signature) != 2:
        x = b.op.Reshape(x, b.ints([-1, depth]))
    bias = ctx.nhwc(op.inputs[2]) if len(op.inputs) > 2 and op.inputs[2] >= 0 else None
    if o is not None and o.KeepNumDims() and len(x_t.signature) != 2:
        y = _activate(ctx, op, b.op.Gemm(x, ctx.nhwc(op.inputs[1]), bias, transB=1))  # elementwise: before the view
        lead = b.op.Slice(b.op.Shape(ctx.nhwc(op.inputs[0])), b.ints([0]), b.ints([-1]))
        b.node("Reshape", [y, b.op.Concat(lead, b.ints([units]), axis=0)], [ctx.output(op)])
        return
    _emit(ctx, op, "Gemm", [x, ctx.nhwc(op.inputs[1]), bias], transB=1)


@converts("RESHAPE")
def reshape(ctx: ImportContext, op: FlatOperator) -> None:
    b = ctx.builder
    if len(op.inputs) > 1 and op.inputs[1] >= 0:
        shape_t = ctx.tensor(op.inputs[1])
        shape = b.ints(shape_t.data.tolist()) if shape_t.data is not None else \
            b.op.Cast(ctx.nhwc(op.inputs[1]), to=7)
    else:
        shape = b.ints(list(op.options.NewShapeAsNumpy()))
    x = _flat_input(ctx, op.inputs[0]) if ctx.rank(op.inputs[0]) == 4 else ctx.nhwc(op.inputs[0])
    b.node("Reshape", [x, shape], [ctx.output(op)])


@converts("SOFTMAX")
def softmax(ctx: ImportContext, op: FlatOperator) -> None:
    b = ctx.builder
    name, layout = ctx.value(op.inputs[0])
    beta = op.options.Beta() if op.options is not None else 1.0
    if beta != 1.0:
        name = b.op.Mul(name, b.const(np.float32(beta)))
    b.node("Softmax", [name], [ctx.output(op, 0, layout)], axis=1 if layout == "nchw" else -1)


@converts("LOGISTIC", "TANH", "RELU", "RELU6", "RELU_N1_TO_1", "LEAKY_RELU")
def unary(ctx: ImportContext, op: FlatOperator) -> None:
    b = ctx.builder
    x, layout = ctx.value(op.inputs[0])
    out = ctx.output(op, 0, layout)
    if op.code in ("RELU6", "RELU_N1_TO_1"):
        lo, hi = (0.0, 6.0) if op.code == "RELU6" else (-1.0, 1.0)
        b.node("Clip", [x, b.const(np.float32(lo)), b.const(np.float32(hi))], [out])
    elif op.code == "LEAKY_RELU":
        b.node("LeakyRelu", [x], [out], alpha=float(op.options.Alpha()))
    else:
        b.node({"LOGISTIC": "Sigmoid", "TANH": "Tanh", "RELU": "Relu"}[op.code], [x], [out])


@converts("ADD", "SUB", "MUL", "DIV")
def binary(ctx: ImportContext, op: FlatOperator) -> None:
    """Elementwise with NumPy broadcasting; if either side is an NCHW image, the other follows it."""
    a, c = op.inputs
    nchw = any(ctx.rank(i) == 4 and ctx.value(i)[1] == "nchw" for i in (a, c)) and \
        max(ctx.rank(a), ctx.rank(c)) == 4
    x, y = (ctx.nchw_operand(a), ctx.nchw_operand(c)) if nchw else (ctx.nhwc(a), ctx.nhwc(c))
    onnx_op = {"ADD": "Add", "SUB": "Sub", "MUL": "Mul", "DIV": "Div"}[op.code]
    _emit(ctx, op, onnx_op, [x, y], "nchw" if nchw else "nhwc")


@converts("CONCATENATION")
def concatenation(ctx: ImportContext, op: FlatOperator) -> None:
    if op.options.FusedActivationFunction():  # LiteRT's kernel ignores it; the schema says to apply it
        raise ctx.fail(op, "a fused activation on CONCATENATION is not supported (LiteRT ignores it)")
    rank = ctx.rank(op.outputs[0])
    axis = op.options.Axis() % rank
    nchw = rank == 4 and any(ctx.value(i)[1] == "nchw" for i in op.inputs)
    if nchw:
        parts, axis = [ctx.nchw(i) for i in op.inputs], NHWC_TO_NCHW.index(axis)
    else:
        parts = [ctx.nhwc(i) for i in op.inputs]
    ctx.builder.node("Concat", parts, [ctx.output(op, 0, "nchw" if nchw else "nhwc")], axis=axis)


@converts("MEAN", "SUM", "REDUCE_MAX")
def reduce(ctx: ImportContext, op: FlatOperator) -> None:
    """Over constant axes; an NCHW input is reduced as is when the kept axes come out in TFLite's order."""
    rank = ctx.rank(op.inputs[0])
    axes = sorted({int(a) % rank for a in np.atleast_1d(ctx.constant_value(op, 1, "the axes"))})
    keep = bool(op.options.KeepDims()) if op.options is not None else False
    kind = {"MEAN": "ReduceMean", "SUM": "ReduceSum", "REDUCE_MAX": "ReduceMax"}[op.code]
    name, layout = ctx.value(op.inputs[0])
    kept = [a for a in range(4) if a not in axes] if rank == 4 else []
    if layout == "nchw" and (keep or [a for a in NHWC_TO_NCHW if a in kept] == kept):
        axes, layout = [NHWC_TO_NCHW.index(a) for a in axes], "nchw" if keep else "nhwc"
    else:
        name, layout = ctx.nhwc(op.inputs[0]), "nhwc"
    ctx.define(op.outputs[0], ctx.builder.reduce(kind, name, axes, keepdims=keep), layout)


@converts("PAD", "PADV2")
def pad(ctx: ImportContext, op: FlatOperator) -> None:
    paddings = ctx.constant_value(op, 1, "the paddings").astype(np.int64)
    b = ctx.builder
    value = ctx.nhwc(op.inputs[2]) if op.code == "PADV2" and len(op.inputs) > 2 else None
    name, layout = ctx.value(op.inputs[0])
    if layout == "nchw":
        paddings = paddings[list(NHWC_TO_NCHW)]
    b.node("Pad", [name, b.ints(paddings[:, 0].tolist() + paddings[:, 1].tolist()), value],
           [ctx.output(op, 0, layout)], mode="constant")


@converts("BATCH_MATMUL")
def batch_matmul(ctx: ImportContext, op: FlatOperator) -> None:
    b = ctx.builder
    operands = []
    o = op.options  # circle names the same two fields AdjointLhs / AdjointRhs
    adjoints = (o.AdjX(), o.AdjY()) if hasattr(o, "AdjX") else (o.AdjointLhs(), o.AdjointRhs())
    for i, adjoint in zip(op.inputs, adjoints):
        x = ctx.nhwc(i)
        if adjoint:
            rank = ctx.rank(i)
            x = b.op.Transpose(x, perm=list(range(rank - 2)) + [rank - 1, rank - 2])
        operands.append(x)
    b.node("MatMul", operands, [ctx.output(op)])


@converts("TRANSPOSE")
def transpose(ctx: ImportContext, op: FlatOperator) -> None:
    perm = [int(p) for p in ctx.constant_value(op, 1, "the permutation")]
    ctx.builder.node("Transpose", [ctx.nhwc(op.inputs[0])], [ctx.output(op)], perm=perm)


@converts("DEQUANTIZE")
def dequantize(ctx: ImportContext, op: FlatOperator) -> None:
    """Only of a float16 weight (LiteRT's float16 quantization): its output is the float32 initializer itself."""
    t = ctx.tensor(op.inputs[0])
    if not (t.is_weight and t.type_code == 1):
        raise ctx.fail(op, f"only float16 constants can be dequantized, {t.name!r} is not one (quantized models "
                           f"cannot be imported for training)")
    ctx.define(op.outputs[0], ctx.nhwc(op.inputs[0]))


@converts("SHAPE")
def shape(ctx: ImportContext, op: FlatOperator) -> None:
    b = ctx.builder
    name, layout = ctx.value(op.inputs[0])
    dims = b.op.Shape(name)
    if layout == "nchw":
        dims = b.op.Gather(dims, b.ints(list(NHWC_TO_NCHW.index(a) for a in range(4))), axis=0)
    out_type = op.options.OutType() if op.options is not None else 2
    b.node("Cast", [dims], [ctx.output(op)], to=7 if out_type == 4 else 6)


@converts("STRIDED_SLICE")
def strided_slice(ctx: ImportContext, op: FlatOperator) -> None:
    o = op.options
    if o.EllipsisMask() or o.NewAxisMask() or o.Offset():
        raise ctx.fail(op, "ellipsis_mask, new_axis_mask and offset are not supported")
    begin, end = ctx.constant_value(op, 1, "begin").tolist(), ctx.constant_value(op, 2, "end").tolist()
    strides = ctx.constant_value(op, 3, "strides").tolist()
    starts, ends, shrink = [], [], []
    for axis, (s, e, step) in enumerate(zip(begin, end, strides)):
        if o.BeginMask() >> axis & 1:
            s = 0 if step > 0 else _INT64_MAX
        if o.EndMask() >> axis & 1:
            e = _INT64_MAX if step > 0 else -_INT64_MAX
        if o.ShrinkAxisMask() >> axis & 1:
            e, step = (s + 1 if s != -1 else _INT64_MAX), 1
            shrink.append(axis)
        starts.append(s)
        ends.append(e)
    b = ctx.builder
    inputs = [ctx.nhwc(op.inputs[0]), b.ints(starts), b.ints(ends), b.ints(range(len(starts))), b.ints(strides)]
    if shrink:
        b.node("Squeeze", [b.node("Slice", inputs), b.ints(shrink)], [ctx.output(op)])
    else:
        b.node("Slice", inputs, [ctx.output(op)])


@converts("PACK")
def pack(ctx: ImportContext, op: FlatOperator) -> None:
    axis = op.options.Axis() % (ctx.rank(op.inputs[0]) + 1)
    b = ctx.builder
    parts = [b.unsqueeze(ctx.nhwc(i), [axis]) for i in op.inputs]
    b.node("Concat", parts, [ctx.output(op)], axis=axis)


@converts("SQUEEZE")
def squeeze(ctx: ImportContext, op: FlatOperator) -> None:
    dims = [int(d) % ctx.rank(op.inputs[0]) for d in op.options.SqueezeDimsAsNumpy()] \
        if op.options is not None and op.options.SqueezeDimsLength() else \
        [a for a, d in enumerate(ctx.tensor(op.inputs[0]).signature) if d == 1]
    ctx.builder.node("Squeeze", [ctx.nhwc(op.inputs[0]), ctx.builder.ints(dims)], [ctx.output(op)])


