"""The Android personalization sample: export an image classifier, train only its last layer on 4 classes.

Sources: https://github.com/microsoft/onnxruntime-training-examples/blob/master/on_device_training/mobile/android/java/prepare_for_training.ipynb
(offline phase) and .../mobile/android/c-cpp/train.ipynb (the training loop, validated in Python before the app).
Adapted: the imports; torchvision's pretrained MobileNetV2 (a download) is a small random-weight network with the
same layer names around the head (``features...``, ``classifier = [Dropout, Linear(C, 4)]``), 32x32 inputs, exported
with ``dynamo=False``: the TorchScript exporter the notebook ran, which exports in eval mode by default; the
four animal folders are digits 0-3; train.ipynb's pre-1.15 calls ``model([batch, labels])`` with int32 labels
and ``model(...)[0]`` for the loss (all three fail on onnxruntime-training 1.19.2 as well: it takes the inputs as
arguments, wants int64 labels and returns a lone loss as a 0-d array) are written ``model(batch, labels)``.
"""

import numpy as np
import onnx
import pytest
from onnxruntime import InferenceSession

import onnxtrain.api as orttraining  # was: import onnxruntime.training.api as orttraining
from onnxtrain import artifacts  # was: from onnxruntime.training import artifacts
from tests.api_compat._data import digit_images

torch = pytest.importorskip("torch")


class TinyMobileNet(torch.nn.Module):
    def __init__(self, num_classes=1000):
        super().__init__()
        def block(cin, cout, stride):
            return torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 3, stride, 1, bias=False),
                                       torch.nn.BatchNorm2d(cout), torch.nn.ReLU6())
        self.features = torch.nn.Sequential(block(3, 8, 2), block(8, 16, 2), block(16, 32, 2))
        self.classifier = torch.nn.Sequential(torch.nn.Dropout(0.2), torch.nn.Linear(32, num_classes))
        for m in self.modules():  # torchvision's MobileNetV2 initialization
            if isinstance(m, torch.nn.Conv2d):
                torch.nn.init.kaiming_normal_(m.weight, mode="fan_out")

    def forward(self, x):
        x = torch.nn.functional.adaptive_avg_pool2d(self.features(x), (1, 1))
        return self.classifier(torch.flatten(x, 1))


def test_android_transfer_learning(tmp_path):
    torch.manual_seed(0)
    model = TinyMobileNet()
    model.classifier[1] = torch.nn.Linear(32, 4)
    model_name = "mobilenetv2"
    out = tmp_path / "training_artifacts"
    out.mkdir()
    torch.onnx.export(model, torch.randn(1, 3, 32, 32),
                      f"{out}/{model_name}.onnx",
                      input_names=["input"], output_names=["output"],
                      dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}},
                      dynamo=False)

    onnx_model = onnx.load(f"{out}/{model_name}.onnx")
    requires_grad = ["classifier.1.weight", "classifier.1.bias"]
    frozen_params = [
        param.name
        for param in onnx_model.graph.initializer
        if param.name not in requires_grad
    ]
    artifacts.generate_artifacts(
        onnx_model,
        requires_grad=requires_grad,
        frozen_params=frozen_params,
        loss=artifacts.LossType.CrossEntropyLoss,
        optimizer=artifacts.OptimType.AdamW,
        artifact_directory=str(out)
    )

    checkpoint_state = orttraining.CheckpointState.load_checkpoint(f"{out}/checkpoint")
    model = orttraining.Module(f"{out}/training_model.onnx", checkpoint_state, f"{out}/eval_model.onnx")
    optimizer = orttraining.Optimizer(f"{out}/optimizer_model.onnx", model)
    frozen_before = {n: p.data for n, p in checkpoint_state.parameters if not p.requires_grad}
    assert sorted(n for n, p in checkpoint_state.parameters if p.requires_grad) == sorted(requires_grad)

    images, labels = digit_images(400)
    images = (images - 0.5) / 0.25  # image_file_to_tensor's normalization
    keep = labels < 4
    images, labels = images[keep], labels[keep]
    num_epochs, batch = 5, 4
    epoch_losses = []
    for epoch in range(num_epochs):
        model.train()
        loss = 0
        for index in range(0, 80, batch):
            loss += model(images[index:index + batch], labels[index:index + batch])
            optimizer.step()
            model.lazy_reset_grad()
        epoch_losses.append(float(loss) / (80 // batch))
    # onnxruntime-training 1.19.2 runs this script to the same epoch losses (within 1e-6); with random features and
    # the default learning rate (1e-3) they fall slowly.
    assert all(later < earlier for earlier, later in zip(epoch_losses, epoch_losses[1:]))
    assert epoch_losses[-1] < 0.97 * epoch_losses[0]
    for name, before in frozen_before.items():
        np.testing.assert_array_equal(checkpoint_state.parameters[name].data, before, err_msg=name)

    inference = tmp_path / "inference.onnx"
    model.export_model_for_inferencing(str(inference), ["output"])
    session = InferenceSession(str(inference), providers=["CPUExecutionProvider"])
    logits = session.run(["output"], {"input": np.stack([images[100]])})
    assert logits[0].shape == (1, 4)
    logits = session.run(["output"], {"input": images[:80]})[0]
    model.eval()
    probabilities = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    expected = -np.log(probabilities[np.arange(80), labels[:80]]).mean()
    np.testing.assert_allclose(model(images[:80], labels[:80]), expected, rtol=1e-4)
