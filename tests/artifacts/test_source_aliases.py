"""Identity nodes on initializers (artifacts/source.py): torch's TorchScript exporter aliases equal-valued parameters
through them (each stays its own parameter), while the dynamo exporter writes a parameter's ``clone()`` as one (still
that one parameter)."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from onnxtrain import artifacts
from onnxtrain.api import CheckpointState, Module
from onnxtrain.artifacts.torch_names import EXPORT_KIND


def _model(recorded: bool):
    """y = x @ w + x @ identity(w), then a loss against a label; ``recorded``: w carries the dynamo exporter's
    record that it is a torch parameter."""
    w = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
    declared = helper.make_tensor_value_info("w", TensorProto.FLOAT, [3, 4])
    if recorded:
        declared.metadata_props.add(key=EXPORT_KIND, value="PARAMETER")
    graph = helper.make_graph(
        [helper.make_node("Identity", ["w"], ["clone"]),
         helper.make_node("MatMul", ["x", "w"], ["a"]),
         helper.make_node("MatMul", ["x", "clone"], ["b"]),
         helper.make_node("Add", ["a", "b"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        initializer=[numpy_helper.from_array(w, "w")], value_info=[declared])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), w


def _trained(tmp_path, recorded: bool):
    model, w = _model(recorded)
    artifacts.generate_artifacts(model, loss=artifacts.LossType.CrossEntropyLoss,
                                 optimizer=artifacts.OptimType.AdamW, artifact_directory=tmp_path)
    state = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    module = Module(tmp_path / "training_model.onnx", state)
    x = np.array([[1.0, -2.0, 0.5], [0.3, 0.1, -1.0]], np.float32)
    labels = np.array([1, 3], np.int64)
    module(x, labels)
    return state, x, labels, w


def _cross_entropy_grad_of_logits(logits, labels):
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(len(labels)), labels] -= 1
    return p / len(labels)


def test_a_parameter_the_dynamo_exporter_clones_stays_one_parameter(tmp_path):
    state, x, labels, w = _trained(tmp_path, recorded=True)
    assert [n for n, p in state.parameters if p.requires_grad] == ["w"]
    # y = 2 x @ w: dL/dw = 2 x^T dL/dy (both reads of the one parameter)
    expected = 2 * x.T @ _cross_entropy_grad_of_logits(2 * x @ w, labels)
    np.testing.assert_allclose(state.parameters["w"].grad, expected, rtol=1e-5, atol=1e-7)


def test_an_alias_of_the_torchscript_exporter_stays_a_parameter_of_its_own(tmp_path):
    state, x, labels, w = _trained(tmp_path, recorded=False)
    assert sorted(n for n, p in state.parameters if p.requires_grad) == ["clone", "w"]
    expected = x.T @ _cross_entropy_grad_of_logits(2 * x @ w, labels)
    for name in ("w", "clone"):
        np.testing.assert_allclose(state.parameters[name].grad, expected, rtol=1e-5, atol=1e-7)
