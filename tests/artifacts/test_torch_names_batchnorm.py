"""A fresh BatchNorm that no convolution absorbs (a BatchNorm1d on a tabular model's input), exported with torch's
defaults: the dynamo exporter's optimizer stores its unit weight and zero bias once with its unit running variance
and zero running mean, and BatchNormalization reads `bn.weight` as the variance and `bn.bias` as the mean.
Both are torch parameters again, each with torch's gradient (artifacts/torch_names.py)."""

from __future__ import annotations

import numpy as np
import pytest

from onnxtrain import artifacts
from onnxtrain.api import CheckpointState, Module
from tests.artifacts.test_torch_names import _export_with_defaults

torch = pytest.importorskip("torch")


def _tabular():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.BatchNorm1d(6), torch.nn.Linear(6, 5), torch.nn.ReLU(),
                               torch.nn.Linear(5, 3)).eval()


@pytest.mark.parametrize("requires_grad", [None, ["0.weight", "0.bias", "1.weight"]])
def test_a_fresh_batchnorms_parameters_train_apart_from_its_statistics(tmp_path, requires_grad):
    """Before, requires_grad=None left out 0.weight and 0.bias without a word (read as BatchNorm statistics), and
    naming them gave gradients that also ran through the variance and mean they stood for (off by half or more)."""
    model = _tabular()
    x = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    labels = np.array([0, 2, 1, 2], np.int64)
    exported = _export_with_defaults(model, (torch.from_numpy(x),), tmp_path / "tab.onnx", ["x"],
                                     {"x": {0: "batch"}, "logits": {0: "batch"}})
    bn = next(n for n in exported.graph.node if n.op_type == "BatchNormalization")
    assert len(set(bn.input[1:])) == 2, "the exporter no longer shares the tensors: this test checks nothing"
    artifacts.generate_artifacts(tmp_path / "tab.onnx", requires_grad=requires_grad,
                                 loss=artifacts.LossType.CrossEntropyLoss, optimizer=artifacts.OptimType.AdamW,
                                 artifact_directory=tmp_path / "arts")
    state = CheckpointState.load_checkpoint(tmp_path / "arts" / "checkpoint")
    module = Module(tmp_path / "arts" / "training_model.onnx", state)
    loss = module(x, labels)

    logits = model(torch.from_numpy(x))
    expected = torch.nn.functional.cross_entropy(logits, torch.from_numpy(labels))
    expected.backward()
    trained = {n: p for n, p in state.parameters if p.requires_grad}
    want = requires_grad or [n for n, _ in model.named_parameters()]
    assert sorted(trained) == sorted(want)
    assert float(loss) == pytest.approx(float(expected), rel=1e-6)
    for name, parameter in model.named_parameters():
        if name in trained:
            np.testing.assert_allclose(trained[name].grad, parameter.grad.numpy(), rtol=1e-4, atol=1e-6,
                                       err_msg=name)
