"""Argument forms of the peer's Module that published scripts use: ``device="cpu:0"`` (the peer splits the device
at ":" into a type and an id) and the private ``module._state`` (the CheckpointState, which scripts save or edit)."""

from __future__ import annotations

import numpy as np
import pytest

from onnxtrain.api import CheckpointState, Module
from onnxtrain.artifacts import LossType, OptimType, generate_artifacts
from tests import models


@pytest.fixture
def folder(tmp_path):
    generate_artifacts(models.mlp(), loss=LossType.CrossEntropyLoss, optimizer=OptimType.AdamW,
                       artifact_directory=tmp_path)
    return tmp_path


def test_cpu_with_a_device_id_is_the_cpu(folder, rng):
    x, y = rng.standard_normal((5, 8)).astype(np.float32), rng.integers(0, 4, 5).astype(np.int64)
    losses = []
    for device in ("cpu", "cpu:0"):
        state = CheckpointState.load_checkpoint(folder / "checkpoint")
        losses.append(Module(folder / "training_model.onnx", state, folder / "eval_model.onnx", device)(x, y))
    assert losses[0] == losses[1]
    with pytest.raises(ValueError, match="unknown device 'cpu:x'"):
        Module(folder / "training_model.onnx", state, device="cpu:x")


def test_the_module_keeps_its_state_as_the_peers_does(folder, tmp_path):
    state = CheckpointState.load_checkpoint(folder / "checkpoint")
    module = Module(folder / "training_model.onnx", state)
    assert module._state is state
    module._state.parameters["fc1.bias"] = np.ones(16, np.float32)
    CheckpointState.save_checkpoint(module._state, tmp_path / "saved")
    np.testing.assert_array_equal(CheckpointState.load_checkpoint(tmp_path / "saved").parameters["fc1.bias"].data, 1)
