"""Models as the ONNX Model Zoo has them (opsets 6-7, IR version 3): BatchNormalization with ``spatial``,
Upsample with a ``scales`` attribute, Slice and Pad with attributes, Dropout with a ``ratio`` attribute, Gemm
with ``broadcast``, and every initializer also listed as a graph input. generate_artifacts converts them to
opset 17; gradients by finite differences, training at two batch sizes, and the exported model against the
original on onnxruntime.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto
from onnx import helper as h
from onnx import numpy_helper as nh
from onnx.reference import ReferenceEvaluator

from onnxtrain.artifacts import LossType
from tests.foreign.harness import Trained, finite_difference_errors


def _model(nodes, inits, in_shape, out_shape, opset: int) -> onnx.ModelProto:
    """IR version 3: initializers are graph inputs too, as exporters of that time wrote them."""
    inputs = [h.make_tensor_value_info("x", TensorProto.FLOAT, in_shape)]
    inputs += [h.make_tensor_value_info(i.name, i.data_type, i.dims) for i in inits]
    graph = h.make_graph(nodes, "old", inputs, [h.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])
    model.ir_version = 3
    onnx.checker.check_model(model)
    return model


def cnn_opset7() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = lambda name, shape, scale=0.3: nh.from_array((scale * rng.standard_normal(shape)).astype(np.float32), name)  # noqa: E731
    nodes = [
        h.make_node("Conv", ["x", "conv.w", "conv.b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        h.make_node("BatchNormalization", ["c", "bn.scale", "bn.bias", "bn.mean", "bn.var"], ["b"], spatial=1),
        h.make_node("Relu", ["b"], ["r"]),
        h.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        h.make_node("Upsample", ["p"], ["u"], scales=[1.0, 1.0, 2.0, 2.0], mode="nearest"),
        h.make_node("Slice", ["u"], ["s"], starts=[1, 1], ends=[7, 7], axes=[2, 3]),
        h.make_node("Pad", ["s"], ["q"], pads=[0, 0, 1, 0, 0, 0, 0, 1], mode="constant", value=0.5),
        h.make_node("Dropout", ["q"], ["d"], ratio=0.3),
        h.make_node("Flatten", ["d"], ["f"], axis=1),
        h.make_node("Gemm", ["f", "fc.w", "fc.b"], ["y"], transB=1),
    ]
    inits = [w("conv.w", (4, 2, 3, 3)), w("conv.b", (4,)),
             nh.from_array((1 + 0.2 * rng.random(4)).astype(np.float32), "bn.scale"), w("bn.bias", (4,)),
             w("bn.mean", (4,), 0.1), nh.from_array((0.5 + rng.random(4)).astype(np.float32), "bn.var"),
             w("fc.w", (3, 4 * 7 * 7), 0.1), w("fc.b", (3,))]
    return _model(nodes, inits, ["N", 2, 8, 8], ["N", 3], 7)


def mlp_opset6() -> onnx.ModelProto:
    """Gemm-6 with ``broadcast=1`` (its bias broadcast was explicit before opset 7)."""
    rng = np.random.default_rng(1)
    w = lambda name, shape: nh.from_array((0.4 * rng.standard_normal(shape)).astype(np.float32), name)  # noqa: E731
    nodes = [h.make_node("Gemm", ["x", "fc1.w", "fc1.b"], ["a"], transB=1, broadcast=1),
             h.make_node("Tanh", ["a"], ["t"]),
             h.make_node("Gemm", ["t", "fc2.w", "fc2.b"], ["y"], broadcast=1, alpha=0.5)]
    return _model(nodes, [w("fc1.w", (6, 5)), w("fc1.b", (6,)), w("fc2.w", (6, 4)), w("fc2.b", (4,))],
                  ["N", 5], ["N", 4], 6)


MODELS = {"cnn_opset7": (cnn_opset7, (2, 8, 8), 3), "mlp_opset6": (mlp_opset6, (5,), 4)}


@pytest.mark.parametrize("name", list(MODELS))
def test_old_opset_model_converts_trains_and_exports(tmp_path, name):
    build, shape, classes = MODELS[name]
    source = build()
    run = Trained(source, tmp_path, LossType.CrossEntropyLoss)
    assert onnx.load(run.paths["training"]).opset_import[0].version == 17
    if name == "cnn_opset7":  # inference-mode BatchNorm: statistics stay constants, scale and bias train
        assert {"conv.w", "bn.scale", "bn.bias"} <= set(run.trainable) and "bn.mean" not in run.trainable
    rng = np.random.default_rng(2)
    x = rng.standard_normal((5, *shape)).astype(np.float32)
    y = rng.integers(0, classes, 5)

    errors = finite_difference_errors(run, [x, y], per_parameter=4)
    assert len(errors) == len(run.trainable) and max(errors.values()) <= 1.0, errors

    exported = onnx.load(run.export())
    assert [i.name for i in exported.graph.input] == ["x"]  # the initializers listed as inputs are weights
    if source.opset_import[0].version < 7:  # onnxruntime no longer runs Gemm-6
        original = ReferenceEvaluator(source).run(None, {"x": x})[0]
    else:
        original = ort.InferenceSession(source.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, {"x": x})[0]
    session = ort.InferenceSession(exported.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, {"x": x})[0], original, rtol=1e-5, atol=1e-6)

    losses = run.train(5, x, y)
    assert losses[-1] < losses[0], losses
    run.train(1, x[:2], y[:2])  # another batch size, same artifacts
