"""A model with several outputs (a classifier that also returns its embedding): ``loss_input_names`` picks the
output the loss reads, an onnxblock optimizer block replaces the OptimType enum, and the exported inference model
returns every output.

Sources: generate_artifacts' docstring (``loss_input_names``, optimizer "enum or onnxblock") in
https://github.com/microsoft/onnxruntime/blob/main/orttraining/orttraining/python/training/artifacts.py and the pull
request that added ``loss_input_names`` for models whose extra outputs broke the loss,
https://github.com/microsoft/onnxruntime/pull/19705 .
Adapted: the imports; the model is a torch MLP on sklearn's digits.
"""

import numpy as np
import onnx
import pytest
from onnxruntime import InferenceSession

import onnxtrain.onnxblock as onnxblock  # was: import onnxruntime.training.onnxblock as onnxblock
from onnxtrain import artifacts  # was: from onnxruntime.training import artifacts
from onnxtrain.api import CheckpointState, Module, Optimizer  # was: from onnxruntime.training.api import ...
from tests.api_compat._data import batches, digits

torch = pytest.importorskip("torch")


class Classifier(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Tanh())
        self.head = torch.nn.Linear(32, 10)

    def forward(self, x):
        embedding = self.body(x)
        return self.head(embedding), embedding


def test_loss_on_one_of_two_outputs_and_export_both(tmp_path):
    torch.manual_seed(0)
    net = Classifier()
    torch.onnx.export(net, (torch.randn(4, 64),), str(tmp_path / "model.onnx"), input_names=["input"],
                      output_names=["logits", "embedding"], dynamic_axes={"input": {0: "N"}}, dynamo=False,
                      do_constant_folding=False, training=torch.onnx.TrainingMode.TRAINING)
    model = onnx.load(str(tmp_path / "model.onnx"))
    artifacts.generate_artifacts(
        model,
        requires_grad=[name for name, _ in net.named_parameters()],
        loss=artifacts.LossType.CrossEntropyLoss,
        optimizer=onnxblock.optim.AdamW(weight_decay=0.01),
        artifact_directory=str(tmp_path),
        loss_input_names=["logits"],
    )
    state = CheckpointState.load_checkpoint(str(tmp_path / "checkpoint"))
    module = Module(str(tmp_path / "training_model.onnx"), state, str(tmp_path / "eval_model.onnx"))
    optimizer = Optimizer(str(tmp_path / "optimizer_model.onnx"), module)
    assert module.input_names() == ["input", "labels"]
    x, y = digits(512)
    module.eval()
    before = float(np.squeeze(module(x, y)))
    module.train()
    for _ in range(3):
        for xb, yb in batches(x, y, 32):
            module(xb, yb)
            optimizer.step()
            module.lazy_reset_grad()
    module.eval()
    after = float(np.squeeze(module(x, y)))
    assert after < 0.9 * before  # onnxruntime-training 1.19.2: the same eval losses (1e-6)

    module.export_model_for_inferencing(str(tmp_path / "inference.onnx"), ["logits", "embedding"])
    session = InferenceSession(str(tmp_path / "inference.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["input"]
    logits, embedding = session.run(["logits", "embedding"], {"input": x})
    assert embedding.shape == (512, 32) and (logits.argmax(1) == y).mean() > 0.5
    # The outputs are the trained network's: recompute them with the trained weights in torch.
    with torch.no_grad():
        for name, param in net.named_parameters():
            param.copy_(torch.from_numpy(state.parameters[name].data))
        expected = net(torch.from_numpy(x))
    np.testing.assert_allclose(logits, expected[0].numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(embedding, expected[1].numpy(), rtol=1e-4, atol=1e-5)
