"""The API usage of onnxruntime-training's own Python API tests, run on onnxtrain.

Source: microsoft/onnxruntime, orttraining/orttraining/test/python/orttraining_test_ort_apis_py_bindings.py (the
1.17-1.19 version: SimpleNet 784-500-10 exported with ``input-0`` / ``output-0``, CrossEntropyLoss, AdamW or SGD).
Restated here rather than copied: each test makes the calls the peer's test makes, with its argument forms
(positional ``LinearLRScheduler(optimizer, 1, 2, 0.2)``, ``copy_buffer_to_parameters(buffer, trainable_only=...)``,
OrtValue inputs, ``state.parameters[name].data = ...``, nominal checkpoints and their "Please load ..." errors), and
checks what it checks. Left out: the CUDA and custom-op tests (onnxtrain trains on the CPU with default-domain ops).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnxruntime import OrtValue

import onnxtrain.onnxblock as onnxblock  # was: import onnxruntime.training.onnxblock as onnxblock
from onnxtrain import artifacts  # was: from onnxruntime.training import artifacts
from onnxtrain.api import CheckpointState, LinearLRScheduler, Module, Optimizer  # was: onnxruntime.training.api

torch = pytest.importorskip("torch")


class _SimpleNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.relu, self.fc2 = torch.nn.Linear(784, 500), torch.nn.ReLU(), torch.nn.Linear(500, 10)

    def forward(self, x):
        return self.fc2(self.relu(self.fc1(x)))


def _artifacts(folder, optimizer=artifacts.OptimType.AdamW, frozen=False, nominal=False):
    torch.manual_seed(0)
    net = _SimpleNet()
    dims = {"input-0": {0: "input-0_dim0", 1: "input-0_dim1"}, "output-0": {0: "output-0_dim0", 1: "output-0_dim1"}}
    torch.onnx.export(net, (torch.randn(64, 784),), str(folder / "simple.onnx"), input_names=["input-0"],
                      output_names=["output-0"], opset_version=14, do_constant_folding=False,
                      training=torch.onnx.TrainingMode.TRAINING, dynamic_axes=dims, dynamo=False)
    names = [n for n, _ in net.named_parameters()]
    artifacts.generate_artifacts(onnx.load(str(folder / "simple.onnx")), optimizer=optimizer,
                                 loss=artifacts.LossType.CrossEntropyLoss,
                                 requires_grad=names[2:] if frozen else names,
                                 frozen_params=names[:2] if frozen else [],
                                 artifact_directory=folder, nominal_checkpoint=nominal)
    return net


def _batch():
    return torch.randn(64, 784).numpy(), torch.randint(high=10, size=(64,), dtype=torch.int64).numpy()


def _torch_loss(net, inputs, labels):
    return torch.nn.CrossEntropyLoss()(net(torch.from_numpy(inputs)), torch.from_numpy(labels)).item()


@pytest.fixture(scope="module")
def adamw(tmp_path_factory):
    folder = tmp_path_factory.mktemp("adamw")
    return folder, _artifacts(folder, nominal=True)


def _load(folder, eval_model=True):
    state = CheckpointState.load_checkpoint(folder / "checkpoint")
    return state, Module(folder / "training_model.onnx", state, folder / "eval_model.onnx" if eval_model else None)


def test_train_and_eval_steps_with_numpy_and_ortvalues(adamw):
    folder, net = adamw
    state, model = _load(folder)
    inputs, labels = _batch()
    model.train()
    assert np.allclose(model(inputs, labels), _torch_loss(net, inputs, labels))
    loss = model(OrtValue.ortvalue_from_numpy(inputs), OrtValue.ortvalue_from_numpy(labels))
    assert isinstance(loss, OrtValue) and np.allclose(loss.numpy(), _torch_loss(net, inputs, labels))
    model.eval()
    fetches = model(OrtValue.ortvalue_from_numpy(inputs), OrtValue.ortvalue_from_numpy(labels))
    assert isinstance(fetches, OrtValue) and fetches


@pytest.mark.parametrize("optimizer_type", [artifacts.OptimType.SGD, artifacts.OptimType.AdamW])
def test_optimizer_step_learning_rate_scheduler_and_buffers(tmp_path, optimizer_type):
    _artifacts(tmp_path, optimizer_type, frozen=True)
    state, model = _load(tmp_path, eval_model=False)
    optimizer = Optimizer(tmp_path / "optimizer_model.onnx", model)
    assert round(optimizer.get_learning_rate(), 3) == 0.001
    optimizer.set_learning_rate(0.5)
    assert np.isclose(optimizer.get_learning_rate(), 0.5)

    for trainable_only in (True, False):
        old = model.get_contiguous_parameters(trainable_only=trainable_only)
        model.train()
        model(*_batch())
        optimizer.step()
        new = model.get_contiguous_parameters(trainable_only=trainable_only)
        assert not np.array_equal(old.numpy(), new.numpy())
        model.copy_buffer_to_parameters(old, trainable_only=trainable_only)
        assert np.array_equal(model.get_contiguous_parameters(trainable_only=trainable_only).numpy(), old.numpy())

    scheduler = LinearLRScheduler(optimizer, 1, 2, 0.2)
    assert np.allclose(optimizer.get_learning_rate(), 0.0)
    model(*_batch())
    optimizer.step()
    scheduler.step()
    assert optimizer.get_learning_rate() != 0.0


def test_checkpoint_export_and_input_output_names(adamw, tmp_path):
    folder, _ = adamw
    state, model = _load(folder)
    model.train()
    model(*_batch())
    CheckpointState.save_checkpoint(state, tmp_path / "checkpoint_export.ckpt")
    reloaded_state = CheckpointState.load_checkpoint(tmp_path / "checkpoint_export.ckpt")
    reloaded = Module(folder / "training_model.onnx", reloaded_state)
    assert np.array_equal(model.get_contiguous_parameters().numpy(), reloaded.get_contiguous_parameters().numpy())

    model.export_model_for_inferencing(tmp_path / "inference_model.onnx", ["output-0"])
    assert (tmp_path / "inference_model.onnx").exists()
    training_model = onnx.load(folder / "training_model.onnx")
    assert model.input_names() == [i.name for i in training_model.graph.input][:2]
    assert model.output_names() == [o.name for o in training_model.graph.output][:1]


def test_property_values_round_trip(adamw, tmp_path):
    folder, _ = adamw
    for value in [-1, 0, 1, 1234567890, -1.0, -0.1, 0.1, 1.0, 1234.0, "hello", "world", "onnxruntime"]:
        state, _ = _load(folder, eval_model=False)
        value = float(np.float32(value)) if isinstance(value, float) else value  # as the peer's test
        assert len(state.properties) == 0
        state.properties["property"] = value
        assert "property" in state.properties and state.properties["property"] == value
        CheckpointState.save_checkpoint(state, tmp_path / "checkpoint")
        loaded = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
        assert loaded.properties["property"] == value and len(loaded.properties) == 1


def test_string_inputs_through_a_forward_block(tmp_path):
    class BlockWithStringInputs(onnxblock.ForwardBlock):
        def __init__(self):
            super().__init__()
            self.cast = onnxblock.blocks.Cast(to=onnx.TensorProto.FLOAT)
            self.linear = onnxblock.blocks.Linear(4, 2)

        def build(self, string_input):
            return self.linear(self.cast(string_input))

    block = BlockWithStringInputs()
    with onnxblock.empty_base() as accessor:
        accessor.model.graph.input.extend([onnx.helper.make_tensor_value_info("input", onnx.TensorProto.STRING,
                                                                              [1, 4])])
        block("input")
    forward = block.to_model_proto()
    artifacts.generate_artifacts(forward, optimizer=artifacts.OptimType.AdamW, loss=artifacts.LossType.CrossEntropyLoss,
                                 requires_grad=[p.name for p in forward.graph.initializer], artifact_directory=tmp_path)
    state, model = _load(tmp_path)
    strings = np.array([["1.0", "2.0", "3.0", "4.0"]], dtype=str)
    labels = np.array([1], dtype=np.int64)
    weight, bias = (state.parameters[n].data.astype(np.float64) for n in ("linear.weight", "linear.bias"))
    logits = np.array([[1.0, 2.0, 3.0, 4.0]]) @ weight.T + bias
    expected = -logits[0, 1] + np.log(np.exp(logits[0]).sum())
    # float32 rounding of the logits: the random Linear can make the loss tiny (a cancellation in log-sum-exp)
    atol = 1e-6 * max(1.0, float(np.abs(logits).max()))
    assert np.allclose(model.train()(strings, labels), expected, rtol=1e-5, atol=atol)
    assert np.allclose(model.eval()(strings, labels), expected, rtol=1e-5, atol=atol)


def test_parameter_values_and_gradients(tmp_path):
    net = _artifacts(tmp_path, frozen=True)
    state, model = _load(tmp_path)
    assert sorted(n for n, _ in state.parameters) == sorted(net.state_dict())
    for name, pt_param in net.named_parameters():
        parameter = state.parameters[name]
        assert parameter.name == name and np.allclose(pt_param.detach().numpy(), parameter.data)
        if name.startswith("fc1"):
            assert parameter.requires_grad is False and parameter.grad is None
        else:
            assert parameter.requires_grad is True and np.allclose(parameter.grad, 0)
    original = state.parameters["fc1.weight"].data
    state.parameters["fc1.weight"].data = np.ones_like(original, dtype=np.float32)
    assert np.allclose(state.parameters["fc1.weight"].data, 1)
    model.train()
    assert model(*_batch()) is not None
    assert state.parameters["fc1.weight"].grad is None and state.parameters["fc2.weight"].grad.any()
    state.parameters["fc1.weight"] = original
    assert np.allclose(state.parameters["fc1.weight"].data, original)


def test_nominal_checkpoint_errors_and_training_after_loading(adamw):
    folder, net = adamw
    nominal = CheckpointState.load_checkpoint(folder / "nominal_checkpoint")
    model = Module(folder / "training_model.onnx", nominal, folder / "eval_model.onnx")
    optimizer = Optimizer(folder / "optimizer_model.onnx", model)
    inputs, labels = _batch()
    assert all(name in nominal.parameters for name in net.state_dict())
    with pytest.raises(Exception, match="Please load the parameter states first"):
        nominal.parameters["fc1.weight"]
    with pytest.raises(Exception, match="Please load all the parameter states first"):
        nominal.parameters["fc1.weight"] = np.ones((10, 10), dtype=np.float32)
    for call in (model.get_contiguous_parameters, lambda: model.train()(inputs, labels), optimizer.step,
                 lambda: model.eval()(inputs, labels)):
        with pytest.raises(Exception, match=r"Please load the model parameters first\."):
            call()
    assert model.get_parameters_size() > 0

    complete_state, complete = _load(folder, eval_model=False)
    complete_optimizer = Optimizer(folder / "optimizer_model.onnx", complete)
    model.copy_buffer_to_parameters(complete.get_contiguous_parameters(), trainable_only=False)
    model.train()
    loss_1, loss_2 = complete(inputs, labels), model(inputs, labels)
    assert np.allclose(loss_1, loss_2) and np.allclose(loss_1, _torch_loss(net, inputs, labels))
    complete_optimizer.step()
    optimizer.step()
    assert np.allclose(complete.get_contiguous_parameters().numpy(), model.get_contiguous_parameters().numpy())
