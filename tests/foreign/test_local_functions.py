"""A model whose nodes call functions it defines (a custom domain, as exporters write layers as functions): the
calls are inlined before differentiation, so it trains as the inlined model does, and every artifact is
default-domain ONNX without functions."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnx.inliner
import onnxruntime
import pytest
from onnx import TensorProto
from onnx import helper as h

from onnxtrain.artifacts import LossType
from onnxtrain.artifacts.passes import InlineLocalFunctions
from tests.foreign.harness import Trained


def _scale_model() -> onnx.ModelProto:
    """y = Scale(x @ w), Scale a model-local function that calls another one (Square) and reads an attribute."""
    square = h.make_function("my.layers", "Square", ["x"], ["y"], [h.make_node("Mul", ["x", "x"], ["y"])],
                             [h.make_opsetid("", 17)])
    factor = h.make_node("Constant", [], ["f"], value_float=0.0)
    factor.attribute[0].ref_attr_name = "factor"
    factor.attribute[0].ClearField("f")
    scale = h.make_function("my.layers", "Scale", ["x"], ["y"],
                            [h.make_node("Square", ["x"], ["s"], domain="my.layers"), factor,
                             h.make_node("Mul", ["s", "f"], ["y"])],
                            [h.make_opsetid("", 17), h.make_opsetid("my.layers", 1)], attributes=["factor"])
    nodes = [h.make_node("MatMul", ["x", "w"], ["m"]),
             h.make_node("Scale", ["m"], ["y"], "scale", domain="my.layers", factor=0.5)]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])],
                         [onnx.numpy_helper.from_array(np.linspace(-1, 1, 6, dtype=np.float32).reshape(3, 2), "w")])
    return h.make_model(graph, functions=[square, scale],
                        opset_imports=[h.make_opsetid("", 17), h.make_opsetid("my.layers", 1)])


def test_the_pass_expands_nested_calls_and_drops_the_functions_domain():
    model = _scale_model()
    onnx.checker.check_model(model, full_check=True)
    result = InlineLocalFunctions()(model)
    assert result.modified and not result.model.functions
    assert {op.domain for op in result.model.opset_import} == {""}
    assert {n.domain for n in result.model.graph.node} == {""}
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    run = [onnxruntime.InferenceSession(m.SerializeToString()).run(None, {"x": x})[0] for m in (model, result.model)]
    np.testing.assert_allclose(run[1], run[0], rtol=1e-6)
    assert not InlineLocalFunctions()(result.model).modified


def test_a_model_with_local_functions_trains_as_its_inlined_form(tmp_path):
    model = _scale_model()
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    target = np.zeros((4, 2), np.float32)
    run = Trained(model, tmp_path / "functions", LossType.MSELoss)
    inlined = Trained(onnx.inliner.inline_local_functions(model), tmp_path / "inlined", LossType.MSELoss)
    assert run.trainable == ["w"]
    loss, grads = run.gradients(x, target)
    expected_loss, expected = inlined.gradients(x, target)
    assert loss == pytest.approx(expected_loss, rel=1e-6)
    np.testing.assert_allclose(grads["w"], expected["w"], rtol=1e-6)
    for kind in ("training", "eval", "optimizer"):
        artifact = onnx.load(run.paths[kind])
        assert not artifact.functions and {op.domain for op in artifact.opset_import} <= {"", "ai.onnx"}


def test_torch_export_with_modules_as_functions_matches_torch_gradients(tmp_path):
    torch = pytest.importorskip("torch")

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear, self.norm = torch.nn.Linear(8, 8), torch.nn.LayerNorm(8)

        def forward(self, x):
            return x + torch.nn.functional.gelu(self.norm(self.linear(x)))

    torch.manual_seed(0)
    net = torch.nn.Sequential(Block(), Block(), torch.nn.Linear(8, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (torch.randn(4, 8),), str(tmp_path / "model.onnx"), dynamo=False, opset_version=17,
                          export_modules_as_functions={Block}, input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
    model = onnx.load(tmp_path / "model.onnx")
    assert model.functions, "the export wrote no functions to inline"
    run = Trained(model, tmp_path / "art", LossType.CrossEntropyLoss)
    x = np.random.default_rng(1).standard_normal((5, 8)).astype(np.float32)
    labels = np.array([0, 1, 2, 0, 1], np.int64)
    loss, grads = run.gradients(x, labels)
    torch_loss = torch.nn.functional.cross_entropy(net(torch.from_numpy(x)), torch.from_numpy(labels))
    torch_loss.backward()
    assert loss == pytest.approx(torch_loss.item(), rel=1e-5)
    parameters = dict(net.named_parameters())
    assert sorted(grads) == sorted(parameters)
    for name, grad in grads.items():
        np.testing.assert_allclose(grad, parameters[name].grad.numpy(), rtol=1e-4, atol=1e-6, err_msg=name)


def test_a_function_written_for_another_opset_is_converted_to_the_models():
    """A body at opset 17 (ReduceMean's axes attribute) in an opset-18 model (axes an input): onnx's inliner leaves
    such a call in place unless asked to convert (and onnxruntime refuses the model as it is); inlined and
    converted, it computes the function's result."""
    center = h.make_function("my.layers", "Center", ["x"], ["y"],
                             [h.make_node("ReduceMean", ["x"], ["m"], axes=[1], keepdims=1),
                              h.make_node("Sub", ["x", "m"], ["y"])], [h.make_opsetid("", 17)])
    nodes = [h.make_node("MatMul", ["x", "w"], ["a"]), h.make_node("Center", ["a"], ["y"], domain="my.layers")]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])],
                         [onnx.numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(3, 2), "w")])
    model = h.make_model(graph, functions=[center],
                         opset_imports=[h.make_opsetid("", 18), h.make_opsetid("my.layers", 1)])
    result = InlineLocalFunctions()(model)
    assert {n.domain for n in result.model.graph.node} == {""} and not result.model.functions
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    got = onnxruntime.InferenceSession(result.model.SerializeToString()).run(None, {"x": x})[0]
    a = x @ np.arange(6, dtype=np.float32).reshape(3, 2)
    np.testing.assert_allclose(got, a - a.mean(axis=1, keepdims=True), rtol=1e-5, atol=1e-5)
