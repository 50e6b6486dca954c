"""One row per converter option: a small TFLite graph built in memory, run by LiteRT and by onnxruntime."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from onnxtrain.tflite.importer import convert
from onnxtrain.tflite.reader import read_flatbuffer
from tests.tflite import flatbuild
from tests.tflite.conftest import run_litert

pytest.importorskip("circle_schema")

RNG = np.random.default_rng(0)
SAME, VALID = 0, 1
RELU, RELU_N1_TO_1, RELU6 = 1, 2, 3


def w(*shape):
    return (RNG.normal(size=shape) * 0.5).astype(np.float32)


def conv(g, x, cout, cin, out_hw, k=3, name="c", **opts):
    """A CONV_2D whose output is an NCHW value inside the ONNX graph (what most rows build on)."""
    opts = {"padding": SAME, "strideW": 1, "strideH": 1, **opts}
    return g.op("CONV_2D", [x, g.const(f"{name}_w", w(cout, k, k, cin)), g.const(f"{name}_b", w(cout))], name,
                [1, *out_hw, cout], "Conv2DOptions", **opts)


def row_conv_same_stride_relu6(g):
    return conv(g, g.input("x", [1, 7, 7, 4]), 6, 4, (4, 4), strideW=2, strideH=2, fusedActivationFunction=RELU6)


def row_conv_same_run_time_size(g):
    """Height and width dynamic (-1 in shape_signature): SAME becomes auto_pad=SAME_UPPER."""
    x = g.input("x", [1, 5, 5, 2], dynamic=(0, 1, 2))
    return g.op("CONV_2D", [x, g.const("k", w(3, 3, 3, 2)), g.const("kb", w(3))], "y", [1, 3, 3, 3],
                "Conv2DOptions", dynamic=(0, 1, 2), padding=SAME, strideW=2, strideH=2)


def row_conv_grouped(g):
    """Input channels 4, weight input channels 2: two groups."""
    return g.op("CONV_2D", [g.input("x", [1, 5, 5, 4]), g.const("k", w(6, 3, 3, 2)), g.const("kb", w(6))], "y",
                [1, 5, 5, 6], "Conv2DOptions", padding=SAME, strideW=1, strideH=1)


def row_conv_dilated_valid(g):
    return conv(g, g.input("x", [1, 9, 8, 2]), 3, 2, (5, 4), padding=VALID, dilationWFactor=2, dilationHFactor=2,
                fusedActivationFunction=RELU)


def row_conv_dilated_same(g):
    return conv(g, g.input("x", [1, 9, 8, 2]), 3, 2, (9, 8), dilationWFactor=2, dilationHFactor=2)


def row_depthwise_multiplier_stride(g):
    x = g.input("x", [1, 8, 8, 3])
    return g.op("DEPTHWISE_CONV_2D", [x, g.const("dw_w", w(1, 3, 3, 6)), g.const("dw_b", w(6))], "y",
                [1, 4, 4, 6], "DepthwiseConv2DOptions", padding=SAME, strideW=2, strideH=2, depthMultiplier=2,
                fusedActivationFunction=RELU_N1_TO_1)


def row_average_pool_same(g):
    x = conv(g, g.input("x", [1, 7, 7, 2]), 3, 2, (7, 7))
    return g.op("AVERAGE_POOL_2D", [x], "y", [1, 4, 4, 3], "Pool2DOptions", padding=SAME, strideW=2, strideH=2,
                filterWidth=3, filterHeight=3, fusedActivationFunction=RELU)


def row_max_pool_valid(g):
    return g.op("MAX_POOL_2D", [g.input("x", [1, 7, 6, 2])], "y", [1, 3, 2, 2], "Pool2DOptions", padding=VALID,
                strideW=2, strideH=2, filterWidth=3, filterHeight=3)


def row_fully_connected_keep_num_dims(g):
    return g.op("FULLY_CONNECTED", [g.input("x", [1, 3, 5]), g.const("fc_w", w(4, 5)), None], "y", [1, 3, 4],
                "FullyConnectedOptions", keepNumDims=True)


def row_fully_connected_keep_num_dims_relu(g):  # Keras Dense(units, activation="relu") on a sequence
    return g.op("FULLY_CONNECTED", [g.input("x", [1, 3, 5]), g.const("fc_w", w(4, 5)), g.const("fc_b", w(4))], "y",
                [1, 3, 4], "FullyConnectedOptions", keepNumDims=True, fusedActivationFunction=RELU)


def row_fully_connected_on_1x1_image(g):
    x = conv(g, g.input("x", [1, 3, 3, 2]), 6, 2, (1, 1), padding=VALID)
    return g.op("FULLY_CONNECTED", [x, g.const("fc_w", w(4, 6)), g.const("fc_b", w(4))], "y", [1, 4],
                "FullyConnectedOptions", fusedActivationFunction=RELU6)


def row_softmax_beta(g):
    return g.op("SOFTMAX", [g.input("x", [1, 7])], "y", [1, 7], "SoftmaxOptions", beta=0.5)


def row_softmax_on_image(g):
    return g.op("SOFTMAX", [conv(g, g.input("x", [1, 4, 4, 2]), 5, 2, (4, 4))], "y", [1, 4, 4, 5],
                "SoftmaxOptions", beta=1.0)


def row_unary_chain_on_image(g):
    x = conv(g, g.input("x", [1, 4, 4, 2]), 3, 2, (4, 4))
    for i, code in enumerate(("RELU6", "LOGISTIC", "RELU_N1_TO_1", "TANH", "RELU")):
        x = g.op(code, [x], f"u{i}", [1, 4, 4, 3])
    return x


def row_leaky_relu(g):
    return g.op("LEAKY_RELU", [g.input("x", [1, 6])], "y", [1, 6], "LeakyReluOptions", alpha=0.1)


def row_squeeze(g):
    x = conv(g, g.input("x", [1, 3, 3, 2]), 6, 2, (1, 1), padding=VALID)
    return g.op("SQUEEZE", [x], "y", [1, 6], "SqueezeOptions", squeezeDims=[1, 2])


def row_mean_keep_dims(g):
    x = conv(g, g.input("x", [1, 4, 5, 2]), 3, 2, (4, 5))
    return g.op("MEAN", [x, g.const("axes", np.array([1, 2], np.int32))], "y", [1, 1, 1, 3], "ReducerOptions",
                keepDims=True)


def row_mean_over_height(g):
    """Keeps (N, W, C): the NCHW result would be (N, C, W), so the input goes back to NHWC first."""
    x = conv(g, g.input("x", [1, 4, 5, 2]), 3, 2, (4, 5))
    return g.op("MEAN", [x, g.const("axes", np.array([1], np.int32))], "y", [1, 5, 3], "ReducerOptions")


def row_sum_over_channels(g):
    x = conv(g, g.input("x", [1, 4, 5, 2]), 3, 2, (4, 5))
    return g.op("SUM", [x, g.const("axes", np.array([-1], np.int32))], "y", [1, 4, 5], "ReducerOptions")


def row_concat_last_axis(g):
    x = g.input("x", [1, 4, 4, 2])
    a, b = conv(g, x, 3, 2, (4, 4), name="a"), conv(g, x, 2, 2, (4, 4), name="b")
    return g.op("CONCATENATION", [a, b, x], "y", [1, 4, 4, 7], "ConcatenationOptions", axis=-1)


def test_concatenation_with_fused_activation_is_refused():
    """LiteRT's kernel ignores it; rather than guess, the import refuses it."""
    g = flatbuild.Graph()
    x = g.input("x", [1, 3])
    data = g.build([g.op("CONCATENATION", [x, x], "y", [1, 6], "ConcatenationOptions", axis=1,
                         fusedActivationFunction=RELU)])
    with pytest.raises(ValueError, match=r"^concat.tflite: operator 0 \(CONCATENATION\): a fused activation .* is "
                                         r"not supported"):
        convert(read_flatbuffer(data), "concat.tflite")   # the file is named, as in every other import error


def row_pad_image(g):
    x = conv(g, g.input("x", [1, 3, 4, 2]), 3, 2, (3, 4))
    pads = g.const("pads", np.array([[0, 0], [1, 2], [0, 3], [1, 0]], np.int32))
    return g.op("PAD", [x, pads], "y", [1, 6, 7, 4])


def row_padv2_value(g):
    pads = g.const("pads", np.array([[0, 0], [2, 1]], np.int32))
    return g.op("PADV2", [g.input("x", [1, 3]), pads, g.const("v", np.array(-1.5, np.float32))], "y", [1, 6])


def row_broadcast_operands_of_image(g):
    x = conv(g, g.input("x", [1, 3, 4, 2]), 3, 2, (3, 4))
    x = g.op("ADD", [x, g.const("bias", w(3))], "a", [1, 3, 4, 3], "AddOptions")
    x = g.op("MUL", [g.const("scale", w(4, 3)), x], "m", [1, 3, 4, 3], "MulOptions", fusedActivationFunction=RELU)
    x = g.op("SUB", [x, g.const("shift", w(1, 3, 1, 3))], "s", [1, 3, 4, 3], "SubOptions")
    return g.op("DIV", [x, g.const("two", np.array(2.0, np.float32))], "y", [1, 3, 4, 3], "DivOptions")


def row_batch_matmul_adjoint(g):
    a, b = g.input("a", [1, 4, 3]), g.input("b", [1, 4, 5])
    return g.op("BATCH_MATMUL", [a, b], "y", [1, 3, 5], "BatchMatMulOptions", adjointLhs=True)


def row_reshape_from_options(g):
    return g.op("RESHAPE", [g.input("x", [1, 2, 6])], "y", [1, 3, 4], "ReshapeOptions", newShape=[-1, 3, 4])


def row_transpose_image(g):
    x = conv(g, g.input("x", [1, 3, 4, 2]), 3, 2, (3, 4))
    return g.op("TRANSPOSE", [x, g.const("perm", np.array([0, 3, 1, 2], np.int32))], "y", [1, 3, 3, 4])


def row_strided_slice_masks(g):
    x = g.input("x", [1, 6, 5, 3])
    begin, end = g.const("begin", np.array([0, 1, 0, 2], np.int32)), g.const("end", np.array([0, 5, 0, 3], np.int32))
    return g.op("STRIDED_SLICE", [x, begin, end, g.const("strides", np.array([1, 2, 2, 1], np.int32))], "y",
                [1, 2, 3], "StridedSliceOptions", beginMask=0b0101, endMask=0b0101, shrinkAxisMask=0b1000)


ROWS = {name.removeprefix("row_"): fn for name, fn in globals().items() if name.startswith("row_")}


@pytest.mark.parametrize("row", list(ROWS))
def test_operator_matches_litert(row):
    g = flatbuild.Graph()
    data = g.build([ROWS[row](g)])
    model = convert(read_flatbuffer(data), row)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {}
    for i in model.graph.input:
        dims = [d.dim_value or 7 for d in i.type.tensor_type.shape.dim]  # batch (and dynamic sizes) 7
        feeds[i.name] = np.random.default_rng(1).normal(size=dims).astype(np.float32)
    ours = session.run(None, feeds)[0]
    ref = run_litert(data, *feeds.values())
    assert ours.shape == ref.shape
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)
