"""The web demo's offline step: generate_artifacts with torch's parameter lists, into the working directory.

Source: https://github.com/microsoft/onnxruntime-training-examples/blob/master/on_device_training/web/offline-step/mnist.ipynb
Adapted: the imports; 64 digit features instead of MNIST's 784; the training phase (JavaScript in the demo) is the
Python API's loop on sklearn's digits.
"""

import io
import os

import numpy as np
import onnx
import pytest

from onnxtrain import artifacts  # was: from onnxruntime.training import artifacts
from onnxtrain.api import CheckpointState, Module, Optimizer  # was: from onnxruntime.training.api import ...
from tests.api_compat._data import batches, digits

torch = pytest.importorskip("torch")


class MNISTNet(torch.nn.Module):
    def __init__(self, input_size, hidden_size, num_classes):
        super(MNISTNet, self).__init__()
        self.fc1 = torch.nn.Linear(input_size, hidden_size)
        self.relu = torch.nn.ReLU()
        self.fc2 = torch.nn.Linear(hidden_size, num_classes)

    def forward(self, model_input):
        out = self.fc1(model_input)
        out = self.relu(out)
        out = self.fc2(out)
        return out


def test_web_offline_step_then_train(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    device = "cpu"
    batch_size, input_size, hidden_size, output_size = 64, 64, 500, 10
    pt_model = MNISTNet(input_size, hidden_size, output_size).to(device)
    model_inputs = (torch.randn(batch_size, input_size, device=device),)
    input_names = ["input"]
    output_names = ["output"]
    dynamic_axes = {"input": {0: "batch_size"}, "output": {0: "batch_size"}}
    f = io.BytesIO()
    torch.onnx.export(pt_model, model_inputs, f, input_names=input_names, output_names=output_names,
                      opset_version=14, do_constant_folding=False, training=torch.onnx.TrainingMode.TRAINING,
                      dynamic_axes=dynamic_axes, export_params=True, keep_initializers_as_inputs=False)
    onnx_model = onnx.load_model_from_string(f.getvalue())

    requires_grad = [name for name, param in pt_model.named_parameters() if param.requires_grad]
    frozen_params = [name for name, param in pt_model.named_parameters() if not param.requires_grad]
    artifacts.generate_artifacts(
        onnx_model,
        optimizer=artifacts.OptimType.AdamW,
        loss=artifacts.LossType.CrossEntropyLoss,
        requires_grad=requires_grad,
        frozen_params=frozen_params,
        additional_output_names=output_names)

    # No artifact_directory: the peer writes the four artifacts to the working directory.
    assert {"training_model.onnx", "eval_model.onnx", "optimizer_model.onnx", "checkpoint"} <= set(os.listdir("."))

    state = CheckpointState.load_checkpoint("checkpoint")
    assert sorted(name for name, _ in state.parameters) == sorted(requires_grad)
    model = Module("training_model.onnx", state, "eval_model.onnx")
    optimizer = Optimizer("optimizer_model.onnx", model)
    assert model.input_names() == ["input", "labels"]
    assert model.output_names()[1:] == ["output"]
    x, y = digits(640)
    epoch_losses = []
    for _ in range(3):
        model.train()
        losses = []
        for xb, yb in batches(x, y, batch_size):
            loss, logits = model(xb, yb)
            assert logits.shape == (len(xb), 10) and np.ndim(loss) == 0
            optimizer.step()
            model.lazy_reset_grad()
            losses.append(float(loss))
        epoch_losses.append(np.mean(losses))
    model.eval()
    eval_loss, logits = model(x, y)
    assert epoch_losses[2] < epoch_losses[1] < epoch_losses[0]
    assert float(eval_loss) < epoch_losses[0] and (logits.argmax(1) == y).mean() > 0.85
