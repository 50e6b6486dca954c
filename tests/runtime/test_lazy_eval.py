"""The eval session opens on first evaluation (a training loop that never evaluates does not hold one), and a
damaged eval model still fails when the Module is built."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from onnxtrain.api import CheckpointState, Module, Optimizer
from onnxtrain.artifacts import LossType, OptimType, generate_artifacts
from onnxtrain.errors import ArtifactError
from onnxtrain.runtime import run
from tests import models


@pytest.fixture
def mlp_dir(tmp_path):
    generate_artifacts(models.mlp(), loss=LossType.CrossEntropyLoss, optimizer=OptimType.AdamW,
                       artifact_directory=tmp_path)
    return tmp_path


def test_the_eval_session_opens_at_the_first_evaluation_only(mlp_dir, monkeypatch):
    opened: list[str] = []
    open_session = run.open_artifact_session
    monkeypatch.setattr(run, "open_artifact_session", lambda model, what, *a: opened.append(what) or
                        open_session(model, what, *a))
    state = CheckpointState.load_checkpoint(mlp_dir / "checkpoint")
    module = Module(mlp_dir / "training_model.onnx", state, mlp_dir / "eval_model.onnx")
    optimizer = Optimizer(mlp_dir / "optimizer_model.onnx", module)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((5, 8)).astype(np.float32), rng.integers(0, 4, 5).astype(np.int64)
    for _ in range(2):
        module(x, y)
        optimizer.step()
        module.lazy_reset_grad()
    assert "eval model" not in opened
    assert module.eval().input_names() == ["input", "labels"] and module.output_names()[0] == "loss"
    first = module(x, y)
    second = module(x, y)
    assert opened.count("eval model") == 1
    np.testing.assert_array_equal(first, second)


def test_a_damaged_eval_model_fails_when_the_module_is_built(mlp_dir):
    model = onnx.load(mlp_dir / "eval_model.onnx")
    model.graph.node[0].input[0] = "not_a_value"
    onnx.save(model, mlp_dir / "eval_model.onnx")
    state = CheckpointState.load_checkpoint(mlp_dir / "checkpoint")
    with pytest.raises(ArtifactError, match="the eval model is not a valid ONNX model: .*not_a_value"):
        Module(mlp_dir / "training_model.onnx", state, mlp_dir / "eval_model.onnx")
