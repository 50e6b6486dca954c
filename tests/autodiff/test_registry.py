"""The registry owns lookup (rule, then the function-body fallback); the engine checks each rule's result."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

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
