"""The demo's CNN, written directly with ``onnx.helper`` (no torch needed anywhere in the demo).

    image [N, 1, 8, 8]
      -> Conv 3x3 (16) -> Relu -> MaxPool 2      [N, 16, 4, 4]
      -> Conv 3x3 (32) -> Relu -> MaxPool 2      [N, 32, 2, 2]
      -> Flatten -> Gemm (64) -> Relu            [N, 64]       "fc1"
      -> Gemm (10)                               [N, 10]       "fc2" -> logits

Weights are He-initialized from a seeded generator, so the demo is reproducible.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["build_cnn", "INPUT", "OUTPUT"]

INPUT, OUTPUT = "image", "logits"


def build_cnn(seed: int = 0, classes: int = 10, opset: int = 17) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)

    def he(shape: tuple[int, ...], fan_in: int) -> np.ndarray:
        return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)

    weights = {
        "conv1.weight": he((16, 1, 3, 3), 9), "conv1.bias": np.zeros(16, np.float32),
        "conv2.weight": he((32, 16, 3, 3), 16 * 9), "conv2.bias": np.zeros(32, np.float32),
        "fc1.weight": he((64, 128), 128), "fc1.bias": np.zeros(64, np.float32),
        "fc2.weight": he((classes, 64), 64), "fc2.bias": np.zeros(classes, np.float32),
    }
    pool = {"kernel_shape": [2, 2], "strides": [2, 2]}
    node = helper.make_node
    nodes = [
        node("Conv", [INPUT, "conv1.weight", "conv1.bias"], ["conv1"], name="conv1", pads=[1, 1, 1, 1]),
        node("Relu", ["conv1"], ["relu1"], name="relu1"),
        node("MaxPool", ["relu1"], ["pool1"], name="pool1", **pool),
        node("Conv", ["pool1", "conv2.weight", "conv2.bias"], ["conv2"], name="conv2", pads=[1, 1, 1, 1]),
        node("Relu", ["conv2"], ["relu2"], name="relu2"),
        node("MaxPool", ["relu2"], ["pool2"], name="pool2", **pool),
        node("Flatten", ["pool2"], ["flat"], name="flatten"),
        node("Gemm", ["flat", "fc1.weight", "fc1.bias"], ["fc1"], name="fc1", transB=1),
        node("Relu", ["fc1"], ["relu3"], name="relu3"),
        node("Gemm", ["relu3", "fc2.weight", "fc2.bias"], [OUTPUT], name="fc2", transB=1),
    ]
    graph = helper.make_graph(
        nodes, "digits_cnn",
        [helper.make_tensor_value_info(INPUT, TensorProto.FLOAT, ["batch", 1, 8, 8])],
        [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["batch", classes])],
        initializer=[numpy_helper.from_array(v, k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="onnxtrain.demo")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model
