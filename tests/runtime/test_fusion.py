"""The fused train+optimizer step (runtime/fusion.py) gives the same training as the two separate graphs,
and falls back to the optimizer graph whenever the update it prepared would be stale."""

from __future__ import annotations

import logging
import warnings

import numpy as np
import onnx
import pytest

from onnxtrain import blocks
from onnxtrain.api import CheckpointState, Module, Optimizer
from onnxtrain.artifacts import LossType, generate_artifacts
from onnxtrain.conventions import TrainingMeta
from onnxtrain.runtime.passes import FusedNames, FuseOptimizer
from tests import models

OPTIMIZERS = {"adamw": lambda: blocks.AdamW(weight_decay=0.01, max_norm=1.0),
              "sgd_momentum": lambda: blocks.SGD(momentum=0.9, nesterov=True)}


def _generate(folder, model, optimizer):
    generate_artifacts(model, loss=LossType.CrossEntropyLoss, optimizer=OPTIMIZERS[optimizer](),
                       artifact_directory=folder)
    return folder


def _setup(folder, fuse: bool, device="cpu"):
    state = CheckpointState.load_checkpoint(folder / "checkpoint")
    module = Module(folder / "training_model.onnx", state, device=device)
    optimizer = Optimizer(folder / "optimizer_model.onnx", module)
    module.training_run.fuse = fuse
    runs = []  # runs of the optimizer graph on its own
    update = module.training_run.update_graph
    original = update.run
    update.run = lambda: runs.append(1) or original()
    return state, module, optimizer, runs


def _batches(model_name, rng, n):
    shape = (5, 8) if model_name == "mlp" else (5, 2, 6, 6)
    return [(rng.standard_normal(shape).astype(np.float32), rng.integers(0, 3, 5).astype(np.int64))
            for _ in range(n)]


def _snapshot(state):
    buffers = {f"buffer:{n}": v.copy() for n, v in state.buffers.items()}
    return {n: p.data for n, p in state.parameters.items()} | buffers


def _assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-6, atol=1e-7, err_msg=k)


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("model_name", ["mlp", "conv_bn"])
@pytest.mark.parametrize("device", ["cpu", "reference"])
def test_fused_step_trains_like_the_separate_graphs(tmp_path, rng, optimizer, model_name, device):
    folder = _generate(tmp_path, getattr(models, model_name)(), optimizer)
    data = _batches(model_name, rng, 4 if device == "reference" else 6)
    results = {}
    for fuse in (True, False):
        state, module, opt, runs = _setup(folder, fuse, device)
        losses = []
        for x, y in data:
            losses.append(float(module(x, y)))
            opt.step()
            module.lazy_reset_grad()
        results[fuse] = (losses, _snapshot(state), {n: p.grad for n, p in state.parameters.items()}, state.step)
        # fused: the optimizer graph never runs on its own (the first call is already fused)
        assert len(runs) == (0 if fuse else len(data))
    np.testing.assert_allclose(results[True][0], results[False][0], rtol=1e-6)
    _assert_same(results[True][1], results[False][1])
    _assert_same(results[True][2], results[False][2])
    assert results[True][3] == results[False][3] == len(data)
    initial = _snapshot(CheckpointState.load_checkpoint(folder / "checkpoint"))
    assert all(not np.allclose(results[True][1][n], initial[n]) for n in initial if not n.startswith("buffer:"))


def _interfere(what, module, optimizer, state):
    if what == "learning_rate":
        optimizer.set_learning_rate(0.5)
    elif what == "parameter":
        name = state.parameters.keys()[0]
        state.parameters[name] = np.full_like(state.parameters[name].data, 0.25)
    elif what == "contiguous_parameters":
        module.copy_buffer_to_parameters(np.asarray(module.get_contiguous_parameters(True).numpy()) * 0.5)
    elif what == "step":
        state.step += 10


@pytest.mark.parametrize("what", ["learning_rate", "parameter", "contiguous_parameters", "step"])
def test_a_change_between_call_and_step_is_not_lost(tmp_path, rng, what):
    """Whatever changes between module(...) and optimizer.step() is seen by the step, fused or not."""
    folder = _generate(tmp_path, models.mlp(classes=3), "adamw")
    data = _batches("mlp", rng, 3)
    results = {}
    for fuse in (True, False):
        state, module, opt, runs = _setup(folder, fuse)
        for i, (x, y) in enumerate(data):
            module(x, y)
            if i == 1:
                _interfere(what, module, opt, state)
            opt.step()
            module.lazy_reset_grad()
        results[fuse] = _snapshot(state)
        if fuse:
            assert len(runs) == 1  # only the step after the change ran the optimizer graph
    _assert_same(results[True], results[False])


def test_gradient_accumulation_stops_fusing_and_matches(tmp_path, rng):
    folder = _generate(tmp_path, models.mlp(classes=3), "adamw")
    data = _batches("mlp", rng, 8)
    results = {}
    for fuse in (True, False):
        state, module, opt, runs = _setup(folder, fuse)
        for i in range(0, len(data), 2):  # two calls per optimizer step
            for x, y in data[i:i + 2]:
                module(x, y)
            opt.step()
            module.lazy_reset_grad()
        results[fuse] = _snapshot(state)
        assert len(runs) == 4  # every step ran the optimizer graph: the first fused update was thrown away
    _assert_same(results[True], results[False])


def test_nonfinite_gradients_skip_the_fused_update(tmp_path, rng):
    folder = _generate(tmp_path, models.mlp(classes=3), "adamw")
    state, module, opt, runs = _setup(folder, True)
    x, y = _batches("mlp", rng, 1)[0]
    module(x, y)
    opt.step()
    module.lazy_reset_grad()
    before = _snapshot(state)
    x[0, 0] = np.inf
    with pytest.warns(RuntimeWarning):
        module(x, y)
        opt.step()
    _assert_same(_snapshot(state), before)
    assert opt.skipped_steps == 1 and state.step == 1 and not runs


def test_fused_graph_is_plain_onnx(tmp_path):
    folder = _generate(tmp_path, models.conv_bn(), "adamw")
    train = onnx.load(folder / "training_model.onnx")
    meta = TrainingMeta.from_model(train)
    result = FuseOptimizer(onnx.load(folder / "optimizer_model.onnx"), meta.trainable)(train)
    fused, fused_names = result.model, FusedNames.of_fused(result.model)
    assert result.modified
    onnx.checker.check_model(fused, full_check=True)
    outputs = {o.name for o in fused.graph.output}
    assert fused_names("params.out") in outputs and fused_names("gradients") in outputs
    assert not any(o.endswith("_grad.accumulation.out") for o in outputs)
    assert {o.domain for o in fused.opset_import} <= {"", "ai.onnx"}


def test_nothing_trainable_runs_without_fusing_or_warnings(tmp_path, caplog):
    """Every parameter frozen (requires_grad=[]): no gradient to accumulate or to fuse with the update; the
    runtime used to warn that the model was 'generated by an older onnxtrain' and that onnxruntime refused the
    fused graph (a Concat of no gradients)."""
    generate_artifacts(models.mlp(), requires_grad=[], frozen_params=["fc1.weight", "fc1.bias", "fc2.weight",
                                                                     "fc2.bias"],
                       loss=LossType.CrossEntropyLoss, optimizer=blocks.AdamW(), artifact_directory=tmp_path)
    caplog.clear()  # generate_artifacts warns that nothing trains (tests/artifacts/test_generate.py)
    state = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    module = Module(tmp_path / "training_model.onnx", state)
    optimizer = Optimizer(tmp_path / "optimizer_model.onnx", module)
    x, y = np.ones((3, 8), np.float32), np.array([0, 1, 2])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        losses = []
        for _ in range(2):
            losses.append(float(module(x, y)))
            optimizer.step()
            module.lazy_reset_grad()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert losses[0] == losses[1]  # nothing trains
