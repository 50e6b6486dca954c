"""CheckpointState.load_checkpoint / save_checkpoint with the path forms of the peer's binding: a bytes path
works; a checkpoint's content given as bytes is a TypeError saying what to pass (it failed with re.error)."""

from __future__ import annotations

import numpy as np
import pytest

from onnxtrain.api import CheckpointState
from onnxtrain.artifacts import LossType, OptimType, generate_artifacts
from tests import models


def test_bytes_paths_and_checkpoint_content(tmp_path):
    generate_artifacts(models.mlp(), loss=LossType.CrossEntropyLoss, optimizer=OptimType.AdamW,
                       artifact_directory=tmp_path)
    state = CheckpointState.load_checkpoint(bytes(tmp_path / "checkpoint"))
    CheckpointState.save_checkpoint(state, bytes(tmp_path / "copy"))
    np.testing.assert_array_equal(CheckpointState.load_checkpoint(tmp_path / "copy").parameters["fc1.weight"].data,
                                  state.parameters["fc1.weight"].data)
    content = (tmp_path / "checkpoint").read_bytes()
    with pytest.raises(TypeError, match=r"load_checkpoint takes the checkpoint's path, got \d+ bytes"):
        CheckpointState.load_checkpoint(content)
