"""Sessions open on first use: the eval session at the first evaluation (a training loop that never evaluates
does not hold one), the training session only if the loop runs it (with an optimizer it runs the training graph
fused with the optimizer's). A damaged model still fails when the Module is built, and one that only
onnxruntime rejects fails at the first step with onnxtrain's error."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import helper

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
    assert opened == ["training model fused with the optimizer"]  # no training session the loop never runs
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


def test_a_damaged_training_model_fails_when_the_module_is_built(mlp_dir):
    model = onnx.load(mlp_dir / "training_model.onnx")
    model.graph.node[0].input[0] = "not_a_value"
    onnx.save(model, mlp_dir / "training_model.onnx")
    state = CheckpointState.load_checkpoint(mlp_dir / "checkpoint")
    with pytest.raises(ArtifactError, match="the training model is not a valid ONNX model: .*not_a_value"):
        Module(mlp_dir / "training_model.onnx", state, mlp_dir / "eval_model.onnx")


def test_a_training_model_only_onnxruntime_rejects_fails_at_the_first_step(mlp_dir):
    model = onnx.load(mlp_dir / "training_model.onnx")
    first = model.graph.node[0]
    # the checker does not infer types; onnxruntime refuses a MatMul of a double and a float
    model.graph.node.insert(0, helper.make_node("Cast", [first.input[0]], ["input_as_double"],
                                                to=onnx.TensorProto.DOUBLE))
    first.input[0] = "input_as_double"
    onnx.save(model, mlp_dir / "training_model.onnx")
    state = CheckpointState.load_checkpoint(mlp_dir / "checkpoint")
    module = Module(mlp_dir / "training_model.onnx", state, mlp_dir / "eval_model.onnx")
    Optimizer(mlp_dir / "optimizer_model.onnx", module)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((5, 8)).astype(np.float32), rng.integers(0, 4, 5).astype(np.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the training model's own error, not a warning about fusing
        with pytest.raises(ArtifactError, match="the training model cannot be loaded"):
            module(x, y)


def test_a_training_loop_runs_no_onnx_checker(mlp_dir, monkeypatch):
    """The checker's operator schemas cost 7.5 MB of resident memory on first use; onnxruntime checks the model."""
    def refuse(*args, **kwargs):
        raise AssertionError("the runtime ran the ONNX checker")

    monkeypatch.setattr(onnx.checker, "check_model", refuse)
    state = CheckpointState.load_checkpoint(mlp_dir / "checkpoint")
    module = Module(mlp_dir / "training_model.onnx", state, mlp_dir / "eval_model.onnx")
    optimizer = Optimizer(mlp_dir / "optimizer_model.onnx", module)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((5, 8)).astype(np.float32), rng.integers(0, 4, 5).astype(np.int64)
    for _ in range(2):
        module(x, y)
        optimizer.step()
        module.lazy_reset_grad()
    module.eval()
    module(x, y)
