"""onnxruntime issue 19008: a custom loss for a YOLOv4 detector, the sum of an MSE, a BCE-with-logits and a
cross-entropy over three model outputs, in a block that never calls ``super().__init__()``.

Source: https://github.com/microsoft/onnxruntime/issues/19008 (``class YoloV4Loss(onnxblock.Block)``).
Adapted: the imports; a three-headed random-weight linear model instead of the YOLOv4 export. The user's block
fails on onnxruntime-training 1.19.2 too: their model had two outputs for a three-input ``build`` (the issue's
``TypeError: YoloV4Loss.build() missing 1 required positional argument``) and ``blocks.Add`` takes two inputs,
not three. onnxtrain raises the same TypeErrors, naming the block and the inputs it was given; the same loss
with its sums nested (``Add(Add(a, b), c)``) trains, and its value and gradients are torch's.
"""

import numpy as np
import onnx
import pytest

import onnxtrain.onnxblock as onnxblock  # was: import onnxruntime.training.onnxblock as onnxblock
from onnxtrain import artifacts  # was: from onnxruntime.training import artifacts
from onnxtrain.api import CheckpointState, Module  # was: from onnxruntime.training.api import ...

torch = pytest.importorskip("torch")
F = torch.nn.functional


# -- the user's code (unchanged) ----------------------------------------------------------------------------------
# Define a custom loss block for yolo v4 model
class YoloV4Loss(onnxblock.Block):
    def __init__(self):
        self._loss1 = onnxblock.loss.MSELoss()
        self._loss2 = onnxblock.loss.BCEWithLogitsLoss()
        self._loss3 = onnxblock.loss.CrossEntropyLoss()
        self._add = onnxblock.blocks.Add()

    def build(self, loss_input_name1, loss_input_name2, loss_input_name3):
        # Returns sum of the three losses
        return self._add(
            self._loss1(loss_input_name1, target_name="target1"),
            self._loss2(loss_input_name2, target_name="target2"),
            self._loss3(loss_input_name3))
# ------------------------------------------------------------------------------------------------------------------


class NestedYoloV4Loss(YoloV4Loss):
    """The user's loss with its three-way sum written as two Adds."""

    def build(self, loss_input_name1, loss_input_name2, loss_input_name3):
        return self._add(self._add(self._loss1(loss_input_name1, target_name="target1"),
                                   self._loss2(loss_input_name2, target_name="target2")),
                         self._loss3(loss_input_name3))


class _Heads(torch.nn.Module):
    def __init__(self, heads: int):
        super().__init__()
        self.heads = heads
        self.box, self.obj, self.cls = torch.nn.Linear(6, 4), torch.nn.Linear(6, 5), torch.nn.Linear(6, 7)

    def forward(self, x):
        return (self.box(x), self.obj(x), self.cls(x))[:self.heads]


def _forward(tmp_path, heads: int):
    torch.manual_seed(0)
    net = _Heads(heads)
    outputs = ["boxes", "objectness", "classes"][:heads]
    torch.onnx.export(net, (torch.randn(3, 6),), str(tmp_path / "yolo.onnx"), input_names=["x"], output_names=outputs,
                      dynamic_axes={"x": {0: "b"}, **{o: {0: "b"} for o in outputs}}, dynamo=False)
    return net, onnx.load(str(tmp_path / "yolo.onnx"))


def _generate(model, loss, tmp_path):
    artifacts.generate_artifacts(model, requires_grad=[i.name for i in model.graph.initializer], loss=loss,
                                 optimizer=artifacts.OptimType.AdamW, artifact_directory=tmp_path)


def test_the_users_block_fails_as_on_the_peer_naming_the_block_and_its_inputs(tmp_path):
    _, two_outputs = _forward(tmp_path, 2)
    with pytest.raises(TypeError, match=r"YoloV4Loss was called with 2 input\(s\) \['boxes', 'objectness'\].*"
                                        r"missing a required argument: 'loss_input_name3'.*every output of the model"):
        _generate(two_outputs, YoloV4Loss(), tmp_path)
    _, three_outputs = _forward(tmp_path, 3)
    with pytest.raises(TypeError, match=r"Add was called with 3 input\(s\).*too many positional arguments"):
        _generate(three_outputs, YoloV4Loss(), tmp_path)


def test_the_nested_sum_trains_with_torchs_loss_and_gradients(tmp_path):
    net, model = _forward(tmp_path, 3)
    _generate(model, NestedYoloV4Loss(), tmp_path)
    state = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    module = Module(tmp_path / "training_model.onnx", state, tmp_path / "eval_model.onnx")
    assert module.input_names() == ["x", "target1", "target2", "labels"]

    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 6)).astype(np.float32)
    target1 = rng.standard_normal((3, 4)).astype(np.float32)
    target2 = (rng.random((3, 5)) > 0.5).astype(np.float32)
    labels = rng.integers(0, 7, 3).astype(np.int64)
    loss = module(x, target1, target2, labels)

    boxes, objectness, classes = net(torch.from_numpy(x))
    expected = (F.mse_loss(boxes, torch.from_numpy(target1))
                + F.binary_cross_entropy_with_logits(objectness, torch.from_numpy(target2))
                + F.cross_entropy(classes, torch.from_numpy(labels)))
    expected.backward()
    assert float(loss) == pytest.approx(expected.item(), rel=1e-5)
    for name, p in net.named_parameters():
        np.testing.assert_allclose(state.parameters[name].grad, p.grad.numpy(), rtol=1e-4, atol=1e-6, err_msg=name)
