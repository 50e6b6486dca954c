"""Hyper-parameters passed to generate_artifacts as keywords it does not have (``optimizer_config={...}``, as some
apps do): a TypeError as onnxruntime-training 1.19.2's (its generate_artifacts has no such keyword nor
``**extra_options``), that says where they go in onnxtrain: the learning rate to the Optimizer at training time,
the others to the optimizer block, with the call the given values make."""

from __future__ import annotations

import inspect
import re

import numpy as np
import pytest

from onnxtrain import blocks
from onnxtrain.api import CheckpointState, Module, Optimizer
from onnxtrain.artifacts import LossType, OptimType, generate_artifacts
from tests import models

WHERE = ("generate_artifacts takes no hyper-parameters (nor does onnxruntime-training's): set the learning rate at "
         "training time with onnxtrain.api.Optimizer.set_learning_rate(lr) or an LR scheduler "
         "(onnxtrain.api.LinearLRScheduler, CosineLRScheduler, StepLRScheduler), and pass the others to the "
         "optimizer block: optimizer=onnxtrain.blocks.AdamW(betas=..., eps=..., weight_decay=...), Adam(betas=..., "
         "eps=..., weight_decay=...) or SGD(momentum=..., nesterov=..., weight_decay=...)")


def _message(keyword: str, here: str | None) -> str:
    text = f"generate_artifacts() got an unexpected keyword argument '{keyword}'; {WHERE}"
    return "^" + re.escape(text + (f"; here: {here}" if here else "")) + "$"


@pytest.mark.parametrize("optimizer, keywords, keyword, here", [
    # the eye-tracking app's call (tests/api_compat/test_eye_tracking_optimizer_config.py)
    (OptimType.AdamW, dict(optimizer_config={"lr": 1e-4, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 1e-4}),
     "optimizer_config", "optimizer=onnxtrain.blocks.AdamW(betas=(0.9, 0.999), eps=1e-08, weight_decay=0.0001), "
                         "then Optimizer.set_learning_rate(0.0001)"),
    (OptimType.SGD, dict(optimizer_config={"learning_rate": 0.1, "momentum": 0.9, "betas": (0.9, 0.99)}),
     "optimizer_config", "optimizer=onnxtrain.blocks.SGD(momentum=0.9), then Optimizer.set_learning_rate(0.1) "
                         "('betas': not an argument of onnxtrain.blocks.SGD)"),
    (blocks.Adam(), dict(lr=np.float32(0.5)), "lr", "Optimizer.set_learning_rate(0.5)"),
    (None, dict(weight_decay=0.01), "weight_decay", "optimizer=onnxtrain.blocks.AdamW(weight_decay=0.01)"),
    (OptimType.AdamW, dict(optimizer_config="adamw.json"), "optimizer_config", None),  # not a dict: no call
])
def test_hyperparameter_keywords_are_a_type_error_that_says_where_they_go(tmp_path, optimizer, keywords, keyword,
                                                                          here):
    with pytest.raises(TypeError, match=_message(keyword, here)):
        generate_artifacts(models.mlp(), loss=LossType.CrossEntropyLoss, optimizer=optimizer,
                           artifact_directory=tmp_path, **keywords)
    assert not any(tmp_path.iterdir())  # refused before anything is written


def test_the_optimizer_given_positionally_names_the_block(tmp_path):
    with pytest.raises(TypeError, match=re.escape("; here: optimizer=onnxtrain.blocks.SGD(momentum=0.9)") + "$"):
        generate_artifacts(models.mlp(), None, None, LossType.CrossEntropyLoss, OptimType.SGD, tmp_path,
                           optimizer_config={"momentum": 0.9})


def test_other_unexpected_keywords_keep_pythons_type_error(tmp_path):
    with pytest.raises(TypeError, match=r"^generate_artifacts\(\) got an unexpected keyword argument 'shuffle'$"):
        generate_artifacts(models.mlp(), loss=LossType.CrossEntropyLoss, artifact_directory=tmp_path, shuffle=True)


def test_the_signature_is_the_peers_and_the_named_calls_train(tmp_path):
    assert list(inspect.signature(generate_artifacts).parameters)[:12] == [
        "model", "requires_grad", "frozen_params", "loss", "optimizer", "artifact_directory", "prefix", "ort_format",
        "custom_op_library", "additional_output_names", "nominal_checkpoint", "loss_input_names"]
    generate_artifacts(models.mlp(), loss=LossType.CrossEntropyLoss, artifact_directory=tmp_path,
                       optimizer=blocks.AdamW(betas=(0.9, 0.999), eps=1e-08, weight_decay=0.0001))
    module = Module(tmp_path / "training_model.onnx", CheckpointState.load_checkpoint(tmp_path / "checkpoint"))
    optimizer = Optimizer(tmp_path / "optimizer_model.onnx", module)
    optimizer.set_learning_rate(0.0001)
    assert optimizer.get_learning_rate() == pytest.approx(0.0001)
    rng = np.random.default_rng(0)
    assert np.isfinite(module(rng.standard_normal((3, 8)).astype(np.float32), np.array([0, 1, 2])))
    optimizer.step()
