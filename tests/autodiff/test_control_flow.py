"""If: gradients through both branches, w.r.t. the outer values the branches read (implicit inputs);
Loop and Scan: a clear UnsupportedOpError."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

from onnxtrain.autodiff.check import check_gradients, gradient_model, run_model
from onnxtrain.errors import UnsupportedOpError

rng = np.random.default_rng(3)


def _vi(name: str, elem=T.DOUBLE, shape=(3,)):
    return helper.make_tensor_value_info(name, elem, shape)


def if_model(elem=T.DOUBLE) -> onnx.ModelProto:
    """c ? (tanh(x * w), w) : (sin(x) + v, v * v), with x = exp(a) computed outside; z = y0 * a.

    The then branch holds a nested If on the same condition, so nested captures are covered too.
    """
    nested = helper.make_node("If", ["c"], ["t1"], then_branch=helper.make_graph(
        [helper.make_node("Mul", ["x", "w"], ["t1_then"])], "nested_then", [], [_vi("t1_then", elem, None)]),
        else_branch=helper.make_graph([helper.make_node("Add", ["x", "w"], ["t1_else"])], "nested_else", [],
                                      [_vi("t1_else", elem, None)]))
    then = helper.make_graph([nested, helper.make_node("Tanh", ["t1"], ["t_out"]),
                              helper.make_node("Identity", ["w"], ["t_out2"])],
                             "then", [], [_vi("t_out", elem, None), _vi("t_out2", elem, None)])
    other = helper.make_graph([helper.make_node("Sin", ["x"], ["e1"]), helper.make_node("Add", ["e1", "v"], ["e_out"]),
                               helper.make_node("Mul", ["v", "v"], ["e_out2"])],
                              "else", [], [_vi("e_out", elem, None), _vi("e_out2", elem, None)])
    nodes = [helper.make_node("Exp", ["a"], ["x"]),
             helper.make_node("If", ["c"], ["y0", "y1"], then_branch=then, else_branch=other),
             helper.make_node("Mul", ["y0", "a"], ["z"])]
    graph = helper.make_graph(nodes, "if", [_vi("c", T.BOOL, ()), *(_vi(n, elem) for n in "awv")],
                              [_vi("z", elem), _vi("y1", elem)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    return model


@pytest.mark.parametrize("cond", [True, False])
def test_if_gradient_through_both_branches(cond):
    """The condition is a run-time input: the same gradient graph serves both branches."""
    feeds = {"c": np.array(cond), **{k: rng.standard_normal(3) for k in "awv"}}
    report = check_gradients(if_model(), feeds, ["a", "w", "v"])
    assert report.ok, report
    unused = "v" if cond else "w"            # the branch not taken gives zeros, not an error
    assert np.all(report.analytic[unused] == 0)


@pytest.mark.parametrize("cond", [True, False])
def test_if_gradient_runs_on_onnxruntime(cond):
    feeds = {"c": np.array(cond), **{k: rng.standard_normal(3).astype(np.float32) for k in "awv"}}
    weights = {"z": np.ones(3, np.float32), "y1": np.full(3, 0.5, np.float32)}
    model = if_model(T.FLOAT)
    on_ort = run_model(gradient_model(model, ["a", "w", "v"], weights), feeds, backend="ort")
    on_ref = run_model(gradient_model(model, ["a", "w", "v"], weights), feeds)
    for a, b in zip(on_ort, on_ref):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _loop_model(op: str) -> onnx.ModelProto:
    """x -> Loop/Scan whose body multiplies the carried state by w (an outer value)."""
    if op == "Loop":
        body = helper.make_graph([helper.make_node("Identity", ["cond_in"], ["cond_out"]),
                                  helper.make_node("Mul", ["s_in", "w"], ["s_out"])], "body",
                                 [_vi("i", T.INT64, ()), _vi("cond_in", T.BOOL, ()), _vi("s_in")],
                                 [_vi("cond_out", T.BOOL, ()), _vi("s_out")])
        node = helper.make_node("Loop", ["n", "", "x"], ["y"], body=body)
        inits = [onnx.numpy_helper.from_array(np.array(3, dtype=np.int64), "n")]
    else:
        body = helper.make_graph([helper.make_node("Mul", ["s_in", "w"], ["s_out"]),
                                  helper.make_node("Identity", ["s_out"], ["scan_out"])], "body",
                                 [_vi("s_in", shape=(3,)), _vi("e", shape=(3,))], [_vi("s_out"), _vi("scan_out")])
        node = helper.make_node("Scan", ["x", "xs"], ["y", "ys"], body=body, num_scan_inputs=1)
        inits = [onnx.numpy_helper.from_array(np.ones((2, 3)), "xs")]
    outputs = [_vi("y")] if op == "Loop" else [_vi("y"), _vi("ys", shape=(2, 3))]
    graph = helper.make_graph([node], op, [_vi("x"), _vi("w")], outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    return model


@pytest.mark.parametrize("op", ["Loop", "Scan"])
def test_loop_and_scan_are_refused_with_a_fix(op):
    model = _loop_model(op)
    weights = {"y": np.ones(3), "ys": np.ones((2, 3))}
    with pytest.raises(UnsupportedOpError, match=rf"{op} node .*not supported.*help:"):
        gradient_model(model, ["w"], weights)
