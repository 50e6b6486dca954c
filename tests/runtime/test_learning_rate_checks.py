"""A learning rate past float32 is refused with onnxtrain's error alone, not after a numpy warning."""

from __future__ import annotations

import warnings

import pytest

from onnxtrain.api import CheckpointState, Module, Optimizer
from onnxtrain.artifacts import LossType, OptimType, generate_artifacts
from tests import models


@pytest.mark.parametrize("bad", [1e39, -1e39, 3.5e38])
def test_a_rate_past_float32_raises_without_a_numpy_overflow_warning(tmp_path, bad):
    """The check compared the Python float with np.float32's maximum, so numpy cast the rate to float32 first and
    printed `RuntimeWarning: overflow encountered in cast` before the ValueError."""
    generate_artifacts(models.mlp(), loss=LossType.CrossEntropyLoss, optimizer=OptimType.AdamW,
                       artifact_directory=tmp_path)
    state = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    optimizer = Optimizer(tmp_path / "optimizer_model.onnx", Module(tmp_path / "training_model.onnx", state))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="must be finite in float32"):
            optimizer.set_learning_rate(bad)
    assert optimizer.get_learning_rate() > 0  # unchanged
