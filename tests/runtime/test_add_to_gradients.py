"""Module.add_to_gradients: a gradient computed outside the training graph joins the accumulated one before the
optimizer step, whether the training call computed the update in advance (fused) or not."""

from __future__ import annotations

import numpy as np
import pytest

from onnxtrain.api import CheckpointState, Module, Optimizer
from onnxtrain.artifacts import LossType, OptimType, generate_artifacts
from tests import models


@pytest.fixture(scope="module")
def sgd_dir(tmp_path_factory):
    """Plain SGD (no momentum): a step is ``w - lr * gradient``."""
    folder = tmp_path_factory.mktemp("sgd")
    generate_artifacts(models.mlp(), loss=LossType.CrossEntropyLoss, optimizer=OptimType.SGD,
                       artifact_directory=folder)
    return folder


def _open(folder, fuse: bool = True):
    state = CheckpointState.load_checkpoint(folder / "checkpoint")
    module = Module(folder / "training_model.onnx", state, folder / "eval_model.onnx")
    module.training_run.fuse = fuse
    optimizer = Optimizer(folder / "optimizer_model.onnx", module)
    optimizer.set_learning_rate(0.5)
    return state, module, optimizer


def _flat(module) -> np.ndarray:
    return module.get_contiguous_parameters(trainable_only=True).numpy()


def _flat_grads(state) -> np.ndarray:
    return np.concatenate([p.grad.ravel() for p in state.parameters.values() if p.requires_grad])


@pytest.mark.parametrize("fuse", [True, False])
def test_the_step_follows_the_gradient_plus_the_added_array(sgd_dir, rng, fuse):
    state, module, optimizer = _open(sgd_dir, fuse)
    x, y = rng.standard_normal((6, 8)).astype(np.float32), rng.integers(0, 4, 6).astype(np.int64)
    extra = rng.standard_normal(module.get_parameters_size()).astype(np.float32)
    for _ in range(2):   # the second step starts from a reset: the first addition is not carried over
        before = _flat(module)
        module(x, y)
        grad = _flat_grads(state)
        module.add_to_gradients(extra)
        np.testing.assert_array_equal(_flat_grads(state), grad + extra)
        optimizer.step()
        module.lazy_reset_grad()
        np.testing.assert_allclose(_flat(module), before - 0.5 * (grad + extra), rtol=1e-6, atol=1e-6)
    assert state.step == 2


def test_an_ortvalue_is_added_too(sgd_dir, rng):
    import onnxruntime as ort

    state, module, _ = _open(sgd_dir)
    module(rng.standard_normal((3, 8)).astype(np.float32), np.array([0, 1, 2], np.int64))
    grad = _flat_grads(state)
    ones = np.ones(module.get_parameters_size(), np.float32)
    module.add_to_gradients(ort.OrtValue.ortvalue_from_numpy(ones))
    np.testing.assert_array_equal(_flat_grads(state), grad + 1)


def test_bad_arrays_are_refused_by_what_is_expected(sgd_dir):
    state, module, _ = _open(sgd_dir)
    n = module.get_parameters_size()
    before = _flat_grads(state)
    with pytest.raises(ValueError, match=rf"add_to_gradients expects a flat array of {n} elements .* got shape "
                                         rf"\[{n - 1}\]"):
        module.add_to_gradients(np.zeros(n - 1, np.float32))
    with pytest.raises(ValueError, match=rf"got shape \[1, {n}\]"):
        module.add_to_gradients(np.zeros((1, n), np.float32))
    with pytest.raises(TypeError, match=r"add_to_gradients expects dtype float32 .*got float64; cast it with "
                                        r"\.astype\('float32'\)"):
        module.add_to_gradients(np.zeros(n))
    np.testing.assert_array_equal(_flat_grads(state), before)   # nothing was added


def test_an_addition_the_next_training_call_would_overwrite_is_refused(sgd_dir, rng):
    state, module, optimizer = _open(sgd_dir)
    x, y = rng.standard_normal((3, 8)).astype(np.float32), np.array([0, 1, 2], np.int64)
    ones = np.ones(module.get_parameters_size(), np.float32)
    with pytest.raises(RuntimeError, match=r"after lazy_reset_grad\(\) and before the training call"):
        module.add_to_gradients(ones)   # a fresh module: its first training call starts from zero
    module(x, y)
    optimizer.step()
    module.lazy_reset_grad()
    with pytest.raises(RuntimeError, match="the addition would be lost"):
        module.add_to_gradients(ones)
    module(x, y)
    grad = _flat_grads(state)
    module.add_to_gradients(ones)
    np.testing.assert_array_equal(_flat_grads(state), grad + 1)
