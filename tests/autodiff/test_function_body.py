"""The function-body fallback, zero-gradient ops, and the coverage report.

Where an op has both a rule and a spec function body, the two must agree: that checks the fallback (and the
rule once more). The fallback runs by hiding the op's rule from the engine.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper
from test_rules import ROWS, Row

from onnxtrain.autodiff import GRADIENT_RULES
from onnxtrain.autodiff.check import check_gradients, gradient_model, run_model, single_node_model
from onnxtrain.autodiff.coverage import PEER_OPS, STATUSES, coverage_table, markdown
from onnxtrain.autodiff.function_body import function_body_rule, has_function_body
from onnxtrain.errors import UnsupportedOpError

# Rows whose op has a rule and a function body the reference evaluator can run in float64.
BOTH = [r for r in ROWS if r.op in GRADIENT_RULES and has_function_body(r.op, r.opset)
        and r.op not in {"Bernoulli", "Range", "Softplus", "Celu"}    # random; a Loop; float32-only bodies
        and r.id != "ReduceL2-zero_vector"]  # the body's Sqrt has no derivative at 0; the rule takes torch's 0
STASHED = {"LayerNormalization", "GroupNormalization", "RMSNormalization"}   # bodies compute in float32


@pytest.mark.parametrize("r", BOTH, ids=[r.id for r in BOTH])
def test_function_body_agrees_with_the_rule(r: Row, monkeypatch):
    model = single_node_model(r.op, r.inputs, n_outputs=r.outputs, opset=r.opset, constant_inputs=r.consts,
                              input_order=r.order, **r.attrs)
    wrt = [k for k, v in r.inputs.items() if np.issubdtype(v.dtype, np.floating)]
    outs = run_model(model, r.inputs)
    weights = {o.name: np.random.default_rng(1).standard_normal(v.shape).astype(v.dtype)
               for o, v in zip(model.graph.output, outs) if np.issubdtype(v.dtype, np.floating)}
    by_rule = run_model(gradient_model(model, wrt, weights), r.inputs)[1:]
    monkeypatch.delitem(GRADIENT_RULES, r.op)
    by_body = run_model(gradient_model(model, wrt, weights), r.inputs)[1:]
    # Bodies hold their constants in float32 (1/6 in HardSwish, sqrt(2/pi) in Gelu): agreement to ~1e-7.
    tol = 1e-6 if r.op not in STASHED and all(v.dtype == np.float64 for v in r.inputs.values()) else 1e-4
    for name, a, b in zip(wrt, by_rule, by_body):
        np.testing.assert_allclose(b, a, rtol=tol, atol=tol * 1e-2,
                                   err_msg=f"{r.id}: d{name} through the function body")


def test_no_body_no_rule_is_an_error_naming_the_op():
    assert function_body_rule(helper.make_node("Unique", ["x"], ["y"]), 22) is None
    model = single_node_model("Unique", {"x": np.array([2.0, 1.0, 2.0])})
    with pytest.raises(UnsupportedOpError, match=r"no gradient rule for op 'Unique'.*register\('Unique'\)"):
        gradient_model(model, ["x"], {"y0": np.ones(())})


def test_zero_gradient_ops_are_not_errors():
    """w feeds Floor, Round, Sign, comparisons and ArgMax (no gradient) and a Mul (a gradient)."""
    nodes = [helper.make_node("Floor", ["w"], ["f"]), helper.make_node("Round", ["w"], ["r"]),
             helper.make_node("Sign", ["w"], ["s"]), helper.make_node("Less", ["w", "f"], ["lt"]),
             helper.make_node("ArgMax", ["w"], ["am"], keepdims=0),
             helper.make_node("Cast", ["lt"], ["ltf"], to=T.DOUBLE),
             helper.make_node("Cast", ["am"], ["amf"], to=T.DOUBLE),
             helper.make_node("Sum", ["f", "r", "s", "ltf", "amf"], ["k"]), helper.make_node("Mul", ["k", "w"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("w", T.DOUBLE, [4])],
                              [helper.make_tensor_value_info("y", T.DOUBLE, [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    w = np.array([0.3, 1.7, -2.2, 0.6])
    report = check_gradients(model, {"w": w}, ["w"])
    assert report.ok, report


def test_coverage_table():
    rows = coverage_table()
    by_op = {r.op: r for r in rows}
    assert len(rows) == len(by_op) > 180
    assert {r.status for r in rows} == set(STATUSES)
    assert sum(r.status == "rule" for r in rows) >= 110
    for op in PEER_OPS:                                  # everything the peer differentiates, we do
        assert by_op[op].status == "rule", op
    for op in "Acos Acosh Asin Asinh Atan Atanh Celu CumSum DepthToSpace SpaceToDepth Einsum Elu GlobalMaxPool "\
              "GridSample GroupNormalization HardSigmoid HardSwish InstanceNormalization LpNormalization Mish "\
              "NegativeLogLikelihoodLoss PRelu RMSNormalization RNN ReduceL1 ReduceLogSum ReduceMax ReduceMin "\
              "ReduceProd ReduceSumSquare Selu Sinh Cosh Tan Softplus Softsign Sum Mean Swish ThresholdedRelu "\
              "Shrink RotaryEmbedding If Loop Scan DFT STFT Col2Im DeformConv Det TensorScatter".split():
        assert by_op[op].status == "rule", op
    assert by_op["Attention"].status == "function body"
    assert {by_op[op].status for op in ("Floor", "Ceil", "Round", "Sign")} == {"zero gradient"}
    assert {by_op[op].status for op in ("Equal", "Less", "Shape", "ArgMax")} == {"not differentiable"}
    assert by_op["LinearAttention"].status == "function body"          # its body loops with Scan
    assert {by_op[op].status for op in ("RoiAlign", "Unique")} == {"unsupported"}


def test_docs_page_is_current():
    page = Path(__file__).resolve().parents[2] / "docs" / "ops.md"
    assert page.read_text() == markdown(), "regenerate: python -m onnxtrain.autodiff.coverage > docs/ops.md"


def test_expanded_body_is_default_domain_onnx():
    """The recomputed body and its gradient are plain default-domain ONNX that passes the checker."""
    model = single_node_model("MeanVarianceNormalization", {"x": np.ones((2, 3, 4), np.float32)}, axes=[0, 2])
    grads = gradient_model(model, ["x"], {"y0": np.ones((2, 3, 4), np.float32)})
    onnx.checker.check_model(grads)
    assert {n.domain for n in grads.graph.node} <= {""}
