"""The pass contract (ir/pass_infra.py): a modified result is checked (ONNX checker, default domain only), and
every failure is a PassError that names the pass."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from onnxtrain.errors import PassError
from onnxtrain.ir.pass_infra import Pass, PassResult


def _model(*nodes, domains=("",)):
    vi = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [2])  # noqa: E731
    graph = helper.make_graph(list(nodes) or [helper.make_node("Relu", ["x"], ["y"])], "g", [vi("x")], [vi("y")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(d, 17 if d == "" else 1) for d in domains])


class Replace(Pass):
    """Returns a given model as the rewritten one."""

    def __init__(self, result, modified=True):
        self.result, self.modified = result, modified

    def call(self, model):
        return PassResult(self.result, self.modified)


def test_a_valid_rewrite_passes():
    result = Replace(_model(helper.make_node("Abs", ["x"], ["y"])))(_model())
    assert result.modified and result.model.graph.node[0].op_type == "Abs"


def test_another_domain_breaks_the_postcondition():
    custom = _model(helper.make_node("Gelu", ["x"], ["y"], domain="com.microsoft"), domains=("", "com.microsoft"))
    with pytest.raises(PassError, match=r"Replace pass produced a model with the domains \['com.microsoft'\]"):
        Replace(custom)(_model())


def test_an_invalid_model_breaks_the_postcondition():
    dangling = _model(helper.make_node("Relu", ["nowhere"], ["y"]))
    with pytest.raises(PassError, match="Replace pass produced an invalid model"):
        Replace(dangling)(_model())


def test_an_unmodified_result_is_not_checked():
    dangling = _model(helper.make_node("Relu", ["nowhere"], ["y"]))
    assert Replace(dangling, modified=False)(_model()).model is dangling


def test_a_failure_inside_a_pass_names_it():
    class Broken(Pass):
        def call(self, model):
            raise KeyError("x")

    with pytest.raises(PassError, match="the Broken pass failed: KeyError"):
        Broken()(onnx.ModelProto())
