"""Which weights train, stay frozen or stay constants, and the warnings that name what a user may not expect."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxtrain import artifacts


def _two_heads():
    """out = x W (read by the loss), aux = x W2 (not)."""
    weights = [numpy_helper.from_array(np.ones((4, 3), np.float32), n) for n in ("W", "W2")]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["out"]), helper.make_node("MatMul", ["x", "W2"], ["aux"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 4])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["b", 3]) for n in ("out", "aux")], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("requires_grad", [["W", "W2"], None])
def test_a_parameter_that_does_not_reach_the_loss_is_named(tmp_path, requires_grad):
    with pytest.warns(UserWarning, match=r"1 trainable parameters do not reach the loss \(e.g. \['W2'\]\)"):
        artifacts.generate_artifacts(_two_heads(), requires_grad=requires_grad, loss=artifacts.LossType.MSELoss,
                                     optimizer=artifacts.OptimType.AdamW, artifact_directory=tmp_path)


def test_no_warning_when_every_parameter_reaches_the_loss(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        artifacts.generate_artifacts(_two_heads(), requires_grad=["W"], loss=artifacts.LossType.MSELoss,
                                     optimizer=artifacts.OptimType.AdamW, artifact_directory=tmp_path)


def _scaled(scale_name: str, bias: np.ndarray):
    """out = (x W + b) * s, then (out W2 + b): s a 0-d initializer, b read as the bias of two Gemms."""
    weights = [numpy_helper.from_array(np.full((4, 4), 0.5, np.float32), "W"),
               numpy_helper.from_array(np.arange(16, dtype=np.float32).reshape(4, 4), "W2"),
               numpy_helper.from_array(bias, "b"), numpy_helper.from_array(np.array(2.0, np.float32), scale_name)]
    nodes = [helper.make_node("Gemm", ["x", "W", "b"], ["h"]), helper.make_node("Mul", ["h", scale_name], ["s"]),
             helper.make_node("Gemm", ["s", "W2", "b"], ["out"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 4])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["b", 4])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_named_scalar_left_constant_and_a_merged_bias_are_warned_about(tmp_path):
    with pytest.warns(UserWarning) as caught:
        artifacts.generate_artifacts(_scaled("temperature", np.zeros(4, np.float32)), loss=artifacts.LossType.MSELoss,
                                     optimizer=artifacts.OptimType.SGD, artifact_directory=tmp_path)
    messages = " ".join(str(w.message) for w in caught)
    assert "leaves 1 0-d initializers as constants (e.g. ['temperature'])" in messages
    assert "equal elements are each read as the scale or bias of several layers (e.g. 'b', all 0.0, by 2" in messages


def test_an_exporters_scalar_and_distinct_shared_values_are_not_warned_about(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        artifacts.generate_artifacts(_scaled("onnx::Mul_7", np.arange(4, dtype=np.float32)),
                                     loss=artifacts.LossType.MSELoss, optimizer=artifacts.OptimType.SGD,
                                     artifact_directory=tmp_path)


def test_weights_too_large_for_constants_become_frozen_parameters(tmp_path, monkeypatch, rng):
    """A model over 2 GB with one layer trained: the other weights cannot be constants of one ONNX message."""
    from onnxtrain.api import CheckpointState, Module
    from onnxtrain.artifacts import params

    model = _scaled("temperature", np.arange(4, dtype=np.float32))
    monkeypatch.setattr(params, "CONSTANTS_LIMIT", 70)   # W (64 bytes), b (16), the scale (4): over it
    monkeypatch.setattr(params, "CONSTANTS_KEPT", 20)    # W moves; b and the scale stay constants
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        artifacts.generate_artifacts(model, requires_grad=["W2"], loss=artifacts.LossType.MSELoss,
                                     optimizer=artifacts.OptimType.SGD, artifact_directory=tmp_path)
    state = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    assert [n for n, p in state.parameters.items() if p.requires_grad] == ["W2"]
    frozen = [n for n, p in state.parameters.items() if not p.requires_grad]
    assert frozen == ["W"]
    x = rng.standard_normal((2, 4)).astype(np.float32)
    module = Module(tmp_path / "training_model.onnx", state)
    expected = ((x @ np.full((4, 4), 0.5) + np.arange(4)) * 2.0) @ np.arange(16).reshape(4, 4) + np.arange(4)
    assert np.isclose(module(x, expected.astype(np.float32)), 0.0, atol=1e-3)
