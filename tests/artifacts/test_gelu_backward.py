import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from onnxtrain.artifacts import LossType, generate_artifacts
from onnxtrain.artifacts.passes import GeluBackward
from onnxtrain.artifacts.passes.gelu_backward import SUFFIX
from onnxtrain.artifacts.passes.recompute import forward_nodes
from onnxtrain.ir.passes import ancestors
from tests.artifacts.as_built import as_built

N, D, H = 4, 6, 10


def _mlp(dtype=np.float32, gelu_output: bool = False) -> onnx.ModelProto:
    """x @ W1 -> erf GELU as torch exports it -> @ W2 (``gelu_output``: u is a graph output too)."""
    rng = np.random.default_rng(0)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inits = [numpy_helper.from_array(rng.normal(size=(D, H)).astype(dtype), "W1"),
             numpy_helper.from_array(rng.normal(size=(H, 3)).astype(dtype), "W2"),
             numpy_helper.from_array(np.array(2 ** 0.5, dtype), "sqrt2"),
             numpy_helper.from_array(np.array(1.0, dtype), "one"),
             numpy_helper.from_array(np.array(0.5, dtype), "half")]
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"]), helper.make_node("Div", ["h", "sqrt2"], ["u"]),
             helper.make_node("Erf", ["u"], ["e"]), helper.make_node("Add", ["e", "one"], ["t"]),
             helper.make_node("Mul", ["h", "t"], ["m"]), helper.make_node("Mul", ["m", "half"], ["a"]),
             helper.make_node("MatMul", ["a", "W2"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", elem, [N, 3])]
    if gelu_output:
        outputs.append(helper.make_tensor_value_info("u", elem, [N, H]))
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", elem, [N, D])], outputs,
                              initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _training_model(tmp_path, dtype=np.float32, gelu_output: bool = False, passes: bool = False) -> onnx.ModelProto:
    """The training model as the autodiff built it, or (``passes``) as generate_artifacts writes it."""
    source = _mlp(dtype, gelu_output)
    with as_built(keep=("GeluBackward", "ShapesInForward", "RecomputeInBackward") if passes else ()):
        paths = generate_artifacts(source, requires_grad=["W1"], frozen_params=["W2"],
                                   loss=LossType.MSELoss, artifact_directory=tmp_path,
                                   additional_output_names=["u"] if gelu_output else None)
    return onnx.load(paths["training"])


def _feeds(model: onnx.ModelProto, dtype=np.float32, w1=None) -> dict:
    rng = np.random.default_rng(1)
    weights = {i.name: numpy_helper.to_array(i) for i in _mlp(dtype).graph.initializer}
    if w1 is not None:
        weights["W1"] = w1
    feeds = {"x": rng.normal(size=(N, D)).astype(dtype), "target": rng.normal(size=(N, 3)).astype(dtype),
             "lazy_reset_grad": np.array(True)}
    for i in model.graph.input:
        if i.name in weights:
            feeds[i.name] = weights[i.name]
        elif i.name not in feeds:  # the gradient accumulator
            feeds[i.name] = np.zeros([d.dim_value for d in i.type.tensor_type.shape.dim], dtype)
    return feeds


def _run(model: onnx.ModelProto, feeds: dict) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in model.graph.output]
    return dict(zip(names, session.run(None, {k: v for k, v in feeds.items()
                                              if k in {i.name for i in model.graph.input}})))


def _gradient_name(model: onnx.ModelProto) -> str:
    return next(o.name for o in model.graph.output if "W1" in o.name)


def _derivative_output(model: onnx.ModelProto) -> str:
    """The value D: the one output of the pass's derivative nodes that none of them reads."""
    nodes = [n for n in model.graph.node if SUFFIX in n.name and not n.name.endswith(SUFFIX)]
    read = {x for n in nodes for x in n.input}
    (d,) = [n.output[0] for n in nodes if n.output[0] not in read]
    return d


def test_the_backward_multiplies_by_the_derivative_and_keeps_nothing_else(tmp_path):
    model = _training_model(tmp_path)
    result = GeluBackward()(model)
    assert result.modified
    out = result.model
    forward = forward_nodes(out.graph.node, out.graph.output[0].name)
    backward = [n for k, n in enumerate(out.graph.node) if k not in forward]
    reads = {x for n in backward for x in n.input}
    assert reads & {"u", "e", "t", "m"} == set()  # no intermediate of the chain
    assert sorted(n.op_type for n in backward if "h" in n.input) == ["Reshape", "Shape"]  # h only through the view
    derivative = [n for n in backward if n.name.startswith("h/wait/Reshape" + SUFFIX)]
    assert sorted(n.op_type for n in derivative) == ["Add", "Add", "Erf", "Exp", "Mul", "Mul", "Mul", "Sub"]
    d = _derivative_output(out)
    assert sorted(n.op_type for n in backward if d in n.input) == ["Mul", "Size"]  # dx = dg * D; the wait
    feeds = _feeds(model)
    got, want = _run(out, feeds), _run(model, feeds)
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)
    # the old backward's constants went with it (onnxruntime warns about an initializer nobody reads)
    read = {x for n in out.graph.node for x in n.input}
    assert [i.name for i in out.graph.initializer if i.name not in read] == []


def test_gradient_matches_finite_differences(tmp_path):
    """Against central differences of the same MLP and mean squared error in float64 numpy (onnxruntime has no
    float64 Erf, onnx.reference computes it in float32)."""
    model = GeluBackward()(_training_model(tmp_path)).model
    feeds = _feeds(model)
    grad = _run(model, feeds)[_gradient_name(model)]
    x, target, w2 = (feeds[k].astype(np.float64) for k in ("x", "target", "W2"))
    erf = np.vectorize(math.erf)

    def loss(w1: np.ndarray) -> float:
        h = x @ w1
        return float(np.mean((h * 0.5 * (1 + erf(h / math.sqrt(2))) @ w2 - target) ** 2))

    w1, eps = feeds["W1"].astype(np.float64), 1e-6
    numeric = np.zeros_like(w1)
    for index in np.ndindex(*w1.shape):
        step = np.zeros_like(w1)
        step[index] = eps
        numeric[index] = (loss(w1 + step) - loss(w1 - step)) / (2 * eps)
    np.testing.assert_allclose(grad, numeric, rtol=1e-4, atol=1e-5 * np.abs(numeric).max())


def test_the_derivative_waits_for_the_backward_and_the_incoming_gradient_for_it(tmp_path):
    """onnxruntime orders the nodes itself: D is computed after the backward value the incoming gradient is
    computed from (not right after the forward), and that gradient after D (not beside D's temporaries)."""
    model = _training_model(tmp_path)
    forward = forward_nodes(model.graph.node, model.graph.output[0].name)
    backward = {n.output[0] for k, n in enumerate(model.graph.node) if k not in forward}
    out = GeluBackward()(model).model
    names = {o: n for n in out.graph.node for o in n.output}
    d = _derivative_output(out)
    before_d = {o for k in ancestors(out.graph.node, [d]) for o in out.graph.node[k].output}
    assert before_d & backward  # D waits for the backward
    incoming = [n for n in out.graph.node if n.op_type == "MatMul" and n.input[1] not in {"W1", "W2"}
                and any(SUFFIX not in i and d in {o for k in ancestors(out.graph.node, [i])
                                                  for o in out.graph.node[k].output} for i in n.input)]
    assert incoming, "the incoming gradient's MatMul does not wait for D"
    assert names[incoming[0].input[0]].op_type == "Reshape"
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(out.SerializeToString(), so, providers=["CPUExecutionProvider"])
    ops = [n.op_type for n in onnx.load(str(tmp_path / "optimized.onnx")).graph.node]
    assert ops.count("Size") == 2  # neither wait is folded away
    assert ops.count("Gelu") == 1 and ops.count("Erf") == 1  # the forward is still one fused Gelu; D's Erf


def test_generate_artifacts_rewrites_the_gelu_before_recomputing(tmp_path):
    model = _training_model(tmp_path, passes=True)
    assert [n for n in model.graph.node if SUFFIX in n.name]
    assert not [n for n in model.graph.node if n.name.endswith("/recomputed")]  # nothing left to recompute


@pytest.mark.parametrize("case", ["intermediate is an output", "not a GELU"])
def test_other_forms_are_left_alone(tmp_path, case):
    if case == "not a GELU":  # erf(x / sqrt 2) + 2: not the derivative this pass writes
        model = _training_model(tmp_path)
        for init in model.graph.initializer:
            if init.name == "one":
                init.CopyFrom(numpy_helper.from_array(np.array(2.0, np.float32), "one"))
    else:
        model = _training_model(tmp_path, gelu_output=True)
    result = GeluBackward()(model)
    assert not result.modified and result.model is model
