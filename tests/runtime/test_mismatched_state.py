"""State that does not fit the artifacts or the optimizer is refused with the name of what differs, and
arguments that would corrupt training (a rate past float32, a negative step) are refused when set."""

from __future__ import annotations

import numpy as np
import pytest

from onnxtrain.api import CheckpointState, CosineLRScheduler, LinearLRScheduler, Module, Optimizer, StepLRScheduler
from onnxtrain.artifacts import LossType, OptimType, generate_artifacts
from onnxtrain.blocks import SGD
from onnxtrain.checkpoint import load_checkpoint, save_checkpoint
from onnxtrain.errors import ArtifactError, CheckpointError
from tests import models


def _artifacts(folder, optimizer=OptimType.AdamW, hidden=16, **kwargs):
    generate_artifacts(models.mlp(hidden=hidden), loss=LossType.CrossEntropyLoss, optimizer=optimizer,
                       artifact_directory=folder, **kwargs)
    return folder


def _trained(folder, rng, steps=3):
    state = CheckpointState.load_checkpoint(folder / "checkpoint")
    module = Module(folder / "training_model.onnx", state)
    optimizer = Optimizer(folder / "optimizer_model.onnx", module)
    for _ in range(steps):
        module(rng.standard_normal((5, 8)).astype(np.float32), rng.integers(0, 4, 5))
        optimizer.step()
        module.lazy_reset_grad()
    return state


def test_another_optimizers_state_is_refused_not_dropped(tmp_path, rng):
    sgd = _artifacts(tmp_path / "sgd", SGD(momentum=0.9))
    adamw = _artifacts(tmp_path / "adamw")
    CheckpointState.save_checkpoint(_trained(sgd, rng), tmp_path / "sgd.ckpt", include_optimizer_state=True)
    state = CheckpointState.load_checkpoint(tmp_path / "sgd.ckpt")
    module = Module(adamw / "training_model.onnx", state)
    with pytest.raises(CheckpointError, match=r"optimizer state of 'fc1.weight' is \['momentum.*'exp_avg'.*"
                                              r"include_optimizer_state=False"):
        Optimizer(adamw / "optimizer_model.onnx", module)


def test_saved_optimizer_state_of_another_dtype_or_for_a_missing_parameter_is_refused(tmp_path, rng):
    folder = _artifacts(tmp_path)
    CheckpointState.save_checkpoint(_trained(folder, rng), tmp_path / "a.ckpt", include_optimizer_state=True)
    data = load_checkpoint(tmp_path / "a.ckpt")
    data.optimizer["fc2.bias"]["exp_avg"] = data.optimizer["fc2.bias"]["exp_avg"].astype(np.float64)
    save_checkpoint(data, tmp_path / "f64.ckpt")
    del data.optimizer["fc2.bias"]
    save_checkpoint(data, tmp_path / "partial.ckpt")
    for name, message in (("f64.ckpt", r"'exp_avg' of 'fc2.bias' is float64\[4\], expected float32\[4\]"),
                          ("partial.ckpt", r"optimizer state of 'fc2.bias' is \[\]")):
        module = Module(folder / "training_model.onnx", CheckpointState.load_checkpoint(tmp_path / name))
        with pytest.raises(CheckpointError, match=message):
            Optimizer(folder / "optimizer_model.onnx", module)


def test_the_resumed_optimizer_state_is_the_saved_one(tmp_path, rng):
    folder = _artifacts(tmp_path)
    state = _trained(folder, rng)
    CheckpointState.save_checkpoint(state, tmp_path / "a.ckpt", include_optimizer_state=True)
    resumed = CheckpointState.load_checkpoint(tmp_path / "a.ckpt")
    optimizer = Optimizer(folder / "optimizer_model.onnx", Module(folder / "training_model.onnx", resumed))
    saved = load_checkpoint(tmp_path / "a.ckpt").optimizer
    assert optimizer.state_names and all(np.abs(saved[p][s]).max() > 0 for p in saved for s in saved[p])
    again = tmp_path / "b.ckpt"
    CheckpointState.save_checkpoint(resumed, again, include_optimizer_state=True)
    for p, states in load_checkpoint(again).optimizer.items():
        for s, array in states.items():
            np.testing.assert_array_equal(array, saved[p][s])


def test_a_parameter_trainable_in_the_checkpoint_only_is_named(tmp_path):
    every = _artifacts(tmp_path / "all")
    part = _artifacts(tmp_path / "part", requires_grad=["fc1.weight", "fc1.bias", "fc2.weight"])
    state = CheckpointState.load_checkpoint(every / "checkpoint")
    with pytest.raises(CheckpointError, match=r"\['fc2.bias'\] trainable in the checkpoint, not in the training"):
        Module(part / "training_model.onnx", state)


def test_an_optimizer_model_of_other_shapes_names_the_parameter(tmp_path):
    small, large = _artifacts(tmp_path / "s"), _artifacts(tmp_path / "l", hidden=32)
    module = Module(small / "training_model.onnx", CheckpointState.load_checkpoint(small / "checkpoint"))
    with pytest.raises(ArtifactError, match=r"'fc1.weight' is \[32, 8\] in the optimizer, \[16, 8\] in the "):
        Optimizer(large / "optimizer_model.onnx", module)


def test_a_parameter_of_another_dtype_is_named(tmp_path):
    folder = _artifacts(tmp_path)
    data = load_checkpoint(folder / "checkpoint")
    data.trainable["fc2.bias"] = data.trainable["fc2.bias"].astype(np.float64)
    save_checkpoint(data, tmp_path / "f64.ckpt")
    with pytest.raises(CheckpointError, match="'fc2.bias' is float64, 3 others are float32"):
        CheckpointState.load_checkpoint(tmp_path / "f64.ckpt")


@pytest.mark.parametrize("value, error, message", [
    (-1, ValueError, "non-negative int64, got -1"), (2.7, TypeError, "an integer, got float 2.7"),
    ("abc", TypeError, "an integer, got str"), (True, TypeError, "an integer, got bool")])
def test_a_step_that_cannot_be_saved_is_refused_when_set(tmp_path, value, error, message):
    state = CheckpointState.load_checkpoint(_artifacts(tmp_path) / "checkpoint")
    with pytest.raises(error, match=message):
        state.step = value
    state.step = np.int64(7)
    assert state.step == 7


@pytest.mark.parametrize("make, error, message", [
    (lambda o: LinearLRScheduler(o, "5", 10, 0.1), TypeError, "warmup_step_count must be an integer, got str"),
    (lambda o: LinearLRScheduler(o, 0, 10, -1.0), ValueError, "initial_lr must be a finite non-negative number"),
    (lambda o: CosineLRScheduler(o, 10, 0.1, min_lr="x"), TypeError, "min_lr must be a number, got str"),
    (lambda o: StepLRScheduler(o, 1, 0.1, gamma=-2.0), ValueError, "gamma must be a finite positive number"),
    (lambda o: StepLRScheduler(o, 0, 0.1), ValueError, "step_size must be at least 1"),
])
def test_scheduler_arguments_are_checked(tmp_path, make, error, message):
    folder = _artifacts(tmp_path)
    module = Module(folder / "training_model.onnx", CheckpointState.load_checkpoint(folder / "checkpoint"))
    with pytest.raises(error, match=message):
        make(Optimizer(folder / "optimizer_model.onnx", module))


def test_a_growing_step_scheduler_stops_at_the_float32_limit(tmp_path):
    folder = _artifacts(tmp_path)
    module = Module(folder / "training_model.onnx", CheckpointState.load_checkpoint(folder / "checkpoint"))
    optimizer = Optimizer(folder / "optimizer_model.onnx", module)
    scheduler = StepLRScheduler(optimizer, 1, 0.1, gamma=1e300)
    with pytest.raises(ValueError, match="must be finite in float32"):
        scheduler.step()
    assert optimizer.get_learning_rate() == pytest.approx(0.1)


def test_saving_a_checkpoint_copies_no_array(tmp_path):
    """A state of several GB cannot be held twice: the save writes views of the live arrays."""
    import tracemalloc

    generate_artifacts(models.mlp(features=2048, hidden=2048), loss=LossType.CrossEntropyLoss,
                       optimizer=OptimType.AdamW, artifact_directory=tmp_path)   # a 16 MB weight
    state = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    tracemalloc.start()
    try:
        CheckpointState.save_checkpoint(state, tmp_path / "saved", include_optimizer_state=True)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 10 << 20, peak   # the checksum joins small arrays in batches of up to 8 MB; nothing else
    np.testing.assert_array_equal(load_checkpoint(tmp_path / "saved").trainable["fc1.weight"],
                                  state.parameters["fc1.weight"].data)
