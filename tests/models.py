"""Tiny forward models built with onnx.helper (no torch), for fast tests."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _model(nodes, inputs, outputs, weights: dict[str, np.ndarray], opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "forward", inputs, outputs,
                              initializer=[numpy_helper.from_array(v, k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def mlp(features: int = 8, hidden: int = 16, classes: int = 4, seed: int = 0) -> onnx.ModelProto:
    """input [batch, features] -> Gemm -> Relu -> Gemm -> output [batch, classes]."""
    rng = np.random.default_rng(seed)
    weights = {
        "fc1.weight": (rng.standard_normal((hidden, features)) / np.sqrt(features)).astype(np.float32),
        "fc1.bias": np.zeros(hidden, np.float32),
        "fc2.weight": (rng.standard_normal((classes, hidden)) / np.sqrt(hidden)).astype(np.float32),
        "fc2.bias": np.zeros(classes, np.float32),
    }
    nodes = [
        helper.make_node("Gemm", ["input", "fc1.weight", "fc1.bias"], ["h"], transB=1),
        helper.make_node("Relu", ["h"], ["a"]),
        helper.make_node("Gemm", ["a", "fc2.weight", "fc2.bias"], ["output"], transB=1),
    ]
    return _model(nodes, [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", features])],
                  [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", classes])], weights)


def conv_bn(channels: int = 4, classes: int = 3, seed: int = 0, dropout: bool = False) -> onnx.ModelProto:
    """input [batch, 2, 6, 6] -> Conv -> BatchNormalization (training mode) -> Relu -> GAP -> Gemm."""
    rng = np.random.default_rng(seed)
    weights = {
        "conv.weight": (rng.standard_normal((channels, 2, 3, 3)) * 0.3).astype(np.float32),
        "bn.weight": np.ones(channels, np.float32), "bn.bias": np.zeros(channels, np.float32),
        "bn.running_mean": np.zeros(channels, np.float32), "bn.running_var": np.ones(channels, np.float32),
        "fc.weight": (rng.standard_normal((classes, channels)) * 0.5).astype(np.float32),
        "fc.bias": np.zeros(classes, np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["input", "conv.weight"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"],
                         ["b", "rm", "rv"], training_mode=1, momentum=0.9),
        helper.make_node("Relu", ["b"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
    ]
    last = "f"
    if dropout:
        weights["ratio"] = np.array(0.5, np.float32)
        weights["training"] = np.array(True)
        nodes.append(helper.make_node("Dropout", ["f", "ratio", "training"], ["d"]))
        last = "d"
    nodes.append(helper.make_node("Gemm", [last, "fc.weight", "fc.bias"], ["output"], transB=1))
    return _model(nodes, [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 2, 6, 6])],
                  [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", classes])], weights)


# position_classifier's sizes: its table has POSITIONS rows
VOCAB, POSITIONS, WIDTH, CLASSES = 20, 8, 4, 3


def position_classifier(positions: str) -> onnx.ModelProto:
    """ids [batch, sequence] -> token + position embeddings -> mean over the sequence -> Gemm. ``positions``:
    "slice" (a BERT: position ids [1, POSITIONS] sliced to the sequence length, read from the ids' shape) or
    "range" (a GPT-2: range(0, sequence) gathered, the length read from the token embeddings' shape)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=(VOCAB, WIDTH)).astype(np.float32), "tokens"),
             numpy_helper.from_array(rng.normal(size=(POSITIONS, WIDTH)).astype(np.float32), "positions"),
             numpy_helper.from_array(rng.normal(size=(CLASSES, WIDTH)).astype(np.float32), "fc"),
             numpy_helper.from_array(np.arange(POSITIONS, dtype=np.int64)[None], "position_ids"),
             numpy_helper.from_array(np.array([1], np.int64), "one"), numpy_helper.from_array(np.array([0], np.int64),
                                                                                           "zero"),
             numpy_helper.from_array(np.array(0, np.int64), "zero_scalar"),
             numpy_helper.from_array(np.array(1, np.int64), "one_scalar")]
    nodes = [helper.make_node("Gather", ["tokens", "ids"], ["t"])]
    if positions == "slice":
        nodes += [helper.make_node("Shape", ["ids"], ["shape"]), helper.make_node("Gather", ["shape", "one"], ["n"]),
                  helper.make_node("Slice", ["position_ids", "zero", "n", "one"], ["pid"]),
                  helper.make_node("Gather", ["positions", "pid"], ["p"])]
    else:
        nodes += [helper.make_node("Shape", ["t"], ["shape"]),
                  helper.make_node("Gather", ["shape", "one_scalar"], ["n"], axis=0),
                  helper.make_node("Range", ["zero_scalar", "n", "one_scalar"], ["pid"]),
                  helper.make_node("Gather", ["positions", "pid"], ["p"])]
    nodes += [helper.make_node("Add", ["t", "p"], ["e"]),
              helper.make_node("ReduceMean", ["e"], ["m"], axes=[1], keepdims=0),
              helper.make_node("Gemm", ["m", "fc"], ["logits"], transB=1)]
    graph = helper.make_graph(nodes, positions, [helper.make_tensor_value_info("ids", TensorProto.INT64,
                                                                               ["batch", "sequence"])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", CLASSES])],
                              initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
