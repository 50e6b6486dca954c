"""Parameters an exporter's folding moved into other tensors: a tie the TorchScript exporter's constant folding
broke is tied again; a parameter the dynamo exporter's optimizer folded away is named in a warning when its
stand-in trains."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from onnxtrain import artifacts, blocks
from onnxtrain.api import CheckpointState, Module

torch = pytest.importorskip("torch")


class TiedLM(torch.nn.Module):
    """An embedding whose weight is also the output head's (transformers' tie_word_embeddings)."""

    def __init__(self, vocab=40, hidden=12):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.proj = torch.nn.Linear(hidden, hidden)
        self.head = torch.nn.Linear(hidden, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids):
        return self.head(torch.tanh(self.proj(self.embed(ids))))


def _torchscript(model, args, path, names, dynamic_axes):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model.eval(), args, str(path), dynamo=False, input_names=names, output_names=["out"],
                          dynamic_axes=dynamic_axes)   # constant folding on, the default
    return path


def _dynamo(model, args, path):
    pytest.importorskip("onnxscript")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model.eval(), args, str(path), input_names=["x"], output_names=["out"],
                          dynamic_shapes=({0: "batch"},))
    return path


def _module(folder):
    state = CheckpointState.load_checkpoint(folder / "checkpoint")
    return state, Module(folder / "training_model.onnx", state, folder / "eval_model.onnx")


@pytest.mark.parametrize("length", [5, 9])
def test_a_tied_head_folded_by_torchscript_trains_as_the_embedding(tmp_path, caplog, length):
    torch.manual_seed(0)
    model = TiedLM()
    path = _torchscript(model, (torch.randint(0, 40, (2, 7)),), tmp_path / "m.onnx", ["ids"],
                        {"ids": {0: "b", 1: "s"}, "out": {0: "b", 1: "s"}})
    generate = lambda folder, **kw: artifacts.generate_artifacts(  # noqa: E731
        path, loss=blocks.CrossEntropyLoss(class_axis=-1), optimizer=blocks.AdamW(), artifact_directory=folder, **kw)
    generate(tmp_path / "all")
    assert "is the transpose of 'embed.weight'" in caplog.text
    generate(tmp_path / "named", requires_grad=["embed.weight"])
    ids, labels = torch.randint(0, 40, (3, length)), torch.randint(0, 40, (3, length))
    torch.nn.functional.cross_entropy(model(ids).reshape(-1, 40), labels.reshape(-1)).backward()
    for folder, count in (("all", 3), ("named", 1)):
        state, module = _module(tmp_path / folder)
        # torch's three parameters (proj.weight under its folded name), no second copy of the embedding
        assert len(state.parameters) == count and "embed.weight" in state.parameters
        module(ids.numpy(), labels.numpy())
        np.testing.assert_allclose(state.parameters["embed.weight"].grad, model.embed.weight.grad.numpy(),
                                   rtol=1e-4, atol=1e-6)


def test_equal_zero_matrices_are_not_taken_for_a_tie(tmp_path, caplog):
    class TwoZero(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(6, 6, bias=False)
            self.b = torch.nn.Linear(6, 6, bias=False)
            torch.nn.init.zeros_(self.a.weight)
            torch.nn.init.zeros_(self.b.weight)

        def forward(self, x):   # b's weight is stored transposed (onnx::MatMul_N), equal to a's: zeros
            return self.b(x).sum(1) + (self.a.weight @ x.transpose(1, 2)).sum(-1)

    path = _torchscript(TwoZero(), (torch.randn(2, 3, 6),), tmp_path / "m.onnx", ["x"], {"x": {0: "b"}})
    artifacts.generate_artifacts(path, loss=artifacts.LossType.MSELoss, optimizer=blocks.SGD(),
                                 artifact_directory=tmp_path / "art")
    assert "is the transpose of" not in caplog.text


class BatchNormNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.bn = torch.nn.BatchNorm2d(4)
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).mean((2, 3)))


class RelativeBias(torch.nn.Module):
    """Swin's relative position bias: a parameter table read through a constant index buffer."""

    def __init__(self, length=4, hidden=8):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(2 * length - 1) * 0.1)
        index = torch.arange(length)[:, None] - torch.arange(length)[None, :] + length - 1
        self.register_buffer("index", index.reshape(-1), persistent=False)
        self.length, self.qk, self.head = length, torch.nn.Linear(hidden, hidden), torch.nn.Linear(hidden, 3)

    def forward(self, x):
        bias = self.table[self.index].view(self.length, self.length)
        attention = torch.softmax(self.qk(x) @ x.transpose(1, 2) + bias, -1)
        return self.head((attention @ x).mean(1))


@pytest.mark.parametrize("model, example, folded, stand_in", [
    (BatchNormNet, (2, 3, 8, 8), "'bn.weight' into the Conv node", "conv.weight"),
    (RelativeBias, (2, 4, 8), "'table' into the constant", None),
])
def test_parameters_the_dynamo_optimizer_folded_are_named_when_their_stand_ins_train(tmp_path, model, example,
                                                                                    folded, stand_in):
    torch.manual_seed(0)
    path = _dynamo(model(), (torch.randn(*example),), tmp_path / "m.onnx")
    with pytest.warns(UserWarning, match=f"folded into other tensors.*{folded}.*optimize=False"):
        artifacts.generate_artifacts(path, loss=artifacts.LossType.CrossEntropyLoss, optimizer=blocks.AdamW(),
                                     artifact_directory=tmp_path / "art")
    state, _ = _module(tmp_path / "art")
    trained = {n for n, p in state.parameters.items() if p.requires_grad}
    if stand_in is not None:
        assert stand_in in trained
    else:  # the gathered table trains as the constant the optimizer computed from it (each entry its own)
        torch_names = {n for n, _ in model().named_parameters()}
        assert "table" not in trained and len(trained - torch_names) == 1
