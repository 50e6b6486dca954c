"""Gradients of the imported models against torch on the same weights, by TFLite tensor name.

Each torch function mirrors one TFLite file operator by operator, on weights in TFLite's layout (OHWI,
[1, KH, KW, C*M], [out, in]) and NHWC inputs; the weights come from the import's record of which weights
each TFLite operator reads.
"""

from __future__ import annotations

import numpy as np
import pytest

from onnxtrain import artifacts, blocks
from onnxtrain.api import CheckpointState, Module
from onnxtrain.tflite import SourceRecord, import_model
from tests.tflite.conftest import example_input

torch = pytest.importorskip("torch")
F = torch.nn.functional
pytest.importorskip("tflite")


def _digits_cnn(x, w):
    (w1, b1), (wd, bd), (wp, bp), (w2, b2), (f1, c1), (f2, c2) = w
    oihw = lambda k: k.permute(0, 3, 1, 2)  # noqa: E731
    x = x.permute(0, 3, 1, 2)
    h = F.relu(F.conv2d(x, oihw(w1), b1, padding=1))
    a = torch.clamp(F.conv2d(h, wd.permute(3, 0, 1, 2), bd, padding=1, groups=h.shape[1]), 0, 6)
    y = torch.cat([a + F.conv2d(h, oihw(wp), bp), h], 1)
    y = F.pad(F.max_pool2d(y, 2), (2, 2, 2, 2))
    y = F.avg_pool2d(F.relu(F.conv2d(y, oihw(w2), b2)), 2)
    flat = torch.cat([y.permute(0, 2, 3, 1).reshape(len(x), -1), y.mean((2, 3))], 1)
    return F.linear(F.relu(F.linear(flat, f1, c1)), f2, c2)


def _mlp(x, w):
    (w1, b1), (w2, b2), (w3, b3) = w
    h1, h2 = F.relu(F.linear(x, w1, b1)), torch.tanh(F.linear(x, w2, b2))
    h = h1 * h2 - h1
    r = h.reshape(len(x), 4, 8)
    return torch.softmax(F.linear(torch.cat([h, (r @ r.transpose(1, 2)).reshape(len(x), -1)], 1), w3, b3), -1)


def _op_zoo(x, w):
    (w1, b1), (w2, b2), (f1, c1), (f2, c2) = w
    oihw = lambda k: k.permute(0, 3, 1, 2)  # noqa: E731
    x = F.leaky_relu(F.conv2d(x.permute(0, 3, 1, 2), oihw(w1), b1, stride=2, padding=1), 0.2)  # SAME, 9 -> 5
    y = torch.sigmoid(F.conv2d(F.pad(x, (2, 2, 2, 2)), oihw(w2), b2))
    y = F.max_pool2d(F.pad(y, (0, 1, 0, 1), value=-torch.inf), 2)  # SAME on 7: the extra row/column at the end
    z = F.pad(y, (0, 1, 1, 0), value=0.5).amax((2, 3))
    d = y / (1 + y.sum(1, keepdim=True) ** 2)
    h = torch.cat([d.permute(0, 2, 3, 1).reshape(len(x), -1), z, y.mean(3).reshape(len(x), -1)], 1)
    h = torch.clamp(torch.clamp(F.linear(h, f1, c1), 0, 6), -1, 1)
    return torch.softmax(F.linear(h, f2, c2), -1)


def _onert_mnist(x, w):
    (w1, b1), (w2, b2) = w
    return F.linear(F.relu(F.linear(x.reshape(len(x), -1), w1, b1)), w2, b2)


CASES = {"digits_cnn.tflite": (_digits_cnn, "ce"), "digits_cnn.circle": (_digits_cnn, "ce"),
         "digits_cnn_fp16.tflite": (_digits_cnn, "ce"),
         "mlp.circle": (_mlp, "mse"), "op_zoo.tflite": (_op_zoo, "mse"), "onert_mnist.tflite": (_onert_mnist, "mse")}


@pytest.mark.parametrize("name", list(CASES))
def test_gradients_match_torch(model_path, tmp_path, name):
    forward, loss = CASES[name]
    model = import_model(model_path(name), tmp_path / "model.onnx")
    record = SourceRecord.from_model(model)
    artifacts.generate_artifacts(str(tmp_path / "model.onnx"), requires_grad=None, artifact_directory=tmp_path,
                                 loss=artifacts.LossType.CrossEntropyLoss if loss == "ce" else
                                 artifacts.LossType.MSELoss, optimizer=blocks.SGD())
    state = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    module = Module(tmp_path / "training_model.onnx", state, tmp_path / "eval_model.onnx")
    x = example_input(model, 6, seed=1)
    rng = np.random.default_rng(2)
    classes = model.graph.output[0].type.tensor_type.shape.dim[1].dim_value
    y = rng.integers(0, classes, 6) if loss == "ce" else rng.random((6, classes)).astype(np.float32)
    module.train()
    ours = float(module(x, y))

    names = [[n for n in ws if record.weights[n].shape] for ws in record.operators]  # scalars are constants
    names = [ws for ws in names if ws]
    params = [[torch.tensor(state.parameters[n].data, dtype=torch.float64, requires_grad=True) for n in ws]
              for ws in names]
    out = forward(torch.tensor(x, dtype=torch.float64), params)
    ref = F.cross_entropy(out, torch.tensor(y)) if loss == "ce" else F.mse_loss(out, torch.tensor(y).double())
    ref.backward()
    assert abs(ours - float(ref)) <= 1e-5 * abs(float(ref)) + 1e-6
    trained = {n for n, p in state.parameters if p.requires_grad}
    assert trained == {n for ws in names for n in ws}
    for ws, ps in zip(names, params):
        for n, p in zip(ws, ps):
            g, r = state.parameters[n].grad, p.grad.numpy()
            assert np.linalg.norm(g - r) <= 1e-4 * np.linalg.norm(r) + 1e-7, n
