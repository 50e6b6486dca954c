"""The runtime's passes (runtime/passes/): the reset specialisation reads the accumulation the artifact lists,
both passes keep their postconditions, a model they cannot rewrite is a PassError, and the runtime's fallback
for it is logged and still trains."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from onnxtrain import blocks, conventions
from onnxtrain.api import CheckpointState, Module, Optimizer
from onnxtrain.artifacts import LossType, generate_artifacts
from onnxtrain.conventions import TrainingMeta
from onnxtrain.errors import PassError
from onnxtrain.runtime.passes import FuseOptimizer, SpecializeReset
from tests import models


@pytest.fixture
def folder(tmp_path):
    generate_artifacts(models.conv_bn(), loss=LossType.CrossEntropyLoss, optimizer=blocks.AdamW(),
                       artifact_directory=tmp_path)
    return tmp_path


def _feeds(model, rng, reset):
    feeds = {}
    for vi in model.graph.input:
        if vi.name == conventions.LAZY_RESET_GRAD:
            feeds[vi.name] = np.array(reset)
            continue
        dims = [d.dim_value or 5 for d in vi.type.tensor_type.shape.dim]
        if vi.type.tensor_type.elem_type == onnx.TensorProto.INT64:
            feeds[vi.name] = rng.integers(0, 3, dims).astype(np.int64)
        else:
            feeds[vi.name] = rng.standard_normal(dims).astype(np.float32)
    return feeds


def _run(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    used = {i.name for i in session.get_inputs()}
    return dict(zip(names, session.run(names, {k: v for k, v in feeds.items() if k in used})))


@pytest.mark.parametrize("reset", [True, False])
def test_specialised_graph_computes_what_the_flag_selects(folder, rng, reset):
    train = onnx.load(folder / "training_model.onnx")
    meta = TrainingMeta.from_model(train)
    assert list(meta.accumulation) == meta.trainable
    result = SpecializeReset(meta.accumulation, reset)(train)
    assert result.modified
    graph_inputs = {i.name for i in result.model.graph.input}
    assert conventions.LAZY_RESET_GRAD not in graph_inputs
    assert not any(n.op_type == "Where" and n.input[0] == conventions.LAZY_RESET_GRAD for n in result.model.graph.node)
    assert (conventions.grad_buffer_name(meta.trainable[0]) in graph_inputs) is not reset
    feeds = _feeds(train, rng, reset)
    expected, got = _run(train, feeds), _run(result.model, feeds)
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-6, atol=1e-7, err_msg=name)


def test_specialising_without_or_against_the_metadata_is_a_pass_error(folder):
    train = onnx.load(folder / "training_model.onnx")
    meta = TrainingMeta.from_model(train)
    with pytest.raises(PassError, match="older onnxtrain"):
        SpecializeReset({}, True)(train)
    param, (fresh, accumulated) = next(iter(meta.accumulation.items()))
    with pytest.raises(PassError, match="as its metadata says"):
        SpecializeReset({param: (accumulated + "_elsewhere", accumulated)}, True)(train)


def test_fusing_graphs_that_do_not_fit_is_a_pass_error(folder):
    train = onnx.load(folder / "training_model.onnx")
    optimizer = onnx.load(folder / "optimizer_model.onnx")
    fuse = FuseOptimizer(optimizer, ["not_a_parameter"])
    with pytest.raises(PassError, match="no gradient outputs"):
        fuse(train)


def _train(model, folder, steps=3):
    state = CheckpointState.load_checkpoint(folder / "checkpoint")
    module = Module(model, state)
    optimizer = Optimizer(folder / "optimizer_model.onnx", module)
    rng = np.random.default_rng(0)
    losses = []
    for _ in range(steps):
        x, y = rng.standard_normal((5, 2, 6, 6)).astype(np.float32), rng.integers(0, 3, 5)
        losses.append(float(module(x, y)))
        optimizer.step()
        module.lazy_reset_grad()
    return losses


def test_artifacts_without_the_accumulation_list_still_train_and_say_why(folder, caplog):
    train = onnx.load(folder / "training_model.onnx")
    meta = TrainingMeta.from_model(train)
    for prop in train.metadata_props:
        if prop.key == conventions.TRAINING_META:
            old = TrainingMeta(**{**meta.__dict__, "accumulation": {}})
            prop.value = old.to_props()[conventions.TRAINING_META]
    with caplog.at_level(logging.WARNING, logger="onnxtrain.runtime.run"):
        old_losses = _train(train, folder)
    assert "older onnxtrain" in caplog.text
    np.testing.assert_allclose(old_losses, _train(folder / "training_model.onnx", folder), rtol=1e-6)
