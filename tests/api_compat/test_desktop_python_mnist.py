"""The desktop Python MNIST tutorial of onnxruntime-training-examples, offline and training phase, via onnxblock.

Source: https://github.com/microsoft/onnxruntime-training-examples/blob/master/on_device_training/desktop/python/mnist.ipynb
Adapted: the imports; sklearn's digits (64 features) instead of torchvision's MNIST download (784); 2 epochs.
"""

import io

import numpy as np
import onnx
import pytest
from onnxruntime import InferenceSession

import onnxtrain.onnxblock as onnxblock  # was: import onnxruntime.training.onnxblock as onnxblock
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


class MNISTTrainingBlock(onnxblock.TrainingBlock):
    def __init__(self):
        super(MNISTTrainingBlock, self).__init__()
        self.loss = onnxblock.loss.CrossEntropyLoss()

    def build(self, output_name):
        return self.loss(output_name), output_name


def test_desktop_python_mnist_tutorial(tmp_path):
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

    training_block = MNISTTrainingBlock()
    for param in onnx_model.graph.initializer:
        training_block.requires_grad(param.name, True)
    with onnxblock.base(onnx_model):
        _ = training_block(*[output.name for output in onnx_model.graph.output])
        training_model, eval_model = training_block.to_model_proto()
        model_params = training_block.parameters()
    optimizer_block = onnxblock.optim.AdamW()
    with onnxblock.empty_base() as accessor:
        _ = optimizer_block(model_params)
        optimizer_model = optimizer_block.to_model_proto()

    data = tmp_path / "data"
    data.mkdir()
    onnxblock.save_checkpoint(training_block.parameters(), f"{data}/checkpoint.ckpt")
    onnx.save(training_model, f"{data}/training_model.onnx")
    onnx.save(optimizer_model, f"{data}/optimizer_model.onnx")
    onnx.save(eval_model, f"{data}/eval_model.onnx")

    state = CheckpointState.load_checkpoint(f"{data}/checkpoint.ckpt")
    model = Module(f"{data}/training_model.onnx", state, f"{data}/eval_model.onnx")
    optimizer = Optimizer(f"{data}/optimizer_model.onnx", model)
    x, y = digits(1200)
    epoch_losses, accuracies = [], []
    for _ in range(2):
        model.train()
        losses = []
        for data_batch, target in batches(x, y, batch_size):
            train_loss, _ = model(data_batch, target.astype(np.int64))
            optimizer.step()
            model.lazy_reset_grad()
            losses.append(train_loss)
        epoch_losses.append(sum(losses) / len(losses))
        model.eval()
        correct = 0
        for data_batch, target in batches(x, y, 1000):
            test_loss, logits = model(data_batch, target)
            correct += int((np.argmax(logits, axis=1) == target).sum())
        accuracies.append(correct / len(x))

    assert epoch_losses[1] < epoch_losses[0] < 2.3
    assert accuracies[-1] > 0.9

    model.export_model_for_inferencing(f"{data}/inference_model.onnx", ["output"])
    session = InferenceSession(f"{data}/inference_model.onnx", providers=["CPUExecutionProvider"])
    input_name = session.get_inputs()[0].name
    output_name = session.get_outputs()[0].name
    output = session.run([output_name], {input_name: x[:1].reshape(1, 64)})
    np.testing.assert_allclose(output[0], model(x[:1], y[:1])[1], rtol=1e-5, atol=1e-5)
    assert np.argmax(output[0], axis=1) == y[:1]
