"""The peer's conventions in the training API: pair iteration, nominal states, string inputs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from onnxtrain.api import CheckpointState, Module, Optimizer
from onnxtrain.artifacts import LossType, OptimType, generate_artifacts
from tests import models


@pytest.fixture
def arts(tmp_path):
    generate_artifacts(models.mlp(), requires_grad=["fc2.*"], frozen_params=["fc1.*"], loss=LossType.CrossEntropyLoss,
                       optimizer=OptimType.AdamW, artifact_directory=tmp_path, nominal_checkpoint=True)
    return tmp_path


def test_parameters_and_properties_iterate_in_pairs(arts):
    state = CheckpointState.load_checkpoint(arts / "checkpoint")
    pairs = [(name, param.name, param.requires_grad) for name, param in state.parameters]
    assert pairs == [("fc2.weight", "fc2.weight", True), ("fc2.bias", "fc2.bias", True),
                     ("fc1.weight", "fc1.weight", False), ("fc1.bias", "fc1.bias", False)]
    assert "fc1.bias" in state.parameters and "nope" not in state.parameters and len(state.parameters) == 4
    assert state.parameters.keys() == [p[0] for p in pairs]
    state.properties["epoch"] = 3
    state.properties["note"] = "x"
    assert list(state.properties) == [("epoch", 3), ("note", "x")]
    assert "epoch" in state.properties and len(state.properties) == 2 and state.properties.keys() == ["epoch", "note"]


def test_a_nominal_state_refuses_use_until_its_parameters_are_loaded(arts, rng):
    full = Module(arts / "training_model.onnx", CheckpointState.load_checkpoint(arts / "checkpoint"))
    state = CheckpointState.load_checkpoint(arts / "nominal_checkpoint")
    module = Module(arts / "training_model.onnx", state, arts / "eval_model.onnx")
    optimizer = Optimizer(arts / "optimizer_model.onnx", module)
    x, y = rng.standard_normal((2, 8)).astype(np.float32), np.array([0, 3])
    assert "fc1.weight" in state.parameters and module.get_parameters_size(trainable_only=False) == 212
    with pytest.raises(RuntimeError, match="Please load the parameter states first"):
        state.parameters["fc1.weight"]
    with pytest.raises(RuntimeError, match="Please load all the parameter states first"):
        state.parameters["fc1.weight"] = np.ones((16, 8), np.float32)
    for use in (module.get_contiguous_parameters, lambda: module(x, y), optimizer.step,
                lambda: module.eval()(x, y)):
        with pytest.raises(RuntimeError, match="Please load the model parameters first"):
            use()
    module.train()
    module.copy_buffer_to_parameters(full.get_contiguous_parameters(trainable_only=True))
    with pytest.raises(RuntimeError, match="Please load the model parameters first"):  # frozen ones still missing
        module(x, y)
    module.copy_buffer_to_parameters(full.get_contiguous_parameters(), trainable_only=False)
    np.testing.assert_allclose(module(x, y), full(x, y), rtol=1e-6)
    optimizer.step()
    state.parameters["fc1.bias"] = np.ones(16, np.float32)
    np.testing.assert_array_equal(state.parameters["fc1.bias"].data, np.ones(16))


def test_string_inputs_train_and_evaluate(tmp_path):
    import onnxtrain.onnxblock as onnxblock

    class FromText(onnxblock.ForwardBlock):
        def __init__(self):
            super().__init__()
            self.cast, self.linear = onnxblock.blocks.Cast(to=onnx.TensorProto.FLOAT), onnxblock.blocks.Linear(2, 3)

        def build(self, text):
            return self.linear(self.cast(text))

    block = FromText()
    with onnxblock.empty_base(opset_version=17) as accessor:  # onnxruntime 1.17 (.ci/oldest-onnxruntime) runs <= 20
        accessor.model.graph.input.append(onnx.helper.make_tensor_value_info("text", onnx.TensorProto.STRING, [1, 2]))
        block("text")
    generate_artifacts(block.to_model_proto(), loss=LossType.CrossEntropyLoss, optimizer=OptimType.SGD,
                       artifact_directory=tmp_path)
    state = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    module = Module(tmp_path / "training_model.onnx", state, tmp_path / "eval_model.onnx")
    optimizer = Optimizer(tmp_path / "optimizer_model.onnx", module)
    text, label = np.array([["0.5", "-2"]]), np.array([1])          # a numpy str array, as users pass it
    w, b = state.parameters["linear.weight"].data, state.parameters["linear.bias"].data
    logits = np.array([0.5, -2.0]) @ w.T + b
    expected = -(logits[1] - np.log(np.exp(logits).sum()))
    np.testing.assert_allclose(module(text, label), expected, rtol=1e-5)
    assert state.parameters["linear.weight"].grad.any()
    optimizer.step()
    assert not np.array_equal(state.parameters["linear.weight"].data, w)
    module.eval()
    assert np.isfinite(module(text, label))
