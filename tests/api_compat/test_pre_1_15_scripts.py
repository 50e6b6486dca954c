"""Scripts written for onnxruntime-training before 1.15 (the first training-API notebooks) fail on 1.19.2 as on
onnxtrain; onnxtrain's errors name the 1.19.2 call to use instead (the peer's are AttributeErrors, pybind
TypeErrors and C++ status strings).

Sources: https://github.com/microsoft/onnxruntime-training-examples/blob/master/on_device_training/training_api_demo/mnist_training_example.ipynb
and .../on_device_training/android_demo/offline_preprocessing/prepare_android_assets.py
(``onnxblock.TrainingModel``, ``with onnxblock.onnx_model(model) as accessor``, ``CheckpointState(path)``,
``model(forward_inputs)`` with a list, int32 labels).
Adapted: the imports; the same script then written for 1.19.2 runs to the end.
"""

import numpy as np
import onnx
import pytest

import onnxtrain.onnxblock as onnxblock  # was: import onnxruntime.training.onnxblock as onnxblock
from onnxtrain.api import CheckpointState, Module, Optimizer  # was: from onnxruntime.training.api import ...
from tests.api_compat._data import digits

torch = pytest.importorskip("torch")


class SimpleNet(torch.nn.Module):
    def __init__(self, input_size, hidden_size, num_classes):
        super(SimpleNet, self).__init__()
        self.fc1 = torch.nn.Linear(input_size, hidden_size)
        self.relu = torch.nn.ReLU()
        self.fc2 = torch.nn.Linear(hidden_size, num_classes)

    def forward(self, model_input):
        return self.fc2(self.relu(self.fc1(model_input)))


def _onnx_model(tmp_path):
    pt_model = SimpleNet(64, 32, 10)
    torch.onnx.export(pt_model, (torch.randn(4, 64),), str(tmp_path / "m.onnx"), input_names=["input-0"],
                      output_names=["output-0"], dynamic_axes={"input-0": {0: "n"}, "output-0": {0: "n"}},
                      opset_version=14, do_constant_folding=False, training=torch.onnx.TrainingMode.TRAINING,
                      dynamo=False)
    return onnx.load(str(tmp_path / "m.onnx"))


def test_pre_1_15_calls_get_errors_that_name_the_replacement(tmp_path):
    onnx_model = _onnx_model(tmp_path)
    with pytest.raises(AttributeError, match=r"TrainingModel is the API of onnxruntime-training before 1.15.*"
                                             r"TrainingBlock"):
        class SimpleModelWithCrossEntropyLoss(onnxblock.TrainingModel):
            pass
    with pytest.raises(AttributeError, match=r"onnx_model is the API .*onnxblock.base\(model\)"):
        with onnxblock.onnx_model(onnx_model) as accessor:
            pass

    # The 1.19.2 form of the same notebook.
    class SimpleModelWithCrossEntropyLoss(onnxblock.TrainingBlock):
        def __init__(self):
            super(SimpleModelWithCrossEntropyLoss, self).__init__()
            self.loss = onnxblock.loss.CrossEntropyLoss()

        def build(self, output_name):
            return self.loss(output_name), output_name

    simple_model = SimpleModelWithCrossEntropyLoss()
    with onnxblock.base(onnx_model):
        _ = simple_model(onnx_model.graph.output[0].name)
        training_model, eval_model = simple_model.to_model_proto()
    optimizer = onnxblock.optim.AdamW()
    with onnxblock.empty_base():
        _ = optimizer(simple_model.parameters())
        optimizer_model = optimizer.to_model_proto()
    trainable_params, non_trainable_params = simple_model.parameters()
    assert sorted(p.name for p in trainable_params) == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]
    assert non_trainable_params == []
    onnxblock.save_checkpoint((trainable_params, non_trainable_params), str(tmp_path / "checkpoint.ckpt"))
    onnx.save(training_model, str(tmp_path / "training_model.onnx"))
    onnx.save(optimizer_model, str(tmp_path / "optimizer.onnx"))
    onnx.save(eval_model, str(tmp_path / "eval_model.onnx"))

    with pytest.raises(TypeError, match=r"CheckpointState.load_checkpoint\(path\)"):
        CheckpointState(str(tmp_path / "checkpoint.ckpt"))
    state = CheckpointState.load_checkpoint(str(tmp_path / "checkpoint.ckpt"))
    model = Module(str(tmp_path / "training_model.onnx"), state, str(tmp_path / "eval_model.onnx"))
    optimizer = Optimizer(str(tmp_path / "optimizer.onnx"), model)

    x, y = digits(256)
    with pytest.raises(ValueError, match=r"training step takes 2 inputs \(input-0: float32\[n, 64\], labels: "
                                         r"int64\[n\]\), got 1"):
        model([x, y.astype(np.int32)])
    with pytest.raises(ValueError, match=r"input 'labels' expects dtype int64, got int32"):
        model(x, y.astype(np.int32))
    assert not hasattr(model, "reset_grad")  # 1.19.2: lazy_reset_grad()

    losses = []
    optimizer.set_learning_rate(0.01)
    for _ in range(20):
        train_loss, _ = model(x, y)
        optimizer.step()
        model.lazy_reset_grad()
        losses.append(float(train_loss))
    assert losses[-1] < 0.7 * losses[0]
    model.export_model_for_inferencing(str(tmp_path / "inference_model.onnx"), ["output-0"])
    assert [i.name for i in onnx.load(str(tmp_path / "inference_model.onnx")).graph.input] == ["input-0"]
