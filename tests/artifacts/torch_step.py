"""One training call of generated artifacts against torch autograd on the same weights and batch."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from onnxtrain.api import CheckpointState, Module


def assert_step_matches_torch(model, directory: Path, x: np.ndarray, labels: np.ndarray,
                              torch_loss: Callable) -> None:
    """The loss and every parameter's gradient of one call of the artifacts in ``directory`` equal torch's for
    ``model`` (float32 tolerances)."""
    import torch

    state = CheckpointState.load_checkpoint(directory / "checkpoint")
    loss = float(Module(directory / "training_model.onnx", state)(x, labels))
    model.zero_grad()
    expected = torch_loss(model(torch.from_numpy(x)), torch.from_numpy(labels))
    expected.backward()
    assert loss == pytest.approx(expected.item(), rel=1e-5)
    for name, p in model.named_parameters():
        np.testing.assert_allclose(state.parameters[name].grad, p.grad.numpy(), rtol=1e-4, atol=1e-6, err_msg=name)
