"""Exact resume across processes, and learning-rate schedulers."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from onnxtrain import blocks
from onnxtrain.api import (
    CheckpointState,
    CosineLRScheduler,
    LinearLRScheduler,
    Module,
    Optimizer,
    StepLRScheduler,
)
from onnxtrain.artifacts import LossType, OptimType, generate_artifacts
from tests import models

TRAIN = textwrap.dedent("""
    import sys
    import numpy as np
    from onnxtrain.api import CheckpointState, Module, Optimizer
    folder, start, steps, save_to = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    state = CheckpointState.load_checkpoint(start)
    module = Module(f"{folder}/training_model.onnx", state)
    opt = Optimizer(f"{folder}/optimizer_model.onnx", module)
    opt.set_learning_rate(0.01)
    rng = np.random.default_rng(state.step)  # the data stream continues where it stopped
    for _ in range(steps):
        x = rng.standard_normal((6, 2, 6, 6)).astype(np.float32)
        y = rng.integers(0, 3, 6).astype(np.int64)
        module(x, y)
        opt.step()
        module.lazy_reset_grad()
        rng = np.random.default_rng(state.step)
    CheckpointState.save_checkpoint(state, save_to, include_optimizer_state=True)
""")


@pytest.mark.parametrize("optimizer", [OptimType.AdamW, blocks.SGD(momentum=0.9)])
def test_resume_in_a_fresh_process_is_bit_exact(optimizer, tmp_path):
    generate_artifacts(models.conv_bn(), loss=LossType.CrossEntropyLoss, optimizer=optimizer,
                       artifact_directory=tmp_path)
    script = tmp_path / "train.py"
    script.write_text(TRAIN)

    def run(start, steps, out):
        subprocess.run([sys.executable, str(script), str(tmp_path), str(start), str(steps), str(out)], check=True)

    run(tmp_path / "checkpoint", 6, tmp_path / "straight")
    run(tmp_path / "checkpoint", 3, tmp_path / "half")
    run(tmp_path / "half", 3, tmp_path / "resumed")
    straight = CheckpointState.load_checkpoint(tmp_path / "straight").to_data()
    resumed = CheckpointState.load_checkpoint(tmp_path / "resumed").to_data()
    assert straight.step == resumed.step == 6
    for kind in ("trainable", "buffers"):
        for name, value in getattr(straight, kind).items():
            np.testing.assert_array_equal(getattr(resumed, kind)[name], value, err_msg=name)
    for name, states in straight.optimizer.items():
        for s, value in states.items():
            np.testing.assert_array_equal(resumed.optimizer[name][s], value, err_msg=f"{name}/{s}")
    initial = CheckpointState.load_checkpoint(tmp_path / "checkpoint").to_data()
    assert not np.array_equal(initial.trainable["conv.weight"], straight.trainable["conv.weight"])


def test_resume_without_optimizer_state_starts_a_fresh_optimizer(tmp_path):
    """A checkpoint saved without the optimizer state holds no moments, so the optimizer restarts: step 0, and the
    first AdamW update after loading is a first step's, about lr * sign(g) (with the moments empty and the step
    kept, the bias correction of step 4 made it 0.58 times that), as with the peer and torch."""
    generate_artifacts(models.mlp(), loss=LossType.CrossEntropyLoss, optimizer=blocks.AdamW(weight_decay=0.0),
                       artifact_directory=tmp_path)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((16, 8)).astype(np.float32), rng.integers(0, 4, 16).astype(np.int64)
    state = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    module = Module(tmp_path / "training_model.onnx", state)
    opt = Optimizer(tmp_path / "optimizer_model.onnx", module)
    for _ in range(3):
        module(x, y)
        opt.step()
        module.lazy_reset_grad()
    CheckpointState.save_checkpoint(state, tmp_path / "weights_only")
    assert state.step == 3  # saving does not change the live state

    resumed = CheckpointState.load_checkpoint(tmp_path / "weights_only")
    assert resumed.step == 0
    module = Module(tmp_path / "training_model.onnx", resumed)
    opt = Optimizer(tmp_path / "optimizer_model.onnx", module)
    lr = 1e-3
    opt.set_learning_rate(lr)
    before = resumed.parameters["fc1.weight"].data
    module(x, y)
    grad = resumed.parameters["fc1.weight"].grad
    opt.step()
    step = resumed.parameters["fc1.weight"].data - before
    # step 1 of AdamW ("hf": epsilon outside the bias correction): lr * g / (|g| + eps / sqrt(1 - beta2))
    first = -lr * grad / (np.abs(grad) + 1e-6 / np.sqrt(1 - 0.999))
    np.testing.assert_allclose(step, first, rtol=1e-3, atol=1e-8)
    assert np.abs(step).max() > 0.5 * lr
    assert resumed.step == 1


@pytest.fixture
def optimizer(tmp_path):
    generate_artifacts(models.mlp(), loss=LossType.CrossEntropyLoss, optimizer=OptimType.SGD,
                       artifact_directory=tmp_path)
    state = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    return Optimizer(tmp_path / "optimizer_model.onnx", Module(tmp_path / "training_model.onnx", state))


def lrs(scheduler, optimizer, n):
    out = [optimizer.get_learning_rate()]
    for _ in range(n):
        scheduler.step()
        out.append(optimizer.get_learning_rate())
    return np.array(out)


def test_linear_scheduler_warms_up_then_decays(optimizer):
    """The documented semantics: warm-up over warmup_step_count steps, zero at total_step_count."""
    got = lrs(LinearLRScheduler(optimizer, warmup_step_count=2, total_step_count=6, initial_lr=1.0), optimizer, 7)
    np.testing.assert_allclose(got, [0, 0.5, 1.0, 0.75, 0.5, 0.25, 0, 0], atol=1e-7)


def test_cosine_and_step_schedulers(optimizer):
    got = lrs(CosineLRScheduler(optimizer, total_step_count=4, initial_lr=1.0, min_lr=0.1), optimizer, 4)
    np.testing.assert_allclose(got, 0.1 + 0.45 * (1 + np.cos(np.pi * np.arange(5) / 4)), rtol=1e-6)
    got = lrs(StepLRScheduler(optimizer, step_size=2, initial_lr=1.0, gamma=0.5), optimizer, 5)
    np.testing.assert_allclose(got, [1, 1, 0.5, 0.5, 0.25, 0.25])


def test_scheduler_arguments_are_checked(optimizer):
    with pytest.raises(ValueError, match="warmup_step_count <= total_step_count"):
        LinearLRScheduler(optimizer, warmup_step_count=10, total_step_count=5, initial_lr=1.0)
    with pytest.raises(TypeError, match="onnxtrain Optimizer"):
        LinearLRScheduler(object(), 1, 5, 1.0)
