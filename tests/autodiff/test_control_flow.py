"""If: gradients through both branches, w.r.t. the outer values the branches read (implicit inputs);
Scan and Loop: a reverse Scan over the saved states, for lengths known only at run time."""

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


def scan_model(elem=T.DOUBLE, reverse: int = 0, axis: int = 0) -> onnx.ModelProto:
    """s_{t+1} = tanh(s_t * w + x_t), y_t = s_{t+1} * x_t over a sequence of run-time length; w is captured from
    the outer graph; x is scanned along ``axis`` in direction ``reverse``, y stacked along ``axis`` too."""
    body = helper.make_graph([helper.make_node("Mul", ["s_in", "w"], ["sw"]),
                              helper.make_node("Add", ["sw", "x_t"], ["a"]),
                              helper.make_node("Tanh", ["a"], ["s_out"]),
                              helper.make_node("Mul", ["s_out", "x_t"], ["y_t"])],
                             "body", [_vi("s_in", elem, (2, 3)), _vi("x_t", elem, (2, 3))],
                             [_vi("s_out", elem, (2, 3)), _vi("y_t", elem, (2, 3))])
    node = helper.make_node("Scan", ["s0", "x"], ["s", "y"], body=body, num_scan_inputs=1,
                            scan_input_directions=[reverse], scan_input_axes=[axis], scan_output_axes=[axis],
                            scan_output_directions=[reverse])
    seq = ["T", 2, 3]
    seq.insert(axis, seq.pop(0))
    graph = helper.make_graph([node], "scan", [_vi("s0", elem, (2, 3)), _vi("x", elem, seq), _vi("w", elem, (3,))],
                              [_vi("s", elem, (2, 3)), _vi("y", elem, seq)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    return model


def loop_model(elem=T.DOUBLE) -> onnx.ModelProto:
    """At most n iterations of s <- s * w + sin(s) (w captured), stopping once sum(s) > limit; each iteration
    also emits s * i. The trip count and the stopping point are known only at run time."""
    body = helper.make_graph(
        [helper.make_node("Mul", ["s_in", "w"], ["sw"]), helper.make_node("Sin", ["s_in"], ["sin"]),
         helper.make_node("Add", ["sw", "sin"], ["s_out"]),
         helper.make_node("ReduceSum", ["s_out"], ["total"], keepdims=0),
         helper.make_node("Less", ["total", "limit"], ["cond_out"]),
         helper.make_node("Cast", ["i"], ["i_f"], to=elem), helper.make_node("Mul", ["s_out", "i_f"], ["scan_out"])],
        "body", [_vi("i", T.INT64, ()), _vi("cond_in", T.BOOL, ()), _vi("s_in", elem, (3,))],
        [_vi("cond_out", T.BOOL, ()), _vi("s_out", elem, (3,)), _vi("scan_out", elem, (3,))])
    node = helper.make_node("Loop", ["n", "go", "s0"], ["s", "ys"], body=body)
    graph = helper.make_graph([node], "loop", [_vi("n", T.INT64, ()), _vi("limit", elem, ()), _vi("s0", elem),
                                               _vi("w", elem)], [_vi("s", elem), _vi("ys", elem, ("T", 3))],
                              initializer=[onnx.numpy_helper.from_array(np.array(True), "go")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    return model


@pytest.mark.parametrize("length", [1, 4])
@pytest.mark.parametrize(("reverse", "axis"), [(0, 0), (1, 0), (0, 1), (1, 2)])
def test_scan_gradient(length, reverse, axis):
    """One gradient graph for every sequence length; the scanned input and the stacked output in any direction
    and along any axis; gradients w.r.t. the initial state, the scanned input and the captured weight.
    onnx.reference runs Scan only along axis 0 forwards: the other layouts are checked on onnxruntime."""
    shape = [length, 2, 3]
    shape.insert(axis, shape.pop(0))
    feeds = {"s0": rng.standard_normal((2, 3)), "x": rng.standard_normal(shape), "w": rng.standard_normal(3)}
    backend = "reference" if (reverse, axis) == (0, 0) else "ort"
    report = check_gradients(scan_model(reverse=reverse, axis=axis), feeds, ["s0", "x", "w"], backend=backend)
    assert report.ok, report


@pytest.mark.parametrize(("n", "limit"), [(0, 100.0), (1, 100.0), (5, 100.0), (5, 5.0)])  # the last stops after 3
def test_loop_gradient(n, limit):
    """A run-time trip count (zero iterations included) and an early stop: the backward runs as many steps
    as the forward did. (onnx.reference cannot run a Loop of zero iterations: that case runs on onnxruntime.)"""
    feeds = {"n": np.array(n), "limit": np.array(limit), "s0": np.array([0.5, 0.3, 0.2]),
             "w": np.array([1.1, 0.9, 1.2])}
    report = check_gradients(loop_model(), feeds, ["s0", "w"], backend="ort" if n == 0 else "reference")
    assert report.ok, report


@pytest.mark.parametrize("op", ["Scan", "Loop"])
def test_loop_gradients_run_on_onnxruntime(op):
    """The float32 gradient graphs pass the full ONNX check, run on stock onnxruntime and agree with
    onnx.reference at two lengths."""
    for length in (0, 2, 5) if op == "Loop" else (2, 5):
        if op == "Scan":
            model = scan_model(T.FLOAT)
            feeds = {"s0": rng.standard_normal((2, 3)), "x": rng.standard_normal((length, 2, 3)),
                     "w": rng.standard_normal(3)}
            weights = {"s": np.ones((2, 3)), "y": rng.standard_normal((length, 2, 3))}
        else:
            model = loop_model(T.FLOAT)
            feeds = {"n": np.array(length), "limit": np.array(100.0), "s0": rng.standard_normal(3),
                     "w": rng.standard_normal(3)}
            weights = {"s": np.ones(3), "ys": rng.standard_normal((length, 3))}
        feeds32 = {k: v.astype(np.float32) if v.dtype == np.float64 else v for k, v in feeds.items()}
        weights32 = {k: v.astype(np.float32) for k, v in weights.items()}
        grad = gradient_model(model, [k for k in feeds if k not in ("n", "limit")], weights32)
        onnx.checker.check_model(grad, full_check=True)
        on_ort = run_model(grad, feeds32, backend="ort")
        if length == 0:                           # onnx.reference cannot run the forward; nothing flows back
            np.testing.assert_array_equal(on_ort[1], weights32["s"])
            continue
        on_ref = run_model(grad, feeds32)
        for a, b in zip(on_ort, on_ref):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_scan_with_an_integer_state_and_a_nested_if():
    """An int64 step counter among the states (no gradient, but saved and fed back to the recomputed step) and
    an If inside the body that picks sin or cos by the counter's parity."""
    parity = [helper.make_node("Mod", ["k_in", "two"], ["odd_i"]),
              helper.make_node("Cast", ["odd_i"], ["odd"], to=T.BOOL)]
    branch = helper.make_node("If", ["odd"], ["f"],
                              then_branch=helper.make_graph([helper.make_node("Sin", ["x_t"], ["f_then"])], "then", [],
                                                            [_vi("f_then", shape=None)]),
                              else_branch=helper.make_graph([helper.make_node("Cos", ["x_t"], ["f_else"])], "else", [],
                                                            [_vi("f_else", shape=None)]))
    body = helper.make_graph(
        [*parity, branch, helper.make_node("Mul", ["s_in", "w"], ["sw"]),
         helper.make_node("Add", ["sw", "f"], ["s_out"]),
         helper.make_node("Add", ["k_in", "one"], ["k_out"]), helper.make_node("Identity", ["s_out"], ["y_t"])],
        "body", [_vi("k_in", T.INT64, ()), _vi("s_in", shape=(3,)), _vi("x_t", shape=(3,))],
        [_vi("k_out", T.INT64, ()), _vi("s_out", shape=(3,)), _vi("y_t", shape=(3,))])
    node = helper.make_node("Scan", ["k0", "s0", "x"], ["k", "s", "y"], body=body, num_scan_inputs=1)
    consts = [onnx.numpy_helper.from_array(np.array(v, dtype=np.int64), n)
              for n, v in (("k0", 0), ("two", 2), ("one", 1))]
    graph = helper.make_graph([node], "scan_int", [_vi("s0"), _vi("x", shape=(4, 3)), _vi("w")],
                              [_vi("s"), _vi("y", shape=(4, 3))], initializer=consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    feeds = {"s0": rng.standard_normal(3), "x": rng.standard_normal((4, 3)), "w": rng.standard_normal(3)}
    report = check_gradients(model, feeds, ["s0", "x", "w"])
    assert report.ok, report
    grads = gradient_model(model, ["s0", "x", "w"], {"s": np.ones(3), "y": np.ones((4, 3))})
    for a, b in zip(run_model(grads, feeds, backend="ort"), run_model(grads, feeds)):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


def test_scan8_is_refused_with_a_fix():
    body = helper.make_graph([helper.make_node("Add", ["s_in", "x_t"], ["s_out"])], "body",
                             [_vi("s_in", shape=(1, 2)), _vi("x_t", shape=(1, 2))], [_vi("s_out", shape=(1, 2))])
    node = helper.make_node("Scan", ["", "s0", "x"], ["s"], body=body, num_scan_inputs=1)
    graph = helper.make_graph([node], "scan8", [_vi("s0", shape=(1, 2)), _vi("x", shape=(1, 3, 2))],
                              [_vi("s", shape=(1, 2))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 8)])
    model.ir_version = 4
    with pytest.raises(UnsupportedOpError, match=r"Scan node .*opset 10 or later.*help: convert"):
        gradient_model(model, ["s0"], {"s": np.ones((1, 2))})


def rnn_scan_model() -> onnx.ModelProto:
    """s_{t+1} = tanh(s_t W + b + x_t) with a captured matrix W and bias b: their per-step gradients are s_t^T dA
    and the rows of dA summed, which the backward sums after the loop over the stacked steps."""
    body = helper.make_graph([helper.make_node("MatMul", ["s_in", "W"], ["sw"]),
                              helper.make_node("Add", ["sw", "b"], ["swb"]),
                              helper.make_node("Add", ["swb", "x_t"], ["a"]),
                              helper.make_node("Tanh", ["a"], ["s_out"]),
                              helper.make_node("Identity", ["s_out"], ["y_t"])],
                             "body", [_vi("s_in", T.DOUBLE, (2, 3)), _vi("x_t", T.DOUBLE, (2, 3))],
                             [_vi("s_out", T.DOUBLE, (2, 3)), _vi("y_t", T.DOUBLE, (2, 3))])
    node = helper.make_node("Scan", ["s0", "x"], ["s", "y"], body=body, num_scan_inputs=1)
    graph = helper.make_graph([node], "rnn", [_vi("s0", T.DOUBLE, (2, 3)), _vi("x", T.DOUBLE, ("T", 2, 3)),
                                              _vi("W", T.DOUBLE, (3, 3)), _vi("b", T.DOUBLE, (3,))],
                              [_vi("s", T.DOUBLE, (2, 3)), _vi("y", T.DOUBLE, ("T", 2, 3))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    return model


@pytest.mark.parametrize("length", [1, 4])
def test_captured_weight_gradients_are_summed_after_the_loop(length):
    """Also: the backward step reads the forward's activations (stacked by the forward loop), not recomputing them."""
    feeds = {"s0": rng.standard_normal((2, 3)), "x": rng.standard_normal((length, 2, 3)),
             "W": rng.standard_normal((3, 3)) * 0.5, "b": rng.standard_normal(3)}
    report = check_gradients(rnn_scan_model(), feeds, ["s0", "x", "W", "b"])
    assert report.ok, report
    grad = gradient_model(rnn_scan_model(), ["s0", "x", "W", "b"],
                          {"s": np.ones((2, 3)), "y": rng.standard_normal((length, 2, 3))})
    backward = [n for n in grad.graph.node if n.op_type == "Scan"][-1]
    body = next(a.g for a in backward.attribute if a.name == "body")
    states = len(backward.input) - next(a.i for a in backward.attribute if a.name == "num_scan_inputs")
    assert states == 1  # the state's gradient only: W's and b's are not accumulated step by step
    # ds = dA W^T only: the step's tanh is stacked by the forward loop, so its product s W is not recomputed
    assert [n.op_type for n in body.node].count("MatMul") == 1
    assert "Tanh" not in [n.op_type for n in body.node]
