"""The pass contract (ir/pass_infra.py): a modified result is checked (ONNX checker, default domain only), and
every failure is a PassError that names the pass; a PassManager checks once, at the end."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from onnxtrain.errors import PassError
from onnxtrain.ir.pass_infra import Pass, PassManager, PassResult


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


class Counting(Replace):
    """Replace, counting the full checks of its results."""

    checks = 0

    def ensures(self, model):
        type(self).checks += 1
        super().ensures(model)


def test_a_pass_manager_checks_the_final_model_once(monkeypatch):
    calls = []
    real = onnx.checker.check_model
    monkeypatch.setattr(onnx.checker, "check_model", lambda m, **kw: calls.append(m) or real(m, **kw))
    abs_, neg = _model(helper.make_node("Abs", ["x"], ["y"])), _model(helper.make_node("Neg", ["x"], ["y"]))
    result = PassManager([Replace(abs_), Replace(neg), Replace(None, modified=False)])(_model())
    assert result.modified and result.model is neg
    assert calls == [neg]


def test_a_pass_manager_names_the_first_pass_that_broke_the_model():
    dangling = _model(helper.make_node("Relu", ["nowhere"], ["y"]))
    also_dangling = _model(helper.make_node("Abs", ["nowhere"], ["y"]))

    class First(Replace):
        pass

    class Second(Replace):
        pass

    with pytest.raises(PassError, match="the First pass produced an invalid model"):
        PassManager([First(dangling), Second(also_dangling)])(_model())
    with pytest.raises(PassError, match="the Second pass produced an invalid model"):
        PassManager([First(_model()), Second(also_dangling)])(_model())


def test_a_pass_manager_checks_a_pass_with_postconditions_of_its_own_on_its_result():
    Counting.checks = 0
    PassManager([Counting(_model(helper.make_node("Abs", ["x"], ["y"]))), Replace(_model())])(_model())
    assert Counting.checks == 1


def test_a_pass_manager_with_nothing_modified_checks_nothing():
    dangling = _model(helper.make_node("Relu", ["nowhere"], ["y"]))
    result = PassManager([Replace(None, modified=False)])(dangling)
    assert not result.modified and result.model is dangling
