"""A model whose nodes call functions it defines (a custom domain, as exporters write layers as functions):
refused with the fix, and trained once inlined."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.inliner
import pytest
from onnx import TensorProto
from onnx import helper as h

from onnxtrain.artifacts import LossType
from tests.foreign.harness import Trained


def test_model_local_functions_are_named_with_the_inliner(tmp_path):
    """A node calling a function the model defines (a custom domain) is outside the default domain: the error says
    to inline it."""
    fn = h.make_function("my.layers", "Scale", ["x"], ["y"], [h.make_node("Mul", ["x", "x"], ["y"])],
                         [h.make_opsetid("", 17)])
    nodes = [h.make_node("MatMul", ["x", "w"], ["m"]), h.make_node("Scale", ["m"], ["y"], "scale", domain="my.layers")]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])],
                         [onnx.numpy_helper.from_array(np.ones((3, 2), np.float32), "w")])
    model = h.make_model(graph, functions=[fn], opset_imports=[h.make_opsetid("", 17), h.make_opsetid("my.layers", 1)])
    with pytest.raises(ValueError, match=r"'scale' calls my\.layers::Scale, a function .*inline_local_functions"):
        Trained(model, tmp_path, LossType.MSELoss)
    run = Trained(onnx.inliner.inline_local_functions(model), tmp_path / "inlined", LossType.MSELoss)
    assert run.trainable == ["w"]
