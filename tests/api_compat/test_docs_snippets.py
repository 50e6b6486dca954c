"""The Python snippets of README.md and docs/*.md run as written, read from the files at test time.

Placeholders the prose leaves to the reader (the forward model file, ``batches``, ``x``/``y``, the "train as
usual" step) are filled in before a snippet runs; the snippet's own lines are not changed.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.api_compat._data import batches as make_batches
from tests.api_compat._data import digits

ROOT = Path(__file__).resolve().parents[2]
torch = pytest.importorskip("torch")


def snippet(doc: str, first_line: str) -> str:
    """The ```python block of ``doc`` whose first line starts with ``first_line``."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / doc).read_text(), re.S)
    found = [b for b in blocks if b.startswith(first_line)]
    assert len(found) == 1, f"{doc}: expected one python block starting with {first_line!r}, found {len(found)}"
    return found[0]


class _Net(torch.nn.Module):
    """A forward model with the parameter names the snippets use."""

    def __init__(self):
        super().__init__()
        self.features = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU())
        self.query = torch.nn.Linear(32, 32)
        self.value = torch.nn.Linear(32, 32)
        self.classifier = torch.nn.Linear(32, 10)

    def forward(self, x):
        h = self.features(x)
        return self.classifier(torch.relu(self.query(h)) + self.value(h))


def _export(path: Path, output: str) -> None:
    torch.manual_seed(0)
    torch.onnx.export(_Net(), (torch.randn(4, 64),), str(path), input_names=["input"], output_names=[output],
                      dynamic_axes={"input": {0: "N"}}, dynamo=False, do_constant_folding=False,
                      training=torch.onnx.TrainingMode.TRAINING)


def test_readme_quick_start(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _export(tmp_path / "model.onnx", "output")
    (tmp_path / "artifacts").mkdir()
    x, y = digits(256)
    scope = {"batches": list(make_batches(x, y, 32))}
    exec(snippet("README.md", "from onnxtrain import artifacts, blocks"), scope)
    trained = onnx.load("model_trained.onnx")
    assert [i.name for i in trained.graph.input] == ["input"] and [o.name for o in trained.graph.output] == ["output"]
    state = scope["state"]
    assert sorted(n for n, p in state.parameters if p.requires_grad) == ["classifier.bias", "classifier.weight"]
    start = {i.name: onnx.numpy_helper.to_array(i) for i in onnx.load("model.onnx").graph.initializer}
    end = {i.name: onnx.numpy_helper.to_array(i) for i in trained.graph.initializer}
    np.testing.assert_array_equal(end["features.0.weight"], start["features.0.weight"])
    assert not np.allclose(end["classifier.weight"], start["classifier.weight"])


def test_architecture_one_training_step(tmp_path):
    from onnxtrain import artifacts
    from onnxtrain.api import CheckpointState, Module, Optimizer

    _export(tmp_path / "model.onnx", "output")
    paths = artifacts.generate_artifacts(str(tmp_path / "model.onnx"), loss=artifacts.LossType.CrossEntropyLoss,
                                         optimizer=artifacts.OptimType.SGD, artifact_directory=tmp_path)
    state = CheckpointState.load_checkpoint(paths["checkpoint"])
    module = Module(paths["training"], state, paths["eval"])
    x, y = digits(32)
    scope = {"module": module, "optimizer": Optimizer(paths["optimizer"], module), "x": x, "y": y}
    before = module.get_contiguous_parameters().numpy()
    exec(snippet("docs/architecture.md", "loss = module(x, y)"), scope)
    assert np.isfinite(scope["loss"]) and not np.allclose(module.get_contiguous_parameters().numpy(), before)


def test_lora_snippet(tmp_path, monkeypatch):
    from onnxtrain.api import CheckpointState, Module, Optimizer

    monkeypatch.chdir(tmp_path)
    _export(tmp_path / "bert.onnx", "logits")
    (tmp_path / "artifacts").mkdir()
    code = snippet("docs/lora.md", "from onnxtrain.artifacts import LoRA")
    train_line = "...  # train with onnxtrain.api as usual\n"
    assert train_line in code
    x, y = digits(64)

    def train():
        state = CheckpointState.load_checkpoint("artifacts/checkpoint")
        module = Module("artifacts/training_model.onnx", state, "artifacts/eval_model.onnx")
        optimizer = Optimizer("artifacts/optimizer_model.onnx", module)
        for _ in range(3):
            module(x, y)
            optimizer.step()
            module.lazy_reset_grad()
        return state, module

    scope = {"train": train}
    exec(code.replace(train_line, "state, module = train()\n"), scope)
    merged = onnx.load("model.onnx")
    assert not any("lora" in n.name.lower() for n in merged.graph.node)  # B A folded into W
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in (tmp_path / "adapter").iterdir()}
    restarted = CheckpointState.load_checkpoint("artifacts/checkpoint")  # the last line: artifacts from the adapter
    adapters = [n for n, p in scope["state"].parameters if p.requires_grad and "lora" in n.lower()]
    assert adapters
    for name in adapters:
        np.testing.assert_array_equal(restarted.parameters[name].data, scope["state"].parameters[name].data)


def test_federated_snippets(tmp_path, monkeypatch):
    pytest.importorskip("flwr")
    scope: dict = {}
    exec(snippet("docs/federated.md", "from onnxtrain.federated import ClientSettings"), scope)
    assert type(scope["client_app"]).__name__ == "ClientApp" and type(scope["server_app"]).__name__ == "ServerApp"

    monkeypatch.chdir(tmp_path)
    (tmp_path / "fl-app").mkdir()  # "make a Flower App directory whose pyproject.toml ..."
    exec(snippet("docs/federated.md", "from onnxtrain.federated.app import app_pyproject"), {})
    text = (tmp_path / "fl-app" / "pyproject.toml").read_text()
    assert "/srv/model/artifacts" in text and "num-server-rounds = 10" in text
