"""The registry owns lookup (rule, then the function-body fallback); the engine checks each rule's result."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

from onnxtrain.autodiff import registry
from onnxtrain.autodiff.check import gradient_model, single_node_model
from onnxtrain.autodiff.function_body import differentiate_function_body


def test_lookup_prefers_the_rule_then_the_function_body_then_none():
    assert registry.lookup(helper.make_node("Relu", ["x"], ["y"]), 18) is registry.GRADIENT_RULES["Relu"]
    mvn = helper.make_node("MeanVarianceNormalization", ["x"], ["y"])
    assert registry.lookup(mvn, 18) is differentiate_function_body
    assert registry.lookup(helper.make_node("Unique", ["x"], ["y"]), 18) is None
    assert registry.lookup(helper.make_node("Relu", ["x"], ["y"], domain="com.example"), 18) is None


def test_a_rule_returning_more_gradients_than_inputs_is_an_error(monkeypatch):
    monkeypatch.setitem(registry.GRADIENT_RULES, "Neg", lambda ctx: [ctx.op.Neg(ctx.dy[0]), ctx.dy[0]])
    model = single_node_model("Neg", {"x": np.ones((2, 3))})
    with pytest.raises(ValueError, match=r"returned 2 gradients .* expected one per input \(1"):
        gradient_model(model, ["x"], {"y0": np.ones((2, 3))})


def test_a_parameter_reaching_an_input_without_gradient_is_warned_about(recwarn):
    """Pad's computed fill value once got no gradient without a word; a rule's None for a float input that a
    parameter reaches is now named (the op, the input, the path), while zero-gradient ops stay silent."""
    nodes = [helper.make_node("Sigmoid", ["p"], ["s"]),
             helper.make_node("Mul", ["s", "zero"], ["ratio"]),             # a Dropout ratio computed from p
             helper.make_node("Reshape", ["ratio", "scalar_shape"], ["ratio_scalar"]),
             helper.make_node("Mul", ["x", "p"], ["xp"]),
             helper.make_node("Dropout", ["xp", "ratio_scalar"], ["y0"], name="drop")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", 11, [2, 3]), helper.make_tensor_value_info("p", 11, [1])],
        [helper.make_tensor_value_info("y0", 11, [2, 3])],
        initializer=[numpy_helper.from_array(np.zeros(1), "zero"),
                     numpy_helper.from_array(np.zeros(0, np.int64), "scalar_shape")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    gradient_model(model, ["p"], {"y0": np.ones((2, 3))})
    messages = [str(w.message) for w in recwarn if "no gradient through input" in str(w.message)]
    assert len(messages) == 1 and "input 1 ('ratio_scalar') of Dropout node 'drop'" in messages[0], messages
    assert "path p -> " in messages[0], messages[0]
    recwarn.clear()
    floor = single_node_model("Floor", {"x": np.ones((2, 3))})
    gradient_model(floor, ["x"], {"y0": np.ones((2, 3))})  # a zero-gradient op: silent
    assert not [w for w in recwarn if "no gradient through input" in str(w.message)]
