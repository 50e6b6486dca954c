"""Which initializers train by default (requires_grad=None)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnxtrain.artifacts.params import plan_parameters


def _rope_like() -> onnx.GraphProto:
    """y = (x W) * cos(positions * inv_freq): a weight, and a rotary embedding's frequency buffer."""
    inits = [numpy_helper.from_array(np.ones((4, 4), np.float32), "layer.weight"),
             numpy_helper.from_array(np.full(4, 0.5, np.float32), "model.rotary_emb.inv_freq"),
             numpy_helper.from_array(np.arange(4, dtype=np.float32), "positions")]
    nodes = [helper.make_node("MatMul", ["x", "layer.weight"], ["h"]),
             helper.make_node("Mul", ["positions", "model.rotary_emb.inv_freq"], ["angles"]),
             helper.make_node("Cos", ["angles"], ["c"]),
             helper.make_node("Mul", ["h", "c"], ["y"])]
    return helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [2, 4])],
                             [helper.make_tensor_value_info("y", 1, [2, 4])], initializer=inits)


def test_rotary_inverse_frequencies_are_not_trained_by_default():
    graph = _rope_like()
    weights = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    plan = plan_parameters(graph, weights, None, None)
    assert "layer.weight" in plan.trainable and "positions" in plan.trainable
    assert "model.rotary_emb.inv_freq" not in plan.trainable


def test_a_known_buffer_trains_when_asked_for():
    graph = _rope_like()
    weights = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    plan = plan_parameters(graph, weights, ["*inv_freq"], None)
    assert plan.trainable == ["model.rotary_emb.inv_freq"]
