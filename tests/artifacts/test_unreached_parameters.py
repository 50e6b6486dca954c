"""A trainable parameter the loss does not depend on is named at generation (its gradient is always zero)."""

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
